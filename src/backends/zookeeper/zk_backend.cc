// File: backends/zookeeper/zk_backend.cc (internal)
//
// The zk:// store. See zk_backend.h for the design; this file holds the lock recipe, the kept
// grants and records, and the reaper. The C client glue is in zk_session.{h,cc}, the node names
// and data in zk_layout.{h,cc}.

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
#include "backends/zookeeper/zk_session.h"
#include "core/duration.h"
#include "core/logging.h"
#include "core/owner_token.h"

namespace leasehold::internal {

using std::chrono::duration_cast;
using std::chrono::milliseconds;
using zk_layout::EscapeKey;
using zk_layout::FromZkMillis;
using zk_layout::KeptData;
using zk_layout::KeysWithPrefix;
using zk_layout::kKeptName;
using zk_layout::kRecordName;
using zk_layout::NodeData;
using zk_layout::NodeKind;
using zk_layout::ParseKeptData;
using zk_layout::ParseNodeData;
using zk_layout::RecordData;
using zk_layout::SortBySequence;

namespace {

// How many times an operation re-reads after a race (the holder left between two reads).
constexpr int kRaceRetries = 4;
// Reaper: how often it retries background deletes, and how many times before giving up (the
// node then goes with its session).
constexpr Duration kReaperRetry = std::chrono::milliseconds(200);
constexpr int kReaperMaxAttempts = 300;
// The most multis one fenced write sends: the first planned on a guess (every node exists), the
// second on what a pipelined exists of every node said, then one more per node that another
// client created or deleted between that exists and the multi.
constexpr int kFencedAttempts = 2 + kRaceRetries;
// How many times ClaimSlot looks again after another grant of the key chose its slot first (each
// retry follows another claim's success: one release admits at most N at once).
constexpr int kClaimAttempts = 32;
// How long ClaimSlot lets an admitted child ahead write its slot first (grants in queue order):
// a live waiter woken by the same release does it within a few round trips.
constexpr Duration kInOrderWait = std::chrono::milliseconds(100);

// The ACL of every node the store creates: creator-only with credentials, else open.
const struct ACL_vector* NodeAcl(const ZkOptions& options) {
  return options.user.has_value() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
}

// A FencedWrite as one multi, planned against what is known of its nodes before the write.
struct FencedPlan {
  // The check of the grant's node first (unless unguarded), then the ops that do something.
  std::vector<ZkMultiOp> ops;
  // Per multi op: the index of its FencedOp (-1 for the check).
  std::vector<int> op_of;
  // Per FencedOp: its count if the multi commits.
  std::vector<std::int64_t> affected;
};

// Plans `ops` as setData/create/delete on absolute paths (chroot + key). `present` says whether
// a node exists before the write; a node it does not name is taken to exist (the common case:
// a Put overwrites). Each op sees the ops before it on the same node (a Put leaves it present,
// a Delete absent), as the multi applies them in order; a Delete of an absent node is dropped
// and counts 0. So a multi planned this way can only miss on the first op of a node (its state
// before the write), which is what ZkBackend::FencedWrite learns from a failed attempt.
FencedPlan PlanFencedWrite(const std::vector<FencedOp>& ops, const std::string& chroot,
                           const std::string& check_path,
                           const std::map<std::string, bool>& present) {
  FencedPlan plan;
  if (!check_path.empty()) {
    // Version -1: the node exists. Its name is never reused (zk_backend.h), so that is this
    // grant's node, whose czxid is the fencing token.
    plan.ops.push_back({.kind = ZkMultiOp::kCheck, .path = check_path});
    plan.op_of.push_back(-1);
  }
  std::map<std::string, bool> state = present;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const FencedOp& op = ops[i];
    auto it = state.try_emplace(chroot + op.key, true).first;
    const bool exists = it->second;
    if (op.kind == FencedOp::Kind::kPut) {
      if (exists) {
        plan.ops.push_back({.kind = ZkMultiOp::kSet, .path = it->first, .data = op.value});
      } else {
        plan.ops.push_back({.kind = ZkMultiOp::kCreate,
                            .path = it->first,
                            .data = op.value,
                            .mode = ZOO_PERSISTENT});
      }
      plan.op_of.push_back(static_cast<int>(i));
      plan.affected.push_back(1);
      it->second = true;
    } else {
      if (exists) {
        plan.ops.push_back({.kind = ZkMultiOp::kDelete, .path = it->first});
        plan.op_of.push_back(static_cast<int>(i));
      }
      plan.affected.push_back(exists ? 1 : 0);
      it->second = false;
    }
  }
  return plan;
}

// A key's children as one listing shows them: the queued nodes (grants and waiters) in
// sequence order with their kinds, and the names of its kept nodes.
struct Listing {
  std::vector<std::string> queued;
  std::vector<NodeKind> kinds;
  std::vector<std::string> kept;
};

Listing ParseListing(std::vector<std::string> children) {
  Listing listing;
  for (const std::string& child : children) {
    if (zk_layout::ParseKeptName(child).has_value()) {
      listing.kept.push_back(child);
    }
  }
  SortBySequence(children);
  listing.queued = std::move(children);
  for (const std::string& name : listing.queued) {
    listing.kinds.push_back(zk_layout::KindOfNode(name));
  }
  return listing;
}

// True if the child `name` is the node of the id `prefix` ("<id>-" or "<id>", any kind's tag
// after it): the id ends where a '.' (a tag) or the '-' before the sequence follows it.
bool HasIdPrefix(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) {
    return false;
  }
  return prefix.ends_with('-') || (name.size() > prefix.size() &&
                                   (name[prefix.size()] == '.' || name[prefix.size()] == '-'));
}

bool IsExclusive(const NodeKind& kind) {
  return kind.limit == 1 && kind.mode == LeaseMode::kExclusive;
}

// Admission, by position in the queue (the recipe of Curator's InterProcessSemaphoreV2 and
// InterProcessReadWriteLock, over one queue). Child i of a listing (in sequence order, with the
// key's live kept grants `kept`) holds the key when every child before it and every live kept
// grant asks for its limit, and:
//   a semaphore of N   fewer than N children before it, counting the live kept grants;
//   shared             no exclusive child before it and no live exclusive kept grant;
//   exclusive          it is the first child and there is no live kept grant.
// Why deciding from a listing after the create is safe (no over-admission, no two families at
// once): sequence numbers only grow, so every child created later sorts after ours and every
// child before ours was created before it; children only leave (a kept grant only replaces the
// child it was, in the same multi). So the children before ours, which are all a decision reads,
// only shrink, and a child admitted stays admitted while it lives. A child admitted while an
// earlier one still lives read that one in its listing, with its kind; and no child counts
// fewer than N children before it unless fewer than N children and kept grants are live before
// it. So at most N grants of a semaphore are live, an exclusive one alone, shared ones only with
// no exclusive one before them, which is writer preference by order: an exclusive waiter keeps
// every later shared child out. A child of another limit than one before it is never admitted
// (TryAcquire reports LimitMismatch and deletes it), and a child after one of another limit
// neither: it may be refused because of a mismatched child that is about to go, never admitted
// next to one.
std::vector<bool> GrantedOf(const std::vector<NodeKind>& kinds, const std::vector<NodeKind>& kept) {
  std::vector<bool> granted(kinds.size(), false);
  std::optional<std::uint32_t> limit;
  bool mixed = false;
  bool exclusive_before = false;
  auto see = [&](const NodeKind& kind) {
    if (!limit.has_value()) {
      limit = kind.limit;
    } else if (*limit != kind.limit) {
      mixed = true;
    }
    exclusive_before = exclusive_before || IsExclusive(kind);
  };
  for (const NodeKind& kind : kept) {
    see(kind);
  }
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    const NodeKind& kind = kinds[i];
    if (!mixed && (!limit.has_value() || *limit == kind.limit)) {
      if (kind.limit > 1) {
        granted[i] = i + kept.size() < kind.limit;
      } else if (kind.mode == LeaseMode::kExclusive) {
        granted[i] = i == 0 && kept.empty();
      } else {
        granted[i] = !exclusive_before;
      }
    }
    see(kind);
  }
  return granted;
}

// What child `mine` of a listing disagrees with: a live kept grant (kept index k, as -2 - k) or
// a child before it (its index) of another limit; -1 if none.
int MismatchOf(const std::vector<NodeKind>& kinds, const std::vector<NodeKind>& kept,
               std::size_t mine) {
  for (std::size_t k = 0; k < kept.size(); ++k) {
    if (kept[k].limit != kinds[mine].limit) {
      return -2 - static_cast<int>(k);
    }
  }
  for (std::size_t j = 0; j < mine; ++j) {
    if (kinds[j].limit != kinds[mine].limit) {
      return static_cast<int>(j);
    }
  }
  return -1;
}

// The parent of a data path, as the caller named it ("/" for a top-level node).
std::string ParentOf(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == 0 ? std::string("/") : std::string(path.substr(0, slash));
}

}  // namespace

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

Result<std::optional<LeaseInfo>> ZkBackend::ReadHolder(ZkSession& session, std::string_view key) {
  LH_ASSIGN_OR_RETURN(std::vector<LiveGrant> grants, ReadGrants(session, key));
  if (grants.empty()) {
    return std::optional<LeaseInfo>();
  }
  return std::optional<LeaseInfo>(std::move(grants.front().info));
}

