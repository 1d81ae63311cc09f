// File: backends/etcd/etcd_backend.h (internal)
//
// EtcdBackend: the etcd:// store, speaking etcd's v3 gRPC API (the subset in proto/rpc.proto)
// through gRPC C++ (docs/impl.md, "The etcd store", has the design notes). Each grant is the key
// "<prefix>/<lease name>" put with an etcd lease; its value holds the owner token, the granted
// TTL and the holder's identity ("v1\n<token>\n<ttl ms>\n<holder>").
//
//   leases        one etcd lease per TTL class (ceil(ttl) s) shared by every grant of this
//                 backend with that TTL, as etcd's concurrency.Session does
//                 (etcd_spare_leases.h); granted by the first acquire of the class, kept while
//                 keys are on it (and, spare_lease=true, after), revoked when the backend closes.
//   try-acquire   one Txn: if create_revision(key) == 0, Put the key with the class's shared
//                 lease, else Range it (the holder). Fencing token = the key's create revision
//                 (cluster-wide, only grows, survives restarts); Grant::store_key
//                 (Lease::store_key) = the key, "<prefix>/<lease name>". The granted TTL is the
//                 shared lease's TTL less the time since the request that last set it was sent
//                 (etcd raises anything below 2 s to 2 s). A LeaseGrant first only if the class
//                 has no lease yet; a keep-alive first if less than 2/3 of its TTL is left. An
//                 unanswered acquire Txn's key is deleted (compare on its value) before the key's
//                 next acquire or by the next renewal round.
//   shared leases mode/limit (backend.h, "Shared leases"): every key of a lease is
//                 "<prefix>/<name>" (exclusive grants, as in every version) or that, a NUL and
//                 "s/<slot>" (shared), "n/<limit>/<slot>" (semaphore) or "w" (the writer
//                 intent, on its waiter's own etcd lease); one Txn admits a request by
//                 compares on those keys and ranges plus its slot's key (a taken slot fails it
//                 whole: the next Txn tries the smallest free slot read). Fencing token = the
//                 grant key's create revision; Grant::store_key = that key.
//   renew         RenewMany: one keep-alive per shared lease on the backend's one bidirectional
//                 LeaseKeepAlive stream, plus one check Txn per 128 keys (compares
//                 create_revision(key) == ours; if one fails, a read Txn of the keys). A grant is
//                 renewed only if its lease answered TTL > 0 and its key is still ours; TTL <= 0
//                 loses every grant on that lease at once (kSessionLost), a key gone or
//                 re-created loses that grant alone (kStoreSaidNo). Each round also deletes
//                 the grants unconfirmed for a whole TTL (the core has lost them).
//   release       a Txn that deletes the key only if its create revision is still ours (the
//                 lease is shared: never revoked here).
//   wait          Range the lease's keys, then Watch them from the next revision for a delete;
//                 a waiter refused by a Txn watches from that Txn's revision + 1 instead.
//   fair=true     waiters queue as keys "<prefix>\0queue/<name>\0<waiter id>" on leases of their
//                 own; the acquire Txn also compares that no queue entry is older than ours
//                 (or, without a waiter id, that the queue is empty) and deletes our entry:
//                 the head only, for every kind (a shared or semaphore waiter's entry lives its
//                 ttl, an exclusive one's max(ttl, 10 s)); no writer intent is written.
//   fenced write  (Lease::Write) one Txn: if create_revision("<prefix>/<name>") == the fencing
//                 token, the Puts (without an etcd lease) and Deletes in order, else Range the
//                 grant key to name its holder. The compare fails once the grant is gone or
//                 re-created (a higher revision); it still passes between the lease's expiry and
//                 etcd's delete of its key (the leader's expiry check, every 500 ms), while no
//                 new grant can exist yet. Data keys may not be the store's own ("<prefix>/...",
//                 "<prefix>\0..."). Sent to one member only: an unanswered fenced write is not
//                 sent again elsewhere (it may have been applied; a copy could apply it twice).
//                 This is the compare of fencing.h's EtcdFenceGuard, which other etcd clients
//                 add to Txns of their own.
//   force-release a Txn deleting the key if its create revision is still the one read (never a
//                 revoke: the holder's lease carries its other grants); the holder's next
//                 renewal round finds the key gone and loses that grant alone.
//   finish        (Backend::Finish) LeaseGrant(ceil(keep) s) and/or LeaseGrant(ceil(record_ttl) s)
//                 first, then one Txn guarded like release: keep > 0 re-Puts the key under the
//                 keep lease (a Put keeps the create revision, so holder and fencing token stay;
//                 nobody renews that lease, so the grant expires by itself with no session of
//                 the caller), keep == 0 deletes it (waking waiters, fair queue included); the
//                 record is Put under its own lease in the same Txn. The key leaves its shared
//                 lease; the new leases are revoked if the Txn finds the grant gone.
//   records       "<prefix>/\0record/<name>" (no lease name starts with NUL: never listed or
//                 inspected as a grant, and untouched by grants' revokes and expiry), on an etcd
//                 lease of record_ttl in whole seconds (at least etcd's minimum, 2 s). etcd
//                 deletes keys of expired leases in its leader's periodic check (every 500 ms),
//                 so a record may be read (or listed) for up to about half a second past its
//                 TTL. ListRecords is one Range over "<prefix>/\0record/<user prefix>".
//   check         Ping is one Range of a key no lease can have ("<prefix>/\0ping"); Diagnose
//                 (for `leasehold check`) reads Cluster MemberList and Maintenance Status
//                 (members, leader, raft term, version, endpoints against members) and learns
//                 etcd's shortest lease TTL by a LeaseGrant of 1 s (revoked at once).
//   wall clock    etcd exposes no server wall clock (ResponseHeader carries cluster and member
//                 ids, revision and raft term; KeyValue only revisions; lease TTLs are relative),
//                 so WallClock is the Backend default: this host's clock, from_store = false.
//
// Renew and release only work for grants made through this backend object (it keeps the lease
// id and create revision of each); a token it does not know gets kLost. A key deleted by
// anything (`etcdctl del`, `leasehold release --force`) is noticed by the holder's next round.
//
// Endpoints: one channel per endpoint; calls go to the current one and move on to the next
// when it answers UNAVAILABLE or not before the deadline (options.command_timeout, on every
// call). An ambiguous Txn retried on another member recognizes its own grant by the token.
//
// Time: every deadline and time the backend reads or compares (WaitForChange deadlines, the
// keep-alive round's deadline, spare leases' and queue entries' refresh times, the Authenticate
// backoff) is on the Clock it was opened with. It must run at the real rate (the registry opens
// etcd:// only on Clock::Real()): etcd's leases expire on the server's clock. gRPC deadlines are
// relative timeouts given to gRPC on the system clock, the only one gRPC takes.
//
// Files: etcd_client.h (channels, failover, auth, call helpers), etcd_keepalive.h (the
// keep-alive stream), etcd_spare_leases.h, etcd_wait_queue.h (fair=true); this class holds the
// Backend methods. Only the .cc files include gRPC: this header stays free of it (the registry
// includes it).
//
// Thread safety: thread-safe. gRPC stubs are; the keep-alive stream has one reader thread
// (std::jthread, owned by the stream and joined by the backend) and writes serialized under a
// mutex; the held-lease table, the spare leases, the queue entries and the auth token have
// their own mutexes.

