// File: core/backoff.h (internal)
//
// Capped exponential backoff with full jitter (the AWS Architecture Blog's "Full Jitter"):
// attempt n sleeps a uniform random time in [0, min(cap, base * 2^n)]. Full jitter spreads
// waiters apart, so a released key is not stormed by every waiter at once.
//
// Thread safety: not thread-safe; one Backoff per waiting call.

#pragma once

#include <cstdint>
#include <random>

#include "leasehold/clock.h"

namespace leasehold::internal {

class Backoff {
 public:
  // REQUIRES: 0 < base <= cap.
  Backoff(Duration base, Duration cap);

  // Returns the next sleep and advances the attempt counter.
  Duration Next();

  // Starts again from `base` (after progress, e.g. a wake-up by notification).
  void Reset() { attempt_ = 0; }

 private:
  const Duration base_;
  const Duration cap_;
  int attempt_ = 0;
  std::minstd_rand rng_;
};

}  // namespace leasehold::internal
