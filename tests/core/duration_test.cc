#include "core/duration.h"

#include <gtest/gtest.h>

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;

TEST(DurationTest, ParsesWhatPeopleWrite) {
  EXPECT_EQ(*ParseDuration("500ms"), 500ms);
  EXPECT_EQ(*ParseDuration("10s"), 10s);
  EXPECT_EQ(*ParseDuration("2m"), 2min);
  EXPECT_EQ(*ParseDuration("1h"), 1h);
  EXPECT_EQ(*ParseDuration("1m30s"), 90s);
  EXPECT_EQ(*ParseDuration("1.5s"), 1500ms);
  EXPECT_EQ(*ParseDuration("250us"), 250us);
  EXPECT_EQ(*ParseDuration("0s"), 0s);
}

TEST(DurationTest, RejectsAmbiguousOrNegativeInput) {
  for (const char* bad : {"", "10", "-1s", "s", "5 s", "5x", "1.s5", "99999999999999999999h", ".s"}) {
    auto r = ParseDuration(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
}

TEST(DurationTest, FormatsCompactly) {
  EXPECT_EQ(FormatDuration(1500ms), "1.5s");
  EXPECT_EQ(FormatDuration(250ms), "250ms");
  EXPECT_EQ(FormatDuration(90s), "1m30s");
  EXPECT_EQ(FormatDuration(12us), "12us");
}

}  // namespace
}  // namespace leasehold::internal
