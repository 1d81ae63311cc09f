// File: backends/sqlite/sqlite_options.h (internal)
//
// SqliteOptions: how the embedded sqlite:// store is opened. The URL and this struct are two
// views of one configuration:
//
//   sqlite:///var/lib/app/leases.db?busy_timeout=500ms
//   sqlite://relative/leases.db            (relative to the working directory)
//   sqlite:///var/lib/leasehold/leases.db?scope=host   (a file every local user shares)
//   sqlite://                              (DefaultSqlitePath(), scope=host)
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

// The query parameters a sqlite:// URL accepts.
inline constexpr std::string_view kSqliteBusyTimeoutParam = "busy_timeout";
inline constexpr std::string_view kSqliteScopeParam = "scope";

// The longest busy_timeout: sqlite3_busy_timeout takes an int of milliseconds.
inline constexpr Duration kSqliteMaxBusyTimeout = std::chrono::milliseconds(2'000'000'000);

struct SqliteOptions {
  // The database file; created if missing (host_scope: 0666, the directory that holds it
  // 1777 and the others 0755; else 0600 and 0700). Relative paths are relative to the working
  // directory.
  // Default: DefaultSqlitePath() (FromUrl fills it in for "sqlite://", with host_scope).
  std::string path;

  // Every local user shares the file: whoever runs leasehold on this host excludes everyone
  // else who does (the default store). Created files and the directory are writable by all
  // (the directory sticky, as /tmp: nobody deletes another user's file); an existing file keeps
  // its mode. Without it a file made here is private to its owner.
  // URL: scope=host (or scope=user). Default: false, true for "sqlite://".
  bool host_scope = false;

  // How long one call waits for another process's write lock before it returns kUnavailable.
  // Must be >= 0 and at most about 24 days (SQLite takes milliseconds as an int).
  // URL: busy_timeout=2s. Default: 2 s.
  Duration busy_timeout = std::chrono::seconds(2);

  // Replaces the kernel boot id (/proc/sys/kernel/random/boot_id) that every grant records, so
  // tests can simulate a reboot. Not settable from a URL.
  // Default: empty (read the kernel's).
  std::string boot_id_for_testing;

  // Builds options from a "sqlite" URL. Returns kInvalidArgument for another scheme, an
  // unknown query parameter (named in the message), a bad busy_timeout or scope.
  static Result<SqliteOptions> FromUrl(const Url& url);
};

}  // namespace leasehold::internal
