// File: bench/native_sqlite.cc
//
// SQLite native lock (bench/native.h): a scratch table in a scratch file beside the store's
// (<store file>.native), WAL and synchronous=FULL as leasehold opens its own, so a grant pays
// the same fsync. Taking is one statement, one transaction: an insert that does nothing when a
// live row exists (INSERT OR IGNORE's semantics) and takes over an expired one (an upsert whose
// DO UPDATE runs only on expiry); releasing is DELETE ... WHERE owner = ?. Waiters retry with a
// 1 ms sleep: SQLite has no notification across processes.

#include <sqlite3.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/url.h"
#include "native.h"

namespace leasehold::bench {
namespace {

long long WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class SqliteNative final : public NativeLock {
 public:
  SqliteNative(sqlite3* db, sqlite3_stmt* take, sqlite3_stmt* give, std::string key)
      : db_(db), take_(take), give_(give), key_(std::move(key)) {}

  ~SqliteNative() override {
    sqlite3_finalize(take_);
    sqlite3_finalize(give_);
    sqlite3_close(db_);
  }

  SqliteNative(const SqliteNative&) = delete;
  SqliteNative& operator=(const SqliteNative&) = delete;

  Result<bool> TryAcquire() override {
    token_ = NativeOwnerToken();
    const long long now = WallMs();
    sqlite3_reset(take_);
    sqlite3_bind_text(take_, 1, key_.c_str(), static_cast<int>(key_.size()), SQLITE_STATIC);
    sqlite3_bind_text(take_, 2, token_.c_str(), static_cast<int>(token_.size()), SQLITE_STATIC);
    sqlite3_bind_int64(take_, 3, now + kNativeTtl.count());
    sqlite3_bind_int64(take_, 4, now);
    if (sqlite3_step(take_) != SQLITE_DONE) {
      return Status::Unavailable(sqlite3_errmsg(db_));
    }
    return sqlite3_changes(db_) == 1;
  }

  Status Acquire(std::chrono::steady_clock::time_point deadline) override {
    for (;;) {
      LH_ASSIGN_OR_RETURN(bool got, TryAcquire());
      if (got) {
        return Status();
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::DeadlineExceeded("sqlite native lock: wait timed out");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  Status Release() override {
    sqlite3_reset(give_);
    sqlite3_bind_text(give_, 1, key_.c_str(), static_cast<int>(key_.size()), SQLITE_STATIC);
    sqlite3_bind_text(give_, 2, token_.c_str(), static_cast<int>(token_.size()), SQLITE_STATIC);
    if (sqlite3_step(give_) != SQLITE_DONE) {
      return Status::Unavailable(sqlite3_errmsg(db_));
    }
    return sqlite3_changes(db_) == 1 ? Status()
                                     : Status::Lost("sqlite native lock: not held at release");
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* take_;
  sqlite3_stmt* give_;
  std::string key_;
  std::string token_;
};

}  // namespace

Result<std::unique_ptr<NativeLock>> OpenSqliteNative(const std::string& url,
                                                     const std::string& key) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  const std::string path = parsed.path + ".native";
  sqlite3* db = nullptr;
  sqlite3_stmt* take = nullptr;
  sqlite3_stmt* give = nullptr;
  auto fail = [&](const char* what) {
    std::string message = std::string(what) + ": " + (db != nullptr ? sqlite3_errmsg(db) : "");
    sqlite3_finalize(take);
    sqlite3_finalize(give);
    sqlite3_close(db);
    return Status::Unavailable(message);
  };
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    return fail("cannot open the sqlite native-lock file");
  }
  sqlite3_busy_timeout(db, 5000);
  if (sqlite3_exec(db,
                   "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; CREATE TABLE IF NOT EXISTS "
                   "native_locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires INTEGER NOT "
                   "NULL)",
                   nullptr, nullptr, nullptr) != SQLITE_OK) {
    return fail("cannot set up the sqlite native-lock file");
  }
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO native_locks (name, owner, expires) VALUES (?1, ?2, ?3) "
                         "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires = "
                         "excluded.expires WHERE native_locks.expires <= ?4",
                         -1, &take, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "DELETE FROM native_locks WHERE name = ?1 AND owner = ?2", -1, &give,
                         nullptr) != SQLITE_OK) {
    return fail("cannot prepare the sqlite native-lock statements");
  }
  return std::unique_ptr<NativeLock>(new SqliteNative(db, take, give, key));
}

}  // namespace leasehold::bench
