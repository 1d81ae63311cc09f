// File: tests/testing/redis_cluster.cc
//
// RedisClusterSetup: RedisServer in cluster mode for the nodes, `redis-cli --cluster create` to
// join them, readiness, slot moves and failover by redis-cli (CLUSTER SLOTS read as redis-cli
// --json prints it).

#include "testing/redis_cluster.h"

#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace leasehold::testing {

using namespace std::chrono_literals;

namespace {

// The value of `field` in INFO-style "field:value\r\n" text, or "".
std::string InfoField(const std::string& info, std::string_view field) {
  std::istringstream lines(info);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') {
      line.pop_back();
    }
    if (line.size() > field.size() && line.starts_with(field) && line[field.size()] == ':') {
      return line.substr(field.size() + 1);
    }
  }
  return "";
}

// Parses CLUSTER SLOTS as `redis-cli --json` prints it (RESP3):
//   [[FIRST,LAST,["IP",PORT,"ID",{METADATA}],[replica...],...],...]
// Only the shape above is understood: each scalar is placed by its path of element indexes
// (range, element, field); objects (node metadata such as hostname) are skipped.
Result<std::vector<RedisClusterSetup::SlotRange>> ParseClusterSlotsJson(std::string_view json) {
  using SlotRange = RedisClusterSetup::SlotRange;
  std::vector<SlotRange> ranges;
  std::vector<int> path;  // index within each open container
  int in_object = 0;      // depth of {...} being skipped
  auto bad = [&](std::string_view why) {
    return Status::Unavailable(fmt::format("unexpected CLUSTER SLOTS ({}): {}", why, json));
  };
  auto place = [&](const std::string& scalar) {
    if (in_object > 0 || path.size() < 2) {
      return;
    }
    const std::size_t r = static_cast<std::size_t>(path[0]);
    if (ranges.size() <= r) {
      ranges.resize(r + 1);
    }
    SlotRange& range = ranges[r];
    const int element = path[1];
    if (path.size() == 2) {
      (element == 0 ? range.first : range.last) = std::atoi(scalar.c_str());
      return;
    }
    // path.size() == 3: field of node `element - 2` (0 the master): IP, port, id.
    if (path.size() != 3 || element < 2) {
      return;
    }
    const int field = path[2];
    if (element == 2 && field == 1) {
      range.master_port = std::atoi(scalar.c_str());
    } else if (element == 2 && field == 2) {
      range.master_id = scalar;
    } else if (element > 2 && field == 1) {
      range.replica_ports.push_back(std::atoi(scalar.c_str()));
    }
  };
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '{') {
      ++in_object;
    } else if (c == '}') {
      --in_object;
    } else if (in_object > 0 && c != '"') {
      continue;
    } else if (c == '[') {
      path.push_back(0);
    } else if (c == ']') {
      if (path.empty()) {
        return bad("unbalanced ]");
      }
      path.pop_back();
    } else if (c == ',') {
      if (!path.empty() && in_object == 0) {
        ++path.back();
      }
    } else if (c == '"') {
      std::string text;
      for (++i; i < json.size() && json[i] != '"'; ++i) {
        if (json[i] == '\\' && i + 1 < json.size()) {
          ++i;
        }
        text += json[i];
      }
      place(text);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      std::size_t end = i + 1;
      while (end < json.size() && json[end] >= '0' && json[end] <= '9') {
        ++end;
      }
      place(std::string(json.substr(i, end - i)));
      i = end - 1;
    }
  }
  if (!path.empty() || in_object != 0) {
    return bad("unbalanced");
  }
  for (const SlotRange& range : ranges) {
    if (range.master_port <= 0 || range.first > range.last) {
      return bad("a range without a master");
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const SlotRange& a, const SlotRange& b) { return a.first < b.first; });
  return ranges;
}

