// File: tools/cli/cli_log.h
//
// The command's own event lines on stderr, "leasehold: " first, one write(2) per line so that
// lines from the heartbeat thread and from the command never interleave mid-line. --quiet
// silences Info() (and the library's info lines) but never Error().
//
// Example:
//
//   cli::Info(fmt::format("acquired {} (fencing token {})", key, token));
//   cli::Error("store unavailable: ...");
//
// Thread safety: thread-safe.

#pragma once

#include <string_view>

namespace leasehold::cli {

// Silences Info() and lowers the library's log level to warnings. Call before any thread starts.
void SetQuiet(bool quiet);

// Returns what SetQuiet set.
bool IsQuiet();

enum class LogFormat {
  // "leasehold: <line>"; the library's events as "leasehold: event key=value ...".
  kText,
  // One JSON object per line: {"ts":"<UTC RFC 3339>","level":"info","event":"acquired",
  // "key":"job","fencing_token":7,...}; our own lines as {"event":"message","msg":"..."}.
  kJson,
};

// Routes the library's log records (leasehold/logging.h) and Info()/Error() through one writer
// in `format`. Call before any thread starts.
void SetLogFormat(LogFormat format);

// Writes "leasehold: <line>\n" to stderr unless --quiet.
void Info(std::string_view line);

// Writes "leasehold: <line>\n" to stderr. Newlines inside `line` are replaced by "; ", so that
// one error is always one line.
void Error(std::string_view line);

}  // namespace leasehold::cli
