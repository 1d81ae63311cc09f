#include "leasehold/testing/fake_clock.h"

#include <cstdlib>

namespace leasehold::testing {

FakeClock::FakeClock(SteadyTime start) : now_(start) {}

SteadyTime FakeClock::Now() {
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

bool FakeClock::SleepUntil(SteadyTime deadline, std::stop_token stop) {
  std::unique_lock<std::mutex> lock(mu_);
  if (now_ >= deadline) {
    return true;
  }
  auto it = deadlines_.insert(deadline);
  ++sleepers_;
  cv_.notify_all();  // WaitForSleepers
  bool reached = cv_.wait(lock, stop, [&] { return now_ >= deadline; });
  --sleepers_;
  deadlines_.erase(it);
  cv_.notify_all();
  return reached;
}

void FakeClock::Advance(Duration d) {
  Set(Now() + d);
}

void FakeClock::Set(SteadyTime t) {
  std::unique_lock<std::mutex> lock(mu_);
  if (t < now_) {
    std::abort();  // a monotonic clock never goes back; the test is wrong
  }
  now_ = t;
  cv_.notify_all();
  // Return only once every sleeper that is due has left SleepUntil, so that a following
  // WaitForSleepers(n) counts threads that went back to sleep, not ones still waking.
  cv_.wait(lock, [&] { return deadlines_.empty() || *deadlines_.begin() > now_; });
}

bool FakeClock::WaitForSleepers(std::size_t n, std::chrono::milliseconds real_timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, real_timeout, [&] { return sleepers_ >= n; });
}

std::size_t FakeClock::sleepers() {
  std::lock_guard<std::mutex> lock(mu_);
  return sleepers_;
}

std::optional<SteadyTime> FakeClock::NextWakeup() {
  std::lock_guard<std::mutex> lock(mu_);
  if (deadlines_.empty()) {
    return std::nullopt;
  }
  return *deadlines_.begin();
}

}  // namespace leasehold::testing
