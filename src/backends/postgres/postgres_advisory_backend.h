// File: backends/postgres/postgres_advisory_backend.h (internal)
//
// PostgresAdvisoryBackend: the postgres:// store in mode=advisory, the default
// (postgres_backend.h).
//
// A grant is pg_try_advisory_lock(id) on a server session the handle keeps, with id = FNV-1a 64
// of "<schema>\0<key>" (AdvisoryLockId), and the key's row in "<schema>.leases" records holder,
// token and fence, bumped in the same statement. Facts it relies on, and what it does about
// them:
// - Advisory locks are re-entrant per session, so the backend refuses a second grant of a key
//   that any of its sessions holds (kHeldByAnother) before asking the server.
// - The grant lives as long as the session: kill -9 of the holder ends the session and frees
//   the lock at once, with no TTL to wait out. A lost session makes every lease on it lost.
// - A store must never free a grant before its holder's safe_until = t_send + ttl - drift
//   (docs/impl.md, "safe_until"); here the bound is the server's own limit for dropping a
//   silent session. Before a session's first grant with a given TTL T (the largest among its
//   leases), the backend sets
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
// - A fenced write (Lease::Write) runs on the session that holds the lock, in a transaction
//   that first checks the lock and the row: a session that was replaced (reconnected) or lost
//   the lock is fenced out. A grant kept after its holder (Finish, keep > 0) has no session, so
//   nobody writes under it.
// - Shared and semaphore leases are not offered (Capabilities::shared_leases is false, so the
//   core refuses them; TryAcquire refuses them too, naming mode=table). What was checked: shared
//   read/write grants could be pg_try_advisory_lock_shared, and a writer queued with the blocking
//   pg_advisory_lock (WaitForTurn) does make a later pg_try_advisory_lock_shared of another
//   session fail (PostgreSQL's lock manager checks new requests against the queue's wait mask),
//   so writer preference would come from the queue. What is missing is the bookkeeping: one row
//   per grant with its session (the `leases` row records one), a slot among the sessions that
//   hold the shared lock, and, for a semaphore, N lock ids whose limit every client must agree on
//   with no row that a dead session leaves behind deciding it. Use mode=table for those.
// Advisory mode needs a direct session; use mode=table through transaction poolers.
// - The store doctor (Store::Check): Ping is SELECT 1 on the primary session; Diagnose reads the
//   server's durability settings, topology (a pooler in between is unsafe here) and the role's
//   privileges on that session too (PgDiagnose, shared with table mode).
//
// Time: a grant lives as long as its server session, bounded by the session limits above; the
// local times (statement deadlines, each grant's local expiry, waits) are on the Clock the
// backend was opened with (backend.h), and only that clock is read.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(PostgresOptions options, PostgresOptions::FromUrl(url));
//   LH_ASSIGN_OR_RETURN(auto backend, PostgresAdvisoryBackend::Open(std::move(options), clock));
//   Result<Grant> grant = backend->TryAcquire(
//       {.key = "job:x", .owner_token = token, .holder = "web-3:42", .ttl = 10s});
//
// Thread safety: thread-safe. Each session's connection is used by one thread at a time (a mutex
// per session); the backend's maps are guarded by its own mutex, never held across a round trip.

#pragma once

#include <cstdint>
#include <functional>
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
#include "backends/postgres/postgres_history.h"
#include "backends/postgres/postgres_options.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// The advisory lock id of `key` under `schema`: FNV-1a 64 (offset basis 0xcbf29ce484222325,
// prime 0x100000001b3) over the bytes of schema, one NUL byte, then key, as a signed bigint.
std::int64_t AdvisoryLockId(std::string_view schema, std::string_view key);

