// File: backends/sqlite/sqlite_backend.h (internal)
//
// SqliteBackend: the embedded sqlite:// store, for many processes on one host. Each grant is a
// row in one SQLite file; each key's fencing counter is a row in a table that is never pruned,
// so fencing tokens keep increasing across release, expiry, force-release and reboots.
// Expiry is judged on CLOCK_BOOTTIME (BootClock), which every process on the host shares and
// which never jumps backwards; each grant also records the kernel boot id, and a grant made
// under another boot counts as expired. The backend reads that time through the Clock it was
// opened with, which must therefore be Clock::Real() (the registry refuses any other for
// sqlite://): the times are shared with other processes through the file.
//
// Processes coordinate through SQLite's own file locking: WAL journal mode, every mutation in
// one BEGIN IMMEDIATE transaction, and a busy timeout (kUnavailable when it runs out). In front
// of BEGIN IMMEDIATE, leasehold's connections to the file queue first come, first served in a
// host-local write queue (<db>-lhq, sqlite_host_queue.h), so that none of them starves in
// SQLite's busy handler; the same file carries the change generations waiters sleep on
// (WaitForChange, the wait facet).
//
// Shared leases (backend.h, "Shared leases"): each grant of a key is a row of its own, in the
// key's smallest free slot; a waiting writer's intent is a row of writer_intents. Admission is
// a read of the key's live grants and an insert in the same BEGIN IMMEDIATE transaction.
//
// Fenced writes (Lease::Write, FencedOp kSql) run the caller's statements on data tables in the
// same file, inside the BEGIN IMMEDIATE transaction that first checks the grant: a holder whose
// grant expired or was taken over writes nothing. The lease tables (grants, fencing_counters,
// records, writer_intents) share the file and are off limits to those statements.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("sqlite:///tmp/leases.db"));
//   LH_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenSqliteBackend(url));
//   Result<Grant> grant = backend->TryAcquire(
//       {.key = "job:x", .owner_token = token, .holder = "web-3:42", .ttl = 10s});
//
// The store doctor (leasehold check): Ping is an empty BEGIN IMMEDIATE / COMMIT on the
// backend's own connection; Diagnose reads the journal mode and synchronous level, the file
// system under the file (statfs) and whether the file and its directory are writable.
//
// Thread safety: thread-safe. One SQLite connection per SqliteBackend, used under a mutex;
// other processes (and other SqliteBackend objects) are serialized by SQLite's file locks.

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
#include "backends/sqlite/sqlite_options.h"
#include "core/url.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// The SQLite handle and its prepared statements; defined in sqlite_backend.cc, the only file
// that includes sqlite3.h.
class SqliteConnection;
class SqliteHolderAnchor;

// Identifies a leasehold database: PRAGMA application_id, 'LEAS' in ASCII.
inline constexpr std::int32_t kSqliteApplicationId = 0x4C454153;
// PRAGMA user_version of the schema this build creates and understands: 2, whose grants table
// holds several grants of a key (shared leases). A version 1 file is migrated at open; a
// version 1 binary refuses a version 2 file (sqlite_backend.cc, kMigrateToV2Sql).
inline constexpr std::int32_t kSqliteSchemaVersion = 2;

// Opens (creating if needed) the leasehold database named by `url` (scheme "sqlite").
// Returns kInvalidArgument for a bad URL or a file that is not a leasehold database (or is
// corrupt); kPermissionDenied if the file or its directory cannot be created, read or written;
// kUnimplemented for a database made by a newer leasehold; kUnavailable if it stays locked
// longer than busy_timeout.
Result<std::shared_ptr<Backend>> OpenSqliteBackend(const Url& url, Clock& clock = Clock::Real());

// The host-wide database path, which every local user shares (opened with scope=host):
// $LEASEHOLD_STATE_DIR/leases.db, else /var/lib/leasehold/leases.db. Returns kInvalidArgument
// for a relative $LEASEHOLD_STATE_DIR.
Result<std::string> DefaultSqlitePath();

// The host-wide store's directory when $LEASEHOLD_STATE_DIR is not set.
inline constexpr std::string_view kDefaultSqliteStateDir = "/var/lib/leasehold";

// The CLOCK_BOOTTIME offset of this process's time namespace (time_namespaces(7)), in ns, from
// the text of /proc/self/timens_offsets ("boottime <s> <ns>" among its lines): the host's
// CLOCK_BOOTTIME is the process's minus it. Returns kInternal naming the text when the line is
// missing or malformed.
Result<std::int64_t> ParseBoottimeOffsetNs(std::string_view timens_offsets);

