// File: tests/testing/redis_sentinel.h
//
// RedisSentinelSetup: a throwaway Redis Sentinel deployment for tests and benchmarks: one
// master and its replicas (RedisServer, each on a free loopback port in a temporary directory)
// and sentinel processes (`redis-server sentinel.conf --sentinel`, which is what Debian's
// redis-sentinel runs) that monitor the master under one name, with a quorum of a majority.
// Everything is killed with the object, or with the process that started it.
//
// Example:
//
//   auto setup = RedisSentinelSetup::Start({.wait_for_quorum = true});
//   ASSERT_TRUE(setup.ok()) << setup.status().ToString();
//   std::string url = (*setup)->Url("/0?min_replicas=1");  //
//   redis+sentinel://...:S1,.../NAME/0?... int old_port = (*setup)->Kill9Master(); auto new_port =
//   (*setup)->AwaitFailover(old_port, 30s);
//
// Thread safety: not thread-safe; use from one test thread.

#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

#include "leasehold/status.h"

#include "testing/redis_server.h"

namespace leasehold::testing {

struct RedisSentinelOptions {
  int sentinels = 3;
  int replicas = 1;
  // The replicas' replica-priority, in order (RedisServerOptions::replica_priority); missing
  // ones are 100. Default: none (all 100).
  std::vector<int> replica_priorities;
  // The master's and replicas' appendonly (RedisServerOptions::aof).
  bool aof = true;
  std::string master_name = "leasehold";
  // sentinel down-after-milliseconds and failover-timeout.
  std::chrono::milliseconds down_after{1000};
  std::chrono::milliseconds failover_timeout{5000};
  // Start waits until every sentinel knows every replica and every other sentinel, so that a
  // failover can happen at once (sentinels find each other by hello messages every 2 s, so this
  // takes a few seconds). Without it, Start returns once every sentinel names the master.
  bool wait_for_quorum = false;
  std::chrono::milliseconds ready_timeout{30'000};
};

class RedisSentinelSetup {
 public:
  static Result<std::unique_ptr<RedisSentinelSetup>> Start(RedisSentinelOptions options = {});

  RedisSentinelSetup(const RedisSentinelSetup&) = delete;
  RedisSentinelSetup& operator=(const RedisSentinelSetup&) = delete;
  ~RedisSentinelSetup();

  // "redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,.../NAME" + path_and_query ("/0?prefix=x").
  [[nodiscard]] std::string Url(const std::string& path_and_query = "") const;

  // The port the sentinels name as the master now (asking them in turn), or kUnavailable.
  Result<int> MasterPort() const;

  // The data server on `port` (the master or a replica), or null.
  [[nodiscard]] RedisServer* ServerOnPort(int port) const;

  // The data servers the sentinels do not name as the master.
  [[nodiscard]] std::vector<RedisServer*> Replicas() const;

  // kill -9 of the current master; returns its port.
  Result<int> Kill9Master();

  // Waits until the sentinels name a master other than `old_port` and that server answers ROLE
  // as a master. Returns its port.
  Result<int> AwaitFailover(int old_port, std::chrono::milliseconds timeout) const;

  [[nodiscard]] const std::vector<int>& sentinel_ports() const { return sentinel_ports_; }

  // Runs redis-cli against sentinel i.
  Result<std::string> SentinelCli(int i, const std::vector<std::string>& args) const;

 private:
  explicit RedisSentinelSetup(RedisSentinelOptions options, std::string dir);

  Status AwaitSentinels() const;

  const RedisSentinelOptions options_;
  const std::string dir_;
  std::vector<std::unique_ptr<RedisServer>> servers_;  // [0]: the first master
  std::vector<int> sentinel_ports_;
  std::vector<pid_t> sentinel_pids_;
};

}  // namespace leasehold::testing
