#include "leasehold/clock.h"

#include <time.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

namespace leasehold {

BootClock::time_point BootClock::now() noexcept {
  timespec ts{};
  // CLOCK_BOOTTIME cannot fail on Linux >= 2.6.39; keep counting through suspend.
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

namespace {

class RealClock final : public Clock {
 public:
  SteadyTime Now() override { return BootClock::now(); }

  bool SleepUntil(SteadyTime deadline, std::stop_token stop) override {
    std::mutex mu;
    std::condition_variable_any cv;
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      if (stop.stop_requested()) {
        return false;
      }
      SteadyTime now = Now();
      if (now >= deadline) {
        return true;
      }
      // The wait itself runs on CLOCK_MONOTONIC, which stops during suspend: wake at least
      // once a second so a resumed machine notices a deadline that passed while it slept.
      Duration step = std::min<Duration>(deadline - now, std::chrono::seconds(1));
      cv.wait_for(lock, stop, step, [] { return false; });
    }
  }
};

}  // namespace

Clock& Clock::Real() {
  static Clock* const clock = new RealClock();  // never destroyed: used by detached users
  return *clock;
}

}  // namespace leasehold
