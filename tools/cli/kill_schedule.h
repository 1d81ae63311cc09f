// File: tools/cli/kill_schedule.h
//
// KillSchedule: when the process tree of `leasehold run` / `elect` gets SIGTERM and SIGKILL
// because of its lease, the CLI's safety core (README, "The process tree is what the lease
// guards"). Pure: it is given the time and the lease's state and says what to do; the caller
// (LeaseGuard in supervised_run.cc) signals the tree, moves the keeper's dead man's switch
// (Supervisor::SetDeadline) and arms its timer for the next instant.
//
//   - Held or at risk: SIGTERM at safe_until - kill_grace, SIGKILL at safe_until. safe_until
//     moves forward with every confirmed renewal, so a healthy lease never gets there.
//   - At risk with --on-risk=term: SIGTERM at once, SIGKILL at safe_until.
//   - Lost (the store says the grant is not ours, or safe_until passed): SIGTERM at once,
//     SIGKILL after the grace, never later than safe_until.
//   - Woken late (the process was stopped, the machine suspended): whatever is due is done at
//     once; past safe_until that is SIGKILL, never a SIGTERM first.
//   - The keeper follows the same schedule, its SIGTERM a little behind ours (min(grace/4,
//     100ms)) so that it never doubles it, its SIGKILL exactly at the kill instant.
//
// Example:
//
//   KillSchedule schedule(settings.kill_grace, settings.term_on_risk);
//   KillSchedule::Step step = schedule.At(clock.Now(), lease.state(), lease.safe_until());
//   if (step.signal != 0) { signal the tree; log KillSchedule::Why(step.reason) }
//   tree.SetDeadline(step.keeper_term_at, step.keeper_kill_at);
//   if (step.next) { arm the timer for *step.next }
//
// Thread safety: none; one owner.

#pragma once

#include <optional>

#include "leasehold/clock.h"
#include "leasehold/options.h"

namespace leasehold::cli {

class KillSchedule {
 public:
  // Why a signal is sent now.
  enum class Reason {
    kNone,             // nothing is sent
    kUnconfirmed,      // SIGTERM: safe_until - kill_grace reached without a confirmed renewal
    kAtRiskTerm,       // SIGTERM: at risk, --on-risk=term
    kLost,             // SIGTERM: the lease is lost
    kGraceOver,        // SIGKILL: the grace after a loss is over
    kSafeUntilPassed,  // SIGKILL: safe_until has passed
  };

  // What to do at one instant.
  struct Step {
    int signal = 0;  // SIGTERM, SIGKILL or 0
    Reason reason = Reason::kNone;
    // When SIGKILL is due (for the log line of a SIGTERM).
    SteadyTime kill_at{};
    // The keeper's dead man's switch (Supervisor::SetDeadline): SteadyTime{} for a SIGTERM
    // already sent.
    SteadyTime keeper_term_at{};
    SteadyTime keeper_kill_at{};
    // When to call At again; nullopt once SIGKILL is sent (nothing is left to schedule).
    std::optional<SteadyTime> next;
  };

  // REQUIRES: kill_grace > 0.
  KillSchedule(Duration kill_grace, bool term_on_risk)
      : kill_grace_(kill_grace), term_on_risk_(term_on_risk) {}

  // The schedule at `now`, for a lease in `state` whose guarantee ends at `safe_until`. Each
  // signal is returned once; a loss is remembered (its instant starts the grace).
  Step At(SteadyTime now, LeaseState state, SteadyTime safe_until);

  // The reason in words, for the log line that goes with the signal.
  static const char* Why(Reason reason);

  // True once a loss was seen.
  [[nodiscard]] bool lost() const { return lost_; }

  [[nodiscard]] bool term_sent() const { return term_sent_; }

  [[nodiscard]] bool kill_sent() const { return kill_sent_; }

 private:
  const Duration kill_grace_;
  const bool term_on_risk_;
  bool lost_ = false;
  SteadyTime lost_at_{};
  bool term_sent_ = false;
  bool kill_sent_ = false;
};

}  // namespace leasehold::cli
