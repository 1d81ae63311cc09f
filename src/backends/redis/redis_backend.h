// File: backends/redis/redis_backend.h (internal)
//
// RedisBackend: the redis:// store. Each exclusive grant is a hash at
// "<prefix>:{<hex key>}" (fields token, holder, fence, ttl) with a PEXPIRE; each key's fencing
// counter is a plain integer at "<prefix>:{<hex key>}:fence" that is never deleted; a release
// publishes on "<prefix>:{<hex key>}:released". The lease name is hex-encoded inside the
// {hash tag}, so any UTF-8 name (including '{', '}', '*', '[') gives one well-formed tag, the
// lease, fence counter and channel share one cluster slot, and a prefix scan needs no glob
// escaping of the name. Every mutation is one Lua script (redis_scripts.h) run with EVALSHA,
// reloaded by itself after NOSCRIPT (server restart, SCRIPT FLUSH). With fair=true, waiters
// also queue in "<prefix>:{<hex key>}:queue" (plus ":queue:expiry" and ":queue:seq", same hash
// tag), and the key goes to the head of the queue only (redis_scripts.h, kFairAcquireScript).
// Shared and semaphore grants (Capabilities::shared_leases) live in the same hash, one field per
// grant, with the writer intent of fair=false at "<prefix>:{<hex key>}:intent" (layout and
// reasons: redis_scripts.h).
// A key's record (Backend::Finish) is a string at "<prefix>:{<hex key>}:record" with its own
// PEXPIRE, beside the grant and under the same hash tag, so that the finish script can end the
// grant and replace the record in one atomic step (in a cluster too); no grant's end touches it.
//
// Fenced writes (Lease::Write): one script checks that the grant hash still holds the caller's
// owner token and applies the ops (SET, DEL, HSET) to the caller's data keys, all or none. Data
// keys are any names outside "<prefix>:"; the grant hash's name is Grant::store_key
// (Lease::store_key()). Lease::DataKey names a data key with the lease's "{<hex key>}" hash tag
// (DataKeyPrefix), in the lease's cluster slot, which a cluster requires.
//
// Fencing tokens survive a restart only if the server persists its data (AOF or RDB): with
// persistence off the counters restart from zero. Open() checks with CONFIG GET where the ACL
// allows it and warns once per server and process. Fenced writes are not affected: they compare
// the owner token, which never repeats, so a restart ends every grant's right to write.
//
// The store doctor (leasehold check): Ping is one PING (per master in a cluster); Diagnose reads
// the same CONFIG GET settings (with appendfsync) and INFO's version and replication in one
// round trip per master, and names the exact ACL the backend needs (PermissionsFix).
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("redis://app:secret@127.0.0.1:6379/0"));
//   LH_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenRedisBackend(url));
//   Result<Grant> grant = backend->TryAcquire(
//       {.key = "job:x", .owner_token = token, .holder = "web-3:42", .ttl = 10s});
//
// Time: every deadline the backend receives and every time it computes (retry times, wake-ups)
// is on the Clock it was opened with. The grants themselves expire on the server's clock
// (PEXPIRE), outside the process, which is why the registry opens redis:// with Clock::Real()
// only.
//
// Redis Cluster (redis+cluster://): every command goes to the master of its key's slot
// (RedisRouter, redis_cluster.h); List and ListRecords SCAN every master; a fenced write's data
// keys must share the lease's slot (DataKeyPrefix).
//
// Thread safety: thread-safe. Connections are not, so commands borrow a connection from
// a small pool per node (RedisOptions::pool_size, redis_connection.h) and waiters share one
// subscriber connection (redis_subscriber.h), read by one std::jthread owned by the backend and
// joined in its destructor. A broken connection is dropped and a new one is opened on the next
// call, with capped exponential backoff between failed connects.

#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
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
#include "backends/redis/redis_options.h"
#include "core/url.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// redis_connection.h and redis_subscriber.h; kept out of this header so that hiredis stays
// inside backends/redis.
class RedisConnectionPool;
class RedisRouter;
class RedisSubscriber;