// The masters of `ranges`, as "first-last:port" (replica lists differ between nodes for a
// while after a replica joins or fails), and with `replicas` their replicas too, sorted, as
// "first-last:port/replica,replica".
std::string MastersOf(const std::vector<RedisClusterSetup::SlotRange>& ranges,
                      bool replicas = false) {
  std::string out;
  for (const auto& range : ranges) {
    out += fmt::format("{}-{}:{}", range.first, range.last, range.master_port);
    if (replicas) {
      std::vector<int> ports = range.replica_ports;
      std::sort(ports.begin(), ports.end());
      out += fmt::format("/{}", fmt::join(ports, ","));
    }
    out += " ";
  }
  return out;
}

// OK if `reply` is one of `accepted` (redis-cli exits 0 on an error reply too).
Status Expect(const Result<std::string>& reply, std::initializer_list<std::string_view> accepted,
              std::string_view what) {
  if (!reply.ok()) {
    return Status::Unavailable(fmt::format("{}: {}", what, reply.status().message()));
  }
  for (std::string_view ok : accepted) {
    if (*reply == ok) {
      return Status();
    }
  }
  return Status::Unavailable(fmt::format("{}: {}", what, *reply));
}

}  // namespace

RedisClusterSetup::RedisClusterSetup(RedisClusterOptions options) : options_(options) {}

Result<std::unique_ptr<RedisClusterSetup>> RedisClusterSetup::Start(RedisClusterOptions options) {
  if (options.masters < 3 || options.replicas_per_master < 0) {
    return Status::InvalidArgument(
        fmt::format("a cluster needs at least 3 masters (redis-cli refuses fewer), got {} with {} "
                    "replicas each",
                    options.masters, options.replicas_per_master));
  }
  std::unique_ptr<RedisClusterSetup> setup(new RedisClusterSetup(options));
  const int nodes = options.masters * (1 + options.replicas_per_master);
  for (int i = 0; i < nodes; ++i) {
    // With TLS, the first node makes the test CA and certificates and the others copy them:
    // nodes verify each other's certificates on the bus and in replication.
    RedisServerOptions node{.aof = options.aof,
                            .tls = options.tls,
                            .cluster = true,
                            .cluster_node_timeout = options.node_timeout};
    if (options.tls && i > 0) {
      node.tls_certificates_from = setup->servers_.front()->TlsFile("");
    }
    LH_ASSIGN_OR_RETURN(std::unique_ptr<RedisServer> server, RedisServer::Start(node));
    setup->servers_.push_back(std::move(server));
  }
  LH_RETURN_IF_ERROR(setup->Create());
  LH_RETURN_IF_ERROR(setup->AwaitReady());
  LH_ASSIGN_OR_RETURN(std::vector<SlotRange> ranges, setup->SlotsOfAnyLiveNode());
  for (const SlotRange& range : ranges) {
    if (std::find(setup->seed_ports_.begin(), setup->seed_ports_.end(), range.master_port) ==
        setup->seed_ports_.end()) {
      setup->seed_ports_.push_back(range.master_port);
    }
  }
  return setup;
}

RedisClusterSetup::~RedisClusterSetup() {
  servers_.clear();
}

Status RedisClusterSetup::Create() const {
  // redis-cli makes the first `masters` nodes given the masters and spreads the rest over them
  // as replicas; it then waits (polling every second) until all nodes have met.
  std::string command = "timeout 60 redis-cli --cluster create";
  for (const auto& server : servers_) {
    command += fmt::format(" 127.0.0.1:{}", server->port());
  }
  command += fmt::format(" --cluster-replicas {} --cluster-yes", options_.replicas_per_master);
  Result<std::string> created = RunCommand(command);
  if (!created.ok()) {
    return Status::Unavailable(
        fmt::format("redis-cli --cluster create failed: {}", created.status().message()));
  }
  if (created->find("[OK] All 16384 slots covered") == std::string::npos) {
    return Status::Unavailable(fmt::format("redis-cli --cluster create: {}", *created));
  }
  return Status();
}

