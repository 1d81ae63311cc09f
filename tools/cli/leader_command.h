// File: tools/cli/leader_command.h
//
// `leasehold leader NAME [--watch] [--json]`: prints the leader of election NAME
// (leasehold/election.h), or with --watch the current leader and then every change, one line
// each, until SIGINT/SIGTERM/SIGHUP (exit 0).
//
//   text:  "svc: leader web-3:42 (term 7, 8.1s left)" or "svc: no leader"
//   json:  {"name": "svc", "leader": true, "id": "web-3:42", "term": 7, "remaining_ms": 8123}
//          or {"name": "svc", "leader": false}; with --watch, one object per line
//
// A term that jumps by more than one between two lines of --watch means a leader came and went
// between two reads of the store (see Election::Observe).
//
// Thread safety: call once, from the main thread.

#pragma once

#include <string>

namespace leasehold::cli {

// Returns the process exit code (exit_codes.h).
int LeaderCommand(const std::string& store_url, const std::string& name, bool watch, bool json);

}  // namespace leasehold::cli
