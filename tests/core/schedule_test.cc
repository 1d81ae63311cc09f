// Schedule slots (leasehold/schedule.h): the grid arithmetic, the tolerance rule, time zones,
// and the record's text form. The stores' part is in the conformance suite.

#include "leasehold/schedule.h"

#include <chrono>
#include <string_view>

#include <gtest/gtest.h>

#include "leasehold/store.h"
#include "leasehold/testing/fake_clock.h"

#include "core/slot_record.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using internal::FormatSlotRecord;
using internal::ParseSlotRecord;

// 2026-12-01T17:00:00Z.
constexpr std::int64_t kHourStart = 1'796'144'400;

SystemTime At(std::int64_t unix_seconds, std::chrono::milliseconds plus = 0ms) {
  return SystemTime(std::chrono::seconds(unix_seconds)) + plus;
}

TEST(SlotGridTest, ASlotStartsAtItsBoundaryAndLastsAPeriod) {
  const SlotGrid hourly{.period = 1h};
  EXPECT_EQ(FormatSlotTime(At(kHourStart)), "2026-12-01T17:00:00.000Z");
  EXPECT_EQ(*SlotStartAt(hourly, At(kHourStart)), At(kHourStart));
  EXPECT_EQ(*SlotStartAt(hourly, At(kHourStart + 1800)), At(kHourStart));
  // The default tolerance is min(period / 4, 5 min): 5 min before 18:00 already counts as 18:00.
  EXPECT_EQ(SlotTolerance(hourly), 5min);
  EXPECT_EQ(*SlotStartAt(hourly, At(kHourStart + 3600 - 301)), At(kHourStart));
  EXPECT_EQ(*SlotStartAt(hourly, At(kHourStart + 3600 - 300)), At(kHourStart + 3600));
  EXPECT_EQ(SlotTolerance({.period = 2s}), 500ms);
}

TEST(SlotGridTest, AHostUpToTheToleranceEarlyJoinsTheComingSlot) {
  const SlotGrid grid{.period = 2s};  // tolerance 500 ms
  const SystemTime boundary = At(kHourStart);
  EXPECT_EQ(*SlotStartAt(grid, boundary - 500ms), boundary);
  EXPECT_EQ(*SlotStartAt(grid, boundary - 501ms), boundary - 2s) << "beyond the tolerance";
  EXPECT_EQ(*SlotStartAt(grid, boundary + 1499ms), boundary);
  EXPECT_EQ(*SlotStartAt(grid, boundary + 1500ms), boundary + 2s);
  const SlotGrid exact{.period = 2s, .tolerance = 0s};
  EXPECT_EQ(*SlotStartAt(exact, boundary - 1ms), boundary - 2s);
}

TEST(SlotGridTest, AnOffsetShiftsTheGrid) {
  const SlotGrid daily_at_2{.period = 24h, .offset = 2h, .tolerance = 0s};
  // 2026-12-01T17:00Z is in the slot that began at 02:00Z that day.
  EXPECT_EQ(FormatSlotTime(*SlotStartAt(daily_at_2, At(kHourStart))), "2026-12-01T02:00:00.000Z");
  EXPECT_EQ(FormatSlotTime(*SlotStartAt(daily_at_2, At(kHourStart - 17 * 3600 + 3600))),
            "2026-11-30T02:00:00.000Z");
}

TEST(SlotGridTest, BeforeTheEpochTheGridStillFloors) {
  const SlotGrid grid{.period = 1h, .tolerance = 0s};
  EXPECT_EQ(*SlotStartAt(grid, At(-1)), At(-3600));
  EXPECT_EQ(FormatSlotTime(At(-1, 1ms)), "1969-12-31T23:59:59.001Z");
}

