// File: backends/sqlite/sqlite_schema.h (internal)
//
// The sqlite:// store's file layout: its paths and intervals, the schema and its migrations, and
// every statement SqliteConnection prepares (StatementId). Only the sqlite_*.cc files include it.

#pragma once

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "backends/common/sql_statement.h"
#include "backends/sqlite/sqlite_holder_anchor.h"
#include "backends/sqlite/sqlite_host_queue.h"
#include "core/duration.h"

namespace leasehold::internal {

inline constexpr const char* kBootIdPath = "/proc/sys/kernel/random/boot_id";
inline constexpr const char* kTimensOffsetsPath = "/proc/self/timens_offsets";

// The owner token's first characters that may be shown to others (LeaseInfo::token_prefix).
inline constexpr std::size_t kTokenPrefixLength = 8;

// How often a waiter asks whether a live grant's holder is still alive (WaitForKey).
inline constexpr Duration kLivenessPollInterval = std::chrono::milliseconds(10);

// How often a switch to WAL that found the file busy is tried again, until busy_timeout.
inline constexpr Duration kWalRetryInterval = std::chrono::milliseconds(5);

// ---------------------------------------------------------------------------------------------
// Schema, version 2. A new file is created at version 2 in one transaction together with
// application_id and user_version, so a database is either fully initialised or untouched; a
// version 1 file is migrated at open (kMigrateToV2Sql, below).
//
// fencing_counters: one row per key ever granted; `last` is the last fencing token handed out.
//   Never deleted, so tokens keep increasing across release, expiry, force-release and reboots,
//   and one counter serves every grant of a key whatever its kind.
// grants: one row per (key, slot): an exclusive grant is the key's slot 0; a shared grant or a
//   semaphore's takes the smallest slot no live grant of the key has. A row is live only while
//   its boot_id is the current boot's and expires_ns > now (CLOCK_BOOTTIME, ns); dead rows stay
//   until an acquire of the key puts a grant in their slot, or a release deletes them. The SQL
//   compares CAST(expires_ns AS INTEGER), the value sqlite3_column_int64 reads: SQLite keeps a
//   text that is no number as text in an INTEGER column, and text sorts after every integer, so
//   a row written by another program with expires_ns 'x' would otherwise be live forever.
//   token is the full owner token (the file is 0600), unique among the key's live grants (an
//   acquire refuses a token already live: Renew and Release name a grant by key and token);
//   holder is the holder's free-form identity; ttl_ns is the TTL of the last acquire or renew;
//   mode is 'exclusive' or 'shared' (a semaphore's grants are 'exclusive' with lease_limit N);
//   lease_limit is the N its holder asked for (1 for exclusive and shared grants); live_at is
//   the byte of the -lhq file whose lock proves the holder alive (sqlite_holder_anchor.h), NULL
//   for a grant judged by its TTL alone: a row whose byte nobody locks is not live either
//   (lh_alive, a function each connection defines). The defaults are what a version 1 row was, and
//   what a version 1 binary's INSERT (which names neither slot, mode nor lease_limit) writes: see
//   kMigrateToV2Sql.
// writer_intents: at most one row per key, the writer intent of a waiting exclusive Acquire
//   (backend.h, "Writer preference"): waiter_id (GrantRequest::waiter_id), holder, ttl_ns, and
//   an expiry on the grants' clock (boot_id, expires_ns). While live it keeps shared requests of
//   other waiters out. Deleted when its waiter is granted the key or abandons its wait; else it
//   expires, and the key's next grant or intent replaces it.
// records: at most one row per key, the key's record (Backend::Finish), live while
//   expires_unix_ns (CLOCK_REALTIME, ns) is after now; written only together with the end of
//   the key's grant by its owner; never touched by grants, releases or force-release. It came
//   later than version 1, additively: a version 1 file made before it gains the table at open
//   (AddRecordsTable) as well.
// WITHOUT ROWID: the primary key is the only lookup path.
inline constexpr const char* kCreateRecordsSql = R"sql(
CREATE TABLE records (
  key             TEXT PRIMARY KEY NOT NULL,
  value           BLOB NOT NULL,
  expires_unix_ns INTEGER NOT NULL
) WITHOUT ROWID;
)sql";

inline constexpr const char* kCreateRecordsIfMissingSql = R"sql(
CREATE TABLE IF NOT EXISTS records (
  key             TEXT PRIMARY KEY NOT NULL,
  value           BLOB NOT NULL,
  expires_unix_ns INTEGER NOT NULL
) WITHOUT ROWID;
)sql";

inline constexpr const char* kHasRecordsTableSql =
    "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'records'";

// grants.live_at came later than version 2's first files, additively as records did: a file
// without it gains it at open (AddLiveAtColumn). A binary that predates it names its columns in
// every statement, so it writes NULL there (a grant judged by its TTL alone) and reads past it.
inline constexpr const char* kHasLiveAtColumnSql =
    "SELECT count(*) FROM pragma_table_info('grants') WHERE name = 'live_at'";
