// File: backends/postgres/postgres_backend.h (internal)
//
// The postgres:// store (DESIGN.md section 4) on libpq, in two modes that share one table,
// "<schema>.leases" (postgres_sql.h), whose per-key `fence` column only ever grows.
//
// mode=table (PostgresTableBackend): a grant is the key's row with an owner token and an
// expiry computed by the server's clock, so client clocks never matter. Acquire, renew (all of a
// handle's leases at once) and release are one statement each, sent without prepared statements,
// so PgBouncer in transaction pooling carries them. Release NOTIFYs the key on the schema's
// channel; waiters share one LISTEN connection (a std::jthread owned by the backend, started by
// the first wait) and also wake at the holder's expiry. Through a pooler, which cannot carry
// LISTEN, waiters poll with backoff instead (native_wait is false).
//
// mode=advisory (PostgresAdvisoryBackend, the default): a grant is pg_try_advisory_lock(id) on
// a server session the handle keeps, with id = FNV-1a 64 of "<schema>\0<key>" (AdvisoryLockId),
// and the key's row records holder, token and fence, bumped in the same statement. Facts it
// relies on, and what it does about them:
// - Advisory locks are re-entrant per session, so the backend refuses a second grant of a key
//   that any of its sessions holds (kHeldByAnother) before asking the server.
// - The grant lives as long as the session: kill -9 of the holder ends the session and frees
//   the lock at once, with no TTL to wait out. A lost session makes every lease on it lost.
// - DESIGN.md section 3's bound is the server's own limit for dropping a silent session. Before
//   a session's first grant with a given TTL T (the largest among its leases), the backend sets
//     idle_session_timeout   = T            (ms; kills a session that sends nothing for T)
//     tcp_keepalives_idle    = ceil(T) s, tcp_keepalives_interval = 1 s, count = 1
//     tcp_user_timeout       = T + 1000 ms
//   The server hears from the holder at or after each renewal's t_send, so none of these can
//   end the session (and free the lock) before t_send + T > safe_until = t_send + T - drift. The
//   first makes a grant whose holder stops renewing (a stopped process, whose kernel still
//   answers keepalives) end after T, like a TTL; a session with no leases goes back to no idle
//   limit. Operator actions (pg_terminate_backend, a restart) can end a session at any moment:
//   the holder learns at its next heartbeat, within one renew interval, and fencing covers
//   that window.
// - Each heartbeat is one statement per session (RenewMany) that also reads pg_backend_pid()
//   and the session's advisory locks from pg_locks: a different pid (a pooler swapped the
//   session) or a lock no longer held makes the lease lost at once, with a message naming the
//   cause. A pooler is refused at open already when it shows: PgBouncer hands the client a
//   made-up backend pid at startup (PQbackendPID), which differs from pg_backend_pid().
// - Blocking acquire waits in the server's lock queue, FIFO, so a release hands the lock to the
//   next waiter at once and in order (fair_queue). WaitForTurn(key, waiter_id) sends
//   pg_advisory_lock(id) under lock_timeout on a session of its own and leaves it in the queue
//   across calls (Store::Acquire re-calls it every few seconds; the place is kept). When the
//   server grants the lock, the waiter's next TryAcquire with the same waiter_id completes the
//   grant on that session (fence bump and row, one statement). AbandonWait cancels a queued wait
//   (PQcancel) or unlocks a lock that was granted but never completed. A stop request wakes the
//   waiter at once. A waiting session that becomes a holder stays one until its leases end.
// - Force-release can only end the holder's session (pg_terminate_backend): all leases on it
//   are lost. It needs the holder's role or pg_signal_backend.
// - A session lock cannot outlive its session, so what must (Backend::Finish) uses the table
//   instead: a grant kept after its holder (keep > 0) becomes the key's row with no session and
//   an expiry on the server's clock, written just before the unlock; every grant statement
//   refuses while it is live (kHeldByAnother, with its holder and remaining time), status and
//   list show it, force-release clears it. Records go into the `records` table, as in table
//   mode.
// Advisory mode needs a direct session; use mode=table through transaction poolers.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("postgres://app@db1/app?mode=table"));
//   LH_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenPostgresBackend(url));
//   Result<Grant> grant = backend->TryAcquire(
//       {.key = "job:x", .owner_token = token, .holder = "web-3:42", .ttl = 10s});
//
// Thread safety: thread-safe. Each connection is used by one thread at a time (a mutex per
// session or pooled connection); the backend's maps are guarded by its own mutex, never held
// across a round trip.

