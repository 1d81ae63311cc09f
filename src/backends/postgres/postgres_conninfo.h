// File: backends/postgres/postgres_conninfo.h (internal)
//
// libpq's key=value conninfo ("host=db1 dbname=app mode=table") as a store URL: it has no
// scheme, and is read as a postgres:// URL with each pair as a query parameter (libpq takes
// every keyword as a URI parameter too), so both of libpq's forms name a PostgreSQL store. The
// registry's PostgreSQL row hands it to ParseUrl.
//
// Thread safety: a plain function.

#pragma once

#include <optional>
#include <string_view>

#include "leasehold/status.h"

#include "core/url.h"

namespace leasehold::internal {

// Returns nullopt if `text` does not start like a conninfo ("keyword ="); else the
// postgres:// Url, or kInvalidArgument (never echoing the text, which may carry a password).
// Values are bare words or single-quoted, with \\ and \' escapes.
std::optional<Result<Url>> ParsePostgresConninfo(std::string_view text);

}  // namespace leasehold::internal
