// The zk:// backend reads time only from the Clock it was opened with: a wait's deadline is
// compared with that clock, and a grant's local deadline (after which the reaper deletes its
// node, and a late renewal is refused) is set and judged on it. The tests open the backend
// directly on a FakeClock set a day ahead of the real clock, and sessions long enough (60 s)
// that a real-clock reading anywhere on these paths would show. (Store::Open refuses a FakeClock
// for zk://, whose sessions expire on the server's clock; see backends/registry.cc.)

#include <unistd.h>

#include <chrono>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "leasehold/testing/fake_clock.h"

#include "backends/zookeeper/zk_backend.h"
#include "backends/zookeeper/zk_options.h"
#include "core/url.h"
#include "testing/zk_server.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using internal::ZkBackend;
using internal::ZkOptions;
using testing::ZkEnsemble;

std::string Token(int i) {
  return fmt::format("{:032x}", i + 1);
}

class ZkClockTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto started = ZkEnsemble::Start({.tick_time = 200ms, .max_session = 60'000ms});
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    zk_ = std::move(started).value().release();
  }

  static void TearDownTestSuite() {
    delete zk_;
    zk_ = nullptr;
  }

  void SetUp() override { ASSERT_NE(zk_, nullptr); }

  // A backend on `clock_`, under a chroot of this test's own.
  std::shared_ptr<ZkBackend> Open() {
    auto url = internal::ParseUrl(zk_->Url(fmt::format("/zk-clock-test-{}-{}", getpid(), n_)));
    EXPECT_TRUE(url.ok()) << url.status().ToString();
    auto options = ZkOptions::FromUrl(*url);
    EXPECT_TRUE(options.ok()) << options.status().ToString();
    auto backend = ZkBackend::Open(*options, clock_);
    EXPECT_TRUE(backend.ok()) << backend.status().ToString();
    return backend.ok() ? *backend : nullptr;
  }

  static ZkEnsemble* zk_;
  static inline int next_n_ = 0;
  const int n_ = ++next_n_;
  testing::FakeClock clock_{Clock::Real().Now() + 24h};
};

ZkEnsemble* ZkClockTest::zk_ = nullptr;

TEST_F(ZkClockTest, WaitForChangeDeadlineIsComparedWithTheBackendsClock) {
  auto holder = Open();
  auto waiter = Open();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(waiter, nullptr);
  ASSERT_TRUE(holder->TryAcquire({"job", Token(1), "holder", 60s, ""}).ok());
  // The deadline has come on the backend's clock, though it is a day away on the real one. A
  // guard stops the wait if the deadline were read against the real clock (kCancelled then).
  std::stop_source guard;
  std::jthread stopper([&guard](std::stop_token done) {
    for (int i = 0; i < 200 && !done.stop_requested(); ++i) {
      std::this_thread::sleep_for(100ms);
    }
    guard.request_stop();
  });
  Status s = waiter->WaitForChange("job", clock_.Now(), guard.get_token());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  stopper.request_stop();
}

TEST_F(ZkClockTest, ARenewalConfirmedAfterTheGrantsDeadlineOnTheBackendsClockIsLost) {
  auto backend = Open();
  ASSERT_NE(backend, nullptr);
  auto grant = backend->TryAcquire({"job", Token(1), "holder", 60s, ""});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  ASSERT_EQ(grant->ttl, 60s);
  EXPECT_TRUE(backend->Renew({"job", Token(1), 60s}).ok());
  // A minute on the backend's clock, none on the real one: the grant's local deadline passed,
  // though the session (timed by the server, in real time) is alive.
  clock_.Advance(61s);
  Status s = backend->Renew({"job", Token(1), 60s});
  EXPECT_EQ(s.code(), StatusCode::kLost) << s.ToString();
  EXPECT_EQ(s.lost_cause(), LostCause::kExpired) << s.ToString();
}

TEST_F(ZkClockTest, TheReaperFreesAGrantPastItsDeadlineOnTheBackendsClock) {
  auto holder = Open();
  auto other = Open();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(holder->TryAcquire({"job", Token(1), "holder", 60s, ""}).ok());
  EXPECT_EQ(other->TryAcquire({"job", Token(2), "other", 60s, ""}).status().code(),
            StatusCode::kHeldByAnother);
  clock_.Advance(61s);
  // The reaper looks again within a second of real time and deletes the node: long before the
  // 60 s a reaper on the real clock would wait.
  Status last;
  for (int i = 0; i < 100; ++i) {
    auto grant = other->TryAcquire({"job", Token(2), "other", 60s, ""});
    last = grant.status();
    if (grant.ok()) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(last.ok()) << last.ToString();
}

}  // namespace
}  // namespace leasehold
