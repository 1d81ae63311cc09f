// File: backends/backend.h (internal)
//
// Backend: the one interface every store implements. The core (Store, Lease, heartbeat) owns
// owner tokens, safe_until and retries; a backend only performs single atomic operations on its
// store and reports what the store said. Every mutation is one atomic store operation (a Lua
// script, a SQL transaction, an etcd Txn...): a read-then-write from the client is a bug.
//
// Error codes, for every method: kUnavailable when the store cannot be reached or does not
// answer within the backend's own timeouts (every call is bounded); kPermissionDenied when the
// store refuses access; kInternal for an unexpected reply. Others are listed per method.
//
// Time, for every method: a backend is opened on a Clock (Open<Store>Backend(url, clock), the
// Store's StoreOptions::clock) and reads time only from it. Every SteadyTime it receives (the
// deadline of WaitForChange and WaitForTurn) is on that clock, and so is every SteadyTime it
// computes (a retry time, a condition-variable wait through ToSteady, backends/common/time.h).
// For every store but memory:// that clock is Clock::Real(): their grants expire on a clock
// outside the process (the server's, or CLOCK_BOOTTIME written into a shared SQLite file), so
// the registry refuses any other. Durations (ttl, keep, record_ttl) are counted by the store, on
// its own clock, from the moment it applies the operation, which is never before the core's
// t_send. SystemTime (StoreTime, schedule records) is wall-clock time, never used for safety.
//
// Thread safety: implementations must be thread-safe (the heartbeat thread and callers use one
// backend concurrently) and say how in their class comment.

#pragma once

#include <atomic>
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

#include "backends/common/store_clock.h"
#include "backends/facets/doctor.h"
#include "backends/facets/fenced_write.h"
#include "backends/facets/records.h"
#include "backends/facets/wait.h"

