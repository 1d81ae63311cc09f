#include "backends/common/time.h"

#include <algorithm>
#include <random>

namespace leasehold::internal {

long long CeilMillis(Duration d) {
  return std::max<long long>(1, std::chrono::ceil<std::chrono::milliseconds>(d).count());
}

std::chrono::milliseconds StoreMillis(long long ms) {
  constexpr long long kMax =
      std::chrono::duration_cast<std::chrono::milliseconds>(Duration::max()).count() / 2;
  return std::chrono::milliseconds(std::clamp<long long>(ms, 0, kMax));
}

Duration Jitter(Duration up_to) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  if (up_to <= Duration::zero()) {
    return Duration::zero();
  }
  std::uniform_int_distribution<Duration::rep> dist(0, up_to.count());
  return Duration(dist(rng));
}

std::chrono::steady_clock::time_point ToSteady(SteadyTime t, Clock& clock) {
  Duration left =
      std::clamp<Duration>(t - clock.Now(), Duration::zero(), std::chrono::hours(24 * 366));
  return std::chrono::steady_clock::now() + left;
}

ReconnectBackoff::ReconnectBackoff(Clock& clock, Duration base, Duration cap)
    : clock_(clock), backoff_(base, cap) {}

bool ReconnectBackoff::Ready() const {
  return clock_.Now() >= retry_at_;
}

Duration ReconnectBackoff::Failed() {
  Duration wait = backoff_.Next();
  retry_at_ = clock_.Now() + wait;
  return wait;
}

void ReconnectBackoff::Succeeded() {
  backoff_.Reset();
  retry_at_ = SteadyTime{};
}

}  // namespace leasehold::internal
