// File: backends/sqlite/sqlite_backend.cc (internal)
//
// The embedded sqlite:// store. Invariants:
// - Every mutation runs in one BEGIN IMMEDIATE transaction, which takes the database's write
//   lock before the first read: the check for a live grant and the write that follows cannot
//   interleave with another process's.
// - Time is the host's CLOCK_BOOTTIME in nanoseconds since boot, read after the write lock is
//   held. A grant is live only if its boot_id is the current boot's and expires_ns > now. It is
//   read through the backend's Clock (SqliteBackend::NowNs), which is Clock::Real(), minus the
//   CLOCK_BOOTTIME offset of the process's time namespace (/proc/self/timens_offsets: CRIU,
//   `unshare --time`, OCI timeOffsets): the values are shared through the file with every other
//   process on the host, whatever its namespace, so they must be on the one time base they all
//   share, and the registry refuses any other clock for sqlite://.
// - fencing_counters rows are never deleted, so fencing tokens keep increasing per key.
// - records (a key's schedule-slot record) are judged on the wall clock, CLOCK_REALTIME, not
//   CLOCK_BOOTTIME: a record must outlive a reboot, and it never decides who holds a lease.
// - A file is modified only once it is known to be a leasehold database (application_id and
//   user_version) or to be empty. Anything else is reported, never recreated.
// - A fenced write's statements run only inside its BEGIN IMMEDIATE transaction, after the
//   grant check, under an authorizer that refuses what would end that transaction or touch the
//   lease tables; the authorizer is installed only while they are prepared and stepped.

#include "backends/sqlite/sqlite_backend.h"

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

namespace {

constexpr const char* kBootIdPath = "/proc/sys/kernel/random/boot_id";
constexpr const char* kTimensOffsetsPath = "/proc/self/timens_offsets";

// The owner token's first characters that may be shown to others (LeaseInfo::token_prefix).
constexpr std::size_t kTokenPrefixLength = 8;

// How often a waiter asks whether a live grant's holder is still alive (WaitForKey).
constexpr Duration kLivenessPollInterval = std::chrono::milliseconds(10);

// How often a switch to WAL that found the file busy is tried again, until busy_timeout.
constexpr Duration kWalRetryInterval = std::chrono::milliseconds(5);

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
constexpr const char* kCreateRecordsSql = R"sql(
CREATE TABLE records (
  key             TEXT PRIMARY KEY NOT NULL,
  value           BLOB NOT NULL,
  expires_unix_ns INTEGER NOT NULL
) WITHOUT ROWID;
)sql";

constexpr const char* kCreateRecordsIfMissingSql = R"sql(
CREATE TABLE IF NOT EXISTS records (
  key             TEXT PRIMARY KEY NOT NULL,
  value           BLOB NOT NULL,
  expires_unix_ns INTEGER NOT NULL
) WITHOUT ROWID;
)sql";

constexpr const char* kHasRecordsTableSql =
    "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'records'";

// grants.live_at came later than version 2's first files, additively as records did: a file
// without it gains it at open (AddLiveAtColumn). A binary that predates it names its columns in
// every statement, so it writes NULL there (a grant judged by its TTL alone) and reads past it.
constexpr const char* kHasLiveAtColumnSql =
    "SELECT count(*) FROM pragma_table_info('grants') WHERE name = 'live_at'";
constexpr const char* kAddLiveAtColumnSql = "ALTER TABLE grants ADD COLUMN live_at INTEGER";

constexpr const char* kCreateSchemaSql = R"sql(
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
constexpr const char* kMigrateToV2Sql = R"sql(
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
constexpr const char* kReadStateSql =
    "SELECT (SELECT application_id FROM pragma_application_id), "
    "(SELECT user_version FROM pragma_user_version), (SELECT count(*) FROM sqlite_schema)";

constexpr const char* kBeginImmediateSql = "BEGIN IMMEDIATE";
constexpr const char* kCommitSql = "COMMIT";
constexpr const char* kRollbackSql = "ROLLBACK";

// The live grants of ?1, same boot (?2), not yet expired at ?3 (ns since boot) and with a
// holder still alive, ordered by slot: the first is Inspect's; all are what TryAcquire admits
// a request against.
constexpr const char* kSelectLiveGrantsSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns, slot, mode, lease_limit
FROM grants
WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3 AND lh_alive(live_at)
ORDER BY slot
)sql";

// As kSelectLiveGrantsSql, with the grants whose holder is gone too (column 9 is 0 for them;
// column 10 is the liveness byte): Holders', which shows them, and WaitForKey's.
constexpr const char* kSelectHoldersSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns, slot, mode, lease_limit,
  lh_alive(live_at), live_at
FROM grants
WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3
ORDER BY slot
)sql";

// The live grant of ?1 with owner token ?4 (boot ?2, expiry after ?3): the fenced write's check.
constexpr const char* kSelectOwnLiveGrantSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns, slot, mode, lease_limit
FROM grants
WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3 AND token = ?4
)sql";

// Bumps the fencing counter of ?1 (starting at 1) and returns the new value.
constexpr const char* kBumpFenceSql = R"sql(
INSERT INTO fencing_counters (key, last) VALUES (?1, 1)
ON CONFLICT (key) DO UPDATE SET last = last + 1
RETURNING last
)sql";

// Writes the new grant in slot ?2, replacing a dead one of the same slot (only called after
// kSelectLiveGrantsSql found no live grant in that slot, in the same transaction); ?11 is the
// grant's liveness byte.
constexpr const char* kPutGrantSql = R"sql(
INSERT OR REPLACE INTO grants
  (key, slot, token, holder, fencing_token, boot_id, ttl_ns, expires_ns, mode, lease_limit,
   live_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
)sql";

// Extends grant (?1, owner token ?2) to ?5 (= now + ttl, computed with saturation) only if it
// is live at ?4 under boot ?6; sqlite3_changes() says whether it did. An owner token is live in
// at most one slot of a key (TryAcquire), so no slot is needed.
constexpr const char* kRenewGrantSql = R"sql(
UPDATE grants SET ttl_ns = ?3, expires_ns = ?5
WHERE key = ?1 AND token = ?2 AND boot_id = ?6 AND CAST(expires_ns AS INTEGER) > ?4
)sql";

// Every grant row of ?1, live or dead, those of owner token ?2 first, then by slot: explains a
// failed renew or release.
constexpr const char* kSelectAnyGrantSql = R"sql(
SELECT token, boot_id, expires_ns, slot, mode, lease_limit FROM grants WHERE key = ?1
ORDER BY token = ?2 DESC, slot
)sql";

// Deletes the grants of ?1 with owner token ?2 (the live one, and any dead one of an earlier
// grant under the same token); returns them so the caller can tell whether one was still live.
constexpr const char* kDeleteOwnGrantSql = R"sql(
DELETE FROM grants WHERE key = ?1 AND token = ?2 RETURNING boot_id, expires_ns
)sql";

// Keeps grant ?1 (owner token ?2, live at ?3) until ?4 (ns since boot) without renewal, with
// ?5 as its TTL for display; sqlite3_changes() says whether it did. The token gains ':kept',
// which no owner sends: a renewal of the owner's already in flight (queued on the write lock
// behind this) no longer matches and cannot extend or shorten the kept grant. The kept grant
// keeps its slot, and loses its liveness byte: its holder exits, and the grant must last.
constexpr const char* kKeepGrantSql = R"sql(
UPDATE grants SET ttl_ns = ?5, expires_ns = ?4, token = token || ':kept', live_at = NULL
WHERE key = ?1 AND token = ?2 AND boot_id = ?6 AND CAST(expires_ns AS INTEGER) > ?3
)sql";

// Replaces the record of ?1 with ?2, live until ?3 (CLOCK_REALTIME ns).
constexpr const char* kPutRecordSql = R"sql(
INSERT OR REPLACE INTO records (key, value, expires_unix_ns) VALUES (?1, ?2, ?3)
)sql";

// The record of ?1 if it is live at ?2 (CLOCK_REALTIME ns).
constexpr const char* kSelectRecordSql = R"sql(
SELECT value FROM records WHERE key = ?1 AND CAST(expires_unix_ns AS INTEGER) > ?2
)sql";

// Live records (at ?1, CLOCK_REALTIME ns) whose key is in the byte range [?2, ?3) (?3 NULL: no
// upper bound), ordered by key: as kListLiveGrantsSql.
constexpr const char* kListRecordsSql = R"sql(
SELECT key, value FROM records
WHERE CAST(expires_unix_ns AS INTEGER) > ?1 AND key >= ?2 AND (?3 IS NULL OR key < ?3)
ORDER BY key
)sql";

// Deletes every grant of ?1 whoever holds it (force-release); the fencing counter and the
// writer intent stay.
constexpr const char* kDeleteAnyGrantSql = R"sql(
DELETE FROM grants WHERE key = ?1 RETURNING boot_id, expires_ns
)sql";

// Deletes the live grant of ?1 (boot ?3, expiry after ?4) whose owner token starts with ?2, the
// lowest slot's if several do (ForceReleaseGrant); returns its slot.
constexpr const char* kDeleteGrantByPrefixSql = R"sql(
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
constexpr const char* kListLiveGrantsSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns, slot, mode, lease_limit
FROM grants
WHERE boot_id = ?1 AND CAST(expires_ns AS INTEGER) > ?2 AND key >= ?3 AND (?4 IS NULL OR key < ?4)
  AND lh_alive(live_at)
ORDER BY key, slot
)sql";

// The live writer intent of ?1 (boot ?2, expiry after ?3).
constexpr const char* kSelectLiveIntentSql = R"sql(
SELECT waiter_id, holder, ttl_ns, expires_ns FROM writer_intents
WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3
)sql";

// Records (or refreshes) the writer intent of ?1 for waiter ?2, replacing a dead one or the
// waiter's own (only called after kSelectLiveIntentSql found no live intent of another waiter).
constexpr const char* kPutIntentSql = R"sql(
INSERT OR REPLACE INTO writer_intents (key, waiter_id, holder, boot_id, ttl_ns, expires_ns)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
)sql";

// On a grant of ?1: deletes the key's writer intent if it is waiter ?2's (granted now) or dead
// (boot ?3, expired at ?4). A live intent of another waiter stays.
constexpr const char* kClearIntentSql = R"sql(
DELETE FROM writer_intents
WHERE key = ?1 AND (waiter_id = ?2 OR boot_id != ?3 OR CAST(expires_ns AS INTEGER) <= ?4)
)sql";

// Deletes the writer intent of ?1 if it is waiter ?2's (AbandonWait).
constexpr const char* kAbandonIntentSql = R"sql(
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

constexpr std::array<const char*, kStatementCount> kStatementSql = {
    kBeginImmediateSql,      kCommitSql,         kRollbackSql,
    kSelectLiveGrantsSql,    kSelectHoldersSql,  kSelectOwnLiveGrantSql,
    kBumpFenceSql,           kPutGrantSql,       kRenewGrantSql,
    kSelectAnyGrantSql,      kDeleteOwnGrantSql, kDeleteAnyGrantSql,
    kDeleteGrantByPrefixSql, kListLiveGrantsSql, kKeepGrantSql,
    kPutRecordSql,           kSelectRecordSql,   kListRecordsSql,
    kSelectLiveIntentSql,    kPutIntentSql,      kClearIntentSql,
    kAbandonIntentSql,
};

// The wall clock (CLOCK_REALTIME) in nanoseconds since the Unix epoch, for records only: a
// different time base from the Clock's on purpose (a record must outlive a reboot, and it never
// decides who holds a lease), so it is read from std::chrono::system_clock, never from the Clock.
std::int64_t WallNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::int64_t SaturatingAdd(std::int64_t a, std::int64_t b) {
  if (b > 0 && a > std::numeric_limits<std::int64_t>::max() - b) {
    return std::numeric_limits<std::int64_t>::max();
  }
  return a + b;
}

std::string OsReason(int err) {
  return std::generic_category().message(err);
}

// Formats a remaining or elapsed time for messages: "3.2s", "450ms", "2m0s".
std::string HumanDuration(std::int64_t ns) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  Duration d(ns);
  if (d >= std::chrono::seconds(10)) {
    return FormatDuration(duration_cast<std::chrono::seconds>(d));
  }
  if (d >= std::chrono::seconds(1)) {
    return FormatDuration(duration_cast<milliseconds>(d) / 100 * 100);
  }
  return FormatDuration(duration_cast<milliseconds>(d));
}

bool IsPermissionErrno(int err) {
  return err == EACCES || err == EPERM || err == EROFS || err == ENOTDIR;
}

// The directory that holds `path` (and its -wal, -shm and -lhq files).
std::string DirectoryOf(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    return ".";
  }
  return slash == 0 ? "/" : path.substr(0, slash);
}

