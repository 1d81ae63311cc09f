// File: heartbeat/heartbeat.h (internal)
//
// Heartbeat: renews every lease one Store handle holds. It owns two threads, started with the
// first lease:
//  - the renewer sleeps (on the injected Clock) until the earliest renew due time, then renews
//    every lease due within half its renew interval in ONE Backend::RenewMany call, so
//    leases taken at different times fall into step and share round trips;
//  - the expiry watchdog sleeps until the earliest safe_until and declares leases lost there,
//    even while the renewer is stuck in a store call that never returns; it also marks a lease
//    at risk once its renewal is overdue (two renew intervals without a confirmation).
// The renewer also keeps the last round trips (LatencyWindow) and judges the TTL headroom: when
// their p99 exceeds a tenth of the shortest TTL in a round, it logs one warning
// ("ttl_headroom_low", at most once per kHeadroomWarnEvery per heartbeat) naming the figure and a
// TTL that would meet the rule, and counts it (leasehold_ttl_headroom_warnings_total); the gauge
// leasehold_ttl_headroom_ratio is the smallest TTL / p99 among held leases (the rule wants 10).
// The renewer also acts on a step of the store's wall clock that the backend noticed in a round
// (Backend::store_clock(), backends/common/store_clock.h): after a forward step, a renewal the
// store refused says so in its lost reason, and every other lease of the handle has its
// safe_until moved earlier by the step and is renewed at once (LeaseCore::OnStoreClockStep).
// The watchdog is why a lease's lost signal fires at safe_until "even if no reply ever
// arrives" (the safety rule of docs/impl.md, "safe_until"): a single thread blocked in I/O
// could not promise that.
//
// Thread safety: thread-safe. The destructor stops and joins both threads; it must not run on
// either of them (leases hold no reference to the heartbeat, so it cannot).

#pragma once

#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "leasehold/clock.h"

#include "backends/backend.h"
#include "core/lease_core.h"
#include "heartbeat/latency_window.h"
#include "metrics/registry.h"
#include "util/mutex.h"

namespace leasehold::internal {

class Heartbeat final : public GaugeSource {
 public:
  // `metrics` (may be null: record nothing) receives round-trip latencies and renew failures;
  // it must outlive the heartbeat.
  Heartbeat(std::shared_ptr<Backend> backend, Clock& clock, LeaseMetrics* metrics = nullptr);
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  Heartbeat(Heartbeat&&) = delete;
  Heartbeat& operator=(Heartbeat&&) = delete;
  ~Heartbeat() override;

  // Starts renewing `lease` and watching its safe_until.
  void Add(std::shared_ptr<LeaseCore> lease) LH_EXCLUDES(mu_);

  // Stops renewing `lease` (released). A renew already in flight may still complete; its
  // result is ignored by the lease.
  void Remove(const LeaseCore* lease) LH_EXCLUDES(mu_);

  // A lease's schedule changed outside the renew loop (Lease::Confirm renewed it): both loops
  // plan again from the leases' state.
  void Replan() LH_EXCLUDES(mu_);

  // Returns the number of leases being renewed.
  std::size_t size() LH_EXCLUDES(mu_);

  // Returns the number of RenewMany calls made so far (round trips), for tests and benchmarks.
  std::uint64_t rounds() LH_EXCLUDES(mu_);

  // Returns how many times Add woke a loop early (a lease due before the loop's planned
  // wake-up), for tests and benchmarks: an acquire whose lease is due after the others wakes
  // no thread.
  std::uint64_t early_wakes() LH_EXCLUDES(mu_);

  // How often, at most, one heartbeat warns that its TTL headroom is low.
  static constexpr Duration kHeadroomWarnEvery = std::chrono::minutes(1);
  // The rule: a TTL at least this many times the heartbeat's p99 round trip.
  static constexpr int kTtlToP99 = 10;

  // Returns how many headroom warnings this heartbeat has logged, for tests.
  std::uint64_t headroom_warnings() LH_EXCLUDES(mu_);

  // The leases held (or at risk), the smallest safe_until - now among them and the smallest
  // TTL / heartbeat p99, for the gauges.
  HeldLeaseGauges CollectGauges() override LH_EXCLUDES(mu_);

 private:
  void RenewLoop() LH_EXCLUDES(mu_);
  void WatchdogLoop() LH_EXCLUDES(mu_);

  // Adds a round's latency to the window and warns (rate-limited) if its p99 exceeds a tenth
  // of `min_ttl`, the shortest TTL of the round.
  void JudgeHeadroom(Duration latency, Duration min_ttl) LH_EXCLUDES(mu_);

  // Drops leases that are no longer active.
  void PruneLocked() LH_REQUIRES(mu_);

  // A forward step of the store's clock the backend noticed since the last round, if any
  // (backward steps end no grant early), and the words that explain it.
  struct ClockStep {
    Duration step;
    std::string why;
  };

  std::optional<ClockStep> NewStoreClockStep();

  // Immutable after construction.
  const std::shared_ptr<Backend> backend_;
  Clock& clock_;
  LeaseMetrics* const metrics_;

  Mutex mu_;
  std::vector<std::shared_ptr<LeaseCore>> leases_ LH_GUARDED_BY(mu_);
  // Requested to wake a sleeping loop early (a lease was added that is due before the loop's
  // planned wake-up, or shutdown); each loop replaces its source after waking.
  std::stop_source renew_wake_ LH_GUARDED_BY(mu_);
  std::stop_source watchdog_wake_ LH_GUARDED_BY(mu_);
  // When each loop plans to wake by itself: SteadyTime::min() while it is scanning or renewing
  // (it has not yet seen every lease: Add must wake it), else the time it sleeps until. Add
  // wakes a loop only for a lease due before that, so an acquire costs no thread wake-ups in
  // the common case (a new lease is due after the ones already held).
  SteadyTime renew_planned_ LH_GUARDED_BY(mu_) = SteadyTime::min();
  SteadyTime watchdog_planned_ LH_GUARDED_BY(mu_) = SteadyTime::min();
  bool shutdown_ LH_GUARDED_BY(mu_) = false;
  std::uint64_t rounds_ LH_GUARDED_BY(mu_) = 0;
  std::uint64_t early_wakes_ LH_GUARDED_BY(mu_) = 0;
  LatencyWindow latencies_ LH_GUARDED_BY(mu_);
  std::optional<SteadyTime> last_headroom_warning_ LH_GUARDED_BY(mu_);
  std::uint64_t headroom_warnings_ LH_GUARDED_BY(mu_) = 0;
  // The renewer's own: Backend::store_clock().steps() as of its last round (from construction:
  // a step noticed before this heartbeat existed is no news to its leases).
  std::uint64_t clock_steps_seen_;
  // Started lazily by the first Add, so that handles used only for status/list stay cheap.
  std::jthread renewer_ LH_GUARDED_BY(mu_);
  std::jthread watchdog_ LH_GUARDED_BY(mu_);
};

}  // namespace leasehold::internal
