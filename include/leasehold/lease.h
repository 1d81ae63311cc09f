// File: leasehold/lease.h
//
// Lease: a move-only handle to one grant in a store. While you hold a valid Lease you may act
// as the key's only owner until safe_until(); the store handle's heartbeat renews it in the
// background. Attach fencing_token() to every write the lease guards.
//
// Example:
//
//   auto lease = store->TryAcquire("job:invoices");
//   if (!lease.ok()) return lease.status();
//   for (auto& batch : work) {
//     if (!lease->valid()) return leasehold::Status::Lost("stopped early");
//     db.Write(batch, lease->fencing_token());
//   }
//   LH_RETURN_IF_ERROR(lease->Release());  // kLost if it was lost or taken over meanwhile
//
// Lost is terminal: a lost Lease never becomes valid again; acquire anew.
//
// fork(): the Lease belongs to the process that acquired it. In a fork() child (without exec)
// its copy is lost: valid() is false, Write() and Release() return kLost and do nothing, and
// its destruction touches nothing, so the parent keeps its grant, its sessions and its
// renewals. (libpq has the same rule for its connections: never use one in a forked child.)
//
// Thread safety: thread-safe. valid(), state() and the accessors may be called from any
// thread while another thread calls Release(); Write() from any number of threads at once, but
// not during a Release() or a move of the same Lease.

#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/fenced_write.h"
#include "leasehold/lease_info.h"
#include "leasehold/options.h"
#include "leasehold/status.h"

namespace leasehold {

namespace internal {
class LeaseCore;
struct StoreCore;
}  // namespace internal

class SlotClaim;

// The longest ReleaseOptions::hold_at_least: a year.
inline constexpr Duration kMaxHoldAtLeast = std::chrono::hours(24 * 366);

// How Lease::Release ends a grant.
struct ReleaseOptions {
  // Zero: the grant is deleted at once and a waiter takes over. Positive: the grant stays in the
  // store until at least this long after it was acquired (ShedLock's lockAtLeastFor), without a
  // heartbeat and without this process, then expires by itself; others are refused with
  // kHeldByAnother until then. If that time has already passed, the grant is deleted at once.
  // The fencing counter is not touched: the next grant's token is higher, as always.
  // A lease already lost when it is released is deleted, never kept. On sqlite:// a kept grant
  // ends at a reboot, as every grant there does. REQUIRES: 0 <= hold_at_least <= kMaxHoldAtLeast.
  Duration hold_at_least{};
};

class Lease {
 public:
  // An empty lease: not valid, Release() is a no-op. Useful as a member before acquisition.
  Lease() = default;
  Lease(Lease&&) noexcept = default;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  // Releases the grant if it is still held (best effort, noexcept); a failure is logged.
  ~Lease();

  // Returns the lease's key. Empty for an empty Lease.
  [[nodiscard]] const std::string& key() const;

  // Returns the fencing token of this grant: higher than any earlier grant of the same key.
  [[nodiscard]] FencingToken fencing_token() const;

  // Returns the grant's slot (LeaseInfo::slot): 0..limit-1 for a semaphore (a worker index no
  // other live holder of the key has), 0 for an exclusive lease.
  [[nodiscard]] std::uint32_t slot() const;

  // Returns how the grant shares its key, and its limit (LeaseOptions::mode, ::limit).
  [[nodiscard]] LeaseMode mode() const;
  [[nodiscard]] std::uint32_t limit() const;

  // Returns where the store keeps this grant, for tools and for data placed beside it: the
  // Redis hash ("<prefix>:{<hex key>}", whose "{...}" is the key's cluster hash tag), the etcd
  // key ("<prefix>/<key>"), the ZooKeeper node of this grant, the SQL row's key (the lease key).
  // Empty for an empty Lease.
  [[nodiscard]] const std::string& store_key() const;

  // Returns the name to give a fenced write's data key `name` so that the store keeps it beside
  // this grant: for Redis "{<hex key>}:<prefix>:<name>", in the lease's hash slot (and the URL's
  // prefix= namespace), which a Redis Cluster
  // needs (one script checks the grant and writes the data, and a script's keys must share a
  // slot); for every other store `name` unchanged. The same name for every holder of the key,
  // and the same as Store::DataKey(key(), name).
  [[nodiscard]] std::string DataKey(std::string_view name) const;

  // Returns the first 8 hex digits of the owner token, for logs. The full token never leaves
  // the library.
  [[nodiscard]] std::string token_prefix() const;

  // Returns the descriptor that proves this grant's holder alive to the other processes of the
  // host, on a store that judges holders by it (sqlite://: when every process that has it open
  // is gone, the next acquire takes the key at once instead of a TTL later), or -1. It is
  // close-on-exec. A process that forks a guard which must keep the grant alive after the
  // process itself dies (`leasehold run`'s keeper, which outlives it until the command's whole
  // tree is gone) keeps it open in that guard; closing it in this process ends nothing.
  [[nodiscard]] int holder_liveness_fd() const;

