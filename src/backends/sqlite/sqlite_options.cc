// File: backends/sqlite/sqlite_options.cc (internal)
//
// SqliteOptions::FromUrl. Unknown parameters are errors, never ignored: a typo such as
// "busytimeout=10s" must not silently leave the 2 s default in place.

#include "backends/sqlite/sqlite_options.h"

#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends/sqlite/sqlite_backend.h"
#include "core/duration.h"

namespace leasehold::internal {

namespace {

// sqlite3_busy_timeout takes an int of milliseconds.
constexpr Duration kMaxBusyTimeout = std::chrono::milliseconds(2'000'000'000);

}  // namespace

Result<SqliteOptions> SqliteOptions::FromUrl(const Url& url) {
  if (url.scheme != "sqlite") {
    return Status::InvalidArgument(
        fmt::format("expected a sqlite:// URL, got scheme \"{}\"", url.scheme));
  }
  std::vector<std::string> unknown;
  for (const auto& [name, value] : url.query) {
    if (name != kSqliteBusyTimeoutParam) {
      unknown.push_back(name);
    }
  }
  if (!unknown.empty()) {
    return Status::InvalidArgument(fmt::format("unknown sqlite:// URL parameter{} {} (known: {})",
                                               unknown.size() == 1 ? "" : "s",
                                               fmt::join(unknown, ", "), kSqliteBusyTimeoutParam));
  }

  SqliteOptions options;
  if (auto it = url.query.find(kSqliteBusyTimeoutParam); it != url.query.end()) {
    Result<Duration> timeout = ParseDuration(it->second);
    if (!timeout.ok()) {
      return timeout.status().WithContext("sqlite:// URL parameter busy_timeout");
    }
    if (*timeout > kMaxBusyTimeout) {
      return Status::InvalidArgument(
          fmt::format("sqlite:// URL parameter busy_timeout={} is too long (at most {})",
                      it->second, FormatDuration(kMaxBusyTimeout)));
    }
    options.busy_timeout = *timeout;
  }

  if (url.path.empty()) {
    LH_ASSIGN_OR_RETURN(options.path, DefaultSqlitePath());
  } else {
    options.path = url.path;
  }
  return options;
}

}  // namespace leasehold::internal
