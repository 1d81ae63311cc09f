// What a Store records, on a FakeClock and memory://: every event moves exactly the series it
// should, gauges are computed at scrape time, and no label carries the key.

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "leasehold/metrics.h"
#include "leasehold/store.h"
#include "leasehold/testing/fake_clock.h"

#include "backends/memory/memory_backend.h"
#include "core/store_access.h"
#include "core/url.h"
#include "testing/fault_injection_backend.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using testing::FakeClock;
using testing::FaultInjectionBackend;

constexpr Duration kTtl = 3s;
constexpr Duration kRenew = 1s;

class StoreMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto inner = internal::OpenMemoryBackend(internal::Url{.scheme = "memory"}, clock_);
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    inner_ = *inner;
    backend_ = std::make_shared<FaultInjectionBackend>(inner_);
    store_ = internal::OpenStoreWithBackend(backend_, {.clock = &clock_});
  }

  void Settle(std::size_t sleepers = 2) { ASSERT_TRUE(clock_.WaitForSleepers(sleepers)); }

  double Value(std::string_view name, std::vector<MetricLabel> labels) {
    labels.push_back({"backend", "memory"});
    MetricsSnapshot snap = store_->metrics()->Snapshot();
    const MetricPoint* p = snap.Find(name, labels);
    EXPECT_NE(p, nullptr) << name;
    return p == nullptr ? -1 : p->value;
  }

  std::uint64_t Count(std::string_view name, std::vector<MetricLabel> labels) {
    labels.push_back({"backend", "memory"});
    MetricsSnapshot snap = store_->metrics()->Snapshot();
    const MetricPoint* p = snap.Find(name, labels);
    EXPECT_NE(p, nullptr) << name;
    return p == nullptr ? 0 : p->count;
  }

  FakeClock clock_;
  std::shared_ptr<internal::Backend> inner_;
  std::shared_ptr<FaultInjectionBackend> backend_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreMetricsTest, AcquireConflictAndReleaseAreCounted) {
  auto lease = store_->TryAcquire("job:a", {.ttl = kTtl});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  auto again = store_->TryAcquire("job:a", {.ttl = kTtl});
  ASSERT_EQ(again.status().code(), StatusCode::kHeldByAnother);
  EXPECT_EQ(Value("leasehold_lease_acquired_total", {}), 1);
  EXPECT_EQ(Value("leasehold_acquire_conflicts_total", {}), 1);
  EXPECT_EQ(Count("leasehold_acquire_latency_seconds", {{"outcome", "acquired"}}), 1U);
  EXPECT_EQ(Count("leasehold_acquire_latency_seconds", {{"outcome", "held_by_another"}}), 1U);
  EXPECT_EQ(Value("leasehold_leases_held", {}), 1);
  ASSERT_TRUE(lease->Release().ok());
  ASSERT_TRUE(lease->Release().ok());  // the second release is a no-op, not counted
  EXPECT_EQ(Value("leasehold_lease_released_total", {{"outcome", "ok"}}), 1);
  EXPECT_EQ(Value("leasehold_lease_released_total", {{"outcome", "lost"}}), 0);
  EXPECT_EQ(Value("leasehold_leases_held", {}), 0);
}

TEST_F(StoreMetricsTest, FencedWritesAreCountedByOutcome) {
  auto lease = store_->TryAcquire("job:w", {.ttl = kTtl});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(lease->Write(FencedWrite().Put("data", "1")).ok());
  EXPECT_EQ(lease->Write(FencedWrite()).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store_->ForceRelease("job:w").ok());
  EXPECT_EQ(lease->Write(FencedWrite().Put("data", "2")).status().code(), StatusCode::kLost);
  EXPECT_EQ(Value("leasehold_fenced_writes_total", {{"outcome", "accepted"}}), 1);
  EXPECT_EQ(Value("leasehold_fenced_writes_total", {{"outcome", "fenced_out"}}), 1);
  // Input refused before any store call is not a store outcome: not counted.
  EXPECT_EQ(Value("leasehold_fenced_writes_total", {{"outcome", "error"}}), 0);
}

TEST_F(StoreMetricsTest, SafeRemainingIsTheSmallestMarginAtScrapeTime) {
  auto a = store_->TryAcquire("a", {.ttl = kTtl});
  ASSERT_TRUE(a.ok());
  Settle();
  clock_.Advance(100ms);
  auto b = store_->TryAcquire("b", {.ttl = kTtl});
  ASSERT_TRUE(b.ok());
  Settle();
  // a was taken 100 ms before b: its margin is the smaller one.
  const double expected = std::chrono::duration<double>(a->safe_until() - clock_.Now()).count();
  EXPECT_DOUBLE_EQ(Value("leasehold_lease_safe_remaining_seconds", {}), expected);
  EXPECT_EQ(Value("leasehold_leases_held", {}), 2);
  ASSERT_TRUE(a->Release().ok());
  ASSERT_TRUE(b->Release().ok());
  MetricsSnapshot snap = store_->metrics()->Snapshot();
  EXPECT_EQ(snap.Find("leasehold_lease_safe_remaining_seconds", {{"backend", "memory"}}), nullptr)
      << "no margin series while nothing is held";
}

