// File: backends/sqlite/sqlite_connection.h (internal)
//
// SqliteConnection (one connection and its prepared statements), StatementRun (one use of a
// statement), WriteTransaction (BEGIN IMMEDIATE through the host's write queue) and the row
// readers every operation shares. Only the sqlite_*.cc files include it.

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
#include "backends/sqlite/sqlite_files.h"
#include "backends/sqlite/sqlite_holder_anchor.h"
#include "backends/sqlite/sqlite_host_queue.h"
#include "backends/sqlite/sqlite_schema.h"
#include "core/duration.h"

namespace leasehold::internal {

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
inline std::string_view ModeText(LeaseMode mode) {
  return mode == LeaseMode::kShared ? "shared" : "exclusive";
}

// Reads grants.mode: anything but 'shared' (a row of another program's) is exclusive, the kind
// that admits nobody beside it.
inline LeaseMode ModeFromText(std::string_view text) {
  return text == "shared" ? LeaseMode::kShared : LeaseMode::kExclusive;
}

// Reads grants.lease_limit and grants.slot as the LeaseInfo fields they are, whatever another
// program put there: a limit in 1..kMaxLeaseLimit, a slot in 0..UINT32_MAX.
inline std::uint32_t LimitFromColumn(std::int64_t value) {
  return static_cast<std::uint32_t>(
      std::clamp<std::int64_t>(value, 1, static_cast<std::int64_t>(kMaxLeaseLimit)));
}

inline std::uint32_t SlotFromColumn(std::int64_t value) {
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(
      value, 0, static_cast<std::int64_t>(std::numeric_limits<std::uint32_t>::max())));
}

// Reads a row of kSelectLiveGrantsSql, kSelectOwnLiveGrantSql or kListLiveGrantsSql.
inline LeaseInfo LeaseInfoFromRow(const StatementRun& row, std::int64_t now_ns) {
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

inline Result<std::optional<LiveIntent>> ReadLiveIntent(SqliteConnection& connection,
                                                        std::string_view key,
                                                        const std::string& boot_id,
                                                        std::int64_t now_ns,
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

inline Status CheckTtl(std::string_view key, Duration ttl) {
  if (ttl <= Duration::zero()) {
    return Status::InvalidArgument(
        fmt::format("lease {}: TTL must be positive, got {}", key, FormatDuration(ttl)));
  }
  return Status::Ok();
}

}  // namespace leasehold::internal
