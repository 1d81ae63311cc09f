// The conformance suite: one list of behaviours that every backend passes unchanged, against a
// real store (Arrow's GenericFileSystemTest, done as a gtest TEST_P). A store joins by adding
// its fixture row to tests/testing/store_fixtures.cc; a behaviour added for one store is added
// here, for all.
//
// Capability predicates (scope, fair_queue, the facets...) come from the backend itself; a test
// that needs a capability the store does not have is skipped with the reason printed.

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "leasehold/election.h"
#include "leasehold/fenced_write.h"
#include "leasehold/store.h"
#include "leasehold/testing/fake_clock.h"

#include "backends/common/admission.h"
#include "backends/registry.h"
#include "core/url.h"
#include "testing/spawned_process.h"
#include "testing/store_fixtures.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LH_TEST_CLANG_ASAN 1
#endif
#endif

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using internal::Backend;
using internal::GrantRequest;
using internal::RenewRequest;

// One fixture per store and mode (tests/testing/store_fixtures.h): every store compiled in.
using BackendFactory = testing::StoreFixture;

using Child = testing::SpawnedProcess;

class ConformanceTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/leasehold-conformance-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    scratch_ = tmpl;
    url_ = GetParam().new_store_url(scratch_);
    auto parsed = internal::ParseUrl(url_);
    ASSERT_TRUE(parsed.ok());
    auto backend = internal::OpenBackend(*parsed, Clock::Real());
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    backend_ = *backend;
  }

  void TearDown() override {
    backend_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(scratch_, ignored);
  }

  std::unique_ptr<Store> OpenHandle() {
    auto store = Store::Open(url_);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  Result<internal::Grant> Grant(const std::string& key, const std::string& token,
                                Duration ttl = 10s) {
    return backend_->TryAcquire(GrantRequest{key, token, "conformance", ttl});
  }

  static std::string Token(char c) { return std::string(32, c); }

  // Waits until a grant nobody renews has expired: its granted TTL (a store may grant more than
  // was asked: etcd rounds up to whole seconds, at least 2 s) plus `margin`, then until the
  // store no longer shows it (a store may remove expired grants a moment late: etcd checks
  // lease expiry every 500 ms), for at most 3 s more.
  void AwaitExpiry(const std::string& key, const internal::Grant& grant, Duration margin) {
    std::this_thread::sleep_for(grant.ttl + margin);
    for (int i = 0; i < 300; ++i) {
      auto info = backend_->Inspect(key);
      if (!info.ok() || !info->has_value() || (*info)->fencing_token != grant.fencing_token) {
        return;
      }
      std::this_thread::sleep_for(10ms);
    }
  }

  std::string scratch_;
  std::string url_;
  std::shared_ptr<Backend> backend_;
};

TEST_P(ConformanceTest, MutualExclusionBetweenTwoHandles) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto held = a->TryAcquire("job", {.ttl = 5s, .holder = "handle-a"});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  auto refused = b->TryAcquire("job", {.ttl = 5s, .holder = "handle-b"});
  ASSERT_EQ(refused.status().code(), StatusCode::kHeldByAnother) << refused.status().ToString();
  ASSERT_NE(refused.status().holder(), nullptr);
  EXPECT_EQ(refused.status().holder()->holder, "handle-a");
  EXPECT_EQ(refused.status().holder()->fencing_token, held->fencing_token());
  EXPECT_TRUE(b->TryAcquire("other-job", {.ttl = 5s}).ok()) << "keys are independent";
}

// The store doctor on a healthy store: every store has a round-trip probe (the bench's floor),
// names it, and runs the whole cycle on a throwaway key it leaves free; nothing is refused or
// unreachable, and the TTL advice is at least 10x the measured p99 and at least 1 s, in the
// store's own steps. (A store's own findings, the unsafe and refused cases, are in
// tests/cli/check_test.py.)
TEST_P(ConformanceTest, CheckTimesTheStoreAndRunsAWholeCycleOnAThrowawayKey) {
  auto store = OpenHandle();
  ASSERT_NE(store, nullptr);
  auto report = store->Check({.ttl = 30s, .probes = 20, .renewals = 5});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  std::string items;
  for (const auto& item : report->items) {
    items += fmt::format("\n  {} {}: {} | {}", item.area, CheckVerdictName(item.verdict),
                         item.found, item.fix);
    EXPECT_LT(item.verdict, CheckVerdict::kPermissionDenied) << items;
    EXPECT_EQ(item.found.find('\n'), std::string::npos) << items;
    if (item.verdict != CheckVerdict::kPass) {
      EXPECT_FALSE(item.fix.empty()) << items;
    }
  }
  EXPECT_EQ(report->backend, backend_->scheme());
  EXPECT_NE(report->probe, "round trip") << "no probe of its own" << items;
  EXPECT_EQ(report->round_trip.count, 20) << items;
  EXPECT_LE(report->round_trip.p50, report->round_trip.p99);
  EXPECT_LE(report->round_trip.p99, report->round_trip.max);
  ASSERT_TRUE(report->cycle_done) << items;
  EXPECT_EQ(report->renew.count, 5);
  EXPECT_GT(report->fencing_token, 0u);
  EXPECT_EQ(report->ttl_requested, 30s);
  EXPECT_GE(report->ttl_granted, std::min<Duration>(30s, 1s)) << items;
  EXPECT_TRUE(report->ttl_judged);
  EXPECT_GE(report->recommended_ttl, 1s);
  EXPECT_GE(report->recommended_ttl, 10 * std::max(report->round_trip.p99, report->renew.p99));
  if (report->ttl_granularity > Duration::zero()) {
    EXPECT_EQ(report->recommended_ttl.count() % report->ttl_granularity.count(), 0) << items;
  }
  auto left = store->Inspect(report->cycle_key);
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_FALSE(left->has_value()) << "the throwaway key was left held";
}

// The core's clock and the store's agree on the time base: a FakeClock drives a store that keeps
// no time of its own (its grants expire on that clock), and every other store refuses it with a
// clear error instead of comparing fake deadlines with real ones.
TEST_P(ConformanceTest, AFakeClockDrivesOnlyAStoreWithoutTimeOfItsOwn) {
  testing::FakeClock clock;
  // A store of its own: the fixture's backend_ is on the real clock.
  auto store = Store::Open(GetParam().new_store_url(scratch_), {.clock = &clock});
  if (!internal::AcceptsAnyClock(backend_->scheme())) {
    ASSERT_EQ(store.status().code(), StatusCode::kInvalidArgument) << store.status().ToString();
    EXPECT_NE(store.status().message().find("runs on the real clock"), std::string_view::npos)
        << store.status().message();
    auto real = Store::Open(url_, {.clock = &Clock::Real()});
    EXPECT_TRUE(real.ok()) << "Clock::Real() named explicitly is the default: "
                           << real.status().ToString();
    return;
  }
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto held = (*store)->TryAcquire("job", {.ttl = 10s});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ((*store)->TryAcquire("job", {.ttl = 10s}).status().code(), StatusCode::kHeldByAnother);
  clock.Advance(11s);  // no renewal can land in time: the heartbeat sleeps on the same clock
  EXPECT_FALSE(held->valid());
  auto next = (*store)->TryAcquire("job", {.ttl = 10s});
  ASSERT_TRUE(next.ok()) << "the grant expired on the FakeClock: " << next.status().ToString();
  EXPECT_GT(next->fencing_token(), held->fencing_token());
}

TEST_P(ConformanceTest, MutualExclusionBetweenTwoProcesses) {
  if (backend_->capabilities().scope == StoreScope::kProcess) {
    GTEST_SKIP() << GetParam().name << " is confined to one process";
  }
  Child holder({LEASE_HOLDER_PATH, url_, "job", "hold", "5000", "60000"});
  std::string line = holder.ReadLine();
  ASSERT_TRUE(line.starts_with("acquired ")) << line;
  auto handle = OpenHandle();
  auto refused = handle->TryAcquire("job", {.ttl = 5s});
  EXPECT_EQ(refused.status().code(), StatusCode::kHeldByAnother);
  Child tryer({LEASE_HOLDER_PATH, url_, "job", "try", "5000"});
  EXPECT_EQ(tryer.Wait(), 3) << tryer.ReadLine();
}

// fork() without exec: the child's copies of the parent's Store and Lease (statics destroyed by
// exit(0), left alone by _exit(0), or used: valid(), Write, Release, TryAcquire) neither end,
// renew nor write through the parent's grant or sessions; after three renew intervals the
// parent's lease is valid, its fenced write goes through, a second handle reads its grant
// unchanged, and its release succeeds (lease_holder's fork mode).
TEST_P(ConformanceTest, AForkedChildNeverEndsRenewsOrWritesItsParentsGrant) {
  if (backend_->capabilities().scope == StoreScope::kProcess) {
    GTEST_SKIP() << GetParam().name << " is confined to one process";
  }
#if defined(__SANITIZE_ADDRESS__) || defined(LH_TEST_CLANG_ASAN)
  // GCC 12's AddressSanitizer takes no lock of its allocator around fork(): a child forked
  // while a parent thread (the heartbeat, a TLS read) was inside malloc waits on that lock
  // forever once it frees or allocates (gdb on a stuck child of this case over rediss://:
  // exit -> OPENSSL_cleanup -> free -> SizeClassAllocator64::GetFromAllocator, in 2 of 30
  // runs). Clang 14's is the same allocator (GCC's libasan is taken from LLVM's compiler-rt).
  // glibc's malloc does take its locks around fork(); the case runs in the plain and
  // ThreadSanitizer builds.
  GTEST_SKIP() << "fork() of a threaded process can deadlock inside the ASan allocator";
#endif
  Child holder({LEASE_HOLDER_PATH, url_, "forked", "fork", "1500"});
  const std::string acquired = holder.ReadLine();
  ASSERT_TRUE(acquired.starts_with("acquired ")) << acquired;
  EXPECT_EQ(holder.ReadLine(), "children 0 0 0")
      << "exit(0), _exit(0), and a child whose checks failed (bits: 1 valid, 2 Write, 4 Release, "
         "8 TryAcquire)";
  EXPECT_EQ(holder.ReadLine(), "parent 1 1 " + acquired.substr(9));
  EXPECT_EQ(holder.Wait(), 0) << "the parent's release";
}

TEST_P(ConformanceTest, WrongTokenRenewAndReleaseAreRefused) {
  auto grant = Grant("job", Token('a'));
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(backend_->Renew({"job", Token('b'), 10s}).code(), StatusCode::kLost);
  EXPECT_EQ(backend_->Release("job", Token('b')).code(), StatusCode::kLost);
  auto info = backend_->Inspect("job");
  ASSERT_TRUE(info.ok() && info->has_value()) << "a refused release deletes nothing";
  EXPECT_EQ((*info)->fencing_token, grant->fencing_token);
  EXPECT_TRUE(backend_->Renew({"job", Token('a'), 10s}).ok());
  EXPECT_TRUE(backend_->Release("job", Token('a')).ok());
  EXPECT_EQ(backend_->Release("job", Token('a')).code(), StatusCode::kLost);
  EXPECT_EQ(backend_->Renew({"job", Token('a'), 10s}).code(), StatusCode::kLost);
}

TEST_P(ConformanceTest, RenewManyAnswersEachRequestInOrder) {
  ASSERT_TRUE(Grant("a", Token('a')).ok());
  ASSERT_TRUE(Grant("b", Token('b')).ok());
  std::vector<RenewRequest> requests = {{"a", Token('a'), 10s},
                                        {"b", Token('x'), 10s},
                                        {"missing", Token('m'), 10s},
                                        {"b", Token('b'), 10s}};
  std::vector<Status> results = backend_->RenewMany(requests);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_TRUE(results[0].ok());
  EXPECT_EQ(results[1].code(), StatusCode::kLost);
  EXPECT_EQ(results[2].code(), StatusCode::kLost);
  EXPECT_TRUE(results[3].ok());
}

TEST_P(ConformanceTest, FencingTokensStrictlyIncreaseAcrossEveryKindOfEnd) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  FencingToken last = 0;
  auto take = [&](Store& store, Duration ttl) {
    auto lease = store.TryAcquire("fenced", {.ttl = ttl});
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    if (!lease.ok()) {
      return Lease();
    }
    EXPECT_GT(lease->fencing_token(), last);
    last = lease->fencing_token();
    return std::move(lease).value();
  };
  Lease first = take(*a, 5s);
  ASSERT_TRUE(first.Release().ok());  // after release
  Lease second = take(*b, 5s);
  ASSERT_TRUE(a->ForceRelease("fenced").ok());  // after force-release
  Lease third = take(*a, 5s);
  ASSERT_TRUE(third.Release().ok());
  // After expiry: a raw grant nobody renews.
  auto expiring = Grant("fenced", Token('e'), 150ms);
  ASSERT_TRUE(expiring.ok()) << expiring.status().ToString();
  AwaitExpiry("fenced", *expiring, 100ms);
  Lease fourth = take(*b, 5s);
  EXPECT_EQ(second.Release().code(), StatusCode::kLost);
  EXPECT_TRUE(fourth.valid()) << "the stale holder's release must not touch the new grant";
}

