// The kill schedule of `leasehold run` / `elect` (tools/cli/kill_schedule.h) on the injected
// clock: every deadline to the nanosecond, with no process and no real time.

#include "kill_schedule.h"

#include <chrono>
#include <csignal>

#include <gtest/gtest.h>

#include "leasehold/testing/fake_clock.h"

namespace leasehold::cli {
namespace {

using namespace std::chrono_literals;
using Reason = KillSchedule::Reason;

constexpr Duration kGrace = 2s;
// The keeper's SIGTERM trails ours by min(grace/4, 100ms).
constexpr Duration kBackstop = 100ms;

TEST(KillScheduleTest, AHealthyLeaseIsNeverSignalledAndTheDeadlinesFollowSafeUntil) {
  testing::FakeClock clock;
  KillSchedule schedule(kGrace, /*term_on_risk=*/false);
  for (int renewal = 0; renewal < 5; ++renewal) {
    // Each renewal moves safe_until 10 s past now, before safe_until - grace comes.
    const SteadyTime safe_until = clock.Now() + 10s;
    const KillSchedule::Step step = schedule.At(clock.Now(), LeaseState::kHeld, safe_until);
    EXPECT_EQ(step.signal, 0);
    ASSERT_TRUE(step.next.has_value());
    EXPECT_EQ(*step.next, safe_until - kGrace);
    EXPECT_EQ(step.keeper_term_at, safe_until - kGrace + kBackstop);
    EXPECT_EQ(step.keeper_kill_at, safe_until);
    clock.Advance(3s);
  }
  EXPECT_FALSE(schedule.term_sent());
}

TEST(KillScheduleTest, UnconfirmedSigtermAtSafeUntilLessGraceAndSigkillAtSafeUntil) {
  testing::FakeClock clock;
  KillSchedule schedule(kGrace, false);
  const SteadyTime safe_until = clock.Now() + 10s;
  auto step = schedule.At(clock.Now(), LeaseState::kAtRisk, safe_until);
  EXPECT_EQ(step.signal, 0) << "at risk alone changes nothing without --on-risk=term";
  EXPECT_EQ(*step.next, safe_until - kGrace);

  clock.Set(safe_until - kGrace - 1ns);
  EXPECT_EQ(schedule.At(clock.Now(), LeaseState::kAtRisk, safe_until).signal, 0);
  clock.Set(safe_until - kGrace);
  step = schedule.At(clock.Now(), LeaseState::kAtRisk, safe_until);
  EXPECT_EQ(step.signal, SIGTERM);
  EXPECT_EQ(step.reason, Reason::kUnconfirmed);
  EXPECT_EQ(step.kill_at, safe_until);
  EXPECT_EQ(step.keeper_term_at, SteadyTime{}) << "ours went out: the keeper does not repeat it";
  EXPECT_EQ(step.keeper_kill_at, safe_until);
  EXPECT_EQ(*step.next, safe_until);

  clock.Set(safe_until - 1ns);
  EXPECT_EQ(schedule.At(clock.Now(), LeaseState::kAtRisk, safe_until).signal, 0)
      << "SIGTERM is sent once";
  clock.Set(safe_until);
  step = schedule.At(clock.Now(), LeaseState::kAtRisk, safe_until);
  EXPECT_EQ(step.signal, SIGKILL);
  EXPECT_EQ(step.reason, Reason::kSafeUntilPassed);
  EXPECT_FALSE(step.next.has_value());
  EXPECT_EQ(schedule.At(clock.Now() + 1s, LeaseState::kLost, safe_until).signal, 0)
      << "SIGKILL is sent once";
}

TEST(KillScheduleTest, ARenewalInTimeCancelsTheSigtermThatWasComing) {
  testing::FakeClock clock;
  KillSchedule schedule(kGrace, false);
  SteadyTime safe_until = clock.Now() + 10s;
  EXPECT_EQ(schedule.At(clock.Now(), LeaseState::kAtRisk, safe_until).signal, 0);
  clock.Set(safe_until - kGrace - 1ms);
  safe_until = clock.Now() + 10s;  // confirmed at the last moment
  const auto step = schedule.At(clock.Now(), LeaseState::kHeld, safe_until);
  EXPECT_EQ(step.signal, 0);
  EXPECT_EQ(*step.next, safe_until - kGrace);
  EXPECT_EQ(step.keeper_kill_at, safe_until);
}

TEST(KillScheduleTest, OnRiskTermSendsSigtermAtOnceAndSigkillAtSafeUntil) {
  testing::FakeClock clock;
  KillSchedule schedule(kGrace, /*term_on_risk=*/true);
  const SteadyTime safe_until = clock.Now() + 10s;
  EXPECT_EQ(schedule.At(clock.Now(), LeaseState::kHeld, safe_until).signal, 0);
  clock.Advance(4s);
  auto step = schedule.At(clock.Now(), LeaseState::kAtRisk, safe_until);
  EXPECT_EQ(step.signal, SIGTERM);
  EXPECT_EQ(step.reason, Reason::kAtRiskTerm);
  EXPECT_EQ(step.kill_at, safe_until);
  EXPECT_EQ(*step.next, safe_until);
  clock.Set(safe_until);
  step = schedule.At(clock.Now(), LeaseState::kAtRisk, safe_until);
  EXPECT_EQ(step.signal, SIGKILL);
  EXPECT_EQ(step.reason, Reason::kSafeUntilPassed);
}

// "Not yours" from the store (a force-release, a grant taken over): SIGTERM at once, SIGKILL
// when the grace is over.
TEST(KillScheduleTest, ALossSendsSigtermAtOnceAndSigkillAfterTheGrace) {
  testing::FakeClock clock;
  KillSchedule schedule(kGrace, false);
  const SteadyTime safe_until = clock.Now() + 10s;
  EXPECT_EQ(schedule.At(clock.Now(), LeaseState::kHeld, safe_until).signal, 0);
  clock.Advance(1s);
  const SteadyTime lost_at = clock.Now();
  auto step = schedule.At(clock.Now(), LeaseState::kLost, safe_until);
  EXPECT_EQ(step.signal, SIGTERM);
  EXPECT_EQ(step.reason, Reason::kLost);
  EXPECT_TRUE(schedule.lost());
  EXPECT_EQ(step.kill_at, lost_at + kGrace);
  EXPECT_EQ(step.keeper_kill_at, lost_at + kGrace);
  EXPECT_EQ(*step.next, lost_at + kGrace);

  clock.Set(lost_at + kGrace - 1ns);
  EXPECT_EQ(schedule.At(clock.Now(), LeaseState::kLost, safe_until).signal, 0);
  clock.Set(lost_at + kGrace);
  step = schedule.At(clock.Now(), LeaseState::kLost, safe_until);
  EXPECT_EQ(step.signal, SIGKILL);
  EXPECT_EQ(step.reason, Reason::kGraceOver);
}

TEST(KillScheduleTest, ALossNearSafeUntilKillsAtSafeUntilNotAfterTheGrace) {
  testing::FakeClock clock;
  KillSchedule schedule(kGrace, false);
  const SteadyTime safe_until = clock.Now() + 10s;
  clock.Set(safe_until - 500ms);
  auto step = schedule.At(clock.Now(), LeaseState::kLost, safe_until);
  EXPECT_EQ(step.signal, SIGTERM);
  EXPECT_EQ(step.kill_at, safe_until) << "never later than safe_until";
  EXPECT_EQ(*step.next, safe_until);
  clock.Set(safe_until);
  step = schedule.At(clock.Now(), LeaseState::kLost, safe_until);
  EXPECT_EQ(step.signal, SIGKILL);
  EXPECT_EQ(step.reason, Reason::kSafeUntilPassed);
}

// A leasehold that was stopped (SIGSTOP, a suspended machine) and wakes past safe_until: the
// lease is lost, and what is due is SIGKILL at once, with no SIGTERM and no grace first.
TEST(KillScheduleTest, AfterAResumePastSafeUntilSigkillComesAtOnce) {
  testing::FakeClock clock;
  KillSchedule schedule(kGrace, false);
  const SteadyTime safe_until = clock.Now() + 10s;
  EXPECT_EQ(schedule.At(clock.Now(), LeaseState::kHeld, safe_until).signal, 0);
  clock.Advance(1h);
  const auto step = schedule.At(clock.Now(), LeaseState::kLost, safe_until);
  EXPECT_EQ(step.signal, SIGKILL);
  EXPECT_EQ(step.reason, Reason::kSafeUntilPassed);
  EXPECT_TRUE(schedule.term_sent()) << "no SIGTERM is sent after the SIGKILL";
  EXPECT_FALSE(step.next.has_value());
}

// Woken between safe_until - grace and safe_until, still held: SIGTERM now, SIGKILL on time.
TEST(KillScheduleTest, AfterAResumeInsideTheGraceSigtermNowAndSigkillOnTime) {
  testing::FakeClock clock;
  KillSchedule schedule(kGrace, false);
  const SteadyTime safe_until = clock.Now() + 10s;
  EXPECT_EQ(schedule.At(clock.Now(), LeaseState::kHeld, safe_until).signal, 0);
  clock.Set(safe_until - 1s);
  const auto step = schedule.At(clock.Now(), LeaseState::kHeld, safe_until);
  EXPECT_EQ(step.signal, SIGTERM);
  EXPECT_EQ(step.reason, Reason::kUnconfirmed);
  EXPECT_EQ(*step.next, safe_until);
}

TEST(KillScheduleTest, TheKeepersSigtermTrailsOursByAQuarterGraceAtMost100ms) {
  testing::FakeClock clock;
  KillSchedule short_grace(200ms, false);
  const SteadyTime safe_until = clock.Now() + 10s;
  EXPECT_EQ(short_grace.At(clock.Now(), LeaseState::kHeld, safe_until).keeper_term_at,
            safe_until - 200ms + 50ms);
  KillSchedule long_grace(10s, false);
  EXPECT_EQ(long_grace.At(clock.Now(), LeaseState::kHeld, safe_until + 10s).keeper_term_at,
            safe_until + 100ms);
}

TEST(KillScheduleTest, EveryReasonHasWords) {
  for (Reason r : {Reason::kUnconfirmed, Reason::kAtRiskTerm, Reason::kLost, Reason::kGraceOver,
                   Reason::kSafeUntilPassed}) {
    EXPECT_STRNE(KillSchedule::Why(r), "");
  }
}

}  // namespace
}  // namespace leasehold::cli
