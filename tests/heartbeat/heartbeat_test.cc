// The heartbeat's own duties: lazy threads, forgetting released and lost leases, waking its
// threads only when a new lease needs it.

#include "heartbeat/heartbeat.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "leasehold/store.h"
#include "leasehold/testing/fake_clock.h"

#include "backends/forwarding_backend.h"
#include "backends/memory/memory_backend.h"
#include "core/logging.h"
#include "core/url.h"

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;

TEST(HeartbeatTest, StartsNoThreadUntilTheFirstLease) {
  testing::FakeClock clock;
  auto store = Store::Open("memory://", {.clock = &clock});
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->List("").ok());
  EXPECT_EQ(clock.sleepers(), 0u);
  auto lease = (*store)->TryAcquire("k", {.ttl = 3s});
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(clock.WaitForSleepers(2));
}

TEST(HeartbeatTest, ForgetsReleasedAndLostLeases) {
  testing::FakeClock clock;
  auto backend = OpenMemoryBackend(Url{.scheme = "memory"}, clock);
  ASSERT_TRUE(backend.ok());
  Heartbeat heartbeat(*backend, clock);
  auto make = [&](const std::string& key) {
    auto grant = (*backend)->TryAcquire({key, std::string(32, 'a'), "h", 3s});
    EXPECT_TRUE(grant.ok());
    return std::make_shared<LeaseCore>(clock, LeaseParams{.key = key,
                                                          .owner_token = std::string(32, 'a'),
                                                          .fencing_token = grant->fencing_token,
                                                          .ttl = 3s,
                                                          .renew_interval = 1s,
                                                          .drift = 32ms,
                                                          .t_send = clock.Now()});
  };
  auto a = make("a");
  auto b = make("b");
  heartbeat.Add(a);
  heartbeat.Add(b);
  ASSERT_TRUE(clock.WaitForSleepers(2));
  EXPECT_EQ(heartbeat.size(), 2u);
  heartbeat.Remove(a.get());
  EXPECT_EQ(heartbeat.size(), 1u);
  b->MarkLost(Status::Lost("test"));
  clock.Advance(1s);
  ASSERT_TRUE(clock.WaitForSleepers(2));
  EXPECT_EQ(heartbeat.size(), 0u);
  EXPECT_EQ(heartbeat.rounds(), 0u) << "nothing left to renew";
}