Result<std::vector<ZkBackend::LiveGrant>> ZkBackend::ReadGrants(ZkSession& session,
                                                                std::string_view key,
                                                                std::optional<LeaseInfo>* writer) {
  const std::string dir = KeyDir(key);
  for (int attempt = 0; attempt < kRaceRetries; ++attempt) {
    std::vector<std::string> children;
    int rc = ZOK;
    {
      ZkRequests requests(session, options_.command_timeout);
      rc = requests.Children(dir, &children);
    }
    if (rc == ZNONODE) {
      return std::vector<LiveGrant>();
    }
    if (rc != ZOK) {
      return ZkErrorStatus(rc, "reading a lease", options_);
    }
    Listing listing = ParseListing(std::move(children));
    LH_ASSIGN_OR_RETURN(std::vector<Kept> kept, ReadKeptNodes(session, key, dir, listing.kept));
    std::erase_if(kept, [](const Kept& k) { return k.remaining <= Duration::zero(); });
    int grc = ZOK;
    LH_ASSIGN_OR_RETURN(std::vector<LiveGrant> grants,
                        GrantsOf(session, key, dir, listing.queued, listing.kinds, kept,
                                 listing.queued.size(), &grc));
    if (grc == ZNONODE) {
      continue;  // a holder left between the two reads
    }
    if (writer != nullptr) {
      LH_ASSIGN_OR_RETURN(*writer,
                          WaitingWriterOf(session, key, dir, listing.queued, listing.kinds, kept));
    }
    return grants;
  }
  return Status::Unavailable(
      fmt::format("the holders of {} kept changing while they were read; try again", key));
}

Result<std::optional<LeaseInfo>> ZkBackend::WaitingWriterOf(ZkSession& session,
                                                            std::string_view key,
                                                            const std::string& dir,
                                                            const std::vector<std::string>& queued,
                                                            const std::vector<NodeKind>& kinds,
                                                            const std::vector<Kept>& kept) {
  std::vector<NodeKind> kept_kinds;
  for (const Kept& k : kept) {
    kept_kinds.push_back(k.kind);
  }
  const std::vector<bool> granted = GrantedOf(kinds, kept_kinds);
  for (std::size_t j = 0; j < queued.size(); ++j) {
    if (!IsExclusive(kinds[j]) || granted[j]) {
      continue;
    }
    std::string data;

    struct Stat stat {};

    ZkRequests requests(session, options_.command_timeout);
    const int rc = requests.Get(dir + "/" + queued[j], &data, &stat);
    if (rc == ZNONODE) {
      return std::optional<LeaseInfo>();  // it left (granted or gave up) since the listing
    }
    if (rc != ZOK) {
      return ZkErrorStatus(rc, "reading a waiting writer", options_);
    }
    LeaseInfo info = zk_layout::ParseNode(key, queued[j], data, 0);
    info.fencing_token = 0;
    info.token_prefix.clear();
    info.remaining = info.ttl;
    info.remaining_is_upper_bound = true;
    info.waiting_writer = true;
    return std::optional<LeaseInfo>(std::move(info));
  }
  return std::optional<LeaseInfo>();
}

Result<std::vector<ZkBackend::LiveGrant>> ZkBackend::GrantsOf(
    ZkSession& session, std::string_view key, const std::string& dir,
    const std::vector<std::string>& queued, const std::vector<NodeKind>& kinds,
    const std::vector<Kept>& kept, std::size_t end, int* rc) {
  *rc = ZOK;
  std::vector<NodeKind> kept_kinds;
  for (const Kept& k : kept) {
    kept_kinds.push_back(k.kind);
  }
  const std::vector<bool> granted = GrantedOf(kinds, kept_kinds);
  std::vector<std::size_t> at;
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < std::min(end, queued.size()); ++i) {
    if (granted[i]) {
      at.push_back(i);
      paths.push_back(dir + "/" + queued[i]);
    }
  }
  std::vector<std::string> values;
  std::vector<struct Stat> stats;
  std::vector<int> rcs;
  if (!paths.empty()) {
    ZkRequests requests(session, options_.command_timeout);
    rcs = requests.GetAll(paths, &values, &stats);
  }
  std::vector<LiveGrant> out;
  for (std::size_t n = 0; n < paths.size(); ++n) {
    if (rcs[n] == ZNONODE) {
      *rc = ZNONODE;  // it left: those after it may have been admitted since, read again
      return std::vector<LiveGrant>();
    }
    if (rcs[n] != ZOK) {
      return ZkErrorStatus(rcs[n], "reading a lease", options_);
    }
    LiveGrant g{.info = zk_layout::ParseNode(key, queued[at[n]], values[n],
                                             static_cast<FencingToken>(stats[n].czxid)),
                .path = paths[n],
                .version = stats[n].version};
    g.slotted = kinds[at[n]] == NodeKind{} || zk_layout::SlotOfNodeData(values[n]).has_value();
    out.push_back(std::move(g));
  }
  for (const Kept& k : kept) {
    out.push_back({.info = k.info, .path = dir + "/" + k.name, .version = k.version, .kept = true});
  }
  // Children admitted but not yet made grants get the smallest slots left, in queue order.
  std::set<std::uint32_t> used;
  for (const LiveGrant& g : out) {
    if (g.slotted) {
      used.insert(g.info.slot);
    }
  }
  std::uint32_t next = 0;
  for (LiveGrant& g : out) {
    if (!g.slotted) {
      while (used.contains(next)) {
        ++next;
      }
      g.info.slot = next++;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const LiveGrant& a, const LiveGrant& b) {
    return a.info.slot != b.info.slot ? a.info.slot < b.info.slot
                                      : a.info.fencing_token < b.info.fencing_token;
  });
  return out;
}

Result<std::vector<ZkBackend::Kept>> ZkBackend::ReadKeptNodes(
    ZkSession& session, std::string_view key, const std::string& dir,
    const std::vector<std::string>& names) {
  std::vector<Kept> out;
  if (names.empty()) {
    return out;
  }
  std::vector<std::string> paths;
  for (const std::string& name : names) {
    paths.push_back(dir + "/" + name);
  }
  std::vector<std::string> values;
  std::vector<struct Stat> stats;
  std::vector<int> rcs;
  {
    ZkRequests requests(session, options_.command_timeout);
    rcs = requests.GetAll(paths, &values, &stats);
  }
  std::vector<std::int64_t> mtimes;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (rcs[i] == ZNONODE) {
      continue;
    }
    if (rcs[i] != ZOK) {
      return ZkErrorStatus(rcs[i], "reading a kept grant", options_);
    }
    std::optional<LeaseInfo> info = ParseKeptData(key, values[i]);
    std::optional<zk_layout::KeptSlot> slot = zk_layout::ParseKeptName(names[i]);
    if (!info.has_value() || !slot.has_value()) {
      continue;  // not our layout: never taken for a grant
    }
    info->mode = slot->kind.mode;
    info->limit = slot->kind.limit;
    info->slot = slot->slot;
    out.push_back({.info = std::move(*info),
                   .version = stats[i].version,
                   .name = names[i],
                   .kind = slot->kind});
    mtimes.push_back(stats[i].mtime);
  }
  if (out.empty()) {
    return out;
  }
  // Judged on the leader's clock, read after the nodes: an mtime is never ahead of it.
  LH_ASSIGN_OR_RETURN(SystemTime now, LeaderNow(session));
  for (std::size_t i = 0; i < out.size(); ++i) {
    Kept& kept = out[i];
    kept.remaining = duration_cast<Duration>(FromZkMillis(mtimes[i]) + kept.info.ttl - now);
    kept.info.remaining =
        std::chrono::ceil<milliseconds>(std::max(Duration::zero(), kept.remaining));
  }
  return out;
}

Result<SystemTime> ZkBackend::LeaderNow(ZkSession& session) {
  ZkRequests requests(session, options_.command_timeout);

  struct Stat stat {};

  // A write goes through the leader, which stamps it with its own wall clock (the transaction
  // time becomes the node's mtime): the store's clock in one round trip.
  int rc = requests.Set(clock_path_, "", -1, &stat);
  if (rc == ZNONODE) {
    const struct ACL_vector* acl = NodeAcl(options_);
    rc = requests.Create(clock_path_, "", acl, ZOO_PERSISTENT, nullptr, &stat);
    if (rc == ZNODEEXISTS) {
      rc = requests.Set(clock_path_, "", -1, &stat);
    }
  }
  if (rc != ZOK) {
    return ZkErrorStatus(rc, "reading the leader's clock", options_);
  }
  return FromZkMillis(stat.mtime);
}

