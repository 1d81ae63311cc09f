// File: tools/cli/elect_command.h
//
// `leasehold elect NAME -- COMMAND...` (run_command.h's supervision, under an election's
// leadership lease).
//
// Thread safety: call once, from the main thread (as RunCommand).

#pragma once

#include <string>

#include "run_command.h"

namespace leasehold::cli {

// `leasehold elect NAME [--id ID] [--again] -- COMMAND...`: campaigns in election NAME
// (leasehold/election.h) and runs COMMAND while leader, supervised exactly as `run` supervises
// it. The child sees LEASEHOLD_ELECTION, LEASEHOLD_TERM, LEASEHOLD_LEADER_ID, and LEASEHOLD_KEY /
// LEASEHOLD_FENCING_TOKEN (the term again) / LEASEHOLD_STORE_KEY as under `run`. Waits for
// leadership for as long as it takes unless --wait says otherwise. With --again it campaigns again
// after the command ends or leadership is lost, until SIGINT/SIGTERM/SIGHUP.
struct ElectFlags {
  std::string name;
  bool again = false;
  // store_url, command, ttl, renew_every, wait, kill_grace, contain, wait_children as for run;
  // holder is --id (default "<hostname>:<pid>"); key is unused.
  RunFlags run;
};

// Returns the outcome: as RunCommand's, the last command's when --again stops.
CommandExit ElectCommand(const ElectFlags& flags);

}  // namespace leasehold::cli
