// File: bench/native.h
//
// The native floor of a store: the cheapest CORRECT lock a user could write by hand with the
// same client library the backend uses, on a connection of its own. leasehold-bench measures it
// beside leasehold (uncontended try-acquire + release, and the 8-process handoff) and prints
// every leasehold figure as a ratio to it: the limit leasehold's machinery (fencing, heartbeat,
// metrics, the lost signal) is measured against. None of them fences, renews or reports a loss.
//
//   redis              SET key token NX PX ttl; release: EVALSHA of a compare-and-delete script
//                      that also PUBLISHes the release; wait: SUBSCRIBE to that channel, retry
//                      on each message (bench/native_redis.cc)
//   postgres_advisory  prepared pg_try_advisory_lock / pg_advisory_unlock; wait: a blocking
//                      prepared pg_advisory_lock (the server's queue) (native_postgres.cc)
//   postgres_table     prepared UPDATE ... RETURNING on a pre-inserted row of a table of its own;
//                      release: an owner-checked UPDATE that also pg_notify()s; wait: LISTEN,
//                      retry on each notification (native_postgres.cc)
//   etcd               put-if-absent Txn (create_revision == 0 -> Put with an already-granted
//                      lease); release: Txn on the create revision -> DeleteRange; wait: Watch
//                      the key for its delete from the refusal's revision (native_etcd.cc)
//   zk                 ephemeral create of a fixed node; release: delete at version 0 (this
//                      session's node); wait: an exists watch on the node (native_zk.cc)
//   sqlite             one upsert (INSERT OR IGNORE semantics, taking over an expired row) on a
//                      scratch table in a scratch file beside the store's (WAL, synchronous=FULL,
//                      as leasehold); release: DELETE ... WHERE owner = ?; wait: retry with a
//                      1 ms sleep (native_sqlite.cc)
//
// Every lock's TTL is kNativeTtl (etcd: the lease granted when the lock opens).

#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "leasehold/status.h"

namespace leasehold::bench {

inline constexpr std::chrono::milliseconds kNativeTtl{10'000};

// A hand-written lock on one key. Not thread-safe: one thread uses it.
class NativeLock {
 public:
  virtual ~NativeLock() = default;
  // One attempt: true when this lock now holds the key, false when another holds it.
  virtual Result<bool> TryAcquire() = 0;
  // Waits (by the store's strategy above) until held; kDeadlineExceeded after `deadline`.
  virtual Status Acquire(std::chrono::steady_clock::time_point deadline) = 0;
  // Releases a key this lock holds (owner-checked: another's grant is never removed).
  virtual Status Release() = 0;
};

// `kind` is one of the names above; `url` the store's leasehold URL; `key` the lock's name.
Result<std::unique_ptr<NativeLock>> OpenNativeLock(const std::string& kind, const std::string& url,
                                                   const std::string& key);

Result<std::unique_ptr<NativeLock>> OpenRedisNative(const std::string& url, const std::string& key);
Result<std::unique_ptr<NativeLock>> OpenPostgresAdvisoryNative(const std::string& url,
                                                               const std::string& key);
Result<std::unique_ptr<NativeLock>> OpenPostgresTableNative(const std::string& url,
                                                            const std::string& key);
Result<std::unique_ptr<NativeLock>> OpenEtcdNative(const std::string& url, const std::string& key);
Result<std::unique_ptr<NativeLock>> OpenZkNative(const std::string& url, const std::string& key);
Result<std::unique_ptr<NativeLock>> OpenSqliteNative(const std::string& url,
                                                     const std::string& key);

// A random owner token (hex), different in every process and call.
std::string NativeOwnerToken();

}  // namespace leasehold::bench
