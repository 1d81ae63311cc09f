// File: backends/postgres/postgres_advisory_backend.cc (internal)
//
// PostgresAdvisoryBackend's grant core: mode=advisory (see postgres_advisory_backend.h for the
// design). Its facets: postgres_advisory_records.cc, postgres_advisory_doctor.cc,
// postgres_advisory_fenced_write.cc, postgres_advisory_wait.cc; what they share:
// postgres_advisory_parts.h.
//
// Invariants:
// - held_ has at most one grant per key, across all sessions: the guard against advisory locks'
//   per-session re-entrancy. It is checked while holding the primary session's mutex, and every
//   plain try-acquire goes through that session, so two threads of one handle cannot both get
//   the same key.
// - Lock order: a session's mu, then the backend's mu_. mu_ is never held across a round trip.
// - A session whose connection broke is lost for good: its leases move to lost_reasons_ at once
//   (the server frees its locks when it notices, within the limits set on the session).
// - The local expiry of a grant is taken after the reply of its acquire or renew, so it is never
//   earlier than the holder's safe_until (read before the request): unlocking a grant whose
//   holder stopped renewing, at that expiry, can never cut a holder's safe window short.
// - A grant kept after its holder (Finish with keep > 0) is not a lock: a session lock cannot
//   outlive its session, and the holder's process may exit at once. It is the key's row with no
//   session (pid NULL) and an expiry, written by the finish statement just before it unlocks
//   (postgres_sql.h, top). Every grant statement refuses while that row is live; a waiter whose
//   queued lock was granted meanwhile keeps the lock (and its place) and sleeps until the kept
//   grant's end (Waiting::kept_until), then completes its grant. held_ never has kept grants.
// - Records live in the `records` table, as in table mode: they need no session either.
// - Local time (statement deadlines, grants' local expiry, waits) is read only from clock_.

#include "backends/postgres/postgres_advisory_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "backends/common/time.h"
#include "backends/postgres/postgres_advisory_parts.h"
#include "backends/postgres/postgres_common.h"
#include "backends/postgres/postgres_sql.h"
#include "core/logging.h"
#include "util/hex.h"

namespace leasehold::internal {

std::int64_t AdvisoryLockId(std::string_view schema, std::string_view key) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  auto mix = [&hash](unsigned char c) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  };
  for (char c : schema) {
    mix(static_cast<unsigned char>(c));
  }
  mix(0);
  for (char c : key) {
    mix(static_cast<unsigned char>(c));
  }
  return static_cast<std::int64_t>(hash);
}

Result<std::shared_ptr<PostgresAdvisoryBackend>> PostgresAdvisoryBackend::Open(
    PostgresOptions options, Clock& clock) {
  std::shared_ptr<PostgresAdvisoryBackend> backend(
      new PostgresAdvisoryBackend(std::move(options), clock));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, backend->NewSession());
  {
    MutexLock slock(&session->mu);
    LH_RETURN_IF_ERROR(EnsureSchema(*session->conn, backend->options_, backend->clock_));
  }
  MutexLock lock(&backend->mu_);
  backend->primary_ = std::move(session);
  return backend;
}

PostgresAdvisoryBackend::PostgresAdvisoryBackend(PostgresOptions options, Clock& clock)
    : options_(std::move(options)), clock_(clock) {}

PostgresAdvisoryBackend::~PostgresAdvisoryBackend() {
  MutexLock lock(&mu_);
  held_.clear();
  waits_.clear();
  idle_.clear();
  primary_.reset();
}

Capabilities PostgresAdvisoryBackend::capabilities() const {
  return Capabilities{.fencing_survives_restart = true,
                      .fair_queue = true,
                      .no_shared_leases_why = kNoSharedLeases};
}

unsigned PostgresAdvisoryBackend::fenced_ops() const {
  return FencedOpBit(FencedOp::Kind::kSql);
}

