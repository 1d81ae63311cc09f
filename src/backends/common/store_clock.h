// File: backends/common/store_clock.h (internal)
//
// StoreClockWatch: notices a step of the store server's wall clock. Redis expires keys, and
// PostgreSQL table mode judges expires_at, by the server's wall clock (CLOCK_REALTIME): an NTP
// step or a VM resume catching up moves every grant's end at once, by the size of the step.
// A forward step ends grants early (another client may be granted the key while its holder
// still counts itself valid, until its next renewal is refused); a backward step makes them
// last longer (waiters wait that much more). ZooKeeper and etcd expire sessions and leases on
// the server's monotonic clock, SQLite on CLOCK_BOOTTIME: no wall step reaches them.
//
// A backend that reads the store's time in a renewal's round trip (Redis TIME, PostgreSQL
// clock_timestamp()) gives each reading with the local send and receive times around it. Two
// readings a and b bound the real time between them: at least b.t_send - a.t_recv, at most
// b.t_recv - a.t_send. The store's clock may run off by the drift bound of the safety rule
// (DESIGN.md: drift(d) = d / 100 + 2 ms); a store's elapsed time outside
//   [min - drift(|min|), max + drift(|max|)]
// is a step, and its size is how far outside it lies.
//
// Example:
//
//   StoreClockWatch watch;
//   if (std::optional<StoreClockStep> step = watch.Observe({t_send, t_recv, store_us})) {
//     ... step->step is +/- how far the store's clock jumped ...
//   }
//
// Thread safety: thread-safe (one mutex); readings from concurrent round trips are fine (one
// whose interval overlaps the previous reading's is kept without being judged).

#pragma once

#include <cstdint>
#include <optional>

#include "leasehold/clock.h"

#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// One reading of the store's wall clock, taken by the server between t_send and t_recv (both on
// the backend's Clock).
struct StoreTimeReading {
  SteadyTime t_send;
  SteadyTime t_recv;
  std::int64_t store_us = 0;  // the store's wall clock, microseconds since the Unix epoch
};

// A step found between two readings.
struct StoreClockStep {
  // How far the store's clock moved beyond what elapsed time can explain: > 0 forward (grants
  // ended early), < 0 backward.
  Duration step{};
  // What the store's clock said elapsed, and the local bounds of the real elapsed time.
  Duration store_elapsed{};
  Duration local_min{};
  Duration local_max{};
};

// The allowance for a store clock running off over `elapsed`: the safety rule's drift bound.
Duration StoreDriftAllowance(Duration elapsed);

class StoreClockWatch {
 public:
  // Judges `reading` against the previous one and keeps it. Returns the step if the store's
  // clock moved further than the elapsed local time allows.
  std::optional<StoreClockStep> Observe(const StoreTimeReading& reading) LH_EXCLUDES(mu_);

  // Steps found so far, and the latest of them.
  [[nodiscard]] std::uint64_t steps() const LH_EXCLUDES(mu_);
  [[nodiscard]] std::optional<StoreClockStep> last_step() const LH_EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::optional<StoreTimeReading> previous_ LH_GUARDED_BY(mu_);
  std::uint64_t steps_ LH_GUARDED_BY(mu_) = 0;
  std::optional<StoreClockStep> last_step_ LH_GUARDED_BY(mu_);
};

}  // namespace leasehold::internal