#if LEASEHOLD_WITH_ZONES
TEST(SlotGridTest, DailySlotsInAZoneStartAtLocalMidnightAcrossDaylightSaving) {
  const SlotGrid berlin{.period = 24h, .zone = "Europe/Berlin", .tolerance = 0s};
  // Winter (UTC+1): local midnight is 23:00Z the day before.
  EXPECT_EQ(FormatSlotTime(*SlotStartAt(berlin, At(kHourStart))), "2026-11-30T23:00:00.000Z");
  // Summer (UTC+2): 2026-07-01T12:00Z -> local midnight 2026-06-30T22:00Z.
  EXPECT_EQ(FormatSlotTime(*SlotStartAt(berlin, At(1'782'907'200))), "2026-06-30T22:00:00.000Z");
  // The day of the spring change (2026-03-29) is 23 h long: 2026-03-29T21:59Z is still that
  // day's slot, which began at 2026-03-28T23:00Z.
  EXPECT_EQ(FormatSlotTime(*SlotStartAt(berlin, At(1'774'821'540))), "2026-03-28T23:00:00.000Z");
  EXPECT_EQ(FormatSlotTime(*SlotStartAt(berlin, At(1'774'821'600))), "2026-03-29T22:00:00.000Z");
}
#endif

TEST(SlotGridTest, BadGridsAreRefusedWithTheReason) {
  auto code = [](const SlotGrid& grid) { return ValidateSlotGrid(grid).code(); };
  EXPECT_EQ(code({.period = 0s}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.period = 999ms}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.period = kMaxSlotPeriod + 1h}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.period = 1500us * 1000 + 1us}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.period = 1h, .offset = 1h}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.period = 1h, .offset = -1s}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.period = 1h, .tolerance = 30min}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.period = 1h, .tolerance = -1s}), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateSlotGrid({.period = 1h, .tolerance = 29min}).ok());
  EXPECT_TRUE(ValidateSlotGrid({.period = kMinSlotPeriod}).ok());
  EXPECT_TRUE(ValidateSlotGrid({.period = kMaxSlotPeriod}).ok());
#if LEASEHOLD_WITH_ZONES
  Status unknown = ValidateSlotGrid({.period = 24h, .zone = "Mars/Olympus"});
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("Mars/Olympus"), std::string_view::npos);
  EXPECT_TRUE(ValidateSlotGrid({.period = 24h, .zone = "UTC"}).ok());
#endif
  EXPECT_EQ(SlotStartAt({.period = 0s}, At(0)).status().code(), StatusCode::kInvalidArgument);
}

TEST(SlotRecordTest, RoundTripsNewestFirstAndCapsTheHistory) {
  std::vector<SlotRun> runs;
  for (int i = 0; i < 12; ++i) {
    runs.push_back({.slot_start = At(kHourStart - i * 3600),
                    .succeeded = i % 2 == 0,
                    .exit_code = i % 2 == 0 ? 0 : -3,
                    .final = i % 2 == 0 || i == 3,
                    .holder = i == 0 ? "web 1:42\nsecond line" : "web-2:7",
                    .fencing_token = static_cast<FencingToken>(100 - i),
                    .started = At(kHourStart, std::chrono::milliseconds(i)),
                    .ended = At(kHourStart + 2, std::chrono::milliseconds(i))});
  }
  const std::string text = FormatSlotRecord(runs);
  EXPECT_LE(text.size(), 4096u);
  auto parsed = ParseSlotRecord(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << text;
  ASSERT_EQ(parsed->size(), kMaxSlotHistory);
  for (std::size_t i = 0; i < kMaxSlotHistory; ++i) {
    const SlotRun& got = (*parsed)[i];
    EXPECT_EQ(got.slot_start, runs[i].slot_start);
    EXPECT_EQ(got.succeeded, runs[i].succeeded);
    EXPECT_EQ(got.exit_code, runs[i].exit_code);
    EXPECT_EQ(got.final, runs[i].final) << i;
    EXPECT_EQ(got.fencing_token, runs[i].fencing_token);
    EXPECT_EQ(got.started, runs[i].started);
    EXPECT_EQ(got.ended, runs[i].ended);
  }
  EXPECT_EQ((*parsed)[0].holder, "web 1:42 second line") << "one line per run";
  // A long holder is cut on a UTF-8 boundary: "é" is two bytes, the 256th byte would split one.
  std::vector<SlotRun> accented{SlotRun{.holder = "x"}};
  for (int i = 0; i < 200; ++i) {
    accented[0].holder += "\xc3\xa9";
  }
  auto cut = ParseSlotRecord(FormatSlotRecord(accented));
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ((*cut)[0].holder.size(), 255u) << "x and 127 whole two-byte characters";
  // A holder name of any length still fits.
  std::vector<SlotRun> long_names(kMaxSlotHistory, SlotRun{.holder = std::string(5000, 'h')});
  EXPECT_LE(FormatSlotRecord(long_names).size(), 4096u);
}

TEST(SlotRecordTest, TextItDoesNotUnderstandIsAnErrorNotACrash) {
  for (std::string_view bad :
       {"", "leasehold-slots 2\n", "leasehold-slots 1", "x\n",
        "leasehold-slots 1\n1 d 0 1 2 3 h",  // no end of line
        "leasehold-slots 1\n1 x 0 1 2 3 h\n", "leasehold-slots 1\n1 d 0\n",
        "leasehold-slots 1\n1 d 0 -1 2 3 h\n", "leasehold-slots 1\n1 d 99999999999 1 2 3 h\n",
        "leasehold-slots 1\n1 d 0 1 2 3a h\n",
        "leasehold-slots 1\n99999999999999999999 d 0 1 2 3 h\n",
        "leasehold-slots 1\n9000000000000000 d 0 1 2 3 h\n",
        "leasehold-slots 1\n1 d 0 1 -9000000000000000 3 h\n"}) {
    EXPECT_EQ(ParseSlotRecord(bad).status().code(), StatusCode::kInternal) << bad;
  }
  auto empty = ParseSlotRecord("leasehold-slots 1\n");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  auto no_holder = ParseSlotRecord("leasehold-slots 1\n1 d 0 1 2 3 \n");
  ASSERT_TRUE(no_holder.ok());
  EXPECT_EQ((*no_holder)[0].holder, "");
}

TEST(SlotClaimTest, ClaimsOnTheMemoryStoreAndReportsTheLocalClock) {
  auto store = Store::Open("memory://");
  ASSERT_TRUE(store.ok());
  auto claim = (*store)->ClaimSlot("job", {.period = 1h}, {.ttl = 5s, .wait = 0s});
  ASSERT_TRUE(claim.ok()) << claim.status().ToString();
  ASSERT_TRUE(claim->claimed());
  EXPECT_FALSE(claim->named_by_store_clock()) << "memory:// has no clock of its own";
  EXPECT_TRUE(claim->lease().valid());
  ASSERT_TRUE(claim->Finish({.succeeded = true}).ok());
  EXPECT_FALSE(claim->lease().valid());
  EXPECT_TRUE(claim->Finish({.succeeded = true}).ok()) << "a second Finish does nothing";
  auto bad = (*store)->ClaimSlot("job", {.period = 10ms}, {});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->ClaimSlot("", {.period = 1h}, {}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(SlotClaimTest, ARunWhoseLeaseWasLostLocallyIsNotRecordedEvenIfTheStoreStillHasIt) {
  // safe_until = t_send + ttl - drift comes before the store's expiry: between the two, the
  // store still has the grant, but the holder may no longer vouch for its run.
  testing::FakeClock clock;
  auto store = Store::Open("memory://", {.clock = &clock});
  ASSERT_TRUE(store.ok());
  auto claim = (*store)->ClaimSlot("job", {.period = 1h},
                                   {.ttl = 10s, .renew_interval = 8s, .drift = 1s, .wait = 0s});
  ASSERT_TRUE(claim.ok() && claim->claimed()) << claim.status().ToString();
  clock.Advance(9500ms);
  EXPECT_FALSE(claim->lease().valid());
  EXPECT_EQ(claim->Finish({.succeeded = true}).code(), StatusCode::kLost);
  auto runs = (*store)->SlotRuns("job");
  ASSERT_TRUE(runs.ok());
  EXPECT_TRUE(runs->empty()) << "a run past its safe_until is not the slot's clean run";
  EXPECT_TRUE((*store)->TryAcquire("job", {.ttl = 5s}).ok()) << "deleted, not kept";
}

TEST(SlotClaimTest, KeepHistoryKeepsTheRunsPastTwoPeriodsAndIsCheckedAtTheDoor) {
  testing::FakeClock clock;
  auto store = Store::Open("memory://", {.clock = &clock});
  ASSERT_TRUE(store.ok());
  for (const char* key : {"kept", "default"}) {
    auto claim = (*store)->ClaimSlot(key, {.period = 1h}, {.ttl = 5s, .wait = 0s});
    ASSERT_TRUE(claim.ok() && claim->claimed()) << claim.status().ToString();
    ASSERT_TRUE(claim
                    ->Finish({.succeeded = true,
                              .keep_history = std::string_view(key) == "kept" ? 5h : 1min})
                    .ok());
  }
  // Two periods and the tolerance have passed: a shorter keep_history than that changes
  // nothing, a longer one keeps the record.
  clock.Advance(3h);
  auto kept = (*store)->SlotRuns("kept");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size(), 1u);
  auto gone = (*store)->SlotRuns("default");
  ASSERT_TRUE(gone.ok());
  EXPECT_TRUE(gone->empty());
  clock.Advance(2h + 1s);
  kept = (*store)->SlotRuns("kept");
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->empty()) << "kept for 5 h, not longer";

  for (Duration bad : {Duration(-1s), kMaxKeepHistory + 1s}) {
    auto claim = (*store)->ClaimSlot("bad", {.period = 1h}, {.ttl = 5s, .wait = 0s});
    ASSERT_TRUE(claim.ok() && claim->claimed()) << claim.status().ToString();
    EXPECT_EQ(claim->Finish({.succeeded = true, .keep_history = bad}).code(),
              StatusCode::kInvalidArgument);
    EXPECT_FALSE(claim->lease().valid()) << "released all the same";
    auto runs = (*store)->SlotRuns("bad");
    ASSERT_TRUE(runs.ok());
    EXPECT_TRUE(runs->empty()) << "the run is not recorded";
  }
}

TEST(HoldAtLeastTest, AHoldOutOfRangeIsRefusedAndTheLeaseStillReleased) {
  auto store = Store::Open("memory://");
  ASSERT_TRUE(store.ok());
  auto lease = (*store)->TryAcquire("job", {.ttl = 5s});
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->Release({.hold_at_least = kMaxHoldAtLeast + 1s}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE((*store)->TryAcquire("job", {.ttl = 5s}).ok()) << "released all the same";
  auto claim = (*store)->ClaimSlot("slot", {.period = 1h}, {.ttl = 5s, .wait = 0s});
  ASSERT_TRUE(claim.ok() && claim->claimed());
  EXPECT_EQ(claim->Finish({.succeeded = true, .hold_at_least = -1s}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(claim->lease().valid());
  auto runs = (*store)->SlotRuns("slot");
  ASSERT_TRUE(runs.ok());
  EXPECT_TRUE(runs->empty());
}

TEST(HoldAtLeastTest, ANegativeHoldIsRefusedAndTheLeaseStillReleased) {
  auto store = Store::Open("memory://");
  ASSERT_TRUE(store.ok());
  auto lease = (*store)->TryAcquire("job", {.ttl = 5s});
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->Release({.hold_at_least = -1s}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*store)->TryAcquire("job", {.ttl = 5s}).ok()) << "released all the same";
}

}  // namespace
}  // namespace leasehold
