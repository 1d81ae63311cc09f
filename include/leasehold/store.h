// File: leasehold/store.h
//
// Store: a handle to the external system that keeps leases, opened from a URL. A Store owns
// one heartbeat that renews every lease taken from it, batched per round trip.
//
// URLs (the README has a section per server store with its URL and parameters):
//   sqlite:///path/to/file.db   the embedded single-host store (the default; see DefaultUrl())
//                               ?scope=host: a file every local user shares (StoreScope)
//   memory://[name]             in-process, for unit tests and examples; handles opened with
//                               the same name in one process share leases
// and, where compiled in (CompiledSchemes()), redis://, postgres://, etcd:// and zk://.
//
// Example:
//
//   auto store = leasehold::Store::Open("sqlite:///var/lib/app/leases.db");
//   if (!store.ok()) return store.status();
//   auto lease = (*store)->Acquire("job:invoices", {.ttl = 10s, .wait = 1min});
//   if (!lease.ok()) return lease.status();  // kHeldByAnother, kDeadlineExceeded, ...
//
// Leases keep the store's internals alive: a Lease may outlive the Store it came from.
//
// fork(): a Store belongs to the process that opened it. In a fork() child (without exec) every
// operation returns kFailedPrecondition before it touches a connection, and destroying the
// Store (or returning from main with it) closes nothing: the parent's sessions and leases are
// unaffected. A child that needs leases opens a Store of its own.
//
// Thread safety: thread-safe.

#pragma once

#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "leasehold/check.h"
#include "leasehold/lease.h"
#include "leasehold/lease_info.h"
#include "leasehold/metrics.h"
#include "leasehold/options.h"
#include "leasehold/schedule.h"
#include "leasehold/status.h"

namespace leasehold {

namespace internal {
struct StoreCore;
struct StoreAccess;
}  // namespace internal

class Store {
 public:
  // Opens the store named by `url`. Returns kInvalidArgument for a malformed URL or an unknown
  // scheme, kUnimplemented for a backend not built in, kUnavailable if the store cannot be
  // reached, kPermissionDenied if it refuses access.
  static Result<std::unique_ptr<Store>> Open(std::string_view url, StoreOptions options = {});

  // Returns the URL used when none is given: $LEASEHOLD_STORE if set, else the `store = URL`
  // line of the host's configuration file ($LEASEHOLD_CONFIG, else
  // /etc/leasehold/leasehold.conf, if it exists), else the host-wide embedded store
  // sqlite://$LEASEHOLD_STATE_DIR/leases.db?scope=host (/var/lib/leasehold/leases.db), which
  // every local user shares. kInvalidArgument names the file and line of a configuration line
  // that does not read as `key = value`.
  static Result<std::string> DefaultUrl();

  // Returns `url` with any password masked, as display_url() shows it, without connecting; a URL
  // that does not parse is returned as "(a URL that does not parse)", never as given (it may
  // hold a secret). For messages about a store that could not be opened.
  static std::string RedactUrl(std::string_view url);

  // Returns the URL schemes compiled into the linked library, e.g. {"memory", "sqlite",
  // "redis"}: the stores Open accepts.
  static std::vector<std::string> CompiledSchemes();

  // Returns the SQL a DBA applies to create the schema of the store named by `url`, without
  // connecting (`leasehold schema`). Returns kInvalidArgument for a malformed URL or bad
  // parameters, kUnimplemented for a store that needs no schema, is not compiled in or is
  // unknown.
  static Result<std::string> SchemaSql(std::string_view url);

  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  Store(Store&&) = delete;
  Store& operator=(Store&&) = delete;
  ~Store();

  // Takes the key if its live grants admit this one (LeaseOptions), in one atomic operation.
  // Returns the Lease; kHeldByAnother (with Status::holder() where the store knows it);
  // kInvalidArgument for a bad key or bad options; kUnavailable; kPermissionDenied.
  Result<Lease> TryAcquire(std::string_view key, const LeaseOptions& options = {});

