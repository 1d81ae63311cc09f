// File: tests/testing/redis_sentinel.cc
//
// RedisSentinelSetup: RedisServer for the data servers, `redis-server CONF --sentinel` for the
// sentinels (started by testing/server_process.h), readiness and failover by redis-cli.

#include "testing/redis_sentinel.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace leasehold::testing {

using namespace std::chrono_literals;

namespace {

// The value after `field` in redis-cli's line-per-element output of SENTINEL MASTER.
std::string FieldOf(const std::string& out, std::string_view field) {
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line == field) {
      std::getline(lines, line);
      return line;
    }
  }
  return "";
}

}  // namespace

RedisSentinelSetup::RedisSentinelSetup(RedisSentinelOptions options, std::string dir)
    : options_(std::move(options)), dir_(std::move(dir)) {}

Result<std::unique_ptr<RedisSentinelSetup>> RedisSentinelSetup::Start(
    RedisSentinelOptions options) {
  char tmpl[] = "/tmp/leasehold-sentinel-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return Status::Unavailable("cannot create a temporary directory for redis-sentinel");
  }
  std::unique_ptr<RedisSentinelSetup> setup(new RedisSentinelSetup(options, tmpl));
  LH_ASSIGN_OR_RETURN(std::unique_ptr<RedisServer> master,
                      RedisServer::Start({.aof = options.aof}));
  const int master_port = master->port();
  setup->servers_.push_back(std::move(master));
  for (int i = 0; i < options.replicas; ++i) {
    const int priority = i < static_cast<int>(options.replica_priorities.size())
                             ? options.replica_priorities[i]
                             : 100;
    LH_ASSIGN_OR_RETURN(
        std::unique_ptr<RedisServer> replica,
        RedisServer::Start(
            {.aof = options.aof, .replica_of = master_port, .replica_priority = priority}));
    setup->servers_.push_back(std::move(replica));
  }
  // Every replica in sync (state=online in the master's INFO replication) before the sentinels
  // come: a replica still waiting for its first sync has nothing to be promoted with.
  const auto synced_by = std::chrono::steady_clock::now() + options.ready_timeout;
  while (options.replicas > 0) {
    Result<std::string> info = setup->servers_.front()->Cli({"INFO", "replication"});
    int online = 0;
    for (std::size_t at = 0;
         info.ok() && (at = info->find("state=online", at)) != std::string::npos; ++at) {
      ++online;
    }
    if (online >= options.replicas) {
      break;
    }
    if (std::chrono::steady_clock::now() > synced_by) {
      return Status::Unavailable(fmt::format("the replicas did not sync with the master: {}",
                                             info.ok() ? *info : info.status().ToString()));
    }
    std::this_thread::sleep_for(20ms);
  }
  const std::string binary = access("/usr/bin/redis-server", X_OK) == 0
                                 ? "/usr/bin/redis-server"
                                 : "/usr/local/bin/redis-server";
  for (int i = 0; i < options.sentinels; ++i) {
    const int port = PickFreeLoopbackPort({6379, 26379, master_port});
    if (port <= 0) {
      return Status::Unavailable("no free loopback port for a sentinel");
    }
    const std::string dir = fmt::format("{}/sentinel{}", setup->dir_, i + 1);
    std::filesystem::create_directories(dir);
    const std::string conf = dir + "/sentinel.conf";
    {
      std::ofstream out(conf);
      out << "port " << port << "\n"
          << "bind 127.0.0.1\n"
          << "protected-mode no\n"
          << "daemonize no\n"
          << "dir " << dir << "\n"
          << "logfile " << dir << "/sentinel.log\n"
          << "sentinel monitor " << options.master_name << " 127.0.0.1 " << master_port << " "
          << options.sentinels / 2 + 1 << "\n"
          << "sentinel down-after-milliseconds " << options.master_name << " "
          << options.down_after.count() << "\n"
          << "sentinel failover-timeout " << options.master_name << " "
          << options.failover_timeout.count() << "\n"
          << "sentinel parallel-syncs " << options.master_name << " 1\n";
      if (!out.good()) {
        return Status::Unavailable(fmt::format("cannot write {}", conf));
      }
    }
    LH_ASSIGN_OR_RETURN(pid_t pid, SpawnServer({binary, conf, "--sentinel"}, dir + "/stdout.log"));
    setup->sentinel_ports_.push_back(port);
    setup->sentinel_pids_.push_back(pid);
  }
  LH_RETURN_IF_ERROR(setup->AwaitSentinels());
  return setup;
}