// 0 if this process may create files in the directory of `path` (access(2) W_OK | X_OK), else
// the errno.
int DirectoryWriteErrno(const std::string& path) {
  return ::access(DirectoryOf(path).c_str(), W_OK | X_OK) == 0 ? 0 : errno;
}

// Maps a failed file-system call on `what` to a Status naming both `what` and the database.
Status FileSystemError(int err, std::string_view action, std::string_view what,
                       std::string_view db_path) {
  std::string message = what == db_path ? fmt::format("cannot {} the sqlite database {}: {}",
                                                      action, db_path, OsReason(err))
                                        : fmt::format("cannot {} {} for the sqlite database {}: {}",
                                                      action, what, db_path, OsReason(err));
  return SqliteFileErrorStatus(err, std::move(message));
}

// The modes of what Open creates: private to the owner, or (host scope) shared by every local
// user, the directory that holds the file sticky as /tmp is (nobody removes another's file).
struct CreateModes {
  mode_t file;
  mode_t leaf_directory;
  mode_t directory;
};

CreateModes ModesFor(bool host_scope) {
  return host_scope ? CreateModes{0666, 01777, 0755} : CreateModes{0600, 0700, 0700};
}

// Creates the missing directories leading to `path` with `modes` whatever the umask. Existing
// directories are left as they are. A host-scope directory that this user may not create is
// kPermissionDenied with the one command that makes it.
Status CreateParentDirectories(const std::string& path, bool host_scope) {
  const CreateModes modes = ModesFor(host_scope);
  const std::size_t last_slash = path.rfind('/');
  if (last_slash == std::string::npos || last_slash == 0) {
    return Status::Ok();  // In the working directory, or in "/".
  }
  const std::string dir = path.substr(0, last_slash);
  std::size_t end = dir.front() == '/' ? 1 : 0;
  while (end <= dir.size()) {
    std::size_t next = dir.find('/', end);
    if (next == std::string::npos) {
      next = dir.size();
    }
    const std::string prefix = dir.substr(0, next);
    end = next + 1;
    if (prefix.empty() || prefix.back() == '/') {
      continue;  // "a//b"
    }

    struct stat st {};

    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return FileSystemError(ENOTDIR, "use the directory", prefix, path);
      }
      continue;
    }
    if (errno != ENOENT) {
      return FileSystemError(errno, "use the directory", prefix, path);
    }
    const mode_t mode = prefix == dir ? modes.leaf_directory : modes.directory;
    if (::mkdir(prefix.c_str(), mode & 0777) != 0) {
      if (errno == EEXIST) {
        continue;  // Another process made it meanwhile.
      }
      if (host_scope && IsPermissionErrno(errno)) {
        return Status::PermissionDenied(fmt::format(
            "cannot create {}, the directory of the host-wide sqlite store {}: {}; make it once "
            "as root with `install -d -m 1777 {}` (every local user then shares the store), or "
            "give a private store, e.g. --store sqlite://$HOME/.local/state/leasehold/leases.db",
            dir, path, OsReason(errno), dir));
      }
      return FileSystemError(errno, "create the directory", prefix, path);
    }
    // mkdir's mode is filtered by the umask (and takes no sticky bit everywhere): set it.
    if (::chmod(prefix.c_str(), mode) != 0) {
      return FileSystemError(errno, "set the mode of the directory", prefix, path);
    }
  }
  return Status::Ok();
}

// Creates `path` as an empty file of the scope's mode if it does not exist (before SQLite would
// create it 0644 minus the umask), and checks that an existing one is a regular file we may read
// and write. SQLite gives its -wal and -shm files the database file's mode. Returns the file's
// mode.
Result<mode_t> CreateOrCheckDatabaseFile(const std::string& path, bool host_scope) {
  const mode_t mode = ModesFor(host_scope).file;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, mode);
  if (fd >= 0) {
    const int rc = ::fchmod(fd, mode);
    const int err = errno;
    ::close(fd);
    if (rc != 0) {
      return FileSystemError(err, "set the mode of", path, path);
    }
    return mode;
  }
  if (errno != EEXIST) {
    return FileSystemError(errno, "create", path, path);
  }
  fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return FileSystemError(errno, "open for reading and writing", path, path);
  }

  struct stat st {};

  const int rc = ::fstat(fd, &st);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    return FileSystemError(err, "inspect", path, path);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(
        fmt::format("{} is not a regular file, so it cannot be a leasehold database", path));
  }
  return st.st_mode & 07777;
}

// Reads the kernel's boot id, which changes at every boot: CLOCK_BOOTTIME values from another
// boot are meaningless.
Result<std::string> ReadBootId() {
  const int fd = ::open(kBootIdPath, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::Internal(
        fmt::format("cannot read the kernel boot id from {}: {}", kBootIdPath, OsReason(errno)));
  }
  std::array<char, 128> buffer{};
  const ssize_t n = ::read(fd, buffer.data(), buffer.size());
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    return Status::Internal(
        fmt::format("cannot read the kernel boot id from {}: {}", kBootIdPath, OsReason(err)));
  }
  std::string id(buffer.data(), static_cast<std::size_t>(n));
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) {
    id.pop_back();
  }
  if (id.empty()) {
    return Status::Internal(fmt::format("the kernel boot id in {} is empty", kBootIdPath));
  }
  return id;
}

// This process's CLOCK_BOOTTIME offset from the host's (ParseBoottimeOffsetNs). A kernel without
// time namespaces (before 5.6, or built without CONFIG_TIME_NS) has no such file, and every
// process reads the host's clock: 0.
Result<std::int64_t> ReadBoottimeOffsetNs() {
  const int fd = ::open(kTimensOffsetsPath, O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    return 0;
  }
  const auto refuse = [](const std::string& why) {
    return Status::Internal(fmt::format(
        "cannot read this process's time namespace offsets from {} ({}): the sqlite store "
        "shares CLOCK_BOOTTIME times between processes and must know this process's offset",
        kTimensOffsetsPath, why));
  };
  if (fd < 0) {
    return refuse(OsReason(errno));
  }
  std::array<char, 512> buffer{};
  const ssize_t n = ::read(fd, buffer.data(), buffer.size());
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    return refuse(OsReason(err));
  }
  return ParseBoottimeOffsetNs(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
}