inline constexpr const char* kAddLiveAtColumnSql = "ALTER TABLE grants ADD COLUMN live_at INTEGER";

inline constexpr const char* kCreateSchemaSql = R"sql(
CREATE TABLE fencing_counters (
  key  TEXT PRIMARY KEY NOT NULL,
  last INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE grants (
  key           TEXT NOT NULL,
  slot          INTEGER NOT NULL DEFAULT 0,
  token         TEXT NOT NULL,
  holder        TEXT NOT NULL,
  fencing_token INTEGER NOT NULL,
  boot_id       TEXT NOT NULL,
  ttl_ns        INTEGER NOT NULL,
  expires_ns    INTEGER NOT NULL,
  mode          TEXT NOT NULL DEFAULT 'exclusive',
  lease_limit   INTEGER NOT NULL DEFAULT 1,
  live_at       INTEGER,
  PRIMARY KEY (key, slot)
) WITHOUT ROWID;
CREATE TABLE writer_intents (
  key        TEXT PRIMARY KEY NOT NULL,
  waiter_id  TEXT NOT NULL,
  holder     TEXT NOT NULL,
  boot_id    TEXT NOT NULL,
  ttl_ns     INTEGER NOT NULL,
  expires_ns INTEGER NOT NULL
) WITHOUT ROWID;
)sql";

// Version 1 to 2, run under BEGIN IMMEDIATE once user_version reads 1 there (MigrateToV2):
// version 1's grants table had the key alone as its primary key (one grant per key), which a
// semaphore's several grants of one key cannot share; SQLite cannot change a primary key in
// place, so the table is rebuilt (https://www.sqlite.org/lang_altertable.html, "Making Other
// Kinds Of Table Schema Changes"), every row kept as the key's slot 0, an exclusive grant of
// limit 1: live grants stay live with their tokens, holders, fencing tokens and expiries, and
// their owners renew and release them as before. legacy_alter_table keeps the rename from
// checking or rewriting views of a user's that name grants (they name the new table after it).
//
// What a version 1 binary does with a version 2 file: one that opens it afterwards refuses it
// (kUnimplemented, "created by a newer leasehold ... upgrade leasehold": CheckState, whose
// check of user_version is version 1's too), so it never misreads several grants of a key. One
// that already had the file open when it was migrated keeps working, as an exclusive-only
// client, until it closes the file: its prepared statements are compiled again against the new
// table (SQLITE_SCHEMA), which has every column they name; its acquire refuses while any live
// grant of the key exists (its live-grant read names no slot) and writes slot 0 with the
// defaults, an exclusive grant of limit 1; it renews, releases and keeps by key and token,
// which find the one live row of its token. It ignores writer_intents, which only ever hold
// shared requests off, and it makes none.
inline constexpr const char* kMigrateToV2Sql = R"sql(
PRAGMA legacy_alter_table = ON;
CREATE TABLE grants_v2 (
  key           TEXT NOT NULL,
  slot          INTEGER NOT NULL DEFAULT 0,
  token         TEXT NOT NULL,
  holder        TEXT NOT NULL,
  fencing_token INTEGER NOT NULL,
  boot_id       TEXT NOT NULL,
  ttl_ns        INTEGER NOT NULL,
  expires_ns    INTEGER NOT NULL,
  mode          TEXT NOT NULL DEFAULT 'exclusive',
  lease_limit   INTEGER NOT NULL DEFAULT 1,
  PRIMARY KEY (key, slot)
) WITHOUT ROWID;
INSERT INTO grants_v2 (key, slot, token, holder, fencing_token, boot_id, ttl_ns, expires_ns)
SELECT key, 0, token, holder, fencing_token, boot_id, ttl_ns, expires_ns FROM grants;
DROP TABLE grants;
ALTER TABLE grants_v2 RENAME TO grants;
PRAGMA legacy_alter_table = OFF;
CREATE TABLE IF NOT EXISTS writer_intents (
  key        TEXT PRIMARY KEY NOT NULL,
  waiter_id  TEXT NOT NULL,
  holder     TEXT NOT NULL,
  boot_id    TEXT NOT NULL,
  ttl_ns     INTEGER NOT NULL,
  expires_ns INTEGER NOT NULL
) WITHOUT ROWID;
PRAGMA user_version = 2;
)sql";

// ---------------------------------------------------------------------------------------------
// Prepared statements, prepared once at open (which also proves the schema is what we expect).