// Opens the store named by `url` (a redis, rediss, redis+unix, redis(s)+sentinel or
// redis(s)+cluster URL) and checks it at once.
// Returns kInvalidArgument for a bad URL; kUnavailable if the server cannot be reached within
// connect_timeout; kPermissionDenied for wrong credentials or an ACL that forbids a command the
// backend needs (the message names it). Messages never contain the password. `clock` must
// outlive the backend.
Result<std::shared_ptr<Backend>> OpenRedisBackend(const Url& url, Clock& clock = Clock::Real());

class RedisBackend final : public Backend,
                           public WaitFacet,
                           public RecordsFacet,
                           public FencedWriteFacet,
                           public DoctorFacet {
 public:
  // What the backend has done so far, for tests and the benchmark.
  struct Stats {
    // Pipelined batches sent and answered: one per operation, one per RenewMany call (in a
    // cluster, one per round of a batch sent to all its nodes at once), plus one per NOSCRIPT
    // recovery or redirection round.
    std::uint64_t round_trips = 0;
    // Connections opened, the subscriber's included.
    std::uint64_t connects = 0;
    // SCRIPT LOAD batches sent (one per master at open, one per NOSCRIPT recovery).
    std::uint64_t script_loads = 0;
    // Cluster: reads of the slot map (CLUSTER SLOTS), the one at open included.
    std::uint64_t slot_map_reads = 0;
  };

  // Connects, authenticates, selects the database, loads the scripts and checks persistence.
  // Every time the backend reads comes from `clock`, which must outlive it.
  static Result<std::shared_ptr<RedisBackend>> Open(RedisOptions options,
                                                    Clock& clock = Clock::Real());

  ~RedisBackend() override;

  [[nodiscard]] std::string_view scheme() const override { return "redis"; }

  // The wait facet: pub/sub. fencing_survives_restart: false only when Open() saw persistence off.
  [[nodiscard]] Capabilities capabilities() const override;

  Facets facets() override {
    return {.wait = this, .records = this, .fenced_write = this, .doctor = this};
  }

  [[nodiscard]] unsigned fenced_ops() const override;

  // One script (kAcquireScript, or kFairAcquireScript with fair=true) admits the request by
  // mode and limit and makes the grant (backend.h, "Shared leases"). Returns kHeldByAnother with
  // the LeaseInfo of the lowest slot (remaining from the server's clock), or of the waiting
  // writer whose intent keeps a shared request out; LimitMismatch when the key's grants are of
  // the other family or limit. With min_replicas, a grant that too few replicas confirm is
  // undone and kUnavailable returned.
  // Grant::store_key is the grant hash (LeaseKeyName). fair=true, with a waiter id: a grant a
  // release handed to this waiter (heard by WaitForTurn, or found by this attempt) is returned
  // with Grant::ttl counted from the waiter's own latest queue refresh (TakeHanded), without a
  // round trip when WaitForTurn heard it.
  Result<Grant> TryAcquire(const GrantRequest& request) override;

  // Renews every request with one pipelined round trip (plus one more after NOSCRIPT). If the
  // round trip fails, every request gets that error.
  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override;

  // One script (redis_scripts.h, kFinishScript): compare the owner token, replace the record
  // (SET PX), then delete the grant and publish as Release does, or PEXPIRE it to `keep`. keep
  // and record_ttl are rounded up to whole milliseconds. Like Release, it does not WAIT for
  // replicas with min_replicas. fair=true without keep: kFairEndScript, which also hands the
  // key to the head waiter.
  Status Finish(const FinishRequest& request) override;

  // One GET of the record key.
  Result<std::optional<std::string>> ReadRecord(std::string_view key) override;

  // Walks the keyspace with SCAN (never KEYS) for record keys and GETs the values found in one
  // pipeline per SCAN page, on one borrowed connection; every round trip is bounded by
  // command_timeout. A record that expires during the walk is left out.
  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override;

  // One script (redis_scripts.h, kFencedWriteScript): compare the grant hash's owner token,
  // check every op could succeed (an HSET target's type, the ACL), then SET, DEL or HSET each
  // data key. Returns kInvalidArgument, before sending, for a data key under "<prefix>:" (the
  // store's own keys), and for an HSET onto a key that holds something other than a hash;
  // kPermissionDenied if the ACL forbids an op's command or key. With min_replicas it WAITs as
  // Finish does, and reports kUnavailable (the write applied on the master) if too few confirm.
  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) override;

  // "{<hex key>}:<prefix>:": the key's hash tag, so a data key named with it shares the grant's
  // slot, and the store's prefix, so that each namespace's data is its own.
  [[nodiscard]] std::string DataKeyPrefix(std::string_view key) const override;

  // The server's TIME, one round trip.
  Result<StoreTime> WallClock() override;

  // PING on a pooled command connection: one round trip, bounded by command_timeout (plus
  // connect_timeout if the pool has to open a connection first); in a cluster, on each master
  // in turn.
  Status Ping() override;

  // One pipelined round trip (per master in a cluster, each item then named by its node):
  // CONFIG GET appendonly/save/appendfsync (as Open) and INFO server,
  // persistence and replication. Items: durability (AOF and its appendfsync, RDB only, or
  // nothing), topology (version, role, replicas against min_replicas); a setting the ACL user
  // may not read is a kWarn naming it. permissions_fix is PermissionsFix(). Returns kUnavailable
  // if the server does not answer.
  Result<Diagnosis> Diagnose() override;

  // The ACL SETUSER line that grants this handle's user (URL user, else "default") every
  // command the backend sends, for its prefix, db, fair and min_replicas.
  [[nodiscard]] std::string PermissionsFix() const;

  // One script (kHoldersScript): every live grant of the key, by slot, read with the time left
  // in one atomic step; the dead ones skipped.
  Result<std::vector<LeaseInfo>> Holders(std::string_view key) override;

  // Walks the keyspace with SCAN (never KEYS) and reads the grants found (every grant of a
  // shared or semaphore key, by slot) in one pipeline per SCAN page.
  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override;

  // ForceReleaseAll, or with a token prefix ForceReleaseOne.
  Result<bool> ForceEnd(std::string_view key, std::string_view token_prefix) override;

  // fair=true: removes `waiter_id` from the key's queue in one script, and wakes the waiters if
  // the key is free and others are still queued (the next one may now be the head). If a
  // release had already handed this waiter the key, ends that grant and hands it on (one more
  // round trip). Best effort: on failure the entry expires by itself (a handed grant, after its
  // TTL). With fair=false: clears the waiter's writer intent (kClearIntentScript, waking the
  // readers it kept out) if one of its attempts here recorded one; otherwise sends nothing.
  void AbandonWait(std::string_view key, std::string_view waiter_id) override;

  // Subscribes (on the shared subscriber connection) to the key's release channel, then reads
  // its PTTL, then blocks until a release message, the grant's remaining TTL plus jitter,
  // `deadline` or `stop`. If the subscriber connection is down it polls every 100 ms instead.
  // With fair=true it reads the queue too: if the key is free but queued for someone else, it
  // also wakes when the head's entry would expire, and re-checks at least every 100 ms (the
  // caller, whose waiter id it does not know, may have become the head meanwhile).
  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) override;

  // As WaitForChange; with fair=true it returns at once if the key is free and `waiter_id`
  // heads the queue, or a release handed it the key, and otherwise needs no 100 ms re-check:
  // every way the head can change (release, abandon-wait, the head's entry expiring) either
  // publishes or is timed. A "handed" message naming `waiter_id` is kept for the next
  // TryAcquire; one naming another waiter does not end the wait (the key is held again, and
  // this waiter's place is unchanged): it sleeps on to the next message or that grant's TTL.
  Status WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                     std::stop_token stop) override;

  [[nodiscard]] Stats stats() const;

  [[nodiscard]] const RedisOptions& options() const { return options_; }

  // Redis key and channel names for `key` under `prefix`, exposed for tests.
  static std::string LeaseKeyName(std::string_view prefix, std::string_view key);
  static std::string FenceKeyName(std::string_view prefix, std::string_view key);
  static std::string ChannelName(std::string_view prefix, std::string_view key);
  // The key's record (Backend::Finish / ReadRecord).
  static std::string RecordKeyName(std::string_view prefix, std::string_view key);
  // fair=true: the wait queue (zset by arrival), its entries' deadlines (zset) and its arrival
  // counter.
  static std::string QueueKeyName(std::string_view prefix, std::string_view key);
  static std::string QueueExpiryKeyName(std::string_view prefix, std::string_view key);
  static std::string QueueSeqKeyName(std::string_view prefix, std::string_view key);
  // fair=true: what each queued waiter's latest attempt left for a release to grant it the key
  // with (owner token, holder, TTL, t_q; redis_scripts.h, kFairEndScript).
  static std::string QueueDataKeyName(std::string_view prefix, std::string_view key);
  // fair=false: the writer intent of an exclusive waiter (redis_scripts.h, kAcquireScript).
  static std::string IntentKeyName(std::string_view prefix, std::string_view key);

 private:
  // Finish with nothing kept: deletes the grant only if its owner token matches.
  Status Delete(std::string_view key, std::string_view owner_token);

  // fair=true: hands the key to the head waiter in the same script, as Release does.
  Result<bool> ForceReleaseAll(std::string_view key);

  // One script (kForceGrantScript; with fair=true kFairEndScript 'prefix', which hands the room
  // to the head waiters as a release does). kInvalidArgument for an empty prefix.
  Result<bool> ForceReleaseOne(std::string_view key, std::string_view token_prefix);

  RedisBackend(RedisOptions options, Clock& clock, std::shared_ptr<RedisRouter> router,
               bool persistence_off);

  // How long a waiter may sleep before re-checking `key`; nullopt if it should retry at once.
  // `*shared` is set if the key is shared or a semaphore (fair=true: a grant handed to another
  // waiter then does not mean the key has no room left to wait for).
  Result<std::optional<Duration>> TimeToRecheck(std::string_view key, std::string_view waiter_id,
                                                bool* shared);

  // fair=true: a grant a release made to one of this process's waiters inside the release
  // (redis_scripts.h, kFairEndScript), learnt from its "handed" message or from the waiter's
  // own attempt (kFairAcquireScript's reply 2).
  struct Handed {
    FencingToken fencing_token = 0;
    // The send time of the waiter's attempt whose queue entry the release found: the grant's
    // expiry began after it.
    SteadyTime t_q{};
    Duration ttl{};
    std::uint32_t slot = 0;
  };

  // Parses a "handed <waiter id> <fencing token> <t_q> <ttl_ms>" message into handed_.
  void RecordHanded(std::string_view waiter_id, std::string_view payload) LH_EXCLUDES(handed_mu_);

  // Turns a handed grant into the Grant of `request`: with its validity counted from t_q
  // (Grant::ttl = ttl - (now - t_q), now read after the core's t_send), or renewed first when
  // less than 3/4 of the TTL would be left or min_replicas asks for replicas' confirmation.
  // Returns kLost if the renewal finds the grant gone.
  Result<Grant> TakeHanded(const GrantRequest& request, const Handed& handed);

  // One fair end script call (kFairEndScript): `mode` 'owner', 'force' or 'handed'.
  Result<long long> FairEnd(std::string_view key, std::string_view who, std::string_view mode,
                            const std::optional<std::string>& record, Duration record_ttl);

  // Immutable after construction.
  const RedisOptions options_;
  Clock& clock_;
  // Where each command goes: the one server's pool, or a cluster's slot map (redis_cluster.h).
  const std::shared_ptr<RedisRouter> router_;
  // router_'s seed pool: the counters and script SHAs, and the subscriber's connections.
  const std::shared_ptr<RedisConnectionPool> pool_;
  const bool persistence_off_;

  Mutex subscriber_mu_;
  // Started by the first WaitForChange, so that a handle used only for status and list costs
  // no thread; lives until the backend is destroyed.
  std::shared_ptr<RedisSubscriber> subscriber_ LH_GUARDED_BY(subscriber_mu_);

  Mutex handed_mu_;
  // fair=true: waiter id -> the grant a "handed" message reported for it, until its next
  // TryAcquire takes it (no round trip) or its AbandonWait drops it. Only this process's
  // waiters, one entry at most per waiting Acquire call.
  std::map<std::string, Handed, std::less<>> handed_ LH_GUARDED_BY(handed_mu_);

  Mutex intents_mu_;
  // fair=false: the waiter ids whose latest refused attempt recorded (or refreshed) a writer
  // intent, until one is granted or abandons: AbandonWait sends kClearIntentScript only for
  // these, so that a reader's or a plain waiter's give-up costs no round trip.
  std::set<std::string, std::less<>> intents_ LH_GUARDED_BY(intents_mu_);
};

}  // namespace leasehold::internal