TEST_F(StoreMetricsTest, FailingRenewalsGoHeldAtRiskLostWithReasonExpired) {
  std::mutex mu;
  std::vector<LeaseState> states;
  LeaseOptions options{.ttl = kTtl};
  options.on_state_change = [&](LeaseState s, const Status&) {
    std::lock_guard<std::mutex> lock(mu);
    states.push_back(s);
  };
  auto lease = store_->TryAcquire("job:cut-off", options);
  ASSERT_TRUE(lease.ok());
  Settle();
  EXPECT_EQ(lease->state(), LeaseState::kHeld);
  backend_->FailRenewals(StatusCode::kUnavailable, -1);  // the store is gone
  clock_.Advance(kRenew);
  Settle();
  EXPECT_EQ(lease->state(), LeaseState::kAtRisk);
  EXPECT_EQ(Value("leasehold_lease_lost_total", {{"reason", "expired"}}), 0);
  EXPECT_GE(Value("leasehold_renew_failures_total", {{"outcome", "unavailable"}}), 1);
  clock_.Advance(lease->safe_until() - clock_.Now());
  Settle();
  EXPECT_EQ(lease->state(), LeaseState::kLost);
  EXPECT_EQ(lease->lost_reason().lost_cause(), LostCause::kExpired);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(states, (std::vector<LeaseState>{LeaseState::kAtRisk, LeaseState::kLost}));
  }
  EXPECT_EQ(Value("leasehold_lease_lost_total", {{"reason", "expired"}}), 1);
  EXPECT_EQ(Value("leasehold_lease_lost_total", {{"reason", "store_said_no"}}), 0);
  EXPECT_GE(Count("leasehold_heartbeat_latency_seconds", {}), 1U);
  EXPECT_EQ(Value("leasehold_leases_held", {}), 0);
  EXPECT_EQ(lease->Release().code(), StatusCode::kLost);
  EXPECT_EQ(Value("leasehold_lease_released_total", {{"outcome", "lost"}}), 1);
}

TEST_F(StoreMetricsTest, ForceReleaseIsStoreSaidNoAndTakeoverIsStolen) {
  auto forced = store_->TryAcquire("f", {.ttl = kTtl});
  auto stolen = store_->TryAcquire("s", {.ttl = kTtl});
  ASSERT_TRUE(forced.ok() && stolen.ok());
  Settle();
  ASSERT_TRUE(store_->ForceRelease("f").ok());
  ASSERT_TRUE(store_->ForceRelease("s").ok());
  // Another handle on the same table takes "s" before the holder's next renewal.
  auto other = internal::OpenStoreWithBackend(inner_, {.clock = &clock_});
  auto thief = other->TryAcquire("s", {.ttl = 10s});
  ASSERT_TRUE(thief.ok());
  Settle(4);  // both handles' heartbeats
  clock_.Advance(kRenew);
  Settle(4);
  EXPECT_EQ(forced->state(), LeaseState::kLost);
  EXPECT_EQ(stolen->state(), LeaseState::kLost);
  EXPECT_EQ(forced->lost_reason().lost_cause(), LostCause::kStoreSaidNo);
  EXPECT_EQ(stolen->lost_reason().lost_cause(), LostCause::kStolen);
  EXPECT_EQ(Value("leasehold_lease_lost_total", {{"reason", "store_said_no"}}), 1);
  EXPECT_EQ(Value("leasehold_lease_lost_total", {{"reason", "stolen"}}), 1);
  EXPECT_EQ(Value("leasehold_renew_failures_total", {{"outcome", "lost"}}), 2);
  // The other handle records into its own registry.
  MetricsSnapshot theirs = other->metrics()->Snapshot();
  const MetricPoint* p = theirs.Find("leasehold_lease_acquired_total", {{"backend", "memory"}});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->value, 1);
}