std::string RedisClusterSetup::WhyNotReady() const {
  std::string first_map;
  int replicas_up = 0;
  for (const auto& server : servers_) {
    const int port = server->port();
    Result<std::string> info = server->Cli({"CLUSTER", "INFO"});
    if (!info.ok() || InfoField(*info, "cluster_state") != "ok" ||
        InfoField(*info, "cluster_slots_ok") != std::to_string(kSlots) ||
        InfoField(*info, "cluster_known_nodes") != std::to_string(servers_.size())) {
      return fmt::format("node {}: {}", port, info.ok() ? *info : info.status().ToString());
    }
    Result<std::vector<SlotRange>> ranges = Slots(port);
    if (!ranges.ok()) {
      return ranges.status().ToString();
    }
    // Replicas included: each node learns who replicates whom by gossip, a little after the
    // replica's link to its master is up, and lists in CLUSTER SLOTS only the replicas it knows.
    const std::string map = MastersOf(*ranges, /*replicas=*/true);
    if (first_map.empty()) {
      first_map = map;
    } else if (map != first_map) {
      return fmt::format("node {} has slot map {}, node {} {}", servers_.front()->port(), first_map,
                         port, map);
    }
    std::set<int> masters;
    for (const SlotRange& range : *ranges) {
      masters.insert(range.master_port);
      if (static_cast<int>(range.replica_ports.size()) != options_.replicas_per_master) {
        return fmt::format("node {} lists the replicas {}", port, map);
      }
    }
    if (static_cast<int>(masters.size()) != options_.masters) {
      return fmt::format("node {} names {} masters: {}", port, masters.size(), map);
    }
    Result<std::string> replication = server->Cli({"INFO", "replication"});
    if (!replication.ok()) {
      return replication.status().ToString();
    }
    if (InfoField(*replication, "role") == "slave") {
      if (InfoField(*replication, "master_link_status") != "up") {
        return fmt::format("replica {}: {}", port, *replication);
      }
      ++replicas_up;
    } else if (masters.count(port) > 0) {
      // Each master sees its replicas online (synced, not waiting for a first transfer).
      int online = 0;
      for (std::size_t at = 0; (at = replication->find("state=online", at)) != std::string::npos;
           ++at) {
        ++online;
      }
      if (online < options_.replicas_per_master) {
        return fmt::format("master {}: {}", port, *replication);
      }
    }
  }
  const int replicas = options_.masters * options_.replicas_per_master;
  if (replicas_up != replicas) {
    return fmt::format("{} of {} replicas in sync", replicas_up, replicas);
  }
  return "";
}

Status RedisClusterSetup::AwaitReady() const {
  const auto give_up = std::chrono::steady_clock::now() + options_.ready_timeout;
  std::string why;
  while (std::chrono::steady_clock::now() < give_up) {
    why = WhyNotReady();
    if (why.empty()) {
      return Status();
    }
    std::this_thread::sleep_for(50ms);
  }
  std::string dirs;
  for (const auto& server : servers_) {
    dirs += " " + server->dir();
  }
  return Status::Unavailable(fmt::format("the cluster was not ready within {} ms: {} (logs in{})",
                                         options_.ready_timeout.count(), why, dirs));
}

std::string RedisClusterSetup::Url(const std::string& path_and_query) const {
  std::string hosts;
  for (int port : seed_ports_) {
    const RedisServer* server = ServerOnPort(port);
    hosts += fmt::format("{}127.0.0.1:{}", hosts.empty() ? "" : ",",
                         options_.tls ? server->tls_port() : port);
  }
  if (!options_.tls) {
    return fmt::format("redis+cluster://{}{}", hosts, path_and_query);
  }
  const char* join = path_and_query.find('?') == std::string::npos ? "?" : "&";
  return fmt::format("rediss+cluster://{}{}{}ca={}", hosts, path_and_query, join,
                     servers_.front()->TlsFile("ca.crt"));
}