Result<Grant> ZkBackend::TryAcquire(const GrantRequest& request) {
  // Our own t_send, read after the core's: the local deadline is never before safe_until.
  const SteadyTime t_send = clock_.Now();
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, LeaseSession(request.ttl));
  const std::string dir = KeyDir(request.key);
  const bool waiting = !request.waiter_id.empty();
  std::string id;
  if (waiting) {
    id = "w" + request.waiter_id;
  } else {
    LH_ASSIGN_OR_RETURN(std::string random, NewOwnerToken());
    id = "g" + random;
  }
  // The kind is in the name (zk_layout::KindTag: none for an exclusive grant, as every earlier
  // version names it), so one listing tells every child's kind.
  const NodeKind my_kind{.mode = request.mode, .limit = request.limit};
  const bool exclusive = IsExclusive(my_kind);
  const std::string prefix = id + zk_layout::KindTag(my_kind) + "-";
  const KeyAndId waiter_key{request.key, request.waiter_id};
  const std::string data = NodeData(session->negotiated(), request.owner_token, request.holder);
  const struct ACL_vector* acl = NodeAcl(options_);

  ZkRequests requests(*session, options_.command_timeout);
  std::string my_name;

  struct Stat my_stat {};

  bool have_stat = false;
  std::vector<std::string> children;
  if (waiting) {
    // Handed over (WaitForTurn saw the predecessor, the holder, deleted, and no kept grant
    // appear): the key is this waiter's without a round trip. Its safe_until is measured from a
    // send time of its own that precedes the grant: the latest t_send of a request this session
    // had answered (last_heard: a renewal round, or the wait's own listing), before which the
    // server had heard from the session, so the session, and the waiter's node with it, cannot
    // expire before last_heard + negotiated. The grant's ttl is what is left of that, counted
    // from `now`, read after the core's t_send (backend.h), so the core's safe_until is never
    // later. The node's own watch, registered on the connection that delivered the delete event
    // and still kLive then, says it was not deleted before the predecessor was (events come in
    // order). Too little left (under nine tenths: the core checks the renew interval and drift
    // against it) and the ordinary path below runs instead: a listing and a watching get,
    // which renew first.
    std::optional<Grant> handed;
    {
      MutexLock lock(&mu_);
      auto it = waiters_.find(waiter_key);
      if (it != waiters_.end() && it->second.handed) {
        Queued& q = it->second;
        q.handed = false;  // one use: a failed attempt goes the ordinary way
        const SteadyTime now = clock_.Now();
        const SteadyTime heard = session->last_heard();
        const Duration negotiated = session->negotiated();
        if (q.session == session && !session->Expired() && q.token == request.owner_token &&
            q.watch != nullptr &&
            q.watch->state.load(std::memory_order_acquire) == ZkNodeWatch::kLive &&
            q.watch_epoch == q.handed_epoch && session->epoch() == q.handed_epoch &&
            heard != SteadyTime::min() && now >= heard &&
            negotiated - (now - heard) >= negotiated - negotiated / 10) {
          const Duration left = negotiated - (now - heard);
          grants_[{request.key, request.owner_token}] = Held{.session = session,
                                                             .path = q.path,
                                                             .czxid = q.czxid,
                                                             .holder = request.holder,
                                                             .ttl = negotiated,
                                                             .deadline = heard + negotiated,
                                                             .watch = q.watch,
                                                             .armed_epoch = q.watch_epoch};
          handed = Grant{.fencing_token = q.czxid,
                         .ttl = left,
                         .store_key = q.path.substr(options_.chroot.size())};
          waiters_.erase(it);
          reaper_cv_.NotifyAll();
        }
      }
    }
    if (handed.has_value()) {
      handed_grants_.fetch_add(1, std::memory_order_relaxed);
      return *handed;
    }
    // The waiter's node, if an earlier attempt made one, is found by its prefix: also after a
    // create whose reply was lost (it is adopted). The listing goes through the same session
    // as the create, after it, so a create the server applied is seen.
    {
      MutexLock lock(&mu_);
      Queued& queued = waiters_[waiter_key];
      if (queued.session != session) {
        queued = Queued{.session = session};  // an expired session took its node with it
      }
    }
    int rc = requests.Children(dir, &children);
    if (rc != ZOK && rc != ZNONODE) {
      return ZkErrorStatus(rc, fmt::format("reading the queue of {}", request.key), options_);
    }
    for (const std::string& child : children) {
      if (child.starts_with(prefix)) {
        my_name = child;
      }
    }
  }
  if (my_name.empty()) {
    std::string created;
    int rc = requests.Create(dir + "/" + prefix, data, acl, ZOO_EPHEMERAL_SEQUENTIAL, &created,
                             &my_stat);
    if (rc == ZNONODE) {
      LH_RETURN_IF_ERROR(EnsureParents(*session, dir));
      rc = requests.Create(dir + "/" + prefix, data, acl, ZOO_EPHEMERAL_SEQUENTIAL, &created,
                           &my_stat);
    }
    if (rc == ZOK) {
      have_stat = true;
      my_name = created.substr(created.rfind('/') + 1);
    } else if (IsZkTransient(rc)) {
      // The server may have created the node and the reply been lost. A waiter adopts it on
      // its next attempt (or AbandonWait deletes it); a plain try-acquire's node is deleted by
      // the reaper, which looks for the unique prefix through this same session (after the
      // create, so it sees it if it was made).
      if (!waiting) {
        Doom({.session = session, .dir = dir, .prefix = prefix});
      }
      return ZkErrorStatus(rc, fmt::format("acquiring {}", request.key), options_);
    } else {
      if (IsZkSessionGone(rc)) {
        return Status::Unavailable(
            fmt::format("ZooKeeper session for {} expired; a new one is opened on the next try",
                        request.key),
            fmt::format("zookeeper rc {}", rc));
      }
      return ZkErrorStatus(rc, fmt::format("acquiring {}", request.key), options_);
    }
  }
  const std::string my_path = dir + "/" + my_name;
  // The node's watch, the renewals' evidence that it is still there (RenewMany). A node just
  // created gets it now, pipelined with the listing below (same round trip); an adopted
  // waiter's node gets it when it turns out lowest, pipelined with the write of its data.
  auto node_watch = std::make_shared<ZkNodeWatch>();
  std::optional<ZkPending> arm;
  std::uint64_t arm_epoch = session->epoch();
  if (have_stat && exclusive) {
    // (A shared or semaphore grant's node is written when it is made, ClaimSlot, which would
    // fire this watch: its watch is set after that write.)
    arm = ZkPending::WatchGet(*session, my_path, node_watch);
  }
  // After a transient error: a plain try-acquire's node goes (its name is never used again); a
  // waiter's stays queued for its next attempt, or for AbandonWait.
  auto forget_node = [&] {
    if (!waiting) {
      Doom({.session = session, .path = my_path});
    }
  };

  for (int attempt = 0; attempt < kRaceRetries; ++attempt) {
    children.clear();
    int rc = requests.Children(dir, &children);
    if (rc != ZOK) {
      forget_node();
      return ZkErrorStatus(rc, fmt::format("acquiring {}", request.key), options_);
    }
    const Listing listing = ParseListing(std::move(children));
    auto mine = std::find(listing.queued.begin(), listing.queued.end(), my_name);
    if (mine == listing.queued.end()) {
      // Our node is gone: the session expired under us, or someone force-released the queue.
      {
        MutexLock lock(&mu_);
        waiters_.erase(waiter_key);
      }
      return Status::Unavailable(fmt::format(
          "the node of {} vanished while acquiring (session expiry?); try again", request.key));
    }
    const auto m = static_cast<std::size_t>(mine - listing.queued.begin());
    // A kept grant (Finish with keep > 0) holds its place ahead of every queued node while it
    // is live. It is only ever created together with the delete of its grant's node, so a
    // listing without that node already shows it.
    std::vector<Kept> kept;
    if (!listing.kept.empty()) {
      Result<std::vector<Kept>> read = ReadKeptNodes(*session, request.key, dir, listing.kept);
      if (!read.ok()) {
        forget_node();
        return read.status();
      }
      kept = std::move(*read);
    }
    auto old_kept =
        std::find_if(kept.begin(), kept.end(), [](const Kept& k) { return k.name == kKeptName; });
    if (exclusive && m == 0 && old_kept != kept.end() && old_kept->remaining <= Duration::zero()) {
      // Expired: take over. The versioned delete fails if someone else already did (or a
      // force-release); the check fails if our node went. Either way: decide again.
      std::vector<int> errors;
      rc = requests.Multi({{.kind = ZkMultiOp::kCheck, .path = my_path},
                           {.kind = ZkMultiOp::kDelete,
                            .path = dir + "/" + std::string(kKeptName),
                            .version = old_kept->version}},
                          acl, &errors);
      if (rc == ZNONODE || rc == ZBADVERSION) {
        continue;
      }
      if (rc != ZOK) {
        forget_node();
        return ZkErrorStatus(rc, fmt::format("taking over the kept grant of {}", request.key),
                             options_);
      }
    }
    // Expired kept grants hold nothing (they stay until replaced or force-released).
    std::erase_if(kept, [](const Kept& k) { return k.remaining <= Duration::zero(); });
    std::vector<NodeKind> kept_kinds;
    for (const Kept& k : kept) {
      kept_kinds.push_back(k.kind);
    }
    if (const int other = MismatchOf(listing.kinds, kept_kinds, m); other != -1) {
      // Another limit or family holds or waits ahead: refused, and our node goes (a waiter's
      // too: it would never be admitted, and it would refuse those behind it).
      LeaseInfo held;
      if (other <= -2) {
        held = kept[static_cast<std::size_t>(-2 - other)].info;
      } else {
        std::string data;

        struct Stat stat {};

        const std::string& name = listing.queued[static_cast<std::size_t>(other)];
        rc = requests.Get(dir + "/" + name, &data, &stat);
        if (rc == ZNONODE) {
          continue;  // it left: decide again
        }
        if (rc == ZOK) {
          held =
              zk_layout::ParseNode(request.key, name, data, static_cast<FencingToken>(stat.czxid));
        } else {
          const NodeKind kind = listing.kinds[static_cast<std::size_t>(other)];
          held.mode = kind.mode;
          held.limit = kind.limit;
        }
      }
      {
        MutexLock lock(&mu_);
        waiters_.erase(waiter_key);
      }
      (void)DeleteOrDoom(session, my_path);
      return LimitMismatch(request.key, held.mode, held.limit, held.holder, request.mode,
                           request.limit);
    }
    if (GrantedOf(listing.kinds, kept_kinds)[m]) {
      std::uint32_t slot = 0;
      if (!exclusive) {
        // The grant is made: its slot is written into its node data (ClaimSlot), with this
        // attempt's token, and its watch set after that write (same round trip as the write's
        // reply is awaited in ClaimSlot; the get below).
        Result<std::uint32_t> claimed =
            ClaimSlot(*session, request.key, dir, my_name, session->negotiated(),
                      request.owner_token, request.holder);
        if (!claimed.ok()) {
          forget_node();
          return claimed.status();
        }
        slot = *claimed;
        arm_epoch = session->epoch();
        arm = ZkPending::WatchGet(*session, my_path, node_watch);
      } else if (!have_stat) {
        // A queued node carries the token of the attempt that created it: show this one's (any
        // version: the name is ours alone). The watching get after it (same round trip) reads
        // the node's Stat and sets its watch after the write, so the write does not fire it.
        ZkPending set = ZkPending::Set(*session, my_path, data, -1);
        arm_epoch = session->epoch();
        arm = ZkPending::WatchGet(*session, my_path, node_watch);
        const SteadyTime until = clock_.Now() + options_.command_timeout;
        (void)set.Await(until);
      }
      // The watch's reply came before the listing's (one connection, in order), or with the
      // write above: the node's Stat, and whether the watch is known to be registered.
      ZkAnswer armed;
      rc = arm->Await(clock_.Now() + options_.command_timeout, &armed);
      if (rc == ZNONODE) {
        MutexLock lock(&mu_);
        waiters_.erase(waiter_key);
        return Status::Unavailable(fmt::format(
            "the node of {} vanished while acquiring (session expiry?); try again", request.key));
      }
      if (rc != ZOK) {
        forget_node();
        return ZkErrorStatus(rc, fmt::format("acquiring {}", request.key), options_);
      }
      my_stat = armed.stat;
      if (my_stat.ephemeralOwner != session->session_id()) {
        return Status::Internal(fmt::format("node {} is not owned by this session", my_path));
      }
      // Registered on the connection the epoch names if no session event came in between; else
      // the first renewal re-arms it.
      const std::uint64_t armed_epoch = session->epoch() == arm_epoch ? arm_epoch : 0;
      {
        MutexLock lock(&mu_);
        waiters_.erase(waiter_key);
        grants_[{request.key, request.owner_token}] =
            Held{.session = session,
                 .path = my_path,
                 .czxid = static_cast<FencingToken>(my_stat.czxid),
                 .holder = request.holder,
                 .ttl = session->negotiated(),
                 .deadline = t_send + session->negotiated(),
                 .watch = node_watch,
                 .armed_epoch = armed_epoch,
                 .kind = my_kind,
                 .slot = slot};
        reaper_cv_.NotifyAll();
      }
      // The node's path in the URL's chroot, as data paths are named (Lease::store_key).
      return Grant{.fencing_token = static_cast<FencingToken>(my_stat.czxid),
                   .ttl = session->negotiated(),
                   .store_key = my_path.substr(options_.chroot.size()),
                   .slot = slot};
    }
    // A waiter stays queued: its node, and (if this attempt created it) the node's watch,
    // whose reply came before the listing's (or not at all: then it is not known registered).
    auto stay_queued = [&] {
      ZkAnswer armed;
      const std::uint64_t epoch_before = arm_epoch;
      const int arc = arm.has_value() ? arm->Await(clock_.Now(), &armed) : ZNOTHING;
      const bool same = session->epoch() == epoch_before;
      MutexLock lock(&mu_);
      Queued& q = waiters_[waiter_key];
      if (q.session != session || q.path != my_path) {
        q = Queued{.session = session, .path = my_path};
      }
      if (arc == ZOK && armed.stat.ephemeralOwner == session->session_id()) {
        q.watch = node_watch;
        q.watch_epoch = same ? epoch_before : 0;
        q.czxid = static_cast<FencingToken>(armed.stat.czxid);
        q.token = request.owner_token;
      }
    };
    // Refused: report the live grant of the lowest slot (a live kept grant, or a child ahead).
    int grc = ZOK;
    Result<std::vector<LiveGrant>> holders =
        GrantsOf(*session, request.key, dir, listing.queued, listing.kinds, kept, m, &grc);
    if (holders.ok() && grc == ZNONODE) {
      continue;  // a holder just left: decide again
    }
    // Writer preference by order: a shared child behind a waiting exclusive one names that
    // writer, as the other stores name the writer whose intent refused the request.
    std::optional<LeaseInfo> writer;
    if (holders.ok() && my_kind.mode == LeaseMode::kShared) {
      const std::vector<bool> granted = GrantedOf(listing.kinds, kept_kinds);
      for (std::size_t j = 0; j < m; ++j) {
        if (IsExclusive(listing.kinds[j]) && !granted[j]) {
          std::string writer_data;

          struct Stat writer_stat {};

          if (requests.Get(dir + "/" + listing.queued[j], &writer_data, &writer_stat) == ZOK) {
            writer = zk_layout::ParseNode(request.key, listing.queued[j], writer_data,
                                          static_cast<FencingToken>(writer_stat.czxid));
            writer->waiting_writer = true;
          }
          break;
        }
      }
    }
    if (waiting) {
      stay_queued();
    } else {
      (void)DeleteOrDoom(session, my_path);
    }
    if (!holders.ok()) {
      return holders.status();
    }
    if (writer.has_value()) {
      return Status::HeldByAnother(*writer, "an exclusive waiter is ahead (writer preference)",
                                   /*remaining_is_upper_bound=*/true);
    }
    if (holders->empty()) {
      return Status::HeldByAnother(
          fmt::format("{} is held by another (its holders changed while read)", request.key));
    }
    const LiveGrant& holder = holders->front();
    if (holder.kept) {
      // The time left (remaining) is the kept grant's, on the leader's clock.
      return Status::HeldByAnother(holder.info, "kept after its holder (hold_at_least)");
    }
    // The holder's session timeout bounds its time left; its age is not known here.
    return Status::HeldByAnother(holder.info, {}, /*remaining_is_upper_bound=*/true);
  }
  if (!waiting) {
    (void)DeleteOrDoom(session, my_path);
  }
  return Status::Unavailable(
      fmt::format("the holder of {} kept changing while acquiring; try again", request.key));
}

