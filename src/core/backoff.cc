#include "core/backoff.h"

#include <algorithm>

namespace leasehold::internal {

Backoff::Backoff(Duration base, Duration cap)
    : base_(base), cap_(cap), rng_(static_cast<std::uint32_t>(std::random_device{}())) {}

Duration Backoff::Next() {
  // base * 2^attempt, saturating at cap (the shift is bounded so it cannot overflow).
  Duration ceiling = cap_;
  if (attempt_ < 30 && base_.count() <= (cap_.count() >> attempt_)) {
    ceiling = std::min(cap_, base_ * (std::int64_t{1} << attempt_));
  }
  ++attempt_;
  std::uniform_int_distribution<Duration::rep> dist(0, ceiling.count());
  return Duration(dist(rng_));
}

}  // namespace leasehold::internal
