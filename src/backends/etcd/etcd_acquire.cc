// File: backends/etcd/etcd_acquire.cc (internal)
//
// The etcd:// store's TryAcquire: one Range of the key's grants, then one Txn that grants the
// request if nothing changed since (compares on create revisions).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/common/time.h"
#include "backends/etcd/etcd_backend.h"
#include "backends/etcd/etcd_client.h"
#include "backends/etcd/etcd_impl.h"
#include "backends/etcd/etcd_keepalive.h"
#include "backends/etcd/etcd_spare_leases.h"
#include "backends/etcd/etcd_value.h"
#include "backends/etcd/etcd_wait_queue.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

using namespace std::chrono_literals;

Result<Grant> EtcdBackend::TryAcquireOnce(const GrantRequest& request) {
  Impl& impl = *impl_;
  // Read after the core read t_send: every TTL reported below is measured from a time no
  // earlier than the core's, so the core's safe_until is never later than etcd's expiry.
  const SteadyTime now = clock_.Now();
  const int64_t seconds = LeaseSeconds(request.ttl);
  const std::string base = KeyName(options_.prefix, request.key);
  const std::string keys_end = KeysEnd(base);
  const bool semaphore = request.limit > 1;
  const bool shared = !semaphore && request.mode == LeaseMode::kShared;
  const bool exclusive = !semaphore && !shared;
  // Grants of this handle that the core has declared lost and whose keys are still in etcd (a
  // release that got no answer, or none sent) are deleted first. The renewal rounds' sweep does
  // that too, but a handle that holds nothing runs no rounds, and this acquire's use of their
  // shared lease (its refresh below, then the grant's keep-alives) would keep them alive: a
  // partition's lost holder that kept trying for its key kept its old grant of it alive, and
  // nobody got the key (partition_etcd's stall).
  SweepLost();
  {
    // An earlier acquire of this key whose Txn got no answer may have put a key on a shared
    // lease: delete it first (only if it is still exactly that grant), under orphan_mu so that
    // no round's delete of it can apply after this acquire's Txn.
    MutexLock lock(&impl.orphan_mu);
    for (auto it = impl.orphans.lower_bound(base);
         it != impl.orphans.end() && it->first < keys_end;) {
      LH_RETURN_IF_ERROR(DeleteOrphan(impl.client, it->second));
      it = impl.orphans.erase(it);
    }
  }
  // fair=true: a waiter takes (or keeps) its place in the key's queue first. Its entry lives
  // max(ttl, 10 s) without the waiter's attempts (each refreshes it once a third has passed);
  // a shared or semaphore waiter's only its ttl (etcd's 2 s at least): such waiters are many
  // and come and go, and every one that dies holds up the whole queue until its entry expires.
  const bool exclusive_waiter = request.limit == 1 && request.mode == LeaseMode::kExclusive;
  const int64_t queue_ttl = exclusive_waiter ? std::max(seconds, kMinQueueTtlSeconds) : seconds;
  std::optional<QueueEntry> entry;
  if (options_.fair && !request.waiter_id.empty()) {
    LH_ASSIGN_OR_RETURN(entry, impl.queue.Enqueue(request.key, request.waiter_id, queue_ttl));
  }
  // fair=false: a waiting writer's intent rides on a lease of its own (granted when it is first
  // refused, below), refreshed by its attempts.
  const bool wants_intent = !options_.fair && exclusive && !request.waiter_id.empty();
  std::optional<int64_t> intent_lease;
  if (wants_intent) {
    LH_ASSIGN_OR_RETURN(intent_lease, impl.queue.IntentLease(request.key, request.waiter_id));
  }
  // The key goes on the live shared lease of its TTL class (counted on it from here on; every
  // path below that does not keep the grant detaches it again).
  std::optional<SharedLease> attached = impl.shared.Attach(seconds);
  if (attached && (now - attached->refreshed) * 3 > std::chrono::seconds(attached->ttl_seconds)) {
    // Less than 2/3 of its TTL left (an idle spare: rounds run only while keys are held):
    // refresh it first with one keep-alive, sent after `sent` (itself after the core's t_send).
    const SteadyTime sent = clock_.Now();
    std::vector<std::optional<int64_t>> ttl = impl.keepalive.KeepAlive({attached->id});
    impl.shared.Renewed(attached->id, ttl[0], sent);
    if (ttl[0] && *ttl[0] > 0) {
      attached->refreshed = sent;
    } else {
      impl.shared.Detach(attached->id);
      if (!ttl[0]) {
        return Status::Unavailable(
            fmt::format("no etcd member of {} answered the keep-alive of the shared lease for {}",
                        options_.Address(), request.key));
      }
      attached.reset();  // gone in etcd (forgotten by Renewed): grant a new one
    }
  }
  SharedLease lease;
  if (attached) {
    lease = *attached;
    impl.client.counters().spare_used.fetch_add(1, std::memory_order_relaxed);
  } else {
    pb::LeaseGrantRequest grant_req;
    grant_req.set_ttl(seconds);
    pb::LeaseGrantResponse grant_resp;
    LH_RETURN_IF_ERROR(impl.client.LeaseGrant("LeaseGrant", grant_req, &grant_resp));
    lease = SharedLease{grant_resp.id(), grant_resp.ttl(), now};
    if (lease.id == 0 || lease.ttl_seconds <= 0) {
      return Status::Internal(
          fmt::format("etcd granted lease {} with TTL {} s", lease.id, lease.ttl_seconds),
          grant_resp.error());
    }
    impl.client.counters().spare_grants.fetch_add(1, std::memory_order_relaxed);
    impl.shared.AddCurrent(seconds, lease);
  }
  // What the core may count on: the lease's TTL less the time since it was last set (zero for
  // a lease granted just now: `now` was read before the grant was sent).
  const Duration reported =
      std::chrono::seconds(lease.ttl_seconds) - std::max(Duration::zero(), now - lease.refreshed);

  const std::string value =
      EncodeValue({request.owner_token, lease.ttl_seconds * 1000, request.holder});
  const std::string intent_key = Suffixed(base, kIntentTag);
  const std::string shared_prefix = Suffixed(base, kSharedTag);
  const std::string semaphores = Suffixed(base, kSemaphoreTag);
  std::uint32_t slot = 0;  // the first try: slot 0; a miss retries the smallest free one read
  for (int attempt = 0;; ++attempt) {
    const std::string grant_key = GrantKey(base, request.mode, request.limit, slot);
    // One Txn decides. Compares: the grants that would keep this request out are absent (each
    // family's keys are one range), its slot is free, and the lower slots are taken (the slot
    // is the smallest free one). Success: the Put (plus taking our queue entry or our intent
    // out). Failure: a Range of every key of the lease (plus recording our intent).
    pb::TxnRequest txn;
    if (exclusive) {
      CompareCreateRevision(&txn, base, 0);
      CompareRange(&txn, shared_prefix, PrefixEnd(shared_prefix), pb::Compare::EQUAL, 0);
      CompareRange(&txn, semaphores, PrefixEnd(semaphores), pb::Compare::EQUAL, 0);
    } else if (shared) {
      CompareCreateRevision(&txn, base, 0);
      CompareRange(&txn, semaphores, PrefixEnd(semaphores), pb::Compare::EQUAL, 0);
      CompareCreateRevision(&txn, intent_key, 0);
      CompareCreateRevision(&txn, grant_key, 0);
    } else {
      const std::string mine = SemaphorePrefix(base, request.limit);
      CompareCreateRevision(&txn, base, 0);
      CompareRange(&txn, shared_prefix, PrefixEnd(shared_prefix), pb::Compare::EQUAL, 0);
      // Every semaphore grant asks our limit: none below our limit's range, none above it.
      CompareRange(&txn, semaphores, mine, pb::Compare::EQUAL, 0);
      CompareRange(&txn, PrefixEnd(mine), PrefixEnd(semaphores), pb::Compare::EQUAL, 0);
      CompareCreateRevision(&txn, grant_key, 0);
    }
    if (!exclusive) {
      for (std::uint32_t j = slot > kLowerSlotCompares ? slot - kLowerSlotCompares : 0; j < slot;
           ++j) {
        pb::Compare* c = txn.add_compare();
        c->set_result(pb::Compare::GREATER);
        c->set_target(pb::Compare::CREATE);
        c->set_key(GrantKey(base, request.mode, request.limit, j));
        c->set_create_revision(0);
      }
    }
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(grant_key);
    put->set_value(value);
    put->set_lease(lease.id);
    pb::RangeRequest* read = txn.add_failure()->mutable_request_range();
    read->set_key(base);
    read->set_range_end(keys_end);
    if (intent_lease) {
      // Granted: our intent goes (only ours: compare its lease). Refused: our intent is
      // recorded unless a live one (another waiter's, or ours already) is there.
      pb::TxnRequest* clear = txn.add_success()->mutable_request_txn();
      pb::Compare* c = clear->add_compare();
      c->set_result(pb::Compare::EQUAL);
      c->set_target(pb::Compare::LEASE);
      c->set_key(intent_key);
      c->set_lease(*intent_lease);
      clear->add_success()->mutable_request_delete_range()->set_key(intent_key);
      pb::TxnRequest* record = txn.add_failure()->mutable_request_txn();
      CompareCreateRevision(record, intent_key, 0);
      CompareRange(record, semaphores, PrefixEnd(semaphores), pb::Compare::EQUAL, 0);
      pb::PutRequest* intent = record->add_success()->mutable_request_put();
      intent->set_key(intent_key);
      intent->set_value(EncodeValue({request.waiter_id, seconds * 1000, request.holder}));
      intent->set_lease(*intent_lease);
    }
    if (options_.fair) {
      // The queue must be empty, or (for a waiter) have nobody ahead of us: every entry's
      // create revision at least ours. The grant then takes our entry out of the queue. Every
      // kind admits the head only; its grant deletes its entry, which wakes the next waiter
      // (docs/impl.md).
      const std::string queue = EtcdWaitQueue::Prefix(options_.prefix, request.key);
      if (entry) {
        CompareRange(&txn, queue, PrefixEnd(queue), pb::Compare::GREATER,
                     entry->create_revision - 1);
        txn.add_success()->mutable_request_delete_range()->set_key(entry->queue_key);
      } else {
        CompareRange(&txn, queue, PrefixEnd(queue), pb::Compare::EQUAL, 0);
      }
    }
    pb::TxnResponse txn_resp;
    Status s = impl.client.Txn("Txn (acquire)", txn, &txn_resp);
    if (!s.ok()) {
      impl.shared.Detach(lease.id);
      if (s.detail().find("lease not found") != std::string_view::npos ||
          s.message().find("lease not found") != std::string_view::npos) {
        if (intent_lease) {
          // The intent's lease may be the one gone: forget it (the retry grants another).
          impl.queue.Dequeue(request.key, request.waiter_id, /*revoke=*/false);
        } else {
          impl.shared.Forget(lease.id);  // revoked behind our back: TryAcquire tries once more
        }
        return s;
      }
      // Unknown outcome: the Put may have been applied, and the shared lease (kept alive for
      // the other grants) would keep the key forever. Delete it if it is exactly our grant,
      // now or, if etcd does not answer, before the next acquire of the key or in the next
      // round.
      Orphan orphan{grant_key, value, clock_.Now() + 2 * options_.command_timeout};
      MutexLock lock(&impl.orphan_mu);
      (void)DeleteOrphan(impl.client, orphan);
      impl.orphans[grant_key] = std::move(orphan);
      return s;
    }
    if (txn_resp.succeeded()) {
      // The Put is the Txn's only write of a key it creates: the Txn's revision is the key's
      // create revision.
      const int64_t revision = txn_resp.header().revision();
      impl.SetHeld({request.key, request.owner_token, grant_key, lease.id, revision, request.holder,
                    lease.ttl_seconds, lease.refreshed});
      if (entry || intent_lease) {
        impl.queue.Dequeue(request.key, request.waiter_id);  // the entry or intent went with it
      }
      if (!request.waiter_id.empty()) {
        impl.ClearRefused(request.waiter_id);
      }
      return Grant{.fencing_token = static_cast<FencingToken>(revision),
                   .ttl = reported,
                   .store_key = grant_key,
                   .slot = slot};
    }
    const pb::RangeResponse* range =
        txn_resp.responses_size() > 0 && txn_resp.responses(0).has_response_range()
            ? &txn_resp.responses(0).response_range()
            : nullptr;
    if (range == nullptr) {
      impl.shared.Detach(lease.id);
      return Status::Unavailable(
          fmt::format("etcd Txn for {} neither created the key nor read it", base));
    }
    const KeySnapshot snap = Snapshot(base, *range);
    for (const KeySnapshot::Held& g : snap.grants) {
      std::optional<GrantValue> mine = DecodeValue(g.kv->value());
      if (mine && mine->token == request.owner_token && g.kv->lease() == lease.id) {
        // An earlier attempt of this very Txn was applied before its reply was lost (a
        // deadline or a failover): the grant is ours, on this lease.
        impl.SetHeld({request.key, request.owner_token, g.kv->key(), lease.id,
                      g.kv->create_revision(), request.holder, lease.ttl_seconds, lease.refreshed});
        return Grant{.fencing_token = static_cast<FencingToken>(g.kv->create_revision()),
                     .ttl = reported,
                     .store_key = g.kv->key(),
                     .slot = g.kind.slot};
      }
    }
    // A live grant of the other family, or of another limit: refused, naming both.
    const auto mismatch = [&](const KeySnapshot::Held& g) {
      std::optional<GrantValue> v = DecodeValue(g.kv->value());
      return LimitMismatch(request.key, g.kind.mode, g.kind.limit, v ? v->holder : "", request.mode,
                           request.limit);
    };
    const Admission admission = AdmitBeside(snap, request);
    if (admission.verdict == Verdict::kMismatch) {
      impl.shared.Detach(lease.id);
      return mismatch(snap.grants[admission.by]);
    }
    // Room left, as this snapshot tells: retry on the smallest free slot.
    std::optional<std::uint32_t> free;
    if (admission.verdict == Verdict::kGranted) {
      free = semaphore ? FreeSlot(snap, request.mode, request.limit, request.limit)
             : shared  ? FreeSlot(snap, LeaseMode::kShared, 1, kMaxLeaseLimit)
                       : std::optional<std::uint32_t>(0);
    }
    const bool queued = options_.fair && free && *free == slot;  // the queue said no
    if (free && !queued && attempt + 1 < kAdmissionTries) {
      slot = *free;
      continue;
    }
    if (wants_intent && !intent_lease && !free && attempt + 1 < kAdmissionTries) {
      // Refused: record our intent, in a Txn that also tries once more.
      LH_ASSIGN_OR_RETURN(int64_t granted,
                          impl.queue.GrantIntentLease(request.key, request.waiter_id, seconds));
      intent_lease = granted;
      continue;
    }
    // No key of ours was attached: the shared lease serves the next acquire (a conflict costs
    // one Txn); without spares an empty lease is revoked.
    impl.shared.Detach(lease.id);
    if (!request.waiter_id.empty()) {
      impl.SetRefused(request.waiter_id, request.key, txn_resp.header().revision());
    }
    if (queued || (options_.fair && snap.grants.empty())) {
      return Status::HeldByAnother(
          fmt::format("{} is free but waiters are queued for it (fair=true)", request.key));
    }
    if (admission.verdict == Verdict::kWriterWaiting) {
      std::optional<GrantValue> v = DecodeValue(snap.intent->value());
      LeaseInfo writer;
      writer.key = request.key;
      writer.holder = v ? v->holder : "";
      writer.ttl = v ? StoreMillis(v->ttl_ms) : std::chrono::milliseconds(0);
      writer.remaining = writer.ttl;
      writer.waiting_writer = true;
      return Status::HeldByAnother(
          fmt::format("{} is kept for a waiting writer, {} (writer preference)", request.key,
                      writer.holder.empty() ? "another owner" : writer.holder),
          writer);
    }
    if (snap.grants.empty()) {
      return Status::HeldByAnother(
          fmt::format("{} was taken and released while this acquire tried", request.key));
    }
    // The grant of the lowest slot (the snapshot is in key order: the base first, then slot
    // order). Its TTL bounds its time left; its age is not known here.
    return Status::HeldByAnother(
        InfoOf(request.key, *snap.grants.front().kv, snap.grants.front().kind), {},
        /*remaining_is_upper_bound=*/true);
  }
}

}  // namespace leasehold::internal
