// File: tests/testing/redis_server.h
//
// RedisServer: a throwaway redis-server for tests and benchmarks, on a free 127.0.0.1 port in
// its own temporary directory, never the system instance and never port 6379. It is stopped by
// PID (SIGKILL, then reaped) when the object is destroyed, and dies with the process that
// started it (PR_SET_PDEATHSIG) if that process crashes.
//
// Example:
//
//   auto server = leasehold::testing::RedisServer::Start({.aof = true});
//   ASSERT_TRUE(server.ok()) << server.status().ToString();
//   std::string url = (*server)->Url();           // redis://127.0.0.1:PORT
//   (*server)->Kill9();  (*server)->Restart();    // same port, same data directory
//
// Thread safety: not thread-safe; use from one test thread.

#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

#include "leasehold/status.h"

#include "testing/server_process.h"

namespace leasehold::testing {

struct RedisServerOptions {
  // appendonly yes with appendfsync always: every write is on disk before its reply.
  // Default: false (no persistence at all: --save '' --appendonly no).
  bool aof = false;
  // ACL lines written to an ACL file, e.g. "user app on >pw ~* &* +ping". Default: none.
  std::vector<std::string> acl_users;
  // Password of the default user (requirepass). Default: none.
  std::string requirepass;
  // How long Start/Restart wait for the server to answer PING. Default: 10 s.
  std::chrono::milliseconds ready_timeout{10'000};
  // Starts as a replica of the server on 127.0.0.1 at this port (--replicaof). Default: 0 (a
  // master).
  int replica_of = 0;
  // replica-priority: which replica Sentinel promotes first (the lowest); 0 means never.
  // Default: 100 (Redis's own).
  int replica_priority = 100;
  // TLS: a second port (tls_port(), TlsUrl()) speaks TLS only, with certificates that Start
  // makes with `openssl` in dir()/tls: a test CA (ca.crt), the server's certificate for
  // localhost and 127.0.0.1 signed by it, a client certificate (client.crt, client.key) signed
  // by it, and another CA that signed none of them (other-ca.crt). The plain port stays, for
  // Cli() and the test's own checks. Default: false.
  bool tls = false;
  // With tls: the server asks for a client certificate signed by the test CA
  // (tls-auth-clients yes). Default: false (none asked).
  bool tls_auth_clients = false;
  // With tls: the server presents a certificate that expired in 2020 (signed by the test CA,
  // made under faketime; Start fails if faketime is missing). Default: false.
  bool tls_expired = false;
  // With tls: copies the certificates from this directory (another server's dir()/tls) instead
  // of making new ones, so that the servers of one deployment (a cluster's nodes, which verify
  // each other on the bus and in replication) share one test CA. Default: empty (make new).
  std::string tls_certificates_from;
  // A Redis Cluster node (cluster-enabled yes, its nodes.conf in dir()), with its cluster bus on
  // a second free port (cluster_port()) and settings that make failover quick and always
  // possible: a replica may be promoted however long its master has been gone
  // (cluster-replica-validity-factor 0), and replicas are pinged every second. With tls, the
  // bus and replication are TLS too (tls-cluster, tls-replication), and the cluster announces
  // the TLS ports to TLS clients. The node starts alone; RedisClusterSetup (redis_cluster.h)
  // joins nodes into a cluster. Restart keeps nodes.conf: the node comes back as itself and
  // rejoins (a killed master whose replica took over, as that one's replica). Default: false.
  bool cluster = false;
  // With cluster: cluster-node-timeout, after which an unreachable node is suspected failing.
  // Default: 1000 ms.
  std::chrono::milliseconds cluster_node_timeout{1000};
};

class RedisServer {
 public:
  // Starts a server and waits until it answers. Returns kUnavailable if redis-server is missing
  // or does not come up within ready_timeout (its log tail is in the message). A start whose
  // port was taken meanwhile (by another test's server) is retried on new ports.
  static Result<std::unique_ptr<RedisServer>> Start(RedisServerOptions options = {});

  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  RedisServer(RedisServer&&) = delete;
  RedisServer& operator=(RedisServer&&) = delete;

  // Kills the server (SIGKILL by PID) and removes the temporary directory.
  ~RedisServer();

  [[nodiscard]] int port() const { return port_; }

  [[nodiscard]] pid_t pid() const { return pid_; }

  [[nodiscard]] const std::string& dir() const { return dir_; }

  // With cluster: the cluster bus port. Otherwise 0.
  [[nodiscard]] int cluster_port() const { return cluster_port_; }

  // Returns "redis://127.0.0.1:PORT" (add user info, path and query as needed).
  [[nodiscard]] std::string Url() const;

  // With tls: the TLS port, and "rediss://127.0.0.1:TLS_PORT" plus `path_and_query` with the
  // test CA as ca= appended to the query (path_and_query "/0?prefix=x" gives
  // rediss://127.0.0.1:P/0?prefix=x&ca=DIR/tls/ca.crt).
  [[nodiscard]] int tls_port() const { return tls_port_; }

  [[nodiscard]] std::string TlsUrl(const std::string& path_and_query = "") const;
  // A file of dir()/tls, e.g. TlsFile("client.key").
  [[nodiscard]] std::string TlsFile(const std::string& name) const;

  // kill -9, and reap. The port and data directory stay reserved for Restart().
  void Kill9();

  // Graceful stop (SIGTERM, wait).
  void Stop();

  // Starts again on the same port and data directory. Returns as Start does.
  Status Restart();

  // SIGSTOP / SIGCONT: the server stops answering without closing connections.
  void Pause();
  void Resume();

  // Runs one command with redis-cli against this server (as the default user) and returns its
  // output without the trailing newline, e.g. Cli({"INFO", "commandstats"}).
  Result<std::string> Cli(const std::vector<std::string>& args) const;

 private:
  RedisServer(RedisServerOptions options, std::string dir, int port, int tls_port,
              int cluster_port);

  // A server not yet launched, on ports picked now, with its directory, certificates and ACL
  // file ready.
  static Result<std::unique_ptr<RedisServer>> Prepare(const RedisServerOptions& options);

  Status MakeCertificates() const;
  Status Launch();

  const RedisServerOptions options_;
  const std::string dir_;
  const int port_;
  const int tls_port_;
  const int cluster_port_;
  pid_t pid_ = -1;
};

}  // namespace leasehold::testing