// Slots. A shared or semaphore grant's slot is the smallest no other live grant of the key
// has, and stays its own while it lives. The queue's order cannot give it (positions move as
// earlier children leave), so it is written into the grant's node data when the grant is made.
// Two grants made at once (one release can admit several) must not take one slot: each reads
// the key node's data version, then the listing and the other grants' slots (reads of one
// session are served in order, so no older than that version), and writes its slot in one multi
// that also sets the key node's data at that version. Of two such multis the second fails (the
// first moved the version) and its retry reads the first's slot: claims are serialised by the
// key node's version, and each sees every earlier one. A child admitted but not yet a grant (a
// waiter admitted while it sleeps) claims later and sees ours. A Finish that turns a grant into
// a kept node named by its slot moves the version too, so a claim that read the grant's node
// gone and the listing without the kept node is retried. A slot freed by a release is free at
// once: nothing to undo. Grants of one limit N are at most N (GrantedOf), so at most N - 1
// others hold slots, and the smallest free one is below N.
Result<std::uint32_t> ZkBackend::ClaimSlot(ZkSession& session, std::string_view key,
                                           const std::string& dir, const std::string& my_name,
                                           Duration ttl, std::string_view owner_token,
                                           std::string_view holder) {
  const std::string my_path = dir + "/" + my_name;
  const struct ACL_vector* acl = NodeAcl(options_);
  const SteadyTime in_order_until = clock_.Now() + std::min(options_.command_timeout, kInOrderWait);
  for (int attempt = 0; attempt < kClaimAttempts; ++attempt) {
    const SteadyTime until = clock_.Now() + options_.command_timeout;
    ZkPending version_read = ZkPending::Exists(session, dir);
    ZkPending listing_read = ZkPending::Children(session, dir);
    ZkAnswer dir_answer;
    ZkAnswer list_answer;
    int rc = version_read.Await(until, &dir_answer);
    const int list_rc = listing_read.Await(until, &list_answer);
    rc = rc == ZOK ? list_rc : rc;
    if (rc != ZOK && rc != ZNONODE) {
      return ZkErrorStatus(rc, fmt::format("choosing a slot of {}", key), options_);
    }
    const Listing listing = ParseListing(std::move(list_answer.strings));
    if (rc == ZNONODE ||
        std::find(listing.queued.begin(), listing.queued.end(), my_name) == listing.queued.end()) {
      return Status::Unavailable(
          fmt::format("the node of {} vanished while acquiring (session expiry?); try again", key));
    }
    LH_ASSIGN_OR_RETURN(std::vector<Kept> kept, ReadKeptNodes(session, key, dir, listing.kept));
    std::erase_if(kept, [](const Kept& k) { return k.remaining <= Duration::zero(); });
    int grc = ZOK;
    LH_ASSIGN_OR_RETURN(std::vector<LiveGrant> grants,
                        GrantsOf(session, key, dir, listing.queued, listing.kinds, kept,
                                 listing.queued.size(), &grc));
    if (grc == ZNONODE) {
      continue;
    }
    // Grants are made in queue order: an admitted child ahead of ours that has not written its
    // slot yet (a waiter woken by the same release, still on its way) goes first, so that the
    // key is granted first come, first served, not by who wins the multi below. Waited for on a
    // watch of its node (its slot's write or its delete fires it), for kInOrderWait in all: one
    // that stalls longer (a holder killed between its admission and its write, whose node stays
    // until its session expires) does not hold later grants back.
    const auto mine = std::find(listing.queued.begin(), listing.queued.end(), my_name);
    std::string earlier;
    for (auto it = listing.queued.begin(); it != mine && clock_.Now() < in_order_until; ++it) {
      const std::string path = dir + "/" + *it;
      auto g = std::find_if(grants.begin(), grants.end(),
                            [&](const LiveGrant& each) { return each.path == path; });
      if (g != grants.end() && !g->slotted) {
        earlier = path;
        break;
      }
    }
    if (!earlier.empty()) {
      auto waker = std::make_shared<ZkWaker>();
      ZkRequests watch(session, options_.command_timeout);
      const int wrc = watch.Watch(earlier, waker);
      if (wrc == ZOK) {
        ZkWaker& w = *waker;
        MutexLock lock(&w.mu);
        (void)w.cv.WaitUntil(ToSteady(in_order_until, clock_), std::stop_token(),
                             [&]() LH_REQUIRES(w.mu) { return w.fired; });
      } else if (wrc != ZNONODE) {
        return ZkErrorStatus(wrc, fmt::format("choosing a slot of {}", key), options_);
      }
      --attempt;  // waiting in order is not a lost race
      continue;
    }
    std::set<std::uint32_t> used;
    bool admitted = false;
    for (const LiveGrant& g : grants) {
      if (g.path == my_path) {
        admitted = true;
      } else if (g.slotted) {
        used.insert(g.info.slot);
      }
    }
    if (!admitted) {
      // Only a kept grant judged live again (a new leader's clock behind the old one's) can
      // do this: not granted, try again.
      return Status::Unavailable(
          fmt::format("the node of {} was admitted, then not (a kept grant?); try again", key));
    }
    std::uint32_t slot = 0;
    while (used.contains(slot)) {
      ++slot;
    }
    ZkRequests requests(session, options_.command_timeout);
    std::vector<int> errors;
    rc = requests.Multi(
        {{.kind = ZkMultiOp::kSet, .path = dir, .data = "", .version = dir_answer.stat.version},
         {.kind = ZkMultiOp::kSet,
          .path = my_path,
          .data = NodeData(ttl, owner_token, holder, slot),
          .version = -1}},
        acl, &errors);
    if (rc == ZOK) {
      return slot;
    }
    if (errors.size() == 2 && errors[0] == ZBADVERSION) {
      continue;  // another grant of the key chose its slot meanwhile: look again
    }
    if (errors.size() == 2 && errors[0] == ZOK && errors[1] == ZNONODE) {
      return Status::Unavailable(
          fmt::format("the node of {} vanished while acquiring (session expiry?); try again", key));
    }
    return ZkErrorStatus(rc, fmt::format("writing the slot of a grant of {}", key), options_);
  }
  return Status::Unavailable(
      fmt::format("the grants of {} kept changing while a slot was chosen; try again", key));
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

Result<std::vector<std::int64_t>> ZkBackend::FencedWrite(const FencedWriteRequest& request) {
  // Every path is checked before anything is sent: a bad one refuses the whole write.
  for (const FencedOp& op : request.ops) {
    if (op.kind != FencedOp::Kind::kPut && op.kind != FencedOp::Kind::kDelete) {
      return Status::Unimplemented(
          fmt::format("the zk store has no fenced {} op", FencedOpKindName(op.kind)));
    }
    if (std::string why = zk_layout::DataPathProblem(options_.chroot, op.key); !why.empty()) {
      return Status::InvalidArgument(
          fmt::format("zk:// cannot {} {}: {}", FencedOpKindName(op.kind), op.key, why));
    }
  }
  // The grant's own session (zk_backend.h says why); unguarded writes (the chaos harness's
  // negative control) go through the service session, with no grant at all.
  std::shared_ptr<ZkSession> session;
  std::string check_path;
  if (request.skip_guard_for_testing) {
    LH_ASSIGN_OR_RETURN(session, ServiceSession());
  } else {
    std::optional<Held> held;
    {
      MutexLock lock(&mu_);
      auto it = grants_.find({request.key, request.owner_token});
      if (it != grants_.end()) {
        held = it->second;
      }
    }
    if (!held.has_value() || held->path != options_.chroot + request.store_key ||
        held->czxid != request.fencing_token) {
      // Lost (a renewal found the node gone), expired or finished: name the holder now if the
      // store says.
      Result<std::shared_ptr<ZkSession>> service = ServiceSession();
      return FencedOut(request.key, request.fencing_token,
                       service.ok() ? FencedOutWhy(**service, request.key, request.fencing_token)
                                    : std::string("is no longer held: released, expired or lost"));
    }
    // Past the local deadline the holder has given the grant up (its safe_until is behind it)
    // and the reaper is deleting the node: nothing is sent.
    if (clock_.Now() >= held->deadline) {
      return FencedOut(request.key, request.fencing_token,
                       "is no longer held: it expired (not renewed before its deadline)");
    }
    // An expired session's ephemeral nodes are gone: the grant with them.
    if (held->session->Expired()) {
      return FencedOut(request.key, request.fencing_token,
                       "is no longer held: its ZooKeeper session expired");
    }
    session = held->session;
    check_path = held->path;
  }
  const struct ACL_vector* acl = NodeAcl(options_);
  // One bound for every round trip of the write.
  ZkRequests requests(*session, options_.command_timeout);
  std::map<std::string, bool> present;
  bool looked = false;
  for (int attempt = 0; attempt < kFencedAttempts; ++attempt) {
    const FencedPlan plan = PlanFencedWrite(request.ops, options_.chroot, check_path, present);
    if (plan.ops.empty()) {
      return plan.affected;  // unguarded deletes of absent nodes only: nothing to send
    }
    std::vector<int> errors;
    const int rc = requests.Multi(plan.ops, acl, &errors);
    if (rc == ZOK) {
      return plan.affected;
    }
    if (IsZkTransient(rc) || IsZkSessionGone(rc)) {
      return ZkErrorStatus(
          rc, fmt::format("a fenced write under {} (applied or not: unknown)", request.key),
          options_);
    }
    // A multi that failed reports ZOK for the ops before the failing one: all or none applied,
    // none here.
    const auto failed = std::find_if(errors.begin(), errors.end(), [](int e) { return e != ZOK; });
    if (failed == errors.end() ||
        static_cast<std::size_t>(failed - errors.begin()) >= plan.ops.size()) {
      if (rc == ZBADARGUMENTS) {
        return Status::InvalidArgument(
            fmt::format("ZooKeeper's client refused a path of the write under {}", request.key));
      }
      return ZkErrorStatus(rc, fmt::format("a fenced write under {}", request.key), options_);
    }
    const std::size_t at = static_cast<std::size_t>(failed - errors.begin());
    const int op_rc = *failed;
    if (plan.op_of[at] < 0) {
      if (op_rc == ZNONODE || op_rc == ZBADVERSION) {
        return FencedOut(request.key, request.fencing_token,
                         FencedOutWhy(*session, request.key, request.fencing_token));
      }
      return ZkErrorStatus(op_rc, fmt::format("checking the grant of {}", request.key), options_);
    }
    const FencedOp& op = request.ops[static_cast<std::size_t>(plan.op_of[at])];
    const ZkMultiOp& zop = plan.ops[at];
    const bool missed_absent =
        op_rc == ZNONODE && (zop.kind == ZkMultiOp::kSet || zop.kind == ZkMultiOp::kDelete);
    const bool missed_present = op_rc == ZNODEEXISTS && zop.kind == ZkMultiOp::kCreate;
    if (!missed_absent && !missed_present) {
      return FencedOpStatus(op, op_rc, request.key);
    }
    // The node was created or deleted by someone else since we looked (or we guessed): plan
    // again. After the first miss, look at every node at once (one pipelined round).
    present[zop.path] = missed_present;
    if (!looked) {
      looked = true;
      std::vector<std::string> paths;
      for (const FencedOp& each : request.ops) {
        paths.push_back(options_.chroot + each.key);
      }
      std::sort(paths.begin(), paths.end());
      paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
      const std::vector<int> rcs = requests.ExistsAll(paths);
      for (std::size_t i = 0; i < paths.size(); ++i) {
        if (rcs[i] != ZOK && rcs[i] != ZNONODE) {
          return ZkErrorStatus(
              rcs[i], fmt::format("a fenced write under {} (nothing was written)", request.key),
              options_);
        }
        present[paths[i]] = rcs[i] == ZOK;
      }
    }
  }
  return Status::Unavailable(fmt::format(
      "the nodes of a fenced write under {} kept changing under other clients; nothing was "
      "written; try again",
      request.key));
}

Status ZkBackend::FencedOpStatus(const FencedOp& op, int rc, std::string_view key) const {
  const char* kind = FencedOpKindName(op.kind);
  switch (rc) {
    case ZNONODE:  // of a create: its parent
      return Status::InvalidArgument(fmt::format(
          "zk:// cannot {} {}: its parent {} does not exist (create it first, in this write or "
          "before); nothing was written",
          kind, op.key, ParentOf(op.key)));
    case ZNOCHILDRENFOREPHEMERALS:
      return Status::InvalidArgument(fmt::format(
          "zk:// cannot {} {}: its parent {} is an ephemeral node, which cannot have children; "
          "nothing was written",
          kind, op.key, ParentOf(op.key)));
    case ZNOTEMPTY:
      return Status::InvalidArgument(fmt::format(
          "zk:// cannot {} {}: it has children (delete them first); nothing was written", kind,
          op.key));
    case ZBADARGUMENTS:
      return Status::InvalidArgument(
          fmt::format("ZooKeeper refused to {} {}; nothing was written", kind, op.key));
    default:
      return ZkErrorStatus(rc, fmt::format("{} of {} under {}", kind, op.key, key), options_);
  }
}

std::string ZkBackend::FencedOutWhy(ZkSession& session, std::string_view key, FencingToken token) {
  Result<std::optional<LeaseInfo>> holder = ReadHolder(session, key);
  // Our own token: the node is still there, on its way out (the reaper forgets a grant before it
  // deletes the node), or kept after us (Finish).
  if (holder.ok() && holder->has_value() && (*holder)->fencing_token != token) {
    const LeaseInfo& info = **holder;
    return fmt::format("is now held by {} under fencing token {}",
                       info.holder.empty() ? std::string("another holder") : info.holder,
                       info.fencing_token);
  }
  return "is no longer held: its node is gone (released, expired, force-released or its session "
         "ended)";
}

Result<std::optional<std::string>> ZkBackend::ReadRecord(std::string_view key) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  // The clock first: it is a write, so the get after it in this session is served no older
  // than the leader's state at that time (a lagging follower cannot hide a fresh record).
  LH_ASSIGN_OR_RETURN(SystemTime now, LeaderNow(*session));
  ZkRequests requests(*session, options_.command_timeout);
  std::string data;

  struct Stat stat {};

  int rc = requests.Get(KeyDir(key) + "/" + std::string(kRecordName), &data, &stat);
  if (rc == ZNONODE) {
    return std::optional<std::string>();
  }
  if (rc != ZOK) {
    return ZkErrorStatus(rc, fmt::format("reading the record of {}", key), options_);
  }
  std::optional<zk_layout::RecordNode> node = zk_layout::ParseRecordData(data);
  if (!node) {
    return Status::Internal(fmt::format("the record node of {} is not in leasehold's layout", key));
  }
  if (FromZkMillis(stat.mtime) + node->ttl <= now) {
    return std::optional<std::string>();  // expired (the node stays until replaced)
  }
  return std::optional<std::string>(std::string(node->record));
}

