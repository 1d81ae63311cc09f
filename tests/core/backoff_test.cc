// Capped exponential backoff with full jitter (src/core/backoff.h).

#include "core/backoff.h"

#include <algorithm>
#include <chrono>

#include <gtest/gtest.h>

namespace leasehold {
namespace {

using namespace std::chrono_literals;

TEST(BackoffTest, FullJitterStaysUnderTheCappedCeiling) {
  internal::Backoff backoff(1ms, 50ms);
  Duration ceiling = 1ms;
  bool saw_nonzero = false;
  for (int i = 0; i < 40; ++i) {
    Duration d = backoff.Next();
    EXPECT_GE(d, Duration::zero());
    EXPECT_LE(d, ceiling);
    saw_nonzero = saw_nonzero || d > Duration::zero();
    ceiling = std::min<Duration>(ceiling * 2, 50ms);
  }
  EXPECT_TRUE(saw_nonzero);
}

}  // namespace
}  // namespace leasehold
