// File: backends/zookeeper/zk_wait.cc (internal)
//
// The zk:// store's wait facet: watches on a key's children, and a waiter's node withdrawn.

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

}  // namespace leasehold::internal
