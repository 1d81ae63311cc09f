// File: tests/backends/postgres/postgres_clock_step_test.cc
//
// A step of the PostgreSQL server's wall clock during a hold, in table mode, where expires_at is
// judged by clock_timestamp(): the server runs under libfaketime (LD_PRELOAD, its offset read
// from FAKETIME_TIMESTAMP_FILE at every call with FAKETIME_NO_CACHE=1, the monotonic clocks
// left alone), and the test steps it forward by 2 x TTL while a lease is held. The grant is
// then expired on the server at once; the holder's handle must notice the step within one renew
// interval (leasehold_store_clock_jumps_total, backends/common/store_clock.h) and steady
// renewals must count none. How many leases were then lost, and how many of those with a reason
// naming the step, is printed: a renewal whose statement straddles the step can still take.
// Runs: LEASEHOLD_CLOCK_STEP_RUNS (default 20). Prints "pg-clock-step: ..." (the README's
// "Clock steps on the store's server" quotes it).

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "leasehold/metrics.h"
#include "leasehold/store.h"

#include "testing/postgres_server.h"
#include "testing/prometheus_text.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using SteadyNow = std::chrono::steady_clock;

constexpr const char* kFakeTime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

// The server's wall clock, in seconds since the Unix epoch.
std::optional<double> ServerEpoch(const testing::PostgresServer& server) {
  auto out = server.Psql("SELECT extract(epoch FROM clock_timestamp())");
  if (!out.ok()) {
    return std::nullopt;
  }
  return std::atof(out->c_str());
}

double WallEpoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(PostgresClockStepTest, AForwardStepOfTheServersClockIsDetectedWithinOneRenewInterval) {
  ASSERT_TRUE(std::filesystem::exists(kFakeTime))
      << kFakeTime << " is missing: apt-get install faketime (scripts/install-deps.sh does)";
  char dir_template[] = "/tmp/leasehold-faketime-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  chmod(dir.c_str(), 0755);  // the server runs as postgres
  const std::string offset_file = dir + "/offset";
  // Whole seconds: libfaketime's relative offsets ("+N").
  auto set_offset = [&](long long seconds) {
    std::ofstream(offset_file, std::ios::trunc) << fmt::format("{:+d}", seconds) << "\n";
  };
  set_offset(0);
  chmod(offset_file.c_str(), 0644);
  auto server = testing::PostgresServer::Start(
      {.env = {std::string("LD_PRELOAD=") + kFakeTime, "FAKETIME_TIMESTAMP_FILE=" + offset_file,
               "FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1"}});
  ASSERT_TRUE(server.ok()) << server.status().ToString();

  // The control: the server's clock follows the file live.
  std::optional<double> before = ServerEpoch(**server);
  ASSERT_TRUE(before.has_value());
  EXPECT_LT(std::abs(*before - WallEpoch()), 1.0);
  set_offset(100);
  std::optional<double> ahead = ServerEpoch(**server);
  ASSERT_TRUE(ahead.has_value());
  EXPECT_GT(*ahead - WallEpoch(), 99.0) << "libfaketime did not step the server's clock";
  set_offset(0);

  const char* runs_env = std::getenv("LEASEHOLD_CLOCK_STEP_RUNS");
  const int runs = runs_env != nullptr ? std::atoi(runs_env) : 20;
  const Duration ttl = 500ms;
  const Duration renew_interval = ttl / 3;
  auto store = Store::Open((*server)->Url() + "?mode=table&schema=clock_step");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  long long offset = 0;
  int detected = 0;  // the step counted within one renew interval (and its round trip)
  int lost = 0;      // the lease was lost within 3 x TTL of the step
  int named = 0;     // ... with a lost reason that names the step
  Duration slowest{};
  auto jumps = [&] {
    return testing::BackendCounter((*store)->metrics()->PrometheusText(),
                                   "leasehold_store_clock_jumps_total", "postgres");
  };
  for (int i = 0; i < runs; ++i) {
    std::mutex mu;
    std::optional<std::string> reason;
    auto lease = (*store)->TryAcquire(fmt::format("step-{}", i),
                                      {.ttl = ttl, .on_lost = [&](const Status& why) {
                                         std::lock_guard lock(mu);
                                         reason = std::string(why.message());
                                       }});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    std::this_thread::sleep_for(2 * renew_interval);  // a few steady renewals
    ASSERT_TRUE(lease->valid()) << lease->lost_reason().ToString();
    const long long counted = jumps();
    EXPECT_EQ(counted, i) << "steady renewals counted a step";
    offset += 1;  // 2 x TTL
    set_offset(offset);
    const auto stepped_at = SteadyNow::now();
    std::optional<Duration> took;
    while (SteadyNow::now() - stepped_at < 3 * ttl) {
      if (!took.has_value() && jumps() > counted) {
        took = SteadyNow::now() - stepped_at;
      }
      {
        std::lock_guard lock(mu);
        if (took.has_value() && reason.has_value()) {
          break;
        }
      }
      std::this_thread::sleep_for(2ms);
    }
    if (took.has_value()) {
      slowest = std::max(slowest, *took);
      detected += *took <= renew_interval + 100ms ? 1 : 0;
    }
    EXPECT_TRUE(took.has_value()) << "run " << i << ": the step went unnoticed";
    std::lock_guard lock(mu);
    if (reason.has_value()) {
      ++lost;
      named += reason->find("the store's clock jumped forward by") != std::string::npos ? 1 : 0;
    }
  }
  std::printf(
      "pg-clock-step: runs=%d step=+1s(2xTTL) ttl_ms=500 renew_interval_ms=166 "
      "detected_within_one_renew_interval=%d slowest_detection_ms=%.0f lost_within_3xTTL=%d "
      "lost_reason_names_the_step=%d leasehold_store_clock_jumps_total=%lld\n",
      runs, detected, std::chrono::duration<double, std::milli>(slowest).count(), lost, named,
      jumps());
  EXPECT_EQ(detected, runs);
  EXPECT_EQ(jumps(), runs) << "one per step, none from steady renewals";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace leasehold