// Takes the write lock now, waiting up to busy_timeout, instead of at the first write (a
// deferred transaction that reads first can fail to upgrade with SQLITE_BUSY, and would let two
// processes both see "no live grant").
// What the file is: its application_id, schema version and number of schema objects.
inline constexpr const char* kReadStateSql =
    "SELECT (SELECT application_id FROM pragma_application_id), "
    "(SELECT user_version FROM pragma_user_version), (SELECT count(*) FROM sqlite_schema)";

inline constexpr const char* kBeginImmediateSql = "BEGIN IMMEDIATE";
inline constexpr const char* kCommitSql = "COMMIT";
inline constexpr const char* kRollbackSql = "ROLLBACK";

// The live grants of ?1, same boot (?2), not yet expired at ?3 (ns since boot) and with a
// holder still alive, ordered by slot: the first is Inspect's; all are what TryAcquire admits
// a request against.
inline constexpr const char* kSelectLiveGrantsSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns, slot, mode, lease_limit
FROM grants
WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3 AND lh_alive(live_at)
ORDER BY slot
)sql";

// As kSelectLiveGrantsSql, with the grants whose holder is gone too (column 9 is 0 for them;
// column 10 is the liveness byte): Holders', which shows them, and WaitForKey's.
inline constexpr const char* kSelectHoldersSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns, slot, mode, lease_limit,
  lh_alive(live_at), live_at
FROM grants
WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3
ORDER BY slot
)sql";

// The live grant of ?1 with owner token ?4 (boot ?2, expiry after ?3): the fenced write's check.
inline constexpr const char* kSelectOwnLiveGrantSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns, slot, mode, lease_limit
FROM grants
WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3 AND token = ?4
)sql";

// Bumps the fencing counter of ?1 (starting at 1) and returns the new value.
inline constexpr const char* kBumpFenceSql = R"sql(
INSERT INTO fencing_counters (key, last) VALUES (?1, 1)
ON CONFLICT (key) DO UPDATE SET last = last + 1
RETURNING last
)sql";

// Writes the new grant in slot ?2, replacing a dead one of the same slot (only called after
// kSelectLiveGrantsSql found no live grant in that slot, in the same transaction); ?11 is the
// grant's liveness byte.
inline constexpr const char* kPutGrantSql = R"sql(
INSERT OR REPLACE INTO grants
  (key, slot, token, holder, fencing_token, boot_id, ttl_ns, expires_ns, mode, lease_limit,
   live_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
)sql";

// Extends grant (?1, owner token ?2) to ?5 (= now + ttl, computed with saturation) only if it
// is live at ?4 under boot ?6; sqlite3_changes() says whether it did. An owner token is live in
// at most one slot of a key (TryAcquire), so no slot is needed.
inline constexpr const char* kRenewGrantSql = R"sql(
UPDATE grants SET ttl_ns = ?3, expires_ns = ?5
WHERE key = ?1 AND token = ?2 AND boot_id = ?6 AND CAST(expires_ns AS INTEGER) > ?4
)sql";

// Every grant row of ?1, live or dead, those of owner token ?2 first, then by slot: explains a
// failed renew or release.
inline constexpr const char* kSelectAnyGrantSql = R"sql(
SELECT token, boot_id, expires_ns, slot, mode, lease_limit FROM grants WHERE key = ?1
ORDER BY token = ?2 DESC, slot
)sql";

// Deletes the grants of ?1 with owner token ?2 (the live one, and any dead one of an earlier
// grant under the same token); returns them so the caller can tell whether one was still live.
inline constexpr const char* kDeleteOwnGrantSql = R"sql(
DELETE FROM grants WHERE key = ?1 AND token = ?2 RETURNING boot_id, expires_ns
)sql";

// Keeps grant ?1 (owner token ?2, live at ?3) until ?4 (ns since boot) without renewal, with
// ?5 as its TTL for display; sqlite3_changes() says whether it did. The token gains ':kept',
// which no owner sends: a renewal of the owner's already in flight (queued on the write lock
// behind this) no longer matches and cannot extend or shorten the kept grant. The kept grant
// keeps its slot, and loses its liveness byte: its holder exits, and the grant must last.
inline constexpr const char* kKeepGrantSql = R"sql(
UPDATE grants SET ttl_ns = ?5, expires_ns = ?4, token = token || ':kept', live_at = NULL
WHERE key = ?1 AND token = ?2 AND boot_id = ?6 AND CAST(expires_ns AS INTEGER) > ?3
)sql";

// Replaces the record of ?1 with ?2, live until ?3 (CLOCK_REALTIME ns).
inline constexpr const char* kPutRecordSql = R"sql(
INSERT OR REPLACE INTO records (key, value, expires_unix_ns) VALUES (?1, ?2, ?3)
)sql";

// The record of ?1 if it is live at ?2 (CLOCK_REALTIME ns).
inline constexpr const char* kSelectRecordSql = R"sql(
SELECT value FROM records WHERE key = ?1 AND CAST(expires_unix_ns AS INTEGER) > ?2
)sql";

