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
  for (const char* bad :
       {"", "10", "-1s", "s", "5 s", "5x", "1.s5", "99999999999999999999h", ".s"}) {
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

TEST(DurationTest, FormatsExactlySoThatWhatIsPrintedReadsBack) {
  EXPECT_EQ(FormatDuration(1s + 1ns), "1.000000001s");
  EXPECT_EQ(FormatDuration(61500ms), "1m1.5s");
  EXPECT_EQ(FormatDuration(Duration(10s) / 3), "3.333333333s");
  for (Duration d : std::initializer_list<Duration>{1s + 1ns, 61500ms, Duration(10s) / 3,
                                                    Duration(1234567), Duration::max()}) {
    auto back = ParseDuration(FormatDuration(d));
    ASSERT_TRUE(back.ok()) << FormatDuration(d);
    EXPECT_EQ(*back, d) << FormatDuration(d);
  }
  EXPECT_EQ(FormatDuration(Duration::min()).front(), '-');
}

TEST(DurationTest, RoundsMeasuredValuesForDisplay) {
  EXPECT_EQ(FormatDuration(RoundForDisplay(Duration(10s) / 3)), "3.333s");
  EXPECT_EQ(FormatDuration(RoundForDisplay(Duration(2s) / 3)), "666.667ms");
  EXPECT_EQ(FormatDuration(RoundForDisplay(Duration(1523847261))), "1.524s");
  EXPECT_EQ(FormatDuration(RoundForDisplay(754s + 567ms)), "12m35s");
  EXPECT_EQ(FormatDuration(RoundForDisplay(1499us + 500ns)), "1.5ms");
  EXPECT_EQ(FormatDuration(RoundForDisplay(-(Duration(10s) / 3))), "-3.333s");
  EXPECT_EQ(RoundForDisplay(999ns), 999ns);
  EXPECT_EQ(RoundForDisplay(Duration::zero()), Duration::zero());
  // The ends of the range stay inside it.
  EXPECT_LE(RoundForDisplay(Duration::max()), Duration::max());
  EXPECT_GE(RoundForDisplay(Duration::min()), Duration::min());
  EXPECT_EQ(RoundForDisplay(Duration::max()).count() % 1'000'000'000, 0);
}

}  // namespace
}  // namespace leasehold::internal
