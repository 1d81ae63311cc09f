// File: core/lease_core.h (internal)
//
// LeaseCore: the state of one grant as the holder sees it, shared by the Lease handle and the
// heartbeat. It implements the lease's safety rule (docs/impl.md, "safe_until"):
//
//   safe_until = t_send + ttl - drift
//
// where t_send is read from the Clock *before* the acquire or renew request is sent. A
// successful renew moves safe_until forward with its own t_send; a renew reply that arrives at
// or after safe_until never brings the lease back; "not yours" from the store makes the lease
// lost at once; transient errors make it "at risk" and are retried until safe_until. Lost is
// terminal and is signalled exactly once (lost_token() and on_lost), whichever thread notices
// first: the heartbeat, its expiry watchdog, or a caller of valid().
//
// Thread safety: thread-safe. Callbacks run with no lock held.

#pragma once

#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease_info.h"
#include "leasehold/options.h"
#include "leasehold/status.h"

#include "metrics/registry.h"
#include "util/mutex.h"

namespace leasehold::internal {

struct LeaseParams {
  std::string key;
  std::string owner_token;
  std::string holder;  // LeaseOptions::holder, or the default "<hostname>:<pid>"
  FencingToken fencing_token = 0;
  std::string store_key;        // Grant::store_key, or the key where the store returned none
  std::string data_key_prefix;  // Backend::DataKeyPrefix(key), for Lease::DataKey
  std::uint32_t slot = 0;       // Grant::slot
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t limit = 1;
  Duration ttl{};             // as granted by the store
  Duration renew_interval{};  // validated: 0 < renew_interval < ttl - drift
  Duration drift{};           // validated: 0 <= drift < ttl
  SteadyTime t_send{};        // read before the acquire request was sent
  SteadyTime t_granted{};     // read when the store's grant arrived (hold-at-least counts from it)
  std::string backend_name;   // for log lines
  // Where losses are counted; null records nothing. Owned by the store's registry, which
  // outlives every call that can change this lease's state (see StoreCore).
  LeaseMetrics* metrics = nullptr;
  std::function<void(const Status&)> on_lost;
  std::function<void(LeaseState, const Status&)> on_state_change;
  std::function<void(SteadyTime)> on_renewed;
};

class LeaseCore {
 public:
  LeaseCore(Clock& clock, LeaseParams params);

  LeaseCore(const LeaseCore&) = delete;
  LeaseCore& operator=(const LeaseCore&) = delete;
  LeaseCore(LeaseCore&&) = delete;
  LeaseCore& operator=(LeaseCore&&) = delete;
  ~LeaseCore() = default;

  const std::string& key() const { return params_.key; }

  const std::string& owner_token() const { return params_.owner_token; }

  const std::string& holder() const { return params_.holder; }

  FencingToken fencing_token() const { return params_.fencing_token; }

  const std::string& store_key() const { return params_.store_key; }

  const std::string& data_key_prefix() const { return params_.data_key_prefix; }

  std::uint32_t slot() const { return params_.slot; }

  LeaseMode mode() const { return params_.mode; }

  std::uint32_t limit() const { return params_.limit; }

  Duration ttl() const { return params_.ttl; }

  Duration renew_interval() const { return params_.renew_interval; }

  // When the store's grant arrived: the grant was made no later than this.
  SteadyTime granted_at() const { return params_.t_granted; }

  // Returns true while not lost and Clock::Now() < safe_until. Marks the lease lost (and fires
  // the signal) if it finds safe_until passed.
  bool Valid() LH_EXCLUDES(mu_);

  LeaseState state() LH_EXCLUDES(mu_);

  SteadyTime safe_until() LH_EXCLUDES(mu_);

  std::stop_token lost_token() const { return lost_source_.get_token(); }

  Status lost_reason() LH_EXCLUDES(mu_);

