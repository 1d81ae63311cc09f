// File: backends/postgres/postgres_util.h (internal)
//
// Helpers shared by the two postgres:// modes: SQL templating, array literals, rows to
// LeaseInfo, records and the store's clock, and the schema check at open.
//
// Thread safety: pure functions, except EnsureSchema (uses the connection it is given).

#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease_info.h"
#include "leasehold/status.h"

#include "backends/backend.h"
#include "backends/postgres/postgres_connection.h"
#include "backends/postgres/postgres_options.h"

namespace leasehold::internal {

// Returns `sql` with {schema} (quoted identifier), {schema_ident} (the same) and {channel} (the
// schema as a string literal) filled in. The schema is a validated plain identifier.
std::string PgStatement(std::string_view sql, const PostgresOptions& options);

// Returns a PostgreSQL array literal of `items` for a text[] parameter: {"a","b\"c"}.
std::string PgArrayLiteral(const std::vector<std::string>& items);

// Milliseconds of `d`, rounded up, at least 1.
long long PgCeilMillis(Duration d);

// Reads (key, holder, token_prefix, fence, ttl_ms, remaining_ms) from `row` of `r`.
LeaseInfo PgLeaseInfo(const PgResult& r, int row);

// Builds the kHeldByAnother status for `key` from an optional holder.
Status PgHeld(std::string_view key, std::optional<LeaseInfo> holder);

// Checks that the schema's table exists, creating what is missing when allowed. Returns
// kPermissionDenied (or kInvalidArgument with create_schema=false) naming `leasehold schema`.
Status EnsureSchema(PgConnection& conn, const PostgresOptions& options);

// The DDL for `options`, as `leasehold schema` prints it.
std::string SchemaSql(const PostgresOptions& options);

// `finish` (kTableFinish or kAdvisoryFinish) with its {recorded} part for a record or for none,
// as PgStatement fills it in.
std::string PgFinishStatement(std::string_view finish, bool with_record,
                              const PostgresOptions& options);

// (key, record) from kListRecords' result; kInternal if a value is not hex.
Result<std::vector<std::pair<std::string, std::string>>> PgRecords(const PgResult& r);

// The store's wall clock from kWallClock's result (microseconds since the epoch).
StoreTime PgStoreTime(const PgResult& r);

// `status` of a statement on the records table, with a message naming `leasehold schema` if the
// table does not exist (an old schema whose role could not create it at open).
Status PgRecordsStatus(Status status, const PostgresOptions& options);

// The deadline of one statement started now.
SteadyTime PgDeadline(const PostgresOptions& options);

}  // namespace leasehold::internal