TEST_P(ConformanceTest, TakeoverAfterTtlWhenTheHolderStopsRenewing) {
  // The handle first: opening one (a Redis Cluster's, under TSan on a busy machine) can take
  // longer than the grant's TTL, which then expires before it is tried.
  auto handle = OpenHandle();
  const auto granted_at = std::chrono::steady_clock::now();
  auto grant = Grant("job", Token('a'), 300ms);
  ASSERT_TRUE(grant.ok());
  {
    const StatusCode early = handle->TryAcquire("job", {.ttl = 5s}).status().code();
    // Judged only while the grant's TTL cannot have run out (a grant taken by the try is
    // released at the end of this line).
    if (std::chrono::steady_clock::now() - granted_at < 300ms) {
      EXPECT_EQ(early, StatusCode::kHeldByAnother);
    }
  }
  auto start = std::chrono::steady_clock::now();
  auto taken = handle->Acquire("job", {.ttl = 5s, .wait = 5s});
  auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_GT(taken->fencing_token(), grant->fencing_token);
  EXPECT_EQ(backend_->Renew({"job", Token('a'), 300ms}).code(), StatusCode::kLost);
  std::printf("[ figure ] %s takeover after a 300ms ttl: waited %.0f ms\n", GetParam().name.c_str(),
              std::chrono::duration<double, std::milli>(waited).count());
}

TEST_P(ConformanceTest, TakeoverAfterTheHoldingProcessIsKilled) {
  if (backend_->capabilities().scope == StoreScope::kProcess) {
    GTEST_SKIP() << GetParam().name << " is confined to one process";
  }
  // A store that knows its holders' liveness frees the key when the process is gone: a TTL
  // far longer than the bound shows that the TTL did not.
  const bool liveness = backend_->capabilities().holder_liveness;
  Child holder({LEASE_HOLDER_PATH, url_, "job", "hold", liveness ? "30000" : "500", "60000"});
  std::string line = holder.ReadLine();
  ASSERT_TRUE(line.starts_with("acquired ")) << line;
  // "acquired N GRANTED_TTL_MS": the bound below is the TTL the store granted.
  unsigned long long fence = 0;
  double granted_ms = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "acquired %llu %lf", &fence, &granted_ms), 2) << line;
  kill(holder.pid(), SIGKILL);
  auto killed_at = std::chrono::steady_clock::now();
  auto handle = OpenHandle();
  auto taken = handle->Acquire("job", {.ttl = 5s, .wait = 5s});
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed_at)
          .count();
  std::printf(
      "[ figure ] %s takeover after kill -9 of a 500ms-ttl holder (granted %.0f ms): "
      "%.0f ms\n",
      GetParam().name.c_str(), granted_ms, ms);
  EXPECT_GE(granted_ms, 500);
  EXPECT_GT(taken->fencing_token(), fence);
  if (liveness) {
    EXPECT_LT(ms, 1000) << "at once: the holder's process is gone";
  } else {
    EXPECT_LT(ms, granted_ms + 1000) << "within the granted ttl + 1 s";
  }
}

TEST_P(ConformanceTest, ReleaseWakesAWaiterLongBeforeTheTtl) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto held = a->TryAcquire("job", {.ttl = 30s});
  ASSERT_TRUE(held.ok());
  std::atomic<bool> waiting{false};
  Result<Lease> waited = Status::Internal("not run");
  std::chrono::steady_clock::time_point got;
  std::jthread waiter([&] {
    waiting = true;
    waited = b->Acquire("job", {.ttl = 30s, .wait = 10s});
    got = std::chrono::steady_clock::now();
  });
  while (!waiting) {
    std::this_thread::yield();
  }
  std::this_thread::sleep_for(200ms);  // the waiter is now asleep in its wait
  auto released_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(held->Release().ok());
  waiter.join();
  // A waiter that only woke at the holder's TTL (30 s) would have hit its 10 s wait limit.
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  std::printf("[ figure ] %s handoff from release to the waiter's grant: %.1f ms\n",
              GetParam().name.c_str(),
              std::chrono::duration<double, std::milli>(got - released_at).count());
}

// A waiter granted the key after a release (on fair stores, inside the release itself) holds
// a fencing token above the releaser's, under its own grant: it is valid, others see it and are
// refused, and once it releases, the key is free.
TEST_P(ConformanceTest, AWaiterGrantedAfterAReleaseHoldsItsOwnGrantWithAHigherFencingToken) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto held = a->TryAcquire("handoff", {.ttl = 30s});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  std::atomic<bool> waiting{false};
  Result<Lease> waited = Status::Internal("not run");
  std::jthread waiter([&] {
    waiting = true;
    waited = b->Acquire("handoff", {.ttl = 30s, .wait = 10s});
  });
  while (!waiting) {
    std::this_thread::yield();
  }
  std::this_thread::sleep_for(200ms);  // the waiter is now asleep in its wait
  ASSERT_TRUE(held->Release().ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_GT(waited->fencing_token(), held->fencing_token());
  EXPECT_TRUE(waited->valid());
  auto info = a->Inspect("handoff");
  ASSERT_TRUE(info.ok() && info->has_value()) << "the waiter's grant is live";
  EXPECT_EQ((*info)->fencing_token, waited->fencing_token());
  EXPECT_EQ(a->TryAcquire("handoff", {.ttl = 30s}).status().code(), StatusCode::kHeldByAnother);
  ASSERT_TRUE(waited->Release().ok());
  auto after = a->TryAcquire("handoff", {.ttl = 30s});
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_GT(after->fencing_token(), waited->fencing_token());
  EXPECT_TRUE(after->Release().ok());
}

TEST_P(ConformanceTest, InspectAndListShowLiveGrantsOnly) {
  auto handle = OpenHandle();
  auto x = handle->TryAcquire("app/x", {.ttl = 5s, .holder = "hx"});
  auto y = handle->TryAcquire("app/y", {.ttl = 5s, .holder = "hy"});
  auto z = handle->TryAcquire("other/z", {.ttl = 5s});
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  auto expiring = Grant("app/expired", Token('e'), 50ms);
  ASSERT_TRUE(expiring.ok()) << expiring.status().ToString();
  ASSERT_TRUE(Grant("app_%", Token('w'), 5s).ok());  // wildcard characters are literal
  AwaitExpiry("app/expired", *expiring, 50ms);

  auto info = handle->Inspect("app/x");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->key, "app/x");
  EXPECT_EQ((*info)->holder, "hx");
  EXPECT_EQ((*info)->fencing_token, x->fencing_token());
  EXPECT_EQ((*info)->token_prefix, x->token_prefix());
  EXPECT_GT((*info)->remaining, 0ms);
  EXPECT_LE((*info)->remaining, 5s);
  EXPECT_EQ((*info)->ttl, 5s);
  auto free_key = handle->Inspect("app/expired");
  ASSERT_TRUE(free_key.ok());
  EXPECT_FALSE(free_key->has_value()) << "an expired grant is not shown as held";

  auto listed = handle->List("app/");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, "app/x");
  EXPECT_EQ((*listed)[1].key, "app/y");
  auto all = handle->List("");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 4u);
  auto literal = handle->List("app_");
  ASSERT_TRUE(literal.ok());
  ASSERT_EQ(literal->size(), 1u);
  EXPECT_EQ((*literal)[0].key, "app_%");
}

// `remaining` is the time the grant has left (what `leasehold status` prints), or marked an
// upper bound where the store does not tell it exactly (ZooKeeper: the TTL; etcd: whole seconds
// plus one); never the TTL passed off as time left. A raw grant nobody renews, 1.2 s into its 2 s.
TEST_P(ConformanceTest, HoldersShowTheTimeLeftOrMarkItAnUpperBound) {
  auto grant = Grant("job", Token('a'), 2s);
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  std::this_thread::sleep_for(1200ms);
  auto holders = backend_->Holders("job");
  ASSERT_TRUE(holders.ok() && holders->size() == 1) << holders.status().ToString();
  const LeaseInfo& h = holders->front();
  if (h.remaining_is_upper_bound) {
    EXPECT_LE(h.remaining, h.ttl);
  } else {
    EXPECT_LE(h.remaining, 1000ms) << "1.2 s of a 2 s grant have passed";
    EXPECT_GT(h.remaining, 0ms);
  }
}

TEST_P(ConformanceTest, ForceReleaseFreesTheKeyAndTheHolderFindsOut) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  std::atomic<int> lost{0};
  auto held = a->TryAcquire(
      "job", {.ttl = 3s, .renew_interval = 100ms, .on_lost = [&](const Status&) { ++lost; }});
  ASSERT_TRUE(held.ok());
  auto forced = b->ForceRelease("job");
  ASSERT_TRUE(forced.ok());
  EXPECT_TRUE(*forced);
  auto again = b->ForceRelease("job");
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again) << "the key was already free";
  // on_lost runs just after the token's stop is requested (options.h): both are awaited.
  auto start = std::chrono::steady_clock::now();
  while ((!held->lost_token().stop_requested() || lost == 0) &&
         std::chrono::steady_clock::now() - start < 2s) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(held->lost_token().stop_requested()) << "lost at the next renewal, before the ttl";
  std::this_thread::sleep_for(50ms);  // a second call, were there one, would come now
  EXPECT_EQ(lost, 1);
  EXPECT_EQ(held->lost_reason().code(), StatusCode::kLost);
  EXPECT_EQ(held->Release().code(), StatusCode::kLost);
}

// A holder waiting on its own key (`leasehold run`'s GrantWatch) is woken by a force-release of
// its grant where the store notifies holders: long before its next renewal (10 s here) or its
// TTL. Elsewhere such a wait says so (kUnimplemented) rather than wait for a grant's end it
// cannot see, or queue behind its own grant.
TEST_P(ConformanceTest, AForceReleaseWakesItsHolderWaitingOnTheKey) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto held = a->TryAcquire("job", {.ttl = 30s, .renew_interval = 10s});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  if (!a->notifies_holder()) {
    EXPECT_EQ(a->WaitForChange("job", a->clock().Now() + 200ms).code(), StatusCode::kUnimplemented);
    EXPECT_TRUE(held->Confirm().ok()) << "the wait took nothing of the holder's";
    ASSERT_TRUE(held->Release().ok());
    return;
  }
  std::atomic<bool> forced{false};
  Status woke;
  std::chrono::steady_clock::time_point woken_at;
  std::thread holder([&] {
    // Spurious wake-ups are allowed: wait again until the force-release has been sent.
    do {
      woke = a->WaitForChange("job", a->clock().Now() + 20s);
    } while (woke.ok() && !forced);
    woken_at = std::chrono::steady_clock::now();
  });
  std::this_thread::sleep_for(300ms);  // the wait is set up (either order is correct)
  const auto forced_at = std::chrono::steady_clock::now();
  forced = true;
  auto released = b->ForceRelease("job");
  holder.join();
  ASSERT_TRUE(released.ok() && *released) << released.status().ToString();
  EXPECT_TRUE(woke.ok()) << woke.ToString();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(woken_at - forced_at);
  EXPECT_LT(took, 3s) << "woken by the notification, not the renewal due in 10 s";
  std::printf("[ figure ] %s holder woken %lld ms after a force-release of its grant\n",
              GetParam().name.c_str(), static_cast<long long>(took.count()));
  EXPECT_EQ(held->Confirm().code(), StatusCode::kLost);
}

// Lease::Confirm: one owner-checked round trip. A held lease is confirmed and its safe_until moves
// on; a grant ended behind its holder's back (force-released here and taken by another handle,
// as a holder whose VM was paused past its TTL finds it) is reported lost by the call itself,
// before any renewal of the heartbeat's; the new holder's grant is untouched.
TEST_P(ConformanceTest, ConfirmProvesTheGrantLiveOrReportsItLost) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  // The heartbeat stays out of the way: its first renewal is due after the test.
  auto held = a->TryAcquire("job", {.ttl = 20s, .renew_interval = 10s});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  const SteadyTime first = held->safe_until();
  std::this_thread::sleep_for(20ms);
  Status confirmed = held->Confirm();
  EXPECT_TRUE(confirmed.ok()) << confirmed.ToString();
  EXPECT_GT(held->safe_until(), first) << "a confirmation is a renewal";
  EXPECT_EQ(held->state(), LeaseState::kHeld);
  auto forced = b->ForceRelease("job");
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();
  EXPECT_TRUE(*forced);
  auto taken = b->Acquire("job", {.ttl = 20s, .wait = 5s});
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  const auto sent = std::chrono::steady_clock::now();
  confirmed = held->Confirm();
  EXPECT_EQ(confirmed.code(), StatusCode::kLost) << confirmed.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - sent, 5s) << "one round trip, not a TTL";
  EXPECT_FALSE(held->valid());
  EXPECT_EQ(held->Confirm().code(), StatusCode::kLost) << "lost is terminal";
  confirmed = taken->Confirm();
  EXPECT_TRUE(confirmed.ok()) << "the new holder's grant is untouched: " << confirmed.ToString();
  EXPECT_TRUE(taken->valid());
  ASSERT_TRUE(taken->Release().ok());
  EXPECT_EQ(taken->Confirm().code(), StatusCode::kLost) << "a released lease confirms nothing";
  EXPECT_EQ(Lease().Confirm().code(), StatusCode::kInvalidArgument);
}

