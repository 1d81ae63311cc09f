// File: tools/cli/elect_command.cc

#include "elect_command.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sys/signalfd.h>

#include "leasehold/clock.h"
#include "leasehold/duration.h"
#include "leasehold/election.h"
#include "leasehold/lease.h"
#include "leasehold/status.h"
#include "leasehold/store.h"

#include "child_env.h"
#include "cli_log.h"
#include "exit_codes.h"
#include "interrupt_watcher.h"
#include "observability.h"
#include "store_flag.h"
#include "supervised_run.h"

namespace leasehold::cli {

namespace {

using std::chrono::seconds;

// --again's pause after a term that ended at once.
constexpr Duration kShortTerm = seconds(1);
constexpr Duration kFirstPause = std::chrono::milliseconds(500);
constexpr Duration kMaxPause = seconds(30);

// Waits up to `limit` on the supervised signals; true if SIGINT/SIGTERM/SIGHUP came.
bool WaitForInterrupt(int signal_fd, Duration limit) {
  const SteadyTime end = Clock::Real().Now() + limit;
  for (;;) {
    const Duration left = end - Clock::Real().Now();
    if (left <= Duration::zero()) {
      return false;
    }
    pollfd p{signal_fd, POLLIN, 0};
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    if (::poll(&p, 1, static_cast<int>(ms)) < 0 && errno != EINTR) {
      return false;
    }
    signalfd_siginfo info{};
    while (ReadSignal(signal_fd, info)) {
      if (IsInterrupt(static_cast<int>(info.ssi_signo))) {
        return true;
      }
    }
  }
}

}  // namespace

CommandExit ElectCommand(const ElectFlags& flags) {
  const RunFlags& run = flags.run;
  SetLogFormat(run.observability.log_format == "json" ? LogFormat::kJson : LogFormat::kText);
  if (run.command.empty()) {
    return ReportFailure(Status::InvalidArgument("elect: missing COMMAND after NAME --"));
  }
  Result<RunSettings> settings = ParseSettings(run);
  if (!settings.ok()) {
    return ReportFailure(settings.error());
  }
  if (std::optional<int> refused = RefuseUnrunnableCommand(run.command)) {
    return *refused;  // before campaigning: a command that cannot run never leads
  }
  const std::string id = run.holder.empty() ? LeaseOptions::DefaultHolder() : run.holder;
  // /metrics is served across every term, until elect exits.
  Result<SupervisedSetup> setup = StartSupervision(run, "election:" + flags.name);
  if (!setup.ok()) {
    return ReportFailure(setup.error());
  }
  Supervision& sup = *setup->sup;
  std::unique_ptr<InterruptWatcher>& watcher = setup->watcher;
  Store& store = *setup->store;
  const Duration wait = settings->wait.value_or(kWaitForever);
  Election election(
      store, flags.name, id,
      {.lease = SupervisedLeaseOptions(*settings, sup),
       .on_event = [&](ElectionEvent event, const LeaderInfo& leader, const Status&) {
         // Runs on this thread for kNotElected; the supervisor reports a loss itself.
         if (event == ElectionEvent::kNotElected) {
           Notice("not_elected",
                  fmt::format("not elected: {} is led by {} (term {}); {}", flags.name,
                              leader.id.empty() ? std::string("another") : leader.id, leader.term,
                              wait == Duration::zero() ? std::string("giving up")
                              : wait == kWaitForever   ? std::string("waiting")
                                                       : "waiting up to " + FormatDuration(wait)));
         }
       }});
  CommandExit exit_code = CommandExit::FromCommand(0);
  Duration pause = Duration::zero();  // between short terms (--again)
  for (;;) {
    if (watcher == nullptr) {
      watcher = std::make_unique<InterruptWatcher>(sup.signal_fd.get());
    }
    Result<Leadership> leadership = Status::Cancelled("interrupted");
    if (watcher->signal() == 0) {
      leadership = election.Campaign(wait, watcher->token());
    }
    const int interrupted_by = EndWait(watcher);
    if (interrupted_by != 0) {
      if (leadership.ok()) {
        (void)leadership->Resign();
      }
      Error(fmt::format("interrupted by {} while campaigning in {}", SignalName(interrupted_by),
                        flags.name));
      return kExitInterrupted;
    }
    if (!leadership.ok()) {
      const StatusCode code = leadership.error().code();
      if (code == StatusCode::kHeldByAnother || code == StatusCode::kDeadlineExceeded) {
        Error(fmt::format("not elected in {}: {}", flags.name, Describe(leadership.error())));
        return kExitHeldByAnother;
      }
      return ReportFailure(leadership.error());
    }
    const Lease& lease = leadership->lease();
    WriteMetricsTextfile(sup);
    Info(fmt::format("elected leader of {} as {} (term {}, ttl {}, renew every {}); {}", flags.name,
                     id, leadership->term(), FormatDuration(lease.ttl()),
                     FormatDuration(RoundForDisplay(lease.renew_interval())),
                     DescribeStore(store)));
    std::vector<std::string> env = LeaseChildEnvironment(
        lease, leadership->term(),
        {"LEASEHOLD_ELECTION=" + flags.name, fmt::format("LEASEHOLD_TERM={}", leadership->term()),
         "LEASEHOLD_LEADER_ID=" + id});
    const SteadyTime term_start = Clock::Real().Now();
    ChildOutcome outcome =
        RunUnderLease({.store = store,
                       .lease = lease,
                       .release = [&leadership](int) { return leadership->Resign(); },
                       .confirm = [&leadership] { return leadership->Confirm(); },
                       .what = "leadership of " + flags.name},
                      run.command, std::move(env), TreeSettingsFor(*settings, run), sup);
    exit_code = outcome.from_command ? CommandExit::FromCommand(outcome.exit_code)
                                     : CommandExit(outcome.exit_code);
    if (!flags.again || outcome.interrupted) {
      return exit_code;
    }
    // A command that ends at once must not turn --again into a loop that hammers the store:
    // after a term shorter than kShortTerm, wait 0.5 s, then twice as long each time, up to 30 s.
    const Duration term = Clock::Real().Now() - term_start;
    pause = term < kShortTerm ? std::min<Duration>(pause * 2 + kFirstPause, kMaxPause)
                              : Duration::zero();
    Info(fmt::format("campaigning again in {}{} (--again; the command ended: exit {})", flags.name,
                     pause > Duration::zero()
                         ? " after " + FormatDuration(pause) + " (its term lasted only " +
                               FormatDuration(RoundForDisplay(term)) + ")"
                         : std::string(),
                     exit_code.code));
    if (pause > Duration::zero() && WaitForInterrupt(sup.signal_fd.get(), pause)) {
      Error(fmt::format("interrupted while pausing between terms of {}", flags.name));
      return exit_code;
    }
  }
}

}  // namespace leasehold::cli