Result<std::vector<std::pair<std::string, std::string>>> ZkBackend::ListRecords(
    std::string_view prefix) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  // One clock read for the whole list, first for the reason ReadRecord gives (the reads after
  // this write in the session see at least the leader's state at its time, key nodes
  // included). A record written after it has an mtime past `now`, so it is judged live.
  LH_ASSIGN_OR_RETURN(SystemTime now, LeaderNow(*session));
  // One deadline for the children and every get: the list costs one command_timeout at most,
  // however many keys there are.
  ZkRequests requests(*session, options_.command_timeout);
  std::vector<std::string> names;
  int rc = requests.Children(base_, &names);
  if (rc == ZNONODE) {
    return std::vector<std::pair<std::string, std::string>>();
  }
  if (rc != ZOK) {
    return ZkErrorStatus(rc, "listing records", options_);
  }
  const std::vector<std::string> keys = KeysWithPrefix(names, prefix);
  std::vector<std::string> paths;
  paths.reserve(keys.size());
  for (const std::string& key : keys) {
    paths.push_back(KeyDir(key) + "/" + std::string(kRecordName));
  }
  std::vector<std::string> values;
  std::vector<struct Stat> stats;
  const std::vector<int> rcs = requests.GetAll(paths, &values, &stats);
  std::vector<std::pair<std::string, std::string>> out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (rcs[i] == ZNONODE) {
      continue;  // a key without a record (or removed since the children were read)
    }
    if (rcs[i] != ZOK) {
      return ZkErrorStatus(rcs[i], fmt::format("reading the record of {}", keys[i]), options_);
    }
    std::optional<zk_layout::RecordNode> node = zk_layout::ParseRecordData(values[i]);
    if (!node) {
      return Status::Internal(
          fmt::format("the record node of {} is not in leasehold's layout", keys[i]));
    }
    if (FromZkMillis(stats[i].mtime) + node->ttl <= now) {
      continue;  // expired, as ReadRecord judges it
    }
    out.emplace_back(std::move(keys[i]), std::string(node->record));
  }
  return out;
}