// A store that renews several grants of one handle together (etcd: one shared lease) must still
// lose only the grant that was force-released.
TEST_P(ConformanceTest, ForceReleaseOfOneKeyLeavesTheHoldersOtherLeasesHeld) {
  if (GetParam().name == "postgres_advisory") {
    // Documented exception: an advisory lock is released only by its own session, so
    // `release --force` ends the holder's session, and every lock of that session dies with it.
    GTEST_SKIP() << "postgres_advisory force-releases by ending the holder's session";
  }
  auto a = OpenHandle();
  auto b = OpenHandle();
  std::vector<Lease> held;
  for (const char* key : {"one", "two", "three"}) {
    auto lease = a->TryAcquire(key, {.ttl = 3s, .renew_interval = 100ms});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    held.push_back(std::move(lease).value());
  }
  auto forced = b->ForceRelease("two");
  ASSERT_TRUE(forced.ok() && *forced) << forced.status().ToString();
  auto start = std::chrono::steady_clock::now();
  while (!held[1].lost_token().stop_requested() && std::chrono::steady_clock::now() - start < 2s) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(held[1].lost_token().stop_requested()) << "lost at the next renewal";
  // Past the 3 s TTL, the other two are alive only because they were renewed.
  std::this_thread::sleep_for(3500ms);
  EXPECT_TRUE(held[0].valid()) << held[0].lost_reason().ToString();
  EXPECT_TRUE(held[2].valid()) << held[2].lost_reason().ToString();
  EXPECT_EQ(b->TryAcquire("one", {.ttl = 3s}).status().code(), StatusCode::kHeldByAnother);
  EXPECT_EQ(b->TryAcquire("three", {.ttl = 3s}).status().code(), StatusCode::kHeldByAnother);
  auto two = b->TryAcquire("two", {.ttl = 3s});
  EXPECT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(held[1].Release().code(), StatusCode::kLost);
  EXPECT_TRUE(held[0].Release().ok());
  EXPECT_TRUE(held[2].Release().ok());
}

// Two and a half TTLs. The TTL leaves a renewal (every 200 ms) about 400 ms to come back: a
// 300 ms TTL was lost once behind PgBouncer on a machine busy with a build beside the suite.
TEST_P(ConformanceTest, HeartbeatKeepsALeaseBeyondItsTtl) {
  auto handle = OpenHandle();
  auto held = handle->TryAcquire("job", {.ttl = 600ms});
  ASSERT_TRUE(held.ok());
  std::this_thread::sleep_for(1500ms);
  EXPECT_TRUE(held->valid()) << held->lost_reason().ToString();
  EXPECT_EQ(handle->TryAcquire("job", {.ttl = 600ms}).status().code(), StatusCode::kHeldByAnother);
  EXPECT_TRUE(held->Release().ok());
}

TEST_P(ConformanceTest, BadInputIsRejectedAndLeavesHeldLeasesAlone) {
  auto handle = OpenHandle();
  auto held = handle->TryAcquire("job", {.ttl = 5s});
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(handle->TryAcquire("", {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(handle->TryAcquire(std::string(513, 'k'), {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(handle->TryAcquire("job", {.ttl = 0s}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(handle->TryAcquire("job", {.ttl = 2s, .renew_interval = 2s}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(handle->Inspect("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(handle->ForceRelease("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(held->valid());
  auto info = handle->Inspect("job");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->fencing_token, held->fencing_token());
}

TEST_P(ConformanceTest, FairStoresGrantWaitersInQueueOrderAndReleasersCannotBarge) {
  if (!backend_->capabilities().fair_queue) {
    GTEST_SKIP() << GetParam().name << " does not queue waiters";
  }
  constexpr int kWaiters = 8;
  auto holder_handle = OpenHandle();
  auto held = holder_handle->TryAcquire("fair", {.ttl = 10s});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  std::vector<std::unique_ptr<Store>> handles;
  for (int i = 0; i < kWaiters; ++i) {
    handles.push_back(OpenHandle());
  }
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::jthread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      auto lease = handles[i]->Acquire("fair", {.ttl = 10s, .wait = 20s});
      ASSERT_TRUE(lease.ok()) << lease.status().ToString();
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      }
      std::this_thread::sleep_for(5ms);
      EXPECT_TRUE(lease->Release().ok());
    });
    std::this_thread::sleep_for(100ms);  // queue in a known order
  }
  // The holder releases and tries to take the key straight back: with waiters queued, it must
  // not barge ahead of them.
  ASSERT_TRUE(held->Release().ok());
  auto barge = holder_handle->TryAcquire("fair", {.ttl = 10s});
  EXPECT_EQ(barge.status().code(), StatusCode::kHeldByAnother) << "a releaser barged ahead";
  if (barge.ok()) {
    (void)barge->Release();
  }
  waiters.clear();
  std::vector<int> expected(kWaiters);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected) << "waiters were not granted the key in the order they queued";
}

// Election (leasehold/election.h): a recipe over Store and Lease, so every store gets it through
// this suite. Waits below are on real signals (a condition variable fed by callbacks), each
// bounded so that a broken store fails the test instead of hanging it.
class ElectionEvents {
 public:
  void Add(std::optional<LeaderInfo> leader) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back(std::move(leader));
    cv_.notify_all();
  }

  // Waits until `pred(seen)` holds; false after 10 s.
  template <typename Pred>
  bool WaitFor(Pred pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return pred(seen_); });
  }

  std::vector<std::optional<LeaderInfo>> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<LeaderInfo>> seen_;
};

TEST_P(ConformanceTest, ElectionHasOneLeaderAtATime) {
  constexpr int kCandidates = 3;
  constexpr int kTerms = 12;
  std::vector<std::unique_ptr<Store>> handles;
  for (int i = 0; i < kCandidates; ++i) {
    handles.push_back(OpenHandle());
  }
  std::mutex mu;
  int leading = 0;
  int most_leading = 0;
  std::vector<FencingToken> terms;
  std::stop_source stop;
  std::vector<Status> results(kCandidates);
  std::vector<std::jthread> candidates;
  for (int i = 0; i < kCandidates; ++i) {
    candidates.emplace_back([&, i] {
      Election election(*handles[i], "svc", fmt::format("candidate-{}", i), {.lease = {.ttl = 5s}});
      results[i] = election.CampaignLoop(
          [&](Leadership& leadership) {
            EXPECT_TRUE(leadership.valid());
            {
              std::lock_guard<std::mutex> lock(mu);
              ++leading;
              most_leading = std::max(most_leading, leading);
              terms.push_back(leadership.term());
            }
            // While we lead, the store names us, and a rival's campaign without wait fails.
            auto leader = election.Leader();
            EXPECT_TRUE(leader.ok() && leader->has_value()) << leader.status().ToString();
            if (leader.ok() && leader->has_value()) {
              EXPECT_EQ((*leader)->id, election.candidate_id());
              EXPECT_EQ((*leader)->term, leadership.term());
            }
            Election rival(*handles[(i + 1) % kCandidates], "svc", "rival");
            EXPECT_EQ(rival.Campaign(0s).status().code(), StatusCode::kHeldByAnother);
            {
              std::lock_guard<std::mutex> lock(mu);
              --leading;
              if (terms.size() >= static_cast<std::size_t>(kTerms)) {
                stop.request_stop();
              }
            }
            return Status();
          },
          stop.get_token());
    });
  }
  candidates.clear();  // joins; every loop ends once kTerms terms were led
  for (const Status& r : results) {
    EXPECT_TRUE(r.ok()) << r.ToString();
  }
  EXPECT_EQ(most_leading, 1) << "two candidates led at once";
  ASSERT_GE(terms.size(), static_cast<std::size_t>(kTerms));
  for (std::size_t i = 1; i < terms.size(); ++i) {
    EXPECT_GT(terms[i], terms[i - 1]) << "terms must strictly increase, leader after leader";
  }
}

TEST_P(ConformanceTest, ElectionObserveSeesEveryChangeInOrder) {
  auto watcher_handle = OpenHandle();
  Election watcher(*watcher_handle, "svc", "watcher");
  ElectionEvents events;
  Status observed = Status::Internal("not run");
  std::stop_source stop_observing;
  std::jthread observer([&] {
    observed = watcher.Observe([&](const std::optional<LeaderInfo>& l) { events.Add(l); },
                               stop_observing.get_token());
  });
  ASSERT_TRUE(events.WaitFor([](const auto& seen) { return !seen.empty(); }));
  EXPECT_FALSE(events.seen().front().has_value()) << "first report: no leader yet";

  // Three leaders one after the other; each change is made only once the previous one was
  // reported, so a correct observer sees every one of them.
  std::vector<std::unique_ptr<Store>> handles;
  std::vector<FencingToken> terms;
  for (int i = 0; i < 3; ++i) {
    handles.push_back(OpenHandle());
    Election candidate(*handles.back(), "svc", fmt::format("leader-{}", i));
    auto leadership = candidate.Campaign(5s);
    ASSERT_TRUE(leadership.ok()) << leadership.status().ToString();
    terms.push_back(leadership->term());
    const FencingToken term = leadership->term();
    ASSERT_TRUE(events.WaitFor([&](const auto& seen) {
      return seen.back().has_value() && seen.back()->term == term;
    })) << "observer missed leader-"
        << i;
    ASSERT_TRUE(leadership->Resign().ok());
    ASSERT_TRUE(events.WaitFor([](const auto& seen) { return !seen.back().has_value(); }))
        << "observer missed the vacancy after leader-" << i << " resigned";
  }
  stop_observing.request_stop();
  observer.join();
  EXPECT_TRUE(observed.ok()) << observed.ToString();

  std::vector<std::optional<LeaderInfo>> seen = events.seen();
  ASSERT_EQ(seen.size(), 7u) << "none, then (leader, none) three times: nothing twice";
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& leader = seen[1 + 2 * i];
    ASSERT_TRUE(leader.has_value());
    EXPECT_EQ(leader->id, fmt::format("leader-{}", i));
    EXPECT_EQ(leader->term, terms[i]);
    EXPECT_FALSE(seen[2 + 2 * i].has_value());
  }
  EXPECT_LT(terms[0], terms[1]);
  EXPECT_LT(terms[1], terms[2]);
}

TEST_P(ConformanceTest, ElectionResignHandsOverAtOnce) {
  auto a_handle = OpenHandle();
  auto b_handle = OpenHandle();
  // A long TTL: if the hand-over waited for expiry, B's 10 s campaign would run out first.
  Election a(*a_handle, "svc", "a", {.lease = {.ttl = 60s}});
  auto leading = a.Campaign(0s);
  ASSERT_TRUE(leading.ok()) << leading.status().ToString();

  std::mutex mu;
  std::condition_variable cv;
  bool b_waiting = false;
  LeaderInfo b_saw;
  Election b(*b_handle, "svc", "b",
             {.lease = {.ttl = 60s},
              .on_event = [&](ElectionEvent event, const LeaderInfo& leader, const Status&) {
                if (event == ElectionEvent::kNotElected) {
                  std::lock_guard<std::mutex> lock(mu);
                  b_waiting = true;
                  b_saw = leader;
                  cv.notify_all();
                }
              }});
  Result<Leadership> b_leads = Status::Internal("not run");
  std::jthread campaign([&] { b_leads = b.Campaign(10s); });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return b_waiting; }));
  }
  EXPECT_EQ(b_saw.id, "a");
  EXPECT_EQ(b_saw.term, leading->term());
  ASSERT_TRUE(leading->Resign().ok());
  EXPECT_FALSE(leading->valid());
  EXPECT_TRUE(leading->Resign().ok()) << "resigning twice is harmless";
  campaign.join();
  ASSERT_TRUE(b_leads.ok()) << b_leads.status().ToString();
  EXPECT_GT(b_leads->term(), leading->term());
  auto leader = a.Leader();
  ASSERT_TRUE(leader.ok() && leader->has_value());
  EXPECT_EQ((*leader)->id, "b");
  EXPECT_EQ((*leader)->term, b_leads->term());
}

