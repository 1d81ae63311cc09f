// File: backends/postgres/postgres_advisory_wait.cc (internal)
//
// Advisory mode's wait facet: a blocking pg_advisory_lock on a waiter session (the server's
// queue), its turn, and a waiter given up.

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

void PostgresAdvisoryBackend::AbandonWait(std::string_view /*key*/, std::string_view waiter_id) {
  std::shared_ptr<Waiting> wait;
  {
    MutexLock lock(&mu_);
    auto it = waits_.find(waiter_id);
    if (it == waits_.end()) {
      return;
    }
    wait = it->second;
    waits_.erase(it);
  }
  std::shared_ptr<Session> session = wait->session;
  {
    MutexLock slock(&session->mu);
    if (session->conn == nullptr || session->conn->broken()) {
      return;
    }
    if (wait->in_flight) {
      session->conn->Cancel();
      Result<std::optional<PgResult>> done =
          session->conn->Await("abandon wait", clock_.Now() + kAbandonGrace, {});
      if ((done.ok() && !done->has_value()) || session->conn->broken()) {
        session->lost = true;  // no answer: drop the session, which ends the wait for sure
        return;
      }
      wait->in_flight = false;
      wait->got = done.ok();  // granted just before the cancel arrived
    }
    if (wait->got) {
      Result<PgResult> r = session->conn->Exec("unlock", UnlockStatement(wait->lock_id), {},
                                               PgDeadline(options_, clock_));
      if (!r.ok()) {
        session->lost = true;  // closing the session is the unlock of last resort
        return;
      }
    }
  }
  Recycle(session);
}

Status PostgresAdvisoryBackend::WaitForChange(std::string_view key, SteadyTime deadline,
                                              std::stop_token stop) {
  std::string waiter;
  {
    MutexLock lock(&mu_);
    if (held_.find(key) != held_.end()) {
      // The wait below queues a session on the lock: behind this handle's own session it would
      // take the lock the moment that session ends, ahead of every other waiter. The holder's
      // grant ends only with its session, which its renewals watch.
      return Status::Unimplemented(fmt::format(
          "this handle holds {}: its grant ends only with its own session, which its renewals "
          "watch",
          key));
    }
    waiter = fmt::format("change-{}", ++next_private_waiter_);
  }
  Status s = WaitForTurn(key, waiter, deadline, std::move(stop));
  AbandonWait(key, waiter);
  return s;
}

}  // namespace leasehold::internal
