// File: backends/zookeeper/zk_backend.cc (internal)
//
// The zk:// store's grant core. See zk_backend.h for the design; this file holds opening,
// sessions, renewal, the ends of grants (kept ones included), listing and the reaper; the
// lock recipe's acquire is in zk_acquire.cc, the reading of a key's grants in zk_grants.cc,
// the facets in zk_records.cc, zk_wait.cc, zk_fenced_write.cc and zk_doctor.cc. The C client glue
// is in zk_session.{h,cc}, the node names and data in zk_layout.{h,cc}.

#include "backends/zookeeper/zk_backend.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backends/common/time.h"
#include "backends/zookeeper/zk_layout.h"
#include "backends/zookeeper/zk_rules.h"
#include "backends/zookeeper/zk_session.h"
#include "core/duration.h"
#include "core/logging.h"
#include "core/owner_token.h"

namespace leasehold::internal {

Result<std::shared_ptr<Backend>> OpenZkBackend(const Url& url, Clock& clock) {
  LH_ASSIGN_OR_RETURN(ZkOptions options, ZkOptions::FromUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkBackend> backend,
                      ZkBackend::Open(std::move(options), clock));
  return std::shared_ptr<Backend>(std::move(backend));
}

ZkBackend::ZkBackend(ZkOptions options, Clock& clock)
    : options_(std::move(options)),
      clock_(clock),
      base_(options_.chroot + "/" + std::string(zk_layout::kRootName)),
      clock_path_(options_.chroot + "/" + std::string(zk_layout::kClockName)) {}

Result<std::shared_ptr<ZkBackend>> ZkBackend::Open(ZkOptions options, Clock& clock) {
  SetUpZkClientLogging();
  std::shared_ptr<ZkBackend> backend(new ZkBackend(std::move(options), clock));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> service, backend->ServiceSession());
  // Checks the chroot and the ACLs at once, so a wrong password fails here, not at first use.
  LH_RETURN_IF_ERROR(backend->EnsureParents(*service, backend->base_));
  backend->reaper_ = std::jthread(
      [raw = backend.get()](std::stop_token stop) { raw->ReaperLoop(std::move(stop)); });
  return backend;
}

ZkBackend::~ZkBackend() {
  reaper_.request_stop();
  {
    MutexLock lock(&mu_);
    reaper_cv_.NotifyAll();
  }
  if (reaper_.joinable()) {
    reaper_.join();
  }
  // Sessions close as their last references go (members are destroyed after this body).
}

Capabilities ZkBackend::capabilities() const {
  return Capabilities{.notifies_holder = true,
                      .fencing_survives_restart = true,
                      .fair_queue = true,
                      .shared_leases = true};
}

unsigned ZkBackend::fenced_ops() const {
  return FencedOpBit(FencedOp::Kind::kPut) | FencedOpBit(FencedOp::Kind::kDelete);
}

Result<std::shared_ptr<ZkSession>> ZkBackend::Connect(Duration timeout) {
  return ZkSession::Open(options_, timeout, clock_);
}

Result<std::shared_ptr<ZkSession>> ZkBackend::ServiceSession() {
  {
    MutexLock lock(&mu_);
    if (service_ != nullptr && !service_->Expired()) {
      return service_;
    }
  }
  MutexLock connecting(&connect_mu_);
  {
    MutexLock lock(&mu_);
    if (service_ != nullptr && !service_->Expired()) {
      return service_;
    }
  }
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session,
                      Connect(options_.service_session_timeout));
  MutexLock lock(&mu_);
  service_ = session;
  return session;
}

Result<std::shared_ptr<ZkSession>> ZkBackend::LeaseSession(Duration ttl) {
  const std::int64_t ms = std::max<std::int64_t>(1, duration_cast<milliseconds>(ttl).count());
  auto lookup = [&]() LH_REQUIRES(mu_) -> std::shared_ptr<ZkSession> {
    auto it = sessions_.find(ms);
    if (it != sessions_.end() && !it->second->Expired()) {
      return it->second;
    }
    return nullptr;
  };
  {
    MutexLock lock(&mu_);
    if (auto s = lookup()) {
      return s;
    }
  }
  MutexLock connecting(&connect_mu_);
  {
    MutexLock lock(&mu_);
    if (auto s = lookup()) {
      return s;
    }
  }
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, Connect(milliseconds(ms)));
  MutexLock lock(&mu_);
  sessions_[ms] = session;  // an expired one it replaces closes with its last grant
  return session;
}