TEST_P(ConformanceTest, ElectionReportsLostLeadership) {
  auto handle = OpenHandle();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ElectionEvent> events;
  FencingToken lost_term = 0;
  Election election(
      *handle, "svc", "a",
      {.lease = {.ttl = 1s},
       .on_event = [&](ElectionEvent event, const LeaderInfo& leader, const Status& reason) {
         std::lock_guard<std::mutex> lock(mu);
         events.push_back(event);
         if (event == ElectionEvent::kLostLeadership) {
           lost_term = leader.term;
           EXPECT_FALSE(reason.ok());
         }
         cv.notify_all();
       }});
  auto leadership = election.Campaign(0s);
  ASSERT_TRUE(leadership.ok()) << leadership.status().ToString();
  ASSERT_TRUE(handle->ForceRelease(Election::KeyFor("svc")).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return events.size() == 2; }));
    EXPECT_EQ(events[0], ElectionEvent::kElected);
    EXPECT_EQ(events[1], ElectionEvent::kLostLeadership);
    EXPECT_EQ(lost_term, leadership->term());
  }
  EXPECT_TRUE(leadership->lost_token().stop_requested());
  EXPECT_EQ(leadership->Resign().code(), StatusCode::kLost);
}

// ---------------------------------------------------------------------------------------------
// Ends that outlive the holder (Backend::Finish), the key's record, the store's clock, and
// schedule slots built on them (leasehold/schedule.h).

// Polls until ReadRecord shows nothing (a store may drop an expired record a moment late: etcd
// checks lease expiry every 500 ms), for at most `limit`.
bool RecordGoneWithin(Backend& backend, const std::string& key, Duration limit) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < give_up) {
    auto record = backend.ReadRecord(key);
    if (record.ok() && !record->has_value()) {
      return true;
    }
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

TEST_P(ConformanceTest, FinishWritesTheRecordOnlyForTheOwnerAndInTheSameStep) {
  auto grant = Grant("job", Token('a'));
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  auto none = backend_->ReadRecord("job");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());
  // Someone else's token: refused, nothing written, the grant untouched.
  Status refused = backend_->Finish(
      {.key = "job", .owner_token = Token('b'), .record = "theirs", .record_ttl = 30s});
  EXPECT_EQ(refused.code(), StatusCode::kLost) << refused.ToString();
  auto still_none = backend_->ReadRecord("job");
  ASSERT_TRUE(still_none.ok());
  EXPECT_FALSE(still_none->has_value()) << "a refused finish must not write the record";
  auto info = backend_->Inspect("job");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->fencing_token, grant->fencing_token);
  // The owner: the grant is deleted and the record written, together.
  std::string value = "leasehold-slots 1\n1 d 0 1 2 3 holder with spaces\n";
  Status finished = backend_->Finish(
      {.key = "job", .owner_token = Token('a'), .record = value, .record_ttl = 30s});
  ASSERT_TRUE(finished.ok()) << finished.ToString();
  auto freed = backend_->Inspect("job");
  ASSERT_TRUE(freed.ok());
  EXPECT_FALSE(freed->has_value()) << "keep 0 deletes the grant";
  auto record = backend_->ReadRecord("job");
  ASSERT_TRUE(record.ok() && record->has_value()) << record.status().ToString();
  EXPECT_EQ(**record, value);
  EXPECT_EQ(backend_->Finish({.key = "job", .owner_token = Token('a')}).code(), StatusCode::kLost)
      << "a second finish finds no grant";
  // Later grants, their releases and force-releases leave the record alone; the next owner
  // replaces it.
  auto next = Grant("job", Token('c'));
  ASSERT_TRUE(next.ok());
  EXPECT_GT(next->fencing_token, grant->fencing_token);
  ASSERT_TRUE(backend_->ForceRelease("job").ok());
  ASSERT_TRUE(Grant("job", Token('d')).ok());
  ASSERT_TRUE(backend_->Release("job", Token('d')).ok());
  record = backend_->ReadRecord("job");
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ(**record, value);
  ASSERT_TRUE(Grant("job", Token('e')).ok());
  ASSERT_TRUE(
      backend_->Finish({.key = "job", .owner_token = Token('e'), .record = "v2", .record_ttl = 30s})
          .ok());
  record = backend_->ReadRecord("job");
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ(**record, "v2");
  // Records are per key.
  auto other = backend_->ReadRecord("job2");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
}

TEST_P(ConformanceTest, ListRecordsByPrefixInKeyOrder) {
  for (const char* key : {"app/b", "app/a", "app_%", "other", "app/gone"}) {
    ASSERT_TRUE(Grant(key, Token('a')).ok()) << key;
    ASSERT_TRUE(backend_
                    ->Finish({.key = key,
                              .owner_token = Token('a'),
                              .record = std::string("r:") + key,
                              .record_ttl = std::string_view(key) == "app/gone" ? 1s : 30s})
                    .ok())
        << key;
  }
  ASSERT_TRUE(Grant("app/c", Token('c')).ok()) << "a grant without a record is not listed";
  std::this_thread::sleep_for(900ms);
  ASSERT_TRUE(RecordGoneWithin(*backend_, "app/gone", 3s));
  auto listed = backend_->ListRecords("app/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0], std::make_pair(std::string("app/a"), std::string("r:app/a")));
  EXPECT_EQ((*listed)[1], std::make_pair(std::string("app/b"), std::string("r:app/b")));
  auto literal = backend_->ListRecords("app_");
  ASSERT_TRUE(literal.ok());
  ASSERT_EQ(literal->size(), 1u) << "wildcard characters are literal";
  EXPECT_EQ((*literal)[0].first, "app_%");
  auto all = backend_->ListRecords("");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 4u);
  auto grants = backend_->List("");
  ASSERT_TRUE(grants.ok());
  EXPECT_EQ(grants->size(), 1u) << "records are not grants";
}

TEST_P(ConformanceTest, ARecordExpiresAfterItsTtl) {
  ASSERT_TRUE(Grant("job", Token('a')).ok());
  ASSERT_TRUE(
      backend_->Finish({.key = "job", .owner_token = Token('a'), .record = "r", .record_ttl = 1s})
          .ok());
  auto record = backend_->ReadRecord("job");
  ASSERT_TRUE(record.ok() && record->has_value()) << "readable at once";
  // A store may round the TTL up to its granularity (etcd: whole seconds, at least 2 s).
  std::this_thread::sleep_for(900ms);
  EXPECT_TRUE(RecordGoneWithin(*backend_, "job", 3s)) << "still there well after its ttl";
}

TEST_P(ConformanceTest, FinishCanKeepTheGrantWithoutItsHolder) {
  auto grant = Grant("job", Token('a'), 10s);
  ASSERT_TRUE(grant.ok());
  auto live = backend_->Holders("job");
  ASSERT_TRUE(live.ok() && live->size() == 1) << live.status().ToString();
  EXPECT_FALSE(live->front().kept);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(backend_->Finish({.key = "job", .owner_token = Token('a'), .keep = 1500ms}).ok());
  // Shown kept (status: "kept until ..."), with the grant's holder, token prefix and token.
  auto kept = backend_->Holders("job");
  ASSERT_TRUE(kept.ok() && kept->size() == 1) << kept.status().ToString();
  EXPECT_TRUE(kept->front().kept);
  EXPECT_EQ(kept->front().fencing_token, grant->fencing_token);
  EXPECT_EQ(kept->front().holder, live->front().holder);
  EXPECT_EQ(kept->front().token_prefix, live->front().token_prefix);
  auto inspected = backend_->Inspect("job");
  ASSERT_TRUE(inspected.ok() && inspected->has_value()) << inspected.status().ToString();
  EXPECT_TRUE((*inspected)->kept);
  // The heartbeat does not wait for a renewal in flight: one that lands after the finish must
  // neither extend the kept grant nor shorten it.
  EXPECT_EQ(backend_->Renew({"job", Token('a'), 10s}).code(), StatusCode::kLost);
  EXPECT_EQ(backend_->Renew({"job", Token('a'), 100ms}).code(), StatusCode::kLost);
  auto handle = OpenHandle();
  auto refused = handle->TryAcquire("job", {.ttl = 5s});
  ASSERT_EQ(refused.status().code(), StatusCode::kHeldByAnother) << refused.status().ToString();
  ASSERT_NE(refused.status().holder(), nullptr);
  EXPECT_EQ(refused.status().holder()->fencing_token, grant->fencing_token);
  EXPECT_LE(refused.status().holder()->remaining, 3s) << "kept for the keep, not the old ttl";
  auto taken = handle->Acquire("job", {.ttl = 5s, .wait = 6s});
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_GE(waited, 1500ms) << "taken before the keep ran out (or a late renewal shortened it)";
  EXPECT_LT(waited, 5s) << "the kept grant must expire by its keep, not the old ttl";
  EXPECT_GT(taken->fencing_token(), grant->fencing_token);
  std::printf("[ figure ] %s grant kept 1500ms after its holder: taken after %.0f ms\n",
              GetParam().name.c_str(), std::chrono::duration<double, std::milli>(waited).count());
}

TEST_P(ConformanceTest, HoldAtLeastKeepsOthersOutAfterTheHolderHasExited) {
  if (backend_->capabilities().scope == StoreScope::kProcess) {
    GTEST_SKIP() << GetParam().name << " is confined to one process";
  }
  // The holder takes the key, releases it with hold_at_least 2s at once, and exits: its
  // session and connections are gone, the grant is not.
  const auto start = std::chrono::steady_clock::now();
  Child holder({LEASE_HOLDER_PATH, url_, "job", "linger", "5000", "2000"});
  std::string line = holder.ReadLine();
  ASSERT_TRUE(line.starts_with("acquired ")) << line;
  ASSERT_EQ(holder.Wait(), 0) << holder.ReadLine();
  auto handle = OpenHandle();
  auto refused = handle->TryAcquire("job", {.ttl = 5s});
  EXPECT_EQ(refused.status().code(), StatusCode::kHeldByAnother)
      << "the holder has exited, but the grant must stay: " << refused.status().ToString();
  auto taken = handle->Acquire("job", {.ttl = 5s, .wait = 8s});
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_GE(waited, 2s);
  std::printf("[ figure ] %s hold_at_least 2s after the holder exited: taken after %.0f ms\n",
              GetParam().name.c_str(), std::chrono::duration<double, std::milli>(waited).count());
}

