// File: backends/redis/redis_cluster.cc (internal to backends/redis)
//
// RedisRouter, KeySlot and ParseRedirection (redis_cluster.h). The slot map comes from CLUSTER
// SLOTS, which every Redis since 3.0 answers (CLUSTER SHARDS is 7.0's and gives nothing more
// that routing needs).

#include "backends/redis/redis_cluster.h"

#include <algorithm>
#include <array>
#include <utility>

#include <fmt/format.h>

#include "backends/common/host_port.h"
#include "backends/common/url_params.h"

namespace leasehold::internal {

namespace {

constexpr std::array<std::uint16_t, 256> MakeCrc16Table() {
  std::array<std::uint16_t, 256> table{};
  for (int i = 0; i < 256; ++i) {
    auto crc = static_cast<std::uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<std::uint16_t>(crc << 1);
    }
    table[static_cast<std::size_t>(i)] = crc;
  }
  return table;
}

constexpr std::array<std::uint16_t, 256> kCrc16Table = MakeCrc16Table();

std::string NodeName(const std::string& host, int port) {
  return HostPort{.host = host, .port = port}.ToString();
}

}  // namespace

std::uint16_t Crc16(std::string_view data) {
  std::uint16_t crc = 0;
  for (char c : data) {
    const auto byte = static_cast<std::uint8_t>(c);
    crc = static_cast<std::uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ byte) & 0xff]);
  }
  return crc;
}

int KeySlot(std::string_view key) {
  const std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & (kClusterSlots - 1);
}

std::optional<Redirection> ParseRedirection(std::string_view error) {
  Redirection r;
  if (error.starts_with("MOVED ")) {
    error.remove_prefix(6);
  } else if (error.starts_with("ASK ")) {
    r.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const std::size_t space = error.find(' ');
  if (space == std::string_view::npos ||
      !ParseWholeNumber(error.substr(0, space), 0, kClusterSlots - 1, &r.slot)) {
    return std::nullopt;
  }
  const std::string_view endpoint = error.substr(space + 1);
  const std::size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos ||
      !ParseWholeNumber(endpoint.substr(colon + 1), 1, 65535, &r.port)) {
    return std::nullopt;
  }
  std::string_view host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // an IPv6 address
  }
  r.host = std::string(host);
  return r;
}

RedisRouter::RedisRouter(std::shared_ptr<RedisConnectionPool> pool)
    : cluster_(false), options_(pool->options()), clock_(Clock::Real()), seed_(std::move(pool)) {}

RedisRouter::RedisRouter(RedisOptions options, Clock& clock,
                         std::shared_ptr<const RedisTlsContext> tls)
    : cluster_(true), options_(std::move(options)), clock_(clock), tls_(std::move(tls)) {
  seed_ = std::make_shared<RedisConnectionPool>(options_, clock_, tls_);
  slots_.resize(kClusterSlots);
}

Result<std::shared_ptr<RedisRouter>> RedisRouter::OpenCluster(
    const RedisOptions& options, Clock& clock, std::shared_ptr<const RedisTlsContext> tls) {
  std::shared_ptr<RedisRouter> router(new RedisRouter(options, clock, std::move(tls)));
  LH_RETURN_IF_ERROR(router->Refresh());
  return router;
}

std::shared_ptr<RedisConnectionPool> RedisRouter::PoolForNodeLocked(const std::string& host,
                                                                    int port) {
  std::shared_ptr<RedisConnectionPool>& pool = nodes_[NodeName(host, port)];
  if (pool == nullptr) {
    RedisOptions node = options_;
    node.host = host;
    node.port = port;
    pool = std::make_shared<RedisConnectionPool>(std::move(node), clock_, tls_);
  }
  return pool;
}

std::shared_ptr<RedisConnectionPool> RedisRouter::PoolForNode(const std::string& host, int port) {
  if (!cluster_) {
    return seed_;
  }
  MutexLock lock(&mu_);
  return PoolForNodeLocked(host, port);
}

