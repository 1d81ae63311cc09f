// File: leasehold/check.h
//
// The store doctor (Store::Check, `leasehold check`): before a lease guards anything, find out
// whether the store can keep leasehold's promises, and which TTL it needs.
//
// A check measures the store's own cheapest round trip (the probe leasehold-bench calls the
// floor: Redis PING, PostgreSQL SELECT 1, an etcd Range of a missing key, a ZooKeeper exists,
// an empty SQLite transaction), runs one full acquire -> renew -> release cycle on a throwaway
// key (its renewals timed as the heartbeat's are), reads the store's clock against this host's,
// and asks the backend about durability, topology and permissions. Each finding is a CheckItem
// with a verdict and, when it is not a pass, one line saying what to change.
//
// The TTL advice follows the rule "TTL at least an order of magnitude above the heartbeat's p99
// round trip": min_ttl = 10 x the larger of the round-trip p99 and the renewals' p99, rounded up
// to the store's granularity (etcd whole seconds, ZooKeeper ticks) and to what the store would
// grant; recommended_ttl = min_ttl but at least 1 s (process pauses: GC, CPU throttling, a busy
// host; a check does not see them), renew every recommended_ttl / 3.
//
// Example:
//
//   auto report = store->Check({.ttl = 5s});
//   if (!report.ok()) return report.status();          // bad options only
//   for (const auto& item : report->items) ...         // report->verdict: the worst of them
//
// Thread safety: plain value types; Store::Check is thread-safe.

#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease_info.h"

namespace leasehold {

// Which processes exclude each other through a store: those that open the same store. A lease
// means nothing to a process outside its store's scope.
enum class StoreScope {
  kProcess,  // memory://: this process only
  kUser,     // an embedded file only its owner may write: this user's processes on this host
  kHost,     // an embedded file every local user may write (sqlite's scope=host, the default
             // store): every process of this host
  kFleet,    // a server: every process of every host that reaches it
};

// "this process", "this user on this host", "this host", "every host that reaches the store".
std::string_view StoreScopeName(StoreScope scope);

// How bad a finding is, in increasing order (CheckReport::verdict is the largest).
enum class CheckVerdict {
  kPass,
  // Worth knowing, safe as it is (e.g. no replicas, a store without a clock of its own).
  kWarn,
  // Leases or fencing tokens would not be safe: fencing counters that a restart resets, a TTL
  // below the rule, a store that grants less than it was asked.
  kUnsafe,
  // The credentials cannot perform an operation leasehold needs.
  kPermissionDenied,
  // The store could not be reached, or did not answer within its timeouts.
  kUnreachable,
};

// Returns "pass", "warn", "unsafe", "permission" or "unreachable".
std::string_view CheckVerdictName(CheckVerdict verdict);

struct CheckItem {
  // What was looked at: "round-trip", "cycle", "clock", "durability", "eviction" (Redis),
  // "topology", "permissions", "session", "ttl", "cpu" (the CPU quota of the cgroup the check
  // runs in).
  std::string area;
  CheckVerdict verdict = CheckVerdict::kPass;
  // One line: what was found.
  std::string found;
  // One line: what to change. Empty for a pass.
  std::string fix;
};

struct CheckOptions {
  // The TTL to judge, and the one the cycle asks for. Unset: the cycle uses LeaseOptions' default
  // TTL and the report judges none (CheckReport::ttl_judged is false).
  std::optional<Duration> ttl;
  // How many round trips to time. REQUIRES: 1 <= probes <= 10000. Default: 50.
  int probes = 50;
  // How many renewals the cycle times. REQUIRES: 1 <= renewals <= 1000. Default: 10.
  int renewals = 10;
  // The throwaway key of the cycle. Empty: "leasehold-check/<16 random hex digits>", which no
  // one else holds. It is released at the end of the cycle (and expires at its TTL if the
  // check is interrupted).
  std::string key;
};

// Latencies of a series of round trips.
struct LatencySummary {
  int count = 0;
  Duration p50{};
  Duration p99{};
  Duration max{};
};

struct CheckReport {
  // The store (Store::display_url, password masked) and its backend's scheme.
  std::string store;
  std::string backend;
  // Which processes its leases exclude (Store::scope()).
  StoreScope scope = StoreScope::kFleet;

  // The round trip: `probe` names it ("PING", "SELECT 1", ...).
  std::string probe;
  LatencySummary round_trip;

  // The cycle on the throwaway key: set only if it ran to its end.
  bool cycle_done = false;
  std::string cycle_key;
  Duration acquire{};
  LatencySummary renew;
  Duration release{};
  Duration cycle_total{};
  FencingToken fencing_token = 0;
  // The TTL the cycle asked for, and the one the store granted (ZooKeeper clamps it to its
  // session bounds, etcd rounds it up to whole seconds).
  Duration ttl_requested{};
  Duration ttl_granted{};

  // The store's wall clock minus this host's, and the uncertainty of that figure (half the
  // round trip that read it). Unset if the store has no clock of its own (etcd) or it could not
  // be read.
  std::optional<Duration> clock_offset;
  std::optional<Duration> clock_uncertainty;

  // The TTL advice (see the file comment). ttl_granularity is zero for a store without one.
  Duration ttl_granularity{};
  Duration min_ttl{};
  Duration recommended_ttl{};
  Duration recommended_renew_every{};
  // True when CheckOptions::ttl was given; ttl_safe is then whether its granted TTL meets the rule.
  bool ttl_judged = false;
  bool ttl_safe = false;

  std::vector<CheckItem> items;
  // The worst verdict of items.
  CheckVerdict verdict = CheckVerdict::kPass;
};

}  // namespace leasehold
