// File: backends/postgres/postgres_connection.h (internal)
//
// PgConnection: one libpq connection, with every wait bounded and cancellable. Statements are
// sent with PQsendQuery (simple protocol, may hold several statements) or PQsendQueryParams
// (one statement, text parameters, the unnamed statement): never a named prepared statement,
// so that transaction-pooling PgBouncer can carry them.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(auto conn, PgConnection::Connect(options, clock));
//   LH_ASSIGN_OR_RETURN(PgResult r, conn->Exec("inspect", kSql, {key}, deadline));
//   std::string_view holder = r.Get(0, 1);
//
// Every deadline is on the Clock given to Connect (the backend's: see backend.h), and it is the
// only clock the connection reads; it must run at the real rate, since poll() waits in real time.
//
// Thread safety: not thread-safe (libpq connections are not); the backend serialises access.
// Cancel() alone may be called from another thread while a statement runs.

#pragma once

#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "backends/postgres/postgres_options.h"

// libpq's types, declared here so that only postgres_connection.cc includes libpq-fe.h.
struct pg_conn;
struct pg_result;
struct pg_cancel;

namespace leasehold::internal {

// The SQLSTATEs the backend acts on.
inline constexpr std::string_view kSqlStateLockNotAvailable = "55P03";
inline constexpr std::string_view kSqlStateQueryCanceled = "57014";
inline constexpr std::string_view kSqlStateUndefinedTable = "42P01";
inline constexpr std::string_view kSqlStateInsufficientPrivilege = "42501";
inline constexpr std::string_view kSqlStateAdminShutdown = "57P01";
inline constexpr std::string_view kSqlStateIdleSessionTimeout = "57P05";
inline constexpr std::string_view kSqlStateProtocolViolation = "08P01";

// The detail of a kUnavailable status whose statement the server may or may not have applied
// (Status::detail(), in place of a SQLSTATE): PgConnection's "indeterminate" outcomes below.
inline constexpr std::string_view kIndeterminate = "indeterminate";

// True if `status` is an indeterminate outcome (kIndeterminate).
bool PgIndeterminate(const Status& status);

// One statement's result: rows of text values.
class PgResult {
 public:
  PgResult() = default;
  explicit PgResult(pg_result* result);

  [[nodiscard]] int rows() const;
  [[nodiscard]] bool IsNull(int row, int col) const;
  // Returns the value as text ("" for NULL).
  [[nodiscard]] std::string_view Get(int row, int col) const;
  // Returns the value as an integer; 0 for NULL or junk.
  [[nodiscard]] long long GetInt(int row, int col) const;
  // Returns true for PostgreSQL's boolean "t".
  [[nodiscard]] bool GetBool(int row, int col) const;
  // Returns the command tag ("INSERT 0 1", "UPDATE 3", "CREATE TABLE"), "" if none.
  [[nodiscard]] std::string_view command_tag() const;
  // Returns the rows the statement processed (PQcmdTuples: inserted, updated, deleted, merged,
  // but also selected), 0 if it reports none.
  [[nodiscard]] long long rows_processed() const;

 private:
  struct Deleter {
    void operator()(pg_result* r) const;
  };

  std::unique_ptr<pg_result, Deleter> result_;
};

// Text parameters for PQsendQueryParams; nullopt is SQL NULL.
using PgParams = std::vector<std::optional<std::string>>;

class PgConnection {
 public:
  // Connects (bounded by libpq's connect_timeout) and reads the backend key the server, or a
  // pooler in front of it, sent at startup. Returns kUnavailable if the server cannot be
  // reached, kPermissionDenied for rejected credentials; messages carry options.display and
  // never a password. Deadlines given to the connection are on `clock`, which must outlive it.
  static Result<std::unique_ptr<PgConnection>> Connect(const PostgresOptions& options,
                                                       Clock& clock);

  ~PgConnection();
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;
  PgConnection(PgConnection&&) = delete;
  PgConnection& operator=(PgConnection&&) = delete;

  // Sends `sql` (with `params` when non-empty: one statement only) and waits for its last
  // result until `deadline`. At the deadline, or when `stop` is requested, the statement is
  // cancelled (PQcancel) and its end awaited for a short grace; a connection that still does
  // not answer is closed (broken()). Returns the statement's error as a Status (detail: the
  // SQLSTATE), kCancelled after `stop`, kUnavailable after the deadline or a broken connection.
  //
  // Indeterminate outcomes. A statement that was sent and then (a) answered only after a cancel
  // request (its own deadline's, or `stop`), (b) answered with the server's warning that it
  // cancelled the wait for synchronous replication (SQLSTATE 01000 or 57P01, "canceling [the]
  // wait for synchronous replication": the COMMIT is durable on this server and on no standby,
  // so a failover can undo it; whoever cancelled it: this connection, statement_timeout, an
  // operator's pg_cancel_backend), or (c) lost its connection before its result, may or may not
  // have been applied, and may yet be undone. Such a result is never returned as a success:
  // the status is kUnavailable "the store may have applied <what>: ..." with detail
  // kIndeterminate (kCancelled keeps its code after `stop`, with the same detail). An answer
  // the statement gave in time is trusted; a cancel that the server answers with 57014 (the
  // statement's transaction rolled back) is a plain kUnavailable, nothing applied.
  //
  // Why a COMMIT that waits for a standby is cancelled at the deadline rather than awaited
  // for longer: the caller's own bound has passed (for a grant, a confirmation that arrives
  // after it is worth nothing, since safe_until counts from the send), and while the wait lasts
  // the transaction keeps its row locks and this connection, so every other statement on the
  // key, the cleanup of this one included, waits behind it. Cancelled, the transaction is
  // committed on this server (others see it: a grant nobody runs under, which an owner-checked
  // release or its TTL ends) and on no standby (a promoted standby never had it): either way
  // nobody was told "granted".
  Result<PgResult> Exec(std::string_view what, const std::string& sql, const PgParams& params,
                        SteadyTime deadline, std::stop_token stop = {});