#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease_info.h"
#include "leasehold/status.h"

#include "backends/backend.h"
#include "backends/postgres/postgres_connection.h"
#include "backends/postgres/postgres_options.h"
#include "core/url.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// Opens the store named by `url` (scheme "postgres" or "postgresql", or a key=value conninfo),
// connects, and creates the schema and table if missing and allowed. Returns kInvalidArgument
// for a bad URL, or advisory mode through a detected pooler (the message names pooling);
// kUnavailable if the server cannot be reached; kPermissionDenied for rejected credentials, or
// a missing table the role may not create (the message names `leasehold schema`).
Result<std::shared_ptr<Backend>> OpenPostgresBackend(const Url& url,
                                                 Clock& clock = Clock::Real());

// Returns the SQL that creates the store's schema and table for `url`, for `leasehold schema`.
Result<std::string> PostgresSchemaSql(const Url& url);

// The advisory lock id of `key` under `schema`: FNV-1a 64 (offset basis 0xcbf29ce484222325,
// prime 0x100000001b3) over the bytes of schema, one NUL byte, then key, as a signed bigint.
std::int64_t AdvisoryLockId(std::string_view schema, std::string_view key);

class PostgresTableBackend final : public Backend {
 public:
  static Result<std::shared_ptr<PostgresTableBackend>> Open(PostgresOptions options);
  ~PostgresTableBackend() override;

  [[nodiscard]] std::string_view scheme() const override { return "postgres"; }

  // native_wait: LISTEN/NOTIFY, unless a pooler is in between.
  [[nodiscard]] Capabilities capabilities() const override;

  Result<Grant> TryAcquire(const GrantRequest& request) override;
  Status Renew(const RenewRequest& request) override;
  // One UPDATE for all requests. If it fails, every request gets that error.
  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override;
  Status Release(std::string_view key, std::string_view owner_token) override;
  // One statement (kTableFinish): the grant's row and the key's row in `records` change together
  // or not at all. keep and record_ttl are rounded up to whole milliseconds.
  Status Finish(const FinishRequest& request) override;
  Result<std::optional<std::string>> ReadRecord(std::string_view key) override;
  // One SELECT (kListRecords); expiry on the server's clock.
  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override;
  // clock_timestamp(), one round trip.
  Result<StoreTime> WallClock() override;
  Result<std::optional<LeaseInfo>> Inspect(std::string_view key) override;
  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override;
  Result<bool> ForceRelease(std::string_view key) override;
  // Blocks until a NOTIFY for `key`, the holder's expiry (plus jitter), `deadline` or `stop`;
  // polls every 100 ms while the LISTEN connection is down. kUnimplemented through a pooler.
  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) override;

  // True if a pooler was detected at open.
  [[nodiscard]] bool pooled() const { return pooled_; }

 private:
  class Listener;
  struct Pool;

  PostgresTableBackend(PostgresOptions options, std::unique_ptr<Pool> pool, bool pooled);

  Result<PgResult> Run(std::string_view what, const std::string& sql,
                             const std::vector<std::optional<std::string>>& params);

  const PostgresOptions options_;
  const std::unique_ptr<Pool> pool_;
  const bool pooled_;
  Mutex listener_mu_;
  std::shared_ptr<Listener> listener_ LH_GUARDED_BY(listener_mu_);
};

class PostgresAdvisoryBackend final : public Backend {
 public:
  static Result<std::shared_ptr<PostgresAdvisoryBackend>> Open(PostgresOptions options);
  ~PostgresAdvisoryBackend() override;

  [[nodiscard]] std::string_view scheme() const override { return "postgres"; }

  // native_wait and fair_queue: the server's lock queue.
  [[nodiscard]] Capabilities capabilities() const override;