Result<StoreTime> ZkBackend::WallClock() {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  LH_ASSIGN_OR_RETURN(SystemTime now, LeaderNow(*session));
  return StoreTime{.time = now, .from_store = true};
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

void ZkBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  if (waiter_id.empty()) {
    return;
  }
  Queued queued;
  {
    MutexLock lock(&mu_);
    auto it = waiters_.find({std::string(key), std::string(waiter_id)});
    if (it == waiters_.end()) {
      return;
    }
    queued = std::move(it->second);
    waiters_.erase(it);
  }
  if (queued.session == nullptr || queued.session->Expired()) {
    return;
  }
  // By prefix, through the waiter's own session: this also finds a node whose create reply was
  // lost. The waiter is done, so its prefix is never used again. The prefix stops before the
  // kind's tag ("w<id>.s-", zk_layout::KindTag): HasIdPrefix matches it up to a '.' or '-'.
  Doomed doomed{
      .session = queued.session, .dir = KeyDir(key), .prefix = "w" + std::string(waiter_id)};
  if (!queued.path.empty()) {
    ZkRequests requests(*queued.session, options_.command_timeout);
    int rc = requests.Delete(queued.path, -1);
    if (rc == ZOK || rc == ZNONODE || IsZkSessionGone(rc)) {
      return;
    }
  } else {
    ZkRequests requests(*queued.session, options_.command_timeout);
    std::vector<std::string> children;
    int rc = requests.Children(doomed.dir, &children);
    if (rc == ZNONODE) {
      return;
    }
    bool all_gone = rc == ZOK;
    for (const std::string& child : children) {
      if (HasIdPrefix(child, doomed.prefix)) {
        int drc = requests.Delete(doomed.dir + "/" + child, -1);
        all_gone = all_gone && (drc == ZOK || drc == ZNONODE);
      }
    }
    if (all_gone) {
      return;
    }
  }
  Doom(std::move(doomed));
}

Status ZkBackend::WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  return Wait(session, KeyDir(key), std::string_view(), deadline, std::move(stop));
}

Status ZkBackend::WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                              std::stop_token stop) {
  std::shared_ptr<ZkSession> session;
  std::string my_name;
  if (!waiter_id.empty()) {
    MutexLock lock(&mu_);
    auto it = waiters_.find({std::string(key), std::string(waiter_id)});
    if (it != waiters_.end()) {
      session = it->second.session;
      my_name = it->second.path.substr(it->second.path.rfind('/') + 1);
    }
  }
  if (session == nullptr) {
    return WaitForChange(key, deadline, std::move(stop));
  }
  const KeyAndId waiter{std::string(key), std::string(waiter_id)};
  return Wait(session, KeyDir(key), my_name, deadline, std::move(stop), &waiter);
}

