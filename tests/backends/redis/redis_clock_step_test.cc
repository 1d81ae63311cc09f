// File: tests/backends/redis/redis_clock_step_test.cc
//
// A step of the Redis server's wall clock during a hold, as the holder's handle sees it. Debian's
// redis-server does not start under libfaketime (its jemalloc calls clock_gettime while
// libfaketime initialises), so the step is made on the wire: a TCP proxy in front of a real
// redis-server pairs every reply with its command and adds the test's offset to the seconds of
// each TIME reply; every other byte passes unchanged. The renewals' round trips carry TIME
// (RedisBackend::RenewMany); a step of 2 x TTL must be noticed within one renew interval
// (leasehold_store_clock_jumps_total, backends/common/store_clock.h), steady renewals must count
// none, and a lease whose renewal was confirmed in the very round trip that saw the step stays
// held (the server itself did not step, so its keys did not expire: LeaseCore::OnStoreClockStep
// leaves alone what that round trip renewed). PostgreSQL's test steps the real server clock
// (tests/backends/postgres/postgres_clock_step_test.cc).
// Runs: LEASEHOLD_CLOCK_STEP_RUNS (default 20). Prints "redis-clock-step: ..." (the README's
// "The store's own clock" quotes it).

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "leasehold/metrics.h"
#include "leasehold/store.h"

#include "testing/prometheus_text.h"
#include "testing/redis_server.h"
#include "testing/tcp_proxy.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using SteadyNow = std::chrono::steady_clock;

// The end of the RESP2 value that starts at `at` in `bytes`, or nullopt if it is not all there.
std::optional<std::size_t> RespEnd(std::string_view bytes, std::size_t at) {
  const std::size_t eol = bytes.find("\r\n", at);
  if (at >= bytes.size() || eol == std::string_view::npos) {
    return std::nullopt;
  }
  const long long n = std::atoll(std::string(bytes.substr(at + 1, eol - at - 1)).c_str());
  std::size_t next = eol + 2;
  switch (bytes[at]) {
    case '$':
      if (n >= 0) {
        next += static_cast<std::size_t>(n) + 2;
      }
      return next <= bytes.size() ? std::optional(next) : std::nullopt;
    case '*':
      for (long long i = 0; i < n; ++i) {
        std::optional<std::size_t> end = RespEnd(bytes, next);
        if (!end.has_value()) {
          return std::nullopt;
        }
        next = *end;
      }
      return next;
    default:  // + - : and inline commands: one line
      return next;
  }
}

// The bulk strings of a RESP2 array of bulk strings (a command, or TIME's reply).
std::vector<std::string> BulkStrings(std::string_view value) {
  std::vector<std::string> out;
  std::size_t at = value.find("\r\n");
  while (at != std::string_view::npos && at + 3 < value.size() && value[at + 2] == '$') {
    const std::size_t eol = value.find("\r\n", at + 2);
    const auto n = static_cast<std::size_t>(
        std::atoll(std::string(value.substr(at + 3, eol - at - 3)).c_str()));
    out.emplace_back(value.substr(eol + 2, n));
    at = eol + 2 + n;
  }
  return out;
}

// Adds `offset` seconds to every TIME reply of one connection.
class TimeShiftingFilter : public testing::TcpProxyFilter {
 public:
  explicit TimeShiftingFilter(const std::atomic<long long>& offset) : offset_(offset) {}

  std::string FromClient(std::string_view bytes) override {
    requests_.append(bytes);
    while (std::optional<std::size_t> end = RespEnd(requests_, 0)) {
      std::vector<std::string> words = BulkStrings(std::string_view(requests_).substr(0, *end));
      commands_.push_back(words.empty() ? std::string() : words.front());
      requests_.erase(0, *end);
    }
    return std::string(bytes);
  }

  std::string FromServer(std::string_view bytes) override {
    replies_.append(bytes);
    std::string out;
    while (std::optional<std::size_t> end = RespEnd(replies_, 0)) {
      std::string reply = replies_.substr(0, *end);
      replies_.erase(0, *end);
      std::string command;
      if (!commands_.empty()) {
        command = std::move(commands_.front());
        commands_.pop_front();
      }
      std::vector<std::string> parts = BulkStrings(reply);
      if ((command == "TIME" || command == "time") && parts.size() == 2) {
        const std::string seconds = std::to_string(std::atoll(parts[0].c_str()) + offset_.load());
        reply = fmt::format("*2\r\n${}\r\n{}\r\n${}\r\n{}\r\n", seconds.size(), seconds,
                            parts[1].size(), parts[1]);
      }
      out += reply;
    }
    return out;
  }

