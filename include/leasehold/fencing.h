// File: leasehold/fencing.h
//
// Fencing helpers for the storage side: declarations here, their bodies in the leasehold library
// (src/core/fencing.cc), which links no database client for them. A TTL cannot stop a holder that
// was paused (GC, SIGSTOP, a VM freeze) from writing after it wakes; the fencing token can, if the
// storage layer keeps one rule for every write it accepts:
//
//   accept a write only if its token is >= the highest token seen for that record, and record
//   the token in the same atomic step.
//
// ">=" rather than ">" lets one holder make many writes under one grant. This file gives that
// rule for three kinds of storage, without linking any of their client libraries:
//
//   - SQL (PostgreSQL, SQLite): a `lock_version` column. BuildFencedUpdate/BuildFencedUpsert
//     build the guarded statement and its parameters; run them with your driver (libpq's
//     PQexecParams, sqlite3_bind_text...), then CheckFencedRows(rows affected): 0 rows means
//     "fenced out".
//   - Files or blob stores: FencedDirectory, a conditional write into a local directory (lock,
//     compare the recorded token, write a temp file, rename). Object stores with conditional
//     puts follow the same shape: read the recorded token and its ETag, refuse a lower token,
//     put with If-Match on that ETag, retry on a precondition failure.
//   - Data kept in etcd: EtcdFenceGuard (MakeEtcdFenceGuard(lease)), the Txn compare "the
//     lease's etcd key still has the create revision I was granted" that the writer adds to its
//     own transaction. (Lease::Write, leasehold/fenced_write.h, sends that Txn itself.)
//
// Example (PostgreSQL):
//
//   auto stmt = leasehold::BuildFencedUpdate({.table = "invoices", .id = "2026-11",
//                                             .set = {{"status", "sent"}},
//                                             .token = lease->fencing_token()});
//   // PQexecParams(conn, stmt->text.c_str(), n, nullptr, values-of(stmt->params), ...)
//   leasehold::Status s = leasehold::CheckFencedRows(std::atoll(PQcmdTuples(res)), token);
//   if (s.code() == leasehold::StatusCode::kLost) { /* a newer holder wrote: stop */ }
//
// Thread safety: functions are pure; FencedDirectory is thread-safe and safe across processes
// (an flock(2) per record), on a local file system.

#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leasehold/lease.h"
#include "leasehold/lease_info.h"
#include "leasehold/status.h"

namespace leasehold {

// Returns true if a write carrying `token` may be accepted by a record whose highest accepted
// token is `highest_seen` (the rule above).
inline bool FenceAdmits(FencingToken highest_seen, FencingToken token) {
  return token >= highest_seen;
}

// ---------------------------------------------------------------------------------------------
// SQL: the lock_version column.
//
// Schema (PostgreSQL; SQLite the same with INTEGER):
//
//   ALTER TABLE invoices ADD COLUMN lock_version bigint NOT NULL DEFAULT 0;
//
// Every write guarded by a lease then goes through one statement:
//
//   UPDATE "invoices" SET "status" = $1, "lock_version" = $2
//    WHERE "id" = $3 AND "lock_version" <= $2
//
// A write from a stale holder matches no row, because a newer holder already stored a higher
// lock_version: the database rejects it atomically, whatever the clocks did.

enum class SqlDialect {
  // $1, $2... (libpq PQexecParams, pgx, psycopg's server-side binding).
  kPostgres,
  // ?1, ?2... (sqlite3_bind_*; the number is the bind index).
  kSqlite,
};

// A statement and its parameters, all passed as text: PostgreSQL infers each parameter's type
// from its column, SQLite applies the column's affinity. params[i] binds placeholder i+1.
struct SqlStatement {
  std::string text;
  std::vector<std::string> params;
};

struct FencedUpdate {
  // The table, and its key and version columns. Identifiers are quoted ("..."), so they are
  // taken verbatim: no schema qualification through dots (use `schema` for that).
  std::string schema;  // Default: none (the search path)
  std::string table;
  std::string id_column = "id";
  std::string version_column = "lock_version";
  // The row to write.
  std::string id;
  // Columns to set, with their new values (as text).
  std::vector<std::pair<std::string, std::string>> set;
  // The writer's fencing token (Lease::fencing_token(), Leadership::term()).
  FencingToken token = 0;
  SqlDialect dialect = SqlDialect::kPostgres;
};

// Builds
//   UPDATE t SET c1 = $1, ..., lock_version = $k WHERE id = $k+1 AND lock_version <= $k
// Returns kInvalidArgument for an empty or NUL-bearing identifier, no column to set, a column
// that is the key or version column, or a token above INT64_MAX.
Result<SqlStatement> BuildFencedUpdate(const FencedUpdate& u);

// Builds the insert-or-update form, for records that may not exist yet (REQUIRES a unique
// index on the key column):
//   INSERT INTO t (id, c1, ..., lock_version) VALUES ($1, $2, ..., $k)
//   ON CONFLICT (id) DO UPDATE SET c1 = excluded.c1, ..., lock_version = excluded.lock_version
//   WHERE t.lock_version <= excluded.lock_version
// Works on PostgreSQL >= 9.5 and SQLite >= 3.24. Errors as BuildFencedUpdate.
Result<SqlStatement> BuildFencedUpsert(const FencedUpdate& u);

// Interprets the row count of a fenced statement. Returns OK if it touched a row; kLost
// ("fenced out") if it touched none: a write with a higher token was accepted first (for
// BuildFencedUpdate, also when the row does not exist). A fenced-out writer has lost its lease
// whatever its own clock says: it must stop, not retry.
Status CheckFencedRows(long long rows_affected, FencingToken token);

// ---------------------------------------------------------------------------------------------
// Files: a conditional write into a local directory.

// FencedDirectory writes whole files ("records") into one local directory, each guarded by the
// fencing rule. For record NAME it keeps:
//   NAME                the data, replaced atomically (temp file + rename)
//   .NAME.fence         the highest token accepted, replaced atomically
//   .NAME.lock          an flock(2) held for the compare-and-write, so writers in several
//                       processes on this host are serialized
// Write() records the token *before* it renames the data into place: a crash in between
// leaves a token without its data, which refuses stale writers (safe) and only asks the
// current holder to write again.
//
// Not for network file systems whose flock is advisory across hosts or absent.
class FencedDirectory {
 public:
  // REQUIRES: `dir` exists and is writable.
  explicit FencedDirectory(std::string dir) : dir_(std::move(dir)) {}

