// File: heartbeat/latency_window.h (internal)
//
// LatencyWindow: the last kSize round trips of a heartbeat, and their p99 (nearest rank). The
// heartbeat judges its TTL headroom by it: the rule "TTL at least 10x the heartbeat's p99"
// (leasehold/check.h) warns when a window's p99 exceeds a tenth of a lease's TTL. Once the window
// holds 100 samples its p99 is the second-slowest of them (one stall alone does not warn, two
// do); until then (the first 5.5 minutes at the default 3.3 s heartbeat) it is the slowest, so
// one slow round among the first 100 warns.
//
// Thread safety: none; the heartbeat guards it with its mutex.

#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>

#include "leasehold/clock.h"

namespace leasehold::internal {

class LatencyWindow {
 public:
  static constexpr std::size_t kSize = 100;
  // Fewer samples than this give no p99: a few rounds after start-up say little.
  static constexpr std::size_t kMinSamples = 5;

  void Add(Duration d) {
    samples_[next_] = d;
    next_ = (next_ + 1) % kSize;
    count_ = std::min(count_ + 1, kSize);
  }

  [[nodiscard]] std::size_t count() const { return count_; }

  // The p99 by nearest rank over the samples held, or nullopt below kMinSamples.
  [[nodiscard]] std::optional<Duration> P99() const {
    if (count_ < kMinSamples)
      return std::nullopt;
    std::array<Duration, kSize> sorted{};
    std::copy_n(samples_.begin(), count_, sorted.begin());
    // ceil(0.99 * n), 1-based.
    const std::size_t rank = (99 * count_ + 99) / 100;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(rank - 1),
                     sorted.begin() + static_cast<std::ptrdiff_t>(count_));
    return sorted[rank - 1];
  }

 private:
  std::array<Duration, kSize> samples_{};
  std::size_t next_ = 0;
  std::size_t count_ = 0;
};

}  // namespace leasehold::internal