Result<std::shared_ptr<PostgresAdvisoryBackend::Session>> PostgresAdvisoryBackend::NewSession() {
  LH_ASSIGN_OR_RETURN(std::unique_ptr<PgConnection> conn, PgConnection::Connect(options_, clock_));
  LH_ASSIGN_OR_RETURN(PgResult r, conn->Exec("server identity", std::string(sql::kServerIdentity),
                                             {}, PgDeadline(options_, clock_)));
  int pid = static_cast<int>(r.GetInt(0, 0));
  // Another cluster, or a primary on an older timeline, is refused; a newer one is a failover.
  bool failover = false;
  LH_RETURN_IF_ERROR(history_.ObserveServer(options_.display, PgIdentityOf(r), &failover));
  if (failover) {
    CountStoreFailover();
  }
  if (pid != conn->startup_pid() && !skip_pooler_check_for_testing) {
    return Status::InvalidArgument(fmt::format(
        "postgres at {} is reached through a connection pooler (the backend pid {} sent at "
        "startup is not the server's pg_backend_pid() {}, as with PgBouncer): mode=advisory "
        "needs a dedicated server session, because advisory locks belong to the session and a "
        "pooler hands it to other clients. Use mode=table through poolers, or connect to "
        "PostgreSQL directly",
        options_.display, conn->startup_pid(), pid));
  }
  if (pid == conn->startup_pid()) {
    // A session of our own (no pooler): skip parsing and planning after each statement's first
    // use (bench: a try-acquire's cost halves).
    conn->PrepareStatements();
  }
  auto session = std::make_shared<Session>();
  MutexLock slock(&session->mu);
  session->conn = std::move(conn);
  session->pid = pid;
  return session;
}

Result<std::shared_ptr<PostgresAdvisoryBackend::Session>>
PostgresAdvisoryBackend::PrimarySession() {
  {
    MutexLock lock(&mu_);
    if (primary_ != nullptr && !primary_->lost) {
      return primary_;
    }
  }
  LH_ASSIGN_OR_RETURN(std::shared_ptr<Session> fresh, NewSession());
  MutexLock lock(&mu_);
  if (primary_ == nullptr || primary_->lost) {
    primary_ = fresh;
  }
  return primary_;
}

void PostgresAdvisoryBackend::SessionLost(const std::shared_ptr<Session>& session,
                                          const std::string& reason) {
  session->lost = true;
  MutexLock lock(&mu_);
  if (lost_reasons_.size() > kMaxLostReasons) {
    lost_reasons_.clear();
  }
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second->session == session) {
      lost_reasons_[it->second->token] = {reason, LostCause::kSessionLost};
      Log(LogLevel::kWarning, fmt::format("postgres advisory lease lost: key={} fencing_token={}: "
                                          "{}",
                                          it->first, it->second->fence, reason));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = waits_.begin(); it != waits_.end();) {
    it = it->second->session == session ? waits_.erase(it) : std::next(it);
  }
  idle_.erase(std::remove(idle_.begin(), idle_.end(), session), idle_.end());
  if (primary_ == session) {
    primary_.reset();
  }
}

void PostgresAdvisoryBackend::Recycle(std::shared_ptr<Session> session) {
  if (session == nullptr || session->lost) {
    return;
  }
  MutexLock lock(&mu_);
  if (session == primary_) {
    return;
  }
  for (const auto& [key, held] : held_) {
    if (held->session == session) {
      return;
    }
  }
  if (idle_.size() < kMaxIdleSessions &&
      std::find(idle_.begin(), idle_.end(), session) == idle_.end()) {
    idle_.push_back(std::move(session));
  }
}

Status PostgresAdvisoryBackend::LostStatus(std::string_view key, std::string_view owner_token) {
  MutexLock lock(&mu_);
  if (auto it = lost_reasons_.find(owner_token); it != lost_reasons_.end()) {
    return Status::Lost(fmt::format("{} was lost: {}", key, it->second.first), it->second.second);
  }
  return Status::Lost(fmt::format(
      "{} is not held by this owner (released, expired, force-released or never granted)", key));
}

Result<Grant> PostgresAdvisoryBackend::TryAcquire(const GrantRequest& request) {
  bool failover = false;
  Result<Grant> granted = PgCheckGrant(
      history_, options_.display, request, AcquireOnce(request),
      [this](std::string_view key, std::string_view token) { return Release(key, token); },
      &failover);
  if (failover) {
    CountStoreFailover();
  }
  return granted;
}

