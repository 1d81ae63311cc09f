// File: backends/sqlite/sqlite_backend.cc (internal)
//
// The embedded sqlite:// store. Invariants:
// - Every mutation runs in one BEGIN IMMEDIATE transaction, which takes the database's write
//   lock before the first read: the check for a live grant and the write that follows cannot
//   interleave with another process's.
// - Time is CLOCK_BOOTTIME in nanoseconds since boot, read after the write lock is held. A
//   grant is live only if its boot_id is the current boot's and expires_ns > now. It is read
//   through the backend's Clock (SqliteBackend::NowNs), which is Clock::Real(): the values are
//   shared through the file with every other process on the host, so they must be on the one
//   time base they all read, and the registry refuses any other clock for sqlite://.
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
#include "backends/sqlite/sqlite_host_queue.h"
#include "core/duration.h"

namespace leasehold::internal {

namespace {

constexpr const char* kBootIdPath = "/proc/sys/kernel/random/boot_id";

// The owner token's first characters that may be shown to others (LeaseInfo::token_prefix).
constexpr std::size_t kTokenPrefixLength = 8;

// How often a switch to WAL that found the file busy is tried again, until busy_timeout.
constexpr Duration kWalRetryInterval = std::chrono::milliseconds(5);

// ---------------------------------------------------------------------------------------------
// Schema, version 1. Created in one transaction together with application_id and user_version,
// so a database is either fully initialised or untouched. `records` came later and is additive:
// a file made before it gains the table at open (AddRecordsTable), and older builds, which never
// read it, keep working on the file (a grant kept by Finish is an ordinary row to them, live
// until its expiry), so user_version stays 1.
//
// fencing_counters: one row per key ever granted; `last` is the last fencing token handed out.
//   Never deleted, so tokens keep increasing across release, expiry, force-release and reboots.
// grants: at most one row per key, the latest grant. A row is live only while its boot_id is the
//   current boot's and expires_ns > now (CLOCK_BOOTTIME, ns); dead rows stay until the next
//   acquire of the key replaces them, or a release deletes them. The SQL compares
//   CAST(expires_ns AS INTEGER), the value sqlite3_column_int64 reads: SQLite keeps a text that
//   is no number as text in an INTEGER column, and text sorts after every integer, so a row
//   written by another program with expires_ns 'x' would otherwise be live forever.
//   token is the full owner token (the file is 0600); holder is the holder's free-form identity;
//   ttl_ns is the TTL of the last acquire or renew.
// records: at most one row per key, the key's record (Backend::Finish), live while
//   expires_unix_ns (CLOCK_REALTIME, ns) is after now; written only together with the end of
//   the key's grant by its owner; never touched by grants, releases or force-release.
// WITHOUT ROWID: the key is the primary key and the only lookup path.
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

constexpr const char* kCreateSchemaSql = R"sql(
CREATE TABLE fencing_counters (
  key  TEXT PRIMARY KEY NOT NULL,
  last INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE grants (
  key           TEXT PRIMARY KEY NOT NULL,
  token         TEXT NOT NULL,
  holder        TEXT NOT NULL,
  fencing_token INTEGER NOT NULL,
  boot_id       TEXT NOT NULL,
  ttl_ns        INTEGER NOT NULL,
  expires_ns    INTEGER NOT NULL
) WITHOUT ROWID;
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

// The live grant of ?1: same boot (?2) and not yet expired at ?3 (ns since boot).
constexpr const char* kSelectLiveGrantSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns
FROM grants
WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3
)sql";

// Bumps the fencing counter of ?1 (starting at 1) and returns the new value.
constexpr const char* kBumpFenceSql = R"sql(
INSERT INTO fencing_counters (key, last) VALUES (?1, 1)
ON CONFLICT (key) DO UPDATE SET last = last + 1
RETURNING last
)sql";

// Writes the new grant, replacing a dead one of the same key (only called after
// kSelectLiveGrantSql found no live grant, in the same transaction).
constexpr const char* kPutGrantSql = R"sql(
INSERT OR REPLACE INTO grants (key, token, holder, fencing_token, boot_id, ttl_ns, expires_ns)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
)sql";