  // Returns true while the holder may act as owner: not lost, not released, and the clock has
  // not reached safe_until(). Fires the lost signal if it finds safe_until() passed.
  [[nodiscard]] bool valid() const;

  // Returns held, at risk or lost. A released lease reports lost.
  [[nodiscard]] LeaseState state() const;

  // Returns the instant (on the store's Clock) until which ownership is guaranteed:
  // t_send + ttl - drift of the latest successful acquire or renew.
  [[nodiscard]] SteadyTime safe_until() const;

  // Returns a token whose stop is requested exactly once, when the lease becomes lost (or is
  // released). Pass it to work that must stop with the lease.
  [[nodiscard]] std::stop_token lost_token() const;

  // Returns why the lease was lost; OK while it is held or after a clean release.
  [[nodiscard]] Status lost_reason() const;

  // Returns the TTL the store granted (a store may round it up) and the renew interval used.
  [[nodiscard]] Duration ttl() const;
  [[nodiscard]] Duration renew_interval() const;

  // Proves that the store holds this grant *now*: one owner-checked round trip (a renewal,
  // sent after the call starts) whose success moves safe_until() to t_send + ttl - drift.
  // valid() judges by this process's clocks, which cannot see a pause they did not count: a
  // paused or live-migrated VM, a restored snapshot or checkpoint (CRIU), a frozen cgroup.
  // Call Confirm() right before an action outside the store that cannot be undone (a payment,
  // an email, a write to a system without fencing tokens), and act only on OK, before the new
  // safe_until(). Writes to this lease's own store need no Confirm(): Write() is checked by the
  // store in the same atomic step.
  // Returns OK if the store confirmed the grant in time (the lease is held); kLost if the grant
  // is gone, expired or someone else's, or the lease was already lost or released (the lease is
  // lost from then on); kUnavailable (or the store's error) if the store did not answer: the
  // lease is at risk and the heartbeat retries, as after a failed renewal. An empty Lease:
  // kInvalidArgument. Not during a Release() or a move of the same Lease.
  Status Confirm();

  // Deletes the grant if the owner token still matches, and wakes waiters.
  // Returns OK on success and on a second call; kLost if the grant was lost, expired or taken
  // over (nothing of anyone else's is deleted); kUnavailable if the store did not answer, in
  // which case the grant simply expires at its TTL.
  Status Release();

  // Applies `write` to data in this lease's store, all ops or none, only if the store still
  // holds this grant live, checked in the same atomic step (leasehold/fenced_write.h). The store
  // decides, not this process's lease state: a lease this process already counts as lost is
  // still sent, and is refused if the grant is gone or someone else's. (A backend that knows
  // locally that the grant is over, because its session ended or its TTL ran out unrenewed, may
  // refuse without sending: zk://, postgres:// advisory mode.)
  // Returns what each op did; kLost ("fenced out: ...", naming the grant that replaced it where
  // the store knows it) if the grant is gone, expired or someone else's, or the lease was
  // released: nothing is written; kInvalidArgument for an empty write, more than
  // kMaxFencedOps ops or kMaxFencedWriteBytes bytes, a key the store refuses (one of its own,
  // a malformed ZooKeeper path) or a statement the database refuses: nothing is written;
  // kUnimplemented for an op kind the store does not have (Store::SupportsFencedOp);
  // kUnavailable if the store did not answer, in which case the write was applied whole or not
  // at all, and this process cannot tell which.
  Result<FencedWriteResult> Write(const FencedWrite& write) const;

  // As Release(), ending the grant as `options` says. The lease is released locally either way:
  // it is no longer valid and the heartbeat stops renewing it.
  // Returns kInvalidArgument (and releases as Release() does) for a hold_at_least out of range;
  // kUnimplemented if the store cannot keep a grant without its holder.
  Status Release(const ReleaseOptions& options);

 private:
  friend class Store;
  friend class SlotClaim;
  Lease(std::shared_ptr<internal::StoreCore> store, std::shared_ptr<internal::LeaseCore> core);

  // Releases the grant: stops the heartbeat, then ends the grant in the store, keeping it
  // until `keep_until` (on the store's Clock; nothing kept if passed) and replacing the key's
  // record with `record` (if set) in the same atomic step.
  Status Finish(SteadyTime keep_until, std::optional<std::string> record, Duration record_ttl);

  // True in a fork() child of the process that acquired this (unreleased) lease.
  [[nodiscard]] bool Forked() const;

  void ReleaseOnDestroy() noexcept;

  // Null once released (or for an empty Lease). Keeps the backend alive while held.
  std::shared_ptr<internal::StoreCore> store_;
  std::shared_ptr<internal::LeaseCore> core_;
};

}  // namespace leasehold