// An acquire should not cost two thread wake-ups: a lease due after every lease the loops
// already sleep for wakes neither; one due earlier wakes them, and is renewed on time.
TEST(HeartbeatTest, WakesItsThreadsOnlyForALeaseDueBeforeTheirPlan) {
  testing::FakeClock clock;
  auto backend = OpenMemoryBackend(Url{.scheme = "memory"}, clock);
  ASSERT_TRUE(backend.ok());
  Heartbeat heartbeat(*backend, clock);
  auto make = [&](const std::string& key, Duration renew_interval) {
    auto grant = (*backend)->TryAcquire({key, std::string(32, 'a'), "h", 3s});
    EXPECT_TRUE(grant.ok());
    return std::make_shared<LeaseCore>(clock, LeaseParams{.key = key,
                                                          .owner_token = std::string(32, 'a'),
                                                          .fencing_token = grant->fencing_token,
                                                          .ttl = 3s,
                                                          .renew_interval = renew_interval,
                                                          .drift = 32ms,
                                                          .t_send = clock.Now()});
  };
  auto a = make("a", 1s);
  heartbeat.Add(a);
  ASSERT_TRUE(clock.WaitForSleepers(2));
  const std::uint64_t after_first = heartbeat.early_wakes();
  for (int i = 0; i < 20; ++i) {
    clock.Advance(1ms);
    heartbeat.Add(make("later" + std::to_string(i), 1s));
  }
  ASSERT_TRUE(clock.WaitForSleepers(2));
  EXPECT_EQ(heartbeat.early_wakes(), after_first) << "leases due later woke a thread";
  EXPECT_EQ(heartbeat.rounds(), 0u);
  // Due in 100 ms, before the renewer's plan (a's due time, ~980 ms away): it must wake.
  auto soon = make("soon", 100ms);
  heartbeat.Add(soon);
  EXPECT_GT(heartbeat.early_wakes(), after_first);
  ASSERT_TRUE(clock.WaitForSleepers(2));
  clock.Advance(100ms);
  for (int i = 0; i < 200 && heartbeat.rounds() == 0; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(heartbeat.rounds(), 1u) << "the early lease was not renewed at its due time";
  EXPECT_EQ(soon->state(), LeaseState::kHeld);
}

// A store whose every renewal round takes `latency` on the fake clock.
class SlowRenewals final : public ForwardingBackend {
 public:
  SlowRenewals(std::shared_ptr<Backend> inner, testing::FakeClock& clock, Duration latency)
      : ForwardingBackend(std::move(inner)), clock_(clock), latency_(latency) {}

  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override {
    clock_.Advance(latency_);
    return ForwardingBackend::RenewMany(requests);
  }

 private:
  testing::FakeClock& clock_;
  const Duration latency_;
};

// Runs `rounds` renewal rounds of one 3 s lease (renewed every 1 s) whose round trips take
// `latency`; returns the headroom warnings logged and the heartbeat's count of them.
struct HeadroomRun {
  std::vector<std::string> warnings;
  std::uint64_t counted = 0;
  HeldLeaseGauges gauges;
};

HeadroomRun RunRounds(Duration latency, int rounds) {
  testing::FakeClock clock;
  auto memory = OpenMemoryBackend(Url{.scheme = "memory"}, clock);
  EXPECT_TRUE(memory.ok());
  auto backend = std::make_shared<SlowRenewals>(*memory, clock, latency);
  HeadroomRun run;
  std::mutex mu;
  SetLogSink([&](LogLevel, std::string_view line) {
    std::lock_guard lock(mu);
    if (line.find("ttl_headroom_low") != std::string_view::npos) {
      run.warnings.emplace_back(line);
    }
  });
  {
    Heartbeat heartbeat(backend, clock);
    auto grant = backend->TryAcquire({"k", std::string(32, 'a'), "h", 3s});
    EXPECT_TRUE(grant.ok());
    auto lease =
        std::make_shared<LeaseCore>(clock, LeaseParams{.key = "k",
                                                       .owner_token = std::string(32, 'a'),
                                                       .fencing_token = grant->fencing_token,
                                                       .ttl = 3s,
                                                       .renew_interval = 1s,
                                                       .drift = 32ms,
                                                       .t_send = clock.Now()});
    heartbeat.Add(lease);
    for (int i = 0; i < rounds; ++i) {
      EXPECT_TRUE(clock.WaitForSleepers(2));
      clock.Set(lease->NextRenewDue());
      for (int w = 0; w < 400 && heartbeat.rounds() <= static_cast<std::uint64_t>(i); ++w) {
        std::this_thread::sleep_for(5ms);
      }
    }
    EXPECT_EQ(heartbeat.rounds(), static_cast<std::uint64_t>(rounds));
    EXPECT_EQ(lease->state(), LeaseState::kHeld);
    run.counted = heartbeat.headroom_warnings();
    run.gauges = heartbeat.CollectGauges();
  }
  SetLogSink(nullptr);
  return run;
}

// The rule "TTL at least 10x the heartbeat's p99": 400 ms round trips on a 3 s TTL (a third over
// the tenth) warn from the 5th round on, naming the figures and a TTL that meets the rule, once a
// minute: 70 rounds of 1 s, two warnings (rounds 5 and ~66); the gauge is TTL / p99.
TEST(HeartbeatTest, WarnsOnceAMinuteWhenTheP99ExceedsATenthOfTheTtl) {
  HeadroomRun run = RunRounds(400ms, 70);
  ASSERT_EQ(run.warnings.size(), 2u) << "rate-limited to one a minute";
  EXPECT_EQ(run.counted, 2u);
  const std::string& line = run.warnings.front();
  EXPECT_NE(line.find("heartbeat_p99_seconds=0.400000"), std::string::npos) << line;
  EXPECT_NE(line.find("ttl_seconds=3.000000"), std::string::npos) << line;
  EXPECT_NE(line.find("recommended_ttl=4s"), std::string::npos) << line;
  ASSERT_TRUE(run.gauges.min_ttl_headroom.has_value());
  EXPECT_DOUBLE_EQ(*run.gauges.min_ttl_headroom, 7.5);
}

TEST(HeartbeatTest, StaysSilentWithinTheHeadroomRule) {
  HeadroomRun run = RunRounds(250ms, 12);
  EXPECT_TRUE(run.warnings.empty()) << run.warnings.front();
  EXPECT_EQ(run.counted, 0u);
  ASSERT_TRUE(run.gauges.min_ttl_headroom.has_value());
  EXPECT_DOUBLE_EQ(*run.gauges.min_ttl_headroom, 12.0);
}

// A store with a wall clock of its own, read in every renewal round as Redis and PostgreSQL
// table mode read theirs: the fake clock's time plus `offset`, which a test steps.
class StoreWithAClock final : public ForwardingBackend {
 public:
  StoreWithAClock(std::shared_ptr<Backend> inner, testing::FakeClock& clock)
      : ForwardingBackend(std::move(inner)), clock_(clock) {
    UseOwnStoreClock();  // its own watch, not the memory store's
  }

  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override {
    const SteadyTime t_send = clock_.Now();
    std::vector<Status> out = refuse_.load()
                                  ? std::vector<Status>(requests.size(), Status::Lost("gone"))
                                  : ForwardingBackend::RenewMany(requests);
    const auto store = clock_.Now().time_since_epoch() + offset_.load();
    ObserveStoreTime({t_send, clock_.Now(),
                      std::chrono::duration_cast<std::chrono::microseconds>(store).count()});
    return out;
  }

  std::atomic<Duration> offset_{Duration::zero()};
  std::atomic<bool> refuse_{false};

 private:
  testing::FakeClock& clock_;
};

struct ClockStepRun {
  testing::FakeClock clock;
  std::shared_ptr<StoreWithAClock> backend;
  LeaseMetrics metrics{"memory", false};
  std::unique_ptr<Heartbeat> heartbeat;
  std::shared_ptr<LeaseCore> often;   // renewed every 1 s (TTL 3 s)
  std::shared_ptr<LeaseCore> seldom;  // renewed every 10 s (TTL 30 s): not in the 1 s rounds
  std::mutex mu;
  std::vector<LeaseState> seldom_states;  // seldom's state changes, in order

  ClockStepRun() {
    auto memory = OpenMemoryBackend(Url{.scheme = "memory"}, clock);
    EXPECT_TRUE(memory.ok());
    backend = std::make_shared<StoreWithAClock>(*memory, clock);
    backend->set_metrics(&metrics);
    heartbeat = std::make_unique<Heartbeat>(backend, clock);
    often = Make("often", 3s, 1s);
    seldom = Make("seldom", 30s, 10s, [this](LeaseState state, const Status&) {
      std::lock_guard lock(mu);
      seldom_states.push_back(state);
    });
    heartbeat->Add(often);
    heartbeat->Add(seldom);
  }

  ~ClockStepRun() { heartbeat.reset(); }

  std::shared_ptr<LeaseCore> Make(
      const std::string& key, Duration ttl, Duration every,
      std::function<void(LeaseState, const Status&)> on_state_change = nullptr) {
    EXPECT_TRUE(backend->TryAcquire({key, std::string(32, 'a'), "h", ttl}).ok());
    return std::make_shared<LeaseCore>(clock,
                                       LeaseParams{.key = key,
                                                   .owner_token = std::string(32, 'a'),
                                                   .ttl = ttl,
                                                   .renew_interval = every,
                                                   .drift = ttl / 100 + 2ms,
                                                   .t_send = clock.Now(),
                                                   .on_state_change = std::move(on_state_change)});
  }

  // Lets the round due at `often`'s next renewal run.
  void Round() {
    const std::uint64_t before = heartbeat->rounds();
    EXPECT_TRUE(clock.WaitForSleepers(2));
    clock.Set(often->NextRenewDue());
    for (int w = 0; w < 400 && heartbeat->rounds() == before; ++w) {
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_GT(heartbeat->rounds(), before);
  }
};

// A forward step of the store's clock by 2 x the long TTL: the lease the round did not renew
// may have ended on the store already, and is lost at once, saying why; the one it renewed
// stands. The step is logged and counted once.
TEST(HeartbeatStoreClockTest, AForwardStepEndsTheLeasesTheRoundDidNotConfirm) {
  std::vector<std::string> lines;
  std::mutex mu;
  SetLogSink([&](LogLevel, std::string_view line) {
    std::lock_guard lock(mu);
    lines.emplace_back(line);
  });
  {
    ClockStepRun run;
    run.Round();
    run.Round();
    EXPECT_EQ(run.metrics.store_clock_jumps.value(), 0u) << "a steady store clock";
    run.backend->offset_ = 60s;
    run.Round();
    EXPECT_EQ(run.metrics.store_clock_jumps.value(), 1u);
    EXPECT_EQ(run.often->state(), LeaseState::kHeld) << "renewed in the round that saw the step";
    EXPECT_EQ(run.seldom->state(), LeaseState::kLost);
    const std::string reason(run.seldom->lost_reason().message());
    EXPECT_NE(reason.find("may have ended early: the store's clock jumped forward by"),
              std::string::npos)
        << reason;
    run.Round();
    EXPECT_EQ(run.metrics.store_clock_jumps.value(), 1u) << "one step, counted once";
  }
  SetLogSink(nullptr);
  std::lock_guard lock(mu);
  int jumps = 0;
  for (const std::string& line : lines) {
    if (line.find("store_clock_jump") != std::string::npos &&
        line.find("direction=forward") != std::string::npos) {
      ++jumps;
    }
  }
  EXPECT_EQ(jumps, 1);
}

// A step smaller than what is left of a lease: at risk, renewed at once (no time passes on the
// fake clock), held again.
TEST(HeartbeatStoreClockTest, ASmallerStepPutsTheLeaseAtRiskAndRenewsItAtOnce) {
  ClockStepRun run;
  run.Round();
  const SteadyTime before_step = run.seldom->safe_until();
  run.backend->offset_ = 5s;
  run.Round();
  EXPECT_TRUE(run.clock.WaitForSleepers(2));
  {
    std::lock_guard lock(run.mu);
    EXPECT_EQ(run.seldom_states, (std::vector<LeaseState>{LeaseState::kAtRisk, LeaseState::kHeld}));
  }
  EXPECT_EQ(run.seldom->state(), LeaseState::kHeld);
  EXPECT_GT(run.seldom->safe_until(), before_step) << "renewed after the step";
  EXPECT_EQ(run.metrics.store_clock_jumps.value(), 1u) << "the renewal at once saw no new step";
}

// A refused renewal in the round that saw a forward step names the step; a backward step ends
// nothing early: counted, nothing else.
TEST(HeartbeatStoreClockTest, ARefusedRenewalNamesTheStepAndABackwardStepEndsNothing) {
  {
    ClockStepRun run;
    run.Round();
    run.backend->offset_ = -60s;
    run.Round();
    EXPECT_EQ(run.metrics.store_clock_jumps.value(), 1u);
    EXPECT_EQ(run.often->state(), LeaseState::kHeld);
    EXPECT_EQ(run.seldom->state(), LeaseState::kHeld);
  }
  ClockStepRun run;
  run.Round();
  run.backend->offset_ = 60s;
  run.backend->refuse_ = true;
  run.Round();
  EXPECT_EQ(run.often->state(), LeaseState::kLost);
  const std::string reason(run.often->lost_reason().message());
  EXPECT_NE(reason.find("gone: the store's clock jumped forward"), std::string::npos) << reason;
}

}  // namespace
}  // namespace leasehold::internal
