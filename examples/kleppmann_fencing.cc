// kleppmann_fencing: the scenario from Martin Kleppmann's "How to do distributed locking"
// (2016), run for real, and the fencing token stopping it.
//
//   1. Client A acquires the lease and checks that it is valid.
//   2. A is paused right before its write (here: SIGSTOP; in life: a GC pause, a VM freeze).
//      Its heartbeat is paused with it, so the lease expires.
//   3. Client B acquires the lease (a higher fencing token) and writes.
//   4. A resumes and writes, still believing it holds the lease.
//   5. Every storage layer rejects A's write.
//
// The storage layers:
//   - the lease's own store (Lease::Write, leasehold/fenced_write.h): data kept beside the
//     lease, written only while the store still holds the writer's grant, checked by the store
//     in the same atomic step. A key-value store gets a Put of "kleppmann:report" (a node
//     "/kleppmann-report" on zk://); a SQL store an upsert into the table kleppmann_report.
//   - a local directory (FencedDirectory) and a SQLite table with a lock_version column
//     (BuildFencedUpsert), the token rule of leasehold/fencing.h for storage outside the store.
//   - with a third argument, a PostgreSQL table with a lock_version column (PostgresLedger:
//     SqlDialect::kPostgres and PQexecParams; built when the project has libpq,
//     LEASEHOLD_WITH_POSTGRES).
//
//   kleppmann_fencing STORE_URL SCRATCH_DIR [LEDGER_URL]
//
// STORE_URL must be shared by two processes (sqlite://, redis://, postgres://, etcd://, zk://;
// not memory://). LEDGER_URL (postgres://... or postgresql://..., a plain libpq URL: no leasehold
// parameters) names the database of the PostgreSQL ledger, table `kleppmann_ledger` (created if
// missing; the example's row is reset at start). Prints each write's fencing token and each
// layer's answer ("accepted", or "rejected" with the reason). Exits 0 if A's stale write was
// rejected by every storage layer and B's writes were accepted.

#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <sys/wait.h>

#include "leasehold/leasehold.h"

#ifdef LEASEHOLD_EXAMPLE_WITH_POSTGRES
#include <libpq-fe.h>
#endif

namespace {

using namespace std::chrono_literals;
using leasehold::FencingToken;
using leasehold::Status;

constexpr char kKey[] = "example:kleppmann";
constexpr auto kTtl = 1s;

// The SQL storage layer: one row per record, guarded by lock_version.
class SqliteLedger {
 public:
  explicit SqliteLedger(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) {
      std::fprintf(stderr, "sqlite3_open %s failed\n", path.c_str());
      std::exit(70);
    }
    sqlite3_busy_timeout(db_, 5000);
    Exec(
        "CREATE TABLE IF NOT EXISTS ledger (id TEXT PRIMARY KEY, value TEXT NOT NULL, "
        "lock_version INTEGER NOT NULL DEFAULT 0)");
  }

  SqliteLedger(const SqliteLedger&) = delete;
  SqliteLedger& operator=(const SqliteLedger&) = delete;
  SqliteLedger(SqliteLedger&&) = delete;
  SqliteLedger& operator=(SqliteLedger&&) = delete;

  ~SqliteLedger() { sqlite3_close(db_); }

  // Writes `value` under `token`; kLost ("fenced out") if a higher token was stored first.
  Status Write(const std::string& id, const std::string& value, FencingToken token) {
    auto stmt = leasehold::BuildFencedUpsert({.table = "ledger",
                                              .id = id,
                                              .set = {{"value", value}},
                                              .token = token,
                                              .dialect = leasehold::SqlDialect::kSqlite});
    if (!stmt.ok()) {
      return stmt.status();
    }
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db_, stmt->text.c_str(), -1, &s, nullptr) != SQLITE_OK) {
      return Status::Internal(sqlite3_errmsg(db_));
    }
    for (std::size_t i = 0; i < stmt->params.size(); ++i) {
      sqlite3_bind_text(s, static_cast<int>(i + 1), stmt->params[i].c_str(), -1, SQLITE_TRANSIENT);
    }
    const int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
      return Status::Unavailable(sqlite3_errmsg(db_));
    }
    return leasehold::CheckFencedRows(sqlite3_changes(db_), token);
  }

  std::string Read(const std::string& id) {
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db_,
                       "SELECT value || ' (lock_version ' || lock_version || ')' FROM ledger "
                       "WHERE id = ?1",
                       -1, &s, nullptr);
    sqlite3_bind_text(s, 1, id.c_str(), -1, SQLITE_TRANSIENT);
    std::string out = sqlite3_step(s) == SQLITE_ROW
                          ? reinterpret_cast<const char*>(sqlite3_column_text(s, 0))
                          : "(missing)";
    sqlite3_finalize(s);
    return out;
  }

 private:
  void Exec(const char* sql) {
    if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
      std::fprintf(stderr, "%s: %s\n", sql, sqlite3_errmsg(db_));
      std::exit(70);
    }
  }

  sqlite3* db_ = nullptr;
};