// Extends grant ?1 to ?5 (= now + ttl, computed with saturation) only if its owner token is ?2
// and it is live at ?4 under boot ?6; sqlite3_changes() says whether it did.
constexpr const char* kRenewGrantSql = R"sql(
UPDATE grants SET ttl_ns = ?3, expires_ns = ?5
WHERE key = ?1 AND token = ?2 AND boot_id = ?6 AND CAST(expires_ns AS INTEGER) > ?4
)sql";

// Any grant row of ?1, live or dead: explains a failed renew or release.
constexpr const char* kSelectAnyGrantSql = R"sql(
SELECT token, boot_id, expires_ns FROM grants WHERE key = ?1
)sql";

// Deletes grant ?1 only if its owner token is ?2; returns it so the caller can tell whether it
// was still live.
constexpr const char* kDeleteOwnGrantSql = R"sql(
DELETE FROM grants WHERE key = ?1 AND token = ?2 RETURNING boot_id, expires_ns
)sql";

// Keeps grant ?1 (owner token ?2, live at ?3) until ?4 (ns since boot) without renewal, with
// ?5 as its TTL for display; sqlite3_changes() says whether it did. The token gains ':kept',
// which no owner sends: a renewal of the owner's already in flight (queued on the write lock
// behind this) no longer matches and cannot extend or shorten the kept grant.
constexpr const char* kKeepGrantSql = R"sql(
UPDATE grants SET ttl_ns = ?5, expires_ns = ?4, token = token || ':kept'
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

// Deletes grant ?1 whoever holds it (force-release); the fencing counter stays.
constexpr const char* kDeleteAnyGrantSql = R"sql(
DELETE FROM grants WHERE key = ?1 RETURNING boot_id, expires_ns
)sql";

// Live grants (boot ?1, expiry after ?2) whose key starts with a prefix, ordered by key. The
// prefix is a byte range [?3, ?4) (?4 NULL: no upper bound) compared with the BINARY collation
// (memcmp), so '%' and '_' in a prefix are plain characters, unlike with LIKE.
constexpr const char* kListLiveGrantsSql = R"sql(
SELECT key, holder, token, fencing_token, ttl_ns, expires_ns
FROM grants
WHERE boot_id = ?1 AND CAST(expires_ns AS INTEGER) > ?2 AND key >= ?3 AND (?4 IS NULL OR key < ?4)
ORDER BY key
)sql";

enum StatementId : std::size_t {
  kBeginImmediate,
  kCommit,
  kRollback,
  kSelectLiveGrant,
  kBumpFence,
  kPutGrant,
  kRenewGrant,
  kSelectAnyGrant,
  kDeleteOwnGrant,
  kDeleteAnyGrant,
  kListLiveGrants,
  kKeepGrant,
  kPutRecord,
  kSelectRecord,
  kListRecords,
  kStatementCount,
};

constexpr std::array<const char*, kStatementCount> kStatementSql = {
    kBeginImmediateSql, kCommitSql,         kRollbackSql,       kSelectLiveGrantSql,
    kBumpFenceSql,      kPutGrantSql,       kRenewGrantSql,     kSelectAnyGrantSql,
    kDeleteOwnGrantSql, kDeleteAnyGrantSql, kListLiveGrantsSql, kKeepGrantSql,
    kPutRecordSql,      kSelectRecordSql,   kListRecordsSql,
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

// Creates the missing directories leading to `path`, each 0700 whatever the umask. Existing
// directories are left as they are.
Status CreateParentDirectories(const std::string& path) {
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
    if (::mkdir(prefix.c_str(), 0700) != 0) {
      if (errno == EEXIST) {
        continue;  // Another process made it meanwhile.
      }
      return FileSystemError(errno, "create the directory", prefix, path);
    }
    // mkdir's mode is filtered by the umask; the state directory must be exactly 0700.
    if (::chmod(prefix.c_str(), 0700) != 0) {
      return FileSystemError(errno, "set the mode of the directory", prefix, path);
    }
  }
  return Status::Ok();
}

