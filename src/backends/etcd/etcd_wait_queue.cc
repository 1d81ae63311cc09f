// File: backends/etcd/etcd_wait_queue.cc (internal)
//
// EtcdWaitQueue. See etcd_wait_queue.h.

#include "backends/etcd/etcd_wait_queue.h"

#include <chrono>
#include <optional>
#include <vector>

#include <fmt/format.h>

namespace leasehold::internal {

namespace pb = etcdserverpb;

std::string EtcdWaitQueue::Prefix(std::string_view prefix, std::string_view key) {
  std::string q(prefix);
  q += '\0';
  q += "queue/";
  q += key;
  q += '\0';
  return q;
}

Result<QueueEntry> EtcdWaitQueue::Enqueue(std::string_view key, std::string_view waiter_id,
                                          int64_t ttl_seconds) {
  const SteadyTime now = client_.clock().Now();
  std::optional<QueueEntry> entry;
  {
    MutexLock lock(&mu_);
    auto it = waiters_.find(waiter_id);
    if (it != waiters_.end() && it->second.key == key) {
      entry = it->second;
    }
  }
  if (entry) {
    if ((now - entry->refreshed) * 3 < std::chrono::seconds(entry->ttl_seconds)) {
      return *entry;
    }
    std::vector<std::optional<int64_t>> ttl = keepalive_.KeepAlive({entry->lease_id});
    if (!ttl[0]) {
      return Status::Unavailable(
          fmt::format("no etcd member of {} answered the keep-alive of a queue entry",
                      client_.options().Address()));
    }
    if (*ttl[0] > 0) {
      MutexLock lock(&mu_);
      auto it = waiters_.find(waiter_id);
      if (it != waiters_.end()) {
        it->second.refreshed = now;
        return it->second;
      }
    }
    // The entry expired (the waiter was away too long): queue again, at the back.
    Dequeue(key, waiter_id);
  }
  pb::LeaseGrantRequest grant_req;
  grant_req.set_ttl(ttl_seconds);
  pb::LeaseGrantResponse grant_resp;
  LH_RETURN_IF_ERROR(client_.LeaseGrant("LeaseGrant (queue)", grant_req, &grant_resp));
  QueueEntry fresh;
  fresh.key = std::string(key);
  fresh.queue_key = Prefix(client_.options().prefix, key) + std::string(waiter_id);
  fresh.lease_id = grant_resp.id();
  fresh.ttl_seconds = grant_resp.ttl();
  fresh.refreshed = now;
  pb::TxnRequest txn;
  CompareCreateRevision(&txn, fresh.queue_key, 0);
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(fresh.queue_key);
  put->set_lease(fresh.lease_id);
  txn.add_failure()->mutable_request_range()->set_key(fresh.queue_key);
  pb::TxnResponse resp;
  Status s = client_.Txn("Txn (enqueue)", txn, &resp);
  if (!s.ok()) {
    client_.RevokeInBackground(fresh.lease_id);
    return s;
  }
  if (resp.succeeded()) {
    fresh.create_revision = resp.header().revision();
  } else {
    // Queued by an earlier attempt whose reply was lost: keep that entry and its lease.
    const auto& kvs = resp.responses(0).response_range().kvs();
    if (kvs.empty()) {
      client_.RevokeInBackground(fresh.lease_id);
      return Status::Unavailable("etcd queue entry vanished while being created");
    }
    client_.RevokeInBackground(fresh.lease_id);
    fresh.create_revision = kvs[0].create_revision();
    fresh.lease_id = kvs[0].lease();
  }
  MutexLock lock(&mu_);
  waiters_[std::string(waiter_id)] = fresh;
  return fresh;
}

Result<std::optional<int64_t>> EtcdWaitQueue::IntentLease(std::string_view key,
                                                          std::string_view waiter_id) {
  const SteadyTime now = client_.clock().Now();
  std::optional<QueueEntry> entry;
  {
    MutexLock lock(&mu_);
    auto it = waiters_.find(waiter_id);
    if (it != waiters_.end() && it->second.key == key && it->second.queue_key.empty()) {
      entry = it->second;
    }
  }
  if (!entry) {
    return std::optional<int64_t>();
  }
  if ((now - entry->refreshed) * 3 < std::chrono::seconds(entry->ttl_seconds)) {
    return std::optional<int64_t>(entry->lease_id);
  }
  std::vector<std::optional<int64_t>> ttl = keepalive_.KeepAlive({entry->lease_id});
  if (!ttl[0]) {
    return Status::Unavailable(
        fmt::format("no etcd member of {} answered the keep-alive of a writer intent",
                    client_.options().Address()));
  }
  if (*ttl[0] > 0) {
    MutexLock lock(&mu_);
    auto it = waiters_.find(waiter_id);
    if (it != waiters_.end() && it->second.lease_id == entry->lease_id) {
      it->second.refreshed = now;
      return std::optional<int64_t>(entry->lease_id);
    }
  }
  Dequeue(key, waiter_id, /*revoke=*/false);  // expired: its intent key went with it
  return std::optional<int64_t>();
}

Result<int64_t> EtcdWaitQueue::GrantIntentLease(std::string_view key, std::string_view waiter_id,
                                                int64_t ttl_seconds) {
  const SteadyTime now = client_.clock().Now();
  pb::LeaseGrantRequest grant_req;
  grant_req.set_ttl(ttl_seconds);
  pb::LeaseGrantResponse grant_resp;
  LH_RETURN_IF_ERROR(client_.LeaseGrant("LeaseGrant (writer intent)", grant_req, &grant_resp));
  if (grant_resp.id() == 0 || grant_resp.ttl() <= 0) {
    return Status::Internal(
        fmt::format("etcd granted lease {} with TTL {} s", grant_resp.id(), grant_resp.ttl()),
        grant_resp.error());
  }
  Dequeue(key, waiter_id);
  QueueEntry fresh;
  fresh.key = std::string(key);
  fresh.lease_id = grant_resp.id();
  fresh.ttl_seconds = grant_resp.ttl();
  fresh.refreshed = now;
  MutexLock lock(&mu_);
  waiters_[std::string(waiter_id)] = fresh;
  return fresh.lease_id;
}

void EtcdWaitQueue::Dequeue(std::string_view key, std::string_view waiter_id, bool revoke) {
  std::optional<QueueEntry> entry;
  {
    MutexLock lock(&mu_);
    auto it = waiters_.find(waiter_id);
    if (it == waiters_.end() || it->second.key != key) {
      return;
    }
    entry = it->second;
    waiters_.erase(it);
  }
  if (revoke) {
    client_.RevokeInBackground(entry->lease_id);
  }
}

SteadyTime EtcdWaitQueue::RefreshDue(std::string_view waiter_id) {
  MutexLock lock(&mu_);
  auto it = waiters_.find(waiter_id);
  if (it == waiters_.end()) {
    return SteadyTime::max();
  }
  return it->second.refreshed +
         std::chrono::duration_cast<Duration>(std::chrono::seconds(it->second.ttl_seconds)) / 3;
}

}  // namespace leasehold::internal