Result<std::shared_ptr<RedisConnectionPool>> RedisRouter::PoolForSlot(int slot) {
  if (!cluster_) {
    return seed_;
  }
  bool refresh = false;
  {
    MutexLock lock(&mu_);
    // One caller reads the map; the others go on with the old one meanwhile (a MOVED sends
    // them round again).
    if (stale_ && !refreshing_ && clock_.Now() - last_refresh_ >= kClusterRefreshInterval) {
      refreshing_ = true;
      refresh = true;
    }
  }
  if (refresh) {
    // A failed read leaves the old map, still marked stale: the next command tries again.
    (void)Refresh();
  }
  MutexLock lock(&mu_);
  std::shared_ptr<RedisConnectionPool> pool = slots_[static_cast<std::size_t>(slot)];
  if (pool == nullptr) {
    return Status::Unavailable(fmt::format(
        "redis {}: no node serves hash slot {} (the cluster is down, or its slots are not all "
        "assigned)",
        options_.Address(), slot));
  }
  return pool;
}

Result<std::vector<std::shared_ptr<RedisConnectionPool>>> RedisRouter::MasterPools() {
  if (!cluster_) {
    return std::vector<std::shared_ptr<RedisConnectionPool>>{seed_};
  }
  // Reads the map again first if it is stale, as PoolForSlot does.
  LH_RETURN_IF_ERROR(PoolForSlot(0).status());
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<RedisConnectionPool>> masters;
  for (const std::shared_ptr<RedisConnectionPool>& pool : slots_) {
    if (pool != nullptr && std::find(masters.begin(), masters.end(), pool) == masters.end()) {
      masters.push_back(pool);
    }
  }
  return masters;
}

std::vector<std::shared_ptr<RedisConnectionPool>> RedisRouter::AllPools() const {
  std::vector<std::shared_ptr<RedisConnectionPool>> pools = {seed_};
  MutexLock lock(&mu_);
  for (const auto& [name, pool] : nodes_) {
    pools.push_back(pool);
  }
  return pools;
}

void RedisRouter::Moved(int slot, const std::string& host, int port) {
  if (!cluster_) {
    return;
  }
  MutexLock lock(&mu_);
  slots_[static_cast<std::size_t>(slot)] = PoolForNodeLocked(host, port);
  stale_ = true;
}

void RedisRouter::MarkStale() {
  if (!cluster_) {
    return;
  }
  MutexLock lock(&mu_);
  stale_ = true;
}

std::vector<ClusterShard> RedisRouter::Shards() const {
  MutexLock lock(&mu_);
  return shards_;
}

std::uint64_t RedisRouter::refreshes() const {
  MutexLock lock(&mu_);
  return refreshes_;
}