// Creates `path` as an empty 0600 file if it does not exist (before SQLite would create it
// 0644 minus the umask), and checks that an existing one is a regular file we may read and
// write. SQLite gives its -wal and -shm files the database file's mode.
Status CreateOrCheckDatabaseFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0600);
  if (fd >= 0) {
    const int rc = ::fchmod(fd, 0600);
    const int err = errno;
    ::close(fd);
    if (rc != 0) {
      return FileSystemError(err, "set the mode of", path, path);
    }
    return Status::Ok();
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
  return Status::Ok();
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
    return AddRecordsTable();
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

  // `text` must outlive the run (bound without a copy).
  void Bind(int index, std::string_view text) {
    Check(sqlite3_bind_text(statement_, index, text.data(), static_cast<int>(text.size()),
                            SQLITE_STATIC));
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

// Reads a row of kSelectLiveGrantSql or kListLiveGrantsSql.
LeaseInfo LeaseInfoFromRow(const StatementRun& row, std::int64_t now_ns) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  LeaseInfo info;
  info.key = row.Text(0);
  info.holder = row.Text(1);
  info.token_prefix = row.Text(2).substr(0, kTokenPrefixLength);
  info.fencing_token = static_cast<FencingToken>(row.Int(3));
  info.ttl = duration_cast<milliseconds>(Duration(row.Int(4)));
  info.remaining = duration_cast<milliseconds>(Duration(row.Int(5) - now_ns));
  return info;
}

// The tables of leasehold's own schema in the file: a fenced write's statements may read them,
// never change them.
constexpr std::array<std::string_view, 3> kLeaseTables = {"grants", "fencing_counters", "records"};

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
        why = "TEMP tables, views and triggers are not allowed in a fenced write (they could "
              "shadow leasehold's own tables on the connection it shares)";
        break;
      case SQLITE_CREATE_TRIGGER:
        // A trigger's body is authorized only when a statement fires it: one fired later by
        // leasehold's own statements or another connection would run outside these checks.
        why = "CREATE TRIGGER is not allowed in a fenced write (its body would run later, "
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

}  // namespace

// ---------------------------------------------------------------------------------------------

Result<std::string> DefaultSqlitePath() {
  // XDG Base Directory spec: a relative $XDG_STATE_HOME is invalid and must be ignored.
  const char* state_home = std::getenv("XDG_STATE_HOME");
  if (state_home != nullptr && state_home[0] == '/') {
    return fmt::format("{}/leasehold/leases.db", state_home);
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') {
    return fmt::format("{}/.local/state/leasehold/leases.db", home);
  }
  return Status::InvalidArgument(
      "cannot choose the default sqlite database: $HOME is not set (nor an absolute "
      "$XDG_STATE_HOME); give a store URL such as sqlite:///path/to/leases.db");
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

  LH_RETURN_IF_ERROR(CreateParentDirectories(options.path));
  LH_RETURN_IF_ERROR(CreateOrCheckDatabaseFile(options.path));
  auto connection =
      std::make_unique<SqliteConnection>(options.path, options.busy_timeout, clock);
  LH_RETURN_IF_ERROR(connection->Open());
  LH_RETURN_IF_ERROR(connection->CheckOrInitialize());
  LH_RETURN_IF_ERROR(connection->Configure());
  LH_RETURN_IF_ERROR(connection->PrepareAll());
  LH_ASSIGN_OR_RETURN(std::unique_ptr<SqliteHostQueue> queue,
                      SqliteHostQueue::Open(options.path, boot_id));
  connection->set_queue(std::move(queue));
  return std::shared_ptr<SqliteBackend>(new SqliteBackend(
      std::move(options.path), std::move(boot_id), clock, std::move(connection)));
}

SqliteBackend::SqliteBackend(std::string path, std::string boot_id, Clock& clock,
                             std::unique_ptr<SqliteConnection> connection)
    : path_(std::move(path)),
      boot_id_(std::move(boot_id)),
      clock_(clock),
      connection_(std::move(connection)) {}

SqliteBackend::~SqliteBackend() = default;

std::int64_t SqliteBackend::NowNs() const { return clock_.Now().time_since_epoch().count(); }

Capabilities SqliteBackend::capabilities() const {
  return Capabilities{
      .multi_process = true,
      .native_wait = true,
      .fencing_survives_restart = true,
      .fenced_ops = FencedOpBit(FencedOp::Kind::kSql),
  };
}

