// File: backends/etcd/etcd_spare_leases.cc (internal)
//
// EtcdSpareLeases. See etcd_spare_leases.h.

#include "backends/etcd/etcd_spare_leases.h"

#include <algorithm>
#include <chrono>

namespace leasehold::internal {

EtcdSpareLeases::~EtcdSpareLeases() {
  std::vector<int64_t> spares;
  {
    MutexLock lock(&mu_);
    closing_ = true;
    for (const auto& [seconds, spare] : spares_) {
      spares.push_back(spare.id);
    }
    spares_.clear();
  }
  for (int64_t id : spares) {
    client_.RevokeInBackground(id);
  }
  // A grant on its way calls Keep on this object: wait for it (Keep revokes it, closing_).
  client_.WaitForBackgroundCalls();
}

std::optional<SpareLease> EtcdSpareLeases::Take(int64_t seconds, SteadyTime now) {
  std::optional<SpareLease> stale;
  std::optional<SpareLease> taken;
  {
    MutexLock lock(&mu_);
    auto it = spares_.find(seconds);
    if (it == spares_.end()) {
      return std::nullopt;
    }
    const Duration age = now - it->second.refreshed;
    if (age >= Duration::zero() && age * 4 <= std::chrono::seconds(it->second.ttl_seconds)) {
      taken = it->second;
    } else {
      stale = it->second;
    }
    spares_.erase(it);
  }
  if (stale) {
    client_.RevokeInBackground(stale->id);
  }
  return taken;
}

void EtcdSpareLeases::Keep(int64_t seconds, SpareLease spare) {
  bool extra = false;
  {
    MutexLock lock(&mu_);
    if (closing_ || spares_.count(seconds) != 0 || spares_.size() >= kMaxSpares) {
      extra = true;
    } else {
      spares_[seconds] = spare;
    }
  }
  if (extra) {
    client_.RevokeInBackground(spare.id);
  }
}

void EtcdSpareLeases::Refill(int64_t seconds) {
  {
    MutexLock lock(&mu_);
    if (closing_ || spares_.count(seconds) != 0 || refilling_.count(seconds) != 0 ||
        spares_.size() + refilling_.size() >= kMaxSpares) {
      return;
    }
    refilling_.insert(seconds);
  }
  client_.counters().spare_grants.fetch_add(1, std::memory_order_relaxed);
  // Read before the send: the lease lives at least until sent + ttl.
  const SteadyTime sent = client_.clock().Now();
  client_.GrantInBackground(
      seconds,
      [this, seconds, sent](const grpc::Status& s, const etcdserverpb::LeaseGrantResponse& resp) {
        {
          MutexLock lock(&mu_);
          refilling_.erase(seconds);
        }
        if (s.ok() && resp.id() != 0 && resp.ttl() > 0) {
          Keep(seconds, {resp.id(), resp.ttl(), sent});
        }
      });
}

std::vector<SpareLease> EtcdSpareLeases::Spares() {
  MutexLock lock(&mu_);
  std::vector<SpareLease> out;
  for (const auto& [seconds, spare] : spares_) {
    out.push_back(spare);
  }
  return out;
}

void EtcdSpareLeases::Renewed(int64_t id, std::optional<int64_t> ttl, SteadyTime sent) {
  MutexLock lock(&mu_);
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    if (it->second.id != id) {
      continue;
    }
    if (ttl && *ttl <= 0) {
      spares_.erase(it);
    } else if (ttl) {
      it->second.refreshed = std::max(it->second.refreshed, sent);
    }
    return;
  }
}

}  // namespace leasehold::internal