#pragma once

#include <atomic>
#include <cstdint>
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
#include "backends/etcd/etcd_options.h"
#include "core/url.h"

namespace leasehold::internal {

// Opens the store named by `url` (scheme "etcd" or "etcds") and checks it at once (a Range on
// the prefix, after Authenticate when a user is given). Returns kInvalidArgument for a bad URL;
// kUnavailable if no endpoint answers within command_timeout; kPermissionDenied for wrong
// credentials or a user without access to the prefix. Messages never contain the password.
Result<std::shared_ptr<Backend>> OpenEtcdBackend(const Url& url, Clock& clock = Clock::Real());

class EtcdBackend final : public Backend,
                          public WaitFacet,
                          public RecordsFacet,
                          public FencedWriteFacet,
                          public DoctorFacet {
 public:
  // Client-side counters, for tests and the benchmark (each a count of calls made).
  struct Stats {
    std::uint64_t range = 0;
    std::uint64_t txn = 0;
    std::uint64_t lease_grant = 0;
    std::uint64_t lease_revoke = 0;
    std::uint64_t lease_time_to_live = 0;
    std::uint64_t authenticate = 0;
    // LeaseKeepAlive streams opened and used (one opened by two threads at once is counted
    // once: the loser is cancelled before it carries anything), requests written on them,
    // answers read.
    std::uint64_t keepalive_streams = 0;
    std::uint64_t keepalive_requests = 0;
    std::uint64_t keepalive_responses = 0;
    // RenewMany rounds (one per call with at least one lease of ours).
    std::uint64_t keepalive_rounds = 0;
    std::uint64_t watch_streams = 0;
    // Times a call moved on to the next endpoint.
    std::uint64_t failovers = 0;
    // Acquires that granted a shared lease for their TTL class (also counted in lease_grant),
    // and acquires that put their key on a live shared lease instead.
    std::uint64_t spare_grants = 0;
    std::uint64_t spare_used = 0;
  };

  // Connects (see OpenEtcdBackend). Every time the backend reads is on `clock`.
  // REQUIRES: `clock` outlives the backend and runs at the real rate.
  static Result<std::shared_ptr<EtcdBackend>> Open(EtcdOptions options,
                                                   Clock& clock = Clock::Real());

  ~EtcdBackend() override;

  [[nodiscard]] std::string_view scheme() const override { return "etcd"; }

  // fencing_survives_restart (revisions are persisted), shared_leases; the wait facet is a
  // watch; fenced_ops Put and Delete.
  [[nodiscard]] Capabilities capabilities() const override;

  Facets facets() override {
    return {.wait = this, .records = this, .fenced_write = this, .doctor = this};
  }

  [[nodiscard]] unsigned fenced_ops() const override;

  // Returns Grant::ttl = the TTL etcd granted (whole seconds, at least 2 s). Returns
  // kHeldByAnother with the holder's identity and fencing token (remaining is reported as
  // the holder's granted TTL, an upper bound: the conflict path makes no extra call).
  // A shared lease revoked behind the handle's back (`release --force` of its last key, an
  // `etcdctl lease revoke`) fails the Txn whole ("lease not found", nothing applied): the
  // attempt is made once more on a fresh lease. Shared and semaphore requests: one Txn, and
  // one more per slot found taken (at most 6); a waiting exclusive request's first refusal
  // grants its intent's lease and runs the Txn once more to record it. Returns
  // kInvalidArgument (LimitMismatch) when a live grant is of the other family or limit.
  Result<Grant> TryAcquire(const GrantRequest& request) override;

  // One keep-alive request per shared lease of ours on the one stream, then waits (at most
  // command_timeout) for all answers (a stream that breaks is re-opened on the next endpoint
  // and the unanswered requests are sent again, while the deadline lasts); then one check Txn
  // per 128 keys whose lease answered (see the file comment).
  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override;

  // Two LeaseGrants at most (keep, record), then one Txn; keep == 0 without a record is Release.
  // The key leaves its shared lease (never revoked here: other grants ride on it).
  // Returns kLost (revoking the leases it granted) if the grant is not ours any more; on an
  // unknown outcome (kUnavailable) the new leases are left to expire by themselves.
  Status Finish(const FinishRequest& request) override;

  // One Txn, sent to one member only (never again after no answer: kUnavailable, applied whole
  // or not at all): if create_revision("<prefix>/<key>") == request.fencing_token, the ops in
  // order (Put without an etcd lease, Delete of the one key: its count is what etcd deleted),
  // else a Range of the grant key. Returns kLost (FencedOut, naming the new holder and its
  // token, or "is no longer held") if the compare fails; kInvalidArgument, before sending, for
  // a data key of the store's own ("<prefix>/...", "<prefix>\0..."), a key put twice or put and
  // deleted in one write (etcd refuses such a Txn), a token 0 or above INT64_MAX, or a
  // store_key that is not a grant key of the lease ("<prefix>/<key>" or "<prefix>/<key>\0s/...",
  // "\0n/..."); kPermissionDenied naming the grant key and the data
  // keys if the user may not read the one or write the others.
  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) override;

