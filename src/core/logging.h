// File: core/logging.h (internal)
//
// One line per event. Until the embedding program installs a sink (SetLogSinkForProcess), lines
// go to stderr prefixed with "leasehold: ". Never pass a full owner token or a password here.
//
// Thread safety: thread-safe.

#pragma once

#include <functional>
#include <string_view>

namespace leasehold::internal {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// Emits one event line. Cheap when the level is below the threshold.
void Log(LogLevel level, std::string_view line);

// Replaces the process-wide sink; nullptr restores stderr. Returns nothing; thread-safe.
void SetLogSink(std::function<void(LogLevel, std::string_view)> sink);

// Lines below `level` are dropped. Default: kInfo, or kDebug if LEASEHOLD_DEBUG is set.
void SetLogLevel(LogLevel level);

}  // namespace leasehold::internal
