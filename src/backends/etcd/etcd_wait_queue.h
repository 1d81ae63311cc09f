// File: backends/etcd/etcd_wait_queue.h (internal)
//
// EtcdWaitQueue: the waiters' places in the keys' queues of an etcd:// backend (fair=true).
// A waiter's place is the key "<prefix>\0queue/<lease name>\0<waiter id>" on an etcd lease of
// its own, so that it goes away by itself when the waiter dies; its create revision orders the
// queue, as in etcd's own concurrency.Mutex. The NUL bytes keep the queue out of every
// "<prefix>/..." range (leases, list) and make one key's queue no prefix of another's (lease
// names contain no NUL). Each waiter's attempt refreshes its entry once a third of the entry's
// TTL has passed (one keep-alive on the backend's stream).
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(QueueEntry entry, queue.Enqueue(key, waiter_id, ttl_seconds));
//   ... the acquire Txn compares that no entry of the queue is older than entry ...
//   queue.Dequeue(key, waiter_id);   // granted, or given up: revokes the entry's lease
//
// Thread safety: thread-safe (mu_ guards the table of this backend's waiters).

#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "backends/etcd/etcd_client.h"
#include "backends/etcd/etcd_keepalive.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// A waiter's place in a key's queue: its key there, the create revision that orders it, and the
// lease that removes it if the waiter dies. `refreshed` is on the client's Clock.
struct QueueEntry {
  std::string key;  // the lease name
  std::string queue_key;
  int64_t create_revision = 0;
  int64_t lease_id = 0;
  int64_t ttl_seconds = 0;
  SteadyTime refreshed{};
};

class EtcdWaitQueue {
 public:
  // REQUIRES: `client` and `keepalive` outlive this object.
  EtcdWaitQueue(EtcdClient& client, EtcdKeepAlive& keepalive)
      : client_(client), keepalive_(keepalive) {}

  // Where the waiters of `key` queue: "<prefix>\0queue/<key>\0" (each entry adds its waiter id).
  static std::string Prefix(std::string_view prefix, std::string_view key);

  // Returns the waiter's queue entry for `key`, creating it (a lease of `ttl_seconds` and a
  // Put if absent) or refreshing its lease (a keep-alive, once a third of its TTL has passed).
  // An entry that expired meanwhile is created again, at the back. Returns kUnavailable if etcd
  // does not answer.
  Result<QueueEntry> Enqueue(std::string_view key, std::string_view waiter_id, int64_t ttl_seconds)
      LH_EXCLUDES(mu_);

  // Writer intent (fair=false): the waiter's own etcd lease, which carries the key's intent key
  // (the acquire Txn puts it). Returns the lease if this backend has one for the waiter and key,
  // refreshed with one keep-alive once a third of its TTL has passed; nullopt if it has none or
  // it expired (forgotten then). Returns kUnavailable if etcd does not answer the keep-alive.
  Result<std::optional<int64_t>> IntentLease(std::string_view key, std::string_view waiter_id)
      LH_EXCLUDES(mu_);

  // Grants the waiter a lease of `ttl_seconds` for its writer intent on `key` (replacing any
  // it had, which is revoked). Returns kUnavailable if etcd does not answer.
  Result<int64_t> GrantIntentLease(std::string_view key, std::string_view waiter_id,
                                   int64_t ttl_seconds) LH_EXCLUDES(mu_);

  // Forgets the waiter's entry (a queue entry or an intent lease); with `revoke`, revokes its
  // lease (which deletes the entry or the intent and wakes the waiters behind it).
  void Dequeue(std::string_view key, std::string_view waiter_id, bool revoke = true)
      LH_EXCLUDES(mu_);

  // When the waiter should be back for its entry's keep-alive (SteadyTime::max() if unknown).
  SteadyTime RefreshDue(std::string_view waiter_id) LH_EXCLUDES(mu_);

 private:
  EtcdClient& client_;
  EtcdKeepAlive& keepalive_;

  Mutex mu_;
  std::map<std::string, QueueEntry, std::less<>> waiters_ LH_GUARDED_BY(mu_);  // by waiter id
};

}  // namespace leasehold::internal
