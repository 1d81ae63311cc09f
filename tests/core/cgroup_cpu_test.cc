// The cgroup CPU throttling parsers (core/cgroup_cpu.h), on the texts the kernel writes. The
// reading of a real quota is tests/cli/cgroup_test.py's.

#include "core/cgroup_cpu.h"

#include <gtest/gtest.h>

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;

TEST(CgroupCpuTest, FindsTheProcessesCgroupInEitherVersion) {
  const std::string hybrid =
      "9:name=systemd:/\n4:memory:/m/x\n2:cpuacct:/\n1:cpu,cpuacct:/pod/c1\n0::/unified/u\n";
  EXPECT_EQ(ParseCgroupPath(hybrid), "/unified/u");
  EXPECT_EQ(ParseCgroupPath(hybrid, "cpu"), "/pod/c1");
  EXPECT_EQ(ParseCgroupPath(hybrid, "cpuacct"), "/");
  EXPECT_EQ(ParseCgroupPath("0::/\n"), "/");
  EXPECT_EQ(ParseCgroupPath("0::/\n", "cpu"), std::nullopt);
  EXPECT_EQ(ParseCgroupPath("4:memory:/m\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupPath("garbage"), std::nullopt);
  EXPECT_EQ(ParseCgroupPath(""), std::nullopt);
}

TEST(CgroupCpuTest, ReadsCpuStatOfBothVersions) {
  auto v2 = ParseCpuStat(
      "usage_usec 123\nuser_usec 100\nsystem_usec 23\nnr_periods 50\nnr_throttled 45\n"
      "throttled_usec 4000000\nnr_bursts 0\nburst_usec 0\n");
  ASSERT_TRUE(v2.has_value());
  EXPECT_EQ(v2->periods, 50U);
  EXPECT_EQ(v2->throttled_periods, 45U);
  EXPECT_EQ(v2->throttled, 4s);
  auto v1 = ParseCpuStat("nr_periods 7\nnr_throttled 3\nthrottled_time 270000000\n");
  ASSERT_TRUE(v1.has_value());
  EXPECT_EQ(v1->throttled, 270ms);
  // A v2 cgroup without the cpu controller has usage only.
  EXPECT_FALSE(ParseCpuStat("usage_usec 1\nuser_usec 1\nsystem_usec 0\n").has_value());
  EXPECT_FALSE(ParseCpuStat("nr_periods x\nnr_throttled 1\nthrottled_usec 1\n").has_value());
}

TEST(CgroupCpuTest, ReadsQuotasOfBothVersions) {
  auto tenth = ParseCpuMax("10000 100000\n");
  ASSERT_TRUE(tenth.has_value() && tenth->has_value());
  EXPECT_EQ((*tenth)->quota, 10ms);
  EXPECT_EQ((*tenth)->period, 100ms);
  EXPECT_EQ((CpuThrottling{.quota = **tenth}.LongestStall()), 90ms);
  auto none = ParseCpuMax("max 100000\n");
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(CpuThrottling{}.LongestStall(), Duration::zero());
  auto two = ParseCpuMax("200000 100000");
  ASSERT_TRUE(two.has_value() && two->has_value());
  EXPECT_EQ((CpuThrottling{.quota = **two}.LongestStall()), Duration::zero())
      << "two CPUs a period: a single thread is never stopped by the quota alone";
  EXPECT_FALSE(ParseCpuMax("").has_value());
  EXPECT_FALSE(ParseCpuMax("10000").has_value());
  EXPECT_FALSE(ParseCpuMax("10000 0").has_value());
  EXPECT_FALSE(ParseCpuMax("-5 100000").has_value());
  auto v1 = ParseCfsQuota("-1\n", "100000\n");
  ASSERT_TRUE(v1.has_value());
  EXPECT_FALSE(v1->has_value());
  auto v1q = ParseCfsQuota("25000\n", "50000\n");
  ASSERT_TRUE(v1q.has_value() && v1q->has_value());
  EXPECT_EQ((*v1q)->quota, 25ms);
}

}  // namespace
}  // namespace leasehold::internal
