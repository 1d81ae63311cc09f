// File: leasehold/testing/fake_clock.h
//
// FakeClock: a Clock that moves only when the test says so, in the manner of abseil's
// SimulatedClock. Sleepers wake when Advance/Set reaches their deadline, so one Advance
// deterministically produces one heartbeat round. Part of the leasehold::testing target, so
// programs that use leasehold can test their own lease handling without real time.
//
// Example:
//
//   leasehold::testing::FakeClock clock;
//   auto store = leasehold::Store::Open("memory://t", {.clock = &clock});
//   auto lease = (*store)->TryAcquire("k", {.ttl = 3s});
//   clock.Advance(1s);                 // the heartbeat renews...
//   clock.WaitForSleepers(2);          // ...and goes back to sleep
//
// Thread safety: thread-safe.

#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <set>

#include "leasehold/clock.h"

namespace leasehold::testing {

class FakeClock final : public Clock {
 public:
  // Starts at `start`. Default: 1000 s after the clock's epoch, so that t - ttl stays positive.
  explicit FakeClock(SteadyTime start = SteadyTime(std::chrono::seconds(1000)));

  SteadyTime Now() override;

  bool SleepUntil(SteadyTime deadline, std::stop_token stop) override;

  // Moves time forward by `d`, wakes every sleeper whose deadline has come, and returns once
  // they have all left SleepUntil.
  void Advance(Duration d);

  // Sets the time. REQUIRES: t >= Now() (monotonic).
  void Set(SteadyTime t);

  // Blocks until at least `n` threads are inside SleepUntil. Returns true when they are, false
  // after `real_timeout` of real time (a test that would otherwise hang fails instead).
  bool WaitForSleepers(std::size_t n,
                       std::chrono::milliseconds real_timeout = std::chrono::seconds(10));

  // Returns the number of threads currently inside SleepUntil.
  std::size_t sleepers();

  // Returns the earliest deadline among current sleepers, if any.
  std::optional<SteadyTime> NextWakeup();

 private:
  std::mutex mu_;
  std::condition_variable_any cv_;
  SteadyTime now_;
  std::size_t sleepers_ = 0;
  std::multiset<SteadyTime> deadlines_;
};

}  // namespace leasehold::testing
