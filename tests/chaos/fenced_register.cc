#include "chaos/fenced_register.h"

#include <sqlite3.h>

#include "leasehold/clock.h"

namespace leasehold::chaos {

namespace {

// `reg` holds the current value and the highest token seen per key; `writes` is the history
// of every attempt (accepted or not), in commit order (rowid).
constexpr const char* kSchema =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS reg(key TEXT PRIMARY KEY, max_token INTEGER NOT NULL,"
    "  value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS writes(id INTEGER PRIMARY KEY, key TEXT NOT NULL,"
    "  token INTEGER NOT NULL, writer TEXT NOT NULL, max_before INTEGER NOT NULL,"
    "  accepted INTEGER NOT NULL, t_commit_ns INTEGER NOT NULL);";

// The fenced write: insert, or update only when the token is not lower than the highest seen.
// sqlite3_changes() tells whether it landed.
constexpr const char* kFencedUpsert =
    "INSERT INTO reg(key, max_token, value) VALUES(?1, ?2, ?3) "
    "ON CONFLICT(key) DO UPDATE SET max_token = excluded.max_token, value = excluded.value "
    "WHERE excluded.max_token >= reg.max_token";

// The negative control: every write lands; the maximum is still tracked for the record.
constexpr const char* kUnfencedUpsert =
    "INSERT INTO reg(key, max_token, value) VALUES(?1, ?2, ?3) "
    "ON CONFLICT(key) DO UPDATE SET max_token = max(reg.max_token, excluded.max_token), "
    "value = excluded.value";

// Busy timeout far beyond the longest pause the harness injects: a worker stopped inside a
// register transaction holds the file lock until it is resumed or killed.
constexpr int kBusyTimeoutMs = 60'000;

}  // namespace

Result<std::unique_ptr<FencedRegister>> FencedRegister::Open(const std::string& path, bool fenced) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Status::Unavailable("register: " + msg);
  }
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  char* err = nullptr;
  if (sqlite3_exec(db, kSchema, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "schema";
    sqlite3_free(err);
    sqlite3_close(db);
    return Status::Unavailable("register: " + msg);
  }
  return std::unique_ptr<FencedRegister>(new FencedRegister(db, fenced));
}

FencedRegister::~FencedRegister() {
  sqlite3_close(db_);
}

WriteResult FencedRegister::Write(const std::string& key, FencingToken token,
                                  const std::string& writer) {
  WriteResult result{.outcome = "error"};
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return result;
  }
  bool ok = true;
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "SELECT max_token FROM reg WHERE key = ?1", -1, &st, nullptr);
  sqlite3_bind_text(st, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st) == SQLITE_ROW) {
    result.max_before = static_cast<std::uint64_t>(sqlite3_column_int64(st, 0));
  }
  sqlite3_finalize(st);

  sqlite3_prepare_v2(db_, fenced_ ? kFencedUpsert : kUnfencedUpsert, -1, &st, nullptr);
  sqlite3_bind_text(st, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, static_cast<sqlite3_int64>(token));
  sqlite3_bind_text(st, 3, writer.c_str(), -1, SQLITE_TRANSIENT);
  ok = sqlite3_step(st) == SQLITE_DONE;
  sqlite3_finalize(st);
  bool accepted = ok && sqlite3_changes(db_) == 1;

  result.t_commit_ns = BootClock::now().time_since_epoch().count();
  sqlite3_prepare_v2(db_,
                     "INSERT INTO writes(key, token, writer, max_before, accepted, t_commit_ns) "
                     "VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
                     -1, &st, nullptr);
  sqlite3_bind_text(st, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, static_cast<sqlite3_int64>(token));
  sqlite3_bind_text(st, 3, writer.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 4, static_cast<sqlite3_int64>(result.max_before));
  sqlite3_bind_int(st, 5, accepted ? 1 : 0);
  sqlite3_bind_int64(st, 6, result.t_commit_ns);
  ok = ok && sqlite3_step(st) == SQLITE_DONE;
  sqlite3_finalize(st);

  if (!ok || sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return result;
  }
  result.outcome = accepted ? "accepted" : "rejected";
  return result;
}

}  // namespace leasehold::chaos