  // Returns true if the lease is neither lost nor released (the heartbeat keeps it).
  bool Active() LH_EXCLUDES(mu_);

  // The instant the heartbeat should next renew: last successful t_send + renew interval, or
  // the retry time after a failure. Returns SteadyTime::max() if inactive.
  SteadyTime NextRenewDue() LH_EXCLUDES(mu_);

  // How much earlier than NextRenewDue() the heartbeat may renew to share a round trip with
  // other leases: half the renew interval, or nothing while retrying after a failure
  // (the retry delay is a backoff and must be kept).
  Duration BatchSlack() LH_EXCLUDES(mu_);

  // Applies a renew result. `t_send` was read before the renew request was sent.
  void OnRenewResult(SteadyTime t_send, const Status& result) LH_EXCLUDES(mu_);

  // The expiry watchdog's check: marks the lease lost if Clock::Now() >= safe_until, and at
  // risk if a renewal is overdue (no confirmed renewal for two renew intervals, e.g. a renew
  // stuck in the store), so the holder hears of trouble before the loss. Returns true if the
  // lease is (now or already) inactive.
  bool CheckExpiry() LH_EXCLUDES(mu_);

  // The next instant CheckExpiry() may change something: the overdue point while held, else
  // safe_until. SteadyTime::max() if inactive.
  SteadyTime NextCheck() LH_EXCLUDES(mu_);

  // Marks the lease lost with `reason`, once. Later calls do nothing.
  void MarkLost(Status reason) LH_EXCLUDES(mu_);

  // The store's wall clock stepped forward by `step` (> 0) somewhere before the renew round
  // trip sent at `t_send` read it (backends/common/store_clock.h): a grant not confirmed in
  // that round trip may end `step` earlier than its renewal set. Such a lease's safe_until moves
  // `step` earlier: lost if that has passed, else at risk with a renewal due at once. A lease
  // confirmed by a renewal sent at or after `t_send` is left alone.
  void OnStoreClockStep(SteadyTime t_send, Duration step, const std::string& why) LH_EXCLUDES(mu_);

  // Marks the lease released by its owner. Returns OK the first time if it was still held,
  // OK on a second call (it is a no-op), and kLost if it had been lost before.
  // After this, the caller deletes the grant from the store.
  Status BeginRelease() LH_EXCLUDES(mu_);

 private:
  struct Transition {
    bool changed = false;
    LeaseState state = LeaseState::kHeld;
    Status reason;
    bool lost = false;
    // The renew round trip that caused the change, if one did.
    std::optional<Duration> latency;
    // A renewal confirmed while held, but more than half a renew interval after it was due:
    // logged as "renewed_late" (no state change).
    bool renewed_late = false;
    // A renewal confirmed: the new safe_until, for on_renewed.
    std::optional<SteadyTime> renewed_until;
    Duration since_confirmed{};
    Duration safe_remaining{};
  };

  // Sets the state under mu_ and reports what the caller must announce after unlocking.
  Transition SetStateLocked(LeaseState next, Status reason) LH_REQUIRES(mu_);

  SteadyTime OverdueAtLocked() LH_REQUIRES(mu_);

  // Fires callbacks and the stop token for a transition. Called with no lock held.
  void Announce(const Transition& t);

  // Immutable after construction.
  Clock& clock_;
  const LeaseParams params_;
  std::stop_source lost_source_;

  Mutex mu_;
  SteadyTime safe_until_ LH_GUARDED_BY(mu_);
  SteadyTime last_renew_send_ LH_GUARDED_BY(mu_);
  SteadyTime retry_at_ LH_GUARDED_BY(mu_);
  int failures_ LH_GUARDED_BY(mu_) = 0;
  LeaseState state_ LH_GUARDED_BY(mu_) = LeaseState::kHeld;
  bool released_ LH_GUARDED_BY(mu_) = false;
  Status lost_reason_ LH_GUARDED_BY(mu_);
};

}  // namespace leasehold::internal
