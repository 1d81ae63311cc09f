// File: backends/common/time.h (internal)
//
// The time helpers every store shares: milliseconds for a store's TTL arguments, a condition
// variable deadline from a Clock deadline, random jitter, and the reconnect backoff.
//
// Every SteadyTime a backend receives (a WaitForChange deadline) or computes (a retry time) is on
// the Clock it was opened with (see backend.h), and only that clock is read: never
// std::chrono::steady_clock::now() or Clock::Real() directly.
//
// Thread safety: the functions are thread-safe; a ReconnectBackoff is not (guard it with the
// connection it paces).

#pragma once

#include <chrono>

#include "leasehold/clock.h"

#include "core/backoff.h"

namespace leasehold::internal {

// Returns `d` in whole milliseconds, rounded up, and at least 1 (a store TTL argument: rounding
// down could expire a grant before the core's safe_until).
long long CeilMillis(Duration d);

// Returns a TTL or remaining time read back from a store, in milliseconds, clamped to
// [0, half of Duration's range] (~146 years): any client with access to the store may have
// written it, and LeaseInfo's users convert it to nanoseconds (FormatDuration) or add it to a
// time point.
std::chrono::milliseconds StoreMillis(long long ms);

// Returns a uniformly random duration in [0, up_to] (zero for up_to <= 0).
Duration Jitter(Duration up_to);

// Returns the std::chrono::steady_clock time point at which `clock` reaches `t`, for waits on a
// CondVar (util/mutex.h). The time left is clamped to [0, one year].
// REQUIRES: `clock` runs at the real rate (Clock::Real()): a store's CondVar waits in real time.
std::chrono::steady_clock::time_point ToSteady(SteadyTime t, Clock& clock);

// The pace of reconnection to a store that failed: after each failure the next attempt waits a
// random time up to a doubling ceiling (full jitter, core/backoff.h) from `base` up to `cap`; a
// success starts again from `base`.
//
// Example:
//
//   ReconnectBackoff backoff(clock, 50ms, 1s);
//   if (!backoff.Ready()) return last_error;   // too soon to try again
//   if (Connect().ok()) backoff.Succeeded(); else backoff.Failed();
class ReconnectBackoff {
 public:
  // REQUIRES: 0 < base <= cap.
  ReconnectBackoff(Clock& clock, Duration base, Duration cap);

  // True if no failure is pending or its wait has passed.
  [[nodiscard]] bool Ready() const;

  // The time of the next attempt (in the past when Ready()).
  [[nodiscard]] SteadyTime retry_at() const { return retry_at_; }

  // Records a failure and returns the wait before the next attempt.
  Duration Failed();
  // Records a success: the next failure waits from `base` again.
  void Succeeded();

 private:
  Clock& clock_;
  Backoff backoff_;
  SteadyTime retry_at_{};
};

}  // namespace leasehold::internal
