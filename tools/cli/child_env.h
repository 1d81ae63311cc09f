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

namespace leasehold::cli {

// Returns the current environment without any variable named in `drop`, plus `add`.
std::vector<std::string> BuildChildEnvironment(const std::vector<std::string>& drop,
                                               const std::vector<std::string>& add);

// Returns "SIGTERM" for SIGTERM, "signal 42" for an unnamed one.
std::string SignalName(int sig);

}  // namespace leasehold::cli
