// File: backends/postgres/postgres_backend.h (internal)
//
// The postgres:// store on libpq: how the registry opens it (OpenPostgresBackend) and the SQL
// `leasehold schema` prints (PostgresSchemaSql). Two modes share one table, "<schema>.leases"
// (postgres_sql.h), whose per-key `fence` column only ever grows, and a `records` table:
// - mode=advisory, the default (postgres_advisory_backend.h): a grant is an advisory lock on a
//   server session the handle keeps, and lives as long as that session;
// - mode=table (postgres_table_backend.h): a grant is the key's row with an expiry on the
//   server's clock; works through transaction poolers such as PgBouncer. Shared and semaphore
//   grants are rows of a third table, `shares` (mode=table only).
// Both take fenced writes (Lease::Write, Sql ops): one transaction that checks the grant, then
// runs the statements (advisory mode on the lock's own session; table mode a FOR SHARE read of
// the key's row), PgFencedWrite in postgres_common.h.
// What both share (SQL templating, rows, records, the schema check) is in postgres_common.h, the
// libpq connection in postgres_connection.h, the URL in postgres_options.h.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("postgres://app@db1/app?mode=table"));
//   LH_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenPostgresBackend(url));
//
// Thread safety: the functions are thread-safe; so is the backend they open.

#pragma once

#include <memory>
#include <string>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "backends/backend.h"
#include "core/url.h"

// For postgres_backend_test, which reaches AdvisoryLockId and
// PostgresAdvisoryBackend::SkipPoolerCheckForTesting through this header. No libpq header comes
// with it (postgres_connection.h forward-declares libpq's types).
#include "backends/postgres/postgres_advisory_backend.h"

namespace leasehold::internal {

// Opens the store named by `url` (scheme "postgres" or "postgresql", or a key=value conninfo),
// connects, and creates the schema and table if missing and allowed. Every local deadline of the
// backend is on `clock`, which must outlive it (grants expire on the server's clock or with the
// server session). Returns kInvalidArgument for a bad URL, or advisory mode through a detected
// pooler (the message names pooling); kUnavailable if the server cannot be reached;
// kPermissionDenied for rejected credentials, or a missing table the role may not create (the
// message names `leasehold schema`).
Result<std::shared_ptr<Backend>> OpenPostgresBackend(const Url& url, Clock& clock = Clock::Real());

// Returns the SQL that creates the store's schema and table for `url`, for `leasehold schema`.
Result<std::string> PostgresSchemaSql(const Url& url);

}  // namespace leasehold::internal
