// File: bench/floor_sqlite.cc
//
// SQLite floor: an empty BEGIN IMMEDIATE / COMMIT on the store's own file, on a connection of
// its own (WAL, as the backend leaves the file). It takes the write lock and writes nothing, so
// it has no fsync: a grant, which must reach the disk, costs at least one fsync more.

#include <sqlite3.h>

#include "core/url.h"
#include "floor.h"

namespace leasehold::bench {
namespace {

class SqliteFloor final : public FloorProbe {
 public:
  ~SqliteFloor() override { sqlite3_close(db_); }

  SqliteFloor(const SqliteFloor&) = delete;
  SqliteFloor& operator=(const SqliteFloor&) = delete;

  SqliteFloor(sqlite3* db, const char* sql) : db_(db), sql_(sql) {}

  Status Call() override {
    if (sqlite3_exec(db_, sql_, nullptr, nullptr, nullptr) != SQLITE_OK) {
      return Status::Unavailable(sqlite3_errmsg(db_));
    }
    return Status();
  }

 private:
  sqlite3* db_;
  const char* sql_;
};

}  // namespace

Result<std::unique_ptr<FloorProbe>> OpenSqliteFloor(const std::string& url) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(parsed.path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return Status::Unavailable(
        "cannot open the sqlite file for the floor probe (open the store "
        "first, it creates the file)");
  }
  sqlite3_busy_timeout(db, 5000);
  sqlite3_exec(db, "PRAGMA synchronous=FULL", nullptr, nullptr, nullptr);
  return std::unique_ptr<FloorProbe>(new SqliteFloor(db, "BEGIN IMMEDIATE; COMMIT;"));
}

Result<std::unique_ptr<FloorProbe>> OpenSqliteDurableFloor(const std::string& url) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  const std::string path = parsed.path + ".floor";
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
          SQLITE_OK ||
      sqlite3_exec(db,
                   "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; CREATE TABLE IF NOT "
                   "EXISTS t (k INTEGER PRIMARY KEY, v INTEGER)",
                   nullptr, nullptr, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return Status::Unavailable("cannot create the sqlite durable-floor file");
  }
  sqlite3_busy_timeout(db, 5000);
  return std::unique_ptr<FloorProbe>(new SqliteFloor(
      db, "BEGIN IMMEDIATE; INSERT OR REPLACE INTO t VALUES (1, random()); COMMIT;"));
}

}  // namespace leasehold::bench