namespace leasehold::internal {

struct LeaseMetrics;

// What a backend can do, for the core and for the conformance suite's capability predicates
// (in the manner of Arrow's GenericFileSystemTest).
struct Capabilities {
  // Which processes share the store's leases (memory://: this process only).
  StoreScope scope = StoreScope::kFleet;
  // The wait facet's WaitForChange also wakes a handle that waits on a key it holds itself when
  // the grant is ended behind it (ForceEnd), so that the holder learns before its next renewal
  // (Store::notifies_holder). Where false, WaitForChange on a key this handle holds returns
  // kUnimplemented. PostgreSQL advisory mode: false (a grant is its holder's session,
  // which only the renewals watch).
  bool notifies_holder = false;
  // The fencing counter survives a restart of the store.
  bool fencing_survives_restart = true;
  // Waiters are queued in the store and granted the key first come, first served: a TryAcquire
  // without a waiter_id, or from a waiter behind the head of the queue, does not barge ahead.
  bool fair_queue = false;
  // TryAcquire honours GrantRequest::mode and GrantRequest::limit ("Shared leases" below);
  // false: the core refuses a shared or semaphore lease with kUnimplemented before calling it.
  bool shared_leases = false;
  // The store frees a grant as soon as its holder is gone (every process that has the holder's
  // HolderLivenessFd open has exited), not a TTL later: sqlite://, on one host.
  bool holder_liveness = false;
  // Without shared_leases: why, and what to use instead, for the core's refusal (a static
  // string; empty: "the <scheme> store has no <kind> leases").
  std::string_view no_shared_leases_why;
};

// Shared leases. A key's live grants are all of one family: read/write (exclusive and shared
// grants, limit 1) or one semaphore (limit N > 1, every grant asking the same N). TryAcquire
// admits a request, in the same atomic step that creates its grant, when:
//   exclusive (limit 1)  the key has no live grant at all;
//   shared               the key has no live exclusive grant and no live writer intent of
//                        another waiter (below);
//   semaphore N          the key has fewer than N live grants.
// It refuses with kHeldByAnother (holder: the live grant with the lowest slot, or for a
// writer intent the waiting writer's identity) when the family matches but there is no room,
// and with LimitMismatch (kInvalidArgument) when a live grant is of the other family or asks
// another N: a semaphore and an exclusive or shared grant, or two semaphores of different N.
// Each admitted grant gets the smallest slot no live grant of the key has, and a fencing token
// from the key's one counter (strictly increasing across every grant of every kind). The rule is
// written once in C++, common/admission.h (Admit, Ahead), which the stores that decide in C++
// call; the Lua and SQL that decide inside a server name the clauses they mirror.
//
// Writer preference. An exclusive request with a waiter_id (a waiting Store::Acquire) that is
// refused records a writer intent for the key in the same step: {waiter_id, holder, expiry =
// now + ttl}, unless a live intent of another waiter exists (one intent per key: the first
// waiting writer's). The intent is refreshed by every attempt of its waiter (the core retries
// at least every ttl/3 while it waits), deleted when that waiter is granted the key or calls
// AbandonWait, and otherwise expires by itself: a writer that crashed while waiting holds
// readers off for at most its ttl. Plain TryAcquire (no waiter_id) records no intent.
// On a fair store (Capabilities::fair_queue) the queue gives the same order instead: a request
// is admitted only if the grants above allow it and every waiter ahead of it in the queue is
// admitted with it (for a semaphore: it is among the first N - live waiters; shared: every
// waiter ahead is shared); an exclusive waiter ahead keeps later shared ones out.
//
// RenewMany, Finish and FencedWrite name a grant by (key, owner_token), whatever its kind: one
// of several grants of the key. Holders returns every live grant of the key, ordered by slot;
// List every live grant of every key.

// A grant kept after its holder (Finish with keep > 0) carries its holder's owner token plus this
// suffix, which no owner sends, so no renewal or release in flight can touch it (sqlite,
// memory, Redis, PostgreSQL, etcd; ZooKeeper keeps it in a node of its own). A holder listing
// written in SQL or Lua returns such a grant's token prefix with the suffix appended, and
// TakeKeptMark moves it to LeaseInfo::kept.
inline constexpr std::string_view kKeptTokenSuffix = ":kept";

// The grant Backend::Inspect returns from a Holders listing: its first live grant, passing over
// grants whose holder is gone and the waiting writer; nullopt if there is none.
std::optional<LeaseInfo> FirstGrant(std::vector<LeaseInfo> holders);

// If `info.token_prefix` ends with kKeptTokenSuffix: removes it and sets `info.kept`.
void TakeKeptMark(LeaseInfo& info);

// The message of a TryAcquire refused because the key's live grants disagree with the request:
// kInvalidArgument "lease <key> is held as <held kind/limit> by <holder>; this acquire asked for
// <asked>: every holder of a key must ask for the same kind and limit". `holder` may be empty.
Status LimitMismatch(std::string_view key, LeaseMode held_mode, std::uint32_t held_limit,
                     std::string_view holder, LeaseMode asked_mode, std::uint32_t asked_limit);

struct GrantRequest {
  std::string key;
  // 32 lowercase hex digits from the OS CSPRNG. Never logged in full.
  std::string owner_token;
  // Free-form identity shown to others (LeaseOptions::holder).
  std::string holder;
  Duration ttl{};
  // Set by Store::Acquire: the same random id for every attempt of one waiting call, so that a
  // fair store can keep the caller's place in its queue. Empty for a plain TryAcquire.
  std::string waiter_id;
  // How the grant shares the key ("Shared leases" above). Validated by the core:
  // 1 <= limit <= kMaxLeaseLimit, limit == 1 for kShared, and only when
  // Capabilities::shared_leases, else always {kExclusive, 1}.
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t limit = 1;
};

struct Grant {
  FencingToken fencing_token = 0;
  // The TTL the store actually granted, counted from a time no earlier than the core's t_send;
  // the core computes safe_until from it. A store may round it up (etcd: whole seconds,
  // >= 2 s) or report less than asked (etcd's spare lease: its TTL less its age).
  Duration ttl{};
  // Where the store keeps this grant (Lease::store_key): the Redis hash, the etcd key, the
  // ZooKeeper node of this grant. Empty: the lease key itself (the SQL stores, memory://).
  std::string store_key;
  // The grant's slot (LeaseInfo::slot): 0 for an exclusive grant, 0..limit-1 for a semaphore.
  std::uint32_t slot = 0;
};

struct RenewRequest {
  std::string key;
  std::string owner_token;
  Duration ttl{};
};

// The longest keep and record_ttl Backend::Finish accepts (four years: a record lives two
// slot periods of at most a year each; every store's expiry arithmetic stays far from overflow).
inline constexpr Duration kMaxFinishDuration = std::chrono::hours(24 * 366 * 4);

// The largest record Backend::Finish accepts (a key's schedule record is a few hundred bytes).
inline constexpr std::size_t kMaxRecordBytes = 4096;

// How a grant ends (Backend::Finish): deleted or left to expire by itself, and optionally with
// the key's record replaced in the same atomic step.
struct FinishRequest {
  std::string key;
  std::string owner_token;
  // Zero: the grant is deleted, as by Release. Positive: the grant is not deleted; it stays
  // live, with its holder and fencing token, until `keep` from now on the store's clock (rounded
  // up to the store's granularity), without renewal and without any session or connection of
  // the caller, then expires by itself. Nobody renews it any more: not even a renewal of the
  // owner's that was already on its way (the heartbeat does not wait for one in flight), so a
  // store must make the kept grant unrenewable in the same step.
  // REQUIRES: 0 <= keep <= kMaxFinishDuration.
  Duration keep{};
  // If set, replaces the key's record (Backend::ReadRecord), only if the owner token matches,
  // in the same atomic step as the end of the grant. Opaque bytes to the backend, at most
  // kMaxRecordBytes. The record is independent of grants: later grants, releases, expiry and
  // force-release leave it alone; it expires `record_ttl` from now on the store's clock
  // (rounded up to the store's granularity), or when replaced.
  std::optional<std::string> record;
  // REQUIRES: 0 < record_ttl <= kMaxFinishDuration when record is set.
  Duration record_ttl{};
};

// Checks a FinishRequest's keep, record size and record_ttl (every backend's Finish calls it
// before touching the store).
Status CheckFinishRequest(const FinishRequest& request);

// The facets a backend hands out beside its grant core (null: it has none). Each points into
// the backend itself (or into an object it owns) and lives as long as it.
struct Facets {
  WaitFacet* wait = nullptr;
  RecordsFacet* records = nullptr;
  FencedWriteFacet* fenced_write = nullptr;
  DoctorFacet* doctor = nullptr;
};

// A backend is the grant core below (nine virtual methods, all but facets() pure) plus the
// facets above. The non-virtual methods after the core are what the core and the tests call:
// each is the core operation it names, or a facet's method with the store-independent answer
// where the backend has no such facet.
class Backend {
 public:
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  Backend(Backend&&) = delete;
  Backend& operator=(Backend&&) = delete;
  virtual ~Backend() = default;

