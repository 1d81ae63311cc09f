// The safety rule (safe_until = t_send + ttl - drift, docs/impl.md "safe_until") at its edges, on a
// FakeClock and memory://: every test moves time by hand, so each renew round and each expiry
// happens exactly when the test says, with no sleeps.

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "leasehold/store.h"
#include "leasehold/testing/fake_clock.h"

#include "backends/forwarding_backend.h"
#include "backends/memory/memory_backend.h"
#include "core/store_access.h"
#include "core/url.h"
#include "testing/fault_injection_backend.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using testing::FakeClock;
using testing::FaultInjectionBackend;

// ttl 3 s, renew every 1 s, drift 3s/100 + 2ms = 32 ms.
constexpr Duration kTtl = 3s;
constexpr Duration kRenew = 1s;
constexpr Duration kDrift = 32ms;

class LeaseSafetyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto inner = internal::OpenMemoryBackend(internal::Url{.scheme = "memory"}, clock_);
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    backend_ = std::make_shared<FaultInjectionBackend>(*inner);
    store_ = internal::OpenStoreWithBackend(backend_, {.clock = &clock_});
  }

  // Acquires "k" with counters on the callbacks.
  Lease AcquireCounted(const std::string& key = "k") {
    LeaseOptions options{.ttl = kTtl};
    options.on_lost = [this](const Status& s) {
      ++lost_calls_;
      last_lost_code_ = s.code();
    };
    options.on_state_change = [this](LeaseState state, const Status&) {
      if (state == LeaseState::kAtRisk) {
        ++at_risk_calls_;
      }
    };
    auto lease = store_->TryAcquire(key, options);
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    return std::move(lease).value();
  }

  // Both heartbeat threads (renewer and watchdog) are asleep on the clock.
  void Settle(std::size_t sleepers = 2) { ASSERT_TRUE(clock_.WaitForSleepers(sleepers)); }

  FakeClock clock_;
  std::shared_ptr<FaultInjectionBackend> backend_;
  std::unique_ptr<Store> store_;
  std::atomic<int> lost_calls_{0};
  std::atomic<int> at_risk_calls_{0};
  std::atomic<StatusCode> last_lost_code_{StatusCode::kOk};
};

TEST_F(LeaseSafetyTest, SafeUntilIsSendTimePlusTtlMinusDrift) {
  SteadyTime t0 = clock_.Now();
  Lease lease = AcquireCounted();
  EXPECT_EQ(lease.safe_until(), t0 + kTtl - kDrift);
  EXPECT_EQ(lease.renew_interval(), kRenew);
  EXPECT_TRUE(lease.valid());
  EXPECT_EQ(lease.state(), LeaseState::kHeld);
}

// A store may grant less than was asked (etcd's spare lease reports its TTL less its age): the
// core counts on the store's figure, never on the request.
class ShorterGrantBackend final : public internal::ForwardingBackend {
 public:
  ShorterGrantBackend(std::shared_ptr<internal::Backend> inner, Duration granted)
      : ForwardingBackend(std::move(inner)), granted_(granted) {}

  Result<internal::Grant> TryAcquire(const internal::GrantRequest& request) override {
    auto grant = ForwardingBackend::TryAcquire(request);
    if (grant.ok()) {
      grant->ttl = granted_;
    }
    return grant;
  }

 private:
  Duration granted_;
};

TEST(LeaseGrantTtlTest, ShorterGrantedTtlThanRequestedIsWhatSafeUntilUses) {
  FakeClock clock;
  auto inner = internal::OpenMemoryBackend(internal::Url{.scheme = "memory"}, clock);
  ASSERT_TRUE(inner.ok());
  auto store = internal::OpenStoreWithBackend(std::make_shared<ShorterGrantBackend>(*inner, 2500ms),
                                              {.clock = &clock});
  SteadyTime t0 = clock.Now();
  auto lease = store->TryAcquire("k", {.ttl = 3s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->ttl(), 2500ms);
  EXPECT_EQ(lease->safe_until(), t0 + 2500ms - (25ms + 2ms));
}

TEST_F(LeaseSafetyTest, RenewMovesSafeUntilForwardFromItsOwnSendTime) {
  SteadyTime t0 = clock_.Now();
  Lease lease = AcquireCounted();
  Settle();
  clock_.Advance(kRenew);
  Settle();
  EXPECT_EQ(backend_->renew_calls(), 1);
  EXPECT_EQ(lease.safe_until(), t0 + kRenew + kTtl - kDrift);
  clock_.Advance(kRenew);
  Settle();
  EXPECT_EQ(lease.safe_until(), t0 + 2 * kRenew + kTtl - kDrift);
  EXPECT_EQ(lost_calls_, 0);
}

TEST_F(LeaseSafetyTest, OnRenewedReportsEveryConfirmedRenewalWithItsNewSafeUntil) {
  SteadyTime t0 = clock_.Now();
  std::mutex mu;
  std::vector<SteadyTime> reported;
  LeaseOptions options{.ttl = kTtl};
  options.on_renewed = [&](SteadyTime safe_until) {
    std::lock_guard<std::mutex> lock(mu);
    reported.push_back(safe_until);
  };
  auto lease = store_->TryAcquire("k", options);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  Settle();
  clock_.Advance(kRenew);
  Settle();
  backend_->FailRenewals(StatusCode::kUnavailable, 1);  // a failed renewal reports nothing
  clock_.Advance(kRenew);
  Settle();
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(reported.size(), 1u);
    EXPECT_EQ(reported[0], t0 + kRenew + kTtl - kDrift);
  }
  clock_.Advance(kRenew / 2);  // the retry succeeds
  Settle();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(reported.size(), 2u);
  EXPECT_EQ(reported[1], lease->safe_until());
}