class PostgresAdvisoryBackend final : public Backend,
                                      public WaitFacet,
                                      public RecordsFacet,
                                      public FencedWriteFacet,
                                      public DoctorFacet {
 public:
  // Opens the primary session (refusing a detected pooler) and checks (or creates) the schema.
  // Every local deadline is on `clock`, which must outlive the backend.
  static Result<std::shared_ptr<PostgresAdvisoryBackend>> Open(PostgresOptions options,
                                                               Clock& clock);
  ~PostgresAdvisoryBackend() override;

  [[nodiscard]] std::string_view scheme() const override { return "postgres"; }

  // fair_queue, and the wait facet: the server's lock queue.
  [[nodiscard]] Capabilities capabilities() const override;

  Facets facets() override {
    return {.wait = this, .records = this, .fenced_write = this, .doctor = this};
  }

  [[nodiscard]] unsigned fenced_ops() const override;

  // With a waiter_id whose WaitForTurn got the lock: completes that grant. With a waiter_id
  // still queued: kHeldByAnother without asking the server (the queue keeps its place). An
  // indeterminate outcome (PgConnection::Exec) is kUnavailable "the store may have applied it",
  // and the lock it may have taken is unlocked (or dies with its session), so no grant stays
  // behind. A grant whose token says the store's history went backwards is released and
  // refused; one on a newer timeline counts a store failover (PgHistory).
  Result<Grant> TryAcquire(const GrantRequest& request) override;
  // One statement per session that holds any of the requests' leases (usually one).
  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override;
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
  // SELECT 1 on the primary session, once (no second try on a fresh session), bounded by
  // command_timeout (and connect_timeout if the primary session must be reopened).
  Status Ping() override;
  // PgDiagnose (postgres_common.h) on the primary session, once: durability, topology (a pooler
  // in between is unsafe in this mode), permissions, the GRANT lines.
  Result<Diagnosis> Diagnose() override;
  // The key's one grant, if any (a key has at most one here).
  Result<std::vector<LeaseInfo>> Holders(std::string_view key) override;
  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override;

  // ForceReleaseAll, or with a token prefix ForceReleaseOne.
  Result<bool> ForceEnd(std::string_view key, std::string_view token_prefix) override;
  // Sql ops only, on the very session that holds the lease's advisory lock, in one transaction
  // (PgFencedWrite, postgres_common.h): BEGIN; pg_locks shows the lock granted to this session
  // and the key's row records this grant as its own (kAdvisoryFencedCheck); the statements,
  // text parameters, never prepared; COMMIT. Nothing else runs on the session meanwhile (its
  // mutex), so heartbeats of its leases wait for the write. kLost (FencedOut) if this handle
  // does not hold the grant, its local expiry passed (not renewed within its ttl), the check
  // finds no row, or the session ended before COMMIT (the write died with it: nothing written,
  // and every lease on the session is lost); kInvalidArgument and kUnavailable as in table
  // mode (PostgresTableBackend::FencedWrite).
  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) override;
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
  // Finish with nothing kept: deletes the grant only if its owner token matches.
  Status Delete(std::string_view key, std::string_view owner_token);

  // Ends the holder's session (see the file comment). Returns false if no session holds the
  // lock; kPermissionDenied without the right to signal that session.
  Result<bool> ForceReleaseAll(std::string_view key);

  struct Session;
  struct Held;
  struct Waiting;

  PostgresAdvisoryBackend(PostgresOptions options, Clock& clock);

  Result<std::shared_ptr<Session>> NewSession();
  Result<std::shared_ptr<Session>> PrimarySession();
  // Marks every lease and wait on `session` lost with `reason`. REQUIRES: mu_ not held.
  void SessionLost(const std::shared_ptr<Session>& session, const std::string& reason);
  // Returns a session with no leases to the idle list, or closes it.
  void Recycle(std::shared_ptr<Session> session);
  Status LostStatus(std::string_view key, std::string_view owner_token);
  // The FencedOut status of a refused fenced write: names the live grant of another holder if
  // there is one, read on `conn` (a session whose mutex the caller holds) or, if null, on the
  // primary session.
  Status FencedRefusal(const FencedWriteRequest& request, PgConnection* conn) LH_EXCLUDES(mu_);
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
  // TryAcquire before the history check.
  Result<Grant> AcquireOnce(const GrantRequest& request);
  // Runs one statement on the primary session, once more on a fresh one if that broke (unless
  // `retry` is false: Ping and Diagnose, whose one round trip is the point).
  Result<PgResult> RunOnPrimary(std::string_view what, const std::string& statement,
                                const PgParams& params, bool retry = true);

  const PostgresOptions options_;
  Clock& clock_;
  PgHistory history_;
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
