// File: backends/postgres/postgres_table_backend.h (internal)
//
// PostgresTableBackend: the postgres:// store in mode=table (postgres_backend.h). A grant is the
// key's row in "<schema>.leases" (postgres_sql.h) with an owner token and an expiry computed by
// the server's clock, so client clocks never matter. Acquire, renew (all of a handle's leases at
// once) and release are one statement each, sent without prepared statements through a pooler,
// so PgBouncer in transaction pooling carries them. Release NOTIFYs the key on the schema's
// channel; waiters share one LISTEN connection (a std::jthread owned by the backend, started by
// the first wait) and also wake at the holder's expiry. Through a pooler, which cannot carry
// LISTEN, waiters poll with backoff instead (no wait facet).
//
// Shared leases (GrantRequest::mode, ::limit): an exclusive grant stays the key's row in
// `leases`; shared and semaphore grants are rows of "<schema>.shares" (key, slot), and a key's
// writer intent is its row of slot -1 there (postgres_sql.h). A plain exclusive try-acquire is
// still the one statement kTableAcquire; any other acquire (shared, semaphore, an exclusive one
// of a waiter, which may record its intent, or one that finds the key marked as shared) is one
// transaction of three statements in one round trip (kTableAcquireShared) that locks the key's
// row first. Without a usable shares table (a schema from before shared leases whose role could
// not create it, or lacks rights on it) the backend uses the statements of that release, and
// shared and semaphore acquires fail naming `leasehold schema`.
//
// Fenced writes (Lease::Write) run the caller's statements in one transaction that first reads
// the key's row FOR SHARE: the grant cannot end or change hands until the write commits.
//
// The store doctor (Store::Check): Ping is SELECT 1 on a pooled connection; Diagnose reads the
// server's durability settings, topology (a pooler in between is fine here) and the role's
// privileges on one (PgDiagnose, shared with advisory mode).
//
// Time: grants expire on the server's clock; the local deadlines (statements, waits, the
// LISTEN connection's reconnect pace) are on the Clock the backend was opened with (backend.h).
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(PostgresOptions options, PostgresOptions::FromUrl(url));
//   LH_ASSIGN_OR_RETURN(auto backend, PostgresTableBackend::Open(std::move(options), clock));
//
// Thread safety: thread-safe. A pooled connection is used by one thread at a time; the listener
// pointer is guarded by its own mutex, never held across a round trip.

#pragma once

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