Status ZkBackend::EnsureParents(ZkSession& session, const std::string& dir) {
  const struct ACL_vector* acl = NodeAcl(options_);
  ZkRequests requests(session, options_.command_timeout);
  // Each component after the root: the chroot's are persistent (the operator named them), ours
  // are containers.
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    std::string path = dir.substr(0, pos);
    if (path.empty()) {
      continue;
    }
    const bool ours = path.size() > options_.chroot.size();
    int rc = requests.Exists(path, nullptr);
    if (rc == ZNONODE) {
      rc = requests.Create(path, "", acl, ours ? ZOO_CONTAINER : ZOO_PERSISTENT, nullptr, nullptr);
      if (rc == ZNODEEXISTS) {
        rc = ZOK;
      }
    }
    if (rc != ZOK) {
      return ZkErrorStatus(rc, fmt::format("creating {}", path), options_);
    }
  }
  return Status();
}

std::string ZkBackend::KeyDir(std::string_view key) const {
  return base_ + "/" + EscapeKey(key);
}

std::vector<Status> ZkBackend::RenewMany(std::span<const RenewRequest> requests) {
  // Read before anything is sent: every request of the round below is sent after it.
  const SteadyTime t_send = clock_.Now();
  std::vector<Status> results(requests.size());

  struct Pending {
    std::size_t index;
    Held held;
    std::optional<ZkPending> rearm;  // a watching get, where the watch is not known registered
  };

  struct Round {
    std::shared_ptr<ZkSession> session;
    std::uint64_t epoch = 0;  // the session's connection epoch before anything was sent
    std::optional<ZkPending> sync;
    std::optional<ZkPending> probe;
    int sync_rc = ZOK;
    int rc = ZOK;
    bool confirmed = false;  // the sync and the probe answered, the epoch did not move
  };

  std::vector<Pending> pending;
  {
    MutexLock lock(&mu_);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      auto it = grants_.find({requests[i].key, requests[i].owner_token});
      if (it == grants_.end()) {
        results[i] = Status::Lost(
            fmt::format("{} is not held with this token (released, expired or never granted)",
                        requests[i].key));
        continue;
      }
      pending.push_back({i, it->second, std::nullopt});
    }
  }
  // The renewal is the session's own liveness, not one read per node (docs/impl.md, "The
  // ZooKeeper store", gives the argument in full). Per session: a sync, then (where a grant's
  // watch is not known to be registered on the current connection) a watching get of its node,
  // then one cheap read (exists of "/"), all pipelined: one round of latency, and 2 requests
  // per session however many grants it holds. A reply to a request sent after t_send proves the
  // server heard from the session after t_send, so the session, and every ephemeral node of it
  // that nobody deleted, lives until at least t_send + negotiated. That no node was deleted is
  // the watches' word: each grant's node carries a data watch, registered on the connection
  // whose epoch armed_epoch names. The sync goes through the leader, so the read after it is
  // served at a state no older than the leader's when the sync reached it (after t_send); the
  // server sends a watch's event before any reply that reflects a later state, on the one
  // connection; and the C client runs watch events and completions on one thread, in the order
  // they came. So once the read's reply has been awaited (below), the delete of any watched node
  // applied before the read has been recorded in its ZkNodeWatch: a node whose watch is still
  // kLive, on a session whose epoch did not move between the watch's registration and the
  // read's reply (the same connection throughout), existed after t_send. A moved epoch (a
  // disconnect, a reconnect to another server) proves nothing from the probe: the grants whose
  // watch was not known registered on the round's connection are re-armed, and each one's get
  // reply (our ephemeralOwner and czxid, sent after the sync) is its own evidence, as an exists
  // was before; the others are not confirmed by that round (at risk; re-armed by the next).
  std::map<ZkSession*, Round> rounds;
  for (Pending& p : pending) {
    ZkSession* raw = p.held.session.get();
    auto [it, fresh] = rounds.try_emplace(raw);
    if (fresh) {
      it->second.session = p.held.session;
      it->second.epoch = raw->epoch();
      it->second.sync = ZkPending::Sync(*raw);
    }
  }
  std::uint64_t sent = 2 * rounds.size();
  for (Pending& p : pending) {
    const Round& round = rounds.at(p.held.session.get());
    if (p.held.armed_epoch == 0 || p.held.armed_epoch != round.epoch) {
      p.rearm = ZkPending::WatchGet(*p.held.session, p.held.path, p.held.watch);
      ++sent;
    }
  }
  for (auto& [raw, round] : rounds) {
    round.probe = ZkPending::Exists(*raw, "/");
  }
  renew_requests_sent_.fetch_add(sent, std::memory_order_relaxed);
  const SteadyTime deadline = clock_.Now() + options_.command_timeout;
  for (auto& [raw, round] : rounds) {
    int rc = round.sync->Await(deadline);
    round.sync_rc = rc;
    if (rc == ZOK) {
      raw->NoteHeard(t_send);
    }
    const int probe_rc = round.probe->Await(deadline);  // awaited whatever the sync said
    if (rc == ZOK) {
      rc = probe_rc == ZNONODE ? ZOK : probe_rc;
    }
    round.rc = rc;
    // Read after the probe's reply was awaited: every event that came before it is recorded.
    round.confirmed = rc == ZOK && raw->epoch() == round.epoch;
  }
  for (Pending& p : pending) {
    const RenewRequest& request = requests[p.index];
    const KeyAndId grant_key{request.key, request.owner_token};
    const Round& round = rounds.at(p.held.session.get());
    int rc = round.rc;
    bool confirmed = round.confirmed;
    bool stolen = false;
    if (p.rearm.has_value()) {
      // Its reply came before the probe's (one connection, in order) unless the connection
      // dropped: then it is not awaited for long. Its own reply is this grant's evidence, as the
      // exists of a round used to be: sent after the sync and after t_send, it found the node
      // ours. That holds even if the connection moved during the round: the client reconnects
      // only to a server at least as new as the last zxid it saw (the sync's, when it answered),
      // so the get is not older than the sync.
      ZkAnswer answer;
      const int arc = p.rearm->Await(deadline, &answer);
      if (arc == ZOK && (answer.stat.ephemeralOwner != p.held.session->session_id() ||
                         static_cast<FencingToken>(answer.stat.czxid) != p.held.czxid)) {
        stolen = true;
      } else if (arc == ZNONODE || IsZkSessionGone(arc)) {
        rc = arc;
        confirmed = false;
      } else if (arc != ZOK) {
        rc = rc == ZOK ? arc : rc;
        confirmed = false;
      } else {
        confirmed = round.sync_rc == ZOK;
        if (confirmed) {
          rc = ZOK;
        }
      }
    }
    // Read only now: after the probe's reply (and the re-arm's) were awaited.
    const int seen = p.held.watch->state.load(std::memory_order_acquire);
    const bool session_gone =
        IsZkSessionGone(rc) || seen == ZkNodeWatch::kSessionEnded || p.held.session->Expired();
    if (!stolen && !session_gone && seen == ZkNodeWatch::kLive && rc != ZNONODE && confirmed) {
      MutexLock lock(&mu_);
      auto it = grants_.find(grant_key);
      if (it == grants_.end()) {
        results[p.index] = Status::Lost(fmt::format("{} was released or expired", request.key));
      } else if (clock_.Now() >= it->second.deadline) {
        // Confirmed too late: the holder has already given the lease up.
        results[p.index] =
            Status::Lost(fmt::format("renewal of {} confirmed after its deadline", request.key),
                         LostCause::kExpired);
        doomed_.push_back({.session = it->second.session, .path = it->second.path});
        grants_.erase(it);
        reaper_cv_.NotifyAll();
      } else {
        it->second.deadline = std::max(it->second.deadline, t_send + it->second.ttl);
        if (round.confirmed) {
          // Registered on the connection that answered the whole round: later rounds need not
          // re-arm it. (A connection that moved leaves the old epoch: re-armed next round.)
          it->second.armed_epoch = round.epoch;
        }
      }
      continue;
    }
    if (stolen || session_gone || seen != ZkNodeWatch::kLive || rc == ZNONODE) {
      const LostCause cause = session_gone ? LostCause::kSessionLost
                              : stolen     ? LostCause::kStolen
                                           : LostCause::kStoreSaidNo;
      {
        MutexLock lock(&mu_);
        auto it = grants_.find(grant_key);
        if (it != grants_.end() && seen == ZkNodeWatch::kChanged && !session_gone) {
          // Changed under us (not by this handle): the lease is given up, its node goes.
          doomed_.push_back({.session = it->second.session, .path = it->second.path});
          reaper_cv_.NotifyAll();
        }
        if (it != grants_.end()) {
          grants_.erase(it);
        }
      }
      results[p.index] =
          Status::Lost(fmt::format("the ZooKeeper node of {} is {}", request.key,
                                   session_gone ? "gone with its expired session"
                                   : stolen || seen == ZkNodeWatch::kChanged
                                       ? "not ours any more"
                                       : "gone (force-released, or its session expired)"),
                       cause);
      continue;
    }
    // Not confirmed (a timeout, a connection lost or moved to another server): not renewed, at
    // risk until a later round confirms it or its deadline passes.
    results[p.index] = ZkErrorStatus(rc == ZOK ? ZCONNECTIONLOSS : rc,
                                     fmt::format("renewing {}", request.key), options_);
  }
  return results;
}

