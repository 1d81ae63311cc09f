// File: backends/postgres/postgres_common.h (internal)
//
// What the two postgres:// modes (postgres_table_backend.h, postgres_advisory_backend.h) share:
// SQL templating, array literals, rows to LeaseInfo, records and the store's clock, statement
// deadlines, the schema check at open, and the store doctor's findings (PgDiagnose, defined in
// postgres_diagnose.cc).
//
// Thread safety: pure functions, except EnsureSchema and PgDiagnose (use the connection they are
// given) and PgDeadline (reads the clock it is given; Clock is thread-safe).

#pragma once

#include <cstdint>
#include <functional>
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

// Reads (key, holder, token_prefix, fence, ttl_ms, remaining_ms) from `row` of `r`.
LeaseInfo PgLeaseInfo(const PgResult& r, int row);

// Reads a live grant from `row` of `r` with its kind: (key, holder, token_prefix, fence, ttl_ms,
// remaining_ms, mode 'x' or 's', lim, slot), as kTableHolders returns it; mode 'w' is the
// key's waiting writer (LeaseInfo::waiting_writer).
LeaseInfo PgGrantInfo(const PgResult& r, int row);

// Returns `text` as an SQL string literal that means the same under any
// standard_conforming_strings (E'...', quotes and backslashes doubled), or NULL for nullopt: for
// the statements of a simple query of several, which cannot take parameters.
// REQUIRES: no NUL byte in `text` (libpq would cut the query there).
std::string PgLiteral(std::optional<std::string_view> text);

// Reads a refused grant statement's holder of `key` from row 0 of `r`: (fence, holder,
// token_prefix, ttl_ms, remaining_ms) in columns 1-5 (column 0 is the "granted" flag).
LeaseInfo PgRefusedBy(std::string_view key, const PgResult& r);

// Builds the kHeldByAnother status for `key`: Status::HeldByAnother(*holder), or "<key> is held
// by another session" when the statement could not see who holds it.
Status PgHeld(std::string_view key, std::optional<LeaseInfo> holder);

// Checks that the schema's table exists, creating what is missing when allowed. Returns
// kPermissionDenied (or kInvalidArgument with create_schema=false) naming `leasehold schema`.
// Its statements' deadlines are on `clock`.
Status EnsureSchema(PgConnection& conn, const PostgresOptions& options, Clock& clock);

// Whether the shares table (shared leases in mode=table) exists and this role may use it,
// creating it when missing and allowed (as EnsureSchema creates records). false, with a warning
// logged naming `leasehold schema` or the GRANT, when it cannot be used: exclusive leases work
// as before, shared and semaphore ones fail (SharesMissing).
Result<bool> PgSharesReady(PgConnection& conn, const PostgresOptions& options, Clock& clock);

// The error of a shared or semaphore acquire on a schema whose shares table is missing or not
// this role's to use: kPermissionDenied naming `leasehold schema` and the GRANT.
Status PgSharesMissing(const PostgresOptions& options);

// The DDL for `options`, as `leasehold schema` prints it.
std::string SchemaSql(const PostgresOptions& options);

// `finish` (kTableFinish or kAdvisoryFinish) with its {recorded} part for a record or for none,
// as PgStatement fills it in.
std::string PgFinishStatement(std::string_view finish, bool with_record,
                              const PostgresOptions& options);

// The record of `key` from kReadRecord's result (nullopt: none); kInternal if it is not hex.
Result<std::optional<std::string>> PgRecord(std::string_view key, const PgResult& r);

// (key, record) from kListRecords' result; kInternal if a value is not hex.
Result<std::vector<std::pair<std::string, std::string>>> PgRecords(const PgResult& r);

// The store's wall clock from kWallClock's result (the server's clock_timestamp(), in
// microseconds since the epoch). A different time base from the backend's Clock, on purpose:
// wall time names schedule slots and dates records, and never drives lease safety.
StoreTime PgStoreTime(const PgResult& r);