  // Like TryAcquire, but waits up to options.wait for the key to become free, using the
  // store's notification where it has one and capped exponential backoff with full jitter
  // otherwise. Returns kDeadlineExceeded when the wait runs out, kCancelled when `cancel`
  // is requested; other errors as TryAcquire. Transient store errors are retried while waiting.
  Result<Lease> Acquire(std::string_view key, const LeaseOptions& options = {},
                        std::stop_token cancel = {});

  // Claims the current slot of `grid` for `key` (leasehold/schedule.h): names the slot on the
  // store's wall clock (the local one where the store has none), returns an unclaimed
  // SlotClaim if the key's record shows the slot done, else takes the lease as Acquire does
  // (waiting up to options.wait; 0 tries once) and checks the record again under it. After a
  // wait it names the slot again, and claims the one it stands in by then.
  // Returns kHeldByAnother (or kDeadlineExceeded after a wait) while another host runs it;
  // kInvalidArgument for a bad key or grid; other errors as Acquire.
  Result<SlotClaim> ClaimSlot(std::string_view key, const SlotGrid& grid,
                              const LeaseOptions& options = {}, std::stop_token cancel = {});

  // Returns the key's recorded slot runs, newest first (empty if none, or the record expired).
  Result<std::vector<SlotRun>> SlotRuns(std::string_view key);

  // Returns the recorded slot runs of every key that starts with `prefix` and has a record
  // (held or free), ordered by key.
  Result<std::vector<KeySlotRuns>> ListSlotRuns(std::string_view prefix = {});

  // Returns the live grant of `key` (of a shared or semaphore key: its holder of the lowest
  // slot), or nullopt if the key is free.
  Result<std::optional<LeaseInfo>> Inspect(std::string_view key);

  // Returns every live grant of `key`, ordered by slot: one for an exclusive lease, each
  // holder of a shared or semaphore key. Empty if the key is free. On sqlite://, grants whose
  // holder is gone follow (LeaseInfo::holder_gone: nothing counts them as held). Last, where
  // the store records one, the writer waiting for the key (LeaseInfo::waiting_writer): a
  // waiting exclusive Acquire's writer intent (every store with fair=false), or on ZooKeeper
  // the first exclusive request queued behind the grants; not a grant, and listed alone on a
  // free key whose writer died waiting, until its intent expires. The fair queues of Redis
  // and etcd (fair=true) are not shown.
  Result<std::vector<LeaseInfo>> Holders(std::string_view key);

  // Returns the live grants whose keys start with `prefix`, ordered by key, then slot.
  Result<std::vector<LeaseInfo>> List(std::string_view prefix = {});

  // Operator break-glass: deletes every grant of `key` whoever holds it. The holders find out
  // at their next renewal and stop. The fencing counter is kept. Returns true if a live grant
  // was deleted, false if the key was free. The library never calls this itself.
  Result<bool> ForceRelease(std::string_view key);

  // As ForceRelease, for the one grant of `key` whose owner token starts with `token_prefix`
  // (LeaseInfo::token_prefix): the key's other holders keep theirs. Returns true if it was
  // deleted, false if no live grant of the key has that prefix; kInvalidArgument for a prefix
  // that is not 1..32 lowercase hex digits.
  Result<bool> ForceReleaseGrant(std::string_view key, std::string_view token_prefix);

  // The store doctor (leasehold/check.h): times the store's round trip and a full acquire ->
  // renew -> release cycle on a throwaway key, reads its clock, asks it about durability,
  // topology and permissions, and advises a TTL. A store that cannot be reached, or refuses a
  // step, is a finding of the report (kUnreachable, kPermissionDenied), not an error. Its calls
  // share the handle's connections: on a handle that holds postgres:// advisory leases, they can
  // delay those leases' renewals by up to two command timeouts (run it on a handle of its own).
  // Returns kInvalidArgument for bad options only.
  Result<CheckReport> Check(const CheckOptions& options = {});

  // Blocks until the store reports that the grant of `key` may have changed (released or
  // expired; a store never reports "acquired"), `deadline` passes or `cancel` is requested.
  // Spurious wake-ups are allowed: read the key again (Inspect) after every return. `deadline`
  // is on clock(). Returns OK when woken, kDeadlineExceeded, kCancelled; kUnimplemented if the
  // store has no change notification (notifies_changes() is false): poll Inspect instead, or
  // for a key this handle holds where notifies_holder() is false; kInvalidArgument for a bad
  // key; kUnavailable.
  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token cancel = {});