class PostgresTableBackend final : public Backend,
                                   public WaitFacet,
                                   public RecordsFacet,
                                   public FencedWriteFacet,
                                   public DoctorFacet {
 public:
  // Connects, tells whether a pooler is in between, and checks (or creates) the schema. Every
  // local deadline is on `clock`, which must outlive the backend.
  static Result<std::shared_ptr<PostgresTableBackend>> Open(PostgresOptions options, Clock& clock);
  ~PostgresTableBackend() override;

  [[nodiscard]] std::string_view scheme() const override { return "postgres"; }

  // The wait facet: LISTEN/NOTIFY, unless a pooler is in between (then none).
  [[nodiscard]] Capabilities capabilities() const override;

  Facets facets() override {
    return {.wait = pooled_ ? nullptr : static_cast<WaitFacet*>(this),
            .records = this,
            .fenced_write = this,
            .doctor = this};
  }

  [[nodiscard]] unsigned fenced_ops() const override;

  // One statement (kTableAcquire, or kTableAcquireShared). An indeterminate outcome (a COMMIT
  // whose wait for a synchronous standby was cancelled, a late answer, a connection lost after
  // the send: PgConnection::Exec) is kUnavailable "the store may have applied it", and the
  // grant it may have made is released, owner-checked, at once and again before later acquires
  // (PgUnsureGrants). A grant whose token says the store's history went backwards is released
  // and refused; one on a newer timeline counts a store failover (PgHistory).
  Result<Grant> TryAcquire(const GrantRequest& request) override;
  // One UPDATE for all requests. If it fails, every request gets that error.
  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override;
  // One statement (kTableFinish): the grant's row and the key's row in `records` change together
  // or not at all. keep and record_ttl are rounded up to whole milliseconds.
  Status Finish(const FinishRequest& request) override;
  Result<std::optional<std::string>> ReadRecord(std::string_view key) override;
  // One SELECT (kListRecords); expiry on the server's clock.
  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override;
  // clock_timestamp(), one round trip.
  Result<StoreTime> WallClock() override;
  // SELECT 1 on a pooled connection, once (no second try on a fresh connection), bounded by
  // command_timeout (and connect_timeout if the pool has no idle connection).
  Status Ping() override;
  // PgDiagnose (postgres_common.h) on a pooled connection, once: durability, topology (a pooler
  // in between is fine in this mode), permissions, the GRANT lines.
  Result<Diagnosis> Diagnose() override;
  Result<std::vector<LeaseInfo>> Holders(std::string_view key) override;
  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override;

  // ForceReleaseAll, or with a token prefix ForceReleaseOne.
  Result<bool> ForceEnd(std::string_view key, std::string_view token_prefix) override;
  // Deletes the waiter's writer intent, if it has one, and NOTIFYs the key (one statement).
  void AbandonWait(std::string_view key, std::string_view waiter_id) override;
  // Sql ops only, in one transaction on one pooled connection (PgFencedWrite, postgres_common.h):
  // BEGIN; the key's row checked to be this grant and live on the server's clock, and locked
  // FOR SHARE, so that no acquire, renew, release or force-release of the key changes it before
  // COMMIT (kTableFencedCheck); the statements, text parameters, no prepared statements (so
  // PgBouncer in transaction pooling carries the whole transaction on one server connection);
  // COMMIT. kLost (FencedOut) if the check finds no row; kInvalidArgument for a statement the
  // server refuses (PgFencedStatementStatus) or one that is not a single data statement
  // (PgCheckFencedOps); kUnavailable if the connection fails (the outcome unknown once COMMIT
  // was sent).
  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) override;
  // Blocks until a NOTIFY for `key`, the holder's expiry (plus jitter), `deadline` or `stop`;
  // polls every 100 ms while the LISTEN connection is down. kUnimplemented through a pooler.
  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) override;
  // As WaitForChange, but the waiter's own writer intent is not something to wait for.
  Status WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                     std::stop_token stop) override;

  // True if the shares table was usable at open (shared leases work).
  [[nodiscard]] bool shares_ready() const { return shares_ready_; }

  // True if a pooler was detected at open.
  [[nodiscard]] bool pooled() const { return pooled_; }

 private:
  // Finish with nothing kept: deletes the grant only if its owner token matches.
  Status Delete(std::string_view key, std::string_view owner_token);

  Result<bool> ForceReleaseAll(std::string_view key);

  // One statement (kTableForceReleaseShared); kUnimplemented without the shares table.
  Result<bool> ForceReleaseOne(std::string_view key, std::string_view token_prefix);

  class Listener;
  struct Pool;

  PostgresTableBackend(PostgresOptions options, Clock& clock, std::unique_ptr<Pool> pool,
                       bool pooled, bool shares_ready);

  // Reads the server a new pooled connection reached and checks it with history_
  // (PgHistory::ObserveServer): another cluster or an older timeline is refused, a newer
  // timeline counts a failover.
  Status CheckServer(PgConnection& conn);
  // TryAcquire's statement, once.
  Result<Grant> AcquireOnce(const GrantRequest& request);
  // kTableAcquireShared for `request`, one round trip.
  Result<Grant> AcquireShared(const GrantRequest& request);
  // The wait of WaitForChange and WaitForTurn; `waiter_id` empty for none.
  Status Wait(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
              std::stop_token stop);
  // `shared` if the shares table is ready, else `legacy`, filled in by PgStatement.
  [[nodiscard]] std::string Sql(std::string_view shared, std::string_view legacy) const;

  // Runs one statement on a pooled connection, once more on a fresh one if a reused connection
  // broke (unless `retry` is false: Ping, whose one round trip is the point).
  Result<PgResult> Run(std::string_view what, const std::string& sql, const PgParams& params,
                       bool retry = true);

  const PostgresOptions options_;
  Clock& clock_;
  const std::unique_ptr<Pool> pool_;
  const bool pooled_;
  const bool shares_ready_;
  PgHistory history_;
  PgUnsureGrants unsure_;
  Mutex listener_mu_;
  std::shared_ptr<Listener> listener_ LH_GUARDED_BY(listener_mu_);
};

}  // namespace leasehold::internal
