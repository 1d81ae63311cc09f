// File: backends/zookeeper/zk_backend.h (internal)
//
// ZkBackend: the zk:// store, on ZooKeeper's C client (zookeeper_mt). docs/impl.md ("The
// ZooKeeper store") gives the design in short; this comment is the full account. The C client
// glue is zk_session.h (the only header that includes zookeeper.h), the node names and data
// zk_layout.h.
//
// Layout: every key is a container node <chroot>/leasehold/<escaped key> (ZOO_CONTAINER, so an
// empty one is removed by the server), and every grant or queued waiter is an ephemeral
// sequential child "<id>-<sequence>" holding "ttl_ms\ntoken_prefix\nholder". The child with the
// lowest sequence holds the lease; its czxid is the fencing token (64-bit, monotonic across the
// ensemble). <id> is unique per grant ("g" + 128 random bits) or per waiting call ("w" +
// waiter id), Curator's "protected" names: a create whose reply was lost in a connection drop is
// found again by its prefix (and adopted or deleted, never left as a phantom waiter), and no
// other client's node can have our name even if the key's container was deleted and recreated
// (sequence numbers restart then).
//
// Shared leases: the node's name also carries its kind ("<id><tag>-<sequence>", zk_layout::
// KindTag: no tag for exclusive, so an exclusive grant is named as by earlier versions), and one
// listing decides every child's admission (zk_backend.cc, GrantedOf): a semaphore's child holds
// the key while fewer than N children (and live kept grants) are ahead of it, a shared child
// while no exclusive one is, an exclusive child when it is first. "The lowest child holds the
// key" is the exclusive case of that rule. A shared or semaphore grant's slot is written into
// its node data when it is made (ClaimSlot), in one multi with a versioned setData of the key
// node that serialises the slot choices of grants admitted at once.
//
// Ends that outlive the holder (Backend::Finish): a grant kept after its holder (keep > 0) must
// survive the holder's session, which an ephemeral node cannot. So one multi, checked by the
// holder node's version, deletes the ephemeral node and creates the persistent node
// <key>/kept ("kept1\n<keep ms>\n<fencing token>\n<token prefix>\n<holder>"), which keeps the
// grant's holder and fencing token (the ephemeral node's czxid: every node queued behind it, and
// every later one, has a higher czxid, so the next grant's token is higher). It is live until its
// mtime, set by the ZooKeeper leader's clock, plus keep; it is not deleted at expiry (plain
// persistent node: TTL nodes need zookeeper.extendedTypesEnabled and are removed lazily anyway),
// so every reader judges it against the leader's clock (WallClock) and ignores it once expired.
// While it is live the lowest queued node is not the holder: TryAcquire refuses with its
// holder, Inspect and List show it, waiters sleep until its expiry (or its delete); once it has
// expired, the lowest queued node takes over by deleting it (versioned, in one multi with a
// check of its own node). ForceRelease deletes it. The same multi (or, with keep == 0, a multi
// of the versioned delete) writes the record, the persistent node <key>/record
// ("<ttl ms>\n<bytes>", live until mtime + ttl on the leader's clock); grants never touch it.
// Neither name has a '-', so neither is ever taken for a queued node. An expired record or kept
// node stays (a few bytes) until it is replaced or taken over.
//
// Wall clock: a setData on <chroot>/leasehold-clock returns a Stat whose mtime the leader set
// (its transaction time): one round trip, and one write. Expiry of kept grants and records is
// judged on it, so it moves by the skew between two servers' clocks if the leader changes.
//
// The store doctor (`leasehold check`): Ping is one exists of a node that is never created, on
// the service session; Diagnose learns the session bounds (two short-lived sessions asking for
// 100 ms and a day), asks the connected server `srvr` and `conf` (four-letter words) and reads
// the ACL of <chroot>/leasehold.
//
// Sessions: an ephemeral node lives as long as the session that created it. A lease's TTL is
// the session timeout the handle asks for; the server clamps it (by default to 2..20 ticks), and
// the negotiated timeout is the Grant's ttl, so safe_until = t_send + negotiated - drift. One
// session per distinct requested TTL, plus one "service" session for reads, watches and
// deletes. ZooKeeper expires a session no earlier than its timeout after it last heard from the
// client, so a reply to a request sent at t_send proves the session, and each of its ephemeral
// nodes nobody deleted, lives until t_send + negotiated. A renewal round (RenewMany) is
// therefore per session, not per lease: a sync (through the leader, so the read after it is not
// stale from a lagging or cut-off follower) and one cheap read (exists of "/"), pipelined: one
// round of latency, two requests per session. That a grant's node was not deleted is learnt from
// a data watch on it (ZkNodeWatch), set with the grant and pipelined with the acquire's own
// requests; on one connection the server sends a watch's event before any later reply, and the
// C client runs events and completions on one thread in order, so once the read's reply has
// been awaited every delete before it has been recorded. The watch counts only while the
// session's connection epoch (ZkSession::epoch) is the one it was registered on: after a
// reconnect the next round re-arms it with a watching get, whose reply (ephemeralOwner is our
// session, czxid our fencing token) is that round's evidence for it; a round during which the
// epoch moves confirms only the grants it re-armed. docs/impl.md gives the argument in full. The C
// client pings by itself, so without renewals a node would live on: each grant therefore also has a
// local deadline (t_send of its last confirmed renewal + ttl, read after the core's t_send, so
// never before the holder's safe_until), and a reaper thread deletes the nodes of grants that pass
// it: a holder that stopped renewing, or was cut off longer than its TTL and then reconnected to a
// session that survived, never blocks the key. Session expiry makes every lease on that session
// lost (kLost, LostCause::kSessionLost); the next acquire opens a new session by itself.
//
// Fenced writes (FencedWrite, Lease::Write): one multi whose first op checks that this grant's
// node still exists (Grant::store_key is its path in the chroot, named as data paths are), then
// the ops on node paths in the chroot: Put is a setData (any version), or a persistent create
// with the store's ACL where the node is absent; Delete is a delete (any version), dropped
// (count 0) where the node is absent. The check is by existence (version -1), and that suffices:
// a node's name carries its grant's (or waiting call's) random id and is never used again (a
// waiting call ends with its one grant), so a node at that path is this grant's node, and its
// czxid is the fencing token; a version would add nothing (a grant's node is written only before
// TryAcquire returns, when an adopted waiter's node gets this attempt's data). A multi fails whole
// on one op's ZNONODE or ZNODEEXISTS, so the write is planned on a guess (every node exists),
// after a miss on a pipelined exists of every node, and resent a bounded number of times; each
// attempt is one whole multi with the check, so the write is still all or none. A create's
// ZNONODE is a missing parent: kInvalidArgument naming it (no parent is made implicitly). Paths
// are checked before anything is sent (zk_layout::DataPathProblem): leasehold's own nodes
// (<chroot>/leasehold, <chroot>/leasehold-clock and below) are not data. A grant past its local
// deadline, or on a session known to have expired, is refused without sending anything. The
// multi goes through the session that owns the grant's node. The check is done by the leader, so
// any session would be safe: the leader orders the multi against the node's delete whoever sends
// either, and no other grant exists until that delete. The owner's session is chosen because
// ZooKeeper applies one session's requests in order, and this handle deletes the grant's node on
// that session (Release, Finish, the reaper): a write sent before such a delete (even one whose
// reply timed out) is applied or refused before it, never after; and once that session has
// expired the grant is known gone without a round trip. Connection or session loss mid-write is
// kUnavailable, outcome unknown (a retry sees the session's fate). A refused check is kLost
// naming the key's holder now (ReadHolder: its lowest child, or a live kept grant).
//
// Waiting is the ZooKeeper lock recipe: a waiter (Store::Acquire, GrantRequest::waiter_id)
// keeps its node between attempts and watches only its predecessor, so the key goes first come,
// first served and a release wakes one waiter, not a herd. (A shared waiter watches the nearest
// exclusive child ahead; a semaphore's waiter every child ahead, since any of them leaving moves
// it up: a herd of the queue, as Curator's semaphore.) A TryAcquire without a waiter id that
// is not lowest deletes its node and reports the holder. Handoff from the delete event: when the
// predecessor a waiter watches is the lowest node (the holder) and there is no kept node, Wait
// also sets an exists watch on <key>/kept, and if the predecessor's delete event comes with no
// kept node seen before it (Finish creates the kept node in the same multi before the delete,
// and events come in order), on the connection the watches were set on, the waiter is marked
// handed: its next TryAcquire grants at once, with ttl = negotiated - (now - last_heard), where
// last_heard is the latest t_send of a request the session had answered (ZkSession::NoteHeard:
// the wait's listing, a renewal round), or goes the ordinary way if less than nine tenths is
// left.
//
// Auth: with zk://user:pass@..., every session authenticates with `digest` and every node is
// created with ZOO_CREATOR_ALL_ACL. Errors: connection loss and timeouts are kUnavailable;
// ZNOAUTH/ZAUTHFAILED are kPermissionDenied.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("zk://127.0.0.1:2181,127.0.0.1:2182/jobs"));
//   LH_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, OpenZkBackend(url));
//
// Time: every SteadyTime here (a WaitForChange or WaitForTurn deadline, a grant's local
// deadline, a request's bound, the reaper's next round) is on the Clock the backend was opened
// with, and only that clock is read. Its condition-variable waits run in real time (ToSteady),
// so the clock must run at the real rate: the registry opens zk:// with Clock::Real() only,
// since a session's expiry is timed by the server. The expiry of kept grants and records is
// judged on the ZooKeeper leader's wall clock (LeaderNow), a different time base.
//
// Thread safety: thread-safe. The C client runs its own IO and completion threads per session;
// watcher and completion callbacks only record results and signal condition variables, and take
// no lock of the backend's. Every request is sent asynchronously and waited for with a bound
// (command_timeout). Lock order: connect_mu_ (held across opening a session, so two callers do
// not both connect), then mu_ (the backend's own state, never held across a request), then a
// session's own lock (ZkSession::Expired). The reaper is one std::jthread joined in the
// destructor.