// The smallest string greater than every string starting with `prefix`, or nullopt if there is
// none (empty prefix, or only 0xFF bytes, which valid UTF-8 never contains).
std::optional<std::string> PrefixUpperBound(std::string_view prefix) {
  std::string bound(prefix);
  while (!bound.empty()) {
    const auto last = static_cast<unsigned char>(bound.back());
    if (last != 0xFF) {
      bound.back() = static_cast<char>(last + 1);
      return bound;
    }
    bound.pop_back();
  }
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

// One SQLite connection and its prepared statements. Not thread-safe: SqliteBackend uses it
// under its mutex only (hence SQLITE_OPEN_NOMUTEX).
class SqliteConnection {
 public:
  SqliteConnection(std::string path, Duration busy_timeout, Clock& clock)
      : path_(std::move(path)), busy_timeout_(busy_timeout), clock_(clock) {}

  SqliteConnection(const SqliteConnection&) = delete;
  SqliteConnection& operator=(const SqliteConnection&) = delete;
  SqliteConnection(SqliteConnection&&) = delete;
  SqliteConnection& operator=(SqliteConnection&&) = delete;

  ~SqliteConnection() {
    for (sqlite3_stmt* statement : statements_) {
      sqlite3_finalize(statement);
    }
    // The last connection to close checkpoints the WAL and removes the -wal and -shm files.
    sqlite3_close_v2(db_);
  }

  [[nodiscard]] sqlite3* db() const { return db_; }

  // The host's write queue and change generations of this file (sqlite_host_queue.h).
  [[nodiscard]] SqliteHostQueue& queue() const { return *queue_; }

  void set_queue(std::unique_ptr<SqliteHostQueue> queue) { queue_ = std::move(queue); }

  [[nodiscard]] Duration busy_timeout() const { return busy_timeout_; }

  // PRAGMA synchronous for the next transaction: FULL (the default: the commit reaches the disk
  // before it returns) or NORMAL (in WAL mode, the commit is fsynced with the next FULL one;
  // a power loss may lose it, never reorder it). Runs only outside a transaction, and only when
  // the setting changes; the state changes only when SQLite took it.
  Status SetDurable(bool durable) {
    if (durable == durable_) {
      return Status::Ok();
    }
    const char* sql = durable ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL";
    const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) {
      return Error(rc, "set synchronous");
    }
    durable_ = durable;
    return Status::Ok();
  }

  // What grants and renewals commit with (Diagnose): the journal mode and PRAGMA synchronous
  // (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA), read after SetDurable(true), the setting of every
  // transaction but a release's (WriteTransaction::Begin).
  struct Durability {
    std::string journal_mode;
    std::int64_t synchronous = 0;
  };

  Result<Durability> ReadDurability() {
    LH_RETURN_IF_ERROR(SetDurable(true));
    Durability durability;
    LH_ASSIGN_OR_RETURN(durability.journal_mode, QueryText("PRAGMA journal_mode", "diagnose"));
    LH_ASSIGN_OR_RETURN(durability.synchronous, QueryInt("PRAGMA synchronous", "diagnose"));
    return durability;
  }

  [[nodiscard]] Clock& clock() const { return clock_; }

  // Sets SQLite's busy handler to wait at most `timeout` (the part of busy_timeout the write
  // queue left).
  void SetBusyWait(Duration timeout) {
    const auto ms =
        std::chrono::ceil<std::chrono::milliseconds>(std::max(timeout, Duration::zero()));
    sqlite3_busy_timeout(db_, static_cast<int>(ms.count()));
  }

  [[nodiscard]] const std::string& path() const { return path_; }

  [[nodiscard]] sqlite3_stmt* statement(StatementId id) const { return statements_[id]; }

  // Opens the existing file read-write. SQLite opens lazily: most errors surface at the first
  // statement.
  Status Open() {
    // A relative name starting with ':' or "file:" could be taken for ":memory:" or a URI.
    std::string name = path_;
    if (name.front() == ':' || name.starts_with("file:")) {
      name = "./" + name;
    }
    const int rc =
        sqlite3_open_v2(name.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) {
      return Error(rc, "open");
    }
    sqlite3_extended_result_codes(db_, 1);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(busy_timeout_);
    sqlite3_busy_timeout(db_, static_cast<int>(ms.count()));
    return Status::Ok();
  }

  // Checks that the file is a leasehold database of a known schema version, initialising it if
  // it is empty. Modifies nothing otherwise.
  Status CheckOrInitialize() {
    LH_ASSIGN_OR_RETURN(State state, ReadState());
    if (state.kind == Kind::kEmpty) {
      // Re-check under the write lock: another process may be initialising it right now.
      LH_RETURN_IF_ERROR(Exec(kBeginImmediateSql, "initialize"));
      Result<State> locked = ReadState();
      if (locked.ok() && locked->kind == Kind::kEmpty) {
        Status created = Exec(kCreateSchemaSql, "initialize");
        if (created.ok()) {
          created = Exec(kCreateRecordsSql, "initialize");
        }
        if (created.ok()) {
          created = Exec(fmt::format("PRAGMA application_id = {}; PRAGMA user_version = {};",
                                     kSqliteApplicationId, kSqliteSchemaVersion),
                         "initialize");
        }
        if (created.ok()) {
          created = Exec(kCommitSql, "initialize");
        }
        if (!created.ok()) {
          RollbackIfActive();
          return created;
        }
        return Status::Ok();
      }
      RollbackIfActive();
      if (!locked.ok()) {
        return locked.status();
      }
      state = *locked;
    }
    LH_RETURN_IF_ERROR(CheckState(state));
    LH_RETURN_IF_ERROR(AddRecordsTable());
    if (state.user_version < kSqliteSchemaVersion) {
      LH_RETURN_IF_ERROR(MigrateToV2());
    }
    return AddLiveAtColumn();
  }

  // Switches to WAL (readers never block the writer; writers queue on the write lock) and
  // makes every commit durable. Only called on a database known to be ours.
  Status Configure() {
    // Switching to WAL needs an exclusive lock, and SQLite does not run the busy handler for
    // it: when several processes open a fresh file at once, retry until busy_timeout.
    const SteadyTime give_up = clock_.Now() + busy_timeout_;
    Result<std::string> switched = QueryText("PRAGMA journal_mode = WAL", "open");
    while (!switched.ok() && switched.status().code() == StatusCode::kUnavailable &&
           clock_.Now() < give_up) {
      (void)clock_.SleepUntil(clock_.Now() + kWalRetryInterval, std::stop_token());
      switched = QueryText("PRAGMA journal_mode = WAL", "open");
    }
    LH_ASSIGN_OR_RETURN(std::string mode, std::move(switched));
    if (mode != "wal") {
      return Status::InvalidArgument(fmt::format(
          "sqlite database {}: cannot use WAL journal mode (still \"{}\"); is it on a network "
          "file system?",
          path_, mode));
    }
    // FULL, not NORMAL: with NORMAL a power loss may undo the last commits, and with them a
    // fencing counter bump, handing out a fencing token twice.
    return Exec("PRAGMA synchronous = FULL", "open");
  }

  // Defines lh_alive(live_at), which the statements use: false only for a liveness byte that
  // `anchor` finds nobody locks (SqliteHolderAnchor::Alive); true for NULL. Not deterministic
  // (asked afresh for every row), and not callable from triggers or views.
  Status DefineLiveness(const SqliteHolderAnchor* anchor) {
    auto alive = [](sqlite3_context* context, int, sqlite3_value** args) {
      const auto* self = static_cast<const SqliteHolderAnchor*>(sqlite3_user_data(context));
      const bool live = sqlite3_value_type(args[0]) != SQLITE_INTEGER ||
                        self->Alive(sqlite3_value_int64(args[0]));
      sqlite3_result_int(context, live ? 1 : 0);
    };
    const int rc = sqlite3_create_function_v2(db_, "lh_alive", 1, SQLITE_UTF8 | SQLITE_DIRECTONLY,
                                              const_cast<SqliteHolderAnchor*>(anchor), alive,
                                              nullptr, nullptr, nullptr);
    return rc == SQLITE_OK ? Status::Ok() : Error(rc, "open");
  }

  Status PrepareAll() {
    for (std::size_t i = 0; i < kStatementCount; ++i) {
      const int rc = sqlite3_prepare_v3(db_, kStatementSql[i], -1, SQLITE_PREPARE_PERSISTENT,
                                        &statements_[i], nullptr);
      if (rc != SQLITE_OK) {
        // A leasehold application_id with tables that do not match the schema version.
        if ((rc & 0xff) == SQLITE_ERROR) {
          return Status(StatusCode::kInvalidArgument,
                        fmt::format("{} is not a leasehold database or is corrupt: its tables do "
                                    "not match schema version {}",
                                    path_, kSqliteSchemaVersion),
                        Detail(rc));
        }
        return Error(rc, "open");
      }
    }
    return Status::Ok();
  }

  // Maps a SQLite result code from `operation` to a Status; the SQLite text goes to detail.
  Status Error(int rc, std::string_view operation) const {
    const int sys = db_ != nullptr ? sqlite3_system_errno(db_) : 0;
    std::string detail = Detail(rc);
    switch (rc & 0xff) {
      case SQLITE_BUSY:
      case SQLITE_LOCKED:
        return Status::Unavailable(
            fmt::format("sqlite database {}: {}: still locked by another connection after "
                        "busy_timeout ({})",
                        path_, operation, FormatDuration(busy_timeout_)),
            std::move(detail));
      case SQLITE_NOTADB:
      case SQLITE_CORRUPT:
        return Status(StatusCode::kInvalidArgument,
                      fmt::format("{} is not a leasehold database or is corrupt; leasehold leaves "
                                  "it as it is (choose another path)",
                                  path_),
                      std::move(detail));
      case SQLITE_READONLY:
      case SQLITE_PERM:
      case SQLITE_AUTH:
        return Status::PermissionDenied(
            fmt::format("sqlite database {}: {}: cannot write: {}", path_, operation,
                        sys != 0 ? OsReason(sys) : "the file or its directory is read-only"),
            std::move(detail));
      case SQLITE_CANTOPEN:
      case SQLITE_IOERR:
        if (IsPermissionErrno(sys)) {
          return Status::PermissionDenied(
              fmt::format("sqlite database {}: {}: {}", path_, operation, OsReason(sys)),
              std::move(detail));
        }
        // SQLite reports a -wal or -shm file it may not create in a read-only (or immutable)
        // directory with the errno of its last probe (often ENOENT): ask the directory itself.
        if (const int dir_err = DirectoryWriteErrno(path_);
            (rc & 0xff) == SQLITE_CANTOPEN && IsPermissionErrno(dir_err)) {
          return Status::PermissionDenied(
              fmt::format("sqlite database {}: {}: cannot create its -wal and -shm files in "
                          "{}: {}",
                          path_, operation, DirectoryOf(path_), OsReason(dir_err)),
              std::move(detail));
        }
        return Status::Unavailable(fmt::format("sqlite database {}: {}: {}", path_, operation,
                                               sys != 0 ? OsReason(sys) : sqlite3_errstr(rc)),
                                   std::move(detail));
      case SQLITE_FULL:
      case SQLITE_NOMEM:
      case SQLITE_PROTOCOL:
      case SQLITE_INTERRUPT:
        return Status::Unavailable(
            fmt::format("sqlite database {}: {}: {}", path_, operation, sqlite3_errstr(rc)),
            std::move(detail));
      default:
        return Status::Internal(
            fmt::format("sqlite database {}: {}: unexpected SQLite error", path_, operation),
            std::move(detail));
    }
  }

  // Maps the error `rc` of a fenced write's statement number `op` (0-based): what SQLite refuses
  // in the statement itself (syntax, a missing table, a constraint, a type, a size) is the
  // caller's, kInvalidArgument with SQLite's message; the rest (locking, I/O) as Error does.
  Status StatementError(int rc, std::size_t op) const {
    switch (rc & 0xff) {
      case SQLITE_ERROR:
      case SQLITE_CONSTRAINT:
      case SQLITE_MISMATCH:
      case SQLITE_RANGE:
      case SQLITE_TOOBIG:
      case SQLITE_AUTH:
        return Status(StatusCode::kInvalidArgument,
                      fmt::format("sqlite database {}: fenced write: statement {} refused: {}",
                                  path_, op + 1, sqlite3_errmsg(db_)),
                      Detail(rc));
      default:
        return Error(rc, "fenced write");
    }
  }

  // Ends the current transaction, if any, discarding its changes. Some errors (SQLITE_FULL,
  // SQLITE_IOERR...) have already rolled it back.
  void RollbackIfActive() {
    if (sqlite3_get_autocommit(db_) == 0) {
      sqlite3_exec(db_, kRollbackSql, nullptr, nullptr, nullptr);
    }
  }

 private:
  enum class Kind { kOurs, kEmpty, kForeign };

  struct State {
    Kind kind = Kind::kForeign;
    std::int64_t application_id = 0;
    std::int64_t user_version = 0;
    std::int64_t table_count = 0;
  };

  [[nodiscard]] std::string Detail(int rc) const {
    return fmt::format("sqlite3 error {} ({}): {}", rc, sqlite3_errstr(rc),
                       db_ != nullptr ? sqlite3_errmsg(db_) : "");
  }

  // Reads only the header and the schema table: nothing here writes.
  Result<State> ReadState() {
    State state;
    // One statement, so one consistent snapshot: read separately, the three values could
    // straddle another process's initialisation (application_id 0 from before it, its tables
    // from after) and make a fresh leasehold database look foreign.
    LH_RETURN_IF_ERROR(QueryOne(kReadStateSql, "open", [&](sqlite3_stmt* s) {
      state.application_id = sqlite3_column_int64(s, 0);
      state.user_version = sqlite3_column_int64(s, 1);
      state.table_count = sqlite3_column_int64(s, 2);
    }));
    if (state.application_id == kSqliteApplicationId) {
      state.kind = Kind::kOurs;
    } else if (state.application_id == 0 && state.user_version == 0 && state.table_count == 0) {
      state.kind = Kind::kEmpty;
    } else {
      state.kind = Kind::kForeign;
    }
    return state;
  }

  // Adds the records table to a file made before it, under the write lock and re-checked there
  // (another process may be adding it right now). A read first: most opens find it, and take
  // no write lock.
  Status AddRecordsTable() {
    LH_ASSIGN_OR_RETURN(std::int64_t present, QueryInt(kHasRecordsTableSql, "open"));
    if (present != 0) {
      return Status::Ok();
    }
    LH_RETURN_IF_ERROR(Exec(kBeginImmediateSql, "add the records table"));
    Status added = Exec(kCreateRecordsIfMissingSql, "add the records table");
    if (added.ok()) {
      added = Exec(kCommitSql, "add the records table");
    }
    if (!added.ok()) {
      RollbackIfActive();
    }
    return added;
  }

  // Adds grants.live_at to a file made before it, under the write lock and re-checked there.
  Status AddLiveAtColumn() {
    LH_ASSIGN_OR_RETURN(std::int64_t present, QueryInt(kHasLiveAtColumnSql, "open"));
    if (present != 0) {
      return Status::Ok();
    }
    LH_RETURN_IF_ERROR(Exec(kBeginImmediateSql, "add the live_at column"));
    Result<std::int64_t> locked = QueryInt(kHasLiveAtColumnSql, "add the live_at column");
    Status added = locked.status();
    if (added.ok() && *locked == 0) {
      added = Exec(kAddLiveAtColumnSql, "add the live_at column");
    }
    if (added.ok()) {
      added = Exec(kCommitSql, "add the live_at column");
    }
    if (!added.ok()) {
      RollbackIfActive();
    }
    return added;
  }

  // Rebuilds a version 1 file's grants table as version 2's (kMigrateToV2Sql), under the write
  // lock and re-checked there (another process may be migrating it right now). All or nothing:
  // a failure rolls the file back to version 1, untouched.
  Status MigrateToV2() {
    LH_RETURN_IF_ERROR(Exec(kBeginImmediateSql, "upgrade the schema"));
    Result<State> locked = ReadState();
    Status migrated = locked.status();
    if (migrated.ok() && locked->user_version == 1) {
      migrated = Exec(kMigrateToV2Sql, "upgrade the schema to version 2");
      if (migrated.ok()) {
        migrated = Exec(kCommitSql, "upgrade the schema to version 2");
      }
    } else if (migrated.ok()) {
      migrated = CheckState(*locked);  // migrated meanwhile, or changed beyond recognition
    }
    RollbackIfActive();
    // A connection setting, not part of the transaction: leave it as SQLite's default.
    (void)Exec("PRAGMA legacy_alter_table = OFF", "upgrade the schema");
    return migrated;
  }

  Status CheckState(const State& state) const {
    if (state.kind == Kind::kForeign) {
      return Status::InvalidArgument(fmt::format(
          "{} is not a leasehold database (it is a SQLite database of another application: "
          "application_id {:#x}, {} tables); leasehold leaves it as it is (choose another path)",
          path_, state.application_id, state.table_count));
    }
    if (state.user_version > kSqliteSchemaVersion) {
      return Status::Unimplemented(fmt::format(
          "{} was created by a newer leasehold (schema version {}; this build knows up to {}); "
          "upgrade leasehold to use it",
          path_, state.user_version, kSqliteSchemaVersion));
    }
    if (state.user_version < 1) {
      return Status::InvalidArgument(fmt::format(
          "{} is not a leasehold database or is corrupt (leasehold application_id but schema "
          "version {})",
          path_, state.user_version));
    }
    return Status::Ok();
  }

  Status Exec(const std::string& sql, std::string_view operation) {
    const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
    return rc == SQLITE_OK ? Status::Ok() : Error(rc, operation);
  }

  // Runs a one-row, one-column statement; returns the column as an integer or text.
  Result<std::int64_t> QueryInt(const char* sql, std::string_view operation) {
    std::int64_t value = 0;
    LH_RETURN_IF_ERROR(
        QueryOne(sql, operation, [&](sqlite3_stmt* s) { value = sqlite3_column_int64(s, 0); }));
    return value;
  }

  Result<std::string> QueryText(const char* sql, std::string_view operation) {
    std::string value;
    LH_RETURN_IF_ERROR(QueryOne(sql, operation, [&](sqlite3_stmt* s) {
      const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
      value.assign(text != nullptr ? text : "",
                   static_cast<std::size_t>(sqlite3_column_bytes(s, 0)));
    }));
    return value;
  }

  template <typename ReadRow>
  Status QueryOne(const char* sql, std::string_view operation, ReadRow read_row) {
    sqlite3_stmt* statement = nullptr;
    int rc = sqlite3_prepare_v2(db_, sql, -1, &statement, nullptr);
    if (rc != SQLITE_OK) {
      Status error = Error(rc, operation);
      sqlite3_finalize(statement);
      return error;
    }
    rc = sqlite3_step(statement);
    if (rc == SQLITE_ROW) {
      read_row(statement);
      rc = sqlite3_step(statement);
    }
    Status result = rc == SQLITE_DONE ? Status::Ok() : Error(rc, operation);
    sqlite3_finalize(statement);
    return result;
  }

  // Immutable after construction.
  const std::string path_;
  const Duration busy_timeout_;
  std::unique_ptr<SqliteHostQueue> queue_;
  // PRAGMA synchronous is FULL (Configure), until SetDurable(false).
  bool durable_ = true;
  Clock& clock_;
  // Set by Open and PrepareAll.
  sqlite3* db_ = nullptr;
  std::array<sqlite3_stmt*, kStatementCount> statements_{};
};

