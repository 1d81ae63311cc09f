// File: tools/cli/run_command.cc

#include "run_command.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "leasehold/duration.h"
#include "leasehold/lease.h"
#include "leasehold/lease_info.h"
#include "leasehold/options.h"
#include "leasehold/schedule.h"
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

// Describes who holds `key` after a failed acquire, asking the store when the status does not say.
std::string HeldMessage(Store& store, const std::string& key, const Status& status, bool waited) {
  std::optional<LeaseInfo> holder;
  if (status.holder() != nullptr) {
    holder = *status.holder();
  } else {
    Result<std::optional<LeaseInfo>> info = store.Inspect(key);
    if (info.ok()) {
      holder = *info;
    }
  }
  std::string what = waited ? fmt::format("gave up waiting for {}", key)
                            : fmt::format("{} is held by another", key);
  if (holder.has_value() && holder->limit > 1) {
    // A full semaphore: say so, with the holder of its lowest slot.
    Result<std::vector<LeaseInfo>> all = store.Holders(key);
    const auto held =
        all.ok()
            ? std::count_if(all->begin(), all->end(),
                            [](const LeaseInfo& h) { return !h.holder_gone && !h.waiting_writer; })
            : 0;
    return fmt::format("{}: {} of its {} slots are held; slot {} by {}", what,
                       all.ok() ? std::to_string(held) : std::string("all"), holder->limit,
                       holder->slot, DescribeHolder(*holder));
  }
  if (holder.has_value() && holder->waiting_writer) {
    return fmt::format("{}: kept for {}",
                       waited ? what : fmt::format("{} cannot be shared now", key),
                       DescribeHolder(*holder));
  }
  if (holder.has_value()) {
    return fmt::format("{}: held by {}", what, DescribeHolder(*holder));
  }
  return fmt::format("{}: {}", what, Describe(status));
}

// Takes the lease (or claims the slot) with `attempt`: once, then, if the key is held and
// --wait allows, again waiting up to --wait (cancelled by SIGINT/SIGTERM/SIGHUP), announcing
// the wait. Sets `waited` if it waited.
template <typename T, typename Attempt>
Result<T> TakeOrWait(Attempt attempt, const std::string& key, std::optional<Duration> wait,
                     LeaseOptions options, InterruptWatcher& watcher, bool& waited) {
  options.wait = Duration::zero();
  Result<T> taken = attempt(options, std::stop_token());
  if (!taken.ok() && taken.error().code() == StatusCode::kHeldByAnother && wait.has_value() &&
      *wait > Duration::zero() && watcher.signal() == 0) {
    const LeaseInfo* holder = taken.error().holder();
    Info(fmt::format("{} is {} {}; waiting {}", key,
                     holder != nullptr && holder->waiting_writer ? "kept for" : "held by",
                     holder != nullptr ? DescribeHolder(*holder) : std::string("another"),
                     *wait == kWaitForever ? std::string("for as long as it takes")
                                           : "up to " + FormatDuration(*wait)));
    options.wait = *wait;
    waited = true;
    taken = attempt(options, watcher.token());
  }
  return taken;
}

// Reports a lease not taken and returns the exit code: 75 when held by another, a normal
// outcome on every host but one (a Notice: silent under --quiet, in every mode).
int ReportNotTaken(Store& store, const std::string& key, const Status& status, bool waited) {
  const StatusCode code = status.code();
  if (code == StatusCode::kHeldByAnother || code == StatusCode::kDeadlineExceeded) {
    Notice(waited ? "gave_up_waiting" : "held_by_another", HeldMessage(store, key, status, waited));
    return kExitHeldByAnother;
  }
  return ReportFailure(status);
}

}  // namespace