Result<Grant> PostgresAdvisoryBackend::AcquireOnce(const GrantRequest& request) {
  if (request.mode != LeaseMode::kExclusive || request.limit != 1) {
    return Status::Unimplemented(fmt::format("{} {} lease: {}", request.key,
                                             LeaseKindName(request.mode, request.limit),
                                             kNoSharedLeases));
  }
  if (!request.waiter_id.empty()) {
    std::shared_ptr<Waiting> wait;
    {
      MutexLock lock(&mu_);
      if (auto it = waits_.find(request.waiter_id); it != waits_.end()) {
        wait = it->second;
      }
    }
    if (wait != nullptr && wait->key == request.key) {
      return CompleteWaitedGrant(request, std::move(wait));
    }
  }
  const std::int64_t lock_id = AdvisoryLockId(options_.schema, request.key);
  const std::string statement = PgStatement(sql::kAdvisoryAcquire, options_);
  for (int attempt = 0;; ++attempt) {
    LH_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, PrimarySession());
    MutexLock slock(&session->mu);
    Duration largest = request.ttl;
    std::shared_ptr<Held> local;
    {
      MutexLock lock(&mu_);
      if (auto it = held_.find(request.key); it != held_.end()) {
        local = it->second;
      }
      for (const auto& [key, held] : held_) {
        if (held->session == session) {
          largest = std::max(largest, held->ttl);
        }
      }
    }
    if (local != nullptr) {
      // One of our sessions holds the key, and would get it again (advisory locks are
      // re-entrant): refuse, unless that session has died unnoticed since (an operator's
      // pg_terminate_backend, say), which one round trip on it tells.
      if (!SessionAlive(local->session, session)) {
        continue;
      }
      LeaseInfo info;
      info.key = local->key;
      info.holder = local->holder;
      info.token_prefix = local->token.substr(0, 8);
      info.fencing_token = local->fence;
      info.ttl = std::chrono::duration_cast<milliseconds>(local->ttl);
      info.remaining = std::max(
          milliseconds(0), std::chrono::duration_cast<milliseconds>(local->expires - clock_.Now()));
      return PgHeld(request.key, std::move(info));
    }
    if (session->lost || session->conn->broken()) {
      continue;
    }
    Limits limits = LimitsFor(largest);
    Result<PgResult> r = session->conn->Exec(
        "acquire", statement,
        {request.key, request.owner_token, request.holder, std::to_string(CeilMillis(request.ttl)),
         std::to_string(lock_id), limits.idle_ms, limits.keepalive_idle_s, limits.user_timeout_ms},
        PgDeadline(options_, clock_));
    if (!r.ok()) {
      if (session->conn->broken()) {
        // The session is gone, and with it any lock this statement may have taken. Its leases
        // are lost; this new acquire is independent of them and may try once more.
        SessionLost(session, SessionEndReason(r.status(), session->conn->broken_reason()));
        if (attempt == 0) {
          continue;
        }
        return r.status();
      }
      // The lock may have been taken before the statement failed, and it outlives the error.
      (void)session->conn->Exec("unlock", UnlockStatement(lock_id), {},
                                PgDeadline(options_, clock_));
      return r.status();
    }
    if (r->rows() >= 1 && r->GetBool(0, 0)) {
      auto held = std::make_shared<Held>();
      held->key = request.key;
      held->token = request.owner_token;
      held->holder = request.holder;
      held->session = session;
      held->lock_id = lock_id;
      held->fence = static_cast<FencingToken>(r->GetInt(0, 1));
      held->ttl = request.ttl;
      held->expires = clock_.Now() + request.ttl;
      MutexLock lock(&mu_);
      held_[request.key] = held;
      return Grant{.fencing_token = held->fence, .ttl = request.ttl};
    }
    if (r->rows() == 0 || r->IsNull(0, 1)) {
      return PgHeld(request.key, std::nullopt);
    }
    return PgHeld(request.key, PgRefusedBy(request.key, *r));
  }
}

bool PostgresAdvisoryBackend::SessionAlive(const std::shared_ptr<Session>& session,
                                           const std::shared_ptr<Session>& locked) {
  auto ping = [&]() LH_NO_THREAD_SAFETY_ANALYSIS {
    if (session->lost || session->conn == nullptr || session->conn->broken()) {
      return false;
    }
    Result<PgResult> r =
        session->conn->Exec("ping", std::string(sql::kPing), {}, PgDeadline(options_, clock_));
    if (!r.ok() && session->conn->broken()) {
      SessionLost(session, SessionEndReason(r.status(), session->conn->broken_reason()));
      return false;
    }
    return true;
  };
  if (session == locked) {
    return ping();  // the caller holds its mutex already
  }
  MutexLock slock(&session->mu);
  return ping();
}