namespace {

// One use of a prepared statement: binds parameters, steps through rows, and resets the
// statement when it goes out of scope, so it holds no snapshot and can be reused.
class StatementRun {
 public:
  StatementRun(SqliteConnection& connection, StatementId id, std::string_view operation)
      : connection_(connection), statement_(connection.statement(id)), operation_(operation) {}

  StatementRun(const StatementRun&) = delete;
  StatementRun& operator=(const StatementRun&) = delete;
  StatementRun(StatementRun&&) = delete;
  StatementRun& operator=(StatementRun&&) = delete;

  ~StatementRun() {
    sqlite3_reset(statement_);
    sqlite3_clear_bindings(statement_);
  }

  // `text` must outlive the run (bound without a copy). An empty view is the empty string,
  // even a default-constructed one (whose null data() SQLite would bind as NULL).
  void Bind(int index, std::string_view text) {
    Check(sqlite3_bind_text(statement_, index, text.data() != nullptr ? text.data() : "",
                            static_cast<int>(text.size()), SQLITE_STATIC));
  }

  void Bind(int index, std::int64_t value) { Check(sqlite3_bind_int64(statement_, index, value)); }

  void BindNull(int index) { Check(sqlite3_bind_null(statement_, index)); }

  // `bytes` must outlive the run (bound without a copy).
  void BindBlob(int index, std::string_view bytes) {
    Check(sqlite3_bind_blob(statement_, index, bytes.data(), static_cast<int>(bytes.size()),
                            SQLITE_STATIC));
  }

  // Steps once. Returns true at a row, false when done.
  Result<bool> Next() {
    if (bind_rc_ != SQLITE_OK) {
      return connection_.Error(bind_rc_, operation_);
    }
    const int rc = sqlite3_step(statement_);
    if (rc == SQLITE_ROW) {
      return true;
    }
    if (rc == SQLITE_DONE) {
      return false;
    }
    return connection_.Error(rc, operation_);
  }

  // Steps to the end.
  Status Finish() {
    while (true) {
      LH_ASSIGN_OR_RETURN(bool row, Next());
      if (!row) {
        return Status::Ok();
      }
    }
  }

  [[nodiscard]] std::int64_t Int(int column) const {
    return sqlite3_column_int64(statement_, column);
  }

  [[nodiscard]] bool IsNull(int column) const {
    return sqlite3_column_type(statement_, column) == SQLITE_NULL;
  }

  [[nodiscard]] std::string Blob(int column) const {
    const auto* bytes = static_cast<const char*>(sqlite3_column_blob(statement_, column));
    if (bytes == nullptr) {
      return {};
    }
    return {bytes, static_cast<std::size_t>(sqlite3_column_bytes(statement_, column))};
  }

  [[nodiscard]] std::string Text(int column) const {
    const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(statement_, column));
    if (text == nullptr) {
      return {};
    }
    return {text, static_cast<std::size_t>(sqlite3_column_bytes(statement_, column))};
  }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && bind_rc_ == SQLITE_OK) {
      bind_rc_ = rc;
    }
  }

  SqliteConnection& connection_;
  sqlite3_stmt* const statement_;
  const std::string_view operation_;
  int bind_rc_ = SQLITE_OK;
};

// A BEGIN IMMEDIATE transaction that rolls back unless committed, entered through the host's
// write queue (SqliteHostQueue): Begin waits for this thread's turn (FIFO among leasehold's
// writers of the file) and then for SQLite's write lock, both within one busy_timeout; the
// queue is handed on after COMMIT or ROLLBACK. NotifyOnCommit(key) bumps the key's change
// generation once the transaction has committed and the queue is handed on, which wakes the
// processes waiting for the key (SqliteBackend::WaitForChange).
class WriteTransaction {
 public:
  explicit WriteTransaction(SqliteConnection& connection) : connection_(connection) {}

  WriteTransaction(const WriteTransaction&) = delete;
  WriteTransaction& operator=(const WriteTransaction&) = delete;
  WriteTransaction(WriteTransaction&&) = delete;
  WriteTransaction& operator=(WriteTransaction&&) = delete;

  ~WriteTransaction() {
    connection_.RollbackIfActive();
    if (queued_) {
      connection_.SetBusyWait(connection_.busy_timeout());
      connection_.queue().Unlock();
    }
    if (committed_ && !notify_key_.empty()) {
      connection_.queue().Notify(notify_key_);
    }
  }

  // `durable` false: the commit need not reach the disk before it returns (SetDurable). Only
  // for a transaction whose loss in a power cut is harmless: deleting a grant (Release,
  // ForceRelease) — after the reboot the row is back but its boot id is the old one, so it
  // counts as expired anyway; and the next durable commit (the next holder's try-acquire)
  // fsyncs the WAL with it, in order. Grants, renewals, fencing counters and records stay FULL.
  Status Begin(std::string_view operation, bool durable = true) {
    LH_RETURN_IF_ERROR(connection_.SetDurable(durable));
    Clock& clock = connection_.clock();
    const SteadyTime start = clock.Now();
    if (Status turn = connection_.queue().Lock(connection_.busy_timeout()); !turn.ok()) {
      return Status(turn.code(), fmt::format("sqlite database {}: {}: {}", connection_.path(),
                                             operation, turn.message()));
    }
    queued_ = true;
    // Safety: the queue only delays BEGIN IMMEDIATE. Every caller reads the store's time
    // (NowNs) after Begin returns, so a grant's or renewal's expiry still counts from a moment
    // after the core's t_send, however long the wait was; a renewal that waited past its
    // grant's expiry finds it expired (kLost), never a grant that was not there.
    // What is left of busy_timeout for a writer outside the queue (a user's own connection).
    connection_.SetBusyWait(connection_.busy_timeout() - (clock.Now() - start));
    StatementRun begin(connection_, kBeginImmediate, operation);
    return begin.Finish();
  }

  Status Commit(std::string_view operation) {
    StatementRun commit(connection_, kCommit, operation);
    Status status = commit.Finish();
    committed_ = status.ok();
    return status;
  }

  // After a successful Commit, wakes the waiters for `key`.
  void NotifyOnCommit(std::string_view key) { notify_key_ = std::string(key); }

 private:
  SqliteConnection& connection_;
  bool queued_ = false;
  bool committed_ = false;
  std::string notify_key_;
};

// The grants.mode text of `mode`.
std::string_view ModeText(LeaseMode mode) {
  return mode == LeaseMode::kShared ? "shared" : "exclusive";
}

// Reads grants.mode: anything but 'shared' (a row of another program's) is exclusive, the kind
// that admits nobody beside it.
LeaseMode ModeFromText(std::string_view text) {
  return text == "shared" ? LeaseMode::kShared : LeaseMode::kExclusive;
}

// Reads grants.lease_limit and grants.slot as the LeaseInfo fields they are, whatever another
// program put there: a limit in 1..kMaxLeaseLimit, a slot in 0..UINT32_MAX.
std::uint32_t LimitFromColumn(std::int64_t value) {
  return static_cast<std::uint32_t>(
      std::clamp<std::int64_t>(value, 1, static_cast<std::int64_t>(kMaxLeaseLimit)));
}

std::uint32_t SlotFromColumn(std::int64_t value) {
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(
      value, 0, static_cast<std::int64_t>(std::numeric_limits<std::uint32_t>::max())));
}

// Reads a row of kSelectLiveGrantsSql, kSelectOwnLiveGrantSql or kListLiveGrantsSql.
LeaseInfo LeaseInfoFromRow(const StatementRun& row, std::int64_t now_ns) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  LeaseInfo info;
  info.key = row.Text(0);
  info.holder = row.Text(1);
  const std::string token = row.Text(2);
  info.token_prefix = token.substr(0, kTokenPrefixLength);
  info.kept = token.ends_with(kKeptTokenSuffix);
  info.fencing_token = static_cast<FencingToken>(row.Int(3));
  info.ttl = duration_cast<milliseconds>(Duration(row.Int(4)));
  info.remaining = duration_cast<milliseconds>(Duration(row.Int(5) - now_ns));
  info.slot = SlotFromColumn(row.Int(6));
  info.mode = ModeFromText(row.Text(7));
  info.limit = LimitFromColumn(row.Int(8));
  return info;
}

// The live writer intent of `key` (kSelectLiveIntentSql), with its waiter's id: read for a
// shared request (it keeps them out), for a waiter's exclusive request that is refused (it
// records or refreshes it), and by Holders (listed last).
struct LiveIntent {
  std::string waiter_id;
  LeaseInfo info;
};

Result<std::optional<LiveIntent>> ReadLiveIntent(SqliteConnection& connection, std::string_view key,
                                                 const std::string& boot_id, std::int64_t now_ns,
                                                 std::string_view operation) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  StatementRun select(connection, kSelectLiveIntent, operation);
  select.Bind(1, key);
  select.Bind(2, boot_id);
  select.Bind(3, now_ns);
  LH_ASSIGN_OR_RETURN(bool row, select.Next());
  if (!row) {
    return std::optional<LiveIntent>();
  }
  LiveIntent intent{.waiter_id = select.Text(0)};
  intent.info.key = std::string(key);
  intent.info.holder = select.Text(1);
  intent.info.waiting_writer = true;
  intent.info.ttl = duration_cast<milliseconds>(Duration(select.Int(2)));
  intent.info.remaining = duration_cast<milliseconds>(Duration(select.Int(3) - now_ns));
  return std::optional<LiveIntent>(std::move(intent));
}

// The tables of leasehold's own schema in the file: a fenced write's statements may read them,
// never change them.
constexpr std::array<std::string_view, 4> kLeaseTables = {"grants", "fencing_counters", "records",
                                                          "writer_intents"};

bool IsLeaseTable(const char* db_name, const char* table) {
  if (table == nullptr || (db_name != nullptr && std::string_view(db_name) != "main")) {
    return false;
  }
  const std::string_view name(table);
  return std::any_of(kLeaseTables.begin(), kLeaseTables.end(), [&](std::string_view t) {
    return sqlite3_strnicmp(t.data(), name.data(), static_cast<int>(t.size())) == 0 &&
           name.size() == t.size();
  });
}

// The authorizer (sqlite3_set_authorizer) while a fenced write's statement is prepared and
// stepped. SQLite calls it for every action the statement compiles to, triggers' included, so
// it sees what a look at the statement's first word cannot (a CTE, a trigger's body). The first
// refusal's reason goes to `refused`, SQLite's own message being only "not authorized".
struct FencedAuthorizer {
  std::string refused;

  static int Callback(void* self, int action, const char* a, const char* b, const char* db_name,
                      const char* /*trigger*/) {
    auto* authorizer = static_cast<FencedAuthorizer*>(self);
    std::string why;
    switch (action) {
      case SQLITE_TRANSACTION:
        why = fmt::format("{} would end the fenced write's own transaction", a ? a : "it");
        break;
      case SQLITE_SAVEPOINT:
        why = "SAVEPOINT and RELEASE would split the fenced write's own transaction";
        break;
      case SQLITE_ATTACH:
      case SQLITE_DETACH:
        why = "ATTACH and DETACH are not allowed in a fenced write";
        break;
      case SQLITE_PRAGMA:
        why = fmt::format(
            "PRAGMA {} is not allowed in a fenced write (it would change the "
            "connection or file leasehold uses)",
            a ? a : "");
        break;
      case SQLITE_INSERT:
      case SQLITE_UPDATE:
      case SQLITE_DELETE:
      case SQLITE_DROP_TABLE:
        if (IsLeaseTable(db_name, a)) {
          why = fmt::format("table {} is leasehold's own: a fenced write may not change it", a);
        }
        break;
      case SQLITE_CREATE_TEMP_TABLE:
      case SQLITE_CREATE_TEMP_VIEW:
      case SQLITE_CREATE_TEMP_TRIGGER:
        // leasehold's own statements name its tables without a schema, and SQLite looks in
        // "temp" first: a temp "grants" would hide the real one from this connection.
        why =
            "TEMP tables, views and triggers are not allowed in a fenced write (they could "
            "shadow leasehold's own tables on the connection it shares)";
        break;
      case SQLITE_CREATE_TRIGGER:
        // A trigger's body is authorized only when a statement fires it: one fired later by
        // leasehold's own statements or another connection would run outside these checks.
        why =
            "CREATE TRIGGER is not allowed in a fenced write (its body would run later, "
            "outside the fenced write's checks)";
        break;
      case SQLITE_ALTER_TABLE:  // a: the database, b: the table
      case SQLITE_CREATE_INDEX:
      case SQLITE_DROP_INDEX:
      case SQLITE_DROP_TRIGGER:
        if (IsLeaseTable(action == SQLITE_ALTER_TABLE ? a : db_name, b)) {
          why = fmt::format("table {} is leasehold's own: a fenced write may not change it", b);
        }
        break;
      default:
        break;
    }
    if (why.empty()) {
      return SQLITE_OK;
    }
    if (authorizer->refused.empty()) {
      authorizer->refused = std::move(why);
    }
    return SQLITE_DENY;
  }
};