CommandExit RunCommand(const RunFlags& flags) {
  SetLogFormat(flags.observability.log_format == "json" ? LogFormat::kJson : LogFormat::kText);
  if (Status s = ValidateKey(flags.key); !s.ok()) {
    return ReportFailure(s);
  }
  if (flags.command.empty()) {
    return ReportFailure(Status::InvalidArgument("run: missing COMMAND after KEY --"));
  }
  Result<RunSettings> settings = ParseSettings(flags);
  if (!settings.ok()) {
    return ReportFailure(settings.error());
  }
  if (flags.shared && flags.limit > 1) {
    return ReportFailure(Status::InvalidArgument(
        "--shared takes no --limit: a shared lease admits any number of shared runs"));
  }
  const bool shares = flags.shared || flags.limit > 1;
  if (shares && settings->slot.has_value()) {
    return ReportFailure(Status::InvalidArgument(
        fmt::format("--once-per runs each slot once, on one host: it takes no {}",
                    flags.shared ? "--shared" : "--limit")));
  }
  // Resolve before you lock: a command that cannot run takes no lease and closes no slot.
  if (std::optional<int> refused = RefuseUnrunnableCommand(flags.command)) {
    return *refused;
  }
  // /metrics is served from before the wait until the command has ended and the lease is
  // released.
  Result<SupervisedSetup> setup = StartSupervision(flags, flags.key);
  if (!setup.ok()) {
    return ReportFailure(setup.error());
  }
  Supervision& sup = *setup->sup;
  std::unique_ptr<InterruptWatcher>& watcher = setup->watcher;
  Store& store = *setup->store;
  if (watcher->signal() != 0) {
    Error(fmt::format("interrupted before acquiring {}", flags.key));
    return kExitInterrupted;
  }

  LeaseOptions options = SupervisedLeaseOptions(*settings, sup);
  options.holder = flags.holder;
  options.limit = flags.limit;
  options.mode = flags.shared ? LeaseMode::kShared : LeaseMode::kExclusive;
  bool waited = false;
  if (settings->slot.has_value()) {
    Result<SlotClaim> claim = TakeOrWait<SlotClaim>(
        [&](const LeaseOptions& o, std::stop_token cancel) {
          return store.ClaimSlot(flags.key, *settings->slot, o, std::move(cancel));
        },
        flags.key, settings->wait, options, *watcher, waited);
    const int interrupted_by = EndWait(watcher);
    if (interrupted_by != 0) {
      Error(fmt::format("interrupted by {} while waiting for {}", SignalName(interrupted_by),
                        flags.key));
      return kExitInterrupted;  // a claim taken meanwhile is released unrecorded
    }
    if (!claim.ok()) {
      return ReportNotTaken(store, flags.key, claim.error(), waited);
    }
    const std::string slot = FormatSlotTime(claim->slot_start());
    const char* clock = claim->named_by_store_clock() ? "the store's clock" : "this host's clock";
    if (!claim->claimed()) {
      const SlotRun& done = *claim->done_by();
      Notice("slot_done",
             fmt::format(
                 "{}: slot {} is done{}: {} by {} (fencing token {}, exit {}) at {}; not running "
                 "(slot named by {})",
                 flags.key, slot,
                 done.slot_start > claim->slot_start()
                     ? fmt::format(" (a later slot, {}, has run)", FormatSlotTime(done.slot_start))
                     : "",
                 done.succeeded ? "ran" : "failed, not to be retried", Printable(done.holder),
                 done.fencing_token, done.exit_code, FormatSlotTime(done.ended), clock));
      return kExitSlotDone;
    }
    WriteMetricsTextfile(sup);
    Info(fmt::format("{}: claimed slot {} (named by {}; fencing token {}); {}", flags.key, slot,
                     clock, claim->lease().fencing_token(), DescribeStore(store)));
    Lease& lease = claim->lease();
    std::vector<std::string> env =
        LeaseChildEnvironment(lease, lease.fencing_token(), {"LEASEHOLD_SLOT=" + slot});
    const bool retry_failed = settings->retry_failed;
    const Duration hold = settings->hold_at_least;
    const Duration keep_history = settings->keep_history;
    const ChildOutcome outcome =
        RunUnderLease({.store = store,
                       .lease = lease,
                       .release =
                           [&claim, retry_failed, hold, keep_history](int code) {
                             return claim->Finish({.succeeded = code == 0,
                                                   .exit_code = code,
                                                   .retry_failed = retry_failed,
                                                   .hold_at_least = hold,
                                                   .keep_history = keep_history});
                           },
                       .confirm = [&lease] { return lease.Confirm(); },
                       .what = "lease " + flags.key},
                      flags.command, std::move(env), TreeSettingsFor(*settings, flags), sup);
    return outcome.from_command ? CommandExit::FromCommand(outcome.exit_code)
                                : CommandExit(outcome.exit_code);
  }
  Result<Lease> lease = TakeOrWait<Lease>(
      [&](const LeaseOptions& o, std::stop_token cancel) {
        return o.wait == Duration::zero() ? store.TryAcquire(flags.key, o)
                                          : store.Acquire(flags.key, o, std::move(cancel));
      },
      flags.key, settings->wait, options, *watcher, waited);
  const int interrupted_by = EndWait(watcher);
  if (interrupted_by != 0) {
    if (lease.ok()) {
      (void)lease->Release();
    }
    Error(fmt::format("interrupted by {} while waiting for {}", SignalName(interrupted_by),
                      flags.key));
    return kExitInterrupted;
  }
  if (!lease.ok()) {
    return ReportNotTaken(store, flags.key, lease.error(), waited);
  }

  // The acquisition was logged by the library ("acquired key=... fencing_token=... token=..."):
  // say where.
  Info(DescribeStore(store));
  WriteMetricsTextfile(sup);

  // Everything the child needs is allocated here, before fork().
  std::vector<std::string> extra;
  if (shares) {
    Info(fmt::format("{}: took {} slot {}{} (fencing token {})", flags.key,
                     LeaseKindName(lease->mode(), lease->limit()), lease->slot(),
                     lease->limit() > 1 ? fmt::format(" of {}", lease->limit()) : "",
                     lease->fencing_token()));
    extra.push_back(fmt::format("LEASEHOLD_SLOT={}", lease->slot()));
    if (lease->limit() > 1) {
      extra.push_back(fmt::format("LEASEHOLD_LIMIT={}", lease->limit()));
    }
  }
  std::vector<std::string> env =
      LeaseChildEnvironment(*lease, lease->fencing_token(), std::move(extra));
  const Duration hold = settings->hold_at_least;
  const ChildOutcome outcome = RunUnderLease(
      {.store = store,
       .lease = *lease,
       .release = [&lease, hold](int) { return lease->Release({.hold_at_least = hold}); },
       .confirm = [&lease] { return lease->Confirm(); },
       .what = "lease " + flags.key},
      flags.command, std::move(env), TreeSettingsFor(*settings, flags), sup);
  return outcome.from_command ? CommandExit::FromCommand(outcome.exit_code)
                              : CommandExit(outcome.exit_code);
}

}  // namespace leasehold::cli
