// File: backends/zookeeper/zk_records.cc (internal)
//
// The zk:// store's records facet: a key's record node, and the leader's transaction time as the
// store's wall clock.

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

}  // namespace leasehold::internal