TEST_P(ConformanceTest, FinishRejectsBadInputAndKeepsTheGrant) {
  auto grant = Grant("job", Token('a'));
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(backend_->Finish({.key = "job", .owner_token = Token('a'), .keep = -1s}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      backend_
          ->Finish(
              {.key = "job", .owner_token = Token('a'), .keep = internal::kMaxFinishDuration + 1s})
          .code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_
                ->Finish({.key = "job",
                          .owner_token = Token('a'),
                          .record = "r",
                          .record_ttl = Duration::max()})
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_
                ->Finish({.key = "job",
                          .owner_token = Token('a'),
                          .record = std::string(internal::kMaxRecordBytes + 1, 'x'),
                          .record_ttl = 10s})
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->Finish({.key = "job", .owner_token = Token('a'), .record = "r"}).code(),
            StatusCode::kInvalidArgument);
  auto info = backend_->Inspect("job");
  ASSERT_TRUE(info.ok() && info->has_value()) << "bad input leaves the grant alone";
  EXPECT_EQ((*info)->fencing_token, grant->fencing_token);
  // The largest record is accepted, byte for byte.
  std::string largest(internal::kMaxRecordBytes, 'x');
  largest[7] = '\n';
  ASSERT_TRUE(
      backend_
          ->Finish({.key = "job", .owner_token = Token('a'), .record = largest, .record_ttl = 10s})
          .ok());
  auto record = backend_->ReadRecord("job");
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ(**record, largest);
}

TEST_P(ConformanceTest, WallClockAgreesWithThisHost) {
  const auto before = std::chrono::system_clock::now();
  auto now = backend_->WallClock();
  const auto after = std::chrono::system_clock::now();
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  // Same machine: the store's clock is this host's, read within the call (1 s of slack for
  // a store that reports whole seconds or a leader's time a little stale).
  EXPECT_GE(now->time, before - 1s);
  EXPECT_LE(now->time, after + 1s);
  std::printf("[ figure ] %s wall clock: %s, %.1f ms from this host's\n", GetParam().name.c_str(),
              now->from_store ? "the store's" : "this host's",
              std::chrono::duration<double, std::milli>(now->time - before).count());
}

TEST_P(ConformanceTest, OneRunPerSlotAmongRacingHolders) {
  // Six handles race for the same slot, each claiming and finishing as a job would; exactly
  // one runs, the others find it running or done.
  const SlotGrid grid{.period = 1h};
  std::vector<std::unique_ptr<Store>> hosts;
  for (int i = 0; i < 6; ++i) {
    hosts.push_back(OpenHandle());
  }
  std::atomic<int> ran{0}, done{0}, running{0}, errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      auto claim = hosts[i]->ClaimSlot("nightly", grid,
                                       {.ttl = 5s, .wait = 0s, .holder = fmt::format("h{}", i)});
      if (!claim.ok()) {
        (claim.status().code() == StatusCode::kHeldByAnother ? running : errors)++;
        return;
      }
      if (!claim->claimed()) {
        ++done;
        return;
      }
      ++ran;
      std::this_thread::sleep_for(100ms);
      if (!claim->Finish({.succeeded = true}).ok()) {
        ++errors;
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(errors, 0);
  EXPECT_EQ(ran + done + running, 6);
  // Whoever comes later in the slot finds it done, with the run recorded.
  auto later = hosts[0]->ClaimSlot("nightly", grid, {.ttl = 5s, .wait = 0s});
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_FALSE(later->claimed());
  ASSERT_TRUE(later->done_by().has_value());
  EXPECT_TRUE(later->done_by()->succeeded);
  EXPECT_EQ(later->done_by()->slot_start, later->slot_start());
  auto runs = hosts[0]->SlotRuns("nightly");
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_TRUE((*runs)[0].holder.starts_with("h"));
  EXPECT_GT((*runs)[0].fencing_token, 0u);
  EXPECT_LE((*runs)[0].started, (*runs)[0].ended);
}

TEST_P(ConformanceTest, AFailedRunFreesTheSlotAndASuccessClosesIt) {
  const SlotGrid grid{.period = 1h};
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto first = a->ClaimSlot("job", grid, {.ttl = 5s, .wait = 0s, .holder = "a"});
  ASSERT_TRUE(first.ok() && first->claimed()) << first.status().ToString();
  ASSERT_TRUE(first->Finish({.succeeded = false, .exit_code = 3}).ok());
  auto retry = b->ClaimSlot("job", grid, {.ttl = 5s, .wait = 0s, .holder = "b"});
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  ASSERT_TRUE(retry->claimed()) << "a failed run leaves the slot open";
  ASSERT_TRUE(retry->Finish({.succeeded = true}).ok());
  auto again = a->ClaimSlot("job", grid, {.ttl = 5s, .wait = 0s});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->claimed()) << "the success closes the slot";
  auto runs = a->SlotRuns("job");
  ASSERT_TRUE(runs.ok() && runs->size() == 2u);
  EXPECT_TRUE((*runs)[0].succeeded);
  EXPECT_EQ((*runs)[0].holder, "b");
  EXPECT_FALSE((*runs)[1].succeeded);
  EXPECT_EQ((*runs)[1].exit_code, 3);
  EXPECT_FALSE((*runs)[1].final);
  // With retries off, a failure closes the slot too.
  auto strict = a->ClaimSlot("strict", grid, {.ttl = 5s, .wait = 0s});
  ASSERT_TRUE(strict.ok() && strict->claimed());
  ASSERT_TRUE(strict->Finish({.succeeded = false, .exit_code = 1, .retry_failed = false}).ok());
  auto closed = b->ClaimSlot("strict", grid, {.ttl = 5s, .wait = 0s});
  ASSERT_TRUE(closed.ok());
  EXPECT_FALSE(closed->claimed());
  // A claim dropped without Finish (a crashed runner) records nothing and frees the slot.
  {
    auto dropped = a->ClaimSlot("crash", grid, {.ttl = 5s, .wait = 0s});
    ASSERT_TRUE(dropped.ok() && dropped->claimed());
  }
  auto after_crash = b->ClaimSlot("crash", grid, {.ttl = 5s, .wait = 0s});
  ASSERT_TRUE(after_crash.ok());
  EXPECT_TRUE(after_crash->claimed());
}

TEST_P(ConformanceTest, ASlotRecordExpiresAfterTwoPeriods) {
  // A 1 s grid without tolerance: the record lives 2 s after the run.
  const SlotGrid grid{.period = 1s, .tolerance = 0s};
  auto handle = OpenHandle();
  auto claim = handle->ClaimSlot("tick", grid, {.ttl = 5s, .wait = 0s});
  ASSERT_TRUE(claim.ok() && claim->claimed()) << claim.status().ToString();
  ASSERT_TRUE(claim->Finish({.succeeded = true}).ok());
  auto runs = handle->SlotRuns("tick");
  ASSERT_TRUE(runs.ok());
  EXPECT_EQ(runs->size(), 1u);
  std::this_thread::sleep_for(1800ms);
  EXPECT_TRUE(RecordGoneWithin(*backend_, "tick", 3s)) << "kept well past two periods";
}

TEST_P(ConformanceTest, ALostLeaseRecordsNoRun) {
  const SlotGrid grid{.period = 1h};
  auto a = OpenHandle();
  auto claim = a->ClaimSlot("job", grid, {.ttl = 5s, .wait = 0s});
  ASSERT_TRUE(claim.ok() && claim->claimed());
  ASSERT_TRUE(a->ForceRelease("job").ok());
  EXPECT_EQ(claim->Finish({.succeeded = true}).code(), StatusCode::kLost);
  auto runs = a->SlotRuns("job");
  ASSERT_TRUE(runs.ok());
  EXPECT_TRUE(runs->empty()) << "a run that may have overlapped another is not recorded";
}

// Fenced writes (Lease::Write): data in the lease's own store, written only while the grant is
// the writer's, checked by the store in the same step. Key-value stores take Put/Delete; SQL
// stores take statements, here on the fixture's data table (testing::kFencedDataTable).
class FencedData {
 public:
  // The data of lease `lease_key` on `store`.
  FencedData(const testing::StoreFixture& fixture, std::string url, const std::string& scratch,
             const Store& store, std::string lease_key = "job")
      : fixture_(fixture),
        url_(std::move(url)),
        prefix_("/lh-fenced-" + std::filesystem::path(scratch).filename().string() + "-"),
        store_(store),
        lease_key_(std::move(lease_key)) {}

  // A data key of this test: unique on a shared server, a valid ZooKeeper path in the chroot,
  // kept beside the lease's grants (Store::DataKey: in a Redis Cluster, in its hash slot).
  std::string Key(const std::string& name) const {
    return store_.DataKey(lease_key_, prefix_ + name);
  }

  FencedWrite Put(const Store& store, const std::string& key, const std::string& value) const {
    if (store.SupportsFencedOp(FencedOp::Kind::kPut)) {
      return FencedWrite().Put(key, value);
    }
    return FencedWrite()
        .Sql(fmt::format("CREATE TABLE IF NOT EXISTS {} (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
                         testing::kFencedDataTable))
        .Sql(fmt::format("INSERT INTO {} (k, v) VALUES ($1, $2) "
                         "ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                         testing::kFencedDataTable),
             {key, value});
  }

  FencedWrite Delete(const Store& store, const std::string& key) const {
    if (store.SupportsFencedOp(FencedOp::Kind::kDelete)) {
      return FencedWrite().Delete(key);
    }
    return FencedWrite().Sql(fmt::format("DELETE FROM {} WHERE k = $1", testing::kFencedDataTable),
                             {key});
  }

  std::optional<std::string> Read(const std::string& key) const {
    auto value = fixture_.read_data(url_, key);
    EXPECT_TRUE(value.ok()) << value.status().ToString();
    return value.ok() ? *value : std::nullopt;
  }

 private:
  const testing::StoreFixture& fixture_;
  const std::string url_;
  const std::string prefix_;
  const Store& store_;
  const std::string lease_key_;
};

TEST_P(ConformanceTest, AFencedWriteCommitsForTheHolderAnyNumberOfTimes) {
  auto handle = OpenHandle();
  FencedData data(GetParam(), url_, scratch_, *handle);
  ASSERT_TRUE(handle->SupportsFencedOp(FencedOp::Kind::kPut) ||
              handle->SupportsFencedOp(FencedOp::Kind::kSql))
      << "every store writes data under a lease";
  auto lease = handle->TryAcquire("job", {.ttl = 10s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_FALSE(lease->store_key().empty());
  const std::string key = data.Key("a");
  auto first = lease->Write(data.Put(*handle, key, "one"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->affected.back(), 1);
  EXPECT_EQ(data.Read(key), "one");
  // The same grant, the same (equal) token: accepted every time.
  auto second = lease->Write(data.Put(*handle, key, "two"));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(data.Read(key), "two");
  auto deleted = lease->Write(data.Delete(*handle, key));
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(deleted->affected, std::vector<std::int64_t>{1});
  EXPECT_EQ(data.Read(key), std::nullopt);
  auto again = lease->Write(data.Delete(*handle, key));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->affected, std::vector<std::int64_t>{0}) << "deleting a missing key is a no-op";
  EXPECT_TRUE(lease->valid()) << "writing does not disturb the lease";
}

TEST_P(ConformanceTest, AStaleHolderIsFencedOutByTheStoreAndNewerHoldersWrite) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  FencedData data(GetParam(), url_, scratch_, *a);
  const std::string key = data.Key("register");
  const std::string other = data.Key("other");
  auto stale = a->TryAcquire("job", {.ttl = 10s, .holder = "holder-a"});
  ASSERT_TRUE(stale.ok()) << stale.status().ToString();
  ASSERT_TRUE(stale->Write(data.Put(*a, key, "a")).ok());
  // A is taken for dead (an operator's force-release stands in for a pause past its TTL), and B
  // takes the key with a higher token.
  ASSERT_TRUE(b->ForceRelease("job").ok());
  auto newer = b->TryAcquire("job", {.ttl = 10s, .holder = "holder-b"});
  ASSERT_TRUE(newer.ok()) << newer.status().ToString();
  ASSERT_GT(newer->fencing_token(), stale->fencing_token());
  auto b_wrote = newer->Write(data.Put(*b, key, "b"));
  ASSERT_TRUE(b_wrote.ok()) << b_wrote.status().ToString();
  // A, unaware, writes with its lower token: the store refuses all of it.
  FencedWrite both = data.Put(*a, key, "a-stale");
  const FencedWrite other_put = data.Put(*a, other, "a-stale");
  for (const FencedOp& op : other_put.ops()) {
    if (op.kind == FencedOp::Kind::kPut) {
      both.Put(op.key, op.value);
    } else {
      both.Sql(op.key, op.params);
    }
  }
  auto refused = stale->Write(both);
  ASSERT_EQ(refused.status().code(), StatusCode::kLost) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("fenced out"), std::string_view::npos)
      << refused.status().message();
  EXPECT_EQ(data.Read(key), "b") << "the stale write changed nothing";
  EXPECT_EQ(data.Read(other), std::nullopt) << "no op of a refused write is applied";
  // B writes again (equal token), then hands over to C (higher token), which writes.
  ASSERT_TRUE(newer->Write(data.Put(*b, key, "b2")).ok());
  ASSERT_TRUE(newer->Release().ok());
  auto after_release = newer->Write(data.Put(*b, key, "b-released"));
  EXPECT_EQ(after_release.status().code(), StatusCode::kLost) << after_release.status().ToString();
  auto c = a->TryAcquire("job", {.ttl = 10s, .holder = "holder-c"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_GT(c->fencing_token(), newer->fencing_token());
  ASSERT_TRUE(c->Write(data.Put(*a, key, "c")).ok());
  EXPECT_EQ(data.Read(key), "c");
  EXPECT_EQ(stale->Write(data.Put(*a, key, "a-again")).status().code(), StatusCode::kLost);
  EXPECT_EQ(data.Read(key), "c");
}

TEST_P(ConformanceTest, AFencedWriteOfAnExpiredGrantIsRefusedEvenWithNoNewHolder) {
  auto handle = OpenHandle();
  FencedData data(GetParam(), url_, scratch_, *handle);
  auto grant = Grant("job", Token('e'), 1s);
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  AwaitExpiry("job", *grant, 300ms);
  const FencedWrite put = data.Put(*handle, data.Key("late"), "late");
  auto late =
      backend_->FencedWrite({.key = "job",
                             .owner_token = Token('e'),
                             .fencing_token = grant->fencing_token,
                             .store_key = grant->store_key.empty() ? "job" : grant->store_key,
                             .ops = put.ops()});
  EXPECT_EQ(late.status().code(), StatusCode::kLost) << late.status().ToString();
  EXPECT_EQ(data.Read(data.Key("late")), std::nullopt);
}

TEST_P(ConformanceTest, BadFencedWritesAreRefusedAndLeaveTheLeaseHeld) {
  auto handle = OpenHandle();
  FencedData data(GetParam(), url_, scratch_, *handle);
  auto lease = handle->TryAcquire("job", {.ttl = 10s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->Write(FencedWrite()).status().code(), StatusCode::kInvalidArgument);
  FencedWrite many;
  for (std::size_t i = 0; i <= kMaxFencedOps; ++i) {
    many.Delete(data.Key("k"));
  }
  EXPECT_EQ(lease->Write(many).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(lease->Write(FencedWrite().Put(data.Key("big"), std::string(kMaxFencedWriteBytes, 'x')))
                .status()
                .code(),
            handle->SupportsFencedOp(FencedOp::Kind::kPut) ? StatusCode::kInvalidArgument
                                                           : StatusCode::kUnimplemented);
  // The op kind the store does not have.
  const bool sql = handle->SupportsFencedOp(FencedOp::Kind::kSql);
  auto wrong_kind =
      lease->Write(sql ? FencedWrite().Put(data.Key("x"), "v") : FencedWrite().Sql("SELECT 1"));
  EXPECT_EQ(wrong_kind.status().code(), StatusCode::kUnimplemented)
      << wrong_kind.status().ToString();
  if (sql) {
    // A statement the database refuses rolls back the whole write, statements before it too.
    FencedWrite broken = data.Put(*handle, data.Key("first"), "v");
    broken.Sql("INSERT INTO no_such_table_here VALUES (1)");
    auto refused = lease->Write(broken);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
    EXPECT_EQ(data.Read(data.Key("first")), std::nullopt);
  } else if (lease->store_key() != lease->key()) {
    // Where grants live among the data keys, the lease's own keys are not data.
    auto own = lease->Write(FencedWrite().Delete(lease->store_key()));
    EXPECT_EQ(own.status().code(), StatusCode::kInvalidArgument) << own.status().ToString();
  }
  EXPECT_TRUE(lease->valid());
  EXPECT_EQ(handle->TryAcquire("job", {.ttl = 10s}).status().code(), StatusCode::kHeldByAnother);
  EXPECT_TRUE(lease->Write(data.Put(*handle, data.Key("after"), "ok")).ok());
}

INSTANTIATE_TEST_SUITE_P(AllBackends, ConformanceTest,
                         ::testing::ValuesIn(testing::AllStoreFixtures()),
                         [](const auto& info) { return info.param.name; });

// Shared leases (LeaseOptions::limit and ::mode; backends/backend.h, "Shared leases"): every
// store, the same cases. A store without them (Capabilities::shared_leases false) skips.
class SharedLeaseTest : public ConformanceTest {
 protected:
  void SetUp() override {
    ConformanceTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) {
      return;  // the store did not open: the failure is reported, there is no backend_
    }
    if (!backend_->capabilities().shared_leases) {
      GTEST_SKIP() << GetParam().name << " has no shared leases";
    }
  }

  // The slots of `leases`, sorted.
  static std::vector<std::uint32_t> Slots(const std::vector<Lease>& leases) {
    std::vector<std::uint32_t> out;
    for (const Lease& l : leases) {
      out.push_back(l.slot());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST_P(SharedLeaseTest, ASemaphoreAdmitsAtMostItsLimitWithDistinctSlotsAndRisingTokens) {
  std::vector<std::unique_ptr<Store>> handles;
  for (int i = 0; i < 4; ++i) {
    handles.push_back(OpenHandle());
  }
  std::vector<Lease> held;
  FencingToken last = 0;
  for (int i = 0; i < 3; ++i) {
    auto lease = handles[i]->TryAcquire(
        "pool", {.ttl = 10s, .limit = 3, .holder = fmt::format("worker-{}", i)});
    ASSERT_TRUE(lease.ok()) << i << ": " << lease.status().ToString();
    EXPECT_GT(lease->fencing_token(), last) << "fencing tokens rise across every grant of a key";
    last = lease->fencing_token();
    EXPECT_EQ(lease->limit(), 3U);
    held.push_back(std::move(*lease));
  }
  EXPECT_EQ(Slots(held), (std::vector<std::uint32_t>{0, 1, 2}));
  auto full = handles[3]->TryAcquire("pool", {.ttl = 10s, .limit = 3, .holder = "worker-3"});
  ASSERT_EQ(full.status().code(), StatusCode::kHeldByAnother) << full.status().ToString();
  // The freed slot is the one a newcomer gets, under a higher token still.
  const std::uint32_t freed = held[1].slot();
  ASSERT_TRUE(held[1].Release().ok());
  auto next = handles[3]->TryAcquire("pool", {.ttl = 10s, .limit = 3, .holder = "worker-3"});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->slot(), freed);
  EXPECT_GT(next->fencing_token(), last);
  // An exclusive lease of another key is unaffected.
  EXPECT_TRUE(handles[3]->TryAcquire("other", {.ttl = 10s}).ok());
}

TEST_P(SharedLeaseTest, HoldersThatDisagreeOnTheLimitOrKindAreRefusedNamingBoth) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto sem = a->TryAcquire("pool", {.ttl = 10s, .limit = 3});
  ASSERT_TRUE(sem.ok()) << sem.status().ToString();
  auto wrong = b->TryAcquire("pool", {.ttl = 10s, .limit = 4});
  ASSERT_EQ(wrong.status().code(), StatusCode::kInvalidArgument) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("limit 3"), std::string_view::npos)
      << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("limit 4"), std::string_view::npos)
      << wrong.status().ToString();
  auto exclusive = b->TryAcquire("pool", {.ttl = 10s});
  EXPECT_EQ(exclusive.status().code(), StatusCode::kInvalidArgument)
      << exclusive.status().ToString();
  auto shared = b->TryAcquire("pool", {.ttl = 10s, .mode = LeaseMode::kShared});
  EXPECT_EQ(shared.status().code(), StatusCode::kInvalidArgument) << shared.status().ToString();
  // Waiting does not turn a refusal into a wait.
  auto waiting = b->Acquire("pool", {.ttl = 10s, .wait = 5s, .limit = 2});
  EXPECT_EQ(waiting.status().code(), StatusCode::kInvalidArgument) << waiting.status().ToString();
  // And the other way round: a semaphore on an exclusive or shared key.
  auto plain = a->TryAcquire("plain", {.ttl = 10s});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(b->TryAcquire("plain", {.ttl = 10s, .limit = 2}).status().code(),
            StatusCode::kInvalidArgument);
  auto reader = a->TryAcquire("rw", {.ttl = 10s, .mode = LeaseMode::kShared});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(b->TryAcquire("rw", {.ttl = 10s, .limit = 2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(sem->valid() && plain->valid() && reader->valid())
      << "a refused acquire leaves held leases alone";
  // Bad options never reach the store.
  EXPECT_EQ(b->TryAcquire("x", {.limit = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->TryAcquire("x", {.limit = kMaxLeaseLimit + 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->TryAcquire("x", {.limit = 2, .mode = LeaseMode::kShared}).status().code(),
            StatusCode::kInvalidArgument);
}

// The store decides as the admission rule does (src/backends/common/admission.h: the C++ stores
// call it, the Lua and SQL mirror it): every sequence of three requests of four kinds, each on
// a fresh key and under its own owner token, is granted, refused as held or refused as a
// mismatch exactly as Admit says with the grants granted before it ahead.
TEST_P(SharedLeaseTest, AdmissionFollowsTheRule) {
  using internal::Admit;
  using internal::GrantKind;
  using internal::Verdict;
  constexpr GrantKind kKinds[] = {{LeaseMode::kExclusive, 1},
                                  {LeaseMode::kShared, 1},
                                  {LeaseMode::kExclusive, 2},
                                  {LeaseMode::kExclusive, 3}};
  constexpr std::size_t kN = std::size(kKinds);
  int token = 0;
  for (std::size_t seq = 0; seq < kN * kN * kN; ++seq) {
    const std::string key = fmt::format("admission-{}", seq);
    const GrantKind asked[] = {kKinds[seq / (kN * kN)], kKinds[seq / kN % kN], kKinds[seq % kN]};
    std::vector<GrantKind> held;
    std::vector<std::string> tokens;
    for (std::size_t i = 0; i < std::size(asked); ++i) {
      const GrantKind mine = asked[i];
      const std::string what =
          fmt::format("sequence {}, request {} (mode {}, limit {})", seq, i,
                      mine.mode == LeaseMode::kShared ? "shared" : "exclusive", mine.limit);
      GrantRequest request{key, fmt::format("{:032x}", ++token), "conformance", 10s};
      request.mode = mine.mode;
      request.limit = mine.limit;
      const Verdict expected = Admit(held, mine).verdict;
      Result<internal::Grant> grant = backend_->TryAcquire(request);
      switch (expected) {
        case Verdict::kGranted:
          ASSERT_TRUE(grant.ok()) << what << ": " << grant.status().ToString();
          held.push_back(mine);
          tokens.push_back(request.owner_token);
          break;
        case Verdict::kBusy:
          ASSERT_EQ(grant.status().code(), StatusCode::kHeldByAnother)
              << what << ": " << grant.status().ToString();
          break;
        case Verdict::kMismatch:
          ASSERT_EQ(grant.status().code(), StatusCode::kInvalidArgument)
              << what << ": " << grant.status().ToString();
          break;
        case Verdict::kWriterWaiting:
          FAIL() << what << ": no writer waits here";
      }
    }
    for (const std::string& t : tokens) {
      ASSERT_TRUE(backend_->Release(key, t).ok()) << key;
    }
  }
}

TEST_P(SharedLeaseTest, ReadersCoexistAndAnExclusiveHolderExcludesThem) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  std::vector<Lease> readers;
  for (int i = 0; i < 3; ++i) {
    auto r = (i % 2 == 0 ? a : b)
                 ->TryAcquire("rw", {.ttl = 10s,
                                     .mode = LeaseMode::kShared,
                                     .holder = fmt::format("reader-{}", i)});
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    EXPECT_EQ(r->mode(), LeaseMode::kShared);
    readers.push_back(std::move(*r));
  }
  auto writer = b->TryAcquire("rw", {.ttl = 10s, .holder = "writer"});
  ASSERT_EQ(writer.status().code(), StatusCode::kHeldByAnother) << writer.status().ToString();
  for (Lease& r : readers) {
    ASSERT_TRUE(r.Release().ok());
  }
  writer = b->TryAcquire("rw", {.ttl = 10s, .holder = "writer"});
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  auto late_reader = a->TryAcquire("rw", {.ttl = 10s, .mode = LeaseMode::kShared});
  EXPECT_EQ(late_reader.status().code(), StatusCode::kHeldByAnother)
      << late_reader.status().ToString();
  ASSERT_NE(late_reader.status().holder(), nullptr);
  EXPECT_EQ(late_reader.status().holder()->holder, "writer");
  ASSERT_TRUE(writer->Release().ok());
  EXPECT_TRUE(a->TryAcquire("rw", {.ttl = 10s, .mode = LeaseMode::kShared}).ok());
}

// A shared request refused because a writer waits for the key (writer preference) names that
// writer as waiting (LeaseInfo::waiting_writer), never as a holder of the key. On a fair store
// the queue decides instead, and the refusal may name the holder or just the queue (Redis and
// etcd with fair=true); ZooKeeper names the writer queued ahead.
TEST_P(SharedLeaseTest, AReaderKeptOutByAWaitingWriterIsToldItIsAWaitingWriter) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto c = OpenHandle();
  std::atomic<bool> writer_done{false};
  std::jthread writer_thread;  // joined after the reader below is released (declared first)
  auto reader = a->TryAcquire("rw", {.ttl = 10s, .mode = LeaseMode::kShared, .holder = "reader"});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  writer_thread = std::jthread([&] {
    auto w = b->Acquire("rw", {.ttl = 10s, .wait = 10s, .holder = "writer"});
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    writer_done = true;
  });
  // Until the writer waits in the store, a late reader may still share the key with the first.
  std::optional<LeaseInfo> named;
  bool queue_named = false;  // refused for the queue, the writer unnamed
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (!named && std::chrono::steady_clock::now() < until) {
    auto late = c->TryAcquire("rw", {.ttl = 10s, .mode = LeaseMode::kShared, .holder = "late"});
    if (late.ok()) {
      ASSERT_TRUE(late->Release().ok());
    } else {
      ASSERT_EQ(late.status().code(), StatusCode::kHeldByAnother) << late.status().ToString();
      const LeaseInfo* holder = late.status().holder();
      if (holder != nullptr && holder->holder == "writer") {
        named = *holder;
      } else {
        // Refused for the queue (etcd with fair=true: "free but waiters are queued", no holder).
        EXPECT_TRUE(holder == nullptr || !holder->waiting_writer)
            << "only the writer is a waiting writer";
        queue_named = true;
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  if (named.has_value()) {
    EXPECT_TRUE(named->waiting_writer);
  } else {
    ASSERT_TRUE(backend_->capabilities().fair_queue && queue_named)
        << "no late reader was refused for the waiting writer";
  }
  EXPECT_FALSE(writer_done.load()) << "the writer still waits";
  ASSERT_TRUE(reader->Release().ok());
}

// Store::Holders lists the writer waiting for a shared key last, as waiting (no grant, fencing
// token 0), never as a holder: Inspect still names the reader; once the writer holds the key,
// it is listed as its grant and no longer as waiting. Every store with writer intents and
// ZooKeeper's queue show it; the fair queues of Redis and etcd do not.
TEST_P(SharedLeaseTest, HoldersListAWaitingWriterLastAndNotAsAHolder) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  std::atomic<bool> writer_done{false};
  std::jthread writer_thread;  // joined after the reader below is released (declared first)
  auto reader = a->TryAcquire("rw", {.ttl = 10s, .mode = LeaseMode::kShared, .holder = "reader"});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  writer_thread = std::jthread([&] {
    auto w = b->Acquire("rw", {.ttl = 10s, .wait = 10s, .holder = "writer"});
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    writer_done = true;
    if (w.ok()) {
      // Held: the writer is a grant now, and waits no more.
      auto holders = a->Holders("rw");
      ASSERT_TRUE(holders.ok()) << holders.status().ToString();
      ASSERT_EQ(holders->size(), 1U);
      EXPECT_EQ(holders->front().holder, "writer");
      EXPECT_FALSE(holders->front().waiting_writer);
      EXPECT_GT(holders->front().fencing_token, 0U);
      EXPECT_TRUE(w->Release().ok());
    }
  });
  const bool shows = !backend_->capabilities().fair_queue || backend_->scheme() == "zk";
  std::optional<LeaseInfo> writer;
  std::vector<LeaseInfo> listed;
  const auto until = std::chrono::steady_clock::now() + (shows ? 5s : 1s);
  while (!writer && std::chrono::steady_clock::now() < until) {
    auto holders = a->Holders("rw");
    ASSERT_TRUE(holders.ok()) << holders.status().ToString();
    listed = *holders;
    for (std::size_t i = 0; i < listed.size(); ++i) {
      if (listed[i].waiting_writer) {
        EXPECT_EQ(i, listed.size() - 1) << "the waiting writer is listed last";
        writer = listed[i];
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  if (shows) {
    ASSERT_TRUE(writer.has_value()) << "no waiting writer listed in 5s";
  }
  if (writer.has_value()) {
    EXPECT_EQ(writer->holder, "writer");
    EXPECT_EQ(writer->fencing_token, 0U);
    EXPECT_TRUE(writer->token_prefix.empty());
    EXPECT_GT(writer->remaining, 0ms);
    EXPECT_LE(writer->remaining, 11s);
    ASSERT_GE(listed.size(), 2U);
    EXPECT_EQ(listed.front().holder, "reader");
    EXPECT_FALSE(listed.front().waiting_writer);
  }
  auto first = a->Inspect("rw");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->holder, "reader");
  EXPECT_FALSE(writer_done.load()) << "the writer still waits";
  ASSERT_TRUE(reader->Release().ok());
  writer_thread.join();
  EXPECT_TRUE(writer_done.load());
}

// Writer preference: readers that overlap one another without a gap would hold the key for
// ever; a waiting writer must get it within about one reader's hold time.
TEST_P(SharedLeaseTest, AWaitingWriterIsNotStarvedByAStreamOfReaders) {
  constexpr int kReaders = 3;
  std::vector<std::unique_ptr<Store>> handles;
  for (int i = 0; i <= kReaders; ++i) {
    handles.push_back(OpenHandle());
  }
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0};
  std::atomic<int> concurrent_with_writer{0};
  std::atomic<bool> writer_holds{false};
  std::vector<std::jthread> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.emplace_back([&, i] {
      // Staggered so that some reader always holds the key.
      std::this_thread::sleep_for(std::chrono::milliseconds(100 * i));
      while (!stop.load()) {
        auto r = handles[i]->Acquire("rw", {.ttl = 10s,
                                            .wait = 500ms,
                                            .mode = LeaseMode::kShared,
                                            .holder = fmt::format("reader-{}", i)});
        if (!r.ok()) {
          continue;
        }
        if (writer_holds.load()) {
          ++concurrent_with_writer;
        }
        ++reads;
        std::this_thread::sleep_for(300ms);
        (void)r->Release();
      }
    });
  }
  std::this_thread::sleep_for(500ms);  // the stream is flowing
  const auto asked = std::chrono::steady_clock::now();
  auto writer = handles[kReaders]->Acquire("rw", {.ttl = 10s, .wait = 15s, .holder = "writer"});
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - asked).count();
  ASSERT_TRUE(writer.ok()) << writer.status().ToString() << " after " << waited_ms << " ms";
  writer_holds = true;
  std::this_thread::sleep_for(200ms);
  writer_holds = false;
  EXPECT_EQ(concurrent_with_writer.load(), 0) << "a reader held the key with the writer";
  ASSERT_TRUE(writer->Release().ok());
  stop = true;
  readers.clear();
  std::printf(
      "[ figure ] %s: a writer waited %.0f ms behind a stream of %d readers (300 ms each)\n",
      GetParam().name.c_str(), waited_ms, kReaders);
  EXPECT_GT(reads.load(), kReaders) << "the readers did run";
  EXPECT_LT(waited_ms, 5000) << "the writer waited far longer than one reader's hold";
}

TEST_P(SharedLeaseTest, RenewReleaseAndFencedWritesNameOneGrantAmongSeveral) {
  const std::string a = Token('a');
  const std::string b = Token('b');
  auto ga = backend_->TryAcquire(
      GrantRequest{.key = "pool", .owner_token = a, .holder = "a", .ttl = 10s, .limit = 2});
  ASSERT_TRUE(ga.ok()) << ga.status().ToString();
  auto gb = backend_->TryAcquire(
      GrantRequest{.key = "pool", .owner_token = b, .holder = "b", .ttl = 10s, .limit = 2});
  ASSERT_TRUE(gb.ok()) << gb.status().ToString();
  EXPECT_NE(ga->slot, gb->slot);
  std::vector<RenewRequest> both{{"pool", a, 10s}, {"pool", b, 10s}, {"pool", Token('c'), 10s}};
  auto renewed = backend_->RenewMany(both);
  ASSERT_EQ(renewed.size(), 3U);
  EXPECT_TRUE(renewed[0].ok()) << renewed[0].ToString();
  EXPECT_TRUE(renewed[1].ok()) << renewed[1].ToString();
  EXPECT_EQ(renewed[2].code(), StatusCode::kLost) << "a token with no grant renews nothing";
  EXPECT_EQ(backend_->Release("pool", Token('c')).code(), StatusCode::kLost);
  ASSERT_TRUE(backend_->Release("pool", a).ok());
  EXPECT_EQ(backend_->Renew({"pool", a, 10s}).code(), StatusCode::kLost);
  EXPECT_TRUE(backend_->Renew({"pool", b, 10s}).ok()) << "the other grant is still b's";
  auto holders = backend_->Holders("pool");
  ASSERT_TRUE(holders.ok()) << holders.status().ToString();
  ASSERT_EQ(holders->size(), 1U);
  EXPECT_EQ(holders->front().holder, "b");
  EXPECT_EQ(holders->front().slot, gb->slot);
  // A released permit writes nothing; the other holder's writes go through.
  auto handle = OpenHandle();
  FencedData data(GetParam(), url_, scratch_, *handle, "pool");
  const std::vector<FencedOp> ops = data.Put(*handle, data.Key("pool"), "x").ops();
  auto stale = backend_->FencedWrite({.key = "pool",
                                      .owner_token = a,
                                      .fencing_token = ga->fencing_token,
                                      .store_key = ga->store_key.empty() ? "pool" : ga->store_key,
                                      .ops = ops});
  EXPECT_EQ(stale.status().code(), StatusCode::kLost) << stale.status().ToString();
  auto live = backend_->FencedWrite({.key = "pool",
                                     .owner_token = b,
                                     .fencing_token = gb->fencing_token,
                                     .store_key = gb->store_key.empty() ? "pool" : gb->store_key,
                                     .ops = ops});
  EXPECT_TRUE(live.ok()) << live.status().ToString();
  ASSERT_TRUE(backend_->Release("pool", b).ok());
}

TEST_P(SharedLeaseTest, HoldersInspectAndListShowEveryHolderWithItsSlotAndKind) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto s0 = a->TryAcquire("pool", {.ttl = 10s, .limit = 4, .holder = "w0"});
  auto s1 = b->TryAcquire("pool", {.ttl = 10s, .limit = 4, .holder = "w1"});
  auto r0 = a->TryAcquire("rw", {.ttl = 10s, .mode = LeaseMode::kShared, .holder = "r0"});
  auto r1 = b->TryAcquire("rw", {.ttl = 10s, .mode = LeaseMode::kShared, .holder = "r1"});
  auto x = a->TryAcquire("solo", {.ttl = 10s, .holder = "x"});
  ASSERT_TRUE(s0.ok() && s1.ok() && r0.ok() && r1.ok() && x.ok())
      << s0.status().ToString() << s1.status().ToString() << r0.status().ToString()
      << r1.status().ToString() << x.status().ToString();
  auto holders = b->Holders("pool");
  ASSERT_TRUE(holders.ok()) << holders.status().ToString();
  ASSERT_EQ(holders->size(), 2U);
  EXPECT_EQ((*holders)[0].slot, 0U);
  EXPECT_EQ((*holders)[1].slot, 1U);
  EXPECT_EQ((*holders)[0].holder, "w0");
  EXPECT_EQ((*holders)[1].holder, "w1");
  for (const LeaseInfo& h : *holders) {
    EXPECT_EQ(h.limit, 4U);
    EXPECT_EQ(h.mode, LeaseMode::kExclusive);
    EXPECT_GT(h.remaining, 0ms);
  }
  EXPECT_EQ((*holders)[0].token_prefix, s0->token_prefix());
  auto first = b->Inspect("pool");
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ((*first)->holder, "w0") << "Inspect shows the holder of the lowest slot";
  auto readers = b->Holders("rw");
  ASSERT_TRUE(readers.ok());
  ASSERT_EQ(readers->size(), 2U);
  for (const LeaseInfo& h : *readers) {
    EXPECT_EQ(h.mode, LeaseMode::kShared);
  }
  auto solo = b->Holders("solo");
  ASSERT_TRUE(solo.ok());
  ASSERT_EQ(solo->size(), 1U);
  EXPECT_EQ(solo->front().mode, LeaseMode::kExclusive);
  EXPECT_EQ(solo->front().limit, 1U);
  EXPECT_TRUE(b->Holders("free")->empty());
  auto listed = b->List();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  std::vector<std::string> seen;
  for (const LeaseInfo& info : *listed) {
    seen.push_back(fmt::format("{}/{}/{}", info.key, info.holder, info.slot));
  }
  std::vector<std::string> sorted_r = {fmt::format("rw/r0/{}", r0->slot()),
                                       fmt::format("rw/r1/{}", r1->slot())};
  std::sort(sorted_r.begin(), sorted_r.end(),
            [&](const std::string& l, const std::string& r) { return l.back() < r.back(); });
  std::vector<std::string> expected = {"pool/w0/0", "pool/w1/1", sorted_r[0], sorted_r[1],
                                       "solo/x/0"};
  EXPECT_EQ(seen, expected) << "List: every grant, by key, then slot";
}

TEST_P(SharedLeaseTest, ForceReleaseGrantFreesOneHolderAndForceReleaseFreesThemAll) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto admin = OpenHandle();
  auto s0 = a->TryAcquire("pool", {.ttl = 10s, .limit = 3, .holder = "w0"});
  auto s1 = b->TryAcquire("pool", {.ttl = 10s, .limit = 3, .holder = "w1"});
  auto s2 = b->TryAcquire("pool", {.ttl = 10s, .limit = 3, .holder = "w2"});
  ASSERT_TRUE(s0.ok() && s1.ok() && s2.ok());
  auto one = admin->ForceReleaseGrant("pool", s1->token_prefix());
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_TRUE(*one);
  auto again = admin->ForceReleaseGrant("pool", s1->token_prefix());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(*again) << "the grant is gone";
  auto holders = admin->Holders("pool");
  ASSERT_TRUE(holders.ok());
  ASSERT_EQ(holders->size(), 2U);
  EXPECT_EQ((*holders)[0].holder, "w0");
  EXPECT_EQ((*holders)[1].holder, "w2");
  EXPECT_EQ(admin->ForceReleaseGrant("pool", "XYZ").status().code(), StatusCode::kInvalidArgument);
  auto all = admin->ForceRelease("pool");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(*all);
  EXPECT_TRUE(admin->Holders("pool")->empty());
  // The holders find out at their next renewal.
  for (Lease* lease : {&*s0, &*s2}) {
    EXPECT_EQ(lease->Release().code(), StatusCode::kLost);
  }
}

TEST_P(SharedLeaseTest, AWaiterIsWokenWhenAnyOneHolderLeaves) {
  auto a = OpenHandle();
  auto b = OpenHandle();
  auto s0 = a->TryAcquire("pool", {.ttl = 30s, .limit = 2});
  auto s1 = a->TryAcquire("pool", {.ttl = 30s, .limit = 2});
  ASSERT_TRUE(s0.ok() && s1.ok());
  std::atomic<bool> granted{false};
  std::chrono::steady_clock::time_point released_at;
  std::jthread waiter([&] {
    auto lease = b->Acquire("pool", {.ttl = 30s, .wait = 20s, .limit = 2});
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    granted = lease.ok();
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(granted.load());
  released_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(s1->Release().ok());
  waiter.join();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - released_at)
          .count();
  std::printf("[ figure ] %s: a semaphore waiter got a freed permit %.1f ms after the release\n",
              GetParam().name.c_str(), ms);
  EXPECT_TRUE(granted.load());
  EXPECT_LT(ms, 5000) << "woken by the release, long before any TTL";
}

TEST_P(SharedLeaseTest, ACrashedHoldersPermitReturnsWhenItsHolderIsKnownGoneElseAtItsTtl) {
  if (backend_->capabilities().scope == StoreScope::kProcess) {
    GTEST_SKIP() << GetParam().name << " is confined to one process";
  }
  auto handle = OpenHandle();
  auto mine = handle->TryAcquire("pool", {.ttl = 10s, .limit = 2});
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  Child holder({LEASE_HOLDER_PATH, url_, "pool", "hold", "2000", "60000", "limit=2"});
  std::string line = holder.ReadLine();
  unsigned long long fence = 0;
  double granted_ms = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "acquired %llu %lf", &fence, &granted_ms), 2) << line;
  kill(holder.pid(), SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  if (backend_->capabilities().holder_liveness) {
    // The store knows the holder is gone: its permit comes back at once, to a waiter too.
    auto taken = handle->Acquire("pool", {.ttl = 10s, .wait = 10s, .limit = 2});
    ASSERT_TRUE(taken.ok()) << taken.status().ToString();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed_at)
            .count();
    std::printf(
        "[ figure ] %s: a kill -9'd holder's permit (granted %.0f ms) came back after "
        "%.0f ms (holder liveness)\n",
        GetParam().name.c_str(), granted_ms, ms);
    EXPECT_LT(ms, granted_ms / 2) << "at once: the holder's process is gone";
    EXPECT_GT(taken->fencing_token(), fence);
    return;
  }
  // Never earlier: the dead holder's permit is still counted until its TTL runs out.
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(granted_ms / 2)));
  auto early = handle->TryAcquire("pool", {.ttl = 10s, .limit = 2});
  EXPECT_EQ(early.status().code(), StatusCode::kHeldByAnother)
      << "a permit came back before its holder's TTL: " << early.status().ToString();
  auto taken = handle->Acquire("pool", {.ttl = 10s, .wait = 10s, .limit = 2});
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed_at)
          .count();
  std::printf(
      "[ figure ] %s: a kill -9'd holder's permit (granted %.0f ms) came back after %.0f ms\n",
      GetParam().name.c_str(), granted_ms, ms);
  EXPECT_GE(ms, granted_ms * 0.9);
  EXPECT_LT(ms, granted_ms + 1000) << "within the granted ttl + 1 s";
  EXPECT_GT(taken->fencing_token(), fence);
}

TEST_P(SharedLeaseTest, FairStoresServeSemaphoreAndReadWriteWaitersInQueueOrder) {
  if (!backend_->capabilities().fair_queue) {
    GTEST_SKIP() << GetParam().name << " does not queue waiters";
  }
  auto holder_handle = OpenHandle();
  auto h0 = holder_handle->TryAcquire("fair", {.ttl = 10s, .limit = 2});
  auto h1 = holder_handle->TryAcquire("fair", {.ttl = 10s, .limit = 2});
  ASSERT_TRUE(h0.ok() && h1.ok());
  constexpr int kWaiters = 4;
  std::vector<std::unique_ptr<Store>> handles;
  for (int i = 0; i < kWaiters; ++i) {
    handles.push_back(OpenHandle());
  }
  std::mutex mu;
  // The store's grant order is its fencing tokens' order (one counter per key): two permits
  // freed back to back grant two waiters at once, and their Acquire calls may return in either
  // order on a loaded machine.
  std::vector<std::pair<FencingToken, int>> granted;
  std::vector<std::jthread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      auto lease = handles[i]->Acquire("fair", {.ttl = 10s, .wait = 20s, .limit = 2});
      ASSERT_TRUE(lease.ok()) << lease.status().ToString();
      {
        std::lock_guard<std::mutex> lock(mu);
        granted.emplace_back(lease->fencing_token(), i);
      }
      std::this_thread::sleep_for(100ms);
      EXPECT_TRUE(lease->Release().ok());
    });
    std::this_thread::sleep_for(150ms);  // queue in a known order
  }
  ASSERT_TRUE(h0->Release().ok());
  auto barge = holder_handle->TryAcquire("fair", {.ttl = 10s, .limit = 2});
  EXPECT_EQ(barge.status().code(), StatusCode::kHeldByAnother) << "a releaser barged ahead";
  if (barge.ok()) {
    (void)barge->Release();
  }
  ASSERT_TRUE(h1->Release().ok());
  waiters.clear();
  std::sort(granted.begin(), granted.end());
  std::vector<int> order;
  for (const auto& [token, waiter] : granted) {
    order.push_back(waiter);
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}))
      << "semaphore waiters out of queue order (by fencing token)";

  // Read/write: a reader queued behind a waiting writer waits for it.
  auto reader = holder_handle->TryAcquire("fair-rw", {.ttl = 10s, .mode = LeaseMode::kShared});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  order.clear();
  std::jthread writer([&] {
    auto lease = handles[0]->Acquire("fair-rw", {.ttl = 10s, .wait = 20s});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(0);
    }
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(lease->Release().ok());
  });
  std::this_thread::sleep_for(200ms);
  std::jthread late_reader([&] {
    auto lease =
        handles[1]->Acquire("fair-rw", {.ttl = 10s, .wait = 20s, .mode = LeaseMode::kShared});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(1);
  });
  std::this_thread::sleep_for(200ms);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(order.empty()) << "a reader went ahead of the queued writer";
  }
  ASSERT_TRUE(reader->Release().ok());
  writer.join();
  late_reader.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
}