TEST_F(LeaseSafetyTest, LostFiresAtSafeUntilEvenIfNoReplyEverArrives) {
  Lease lease = AcquireCounted();
  SteadyTime safe_until = lease.safe_until();
  Settle();
  backend_->BlockRenewals();
  clock_.Advance(kRenew);
  ASSERT_TRUE(backend_->WaitForBlockedRenewal());
  clock_.Advance(safe_until - clock_.Now() - 1ns);
  Settle(1);  // only the watchdog sleeps; the renewer is stuck in the store call
  EXPECT_TRUE(lease.valid()) << "one nanosecond before safe_until the lease is still ours";
  clock_.Advance(1ns);
  Settle(1);
  EXPECT_TRUE(lease.lost_token().stop_requested());
  EXPECT_EQ(lost_calls_, 1);
  EXPECT_FALSE(lease.valid());
  backend_->UnblockRenewals();
  Settle();
}

TEST_F(LeaseSafetyTest, ARenewalStuckInTheStoreMakesTheLeaseAtRiskBeforeItIsLost) {
  SteadyTime t0 = clock_.Now();
  Lease lease = AcquireCounted();
  Settle();
  backend_->BlockRenewals();
  clock_.Advance(kRenew);
  ASSERT_TRUE(backend_->WaitForBlockedRenewal());
  clock_.Advance(kRenew - 1ns);
  Settle(1);
  EXPECT_EQ(lease.state(), LeaseState::kHeld) << "one renew interval late is not yet overdue";
  clock_.Advance(1ns);  // two intervals since the last confirmed renewal (the acquire, at t0)
  Settle(1);
  EXPECT_EQ(lease.state(), LeaseState::kAtRisk);
  EXPECT_EQ(at_risk_calls_, 1);
  EXPECT_TRUE(lease.valid());
  EXPECT_EQ(lease.safe_until(), t0 + kTtl - kDrift);
  clock_.Advance(lease.safe_until() - clock_.Now());
  Settle(1);
  EXPECT_FALSE(lease.valid());
  EXPECT_EQ(lost_calls_, 1);
  backend_->UnblockRenewals();
  Settle();
}

TEST_F(LeaseSafetyTest, RenewReplyAfterSafeUntilDoesNotBringTheLeaseBack) {
  Lease lease = AcquireCounted();
  Settle();
  backend_->BlockRenewals();
  clock_.Advance(kRenew);
  ASSERT_TRUE(backend_->WaitForBlockedRenewal());
  clock_.Advance(kTtl);
  Settle(1);
  ASSERT_EQ(lease.state(), LeaseState::kLost);
  // The store did renew (the renew reached it in time), but the reply is late: stays lost.
  backend_->UnblockRenewals();
  Settle();
  EXPECT_EQ(lease.state(), LeaseState::kLost);
  EXPECT_FALSE(lease.valid());
  EXPECT_EQ(lost_calls_, 1);
  clock_.Advance(kRenew);
  Settle();
  EXPECT_FALSE(lease.valid());
  EXPECT_EQ(lost_calls_, 1);
  EXPECT_EQ(lease.Release().code(), StatusCode::kLost);
}