  // One Range of the record's key.
  Result<std::optional<std::string>> ReadRecord(std::string_view key) override;

  // One Range over the records of the keys that start with `prefix` (their values only: the
  // whole answer must fit gRPC's 4 MiB message limit, about 1000 records of kMaxRecordBytes).
  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override;

  // One Range of "<prefix>/\0ping" (no lease's key: lease names have no NUL), through the
  // client's failover, bounded by command_timeout.
  Status Ping() override;

  // Probe "Range (missing key)", TTL granularity 1 s, shortest_ttl learnt by a LeaseGrant of
  // 1 s (revoked at once); items: durability (revisions persist), session (that shortest TTL),
  // topology (MemberList: member count; Status of the member that answers: leader, raft term,
  // version, alarms; the URL's endpoints against the members' client URLs), permissions (auth
  // on or off). kUnavailable if no member answers.
  Result<Diagnosis> Diagnose() override;

  // One Range over the prefix plus one LeaseTimeToLive per etcd lease among the grants.
  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override;

  // ForceReleaseAll, or with a token prefix ForceReleaseOne.
  Result<bool> ForceEnd(std::string_view key, std::string_view token_prefix) override;

  // One Range of the lease's keys plus one LeaseTimeToLive per etcd lease among them.
  Result<std::vector<LeaseInfo>> Holders(std::string_view key) override;