// Installs a FencedAuthorizer on `db` for the scope.
class ScopedAuthorizer {
 public:
  ScopedAuthorizer(sqlite3* db, FencedAuthorizer& authorizer) : db_(db) {
    sqlite3_set_authorizer(db_, &FencedAuthorizer::Callback, &authorizer);
  }

  ScopedAuthorizer(const ScopedAuthorizer&) = delete;
  ScopedAuthorizer& operator=(const ScopedAuthorizer&) = delete;
  ScopedAuthorizer(ScopedAuthorizer&&) = delete;
  ScopedAuthorizer& operator=(ScopedAuthorizer&&) = delete;

  ~ScopedAuthorizer() { sqlite3_set_authorizer(db_, nullptr, nullptr); }

 private:
  sqlite3* const db_;
};

struct StatementFinalizer {
  void operator()(sqlite3_stmt* statement) const { sqlite3_finalize(statement); }
};

using OwnedStatement = std::unique_ptr<sqlite3_stmt, StatementFinalizer>;

// The 1-based parameter number of a "$N" or "?N" name, or 0 if `name` is not of that form.
std::size_t NumberedParameter(const char* name) {
  if (name == nullptr || (name[0] != '$' && name[0] != '?') || name[1] == '\0') {
    return 0;
  }
  std::size_t n = 0;
  for (const char* c = name + 1; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9' || n > kMaxFencedOps * 1000) {
      return 0;
    }
    n = n * 10 + static_cast<std::size_t>(*c - '0');
  }
  return n;
}

// Binds `params` to `statement` as text: a parameter named $N or ?N takes params[N-1] (so "$1"
// means the same as on PostgreSQL, wherever it stands), an anonymous "?" the value of its index.
// Returns why not (kInvalidArgument) if the statement names a parameter the op does not have
// (":name", "$9" of two...) or the op has one the statement never uses: PostgreSQL refuses both
// as well, and a silent NULL would be worse.
Status BindFencedParameters(sqlite3_stmt* statement, const std::vector<std::string>& params,
                            std::size_t op) {
  std::vector<bool> used(params.size(), false);
  const int count = sqlite3_bind_parameter_count(statement);
  for (int index = 1; index <= count; ++index) {
    const char* name = sqlite3_bind_parameter_name(statement, index);
    const std::size_t n =
        name == nullptr ? static_cast<std::size_t>(index) : NumberedParameter(name);
    if (n == 0) {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {}: parameter {} is not numbered (write $1, $2... or ?1, ?2...)",
          op + 1, name));
    }
    if (n > params.size()) {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {} uses parameter {} but has {} parameter(s)", op + 1,
          name != nullptr ? std::string(name) : fmt::format("?{}", index), params.size()));
    }
    const std::string& value = params[n - 1];
    const int rc = sqlite3_bind_text(statement, index, value.data(), static_cast<int>(value.size()),
                                     SQLITE_STATIC);
    if (rc != SQLITE_OK) {
      return Status::InvalidArgument(fmt::format("fenced write: statement {}: cannot bind {}: {}",
                                                 op + 1, n, sqlite3_errstr(rc)));
    }
    used[n - 1] = true;
  }
  for (std::size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {} has parameter ${} but never uses it", op + 1, i + 1));
    }
  }
  return Status::Ok();
}

Status CheckTtl(std::string_view key, Duration ttl) {
  if (ttl <= Duration::zero()) {
    return Status::InvalidArgument(
        fmt::format("lease {}: TTL must be positive, got {}", key, FormatDuration(ttl)));
  }
  return Status::Ok();
}

// The file systems a database must not be on, by statfs f_type (linux/magic.h; spelt out so
// that no kernel header is needed). SQLite's locking (POSIX advisory locks) and WAL's shared
// memory (an mmap of the -shm file) are only as good as the file system's: on network file
// systems locks are often broken or missing, and WAL does not work across hosts at all
// (https://www.sqlite.org/lockingv3.html, "How To Corrupt Your Database Files";
// https://www.sqlite.org/wal.html). Two holders of one key are then possible. FUSE is listed
// because its locking and mmap are the FUSE daemon's own and most FUSE file systems in use for
// databases are network ones (sshfs, s3fs, GlusterFS); the f_type does not say which.
struct FileSystemKind {
  std::int64_t magic;
  std::string_view name;
};

constexpr FileSystemKind kNetworkFileSystems[] = {
    {0x6969, "NFS"},        {0x517B, "SMB"},      {0xFF534D42, "CIFS"}, {0xFE534D42, "SMB2"},
    {0x65735546, "FUSE"},   {0x01021997, "9p"},   {0x00C36400, "Ceph"}, {0x5346414F, "AFS"},
    {0x0BD00BD0, "Lustre"}, {0x73757245, "Coda"}, {0x01161970, "GFS2"}, {0x7461636F, "OCFS2"},
};

// File systems that do not outlive a reboot: the fencing counters would start again at 1.
constexpr FileSystemKind kVolatileFileSystems[] = {
    {0x01021994, "tmpfs"},
    {0x858458F6, "ramfs"},
};

constexpr FileSystemKind kLocalFileSystems[] = {
    {0xEF53, "ext2/3/4"}, {0x58465342, "xfs"},       {0x9123683E, "btrfs"},
    {0x2FC12FC1, "zfs"},  {0x794C7630, "overlayfs"}, {0xF2F52010, "f2fs"},
};

std::optional<std::string_view> FileSystemName(std::span<const FileSystemKind> kinds,
                                               std::int64_t magic) {
  for (const FileSystemKind& kind : kinds) {
    if (kind.magic == magic) {
      return kind.name;
    }
  }
  return std::nullopt;
}

// Diagnose's finding about the file system that holds `path`.
CheckItem FileSystemItem(const std::string& path) {
  CheckItem item{.area = "durability"};

  struct statfs fs {};

  if (::statfs(path.c_str(), &fs) != 0) {
    item.verdict = CheckVerdict::kWarn;
    item.found = fmt::format("the file system of {} could not be read: {}", path, OsReason(errno));
    item.fix = "make sure it is a local disk file system (not NFS, SMB, FUSE or tmpfs)";
    return item;
  }
  const auto magic = static_cast<std::int64_t>(static_cast<std::uint32_t>(fs.f_type));
  constexpr std::string_view kLocalFix =
      "move the database to a local disk file system (ext4, xfs, btrfs): sqlite:///path/on/disk";
  if (auto name = FileSystemName(kNetworkFileSystems, magic)) {
    item.verdict = CheckVerdict::kUnsafe;
    item.found = fmt::format(
        "{} is on {} (a network or FUSE file system): SQLite's locking is "
        "unreliable there, so two holders of one key are possible",
        path, *name);
    item.fix = std::string(kLocalFix);
  } else if (auto name = FileSystemName(kVolatileFileSystems, magic)) {
    item.verdict = CheckVerdict::kUnsafe;
    item.found = fmt::format(
        "{} is on {}: the file, and with it every fencing counter, is gone "
        "after a reboot, so fencing tokens start again at 1",
        path, *name);
    item.fix = std::string(kLocalFix);
  } else {
    auto local = FileSystemName(kLocalFileSystems, magic);
    item.found = local ? fmt::format("{} is on a local file system ({})", path, *local)
                       : fmt::format(
                             "{} is on a file system (f_type {:#x}) that is not a known "
                             "network or volatile one",
                             path, magic);
  }
  return item;
}

// Diagnose's finding about journal_mode and synchronous.
CheckItem JournalItem(const std::string& journal_mode, std::int64_t synchronous) {
  CheckItem item{.area = "durability"};
  constexpr std::string_view kNames[] = {"OFF", "NORMAL", "FULL", "EXTRA"};
  const std::string_view level =
      synchronous >= 0 && synchronous <= 3 ? kNames[synchronous] : std::string_view("unknown");
  if (journal_mode != "wal") {
    // Open switches every file to WAL and refuses one that will not switch: not expected here.
    item.verdict = CheckVerdict::kUnsafe;
    item.found =
        fmt::format("journal_mode {} (synchronous {}): leasehold expects WAL", journal_mode, level);
    item.fix =
        "reopen the store (leasehold switches the file to WAL) and keep other programs "
        "from changing its journal mode";
    return item;
  }
  if (synchronous >= 2) {
    item.found = fmt::format(
        "journal_mode wal, synchronous {}: every grant, renewal and fencing counter bump is on "
        "disk before it returns",
        level);
    return item;
  }
  // NORMAL is unsafe, not a warning: in WAL mode a power loss may roll back the last commits,
  // and with them a fencing counter bump, so after the reboot the same fencing token is handed
  // out again (check.h: "fencing counters that a restart resets"). OFF is worse. Configure sets
  // FULL and no URL parameter lowers it, so this reports a connection changed behind our back.
  item.verdict = CheckVerdict::kUnsafe;
  item.found = fmt::format(
      "journal_mode wal, synchronous {}: a power loss can lose the last grants and fencing "
      "counter bumps, so a fencing token can be handed out twice",
      level);
  item.fix =
      "unexpected, since leasehold sets synchronous = FULL on its own connection: report it "
      "with the output of --json";
  return item;
}

// Diagnose's permission finding: access(2) for the file (read and write), its host queue file
// and its directory (write and search: the -wal, -shm and -lhq files are made there).
CheckItem AccessItem(const std::string& path, const std::string& fix) {
  CheckItem item{.area = "permissions"};
  const std::string dir = DirectoryOf(path);

  struct Need {
    std::string what;
    int mode;
    bool optional;
  };

  const Need needs[] = {
      {path, R_OK | W_OK, false}, {path + "-lhq", R_OK | W_OK, true}, {dir, W_OK | X_OK, false}};
  for (const Need& need : needs) {
    if (::access(need.what.c_str(), need.mode) != 0) {
      const int err = errno;
      if (need.optional && err == ENOENT) {
        continue;
      }
      item.verdict = CheckVerdict::kPermissionDenied;
      item.found = fmt::format("{} is not writable by this user (uid {}): {}", need.what,
                               ::getuid(), OsReason(err));
      item.fix = fix;
      return item;
    }
  }
  item.found =
      fmt::format("{} and its directory are writable by this user (uid {})", path, ::getuid());
  return item;
}