class SqliteBackend final : public Backend,
                            public WaitFacet,
                            public RecordsFacet,
                            public FencedWriteFacet,
                            public DoctorFacet {
 public:
  // Opens or creates the database, as OpenSqliteBackend does; all checks happen here, so that a
  // bad file is reported at once rather than on the first lease operation. Every time the
  // backend reads comes from `clock`, which must outlive it.
  // REQUIRES: `clock` is Clock::Real() (grants carry CLOCK_BOOTTIME times that other processes
  // compare with theirs).
  static Result<std::shared_ptr<SqliteBackend>> Open(SqliteOptions options,
                                                     Clock& clock = Clock::Real());

  ~SqliteBackend() override;

  [[nodiscard]] std::string_view scheme() const override { return "sqlite"; }

  [[nodiscard]] Capabilities capabilities() const override;

  Facets facets() override {
    return {.wait = this, .records = this, .fenced_write = this, .doctor = this};
  }

  [[nodiscard]] unsigned fenced_ops() const override;

  // One BEGIN IMMEDIATE transaction: reads the key's live grants (and its writer intent where
  // the request's mode needs it), admits the request by backend.h's rules ("Shared leases"),
  // and writes the grant in the smallest free slot with the key's next fencing token, or, for a
  // refused exclusive request of a waiter, its writer intent. A token that already holds a live
  // grant of the key is refused as held (an earlier attempt's grant whose reply was lost; it
  // expires by itself).
  Result<Grant> TryAcquire(const GrantRequest& request) override;

  // Renews every request in one BEGIN IMMEDIATE transaction. If the transaction cannot start
  // or commit, every request gets that error.
  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override;

  // One BEGIN IMMEDIATE transaction: the owner check, the grant's end (delete, or a new expiry
  // with no renewal) and the record.
  Status Finish(const FinishRequest& request) override;

  Result<std::optional<std::string>> ReadRecord(std::string_view key) override;

  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override;

  // This host's wall clock, which is the store's (from_store true).
  Result<StoreTime> WallClock() override;

  // An empty BEGIN IMMEDIATE / COMMIT, through the host's write queue as every mutation: the
  // write lock's round trip. Writes nothing. kUnavailable if the file stays locked.
  Status Ping() override;

  // Items: durability (journal_mode and the synchronous level grants commit with; the file
  // system, by statfs: a network, FUSE or volatile one is kUnsafe), topology (who shares the
  // file: this host, or a warning for a private file) and permissions (access(2) on the file,
  // its -lhq queue file and its directory).
  Result<Diagnosis> Diagnose() override;

  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override;

  // ForceReleaseAll, or with a token prefix ForceReleaseOne.
  Result<bool> ForceEnd(std::string_view key, std::string_view token_prefix) override;

  // Every live grant of the key, ordered by slot, and those not yet expired whose holder is gone
  // (LeaseInfo::holder_gone), which no other operation counts as live.
  Result<std::vector<LeaseInfo>> Holders(std::string_view key) override;

  // Deletes the waiter's writer intent of the key, if it has one (and wakes the key's waiters:
  // shared requests it held off may be admitted now).
  void AbandonWait(std::string_view key, std::string_view waiter_id) override;

  // Sleeps on the key's change generation in the host's shared file (SqliteHostQueue), which
  // Release, Finish, ForceRelease and ForceReleaseGrant of any process bump after COMMIT (and
  // AbandonWait, and a grant that clears a writer intent): a wake-up, not a poll. It reads the
  // generation, then the key's live grants: if there is none it returns OK at once; else it
  // sleeps while the generation is unchanged, at most until the first of their expiries
  // (nobody releases after a kill -9) or `deadline`, so the end of any grant of the key wakes
  // it. A release that commits after the grants were read bumps the generation after that
  // read, so it cannot be missed. OK when woken or the grants are gone; kDeadlineExceeded;
  // kCancelled on `stop`.
  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) override;

  // As WaitForChange, for the waiter of Store::Acquire whose last TryAcquire was refused: it
  // sleeps on the change generation that TryAcquire read before its transaction, not on one
  // read now, so a grant that ended between the refusal and this call (a semaphore's slot
  // freed, which leaves the key held) wakes it at once. Also returns at once if the key has no
  // live grant and no live writer intent but the waiter's own; sleeps at most until the first
  // expiry of the key's live grants or of another waiter's intent.
  Status WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                     std::stop_token stop) override;

  // Sql ops only. One BEGIN IMMEDIATE transaction on the file: a grant row of the key (one of
  // several, for a shared or semaphore lease) still holds request.owner_token and is live
  // (same boot, not expired: the rule of Renew and Inspect), then each statement, prepared,
  // its parameters bound as text ($N by name, as on PostgreSQL; else ?N or ? by index),
  // stepped to its end; then COMMIT. Any error rolls everything back.
  // Returns per statement the rows it changed (sqlite3_changes; 0 for one that changes none).
  // kLost (FencedOut) if the check fails; kInvalidArgument with SQLite's message for a
  // statement SQLite refuses (syntax, constraint, type...), for more than one statement in an
  // op, for parameters that do not match the statement's, and for statements that would end
  // the transaction (BEGIN, COMMIT, END, ROLLBACK, SAVEPOINT, RELEASE, ATTACH, DETACH, VACUUM),
  // change leasehold's own tables (grants, fencing_counters, records, writer_intents), create a
  // TEMP table, view or trigger (it could shadow them) or any trigger, or run a PRAGMA;
  // kUnavailable when the file stays locked (busy_timeout) or fails as elsewhere. The write
  // holds the file's write lock while it runs: other writers of the file (every lease
  // operation of every process on it) wait for it.
  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) override;

  // The database file, as given (not made absolute).
  [[nodiscard]] const std::string& path() const { return path_; }

  // The boot id that grants made by this process record.
  [[nodiscard]] const std::string& boot_id() const { return boot_id_; }

 private:
  // Finish with nothing kept: deletes the grant only if its owner token matches.
  Status Delete(std::string_view key, std::string_view owner_token);

  Result<bool> ForceReleaseAll(std::string_view key);

  // One DELETE of the key's lowest-slot live grant whose token starts with `token_prefix`;
  // wakes waiters as Release.
  Result<bool> ForceReleaseOne(std::string_view key, std::string_view token_prefix);

  SqliteBackend(std::string path, StoreScope scope, std::string boot_id,
                std::int64_t boot_offset_ns, Clock& clock,
                std::unique_ptr<SqliteHolderAnchor> anchor,
                std::unique_ptr<SqliteConnection> connection);

  // The store's time, as grants record it: the host's CLOCK_BOOTTIME in nanoseconds (the
  // clock's reading minus this process's time namespace offset, boot_offset_ns_).
  [[nodiscard]] std::int64_t NowNs() const;

  // TryAcquire inside the lock.
  Result<Grant> TryAcquireLocked(const GrantRequest& request) LH_REQUIRES(mu_);

  // The wait of WaitForChange and WaitForTurn: `seen` is the key's generation before the read
  // the caller's decision came from; `waiter_id` empty for WaitForChange.
  Status WaitForKey(std::string_view key, std::string_view waiter_id,
                    std::optional<std::uint32_t> seen, SteadyTime deadline, std::stop_token stop);

  // Renews one grant inside an open transaction, at store time `now_ns`.
  Status RenewLocked(const RenewRequest& request, std::int64_t now_ns) LH_REQUIRES(mu_);

  // Explains why `key` is not (or no longer) held under `owner_token`, inside an open
  // transaction: "lease job:x was lost: expired 1.2s ago" and so on.
  Status LostStatusLocked(std::string_view key, std::string_view owner_token, std::int64_t now_ns)
      LH_REQUIRES(mu_);

  // Immutable after construction.
  const std::string path_;
  // Who may write the file, as Open found its mode (Capabilities::scope).
  const StoreScope scope_;
  const std::string boot_id_;
  // This process's CLOCK_BOOTTIME minus the host's (its time namespace's offset; 0 outside one).
  const std::int64_t boot_offset_ns_;
  Clock& clock_;
  // The lock that proves this process's grants alive; lh_alive asks it about the others'.
  // Declared before connection_, whose statements call lh_alive: destroyed after it.
  const std::unique_ptr<SqliteHolderAnchor> anchor_;

  // The change generation a waiter's refused TryAcquire read before its transaction, by
  // waiter_id, until its WaitForTurn takes it (or it is granted, or abandons).
  struct RefusedAt {
    std::string key;
    std::uint32_t generation = 0;
  };

  // At most this many RefusedAt entries; beyond, they are dropped (a WaitForTurn without one
  // reads the generation afresh, as WaitForChange does).
  static constexpr std::size_t kMaxRefusedWaiters = 4096;

  Mutex mu_;
  // Guarded by mu_.
  std::unique_ptr<SqliteConnection> connection_ LH_PT_GUARDED_BY(mu_);
  std::map<std::string, RefusedAt, std::less<>> refused_at_ LH_GUARDED_BY(mu_);
};

}  // namespace leasehold::internal