Result<Grant> PostgresAdvisoryBackend::CompleteWaitedGrant(const GrantRequest& request,
                                                           std::shared_ptr<Waiting> wait) {
  std::shared_ptr<Session> session = wait->session;
  MutexLock slock(&session->mu);
  if (session->lost || session->conn == nullptr || session->conn->broken()) {
    return Status::Unavailable("the waiting session was lost");
  }
  if (!wait->got && wait->in_flight) {
    // The server may have granted the lock since the last look: check without blocking.
    Result<std::optional<PgResult>> done =
        session->conn->Await("wait", clock_.Now(), std::stop_token());
    if (done.ok() && done->has_value()) {
      wait->in_flight = false;
      wait->got = true;
    } else if (!done.ok()) {
      wait->in_flight = session->conn->busy();
    }
  }
  if (!wait->got) {
    return Status::HeldByAnother(fmt::format(
        "{} is held by another session; this waiter is queued in the server's lock queue",
        request.key));
  }
  Duration largest = request.ttl;
  {
    MutexLock lock(&mu_);
    for (const auto& [key, held] : held_) {
      if (held->session == session) {
        largest = std::max(largest, held->ttl);
      }
    }
  }
  Limits limits = LimitsFor(largest);
  Result<PgResult> r =
      session->conn->Exec("acquire", PgStatement(sql::kAdvisoryGrantHeld, options_),
                          {request.key, request.owner_token, request.holder,
                           std::to_string(CeilMillis(request.ttl)), std::to_string(wait->lock_id),
                           limits.idle_ms, limits.keepalive_idle_s, limits.user_timeout_ms},
                          PgDeadline(options_, clock_));
  if (!r.ok()) {
    if (session->conn->broken()) {
      SessionLost(session, SessionEndReason(r.status(), session->conn->broken_reason()));
    }
    return r.status();  // still queued-and-granted: AbandonWait unlocks if the caller gives up
  }
  if (r->rows() == 0 || !r->GetBool(0, 0)) {
    // A kept grant refuses: keep the lock, and with it this waiter's place, and sleep until
    // the kept grant ends (WaitForTurn). Its row may not be visible to the statement's
    // snapshot yet (a finish that committed while we waited for its row): re-check soon then.
    const bool known = r->rows() > 0;
    wait->kept_until = clock_.Now() + (known ? milliseconds(r->GetInt(0, 5)) : kKeptRecheck);
    return known ? PgHeld(request.key, PgRefusedBy(request.key, *r))
                 : PgHeld(request.key, std::nullopt);
  }
  auto held = std::make_shared<Held>();
  held->key = request.key;
  held->token = request.owner_token;
  held->holder = request.holder;
  held->session = session;
  held->lock_id = wait->lock_id;
  held->fence = static_cast<FencingToken>(r->GetInt(0, 1));
  held->ttl = request.ttl;
  held->expires = clock_.Now() + request.ttl;
  MutexLock lock(&mu_);
  waits_.erase(request.waiter_id);
  held_[request.key] = held;
  return Grant{.fencing_token = held->fence, .ttl = request.ttl};
}

