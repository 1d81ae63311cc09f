// The etcd:// backend reads time only from the Clock it was opened with: a deadline the core
// computes on its clock is compared with that clock, and a spare lease's age is judged on it.
// The tests open the backend directly on a FakeClock set a day ahead of the real clock, so a
// reading of the real clock anywhere on these paths would show. (Store::Open refuses a
// FakeClock for etcd://, whose leases expire on the server's clock; see backends/registry.cc.)

#include <unistd.h>

#include <chrono>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "leasehold/testing/fake_clock.h"

#include "backends/etcd/etcd_backend.h"
#include "backends/etcd/etcd_options.h"
#include "core/url.h"
#include "testing/etcd_server.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using internal::EtcdBackend;
using internal::EtcdOptions;
using testing::EtcdCluster;

std::string Token(int i) {
  return fmt::format("{:032x}", i + 1);
}

class EtcdClockTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto started = EtcdCluster::Start();
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    cluster_ = std::move(started).value().release();
  }

  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  // A backend on `clock_`, with a prefix of its own.
  std::shared_ptr<EtcdBackend> Open(const std::string& query = "") {
    static int n = 0;
    auto url = internal::ParseUrl(
        fmt::format("{}?prefix=etcd-clock-test-{}-{}{}", cluster_->Url(), getpid(), ++n, query));
    EXPECT_TRUE(url.ok()) << url.status().ToString();
    auto options = EtcdOptions::FromUrl(*url);
    EXPECT_TRUE(options.ok()) << options.status().ToString();
    auto backend = EtcdBackend::Open(*options, clock_);
    EXPECT_TRUE(backend.ok()) << backend.status().ToString();
    return backend.ok() ? *backend : nullptr;
  }

  static EtcdCluster* cluster_;
  testing::FakeClock clock_{Clock::Real().Now() + 24h};
};

EtcdCluster* EtcdClockTest::cluster_ = nullptr;

TEST_F(EtcdClockTest, WaitForChangeDeadlineIsComparedWithTheBackendsClock) {
  auto backend = Open();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire({"job", Token(1), "holder", 30s}).ok());
  // The deadline has come on the backend's clock, though it is a day away on the real one. A
  // guard stops the wait if the deadline were read against the real clock (kCancelled then).
  std::stop_source guard;
  std::jthread stopper([&guard](std::stop_token done) {
    for (int i = 0; i < 200 && !done.stop_requested(); ++i) {
      std::this_thread::sleep_for(100ms);
    }
    guard.request_stop();
  });
  Status s = backend->WaitForChange("job", clock_.Now(), guard.get_token());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  stopper.request_stop();
}

TEST_F(EtcdClockTest, SpareLeaseAgeIsMeasuredOnTheBackendsClock) {
  auto backend = Open();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire({"held", Token(1), "holder", 10s}).ok());
  // The holder's shared lease serves the conflict and the next acquire; it is stamped with the
  // (still) clock.
  EXPECT_EQ(backend->TryAcquire({"held", Token(2), "t", 10s}).status().code(),
            StatusCode::kHeldByAnother);
  clock_.Advance(2s);
  const EtcdBackend::Stats before = backend->stats();
  auto grant = backend->TryAcquire({"other", Token(3), "t", 10s});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(backend->stats().spare_used - before.spare_used, 1u);
  EXPECT_EQ(grant->ttl, 8s) << "the shared lease's TTL less its age on the backend's clock";
}

TEST_F(EtcdClockTest, ASharedLeaseOlderThanAThirdOfItsTtlOnTheBackendsClockIsRefreshedFirst) {
  auto backend = Open();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire({"held", Token(1), "holder", 10s}).ok());
  EXPECT_EQ(backend->TryAcquire({"held", Token(2), "t", 10s}).status().code(),
            StatusCode::kHeldByAnother);
  clock_.Advance(4s);  // a shared lease of 10 s is used as it is only while 2/3 of it is left
  const EtcdBackend::Stats before = backend->stats();
  auto grant = backend->TryAcquire({"other", Token(3), "t", 10s});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  const EtcdBackend::Stats after = backend->stats();
  EXPECT_EQ(after.spare_used - before.spare_used, 1u) << "still the shared lease";
  EXPECT_EQ(after.lease_grant - before.lease_grant, 0u);
  EXPECT_EQ(after.keepalive_requests - before.keepalive_requests, 1u) << "refreshed first";
  EXPECT_EQ(grant->ttl, 10s) << "refreshed by a keep-alive sent after the call began";
}

}  // namespace
}  // namespace leasehold