TEST_F(LeaseSafetyTest, TransientRenewErrorsAreRetriedUntilSafeUntilThenLost) {
  Lease lease = AcquireCounted();
  SteadyTime safe_until = lease.safe_until();
  Settle();
  backend_->FailRenewals(StatusCode::kUnavailable, -1);
  clock_.Advance(kRenew);
  Settle();
  EXPECT_EQ(lease.state(), LeaseState::kAtRisk);
  EXPECT_TRUE(lease.valid()) << "at risk is still valid until safe_until";
  EXPECT_EQ(at_risk_calls_, 1);
  while (clock_.Now() + 50ms < safe_until) {
    clock_.Advance(50ms);
    Settle();
    ASSERT_TRUE(lease.valid());
  }
  int attempts = backend_->renew_calls();
  EXPECT_GE(attempts, 4) << "failed renewals must be retried, not given up";
  clock_.Advance(safe_until - clock_.Now());
  Settle();
  EXPECT_FALSE(lease.valid());
  EXPECT_EQ(lost_calls_, 1);
  EXPECT_EQ(last_lost_code_.load(), StatusCode::kLost);
  EXPECT_EQ(at_risk_calls_, 1) << "at risk is announced once per episode";
}

TEST_F(LeaseSafetyTest, RecoversFromAtRiskWhenARenewalSucceeds) {
  SteadyTime t0 = clock_.Now();
  Lease lease = AcquireCounted();
  Settle();
  backend_->FailRenewals(StatusCode::kUnavailable, 1);
  clock_.Advance(kRenew);
  Settle();
  ASSERT_EQ(lease.state(), LeaseState::kAtRisk);
  clock_.Advance(kRenew / 2);  // past the first retry (1/8 of the interval)
  Settle();
  EXPECT_EQ(lease.state(), LeaseState::kHeld);
  EXPECT_GT(lease.safe_until(), t0 + kRenew + kTtl - kDrift);
}

TEST_F(LeaseSafetyTest, StoreSayingNotYoursMakesTheLeaseLostAtOnce) {
  Lease lease = AcquireCounted();
  Settle();
  auto forced = store_->ForceRelease("k");
  ASSERT_TRUE(forced.ok());
  EXPECT_TRUE(*forced);
  clock_.Advance(kRenew);
  Settle();
  EXPECT_LT(clock_.Now(), lease.safe_until()) << "lost well before safe_until";
  EXPECT_FALSE(lease.valid());
  EXPECT_EQ(lost_calls_, 1);
  EXPECT_EQ(lease.lost_reason().code(), StatusCode::kLost);
  EXPECT_EQ(lease.Release().code(), StatusCode::kLost);
}

TEST_F(LeaseSafetyTest, LostFiresExactlyOnceUnderConcurrentObservers) {
  Lease lease = AcquireCounted();
  Settle();
  backend_->BlockRenewals();
  clock_.Advance(kRenew);
  ASSERT_TRUE(backend_->WaitForBlockedRenewal());
  std::atomic<bool> go{false};
  std::vector<std::jthread> observers;
  for (int i = 0; i < 4; ++i) {
    observers.emplace_back([&] {
      while (!go) {
      }
      for (int n = 0; n < 1000; ++n) {
        (void)lease.valid();
      }
    });
  }
  go = true;
  clock_.Advance(kTtl);
  observers.clear();
  backend_->UnblockRenewals();
  Settle();
  EXPECT_EQ(lost_calls_, 1);
}

TEST_F(LeaseSafetyTest, DestroyingLeaseAndStoreDuringARenewIsSafe) {
  std::optional<Lease> lease(AcquireCounted());
  Settle();
  backend_->BlockRenewals();
  clock_.Advance(kRenew);
  ASSERT_TRUE(backend_->WaitForBlockedRenewal());
  std::jthread destroyer([&] {
    lease.reset();   // releases while the renew is in flight
    store_.reset();  // joins the heartbeat, which is still inside the store call
  });
  std::this_thread::sleep_for(20ms);  // let the destroyer reach the join (real time, harmless)
  backend_->UnblockRenewals();
  destroyer.join();
  EXPECT_EQ(lost_calls_, 0) << "a release is not a loss";
}

TEST_F(LeaseSafetyTest, ReleaseIsHarmlessTwiceAndNeverDeletesAnotherGrant) {
  Lease first = AcquireCounted("a");
  ASSERT_TRUE(first.Release().ok());
  EXPECT_TRUE(first.Release().ok());
  EXPECT_FALSE(first.valid());
  EXPECT_TRUE(first.lost_token().stop_requested()) << "work bound to a released lease stops";

  Lease stale = AcquireCounted("b");
  ASSERT_TRUE(store_->ForceRelease("b").ok());
  Lease fresh = AcquireCounted("b");
  EXPECT_GT(fresh.fencing_token(), stale.fencing_token());
  EXPECT_EQ(stale.Release().code(), StatusCode::kLost);
  auto info = store_->Inspect("b");
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE(info->has_value()) << "the stale release must not delete the new grant";
  EXPECT_EQ((*info)->fencing_token, fresh.fencing_token());
}