// `status` of a statement on the records table, with a message naming `leasehold schema` if the
// table does not exist (an old schema whose role could not create it at open).
Status PgRecordsStatus(Status status, const PostgresOptions& options);

// The deadline of one statement started now, on `clock` (the backend's: see backend.h).
SteadyTime PgDeadline(const PostgresOptions& options, Clock& clock);

// Backend::Diagnose of both modes, on `conn` (the backend's own connection or session): reads
// the server's settings, role and privileges in one statement (kDiagnose; a second one only if
// the role may not read pg_stat_replication) and turns them into the store doctor's items:
// durability (fsync, synchronous_commit, full_page_writes), topology (primary or standby, the
// version, a pooler in between: unsafe in mode=advisory, fine in mode=table; the standbys),
// permissions (USAGE and CREATE on the schema, SELECT, INSERT, UPDATE on both tables), and the
// GRANT lines the role needs. Each statement is bounded by the options' command_timeout on
// `clock`. Returns the connection's error (kUnavailable if the server does not answer).
Result<Diagnosis> PgDiagnose(PgConnection& conn, const PostgresOptions& options, Clock& clock);

// Checks a fenced write's ops before anything is sent: Sql ops only, without NUL bytes (in the
// statement or, since text cannot hold one, a parameter), none of them transaction control
// (BEGIN, START, COMMIT, END, ROLLBACK, ABORT, SAVEPOINT, RELEASE, PREPARE TRANSACTION) or COPY
// (its protocol is not a statement's). Returns kInvalidArgument naming the op.
Status PgCheckFencedOps(const std::vector<FencedOp>& ops);

// How PgFencedWrite ended, for the caller's bookkeeping.
struct PgFencedOutcome {
  // The counts (FencedWriteResult::affected), or why not.
  Result<std::vector<std::int64_t>> result = Status::Internal("fenced write not run");
  // COMMIT was sent: if the connection broke after that, the write may have committed.
  bool commit_sent = false;
  // The check found no row: result is refused()'s status.
  bool refused = false;
};

// Runs a fenced write on `conn`, one transaction: BEGIN; `check` with `check_params` (a
// statement that returns a row only while the grant is the caller's; skipped with
// request.skip_guard_for_testing); each op through ExecOnce (text parameters, one statement, no
// prepared statement); COMMIT. The whole is bounded by `deadline` (ROLLBACK gets a deadline of
// its own). Any failure sends ROLLBACK; a connection whose ROLLBACK fails is discarded. When the
// check finds no row, `refused` (called after the ROLLBACK, `conn` free again) makes the
// status. A statement's error is mapped by PgFencedStatementStatus. A broken connection, or a
// COMMIT whose outcome is indeterminate (PgConnection::Exec: its wait for a synchronous standby
// cancelled, its answer late): the status is kUnavailable, naming an unknown outcome if COMMIT
// was sent.
PgFencedOutcome PgFencedWrite(PgConnection& conn, const FencedWriteRequest& request,
                              const std::string& check, const PgParams& check_params,
                              SteadyTime deadline, Clock& clock, const PostgresOptions& options,
                              const std::function<Status()>& refused);

// Maps the error of a fenced write's statement: SQLSTATE classes 0A, 21, 22, 23, 25, 27, 2D, 42, 44
// and P0 (what the statement asks is refused: syntax, a missing table, a constraint, a type, a
// RAISE...), and 08P01 on a connection that is still fine (parameters that do not match the
// statement's), are the caller's, kInvalidArgument with the server's message; 28 and 42501 stay
// kPermissionDenied, connection and server trouble kUnavailable, as PgConnection maps them.
Status PgFencedStatementStatus(const Status& status, bool connection_ok);

// The rows a fenced write's statement changed: its count for INSERT, UPDATE, DELETE and MERGE,
// 0 for every other command (a SELECT's count is of rows read, not changed).
std::int64_t PgRowsChanged(const PgResult& r);

}  // namespace leasehold::internal
