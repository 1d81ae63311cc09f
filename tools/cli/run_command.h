// File: tools/cli/run_command.h
//
// `leasehold run KEY -- COMMAND...`: runs COMMAND while holding KEY (README, "The command
// line"; docs/leasehold.1).
//
//   1. Blocks SIGINT, SIGTERM, SIGHUP, SIGCHLD and SIGCONT (and SIGPIPE) before the store opens,
//      so that every library thread inherits the mask and the signals arrive on one signalfd.
//   2. Takes the lease (try once, or wait up to --wait; SIGINT/SIGTERM/SIGHUP end the wait: 130).
//   3. Starts COMMAND as a supervised process tree (supervisor.h): a keeper process that is a
//      subreaper, in its own session, contains the tree (--contain: a cgroup v2 leaf, a PID
//      namespace, or the process group only) and kills it by itself when leasehold dies
//      (kill -9 included) or does not run at safe_until (its dead man's switch). COMMAND sees
//      LEASEHOLD_KEY, LEASEHOLD_FENCING_TOKEN and LEASEHOLD_STORE_KEY (Lease::store_key) in its
//      environment (never the owner token).
//   4. Supervises with poll() over the signalfd, an eventfd written by the lease's callbacks
//      (state changes, losses and every renewal), a CLOCK_BOOTTIME timerfd and the keeper's
//      report socket:
//        - SIGINT/SIGTERM/SIGHUP go to the command's process group, as job control would
//          (to the whole tree once only leftovers of an exited command remain);
//        - without a confirmed renewal the whole tree gets SIGTERM at safe_until - kill_grace
//          and SIGKILL at safe_until, so it is gone before anyone else can acquire the lease;
//        - if the store says the grant is no longer ours (force-release, take-over), SIGTERM at
//          once and SIGKILL after kill_grace (or at safe_until if that comes first);
//        - after a SIGSTOP past safe_until, SIGCONT wakes the loop and the tree is killed at
//          once (the keeper has usually done it already, at safe_until);
//        - when COMMAND's own process exits and descendants remain, they are stopped (SIGTERM,
//          kill_grace, SIGKILL) before the lease is released, or waited for (--wait-children).
//   5. Once every process of the tree is gone, releases the lease and exits with COMMAND's own
//      code, or 79 if the lease was lost. With --hold-at-least the release leaves the grant in
//      the store until that long after it was taken.
// With --once-per, step 2 claims the current schedule slot (Store::ClaimSlot): exit 80 at once if
// the slot is done, 75 if another host is running it (or wait, with --wait); step 5 records the
// run (exit 0: done; else a failed attempt, which leaves the slot open unless --retry-failed=no)
// in the same atomic step as the release.
//
// Thread safety: call once, from the main thread (the keeper's PDEATHSIG follows the forking
// thread).

#pragma once

#include <optional>
#include <string>
#include <vector>

#include "exit_codes.h"
#include "observability.h"

namespace leasehold::cli {

struct RunFlags {
  // --store; empty means Store::DefaultUrl().
  std::string store_url;
  std::string key;
  // COMMAND and its arguments. REQUIRES: not empty.
  std::vector<std::string> command;
  // --ttl. Default: 10s.
  std::string ttl = "10s";
  // --renew-every. Default: ttl / 3 (the library's default).
  std::optional<std::string> renew_every;
  // --wait: a duration or "forever". Default: none (try once).
  std::optional<std::string> wait;
  // --long-ttl: allows a --ttl above one hour.
  bool long_ttl = false;
  // --kill-grace. Default: min(ttl / 4, 5s).
  std::optional<std::string> kill_grace;
  // --contain: auto, cgroup, pidns or group (supervisor.h). Default: auto.
  std::string contain = "auto";
  // --wait-children: wait for the command's leftovers instead of stopping them.
  bool wait_children = false;
  // --holder. Default: the library's "<hostname>:<pid>".
  std::string holder;
  // --limit N: a semaphore of N (LeaseOptions::limit); --shared: a shared lease. The command
  // sees LEASEHOLD_SLOT (the grant's slot) under either, and LEASEHOLD_LIMIT under --limit.
  // Neither goes with --once-per. Default: an exclusive lease.
  std::uint32_t limit = 1;
  bool shared = false;
  // --metrics-addr, --log-format, --on-risk.
  ObservabilityFlags observability;
  // --once-per PERIOD (leasehold/schedule.h): run at most once successfully per slot of the
  // grid; --slot-offset, --slot-zone, --slot-tolerance shape the grid; --retry-failed=no makes
  // a failed run close its slot too. Unset: an ordinary run.
  std::optional<std::string> once_per;
  std::optional<std::string> slot_offset;
  std::string slot_zone;
  std::optional<std::string> slot_tolerance;
  std::string retry_failed = "yes";
  // --hold-at-least: the grant stays in the store this long after it was taken, without the
  // process (ReleaseOptions::hold_at_least).
  std::optional<std::string> hold_at_least;
  // --keep-history: how long the store keeps the key's --once-per run history after a run
  // (SlotFinish::keep_history).
  std::optional<std::string> keep_history;
  // --exit-code OUTCOME=N, as given (ParseExitCodeMap); applied by the caller (ExitCodeOf).
  std::vector<std::string> exit_codes;
};

// Runs the command; returns leasehold's own outcome or the command's code (exit_codes.h).
CommandExit RunCommand(const RunFlags& flags);

}  // namespace leasehold::cli
