// File: backends/redis/redis_options.h (internal)
//
// RedisOptions: how a redis:// store is reached. The URL and this struct are two views of one
// configuration:
//
//   redis://[user[:password]@]host[:port][/db][?param=value&...]
//   rediss://[user[:password]@]host[:port][/db][?ca=...&cert=...&key=...&sni=...&...]  (TLS)
//   redis+unix://[user[:password]@]/path/to/redis.sock[?db=N&...]
//   redis+sentinel://[user[:password]@]h1:p1[,h2:p2,...]/MASTER_NAME[/db][?...]    (Sentinel)
//   rediss+sentinel://...                                           (Sentinel, TLS everywhere)
//   redis+cluster://[user[:password]@]h1:p1[,h2:p2,...][/0][?...]               (Redis Cluster)
//   rediss+cluster://...                                             (Cluster, TLS everywhere)
//
// Parameters: connect_timeout, command_timeout (durations, e.g. 500ms), prefix (key
// namespace), min_replicas, replica_timeout, pool_size, fair, accept_eviction; rediss:// only: ca,
// cert, key, sni, insecure. Unknown parameters are errors.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("redis://app:secret@10.0.0.5:6380/2?prefix=jobs"));
//   LH_ASSIGN_OR_RETURN(RedisOptions options, RedisOptions::FromUrl(url));
//   LH_ASSIGN_OR_RETURN(auto backend, RedisBackend::Open(options));
//
// Thread safety: a plain value type.

#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "core/url.h"

namespace leasehold::internal {

inline constexpr int kRedisDefaultPort = 6379;
inline constexpr int kRedisSentinelDefaultPort = 26379;

struct RedisOptions {
  // TCP host and port. Unused when unix_socket is set.
  // Default: 127.0.0.1:6379.
  std::string host = "127.0.0.1";
  int port = kRedisDefaultPort;

  // Path of a Unix domain socket (redis+unix://). Default: empty (use TCP).
  std::string unix_socket;

  // TLS (rediss://): every connection is TLS 1.2 or later, and the server's certificate is
  // verified against `tls_ca` (or the system's trust store when it is empty), its name (or IP
  // address) against `tls_sni` or, when that is empty, the URL's host. URL: ca=/path/ca.pem
  // (a file, or a directory of hashed certificates), cert=/path/client.pem and key=/path/key.pem
  // (a client certificate, for servers with tls-auth-clients yes; both or neither), sni=NAME
  // (sent as the server name and checked in the certificate: for a host given by address),
  // insecure=true (no verification at all: only by that name, for tests). Default: off.
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_sni;
  bool tls_insecure = false;

  // Sentinel (redis+sentinel://): the sentinels to ask, in order, for the address of the master
  // named `sentinel_master`. Host and port above stay empty and 0 here: the pool keeps the
  // master as last learnt and connects with a copy that names it (asking again after any broken
  // connection, a READONLY reply, a server whose ROLE is not master, and following every
  // +switch-master). The URL's user and password are the master's; the sentinels are asked
  // without AUTH. Default: empty (a plain server).
  std::vector<std::pair<std::string, int>> sentinels;
  std::string sentinel_master;

  // Redis Cluster (redis+cluster://): the seed nodes, asked in turn for the slot map (CLUSTER
  // SLOTS) at open and whenever it is stale. The store's own options leave host and port empty
  // and 0; the cluster keeps one pool per node, whose copy of these options names that node (and
  // keeps this list, for messages). A pool whose options name no node (port 0) connects to the
  // first seed that answers: the subscriber's, since PUBLISH reaches every node of a cluster.
  // Only database 0 exists in a cluster. Default: empty (not a cluster).
  std::vector<std::pair<std::string, int>> cluster_nodes;

  // Every connection checks ROLE in its first round trip and is refused unless the server is a
  // master (set for Sentinel: a failover can leave a client's address pointing at a replica).
  bool require_master = false;

  // ACL user and password (AUTH user password; AUTH password when only a password is given).
  // The password never appears in logs or errors. Default: none (no AUTH).
  std::optional<std::string> user;
  std::optional<std::string> password;

  // Database number for SELECT. URL: the path (/2) for redis://, db=2 for redis+unix://.
  // Default: 0.
  int db = 0;

  // Bound on establishing one connection (TCP connect plus AUTH/SELECT).
  // URL: connect_timeout=2s. Default: 2 s.
  Duration connect_timeout = std::chrono::seconds(2);

  // Bound on one command's round trip (a pipelined batch counts as one).
  // URL: command_timeout=2s. Default: 2 s.
  Duration command_timeout = std::chrono::seconds(2);

  // Namespace of every key leasehold writes: "<prefix>:{<hex key>}". Lets several
  // applications (or test cases) share one database. Must not contain '{' or '}'.
  // URL: prefix=myapp. Default: "leasehold".
  std::string prefix = "leasehold";

  // After each acquire and renew, WAIT for this many replicas to acknowledge, within
  // replica_timeout; if fewer do, an acquire is undone and reported kUnavailable and a renew
  // counts as failed (kUnavailable). URL: min_replicas=1. Default: 0 (no WAIT).
  int min_replicas = 0;

  // Bound on the WAIT above. URL: replica_timeout=200ms. Default: 500 ms.
  Duration replica_timeout = std::chrono::milliseconds(500);

  // Most connections open at once for commands (the subscriber connection is extra).
  // URL: pool_size=4. Default: 4.
  int pool_size = 4;

  // Waiters queue in Redis beside the lease and are granted the key first come, first served;
  // a TryAcquire without a place in the queue (or behind its head) does not barge ahead. Every
  // handle that uses a key must agree on this: a handle with fair=false ignores the queue.
  // URL: fair=true. Default: false.
  bool fair = false;

  // Open refuses a server that may evict keys (maxmemory set with a maxmemory-policy other than
  // noeviction): an evicted grant lets another process take a key that is still held, and an
  // evicted fencing counter starts again at 1. This accepts the risk: Open then only warns.
  // URL: accept_eviction=true. Default: false.
  bool accept_eviction = false;

  // Returns "host:port" or "unix:/path" (never credentials), for messages; with Sentinel,
  // "master NAME at host:port", or "master NAME via sentinels h1:p1,..." before one is known;
  // with Cluster, "cluster node host:port", or "cluster via h1:p1,..." for the store as a whole.
  [[nodiscard]] std::string Address() const;

  // True for redis+sentinel:// and rediss+sentinel://.
  [[nodiscard]] bool sentinel() const { return !sentinel_master.empty(); }

  // True for redis+cluster:// and rediss+cluster://.
  [[nodiscard]] bool cluster() const { return !cluster_nodes.empty(); }

  // With Sentinel: "h1:p1,h2:p2" (for messages).
  [[nodiscard]] std::string SentinelList() const;

  // With Cluster: the seeds, "h1:p1,h2:p2" (for messages).
  [[nodiscard]] std::string ClusterList() const;

  // Builds options from a redis, rediss, redis+unix, redis(s)+sentinel or redis(s)+cluster URL.
  // Returns kInvalidArgument for another scheme, an unknown or malformed parameter (named in the
  // message), a bad port or db (a cluster's is 0), several hosts on a one-server URL, TLS
  // parameters on a plain URL, or cert= without key= (or the reverse).
  static Result<RedisOptions> FromUrl(const Url& url);
};

}  // namespace leasehold::internal
