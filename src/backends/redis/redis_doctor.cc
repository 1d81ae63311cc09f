// File: backends/redis/redis_doctor.cc (internal)
//
// The redis:// store's doctor facet: PING as the probe, and persistence, eviction, replication
// and ACL findings.

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
#include "backends/redis/redis_backend.h"
#include "backends/redis/redis_cluster.h"
#include "backends/redis/redis_connection.h"
#include "backends/redis/redis_replies.h"
#include "backends/redis/redis_run.h"
#include "backends/redis/redis_scripts.h"
#include "backends/redis/redis_server_config.h"
#include "backends/redis/redis_subscriber.h"
#include "core/duration.h"
#include "core/logging.h"
#include "util/hex.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

Status RedisBackend::Ping() {
  // In a cluster, every master in turn: each holds leases.
  std::vector<Command> ping = {{"PING"}};
  LH_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RedisConnectionPool>> masters,
                      router_->MasterPools());
  for (const std::shared_ptr<RedisConnectionPool>& master : masters) {
    const std::string address = master->options().Address();
    LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies, PipelineOn(*router_, *master, ping));
    if (IsError(replies[0].get())) {
      return ErrorReplyStatus(address, "PING", ReplyText(replies[0].get()));
    }
  }
  return Status();
}

// The commands, as sent: Connect's AUTH (always allowed), SELECT (db != 0) and PING; Open's
// SCRIPT LOAD; EVALSHA of every operation (never EVAL); WAIT with min_replicas; SCAN and GET
// (List, ListRecords, ReadRecord); TIME (WallClock); the subscriber's SUBSCRIBE and
// UNSUBSCRIBE. Inside the scripts (redis_scripts.h), which the ACL checks too: EXISTS HMGET HGET
// HSET INCR PEXPIRE PTTL DEL PUBLISH SET TIME, and for shared and semaphore grants (kGrantLib)
// HGETALL HDEL PEXPIREAT; with fair=true ZADD ZREM ZRANGE ZRANGEBYSCORE ZREMRANGEBYSCORE ZSCORE
// ZRANK ZCARD HEXISTS; with Sentinel ROLE; with Cluster CLUSTER SLOTS and ASKING, and CLUSTER INFO
// inside the granting scripts (the node's config epoch). CONFIG GET
// and INFO (Open's persistence and eviction checks, and Diagnose) are optional: refused, they
// are reported, never fatal.
std::string RedisBackend::PermissionsFix() const {
  const std::string keys = GlobEscape(options_.prefix) + ":*";
  std::string commands = "-@all +ping";
  if (options_.db != 0) {
    commands += " +select";
  }
  commands +=
      " +evalsha +script|load +scan +subscribe +unsubscribe +exists +hmget +hget +hset +incr "
      "+pexpire +pttl +del +publish +get +set +time +hgetall +hdel +pexpireat";
  if (options_.fair) {
    commands +=
        " +zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zscore +zrank +zcard "
        "+hexists";
  }
  if (options_.min_replicas > 0) {
    commands += " +wait";
  }
  if (options_.require_master) {
    commands += " +role";  // Sentinel: every connection checks that it reached the master
  }
  if (options_.cluster()) {
    // The slot map, ASK redirections, and the node's config epoch (the granting scripts).
    commands += " +cluster|slots +asking +cluster|info";
  }
  return fmt::format(
      "ACL SETUSER {} on ~{} &{} {} (optional: +config|get +info, for the persistence and "
      "eviction checks and leasehold check; fenced writes also need their data keys and, for "
      "HashSet, +type)",
      options_.user.value_or("default"), keys, keys, commands);
}

// One round trip: CONFIG GET and INFO memory (as Open reads them) and INFO server, persistence
// and replication, as separate commands so that a server older than 7.0 (one INFO section per
// call) answers them and a refusal of one leaves the others readable.
Result<Diagnosis> RedisBackend::Diagnose() {
  std::vector<Command> commands = ServerConfigCommands();
  const std::size_t memory_at = commands.size() - 1;
  const std::size_t info_at = commands.size();
  commands.push_back({"INFO", "server"});
  commands.push_back({"INFO", "persistence"});
  commands.push_back({"INFO", "replication"});
  Diagnosis diagnosis{.probe = "PING", .permissions_fix = PermissionsFix()};
  // In a cluster, each master's findings, each named by its node.
  LH_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RedisConnectionPool>> masters,
                      router_->MasterPools());
  for (const std::shared_ptr<RedisConnectionPool>& master : masters) {
    const std::string address = master->options().Address();
    LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies, PipelineOn(*router_, *master, commands));
    const ServerConfig persistence = ParseServerConfig(replies);
    std::string server_refusal;
    std::string persistence_refusal;
    std::string replication_refusal;
    std::optional<std::string_view> server = InfoText(replies[info_at].get(), &server_refusal);
    std::optional<std::string_view> persistence_info =
        InfoText(replies[info_at + 1].get(), &persistence_refusal);
    std::optional<std::string_view> replication =
        InfoText(replies[info_at + 2].get(), &replication_refusal);
    const std::string replicas =
        replication ? InfoField(*replication, "connected_slaves").value_or("") : std::string();
    CheckItem durability =
        DurabilityItem(persistence, persistence_info, persistence_refusal, replicas);
    std::optional<Result<std::vector<SentinelReplica>>> sentinel_view;
    if (options_.sentinel()) {
      sentinel_view = master->AskSentinelsForReplicas();
    }
    CheckItem topology = TopologyItem(options_, server, replication, replication_refusal,
                                      sentinel_view ? &*sentinel_view : nullptr);
    std::string memory_refusal;
    CheckItem eviction = EvictionItem(ReadEviction(
        persistence, InfoText(replies[memory_at].get(), &memory_refusal), memory_refusal));
    if (router_->cluster()) {
      durability.found = address + ": " + durability.found;
      topology.found = address + ": " + topology.found;
      eviction.found = address + ": " + eviction.found;
    }
    diagnosis.items.push_back(std::move(durability));
    diagnosis.items.push_back(std::move(eviction));
    diagnosis.items.push_back(std::move(topology));
  }
  return diagnosis;
}

}  // namespace leasehold::internal