// Live records (at ?1, CLOCK_REALTIME ns) whose key is in the byte range [?2, ?3) (?3 NULL: no
// upper bound), ordered by key: as kListLiveGrantsSql.
inline constexpr const char* kListRecordsSql = R"sql(
SELECT key, value FROM records
WHERE CAST(expires_unix_ns AS INTEGER) > ?1 AND key >= ?2 AND (?3 IS NULL OR key < ?3)
ORDER BY key
)sql";

// Deletes every grant of ?1 whoever holds it (force-release); the fencing counter and the
// writer intent stay.
inline constexpr const char* kDeleteAnyGrantSql = R"sql(
DELETE FROM grants WHERE key = ?1 RETURNING boot_id, expires_ns
)sql";

// Deletes the live grant of ?1 (boot ?3, expiry after ?4) whose owner token starts with ?2, the
// lowest slot's if several do (ForceReleaseGrant); returns its slot.
inline constexpr const char* kDeleteGrantByPrefixSql = R"sql(
DELETE FROM grants WHERE key = ?1 AND slot = (
  SELECT slot FROM grants
  WHERE key = ?1 AND boot_id = ?3 AND CAST(expires_ns AS INTEGER) > ?4
    AND substr(token, 1, length(?2)) = ?2
  ORDER BY slot LIMIT 1)
RETURNING slot
)sql";

// Live grants (boot ?1, expiry after ?2, holder alive) whose key starts with a prefix, ordered
// by key, then slot. The prefix is a byte range [?3, ?4) (?4 NULL: no upper bound) compared with
// the BINARY collation (memcmp), so '%' and '_' in a prefix are plain characters, unlike with LIKE.
inline constexpr const char* kListLiveGrantsSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns, slot, mode, lease_limit
FROM grants
WHERE boot_id = ?1 AND CAST(expires_ns AS INTEGER) > ?2 AND key >= ?3 AND (?4 IS NULL OR key < ?4)
  AND lh_alive(live_at)
ORDER BY key, slot
)sql";

// The live writer intent of ?1 (boot ?2, expiry after ?3).
inline constexpr const char* kSelectLiveIntentSql = R"sql(
SELECT waiter_id, holder, ttl_ns, expires_ns FROM writer_intents
WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3
)sql";

// Records (or refreshes) the writer intent of ?1 for waiter ?2, replacing a dead one or the
// waiter's own (only called after kSelectLiveIntentSql found no live intent of another waiter).
inline constexpr const char* kPutIntentSql = R"sql(
INSERT OR REPLACE INTO writer_intents (key, waiter_id, holder, boot_id, ttl_ns, expires_ns)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
)sql";

// On a grant of ?1: deletes the key's writer intent if it is waiter ?2's (granted now) or dead
// (boot ?3, expired at ?4). A live intent of another waiter stays.
inline constexpr const char* kClearIntentSql = R"sql(
DELETE FROM writer_intents
WHERE key = ?1 AND (waiter_id = ?2 OR boot_id != ?3 OR CAST(expires_ns AS INTEGER) <= ?4)
)sql";

// Deletes the writer intent of ?1 if it is waiter ?2's (AbandonWait).
inline constexpr const char* kAbandonIntentSql = R"sql(
DELETE FROM writer_intents WHERE key = ?1 AND waiter_id = ?2
)sql";

enum StatementId : std::size_t {
  kBeginImmediate,
  kCommit,
  kRollback,
  kSelectLiveGrants,
  kSelectHolders,
  kSelectOwnLiveGrant,
  kBumpFence,
  kPutGrant,
  kRenewGrant,
  kSelectAnyGrant,
  kDeleteOwnGrant,
  kDeleteAnyGrant,
  kDeleteGrantByPrefix,
  kListLiveGrants,
  kKeepGrant,
  kPutRecord,
  kSelectRecord,
  kListRecords,
  kSelectLiveIntent,
  kPutIntent,
  kClearIntent,
  kAbandonIntent,
  kStatementCount,
};

inline constexpr std::array<const char*, kStatementCount> kStatementSql = {
    kBeginImmediateSql,      kCommitSql,         kRollbackSql,
    kSelectLiveGrantsSql,    kSelectHoldersSql,  kSelectOwnLiveGrantSql,
    kBumpFenceSql,           kPutGrantSql,       kRenewGrantSql,
    kSelectAnyGrantSql,      kDeleteOwnGrantSql, kDeleteAnyGrantSql,
    kDeleteGrantByPrefixSql, kListLiveGrantsSql, kKeepGrantSql,
    kPutRecordSql,           kSelectRecordSql,   kListRecordsSql,
    kSelectLiveIntentSql,    kPutIntentSql,      kClearIntentSql,
    kAbandonIntentSql,
};

}  // namespace leasehold::internal
