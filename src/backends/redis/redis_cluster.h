// File: backends/redis/redis_cluster.h (internal to backends/redis)
//
// RedisRouter: where a redis:// store's commands go. For one server (redis://, rediss://,
// redis+unix://) and for Sentinel it is that store's one RedisConnectionPool. For Redis Cluster
// (redis+cluster://) it keeps the slot map read with CLUSTER SLOTS and one pool per node, and
// gives each command the pool of the master that serves its key's hash slot; MOVED replies
// update the map, and a stale map (a broken connection, a failover) is read again from any node
// that answers, at most every kClusterRefreshInterval. The hash-slot function (KeySlot) and the
// redirection parser (ParseRedirection) are here too.
//
// Every key the backend writes for one lease carries the same {hash tag} (redis_backend.h), so
// one lease's keys live in one slot, on one master, and each script runs on exactly one node.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(std::shared_ptr<RedisRouter> router,
//                       RedisRouter::Open(options, clock, tls));
//   LH_ASSIGN_OR_RETURN(std::shared_ptr<RedisConnectionPool> pool,
//                       router->PoolForSlot(KeySlot("leasehold:{6a6f62}")));
//
// Thread safety: thread-safe.

#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "backends/redis/redis_connection.h"
#include "backends/redis/redis_options.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

inline constexpr int kClusterSlots = 16384;

// The shortest time between two reads of a cluster's slot map.
inline constexpr Duration kClusterRefreshInterval = std::chrono::milliseconds(100);

// CRC16-CCITT (XModem: polynomial 0x1021, initial value 0), the checksum of Redis Cluster's key
// hashing.
std::uint16_t Crc16(std::string_view data);

// The hash slot (0..16383) of `key` as Redis Cluster computes it: of the part between the first
// '{' and the next '}' when that part is not empty, else of the whole key.
int KeySlot(std::string_view key);

// A MOVED or ASK error reply: "MOVED 3999 127.0.0.1:6381".
struct Redirection {
  bool ask = false;  // ASK: this one command, on that node, after ASKING; MOVED: the map changed
  int slot = 0;
  std::string host;
  int port = 0;
};

// Parses a MOVED or ASK error's text; nullopt for any other text. An empty host (a node that
// does not know its own address) stays empty: the caller puts in the address it asked.
std::optional<Redirection> ParseRedirection(std::string_view error);

// One master of a cluster's slot map.
struct ClusterShard {
  std::string host;
  int port = 0;
  int slots = 0;     // how many slots it serves
  int replicas = 0;  // replicas CLUSTER SLOTS lists for it
};

class RedisRouter {
 public:
  // One server, or Sentinel: every command goes to `pool`.
  explicit RedisRouter(std::shared_ptr<RedisConnectionPool> pool);

  // Cluster (options.cluster()): reads the slot map from the first seed that answers. Returns
  // kInvalidArgument if a seed answers that it is not a cluster node (cluster support
  // disabled), kUnavailable if none answers or every one that answers serves no slots (the
  // cluster is not created yet), kPermissionDenied for refused credentials or an ACL without
  // +cluster|slots. Every connect and command is bounded by connect_timeout and
  // command_timeout.
  static Result<std::shared_ptr<RedisRouter>> OpenCluster(
      const RedisOptions& options, Clock& clock, std::shared_ptr<const RedisTlsContext> tls);

  [[nodiscard]] bool cluster() const { return cluster_; }

  // The store's options (a cluster's name no node: Address() is "cluster via <seeds>").
  [[nodiscard]] const RedisOptions& options() const { return options_; }

  // The pool of the master serving `slot` by the map as last read, reading the map again first
  // when it is stale. One server: its pool. kUnavailable if no node serves the slot.
  Result<std::shared_ptr<RedisConnectionPool>> PoolForSlot(int slot) LH_EXCLUDES(mu_);

  // The pool of node host:port (an ASK redirection's target), made on first use.
  std::shared_ptr<RedisConnectionPool> PoolForNode(const std::string& host, int port)
      LH_EXCLUDES(mu_);

  // The pool of each master of the map (one server: its pool), in slot order.
  Result<std::vector<std::shared_ptr<RedisConnectionPool>>> MasterPools() LH_EXCLUDES(mu_);

  // Every pool made so far (for the connect count), the seed pool first.
  std::vector<std::shared_ptr<RedisConnectionPool>> AllPools() const LH_EXCLUDES(mu_);

  // The pool that carries the store's counters and script SHAs, and that the subscriber
  // connects through: one server's pool; in a cluster, one whose connections go to the first
  // seed that answers (PUBLISH reaches every node of a cluster, so any node hears every
  // release).
  [[nodiscard]] const std::shared_ptr<RedisConnectionPool>& seed_pool() const { return seed_; }

  // A MOVED reply: `slot` is served by host:port now. The map is marked stale too, for the
  // other slots that moved with it.
  void Moved(int slot, const std::string& host, int port) LH_EXCLUDES(mu_);

  // A node failed to answer: the map may be stale (a failover), read it again before the next
  // command (no-op for one server).
  void MarkStale() LH_EXCLUDES(mu_);

  // Cluster: the masters of the map as last read.
  std::vector<ClusterShard> Shards() const LH_EXCLUDES(mu_);

  // Cluster: slot map reads so far (the one at open included).
  [[nodiscard]] std::uint64_t refreshes() const LH_EXCLUDES(mu_);

 private:
  RedisRouter(RedisOptions options, Clock& clock, std::shared_ptr<const RedisTlsContext> tls);

  // Reads CLUSTER SLOTS from the masters as last read, then from the seeds, until one answers.
  Status Refresh() LH_EXCLUDES(mu_);
  // The map from one CLUSTER SLOTS reply of node `asked`.
  Status ApplySlots(const redisReply* reply, const std::string& asked_host) LH_EXCLUDES(mu_);
  std::shared_ptr<RedisConnectionPool> PoolForNodeLocked(const std::string& host, int port)
      LH_REQUIRES(mu_);

  const bool cluster_;
  const RedisOptions options_;
  Clock& clock_;
  const std::shared_ptr<const RedisTlsContext> tls_;
  std::shared_ptr<RedisConnectionPool> seed_;

  mutable Mutex mu_;
  // "host:port" -> its pool; pools are never dropped (one of a dead node holds no connection).
  std::map<std::string, std::shared_ptr<RedisConnectionPool>> nodes_ LH_GUARDED_BY(mu_);
  // Slot -> the pool of its master, null for an unserved slot.
  std::vector<std::shared_ptr<RedisConnectionPool>> slots_ LH_GUARDED_BY(mu_);
  std::vector<ClusterShard> shards_ LH_GUARDED_BY(mu_);
  bool stale_ LH_GUARDED_BY(mu_) = false;
  bool refreshing_ LH_GUARDED_BY(mu_) = false;
  SteadyTime last_refresh_ LH_GUARDED_BY(mu_){};
  std::uint64_t refreshes_ LH_GUARDED_BY(mu_) = 0;
};

}  // namespace leasehold::internal
