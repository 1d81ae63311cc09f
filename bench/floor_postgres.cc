// File: bench/floor_postgres.cc
//
// PostgreSQL floor: SELECT 1 on a libpq connection of its own, made from the same libpq
// parameters the backend would use.

#include <vector>

#include <libpq-fe.h>

#include "backends/postgres/postgres_options.h"
#include "core/url.h"
#include "floor.h"

namespace leasehold::bench {
namespace {

class PostgresFloor final : public FloorProbe {
 public:
  explicit PostgresFloor(PGconn* conn) : conn_(conn) {}

  ~PostgresFloor() override { PQfinish(conn_); }

  PostgresFloor(const PostgresFloor&) = delete;
  PostgresFloor& operator=(const PostgresFloor&) = delete;

  Status Call() override {
    PGresult* result = PQexec(conn_, "SELECT 1");
    const bool ok = PQresultStatus(result) == PGRES_TUPLES_OK;
    PQclear(result);
    return ok ? Status() : Status::Unavailable("SELECT 1 failed");
  }

 private:
  PGconn* conn_;
};

}  // namespace

Result<std::unique_ptr<FloorProbe>> OpenPostgresFloor(const std::string& url) {
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
    return Status::Unavailable("cannot connect to postgres for the floor probe");
  }
  return std::unique_ptr<FloorProbe>(new PostgresFloor(conn));
}

}  // namespace leasehold::bench