// Diagnose's topology finding: who shares the file. A private file excludes nothing of another
// user's: their leasehold commands use a store of their own unless they name this file.
CheckItem TopologyItem(const std::string& path, StoreScope scope) {
  CheckItem item{.area = "topology"};

  struct stat st {};

  const bool known = ::stat(path.c_str(), &st) == 0;
  const std::string mode =
      known ? fmt::format("mode {:04o}, owner uid {}", st.st_mode & 07777, st.st_uid)
            : std::string("mode unknown");
  if (scope == StoreScope::kHost) {
    item.found = fmt::format(
        "this host: every local user who runs leasehold with this store shares it ({}); other "
        "hosts cannot",
        mode);
    return item;
  }
  item.verdict = CheckVerdict::kWarn;
  item.found = fmt::format(
      "this user on this host: only processes that may write {} share it ({}); another user's "
      "leasehold run with the default store does not see these leases",
      path, mode);
  item.fix =
      "for one lease per host whoever runs the job, use the host-wide store (the default, "
      "sqlite:///var/lib/leasehold/leases.db?scope=host); for one per fleet, a server store";
  return item;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Result<std::int64_t> ParseBoottimeOffsetNs(std::string_view timens_offsets) {
  const auto malformed = [&] {
    return Status::Internal(fmt::format("no valid \"boottime <s> <ns>\" line in {}: \"{}\"",
                                        kTimensOffsetsPath, timens_offsets));
  };
  std::size_t at = 0;
  while (at < timens_offsets.size()) {
    std::size_t end = timens_offsets.find('\n', at);
    if (end == std::string_view::npos) {
      end = timens_offsets.size();
    }
    // The line's fields, split on blanks.
    std::vector<std::string_view> fields;
    for (std::size_t i = at; i < end;) {
      while (i < end && (timens_offsets[i] == ' ' || timens_offsets[i] == '\t')) {
        ++i;
      }
      const std::size_t start = i;
      while (i < end && timens_offsets[i] != ' ' && timens_offsets[i] != '\t') {
        ++i;
      }
      if (i > start) {
        fields.push_back(timens_offsets.substr(start, i - start));
      }
    }
    at = end + 1;
    if (fields.empty() || fields[0] != "boottime") {
      continue;
    }
    std::int64_t seconds = 0;
    std::int64_t nanos = 0;
    const auto number = [](std::string_view text, std::int64_t& out) {
      const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
      return ec == std::errc() && ptr == text.data() + text.size();
    };
    // The kernel bounds an offset to what a timespec64 holds; more than ~292 years overflows ns.
    constexpr std::int64_t kMaxSeconds =
        std::numeric_limits<std::int64_t>::max() / 1'000'000'000 - 1;
    if (fields.size() != 3 || !number(fields[1], seconds) || !number(fields[2], nanos) ||
        nanos < 0 || nanos >= 1'000'000'000 || seconds > kMaxSeconds || seconds < -kMaxSeconds) {
      return malformed();
    }
    return seconds * 1'000'000'000 + nanos;
  }
  return malformed();
}

Result<std::string> DefaultSqlitePath() {
  const char* dir = std::getenv("LEASEHOLD_STATE_DIR");
  if (dir == nullptr || dir[0] == '\0') {
    return fmt::format("{}/leases.db", kDefaultSqliteStateDir);
  }
  if (dir[0] != '/') {
    return Status::InvalidArgument(fmt::format(
        "LEASEHOLD_STATE_DIR must be an absolute path (the host-wide store's directory), got "
        "\"{}\"",
        dir));
  }
  return fmt::format("{}/leases.db", dir);
}

Result<std::shared_ptr<Backend>> OpenSqliteBackend(const Url& url, Clock& clock) {
  LH_ASSIGN_OR_RETURN(SqliteOptions options, SqliteOptions::FromUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<SqliteBackend> backend,
                      SqliteBackend::Open(std::move(options), clock));
  return std::shared_ptr<Backend>(std::move(backend));
}

Result<std::shared_ptr<SqliteBackend>> SqliteBackend::Open(SqliteOptions options, Clock& clock) {
  if (options.path.empty()) {
    LH_ASSIGN_OR_RETURN(options.path, DefaultSqlitePath());
  }
  if (options.busy_timeout < Duration::zero() || options.busy_timeout > kSqliteMaxBusyTimeout) {
    return Status::InvalidArgument(
        fmt::format("sqlite busy_timeout must be between 0 and {}, got {}",
                    FormatDuration(kSqliteMaxBusyTimeout), FormatDuration(options.busy_timeout)));
  }
  std::string boot_id = options.boot_id_for_testing;
  if (boot_id.empty()) {
    LH_ASSIGN_OR_RETURN(boot_id, ReadBootId());
  }
  LH_ASSIGN_OR_RETURN(const std::int64_t boot_offset_ns, ReadBoottimeOffsetNs());

  LH_RETURN_IF_ERROR(CreateParentDirectories(options.path, options.host_scope));
  LH_ASSIGN_OR_RETURN(const mode_t mode,
                      CreateOrCheckDatabaseFile(options.path, options.host_scope));
  // Whoever may write the file shares its leases: others too when group or others may.
  const StoreScope scope = (mode & 0022) != 0 ? StoreScope::kHost : StoreScope::kUser;
  auto connection = std::make_unique<SqliteConnection>(options.path, options.busy_timeout, clock);
  LH_RETURN_IF_ERROR(connection->Open());
  LH_RETURN_IF_ERROR(connection->CheckOrInitialize());
  LH_RETURN_IF_ERROR(connection->Configure());
  LH_ASSIGN_OR_RETURN(std::unique_ptr<SqliteHostQueue> queue,
                      SqliteHostQueue::Open(options.path, boot_id));
  connection->set_queue(std::move(queue));
  LH_ASSIGN_OR_RETURN(std::unique_ptr<SqliteHolderAnchor> anchor,
                      SqliteHolderAnchor::Open(options.path + "-lhq"));
  LH_RETURN_IF_ERROR(connection->DefineLiveness(anchor.get()));
  LH_RETURN_IF_ERROR(connection->PrepareAll());
  return std::shared_ptr<SqliteBackend>(
      new SqliteBackend(std::move(options.path), scope, std::move(boot_id), boot_offset_ns, clock,
                        std::move(anchor), std::move(connection)));
}

SqliteBackend::SqliteBackend(std::string path, StoreScope scope, std::string boot_id,
                             std::int64_t boot_offset_ns, Clock& clock,
                             std::unique_ptr<SqliteHolderAnchor> anchor,
                             std::unique_ptr<SqliteConnection> connection)
    : path_(std::move(path)),
      scope_(scope),
      boot_id_(std::move(boot_id)),
      boot_offset_ns_(boot_offset_ns),
      clock_(clock),
      anchor_(std::move(anchor)),
      connection_(std::move(connection)) {
  // The holder liveness lock (sqlite_holder_anchor.h): every grant this backend makes counts as
  // live, TTL permitting, until each process that has this descriptor open has closed it.
  set_holder_liveness_fd(anchor_->fd());
}

SqliteBackend::~SqliteBackend() = default;

std::int64_t SqliteBackend::NowNs() const {
  return clock_.Now().time_since_epoch().count() - boot_offset_ns_;
}

Capabilities SqliteBackend::capabilities() const {
  return Capabilities{
      .scope = scope_,
      .notifies_holder = true,
      .fencing_survives_restart = true,
      .shared_leases = true,
      .holder_liveness = true,
  };
}

unsigned SqliteBackend::fenced_ops() const {
  return FencedOpBit(FencedOp::Kind::kSql);
}

Result<Grant> SqliteBackend::TryAcquire(const GrantRequest& request) {
  LH_RETURN_IF_ERROR(CheckTtl(request.key, request.ttl));
  MutexLock lock(&mu_);
  // Read before the transaction: a grant's end that this attempt does not see commits after
  // its read of the grants, and bumps the generation after that, so after this read; the
  // waiter's WaitForTurn sleeps on this value and cannot miss it.
  const std::uint32_t generation = connection_->queue().Generation(request.key);
  Result<Grant> result = TryAcquireLocked(request);
  if (!request.waiter_id.empty()) {
    if (result.ok() || result.status().code() != StatusCode::kHeldByAnother) {
      refused_at_.erase(request.waiter_id);
    } else {
      if (refused_at_.size() >= kMaxRefusedWaiters && !refused_at_.contains(request.waiter_id)) {
        refused_at_.clear();
      }
      refused_at_.insert_or_assign(request.waiter_id,
                                   RefusedAt{.key = request.key, .generation = generation});
    }
  }
  return result;
}

Result<Grant> SqliteBackend::TryAcquireLocked(const GrantRequest& request) {
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("try-acquire"));
  // Read the clock only now that the write lock is held: the wait for it may be long, and the
  // grant's expiry must not be earlier than the caller's t_send + ttl.
  const std::int64_t now_ns = NowNs();
  // The key's live grants, by slot; and which of them, if any, is already this owner token's.
  std::vector<LeaseInfo> live;
  std::optional<std::size_t> own;
  {
    StatementRun select(connection, kSelectLiveGrants, "try-acquire");
    select.Bind(1, request.key);
    select.Bind(2, boot_id_);
    select.Bind(3, now_ns);
    while (true) {
      LH_ASSIGN_OR_RETURN(bool row, select.Next());
      if (!row) {
        break;
      }
      if (select.Text(2) == request.owner_token) {
        own = live.size();
      }
      live.push_back(LeaseInfoFromRow(select, now_ns));
    }
  }
  // One family per key: read/write (limit 1) or one semaphore of one N.
  const bool asks_semaphore = request.limit > 1;
  for (const LeaseInfo& held : live) {
    if ((held.limit > 1) != asks_semaphore || (asks_semaphore && held.limit != request.limit)) {
      return LimitMismatch(request.key, held.mode, held.limit, held.holder, request.mode,
                           request.limit);
    }
  }
  if (own.has_value()) {
    // An earlier attempt of the same call was granted under this token and its reply was lost:
    // its expiry began before this attempt's t_send, so it cannot be adopted (see Store::Acquire);
    // it is refused as held and expires by itself.
    return Status::HeldByAnother(live[*own], "a grant under this owner token already exists");
  }

  auto read_intent = [&] {
    return ReadLiveIntent(connection, request.key, boot_id_, now_ns, "try-acquire");
  };

  if (asks_semaphore) {
    if (live.size() >= request.limit) {
      return Status::HeldByAnother(live.front(),
                                   fmt::format("all {} slots are held", request.limit));
    }
  } else if (request.mode == LeaseMode::kShared) {
    const auto exclusive = std::find_if(live.begin(), live.end(), [](const LeaseInfo& held) {
      return held.mode == LeaseMode::kExclusive;
    });
    if (exclusive != live.end()) {
      return Status::HeldByAnother(live.front());
    }
    LH_ASSIGN_OR_RETURN(std::optional<LiveIntent> intent, read_intent());
    if (intent.has_value() && intent->waiter_id != request.waiter_id) {
      const LeaseInfo& writer = intent->info;
      return Status::HeldByAnother(
          fmt::format("{} is kept for {}, a writer waiting for it ({} left of its intent); "
                      "shared holders are admitted after it",
                      request.key, writer.holder.empty() ? "another owner" : writer.holder,
                      FormatDuration(RoundForDisplay(writer.remaining))),
          writer);
    }
  } else if (!live.empty()) {
    Status held = Status::HeldByAnother(live.front());
    if (request.waiter_id.empty()) {
      return held;
    }
    // Writer preference: record this waiter's intent, or refresh it, unless another waiter's
    // live intent came first (one intent per key: the first waiting writer's).
    LH_ASSIGN_OR_RETURN(std::optional<LiveIntent> intent, read_intent());
    if (intent.has_value() && intent->waiter_id != request.waiter_id) {
      return held;
    }
    {
      StatementRun put(connection, kPutIntent, "try-acquire");
      put.Bind(1, request.key);
      put.Bind(2, request.waiter_id);
      put.Bind(3, request.holder);
      put.Bind(4, boot_id_);
      put.Bind(5, request.ttl.count());
      put.Bind(6, SaturatingAdd(now_ns, request.ttl.count()));
      LH_RETURN_IF_ERROR(put.Finish());
    }
    LH_RETURN_IF_ERROR(transaction.Commit("try-acquire"));
    return held;
  }

  // Admitted. The smallest slot no live grant has (live is ordered by slot).
  std::uint32_t slot = 0;
  for (const LeaseInfo& held : live) {
    if (held.slot == slot) {
      ++slot;
    } else if (held.slot > slot) {
      break;
    }
  }
  std::int64_t fencing_token = 0;
  {
    StatementRun bump(connection, kBumpFence, "try-acquire");
    bump.Bind(1, request.key);
    LH_ASSIGN_OR_RETURN(bool row, bump.Next());
    if (!row) {
      return Status::Internal(
          fmt::format("sqlite database {}: try-acquire of {}: the fencing counter returned no "
                      "row",
                      path_, request.key));
    }
    fencing_token = bump.Int(0);
    LH_RETURN_IF_ERROR(bump.Finish());
  }
  {
    StatementRun put(connection, kPutGrant, "try-acquire");
    put.Bind(1, request.key);
    put.Bind(2, static_cast<std::int64_t>(slot));
    put.Bind(3, request.owner_token);
    put.Bind(4, request.holder);
    put.Bind(5, fencing_token);
    put.Bind(6, boot_id_);
    put.Bind(7, request.ttl.count());
    put.Bind(8, SaturatingAdd(now_ns, request.ttl.count()));
    put.Bind(9, ModeText(request.mode));
    put.Bind(10, static_cast<std::int64_t>(request.limit));
    put.Bind(11, anchor_->offset());
    LH_RETURN_IF_ERROR(put.Finish());
  }
  {
    // The waiter's own intent is done with; a dead one of anybody's is tidied.
    StatementRun clear(connection, kClearIntent, "try-acquire");
    clear.Bind(1, request.key);
    clear.Bind(2, request.waiter_id);
    clear.Bind(3, boot_id_);
    clear.Bind(4, now_ns);
    LH_RETURN_IF_ERROR(clear.Finish());
    if (sqlite3_changes(connection.db()) > 0) {
      // Waiters on a free key that the intent held off sleep until its expiry (WaitForKey):
      // wake them, so that they wait for this grant's end instead.
      transaction.NotifyOnCommit(request.key);
    }
  }
  LH_RETURN_IF_ERROR(transaction.Commit("try-acquire"));
  return Grant{
      .fencing_token = static_cast<FencingToken>(fencing_token), .ttl = request.ttl, .slot = slot};
}

