// File: tools/cli/supervised_run.h
//
// What `leasehold run` and `leasehold elect` share: the lease flags read into settings
// (ParseSettings), the signal mask and descriptors made before the store opens
// (BlockSignals), lease options whose callbacks wake the supervisor loop
// (SupervisedLeaseOptions), and the run of the command as a supervised process tree under a
// lease, with its kill schedule (RunUnderLease; supervisor.h runs the processes).
//
// Thread safety: call from the main thread only (see run_command.h).

#pragma once

#include <signal.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease.h"
#include "leasehold/options.h"
#include "leasehold/schedule.h"
#include "leasehold/status.h"
#include "leasehold/store.h"

#include "interrupt_watcher.h"
#include "observability.h"
#include "run_command.h"
#include "supervisor.h"
#include "unique_fd.h"

namespace leasehold::cli {

// The lease flags of `run` / `elect`, read and checked.
struct RunSettings {
  Duration ttl{};
  Containment contain = Containment::kAuto;
  std::optional<Duration> renew_interval;
  // nullopt: try once.
  std::optional<Duration> wait;
  Duration kill_grace{};
  // --once-per and its shape; nullopt: an ordinary run.
  std::optional<SlotGrid> slot;
  bool retry_failed = true;
  // --hold-at-least; zero: release at once.
  Duration hold_at_least{};
  // --keep-history; zero: the least the slot needs (two periods and the tolerance).
  Duration keep_history{};
};

// Reads and cross-checks the duration flags, naming the flag in every error.
Result<RunSettings> ParseSettings(const RunFlags& flags);

// How the command's tree is run and stopped (the flags RunUnderLease needs besides the lease).
struct TreeSettings {
  Duration kill_grace{};
  Containment contain = Containment::kAuto;
  bool term_on_risk = false;   // --on-risk=term
  bool wait_children = false;  // --wait-children
};

// The tree settings of a run: from its settings and its --on-risk / --wait-children flags.
TreeSettings TreeSettingsFor(const RunSettings& settings, const RunFlags& flags);

// Finds `command`'s program as execvp will (a name with a '/' as it is, else the first match in
// $PATH, "/bin:/usr/bin" when unset) before any lease or slot is taken: nullopt if it can run;
// else prints one line and returns 127 (not found) or 126 (found, but not an executable file).
// The exec itself can still fail (a bad interpreter line); that case releases what it took.
std::optional<int> RefuseUnrunnableCommand(const std::vector<std::string>& command);

// The signal mask and descriptors of a supervised command, made before the store opens.
struct Supervision {
  sigset_t saved_mask{};
  UniqueFd signal_fd;
  UniqueFd event_fd;  // written by the lease callbacks; outlives the lease
  UniqueFd timer_fd;
  // --metrics-textfile: rewritten by the lease callbacks at each state change, after the lease
  // is taken (WriteMetricsTextfile) and when SupervisedSetup goes; null without the flag.
  std::shared_ptr<MetricsTextfile> textfile;
};

// Rewrites --metrics-textfile, if given (after the lease or slot is taken).
void WriteMetricsTextfile(const Supervision& sup);

// Blocks the supervised signals before any library thread exists, so that all of them inherit
// the mask and every supervised signal lands on the signalfd. SIGPIPE is blocked too, so that a
// closed stderr or store socket gives EPIPE instead of killing us and orphaning the command.
Result<std::unique_ptr<Supervision>> BlockSignals();

// What a supervised command sets up before it takes its lease (StartSupervision). The members
// go in reverse order: the metrics server first, the signal descriptors last.
struct SupervisedSetup {
  SupervisedSetup() = default;
  SupervisedSetup(SupervisedSetup&&) = default;
  SupervisedSetup& operator=(SupervisedSetup&&) = default;

  // The end of the run: --metrics-textfile written once more, with the release counted.
  ~SupervisedSetup() {
    if (sup != nullptr) {
      WriteMetricsTextfile(*sup);
    }
  }

  std::unique_ptr<Supervision> sup;
  // Ends a wait for the lease at SIGINT/SIGTERM/SIGHUP; the caller resets it after the wait.
  std::unique_ptr<InterruptWatcher> watcher;
  std::unique_ptr<Store> store;
  // Serves /metrics (--metrics-addr) until the command has ended and the lease is released;
  // null without the flag.
  std::unique_ptr<MetricsServer> metrics_server;
};

// In this order: blocks the supervised signals (BlockSignals), starts watching for interrupts,
// opens the store of --store, starts the metrics server of --metrics-addr (announcing it, or
// warning that it cannot bind: the job runs without it) and sets up --metrics-textfile with
// `key` as its label. Returns the first error.
Result<SupervisedSetup> StartSupervision(const RunFlags& flags, const std::string& key);

// Ends a wait for the lease: stops and destroys `watcher` and returns the signal that
// interrupted the wait (SIGINT, SIGTERM, SIGHUP), or 0 if none did.
int EndWait(std::unique_ptr<InterruptWatcher>& watcher);

// Lease options whose callbacks wake the supervisor loop.
LeaseOptions SupervisedLeaseOptions(const RunSettings& settings, const Supervision& sup);

// How a supervised run ended.
struct ChildOutcome {
  int exit_code = 0;
  // exit_code is the command's own (its exit, or 128+N for its signal), not leasehold's.
  bool from_command = false;
  // SIGINT/SIGTERM/SIGHUP reached us while the command ran.
  bool interrupted = false;
};

// The lease a supervised run holds, and how to prove and end it.
struct HeldLease {
  Store& store;
  const Lease& lease;
  // Lease::Release, SlotClaim::Finish or Leadership::Resign, with the exit code the run ends
  // with (the command's, 79, 126, 127...).
  std::function<Status(int)> release;
  // Lease::Confirm or Leadership::Confirm of the same grant (GrantWatch).
  std::function<Status()> confirm;
  // Names the lease in messages ("lease job", "leadership of svc").
  std::string what;
};

// Runs `command` with `env` as a supervised process tree while `held.lease` is held, until every
// process of the tree is gone, then calls `held.release`. While the tree runs, a GrantWatch
// (grant_watch.h) confirms the grant whenever the store reports the key changed, so that a
// force-release stops the tree at once where the store notifies. Returns the command's code,
// 79 if the lease was lost, 126/127 if the command could not run.
ChildOutcome RunUnderLease(const HeldLease& held, const std::vector<std::string>& command,
                           std::vector<std::string> env, const TreeSettings& settings,
                           Supervision& sup);

}  // namespace leasehold::cli