RedisSentinelSetup::~RedisSentinelSetup() {
  for (pid_t& pid : sentinel_pids_) {
    StopPid(pid, SIGKILL);
  }
  servers_.clear();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

Status RedisSentinelSetup::AwaitSentinels() const {
  const auto give_up = std::chrono::steady_clock::now() + options_.ready_timeout;
  const int first_master = servers_.front()->port();
  std::string last;
  while (std::chrono::steady_clock::now() < give_up) {
    bool all = true;
    for (int i = 0; i < static_cast<int>(sentinel_ports_.size()) && all; ++i) {
      Result<std::string> master = SentinelCli(i, {"SENTINEL", "MASTER", options_.master_name});
      if (!master.ok()) {
        last = master.status().ToString();
        all = false;
        break;
      }
      const bool named = FieldOf(*master, "port") == std::to_string(first_master);
      const bool quorum = !options_.wait_for_quorum ||
                          (std::atoi(FieldOf(*master, "num-slaves").c_str()) >= options_.replicas &&
                           std::atoi(FieldOf(*master, "num-other-sentinels").c_str()) >=
                               static_cast<int>(sentinel_ports_.size()) - 1);
      if (!named || !quorum) {
        last = fmt::format("sentinel {}: port {}, {} replicas, {} other sentinels", i,
                           FieldOf(*master, "port"), FieldOf(*master, "num-slaves"),
                           FieldOf(*master, "num-other-sentinels"));
        all = false;
      }
    }
    if (all) {
      return Status();
    }
    std::this_thread::sleep_for(100ms);
  }
  return Status::Unavailable(
      fmt::format("the sentinels were not ready within {} ms: {} (logs in {})",
                  options_.ready_timeout.count(), last, dir_));
}

std::string RedisSentinelSetup::Url(const std::string& path_and_query) const {
  std::string hosts;
  for (int port : sentinel_ports_) {
    hosts += fmt::format("{}127.0.0.1:{}", hosts.empty() ? "" : ",", port);
  }
  return fmt::format("redis+sentinel://{}/{}{}", hosts, options_.master_name, path_and_query);
}

Result<int> RedisSentinelSetup::MasterPort() const {
  for (int i = 0; i < static_cast<int>(sentinel_ports_.size()); ++i) {
    Result<std::string> out =
        SentinelCli(i, {"SENTINEL", "get-master-addr-by-name", options_.master_name});
    if (!out.ok()) {
      continue;
    }
    const std::size_t newline = out->find('\n');
    if (newline != std::string::npos) {
      return std::atoi(out->c_str() + newline + 1);
    }
  }
  return Status::Unavailable("no sentinel names the master");
}

RedisServer* RedisSentinelSetup::ServerOnPort(int port) const {
  for (const auto& server : servers_) {
    if (server->port() == port) {
      return server.get();
    }
  }
  return nullptr;
}

std::vector<RedisServer*> RedisSentinelSetup::Replicas() const {
  Result<int> master = MasterPort();
  std::vector<RedisServer*> replicas;
  for (const auto& server : servers_) {
    if (!master.ok() || server->port() != *master) {
      replicas.push_back(server.get());
    }
  }
  return replicas;
}

Result<int> RedisSentinelSetup::Kill9Master() {
  LH_ASSIGN_OR_RETURN(int port, MasterPort());
  RedisServer* master = ServerOnPort(port);
  if (master == nullptr) {
    return Status::Internal(fmt::format("the sentinels name port {}, not one of ours", port));
  }
  master->Kill9();
  return port;
}

Result<int> RedisSentinelSetup::AwaitFailover(int old_port,
                                              std::chrono::milliseconds timeout) const {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < give_up) {
    Result<int> port = MasterPort();
    if (port.ok() && *port != old_port) {
      RedisServer* server = ServerOnPort(*port);
      Result<std::string> role =
          server != nullptr ? server->Cli({"ROLE"}) : Result<std::string>(Status::Unavailable(""));
      if (role.ok() && role->starts_with("master")) {
        return *port;
      }
    }
    std::this_thread::sleep_for(50ms);
  }
  return Status::Unavailable(fmt::format("no failover away from port {} within {} ms (logs in {})",
                                         old_port, timeout.count(), dir_));
}

Result<std::string> RedisSentinelSetup::SentinelCli(int i,
                                                    const std::vector<std::string>& args) const {
  std::string command = fmt::format("timeout 5 redis-cli -h 127.0.0.1 -p {}", sentinel_ports_[i]);
  for (const std::string& arg : args) {
    command += " " + ShellQuote(arg);
  }
  return RunCommand(command);
}

}  // namespace leasehold::testing
