// File: leasehold/options.h
//
// StoreOptions (how a Store handle behaves) and LeaseOptions (how one lease is taken and kept).
// Both are aggregates: set what you need with designated initializers.
//
// Example:
//
//   using namespace std::chrono_literals;
//   auto lease = store->Acquire("job:invoices",
//                               {.ttl = 10s, .wait = 30s, .holder = "invoicer-1"});
//
// Thread safety: plain value types.

#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "leasehold/clock.h"
#include "leasehold/status.h"

namespace leasehold {

class Metrics;

// A wait that never runs out (LeaseOptions::wait). Cancellation still ends it.
inline constexpr Duration kWaitForever = Duration::max();

// The three states of a held lease (docs/impl.md, "safe_until", gives the rules).
enum class LeaseState {
  // Renewals succeed; the holder may act until safe_until().
  kHeld,
  // Renewals are failing but safe_until() has not passed: finish or checkpoint now.
  kAtRisk,
  // Ownership can no longer be guaranteed. Terminal.
  kLost,
};

// Returns "held", "at risk" or "lost".
std::string_view LeaseStateName(LeaseState state);

struct LeaseOptions {
  // How long the store keeps the grant without renewal. REQUIRES: > 0.
  // Default: 10 s.
  Duration ttl = std::chrono::seconds(10);

  // How often the heartbeat renews. REQUIRES: 0 < renew_interval < ttl - drift.
  // Default: ttl / 3.
  std::optional<Duration> renew_interval;

  // Allowance for clock-rate differences between this host and the store, subtracted from
  // every safe_until: safe_until = t_send + ttl - drift. REQUIRES: 0 <= drift < ttl.
  // Default: DefaultDrift(ttl), i.e. ttl / 100 + 2 ms.
  std::optional<Duration> drift;

  // How long Store::Acquire waits for the key to become free. Ignored by TryAcquire.
  // Default: kWaitForever.
  Duration wait = kWaitForever;

  // How many holders the key admits at once. 1: an exclusive (or, with mode kShared, a shared)
  // lease. N > 1: a counting semaphore: at most N live grants of the key, each a full lease of
  // its own (owner token, TTL, heartbeat, fencing token) with a slot 0..N-1 (Lease::slot()).
  // Every holder of a key must ask for the same limit: an acquire that disagrees with a live
  // grant is refused with kInvalidArgument naming both, never admitted.
  // REQUIRES: 1 <= limit <= kMaxLeaseLimit; limit == 1 when mode is kShared. Default: 1.
  std::uint32_t limit = 1;

  // kShared: a read lease: any number of shared holders at once, while no exclusive holder has
  // the key; an exclusive lease of the same key waits for every shared one to end, and a waiting
  // exclusive Acquire keeps new shared holders out meanwhile (writer preference: a stream of
  // readers cannot starve it). kExclusive: one holder. Default: kExclusive.
  LeaseMode mode = LeaseMode::kExclusive;

  // The identity other processes see for this holder (status, list, kHeldByAnother).
  // Default: DefaultHolder(), i.e. "<hostname>:<pid>".
  std::string holder;

  // Called exactly once when the lease becomes lost, with the reason. Runs on the heartbeat
  // thread, or on the thread that first noticed the loss (e.g. a call to Lease::valid()), never
  // with a leasehold lock held. Must not block for long and must not destroy the Lease. It runs
  // just after the stop of Lease::lost_token() is requested (work bound to the token is told
  // first), so a thread that sees the token stopped may still find on_lost running.
  // Default: none.
  std::function<void(const Status&)> on_lost;

  // Called on every state change (held -> at risk -> held, or -> lost), after on_lost for the
  // final change. Same threading rules as on_lost. Default: none.
  std::function<void(LeaseState, const Status&)> on_state_change;

  // Called after every confirmed renewal with the new safe_until (on the store's clock(), as
  // Lease::safe_until()). Same threading rules as on_lost. For a supervisor that keeps a
  // deadline of its own in step with the lease (the CLI's process-tree keeper). Default: none.
  std::function<void(SteadyTime)> on_renewed;

  // Returns the drift used when `drift` is unset for a grant of `ttl`: ttl / 100 + 2 ms (the
  // granted TTL, which may differ from the one asked for). For a program that schedules
  // against safe_until and must know it in advance (the CLI's --kill-grace check).
  static Duration DefaultDrift(Duration ttl);

  // Returns the holder used when `holder` is empty: "<hostname>:<pid>", read once per process
  // ("unknown-host" if the host name cannot be read).
  static const std::string& DefaultHolder();
};

struct StoreOptions {
  // The clock that drives safe_until, renewals and waits. Must outlive the Store and every
  // Lease taken from it. Default: Clock::Real().
  Clock* clock = nullptr;

  // The registry the handle records its metrics into (leasehold/metrics.h). Pass one registry
  // to several handles to add them up; Store::metrics() returns it either way.
  // Default: a new registry of this handle's own.
  std::shared_ptr<Metrics> metrics;

  // Records metrics when true. When false the handle records nothing and Store::metrics()
  // stays empty (for measuring the cost of metrics). Default: true.
  bool record_metrics = true;
};

}  // namespace leasehold