Status ZkBackend::Delete(std::string_view key, std::string_view owner_token) {
  Held held;
  {
    MutexLock lock(&mu_);
    auto it = grants_.find({std::string(key), std::string(owner_token)});
    if (it == grants_.end()) {
      return Status::Lost(
          fmt::format("{} is not held with this token (released, expired or never granted)", key));
    }
    held = it->second;
    grants_.erase(it);
  }
  if (held.session->Expired()) {
    return Status::Lost(fmt::format("the ZooKeeper session that held {} expired", key),
                        LostCause::kSessionLost);
  }
  ZkRequests requests(*held.session, options_.command_timeout);

  struct Stat stat {};

  int rc = requests.Exists(held.path, &stat);
  if (rc == ZOK && (stat.ephemeralOwner != held.session->session_id() ||
                    static_cast<FencingToken>(stat.czxid) != held.czxid)) {
    return Status::Lost(fmt::format("the node of {} is not ours any more", key),
                        LostCause::kStolen);
  }
  if (rc == ZOK) {
    rc = requests.Delete(held.path, stat.version);
  }
  if (rc == ZOK) {
    return Status();
  }
  if (rc == ZNONODE) {
    return Status::Lost(fmt::format("the node of {} was already gone", key));
  }
  if (IsZkSessionGone(rc)) {
    return Status::Lost(fmt::format("the ZooKeeper session that held {} expired", key),
                        LostCause::kSessionLost);
  }
  // Unknown outcome: the reaper deletes the node once the session answers again, so the key is
  // not left blocked by a grant nobody holds.
  Doom({.session = held.session, .path = held.path});
  return ZkErrorStatus(rc, fmt::format("releasing {}", key), options_);
}

