// Input validation and URL dispatch of Store, on memory://.

#include "leasehold/store.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "leasehold/testing/fake_clock.h"

#include "backends/registry.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Store::Open("memory://", {.clock = &clock_});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
  }

  StatusCode TryCode(std::string_view key, const LeaseOptions& options = {}) {
    return store_->TryAcquire(key, options).status().code();
  }

  testing::FakeClock clock_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, RejectsBadKeys) {
  EXPECT_EQ(TryCode(""), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode(std::string(513, 'x')), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode(std::string("a\0b", 3)), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode("\xff\xfe"), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode("\xc0\xaf"), StatusCode::kInvalidArgument) << "overlong encoding";
  EXPECT_EQ(TryCode(std::string(512, 'x')), StatusCode::kOk);
  EXPECT_EQ(TryCode("job:Ünïcödé-✓"), StatusCode::kOk);
}

TEST_F(StoreTest, RejectsBadTimes) {
  EXPECT_EQ(TryCode("k", {.ttl = 0s}), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode("k", {.ttl = -1s}), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode("k", {.ttl = 1ms}), StatusCode::kInvalidArgument) << "shorter than drift";
  EXPECT_EQ(TryCode("k", {.ttl = 2s, .renew_interval = 5s}), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode("k", {.ttl = 2s, .renew_interval = 2s}), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode("k", {.ttl = 2s, .renew_interval = 0s}), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode("k", {.ttl = 2s, .drift = -1ms}), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode("k", {.ttl = 2s, .drift = 2s}), StatusCode::kInvalidArgument);
  auto status = store_->TryAcquire("k", {.ttl = 2s, .renew_interval = 5s}).status();
  EXPECT_NE(status.message().find("renew interval"), std::string_view::npos) << status.message();
}

TEST_F(StoreTest, RejectedInputLeavesAHeldLeaseAlone) {
  auto held = store_->TryAcquire("k", {.ttl = 3s});
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(TryCode("k", {.ttl = 0s}), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->ForceRelease("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(held->valid());
  auto info = store_->Inspect("k");
  ASSERT_TRUE(info.ok() && info->has_value());
}

TEST_F(StoreTest, HeldByAnotherCarriesTheHolder) {
  auto held = store_->TryAcquire("k", {.ttl = 3s, .holder = "web-1"});
  ASSERT_TRUE(held.ok());
  auto second = store_->TryAcquire("k", {.ttl = 3s, .holder = "web-2"});
  ASSERT_EQ(second.status().code(), StatusCode::kHeldByAnother);
  const LeaseInfo* holder = second.status().holder();
  ASSERT_NE(holder, nullptr);
  EXPECT_EQ(holder->holder, "web-1");
  EXPECT_EQ(holder->fencing_token, held->fencing_token());
  EXPECT_EQ(holder->token_prefix, held->token_prefix());
  EXPECT_EQ(held->token_prefix().size(), 8u);
}

TEST(StoreOpenTest, UnknownAndMissingSchemesAreClear) {
  auto unknown = Store::Open("nosuch://x");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("nosuch"), std::string_view::npos);
  // A store the registry knows that this build lacks (none, when every store is built in).
  std::vector<std::string> built = internal::CompiledSchemes();
  for (std::string scheme : {"etcd", "zk"}) {
    if (std::find(built.begin(), built.end(), scheme) != built.end()) {
      continue;
    }
    auto not_built = Store::Open(scheme + "://127.0.0.1:1");
    EXPECT_EQ(not_built.status().code(), StatusCode::kUnimplemented) << scheme;
    EXPECT_NE(not_built.status().message().find("compiled without"), std::string_view::npos);
  }
  EXPECT_EQ(Store::Open("no-scheme-here").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Store::Open("").status().code(), StatusCode::kInvalidArgument);
}

TEST(StoreOpenTest, PasswordsNeverAppearInErrors) {
  auto r = Store::Open("redis://user:hunter2@127.0.0.1:1/0");
  EXPECT_EQ(r.status().ToString().find("hunter2"), std::string::npos);
}

TEST(StoreOpenTest, NamedMemoryStoresAreSharedWithinTheProcess) {
  auto a = Store::Open("memory://shared-test");
  auto b = Store::Open("memory://shared-test");
  ASSERT_TRUE(a.ok() && b.ok());
  auto lease = (*a)->TryAcquire("k");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ((*b)->TryAcquire("k").status().code(), StatusCode::kHeldByAnother);
}

TEST(LeaseTest, EmptyLeaseIsInvalidAndReleasesHarmlessly) {
  Lease lease;
  EXPECT_FALSE(lease.valid());
  EXPECT_TRUE(lease.lost_token().stop_requested());
  EXPECT_TRUE(lease.Release().ok());
  EXPECT_EQ(lease.key(), "");
}

TEST(LeaseTest, MoveAssignmentReleasesTheOldGrant) {
  auto store = Store::Open("memory://");
  ASSERT_TRUE(store.ok());
  auto a = (*store)->TryAcquire("a");
  auto b = (*store)->TryAcquire("b");
  ASSERT_TRUE(a.ok() && b.ok());
  Lease lease = std::move(a).value();
  lease = std::move(b).value();
  EXPECT_EQ(lease.key(), "b");
  EXPECT_FALSE((*store)->Inspect("a")->has_value());
  EXPECT_TRUE((*store)->Inspect("b")->has_value());
}

}  // namespace
}  // namespace leasehold
