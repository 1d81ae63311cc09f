// The backend toolkit every store reads its URL and paces its reconnects with
// (src/backends/common/): one rule and one message format for all of them.

#include <optional>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "leasehold/testing/fake_clock.h"

#include "backends/common/host_port.h"
#include "backends/common/store_clock.h"
#include "backends/common/time.h"
#include "backends/common/url_params.h"
#include "core/url.h"

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;

Url MustParse(std::string_view text) {
  Result<Url> url = ParseUrl(text);
  EXPECT_TRUE(url.ok()) << url.status().ToString();
  return url.ok() ? *url : Url{};
}

TEST(UrlParamsTest, UnknownParametersAreRefusedByNameWithTheKnownOnesListed) {
  constexpr std::string_view kKnown[] = {"command_timeout", "fair"};
  EXPECT_TRUE(RefuseUnknownParams(MustParse("x://h?fair=true"), kKnown).ok());
  Status s = RefuseUnknownParams(MustParse("x://h?comand_timeout=1s&fiar=1"), kKnown, "see docs");
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "unknown x:// URL parameters comand_timeout, fiar (known: command_timeout, fair; "
            "see docs)");
}

TEST(UrlParamsTest, AbsentParametersLeaveTheDefault) {
  Url url = MustParse("x://h");
  Duration timeout = 7s;
  int n = 3;
  bool flag = true;
  std::string text = "default";
  EXPECT_TRUE(ReadTimeoutParam(url, "t", &timeout).ok());
  EXPECT_TRUE(ReadIntParam(url, "n", 0, 9, &n).ok());
  EXPECT_TRUE(ReadBoolParam(url, "b", &flag).ok());
  EXPECT_TRUE(ReadStringParam(url, "s", &text).ok());
  EXPECT_EQ(timeout, 7s);
  EXPECT_EQ(n, 3);
  EXPECT_TRUE(flag);
  EXPECT_EQ(text, "default");
}