Status ZkBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  if (request.keep == Duration::zero() && !request.record.has_value()) {
    return Delete(request.key, request.owner_token);
  }
  Held held;
  {
    MutexLock lock(&mu_);
    auto it = grants_.find({request.key, request.owner_token});
    if (it == grants_.end()) {
      return Status::Lost(fmt::format(
          "{} is not held with this token (released, expired or never granted)", request.key));
    }
    held = it->second;
    grants_.erase(it);
  }
  if (held.session->Expired()) {
    return Status::Lost(fmt::format("the ZooKeeper session that held {} expired", request.key),
                        LostCause::kSessionLost);
  }
  if (clock_.Now() >= held.deadline) {
    // Not renewed in time: given up already (the reaper was about to delete it).
    Doom({.session = held.session, .path = held.path});
    return Status::Lost(fmt::format("{} passed its deadline before it was finished", request.key),
                        LostCause::kExpired);
  }
  const std::string dir = held.path.substr(0, held.path.rfind('/'));
  const struct ACL_vector* acl = NodeAcl(options_);
  ZkRequests requests(*held.session, options_.command_timeout);
  int rc = ZOK;
  for (int attempt = 0; attempt < kRaceRetries; ++attempt) {
    struct Stat stat {};

    rc = requests.Exists(held.path, &stat);
    if (rc == ZOK && (stat.ephemeralOwner != held.session->session_id() ||
                      static_cast<FencingToken>(stat.czxid) != held.czxid)) {
      return Status::Lost(fmt::format("the node of {} is not ours any more", request.key),
                          LostCause::kStolen);
    }
    if (rc == ZNONODE) {
      return Status::Lost(fmt::format("the node of {} was already gone", request.key));
    }
    if (rc != ZOK) {
      break;
    }
    // The versioned delete of our node is the owner check; the kept node and the record are
    // created or set in the same multi (an exists says which; if that changes before the multi,
    // the multi fails and we look again). The delete goes last: ZooKeeper applies a multi's ops
    // in order and fires each one's watches as it applies it, so a waiter that watches our node
    // and <key>/kept sees the kept node's create before our node's delete (Wait's handoff).
    std::vector<ZkMultiOp> ops;
    const bool slotted = !IsExclusive(held.kind);
    if (slotted && request.keep > Duration::zero()) {
      // The grant's slot moves to a kept node: a slot being chosen meanwhile (ClaimSlot) must
      // look again, so the key node's version moves with it.
      ops.push_back({.kind = ZkMultiOp::kSet, .path = dir, .data = "", .version = -1});
    }
    auto write = [&](std::string_view name, std::string data) -> int {
      const std::string path = dir + "/" + std::string(name);

      struct Stat existing {};

      const int erc = requests.Exists(path, &existing);
      if (erc == ZNONODE) {
        ops.push_back({.kind = ZkMultiOp::kCreate,
                       .path = path,
                       .data = std::move(data),
                       .mode = ZOO_PERSISTENT});
        return ZOK;
      }
      if (erc == ZOK) {
        ops.push_back({.kind = ZkMultiOp::kSet,
                       .path = path,
                       .data = std::move(data),
                       .version = existing.version});
      }
      return erc;
    };
    if (request.keep > Duration::zero()) {
      rc = write(zk_layout::KeptName(held.kind, held.slot),
                 KeptData(request.keep, held.czxid, request.owner_token, held.holder));
    }
    if (rc == ZOK && request.record.has_value()) {
      rc = write(kRecordName, RecordData(request.record_ttl, *request.record));
    }
    if (rc != ZOK) {
      break;
    }
    ops.push_back({.kind = ZkMultiOp::kDelete, .path = held.path, .version = stat.version});
    std::vector<int> errors;
    rc = requests.Multi(ops, acl, &errors);
    if (rc == ZOK) {
      return Status();
    }
    // Ops before the failing one report ZOK, those after it ZRUNTIMEINCONSISTENCY: if every
    // write before the delete went through, the delete failed: our node changed or went.
    if (errors.size() == ops.size() &&
        std::all_of(errors.begin(), errors.end() - 1, [](int e) { return e == ZOK; }) &&
        errors.back() != ZOK) {
      return Status::Lost(fmt::format("the node of {} is not ours any more", request.key),
                          LostCause::kStolen);
    }
    if (rc != ZNONODE && rc != ZNODEEXISTS && rc != ZBADVERSION) {
      break;
    }
  }
  if (IsZkSessionGone(rc)) {
    return Status::Lost(fmt::format("the ZooKeeper session that held {} expired", request.key),
                        LostCause::kSessionLost);
  }
  // Unknown outcome (or the record kept changing). If the multi was not applied, our node is
  // still there: with keep it stays until the keep has passed (then the reaper deletes it, as
  // for any grant past its deadline), without keep it goes now, as in Release.
  if (request.keep > Duration::zero()) {
    held.deadline = std::max(held.deadline, clock_.Now() + request.keep);
    MutexLock lock(&mu_);
    grants_[{request.key, request.owner_token}] = held;
    reaper_cv_.NotifyAll();
  } else {
    Doom({.session = held.session, .path = held.path});
  }
  if (rc == ZNONODE || rc == ZNODEEXISTS || rc == ZBADVERSION) {
    return Status::Unavailable(
        fmt::format("the record of {} kept changing while finishing; try again", request.key));
  }
  return ZkErrorStatus(rc, fmt::format("finishing {}", request.key), options_);
}