#ifdef LEASEHOLD_EXAMPLE_WITH_POSTGRES
// The same storage layer on PostgreSQL: `kleppmann_ledger`, guarded by lock_version (bigint).
class PostgresLedger {
 public:
  explicit PostgresLedger(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) {
      std::fprintf(stderr, "postgres ledger: %s", PQerrorMessage(conn_));
      std::exit(70);
    }
    PQsetNoticeProcessor(
        conn_, [](void*, const char*) {}, nullptr);  // "already exists"
    Exec(
        "CREATE TABLE IF NOT EXISTS kleppmann_ledger (id text PRIMARY KEY, value text NOT NULL, "
        "lock_version bigint NOT NULL DEFAULT 0)");
  }

  PostgresLedger(const PostgresLedger&) = delete;
  PostgresLedger& operator=(const PostgresLedger&) = delete;
  PostgresLedger(PostgresLedger&&) = delete;
  PostgresLedger& operator=(PostgresLedger&&) = delete;

  ~PostgresLedger() { PQfinish(conn_); }

  // Forgets the record: a fresh run (the database, unlike the scratch directory, outlives it).
  void Reset(const std::string& id) {
    const char* values[] = {id.c_str()};
    PQclear(PQexecParams(conn_, "DELETE FROM kleppmann_ledger WHERE id = $1", 1, nullptr, values,
                         nullptr, nullptr, 0));
  }

  // Writes `value` under `token`; kLost ("fenced out") if a higher token was stored first.
  Status Write(const std::string& id, const std::string& value, FencingToken token) {
    auto stmt = leasehold::BuildFencedUpsert({.table = "kleppmann_ledger",
                                              .id = id,
                                              .set = {{"value", value}},
                                              .token = token,
                                              .dialect = leasehold::SqlDialect::kPostgres});
    if (!stmt.ok()) {
      return stmt.status();
    }
    std::vector<const char*> values;
    for (const std::string& p : stmt->params) {
      values.push_back(p.c_str());
    }
    PGresult* res = PQexecParams(conn_, stmt->text.c_str(), static_cast<int>(values.size()),
                                 nullptr, values.data(), nullptr, nullptr, 0);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      Status err = Status::Unavailable(PQresultErrorMessage(res));
      PQclear(res);
      return err;
    }
    const long long rows = std::atoll(PQcmdTuples(res));
    PQclear(res);
    return leasehold::CheckFencedRows(rows, token);
  }

  std::string Read(const std::string& id) {
    const char* values[] = {id.c_str()};
    PGresult* res = PQexecParams(conn_,
                                 "SELECT value || ' (lock_version ' || lock_version || ')' FROM "
                                 "kleppmann_ledger WHERE id = $1",
                                 1, nullptr, values, nullptr, nullptr, 0);
    std::string out = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1
                          ? PQgetvalue(res, 0, 0)
                          : "(missing)";
    PQclear(res);
    return out;
  }

 private:
  void Exec(const char* sql) {
    PGresult* res = PQexec(conn_, sql);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      std::fprintf(stderr, "%s: %s", sql, PQresultErrorMessage(res));
      std::exit(70);
    }
    PQclear(res);
  }

  PGconn* conn_;
};
#endif

// The PostgreSQL ledger's URL (third argument), or empty.
std::string g_ledger_url;

struct Outcome {
  bool store_ok = false;
  bool dir_ok = false;
  bool sql_ok = false;
  bool pg_ok = false;

  [[nodiscard]] bool any() const { return store_ok || dir_ok || sql_ok || pg_ok; }
};

std::string Answer(const Status& s) {
  return s.ok() ? "accepted" : "rejected (" + s.ToString() + ")";
}

