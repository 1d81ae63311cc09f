// File: testing/store_fixtures.h
//
// One fixture per store and mode, shared by the conformance suite and leasehold-bench: each
// hands out URLs of fresh, empty stores (their own key prefix, schema, chroot or file), and
// starts its real server on first use, in a temporary directory on free loopback ports, stopped
// at exit. A store joins by adding its row to AllStoreFixtures() (store_fixtures.cc).
//
// Example:
//
//   for (const testing::StoreFixture& fixture : testing::AllStoreFixtures()) {
//     std::string url = fixture.new_store_url(scratch_dir);   // e.g.
//     redis://127.0.0.1:PORT/0?prefix=... auto store = Store::Open(url);
//   }
//
// Thread safety: AllStoreFixtures() and every function of a fixture are thread-safe.

#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "leasehold/status.h"

namespace leasehold::testing {

// How the servers start: set before the first fixture is used (later calls have no effect on
// servers already started).
struct StoreFixtureOptions {
  // Redis with appendonly and appendfsync always (every write on disk before its reply), so that
  // fencing counters survive a restart. The bench measures Redis without persistence.
  bool redis_aof = true;
  // PostgreSQL's max_connections.
  int postgres_max_connections = 300;
};

void SetStoreFixtureOptions(const StoreFixtureOptions& options);

struct StoreFixture {
  // The store and its mode: "memory", "sqlite", "redis", "redis_fair", "rediss" (TLS),
  // "postgres_advisory", "postgres_table", "postgres_table_pgbouncer", "etcd", "etcd_fair",
  // "zk".
  std::string name;
  // Waiters queue in the store (fair=true): the fairness targets apply.
  bool fair = false;
  // Measured by leasehold-bench by default (memory:// is in-process; the PgBouncer path is table
  // mode again; redis_sentinel is the redis row behind a learnt address).
  bool in_bench = true;
  // Starts the store's server if it has one and it is not running yet; returns why it would not
  // start (kUnavailable), the same answer on every later call.
  std::function<Status()> start;
  // Returns the URL of a fresh, empty store (for sqlite://, the file leases.db in `scratch_dir`,
  // which must be a fresh directory for a fresh store; unused by the others). If the
  // server would not start, the URL names an unreachable port, so every open fails (and start()
  // says why).
  std::function<std::string(const std::string& scratch_dir)> new_store_url;
  // The server's own count of requests it has read, where it keeps one (Redis
  // total_reads_processed, PostgreSQL transactions, etcd gRPC messages, ZooKeeper packets);
  // null for stores without a server.
  std::function<std::optional<double>()> server_requests;
  std::string server_requests_what;
  // Reads data a fenced write (Lease::Write) left in the store named by `url`, with the store's
  // own client, not through leasehold: for a key-value store the value at `data_key` (a Redis or
  // etcd key, a ZooKeeper node path in the URL's chroot); for a SQL store the column v of the row
  // k = data_key in the table kFencedDataTable. Returns nullopt if there is none.
  std::function<Result<std::optional<std::string>>(const std::string& url,
                                                   const std::string& data_key)>
      read_data;
};

// The table (k text primary key, v text) the conformance suite writes into on SQL stores, made
// by the fixture where the server is shared (PostgreSQL: in its default schema), else by the
// suite's CREATE TABLE IF NOT EXISTS.
inline constexpr const char* kFencedDataTable = "leasehold_conformance_data";

// Every store compiled into this build, memory:// first.
const std::vector<StoreFixture>& AllStoreFixtures();

// Names the fixture in gtest output (a TEST_P parameter) instead of dumping its bytes.
inline void PrintTo(const StoreFixture& fixture, std::ostream* os) {
  *os << fixture.name;
}

}  // namespace leasehold::testing
