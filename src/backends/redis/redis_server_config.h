// File: backends/redis/redis_server_config.h (internal)
//
// What a Redis server says of its persistence, eviction and topology (CONFIG GET, INFO), and
// the findings and refusals leasehold draws from it: Open refuses a server that may evict
// leases, Diagnose reports. Only the redis_*.cc files include it.

#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backends/common/time.h"
#include "backends/redis/redis_cluster.h"
#include "backends/redis/redis_connection.h"
#include "backends/redis/redis_replies.h"
#include "backends/redis/redis_scripts.h"
#include "backends/redis/redis_subscriber.h"
#include "core/duration.h"
#include "core/logging.h"
#include "util/hex.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// The server's persistence and eviction settings, as CONFIG GET reads them. Each is unset if
// the server would not say (CONFIG is often denied to application users), with the reason in
// `refusal`.
struct ServerConfig {
  std::optional<std::string> appendonly;
  std::optional<std::string> save;
  std::optional<std::string> appendfsync;
  std::optional<std::string> maxmemory;  // bytes, "0" for no limit
  std::optional<std::string> maxmemory_policy;
  // The first error reply (e.g. "NOPERM ... 'config|get' command"), or "no answer".
  std::string refusal;

  // Whether AOF and RDB snapshots are both known.
  [[nodiscard]] bool known() const { return appendonly && save; }

  // Known to be off: no AOF and no RDB snapshots, so a restart forgets everything.
  [[nodiscard]] bool off() const { return appendonly == "no" && save && save->empty(); }
};

// The CONFIG GET commands ParseServerConfig reads, in its order: one per setting, so that a
// server older than 7.0 (one parameter per CONFIG GET) answers them too; then INFO memory, which
// tells maxmemory and its policy to a user that may not run CONFIG GET.
inline std::vector<Command> ServerConfigCommands() {
  return {{"CONFIG", "GET", "appendonly"},       {"CONFIG", "GET", "save"},
          {"CONFIG", "GET", "appendfsync"},      {"CONFIG", "GET", "maxmemory"},
          {"CONFIG", "GET", "maxmemory-policy"}, {"INFO", "memory"}};
}

// Reads the replies to the CONFIG GETs of ServerConfigCommands() (the first five of `replies`).
inline ServerConfig ParseServerConfig(std::span<const ReplyPtr> replies) {
  ServerConfig config;
  auto value = [&](std::size_t i) -> std::optional<std::string> {
    const redisReply* r = i < replies.size() ? replies[i].get() : nullptr;
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
      if (config.refusal.empty()) {
        config.refusal = IsError(r) ? std::string(ReplyText(r)) : "no answer";
      }
      return std::nullopt;
    }
    return std::string(ReplyText(r->element[1]));
  };
  config.appendonly = value(0);
  config.save = value(1);
  config.appendfsync = value(2);
  config.maxmemory = value(3);
  config.maxmemory_policy = value(4);
  return config;
}

// The value of `field` in an INFO reply ("field:value" lines), or nullopt.
inline std::optional<std::string> InfoField(std::string_view info, std::string_view field) {
  std::size_t pos = 0;
  while (pos < info.size()) {
    std::size_t end = info.find('\n', pos);
    if (end == std::string_view::npos) {
      end = info.size();
    }
    std::string_view line = info.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') {
      line.remove_suffix(1);
    }
    if (line.size() > field.size() && line.starts_with(field) && line[field.size()] == ':') {
      return std::string(line.substr(field.size() + 1));
    }
    pos = end + 1;
  }
  return std::nullopt;
}

// The text of an INFO reply, or nullopt with the error (or "no answer") in `*refusal`.
inline std::optional<std::string_view> InfoText(const redisReply* reply, std::string* refusal) {
  if (reply != nullptr &&
      (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS)) {
    return ReplyText(reply);
  }
  *refusal = IsError(reply) ? std::string(ReplyText(reply)) : "no answer";
  return std::nullopt;
}

