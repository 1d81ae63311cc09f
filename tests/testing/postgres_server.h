// File: tests/testing/postgres_server.h
//
// PostgresServer: a throwaway PostgreSQL 15 for tests and benchmarks: a copy of one initdb'd
// cluster (made once per machine and user, in /tmp) in its own temporary directory (owned by
// the `postgres` OS user when run as root: initdb refuses root),
// the server on a free 127.0.0.1 port with its Unix socket in that directory, never the system
// instance. PgBouncer: a pooler in front of it (pool_mode = transaction by default). Both are
// stopped by PID when the object is destroyed, and die with the process that started them
// (PR_SET_PDEATHSIG) if it crashes.
//
// Example:
//
//   auto pg = leasehold::testing::PostgresServer::Start();
//   ASSERT_TRUE(pg.ok()) << pg.status().ToString();
//   std::string url = (*pg)->Url();                 // postgres://postgres@127.0.0.1:PORT/postgres
//   auto bouncer = leasehold::testing::PgBouncer::Start(**pg);
//   (*pg)->Psql("SELECT pg_terminate_backend(123)");
//
// Thread safety: not thread-safe; use from one test thread (Psql may be called from any).

#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

#include "leasehold/status.h"

namespace leasehold::testing {

struct PostgresServerOptions {
  // max_connections of the server. Default: 300.
  int max_connections = 300;
  // How long Start waits for the server to accept connections. Default: 30 s.
  std::chrono::milliseconds ready_timeout{30'000};
  // "NAME=value" settings added to the server's environment (through /usr/bin/env), e.g.
  // LD_PRELOAD of libfaketime. Default: none.
  std::vector<std::string> env;
};

class PostgresServer {
 public:
  // initdb + start + wait until ready. Returns kUnavailable if the binaries are missing or the
  // server does not come up in time (its log tail is in the message).
  static Result<std::unique_ptr<PostgresServer>> Start(PostgresServerOptions options = {});

  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;
  PostgresServer(PostgresServer&&) = delete;
  PostgresServer& operator=(PostgresServer&&) = delete;

  // Stops the server (SIGQUIT by PID: immediate shutdown, then SIGKILL) and removes the
  // temporary directory.
  ~PostgresServer();

  [[nodiscard]] int port() const { return port_; }

  [[nodiscard]] const std::string& dir() const { return dir_; }

  // The postmaster's process id (for SIGSTOP/SIGCONT: a paused host).
  [[nodiscard]] pid_t pid() const { return pid_; }

  // Returns "postgres://postgres@127.0.0.1:PORT/postgres" (add a query as needed).
  [[nodiscard]] std::string Url() const;

  // Runs `sql` with psql as the postgres superuser and returns its unaligned, tuples-only
  // output without the trailing newline.
  Result<std::string> Psql(const std::string& sql) const;

 private:
  PostgresServer(PostgresServerOptions options, std::string dir, int port);

  const PostgresServerOptions options_;
  const std::string dir_;
  const int port_;
  pid_t pid_ = -1;
};

enum class PoolMode { kSession, kTransaction };

class PgBouncer {
 public:
  // Starts pgbouncer in front of `server` on a free loopback port and waits until it answers.
  static Result<std::unique_ptr<PgBouncer>> Start(const PostgresServer& server,
                                                  PoolMode mode = PoolMode::kTransaction);

  PgBouncer(const PgBouncer&) = delete;
  PgBouncer& operator=(const PgBouncer&) = delete;
  PgBouncer(PgBouncer&&) = delete;
  PgBouncer& operator=(PgBouncer&&) = delete;

  // Stops pgbouncer by PID and removes its directory.
  ~PgBouncer();

  [[nodiscard]] int port() const { return port_; }

  // Returns "postgres://postgres@127.0.0.1:PORT/postgres".
  [[nodiscard]] std::string Url() const;

 private:
  PgBouncer(std::string dir, int port) : dir_(std::move(dir)), port_(port) {}

  const std::string dir_;
  const int port_;
  pid_t pid_ = -1;
};

// Returns a TCP port on 127.0.0.1 that was free a moment ago.
int PickFreePostgresPort();

// Runs `sql` with psql against 127.0.0.1:`port` (a server or a PgBouncer) as postgres.
Result<std::string> RunPsqlForTesting(int port, const std::string& sql);

}  // namespace leasehold::testing