// The write of `value` to data in the lease's own store, in the op kind the store takes.
leasehold::FencedWrite StoreWrite(const leasehold::Store& store, const std::string& value) {
  if (store.SupportsFencedOp(leasehold::FencedOp::Kind::kPut)) {
    const std::string key = store.backend_name() == "zk" ? "/kleppmann-report" : "kleppmann:report";
    return leasehold::FencedWrite().Put(key, value);
  }
  return leasehold::FencedWrite()
      .Sql("CREATE TABLE IF NOT EXISTS kleppmann_report (id TEXT PRIMARY KEY, value TEXT NOT NULL)")
      .Sql(
          "INSERT INTO kleppmann_report (id, value) VALUES ('report', $1) "
          "ON CONFLICT (id) DO UPDATE SET value = excluded.value",
          {value});
}

// Writes one value to every storage layer and prints what each said.
Outcome WriteAll(const char* who, const leasehold::Store& store, const leasehold::Lease& lease,
                 const std::string& dir) {
  const FencingToken token = lease.fencing_token();
  const std::string value = std::string("written by ") + who;
  Status in_store = lease.Write(StoreWrite(store, value)).status();
  Status d = leasehold::FencedDirectory(dir).Write("report", value, token);
  Status s = SqliteLedger(dir + "/ledger.db").Write("report", value, token);
  std::printf(
      "%s writes with fencing token %llu:\n  store (%s): %s\n  directory: %s\n"
      "  sqlite:    %s\n",
      who, static_cast<unsigned long long>(token), std::string(store.backend_name()).c_str(),
      Answer(in_store).c_str(), Answer(d).c_str(), Answer(s).c_str());
  Outcome out{in_store.ok(), d.ok(), s.ok(), false};
#ifdef LEASEHOLD_EXAMPLE_WITH_POSTGRES
  if (!g_ledger_url.empty()) {
    Status p = PostgresLedger(g_ledger_url).Write("report", value, token);
    std::printf("  postgres:  %s\n", Answer(p).c_str());
    out.pg_ok = p.ok();
  }
#endif
  std::fflush(stdout);
  return out;
}

void WriteByte(int fd, char c) {
  while (::write(fd, &c, 1) < 0 && errno == EINTR) {
  }
}

