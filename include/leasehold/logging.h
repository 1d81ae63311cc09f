// File: leasehold/logging.h
//
// Routes leasehold's log lines into the embedding program's logger. leasehold logs one line per
// lease event (acquired, renewed late, at risk, recovered, lost, released, handoff) with the
// key, the fencing token, the first 8 hex digits of the owner token and a latency where there
// is one, plus occasional free-text lines (a store that is unreachable while waiting...). The
// full owner token and store passwords never appear.
//
// Until a sink is installed, lines at kInfo and above go to stderr, prefixed "leasehold: ".
//
// Example:
//
//   leasehold::SetLogSink([](const leasehold::LogRecord& r) {
//     if (r.event == "lost") alerts.Page(r.line);
//     my_logger.Log(ToMyLevel(r.level), r.line);  // or r.fields, for structured loggers
//   });
//   leasehold::SetLogLevel(leasehold::LogLevel::kWarning);
//
// Thread safety: thread-safe. The sink is called from leasehold's heartbeat threads and from
// the threads that call into leasehold, one call at a time (calls are serialized), with no
// other leasehold lock held. It must not call back into SetLogSink.

#pragma once

#include <functional>
#include <span>
#include <string_view>

namespace leasehold {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// Returns "debug", "info", "warning" or "error".
std::string_view LogLevelName(LogLevel level);

// One field of an event, e.g. {"fencing_token", "42", true}.
struct LogField {
  std::string_view name;
  std::string_view value;
  // True if `value` is a number (fencing token, seconds): a JSON logger may print it unquoted.
  bool numeric = false;
};

// One log line. Every view is valid only during the sink call.
struct LogRecord {
  LogLevel level = LogLevel::kInfo;
  // The event's name: "acquired", "renewed_late", "at_risk", "recovered", "lost", "released",
  // "handoff", "force_released", "fenced_out" (a Lease::Write the store refused), "cpu_quota"
  // (the CPU quota of the process's cgroup can stop it for more than a tenth of a grant's TTL;
  // once per Store); "message" for a free-text line.
  std::string_view event;
  // The event's fields in a fixed order: key, fencing_token, token (8-hex-digit prefix),
  // backend, then event-specific ones (latency_seconds, reason, cause...). Empty for "message".
  std::span<const LogField> fields;
  // The whole line as text: `event name=value ...` (logfmt quoting), or the free text.
  std::string_view line;
};

using LogSink = std::function<void(const LogRecord&)>;

// Replaces the process-wide sink; an empty sink restores stderr.
void SetLogSink(LogSink sink);

// Records below `level` are dropped before they are formatted.
// Default: kInfo, or kDebug if the environment variable LEASEHOLD_DEBUG is set.
void SetLogLevel(LogLevel level);

}  // namespace leasehold
