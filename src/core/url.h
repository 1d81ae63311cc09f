// File: core/url.h (internal)
//
// Url: a store URL split into parts, shared by every backend's XOptions::FromUrl.
//   scheme://[user[:password]@]host[:port][,host[:port]...][/path][?k=v&k=v]
// Percent-escapes are decoded in user, password, path and query values.
// The sqlite scheme is special: everything between "sqlite://" and '?' is a file path.
// Text without a scheme that a store reads (libpq's key=value conninfo, "host=db1 dbname=app")
// is handed to that store by the registry (ParseSchemelessUrl, backends/registry.h).
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

  // Returns the URL with the password, and the values of the parameters password, pass, token
  // and sslpassword, replaced by "***", for logs and errors.
  [[nodiscard]] std::string Redacted() const;
};

// Parses `text`. Returns kInvalidArgument (naming the problem, never echoing a password) for
// a missing scheme, a bad percent-escape, a query parameter without a name or a repeated one.
Result<Url> ParseUrl(std::string_view text);

// Decodes %XX escapes. Returns kInvalidArgument on a malformed escape.
Result<std::string> PercentDecode(std::string_view text);

}  // namespace leasehold::internal