Result<Grant> SqliteBackend::TryAcquire(const GrantRequest& request) {
  LH_RETURN_IF_ERROR(CheckTtl(request.key, request.ttl));
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("try-acquire"));
  // Read the clock only now that the write lock is held: the wait for it may be long, and the
  // grant's expiry must not be earlier than the caller's t_send + ttl.
  const std::int64_t now_ns = NowNs();
  {
    StatementRun live(connection, kSelectLiveGrant, "try-acquire");
    live.Bind(1, request.key);
    live.Bind(2, boot_id_);
    live.Bind(3, now_ns);
    LH_ASSIGN_OR_RETURN(bool held, live.Next());
    if (held) {
      return Status::HeldByAnother(LeaseInfoFromRow(live, now_ns));
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
    put.Bind(2, request.owner_token);
    put.Bind(3, request.holder);
    put.Bind(4, fencing_token);
    put.Bind(5, boot_id_);
    put.Bind(6, request.ttl.count());
    put.Bind(7, SaturatingAdd(now_ns, request.ttl.count()));
    LH_RETURN_IF_ERROR(put.Finish());
  }
  LH_RETURN_IF_ERROR(transaction.Commit("try-acquire"));
  return Grant{.fencing_token = static_cast<FencingToken>(fencing_token), .ttl = request.ttl};
}

Status SqliteBackend::Renew(const RenewRequest& request) {
  std::vector<Status> results = RenewMany(std::span<const RenewRequest>(&request, 1));
  return std::move(results.front());
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
    return Status::Lost(fmt::format("lease {} was lost: taken over by another owner", key),
                        LostCause::kStolen);
  }
  if (any.Text(1) != boot_id_) {
    return Status::Lost(
        fmt::format("lease {} was lost: expired (the host rebooted since it was granted)", key));
  }
  return Status::Lost(
      fmt::format("lease {} was lost: expired {} ago", key, HumanDuration(now_ns - any.Int(2))));
}

Status SqliteBackend::Release(std::string_view key, std::string_view owner_token) {
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  // Not durable: a release lost in a power cut is a grant of the old boot, expired anyway.
  // This saves one fsync on every handoff (WriteTransaction::Begin).
  LH_RETURN_IF_ERROR(transaction.Begin("release", /*durable=*/false));
  transaction.NotifyOnCommit(key);
  const std::int64_t now_ns = NowNs();
  Status result;
  bool found = false;
  {
    StatementRun erase(connection, kDeleteOwnGrant, "release");
    erase.Bind(1, key);
    erase.Bind(2, owner_token);
    LH_ASSIGN_OR_RETURN(found, erase.Next());
    if (found) {
      const bool same_boot = erase.Text(0) == boot_id_;
      const std::int64_t expires_ns = erase.Int(1);
      LH_RETURN_IF_ERROR(erase.Finish());
      if (!same_boot) {
        result = Status::Lost(fmt::format(
            "lease {} was lost before release: expired (the host rebooted since it was granted)",
            key));
      } else if (expires_ns <= now_ns) {
        result = Status::Lost(fmt::format("lease {} was lost before release: expired {} ago", key,
                                          HumanDuration(now_ns - expires_ns)));
      }
    }
  }
  if (!found) {
    // Absent, or someone else's: nothing was deleted.
    result = LostStatusLocked(key, owner_token, now_ns);
  }
  // Commit even when lost: deleting our own expired row is harmless and tidies the table.
  LH_RETURN_IF_ERROR(transaction.Commit("release"));
  return result;
}