Status ZkBackend::DeleteOrDoom(const std::shared_ptr<ZkSession>& session, const std::string& path) {
  ZkRequests requests(*session, options_.command_timeout);
  int rc = requests.Delete(path, -1);  // the name is unique to us: -1 cannot hit another's
  if (rc == ZOK || rc == ZNONODE || IsZkSessionGone(rc)) {
    return Status();
  }
  Doom({.session = session, .path = path});
  return ZkErrorStatus(rc, "deleting a node", options_);
}

void ZkBackend::Doom(Doomed doomed) {
  MutexLock lock(&mu_);
  doomed_.push_back(std::move(doomed));
  reaper_cv_.NotifyAll();
}

Result<std::vector<LeaseInfo>> ZkBackend::Holders(std::string_view key) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  std::optional<LeaseInfo> writer;
  LH_ASSIGN_OR_RETURN(std::vector<LiveGrant> grants, ReadGrants(*session, key, &writer));
  std::vector<LeaseInfo> out;
  out.reserve(grants.size() + 1);
  for (LiveGrant& g : grants) {
    out.push_back(std::move(g.info));
  }
  if (writer.has_value()) {
    out.push_back(std::move(*writer));
  }
  return out;
}

Result<std::vector<LeaseInfo>> ZkBackend::List(std::string_view prefix) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  std::vector<std::string> names;
  {
    ZkRequests requests(*session, options_.command_timeout);
    int rc = requests.Children(base_, &names);
    if (rc == ZNONODE) {
      return std::vector<LeaseInfo>();
    }
    if (rc != ZOK) {
      return ZkErrorStatus(rc, "listing leases", options_);
    }
  }
  const std::vector<std::string> keys = KeysWithPrefix(names, prefix);
  std::vector<LeaseInfo> out;
  for (const std::string& key : keys) {
    LH_ASSIGN_OR_RETURN(std::vector<LiveGrant> grants, ReadGrants(*session, key));
    for (LiveGrant& g : grants) {
      out.push_back(std::move(g.info));
    }
  }
  return out;
}