  // ---- The grant core.

  // Returns the URL scheme, e.g. "sqlite".
  [[nodiscard]] virtual std::string_view scheme() const = 0;

  [[nodiscard]] virtual Capabilities capabilities() const = 0;

  // The facets this backend has. The default: none.
  virtual Facets facets() { return {}; }

  // Creates the grant if the key's live grants admit it (exclusive: none; shared and semaphore:
  // the admission rule above), binds it to request.owner_token and bumps the key's fencing
  // counter, all in one atomic step. The key has been validated. Returns kHeldByAnother, with
  // Status::holder() set where the store keeps the holder's identity, when they do not.
  virtual Result<Grant> TryAcquire(const GrantRequest& request) = 0;

  // Extends each grant to its request's ttl from now (on the store's clock) only if it is live
  // and its owner token matches, in one round trip where the store allows. Returns one Status
  // per request, in order: kLost if the grant is absent, expired or someone else's.
  virtual std::vector<Status> RenewMany(std::span<const RenewRequest> requests) = 0;

  // Ends the grant as `request` says (see FinishRequest: deleted, or kept without its holder,
  // with the key's record replaced if one is given), only if request.owner_token matches.
  // Returns OK if a live grant of the caller's was ended; kLost if the grant was absent, expired
  // or someone else's (nothing is written: neither the grant nor the record changes);
  // kInvalidArgument for a keep, record or record_ttl CheckFinishRequest refuses; kUnimplemented
  // for a keep or a record on a store that keeps neither. Wakes waiters when the grant is
  // deleted.
  virtual Status Finish(const FinishRequest& request) = 0;

  // Returns every live grant of `key`, ordered by slot (empty if the key is free), and, on a
  // store that can tell, the grants not yet expired whose holder is gone (holder_gone), which
  // List and TryAcquire do not count. Last, where the store records one, the writer
  // waiting for the key (waiting_writer: its live writer intent, "Writer preference" above, or
  // on ZooKeeper the first exclusive request queued behind the grants): no grant, fencing
  // token 0, `remaining` its intent's time left (ZooKeeper: the writer's TTL, an upper
  // bound). A free key can list a waiting writer alone: one that died waiting, until its
  // intent expires. The fair queues of Redis and etcd (fair=true) are not shown.
  virtual Result<std::vector<LeaseInfo>> Holders(std::string_view key) = 0;

  // Returns the live grants whose keys start with `prefix`, ordered by key, then slot: every
  // holder of a shared or semaphore key.
  virtual Result<std::vector<LeaseInfo>> List(std::string_view prefix) = 0;

  // Deletes, whoever holds it, every live grant of `key` (token_prefix empty), or the one whose
  // owner token starts with `token_prefix` (LeaseInfo::token_prefix, 8 hex digits), in one
  // atomic step; the fencing counter is kept (and a writer intent is left to expire). Wakes
  // waiters as Finish. Returns true if a live grant was deleted, false if none matched.
  virtual Result<bool> ForceEnd(std::string_view key, std::string_view token_prefix) = 0;