  // Range, then a Watch stream from the following revision filtered to deletes. Returns OK
  // at once if the key is free; the stream is cancelled on `stop` (kCancelled) and ends at
  // `deadline` (kDeadlineExceeded).
  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) override;

  // A waiter whose last attempt was refused watches the lease's keys (and, fair=true, its
  // queue) for deletes from the revision after that refusal, with no read first.
  // fair=true otherwise: returns at once if the key is free and `waiter_id` heads its queue;
  // else watches the grants and the queue for deletes, and returns by the time the waiter's queue
  // entry needs its keep-alive (the caller's next TryAcquire sends it). Without fair, as
  // WaitForChange.
  Status WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                     std::stop_token stop) override;

  // Revokes the waiter's queue entry (fair=true) or writer intent (fair=false), each on its
  // own lease, which wakes the waiters behind.
  void AbandonWait(std::string_view key, std::string_view waiter_id) override;

  [[nodiscard]] Stats stats() const;

  [[nodiscard]] const EtcdOptions& options() const { return options_; }

  // The etcd key of lease `key` under `prefix`: "<prefix>/<key>".
  static std::string KeyName(std::string_view prefix, std::string_view key);

 private:
  // Finish with nothing kept: deletes the grant only if its owner token matches.
  Status Delete(std::string_view key, std::string_view owner_token);

  // One Txn deleting the lease's keys but its writer intent (DeleteRange of the base and of
  // each slot range, with their previous values), then for each etcd lease that carried one of
  // them, a LeaseTimeToLive and a revoke if it carries no key any more (an older leasehold's
  // one-lease-per-grant holder learns of it so).
  Result<bool> ForceReleaseAll(std::string_view key);

  // One Range of the lease's keys, then a Txn deleting the grant whose token starts with
  // `token_prefix` if its create revision is still the one read (and a revoke as
  // ForceRelease).
  Result<bool> ForceReleaseOne(std::string_view key, std::string_view token_prefix);

  // One attempt of TryAcquire.
  Result<Grant> TryAcquireOnce(const GrantRequest& request);

  // The parts that touch gRPC (etcd_backend.cc).
  class Impl;

  EtcdBackend(EtcdOptions options, Clock& clock, std::unique_ptr<Impl> impl);

  // After a renewal round and before an acquire: deletes the grants the core has lost (no
  // confirmation for a whole TTL) and the keys of unanswered acquire Txns, which the shared
  // leases would keep alive.
  void SweepLost();

  const EtcdOptions options_;
  Clock& clock_;
  const std::unique_ptr<Impl> impl_;
};

}  // namespace leasehold::internal
