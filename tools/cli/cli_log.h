// File: tools/cli/cli_log.h
//
// The command's own event lines on stderr, "leasehold: " first, one write(2) per line so that
// lines from the heartbeat thread and from the command never interleave mid-line.
//
// Silent on success (the Unix rule of silence: cron mails whatever a job prints): by default a
// run that takes its lease, runs its command and releases prints nothing. Each line has a
// level of verbosity:
//   Info    -v only: the lifecycle (acquired, store, containment, started, exited, released,
//           and the library's info lines);
//   Notice  by default, not with -q: a normal outcome that is not a success (held by another,
//           the slot done, not elected, a force-release's result, a signal that stops the run);
//   Warn    by default, not with -q: something the operator should fix that does not stop
//           the command (a metrics port that cannot be bound);
//   Alarm   always: the lease at risk or recovered, the kill schedule applied;
//   Error   always: errors, and a lost lease (the library's warnings and errors print always).
//
// Example:
//
//   cli::Info(fmt::format("acquired {} (fencing token {})", key, token));
//   cli::Notice("held", "job is held by another: held by web-2:41 (fencing token 7, 8.1s left)");
//   cli::Error("store unavailable: ...");
//
// Thread safety: thread-safe.

#pragma once

#include <string_view>

namespace leasehold::cli {

enum class Verbosity {
  kQuiet,    // -q: Alarm and Error only
  kNormal,   // the default: Notice, Warn, Alarm, Error
  kVerbose,  // -v: every line, and the library's info lines
};

// Sets which lines print, and the library's log level (info with kVerbose, else warning). Call
// before any thread starts.
void SetVerbosity(Verbosity verbosity);

enum class LogFormat {
  // "leasehold: <line>"; the library's events as "leasehold: event key=value ...".
  kText,
  // One JSON object per line: {"ts":"<UTC RFC 3339, ms>","level":"info","event":"acquired",
  // "key":"job","fencing_token":7,...}; our own lines as {"event":"<Notice's event, or
  // message>","msg":"..."}.
  kJson,
};

// Routes the library's log records (leasehold/logging.h) and Info()/Error() through one writer
// in `format`. Call before any thread starts.
void SetLogFormat(LogFormat format);

// Writes "leasehold: <line>\n" to stderr with -v only (level info).
void Info(std::string_view line);

// Writes "leasehold: <line>\n" to stderr unless -q (level info; in JSON, event `event`).
void Notice(std::string_view event, std::string_view line);

// Writes "leasehold: warning: <line>\n" to stderr unless -q (level warning).
void Warn(std::string_view line);

// Writes "leasehold: <line>\n" to stderr, even with -q (level warning).
void Alarm(std::string_view line);

// Writes "leasehold: <line>\n" to stderr. Newlines inside `line` are replaced by "; ", so that
// one error is always one line.
void Error(std::string_view line);

}  // namespace leasehold::cli
