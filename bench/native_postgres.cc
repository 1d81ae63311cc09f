// File: bench/native_postgres.cc
//
// PostgreSQL native locks (bench/native.h) on libpq, every statement prepared once:
// - advisory: pg_try_advisory_lock / pg_advisory_unlock of one bigint id; a waiter blocks in
//   pg_advisory_lock (the server's FIFO queue, what a user writes by hand);
// - table: a row of a table of its own, pre-inserted, taken by one UPDATE ... RETURNING when
//   free or expired (server clock) and released by an owner-checked UPDATE that pg_notify()s in
//   the same statement; a waiter LISTENs and retries on each notification (and every 50 ms, for
//   a holder that died without releasing).

#include <poll.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <libpq-fe.h>

#include "backends/postgres/postgres_options.h"
#include "core/url.h"
#include "native.h"

namespace leasehold::bench {
namespace {

constexpr auto kRetrySlice = std::chrono::milliseconds(50);
constexpr const char* kTable = "leasehold_native_locks";
constexpr const char* kChannel = "leasehold_native_locks";

Result<PGconn*> Connect(const std::string& url) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(internal::PostgresOptions options,
                      internal::PostgresOptions::FromUrl(parsed));
  std::vector<const char*> keys;
  std::vector<const char*> values;
  for (const auto& [k, v] : options.libpq_params) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  PGconn* conn = PQconnectdbParams(keys.data(), values.data(), 0);
  if (PQstatus(conn) != CONNECTION_OK) {
    PQfinish(conn);
    return Status::Unavailable("cannot connect to postgres for the native lock");
  }
  return conn;
}

Status Exec(PGconn* conn, const std::string& sql) {
  PGresult* r = PQexec(conn, sql.c_str());
  const ExecStatusType st = PQresultStatus(r);
  std::string error = PQresultErrorMessage(r);
  PQclear(r);
  return st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK
             ? Status()
             : Status::Unavailable(fmt::format("postgres: {}", error));
}

Status Prepare(PGconn* conn, const char* name, const std::string& sql, int params) {
  PGresult* r = PQprepare(conn, name, sql.c_str(), params, nullptr);
  const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
  std::string error = PQresultErrorMessage(r);
  PQclear(r);
  return ok ? Status() : Status::Unavailable(fmt::format("postgres prepare {}: {}", name, error));
}

// Runs a prepared statement; `rows` gets the row count, `first` the first column's first value.
Status Run(PGconn* conn, const char* name, const std::vector<std::string>& params, int* rows,
           std::string* first) {
  std::vector<const char*> values;
  for (const std::string& p : params) {
    values.push_back(p.c_str());
  }
  PGresult* r = PQexecPrepared(conn, name, static_cast<int>(values.size()), values.data(), nullptr,
                               nullptr, 0);
  const ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    std::string error = PQresultErrorMessage(r);
    PQclear(r);
    return Status::Unavailable(fmt::format("postgres {}: {}", name, error));
  }
  if (rows != nullptr) {
    *rows = PQntuples(r);
  }
  if (first != nullptr) {
    *first = PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
  }
  PQclear(r);
  return Status();
}

class PostgresAdvisoryNative final : public NativeLock {
 public:
  PostgresAdvisoryNative(PGconn* conn, std::string id) : conn_(conn), id_(std::move(id)) {}

  ~PostgresAdvisoryNative() override { PQfinish(conn_); }

  PostgresAdvisoryNative(const PostgresAdvisoryNative&) = delete;
  PostgresAdvisoryNative& operator=(const PostgresAdvisoryNative&) = delete;

  Result<bool> TryAcquire() override {
    std::string got;
    LH_RETURN_IF_ERROR(Run(conn_, "try", {id_}, nullptr, &got));
    return got == "t";
  }

  // Blocks in the server's lock queue (lock_timeout, set when the lock opened, bounds it). A
  // grant that comes after the deadline is given back.
  Status Acquire(std::chrono::steady_clock::time_point deadline) override {
    LH_RETURN_IF_ERROR(Run(conn_, "lock", {id_}, nullptr, nullptr));
    if (std::chrono::steady_clock::now() > deadline) {
      LH_RETURN_IF_ERROR(Release());
      return Status::DeadlineExceeded("postgres native lock: granted after the deadline");
    }
    return Status();
  }

  Status Release() override {
    std::string released;
    LH_RETURN_IF_ERROR(Run(conn_, "unlock", {id_}, nullptr, &released));
    return released == "t" ? Status() : Status::Lost("postgres native lock: not held at release");
  }

 private:
  PGconn* conn_;
  std::string id_;
};

class PostgresTableNative final : public NativeLock {
 public:
  PostgresTableNative(PGconn* conn, std::string key) : conn_(conn), key_(std::move(key)) {}

  ~PostgresTableNative() override { PQfinish(conn_); }

