// File: leasehold/clock.h
//
// Clock: the only source of time that drives lease safety. It is monotonic and keeps counting
// while the machine is suspended (Linux CLOCK_BOOTTIME): plain CLOCK_MONOTONIC stops during
// suspend and would stretch a lease past its TTL. Every process on a host shares it, which is
// what lets the test harness compare holders across processes.
//
// Inject a clock through StoreOptions::clock instead of reading time directly; tests use
// leasehold::testing::FakeClock (leasehold/testing/fake_clock.h).
//
// Example:
//
//   leasehold::Clock& clock = leasehold::Clock::Real();
//   leasehold::SteadyTime deadline = clock.Now() + std::chrono::seconds(1);
//   clock.SleepUntil(deadline, stop_token);  // false if stop was requested first
//
// Thread safety: all Clock implementations are safe for concurrent use.

#pragma once

#include <chrono>
#include <stop_token>

namespace leasehold {

// A std::chrono clock over CLOCK_BOOTTIME.
struct BootClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<BootClock>;
  static constexpr bool is_steady = true;

  static time_point now() noexcept;
};

using Duration = std::chrono::nanoseconds;
using SteadyTime = BootClock::time_point;
// Wall-clock time (CLOCK_REALTIME): names schedule slots and dates records, never drives
// safety (it may jump).
using SystemTime = std::chrono::system_clock::time_point;

class Clock {
 public:
  Clock() = default;
  Clock(const Clock&) = delete;
  Clock& operator=(const Clock&) = delete;
  Clock(Clock&&) = delete;
  Clock& operator=(Clock&&) = delete;
  virtual ~Clock() = default;

  // Returns the current monotonic time.
  virtual SteadyTime Now() = 0;

  // Blocks until Now() >= deadline or `stop` is requested, whichever comes first.
  // Returns true if the deadline was reached, false if stop was requested.
  virtual bool SleepUntil(SteadyTime deadline, std::stop_token stop) = 0;

  // Returns the process-wide real clock (CLOCK_BOOTTIME). It belongs to leasehold, lives
  // for the whole process and must never be deleted.
  static Clock& Real();
};

}  // namespace leasehold