bool ReadExact(int fd, void* buf, std::size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) {
      continue;
    }
    if (r <= 0) {
      return false;
    }
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// Client A, in its own process. Exit codes: 0 its write was rejected (as it must be), 1 it was
// accepted (fencing failed), 2 setup failed.
int ClientA(const std::string& url, const std::string& dir, int to_parent, int from_parent) {
  auto store = leasehold::Store::Open(url);
  if (!store.ok()) {
    std::fprintf(stderr, "A: %s\n", store.status().ToString().c_str());
    return 2;
  }
  auto lease = (*store)->TryAcquire(kKey, {.ttl = kTtl, .holder = "client-A"});
  if (!lease.ok() || !lease->valid()) {
    std::fprintf(stderr, "A: %s\n", lease.status().ToString().c_str());
    return 2;
  }
  // A checked its lease: it is valid. From here A believes it may write...
  FencingToken token = lease->fencing_token();
  if (::write(to_parent, &token, sizeof token) != sizeof token) {
    return 2;
  }
  // ...and is paused exactly here, between the check and the write (the parent SIGSTOPs us
  // while we wait for its go-ahead; the blocking read only fixes *where* the pause lands).
  char go = 0;
  if (!ReadExact(from_parent, &go, 1)) {
    return 2;
  }
  // Resumed. A naive client writes now. (A careful one would check lease->valid() again and
  // find it false; but the pause could just as well strike after that check, so only the
  // storage layer can make the write safe.)
  Outcome a = WriteAll("client A (stale)", **store, *lease, dir);
  return a.any() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: kleppmann_fencing STORE_URL SCRATCH_DIR [LEDGER_URL]\n");
    return 64;
  }
  const std::string url = argv[1];
  const std::string dir = argv[2];
  if (argc == 4) {
#ifdef LEASEHOLD_EXAMPLE_WITH_POSTGRES
    g_ledger_url = argv[3];
    PostgresLedger(g_ledger_url).Reset("report");
#else
    std::fprintf(stderr, "kleppmann_fencing was built without libpq: no LEDGER_URL\n");
    return 64;
#endif
  }
  if (url.rfind("memory:", 0) == 0) {
    std::fprintf(stderr, "kleppmann_fencing needs a store shared by two processes\n");
    return 64;
  }
  int a_to_parent[2];
  int parent_to_a[2];
  if (::pipe(a_to_parent) != 0 || ::pipe(parent_to_a) != 0) {
    return 70;
  }
  std::fflush(stdout);
  // Fork before opening any store in this process: the child starts with one thread.
  const pid_t a = ::fork();
  if (a < 0) {
    return 70;
  }
  if (a == 0) {
    ::close(a_to_parent[0]);
    ::close(parent_to_a[1]);
    ::_exit(ClientA(url, dir, a_to_parent[1], parent_to_a[0]));
  }
  ::close(a_to_parent[1]);
  ::close(parent_to_a[0]);
  auto reap_a = [a] {
    int status = 0;
    ::waitpid(a, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  };

  FencingToken a_token = 0;
  if (!ReadExact(a_to_parent[0], &a_token, sizeof a_token)) {
    std::fprintf(stderr, "client A failed to acquire the lease\n");
    return reap_a() == 0 ? 70 : 69;
  }
  std::printf("client A acquired %s with fencing token %llu (ttl %lld ms) and checked it\n", kKey,
              static_cast<unsigned long long>(a_token),
              static_cast<long long>(std::chrono::milliseconds(kTtl).count()));
  ::kill(a, SIGSTOP);
  std::printf("client A paused (SIGSTOP) right before its write; its heartbeat stops too\n");
  std::fflush(stdout);

  int rc = 0;
  {
    auto store = leasehold::Store::Open(url);
    if (!store.ok()) {
      std::fprintf(stderr, "B: %s\n", store.status().ToString().c_str());
      ::kill(a, SIGKILL);
      reap_a();
      return 69;
    }
    // B waits for the key: it frees itself when A's unrenewed grant expires.
    auto t0 = std::chrono::steady_clock::now();
    auto lease = (*store)->Acquire(kKey, {.ttl = 10s, .wait = 30s, .holder = "client-B"});
    if (!lease.ok()) {
      std::fprintf(stderr, "B: %s\n", lease.status().ToString().c_str());
      ::kill(a, SIGKILL);
      reap_a();
      return 69;
    }
    std::printf("client B acquired %s with fencing token %llu after waiting %lld ms\n", kKey,
                static_cast<unsigned long long>(lease->fencing_token()),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - t0)
                                           .count()));
    Outcome b = WriteAll("client B", **store, *lease, dir);
    if (!b.store_ok || !b.dir_ok || !b.sql_ok || (!g_ledger_url.empty() && !b.pg_ok)) {
      rc = 1;
    }

    ::kill(a, SIGCONT);
    WriteByte(parent_to_a[1], 'g');
    std::printf("client A resumed\n");
    std::fflush(stdout);
    const int a_rc = reap_a();
    if (a_rc != 0) {
      std::printf("FAIL: client A's stale write was %s\n",
                  a_rc == 1 ? "accepted by a storage layer" : "not attempted");
      rc = 1;
    }
    (void)lease->Release();
  }
  std::string file;
  if (FILE* f = std::fopen((dir + "/report").c_str(), "r")) {
    char buf[256] = {};
    file = std::string(buf, std::fread(buf, 1, sizeof buf - 1, f));
    std::fclose(f);
  }
  auto highest = leasehold::FencedDirectory(dir).HighestToken("report");
  std::printf("final: directory holds \"%s\" (highest token %llu); sqlite holds \"%s\"\n",
              file.c_str(), static_cast<unsigned long long>(highest.value_or(0)),
              SqliteLedger(dir + "/ledger.db").Read("report").c_str());
#ifdef LEASEHOLD_EXAMPLE_WITH_POSTGRES
  if (!g_ledger_url.empty()) {
    const std::string row = PostgresLedger(g_ledger_url).Read("report");
    std::printf("final: postgres holds \"%s\"\n", row.c_str());
    if (row.rfind("written by client B", 0) != 0) {
      rc = 1;
    }
  }
#endif
  if (file != "written by client B") {
    rc = 1;
  }
  std::printf(rc == 0 ? "OK: the storage layers rejected the stale write\n" : "FAIL\n");
  return rc;
}
