// File: core/logging.h (internal)
//
// One line per event. The implementation of leasehold/logging.h: until the embedding program
// installs a sink (leasehold::SetLogSink), lines go to stderr prefixed with "leasehold: ".
// Never pass a full owner token or a password here.
//
// Thread safety: thread-safe.

#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/logging.h"

namespace leasehold::internal {

using LogLevel = ::leasehold::LogLevel;

// Returns true if a record at `level` would be emitted: check before formatting fields.
bool LogEnabled(LogLevel level);

// Emits one free-text line (event "message"). Cheap when the level is below the threshold.
void Log(LogLevel level, std::string_view line);

// Emits one event with its fields; the text line is `event name=value ...` (logfmt quoting).
void LogEvent(LogLevel level, std::string_view event, std::initializer_list<LogField> fields);

// Replaces the process-wide sink with one that takes only the level and the text line; nullptr
// restores stderr. Kept for callers that want the plain line (tests, the CLI's text format).
void SetLogSink(std::function<void(LogLevel, std::string_view)> sink);

// Lines below `level` are dropped. Default: kInfo, or kDebug if LEASEHOLD_DEBUG is set.
void SetLogLevel(LogLevel level);

// Formats a duration as seconds with microsecond precision, e.g. "0.000412", for log fields.
std::string LogSeconds(Duration d);

// Appends `value` to `out` as a logfmt value: bare if it is a plain word, else in double quotes
// with \" \\ \n \t escaped.
void AppendLogfmtValue(std::string& out, std::string_view value);

}  // namespace leasehold::internal