Status SqliteBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  if (request.keep == Duration::zero() && !request.record.has_value()) {
    return Release(request.key, request.owner_token);
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
  } else {
    // Only a live grant of ours may end with a record: a dead one is deleted without it.
    StatementRun erase(connection, kDeleteOwnGrant, "finish");
    erase.Bind(1, request.key);
    erase.Bind(2, request.owner_token);
    LH_ASSIGN_OR_RETURN(bool found, erase.Next());
    if (found && (erase.Text(0) != boot_id_ || erase.Int(1) <= now_ns)) {
      LH_RETURN_IF_ERROR(erase.Finish());
      Status lost = Status::Lost(
          fmt::format("lease {} was lost before release: expired (nothing recorded)", request.key));
      LH_RETURN_IF_ERROR(transaction.Commit("finish"));
      return lost;
    }
    if (found) {
      LH_RETURN_IF_ERROR(erase.Finish());
    }
  }
  if (sqlite3_changes(connection.db()) != 1) {
    return LostStatusLocked(request.key, request.owner_token, now_ns);  // rolls back
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
  diagnosis.items.push_back(
      {.area = "topology",
       .found = "single host: every process of this host shares it (other hosts cannot)"});
  diagnosis.items.push_back(AccessItem(path_, fix));
  return diagnosis;
}

Result<std::optional<LeaseInfo>> SqliteBackend::Inspect(std::string_view key) {
  MutexLock lock(&mu_);
  const std::int64_t now_ns = NowNs();
  StatementRun live(*connection_, kSelectLiveGrant, "inspect");
  live.Bind(1, key);
  live.Bind(2, boot_id_);
  live.Bind(3, now_ns);
  LH_ASSIGN_OR_RETURN(bool found, live.Next());
  if (!found) {
    return std::optional<LeaseInfo>();
  }
  return std::optional<LeaseInfo>(LeaseInfoFromRow(live, now_ns));
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

Result<bool> SqliteBackend::ForceRelease(std::string_view key) {
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
    LH_ASSIGN_OR_RETURN(bool found, erase.Next());
    if (found) {
      was_live = erase.Text(0) == boot_id_ && erase.Int(1) > now_ns;
      LH_RETURN_IF_ERROR(erase.Finish());
    }
  }
  LH_RETURN_IF_ERROR(transaction.Commit("force-release"));
  return was_live;
}

Status SqliteBackend::WaitForChange(std::string_view key, SteadyTime deadline,
                                    std::stop_token stop) {
  // Cancellation bumps the slot too, so that a stop requested between the check below and the
  // futex wait is not missed (the other waiters on the slot see a spurious wake-up).
  SqliteHostQueue* queue = nullptr;
  {
    MutexLock lock(&mu_);
    queue = &connection_->queue();
  }
  std::stop_callback on_stop(stop, [queue, key] { queue->Notify(key); });
  while (true) {
    if (stop.stop_requested()) {
      return Status::Cancelled("wait cancelled");
    }
    const SteadyTime now = clock_.Now();
    if (now >= deadline) {
      return Status::DeadlineExceeded("wait ran out");
    }
    // The generation first, then the grant: a release that commits after this read of the
    // grant bumps the generation after the read of the generation.
    const std::uint32_t seen = queue->Generation(key);
    std::int64_t expires_ns = 0;
    std::int64_t now_ns = 0;
    {
      MutexLock lock(&mu_);
      now_ns = NowNs();
      StatementRun live(*connection_, kSelectLiveGrant, "wait");
      live.Bind(1, key);
      live.Bind(2, boot_id_);
      live.Bind(3, now_ns);
      LH_ASSIGN_OR_RETURN(bool held, live.Next());
      if (!held) {
        return Status::Ok();
      }
      expires_ns = live.Int(5);
    }
    // Without a release (the holder killed) the grant ends by itself: wake then at the latest.
    const Duration until_expiry = Duration(expires_ns - now_ns) + std::chrono::milliseconds(1);
    const Duration timeout = std::min<Duration>(deadline - now, until_expiry);
    if (queue->WaitChange(key, seen, timeout) && !stop.stop_requested()) {
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
    StatementRun live(connection, kSelectLiveGrant, "fenced write");
    live.Bind(1, request.key);
    live.Bind(2, boot_id_);
    live.Bind(3, now_ns);
    LH_ASSIGN_OR_RETURN(bool found, live.Next());
    const bool ours = found && live.Text(2) == request.owner_token &&
                      static_cast<FencingToken>(live.Int(3)) == request.fencing_token;
    if (!ours) {
      // A live row of another grant names its holder; our own kept grant (token + ":kept",
      // Finish) or none at all means ours ended.
      const bool other = found && static_cast<FencingToken>(live.Int(3)) != request.fencing_token;
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
