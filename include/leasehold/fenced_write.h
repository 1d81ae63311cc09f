// File: leasehold/fenced_write.h
//
// FencedWrite: writes to data kept in the lease's own store, applied by the store only while
// the lease's grant is still live and still this lease's, checked in the same atomic step as
// the write (Lease::Write). A holder that was paused past its TTL (GC, SIGSTOP, a VM freeze)
// and wakes up after another process took the key cannot write: the store refuses, whatever
// the paused process believes. This is the fencing rule applied by the lease store itself.
//
// Per store (the README's "Fencing" table has the whole picture):
//   redis://     one Lua script: the grant hash still holds this lease's owner token, then the
//                ops (Put: SET, Delete: DEL, HashSet: HSET), every op checked before the first
//                write (an HSET target must be a hash or absent). Data keys must not start
//                with "<prefix>:" (the store's own keys); to keep them in the lease's cluster
//                slot, name them with the lease's hash tag (the "{...}" of Lease::store_key()).
//   etcd://      one Txn: If CreateRevision(Lease::store_key()) == fencing_token, Then the ops
//                (Put, without an etcd lease; Delete) on keys outside the store's own
//                ("<prefix>/...", "<prefix>\0..."). One write may not put a key twice, or put
//                and delete it (etcd refuses such a Txn). Not sent again to another member
//                after no answer (kUnavailable).
//   zk://        one multi: a check that this grant's node (Lease::store_key(), its path in the
//                URL's chroot) still exists, then the ops on absolute node paths in the chroot
//                (Put: setData, or create where the node is absent; Delete) outside leasehold's
//                own nodes (/leasehold, /leasehold-clock). A parent must exist.
//   sqlite://    one BEGIN IMMEDIATE transaction on the store's file: the key's row still holds
//                this lease's owner token and has not expired, then the Sql statements.
//   postgres://  one transaction: table mode checks the key's row (FOR SHARE, expiry on the
//                server's clock); advisory mode runs on the session that holds the advisory
//                lock and checks the lock is still held. Then the Sql statements.
//   memory://    the in-process table checks the grant (Put, Delete), for unit tests.
//
// Tokens: this check is stricter than the token rule of leasehold/fencing.h ("accept a token >=
// the highest seen"). The current grant writes any number of times (its token is equal every
// time); a grant that was superseded (a lower token than the key's newest) is refused; and so is
// a grant that merely expired, even if nobody took the key since (on etcd:// only once the
// server has revoked the expired etcd lease, which its leader does within about 500 ms, later
// across a leader change; no other grant can exist before that). It compares the owner token or
// the grant's own identity, never only the number, so a store that lost its fencing counter in a
// restart (Redis without persistence, Store::fencing_survives_restart()) still refuses every old
// holder: a restart ends every grant of such a store.
//
// Example (Redis):
//
//   auto lease = store->Acquire("invoices:2026-11", {.ttl = 30s});
//   if (!lease.ok()) return lease.status();
//   auto done = lease->Write(leasehold::FencedWrite()
//                                .Put("invoices:2026-11:status", "sent")
//                                .Delete("invoices:2026-11:draft"));
//   if (done.status().code() == leasehold::StatusCode::kLost) { /* fenced out: stop */ }
//
// Thread safety: FencedWrite is a plain value; Lease::Write as leasehold/lease.h says.

#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace leasehold {

// The most ops one FencedWrite may carry, and the most bytes (keys, fields, values, statements
// and parameters together): every store applies one write as one request, and etcd and
// ZooKeeper cap a request near 1 MiB.
inline constexpr std::size_t kMaxFencedOps = 64;
inline constexpr std::size_t kMaxFencedWriteBytes = 512 * 1024;

// One operation of a FencedWrite.
struct FencedOp {
  enum class Kind {
    // Sets `key` to `value` (key-value stores: redis, etcd, zk, memory).
    kPut,
    // Deletes `key` (key-value stores); deleting a missing key changes nothing.
    kDelete,
    // Sets `field` of the hash `key` to `value` (redis only).
    kHashSet,
    // Runs the statement in `key` with `params` bound as text to $1, $2... (sqlite, postgres;
    // SQLite also takes ?1, ?2...). One statement per op.
    kSql,
  };
  Kind kind = Kind::kPut;
  std::string key;
  std::string field;
  std::string value;
  std::vector<std::string> params;
};

// Returns "put", "delete", "hash-set" or "sql".
const char* FencedOpKindName(FencedOp::Kind kind);

// A list of operations applied in order, all or none (Lease::Write).
class FencedWrite {
 public:
  FencedWrite& Put(std::string key, std::string value) {
    ops_.push_back(
        {.kind = FencedOp::Kind::kPut, .key = std::move(key), .value = std::move(value)});
    return *this;
  }

  FencedWrite& Delete(std::string key) {
    ops_.push_back({.kind = FencedOp::Kind::kDelete, .key = std::move(key)});
    return *this;
  }

  FencedWrite& HashSet(std::string key, std::string field, std::string value) {
    ops_.push_back({.kind = FencedOp::Kind::kHashSet,
                    .key = std::move(key),
                    .field = std::move(field),
                    .value = std::move(value)});
    return *this;
  }

  FencedWrite& Sql(std::string statement, std::vector<std::string> params = {}) {
    ops_.push_back(
        {.kind = FencedOp::Kind::kSql, .key = std::move(statement), .params = std::move(params)});
    return *this;
  }

  [[nodiscard]] const std::vector<FencedOp>& ops() const { return ops_; }

 private:
  std::vector<FencedOp> ops_;
};

// What a committed FencedWrite did: one count per op, in order. kSql: the rows the statement
// changed as the database reports them (0 for a statement that changes none, such as CREATE
// TABLE; on PostgreSQL, a SELECT whose WITH clause modifies rows reports the rows it selected);
// kDelete: the keys deleted (0 or 1); kPut and kHashSet: 1.
struct FencedWriteResult {
  std::vector<std::int64_t> affected;
};

}  // namespace leasehold