TEST_F(StoreMetricsTest, ASharedRegistryAddsHandlesUpAndDisabledHandlesRecordNothing) {
  auto shared = std::make_shared<Metrics>();
  auto one = internal::OpenStoreWithBackend(inner_, {.clock = &clock_, .metrics = shared});
  auto two = internal::OpenStoreWithBackend(inner_, {.clock = &clock_, .metrics = shared});
  auto off = internal::OpenStoreWithBackend(inner_, {.clock = &clock_, .record_metrics = false});
  EXPECT_EQ(one->metrics(), shared);
  auto a = one->TryAcquire("a", {.ttl = kTtl});
  auto b = two->TryAcquire("b", {.ttl = kTtl});
  auto c = off->TryAcquire("c", {.ttl = kTtl});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  MetricsSnapshot snap = shared->Snapshot();
  const MetricPoint* acquired =
      snap.Find("leasehold_lease_acquired_total", {{"backend", "memory"}});
  ASSERT_NE(acquired, nullptr);
  EXPECT_EQ(acquired->value, 2);
  const MetricPoint* held = snap.Find("leasehold_leases_held", {{"backend", "memory"}});
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->value, 2);
  EXPECT_TRUE(off->metrics()->Snapshot().Find("leasehold_lease_acquired_total")->points.empty());
  // A closed handle drops out of the gauges; its counters stay.
  a = Lease();
  one.reset();
  snap = shared->Snapshot();
  EXPECT_EQ(snap.Find("leasehold_leases_held", {{"backend", "memory"}})->value, 1);
  EXPECT_EQ(snap.Find("leasehold_lease_acquired_total", {{"backend", "memory"}})->value, 2);
}

