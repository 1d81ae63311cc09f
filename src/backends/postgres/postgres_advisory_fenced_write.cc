// File: backends/postgres/postgres_advisory_fenced_write.cc (internal)
//
// Advisory mode's fenced-write facet: the SQL runs on the holder's own session, in one
// transaction that first checks the session still holds the key's lock.

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

Result<std::vector<std::int64_t>> PostgresAdvisoryBackend::FencedWrite(
    const FencedWriteRequest& request) {
  LH_RETURN_IF_ERROR(PgCheckFencedOps(request.ops));
  std::shared_ptr<Held> held = FindHeld(request.key, request.owner_token);
  // The heartbeat (RenewMany) writes expires under mu_: read the grant's fields under it too.
  FencingToken held_fence = 0;
  SteadyTime held_expires{};
  if (held != nullptr) {
    MutexLock lock(&mu_);
    held_fence = held->fence;
    held_expires = held->expires;
  }
  std::shared_ptr<Session> session;
  if (!request.skip_guard_for_testing) {
    if (held == nullptr || held_fence != request.fencing_token) {
      return FencedRefusal(request, nullptr);
    }
    if (clock_.Now() >= held_expires) {
      // Not renewed within its ttl: its holder's safe_until has passed, and the next heartbeat
      // unlocks it (RenewMany). The lock may still be on the session; the grant is over.
      return FencedOut(request.key, request.fencing_token,
                       "is no longer held: expired (not renewed within its ttl)");
    }
    session = held->session;
  } else if (held != nullptr) {
    session = held->session;
  } else {
    LH_ASSIGN_OR_RETURN(session, PrimarySession());
  }
  MutexLock slock(&session->mu);
  if (session->lost || session->conn == nullptr || session->conn->broken()) {
    return FencedOut(request.key, request.fencing_token,
                     "is no longer held: its server session ended");
  }
  PgConnection& conn = *session->conn;
  const std::int64_t lock_id = AdvisoryLockId(options_.schema, request.key);
  PgFencedOutcome outcome =
      PgFencedWrite(conn, request, PgStatement(sql::kAdvisoryFencedCheck, options_),
                    {request.key, request.owner_token, std::to_string(request.fencing_token),
                     std::to_string(lock_id)},
                    PgDeadline(options_, clock_), clock_, options_,
                    [&] { return FencedRefusal(request, &conn); });
  if (conn.broken()) {
    // The session is gone (or discarded), and with it the lock: every lease on it is lost.
    const std::string reason = SessionEndReason(outcome.result.status(), conn.broken_reason());
    SessionLost(session, reason);
    if (!outcome.commit_sent) {
      // The write's transaction died with the session: nothing was written.
      return FencedOut(request.key, request.fencing_token,
                       fmt::format("is no longer held: {}; nothing was written", reason));
    }
  }
  return std::move(outcome.result);
}

Status PostgresAdvisoryBackend::WaitForTurn(std::string_view key, std::string_view waiter_id,
                                            SteadyTime deadline, std::stop_token stop) {
  std::shared_ptr<Waiting> wait;
  {
    MutexLock lock(&mu_);
    if (auto it = waits_.find(waiter_id); it != waits_.end()) {
      wait = it->second;
    } else if (!idle_.empty()) {
      wait = std::make_shared<Waiting>();
      wait->session = idle_.back();
      idle_.pop_back();
    }
  }
  if (wait == nullptr) {
    LH_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, NewSession());
    wait = std::make_shared<Waiting>();
    wait->session = std::move(session);
  }
  if (wait->key.empty()) {
    wait->key = std::string(key);
    wait->lock_id = AdvisoryLockId(options_.schema, key);
    MutexLock lock(&mu_);
    waits_[std::string(waiter_id)] = wait;
  }
  std::shared_ptr<Session> session = wait->session;
  SteadyTime kept_until{};
  {
    MutexLock slock(&session->mu);
    kept_until = wait->got ? wait->kept_until : SteadyTime{};
  }
  if (kept_until > clock_.Now()) {
    // Ours is the lock, but a kept grant refused us: nothing will notify its end. Sleep until
    // then, without the session's mutex (AbandonWait may need it meanwhile).
    const SteadyTime until = std::min(deadline, kept_until);
    (void)clock_.SleepUntil(until, stop);
    if (stop.stop_requested()) {
      return Status::Cancelled(fmt::format("cancelled while waiting for {}", key));
    }
    if (clock_.Now() < kept_until) {
      return Status::DeadlineExceeded(fmt::format("{} is kept by its last holder", key));
    }
    return Status();
  }
  MutexLock slock(&session->mu);
  if (wait->got) {
    return Status();
  }
  if (session->lost || session->conn->broken()) {
    MutexLock lock(&mu_);
    waits_.erase(std::string(waiter_id));
    return Status::Unavailable("the waiting session was lost; waiting again");
  }
  if (!wait->in_flight) {
    LH_RETURN_IF_ERROR(session->conn->Send("wait", WaitStatement(wait->lock_id), {}));
    wait->in_flight = true;
  }
  Result<std::optional<PgResult>> done = session->conn->Await("wait", deadline, stop);
  if (!done.ok()) {
    wait->in_flight = session->conn->busy();
    if (session->conn->broken()) {
      MutexLock lock(&mu_);
      waits_.erase(std::string(waiter_id));
      return done.status();
    }
    if (done.status().detail() == kSqlStateLockNotAvailable) {
      return Status();  // the backstop lock_timeout: re-check, and queue again
    }
    return done.status();
  }
  if (!done->has_value()) {
    if (stop.stop_requested()) {
      return Status::Cancelled(fmt::format("cancelled while waiting for {}", key));
    }
    return Status::DeadlineExceeded(fmt::format("still queued for {}", key));
  }
  wait->in_flight = false;
  wait->got = true;
  return Status();
}

}  // namespace leasehold::internal
