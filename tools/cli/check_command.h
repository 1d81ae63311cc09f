// File: tools/cli/check_command.h
//
// `leasehold check [--store URL] [--ttl D] [--probes N] [--json]`: the store doctor
// (leasehold/check.h, Store::Check). Prints a short block, one line per finding, then one line
// per failure saying what to change; with --json, one JSON object:
//   {"store": "redis://...", "backend": "redis", "verdict": "unsafe",
//    "round_trip": {"probe": "PING", "count": 50, "p50_ms": 0.21, "p99_ms": 0.4, "max_ms": 0.5},
//    "cycle": {"done": true, "key": "...", "acquire_ms": ..., "renew": {...}, "release_ms": ...,
//              "total_ms": ..., "fencing_token": 7, "ttl_requested_ms": ..., "ttl_granted_ms":
//              ...},
//    "clock": {"offset_ms": 0.8, "uncertainty_ms": 0.1} | null,
//    "ttl": {"granularity_ms": 0, "min_ms": ..., "recommended_ms": ..., "renew_every_ms": ...,
//            "judged": true, "safe": true},
//    "items": [{"area": "durability", "verdict": "unsafe", "found": "...", "fix": "..."}, ...]}
//
// Exit codes: 0 when every finding is a pass or a warning; 69 when the store cannot be reached
// (not at all, or a step of the check was not answered within the store's timeouts); 77 when a
// step was refused for lack of permission; 81 when a finding is unsafe (fencing that does not
// survive a restart, a TTL below the rule, ...); 64 for bad flags or a URL leasehold refuses. The
// worst finding decides.
//
// Thread safety: call from the main thread.

#pragma once

#include <string>

namespace leasehold::cli {

struct CheckFlags {
  std::string store_url;
  // Empty: no TTL is judged; the advice is printed.
  std::string ttl;
  int probes = 50;
  bool json = false;
};

int CheckCommand(const CheckFlags& flags);

}  // namespace leasehold::cli
