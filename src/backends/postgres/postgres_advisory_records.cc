// File: backends/postgres/postgres_advisory_records.cc (internal)
//
// Advisory mode's records facet: the records table, as in table mode (a record needs no session),
// read on the primary session; the server's clock_timestamp() as the store's wall clock.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "backends/common/time.h"
#include "backends/postgres/postgres_advisory_backend.h"
#include "backends/postgres/postgres_advisory_parts.h"
#include "backends/postgres/postgres_common.h"
#include "backends/postgres/postgres_sql.h"
#include "core/logging.h"
#include "util/hex.h"

namespace leasehold::internal {

Result<std::optional<std::string>> PostgresAdvisoryBackend::ReadRecord(std::string_view key) {
  Result<PgResult> r =
      RunOnPrimary("read record", PgStatement(sql::kReadRecord, options_), {std::string(key)});
  if (!r.ok()) {
    return PgRecordsStatus(r.status(), options_);
  }
  return PgRecord(key, *r);
}

Result<std::vector<std::pair<std::string, std::string>>> PostgresAdvisoryBackend::ListRecords(
    std::string_view prefix) {
  Result<PgResult> r =
      RunOnPrimary("list records", PgStatement(sql::kListRecords, options_), {std::string(prefix)});
  if (!r.ok()) {
    return PgRecordsStatus(r.status(), options_);  // a missing records table: an old schema
  }
  return PgRecords(*r);
}

Result<StoreTime> PostgresAdvisoryBackend::WallClock() {
  LH_ASSIGN_OR_RETURN(PgResult r, RunOnPrimary("clock", std::string(sql::kWallClock), {}));
  return PgStoreTime(r);
}

}  // namespace leasehold::internal