  // With a waiter_id whose WaitForTurn got the lock: completes that grant. With a waiter_id
  // still queued: kHeldByAnother without asking the server (the queue keeps its place).
  Result<Grant> TryAcquire(const GrantRequest& request) override;
  Status Renew(const RenewRequest& request) override;
  // One statement per session that holds any of the requests' leases (usually one).
  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override;
  Status Release(std::string_view key, std::string_view owner_token) override;
  // One statement on the holder's session (kAdvisoryFinish): writes the record into `records`,
  // clears the key's row or turns it into a kept grant (no session, an expiry: the file
  // comment), then unlocks. keep == 0 without a record is Release. If the statement fails, the
  // grant is released as by Release and the error returned.
  Status Finish(const FinishRequest& request) override;
  // Records are in the `records` table, as in table mode (read on the primary session).
  Result<std::optional<std::string>> ReadRecord(std::string_view key) override;
  // One SELECT (kListRecords) on the primary session, as ReadRecord.
  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override;
  // clock_timestamp(), one round trip on the primary session.
  Result<StoreTime> WallClock() override;
  // Live grants and live kept grants.
  Result<std::optional<LeaseInfo>> Inspect(std::string_view key) override;
  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override;
  // Ends the holder's session (see the file comment). Returns false if no session holds the
  // lock; kPermissionDenied without the right to signal that session.
  Result<bool> ForceRelease(std::string_view key) override;
  void AbandonWait(std::string_view key, std::string_view waiter_id) override;
  // Queues for the lock and returns when it is granted (OK), at `deadline` (kDeadlineExceeded,
  // still queued), or at `stop` (kCancelled, still queued until AbandonWait).
  Status WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                     std::stop_token stop) override;
  // WaitForTurn with a private waiter, abandoned on return.
  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) override;

  // Server pids of the sessions holding leases, for tests (pg_terminate_backend).
  [[nodiscard]] std::vector<int> SessionPidsForTesting() const;

  // Turns the open-time pooler check off (process-wide), so that a test can show the
  // heartbeat's own check against a pooler that the open-time check would have refused.
  static void SkipPoolerCheckForTesting(bool skip);

 private:
  struct Session;
  struct Held;
  struct Waiting;

  explicit PostgresAdvisoryBackend(PostgresOptions options);

  Result<std::shared_ptr<Session>> NewSession();
  Result<std::shared_ptr<Session>> PrimarySession();
  // Marks every lease and wait on `session` lost with `reason`. REQUIRES: mu_ not held.
  void SessionLost(const std::shared_ptr<Session>& session, const std::string& reason);
  // Returns a session with no leases to the idle list, or closes it.
  void Recycle(std::shared_ptr<Session> session);
  Status LostStatus(std::string_view key, std::string_view owner_token);
  // Returns the live grant of `key` if it is `owner_token`'s, else null.
  std::shared_ptr<Held> FindHeld(std::string_view key, std::string_view owner_token)
      LH_EXCLUDES(mu_);
  // The idle-in-transaction limit `ending`'s session keeps once `ending` is gone: that of its
  // other grants' largest TTL, or "0" when it holds no other (Release and Finish).
  std::string IdleMsAfter(const Held& ending) LH_EXCLUDES(mu_);
  // Returns false (and marks it lost) if `session` has died; `locked` is a session whose mutex
  // the caller holds (lock order: that one, then `session`'s).
  bool SessionAlive(const std::shared_ptr<Session>& session,
                    const std::shared_ptr<Session>& locked);
  Result<Grant> CompleteWaitedGrant(const GrantRequest& request, std::shared_ptr<Waiting> wait);
  // Runs one statement on the primary session, once more on a fresh one if that broke.
  Result<PgResult> RunOnPrimary(std::string_view what, const std::string& statement,
                                const PgParams& params);

  const PostgresOptions options_;
  mutable Mutex mu_;
  std::shared_ptr<Session> primary_ LH_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Session>> idle_ LH_GUARDED_BY(mu_);
  // Live grants by key (at most one per key: the re-entrancy guard).
  std::map<std::string, std::shared_ptr<Held>, std::less<>> held_ LH_GUARDED_BY(mu_);
  // Waits by waiter id.
  std::map<std::string, std::shared_ptr<Waiting>, std::less<>> waits_ LH_GUARDED_BY(mu_);
  // Why recent grants were lost, by owner token, for the kLost message (bounded).
  std::map<std::string, std::pair<std::string, LostCause>, std::less<>> lost_reasons_
      LH_GUARDED_BY(mu_);
  std::uint64_t next_private_waiter_ LH_GUARDED_BY(mu_) = 0;
};

}  // namespace leasehold::internal
