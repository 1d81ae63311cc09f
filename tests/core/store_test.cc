// Input validation and URL dispatch of Store, on memory://.

#include "leasehold/store.h"

#include <algorithm>
#include <atomic>

#include <gtest/gtest.h>

#include "leasehold/testing/fake_clock.h"

#include "backends/forwarding_backend.h"
#include "backends/memory/memory_backend.h"
#include "backends/registry.h"
#include "core/store_access.h"
#include "core/url.h"

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

TEST_F(StoreTest, RejectsBadLimitsAndModes) {
  EXPECT_EQ(TryCode("k", {.limit = 0}), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryCode("k", {.limit = kMaxLeaseLimit + 1}), StatusCode::kInvalidArgument);
  auto shared_with_limit = store_->TryAcquire("k", {.limit = 3, .mode = LeaseMode::kShared});
  EXPECT_EQ(shared_with_limit.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shared_with_limit.status().message().find("shared"), std::string_view::npos);
  EXPECT_EQ(TryCode("k", {.limit = kMaxLeaseLimit}), StatusCode::kOk);
  EXPECT_EQ(store_->ForceReleaseGrant("k", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->ForceReleaseGrant("k", "ABC").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->ForceReleaseGrant("k", std::string(33, 'a')).status().code(),
            StatusCode::kInvalidArgument);
}

// A backend without shared leases (Capabilities::shared_leases false) is never asked for one.
TEST(StoreSharedTest, AStoreWithoutSharedLeasesRefusesThemBeforeAsking) {
  class Exclusive final : public internal::ForwardingBackend {
   public:
    using ForwardingBackend::ForwardingBackend;

    internal::Capabilities capabilities() const override {
      internal::Capabilities c = ForwardingBackend::capabilities();
      c.shared_leases = false;
      return c;
    }

    Result<internal::Grant> TryAcquire(const internal::GrantRequest& request) override {
      EXPECT_EQ(request.limit, 1U);
      EXPECT_EQ(request.mode, LeaseMode::kExclusive);
      return ForwardingBackend::TryAcquire(request);
    }
  };

  auto url = internal::ParseUrl("memory://");
  ASSERT_TRUE(url.ok());
  auto inner = internal::OpenMemoryBackend(*url, Clock::Real());
  ASSERT_TRUE(inner.ok());
  auto store = internal::OpenStoreWithBackend(std::make_shared<Exclusive>(*inner));
  auto sem = store->TryAcquire("k", {.limit = 2});
  EXPECT_EQ(sem.status().code(), StatusCode::kUnimplemented) << sem.status().ToString();
  EXPECT_NE(sem.status().message().find("semaphore"), std::string_view::npos);
  EXPECT_EQ(store->TryAcquire("k", {.mode = LeaseMode::kShared}).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_TRUE(store->TryAcquire("k").ok());
}

// Store::DataKey through a decorator names the data as the store under it does (a Redis
// Cluster's hash tag, here a stand-in prefix): ForwardingBackend hands out the facets of the
// backend it wraps (tests/backends/common/forwarding_backend_check.py checks that it forwards
// every method of the core).
TEST(StoreDataKeyTest, ADecoratedStoreKeepsTheStoresDataKeyPrefix) {
  class Prefixed final : public internal::ForwardingBackend, public internal::FencedWriteFacet {
   public:
    explicit Prefixed(const std::shared_ptr<internal::Backend>& inner)
        : ForwardingBackend(inner), inner_writes_(inner->facets().fenced_write) {}

    internal::Facets facets() override {
      internal::Facets f = ForwardingBackend::facets();
      f.fenced_write = this;
      return f;
    }

    unsigned fenced_ops() const override { return inner_writes_->fenced_ops(); }

    Result<std::vector<std::int64_t>> FencedWrite(
        const internal::FencedWriteRequest& request) override {
      return inner_writes_->FencedWrite(request);
    }

    std::string DataKeyPrefix(std::string_view key) const override {
      return "{" + std::string(key) + "}:";
    }

   private:
    internal::FencedWriteFacet* const inner_writes_;
  };

  auto url = internal::ParseUrl("memory://");
  ASSERT_TRUE(url.ok());
  auto inner = internal::OpenMemoryBackend(*url, Clock::Real());
  ASSERT_TRUE(inner.ok());
  auto decorated =
      std::make_shared<internal::ForwardingBackend>(std::make_shared<Prefixed>(*inner));
  auto store = internal::OpenStoreWithBackend(decorated);
  EXPECT_EQ(store->DataKey("job", "rows"), "{job}:rows");
  auto lease = store->TryAcquire("job");
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->DataKey("rows"), "{job}:rows");
}

// Lease::Confirm on a fake clock, against a store whose renewals are scripted: no answer leaves
// the lease at risk (neither confirmed nor lost); an answer in time moves safe_until to
// t_send + ttl - drift, t_send read before the request went out; an answer that comes after
// safe_until is a loss, never a renewal.
TEST(StoreConfirmTest, ConfirmsOnlyWhatTheStoreAnsweredInTime) {
  testing::FakeClock clock;

  class Scripted final : public internal::ForwardingBackend {
   public:
    Scripted(std::shared_ptr<internal::Backend> inner, testing::FakeClock& clock)
        : ForwardingBackend(std::move(inner)), clock_(clock) {}

    std::vector<Status> RenewMany(std::span<const internal::RenewRequest> requests) override {
      clock_.Advance(delay.exchange(Duration::zero()));
      return answer_ok ? ForwardingBackend::RenewMany(requests)
                       : std::vector<Status>(requests.size(), Status::Unavailable("no answer"));
    }

    std::atomic<Duration> delay{Duration::zero()};
    std::atomic<bool> answer_ok{true};

   private:
    testing::FakeClock& clock_;
  };

  auto url = internal::ParseUrl("memory://");
  ASSERT_TRUE(url.ok());
  auto inner = internal::OpenMemoryBackend(*url, clock);
  ASSERT_TRUE(inner.ok());
  auto scripted = std::make_shared<Scripted>(*inner, clock);
  auto store = internal::OpenStoreWithBackend(scripted, {.clock = &clock});
  // The heartbeat's first renewal is due after everything below.
  auto held = store->TryAcquire("k", {.ttl = 30s, .renew_interval = 25s});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  const Duration drift = LeaseOptions::DefaultDrift(30s);

  scripted->answer_ok = false;
  EXPECT_EQ(held->Confirm().code(), StatusCode::kUnavailable);
  EXPECT_EQ(held->state(), LeaseState::kAtRisk);
  EXPECT_TRUE(held->valid()) << "a renewal that failed leaves the old safe_until";

  scripted->answer_ok = true;
  clock.Advance(2s);
  const SteadyTime t_send = clock.Now();
  scripted->delay = 1s;
  EXPECT_TRUE(held->Confirm().ok());
  EXPECT_EQ(held->safe_until(), t_send + 30s - drift) << "from t_send, not from the reply";
  EXPECT_EQ(held->state(), LeaseState::kHeld);

  scripted->delay = 40s;  // the reply comes after safe_until
  Status late = held->Confirm();
  EXPECT_EQ(late.code(), StatusCode::kLost) << late.ToString();
  EXPECT_FALSE(held->valid());
}

// The writer intent on the reference store, on a fake clock: it keeps readers out while it
// lives, goes with AbandonWait, and otherwise expires one ttl after the writer's last attempt.
TEST(StoreSharedTest, AWriterIntentKeepsReadersOutUntilItExpiresOrIsAbandoned) {
  testing::FakeClock clock;
  auto url = internal::ParseUrl("memory://");
  ASSERT_TRUE(url.ok());
  auto opened = internal::OpenMemoryBackend(*url, clock);
  ASSERT_TRUE(opened.ok());
  internal::Backend& backend = **opened;
  auto grant = [&](const std::string& token, LeaseMode mode, std::string waiter = {}) {
    return backend.TryAcquire({.key = "rw",
                               .owner_token = token,
                               .holder = token,
                               .ttl = mode == LeaseMode::kShared ? 60s : 2s,
                               .waiter_id = std::move(waiter),
                               .mode = mode});
  };
  ASSERT_TRUE(grant("reader1", LeaseMode::kShared).ok());
  // A plain TryAcquire of the writer records nothing: readers still come in.
  EXPECT_EQ(grant("writer", LeaseMode::kExclusive).status().code(), StatusCode::kHeldByAnother);
  ASSERT_TRUE(grant("reader2", LeaseMode::kShared).ok());
  // A waiting writer's attempt does.
  EXPECT_EQ(grant("writer", LeaseMode::kExclusive, "w1").status().code(),
            StatusCode::kHeldByAnother);
  auto held_off = grant("reader3", LeaseMode::kShared);
  ASSERT_EQ(held_off.status().code(), StatusCode::kHeldByAnother);
  ASSERT_NE(held_off.status().holder(), nullptr);
  EXPECT_EQ(held_off.status().holder()->holder, "writer");
  // A second waiting writer does not replace the first's intent.
  EXPECT_EQ(grant("writer2", LeaseMode::kExclusive, "w2").status().code(),
            StatusCode::kHeldByAnother);
  // Refreshed by w1's attempts; gone one ttl (2 s) after the last.
  clock.Advance(1500ms);
  EXPECT_EQ(grant("writer", LeaseMode::kExclusive, "w1").status().code(),
            StatusCode::kHeldByAnother);
  clock.Advance(1500ms);
  EXPECT_EQ(grant("reader3", LeaseMode::kShared).status().code(), StatusCode::kHeldByAnother)
      << "the refreshed intent still lives";
  clock.Advance(600ms);
  EXPECT_TRUE(grant("reader3", LeaseMode::kShared).ok()) << "the intent expired";
  // AbandonWait ends an intent at once.
  EXPECT_EQ(grant("writer", LeaseMode::kExclusive, "w3").status().code(),
            StatusCode::kHeldByAnother);
  EXPECT_EQ(grant("reader4", LeaseMode::kShared).status().code(), StatusCode::kHeldByAnother);
  backend.AbandonWait("rw", "w3");
  EXPECT_TRUE(grant("reader4", LeaseMode::kShared).ok());
}

// A semaphore's slot is given again only once the grant in it has ended: here by expiry.
TEST(StoreSharedTest, ASemaphoreSlotComesBackAtItsGrantsExpiryAndNotBefore) {
  testing::FakeClock clock;
  auto url = internal::ParseUrl("memory://");
  ASSERT_TRUE(url.ok());
  auto opened = internal::OpenMemoryBackend(*url, clock);
  ASSERT_TRUE(opened.ok());
  internal::Backend& backend = **opened;
  auto grant = [&](const std::string& token) {
    return backend.TryAcquire(
        {.key = "pool", .owner_token = token, .holder = token, .ttl = 5s, .limit = 2});
  };
  auto a = grant("a");
  clock.Advance(1s);
  auto b = grant("b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->slot, 0U);
  EXPECT_EQ(b->slot, 1U);
  clock.Advance(3999ms);
  EXPECT_EQ(grant("c").status().code(), StatusCode::kHeldByAnother);
  clock.Advance(1ms);
  auto c = grant("c");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->slot, 0U) << "a's slot, free once a's grant expired";
  EXPECT_GT(c->fencing_token, b->fencing_token);
  EXPECT_EQ(backend.Renew({"pool", "a", 5s}).code(), StatusCode::kLost);
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