Status ZkBackend::Wait(const std::shared_ptr<ZkSession>& session, const std::string& dir,
                       std::string_view my_name, SteadyTime deadline, std::stop_token stop,
                       const KeyAndId* waiter) {
  if (stop.stop_requested()) {
    return Status::Cancelled("cancelled while waiting");
  }
  // Both read before anything is sent: the listing's reply proves the server heard from the
  // session after t_list, and the epoch says which connection the watches below are on.
  const SteadyTime t_list = clock_.Now();
  const std::uint64_t epoch = session->epoch();
  ZkRequests requests(*session, options_.command_timeout);
  std::vector<std::string> children;
  int rc = requests.Children(dir, &children);
  if (rc == ZNONODE) {
    return Status();  // no node at all: the key is free
  }
  if (rc != ZOK) {
    return ZkErrorStatus(rc, "waiting for a lease", options_);
  }
  session->NoteHeard(t_list);
  const Listing listing = ParseListing(std::move(children));
  const bool kept_listed = !listing.kept.empty();
  // A live kept grant holds its place until its expiry, which nothing announces (the node is
  // not deleted then): wait until the first expiry at most, watching the nodes for an earlier
  // delete.
  SteadyTime until = deadline;
  std::vector<Kept> kept;
  if (kept_listed) {
    LH_ASSIGN_OR_RETURN(kept, ReadKeptNodes(*session, "", dir, listing.kept));
    std::erase_if(kept, [](const Kept& k) { return k.remaining <= Duration::zero(); });
    for (const Kept& k : kept) {
      until = std::min(until, clock_.Now() + k.remaining);
    }
  }
  std::vector<NodeKind> kept_kinds;
  for (const Kept& k : kept) {
    kept_kinds.push_back(k.kind);
  }
  const std::vector<bool> granted = GrantedOf(listing.kinds, kept_kinds);
  // The nodes whose change may admit us: any grant's end wakes WaitForChange; a waiter watches
  // only the nodes ahead that keep it out (the predecessor for an exclusive child: no herd when
  // the holder leaves; the nearest exclusive child ahead for a shared one; every child ahead
  // for a semaphore's, since any of them leaving moves it up).
  std::vector<std::string> watched;
  auto watch_kept = [&] {
    for (const Kept& k : kept) {
      watched.push_back(k.name);
    }
  };
  std::size_t m = 0;
  if (my_name.empty()) {
    for (std::size_t i = 0; i < listing.queued.size(); ++i) {
      if (granted[i]) {
        watched.push_back(listing.queued[i]);
      }
    }
    watch_kept();
  } else {
    auto mine = std::find(listing.queued.begin(), listing.queued.end(), my_name);
    if (mine == listing.queued.end()) {
      return Status();  // our node is gone: the next try says why
    }
    m = static_cast<std::size_t>(mine - listing.queued.begin());
    if (granted[m] || MismatchOf(listing.kinds, kept_kinds, m) != -1) {
      return Status();  // our turn, or the next try reports the mismatch
    }
    const NodeKind kind = listing.kinds[m];
    if (kind.limit > 1) {
      for (std::size_t j = 0; j < m; ++j) {
        watched.push_back(listing.queued[j]);
      }
      watch_kept();
    } else if (kind.mode == LeaseMode::kShared) {
      std::size_t j = m;
      while (j > 0 && !IsExclusive(listing.kinds[j - 1])) {
        --j;
      }
      if (j > 0) {
        watched.push_back(listing.queued[j - 1]);
      } else {
        watch_kept();
      }
    } else if (m > 0) {
      watched.push_back(listing.queued[m - 1]);
    } else {
      watch_kept();
    }
  }
  if (watched.empty()) {
    return Status();  // nothing holds the key
  }
  // Handoff from the delete event: if the predecessor is the lowest node (the holder) and there
  // is no kept node, its delete alone proves this waiter is now lowest (later nodes get higher
  // sequence numbers; the key's container cannot be recreated under our node) unless that
  // delete came with a kept grant: the holder's Finish with keep creates <key>/kept in the same
  // multi, before the delete (ZooKeeper applies a multi's ops in order and fires each one's
  // watches as it applies it). So an exists watch on <key>/kept, set with the predecessor's, in
  // one round: its event reaches us before the delete's, on the one connection, and the C client
  // runs events in order, so when the delete's event is seen a kept node would have been
  // recorded. Both watches and the waiter's own node watch must be on the connection the event
  // came by (the epoch did not move); else, or without a predecessor that is the holder, the
  // next TryAcquire lists the queue again. Exclusive children only, behind an exclusive holder:
  // a shared holder's kept node has another name, and a shared or semaphore grant is made by
  // ClaimSlot's write anyway.
  const bool may_hand = waiter != nullptr && !my_name.empty() && !kept_listed && m == 1 &&
                        IsExclusive(listing.kinds[0]) && IsExclusive(listing.kinds[1]);
  std::shared_ptr<ZkNodeWatch> kept_watch;
  std::optional<ZkPending> kept_arm;
  if (may_hand) {
    kept_arm = ZkPending::WatchExists(*session, dir + "/" + std::string(kKeptName), &kept_watch);
  }
  auto waker = std::make_shared<ZkWaker>();
  std::vector<std::string> paths;
  for (const std::string& name : watched) {
    paths.push_back(dir + "/" + name);
  }
  rc = requests.WatchAny(paths, waker);
  if (rc == ZNONODE) {
    return Status();
  }
  if (rc != ZOK) {
    return ZkErrorStatus(rc, "waiting for a lease", options_);
  }
  // Its reply came before the predecessor's (one connection, in order): absent is what allows
  // the handoff.
  const bool kept_absent =
      may_hand && kept_arm->Await(clock_.Now() + options_.command_timeout) == ZNONODE;
  bool fired = false;
  bool deleted = false;
  {
    ZkWaker& w = *waker;
    MutexLock lock(&w.mu);
    fired =
        w.cv.WaitUntil(ToSteady(until, clock_), stop, [&]() LH_REQUIRES(w.mu) { return w.fired; });
    deleted = fired && w.type == ZOO_DELETED_EVENT;
  }
  if (fired) {
    // Read after the event was seen (it was recorded after any earlier event's).
    if (kept_absent && deleted && session->epoch() == epoch &&
        kept_watch->state.load(std::memory_order_acquire) == ZkNodeWatch::kLive) {
      MutexLock lock(&mu_);
      auto it = waiters_.find(*waiter);
      if (it != waiters_.end() && it->second.session == session &&
          it->second.path == dir + "/" + std::string(my_name) && it->second.watch != nullptr &&
          it->second.watch_epoch == epoch &&
          it->second.watch->state.load(std::memory_order_acquire) == ZkNodeWatch::kLive) {
        it->second.handed = true;
        it->second.handed_epoch = epoch;
      }
    }
    return Status();
  }
  if (stop.stop_requested()) {
    return Status::Cancelled("cancelled while waiting");
  }
  if (clock_.Now() < deadline) {
    return Status();  // the kept grant has expired
  }
  return Status::DeadlineExceeded("the lease did not change before the deadline");
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

namespace {

// The value of "name=value" or "name: value" on a line of a four-letter word's answer.
std::optional<std::string> FourLetterField(std::string_view text, std::string_view name) {
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (!line.starts_with(name) || line.size() == name.size()) {
      continue;
    }
    line.remove_prefix(name.size());
    if (line.front() != '=' && line.front() != ':') {
      continue;
    }
    line.remove_prefix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
      line.remove_prefix(1);
    }
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
      line.remove_suffix(1);
    }
    return std::string(line);
  }
  return std::nullopt;
}

std::optional<std::int64_t> FourLetterNumber(std::string_view text, std::string_view name) {
  std::optional<std::string> v = FourLetterField(text, name);
  if (!v || v->empty()) {
    return std::nullopt;
  }
  std::int64_t n = 0;
  for (char c : *v) {
    if (c < '0' || c > '9' || n > (std::int64_t{1} << 50)) {
      return std::nullopt;
    }
    n = n * 10 + (c - '0');
  }
  return n;
}

// The voting servers of an ensemble in a `conf` answer: its "server.N=" lines (3.5 and later)
// that are not observers.
int CountServers(std::string_view text) {
  int n = 0;
  std::size_t at = 0;
  while ((at = text.find("server.", at)) != std::string_view::npos) {
    if (at == 0 || text[at - 1] == '\n') {
      std::size_t eq = text.find('=', at);
      std::size_t nl = text.find('\n', at);
      // server.N=host:peer:election[:participant|:observer][;client]: observers do not vote.
      std::string_view line = text.substr(at, nl == std::string_view::npos ? nl : nl - at);
      if (eq != std::string_view::npos && (nl == std::string_view::npos || eq < nl) &&
          line.find(":observer") == std::string_view::npos) {
        ++n;
      }
    }
    at += 7;
  }
  return n;
}

bool NotWhitelisted(std::string_view answer) {
  return answer.find("not in the whitelist") != std::string_view::npos ||
         answer.find("not executed") != std::string_view::npos;
}

std::string PermLetters(int perms) {
  std::string out;
  for (auto [bit, letter] : {std::pair{ZOO_PERM_CREATE, 'c'}, std::pair{ZOO_PERM_DELETE, 'd'},
                             std::pair{ZOO_PERM_READ, 'r'}, std::pair{ZOO_PERM_WRITE, 'w'},
                             std::pair{ZOO_PERM_ADMIN, 'a'}}) {
    if ((perms & bit) != 0) {
      out += letter;
    }
  }
  return out.empty() ? "nothing" : out;
}

}  // namespace

Status ZkBackend::Ping() {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  ZkRequests requests(*session, options_.command_timeout);
  // A node leasehold never creates (leasehold-clock has no children): one read, no write.
  const int rc = requests.Exists(clock_path_ + "/ping", nullptr);
  if (rc == ZOK || rc == ZNONODE) {
    return Status();
  }
  return ZkErrorStatus(rc, "exists (missing node)", options_);
}