#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease_info.h"
#include "leasehold/status.h"

#include "backends/backend.h"
#include "backends/zookeeper/zk_layout.h"
#include "backends/zookeeper/zk_options.h"
#include "core/url.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// zk_session.h: zookeeper.h stays out of this header.
class ZkSession;
struct ZkNodeWatch;

// Opens the store named by `url` (scheme "zk") and checks it at once (one session, the chroot
// created if missing). Returns kInvalidArgument for a bad URL; kUnavailable if no server answers
// within connect_timeout; kPermissionDenied if the server refuses the credentials or the ACLs.
Result<std::shared_ptr<Backend>> OpenZkBackend(const Url& url, Clock& clock = Clock::Real());

class ZkBackend final : public Backend,
                        public WaitFacet,
                        public RecordsFacet,
                        public FencedWriteFacet,
                        public DoctorFacet {
 public:
  // As OpenZkBackend, from parsed options. `clock` must outlive the backend.
  static Result<std::shared_ptr<ZkBackend>> Open(ZkOptions options, Clock& clock = Clock::Real());

  // Stops the reaper and closes every session (the server deletes their ephemeral nodes).
  ~ZkBackend() override;

  [[nodiscard]] std::string_view scheme() const override { return "zk"; }

  // fair_queue: the lock recipe, whose watches are the wait facet; fencing survives restarts
  // (czxid).
  [[nodiscard]] Capabilities capabilities() const override;

  Facets facets() override {
    return {.wait = this, .records = this, .fenced_write = this, .doctor = this};
  }

  [[nodiscard]] unsigned fenced_ops() const override;

  // Grant.ttl is the negotiated session timeout. Returns kHeldByAnother with the LeaseInfo of
  // the live grant of the lowest slot (remaining = its session timeout: the server cannot say
  // more), or of the exclusive waiter a shared request is queued behind, if the node is not
  // admitted (GrantedOf); with a waiter id the waiter's node stays queued. Returns LimitMismatch
  // (and deletes the node, a waiter's too) if a child ahead or a live kept grant asks for
  // another limit.
  Result<Grant> TryAcquire(const GrantRequest& request) override;

  // Per session: a sync and one read (plus a watching get per grant whose watch needs re-arming
  // after a reconnect), all sent before any reply is awaited; each grant's node watch says
  // whether it was deleted.
  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override;

  // One multi: a versioned delete of the holder's node, with the kept node and/or the record
  // created or set (an exists of each first says which); keep == 0 without a record is Release.
  // Returns kLost if the node is not ours any more or the grant passed its local deadline.
  Status Finish(const FinishRequest& request) override;

  // A clock read (to judge the record's expiry), then a get of the record.
  Result<std::optional<std::string>> ReadRecord(std::string_view key) override;

  // A clock read, the key nodes under <chroot>/leasehold, then a get of every matching key's
  // record, pipelined (three rounds of latency however many keys; the last two share one
  // command_timeout).
  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override;

  // One multi: a check that this grant's node still exists, then the ops on absolute node
  // paths (Put: setData, or create where the node is absent; Delete: delete, dropped where
  // absent); re-planned and resent, each time as one whole multi, when a node turns out absent
  // or present. Returns kInvalidArgument for a path the store does not write (before sending) or
  // a missing parent; kLost (FencedOut, naming the holder) if the check fails or the grant is
  // past its local deadline or its session expired (then nothing is sent); kUnavailable, outcome
  // unknown, on connection or session loss.
  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) override;

  // The leader's transaction time of a setData on the clock node; from_store = true.
  Result<StoreTime> WallClock() override;

  // One exists of "<chroot>/leasehold-clock/ping" (a node never created) on the service session.
  Status Ping() override;

  // Probe "exists (missing node)". Learns the session bounds by opening two short-lived
  // sessions that ask for 100 ms and for a day (the negotiated timeouts are minSessionTimeout and
  // maxSessionTimeout); ttl_granularity is tickTime from the `conf` four-letter word, or min / 2
  // when the bounds are the default 2 and 20 ticks, else zero; shortest_ttl the minimum (when
  // it is above 100 ms, so known exactly). Topology from `srvr` (and the
  // ensemble's size from `conf`) on the server the service session is connected to; a word
  // outside the server's whitelist is a kWarn item. Permissions: the ACL of <chroot>/leasehold
  // (getACL) must grant this handle's identity (digest user, or world:anyone) cdrw.
  Result<Diagnosis> Diagnose() override;

  // A listing of the key's children, then one round of gets of the granted ones (and of the kept
  // nodes, with a clock read).
  Result<std::vector<LeaseInfo>> Holders(std::string_view key) override;

  // Reads the key nodes under <chroot>/leasehold, then each key's holders.
  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override;

  // ForceReleaseAll, or with a token prefix ForceReleaseOne.
  Result<bool> ForceEnd(std::string_view key, std::string_view token_prefix) override;

  // Deletes the waiter's node (or, if that fails, leaves it to the reaper).
  void AbandonWait(std::string_view key, std::string_view waiter_id) override;

  // Watches the key's granted children (and live kept nodes): any grant's end wakes it.
  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) override;

  // Returns OK at once if the waiter's node is admitted (or gone); else watches what keeps it
  // out: its predecessor (exclusive), the nearest exclusive child ahead (shared), every child
  // ahead (a semaphore's).
  Status WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                     std::stop_token stop) override;

  // For tests: the session timeout the server granted for leases of `ttl` (opening that session
  // if needed), and the loopback port of the server that session is connected to (-1 if none).
  Result<Duration> NegotiatedTimeoutForTesting(Duration ttl);
  int ConnectedPortForTesting(Duration ttl);

  // For tests: how many requests RenewMany has sent in all (a round is a sync and one read per
  // session, plus a watching get per grant whose watch needs re-arming after a reconnect).
  [[nodiscard]] std::uint64_t RenewRequestsSentForTesting() const {
    return renew_requests_sent_.load(std::memory_order_relaxed);
  }

  // For tests: how many grants TryAcquire made from a handoff (the predecessor's delete event)
  // without a round trip.
  [[nodiscard]] std::uint64_t HandedGrantsForTesting() const {
    return handed_grants_.load(std::memory_order_relaxed);
  }

 private:
  // Finish with nothing kept: deletes the grant only if its owner token matches.
  Status Delete(std::string_view key, std::string_view owner_token);

  // Deletes the granted children of the key (and its kept nodes); queued waiters stay, so the
  // next ones then hold the key.
  Result<bool> ForceReleaseAll(std::string_view key);

  // Deletes the one granted child (or live kept node) whose data carries the token prefix.
  Result<bool> ForceReleaseOne(std::string_view key, std::string_view token_prefix);

  // A grant of this handle, by (key, owner token).
  struct Held {
    std::shared_ptr<ZkSession> session;
    std::string path;
    FencingToken czxid = 0;
    std::string holder;  // for the kept node (Finish)
    Duration ttl{};
    // t_send of the last confirmed renewal + ttl; the reaper deletes the node after it.
    SteadyTime deadline{};
    // The node's watch (set with the grant, re-armed after a reconnect) and the session's
    // connection epoch it is known to be registered on (0: not known; RenewMany re-arms it).
    std::shared_ptr<ZkNodeWatch> watch;
    std::uint64_t armed_epoch = 0;
    // The grant's kind (its node name's tag) and slot: a kept node (Finish) is named by both.
    zk_layout::NodeKind kind;
    std::uint32_t slot = 0;
  };

  // A queued waiter's node, by (key, waiter id).
  struct Queued {
    std::shared_ptr<ZkSession> session;
    std::string path;
    // The node's watch, set when this call created it (nullptr for an adopted node), the
    // connection epoch it is known registered on (0: not known), its czxid, and the owner token
    // its data carries.
    std::shared_ptr<ZkNodeWatch> watch;
    std::uint64_t watch_epoch = 0;
    FencingToken czxid = 0;
    std::string token;
    // Set by Wait from the predecessor's delete event alone, when that predecessor was the
    // holder (WaitForTurn): the next TryAcquire of this waiter grants without a round trip.
    bool handed = false;
    std::uint64_t handed_epoch = 0;
  };

  // A node to delete in the background: by path, or (path empty) the child of `dir` whose name
  // starts with `prefix` (a create whose reply was lost).
  struct Doomed {
    std::shared_ptr<ZkSession> session;
    std::string path;
    std::string dir;
    std::string prefix;
    int attempts = 0;
  };

  using KeyAndId = std::pair<std::string, std::string>;

  // A kept grant's node as read, with its time left on the leader's clock (<= 0: expired).
  struct Kept {
    LeaseInfo info;
    int version = 0;
    Duration remaining{};
    std::string name;  // "kept", or "kept<tag>.<slot>" (zk_layout::KeptName)
    zk_layout::NodeKind kind;
  };

  // A live grant of a key as ReadGrants found it: a granted child or a live kept node.
  struct LiveGrant {
    LeaseInfo info;
    std::string path;
    int version = 0;
    bool kept = false;
    // The slot is the grant's own (an exclusive or kept grant's, or written in its node data);
    // false: a shared or semaphore child admitted but not yet made a grant by its TryAcquire
    // (ClaimSlot), shown with the smallest slot free at the time of reading.
    bool slotted = true;
  };

  ZkBackend(ZkOptions options, Clock& clock);

  // Returns the live session for leases of `ttl`, opening (or replacing an expired) one.
  Result<std::shared_ptr<ZkSession>> LeaseSession(Duration ttl) LH_EXCLUDES(mu_, connect_mu_);
  Result<std::shared_ptr<ZkSession>> ServiceSession() LH_EXCLUDES(mu_, connect_mu_);
  // Opens a session asking for `timeout` (ZkSession::Open with this backend's options and clock).
  Result<std::shared_ptr<ZkSession>> Connect(Duration timeout) LH_REQUIRES(connect_mu_)
      LH_EXCLUDES(mu_);

  // Creates the chroot (persistent), <chroot>/leasehold and `dir` (containers) as needed.
  Status EnsureParents(ZkSession& session, const std::string& dir);

  std::string KeyDir(std::string_view key) const;

  // Reads the key's holder as a LeaseInfo: its live grant of the lowest slot; nullopt if the key
  // has none.
  Result<std::optional<LeaseInfo>> ReadHolder(ZkSession& session, std::string_view key);

  // Reads the key's live grants, ordered by slot: its granted children (zk_backend.cc,
  // GrantedOf) and live kept nodes, from one listing and one round of gets (re-read if a child
  // left in between). With `writer`, also the first exclusive child of that listing not yet
  // granted (the writer waiting for the key, waiting_writer), or nullopt.
  Result<std::vector<LiveGrant>> ReadGrants(ZkSession& session, std::string_view key,
                                            std::optional<LeaseInfo>* writer = nullptr);

  // The first exclusive node among `queued` (a listing's sequence nodes, in order, with their
  // kinds) that the grants before it and `kept` do not admit: the writer waiting for the key,
  // as Holders lists it (no fencing token or token prefix; `remaining` its TTL, an upper
  // bound), or nullopt.
  Result<std::optional<LeaseInfo>> WaitingWriterOf(ZkSession& session, std::string_view key,
                                                   const std::string& dir,
                                                   const std::vector<std::string>& queued,
                                                   const std::vector<zk_layout::NodeKind>& kinds,
                                                   const std::vector<Kept>& kept);

  // The live grants among `queued` (a listing's sequence nodes, in order, with their kinds)
  // before index `end`, and the live kept nodes `kept`, ordered by slot: one round of gets.
  // Returns ZNONODE in *rc (and nothing) if a granted child left before its get.
  Result<std::vector<LiveGrant>> GrantsOf(ZkSession& session, std::string_view key,
                                          const std::string& dir,
                                          const std::vector<std::string>& queued,
                                          const std::vector<zk_layout::NodeKind>& kinds,
                                          const std::vector<Kept>& kept, std::size_t end, int* rc);

  // Writes the slot of the shared or semaphore grant `my_name` into its node data (the
  // smallest slot no other live grant of the key has), in one multi checked by the key node's
  // version (zk_backend.cc says why that cannot give two grants one slot). Returns the slot.
  Result<std::uint32_t> ClaimSlot(ZkSession& session, std::string_view key, const std::string& dir,
                                  const std::string& my_name, Duration ttl,
                                  std::string_view owner_token, std::string_view holder);

  // Reads the kept nodes `names` of `dir` and judges each on the leader's clock (one clock read
  // for all); those not in our layout are left out.
  Result<std::vector<Kept>> ReadKeptNodes(ZkSession& session, std::string_view key,
                                          const std::string& dir,
                                          const std::vector<std::string>& names);

  // The Status of a fenced write whose op `op` failed with `rc` (a missing parent, children,
  // an ephemeral parent, a path ZooKeeper refused, or ZkErrorStatus).
  Status FencedOpStatus(const FencedOp& op, int rc, std::string_view key) const;

  // FencedOut's `why` for a refused write of the grant with `token`: the key's holder now
  // (ReadHolder), or "is no longer held" if it has none, cannot be read, or is that grant.
  std::string FencedOutWhy(ZkSession& session, std::string_view key, FencingToken token);

  // The leader's wall clock: the mtime of a setData on the clock node (created if missing).
  Result<SystemTime> LeaderNow(ZkSession& session);

  // Deletes `path` now (bounded); on a transient failure hands it to the reaper.
  Status DeleteOrDoom(const std::shared_ptr<ZkSession>& session, const std::string& path)
      LH_EXCLUDES(mu_);

  // Hands a node to the reaper.
  void Doom(Doomed doomed) LH_EXCLUDES(mu_);

  // The reaper thread: deletes the nodes of grants past their local deadline and the doomed
  // ones, retrying transient failures.
  void ReaperLoop(std::stop_token stop) LH_EXCLUDES(mu_);

  // Waits until the child before `my_name` of `dir` (the lowest child if `my_name` is empty), or
  // a live kept grant, changes; `deadline` is on clock_.
  // `waiter` (null for WaitForChange) names the waiter, whose Queued entry Wait marks handed
  // when the predecessor's delete event alone proves the key is the waiter's.
  Status Wait(const std::shared_ptr<ZkSession>& session, const std::string& dir,
              std::string_view my_name, SteadyTime deadline, std::stop_token stop,
              const KeyAndId* waiter = nullptr) LH_EXCLUDES(mu_);

  // Immutable after construction.
  const ZkOptions options_;
  Clock& clock_;                  // every SteadyTime of this backend is on it
  const std::string base_;        // <chroot>/leasehold
  const std::string clock_path_;  // <chroot>/leasehold-clock

  // Serialises session creation (a connect can take up to connect_timeout).
  Mutex connect_mu_;

  Mutex mu_;
  CondVar reaper_cv_{&mu_};
  std::map<std::int64_t, std::shared_ptr<ZkSession>> sessions_ LH_GUARDED_BY(mu_);
  std::shared_ptr<ZkSession> service_ LH_GUARDED_BY(mu_);
  std::map<KeyAndId, Held> grants_ LH_GUARDED_BY(mu_);
  std::map<KeyAndId, Queued> waiters_ LH_GUARDED_BY(mu_);
  std::vector<Doomed> doomed_ LH_GUARDED_BY(mu_);
  std::atomic<std::uint64_t> renew_requests_sent_{0};
  std::atomic<std::uint64_t> handed_grants_{0};

  std::jthread reaper_;  // last: joined first
};

}  // namespace leasehold::internal
