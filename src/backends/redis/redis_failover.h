// File: backends/redis/redis_failover.h (internal)
//
// What a Sentinel failover can lose under WAIT: the replicas the sentinels know (SENTINEL
// REPLICAS), which of them a failover may promote, and the min_replicas that puts every
// confirmed write on the one promoted. `leasehold check` judges a redis+sentinel:// URL with it.
//
// Sentinel promotes, among the replicas it reaches, one with the lowest non-zero
// replica-priority, and among equals the one with the largest replication offset *as it last
// read it* (INFO every 10 s, every second once the master is down): that reading lags, so the
// replica promoted can be one that had not received the newest writes (the chaos run with two
// replicas and min_replicas=1: 10 fencing-token regressions in 20 failovers, tests/chaos/
// RESULTS.md). A replica of priority 0 is never promoted, but WAIT N counts any N replicas,
// its confirmation too. So a confirmation survives a failover only when every replica that can
// confirm has confirmed: min_replicas must be the number of replicas.
//
// A failover that lost writes (min_replicas=0, or a confirmation from a replica that was not
// promoted) sends the fencing counter back: the new master's counter is what it had replicated.
// The master's config epoch, which the sentinels bump at every failover, keeps tokens from
// repeating: every connection is opened to a master learnt together with its epoch
// (SentinelMaster), and every grant on it raises the counter to at least epoch << 32
// (kGrantLib's lh_floor), so a token granted after a failover is above every token granted
// before it at that epoch, as long as fewer than 2^32 grants were made within one epoch.
//
// Thread safety: plain functions.

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <hiredis/hiredis.h>

#include "leasehold/check.h"
#include "leasehold/status.h"

namespace leasehold::internal {

// One replica as a sentinel reports it.
struct SentinelReplica {
  std::string address;  // "ip:port"
  int priority = 100;   // replica-priority (Sentinel's "slave-priority"); 0: never promoted
  std::string flags;    // "slave", "slave,s_down", "slave,disconnected", ...
  // Neither down nor disconnected in the sentinel's view: it can confirm and be promoted.
  [[nodiscard]] bool reachable() const;
};

// Reads the reply of SENTINEL REPLICAS <name>: an array of flat field/value arrays (RESP2).
// kInternal for any other shape.
Result<std::vector<SentinelReplica>> ParseSentinelReplicas(const redisReply* reply);

// The master as one sentinel names it, with the config epoch of that naming.
struct SentinelMaster {
  std::string host;
  int port = 0;
  // Sentinel's config-epoch for this master: bumped by the failover that promoted it.
  std::int64_t epoch = 0;
};

// The largest config epoch a token floor can carry: epoch << 32 stays below 2^53, the largest
// integer every Lua number (a double) holds exactly.
inline constexpr std::int64_t kMaxSentinelEpoch = (std::int64_t{1} << 21) - 1;

// Reads one sentinel's replies to SENTINEL get-master-addr-by-name <name> (`address`: an array
// {ip, port}, or nil when it knows no such master) and SENTINEL MASTER <name> (`master`: a flat
// field/value array holding "config-epoch"), sent in one pipeline so that both describe the same
// moment of that sentinel. The address is the one get-master-addr-by-name gives: during a
// failover it names the promoted replica from the moment the epoch is bumped, while SENTINEL
// MASTER's ip/port still name the old master until the failover ends. nullopt when the sentinel
// knows no such master; kInternal for any other shape, or an epoch above kMaxSentinelEpoch.
Result<std::optional<SentinelMaster>> ParseSentinelMaster(const redisReply* address,
                                                          const redisReply* master);

struct FailoverCopies {
  int confirming = 0;  // replicas that can answer WAIT
  int promotable = 0;  // reachable, with a non-zero priority: a failover may promote any one
  // The least min_replicas whose confirmation is on whichever replica is promoted: every one
  // that can confirm (0 when none can be promoted).
  int needed = 0;
  // One line: each replica with its priority, e.g. "127.0.0.1:7001 priority 100,
  // 127.0.0.1:7002 priority 0 (never promoted)"; down ones named as down.
  std::string listing;
};

// `connected` is the master's connected_slaves: a replica the sentinels have not seen yet can
// confirm a WAIT too, so the larger of it and the reachable count is what can confirm.
FailoverCopies CountFailoverCopies(const std::vector<SentinelReplica>& replicas, int connected);

// check's topology finding for a Sentinel master with `connected` replicas (`item`, as judged
// from INFO against min_replicas), judged again against `view`, the sentinels' replicas:
// min_replicas below the number of replicas is unsafe (the one promoted may not have
// confirmed), naming the value that would do; no replica the sentinels can promote is a
// warning (no failover at all); a view that could not be read is a warning.
void JudgeFailover(int min_replicas, const Result<std::vector<SentinelReplica>>& view,
                   long long connected, CheckItem& item);

}  // namespace leasehold::internal
