// File: backends/etcd/etcd_spare_leases.h (internal)
//
// EtcdSharedLeases: the etcd leases an etcd:// backend puts its grants' keys on: one live lease
// per TTL class (the granted TTL in whole seconds) shared by every grant of that TTL, as etcd's
// own concurrency.Session does. A renewal round is then one keep-alive per shared lease, however
// many keys ride on it. Each lease counts the keys attached to it (Attach before the acquire's
// Txn, Detach once the key is known not to be on it: a failed try, a release, a finish, a loss).
//
// The spare-lease trick is what this table does by itself: an acquire puts its key on the live
// lease of its class, with no LeaseGrant on the acquire path. With spare_lease=true the lease of
// a class stays (kept alive in the rounds, no key attached) when its last key goes, for the
// next acquire; with spare_lease=false it is revoked then. A lease is used only while its
// remaining TTL, judged from a time read after the core's t_send, is at least 2/3 of its TTL;
// an older one is refreshed first (one keep-alive: the backend does it, see TryAcquire).
//
// Example:
//
//   std::optional<SharedLease> lease = leases.Attach(seconds);
//   if (!lease) { ... LeaseGrant ...; leases.AddCurrent(seconds, granted); }
//   ... Txn that puts the key with lease->id; on failure leases.Detach(lease->id) ...
//
// Thread safety: thread-safe (mu_). Revokes are sent without waiting; the destructor revokes
// every lease (the handle's close: every key still on them goes with them) and waits for the
// background calls.

#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "leasehold/clock.h"

#include "backends/etcd/etcd_client.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// An etcd lease of this backend's. `refreshed` is when the request that last set its TTL (grant
// or keep-alive) was sent, on the client's Clock: etcd keeps the lease at least until
// refreshed + ttl_seconds.
struct SharedLease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;
  SteadyTime refreshed{};
};

class EtcdSharedLeases {
 public:
  // REQUIRES: `client` outlives this object.
  EtcdSharedLeases(EtcdClient& client, bool keep_spare)
      : client_(client), keep_spare_(keep_spare) {}

  EtcdSharedLeases(const EtcdSharedLeases&) = delete;
  EtcdSharedLeases& operator=(const EtcdSharedLeases&) = delete;
  EtcdSharedLeases(EtcdSharedLeases&&) = delete;
  EtcdSharedLeases& operator=(EtcdSharedLeases&&) = delete;

  // Revokes every lease and waits for the background calls.
  ~EtcdSharedLeases();

  // The current lease of `seconds`, with one more key counted on it; nullopt if the class has
  // none (the caller grants one and calls AddCurrent).
  std::optional<SharedLease> Attach(int64_t seconds) LH_EXCLUDES(mu_);

  // Makes `lease` (granted just now) the current lease of `seconds`, with one key counted on
  // it. A previous current lease stays while keys are on it (revoked when they are gone).
  void AddCurrent(int64_t seconds, SharedLease lease) LH_EXCLUDES(mu_);

  // One key attached by Attach/AddCurrent is not on lease `id` (any more). An empty lease is
  // revoked unless it is the current one of its class and spare_lease is on.
  void Detach(int64_t id) LH_EXCLUDES(mu_);

  // Forgets lease `id` (etcd said it is gone): the keys on it went with it.
  void Forget(int64_t id) LH_EXCLUDES(mu_);

  // The leases to keep alive in a round: every lease of this backend.
  std::vector<SharedLease> All() LH_EXCLUDES(mu_);

  // After a keep-alive sent at `sent`: moves the lease's refresh time forward (ttl > 0), forgets
  // it (ttl <= 0), or nothing (no answer).
  void Renewed(int64_t id, std::optional<int64_t> ttl, SteadyTime sent) LH_EXCLUDES(mu_);

  // The number of leases (for tests).
  std::size_t size() const LH_EXCLUDES(mu_);

 private:
  struct Entry {
    SharedLease lease;
    std::size_t keys = 0;
  };

  EtcdClient& client_;
  const bool keep_spare_;

  mutable Mutex mu_;
  std::map<int64_t, Entry> leases_ LH_GUARDED_BY(mu_);     // by lease id
  std::map<int64_t, int64_t> current_ LH_GUARDED_BY(mu_);  // TTL seconds -> lease id
  bool closing_ LH_GUARDED_BY(mu_) = false;
};

}  // namespace leasehold::internal
