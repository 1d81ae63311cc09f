#include "backends/redis/redis_failover.h"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "backends/common/url_params.h"
#include "backends/redis/redis_connection.h"

namespace leasehold::internal {

bool SentinelReplica::reachable() const {
  for (std::string_view down : {"s_down", "o_down", "disconnected"}) {
    if (flags.find(down) != std::string::npos) {
      return false;
    }
  }
  return true;
}

Result<std::vector<SentinelReplica>> ParseSentinelReplicas(const redisReply* reply) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) {
    return Status::Internal("unexpected reply from a sentinel to SENTINEL REPLICAS");
  }
  std::vector<SentinelReplica> replicas;
  for (std::size_t i = 0; i < reply->elements; ++i) {
    const redisReply* fields = reply->element[i];
    if (fields == nullptr || fields->type != REDIS_REPLY_ARRAY || fields->elements % 2 != 0) {
      return Status::Internal("unexpected reply from a sentinel to SENTINEL REPLICAS");
    }
    SentinelReplica replica;
    std::string ip;
    std::string port;
    for (std::size_t f = 0; f + 1 < fields->elements; f += 2) {
      const std::string_view name = ReplyText(fields->element[f]);
      const std::string_view value = ReplyText(fields->element[f + 1]);
      if (name == "ip") {
        ip = value;
      } else if (name == "port") {
        port = value;
      } else if (name == "flags") {
        replica.flags = value;
      } else if (name == "slave-priority" || name == "replica-priority") {
        if (!ParseWholeNumber(value, 0, 1 << 30, &replica.priority)) {
          return Status::Internal(
              fmt::format("a sentinel reported a replica priority of '{}'", value));
        }
      }
    }
    replica.address = ip + ":" + port;
    replicas.push_back(std::move(replica));
  }
  return replicas;
}

Result<std::optional<SentinelMaster>> ParseSentinelMaster(const redisReply* address,
                                                          const redisReply* master) {
  if (address != nullptr && address->type == REDIS_REPLY_NIL) {
    return std::optional<SentinelMaster>();
  }
  SentinelMaster out;
  if (address == nullptr || address->type != REDIS_REPLY_ARRAY || address->elements != 2 ||
      !ParseWholeNumber(ReplyText(address->element[1]), 1, 65535, &out.port)) {
    return Status::Internal("unexpected reply from a sentinel to get-master-addr-by-name");
  }
  out.host = ReplyText(address->element[0]);
  if (master == nullptr || master->type != REDIS_REPLY_ARRAY || master->elements % 2 != 0) {
    return Status::Internal("unexpected reply from a sentinel to SENTINEL MASTER");
  }
  for (std::size_t f = 0; f + 1 < master->elements; f += 2) {
    if (ReplyText(master->element[f]) != "config-epoch") {
      continue;
    }
    const std::string_view value = ReplyText(master->element[f + 1]);
    int epoch = 0;
    if (!ParseWholeNumber(value, 0, static_cast<int>(kMaxSentinelEpoch), &epoch)) {
      return Status::Internal(fmt::format(
          "a sentinel reported a config epoch of '{}' (leasehold's token floor holds up to {})",
          value, kMaxSentinelEpoch));
    }
    out.epoch = epoch;
    return std::optional<SentinelMaster>(std::move(out));
  }
  return Status::Internal("a sentinel's SENTINEL MASTER reply has no config-epoch");
}

FailoverCopies CountFailoverCopies(const std::vector<SentinelReplica>& replicas, int connected) {
  FailoverCopies out;
  int reachable = 0;
  for (const SentinelReplica& r : replicas) {
    std::string role;
    if (!r.reachable()) {
      role = fmt::format("down ({})", r.flags);
    } else {
      ++reachable;
      if (r.priority == 0) {
        role = "priority 0 (never promoted)";
      } else {
        ++out.promotable;
        role = fmt::format("priority {}", r.priority);
      }
    }
    out.listing += fmt::format("{}{} {}", out.listing.empty() ? "" : ", ", r.address, role);
  }
  out.confirming = std::max(reachable, connected);
  out.needed = out.promotable > 0 ? out.confirming : 0;
  return out;
}

void JudgeFailover(int min_replicas, const Result<std::vector<SentinelReplica>>& view,
                   long long connected, CheckItem& item) {
  if (!view.ok()) {
    item.found += fmt::format("; the sentinels' view of the replicas could not be read ({})",
                              view.status().message());
    if (item.verdict == CheckVerdict::kPass) {
      item.verdict = CheckVerdict::kWarn;
      item.fix = "check that the sentinels answer SENTINEL REPLICAS";
    }
    return;
  }
  if (item.verdict == CheckVerdict::kUnsafe) {
    return;  // fewer replicas than min_replicas: said already
  }
  const FailoverCopies copies = CountFailoverCopies(*view, static_cast<int>(connected));
  // "redis 7.0.15, a master with 2 replica(s)": what TopologyItem found before its judgement.
  const std::string head = item.found.substr(0, item.found.find(';'));
  if (copies.promotable == 0) {
    item.verdict = std::max(item.verdict, CheckVerdict::kWarn);
    item.found =
        head +
        fmt::format(
            "; the sentinels can promote none of its replicas ({}): a failover "
            "cannot happen{}",
            copies.listing.empty() ? "they know none" : copies.listing,
            min_replicas > 0 ? ", and WAIT is confirmed by replicas that never become master" : "");
    item.fix = "give a replica a replica-priority above 0 (0 means never promoted)";
    return;
  }
  if (min_replicas == 0) {
    item.fix = fmt::format(
        "add min_replicas={} to the URL: every acquire and renew then WAITs until every replica "
        "has it, so the one a failover promotes does (fencing tokens cover what is left)",
        copies.needed);
    return;
  }
  if (min_replicas < copies.needed) {
    item.verdict = CheckVerdict::kUnsafe;
    item.found = fmt::format(
        "{}; min_replicas={} of {} replicas ({}): a failover may promote one that did not "
        "confirm (Sentinel ranks replicas by replica-priority, then by the replication offset it "
        "last read, which lags), and hand a confirmed grant's key to another holder",
        head, min_replicas, copies.confirming, copies.listing);
    item.fix = fmt::format(
        "min_replicas={} (every replica confirms; one replica down then fails every acquire "
        "closed), or fewer replicas",
        copies.needed);
    return;
  }
  item.found = fmt::format(
      "{}; min_replicas={}: every replica ({}) confirms each grant, so the one a failover "
      "promotes has it; one replica down fails every acquire closed (fencing tokens cover a "
      "split brain)",
      head, min_replicas, copies.listing);
}

}  // namespace leasehold::internal