  // Writes `data` as record `name` if `token` >= the highest token accepted for it, and
  // records `token`. Returns OK; kLost ("fenced out") if a higher token was accepted before,
  // and nothing is written; kInvalidArgument for a bad name (empty, over 200 bytes, a '/' or
  // NUL, or a leading '.'); kPermissionDenied or kUnavailable for I/O errors.
  Status Write(std::string_view name, std::string_view data, FencingToken token) const;

  // Returns the highest token accepted for `name`, 0 if none.
  Result<FencingToken> HighestToken(std::string_view name) const;

  [[nodiscard]] const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
};

// ---------------------------------------------------------------------------------------------
// etcd: fencing by the lease key's create revision.
//
// With the etcd store (etcd://), a lease is the etcd key "<prefix>/<lease key>" (Lease::store_key,
// e.g. "leasehold/job:invoices"), put with `create_revision(key) == 0`, and the fencing token
// *is* that key's create revision (cluster-wide monotonic). A writer whose data also lives in
// etcd fences itself by adding one compare to its own Txn:
//
//   Txn(If:   Compare(CreateRevision(store_key), "=", fencing_token),
//       Then: Put(data_key, value) ...,
//       Else: Get(store_key))              // Succeeded == false: fenced out
//
// The compare fails as soon as the grant is gone (revision 0) or re-created by a newer holder
// (a higher revision): no stale write can commit. It is stricter than the ">=" rule above: only
// the current grant's token passes, as many times as it likes. One exception: a grant released
// with ReleaseOptions::hold_at_least stays the same key (same create revision) until its keep
// ends, so this compare still passes for the released holder meanwhile (Lease::Write refuses a
// released lease locally); stop writing when you release. This is etcd's own
// Mutex.IsOwner() compare, and the one Lease::Write sends itself (leasehold/fenced_write.h): for
// data in the lease's own etcd cluster, Lease::Write is the simpler way. EtcdFenceGuard is for
// Txns your own etcd client sends (another language, etcd's JSON gateway, a Txn that also reads).
//
// Example (the holder's own process):
//
//   auto lease = store->Acquire("job:invoices", {.ttl = 30s});   // an etcd:// store
//   if (!lease.ok()) return lease.status();
//   auto guard = leasehold::MakeEtcdFenceGuard(*lease);
//   if (!guard.ok()) return guard.status();
//   // POST /v3/kv/txn {"compare":[<guard->ToJson()>],"success":[{"request_put":{...}}]}
//   // "succeeded" absent or false: fenced out, stop.
//
// For a lease held by another process, build the guard from the key and token it was given:
// `leasehold run` passes the child LEASEHOLD_STORE_KEY (the etcd key) and
// LEASEHOLD_FENCING_TOKEN, for MakeEtcdFenceGuard(getenv("LEASEHOLD_STORE_KEY"), token).
struct EtcdFenceGuard {
  // The lease's etcd key, "<prefix>/<lease key>" (Lease::store_key()).
  std::string lease_key;
  // Compare target CREATE with result EQUAL against this revision: the fencing token.
  std::int64_t create_revision = 0;

  // Returns the compare as etcd's JSON gateway (/v3/kv/txn) expects it:
  // {"key":"<base64>","target":"CREATE","result":"EQUAL","create_revision":"<n>"}
  [[nodiscard]] std::string ToJson() const;
};

// Returns the guard for a holder of the etcd key `lease_key` (Lease::store_key(), e.g. from
// LEASEHOLD_STORE_KEY in a child of `leasehold run`) whose fencing token is `token`. This is the
// form for a lease held by another process: the key is taken as given, so it must be the store
// key, never the bare lease name (the store never writes that key: its compare would fail, or
// worse, match a key of your own). Returns kInvalidArgument for an empty key or a token outside
// 1..INT64_MAX (etcd revisions are int64; 0 would mean "the key is absent").
Result<EtcdFenceGuard> MakeEtcdFenceGuard(std::string lease_key, FencingToken token);

// Returns the guard of `lease`, a lease of an etcd:// store: its store key and fencing token.
// Returns kInvalidArgument for an empty Lease, and for a lease whose store key is not of the
// etcd form "<prefix>/<lease key>" with a non-empty prefix. That check is all this header can
// see (a Lease does not tell its store's URL): it refuses every sqlite://, postgres:// and
// memory:// lease (their store key is the lease key itself) and every redis:// lease (a hash
// "<prefix>:{<hex>}"), but it cannot refuse a zk:// lease whose grant node path happens to end
// in "/<lease key>" (a lease key equal to that node's name): pass only leases of etcd:// stores.
Result<EtcdFenceGuard> MakeEtcdFenceGuard(const Lease& lease);

}  // namespace leasehold
