// The heartbeat's own duties: lazy threads, forgetting released and lost leases.

#include "heartbeat/heartbeat.h"

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

}  // namespace
}  // namespace leasehold::internal