// Whether the server may evict keys, from CONFIG GET where the ACL allows it, else from INFO
// memory (`memory_info`, or nullopt with the reason in `info_refusal`).
struct Eviction {
  std::optional<unsigned long long> maxmemory;  // bytes; 0: no limit
  std::optional<std::string> policy;
  std::string refusal;  // why they could not be read, when unknown

  [[nodiscard]] bool known() const { return maxmemory && policy; }

  // Redis evicts only with a memory limit, and never under noeviction.
  [[nodiscard]] bool can_evict() const {
    return known() && *maxmemory > 0 && *policy != "noeviction";
  }

  // "maxmemory-policy allkeys-lru with maxmemory 8388608 bytes".
  [[nodiscard]] std::string Describe() const {
    return fmt::format("maxmemory-policy {} with maxmemory {} bytes", policy.value_or("?"),
                       maxmemory.value_or(0));
  }
};

inline Eviction ReadEviction(const ServerConfig& config,
                             std::optional<std::string_view> memory_info,
                             const std::string& info_refusal) {
  Eviction eviction;
  std::optional<std::string> bytes = config.maxmemory;
  eviction.policy = config.maxmemory_policy;
  if (memory_info) {
    if (!bytes) {
      bytes = InfoField(*memory_info, "maxmemory");
    }
    if (!eviction.policy) {
      eviction.policy = InfoField(*memory_info, "maxmemory_policy");
    }
  }
  unsigned long long n = 0;
  if (bytes && std::from_chars(bytes->data(), bytes->data() + bytes->size(), n).ec == std::errc()) {
    eviction.maxmemory = n;
  }
  if (!eviction.known()) {
    eviction.refusal = fmt::format("CONFIG GET refused ({}), INFO memory refused ({})",
                                   config.refusal.empty() ? "no answer" : config.refusal,
                                   memory_info ? "no maxmemory fields" : info_refusal);
  }
  return eviction;
}

// What eviction does to leasehold's keys under `policy`: the grants carry a TTL (volatile-*
// policies pick among keys with one), the fencing counters do not (allkeys-* picks them too).
inline std::string EvictionHarm(std::string_view policy) {
  if (policy.starts_with("volatile-")) {
    return "when memory is full Redis evicts keys that have a TTL, and every lease's grant has "
           "one: another process is then granted a key that is still held";
  }
  return "when memory is full Redis evicts any key: a lease's grant (another process is then "
         "granted a key that is still held) and its fencing counter (tokens start again at 1, "
         "so a stale writer's token is accepted)";
}

inline constexpr std::string_view kEvictionFix =
    "CONFIG SET maxmemory-policy noeviction (and the same in redis.conf), or give leases a "
    "Redis instance or database of their own without maxmemory; under noeviction an acquire "
    "that meets a full memory fails (OOM) and no lease is dropped";

// Diagnose's eviction finding: can the server drop a grant or a fencing counter?
inline CheckItem EvictionItem(const Eviction& eviction) {
  CheckItem item{.area = "eviction"};
  if (!eviction.known()) {
    item.verdict = CheckVerdict::kWarn;
    item.found = "maxmemory and maxmemory-policy could not be read: " + eviction.refusal;
    item.fix =
        "grant the user +config|get (or +info) so that leasehold check can read them, or check "
        "maxmemory-policy noeviction on the server yourself";
    return item;
  }
  if (eviction.can_evict()) {
    item.verdict = CheckVerdict::kUnsafe;
    item.found = fmt::format("{}: {}", eviction.Describe(), EvictionHarm(*eviction.policy));
    item.fix = std::string(kEvictionFix);
    return item;
  }
  if (*eviction.maxmemory == 0) {
    item.found = fmt::format(
        "no maxmemory: Redis evicts nothing (maxmemory-policy {} applies only with a limit)",
        *eviction.policy);
  } else {
    item.found = fmt::format(
        "maxmemory {} bytes with maxmemory-policy noeviction: when memory is full, writes are "
        "refused (an acquire fails, OOM) and no key is evicted",
        *eviction.maxmemory);
  }
  return item;
}