std::vector<Status> PostgresAdvisoryBackend::RenewMany(std::span<const RenewRequest> requests) {
  std::vector<Status> results(requests.size());
  std::map<std::shared_ptr<Session>, std::vector<std::size_t>> by_session;
  std::vector<std::pair<std::string, std::string>> expired;
  const SteadyTime now = clock_.Now();
  {
    MutexLock lock(&mu_);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      auto it = held_.find(requests[i].key);
      if (it == held_.end() || it->second->token != requests[i].owner_token) {
        results[i] = Status::Lost("");  // filled in below, outside mu_
        continue;
      }
      if (now >= it->second->expires) {
        expired.emplace_back(it->first, it->second->token);
        continue;
      }
      by_session[it->second->session].push_back(i);
    }
  }
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (results[i].code() == StatusCode::kLost && results[i].message().empty()) {
      results[i] = LostStatus(requests[i].key, requests[i].owner_token);
    }
  }
  for (const auto& [key, token] : expired) {
    // Its holder stopped renewing for a whole ttl: free the lock for others.
    (void)Release(key, token);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].key == key && requests[i].owner_token == token) {
        results[i] = Status::Lost(fmt::format("{} expired: not renewed within its ttl", key),
                                  LostCause::kExpired);
      }
    }
  }
  const std::string statement = PgStatement(sql::kAdvisoryRenewMany, options_);
  for (auto& [session, indexes] : by_session) {
    std::vector<std::string> keys;
    std::vector<std::string> tokens;
    std::vector<std::string> ttls;
    for (std::size_t i : indexes) {
      keys.push_back(requests[i].key);
      tokens.push_back(requests[i].owner_token);
      ttls.push_back(std::to_string(CeilMillis(requests[i].ttl)));
    }
    Result<PgResult> r = Status::Unavailable("session already lost");
    {
      MutexLock slock(&session->mu);
      if (!session->lost && !session->conn->broken()) {
        r = session->conn->Exec(
            "renew", statement,
            {PgArrayLiteral(keys), PgArrayLiteral(tokens), PgArrayLiteral(ttls)},
            PgDeadline(options_, clock_));
      }
      if (!r.ok() && (session->lost || session->conn->broken())) {
        SessionLost(session, SessionEndReason(r.status(), session->conn->broken_reason()));
      }
    }
    if (!r.ok()) {
      for (std::size_t i : indexes) {
        results[i] =
            session->lost ? LostStatus(requests[i].key, requests[i].owner_token) : r.status();
      }
      continue;
    }
    int pid = 0;
    std::set<std::int64_t> locks;
    std::set<std::string, std::less<>> renewed;
    for (int row = 0; row < r->rows(); ++row) {
      std::string_view tag = r->Get(row, 0);
      if (tag == "pid") {
        pid = static_cast<int>(r->GetInt(row, 1));
      } else if (tag == "lock") {
        locks.insert(r->GetInt(row, 1));
      } else {
        renewed.emplace(r->Get(row, 1));
      }
    }
    if (pid != session->pid) {
      std::string reason = fmt::format(
          "the server session changed under this lease (pg_backend_pid {} became {}): a "
          "connection pooler (PgBouncer in transaction or statement pooling) sits between "
          "leasehold and PostgreSQL, and advisory locks need one dedicated session; use "
          "mode=table through poolers",
          session->pid, pid);
      SessionLost(session, reason);
      MutexLock slock(&session->mu);
      session->conn.reset();  // never use it again; closing it frees whatever it holds
      session->conn = nullptr;
      for (std::size_t i : indexes) {
        results[i] = LostStatus(requests[i].key, requests[i].owner_token);
      }
      continue;
    }
    const SteadyTime replied = clock_.Now();
    MutexLock lock(&mu_);
    for (std::size_t i : indexes) {
      auto it = held_.find(requests[i].key);
      if (it == held_.end() || it->second->token != requests[i].owner_token) {
        results[i] = Status::Lost(fmt::format("{} was released meanwhile", requests[i].key));
        continue;
      }
      Held& h = *it->second;
      if (locks.count(h.lock_id) == 0) {
        std::string reason = fmt::format(
            "session pid {} no longer holds the advisory lock (pg_advisory_unlock_all, DISCARD "
            "ALL or a pooler reset ran on it)",
            session->pid);
        lost_reasons_[h.token] = {reason, LostCause::kSessionLost};
        held_.erase(it);
        results[i] = Status::Lost(fmt::format("{} was lost: {}", requests[i].key, reason),
                                  LostCause::kSessionLost);
        continue;
      }
      if (renewed.count(requests[i].key) == 0) {
        std::string reason = "its row no longer records this grant (changed by someone else)";
        lost_reasons_[h.token] = {reason, LostCause::kStolen};
        results[i] = Status::Lost(fmt::format("{} was lost: {}", requests[i].key, reason),
                                  LostCause::kStolen);
        continue;  // keeps held_ so that Release still unlocks it
      }
      h.ttl = requests[i].ttl;
      h.expires = replied + requests[i].ttl;
      results[i] = Status();
    }
  }
  return results;
}

std::shared_ptr<PostgresAdvisoryBackend::Held> PostgresAdvisoryBackend::FindHeld(
    std::string_view key, std::string_view owner_token) {
  MutexLock lock(&mu_);
  if (auto it = held_.find(key); it != held_.end() && it->second->token == owner_token) {
    return it->second;
  }
  return nullptr;
}