  // As Exec, for a statement the caller does not repeat (a fenced write's): always sent with
  // PQsendQueryParams, also without parameters, so that the server takes one statement only (the
  // extended protocol refuses several, SQLSTATE 42601), and never as a named prepared statement
  // (PrepareStatements), so that the session keeps nothing of it.
  Result<PgResult> ExecOnce(std::string_view what, const std::string& sql, const PgParams& params,
                            SteadyTime deadline);

  // Closes the connection for good (broken() from now on, with `reason`): for a connection left
  // in a state nobody can vouch for, such as a transaction whose ROLLBACK failed.
  void Discard(std::string reason);

  // The two halves of Exec, for a statement that outlives one call (a wait in the server's
  // lock queue). Send starts it; Await waits until `deadline` or `stop` and returns nullopt if it
  // is still running then (nothing is cancelled), else its result as Exec does.
  Status Send(std::string_view what, const std::string& sql, const PgParams& params);
  Result<std::optional<PgResult>> Await(std::string_view what, SteadyTime deadline,
                                        std::stop_token stop);

  // Waits until `deadline` or `stop` for NOTIFY messages (after a LISTEN) and returns the
  // payloads of those on `channel` (possibly none). Returns kUnavailable if the connection broke.
  Result<std::vector<std::string>> ReadNotifications(std::string_view channel, SteadyTime deadline,
                                                     std::stop_token stop);

  // From now on, a statement sent with parameters is prepared on this connection the first time
  // (one extra round trip, once) and executed by name afterwards: the server then skips parsing
  // and planning, most of a short statement's cost. Only for a connection that keeps its
  // session (not through a transaction-pooling proxy, where a prepared name is not ours).
  void PrepareStatements() { prepare_ = true; }

  // The chaos harness's negative control only (tests/chaos, chaos_worker --unsafe=trustcommit):
  // from now on, every connection of the process trusts what the indeterminate-outcome rule
  // (Exec) refuses, as leasehold did before it: a success answered with the warning of a
  // cancelled wait for synchronous replication, and an answer that arrives after a cancel.
  // Never called by the library.
  static void TrustUnconfirmedCommitsForTesting(bool trust);

  // Asks the server to cancel the running statement (PQcancel) and returns at once: the request
  // is sent from a thread of its own. PQcancel opens a new connection to the server and waits
  // for the server to close it, with no timeout: against a host that drops packets or a paused
  // one (a stopped VM, a SIGSTOPped postmaster) that is minutes or forever, and the caller's
  // deadline must hold regardless. At most kMaxCancelsInFlight such requests are outstanding in
  // the process; past that a cancel is skipped (the caller's grace then ends the connection).
  // Thread-safe.
  void Cancel();

  // True once the connection failed; it is never used again.
  [[nodiscard]] bool broken() const { return broken_; }

  // Why the connection broke (scrubbed), or "".
  [[nodiscard]] const std::string& broken_reason() const { return broken_reason_; }

  // True while a statement sent by Send has not been awaited to its end.
  [[nodiscard]] bool busy() const { return busy_; }

  // The process id in the BackendKeyData message: the server's own pid on a direct connection,
  // a number of the pooler's choosing through PgBouncer.
  [[nodiscard]] int startup_pid() const { return startup_pid_; }

 private:
  PgConnection(pg_conn* conn, const PostgresOptions& options, Clock& clock);

  struct CancelRequest;
  // Cancel, returning the request in flight (nullptr if none could be sent).
  std::shared_ptr<CancelRequest> StartCancel();
  // Closes the connection for good. With a statement in flight (busy_), the status is
  // indeterminate: it may have been applied.
  Status MarkBroken(std::string_view what, std::string reason);
  // The indeterminate status of `what` (see Exec), for `why` ("cancelled the wait ...").
  Status Indeterminate(std::string_view what, std::string_view why, StatusCode code) const;
  // libpq's notice receiver: logs the server's NOTICEs and WARNINGs at debug level and records
  // a cancelled wait for synchronous replication in sync_rep_cancelled_.
  static void OnNotice(void* self, const pg_result* notice);
  // Send, with `once` as ExecOnce describes.
  Status SendStatement(std::string_view what, const std::string& sql, const PgParams& params,
                       bool once);
  // Marks a statement as sent: busy, with no result, error or warning of its own yet.
  void Started();
  // Awaits the statement in flight until `deadline`; past it (or on `stop`) cancels it as Exec
  // describes.
  Result<PgResult> Finish(std::string_view what, SteadyTime deadline, std::stop_token stop);
  Status ResultStatus(std::string_view what, pg_result* result);

  pg_conn* const conn_;
  Clock& clock_;
  // Shared with the threads that send cancel requests, which can outlive the connection.
  const std::shared_ptr<pg_cancel> cancel_;
  const std::string display_;
  const std::optional<std::string> password_;
  const int startup_pid_;
  // Written by a stop request to wake Await's poll().
  const int wake_fd_;
  bool broken_ = false;
  bool busy_ = false;
  bool prepare_ = false;
  // Statement text -> name of its prepared statement on this connection.
  std::map<std::string, std::string, std::less<>> prepared_;
  std::string broken_reason_;
  // The server's warning that it cancelled the statement in flight's wait for synchronous
  // replication (set by OnNotice, cleared by every send), or "".
  std::string sync_rep_cancelled_;
  // Results of the statement in flight, collected by Await: the first error, else the last.
  std::optional<Status> pending_error_;
  PgResult pending_result_;
};

}  // namespace leasehold::internal
