// File: metrics/registry.h (internal)
//
// MetricsRegistry: what leasehold::Metrics (leasehold/metrics.h) holds. One LeaseMetrics per
// backend label value, created once when a Store opens and then recorded into without locks:
// every counter and histogram bucket is a relaxed atomic, so the acquire, renew and release
// paths pay a few uncontended atomic adds and never allocate. Gauges are not recorded: they are
// computed at scrape time from the heartbeats of the stores that record here (GaugeSource).
//
// Thread safety: thread-safe. LeaseMetrics live as long as the registry, at a stable address.

#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease_info.h"
#include "leasehold/metrics.h"
#include "leasehold/status.h"

#include "util/mutex.h"

namespace leasehold::internal {

// The registry behind a public Metrics, for leasehold's own code (Metrics names this its friend).
struct MetricsAccess {
  static MetricsRegistry& Of(Metrics& metrics) { return *metrics.registry_; }
};

// Histogram bucket upper bounds ("le", inclusive) in nanoseconds.
// Store round trips: 100 us (memory://, a local SQLite file) to 10 s (a store timing out).
inline constexpr std::int64_t kLatencyBoundsNs[] = {
    100'000,       250'000,       500'000,       1'000'000,     2'500'000,   5'000'000,
    10'000'000,    25'000'000,    50'000'000,    100'000'000,   250'000'000, 500'000'000,
    1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};
// Waiting for a key: 1 ms to 10 min.
inline constexpr std::int64_t kWaitBoundsNs[] = {
    1'000'000,      10'000'000,     50'000'000,      100'000'000,     250'000'000,
    500'000'000,    1'000'000'000,  2'500'000'000,   5'000'000'000,   10'000'000'000,
    30'000'000'000, 60'000'000'000, 120'000'000'000, 300'000'000'000, 600'000'000'000};

class Counter {
 public:
  void Add(std::uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }

  [[nodiscard]] std::uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> v_{0};
};

class Histogram {
 public:
  static constexpr std::size_t kMaxBounds = 16;

  // REQUIRES: bounds_ns ascending, at most kMaxBounds, and outliving the histogram.
  explicit Histogram(std::span<const std::int64_t> bounds_ns);

  // Records one observation; negative durations count as zero.
  void Observe(Duration d);

  // Fills point.buckets (cumulative, ending with +Inf), point.sum (seconds) and point.count.
  void SnapshotInto(MetricPoint& point) const;

 private:
  const std::span<const std::int64_t> bounds_ns_;
  // counts_[i]: observations in (bounds_ns_[i-1], bounds_ns_[i]]; the last: above every bound.
  std::array<std::atomic<std::uint64_t>, kMaxBounds + 1> counts_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

// Label values. Each enum indexes an array of counters or histograms; the names are the label
// values in the exposition.
enum class AcquireOutcome : std::uint8_t { kAcquired, kHeldByAnother, kError };
inline constexpr std::string_view kAcquireOutcomeNames[] = {"acquired", "held_by_another", "error"};
enum class WaitOutcome : std::uint8_t { kAcquired, kDeadlineExceeded, kCancelled, kError };
inline constexpr std::string_view kWaitOutcomeNames[] = {"acquired", "deadline_exceeded",
                                                         "cancelled", "error"};
enum class ReleaseOutcome : std::uint8_t { kOk, kLost, kError };
inline constexpr std::string_view kReleaseOutcomeNames[] = {"ok", "lost", "error"};
enum class FencedWriteOutcome : std::uint8_t { kAccepted, kFencedOut, kError };
inline constexpr std::string_view kFencedWriteOutcomeNames[] = {"accepted", "fenced_out", "error"};
enum class RenewFailure : std::uint8_t { kUnavailable, kLost, kError };
inline constexpr std::string_view kRenewFailureNames[] = {"unavailable", "lost", "error"};

// The failure label of a renewal that returned `code` (not kOk).
constexpr RenewFailure RenewFailureOf(StatusCode code) {
  return code == StatusCode::kUnavailable ? RenewFailure::kUnavailable
         : code == StatusCode::kLost      ? RenewFailure::kLost
                                          : RenewFailure::kError;
}

inline constexpr LostCause kLostCauses[] = {LostCause::kExpired, LostCause::kStoreSaidNo,
                                            LostCause::kStolen, LostCause::kSessionLost};

// The `kind` label: what kind of lease an event concerns (LeaseKindName). Never the key.
enum class LeaseKind : std::uint8_t { kExclusive, kShared, kSemaphore };
inline constexpr std::size_t kLeaseKindCount = 3;
inline constexpr std::string_view kLeaseKindNames[] = {"exclusive", "shared", "semaphore"};

// The kind of a grant of `mode` and `limit`; names as LeaseKindName's.
constexpr LeaseKind KindOf(LeaseMode mode, std::uint32_t limit) {
  return mode == LeaseMode::kShared ? LeaseKind::kShared
         : limit > 1                ? LeaseKind::kSemaphore
                                    : LeaseKind::kExclusive;
}

// The per-lease series of one backend label value and one kind.
struct KindMetrics {
  KindMetrics();

  Counter acquired;
  Counter conflicts;
  std::array<Counter, std::size(kLostCauses)> lost;
  std::array<Counter, std::size(kReleaseOutcomeNames)> released;
  std::array<Counter, std::size(kRenewFailureNames)> renew_failures;
  std::array<Counter, std::size(kFencedWriteOutcomeNames)> fenced_writes;
  std::array<Histogram, std::size(kAcquireOutcomeNames)> acquire_latency;
  std::array<Histogram, std::size(kWaitOutcomeNames)> wait;
  Histogram handoff;
};

// Everything recorded for one backend label value. Per-lease events are recorded under their
// lease's kind; the exclusive series are always exposed, the shared and semaphore ones only
// once an event of that kind was recorded here (so plain leases add no series).
struct LeaseMetrics {
  LeaseMetrics(std::string backend_name, bool handoff_is_observable);

  void RecordAcquire(LeaseKind kind, AcquireOutcome outcome, Duration latency) {
    KindMetrics& k = Of(kind);
    k.acquire_latency[static_cast<std::size_t>(outcome)].Observe(latency);
    if (outcome == AcquireOutcome::kAcquired) {
      k.acquired.Add();
    } else if (outcome == AcquireOutcome::kHeldByAnother) {
      k.conflicts.Add();
    }
  }

  void RecordWait(LeaseKind kind, WaitOutcome outcome, Duration waited) {
    Of(kind).wait[static_cast<std::size_t>(outcome)].Observe(waited);
  }

  void RecordHandoff(LeaseKind kind, Duration handoff) { Of(kind).handoff.Observe(handoff); }

  void RecordLost(LeaseKind kind, LostCause cause) {
    Of(kind).lost[static_cast<std::size_t>(cause)].Add();
  }

  void RecordRelease(LeaseKind kind, ReleaseOutcome outcome) {
    Of(kind).released[static_cast<std::size_t>(outcome)].Add();
  }

  void RecordFencedWrite(LeaseKind kind, FencedWriteOutcome outcome) {
    Of(kind).fenced_writes[static_cast<std::size_t>(outcome)].Add();
  }

  void RecordRenewFailure(LeaseKind kind, RenewFailure failure) {
    Of(kind).renew_failures[static_cast<std::size_t>(failure)].Add();
  }

  // Whether the series of `kind` are exposed: always for exclusive, else once recorded.
  [[nodiscard]] bool KindUsed(LeaseKind kind) const {
    return kind == LeaseKind::kExclusive ||
           used[static_cast<std::size_t>(kind)].load(std::memory_order_relaxed);
  }

  // Immutable after construction.
  const std::string backend;
  // The store tells a waiter when the key changes (the backend has a wait facet), so the time from
  // that notification to the new grant can be measured (leasehold_handoff_seconds).
  const bool handoff_observable;

  std::array<KindMetrics, kLeaseKindCount> kinds;
  // Per-round and per-handle series: no kind.
  // Heartbeat warnings that the p99 round trip exceeds a tenth of the TTL.
  Counter ttl_headroom_warnings;
  // Store failovers a backend noticed (Backend::CountStoreFailover).
  Counter store_failovers;
  // Store clock steps a backend noticed (Backend::ObserveStoreTime).
  Counter store_clock_jumps;
  Histogram heartbeat_latency;

 private:
  KindMetrics& Of(LeaseKind kind) {
    const auto i = static_cast<std::size_t>(kind);
    // A load first: the flag's cache line stays shared once set.
    if (kind != LeaseKind::kExclusive && !used[i].load(std::memory_order_relaxed)) {
      used[i].store(true, std::memory_order_relaxed);
    }
    return kinds[i];
  }

  std::array<std::atomic<bool>, kLeaseKindCount> used{};
};

// What one store's heartbeat reports at scrape time.
struct HeldLeaseGauges {
  // Leases held or at risk, by kind.
  std::array<std::uint64_t, kLeaseKindCount> held{};
  // The smallest safe_until - now among them, by kind; nullopt if none.
  std::array<std::optional<Duration>, kLeaseKindCount> min_safe_remaining{};
  // The smallest TTL / heartbeat p99 among all of them; nullopt if none, or too few round
  // trips yet.
  std::optional<double> min_ttl_headroom;
};

class GaugeSource {
 public:
  GaugeSource() = default;
  GaugeSource(const GaugeSource&) = delete;
  GaugeSource& operator=(const GaugeSource&) = delete;
  GaugeSource(GaugeSource&&) = delete;
  GaugeSource& operator=(GaugeSource&&) = delete;
  virtual ~GaugeSource() = default;

  // Called at scrape time, with no registry lock held.
  virtual HeldLeaseGauges CollectGauges() = 0;
};

class MetricsRegistry {
 public:
  // Returns the metrics of `backend`, created on first use.
  LeaseMetrics& ForBackend(std::string_view backend, bool handoff_observable) LH_EXCLUDES(mu_);

  // Adds a store's heartbeat to the gauges of `series`. The registry keeps only a weak
  // reference: a closed store drops out by itself.
  void AddGaugeSource(const LeaseMetrics& series, std::weak_ptr<GaugeSource> source)
      LH_EXCLUDES(mu_);

  MetricsSnapshot Snapshot() LH_EXCLUDES(mu_);

 private:
  Mutex mu_;
  std::vector<std::unique_ptr<LeaseMetrics>> series_ LH_GUARDED_BY(mu_);
  std::vector<std::pair<const LeaseMetrics*, std::weak_ptr<GaugeSource>>> sources_
      LH_GUARDED_BY(mu_);
};

}  // namespace leasehold::internal