Result<Diagnosis> ZkBackend::Diagnose() {
  using std::chrono::hours;
  using std::chrono::milliseconds;
  Diagnosis d{.probe = "exists (missing node)"};
  const std::string identity =
      options_.user ? fmt::format("digest user {}", *options_.user) : std::string("world:anyone");
  d.permissions_fix =
      options_.user
          ? fmt::format(
                "the nodes under {} need CREATE, DELETE, READ and WRITE for {}: in zkCli, "
                "addauth digest {}:<password>, then setAcl -R {} auth::cdrwa",
                base_, identity, *options_.user, base_)
          : fmt::format(
                "the nodes under {} need CREATE, DELETE, READ and WRITE for "
                "world:anyone: in zkCli, setAcl -R {} world:anyone:cdrwa",
                base_, base_);
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> service, ServiceSession());

  d.items.push_back(
      {.area = "durability",
       .found = "ZooKeeper persists its transaction log: czxids (fencing tokens) only grow, "
                "across restarts"});

  // What the server the service session is connected to says of itself (4lw srvr and conf:
  // only srvr is in ZooKeeper's default 4lw.commands.whitelist).
  auto srvr = service->FourLetterWord("srvr", options_.command_timeout);
  auto conf = service->FourLetterWord("conf", options_.command_timeout);
  const bool conf_ok = conf.ok() && !NotWhitelisted(*conf) && !conf->empty();
  // tickTime in ms; 0 if conf did not say.
  const std::int64_t tick = conf_ok ? FourLetterNumber(*conf, "tickTime").value_or(0) : 0;

  // The session bounds: the server clamps a requested timeout to [min, max]. conf prints them
  // where it is allowed; otherwise they are learnt by asking for very little and for a day, and
  // reading what each short-lived session was granted. "Very little" is kShortestAsk, not 1 ms:
  // the C client also times its connection attempts by the requested timeout, and asking for
  // 1 ms it never connected (3.8.0, on loopback); for the same reason the short session is
  // tried up to three times (a busy machine can miss a 100 ms handshake). A server whose minimum
  // is below kShortestAsk grants kShortestAsk itself: the minimum is then known only to be at
  // most that. A bounds session that does not connect while the service session is connected
  // is a warning, not "unreachable".
  constexpr Duration kShortestAsk = milliseconds(100);
  constexpr int kShortTries = 3;
  std::optional<Duration> lo;
  std::optional<Duration> hi;
  bool lo_exact = false;
  std::string bounds_error;
  const std::optional<std::int64_t> conf_min =
      conf_ok ? FourLetterNumber(*conf, "minSessionTimeout") : std::nullopt;
  const std::optional<std::int64_t> conf_max =
      conf_ok ? FourLetterNumber(*conf, "maxSessionTimeout") : std::nullopt;
  if (conf_min && conf_max && *conf_min > 0 && *conf_max >= *conf_min) {
    lo = milliseconds(*conf_min);
    hi = milliseconds(*conf_max);
    lo_exact = true;
  } else {
    for (auto [asked, out] : {std::pair{kShortestAsk, &lo}, std::pair{Duration(hours(24)), &hi}}) {
      const int tries = asked == kShortestAsk ? kShortTries : 1;
      for (int i = 0; i < tries && !out->has_value(); ++i) {
        auto session = ZkSession::Open(options_, asked, clock_);
        if (session.ok()) {
          *out = (*session)->negotiated();
        } else if (session.status().code() == StatusCode::kUnavailable &&
                   service->ConnectedPort() < 0) {
          return session.status();  // the server is not answering: the check says so
        } else {
          bounds_error = fmt::format("a session asking for {} did not connect: {}",
                                     FormatDuration(asked), session.status().ToString());
        }
      }
    }
    lo_exact = lo && *lo > kShortestAsk;
  }
  if (lo_exact) {
    d.shortest_ttl = *lo;
  }

  if (lo && hi) {
    std::string found = fmt::format(
        "the server grants session timeouts (TTLs) in [{}, {}]{}", FormatDuration(*lo),
        FormatDuration(*hi),
        lo_exact ? "" : " (the minimum may be lower: a session asking for that got it)");
    if (tick > 0) {
      d.ttl_granularity = milliseconds(tick);
      d.items.push_back({.area = "session",
                         .found = fmt::format("{}, in ticks of {} (conf)", found,
                                              FormatDuration(d.ttl_granularity))});
    } else if (lo_exact && *hi == *lo * 10) {
      // ZooKeeper's defaults are 2 and 20 ticks: bounds 1:10 are those of tickTime = min / 2,
      // if the bounds are the defaults (a zoo.cfg could set others in that ratio: a guess, said).
      d.ttl_granularity = *lo / 2;
      d.items.push_back({.area = "session",
                         .found = fmt::format("{}: as ZooKeeper's default 2 and 20 ticks, so "
                                              "taken as a tickTime of {} (conf could not be read)",
                                              found, FormatDuration(d.ttl_granularity))});
    } else {
      d.items.push_back(
          {.area = "session",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("{}; its tickTime could not be read (conf: {}), so TTL advice is "
                                "not rounded to ticks",
                                found,
                                conf.ok() ? (conf_ok ? "no tickTime" : "not in the 4lw whitelist")
                                          : conf.status().message()),
           .fix = "add conf to 4lw.commands.whitelist to let check read tickTime"});
    }
  } else {
    d.items.push_back(
        {.area = "session",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("the session bounds could not be learnt: {}", bounds_error),
         .fix = "minSessionTimeout and maxSessionTimeout (default 2 and 20 ticks) "
                "clamp every TTL: check them in zoo.cfg"});
  }
  if (!srvr.ok()) {
    d.items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("the server's mode could not be read: {}", srvr.status().ToString()),
         .fix = "check the ensemble with zkServer.sh status"});
  } else if (NotWhitelisted(*srvr)) {
    d.items.push_back({.area = "topology",
                       .verdict = CheckVerdict::kWarn,
                       .found = "the server refused the four-letter word srvr (not in "
                                "4lw.commands.whitelist): its mode and ensemble are unknown",
                       .fix = "add srvr to 4lw.commands.whitelist (it is in the default one)"});
  } else if (srvr->find("not currently serving") != std::string::npos) {
    d.items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kUnreachable,
         .found = fmt::format("the server on port {} is not serving requests (no quorum)",
                              service->ConnectedPort()),
         .fix = "restore a quorum of the ensemble's servers"});
  } else {
    const std::string mode = FourLetterField(*srvr, "Mode").value_or("unknown");
    std::string version = FourLetterField(*srvr, "Zookeeper version").value_or("?");
    version = version.substr(0, version.find_first_of(", -"));
    const int servers = conf_ok ? CountServers(*conf) : 0;
    const std::string where =
        fmt::format("the server on port {} (ZooKeeper {})", service->ConnectedPort(), version);
    if (mode == "standalone") {
      d.items.push_back({.area = "topology",
                         .verdict = CheckVerdict::kWarn,
                         .found = where + " is standalone: no fault tolerance",
                         .fix = "run an ensemble of 3 or 5 servers for a store leases depend on"});
    } else if (servers == 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("{} is a {} of an ensemble whose size could not be read (conf {})",
                                where, mode, conf_ok ? "names no servers" : "is not whitelisted"),
           .fix = "add conf to 4lw.commands.whitelist to let check count the ensemble"});
    } else if (servers % 2 == 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("{} is a {} of {} servers: an even count tolerates no more "
                                "failures than one fewer",
                                where, mode, servers),
           .fix = fmt::format("run {} or {} servers", servers - 1, servers + 1)});
    } else {
      d.items.push_back({.area = "topology",
                         .found = fmt::format("{} is a {} of {} servers: tolerates {} failed",
                                              where, mode, servers, (servers - 1) / 2)});
    }
  }

  // The ACL of <chroot>/leasehold: every key's node is created below it.
  ZkAnswer acl;
  const int rc =
      ZkPending::GetAcl(*service, base_).Await(clock_.Now() + options_.command_timeout, &acl);
  if (IsZkTransient(rc) || IsZkSessionGone(rc)) {
    return ZkErrorStatus(rc, "getACL", options_);
  }
  const int needed = ZOO_PERM_CREATE | ZOO_PERM_DELETE | ZOO_PERM_READ | ZOO_PERM_WRITE;
  if (rc != ZOK) {
    d.items.push_back(
        {.area = "permissions",
         .verdict = rc == ZNOAUTH ? CheckVerdict::kPermissionDenied : CheckVerdict::kWarn,
         .found = fmt::format("the ACL of {} could not be read: {}", base_, zerror(rc)),
         .fix = d.permissions_fix});
  } else {
    int granted = 0;
    bool unjudged = false;
    for (const ZkAclEntry& e : acl.acl) {
      if (e.scheme == "world" && e.id == "anyone") {
        granted |= e.perms;
      } else if (e.scheme == "digest" && options_.user && e.id.starts_with(*options_.user + ":")) {
        granted |= e.perms;
      } else if (e.scheme != "digest") {
        unjudged = true;  // ip, sasl, x509: which identity this handle has there is not known
      }
    }
    if ((granted & needed) == needed) {
      d.items.push_back({.area = "permissions",
                         .found = fmt::format("the ACL of {} grants {} {}", base_, identity,
                                              PermLetters(granted))});
    } else {
      d.items.push_back(
          {.area = "permissions",
           .verdict = unjudged ? CheckVerdict::kWarn : CheckVerdict::kPermissionDenied,
           .found = fmt::format("the ACL of {} grants {} {}{} (needed: cdrw)", base_, identity,
                                PermLetters(granted),
                                unjudged ? ", and other schemes this check cannot judge" : ""),
           .fix = d.permissions_fix});
    }
  }
  return d;
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
