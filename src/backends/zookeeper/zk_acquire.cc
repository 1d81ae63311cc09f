// File: backends/zookeeper/zk_acquire.cc (internal)
//
// The zk:// store's TryAcquire: the lock recipe (a sequential node, the children listed, the
// grant decided by the queue ahead of it).

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
#include "backends/zookeeper/zk_backend.h"
#include "backends/zookeeper/zk_layout.h"
#include "backends/zookeeper/zk_rules.h"
#include "backends/zookeeper/zk_session.h"
#include "core/duration.h"
#include "core/logging.h"
#include "core/owner_token.h"

namespace leasehold::internal {

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

}  // namespace leasehold::internal