Status RedisRouter::Refresh() {
  // Who to ask: the masters as last read (they know the newest map), then the seeds.
  std::vector<std::pair<std::string, int>> ask;
  {
    MutexLock lock(&mu_);
    for (const ClusterShard& shard : shards_) {
      ask.emplace_back(shard.host, shard.port);
    }
  }
  for (const auto& seed : options_.cluster_nodes) {
    if (std::find(ask.begin(), ask.end(), seed) == ask.end()) {
      ask.push_back(seed);
    }
  }
  std::string unreachable;
  Status outcome;
  bool answered = false;  // a node answered (outcome is its map's, or its refusal)
  for (const auto& [host, port] : ask) {
    RedisOptions node = options_;
    node.host = host;
    node.port = port;
    const std::string at = node.Address();
    Result<std::unique_ptr<RedisConnection>> connection =
        RedisConnection::Connect(node, tls_.get());
    Result<std::vector<ReplyPtr>> replies = connection.status();
    if (connection.ok()) {
      const std::vector<Command> slots = {{"CLUSTER", "SLOTS"}};
      replies = (*connection)->Pipeline(slots, at);
    }
    if (!replies.ok()) {
      if (replies.status().code() == StatusCode::kPermissionDenied) {
        outcome = replies.status();  // wrong credentials: every node says the same
        answered = true;
        break;
      }
      unreachable +=
          fmt::format("{}{}", unreachable.empty() ? "" : "; ", replies.status().message());
      continue;
    }
    const redisReply* reply = (*replies)[0].get();
    if (IsError(reply)) {
      const std::string_view error = ReplyText(reply);
      if (error.find("cluster support disabled") != std::string_view::npos) {
        outcome = Status::InvalidArgument(fmt::format(
            "redis at {} is not a cluster node (cluster support disabled): use redis:// for one "
            "server or redis+sentinel:// for Sentinel",
            NodeName(host, port)));
        answered = true;
        break;
      }
      outcome = ErrorReplyStatus(at, "CLUSTER SLOTS", error);
      if (outcome.code() == StatusCode::kPermissionDenied) {
        answered = true;
        break;
      }
      unreachable += fmt::format("{}{}", unreachable.empty() ? "" : "; ", outcome.message());
      outcome = Status();
      continue;
    }
    outcome = ApplySlots(reply, host);
    if (!outcome.ok()) {
      // A node that serves no slots (new, reset, or on a minority side) cannot tell the map:
      // ask the next one.
      unreachable += fmt::format("{}{}", unreachable.empty() ? "" : "; ", outcome.message());
      continue;
    }
    answered = true;
    break;
  }
  if (!answered) {
    outcome = Status::Unavailable(
        fmt::format("cannot read the slot map of redis {}: {}", options_.Address(), unreachable));
  }
  MutexLock lock(&mu_);
  refreshing_ = false;
  last_refresh_ = clock_.Now();
  return outcome;
}

Status RedisRouter::ApplySlots(const redisReply* reply, const std::string& asked_host) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) {
    return Status::Internal("unexpected reply from redis to CLUSTER SLOTS");
  }
  std::vector<std::pair<std::string, int>> owner(kClusterSlots);
  std::map<std::pair<std::string, int>, ClusterShard> shards;
  int served = 0;
  // Each entry: start slot, end slot, then the master's [host, port, id, ...], then each
  // replica's.
  for (std::size_t i = 0; i < reply->elements; ++i) {
    const redisReply* range = reply->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER ||
        range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2 ||
        range->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      return Status::Internal("unexpected entry in redis's reply to CLUSTER SLOTS");
    }
    const long long start = range->element[0]->integer;
    const long long end = range->element[1]->integer;
    if (start < 0 || end >= kClusterSlots || start > end) {
      return Status::Internal("unexpected slot range in redis's reply to CLUSTER SLOTS");
    }
    std::string host(ReplyText(range->element[2]->element[0]));
    if (host.empty() || host == "?") {
      host = asked_host;  // a node that does not know its own address: the one asked
    }
    const int port = static_cast<int>(range->element[2]->element[1]->integer);
    ClusterShard& shard = shards[{host, port}];
    shard.host = host;
    shard.port = port;
    shard.slots += static_cast<int>(end - start + 1);
    shard.replicas = std::max(shard.replicas, static_cast<int>(range->elements) - 3);
    for (long long s = start; s <= end; ++s) {
      owner[static_cast<std::size_t>(s)] = {host, port};
    }
    served += static_cast<int>(end - start + 1);
  }
  MutexLock lock(&mu_);
  ++refreshes_;
  if (served == 0) {
    return Status::Unavailable(fmt::format(
        "redis {}: the cluster serves no slots (not created yet: redis-cli --cluster create)",
        options_.Address()));
  }
  for (int s = 0; s < kClusterSlots; ++s) {
    const auto& [host, port] = owner[static_cast<std::size_t>(s)];
    slots_[static_cast<std::size_t>(s)] = port == 0 ? nullptr : PoolForNodeLocked(host, port);
  }
  shards_.clear();
  for (auto& [address, shard] : shards) {
    shards_.push_back(std::move(shard));
  }
  stale_ = false;
  return Status();
}

}  // namespace leasehold::internal
