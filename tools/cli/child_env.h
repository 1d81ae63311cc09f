// File: tools/cli/child_env.h
//
// Helpers for the command that `leasehold run` supervises (supervisor.h runs it): its
// environment, and signal names for log lines.
//
// Thread safety: BuildChildEnvironment reads environ (no setenv may run meanwhile); SignalName
// is thread-safe.

#pragma once

#include <string>
#include <vector>

#include "leasehold/lease.h"

namespace leasehold::cli {

// Returns the current environment without any variable named in `drop`, plus `add`.
std::vector<std::string> BuildChildEnvironment(const std::vector<std::string>& drop,
                                               const std::vector<std::string>& add);

// Returns the current environment with the lease's variables for its command: LEASEHOLD_KEY,
// LEASEHOLD_FENCING_TOKEN (`token`: the lease's, or an election's term), LEASEHOLD_STORE_KEY
// (Lease::store_key(): where the store keeps the grant, e.g. for an etcd Txn compare), plus
// `extra` ("NAME=value"). Inherited variables of those names are replaced.
std::vector<std::string> LeaseChildEnvironment(const Lease& lease, FencingToken token,
                                               std::vector<std::string> extra = {});

// Returns "SIGTERM" for SIGTERM, "signal 42" for an unnamed one.
std::string SignalName(int sig);

}  // namespace leasehold::cli
