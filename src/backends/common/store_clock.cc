#include "backends/common/store_clock.h"

#include <chrono>

namespace leasehold::internal {

Duration StoreDriftAllowance(Duration elapsed) {
  const Duration magnitude = elapsed < Duration::zero() ? -elapsed : elapsed;
  return magnitude / 100 + std::chrono::milliseconds(2);
}

std::optional<StoreClockStep> StoreClockWatch::Observe(const StoreTimeReading& reading) {
  MutexLock lock(&mu_);
  if (!previous_.has_value() || reading.t_send < previous_->t_recv) {
    // The first reading, or one whose round trip overlapped the previous one's (a Confirm()
    // beside the heartbeat): no order between them to judge by. Keep the later one.
    if (!previous_.has_value() || reading.t_recv >= previous_->t_recv) {
      previous_ = reading;
    }
    return std::nullopt;
  }
  const StoreTimeReading a = *previous_;
  previous_ = reading;
  StoreClockStep s;
  s.store_elapsed = std::chrono::microseconds(reading.store_us - a.store_us);
  s.local_min = reading.t_send - a.t_recv;
  s.local_max = reading.t_recv - a.t_send;
  const Duration low = s.local_min - StoreDriftAllowance(s.local_min);
  const Duration high = s.local_max + StoreDriftAllowance(s.local_max);
  if (s.store_elapsed > high) {
    s.step = s.store_elapsed - high;
  } else if (s.store_elapsed < low) {
    s.step = s.store_elapsed - low;
  } else {
    return std::nullopt;
  }
  ++steps_;
  last_step_ = s;
  return s;
}

std::uint64_t StoreClockWatch::steps() const {
  MutexLock lock(&mu_);
  return steps_;
}

std::optional<StoreClockStep> StoreClockWatch::last_step() const {
  MutexLock lock(&mu_);
  return last_step_;
}

}  // namespace leasehold::internal