std::vector<Status> SqliteBackend::RenewMany(std::span<const RenewRequest> requests) {
  std::vector<Status> results;
  if (requests.empty()) {
    return results;
  }
  MutexLock lock(&mu_);
  WriteTransaction transaction(*connection_);
  if (Status begun = transaction.Begin("renew"); !begun.ok()) {
    return std::vector<Status>(requests.size(), begun);
  }
  // After the write lock, as in TryAcquire: expiry counts from no earlier than t_send.
  const std::int64_t now_ns = NowNs();
  results.reserve(requests.size());
  for (const RenewRequest& request : requests) {
    results.push_back(RenewLocked(request, now_ns));
  }
  if (Status committed = transaction.Commit("renew"); !committed.ok()) {
    return std::vector<Status>(requests.size(), committed);
  }
  return results;
}

Status SqliteBackend::RenewLocked(const RenewRequest& request, std::int64_t now_ns) {
  LH_RETURN_IF_ERROR(CheckTtl(request.key, request.ttl));
  SqliteConnection& connection = *connection_;
  {
    StatementRun renew(connection, kRenewGrant, "renew");
    renew.Bind(1, request.key);
    renew.Bind(2, request.owner_token);
    renew.Bind(3, request.ttl.count());
    renew.Bind(4, now_ns);
    renew.Bind(5, SaturatingAdd(now_ns, request.ttl.count()));
    renew.Bind(6, boot_id_);
    LH_RETURN_IF_ERROR(renew.Finish());
    if (sqlite3_changes(connection.db()) == 1) {
      return Status::Ok();
    }
  }
  return LostStatusLocked(request.key, request.owner_token, now_ns);
}

// NOLINTNEXTLINE(bugprone-easily-swappable-parameters): the order of Backend::Release.
Status SqliteBackend::LostStatusLocked(std::string_view key, std::string_view owner_token,
                                       std::int64_t now_ns) {
  StatementRun any(*connection_, kSelectAnyGrant, "check the grant");
  any.Bind(1, key);
  any.Bind(2, owner_token);
  Result<bool> row = any.Next();
  if (!row.ok()) {
    // The grant is known not to be live and ours; only the reason is unknown.
    return Status(StatusCode::kLost, fmt::format("lease {} was lost", key),
                  std::string(row.status().message()));
  }
  if (!*row) {
    return Status::Lost(fmt::format(
        "lease {} was lost: its grant no longer exists (released by force, or expired and was "
        "taken over since)",
        key));
  }
  if (any.Text(0) != owner_token) {
    // No row of ours (rows of ours sort first). Another owner's exclusive grant in slot 0 took
    // the key after ours (which was in slot 0 too, or ended with every other grant of the key
    // before it could be taken exclusively). A shared or semaphore grant of another owner says
    // nothing about ours, which may have been in another slot.
    if (any.Int(3) == 0 && ModeFromText(any.Text(4)) == LeaseMode::kExclusive && any.Int(5) == 1) {
      return Status::Lost(fmt::format("lease {} was lost: taken over by another owner", key),
                          LostCause::kStolen);
    }
    return Status::Lost(fmt::format(
        "lease {} was lost: its grant no longer exists (released by force, or expired and its "
        "slot was taken since)",
        key));
  }
  if (any.Text(1) != boot_id_) {
    return Status::Lost(
        fmt::format("lease {} was lost: expired (the host rebooted since it was granted)", key));
  }
  return Status::Lost(
      fmt::format("lease {} was lost: expired {} ago", key, HumanDuration(now_ns - any.Int(2))));
}

Status SqliteBackend::Delete(std::string_view key, std::string_view owner_token) {
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  // Not durable: a release lost in a power cut is a grant of the old boot, expired anyway.
  // This saves one fsync on every handoff (WriteTransaction::Begin).
  LH_RETURN_IF_ERROR(transaction.Begin("release", /*durable=*/false));
  transaction.NotifyOnCommit(key);
  const std::int64_t now_ns = NowNs();
  // The rows of this token: the live grant, if any, and dead ones of earlier grants under it
  // (an attempt of Store::Acquire whose reply was lost). Whether one of them was live decides.
  bool found = false;
  bool live = false;
  std::optional<std::int64_t> expired_ns;  // the latest expiry of this boot's dead rows
  {
    StatementRun erase(connection, kDeleteOwnGrant, "release");
    erase.Bind(1, key);
    erase.Bind(2, owner_token);
    while (true) {
      LH_ASSIGN_OR_RETURN(bool row, erase.Next());
      if (!row) {
        break;
      }
      found = true;
      const std::int64_t expires_ns = erase.Int(1);
      if (erase.Text(0) != boot_id_) {
        continue;
      }
      if (expires_ns > now_ns) {
        live = true;
      } else {
        expired_ns = std::max(expired_ns.value_or(expires_ns), expires_ns);
      }
    }
  }
  Status result;
  if (!found) {
    // Absent, or someone else's: nothing was deleted.
    result = LostStatusLocked(key, owner_token, now_ns);
  } else if (!live && !expired_ns.has_value()) {
    result = Status::Lost(fmt::format(
        "lease {} was lost before release: expired (the host rebooted since it was granted)", key));
  } else if (!live) {
    result = Status::Lost(fmt::format("lease {} was lost before release: expired {} ago", key,
                                      HumanDuration(now_ns - *expired_ns)));
  }
  // Commit even when lost: deleting our own expired row is harmless and tidies the table.
  LH_RETURN_IF_ERROR(transaction.Commit("release"));
  return result;
}

Status SqliteBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  if (request.keep == Duration::zero() && !request.record.has_value()) {
    return Delete(request.key, request.owner_token);
  }
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("finish"));
  // Deleted or kept, the grant's end has moved: waiters re-read it.
  transaction.NotifyOnCommit(request.key);
  const std::int64_t now_ns = NowNs();
  if (request.keep > Duration::zero()) {
    StatementRun keep(connection, kKeepGrant, "finish");
    keep.Bind(1, request.key);
    keep.Bind(2, request.owner_token);
    keep.Bind(3, now_ns);
    keep.Bind(4, SaturatingAdd(now_ns, request.keep.count()));
    keep.Bind(5, request.keep.count());
    keep.Bind(6, boot_id_);
    LH_RETURN_IF_ERROR(keep.Finish());
    if (sqlite3_changes(connection.db()) != 1) {
      return LostStatusLocked(request.key, request.owner_token, now_ns);  // rolls back
    }
  } else {
    // Only a live grant of ours may end with a record: dead ones (of this token) are deleted
    // without it.
    StatementRun erase(connection, kDeleteOwnGrant, "finish");
    erase.Bind(1, request.key);
    erase.Bind(2, request.owner_token);
    bool found = false;
    bool live = false;
    while (true) {
      LH_ASSIGN_OR_RETURN(bool row, erase.Next());
      if (!row) {
        break;
      }
      found = true;
      live = live || (erase.Text(0) == boot_id_ && erase.Int(1) > now_ns);
    }
    if (!found) {
      return LostStatusLocked(request.key, request.owner_token, now_ns);  // rolls back
    }
    if (!live) {
      Status lost = Status::Lost(
          fmt::format("lease {} was lost before release: expired (nothing recorded)", request.key));
      LH_RETURN_IF_ERROR(transaction.Commit("finish"));
      return lost;
    }
  }
  if (request.record.has_value()) {
    StatementRun put(connection, kPutRecord, "finish");
    put.Bind(1, request.key);
    put.BindBlob(2, *request.record);
    put.Bind(3, SaturatingAdd(WallNowNs(), request.record_ttl.count()));
    LH_RETURN_IF_ERROR(put.Finish());
  }
  LH_RETURN_IF_ERROR(transaction.Commit("finish"));
  return Status::Ok();
}

Result<std::optional<std::string>> SqliteBackend::ReadRecord(std::string_view key) {
  MutexLock lock(&mu_);
  StatementRun select(*connection_, kSelectRecord, "read the record");
  select.Bind(1, key);
  select.Bind(2, WallNowNs());
  LH_ASSIGN_OR_RETURN(bool found, select.Next());
  if (!found) {
    return std::optional<std::string>();
  }
  return std::optional<std::string>(select.Blob(0));
}

Result<std::vector<std::pair<std::string, std::string>>> SqliteBackend::ListRecords(
    std::string_view prefix) {
  MutexLock lock(&mu_);
  const std::optional<std::string> upper = PrefixUpperBound(prefix);
  StatementRun list(*connection_, kListRecords, "list records");
  list.Bind(1, WallNowNs());
  list.Bind(2, prefix);
  if (upper.has_value()) {
    list.Bind(3, *upper);
  } else {
    list.BindNull(3);
  }
  std::vector<std::pair<std::string, std::string>> records;
  while (true) {
    LH_ASSIGN_OR_RETURN(bool row, list.Next());
    if (!row) {
      return records;
    }
    records.emplace_back(list.Text(0), list.Blob(1));
  }
}

Result<StoreTime> SqliteBackend::WallClock() {
  // The database is on this host: its clock is this host's. Wall time (system_clock), a
  // different time base from the Clock's: StoreTime dates records and names slots, it never
  // drives safety.
  return StoreTime{.time = std::chrono::system_clock::now(), .from_store = true};
}

Status SqliteBackend::Ping() {
  MutexLock lock(&mu_);
  // Through the host's write queue, as every lease operation: the probe measures what a
  // renewal's transaction costs, minus its statement. An empty transaction writes nothing.
  WriteTransaction transaction(*connection_);
  LH_RETURN_IF_ERROR(transaction.Begin("ping"));
  return transaction.Commit("ping");
}

Result<Diagnosis> SqliteBackend::Diagnose() {
  const std::string fix =
      fmt::format("the file {} and its directory must be writable by this user", path_);
  Diagnosis diagnosis{.probe = "BEGIN IMMEDIATE/COMMIT", .permissions_fix = fix};
  {
    MutexLock lock(&mu_);
    LH_ASSIGN_OR_RETURN(SqliteConnection::Durability durability, connection_->ReadDurability());
    diagnosis.items.push_back(JournalItem(durability.journal_mode, durability.synchronous));
  }
  diagnosis.items.push_back(FileSystemItem(path_));
  diagnosis.items.push_back(TopologyItem(path_, scope_));
  diagnosis.items.push_back(AccessItem(path_, fix));
  return diagnosis;
}

Result<std::vector<LeaseInfo>> SqliteBackend::Holders(std::string_view key) {
  MutexLock lock(&mu_);
  const std::int64_t now_ns = NowNs();
  StatementRun live(*connection_, kSelectHolders, "holders");
  live.Bind(1, key);
  live.Bind(2, boot_id_);
  live.Bind(3, now_ns);
  std::vector<LeaseInfo> infos;
  while (true) {
    LH_ASSIGN_OR_RETURN(bool row, live.Next());
    if (!row) {
      break;
    }
    infos.push_back(LeaseInfoFromRow(live, now_ns));
    infos.back().holder_gone = live.Int(9) == 0;
  }
  LH_ASSIGN_OR_RETURN(std::optional<LiveIntent> intent,
                      ReadLiveIntent(*connection_, key, boot_id_, now_ns, "holders"));
  if (intent.has_value()) {
    infos.push_back(std::move(intent->info));
  }
  return infos;
}

Result<std::vector<LeaseInfo>> SqliteBackend::List(std::string_view prefix) {
  MutexLock lock(&mu_);
  const std::int64_t now_ns = NowNs();
  const std::optional<std::string> upper = PrefixUpperBound(prefix);
  StatementRun live(*connection_, kListLiveGrants, "list");
  live.Bind(1, boot_id_);
  live.Bind(2, now_ns);
  live.Bind(3, prefix);
  if (upper.has_value()) {
    live.Bind(4, *upper);
  } else {
    live.BindNull(4);
  }
  std::vector<LeaseInfo> infos;
  while (true) {
    LH_ASSIGN_OR_RETURN(bool row, live.Next());
    if (!row) {
      return infos;
    }
    infos.push_back(LeaseInfoFromRow(live, now_ns));
  }
}

Result<bool> SqliteBackend::ForceEnd(std::string_view key, std::string_view token_prefix) {
  return token_prefix.empty() ? ForceReleaseAll(key) : ForceReleaseOne(key, token_prefix);
}

Result<bool> SqliteBackend::ForceReleaseAll(std::string_view key) {
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("force-release", /*durable=*/false));
  transaction.NotifyOnCommit(key);
  const std::int64_t now_ns = NowNs();
  bool was_live = false;
  {
    StatementRun erase(connection, kDeleteAnyGrant, "force-release");
    erase.Bind(1, key);
    while (true) {
      LH_ASSIGN_OR_RETURN(bool row, erase.Next());
      if (!row) {
        break;
      }
      was_live = was_live || (erase.Text(0) == boot_id_ && erase.Int(1) > now_ns);
    }
  }
  LH_RETURN_IF_ERROR(transaction.Commit("force-release"));
  return was_live;
}