  PostgresTableNative(const PostgresTableNative&) = delete;
  PostgresTableNative& operator=(const PostgresTableNative&) = delete;

  Result<bool> TryAcquire() override {
    token_ = NativeOwnerToken();
    int rows = 0;
    LH_RETURN_IF_ERROR(Run(conn_, "take", {key_, token_}, &rows, nullptr));
    return rows == 1;
  }

  Status Acquire(std::chrono::steady_clock::time_point deadline) override {
    if (!listening_) {
      LH_RETURN_IF_ERROR(Exec(conn_, fmt::format("LISTEN {}", kChannel)));
      listening_ = true;
    }
    // Listening before the first try: a release after a refused try always wakes us.
    for (;;) {
      LH_ASSIGN_OR_RETURN(bool got, TryAcquire());
      if (got) {
        return Status();
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return Status::DeadlineExceeded("postgres native lock: wait timed out");
      }
      LH_RETURN_IF_ERROR(WaitForNotify(std::min(
          kRetrySlice, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                           std::chrono::milliseconds(1))));
    }
  }

  Status Release() override {
    int rows = 0;
    LH_RETURN_IF_ERROR(Run(conn_, "give", {key_, token_}, &rows, nullptr));
    return rows == 1 ? Status() : Status::Lost("postgres native lock: not held at release");
  }

 private:
  Status WaitForNotify(std::chrono::milliseconds timeout) {
    bool any = false;
    for (PGnotify* n = PQnotifies(conn_); n != nullptr; n = PQnotifies(conn_)) {
      PQfreemem(n);
      any = true;
    }
    if (any) {
      return Status();
    }
    pollfd p{PQsocket(conn_), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) > 0) {
      if (PQconsumeInput(conn_) == 0) {
        return Status::Unavailable("postgres native lock: connection lost while listening");
      }
      for (PGnotify* n = PQnotifies(conn_); n != nullptr; n = PQnotifies(conn_)) {
        PQfreemem(n);
      }
    }
    return Status();
  }

  PGconn* conn_;
  std::string key_;
  std::string token_;
  bool listening_ = false;
};

}  // namespace

Result<std::unique_ptr<NativeLock>> OpenPostgresAdvisoryNative(const std::string& url,
                                                               const std::string& key) {
  LH_ASSIGN_OR_RETURN(PGconn * conn, Connect(url));
  auto lock = std::make_unique<PostgresAdvisoryNative>(
      conn, std::to_string(static_cast<long long>(std::hash<std::string>{}(key) >> 1)));
  LH_RETURN_IF_ERROR(Exec(conn, "SET lock_timeout = '60s'"));
  LH_RETURN_IF_ERROR(Prepare(conn, "try", "SELECT pg_try_advisory_lock($1::bigint)", 1));
  LH_RETURN_IF_ERROR(Prepare(conn, "lock", "SELECT pg_advisory_lock($1::bigint)", 1));
  LH_RETURN_IF_ERROR(Prepare(conn, "unlock", "SELECT pg_advisory_unlock($1::bigint)", 1));
  return std::unique_ptr<NativeLock>(std::move(lock));
}

Result<std::unique_ptr<NativeLock>> OpenPostgresTableNative(const std::string& url,
                                                            const std::string& key) {
  LH_ASSIGN_OR_RETURN(PGconn * conn, Connect(url));
  auto lock = std::make_unique<PostgresTableNative>(conn, key);
  // Concurrent opens (the handoff's processes) may race on CREATE TABLE IF NOT EXISTS (a
  // unique violation in pg_type): one retry after the winner committed.
  const std::string create = fmt::format(
      "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, owner text, expires timestamptz)",
      kTable);
  if (!Exec(conn, create).ok()) {
    LH_RETURN_IF_ERROR(Exec(conn, create));
  }
  LH_RETURN_IF_ERROR(
      Prepare(conn, "row",
              fmt::format("INSERT INTO {} (name) VALUES ($1) ON CONFLICT DO NOTHING", kTable), 1));
  LH_RETURN_IF_ERROR(Run(conn, "row", {key}, nullptr, nullptr));
  LH_RETURN_IF_ERROR(
      Prepare(conn, "take",
              fmt::format("UPDATE {} SET owner = $2, expires = clock_timestamp() + interval '{} "
                          "milliseconds' WHERE name = $1 AND (owner IS NULL OR expires < "
                          "clock_timestamp()) RETURNING name",
                          kTable, kNativeTtl.count()),
              2));
  LH_RETURN_IF_ERROR(Prepare(conn, "give",
                             fmt::format("WITH r AS (UPDATE {} SET owner = NULL WHERE name = $1 "
                                         "AND owner = $2 RETURNING name) SELECT pg_notify('{}', "
                                         "name) FROM r",
                                         kTable, kChannel),
                             2));
  return std::unique_ptr<NativeLock>(std::move(lock));
}

}  // namespace leasehold::bench
