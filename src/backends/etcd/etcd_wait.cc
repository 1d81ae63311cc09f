// File: backends/etcd/etcd_wait.cc (internal)
//
// The etcd:// store's wait facet: watches for the deletes that free a key, and a waiter's queue
// entry withdrawn.

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

namespace {

// Watches `ranges` (key, range_end; empty range_end: one key) for deletes from `start_revision`
// on the member `index`, until one happens (OK), `slice_end` (OK: a spurious wake-up, the
// caller re-checks), `deadline` (kDeadlineExceeded) or `stop` (kCancelled).
Status WatchForDeletes(EtcdClient& client, Clock& clock, std::size_t index,
                       const std::vector<std::pair<std::string, std::string>>& ranges,
                       int64_t start_revision, SteadyTime slice_end, SteadyTime deadline,
                       std::stop_token stop, std::string_view what) {
  // `deadline` and `slice_end` are on the backend's clock (the core's deadline, a queue entry's
  // refresh time): so is every reading they are compared with.
  const SteadyTime now = clock.Now();
  const Duration left = std::min(slice_end, deadline) - now;
  if (now >= deadline) {
    return Status::DeadlineExceeded(fmt::format("wait for {} ran out", what));
  }
  if (stop.stop_requested()) {
    return Status::Cancelled(fmt::format("wait for {} cancelled", what));
  }
  if (left <= Duration::zero()) {
    return Status();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(std::min(left, kMaxWatchSlice)));
  client.AddToken(ctx);
  std::stop_callback cancel(stop, [&ctx] { ctx.TryCancel(); });
  client.counters().watch_streams.fetch_add(1, std::memory_order_relaxed);
  auto stream = client.endpoint(index).watch->Watch(&ctx);
  bool written = true;
  for (const auto& [key, range_end] : ranges) {
    pb::WatchRequest req;
    pb::WatchCreateRequest* create = req.mutable_create_request();
    create->set_key(key);
    create->set_range_end(range_end);
    // Everything after the revision we read: a delete between the read and now is replayed.
    create->set_start_revision(start_revision);
    create->add_filters(pb::WatchCreateRequest::NOPUT);
    written = written && stream->Write(req);
  }
  bool woken = false;
  if (written) {
    pb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (resp.events_size() > 0 || resp.canceled()) {
        woken = true;  // deleted (released, expired, revoked), or the watch ended: re-check
        break;
      }
    }
  }
  if (woken) {
    ctx.TryCancel();
  }
  grpc::Status final_status = stream->Finish();
  if (woken) {
    return Status();
  }
  if (stop.stop_requested()) {
    return Status::Cancelled(fmt::format("wait for {} cancelled", what));
  }
  if (clock.Now() >= deadline) {
    return Status::DeadlineExceeded(fmt::format("wait for {} ran out", what));
  }
  if (IsUnreachable(final_status)) {
    client.MoveOn(index);
  }
  return Status();  // the stream ended early, or the slice ran out: the caller re-checks
}

}  // namespace

Status EtcdBackend::WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, key);
  pb::RangeRequest range;
  range.set_key(base);
  range.set_range_end(KeysEnd(base));
  range.set_keys_only(true);
  pb::RangeResponse range_resp;
  std::size_t index = 0;
  LH_RETURN_IF_ERROR(impl.client.Range("Range (wait)", range, &range_resp, &index));
  if (range_resp.kvs_size() == 0) {
    return Status();  // free already
  }
  // Any delete of the lease's keys: a grant released, expired or force-released, or the
  // writer intent gone.
  return WatchForDeletes(impl.client, clock_, index, {{base, KeysEnd(base)}},
                         range_resp.header().revision() + 1, SteadyTime::max(), deadline,
                         std::move(stop), key);
}

Status EtcdBackend::WaitForTurn(std::string_view key, std::string_view waiter_id,
                                SteadyTime deadline, std::stop_token stop) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, key);
  const std::string queue = EtcdWaitQueue::Prefix(options_.prefix, key);
  std::vector<std::pair<std::string, std::string>> ranges = {{base, KeysEnd(base)}};
  if (options_.fair) {
    ranges.emplace_back(queue, PrefixEnd(queue));
  }
  const SteadyTime refresh = options_.fair ? impl.queue.RefreshDue(waiter_id) : SteadyTime::max();
  if (std::optional<int64_t> refused = impl.Refused(waiter_id, key)) {
    // Our last attempt was refused on the snapshot at `refused`: only a delete since (a grant
    // ended, an intent or a queue entry ahead gone) can let us in, and the watch replays every
    // delete from the next revision on. No read first, so none is missed in between.
    return WatchForDeletes(impl.client, clock_, impl.client.current(), ranges, *refused + 1,
                           refresh, deadline, std::move(stop), key);
  }
  if (!options_.fair) {
    return WaitForChange(key, deadline, std::move(stop));
  }
  const std::string me = queue + std::string(waiter_id);
  // One read-only Txn: the grants, and the head of the queue (lowest create revision).
  pb::TxnRequest txn;
  pb::RangeRequest* grant = txn.add_success()->mutable_request_range();
  grant->set_key(base);
  grant->set_range_end(KeysEnd(base));
  grant->set_keys_only(true);
  pb::RangeRequest* head = txn.add_success()->mutable_request_range();
  head->set_key(queue);
  head->set_range_end(PrefixEnd(queue));
  head->set_sort_order(pb::RangeRequest::ASCEND);
  head->set_sort_target(pb::RangeRequest::CREATE);
  head->set_limit(1);
  head->set_keys_only(true);
  pb::TxnResponse resp;
  std::size_t index = 0;
  LH_RETURN_IF_ERROR(impl.client.Txn("Txn (queue read)", txn, &resp, &index));
  if (resp.responses_size() != 2) {
    return Status::Internal("etcd answered a two-range Txn with a different number of replies");
  }
  const auto& grant_kvs = resp.responses(0).response_range().kvs();
  const auto& head_kvs = resp.responses(1).response_range().kvs();
  if (grant_kvs.empty() && (head_kvs.empty() || head_kvs[0].key() == me)) {
    return Status();  // free, and our turn
  }
  // Wake on a grant's delete or any queue entry's delete (a waiter ahead took the key, left,
  // or died). Come back in time for the caller's next attempt to refresh our entry.
  return WatchForDeletes(impl.client, clock_, index, ranges, resp.header().revision() + 1, refresh,
                         deadline, std::move(stop), key);
}

void EtcdBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  // The queue entry (fair=true) or the writer intent (fair=false) goes with its lease.
  impl_->queue.Dequeue(key, waiter_id);
  impl_->ClearRefused(waiter_id);
}

}  // namespace leasehold::internal
