// File: backends/etcd/etcd_spare_leases.h (internal)
//
// EtcdSpareLeases: the etcd leases an etcd:// backend grants ahead of time (spare_lease=true),
// at most one per TTL in whole seconds and kMaxSpares in all, with no key attached, so that an
// acquire needs only its Txn and a conflict costs one Txn (the lease of a failed try is kept
// for the next one). They ride along in the keep-alive rounds of the held leases (Spares(),
// then SpareRenewed() with each answer), so they stay young enough to be used: a spare is
// taken only while its remaining TTL is at least 3/4 of its TTL.
//
// Example:
//
//   std::optional<SpareLease> spare = spares.Take(seconds, now);
//   ... Txn with spare->id, or a LeaseGrant of its own ...
//   spares.Refill(seconds);      // grant the next one in the background
//
// Thread safety: thread-safe (mu_). The background grants' callbacks run on gRPC threads; the
// destructor waits for them.

#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "leasehold/clock.h"

#include "backends/etcd/etcd_client.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// An etcd lease with no key attached yet. `refreshed` is when the request that last set its TTL
// (grant or keep-alive) was sent, on the client's Clock: etcd keeps the lease at least until
// refreshed + ttl.
struct SpareLease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;
  SteadyTime refreshed{};
};

class EtcdSpareLeases {
 public:
  // REQUIRES: `client` outlives this object.
  explicit EtcdSpareLeases(EtcdClient& client) : client_(client) {}

  EtcdSpareLeases(const EtcdSpareLeases&) = delete;
  EtcdSpareLeases& operator=(const EtcdSpareLeases&) = delete;
  EtcdSpareLeases(EtcdSpareLeases&&) = delete;
  EtcdSpareLeases& operator=(EtcdSpareLeases&&) = delete;

  // Revokes the spares (they carry no key: better than leaving them to expire) and waits for
  // the background grants' callbacks.
  ~EtcdSpareLeases();

  // Takes the spare lease of `seconds` if it is young enough: its remaining TTL, judged from
  // `now` (read after the core's t_send), must be at least 3/4 of its TTL. An older one is
  // revoked.
  std::optional<SpareLease> Take(int64_t seconds, SteadyTime now) LH_EXCLUDES(mu_);

  // Keeps `spare` (unused: no key attached) for the next acquire of `seconds`, unless one is
  // kept already, in which case it is revoked.
  void Keep(int64_t seconds, SpareLease spare) LH_EXCLUDES(mu_);

  // Grants a spare lease of `seconds` in the background (no waiting for the reply), unless one
  // is kept or on its way.
  void Refill(int64_t seconds) LH_EXCLUDES(mu_);

  // The spare leases, for a keep-alive round.
  std::vector<SpareLease> Spares() LH_EXCLUDES(mu_);

  // After a keep-alive round sent at `sent`: moves a spare's refresh time forward, or drops it
  // if etcd says it is gone.
  void Renewed(int64_t id, std::optional<int64_t> ttl, SteadyTime sent) LH_EXCLUDES(mu_);

 private:
  // At most this many spare leases (one per distinct TTL in whole seconds).
  static constexpr std::size_t kMaxSpares = 4;

  EtcdClient& client_;

  Mutex mu_;
  std::map<int64_t, SpareLease> spares_ LH_GUARDED_BY(mu_);  // by TTL seconds
  std::set<int64_t> refilling_ LH_GUARDED_BY(mu_);
  bool closing_ LH_GUARDED_BY(mu_) = false;
};

}  // namespace leasehold::internal