Result<std::vector<RedisClusterSetup::SlotRange>> RedisClusterSetup::Slots(int port) const {
  LH_ASSIGN_OR_RETURN(std::string json, Cli(port, {"--json", "CLUSTER", "SLOTS"}));
  return ParseClusterSlotsJson(json);
}

Result<std::vector<RedisClusterSetup::SlotRange>> RedisClusterSetup::SlotsOfAnyLiveNode() const {
  Status last = Status::Unavailable("no live node");
  for (const auto& server : servers_) {
    if (server->pid() <= 0) {
      continue;
    }
    Result<std::vector<SlotRange>> ranges = Slots(server->port());
    if (ranges.ok()) {
      return ranges;
    }
    last = ranges.status();
  }
  return last;
}

Result<int> RedisClusterSetup::SlotOfKey(const std::string& key) const {
  for (const auto& server : servers_) {
    if (server->pid() <= 0) {
      continue;
    }
    Result<std::string> slot = server->Cli({"CLUSTER", "KEYSLOT", key});
    if (slot.ok() && !slot->empty() && std::isdigit(static_cast<unsigned char>(slot->front()))) {
      return std::atoi(slot->c_str());
    }
  }
  return Status::Unavailable(fmt::format("no live node answers CLUSTER KEYSLOT {}", key));
}

Result<int> RedisClusterSetup::MasterPortForSlot(int slot) const {
  LH_ASSIGN_OR_RETURN(std::vector<SlotRange> ranges, SlotsOfAnyLiveNode());
  for (const SlotRange& range : ranges) {
    if (range.first <= slot && slot <= range.last) {
      return range.master_port;
    }
  }
  return Status::Unavailable(fmt::format("slot {} has no master: {}", slot, MastersOf(ranges)));
}

Result<int> RedisClusterSetup::MasterPortForKey(const std::string& key) const {
  LH_ASSIGN_OR_RETURN(int slot, SlotOfKey(key));
  return MasterPortForSlot(slot);
}

RedisServer* RedisClusterSetup::ServerOnPort(int port) const {
  for (const auto& server : servers_) {
    if (server->port() == port) {
      return server.get();
    }
  }
  return nullptr;
}

std::vector<int> RedisClusterSetup::MasterPorts() const {
  Result<std::vector<SlotRange>> ranges = SlotsOfAnyLiveNode();
  std::set<int> ports;
  for (const SlotRange& range : ranges.ok() ? *ranges : std::vector<SlotRange>{}) {
    ports.insert(range.master_port);
  }
  return {ports.begin(), ports.end()};
}

std::vector<RedisServer*> RedisClusterSetup::servers() const {
  std::vector<RedisServer*> all;
  for (const auto& server : servers_) {
    all.push_back(server.get());
  }
  return all;
}

Result<int> RedisClusterSetup::Kill9MasterOf(int slot) {
  LH_ASSIGN_OR_RETURN(int port, MasterPortForSlot(slot));
  RedisServer* master = ServerOnPort(port);
  if (master == nullptr) {
    return Status::Internal(fmt::format("CLUSTER SLOTS names port {}, not one of ours", port));
  }
  master->Kill9();
  return port;
}