// The limit among processes that race for the key, with random kill -9s: on one host the
// children's CLOCK_MONOTONIC windows (from the grant to before the release) can be compared, and
// at no instant may more than N be open. LEASEHOLD_CONFORMANCE_RACE_SECONDS sets the length
// (CI: 4 s; by hand: 30, the issue's figure).
TEST_P(SharedLeaseTest, RacingProcessesNeverExceedTheLimitThroughRandomKills) {
  if (backend_->capabilities().scope == StoreScope::kProcess) {
    GTEST_SKIP() << GetParam().name << " is confined to one process";
  }
  constexpr int kLimit = 3;
  constexpr int kProcesses = 6;
  const char* env = std::getenv("LEASEHOLD_CONFORMANCE_RACE_SECONDS");
  const int seconds = env != nullptr ? std::max(1, std::atoi(env)) : 4;

  struct Window {
    long long start = 0;
    long long end = 0;
    unsigned long long fence = 0;
    unsigned slot = 0;
  };

  std::mutex mu;
  std::vector<Window> windows;
  auto now_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
  };
  std::atomic<int> kills{0};
  const unsigned kill_span_ms = backend_->capabilities().fair_queue ? 4000U : 1200U;
  // The race runs for `seconds`, and on until more grants than the limit were seen (at most 4
  // times as long): on a fair store a killed waiter holds its place in the queue until its TTL
  // ends, and on a busy machine 4 s gave as few as 2 grants.
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + std::chrono::seconds(seconds);
  const auto hard_until = start + std::chrono::seconds(4 * seconds);
  auto racing = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (now < until) {
      return true;
    }
    std::lock_guard<std::mutex> lock(mu);
    return now < hard_until && windows.size() <= static_cast<std::size_t>(kLimit);
  };
  std::vector<std::jthread> runners;
  for (int p = 0; p < kProcesses; ++p) {
    runners.emplace_back([&, p] {
      std::mt19937 rng(static_cast<unsigned>(p) * 7919U + 1U);
      while (racing()) {
        const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(
                                              hard_until - std::chrono::steady_clock::now())
                                              .count()) +
                         1;
        auto child = std::make_unique<Child>(
            std::vector<std::string>{LEASE_HOLDER_PATH, url_, "race", "race", "1000",
                                     std::to_string(left), fmt::format("limit={}", kLimit)});
        // Killed after 0.3..1.5 s, mid-hold or not; on a fair store after 0.3..4.3 s: a killed
        // waiter keeps its place in the queue until its entry expires (etcd: 2 s for a TTL of
        // 1 s), so waiters that all die sooner than that starve each other behind dead entries
        // (a fresh-clone CI run: 1 grant in 17 s, 108 kills, on etcd_fair).
        const auto kill_at = std::chrono::steady_clock::now() +
                             std::chrono::milliseconds(300 + rng() % kill_span_ms);
        std::atomic<bool> killed{false};
        std::atomic<long long> killed_ns{0};
        std::jthread killer([&](std::stop_token st) {
          while (!st.stop_requested() && std::chrono::steady_clock::now() < kill_at) {
            std::this_thread::sleep_for(5ms);
          }
          if (!st.stop_requested()) {
            killed = true;
            killed_ns = now_ns();
            kill(child->pid(), SIGKILL);
          }
        });
        std::optional<Window> open;
        while (true) {
          std::string line = child->ReadLine();
          if (line.empty() || line == "done") {
            break;
          }
          Window w;
          if (std::sscanf(line.c_str(), "start %lld %llu %u", &w.start, &w.fence, &w.slot) == 3) {
            open = w;
          } else if (open.has_value() && std::sscanf(line.c_str(), "end %lld", &w.end) == 1) {
            open->end = w.end;
            std::lock_guard<std::mutex> lock(mu);
            windows.push_back(*open);
            open.reset();
          } else {
            ADD_FAILURE() << "lease_holder: " << line;
          }
        }
        killer.request_stop();
        killer.join();
        (void)child->Wait();
        if (open.has_value()) {
          // Killed while holding: its window ends with the process. The kill is taken as its
          // end (SIGKILL is delivered within microseconds, and the child prints nothing more),
          // not the moment this thread notices the death: a store that frees a dead holder's
          // grant at once (holder_liveness) may grant it again before then, and the window would
          // overlap the next holder's by this thread's own lag.
          open->end = killed ? killed_ns.load() : now_ns();
          std::lock_guard<std::mutex> lock(mu);
          windows.push_back(*open);
        }
        if (killed) {
          ++kills;
        }
      }
    });
  }
  runners.clear();
  std::vector<std::pair<long long, int>> events;
  std::set<unsigned long long> fences;
  for (const Window& w : windows) {
    events.emplace_back(w.start, +1);
    events.emplace_back(w.end, -1);
    EXPECT_LT(w.slot, static_cast<unsigned>(kLimit));
    EXPECT_TRUE(fences.insert(w.fence).second) << "fencing token " << w.fence << " granted twice";
  }
  // Ends sort before starts at the same instant: touching windows do not overlap.
  std::sort(events.begin(), events.end());
  int open_now = 0;
  int most = 0;
  for (const auto& [t, delta] : events) {
    open_now += delta;
    most = std::max(most, open_now);
  }
  // Two windows open at once never share a slot.
  for (std::size_t i = 0; i < windows.size(); ++i) {
    for (std::size_t j = i + 1; j < windows.size(); ++j) {
      const Window& x = windows[i];
      const Window& y = windows[j];
      if (x.start < y.end && y.start < x.end) {
        EXPECT_NE(x.slot, y.slot) << "two live grants in slot " << x.slot;
      }
    }
  }
  const double raced_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "[ figure ] %s: %zu grants by %d racing processes over %.1f s (%d kill -9s), at "
      "most %d of limit %d at once\n",
      GetParam().name.c_str(), windows.size(), kProcesses, raced_seconds, kills.load(), most,
      kLimit);
  EXPECT_LE(most, kLimit) << "the limit was exceeded";
  // More than one process was granted the key. (Past the limit's count is what the racing runs
  // on for, at most 4 times its length.)
  EXPECT_GE(windows.size(), 2U) << "the processes did race";
}

INSTANTIATE_TEST_SUITE_P(AllBackends, SharedLeaseTest,
                         ::testing::ValuesIn(testing::AllStoreFixtures()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace leasehold
