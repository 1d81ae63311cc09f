// File: backends/sqlite/sqlite_options.cc (internal)
//
// SqliteOptions::FromUrl, on the shared URL readers (backends/common/url_params.h). Unknown
// parameters are errors, never ignored: a typo such as "busytimeout=10s" must not silently
// leave the 2 s default in place.

#include "backends/sqlite/sqlite_options.h"

#include <string>
#include <string_view>

#include <fmt/format.h>

#include "backends/common/url_params.h"
#include "backends/sqlite/sqlite_backend.h"

namespace leasehold::internal {

Result<SqliteOptions> SqliteOptions::FromUrl(const Url& url) {
  if (url.scheme != "sqlite") {
    return Status::InvalidArgument(
        fmt::format("expected a sqlite:// URL, got scheme \"{}\"", url.scheme));
  }
  constexpr std::string_view kKnownParams[] = {kSqliteBusyTimeoutParam, kSqliteScopeParam};
  LH_RETURN_IF_ERROR(RefuseUnknownParams(url, kKnownParams));

  SqliteOptions options;
  // Zero is allowed: fail at once when another process holds the write lock.
  LH_RETURN_IF_ERROR(ReadDurationParam(url, kSqliteBusyTimeoutParam, Duration::zero(),
                                       kSqliteMaxBusyTimeout, &options.busy_timeout));

  std::string scope = url.path.empty() ? "host" : "user";
  LH_RETURN_IF_ERROR(ReadStringParam(url, kSqliteScopeParam, &scope));
  if (scope != "host" && scope != "user") {
    return BadParam(url, kSqliteScopeParam,
                    "must be host (every local user shares the file) or user (private to its "
                    "owner)");
  }
  options.host_scope = scope == "host";
  if (url.path.empty()) {
    LH_ASSIGN_OR_RETURN(options.path, DefaultSqlitePath());
  } else {
    options.path = url.path;
  }
  return options;
}

}  // namespace leasehold::internal