 private:
  const std::atomic<long long>& offset_;
  std::string requests_;  // an incomplete command
  std::string replies_;   // an incomplete reply
  std::deque<std::string> commands_;
};

TEST(RedisRespTest, ValuesEndWhereTheyEnd) {
  EXPECT_EQ(RespEnd("+OK\r\n", 0), 5u);
  EXPECT_EQ(RespEnd("+OK\r", 0), std::nullopt);
  EXPECT_EQ(RespEnd("$-1\r\n", 0), 5u);
  EXPECT_EQ(RespEnd("$3\r\nabc\r\n:1\r\n", 0), 9u);
  EXPECT_EQ(RespEnd("$3\r\nab", 0), std::nullopt);
  EXPECT_EQ(RespEnd("*2\r\n$1\r\na\r\n*1\r\n:5\r\n", 0), 19u);
  EXPECT_EQ(RespEnd("*2\r\n$1\r\na\r\n", 0), std::nullopt);
  EXPECT_EQ(BulkStrings("*2\r\n$10\r\n1733500000\r\n$6\r\n123456\r\n"),
            (std::vector<std::string>{"1733500000", "123456"}));
}

TEST(RedisClockStepTest, AForwardStepInTimesRepliesIsDetectedWithinOneRenewInterval) {
  auto server = testing::RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::atomic<long long> offset{0};
  std::atomic<int> connections{0};
  testing::TcpProxy proxy({.upstream_port = (*server)->port(), .filter = [&] {
                             ++connections;
                             return std::make_unique<TimeShiftingFilter>(offset);
                           }});
  auto store = Store::Open(fmt::format("redis://127.0.0.1:{}/", proxy.port()));
  ASSERT_TRUE(store.ok()) << store.status().ToString();

  const char* runs_env = std::getenv("LEASEHOLD_CLOCK_STEP_RUNS");
  const int runs = runs_env != nullptr ? std::atoi(runs_env) : 20;
  const Duration ttl = 500ms;
  const Duration renew_interval = ttl / 3;
  int detected = 0;  // the step counted within one renew interval (and its round trip)
  int held = 0;      // the lease still valid 3 x TTL after the step
  Duration slowest{};
  auto jumps = [&] {
    return testing::BackendCounter((*store)->metrics()->PrometheusText(),
                                   "leasehold_store_clock_jumps_total", "redis");
  };
  for (int i = 0; i < runs; ++i) {
    auto lease = (*store)->TryAcquire(fmt::format("step-{}", i), {.ttl = ttl});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    std::this_thread::sleep_for(2 * renew_interval);  // a few steady renewals
    ASSERT_TRUE(lease->valid()) << lease->lost_reason().ToString();
    const long long counted = jumps();
    EXPECT_EQ(counted, i) << "steady renewals counted a step";
    offset += 1;  // 2 x TTL
    const auto stepped_at = SteadyNow::now();
    std::optional<Duration> took;
    while (!took.has_value() && SteadyNow::now() - stepped_at < 3 * ttl) {
      if (jumps() > counted) {
        took = SteadyNow::now() - stepped_at;
      }
      std::this_thread::sleep_for(2ms);
    }
    EXPECT_TRUE(took.has_value()) << "run " << i << ": the step went unnoticed";
    if (took.has_value()) {
      slowest = std::max(slowest, *took);
      detected += *took <= renew_interval + 100ms ? 1 : 0;
    }
    std::this_thread::sleep_for(renew_interval);
    held += lease->valid() ? 1 : 0;
    EXPECT_TRUE(lease->valid()) << "run " << i << ": " << lease->lost_reason().ToString();
    EXPECT_TRUE(lease->Release().ok());
  }
  std::printf(
      "redis-clock-step: runs=%d step=+1s(2xTTL, TIME replies rewritten by a proxy) ttl_ms=500 "
      "renew_interval_ms=166 detected_within_one_renew_interval=%d slowest_detection_ms=%.0f "
      "still_held=%d leasehold_store_clock_jumps_total=%lld proxied_connections=%d\n",
      runs, detected, std::chrono::duration<double, std::milli>(slowest).count(), held, jumps(),
      connections.load());
  EXPECT_EQ(detected, runs);
  EXPECT_EQ(jumps(), runs);
}

}  // namespace
}  // namespace leasehold
