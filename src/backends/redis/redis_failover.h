// File: backends/redis/redis_failover.h (internal)
//
// What a Sentinel failover can lose under WAIT: the replicas the sentinels know (SENTINEL
// REPLICAS), which of them a failover would promote, and the min_replicas that puts every
// confirmed write on one of those. `leasehold check` judges a redis+sentinel:// URL with it.
//
// Sentinel promotes, among the replicas it reaches, the one with the lowest non-zero
// replica-priority, and among equals the one with the most of the master's stream (the largest
// replication offset); a replica of priority 0 is never promoted. WAIT N counts any N replicas,
// so a confirmation by N replicas survives a failover exactly when every N replicas include
// one of the first choice: N > (replicas that can confirm) - (first choices). A first choice
// that confirmed holds the write; the one promoted has at least its offset, so holds it too.
//
// Thread safety: plain functions.

#pragma once

#include <string>
#include <vector>

#include <hiredis/hiredis.h>

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

struct FailoverCopies {
  int confirming = 0;      // replicas that can answer WAIT
  int first_choice = 0;    // reachable, with the lowest non-zero priority among the reachable
  int first_priority = 0;  // their priority (0 when there is none)
  // The least min_replicas whose every confirmation includes a first choice:
  // confirming - first_choice + 1 (0 when there is no first choice).
  int needed = 0;
  // One line: each reachable replica with its priority, e.g. "127.0.0.1:7001 priority 100
  // (first choice), 127.0.0.1:7002 priority 0 (never promoted)"; down ones named as down.
  std::string listing;
};

// `connected` is the master's connected_slaves: a replica the sentinels have not seen yet can
// confirm a WAIT too, so the larger of it and the reachable count is what can confirm.
FailoverCopies CountFailoverCopies(const std::vector<SentinelReplica>& replicas, int connected);

}  // namespace leasehold::internal
