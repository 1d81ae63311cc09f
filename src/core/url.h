// File: core/url.h (internal)
//
// Url: a store URL split into parts, shared by every backend's XOptions::FromUrl.
//   scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&k=v]
// Percent-escapes are decoded in user, password, path and query values.
// The sqlite scheme is special: everything between "sqlite://" and '?' is a file path.
// A libpq key=value conninfo ("host=db1 dbname=app mode=table") has no scheme: it is read as a
// postgres:// URL with each pair as a query parameter (libpq takes every keyword as a URI
// parameter too), so both of libpq's forms name a PostgreSQL store.
//
// Thread safety: a plain value type.

#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "leasehold/status.h"

namespace leasehold::internal {

struct Url {
  std::string scheme;
  std::optional<std::string> user;
  std::optional<std::string> password;
  // "host:port[,host:port...]" as written (empty if absent).
  std::string authority;
  // Path after the authority, with its leading '/'; for sqlite, the file path.
  std::string path;
  std::map<std::string, std::string, std::less<>> query;

  // Returns the URL with the password replaced by "***", for logs and errors.
  [[nodiscard]] std::string Redacted() const;
};

// Parses `text`. Returns kInvalidArgument (naming the problem, never echoing a password) for
// a missing scheme, a bad percent-escape or a repeated query parameter.
Result<Url> ParseUrl(std::string_view text);

// Decodes %XX escapes. Returns kInvalidArgument on a malformed escape.
Result<std::string> PercentDecode(std::string_view text);

}  // namespace leasehold::internal
