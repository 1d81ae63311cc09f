// File: backends/postgres/postgres_advisory_doctor.cc (internal)
//
// Advisory mode's doctor facet: SELECT 1 on the primary session as the probe, and the findings
// every PostgreSQL mode shares (postgres_diagnose.cc) plus the pooler that breaks session locks.

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

Status PostgresAdvisoryBackend::Ping() {
  return RunOnPrimary("ping", std::string(sql::kPing), {}, /*retry=*/false).status();
}

Result<Diagnosis> PostgresAdvisoryBackend::Diagnose() {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, PrimarySession());
  MutexLock slock(&session->mu);
  Result<Diagnosis> d = PgDiagnose(*session->conn, options_, clock_);
  if (!d.ok() && session->conn->broken()) {
    SessionLost(session, SessionEndReason(d.status(), session->conn->broken_reason()));
  }
  return d;
}

Result<PgResult> PostgresAdvisoryBackend::RunOnPrimary(std::string_view what,
                                                       const std::string& statement,
                                                       const PgParams& params, bool retry) {
  for (int attempt = 0;; ++attempt) {
    LH_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, PrimarySession());
    MutexLock slock(&session->mu);
    Result<PgResult> r = session->conn->Exec(what, statement, params, PgDeadline(options_, clock_));
    if (!r.ok() && session->conn->broken()) {
      SessionLost(session, SessionEndReason(r.status(), session->conn->broken_reason()));
      if (attempt == 0 && retry) {
        continue;  // a fresh session: nothing of a lease depends on this read
      }
    }
    return r;
  }
}

// One grant per key: the lowest slot is the only one.

}  // namespace leasehold::internal
