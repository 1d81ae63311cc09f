// File: backends/zookeeper/zk_grants.cc (internal)
//
// Reading a zk:// key's grants: its holder, its live grants in queue order, its kept nodes, and
// the leader's clock.

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

}  // namespace leasehold::internal