Result<int> RedisClusterSetup::AwaitFailover(int slot, int old_port,
                                             std::chrono::milliseconds timeout) const {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < give_up) {
    for (const auto& server : servers_) {
      if (server->pid() <= 0 || server->port() == old_port) {
        continue;
      }
      Result<std::vector<SlotRange>> ranges = Slots(server->port());
      if (!ranges.ok()) {
        continue;
      }
      auto range = std::find_if(ranges->begin(), ranges->end(), [slot](const SlotRange& r) {
        return r.first <= slot && slot <= r.last;
      });
      if (range == ranges->end() || range->master_port == old_port) {
        last = fmt::format("node {} has {}", server->port(), MastersOf(*ranges));
        continue;
      }
      const RedisServer* promoted = ServerOnPort(range->master_port);
      Result<std::string> role = promoted != nullptr ? promoted->Cli({"ROLE"})
                                                     : Result<std::string>(Status::Unavailable(""));
      Result<std::string> info = promoted != nullptr ? promoted->Cli({"CLUSTER", "INFO"})
                                                     : Result<std::string>(Status::Unavailable(""));
      if (role.ok() && role->starts_with("master") && info.ok() &&
          InfoField(*info, "cluster_state") == "ok") {
        return range->master_port;
      }
      last = fmt::format(
          "node {} names {} for slot {}, which is not yet a master of a healthy "
          "cluster",
          server->port(), range->master_port, slot);
    }
    std::this_thread::sleep_for(50ms);
  }
  return Status::Unavailable(
      fmt::format("no failover of slot {} away from port {} within {} ms: {}", slot, old_port,
                  timeout.count(), last));
}

Status RedisClusterSetup::MoveSlot(int slot, int to_port) {
  LH_RETURN_IF_ERROR(BeginMigration(slot, to_port));
  for (;;) {
    LH_ASSIGN_OR_RETURN(int moved, MigrateKeys(slot, 100));
    if (moved == 0) {
      break;
    }
  }
  return FinishMigration(slot, to_port);
}

Status RedisClusterSetup::BeginMigration(int slot, int to_port) {
  if (slot < 0 || slot >= kSlots) {
    return Status::InvalidArgument(fmt::format("no slot {}", slot));
  }
  if (migrations_.count(slot) > 0) {
    return Status::InvalidArgument(fmt::format("slot {} is being migrated already", slot));
  }
  LH_ASSIGN_OR_RETURN(int from_port, MasterPortForSlot(slot));
  if (from_port == to_port) {
    return Status::InvalidArgument(fmt::format("slot {} is on port {} already", slot, to_port));
  }
  const std::vector<int> masters = MasterPorts();
  if (std::find(masters.begin(), masters.end(), to_port) == masters.end()) {
    return Status::InvalidArgument(fmt::format("port {} is not a master", to_port));
  }
  LH_ASSIGN_OR_RETURN(std::string from_id, NodeId(from_port));
  LH_ASSIGN_OR_RETURN(std::string to_id, NodeId(to_port));
  // The target first, as redis-cli does: once the source says ASK, the target must accept.
  const std::string s = std::to_string(slot);
  LH_RETURN_IF_ERROR(Expect(Cli(to_port, {"CLUSTER", "SETSLOT", s, "IMPORTING", from_id}), {"OK"},
                            fmt::format("CLUSTER SETSLOT {} IMPORTING on {}", s, to_port)));
  LH_RETURN_IF_ERROR(Expect(Cli(from_port, {"CLUSTER", "SETSLOT", s, "MIGRATING", to_id}), {"OK"},
                            fmt::format("CLUSTER SETSLOT {} MIGRATING on {}", s, from_port)));
  migrations_[slot] = {.from_port = from_port, .to_port = to_port};
  return Status();
}

