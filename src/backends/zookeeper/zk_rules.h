// File: backends/zookeeper/zk_rules.h (internal)
//
// What the zk:// store's files share: its retry bounds, the ACL of its nodes, and the reading of
// a key's children (which queued nodes are granted, which request cannot share with them). Only
// the zk_*.cc files include it.

#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backends/common/admission.h"
#include "backends/common/time.h"
#include "backends/zookeeper/zk_backend.h"
#include "backends/zookeeper/zk_layout.h"
#include "backends/zookeeper/zk_session.h"
#include "core/duration.h"
#include "core/logging.h"
#include "core/owner_token.h"

namespace leasehold::internal {

// The names every zk_*.cc file uses, brought in once.
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

// How many times an operation re-reads after a race (the holder left between two reads).
inline constexpr int kRaceRetries = 4;
// Reaper: how often it retries background deletes, and how many times before giving up (the
// node then goes with its session).
inline constexpr Duration kReaperRetry = std::chrono::milliseconds(200);
inline constexpr int kReaperMaxAttempts = 300;
// The most multis one fenced write sends: the first planned on a guess (every node exists), the
// second on what a pipelined exists of every node said, then one more per node that another
// client created or deleted between that exists and the multi.
inline constexpr int kFencedAttempts = 2 + kRaceRetries;
// How many times ClaimSlot looks again after another grant of the key chose its slot first (each
// retry follows another claim's success: one release admits at most N at once).
inline constexpr int kClaimAttempts = 32;
// How long ClaimSlot lets an admitted child ahead write its slot first (grants in queue order):
// a live waiter woken by the same release does it within a few round trips.
inline constexpr Duration kInOrderWait = std::chrono::milliseconds(100);

// The ACL of every node the store creates: creator-only with credentials, else open.
inline const struct ACL_vector* NodeAcl(const ZkOptions& options) {
  return options.user.has_value() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
}

// A key's children as one listing shows them: the queued nodes (grants and waiters) in
// sequence order with their kinds, and the names of its kept nodes.
struct Listing {
  std::vector<std::string> queued;
  std::vector<NodeKind> kinds;
  std::vector<std::string> kept;
};

inline Listing ParseListing(std::vector<std::string> children) {
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
inline bool HasIdPrefix(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) {
    return false;
  }
  return prefix.ends_with('-') || (name.size() > prefix.size() &&
                                   (name[prefix.size()] == '.' || name[prefix.size()] == '-'));
}

inline bool IsExclusive(const NodeKind& kind) {
  return kind.limit == 1 && kind.mode == LeaseMode::kExclusive;
}

// Admission, by position in the queue (the recipe of Curator's InterProcessSemaphoreV2 and
// InterProcessReadWriteLock, over one queue): child i of a listing (in sequence order, with the
// key's live kept grants `kept`) holds the key when the admission rule (common/admission.h)
// grants it with the kept grants and the children before it ahead, in that order:
//   a semaphore of N   fewer than N children before it, counting the live kept grants;
//   shared             no exclusive child before it and no live exclusive kept grant;
//   exclusive          it is the first child and there is no live kept grant;
// and none of them of another limit.
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
inline std::vector<bool> GrantedOf(const std::vector<NodeKind>& kinds,
                                   const std::vector<NodeKind>& kept) {
  std::vector<bool> granted(kinds.size(), false);
  Ahead ahead;
  for (const NodeKind& kind : kept) {
    ahead.Add({kind.mode, kind.limit});
  }
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    granted[i] = ahead.Decide({kinds[i].mode, kinds[i].limit}).verdict == Verdict::kGranted;
    ahead.Add({kinds[i].mode, kinds[i].limit});
  }
  return granted;
}

// What child `mine` of a listing disagrees with: a live kept grant (kept index k, as -2 - k) or
// a child before it (its index) of another limit; -1 if none.
inline int MismatchOf(const std::vector<NodeKind>& kinds, const std::vector<NodeKind>& kept,
                      std::size_t mine) {
  Ahead ahead;
  for (const NodeKind& kind : kept) {
    ahead.Add({kind.mode, kind.limit});
  }
  for (std::size_t j = 0; j < mine; ++j) {
    ahead.Add({kinds[j].mode, kinds[j].limit});
  }
  const Admission admission = ahead.Decide({kinds[mine].mode, kinds[mine].limit});
  if (admission.verdict != Verdict::kMismatch) {
    return -1;
  }
  return admission.by < kept.size() ? -2 - static_cast<int>(admission.by)
                                    : static_cast<int>(admission.by - kept.size());
}

// The parent of a data path, as the caller named it ("/" for a top-level node).
inline std::string ParentOf(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == 0 ? std::string("/") : std::string(path.substr(0, slash));
}

}  // namespace leasehold::internal