std::string PostgresAdvisoryBackend::IdleMsAfter(const Held& ending) {
  Duration largest{};
  bool others = false;
  MutexLock lock(&mu_);
  for (const auto& [k, h] : held_) {
    if (h->session == ending.session && h.get() != &ending) {
      largest = std::max(largest, h->ttl);
      others = true;
    }
  }
  return others ? LimitsFor(largest).idle_ms : std::string("0");
}

Status PostgresAdvisoryBackend::Delete(std::string_view key, std::string_view owner_token) {
  std::shared_ptr<Held> held = FindHeld(key, owner_token);
  if (held == nullptr) {
    return LostStatus(key, owner_token);
  }
  std::shared_ptr<Session> session = held->session;
  Result<PgResult> r = Status::Unavailable("session lost");
  {
    MutexLock slock(&session->mu);
    const std::string idle_ms = IdleMsAfter(*held);
    if (!session->lost && session->conn != nullptr && !session->conn->broken()) {
      r = session->conn->Exec("release", PgStatement(sql::kAdvisoryRelease, options_),
                              {std::to_string(held->lock_id), idle_ms},
                              PgDeadline(options_, clock_));
      if (!r.ok() && session->conn->broken()) {
        SessionLost(session, SessionEndReason(r.status(), session->conn->broken_reason()));
      }
    }
    MutexLock lock(&mu_);
    if (auto it = held_.find(key); it != held_.end() && it->second == held) {
      held_.erase(it);
    }
  }
  if (!r.ok()) {
    return session->lost ? LostStatus(key, owner_token) : r.status();
  }
  Recycle(session);
  if (!r->GetBool(0, 0)) {
    return Status::Lost(fmt::format(
        "{}: this session no longer held the advisory lock (lost); nothing released", key));
  }
  return Status();
}

Status PostgresAdvisoryBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  if (request.keep == Duration::zero() && !request.record.has_value()) {
    return Delete(request.key, request.owner_token);  // the cheaper statement
  }
  std::shared_ptr<Held> held = FindHeld(request.key, request.owner_token);
  if (held == nullptr) {
    return LostStatus(request.key, request.owner_token);
  }
  const bool write_record = request.record.has_value();
  std::shared_ptr<Session> session = held->session;
  Result<PgResult> r = Status::Unavailable("session lost");
  {
    MutexLock slock(&session->mu);
    const std::string idle_ms = IdleMsAfter(*held);
    if (!session->lost && session->conn != nullptr && !session->conn->broken()) {
      r = session->conn->Exec(
          "finish", PgFinishStatement(sql::kAdvisoryFinish, write_record, options_),
          {request.key, request.owner_token,
           request.keep > Duration::zero() ? std::to_string(CeilMillis(request.keep))
                                           : std::string("0"),
           write_record ? std::optional<std::string>(HexEncode(*request.record)) : std::nullopt,
           std::to_string(write_record ? CeilMillis(request.record_ttl) : 0),
           std::to_string(held->lock_id), idle_ms},
          PgDeadline(options_, clock_));
      if (!r.ok() && session->conn->broken()) {
        SessionLost(session, SessionEndReason(r.status(), session->conn->broken_reason()));
      }
    }
    if (r.ok() && r->rows() > 0) {
      MutexLock lock(&mu_);
      if (auto it = held_.find(request.key); it != held_.end() && it->second == held) {
        held_.erase(it);
      }
    }
  }
  if (session->lost) {
    return LostStatus(request.key, request.owner_token);
  }
  if (!r.ok() || r->rows() == 0) {
    // Failed, or the row or the lock is not this grant's any more: nothing was written. End
    // what is left of the grant as Release does (a lock nobody renews must not stay on a live
    // session), and report the failure.
    (void)Release(request.key, request.owner_token);
    if (!r.ok()) {
      return PgRecordsStatus(r.status(), options_);
    }
    return Status::Lost(fmt::format(
        "{}: this session no longer held the grant (lost); nothing kept or written", request.key));
  }
  Recycle(session);
  return Status();
}

Result<std::vector<LeaseInfo>> PostgresAdvisoryBackend::Holders(std::string_view key) {
  LH_ASSIGN_OR_RETURN(
      PgResult r,
      RunOnPrimary("inspect", PgStatement(sql::kAdvisoryInspect, options_), {std::string(key)}));
  std::vector<LeaseInfo> out;
  if (r.rows() > 0) {
    out.push_back(PgLeaseInfo(r, 0));
  }
  return out;
}

