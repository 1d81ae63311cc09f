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

}  // namespace leasehold::internal