  // Returns true if the store notifies changes of a key (WaitForChange, and the waits of
  // Acquire), false if waiting means polling.
  [[nodiscard]] bool notifies_changes() const;

  // Returns true if WaitForChange also wakes the holder of a key (a handle waiting on a key it
  // holds) when its grant is ended behind it (`leasehold release --force`, ForceRelease), so
  // that it can Confirm and stop at once instead of at its next renewal; `leasehold run` and
  // `elect` do. False without notification and on PostgreSQL advisory mode, where such a wait
  // returns kUnimplemented.
  [[nodiscard]] bool notifies_holder() const;

  // Returns true if Lease::Write of this store takes ops of `kind` (leasehold/fenced_write.h).
  [[nodiscard]] bool SupportsFencedOp(FencedOp::Kind kind) const;

  // Returns the name to give data key `name` so that the store keeps it beside the grants of
  // lease `key` (Lease::DataKey, for code that names its data before it holds the lease): for
  // Redis "{<hex key>}:<prefix>:<name>", in the lease's hash slot, as a Redis Cluster needs for
  // a fenced
  // write; for every other store `name` unchanged.
  [[nodiscard]] std::string DataKey(std::string_view key, std::string_view name) const;

  // Returns false if this store's fencing counters restart from zero when the store restarts
  // (redis:// with persistence off, as Open found it; memory://): a storage layer outside the
  // store that compares tokens (leasehold/fencing.h) may then see a new grant with a token it
  // has already seen. Lease::Write is not affected (it checks the grant, not the number).
  [[nodiscard]] bool fencing_survives_restart() const;

  // Returns which processes this store's leases exclude (StoreScope): for an embedded file, as
  // its mode was when the store was opened.
  [[nodiscard]] StoreScope scope() const;

  // Returns the clock every deadline and time of this handle is on (StoreOptions::clock, or
  // Clock::Real()): safe_until, WaitForChange's deadline, the waits of Acquire.
  [[nodiscard]] Clock& clock() const;

  // Returns the backend's scheme, e.g. "sqlite".
  [[nodiscard]] std::string_view backend_name() const;

  // Returns the URL with any password masked, for logs and status output.
  [[nodiscard]] const std::string& display_url() const;

  // Returns the registry this handle records its metrics into (StoreOptions::metrics, or the
  // handle's own). Never null; it stays valid after the Store is destroyed.
  [[nodiscard]] const std::shared_ptr<Metrics>& metrics() const;

 private:
  friend struct internal::StoreAccess;

  explicit Store(std::shared_ptr<internal::StoreCore> core);

  // OK, or kFailedPrecondition in a fork() child of the process that opened this Store.
  Status Usable() const;

  // TryAcquire as one attempt of a waiting Acquire (waiter_id non-empty) or alone (empty),
  // under `owner_token` (a fresh one from internal::NewOwnerToken).
  Result<Lease> TryAcquireAs(std::string_view key, const LeaseOptions& options,
                             const std::string& waiter_id, const std::string& owner_token);

  // Logs (and, where the store notifies waiters, times) the grant that ended a wait.
  void LogHandoff(const Lease& lease, Duration waited, std::optional<Duration> handoff);

  std::shared_ptr<internal::StoreCore> core_;
};

// Checks that `key` is a valid lease key: 1..512 bytes of valid UTF-8 without control
// characters (C0 including NUL, DEL, C1). Returns kInvalidArgument saying which rule it breaks
// (for a control character: which one, at which byte).
Status ValidateKey(std::string_view key);

// The longest holder identity (LeaseOptions::holder), in bytes.
inline constexpr std::size_t kMaxHolderBytes = 256;

// Checks that `holder` is a valid holder identity: at most kMaxHolderBytes of valid UTF-8
// without control characters (empty means the default, LeaseOptions::DefaultHolder()).
// Returns kInvalidArgument saying which rule it breaks.
Status ValidateHolder(std::string_view holder);

}  // namespace leasehold