Result<bool> ZkBackend::ForceEnd(std::string_view key, std::string_view token_prefix) {
  return token_prefix.empty() ? ForceReleaseAll(key) : ForceReleaseOne(key, token_prefix);
}

Result<bool> ZkBackend::ForceReleaseAll(std::string_view key) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  const std::string dir = KeyDir(key);
  for (int attempt = 0; attempt < kRaceRetries; ++attempt) {
    ZkRequests requests(*session, options_.command_timeout);
    std::vector<std::string> children;
    int rc = requests.Children(dir, &children);
    if (rc == ZNONODE) {
      return false;
    }
    if (rc != ZOK) {
      return ZkErrorStatus(rc, fmt::format("force-releasing {}", key), options_);
    }
    const Listing listing = ParseListing(std::move(children));
    LH_ASSIGN_OR_RETURN(std::vector<Kept> kept, ReadKeptNodes(*session, key, dir, listing.kept));
    // Every kept node goes, live or expired (an expired one is tidied away); of the queued
    // nodes only the granted ones (as the live kept grants leave them): waiters stay queued, so
    // the next ones then hold the key.
    bool released = false;
    bool raced = false;
    for (const Kept& k : kept) {
      rc = requests.Delete(dir + "/" + k.name, k.version);
      if (rc == ZBADVERSION) {
        raced = true;  // replaced meanwhile (a new kept grant): decide again
      } else if (rc != ZOK && rc != ZNONODE) {
        return ZkErrorStatus(rc, fmt::format("force-releasing {}", key), options_);
      } else if (rc == ZOK && k.remaining > Duration::zero()) {
        released = true;
        LogEvent(LogLevel::kWarning, "zk_force_release",
                 {{"key", std::string(key)}, {"node", k.name}});
      }
    }
    if (raced) {
      continue;
    }
    std::erase_if(kept, [](const Kept& k) { return k.remaining <= Duration::zero(); });
    std::vector<NodeKind> kept_kinds;
    for (const Kept& k : kept) {
      kept_kinds.push_back(k.kind);
    }
    const std::vector<bool> granted = GrantedOf(listing.kinds, kept_kinds);
    for (std::size_t i = 0; i < listing.queued.size(); ++i) {
      if (!granted[i]) {
        continue;
      }
      rc = requests.Delete(dir + "/" + listing.queued[i], -1);
      if (rc == ZOK) {
        released = true;
        LogEvent(LogLevel::kWarning, "zk_force_release",
                 {{"key", std::string(key)}, {"node", listing.queued[i].substr(0, 9)}});
      } else if (rc != ZNONODE) {
        return ZkErrorStatus(rc, fmt::format("force-releasing {}", key), options_);
      }
    }
    // Grants that left by themselves meanwhile are not followed by the waiters they admitted:
    // those were not grants when the key was read.
    return released;
  }
  return Status::Unavailable(
      fmt::format("the holder of {} kept changing while force-releasing; try again", key));
}

