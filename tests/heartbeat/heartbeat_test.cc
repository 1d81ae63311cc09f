// The heartbeat's own duties: lazy threads, forgetting released and lost leases, waking its
// threads only when a new lease needs it.

#include "heartbeat/heartbeat.h"

#include <thread>

#include <gtest/gtest.h>

#include "backends/memory/memory_backend.h"
#include "core/url.h"
#include "leasehold/store.h"
#include "leasehold/testing/fake_clock.h"

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
    return std::make_shared<LeaseCore>(
        clock, LeaseParams{.key = key,
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
    return std::make_shared<LeaseCore>(
        clock, LeaseParams{.key = key,
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

}  // namespace
}  // namespace leasehold::internal