TEST_F(LeaseSafetyTest, OneRenewRoundTripForManyLeases) {
  std::vector<Lease> leases;
  for (int i = 0; i < 50; ++i) {
    leases.push_back(AcquireCounted(fmt::format("k{}", i)));
    clock_.Advance(4ms);  // acquired at different times, all within a quarter interval
  }
  Settle();
  int before = backend_->renew_many_calls();
  clock_.Advance(kRenew);
  Settle();
  EXPECT_EQ(backend_->renew_many_calls() - before, 1);
  EXPECT_EQ(backend_->renew_calls(), 50);
  for (int round = 0; round < 3; ++round) {
    clock_.Advance(kRenew);
    Settle();
  }
  EXPECT_EQ(backend_->renew_many_calls() - before, 4);
  for (const Lease& l : leases) {
    EXPECT_TRUE(l.valid());
  }
}

TEST_F(LeaseSafetyTest, LeasesTakenFarApartFallIntoOneRound) {
  std::vector<Lease> leases;
  for (int group = 0; group < 4; ++group) {
    for (int i = 0; i < 10; ++i) {
      leases.push_back(AcquireCounted(fmt::format("g{}-{}", group, i)));
    }
    clock_.Advance(kRenew * 3 / 10);  // groups 0.3 renew intervals apart
  }
  Settle();
  // The first interval may take a few rounds while the groups merge...
  for (int step = 0; step < 20; ++step) {
    clock_.Advance(kRenew / 10);
    Settle();
  }
  // ...after that, every round renews all 40 leases in one call.
  int calls = backend_->renew_many_calls();
  int renewals = backend_->renew_calls();
  for (int step = 0; step < 30; ++step) {
    clock_.Advance(kRenew / 10);
    Settle();
  }
  EXPECT_EQ(backend_->renew_many_calls() - calls, 3) << "three intervals, three round trips";
  EXPECT_EQ(backend_->renew_calls() - renewals, 3 * 40);
}

TEST_F(LeaseSafetyTest, WaiterGetsTheKeyWhenTheHolderReleases) {
  Lease holder = AcquireCounted();
  Settle();
  Result<Lease> waited = Status::Internal("not run");
  std::jthread waiter([&] { waited = store_->Acquire("k", {.ttl = kTtl}); });
  Settle(3);  // the waiter sleeps on the clock too
  ASSERT_TRUE(holder.Release().ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_GT(waited->fencing_token(), holder.fencing_token());
}

TEST_F(LeaseSafetyTest, WaiterTakesOverAtExpiryWhenTheHolderStopsRenewing) {
  Lease holder = AcquireCounted();
  backend_->FailRenewals(StatusCode::kUnavailable, -1);  // the holder is cut off
  Settle();
  Result<Lease> waited = Status::Internal("not run");
  std::atomic<bool> done{false};  // publishes `waited` to this thread (release/acquire)
  std::jthread waiter([&] {
    waited = store_->Acquire("k", {.ttl = kTtl});
    done.store(true, std::memory_order_release);
  });
  Settle(3);
  SteadyTime start = clock_.Now();
  while (!done.load(std::memory_order_acquire) && clock_.Now() < start + 2 * kTtl) {
    clock_.Advance(100ms);
    (void)clock_.WaitForSleepers(3, 50ms);
  }
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_FALSE(holder.valid()) << "the old holder was told before the takeover";
  EXPECT_LE(holder.safe_until(), clock_.Now());
}

TEST_F(LeaseSafetyTest, WaitRunsOutWithDeadlineExceeded) {
  Lease holder = AcquireCounted();
  Settle();
  Result<Lease> waited = Status::Internal("not run");
  std::jthread waiter([&] { waited = store_->Acquire("k", {.ttl = kTtl, .wait = 2s}); });
  Settle(3);
  clock_.Advance(1s);
  Settle(3);
  clock_.Advance(1s);
  waiter.join();
  EXPECT_EQ(waited.status().code(), StatusCode::kDeadlineExceeded) << waited.status().ToString();
  EXPECT_TRUE(holder.valid());
}

TEST_F(LeaseSafetyTest, WaitIsCancelledThroughTheStopToken) {
  Lease holder = AcquireCounted();
  Settle();
  std::stop_source cancel;
  Result<Lease> waited = Status::Internal("not run");
  std::jthread waiter([&] { waited = store_->Acquire("k", {.ttl = kTtl}, cancel.get_token()); });
  Settle(3);
  cancel.request_stop();
  waiter.join();
  EXPECT_EQ(waited.status().code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace leasehold
