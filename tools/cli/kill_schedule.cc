// File: tools/cli/kill_schedule.cc

#include "kill_schedule.h"

#include <algorithm>
#include <chrono>
#include <csignal>

namespace leasehold::cli {

KillSchedule::Step KillSchedule::At(SteadyTime now, LeaseState state, SteadyTime safe_until) {
  if (state == LeaseState::kLost && !lost_) {
    lost_ = true;
    lost_at_ = now;
  }
  const bool term_now = term_on_risk_ && state == LeaseState::kAtRisk;
  const SteadyTime term_at = lost_ ? lost_at_ : term_now ? now : safe_until - kill_grace_;
  const SteadyTime kill_at = lost_ ? std::min(safe_until, lost_at_ + kill_grace_) : safe_until;
  Step step;
  step.kill_at = kill_at;
  if (!kill_sent_ && now >= kill_at) {
    step.signal = SIGKILL;
    step.reason = now >= safe_until ? Reason::kSafeUntilPassed : Reason::kGraceOver;
    kill_sent_ = true;
    term_sent_ = true;
  } else if (!term_sent_ && now >= term_at) {
    step.signal = SIGTERM;
    step.reason = lost_ ? Reason::kLost : term_now ? Reason::kAtRiskTerm : Reason::kUnconfirmed;
    term_sent_ = true;
  }
  const Duration backstop = std::min<Duration>(kill_grace_ / 4, std::chrono::milliseconds(100));
  step.keeper_term_at = term_sent_ ? SteadyTime{} : term_at + backstop;
  step.keeper_kill_at = kill_at;
  if (!kill_sent_) {
    step.next = term_sent_ ? kill_at : term_at;
  }
  return step;
}

const char* KillSchedule::Why(Reason reason) {
  switch (reason) {
    case Reason::kNone:
      return "";
    case Reason::kUnconfirmed:
      return "the lease cannot be confirmed";
    case Reason::kAtRiskTerm:
      return "the lease is at risk (--on-risk=term)";
    case Reason::kLost:
      return "the lease is lost";
    case Reason::kGraceOver:
      return "grace period over";
    case Reason::kSafeUntilPassed:
      return "safe_until has passed";
  }
  return "";
}

}  // namespace leasehold::cli
