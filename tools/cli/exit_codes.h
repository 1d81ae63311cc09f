// File: tools/cli/exit_codes.h
//
// The exit codes of the `leasehold` command, one per outcome, so that scripts can tell "someone
// else is running the job" from "the store is down". The numbers follow sysexits.h where one
// fits (64 usage, 69 unavailable, 70 software, 75 temporary failure, 77 no permission) and the
// shell for the rest (126/127 for a command that cannot run, 128+N for death by signal N).
// The README copies ExitCodeHelp(); keep them in step.
//
// Thread safety: constants and pure functions.

#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "leasehold/status.h"

namespace leasehold::cli {

// status: the key is free (no live grant; a grant whose holder is gone counts as free). 0 is
// held; an unreachable store is kExitUnavailable, as for every command.
inline constexpr int kExitFree = 1;
// Usage or invalid argument: bad flags, bad key, bad duration, unknown URL scheme, a file that
// is not a leasehold database.
inline constexpr int kExitUsage = 64;
// The store could not be reached or did not answer.
inline constexpr int kExitUnavailable = 69;
// A bug in leasehold.
inline constexpr int kExitInternal = 70;
// The key is held by another (no --wait, or the wait ran out).
inline constexpr int kExitHeldByAnother = 75;
// The store refused access, or its directory is not writable.
inline constexpr int kExitPermissionDenied = 77;
// The lease was lost (expired, force-released or taken over) and the child was stopped.
inline constexpr int kExitLeaseLost = 79;
// run --once-per: the schedule slot was already done (by this or another host).
inline constexpr int kExitSlotDone = 80;
// check: a finding says leases or fencing tokens would not be safe on this store (fencing
// counters a restart resets, a TTL below the rule, a store that grants less than asked); every
// other command: the store refused to open for a setting that would not keep leases safe (Redis
// with an eviction policy).
inline constexpr int kExitCheckUnsafe = 81;
// The command was found but could not be executed (as in a shell).
inline constexpr int kExitCannotExecute = 126;
// The command was not found (as in a shell).
inline constexpr int kExitCommandNotFound = 127;
// Death by signal N is reported as kExitSignalBase + N (as in a shell).
inline constexpr int kExitSignalBase = 128;
// Interrupted by SIGINT, SIGTERM or SIGHUP while waiting for the lease.
inline constexpr int kExitInterrupted = 130;

// Returns the exit code for a failed library call. REQUIRES: !status.ok().
inline int ExitCodeFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return 0;
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnimplemented:  // e.g. a backend not built in: the URL is unusable here
      return kExitUsage;
    case StatusCode::kHeldByAnother:
    case StatusCode::kDeadlineExceeded:
      return kExitHeldByAnother;
    case StatusCode::kLost:
      return kExitLeaseLost;
    case StatusCode::kUnavailable:
      return kExitUnavailable;
    case StatusCode::kCancelled:
      return kExitInterrupted;
    case StatusCode::kPermissionDenied:
      return kExitPermissionDenied;
    case StatusCode::kInternal:
      return kExitInternal;
    case StatusCode::kFailedPrecondition:
      return kExitCheckUnsafe;
  }
  return kExitInternal;
}

// What `run` and `elect` end with: one of leasehold's own outcomes above, or the command's own
// exit code (its 0..125, or 128+N for its death by signal N), which --exit-code never moves.
struct CommandExit {
  CommandExit(int own_code) : code(own_code) {}  // NOLINT(google-explicit-constructor)

  static CommandExit FromCommand(int command_code) {
    CommandExit e(command_code);
    e.from_command = true;
    return e;
  }

  int code;
  bool from_command = false;
};

// --exit-code OUTCOME=N (flock -E for each outcome): leasehold's own code for OUTCOME becomes N
// (0..255), so that a job's own 75 or 80 is never mistaken for "held by another" or "slot
// done". OUTCOME: usage, unavailable, internal, held, permission, lost, done, unsafe,
// cannot-execute, not-found, interrupted. Returns {own code -> N}, or kInvalidArgument naming
// the bad spec and the outcomes.
Result<std::map<int, int>> ParseExitCodeMap(const std::vector<std::string>& specs);

// The process exit code of `exit` under `map`: the command's own code as it is, leasehold's
// moved where the map says.
inline int ExitCodeOf(const CommandExit& exit, const std::map<int, int>& map) {
  if (exit.from_command) {
    return exit.code;
  }
  const auto moved = map.find(exit.code);
  return moved == map.end() ? exit.code : moved->second;
}

// The exit-code table printed at the end of every --help.
inline constexpr std::string_view kExitCodeHelp =
    "Exit codes:\n"
    "  0..125  run/elect: the command's own exit code on normal completion\n"
    "  0 / 1   status: the key is held / free\n"
    "  64      usage or invalid argument (bad flag, key, duration, URL scheme, not a leasehold "
    "store)\n"
    "  69      store unavailable\n"
    "  70      internal error\n"
    "  75      held by another / not elected (no --wait, or the wait expired)\n"
    "  77      permission denied (store refused access, store directory not writable)\n"
    "  79      lease (or leadership) lost, command stopped\n"
    "  80      run --once-per: this schedule slot is already done (nothing run)\n"
    "  81      check: a finding is unsafe (see its line for what to change); other commands:\n"
    "          the store's settings would not keep leases safe (the message names the fix)\n"
    "  126     run/elect: command found but not executable\n"
    "  127     run/elect: command not found\n"
    "  128+N   run/elect: the command died of signal N\n"
    "  130     interrupted (SIGINT/SIGTERM/SIGHUP) while waiting for the lease\n"
    "run/elect --exit-code OUTCOME=N moves one of leasehold's own codes (usage 64, unavailable "
    "69,\n"
    "internal 70, held 75, permission 77, lost 79, done 80, unsafe 81, cannot-execute 126,\n"
    "not-found 127, interrupted 130) to N; the command's own code is never moved.\n";

}  // namespace leasehold::cli