TEST_F(StoreMetricsTest, AWaiterWokenByAReleaseRecordsWaitAndHandoff) {
  auto holder = store_->TryAcquire("k", {.ttl = kTtl});
  ASSERT_TRUE(holder.ok());
  Settle();
  Result<Lease> waited = Status::Internal("not run");
  std::jthread waiter([&] { waited = store_->Acquire("k", {.ttl = kTtl}); });
  Settle(3);  // the waiter sleeps on the clock too
  ASSERT_TRUE(holder->Release().ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(Count("leasehold_wait_seconds", {{"outcome", "acquired"}}), 1U);
  EXPECT_EQ(Count("leasehold_handoff_seconds", {}), 1U);
  EXPECT_EQ(Value("leasehold_acquire_conflicts_total", {}), 1);
}

TEST_F(StoreMetricsTest, NoLabelEverCarriesTheKey) {
  auto lease = store_->TryAcquire("tenant-7f3a:secret-job", {.ttl = kTtl});
  ASSERT_TRUE(lease.ok());
  Settle();
  std::string text = store_->metrics()->PrometheusText();
  EXPECT_EQ(text.find("tenant-7f3a"), std::string::npos) << text;
  EXPECT_NE(text.find("leasehold_lease_acquired_total{backend=\"memory\",kind=\"exclusive\"} 1\n"),
            std::string::npos)
      << text;
}

TEST_F(StoreMetricsTest, PlainLeasesAddNoSharedOrSemaphoreSeries) {
  auto lease = store_->TryAcquire("plain", {.ttl = kTtl});
  ASSERT_TRUE(lease.ok());
  Settle();
  std::string text = store_->metrics()->PrometheusText();
  EXPECT_NE(text.find("leasehold_leases_held{backend=\"memory\",kind=\"exclusive\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("kind=\"shared\""), std::string::npos) << text;
  EXPECT_EQ(text.find("kind=\"semaphore\""), std::string::npos) << text;
  // Per-round and per-handle series carry no kind.
  EXPECT_NE(text.find("leasehold_heartbeat_latency_seconds_count{backend=\"memory\"} "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("leasehold_ttl_headroom_warnings_total{backend=\"memory\"} 0\n"),
            std::string::npos)
      << text;
}

TEST_F(StoreMetricsTest, ASemaphoreAndASharedLeaseRecordUnderTheirKind) {
  const std::vector<MetricLabel> semaphore{{"kind", "semaphore"}};
  const std::vector<MetricLabel> shared{{"kind", "shared"}};
  const std::vector<MetricLabel> exclusive{{"kind", "exclusive"}};
  const LeaseOptions permit{.ttl = kTtl, .limit = 2};
  auto p1 = store_->TryAcquire("pool-9c1e:gpu", permit);
  auto p2 = store_->TryAcquire("pool-9c1e:gpu", permit);
  ASSERT_TRUE(p1.ok() && p2.ok()) << p1.status().ToString() << p2.status().ToString();
  EXPECT_EQ(store_->TryAcquire("pool-9c1e:gpu", permit).status().code(),
            StatusCode::kHeldByAnother);
  const LeaseOptions reader{.ttl = kTtl, .mode = LeaseMode::kShared};
  auto r1 = store_->TryAcquire("table-4d2b:orders", reader);
  auto r2 = store_->TryAcquire("table-4d2b:orders", reader);
  ASSERT_TRUE(r1.ok() && r2.ok()) << r1.status().ToString() << r2.status().ToString();
  // A writer refused by the readers is an exclusive conflict.
  EXPECT_EQ(store_->TryAcquire("table-4d2b:orders", {.ttl = kTtl}).status().code(),
            StatusCode::kHeldByAnother);
  Settle();

  EXPECT_EQ(Value("leasehold_lease_acquired_total", semaphore), 2);
  EXPECT_EQ(Value("leasehold_acquire_conflicts_total", semaphore), 1);
  EXPECT_EQ(Value("leasehold_lease_acquired_total", shared), 2);
  EXPECT_EQ(Value("leasehold_acquire_conflicts_total", shared), 0);
  EXPECT_EQ(Value("leasehold_lease_acquired_total", exclusive), 0);
  EXPECT_EQ(Value("leasehold_acquire_conflicts_total", exclusive), 1);
  std::vector<MetricLabel> labels = semaphore;
  labels.push_back({"outcome", "acquired"});
  EXPECT_EQ(Count("leasehold_acquire_latency_seconds", labels), 2U);
  EXPECT_EQ(Value("leasehold_leases_held", semaphore), 2);
  EXPECT_EQ(Value("leasehold_leases_held", shared), 2);
  EXPECT_EQ(Value("leasehold_leases_held", exclusive), 0);
  EXPECT_GT(Value("leasehold_lease_safe_remaining_seconds", shared), 0);
  // One fenced write by a permit holder, one by a reader after a force release of its grant.
  ASSERT_TRUE(p1->Write(FencedWrite().Put("data", "1")).ok());
  ASSERT_TRUE(store_->ForceReleaseGrant("table-4d2b:orders", r1->token_prefix()).ok());
  EXPECT_EQ(r1->Write(FencedWrite().Put("data", "2")).status().code(), StatusCode::kLost);
  labels = semaphore;
  labels.push_back({"outcome", "accepted"});
  EXPECT_EQ(Value("leasehold_fenced_writes_total", labels), 1);
  labels = shared;
  labels.push_back({"outcome", "fenced_out"});
  EXPECT_EQ(Value("leasehold_fenced_writes_total", labels), 1);
  // The heartbeat finds the reader's grant gone: a renewal failure and a loss, both shared.
  clock_.Advance(kRenew);
  Settle();
  EXPECT_EQ(r1->state(), LeaseState::kLost);
  labels = shared;
  labels.push_back({"outcome", "lost"});
  EXPECT_EQ(Value("leasehold_renew_failures_total", labels), 1);
  labels = shared;
  labels.push_back({"reason", "store_said_no"});
  EXPECT_EQ(Value("leasehold_lease_lost_total", labels), 1);
  labels = exclusive;
  labels.push_back({"reason", "store_said_no"});
  EXPECT_EQ(Value("leasehold_lease_lost_total", labels), 0);

  ASSERT_TRUE(p1->Release().ok());
  ASSERT_TRUE(p2->Release().ok());
  ASSERT_TRUE(r2->Release().ok());
  labels = semaphore;
  labels.push_back({"outcome", "ok"});
  EXPECT_EQ(Value("leasehold_lease_released_total", labels), 2);
  labels = shared;
  labels.push_back({"outcome", "ok"});
  EXPECT_EQ(Value("leasehold_lease_released_total", labels), 1);
  EXPECT_EQ(Value("leasehold_leases_held", semaphore), 0);
  EXPECT_EQ(Value("leasehold_leases_held", shared), 0);

  std::string text = store_->metrics()->PrometheusText();
  EXPECT_EQ(text.find("pool-9c1e"), std::string::npos) << text;
  EXPECT_EQ(text.find("table-4d2b"), std::string::npos) << text;
  EXPECT_NE(text.find("leasehold_lease_acquired_total{backend=\"memory\",kind=\"semaphore\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("leasehold_lease_acquired_total{backend=\"memory\",kind=\"shared\"} 2\n"),
            std::string::npos)
      << text;
}

TEST_F(StoreMetricsTest, ASemaphoreWaiterRecordsItsWaitAndHandoffUnderItsKind) {
  const LeaseOptions two{.ttl = kTtl, .limit = 2};
  auto a = store_->TryAcquire("q", two);
  auto b = store_->TryAcquire("q", two);
  ASSERT_TRUE(a.ok() && b.ok());
  Settle();
  Result<Lease> waited = Status::Internal("not run");
  std::jthread waiter([&] { waited = store_->Acquire("q", two); });
  Settle(3);
  ASSERT_TRUE(a->Release().ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(Count("leasehold_wait_seconds", {{"kind", "semaphore"}, {"outcome", "acquired"}}), 1U);
  EXPECT_EQ(Count("leasehold_wait_seconds", {{"kind", "exclusive"}, {"outcome", "acquired"}}), 0U);
  EXPECT_EQ(Count("leasehold_handoff_seconds", {{"kind", "semaphore"}}), 1U);
  EXPECT_EQ(Count("leasehold_handoff_seconds", {{"kind", "exclusive"}}), 0U);
}

}  // namespace
}  // namespace leasehold