Result<std::vector<LeaseInfo>> PostgresAdvisoryBackend::List(std::string_view prefix) {
  LH_ASSIGN_OR_RETURN(PgResult r, RunOnPrimary("list", PgStatement(sql::kAdvisoryList, options_),
                                               {std::string(prefix)}));
  std::vector<LeaseInfo> out;
  for (int i = 0; i < r.rows(); ++i) {
    out.push_back(PgLeaseInfo(r, i));
  }
  return out;
}

Result<bool> PostgresAdvisoryBackend::ForceEnd(std::string_view key,
                                               std::string_view token_prefix) {
  if (!token_prefix.empty()) {
    return Status::Unimplemented(
        "the postgres store in advisory mode has one grant per key: force-release the key");
  }
  return ForceReleaseAll(key);
}

Result<bool> PostgresAdvisoryBackend::ForceReleaseAll(std::string_view key) {
  std::string own_token;
  {
    MutexLock lock(&mu_);
    if (auto it = held_.find(key); it != held_.end()) {
      own_token = it->second->token;
    }
  }
  if (!own_token.empty()) {
    // Held by this very handle: its own session can unlock it; its lease learns at renewal.
    Status s = Release(key, own_token);
    MutexLock lock(&mu_);
    lost_reasons_[own_token] = {"force-released (release --force)", LostCause::kStoreSaidNo};
    if (s.ok() || s.code() == StatusCode::kLost) {
      return true;
    }
    return s;
  }
  const std::int64_t lock_id = AdvisoryLockId(options_.schema, key);
  for (int attempt = 0;; ++attempt) {
    LH_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, PrimarySession());
    MutexLock slock(&session->mu);
    Result<PgResult> r = session->conn->Exec(
        "force-release", PgStatement(sql::kAdvisoryForceRelease, options_),
        {std::string(key), std::to_string(lock_id)},
        clock_.Now() + std::max<Duration>(options_.command_timeout, std::chrono::seconds(4)));
    if (!r.ok()) {
      if (session->conn->broken()) {
        SessionLost(session, SessionEndReason(r.status(), session->conn->broken_reason()));
        if (attempt == 0) {
          continue;
        }
      }
      if (r.status().code() == StatusCode::kPermissionDenied) {
        return Status::PermissionDenied(
            fmt::format("{}: in mode=advisory, force-release ends the holder's session "
                        "(pg_terminate_backend), which needs the holder's role or membership in "
                        "pg_signal_backend",
                        r.status().message()));
      }
      return r.status();
    }
    return r->rows() > 0;
  }
}

Status PostgresAdvisoryBackend::FencedRefusal(const FencedWriteRequest& request,
                                              PgConnection* conn) {
  const std::string inspect = PgStatement(sql::kAdvisoryInspect, options_);
  Result<PgResult> r =
      conn != nullptr
          ? conn->Exec("fenced write holder", inspect, {request.key}, PgDeadline(options_, clock_))
          : RunOnPrimary("fenced write holder", inspect, {request.key});
  if (r.ok() && r->rows() > 0 &&
      static_cast<FencingToken>(r->GetInt(0, 3)) != request.fencing_token) {
    return FencedOut(
        request.key, request.fencing_token,
        fmt::format("is now held by {} under fencing token {}", r->Get(0, 1), r->GetInt(0, 3)));
  }
  MutexLock lock(&mu_);
  if (auto it = lost_reasons_.find(request.owner_token); it != lost_reasons_.end()) {
    return FencedOut(request.key, request.fencing_token,
                     fmt::format("is no longer held: {}", it->second.first));
  }
  return FencedOut(request.key, request.fencing_token, "is no longer held: expired or released");
}

void PostgresAdvisoryBackend::SkipPoolerCheckForTesting(bool skip) {
  skip_pooler_check_for_testing = skip;
}

std::vector<int> PostgresAdvisoryBackend::SessionPidsForTesting() const {
  MutexLock lock(&mu_);
  std::set<int> pids;
  for (const auto& [key, held] : held_) {
    pids.insert(held->session->pid);
  }
  return {pids.begin(), pids.end()};
}

}  // namespace leasehold::internal