// Open's refusal of a server that may evict keys (RedisOptions::accept_eviction).
inline Status EvictionRefusal(const std::string& address, const Eviction& eviction) {
  return Status::FailedPrecondition(
      fmt::format("redis at {} may evict leases ({}): {}. Fix: {}; or add accept_eviction=true "
                  "to the URL to take that risk",
                  address, eviction.Describe(), EvictionHarm(*eviction.policy), kEvictionFix),
      "accept_eviction=true");
}

// Diagnose's durability finding: will grants and fencing counters survive a restart? From
// CONFIG GET where the ACL allows it, else from INFO persistence's aof_enabled, which tells AOF
// but not RDB snapshots (either way AOF off is unsafe: counters go back to the last snapshot, or
// to nothing).
inline CheckItem DurabilityItem(const ServerConfig& config, std::optional<std::string_view> info,
                                const std::string& info_refusal, std::string_view replicas) {
  constexpr std::string_view kAofFix =
      "turn on AOF: CONFIG SET appendonly yes and CONFIG SET appendfsync always (or everysec), "
      "and the same in redis.conf";
  CheckItem item{.area = "durability"};
  std::optional<std::string> aof_enabled;
  if (info) {
    aof_enabled = InfoField(*info, "aof_enabled");
  }
  const bool aof_on = config.appendonly ? *config.appendonly == "yes" : aof_enabled == "1";
  if (!config.appendonly && !aof_enabled) {
    item.verdict = CheckVerdict::kWarn;
    item.found = fmt::format(
        "persistence could not be read: CONFIG GET refused ({}), INFO persistence refused ({})",
        config.refusal, info ? "no aof_enabled field" : info_refusal);
    item.fix =
        "grant the user +config|get (or +info) so that leasehold check can read it, or "
        "check appendonly yes and appendfsync always|everysec on the server yourself";
    return item;
  }
  if (aof_on) {
    const std::string fsync = config.appendfsync.value_or("");
    if (fsync == "always") {
      item.found =
          "AOF on, appendfsync always: every grant and fencing counter bump is on disk "
          "before its reply";
    } else if (fsync == "everysec") {
      item.found =
          "AOF on, appendfsync everysec: a host crash or power loss can lose about the "
          "last second of grants and fencing counter bumps";
    } else if (fsync == "no") {
      item.verdict = CheckVerdict::kWarn;
      item.found =
          "AOF on, appendfsync no: the OS decides when the log reaches the disk, so a "
          "host crash can lose many seconds of grants and fencing counter bumps";
      item.fix =
          "CONFIG SET appendfsync always (or everysec: about 1 s at risk), and the same in "
          "redis.conf";
    } else {
      item.verdict = CheckVerdict::kWarn;
      item.found = fmt::format(
          "AOF on (INFO persistence); appendfsync could not be read: CONFIG "
          "GET refused ({})",
          config.refusal);
      item.fix =
          "grant the user +config|get so that leasehold check can read it, or check "
          "appendfsync always|everysec on the server yourself";
    }
    return item;
  }
  item.verdict = CheckVerdict::kUnsafe;
  item.fix = std::string(kAofFix);
  if (!config.save) {
    item.found = fmt::format(
        "AOF off: fencing counters go back to the last RDB snapshot on restart, if there is "
        "one at all (save could not be read: CONFIG GET refused ({}))",
        config.refusal);
  } else if (!config.save->empty()) {
    item.found = fmt::format(
        "RDB snapshots only (save \"{}\", appendonly no): fencing counters "
        "go back to the last snapshot on restart",
        *config.save);
  } else {
    item.found =
        "persistence off (appendonly no, save \"\"): fencing does not survive a restart "
        "(leases are forgotten and fencing tokens start again at 1)";
    if (!replicas.empty() && replicas != "0") {
      // Redis's replication documentation: a master without persistence that restarts
      // before a failover comes back empty, and its replicas copy the empty dataset.
      item.found += fmt::format(
          "; and it has {} replica(s) (connected_slaves:{}): restarted before a failover (a "
          "supervisor, a quick reboot) it comes back empty and they copy the empty dataset, "
          "so every lease and counter is gone on every node",
          replicas, replicas);
      item.fix += "; or never restart a master without persistence automatically";
    }
  }
  return item;
}

