// File: backends/postgres/postgres_backend.cc (internal)
//
// OpenPostgresBackend picks the mode's backend; PostgresSchemaSql prints the DDL.

#include "backends/postgres/postgres_backend.h"

#include <utility>

#include "backends/postgres/postgres_advisory_backend.h"
#include "backends/postgres/postgres_common.h"
#include "backends/postgres/postgres_options.h"
#include "backends/postgres/postgres_table_backend.h"

namespace leasehold::internal {

Result<std::shared_ptr<Backend>> OpenPostgresBackend(const Url& url, Clock& clock) {
  LH_ASSIGN_OR_RETURN(PostgresOptions options, PostgresOptions::FromUrl(url));
  if (options.mode == PostgresMode::kTable) {
    LH_ASSIGN_OR_RETURN(auto backend, PostgresTableBackend::Open(std::move(options), clock));
    return std::shared_ptr<Backend>(std::move(backend));
  }
  LH_ASSIGN_OR_RETURN(auto backend, PostgresAdvisoryBackend::Open(std::move(options), clock));
  return std::shared_ptr<Backend>(std::move(backend));
}

Result<std::string> PostgresSchemaSql(const Url& url) {
  LH_ASSIGN_OR_RETURN(PostgresOptions options, PostgresOptions::FromUrl(url));
  return SchemaSql(options);
}

}  // namespace leasehold::internal