  // ---- The calls.

  // Renews one grant: RenewMany of one.
  Status Renew(const RenewRequest& request);

  // Deletes the grant only if its owner token matches: Finish with nothing kept.
  Status Release(std::string_view key, std::string_view owner_token);

  // Returns the live grant of `key` with the lowest slot, or nullopt if there is none
  // (FirstGrant of Holders).
  Result<std::optional<LeaseInfo>> Inspect(std::string_view key);

  // ForceEnd of every grant of `key`.
  Result<bool> ForceRelease(std::string_view key);

  // ForceEnd of the one grant whose owner token starts with `token_prefix` (not empty).
  Result<bool> ForceReleaseGrant(std::string_view key, std::string_view token_prefix);

  // The records facet's: kUnimplemented without one, and the local wall clock (from_store
  // false) for WallClock.
  Result<std::optional<std::string>> ReadRecord(std::string_view key);
  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(std::string_view prefix);
  Result<StoreTime> WallClock();

  // The fenced-write facet's: kUnimplemented without one, no op kinds and no prefix.
  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request);
  [[nodiscard]] unsigned fenced_ops();
  [[nodiscard]] std::string DataKeyPrefix(std::string_view key);

  // The doctor facet's: kUnimplemented without one for Ping, no findings for Diagnose.
  Status Ping();
  Result<Diagnosis> Diagnose();

  // The wait facet's: kUnimplemented without one (the core polls), nothing to abandon.
  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop);
  Status WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                     std::stop_token stop);
  void AbandonWait(std::string_view key, std::string_view waiter_id);

  // ---- Observations.

  // Where the backend counts the store failovers it notices (a new primary, a new timeline:
  // leasehold_store_failovers_total). Set by the Store that opens it; nullptr: not recorded.
  void set_metrics(LeaseMetrics* metrics) { metrics_.store(metrics, std::memory_order_release); }

  // The store server's wall clock as this backend read it in its renewals' round trips
  // (backends/common/store_clock.h): Redis and PostgreSQL table mode read it, the others expire
  // grants on clocks no wall step reaches. The heartbeat reads steps() around each round. A
  // decorator shows the watch of the backend it wraps (ShareStoreClock).
  [[nodiscard]] const StoreClockWatch& store_clock() const { return *store_clock_view_; }

  // A descriptor whose open file description proves this process's grants alive to the other
  // processes of the host, on a store that judges holders by it (sqlite://,
  // Capabilities::holder_liveness); -1 elsewhere. A process that forks a guard which must keep
  // the grants alive after it dies keeps it open there (it is close-on-exec).
  [[nodiscard]] int HolderLivenessFd() const { return holder_liveness_fd_; }

 protected:
  // Counts a store failover the backend noticed, where metrics are recorded (set_metrics).
  void CountStoreFailover();

  // A reading of the store's wall clock taken in a renewal's round trip, judged against the
  // previous one: a step is logged (store_clock_jump, a warning) and counted
  // (leasehold_store_clock_jumps_total), and the heartbeat acts on it (store_clock()).
  void ObserveStoreTime(const StoreTimeReading& reading);

  // Makes store_clock() and HolderLivenessFd() show `inner`'s (ForwardingBackend). `inner`
  // outlives this.
  void ShareObservations(const Backend& inner) {
    store_clock_view_ = &inner.store_clock();
    holder_liveness_fd_ = inner.HolderLivenessFd();
  }

  // Makes store_clock() show this backend's own watch again: a decorator that reads a store
  // clock of its own (ObserveStoreTime) after ShareObservations.
  void UseOwnStoreClock() { store_clock_view_ = &store_clock_; }

  // Set once, by a backend with Capabilities::holder_liveness, before it is shared.
  void set_holder_liveness_fd(int fd) { holder_liveness_fd_ = fd; }

  // RenewMany by `renew_one` for each request in turn, for a store with no batch.
  template <typename RenewOne>
  static std::vector<Status> RenewEach(std::span<const RenewRequest> requests,
                                       RenewOne&& renew_one) {
    std::vector<Status> results;
    results.reserve(requests.size());
    for (const RenewRequest& request : requests) {
      results.push_back(renew_one(request));
    }
    return results;
  }

 private:
  std::atomic<LeaseMetrics*> metrics_{nullptr};
  StoreClockWatch store_clock_;
  const StoreClockWatch* store_clock_view_ = &store_clock_;
  int holder_liveness_fd_ = -1;
};

}  // namespace leasehold::internal
