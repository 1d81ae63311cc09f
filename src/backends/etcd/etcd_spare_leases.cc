// File: backends/etcd/etcd_spare_leases.cc (internal)
//
// EtcdSharedLeases. See etcd_spare_leases.h.

#include "backends/etcd/etcd_spare_leases.h"

#include <algorithm>

namespace leasehold::internal {

EtcdSharedLeases::~EtcdSharedLeases() {
  std::vector<int64_t> ids;
  {
    MutexLock lock(&mu_);
    closing_ = true;
    for (const auto& [id, entry] : leases_) {
      ids.push_back(id);
    }
    leases_.clear();
    current_.clear();
  }
  for (int64_t id : ids) {
    client_.RevokeInBackground(id);
  }
  client_.WaitForBackgroundCalls();
}

std::optional<SharedLease> EtcdSharedLeases::Attach(int64_t seconds) {
  MutexLock lock(&mu_);
  auto cur = current_.find(seconds);
  if (cur == current_.end()) {
    return std::nullopt;
  }
  auto it = leases_.find(cur->second);
  if (it == leases_.end()) {
    current_.erase(cur);
    return std::nullopt;
  }
  ++it->second.keys;
  return it->second.lease;
}

void EtcdSharedLeases::AddCurrent(int64_t seconds, SharedLease lease) {
  std::optional<int64_t> revoke;
  {
    MutexLock lock(&mu_);
    if (closing_) {
      revoke = lease.id;
    } else {
      auto cur = current_.find(seconds);
      if (cur != current_.end() && cur->second != lease.id) {
        auto old = leases_.find(cur->second);
        if (old != leases_.end() && old->second.keys == 0) {
          revoke = old->first;  // an empty spare replaced by the new lease
          leases_.erase(old);
        }
      }
      current_[seconds] = lease.id;
      Entry& entry = leases_[lease.id];
      entry.lease = lease;
      ++entry.keys;
    }
  }
  if (revoke) {
    client_.RevokeInBackground(*revoke);
  }
}

void EtcdSharedLeases::Detach(int64_t id) {
  bool revoke = false;
  {
    MutexLock lock(&mu_);
    auto it = leases_.find(id);
    if (it == leases_.end()) {
      return;
    }
    if (it->second.keys > 0) {
      --it->second.keys;
    }
    if (it->second.keys > 0) {
      return;
    }
    auto cur = current_.find(it->second.lease.ttl_seconds);
    const bool is_current = cur != current_.end() && cur->second == id;
    if (is_current && keep_spare_) {
      return;  // the spare of its class
    }
    if (is_current) {
      current_.erase(cur);
    }
    leases_.erase(it);
    revoke = true;
  }
  if (revoke) {
    client_.RevokeInBackground(id);
  }
}

void EtcdSharedLeases::Forget(int64_t id) {
  MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) {
    return;
  }
  auto cur = current_.find(it->second.lease.ttl_seconds);
  if (cur != current_.end() && cur->second == id) {
    current_.erase(cur);
  }
  leases_.erase(it);
}

std::vector<SharedLease> EtcdSharedLeases::All() {
  MutexLock lock(&mu_);
  std::vector<SharedLease> out;
  out.reserve(leases_.size());
  for (const auto& [id, entry] : leases_) {
    out.push_back(entry.lease);
  }
  return out;
}

void EtcdSharedLeases::Renewed(int64_t id, std::optional<int64_t> ttl, SteadyTime sent) {
  if (ttl && *ttl <= 0) {
    Forget(id);
    return;
  }
  MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it != leases_.end() && ttl) {
    it->second.lease.refreshed = std::max(it->second.lease.refreshed, sent);
  }
}

std::size_t EtcdSharedLeases::size() const {
  MutexLock lock(&mu_);
  return leases_.size();
}

}  // namespace leasehold::internal
