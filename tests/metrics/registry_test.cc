// The lock-free counters and histograms of metrics/registry.h.

#include "metrics/registry.h"

#include <cmath>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "leasehold/version.h"

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t kBounds[] = {1'000'000, 10'000'000, 100'000'000};  // 1, 10, 100 ms

TEST(HistogramTest, BucketsAreCumulativeInclusiveAndEndWithInf) {
  Histogram h(kBounds);
  h.Observe(0ns);
  h.Observe(1ms);     // le is inclusive: the 1 ms bucket
  h.Observe(1001us);  // the 10 ms bucket
  h.Observe(100ms);
  h.Observe(3s);    // only +Inf
  h.Observe(-5ms);  // counts as zero
  MetricPoint p;
  h.SnapshotInto(p);
  ASSERT_EQ(p.buckets.size(), 4U);
  EXPECT_DOUBLE_EQ(p.buckets[0].upper_bound, 0.001);
  EXPECT_EQ(p.buckets[0].cumulative_count, 3U);
  EXPECT_DOUBLE_EQ(p.buckets[1].upper_bound, 0.01);
  EXPECT_EQ(p.buckets[1].cumulative_count, 4U);
  EXPECT_EQ(p.buckets[2].cumulative_count, 5U);
  EXPECT_TRUE(std::isinf(p.buckets[3].upper_bound));
  EXPECT_EQ(p.buckets[3].cumulative_count, 6U);
  EXPECT_EQ(p.count, 6U);
  EXPECT_NEAR(p.sum, 0.001 + 0.001001 + 0.1 + 3.0, 1e-12);
}

TEST(HistogramTest, ConcurrentObservationsAreAllCounted) {
  Histogram h(kLatencyBoundsNs);
  constexpr int kThreads = 4;
  constexpr int kEach = 20000;
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&h, t] {
        for (int i = 0; i < kEach; ++i) {
          h.Observe(std::chrono::microseconds(50 * (i % 7 + t)));
        }
      });
    }
  }
  MetricPoint p;
  h.SnapshotInto(p);
  EXPECT_EQ(p.count, static_cast<std::uint64_t>(kThreads * kEach));
  EXPECT_EQ(p.buckets.back().cumulative_count, p.count);
}

TEST(MetricsRegistryTest, OneSeriesPerBackendAtAStableAddress) {
  MetricsRegistry registry;
  LeaseMetrics& a = registry.ForBackend("sqlite", false);
  LeaseMetrics& b = registry.ForBackend("redis", true);
  EXPECT_EQ(&registry.ForBackend("sqlite", false), &a);
  EXPECT_NE(&a, &b);
  a.RecordAcquire(LeaseKind::kExclusive, AcquireOutcome::kAcquired, 2ms);
  a.RecordAcquire(LeaseKind::kExclusive, AcquireOutcome::kHeldByAnother, 1ms);
  b.RecordLost(LeaseKind::kExclusive, LostCause::kStolen);
  MetricsSnapshot snap = registry.Snapshot();
  const MetricPoint* acquired =
      snap.Find("leasehold_lease_acquired_total", {{"backend", "sqlite"}});
  ASSERT_NE(acquired, nullptr);
  EXPECT_EQ(acquired->value, 1);
  const MetricPoint* conflicts =
      snap.Find("leasehold_acquire_conflicts_total", {{"backend", "sqlite"}});
  ASSERT_NE(conflicts, nullptr);
  EXPECT_EQ(conflicts->value, 1);
  const MetricPoint* stolen =
      snap.Find("leasehold_lease_lost_total", {{"backend", "redis"}, {"reason", "stolen"}});
  ASSERT_NE(stolen, nullptr);
  EXPECT_EQ(stolen->value, 1);
  const MetricPoint* latency = snap.Find("leasehold_acquire_latency_seconds",
                                         {{"backend", "sqlite"}, {"outcome", "acquired"}});
  ASSERT_NE(latency, nullptr);
  EXPECT_EQ(latency->count, 1U);
  // Handoff only where the store notifies waiters.
  EXPECT_EQ(snap.Find("leasehold_handoff_seconds", {{"backend", "sqlite"}}), nullptr);
  EXPECT_NE(snap.Find("leasehold_handoff_seconds", {{"backend", "redis"}}), nullptr);
}