Result<int> RedisClusterSetup::MigrateKeys(int slot, int count) {
  auto migration = migrations_.find(slot);
  if (migration == migrations_.end()) {
    return Status::InvalidArgument(fmt::format("no migration of slot {} begun", slot));
  }
  if (count <= 0) {
    return Status::InvalidArgument(fmt::format("MigrateKeys of {} keys", count));
  }
  const auto [from_port, to_port] = migration->second;
  LH_ASSIGN_OR_RETURN(
      std::string listed,
      Cli(from_port, {"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), std::to_string(count)}));
  std::vector<std::string> keys;
  std::istringstream lines(listed);
  for (std::string key; std::getline(lines, key);) {
    if (!key.empty()) {
      keys.push_back(key);
    }
  }
  if (keys.empty()) {
    return 0;
  }
  // MIGRATE host port "" 0 timeout KEYS k...: database 0, the only one in a cluster. No
  // REPLACE: a key on both sides is a test's mistake, reported as BUSYKEY.
  std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", std::to_string(to_port), "", "0",
                                      "5000",    "KEYS"};
  migrate.insert(migrate.end(), keys.begin(), keys.end());
  LH_RETURN_IF_ERROR(
      Expect(Cli(from_port, migrate), {"OK", "NOKEY"},
             fmt::format("MIGRATE of slot {} from {} to {}", slot, from_port, to_port)));
  return static_cast<int>(keys.size());
}

Status RedisClusterSetup::FinishMigration(int slot, int to_port) {
  auto migration = migrations_.find(slot);
  if (migration == migrations_.end() || migration->second.to_port != to_port) {
    return Status::InvalidArgument(
        fmt::format("no migration of slot {} to port {} begun", slot, to_port));
  }
  const int from_port = migration->second.from_port;
  const std::string s = std::to_string(slot);
  LH_ASSIGN_OR_RETURN(std::string left, Cli(from_port, {"CLUSTER", "COUNTKEYSINSLOT", s}));
  if (left != "0") {
    return Status::InvalidArgument(fmt::format(
        "{} keys of slot {} are still on port {}: MigrateKeys first", left, slot, from_port));
  }
  LH_ASSIGN_OR_RETURN(std::string to_id, NodeId(to_port));
  // The target first (it bumps its config epoch, so its claim wins in gossip), then the source,
  // then the other masters, as redis-cli does; replicas learn it from their masters.
  std::vector<int> order = {to_port, from_port};
  for (int port : MasterPorts()) {
    if (port != to_port && port != from_port) {
      order.push_back(port);
    }
  }
  for (int port : order) {
    LH_RETURN_IF_ERROR(Expect(Cli(port, {"CLUSTER", "SETSLOT", s, "NODE", to_id}), {"OK"},
                              fmt::format("CLUSTER SETSLOT {} NODE on {}", s, port)));
  }
  migrations_.erase(migration);
  return AwaitSlotOwner(slot, to_port);
}

Status RedisClusterSetup::AwaitSlotOwner(int slot, int port) const {
  const auto give_up = std::chrono::steady_clock::now() + options_.ready_timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < give_up) {
    last.clear();
    for (const auto& server : servers_) {
      if (server->pid() <= 0) {
        continue;
      }
      Result<std::vector<SlotRange>> ranges = Slots(server->port());
      if (!ranges.ok()) {
        last = ranges.status().ToString();
        break;
      }
      auto range = std::find_if(ranges->begin(), ranges->end(), [slot](const SlotRange& r) {
        return r.first <= slot && slot <= r.last;
      });
      if (range == ranges->end() || range->master_port != port) {
        last = fmt::format("node {} has {}", server->port(), MastersOf(*ranges));
        break;
      }
    }
    if (last.empty()) {
      return Status();
    }
    std::this_thread::sleep_for(20ms);
  }
  return Status::Unavailable(
      fmt::format("not every node names port {} for slot {} within {} ms: {}", port, slot,
                  options_.ready_timeout.count(), last));
}

Result<std::string> RedisClusterSetup::Cli(int port, const std::vector<std::string>& args) const {
  const RedisServer* server = ServerOnPort(port);
  if (server == nullptr) {
    return Status::InvalidArgument(fmt::format("no node of this cluster on port {}", port));
  }
  return server->Cli(args);
}

Result<std::string> RedisClusterSetup::NodeId(int port) const {
  LH_ASSIGN_OR_RETURN(std::string id, Cli(port, {"CLUSTER", "MYID"}));
  if (id.size() != 40) {
    return Status::Unavailable(fmt::format("CLUSTER MYID on {}: {}", port, id));
  }
  return id;
}

}  // namespace leasehold::testing