TEST(UrlParamsTest, ValuesAreReadAndBadOnesGetOneFormat) {
  Url url = MustParse("x://h?t=250ms&n=4&b=false&s=jobs&z=0s&big=2h&neg=-1&word=yes&e=");
  Duration timeout{};
  ASSERT_TRUE(ReadTimeoutParam(url, "t", &timeout).ok());
  EXPECT_EQ(timeout, 250ms);
  int n = 0;
  ASSERT_TRUE(ReadIntParam(url, "n", 0, 9, &n).ok());
  EXPECT_EQ(n, 4);
  bool flag = true;
  ASSERT_TRUE(ReadBoolParam(url, "b", &flag).ok());
  EXPECT_FALSE(flag);
  std::string text;
  ASSERT_TRUE(ReadStringParam(url, "s", &text).ok());
  EXPECT_EQ(text, "jobs");

  EXPECT_EQ(ReadTimeoutParam(url, "z", &timeout).message(),
            "x:// URL parameter z=0s must be above 0 and at most 1h0m0s");
  EXPECT_EQ(ReadTimeoutParam(url, "big", &timeout).message(),
            "x:// URL parameter big=2h must be above 0 and at most 1h0m0s");
  Duration zero_ok = 1s;
  EXPECT_TRUE(ReadDurationParam(url, "z", Duration::zero(), 1h, &zero_ok).ok());
  EXPECT_EQ(zero_ok, Duration::zero());
  EXPECT_EQ(ReadIntParam(url, "neg", 0, 9, &n).message(),
            "x:// URL parameter neg=-1 is not a whole number in [0, 9]");
  EXPECT_EQ(ReadBoolParam(url, "word", &flag).message(),
            "x:// URL parameter word=yes must be true or false");
  EXPECT_EQ(ReadStringParam(url, "e", &text).message(), "x:// URL parameter e= must not be empty");
  EXPECT_TRUE(ReadStringParam(url, "e", &text, /*allow_empty=*/true).ok());
  EXPECT_EQ(ReadTimeoutParam(url, "word", &timeout).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(timeout, 250ms) << "a refused value leaves the output alone";
}

TEST(HostPortTest, OneRuleForHostsPortsAndIpv6) {
  auto hosts = ParseHostPorts("x", "db1:7000,[::1]:7001,[fe80::2],db4", 2379);
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  ASSERT_EQ(hosts->size(), 4u);
  EXPECT_EQ((*hosts)[0].ToString(), "db1:7000");
  EXPECT_EQ((*hosts)[1].host, "::1") << "no brackets in the host";
  EXPECT_EQ((*hosts)[1].ToString(), "[::1]:7001");
  EXPECT_EQ((*hosts)[2].ToString(), "[fe80::2]:2379");
  EXPECT_FALSE((*hosts)[2].port_given);
  EXPECT_EQ((*hosts)[3].ToString(), "db4:2379");

  auto fallback = ParseHostPorts("x", "", 6379, "127.0.0.1");
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ((*fallback)[0].ToString(), "127.0.0.1:6379");
  EXPECT_FALSE(ParseHostPorts("x", "", 6379).ok()) << "no host and no default";

  auto empty_port = ParseHostPorts("x", "h:", 2379);
  ASSERT_TRUE(empty_port.ok()) << "an empty port is the default";
  EXPECT_EQ((*empty_port)[0].ToString(), "h:2379");
  auto empty_host =
      ParseHostPorts("x", ":6380,[::1]", 6379, "127.0.0.1", /*allow_empty_host=*/true);
  ASSERT_TRUE(empty_host.ok()) << empty_host.status().ToString();
  EXPECT_EQ((*empty_host)[0].ToString(), "127.0.0.1:6380");
  auto libpq_default = ParseHostPorts("x", ":5433", 5432, {}, /*allow_empty_host=*/true);
  ASSERT_TRUE(libpq_default.ok());
  EXPECT_EQ((*libpq_default)[0].host, "") << "left to the client library's default";

  for (std::string_view bad :
       {"[::1", "[::1]x", "::1:2379", ":2379", "h:0", "h:65536", "h:12ab", "a,,b"}) {
    auto parsed = ParseHostPorts("x", bad, 2379);
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(parsed.status().message().starts_with("x:// URL")) << parsed.status().message();
  }
}

TEST(TimeTest, CeilMillisNeverRoundsATtlDown) {
  EXPECT_EQ(CeilMillis(1ns), 1);
  EXPECT_EQ(CeilMillis(Duration::zero()), 1);
  EXPECT_EQ(CeilMillis(1000us), 1);
  EXPECT_EQ(CeilMillis(1001us), 2);
  EXPECT_EQ(CeilMillis(10s), 10'000);
}

TEST(TimeTest, JitterStaysInRange) {
  EXPECT_EQ(Jitter(-1s), Duration::zero());
  for (int i = 0; i < 1000; ++i) {
    Duration d = Jitter(5ms);
    ASSERT_GE(d, Duration::zero());
    ASSERT_LE(d, 5ms);
  }
}

TEST(TimeTest, ReconnectBackoffWaitsOnItsClockAndStartsOverAfterASuccess) {
  testing::FakeClock clock;
  ReconnectBackoff backoff(clock, 100ms, 1s);
  EXPECT_TRUE(backoff.Ready());
  Duration ceiling = 100ms;
  for (int i = 0; i < 8; ++i) {
    Duration wait = backoff.Failed();
    ASSERT_GE(wait, Duration::zero());
    ASSERT_LE(wait, ceiling) << "attempt " << i;
    EXPECT_EQ(backoff.retry_at(), clock.Now() + wait);
    clock.Advance(wait + 1ns);
    EXPECT_TRUE(backoff.Ready());
    ceiling = std::min<Duration>(ceiling * 2, 1s);
  }
  backoff.Succeeded();
  EXPECT_TRUE(backoff.Ready());
  EXPECT_LE(backoff.Failed(), 100ms) << "a success starts again from base";
}

TEST(TimeTest, ToSteadyCountsTheTimeLeftOnTheGivenClock) {
  testing::FakeClock clock;  // far from the real clock: only the difference to it may count
  auto before = std::chrono::steady_clock::now();
  auto at = ToSteady(clock.Now() + 2s, clock);
  EXPECT_GE(at - before, 2s);
  EXPECT_LT(at - before, 3s);
  auto past = ToSteady(clock.Now() - 1h, clock);
  EXPECT_LE(past, std::chrono::steady_clock::now()) << "a passed deadline is now";
}

// Two readings of the store's clock bound the real time between them by their round trips; the
// store may run off by the drift bound (1 % + 2 ms) and no more.
TEST(StoreClockWatchTest, JudgesTheStoresElapsedTimeAgainstTheRoundTripsAndTheDriftBound) {
  const SteadyTime t0{std::chrono::hours(1)};
  auto at = [&](Duration send, Duration recv, Duration store) {
    return StoreTimeReading{t0 + send, t0 + recv,
                            std::chrono::duration_cast<std::chrono::microseconds>(store).count()};
  };
  StoreClockWatch watch;
  EXPECT_FALSE(watch.Observe(at(0ms, 10ms, 1000s)).has_value()) << "the first reading";
  // 1 s later, 10 ms round trips: real time between 990 ms and 1010 ms; allowed up to
  // 1010 + 10.1 + 2 ms and down to 990 - 9.9 - 2 ms.
  EXPECT_FALSE(watch.Observe(at(1000ms, 1010ms, 1000s + 1022ms)).has_value());
  EXPECT_FALSE(watch.Observe(at(2000ms, 2010ms, 1000s + 1022ms + 979ms)).has_value());
  std::optional<StoreClockStep> forward = watch.Observe(at(3000ms, 3010ms, 1000s + 2001ms + 3s));
  ASSERT_TRUE(forward.has_value());
  EXPECT_GT(forward->step, 1900ms);
  EXPECT_LT(forward->step, 2000ms);
  EXPECT_EQ(forward->local_min, 990ms);
  EXPECT_EQ(forward->local_max, 1010ms);
  std::optional<StoreClockStep> backward = watch.Observe(at(4000ms, 4010ms, 1000s));
  ASSERT_TRUE(backward.has_value());
  EXPECT_LT(backward->step, -4s);
  EXPECT_EQ(watch.steps(), 2u);
  ASSERT_TRUE(watch.last_step().has_value());
  EXPECT_EQ(watch.last_step()->step, backward->step);
  // A long pause between renewals with a steady store: 1 % of an hour is allowed.
  EXPECT_FALSE(watch.Observe(at(4000ms + 1h, 4010ms + 1h, 1000s + 1h + 30s)).has_value());
  EXPECT_TRUE(watch.Observe(at(4000ms + 2h, 4010ms + 2h, 1000s + 2h + 90s)).has_value());
}

TEST(StoreClockWatchTest, AReadingWhoseRoundTripOverlapsThePreviousIsNotJudged) {
  const SteadyTime t0{std::chrono::hours(1)};
  StoreClockWatch watch;
  watch.Observe({t0, t0 + 100ms, 5'000'000});
  // Sent before the previous reply came (a Confirm() beside the heartbeat): kept, not judged.
  EXPECT_FALSE(watch.Observe({t0 + 50ms, t0 + 300ms, 99'000'000}).has_value());
  EXPECT_EQ(watch.steps(), 0u);
  // The next one is judged against it.
  EXPECT_FALSE(watch.Observe({t0 + 1300ms, t0 + 1310ms, 100'000'000}).has_value());
}

}  // namespace
}  // namespace leasehold::internal
