// File: bench/floor.h
//
// The floor of a store: its own cheapest round trip, made through the same client library the
// backend uses, on a connection of its own. leasehold-bench divides every figure by it.
//
//   Redis PING · PostgreSQL SELECT 1 · etcd Range of a missing key · ZooKeeper exists ·
//   SQLite an empty BEGIN IMMEDIATE/COMMIT.
//
// Each store's probe lives in bench/floor_<store>.cc, built only when the store is.

#pragma once

#include <functional>
#include <memory>
#include <string>

#include "leasehold/status.h"

namespace leasehold::bench {

// A connected probe. Call() performs exactly one round trip and returns its status.
class FloorProbe {
 public:
  virtual ~FloorProbe() = default;
  virtual Status Call() = 0;
};

// Each opens its own connection to the store at `url` (the same URL leasehold would use).
Result<std::unique_ptr<FloorProbe>> OpenSqliteFloor(const std::string& url);

// The durable floor of the stores whose grant must reach a disk before it is answered: the
// store's cheapest write. The floors above do not write, so they never pay the flush.
//   SQLite: a one-row write committed with synchronous=FULL in WAL mode, on a scratch file
//           beside the store's · etcd: a Put of a scratch key (one raft entry, WAL fsync) ·
//   ZooKeeper: a setData of a scratch node (one transaction-log entry, fsync).
Result<std::unique_ptr<FloorProbe>> OpenSqliteDurableFloor(const std::string& url);
Result<std::unique_ptr<FloorProbe>> OpenEtcdDurableFloor(const std::string& url);
Result<std::unique_ptr<FloorProbe>> OpenZkDurableFloor(const std::string& url);
Result<std::unique_ptr<FloorProbe>> OpenRedisFloor(const std::string& url);
Result<std::unique_ptr<FloorProbe>> OpenPostgresFloor(const std::string& url);
Result<std::unique_ptr<FloorProbe>> OpenEtcdFloor(const std::string& url);
Result<std::unique_ptr<FloorProbe>> OpenZkFloor(const std::string& url);

}  // namespace leasehold::bench