// Diagnose's topology finding, from INFO server (version, mode) and INFO replication (role,
// replicas), judged against the URL's min_replicas, and with Sentinel (`sentinel_view` not
// null) against the replicas a failover promotes.
inline CheckItem TopologyItem(const RedisOptions& options, std::optional<std::string_view> server,
                              std::optional<std::string_view> replication,
                              const std::string& refusal,
                              const Result<std::vector<SentinelReplica>>* sentinel_view) {
  CheckItem item{.area = "topology"};
  std::string version = "redis";
  if (server) {
    version += " " + InfoField(*server, "redis_version").value_or("(version unknown)");
  }
  if (!options.cluster() && server && InfoField(*server, "redis_mode") == "cluster") {
    item.verdict = CheckVerdict::kWarn;
    item.found = version +
                 " in cluster mode: this URL talks to one node, and keys of other slots get "
                 "MOVED";
    item.fix = "use a redis+cluster:// URL that names the cluster's nodes";
    return item;
  }
  std::optional<std::string> role;
  if (replication) {
    role = InfoField(*replication, "role");
  }
  if (!role) {
    item.verdict = CheckVerdict::kWarn;
    item.found = fmt::format("{}; replication could not be read: INFO replication refused ({})",
                             version, replication ? "no role field" : refusal);
    item.fix = "grant the user +info so that leasehold check can read it";
    return item;
  }
  if (*role != "master") {
    item.verdict = CheckVerdict::kUnsafe;
    item.found = fmt::format(
        "{} is a replica (role:{}) of {}:{}: leasehold's scripts write, which a replica refuses "
        "(READONLY), and what it holds lags its master",
        version, *role, InfoField(*replication, "master_host").value_or("?"),
        InfoField(*replication, "master_port").value_or("?"));
    item.fix = "point the URL at the master";
    return item;
  }
  long long replicas = 0;
  const std::string count = InfoField(*replication, "connected_slaves").value_or("0");
  std::from_chars(count.data(), count.data() + count.size(), replicas);
  if (replicas == 0) {
    item.verdict = CheckVerdict::kWarn;
    item.found = fmt::format("{}, a master with no replicas (connected_slaves:0): no failover copy",
                             version);
    item.fix = options.min_replicas > 0
                   ? fmt::format(
                         "min_replicas={} with no replica connected: every acquire is "
                         "undone; add replicas or lower min_replicas",
                         options.min_replicas)
                   : "fine with AOF on one server; add a replica for a failover copy (replication "
                     "is asynchronous: see min_replicas in the README)";
    if (options.min_replicas > 0) {
      item.verdict = CheckVerdict::kUnsafe;
    }
    return item;
  }
  if (options.min_replicas == 0) {
    item.verdict = CheckVerdict::kWarn;
    item.found = fmt::format(
        "{}, a master with {} replica(s); replication is asynchronous: a failover can lose an "
        "acknowledged grant (min_replicas is 0)",
        version, replicas);
    item.fix =
        "add min_replicas=1 to the URL: each acquire and renew then WAITs for a replica "
        "(fencing tokens cover what is left)";
  } else if (replicas < options.min_replicas) {
    item.verdict = CheckVerdict::kUnsafe;
    item.found = fmt::format(
        "{}, a master with {} replica(s), fewer than min_replicas={}: every "
        "acquire is undone",
        version, replicas, options.min_replicas);
    item.fix = "add replicas or lower min_replicas";
  } else {
    item.found = fmt::format(
        "{}, a master with {} replica(s); min_replicas={}: each acquire and renew waits for them "
        "(replication stays asynchronous: a failover to one that had not confirmed can still "
        "lose a grant, which fencing tokens cover)",
        version, replicas, options.min_replicas);
  }
  if (sentinel_view != nullptr) {
    JudgeFailover(options.min_replicas, *sentinel_view, replicas, item);
  }
  return item;
}

}  // namespace leasehold::internal