Result<bool> SqliteBackend::ForceReleaseOne(std::string_view key, std::string_view token_prefix) {
  if (token_prefix.empty()) {
    return Status::InvalidArgument("force-release of one grant: the token prefix is empty");
  }
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("force-release", /*durable=*/false));
  transaction.NotifyOnCommit(key);
  const std::int64_t now_ns = NowNs();
  bool deleted = false;
  {
    StatementRun erase(connection, kDeleteGrantByPrefix, "force-release");
    erase.Bind(1, key);
    erase.Bind(2, token_prefix);
    erase.Bind(3, boot_id_);
    erase.Bind(4, now_ns);
    LH_ASSIGN_OR_RETURN(deleted, erase.Next());
    LH_RETURN_IF_ERROR(erase.Finish());
  }
  LH_RETURN_IF_ERROR(transaction.Commit("force-release"));
  return deleted;
}

void SqliteBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  MutexLock lock(&mu_);
  if (auto it = refused_at_.find(waiter_id); it != refused_at_.end()) {
    refused_at_.erase(it);
  }
  if (waiter_id.empty()) {
    return;
  }
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  // Best effort (Backend::AbandonWait): an intent left behind expires by itself within its ttl.
  // Not durable, as a release: an intent lost in a power cut is of the old boot, dead anyway.
  if (!transaction.Begin("abandon the wait", /*durable=*/false).ok()) {
    return;
  }
  {
    StatementRun erase(connection, kAbandonIntent, "abandon the wait");
    erase.Bind(1, key);
    erase.Bind(2, waiter_id);
    if (!erase.Finish().ok()) {
      return;
    }
  }
  if (sqlite3_changes(connection.db()) > 0) {
    // Shared requests the intent kept out may be admitted now.
    transaction.NotifyOnCommit(key);
  }
  (void)transaction.Commit("abandon the wait");
}

Status SqliteBackend::WaitForChange(std::string_view key, SteadyTime deadline,
                                    std::stop_token stop) {
  return WaitForKey(key, {}, std::nullopt, deadline, std::move(stop));
}

Status SqliteBackend::WaitForTurn(std::string_view key, std::string_view waiter_id,
                                  SteadyTime deadline, std::stop_token stop) {
  std::optional<std::uint32_t> seen;
  {
    MutexLock lock(&mu_);
    if (auto it = refused_at_.find(waiter_id); it != refused_at_.end()) {
      if (it->second.key == key) {
        seen = it->second.generation;
      }
      // Taken: the next attempt's refusal records the generation it read.
      refused_at_.erase(it);
    }
  }
  return WaitForKey(key, waiter_id, seen, deadline, std::move(stop));
}

Status SqliteBackend::WaitForKey(std::string_view key, std::string_view waiter_id,
                                 std::optional<std::uint32_t> seen, SteadyTime deadline,
                                 std::stop_token stop) {
  // Cancellation bumps the slot too, so that a stop requested between the check below and the
  // futex wait is not missed (the other waiters on the slot see a spurious wake-up).
  SqliteHostQueue* queue = nullptr;
  {
    MutexLock lock(&mu_);
    queue = &connection_->queue();
  }
  std::stop_callback on_stop(stop, [queue, key] { queue->Notify(key); });
  // While holders' liveness is polled: the first expiry the last round saw. Passing it is a
  // change (as the end of a plain wait at that expiry would be), though the next read of the
  // grants no longer shows the expired one.
  std::optional<std::int64_t> polled_expiry_ns;
  while (true) {
    if (stop.stop_requested()) {
      return Status::Cancelled("wait cancelled");
    }
    const SteadyTime now = clock_.Now();
    if (now >= deadline) {
      return Status::DeadlineExceeded("wait ran out");
    }
    // The generation first, then the grants: a grant's end that commits after this read of
    // the grants bumps the generation after the read of the generation. A waiter's refused
    // TryAcquire read it before its own read of the grants (WaitForTurn): a grant that ended
    // since then (a semaphore's slot freed while others still hold the key) has moved it.
    const std::uint32_t generation = seen.value_or(queue->Generation(key));
    seen.reset();  // a later round (after a timeout) reads afresh
    std::optional<std::int64_t> first_expiry_ns;
    // A grant of another process that proves its holder alive: nobody bumps the generation
    // when that holder dies, so its liveness is asked again every kLivenessPollInterval.
    bool watch_liveness = false;
    std::int64_t now_ns = 0;
    {
      MutexLock lock(&mu_);
      now_ns = NowNs();
      if (polled_expiry_ns.has_value() && now_ns >= *polled_expiry_ns) {
        return Status::Ok();
      }
      {
        StatementRun live(*connection_, kSelectHolders, "wait");
        live.Bind(1, key);
        live.Bind(2, boot_id_);
        live.Bind(3, now_ns);
        while (true) {
          LH_ASSIGN_OR_RETURN(bool row, live.Next());
          if (!row) {
            break;
          }
          if (live.Int(9) == 0) {
            return Status::Ok();  // a grant whose holder is gone: its slot is free now
          }
          first_expiry_ns = std::min(first_expiry_ns.value_or(live.Int(5)), live.Int(5));
          watch_liveness =
              watch_liveness || (!live.IsNull(10) && live.Int(10) != anchor_->offset());
        }
      }
      if (!first_expiry_ns.has_value() && waiter_id.empty()) {
        return Status::Ok();  // WaitForChange: the key is free
      }
      if (!first_expiry_ns.has_value()) {
        // A waiter (WaitForTurn) on a free key: another waiter's writer intent still holds its
        // shared request off. The intent ends by itself (a writer that died waiting: wake at
        // its expiry) or by its writer's grant or AbandonWait (which wakes us). The waiter's
        // own intent, or none: the key is its to take. (Its writer's grant, which clears it,
        // wakes us too: we then wait for that grant's end.)
        StatementRun intent(*connection_, kSelectLiveIntent, "wait");
        intent.Bind(1, key);
        intent.Bind(2, boot_id_);
        intent.Bind(3, now_ns);
        LH_ASSIGN_OR_RETURN(bool has_intent, intent.Next());
        if (!has_intent || intent.Text(0) == waiter_id) {
          return Status::Ok();
        }
        first_expiry_ns = intent.Int(3);
      }
    }
    // Without a release (a holder killed) a grant ends by itself: wake then at the latest. The
    // first expiry is a change too, though other grants may still hold the key.
    const Duration until_expiry =
        Duration(*first_expiry_ns - now_ns) + std::chrono::milliseconds(1);
    const bool until_an_expiry = until_expiry <= deadline - now;
    Duration timeout = std::min<Duration>(deadline - now, until_expiry);
    if (watch_liveness && timeout > kLivenessPollInterval) {
      if (queue->WaitChange(key, generation, kLivenessPollInterval) && !stop.stop_requested()) {
        return Status::Ok();
      }
      // The grants are read again: a gone holder's no longer counts, and the first expiry, if
      // it has passed meanwhile, ends the wait.
      polled_expiry_ns = *first_expiry_ns;
      continue;
    }
    if ((queue->WaitChange(key, generation, timeout) || until_an_expiry) &&
        !stop.stop_requested()) {
      return Status::Ok();
    }
  }
}

Result<std::vector<std::int64_t>> SqliteBackend::FencedWrite(const FencedWriteRequest& request) {
  // What can be told from the text alone, before the file is locked.
  for (std::size_t i = 0; i < request.ops.size(); ++i) {
    const FencedOp& op = request.ops[i];
    if (op.kind != FencedOp::Kind::kSql) {
      return Status::InvalidArgument(
          fmt::format("the sqlite store has no fenced {} op", FencedOpKindName(op.kind)));
    }
    if (op.key.find('\0') != std::string::npos) {
      return Status::InvalidArgument(
          fmt::format("fenced write: statement {} contains a NUL byte", i + 1));
    }
    if (std::string_view word = TransactionControlKeyword(LeadingSqlKeywords(op.key));
        !word.empty()) {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {} is {}: the write runs in a transaction of its own, which "
          "its statements may not end, split or leave",
          i + 1, word));
    }
  }
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  sqlite3* const db = connection.db();
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("fenced write"));
  // After the write lock, as everywhere: no other writer can change the grant until COMMIT.
  const std::int64_t now_ns = NowNs();
  if (!request.skip_guard_for_testing) {
    bool ours = false;
    {
      // The caller's grant among the key's (one of several, for a shared or semaphore lease).
      StatementRun own(connection, kSelectOwnLiveGrant, "fenced write");
      own.Bind(1, request.key);
      own.Bind(2, boot_id_);
      own.Bind(3, now_ns);
      own.Bind(4, request.owner_token);
      LH_ASSIGN_OR_RETURN(bool found, own.Next());
      ours = found && static_cast<FencingToken>(own.Int(3)) == request.fencing_token;
    }
    if (!ours) {
      // Another owner's exclusive grant names its holder; our own kept grant (token + ":kept",
      // Finish), other holders of a shared or semaphore key, or none at all: ours ended.
      StatementRun live(connection, kSelectLiveGrants, "fenced write");
      live.Bind(1, request.key);
      live.Bind(2, boot_id_);
      live.Bind(3, now_ns);
      LH_ASSIGN_OR_RETURN(bool found, live.Next());
      const bool other = found && static_cast<FencingToken>(live.Int(3)) != request.fencing_token &&
                         ModeFromText(live.Text(7)) == LeaseMode::kExclusive && live.Int(8) == 1;
      return FencedOut(
          request.key, request.fencing_token,
          other ? fmt::format("is now held by {} under fencing token {}", live.Text(1), live.Int(3))
                : std::string("is no longer held: expired or released"));
    }
  }
  std::vector<std::int64_t> affected;
  affected.reserve(request.ops.size());
  for (std::size_t i = 0; i < request.ops.size(); ++i) {
    const FencedOp& op = request.ops[i];
    FencedAuthorizer authorizer;
    ScopedAuthorizer authorize(db, authorizer);
    sqlite3_stmt* raw = nullptr;
    const char* tail = nullptr;
    int rc = sqlite3_prepare_v3(db, op.key.data(), static_cast<int>(op.key.size()), 0, &raw, &tail);
    OwnedStatement statement(raw);
    if (rc != SQLITE_OK) {
      if (!authorizer.refused.empty()) {
        return Status::InvalidArgument(
            fmt::format("sqlite database {}: fenced write: statement {} refused: {}", path_, i + 1,
                        authorizer.refused));
      }
      return connection.StatementError(rc, i);
    }
    if (statement == nullptr) {
      return Status::InvalidArgument(
          fmt::format("fenced write: statement {} is empty (only white space or comments)", i + 1));
    }
    // Only white space, comments and semicolons may follow: preparing them yields no statement.
    const std::string_view rest(tail, op.key.data() + op.key.size() - tail);
    if (rest.find_first_not_of(" \t\r\n;") != std::string_view::npos) {
      sqlite3_stmt* next = nullptr;
      rc = sqlite3_prepare_v3(db, rest.data(), static_cast<int>(rest.size()), 0, &next, nullptr);
      OwnedStatement second(next);
      if (rc != SQLITE_OK || second != nullptr) {
        return Status::InvalidArgument(fmt::format(
            "fenced write: statement {} holds more than one statement (one per op)", i + 1));
      }
    }
    LH_RETURN_IF_ERROR(BindFencedParameters(statement.get(), op.params, i));
    // Rows changed: sqlite3_changes counts only INSERT, UPDATE and DELETE and keeps its value
    // through any other statement, so it is read only if the total moved (a statement that
    // changes rows directly moves the total; CREATE TABLE, DROP TABLE and SELECT never do).
    const std::int64_t total_before = sqlite3_total_changes64(db);
    do {
      rc = sqlite3_step(statement.get());
    } while (rc == SQLITE_ROW);
    if (rc != SQLITE_DONE) {
      if (!authorizer.refused.empty()) {
        return Status::InvalidArgument(
            fmt::format("sqlite database {}: fenced write: statement {} refused: {}", path_, i + 1,
                        authorizer.refused));
      }
      return connection.StatementError(rc, i);
    }
    if (sqlite3_get_autocommit(db) != 0) {
      // The authorizer refuses every statement that could do this; should one slip through,
      // say so rather than report a write that may be half committed as done.
      return Status::Internal(fmt::format(
          "sqlite database {}: fenced write: statement {} ended the write's transaction", path_,
          i + 1));
    }
    affected.push_back(sqlite3_total_changes64(db) != total_before ? sqlite3_changes64(db) : 0);
  }
  LH_RETURN_IF_ERROR(transaction.Commit("fenced write"));
  return affected;
}

}  // namespace leasehold::internal
