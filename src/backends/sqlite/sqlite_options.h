// File: backends/sqlite/sqlite_options.h (internal)
//
// SqliteOptions: how the embedded sqlite:// store is opened. The URL and this struct are two
// views of one configuration:
//
//   sqlite:///var/lib/app/leases.db?busy_timeout=500ms
//   sqlite://relative/leases.db            (relative to the working directory)
//   sqlite://                              (DefaultSqlitePath())
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("sqlite:///tmp/leases.db?busy_timeout=1s"));
//   LH_ASSIGN_OR_RETURN(SqliteOptions options, SqliteOptions::FromUrl(url));
//   LH_ASSIGN_OR_RETURN(auto backend, SqliteBackend::Open(options));
//
// Thread safety: a plain value type.

#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "core/url.h"

namespace leasehold::internal {

// The only query parameter a sqlite:// URL accepts.
inline constexpr std::string_view kSqliteBusyTimeoutParam = "busy_timeout";

// The longest busy_timeout: sqlite3_busy_timeout takes an int of milliseconds.
inline constexpr Duration kSqliteMaxBusyTimeout = std::chrono::milliseconds(2'000'000'000);

struct SqliteOptions {
  // The database file; created (0600, parent directories 0700) if missing. Relative paths are
  // relative to the working directory.
  // Default: DefaultSqlitePath() (FromUrl fills it in for "sqlite://").
  std::string path;

  // How long one call waits for another process's write lock before it returns kUnavailable.
  // Must be >= 0 and at most about 24 days (SQLite takes milliseconds as an int).
  // URL: busy_timeout=2s. Default: 2 s.
  Duration busy_timeout = std::chrono::seconds(2);

  // Replaces the kernel boot id (/proc/sys/kernel/random/boot_id) that every grant records, so
  // tests can simulate a reboot. Not settable from a URL.
  // Default: empty (read the kernel's).
  std::string boot_id_for_testing;

  // Builds options from a "sqlite" URL. Returns kInvalidArgument for another scheme, an
  // unknown query parameter (named in the message), a bad busy_timeout, or an empty path when
  // no default path can be found ($XDG_STATE_HOME and $HOME unset).
  static Result<SqliteOptions> FromUrl(const Url& url);
};

}  // namespace leasehold::internal