Result<bool> ZkBackend::ForceReleaseOne(std::string_view key, std::string_view token_prefix) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  for (int attempt = 0; attempt < kRaceRetries; ++attempt) {
    LH_ASSIGN_OR_RETURN(std::vector<LiveGrant> grants, ReadGrants(*session, key));
    // A node keeps 8 hex digits of its token (zk_layout::NodeData): a longer prefix is matched
    // on those.
    auto match = std::find_if(grants.begin(), grants.end(), [&](const LiveGrant& g) {
      const std::size_t n = std::min(token_prefix.size(), g.info.token_prefix.size());
      return n > 0 && g.info.token_prefix.substr(0, n) == token_prefix.substr(0, n);
    });
    if (match == grants.end()) {
      return false;
    }
    ZkRequests requests(*session, options_.command_timeout);
    // Versioned for a kept node (its name is reused by the next kept grant of its slot); a
    // child's name is never reused.
    const int rc = requests.Delete(match->path, match->kept ? match->version : -1);
    if (rc == ZOK) {
      LogEvent(
          LogLevel::kWarning, "zk_force_release",
          {{"key", std::string(key)}, {"node", match->path.substr(match->path.rfind('/') + 1, 9)}});
      return true;
    }
    if (rc != ZNONODE && rc != ZBADVERSION) {
      return ZkErrorStatus(rc, fmt::format("force-releasing a grant of {}", key), options_);
    }
  }
  return Status::Unavailable(
      fmt::format("the holders of {} kept changing while force-releasing; try again", key));
}

void ZkBackend::ReaperLoop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    std::vector<Doomed> work;
    {
      MutexLock lock(&mu_);
      const SteadyTime now = clock_.Now();
      SteadyTime next = now + std::chrono::seconds(1);
      for (auto it = grants_.begin(); it != grants_.end();) {
        if (now >= it->second.deadline) {
          // Not renewed in time: the holder has given it up (its safe_until has passed), so
          // the node must not block the key any longer, whether or not its session lives.
          LogEvent(LogLevel::kInfo, "zk_grant_expired", {{"key", it->first.first}});
          doomed_.push_back({.session = it->second.session, .path = it->second.path});
          it = grants_.erase(it);
        } else {
          next = std::min(next, it->second.deadline);
          ++it;
        }
      }
      work.swap(doomed_);
      if (work.empty()) {
        reaper_cv_.WaitUntil(ToSteady(next, clock_), stop, [&]() LH_REQUIRES(mu_) {
          return !doomed_.empty() ||
                 std::any_of(grants_.begin(), grants_.end(),
                             [&](const auto& g) { return g.second.deadline < next; });
        });
        continue;
      }
    }
    std::vector<Doomed> retry;
    for (Doomed& d : work) {
      if (d.session->Expired()) {
        continue;  // its ephemeral nodes went with it
      }
      ZkRequests requests(*d.session, options_.command_timeout);
      std::vector<std::string> paths;
      int rc = ZOK;
      if (d.path.empty()) {
        std::vector<std::string> children;
        rc = requests.Children(d.dir, &children);
        for (const std::string& child : children) {
          if (HasIdPrefix(child, d.prefix)) {
            paths.push_back(d.dir + "/" + child);
          }
        }
      } else {
        paths.push_back(d.path);
      }
      bool done = rc == ZOK || rc == ZNONODE || IsZkSessionGone(rc);
      if (rc == ZOK) {
        for (const std::string& path : paths) {
          int drc = requests.Delete(path, -1);  // unique name: never another's node
          done = done && (drc == ZOK || drc == ZNONODE || IsZkSessionGone(drc));
        }
      }
      if (done) {
        continue;
      }
      if (++d.attempts < kReaperMaxAttempts) {
        retry.push_back(std::move(d));
      }
    }
    MutexLock lock(&mu_);
    for (Doomed& d : retry) {
      doomed_.push_back(std::move(d));
    }
    if (!retry.empty()) {
      reaper_cv_.WaitUntil(ToSteady(clock_.Now() + kReaperRetry, clock_), stop,
                           [] { return false; });
    }
  }
}

Result<Duration> ZkBackend::NegotiatedTimeoutForTesting(Duration ttl) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, LeaseSession(ttl));
  return session->negotiated();
}

int ZkBackend::ConnectedPortForTesting(Duration ttl) {
  std::shared_ptr<ZkSession> session;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(duration_cast<milliseconds>(ttl).count());
    if (it == sessions_.end()) {
      return -1;
    }
    session = it->second;
  }
  return session->ConnectedPort();
}

}  // namespace leasehold::internal