TEST(MetricsRegistryTest, KindNamesAreLeaseKindNames) {
  for (LeaseMode mode : {LeaseMode::kExclusive, LeaseMode::kShared}) {
    for (std::uint32_t limit : {1U, 2U, kMaxLeaseLimit}) {
      if (mode == LeaseMode::kShared && limit != 1) {
        continue;
      }
      EXPECT_EQ(kLeaseKindNames[static_cast<std::size_t>(KindOf(mode, limit))],
                LeaseKindName(mode, limit));
    }
  }
}

TEST(MetricsRegistryTest, SharedAndSemaphoreSeriesAppearOnlyOnceUsed) {
  MetricsRegistry registry;
  LeaseMetrics& m = registry.ForBackend("redis", true);
  m.RecordAcquire(LeaseKind::kExclusive, AcquireOutcome::kAcquired, 1ms);
  MetricsSnapshot snap = registry.Snapshot();
  EXPECT_NE(snap.Find("leasehold_lease_acquired_total", {{"kind", "exclusive"}}), nullptr);
  EXPECT_EQ(snap.Find("leasehold_lease_acquired_total", {{"kind", "shared"}}), nullptr);
  EXPECT_EQ(snap.Find("leasehold_leases_held", {{"kind", "semaphore"}}), nullptr);
  m.RecordRelease(LeaseKind::kSemaphore, ReleaseOutcome::kOk);
  snap = registry.Snapshot();
  EXPECT_EQ(snap.Find("leasehold_lease_acquired_total", {{"kind", "shared"}}), nullptr);
  const MetricPoint* released =
      snap.Find("leasehold_lease_released_total", {{"kind", "semaphore"}, {"outcome", "ok"}});
  ASSERT_NE(released, nullptr);
  EXPECT_EQ(released->value, 1);
  // Every per-lease family of the kind appears, the per-round ones stay without a kind.
  for (const char* name :
       {"leasehold_lease_acquired_total", "leasehold_acquire_conflicts_total",
        "leasehold_lease_lost_total", "leasehold_renew_failures_total",
        "leasehold_fenced_writes_total", "leasehold_acquire_latency_seconds",
        "leasehold_wait_seconds", "leasehold_handoff_seconds", "leasehold_leases_held"}) {
    EXPECT_NE(snap.Find(name, {{"kind", "semaphore"}}), nullptr) << name;
  }
  for (const char* name :
       {"leasehold_heartbeat_latency_seconds", "leasehold_ttl_headroom_warnings_total",
        "leasehold_store_failovers_total"}) {
    const MetricFamily* family = snap.Find(name);
    ASSERT_NE(family, nullptr);
    ASSERT_EQ(family->points.size(), 1U) << name;
    EXPECT_EQ(family->points[0].labels, (std::vector<MetricLabel>{{"backend", "redis"}}));
  }
}

TEST(MetricsRegistryTest, EveryFamilyIsListedEvenWithoutSeries) {
  MetricsRegistry registry;
  MetricsSnapshot snap = registry.Snapshot();
  for (const char* name :
       {"leasehold_lease_acquired_total", "leasehold_lease_lost_total",
        "leasehold_lease_released_total", "leasehold_acquire_conflicts_total",
        "leasehold_renew_failures_total", "leasehold_fenced_writes_total",
        "leasehold_acquire_latency_seconds", "leasehold_heartbeat_latency_seconds",
        "leasehold_wait_seconds", "leasehold_handoff_seconds", "leasehold_leases_held",
        "leasehold_lease_safe_remaining_seconds", "leasehold_ttl_headroom_ratio",
        "leasehold_ttl_headroom_warnings_total", "leasehold_store_failovers_total"}) {
    const MetricFamily* f = snap.Find(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_TRUE(f->points.empty()) << name;
    EXPECT_FALSE(f->help.empty()) << name;
  }
}

TEST(MetricsRegistryTest, BuildInfoNamesVersionCommitAndStores) {
  MetricsRegistry registry;
  MetricsSnapshot snap = registry.Snapshot();
  const MetricPoint* info =
      snap.Find("leasehold_build_info",
                {{"version", Version()}, {"commit", Commit()}, {"stores", CompiledStores()}});
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->value, 1);
  EXPECT_STRNE(Commit(), "");
  EXPECT_EQ(std::string(CompiledStores()).find("  "), std::string::npos);
}

}  // namespace
}  // namespace leasehold::internal
