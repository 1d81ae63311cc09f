// File: backends/redis/redis_backend.cc (internal)
//
// RedisBackend: the operations, each a Lua script (redis_scripts.h) run with EVALSHA on a
// connection borrowed from the pool of the node that serves its key (redis_cluster.h: the one
// server's, or in a cluster the slot's master; redis_connection.h); waits go through the
// subscriber (redis_subscriber.h).
//
// Invariants:
// - One operation is one pipelined round trip: the EVALSHA (plus WAIT with min_replicas) is
//   written in one go and every reply read back; a batch that spans a cluster's masters is
//   written to all of them before any reply is read. NOSCRIPT costs one more SCRIPT LOAD and one
//   retry of exactly the calls that did not run; MOVED, ASK and TRYAGAIN one more round of
//   exactly those (RunEach). A call that may have run is never sent again.
// - Every time the backend reads is on clock_ (the Clock it was opened with), the clock of the
//   deadlines it receives; the grants' own expiry is the server's PEXPIRE, never a local time.

#include "backends/redis/redis_backend.h"

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

namespace {

using std::chrono::milliseconds;

// A waiter whose subscription is not confirmed (subscriber down) polls this often.
constexpr Duration kFallbackPoll = milliseconds(100);
// Waiters woken by a grant's expiry spread out over up to this much.
constexpr Duration kMaxExpiryJitter = milliseconds(20);
// fair=true: a waiter's queue entry lives this long past its latest attempt (plus the time two
// store calls may take, see FairEntryLifetime). Store::Acquire re-attempts on every release
// message, at the holder's expiry, and at least every 5 s (kNotificationSafetyNet in
// src/core/store.cc); twice that leaves room for one missed re-check. The price: a waiter killed
// at the head of the queue delays the next grant by up to its entry lifetime.
constexpr Duration kFairEntryBase = std::chrono::seconds(10);
// fair=true: a grant handed over inside a release is taken without a round trip only while at
// least this share of its TTL is left, counted from the waiter's t_q (as etcd's spare leases);
// otherwise the waiter renews it first.
constexpr int kHandedMinLeftNum = 3;
constexpr int kHandedMinLeftDen = 4;
// SCAN page size hint.
constexpr std::string_view kScanCount = "1000";

struct Script {
  std::string_view name;
  std::string_view body;
  // Sent after kGrantLib (redis_scripts.h).
  bool grant_lib = false;
};

enum ScriptId {
  kAcquire = 0,
  kRenew,
  kRelease,
  kForceRelease,
  kHolders,
  kFairAcquire,
  kAbandonWait,
  kQueueState,
  kFinish,
  kFencedWrite,
  kFairEnd,
  kForceGrant,
  kWaitState,
  kClearIntent,
  kIntent,
  kScriptCount
};

constexpr Script kScripts[kScriptCount] = {
    {"acquire", kAcquireScript, true},
    {"renew", kRenewScript, true},
    {"release", kReleaseScript, true},
    {"force-release", kForceReleaseScript},
    {"holders", kHoldersScript, true},
    {"fair acquire", kFairAcquireScript, true},
    {"abandon-wait", kAbandonWaitScript, true},
    {"queue-state", kQueueStateScript, true},
    {"finish", kFinishScript, true},
    {"fenced-write", kFencedWriteScript, true},
    {"fair end", kFairEndScript, true},
    {"force-release-grant", kForceGrantScript, true},
    {"wait-state", kWaitStateScript, true},
    {"clear-intent", kClearIntentScript},
    {"intent", kIntentScript},
};

// The text SCRIPT LOAD sends for `id` (kGrantLib first where the script uses it), which is
// also the text a script error's line number counts in.
const std::string& ScriptText(ScriptId id) {
  static const std::vector<std::string>* texts = [] {
    auto* out = new std::vector<std::string>();  // never destroyed
    for (const Script& script : kScripts) {
      out->push_back(script.grant_lib ? std::string(kGrantLib) + std::string(script.body)
                                      : std::string(script.body));
    }
    return out;
  }();
  return (*texts)[id];
}

// The kind name the scripts use for a request ("exclusive", "shared", "semaphore").
std::string_view KindArg(LeaseMode mode, std::uint32_t limit) {
  return limit > 1 ? "semaphore" : mode == LeaseMode::kShared ? "shared" : "exclusive";
}

// Escapes Redis glob metacharacters (* ? [ ] \) so that `text` matches only itself in SCAN
// MATCH.
std::string GlobEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') {
      out += '\\';
    }
    out += c;
  }
  return out;
}

// Logs `message` as a warning once per process for each `what` (a finding and a server address),
// however many handles open that server.
void WarnOnce(const std::string& what, const std::string& message) {
  static Mutex mu;
  static std::set<std::string>* warned = new std::set<std::string>();  // never destroyed
  {
    MutexLock lock(&mu);
    if (!warned->insert(what).second) {
      return;
    }
  }
  Log(LogLevel::kWarning, message);
}

// Warns once per server address and process that fencing tokens will not survive a restart.
void WarnPersistenceOffOnce(const std::string& address) {
  WarnOnce("persistence off " + address,
           fmt::format("redis at {} has persistence off (appendonly no, save \"\"): after a "
                       "restart of that server, leases are gone and fencing tokens start again "
                       "from 1, so a stale holder's token may be accepted. Turn on AOF "
                       "(appendonly yes) for fencing that survives restarts",
                       address));
}

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
std::vector<Command> ServerConfigCommands() {
  return {{"CONFIG", "GET", "appendonly"},       {"CONFIG", "GET", "save"},
          {"CONFIG", "GET", "appendfsync"},      {"CONFIG", "GET", "maxmemory"},
          {"CONFIG", "GET", "maxmemory-policy"}, {"INFO", "memory"}};
}

// Reads the replies to the CONFIG GETs of ServerConfigCommands() (the first five of `replies`).
ServerConfig ParseServerConfig(std::span<const ReplyPtr> replies) {
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
std::optional<std::string> InfoField(std::string_view info, std::string_view field) {
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
std::optional<std::string_view> InfoText(const redisReply* reply, std::string* refusal) {
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

Eviction ReadEviction(const ServerConfig& config, std::optional<std::string_view> memory_info,
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
std::string EvictionHarm(std::string_view policy) {
  if (policy.starts_with("volatile-")) {
    return "when memory is full Redis evicts keys that have a TTL, and every lease's grant has "
           "one: another process is then granted a key that is still held";
  }
  return "when memory is full Redis evicts any key: a lease's grant (another process is then "
         "granted a key that is still held) and its fencing counter (tokens start again at 1, "
         "so a stale writer's token is accepted)";
}

constexpr std::string_view kEvictionFix =
    "CONFIG SET maxmemory-policy noeviction (and the same in redis.conf), or give leases a "
    "Redis instance or database of their own without maxmemory; under noeviction an acquire "
    "that meets a full memory fails (OOM) and no lease is dropped";

// Diagnose's eviction finding: can the server drop a grant or a fencing counter?
CheckItem EvictionItem(const Eviction& eviction) {
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
Status EvictionRefusal(const std::string& address, const Eviction& eviction) {
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
CheckItem DurabilityItem(const ServerConfig& config, std::optional<std::string_view> info,
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
CheckItem TopologyItem(const RedisOptions& options, std::optional<std::string_view> server,
                       std::optional<std::string_view> replication, const std::string& refusal,
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

// How long a queue entry outlives the waiter's latest attempt: max(ttl, kFairEntryBase), plus
// two command timeouts (a WaitForChange's queue read and the next try-acquire may each take
// that long before the entry is refreshed), plus the WAIT bound with min_replicas. The ttl term
// means a killed waiter never costs more than max(a killed holder, 10 s) plus those margins.
Duration FairEntryLifetime(const RedisOptions& options, Duration ttl) {
  Duration lifetime = std::max(ttl, kFairEntryBase) + 2 * options.command_timeout;
  if (options.min_replicas > 0) {
    lifetime += options.replica_timeout;
  }
  return lifetime;
}

// Loads every script on `connection` (to the node at `address`) and returns their SHA1s; counts
// on `pool`.
Result<std::vector<std::string>> LoadScripts(RedisConnectionPool& pool, RedisConnection& connection,
                                             std::string_view address) {
  std::vector<Command> loads;
  for (int id = 0; id < kScriptCount; ++id) {
    loads.push_back({"SCRIPT", "LOAD", ScriptText(static_cast<ScriptId>(id))});
  }
  pool.script_loads_.fetch_add(1, std::memory_order_relaxed);
  pool.round_trips_.fetch_add(1, std::memory_order_relaxed);
  LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies, connection.Pipeline(loads, address));
  std::vector<std::string> shas;
  for (std::size_t i = 0; i < replies.size(); ++i) {
    if (IsError(replies[i].get())) {
      return ErrorReplyStatus(address,
                              fmt::format("SCRIPT LOAD of the {} script", kScripts[i].name),
                              ReplyText(replies[i].get()));
    }
    if (replies[i]->type != REDIS_REPLY_STRING) {
      return Status::Internal("unexpected reply from redis to SCRIPT LOAD");
    }
    shas.emplace_back(ReplyText(replies[i].get()));
  }
  return shas;
}

// What one batch of commands produced.
struct ScriptReplies {
  // One per command, in order; null where `errors` holds its failure.
  std::vector<ReplyPtr> replies;
  // One per command: OK where it was answered (an error reply is an answer).
  std::vector<Status> errors;
  // One per command: the replicas that acknowledged it (WAIT's reply on its node), when the
  // options ask for WAIT.
  std::vector<long long> replicas_of;
  // The fewest of replicas_of (a one-command batch: its node's).
  long long replicas = 0;
};

// How many times a batch goes round after redirections (MOVED, ASK, TRYAGAIN, NOSCRIPT) before
// the commands still redirected are reported kUnavailable: a slot moves once per redirection,
// so more rounds only happen while a cluster reshards that slot over and over.
constexpr int kMaxRedirectRounds = 5;
// The pause before the round after a TRYAGAIN (a slot half migrated, keys of one command on
// both sides).
constexpr Duration kTryAgainPause = milliseconds(20);

// The last argument of a granting script (kAcquireScript, kFairAcquireScript, kFairEndScript):
// RunEach puts in its place the least fencing token of the connection it sends the call on
// (BindEpochFloor). Not a number, so a call sent without it reads as floor 0.
constexpr std::string_view kEpochFloorArg = "(epoch floor)";

// `call` as it goes out on `connection`: a trailing kEpochFloorArg becomes the connection's
// master's config epoch << 32 (0 without Sentinel; redis_failover.h), or in a cluster
// 'cluster': the script reads the node's own config epoch in the grant's atomic step
// (kGrantLib's lh_floor_of), so a connection kept across the node's role changes never grants
// from an old epoch.
Command BindEpochFloor(const Command& call, const RedisConnection& connection, bool cluster) {
  Command out = call;
  if (!out.empty() && out.back() == kEpochFloorArg) {
    out.back() = cluster ? std::string("cluster") : std::to_string(connection.epoch << 32);
  }
  return out;
}

// The key a command is routed by: EVALSHA's first key, GET's key; none (any master) otherwise.
std::optional<std::string_view> RoutingKey(const Command& command) {
  if (command.size() >= 4 && command[0] == "EVALSHA" && command[2] != "0") {
    return command[3];
  }
  if (command.size() >= 2 && command[0] == "GET") {
    return command[1];
  }
  return std::nullopt;
}

// Runs `calls` and reads every reply. Every command goes to the node that serves its key (one
// server: the only one); every node's commands (followed by WAIT when `wait_replicas` and the
// options ask for it) are written before any reply is read, so a batch that spans the masters
// of a cluster still takes one round trip of latency. Commands that did not run and say so are
// sent again, each at most kMaxRedirectRounds times: MOVED (to the new master, after updating
// the slot map), ASK (to the importing node, after ASKING), TRYAGAIN (after a pause), NOSCRIPT
// (after reloading the scripts on that node). A command whose node cannot be reached or stops
// answering gets that kUnavailable and is never sent again: it may have run.
ScriptReplies RunEach(RedisRouter& router, const std::vector<Command>& calls, bool wait_replicas) {
  const RedisOptions& options = router.options();
  RedisConnectionPool& counters = *router.seed_pool();
  const std::size_t n = calls.size();
  ScriptReplies out;
  out.replies.resize(n);
  out.errors.assign(n, Status());
  out.replicas_of.assign(n, 0);
  const Command wait = {"WAIT", std::to_string(options.min_replicas),
                        std::to_string(CeilMillis(options.replica_timeout))};
  const Command asking = {"ASKING"};
  const bool waiting = wait_replicas && options.min_replicas > 0;

  // The commands of one node in one round.
  struct Target {
    std::shared_ptr<RedisConnectionPool> pool;
    bool asking = false;  // an ASK redirection's target: each command follows an ASKING
    std::vector<std::size_t> calls;
    std::optional<RedisConnectionPool::Borrowed> connection;
    Status failed;
    std::vector<ReplyPtr> replies;
  };

  std::vector<std::size_t> pending(n);
  for (std::size_t i = 0; i < n; ++i) {
    pending[i] = i;
  }
  std::map<std::size_t, std::pair<std::string, int>> ask_to;  // command -> ASK target
  std::string last_redirect;  // the latest redirecting reply, for the message if they never end
  for (int round = 0; !pending.empty(); ++round) {
    if (round == kMaxRedirectRounds) {
      for (std::size_t i : pending) {
        out.errors[i] = Status::Unavailable(fmt::format(
            "redis {}: {} (the slot is being migrated); try again later", options.Address(),
            last_redirect.empty() ? "redirected too often" : last_redirect));
      }
      break;
    }
    std::vector<Target> targets;
    for (std::size_t i : pending) {
      std::shared_ptr<RedisConnectionPool> pool;
      const auto ask = ask_to.find(i);
      if (ask != ask_to.end()) {
        pool = router.PoolForNode(ask->second.first, ask->second.second);
      } else {
        const std::optional<std::string_view> key = RoutingKey(calls[i]);
        Result<std::shared_ptr<RedisConnectionPool>> found =
            router.PoolForSlot(key ? KeySlot(*key) : 0);
        if (!found.ok()) {
          out.errors[i] = found.status();
          continue;
        }
        pool = std::move(found).value();
      }
      const bool by_ask = ask != ask_to.end();
      auto t = std::find_if(targets.begin(), targets.end(), [&](const Target& target) {
        return target.pool == pool && target.asking == by_ask;
      });
      if (t == targets.end()) {
        targets.push_back(Target{.pool = pool, .asking = by_ask});
        t = targets.end() - 1;
      }
      t->calls.push_back(i);
    }
    pending.clear();
    // Write every node's commands, then read every node's replies.
    for (Target& t : targets) {
      Result<RedisConnectionPool::Borrowed> borrowed = t.pool->Borrow();
      if (!borrowed.ok()) {
        t.failed = borrowed.status();
        continue;
      }
      t.connection.emplace(std::move(borrowed).value());
      std::vector<Command> commands;
      for (std::size_t i : t.calls) {
        if (t.asking) {
          commands.push_back(asking);
        }
        commands.push_back(BindEpochFloor(calls[i], t.connection->get(), router.cluster()));
      }
      if (waiting) {
        commands.push_back(wait);
      }
      t.failed = (*t.connection)->Send(commands, t.pool->options().Address());
    }
    counters.round_trips_.fetch_add(1, std::memory_order_relaxed);
    bool pause = false;
    for (Target& t : targets) {
      const std::string address = t.pool->options().Address();
      if (t.failed.ok()) {
        const std::size_t count = t.calls.size() * (t.asking ? 2 : 1) + (waiting ? 1 : 0);
        Result<std::vector<ReplyPtr>> replies = (*t.connection)->ReadReplies(count, address);
        if (replies.ok()) {
          t.replies = std::move(replies).value();
        } else {
          t.failed = replies.status();
        }
      }
      if (!t.failed.ok()) {
        // Perhaps a failover: read the map again before the next command.
        router.MarkStale();
        for (std::size_t i : t.calls) {
          out.errors[i] = t.failed;
        }
        continue;
      }
      long long replicas = 0;
      Status wait_error;
      if (waiting) {
        const redisReply* w = t.replies.back().get();
        if (IsError(w)) {
          wait_error = ErrorReplyStatus(address, "WAIT", ReplyText(w));
        } else if (Result<long long> acked = ParseInteger(w); acked.ok()) {
          replicas = *acked;
        } else {
          wait_error = acked.status();
        }
      }
      std::vector<std::size_t> noscript;  // commands to send again once the scripts are loaded
      for (std::size_t j = 0; j < t.calls.size(); ++j) {
        const std::size_t i = t.calls[j];
        ReplyPtr& reply = t.replies[t.asking ? 2 * j + 1 : j];
        const std::string_view error = IsError(reply.get()) ? ReplyText(reply.get()) : "";
        if (error.starts_with("TRYAGAIN") ||
            (!last_redirect.starts_with("TRYAGAIN") &&
             (error.starts_with("MOVED") || error.starts_with("ASK")))) {
          last_redirect = std::string(error);  // TRYAGAIN says the most: it is kept
        }
        // Redirections are a cluster's only: one server's MOVED (a redis:// URL that names a
        // cluster node) is its answer, reported as the error it is.
        std::optional<Redirection> r = router.cluster() ? ParseRedirection(error) : std::nullopt;
        if (r) {
          const std::string host = r->host.empty() ? t.pool->options().host : r->host;
          if (r->ask) {
            ask_to[i] = {host, r->port};
          } else {
            ask_to.erase(i);
            router.Moved(r->slot, host, r->port);
          }
          pending.push_back(i);
        } else if (router.cluster() && error.starts_with("TRYAGAIN")) {
          ask_to.erase(i);
          pause = true;
          pending.push_back(i);
        } else if (IsNoScript(reply.get())) {
          noscript.push_back(i);
          pending.push_back(i);  // to the same node, ASK or not
        } else if (!wait_error.ok()) {
          ask_to.erase(i);
          out.errors[i] = wait_error;
        } else {
          ask_to.erase(i);
          out.replies[i] = std::move(reply);
          out.replicas_of[i] = replicas;
        }
      }
      if (!noscript.empty()) {
        // NOSCRIPT: the call did not run (a restarted server, SCRIPT FLUSH, a node the scripts
        // were never loaded on), so sending it again cannot apply anything twice.
        Status loaded = LoadScripts(counters, t.connection->get(), address).status();
        if (!loaded.ok()) {
          for (std::size_t i : noscript) {
            out.errors[i] = loaded;
            pending.erase(std::find(pending.begin(), pending.end(), i));
          }
        }
      }
    }
    targets.clear();  // the connections go back to their pools before any pause
    if (pause && !pending.empty()) {
      std::this_thread::sleep_for(kTryAgainPause);
    }
  }
  out.replicas = n == 0 ? 0 : *std::min_element(out.replicas_of.begin(), out.replicas_of.end());
  return out;
}

// One pipelined round trip of `commands` on a connection of `node` (counted on the router's
// seed pool). A node that cannot be reached or stops answering marks a cluster's slot map stale,
// so that a failover is learnt before the next command.
Result<std::vector<ReplyPtr>> PipelineOn(RedisRouter& router, RedisConnectionPool& node,
                                         const std::vector<Command>& commands) {
  router.seed_pool()->round_trips_.fetch_add(1, std::memory_order_relaxed);
  Result<RedisConnectionPool::Borrowed> connection = node.Borrow();
  Result<std::vector<ReplyPtr>> replies = connection.status();
  if (connection.ok()) {
    replies = (*connection)->Pipeline(commands, node.options().Address());
  }
  if (!replies.ok()) {
    router.MarkStale();
  }
  return replies;
}

// RunEach, for batches that succeed or fail as one: the first command's failure, if any.
Result<ScriptReplies> RunScripts(RedisRouter& router, const std::vector<Command>& calls,
                                 bool wait_replicas) {
  ScriptReplies out = RunEach(router, calls, wait_replicas);
  for (Status& error : out.errors) {
    if (!error.ok()) {
      return std::move(error);
    }
  }
  return out;
}

// One page of a SCAN walk: the cursor to continue from ("0" when done) and the keys found.
// SCAN may return a key on more than one page.
struct ScanPage {
  std::string cursor;
  std::vector<std::string> keys;
};

// Runs one SCAN ... MATCH `pattern` from `cursor` on `connection` (to `address`): one round
// trip, counted on `counters`.
Result<ScanPage> Scan(RedisConnectionPool& counters, RedisConnection& connection,
                      const std::string& address, const std::string& pattern,
                      const std::string& cursor) {
  std::vector<Command> scan = {
      {"SCAN", cursor, "MATCH", pattern, "COUNT", std::string(kScanCount)}};
  counters.round_trips_.fetch_add(1, std::memory_order_relaxed);
  LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies, connection.Pipeline(scan, address));
  const redisReply* reply = replies[0].get();
  if (IsError(reply)) {
    return ErrorReplyStatus(address, "SCAN", ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
      reply->element[1]->type != REDIS_REPLY_ARRAY) {
    return Status::Internal("unexpected reply from redis to SCAN");
  }
  ScanPage page{.cursor = std::string(ReplyText(reply->element[0]))};
  for (std::size_t i = 0; i < reply->element[1]->elements; ++i) {
    page.keys.emplace_back(ReplyText(reply->element[1]->element[i]));
  }
  return page;
}

// Returns the lease name inside "<head><hex name><tail>", or nullopt if `redis_key` is not of
// that form (not one of ours).
std::optional<std::string> LeaseNameOf(std::string_view redis_key, std::string_view head,
                                       std::string_view tail) {
  if (!redis_key.starts_with(head) || !redis_key.ends_with(tail)) {
    return std::nullopt;
  }
  return HexDecode(redis_key.substr(head.size(), redis_key.size() - head.size() - tail.size()));
}

}  // namespace

RedisBackend::RedisBackend(RedisOptions options, Clock& clock, std::shared_ptr<RedisRouter> router,
                           bool persistence_off)
    : options_(std::move(options)),
      clock_(clock),
      router_(std::move(router)),
      pool_(router_->seed_pool()),
      persistence_off_(persistence_off) {}

RedisBackend::~RedisBackend() = default;

Result<std::shared_ptr<Backend>> OpenRedisBackend(const Url& url, Clock& clock) {
  LH_ASSIGN_OR_RETURN(RedisOptions options, RedisOptions::FromUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<RedisBackend> backend, RedisBackend::Open(options, clock));
  return std::shared_ptr<Backend>(std::move(backend));
}

Result<std::shared_ptr<RedisBackend>> RedisBackend::Open(RedisOptions options, Clock& clock) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<const RedisTlsContext> tls, RedisTlsContext::Create(options));
  std::shared_ptr<RedisRouter> router;
  if (options.cluster()) {
    LH_ASSIGN_OR_RETURN(router, RedisRouter::OpenCluster(options, clock, std::move(tls)));
  } else {
    router = std::make_shared<RedisRouter>(
        std::make_shared<RedisConnectionPool>(options, clock, std::move(tls)));
  }
  RedisConnectionPool& counters = *router->seed_pool();
  bool persistence_off = false;
  // The scripts go onto every master (a cluster's: each runs the scripts of its slots; a node
  // that becomes master later answers NOSCRIPT once, and RunEach loads them there).
  LH_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RedisConnectionPool>> masters,
                      router->MasterPools());
  for (const std::shared_ptr<RedisConnectionPool>& master : masters) {
    const std::string address = master->options().Address();
    LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, master->Borrow());
    LH_ASSIGN_OR_RETURN(std::vector<std::string> shas,
                        LoadScripts(counters, connection.get(), address));
    counters.shas_ = std::move(shas);  // the SHA1 of the text: the same on every node
    // Persistence and eviction checks. CONFIG is often denied to application users: then
    // persistence is assumed on (with a debug line: the server may well persist), and eviction
    // is read from INFO memory.
    std::vector<Command> config = ServerConfigCommands();
    counters.round_trips_.fetch_add(1, std::memory_order_relaxed);
    LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies, connection->Pipeline(config, address));
    const ServerConfig server = ParseServerConfig(replies);
    if (server.known()) {
      if (server.off()) {
        persistence_off = true;
        WarnPersistenceOffOnce(fmt::format("{}/{}", address, options.db));
      }
    } else {
      Log(LogLevel::kDebug,
          fmt::format("redis at {}: cannot check persistence with CONFIG GET ({}); assuming on",
                      address, server.refusal));
    }
    std::string memory_refusal;
    const Eviction eviction =
        ReadEviction(server, InfoText(replies.back().get(), &memory_refusal), memory_refusal);
    if (eviction.can_evict()) {
      if (!options.accept_eviction) {
        return EvictionRefusal(address, eviction);
      }
      WarnOnce("eviction accepted " + address,
               fmt::format("redis at {} may evict leases ({}): opened because the URL says "
                           "accept_eviction=true",
                           address, eviction.Describe()));
    } else if (!eviction.known()) {
      WarnOnce("eviction unknown " + address,
               fmt::format("redis at {}: cannot tell whether it may evict leases ({}); make "
                           "sure maxmemory-policy is noeviction",
                           address, eviction.refusal));
    }
  }
  return std::shared_ptr<RedisBackend>(
      new RedisBackend(std::move(options), clock, std::move(router), persistence_off));
}

Capabilities RedisBackend::capabilities() const {
  return Capabilities{.notifies_holder = true,
                      .fencing_survives_restart = !persistence_off_,
                      .fair_queue = options_.fair,
                      .shared_leases = true};
}

unsigned RedisBackend::fenced_ops() const {
  return FencedOpBit(FencedOp::Kind::kPut) | FencedOpBit(FencedOp::Kind::kDelete) |
         FencedOpBit(FencedOp::Kind::kHashSet);
}

std::string RedisBackend::LeaseKeyName(std::string_view prefix, std::string_view key) {
  return fmt::format("{}:{{{}}}", prefix, HexEncode(key));
}

std::string RedisBackend::FenceKeyName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":fence";
}

std::string RedisBackend::ChannelName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":released";
}

std::string RedisBackend::RecordKeyName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":record";
}

std::string RedisBackend::QueueKeyName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":queue";
}

std::string RedisBackend::QueueExpiryKeyName(std::string_view prefix, std::string_view key) {
  return QueueKeyName(prefix, key) + ":expiry";
}

std::string RedisBackend::QueueSeqKeyName(std::string_view prefix, std::string_view key) {
  return QueueKeyName(prefix, key) + ":seq";
}

std::string RedisBackend::QueueDataKeyName(std::string_view prefix, std::string_view key) {
  return QueueKeyName(prefix, key) + ":data";
}

std::string RedisBackend::IntentKeyName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":intent";
}

Result<Grant> RedisBackend::TryAcquire(const GrantRequest& request) {
  const bool queued_waiter = options_.fair && !request.waiter_id.empty();
  if (queued_waiter) {
    // A release handed this waiter the key and WaitForTurn heard it: no round trip needed.
    std::optional<Handed> handed;
    {
      MutexLock lock(&handed_mu_);
      if (auto it = handed_.find(request.waiter_id); it != handed_.end()) {
        handed = it->second;
        handed_.erase(it);
      }
    }
    if (handed) {
      Result<Grant> grant = TakeHanded(request, *handed);
      if (grant.ok() || grant.status().code() != StatusCode::kLost) {
        return grant;
      }
      // The handed grant is gone (expired, force-released): try as usual, which queues again.
    }
  }
  const long long ttl_ms = CeilMillis(request.ttl);
  const std::string lease_key = LeaseKeyName(options_.prefix, request.key);
  const std::string kind(KindArg(request.mode, request.limit));
  std::vector<Command> call;
  if (options_.fair) {
    // t_q: this attempt's send time, read after the core's t_send and before sending. The
    // queue entry keeps it; a release that hands us the key copies it (kFairEndScript).
    const SteadyTime t_q = clock_.Now();
    call.push_back({"EVALSHA", pool_->shas_[kFairAcquire], "6", lease_key,
                    FenceKeyName(options_.prefix, request.key),
                    QueueKeyName(options_.prefix, request.key),
                    QueueExpiryKeyName(options_.prefix, request.key),
                    QueueSeqKeyName(options_.prefix, request.key),
                    QueueDataKeyName(options_.prefix, request.key), request.owner_token,
                    request.holder, std::to_string(ttl_ms), request.waiter_id,
                    std::to_string(CeilMillis(FairEntryLifetime(options_, request.ttl))),
                    std::to_string(t_q.time_since_epoch().count()), kind,
                    std::to_string(request.limit), std::string(kEpochFloorArg)});
  } else {
    call.push_back({"EVALSHA", pool_->shas_[kAcquire], "3", lease_key,
                    FenceKeyName(options_.prefix, request.key),
                    IntentKeyName(options_.prefix, request.key), request.owner_token,
                    request.holder, std::to_string(ttl_ms), kind, std::to_string(request.limit),
                    request.waiter_id, std::string(kEpochFloorArg)});
  }
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, true));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("acquiring {}", request.key),
                             ScriptText(options_.fair ? kFairAcquire : kAcquire), ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 2) {
    return Status::Internal("unexpected reply from redis to the acquire script");
  }
  LH_ASSIGN_OR_RETURN(long long granted, ParseInteger(reply->element[0]));
  if (granted == 0) {
    if (!options_.fair && reply->elements >= 10 &&
        ParseInteger(reply->element[9]).value_or(0) == 1) {
      // Our writer intent lives: AbandonWait clears it if this call gives up.
      MutexLock lock(&intents_mu_);
      intents_.insert(request.waiter_id);
    }
    return HeldReply(request.key, reply);
  }
  if (granted == 3 && reply->elements >= 4) {
    // {3, held kind, held limit, holder}: the key's grants are of the other family or limit.
    LH_ASSIGN_OR_RETURN(long long held_limit, ParseInteger(reply->element[2]));
    const std::string_view held_kind = ReplyText(reply->element[1]);
    return LimitMismatch(request.key,
                         held_kind == "shared" ? LeaseMode::kShared : LeaseMode::kExclusive,
                         static_cast<std::uint32_t>(held_limit), ReplyText(reply->element[3]),
                         request.mode, request.limit);
  }
  if (granted == 4) {
    // {4, the waiting writer as a grant}: a writer intent keeps this shared request out.
    LH_ASSIGN_OR_RETURN(LeaseInfo writer, ParseLeaseInfo(request.key, reply, 1));
    writer.waiting_writer = true;
    return Status::HeldByAnother(
        fmt::format("{} waits for a writer: {} asked for it exclusively first (writer preference)",
                    request.key, writer.holder),
        writer);
  }
  LH_ASSIGN_OR_RETURN(long long fence, ParseInteger(reply->element[1]));
  if (granted == 2 && queued_waiter && reply->elements >= 5) {
    // Handed over by a release whose message we did not see: {2, fence, t_q, ttl_ms, slot}.
    LH_ASSIGN_OR_RETURN(long long t_q, ParseInteger(reply->element[2]));
    LH_ASSIGN_OR_RETURN(long long handed_ttl, ParseInteger(reply->element[3]));
    LH_ASSIGN_OR_RETURN(long long slot, ParseInteger(reply->element[4]));
    Result<Grant> grant =
        TakeHanded(request, Handed{.fencing_token = static_cast<FencingToken>(fence),
                                   .t_q = SteadyTime(Duration(t_q)),
                                   .ttl = StoreMillis(handed_ttl),
                                   .slot = static_cast<std::uint32_t>(slot)});
    if (!grant.ok() && grant.status().code() == StatusCode::kLost) {
      return Status::HeldByAnother(fmt::format(
          "{}: the grant a release handed to this waiter ended before it was taken", request.key));
    }
    return grant;
  }
  if (granted != 1 || reply->elements < 3) {
    return Status::Internal("unexpected reply from redis to the acquire script");
  }
  LH_ASSIGN_OR_RETURN(long long slot, ParseInteger(reply->element[2]));
  if (!options_.fair && !request.waiter_id.empty()) {
    // The script ended our writer intent, if we had one.
    MutexLock lock(&intents_mu_);
    intents_.erase(request.waiter_id);
  }
  if (options_.min_replicas > 0 && out.replicas < options_.min_replicas) {
    // A failover to a replica that never saw this grant would forget it: undo it. If the undo
    // itself fails, the grant simply expires after its TTL.
    std::vector<Command> undo = {{"EVALSHA", pool_->shas_[kRelease], "1", lease_key,
                                  request.owner_token, ChannelName(options_.prefix, request.key)}};
    (void)RunScripts(*router_, undo, false);
    return Status::Unavailable(fmt::format(
        "acquiring {}: only {} of {} replicas confirmed the grant within {}; undone", request.key,
        out.replicas, options_.min_replicas, FormatDuration(options_.replica_timeout)));
  }
  return Grant{.fencing_token = static_cast<FencingToken>(fence),
               .ttl = milliseconds(ttl_ms),
               .store_key = lease_key,
               .slot = static_cast<std::uint32_t>(slot)};
}

// SAFETY (DESIGN.md: safe_until = t_send + ttl - drift). The release that handed us the key ran
// on the server after the attempt whose entry it found (the server ran that attempt's script
// first: the entry, with its t_q, exists only once it has), and that attempt's script ran after
// we read its t_q. So the grant's expiry, release time + TTL, is at least t_q + TTL. `now` is
// read here, after the core read its t_send for this TryAcquire, so reporting
// Grant::ttl = TTL - (now - t_q) gives the core safe_until = t_send + TTL - (now - t_q) - drift
// <= t_q + TTL - drift: never later than the rule allows from our own send time t_q. The
// notification's arrival time plays no part. When that leaves under 3/4 of the TTL (a long
// wait since our last queue refresh), or replicas must confirm the grant, we renew first:
// the renewal's expiry starts when the server runs it, after `now`, so a full TTL counts from
// the core's t_send.
Result<Grant> RedisBackend::TakeHanded(const GrantRequest& request, const Handed& handed) {
  const std::string lease_key = LeaseKeyName(options_.prefix, request.key);
  const SteadyTime now = clock_.Now();
  const Duration requested = milliseconds(CeilMillis(request.ttl));
  // t_q and the TTL came back through the store and a pub/sub message: they are judged by
  // comparisons that cannot overflow before any arithmetic (a TTL above the one this waiter
  // asked for, or a t_q after now or more than a TTL ago, is not a usable handover).
  if (options_.min_replicas == 0 && handed.ttl > Duration::zero() && handed.ttl <= requested &&
      handed.t_q <= now && handed.t_q >= now - handed.ttl) {
    const Duration left = handed.ttl - (now - handed.t_q);
    if (left >= handed.ttl / kHandedMinLeftDen * kHandedMinLeftNum) {
      return Grant{.fencing_token = handed.fencing_token,
                   .ttl = left,
                   .store_key = lease_key,
                   .slot = handed.slot};
    }
  }
  LH_RETURN_IF_ERROR(Renew({request.key, request.owner_token, request.ttl}));
  return Grant{.fencing_token = handed.fencing_token,
               .ttl = requested,
               .store_key = lease_key,
               .slot = handed.slot};
}

void RedisBackend::RecordHanded(std::string_view waiter_id, std::string_view payload) {
  // "handed <waiter id> <fencing token> <t_q> <ttl_ms>[ <slot>]"
  std::vector<std::string_view> parts;
  std::size_t pos = 0;
  while (pos <= payload.size() && parts.size() < 7) {
    std::size_t space = payload.find(' ', pos);
    if (space == std::string_view::npos) {
      space = payload.size();
    }
    parts.push_back(payload.substr(pos, space - pos));
    pos = space + 1;
  }
  long long values[4] = {0, 0, 0, 0};
  if ((parts.size() != 5 && parts.size() != 6) || parts[0] != "handed" || parts[1] != waiter_id) {
    return;
  }
  for (std::size_t i = 0; i + 2 < parts.size(); ++i) {
    std::string_view text = parts[2 + i];
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), values[i]);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return;  // not ours to trust: the next attempt asks the server (kFairAcquireScript 5-11)
    }
  }
  MutexLock lock(&handed_mu_);
  handed_[std::string(waiter_id)] = Handed{
      .fencing_token = static_cast<FencingToken>(values[0]),
      .t_q = SteadyTime(Duration(values[1])),
      .ttl = StoreMillis(values[2]),
      .slot = static_cast<std::uint32_t>(std::clamp<long long>(values[3], 0, kMaxLeaseLimit))};
}

Result<long long> RedisBackend::FairEnd(std::string_view key, std::string_view who,
                                        std::string_view mode,
                                        const std::optional<std::string>& record,
                                        Duration record_ttl) {
  std::vector<Command> call = {
      {"EVALSHA", pool_->shas_[kFairEnd], "7", LeaseKeyName(options_.prefix, key),
       FenceKeyName(options_.prefix, key), QueueKeyName(options_.prefix, key),
       QueueExpiryKeyName(options_.prefix, key), QueueSeqKeyName(options_.prefix, key),
       QueueDataKeyName(options_.prefix, key), RecordKeyName(options_.prefix, key),
       std::string(who), ChannelName(options_.prefix, key), std::string(mode), record ? "1" : "0",
       record ? *record : std::string(), record ? std::to_string(CeilMillis(record_ttl)) : "0",
       std::string(kEpochFloorArg)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, record.has_value()));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("ending the grant of {}", key),
                             ScriptText(kFairEnd), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long ended, ParseInteger(reply));
  if (ended != 0 && record && options_.min_replicas > 0 && out.replicas < options_.min_replicas) {
    return Status::Unavailable(fmt::format(
        "finished {}, but only {} of the {} replicas asked for (min_replicas) acknowledged it "
        "within {}: a failover now could lose its record",
        key, out.replicas, options_.min_replicas, FormatDuration(options_.replica_timeout)));
  }
  return ended;
}

std::vector<Status> RedisBackend::RenewMany(std::span<const RenewRequest> requests) {
  std::vector<Status> results;
  if (requests.empty()) {
    return results;
  }
  std::vector<Command> calls;
  calls.reserve(requests.size());
  for (const RenewRequest& request : requests) {
    calls.push_back({"EVALSHA", pool_->shas_[kRenew], "1",
                     LeaseKeyName(options_.prefix, request.key), request.owner_token,
                     std::to_string(CeilMillis(request.ttl))});
  }
  // The server's wall clock, by which it expires the grants, read in the same round trip after
  // the renewals (backends/common/store_clock.h). Not in a cluster: each master has its own
  // clock, and TIME would go to one of them.
  const bool read_time = !router_->cluster();
  if (read_time) {
    calls.push_back({"TIME"});
  }
  // In a cluster each request goes to its key's master, and only a node that fails fails its
  // own requests.
  const SteadyTime t_send = clock_.Now();
  ScriptReplies out = RunEach(*router_, calls, true);
  if (read_time && out.errors.back().ok()) {
    if (std::optional<std::int64_t> us = ParseServerTime(out.replies.back().get())) {
      ObserveStoreTime({t_send, clock_.Now(), *us});
    }
  }
  results.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (!out.errors[i].ok()) {
      results.push_back(std::move(out.errors[i]));
      continue;
    }
    const redisReply* reply = out.replies[i].get();
    const bool replicas_short =
        options_.min_replicas > 0 && out.replicas_of[i] < options_.min_replicas;
    if (IsError(reply)) {
      results.push_back(ScriptErrorStatus(options_.Address(),
                                          fmt::format("renewing {}", requests[i].key),
                                          ScriptText(kRenew), ReplyText(reply)));
      continue;
    }
    Result<long long> renewed = ParseInteger(reply);
    if (!renewed.ok()) {
      results.push_back(renewed.status());
    } else if (*renewed == 0) {
      results.push_back(Status::Lost(fmt::format(
          "lease {} was lost: the grant expired, was force-released or is someone else's",
          requests[i].key)));
    } else if (replicas_short) {
      results.push_back(Status::Unavailable(fmt::format(
          "renewing {}: only {} of {} replicas confirmed within {}", requests[i].key,
          out.replicas_of[i], options_.min_replicas, FormatDuration(options_.replica_timeout))));
    } else {
      results.emplace_back();
    }
  }
  return results;
}

Status RedisBackend::Delete(std::string_view key, std::string_view owner_token) {
  if (options_.fair) {
    // The head waiter, if any, is granted the key inside the release (kFairEndScript).
    LH_ASSIGN_OR_RETURN(long long released,
                        FairEnd(key, owner_token, "owner", std::nullopt, Duration::zero()));
    if (released == 0) {
      return Status::Lost(fmt::format(
          "lease {} was lost or stolen: the grant expired, was force-released or is someone "
          "else's; nothing was deleted",
          key));
    }
    return Status();
  }
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kRelease], "1",
                                LeaseKeyName(options_.prefix, key), std::string(owner_token),
                                ChannelName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("releasing {}", key),
                             ScriptText(kRelease), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long released, ParseInteger(reply));
  if (released == 0) {
    return Status::Lost(fmt::format(
        "lease {} was lost or stolen: the grant expired, was force-released or is someone "
        "else's; nothing was deleted",
        key));
  }
  return Status();
}

Status RedisBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  // keep and record_ttl are rounded up to whole ms: a grant or record never ends early. A
  // positive keep never rounds to the '0' that means "delete".
  const std::string keep_ms =
      request.keep > Duration::zero() ? std::to_string(CeilMillis(request.keep)) : "0";
  if (options_.fair && request.keep == Duration::zero()) {
    // Deleted: hand the key to the head waiter in the same step, as Release does.
    LH_ASSIGN_OR_RETURN(long long finished, FairEnd(request.key, request.owner_token, "owner",
                                                    request.record, request.record_ttl));
    if (finished == 0) {
      return Status::Lost(fmt::format(
          "lease {} was lost or stolen: the grant expired, was force-released or is someone "
          "else's; nothing was deleted or written",
          request.key));
    }
    return Status();
  }
  const bool write_record = request.record.has_value();
  std::vector<Command> call = {
      {"EVALSHA", pool_->shas_[kFinish], "2", LeaseKeyName(options_.prefix, request.key),
       RecordKeyName(options_.prefix, request.key), request.owner_token,
       ChannelName(options_.prefix, request.key), keep_ms, write_record ? "1" : "0",
       write_record ? *request.record : std::string(),
       write_record ? std::to_string(CeilMillis(request.record_ttl)) : "0"}};
  // A record or a kept grant is what keeps the next host out: with min_replicas, WAIT for it as
  // an acquire does, so a failover right after is as unlikely to lose it as to lose a grant.
  const bool wait_replicas = write_record || request.keep > Duration::zero();
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, wait_replicas));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("finishing {}", request.key),
                             ScriptText(kFinish), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long finished, ParseInteger(reply));
  if (finished == 0) {
    return Status::Lost(fmt::format(
        "lease {} was lost or stolen: the grant expired, was force-released or is someone "
        "else's; nothing was deleted or written",
        request.key));
  }
  if (wait_replicas && options_.min_replicas > 0 && out.replicas < options_.min_replicas) {
    // Done on the master and not undoable; say that a failover now could forget it.
    return Status::Unavailable(fmt::format(
        "finished {}, but only {} of the {} replicas asked for (min_replicas) acknowledged it "
        "within {}: a failover now could lose its record or kept grant",
        request.key, out.replicas, options_.min_replicas,
        FormatDuration(options_.replica_timeout)));
  }
  return Status();
}

std::string RedisBackend::DataKeyPrefix(std::string_view key) const {
  // The hash tag first (the first {...} of a name is its tag), then the store's prefix, so that
  // two namespaces' leases of one name never share data; the name never starts with
  // "<prefix>:", the store's own keys.
  return fmt::format("{{{}}}:{}:", HexEncode(key), options_.prefix);
}

Result<std::vector<std::int64_t>> RedisBackend::FencedWrite(const FencedWriteRequest& request) {
  // The grant hash is named from the lease key, as every other operation names it, rather than
  // taken from request.store_key: a fenced write can only ever be checked against this key's
  // grant. (Both are the same for a grant this backend made.)
  const std::string lease_key = LeaseKeyName(options_.prefix, request.key);
  const std::string own = options_.prefix + ":";
  Command call = {"EVALSHA", pool_->shas_[kFencedWrite], std::to_string(1 + request.ops.size()),
                  lease_key};
  for (const FencedOp& op : request.ops) {
    if (op.key.starts_with(own)) {
      return Status::InvalidArgument(fmt::format(
          "fenced {} of {}: keys under '{}' are leasehold's own (grants, fencing counters, "
          "records, queues), not data; nothing was written",
          FencedOpKindName(op.kind), op.key, own));
    }
    if (op.kind != FencedOp::Kind::kPut && op.kind != FencedOp::Kind::kDelete &&
        op.kind != FencedOp::Kind::kHashSet) {
      return Status::Unimplemented(
          fmt::format("the redis store has no fenced {} op", FencedOpKindName(op.kind)));
    }
    if (options_.cluster() && KeySlot(op.key) != KeySlot(lease_key)) {
      // One script checks the grant and writes the data: in a cluster its keys must share a
      // slot, or the server refuses it (CROSSSLOT).
      return Status::InvalidArgument(fmt::format(
          "fenced {} of {}: in a Redis Cluster a data key must share the lease's hash slot; "
          "name it with Lease::DataKey (\"{}{}\"); nothing was written",
          FencedOpKindName(op.kind), op.key, DataKeyPrefix(request.key), op.key));
    }
    call.push_back(op.key);
  }
  call.push_back(request.owner_token);
  call.push_back(request.skip_guard_for_testing ? "0" : "1");
  for (const FencedOp& op : request.ops) {
    call.push_back(op.kind == FencedOp::Kind::kPut      ? "put"
                   : op.kind == FencedOp::Kind::kDelete ? "del"
                                                        : "hset");
    call.push_back(op.kind == FencedOp::Kind::kHashSet ? op.field : std::string());
    call.push_back(op.kind == FencedOp::Kind::kDelete ? std::string() : op.value);
  }
  std::vector<Command> calls;
  calls.push_back(std::move(call));
  // With min_replicas the write waits for replicas, as a finish does (same round trip).
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, calls, true));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("the fenced write of {}", request.key),
                             ScriptText(kFencedWrite), ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 1) {
    return Status::Internal("unexpected reply from redis to the fenced-write script");
  }
  LH_ASSIGN_OR_RETURN(long long outcome, ParseInteger(reply->element[0]));
  if (outcome == 0) {
    const std::string_view state =
        reply->elements >= 2 ? ReplyText(reply->element[1]) : std::string_view();
    if (state == "none") {
      return FencedOut(request.key, request.fencing_token,
                       "is no longer held: expired or released");
    }
    if (state == "kept") {
      return FencedOut(request.key, request.fencing_token,
                       "was released: its grant is kept until it expires, but writes nothing");
    }
    if (state != "other" || reply->elements < 4) {
      return Status::Internal("unexpected reply from redis to the fenced-write script");
    }
    LH_ASSIGN_OR_RETURN(long long fence, ParseInteger(reply->element[3]));
    return FencedOut(request.key, request.fencing_token,
                     fmt::format("is now held by {} under fencing token {}",
                                 ReplyText(reply->element[2]), fence));
  }
  if (outcome < 0) {
    if (reply->elements < 3) {
      return Status::Internal("unexpected reply from redis to the fenced-write script");
    }
    LH_ASSIGN_OR_RETURN(long long index, ParseInteger(reply->element[1]));
    if (index < 1 || static_cast<std::size_t>(index) > request.ops.size()) {
      return Status::Internal("unexpected reply from redis to the fenced-write script");
    }
    const FencedOp& op = request.ops[static_cast<std::size_t>(index - 1)];
    if (outcome == -1) {
      return Status::InvalidArgument(fmt::format(
          "fenced write of {}: op {} sets field '{}' of {}, which holds a {}, not a hash; nothing "
          "was written",
          request.key, index, op.field, op.key, ReplyText(reply->element[2])));
    }
    return Status::PermissionDenied(fmt::format(
        "redis at {} refused the fenced write of {}: the ACL user may not run {} on {} (op {}); "
        "nothing was written",
        options_.Address(), request.key, ReplyText(reply->element[2]), op.key, index));
  }
  if (reply->elements != 1 + request.ops.size()) {
    return Status::Internal("unexpected reply from redis to the fenced-write script");
  }
  std::vector<std::int64_t> affected;
  affected.reserve(request.ops.size());
  for (std::size_t i = 0; i < request.ops.size(); ++i) {
    LH_ASSIGN_OR_RETURN(long long n, ParseInteger(reply->element[i + 1]));
    affected.push_back(n);
  }
  if (options_.min_replicas > 0 && out.replicas < options_.min_replicas) {
    return Status::Unavailable(fmt::format(
        "the fenced write of {} was applied, but only {} of {} replicas confirmed it within {}: "
        "a failover now could lose it",
        request.key, out.replicas, options_.min_replicas,
        FormatDuration(options_.replica_timeout)));
  }
  return affected;
}

Result<std::optional<std::string>> RedisBackend::ReadRecord(std::string_view key) {
  // A plain GET is one atomic read; the server drops the record at its PX expiry.
  std::vector<Command> get = {{"GET", RecordKeyName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, get, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ErrorReplyStatus(options_.Address(), "GET", ReplyText(reply));
  }
  if (reply->type == REDIS_REPLY_NIL) {
    return std::optional<std::string>();
  }
  if (reply->type != REDIS_REPLY_STRING) {
    return Status::Internal(
        fmt::format("unexpected reply from redis to GET of the record of {}", key));
  }
  return std::optional<std::string>(std::string(ReplyText(reply)));
}

Result<std::vector<std::pair<std::string, std::string>>> RedisBackend::ListRecords(
    std::string_view prefix) {
  // Record keys are "<prefix>:{<hex>}:record": the prefix match works as in List(), and since
  // hex digits are never '}', a key ending in "}:record" whose middle decodes is a record. The
  // values come with plain GETs pipelined per SCAN page (one round trip each, like List, and no
  // command beyond the ACL's +get; MGET would need +mget and one slot in a cluster).
  const std::string head = options_.prefix + ":{";
  constexpr std::string_view kTail = "}:record";
  const std::string pattern = GlobEscape(head) + HexEncode(prefix) + "*" + std::string(kTail);
  std::vector<std::pair<std::string, std::string>> records;
  // In a cluster, every master's keys: each SCAN walks one node.
  LH_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RedisConnectionPool>> masters,
                      router_->MasterPools());
  for (const std::shared_ptr<RedisConnectionPool>& master : masters) {
    const std::string address = master->options().Address();
    LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, master->Borrow());
    std::string cursor = "0";
    do {
      LH_ASSIGN_OR_RETURN(ScanPage page, Scan(*pool_, connection.get(), address, pattern, cursor));
      cursor = std::move(page.cursor);
      std::vector<std::string> keys;
      std::vector<Command> reads;
      for (std::string& redis_key : page.keys) {
        std::optional<std::string> key = LeaseNameOf(redis_key, head, kTail);
        if (!key) {
          continue;  // not one of ours
        }
        keys.push_back(std::move(*key));
        reads.push_back({"GET", std::move(redis_key)});
      }
      if (reads.empty()) {
        continue;
      }
      pool_->round_trips_.fetch_add(1, std::memory_order_relaxed);
      LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> values, connection->Pipeline(reads, address));
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const redisReply* reply = values[i].get();
        if (IsError(reply) && ParseRedirection(ReplyText(reply))) {
          continue;  // migrated since SCAN saw it: the target's walk finds it, or has
        }
        if (IsError(reply)) {
          return ErrorReplyStatus(address, "GET", ReplyText(reply));
        }
        if (reply->type == REDIS_REPLY_NIL) {
          continue;  // expired since SCAN saw it
        }
        if (reply->type != REDIS_REPLY_STRING) {
          return Status::Internal(
              fmt::format("unexpected reply from redis to GET of the record of {}", keys[i]));
        }
        records.emplace_back(std::move(keys[i]), std::string(ReplyText(reply)));
      }
    } while (cursor != "0");
  }
  // std::string compares as unsigned bytes (char_traits<char>::lt), the order the other stores
  // give.
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  // SCAN may return a key more than once.
  records.erase(std::unique(records.begin(), records.end(),
                            [](const auto& a, const auto& b) { return a.first == b.first; }),
                records.end());
  return records;
}

Result<StoreTime> RedisBackend::WallClock() {
  // In a cluster, the clock of slot 0's master.
  std::vector<Command> time = {{"TIME"}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, time, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ErrorReplyStatus(options_.Address(), "TIME", ReplyText(reply));
  }
  // {unix seconds, microseconds within the second}, both as strings.
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) {
    return Status::Internal("unexpected reply from redis to TIME");
  }
  LH_ASSIGN_OR_RETURN(long long seconds, ParseInteger(reply->element[0]));
  LH_ASSIGN_OR_RETURN(long long micros, ParseInteger(reply->element[1]));
  return StoreTime{.time = SystemTime(std::chrono::duration_cast<SystemTime::duration>(
                       std::chrono::seconds(seconds) + std::chrono::microseconds(micros))),
                   .from_store = true};
}

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

namespace {

// Reads kHoldersScript's reply for `key`: the live grants, by slot.
Result<std::vector<LeaseInfo>> ParseHolders(const std::string& address, const std::string& key,
                                            const redisReply* reply) {
  if (IsError(reply)) {
    return ScriptErrorStatus(address, fmt::format("inspecting {}", key), ScriptText(kHolders),
                             ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY) {
    return Status::Internal("unexpected reply from redis to the holders script");
  }
  std::vector<LeaseInfo> holders;
  holders.reserve(reply->elements);
  for (std::size_t i = 0; i < reply->elements; ++i) {
    LH_ASSIGN_OR_RETURN(LeaseInfo info, ParseLeaseInfo(key, reply->element[i], 0));
    holders.push_back(std::move(info));
  }
  return holders;
}

}  // namespace

Result<std::vector<LeaseInfo>> RedisBackend::Holders(std::string_view key) {
  // The grants, then the writer intent (fair=false; none exists with fair=true): two one-key
  // scripts in one round trip (kIntentScript says why not one).
  std::vector<Command> call = {
      {"EVALSHA", pool_->shas_[kHolders], "1", LeaseKeyName(options_.prefix, key)},
      {"EVALSHA", pool_->shas_[kIntent], "1", IntentKeyName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
  LH_ASSIGN_OR_RETURN(std::vector<LeaseInfo> holders,
                      ParseHolders(options_.Address(), std::string(key), out.replies[0].get()));
  const redisReply* intent = out.replies[1].get();
  if (IsError(intent)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("inspecting {}", key),
                             ScriptText(kIntent), ReplyText(intent));
  }
  if (intent->type == REDIS_REPLY_ARRAY && intent->elements >= 8) {
    LH_ASSIGN_OR_RETURN(LeaseInfo writer, ParseLeaseInfo(std::string(key), intent, 0));
    writer.waiting_writer = true;
    holders.push_back(std::move(writer));
  }
  return holders;
}

Result<std::vector<LeaseInfo>> RedisBackend::List(std::string_view prefix) {
  // Grant keys are "<prefix>:{<hex>}"; hex(prefix) is a prefix of hex(key) exactly when prefix
  // is a prefix of key, and hex digits are never glob metacharacters. The trailing "}" keeps
  // the fence counters (":fence"), records (":record"), intents and queues out of the match.
  const std::string head = options_.prefix + ":{";
  const std::string pattern = GlobEscape(head) + HexEncode(prefix) + "*}";
  std::vector<LeaseInfo> leases;
  std::set<std::string> seen;  // SCAN may return a key more than once
  // In a cluster, every master's keys: each SCAN walks one node.
  LH_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RedisConnectionPool>> masters,
                      router_->MasterPools());
  for (std::size_t m = 0; m < masters.size(); ++m) {
    const std::string address = masters[m]->options().Address();
    std::string cursor = "0";
    do {
      ScanPage page;
      {
        // The connection goes back to the pool before the page's grants are read (RunScripts
        // borrows its own).
        LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, masters[m]->Borrow());
        LH_ASSIGN_OR_RETURN(page, Scan(*pool_, connection.get(), address, pattern, cursor));
      }
      cursor = std::move(page.cursor);
      std::vector<std::string> keys;
      std::vector<Command> reads;
      for (std::string& redis_key : page.keys) {
        std::optional<std::string> key = LeaseNameOf(redis_key, head, "}");
        if (!key || !seen.insert(*key).second) {
          continue;  // not one of ours, or seen on an earlier page
        }
        keys.push_back(std::move(*key));
        reads.push_back({"EVALSHA", pool_->shas_[kHolders], "1", std::move(redis_key)});
      }
      if (reads.empty()) {
        continue;
      }
      LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, reads, false));
      for (std::size_t i = 0; i < keys.size(); ++i) {
        LH_ASSIGN_OR_RETURN(std::vector<LeaseInfo> holders,
                            ParseHolders(options_.Address(), keys[i], out.replies[i].get()));
        for (LeaseInfo& info : holders) {
          leases.push_back(std::move(info));
        }
      }
    } while (cursor != "0");
  }
  // By key (std::string compares as unsigned bytes, the order the other stores give), then
  // slot; stable, so each key's grants stay in the slot order the script gave.
  std::stable_sort(leases.begin(), leases.end(), [](const LeaseInfo& a, const LeaseInfo& b) {
    return a.key != b.key ? a.key < b.key : a.slot < b.slot;
  });
  return leases;
}

Result<bool> RedisBackend::ForceReleaseOne(std::string_view key, std::string_view token_prefix) {
  if (token_prefix.empty()) {
    return Status::InvalidArgument(
        fmt::format("force-releasing one grant of {}: the token prefix is empty", key));
  }
  if (options_.fair) {
    // The room goes to the head waiters in the same step, as after a release.
    LH_ASSIGN_OR_RETURN(long long deleted,
                        FairEnd(key, token_prefix, "prefix", std::nullopt, Duration::zero()));
    return deleted != 0;
  }
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kForceGrant], "1",
                                LeaseKeyName(options_.prefix, key), std::string(token_prefix),
                                ChannelName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("force-releasing a grant of {}", key),
                             ScriptText(kForceGrant), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long deleted, ParseInteger(reply));
  return deleted == 1;
}

Result<bool> RedisBackend::ForceEnd(std::string_view key, std::string_view token_prefix) {
  return token_prefix.empty() ? ForceReleaseAll(key) : ForceReleaseOne(key, token_prefix);
}

Result<bool> RedisBackend::ForceReleaseAll(std::string_view key) {
  if (options_.fair) {
    // The head waiter is granted the key in the same step, as after a release.
    LH_ASSIGN_OR_RETURN(long long deleted,
                        FairEnd(key, std::string_view(), "force", std::nullopt, Duration::zero()));
    return deleted != 0;
  }
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kForceRelease], "1",
                                LeaseKeyName(options_.prefix, key),
                                ChannelName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("force-releasing {}", key),
                             ScriptText(kForceRelease), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long deleted, ParseInteger(reply));
  return deleted == 1;
}

void RedisBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  if (waiter_id.empty()) {
    return;
  }
  if (!options_.fair) {
    {
      MutexLock lock(&intents_mu_);
      auto it = intents_.find(waiter_id);
      if (it == intents_.end()) {
        return;  // no writer intent of ours: nothing in the store to undo
      }
      intents_.erase(it);
    }
    std::vector<Command> call = {{"EVALSHA", pool_->shas_[kClearIntent], "1",
                                  IntentKeyName(options_.prefix, key), std::string(waiter_id),
                                  ChannelName(options_.prefix, key)}};
    Result<ScriptReplies> out = RunScripts(*router_, call, false);
    // Best effort: if this fails, the intent expires by itself within the waiter's TTL.
    if (!out.ok() || IsError(out->replies[0].get())) {
      Log(LogLevel::kDebug, fmt::format("clearing the writer intent of {}: {}", key,
                                        out.ok() ? std::string(ReplyText(out->replies[0].get()))
                                                 : out.status().ToString()));
    }
    return;
  }
  {
    MutexLock lock(&handed_mu_);
    if (auto it = handed_.find(waiter_id); it != handed_.end()) {
      handed_.erase(it);
    }
  }
  std::vector<Command> call = {
      {"EVALSHA", pool_->shas_[kAbandonWait], "5", LeaseKeyName(options_.prefix, key),
       QueueKeyName(options_.prefix, key), QueueExpiryKeyName(options_.prefix, key),
       QueueSeqKeyName(options_.prefix, key), QueueDataKeyName(options_.prefix, key),
       std::string(waiter_id), ChannelName(options_.prefix, key)}};
  Result<ScriptReplies> out = RunScripts(*router_, call, false);
  // Best effort: if this fails, the entry expires by itself within its lifetime (and a grant
  // handed to us after we gave up, within its TTL).
  if (!out.ok()) {
    Log(LogLevel::kDebug,
        fmt::format("leaving the wait queue of {}: {}", key, out.status().ToString()));
    return;
  }
  if (IsError(out->replies[0].get())) {
    Log(LogLevel::kDebug,
        fmt::format("leaving the wait queue of {}: {}", key,
                    ScriptErrorStatus(options_.Address(), "abandon-wait", ScriptText(kAbandonWait),
                                      ReplyText(out->replies[0].get()))
                        .ToString()));
    return;
  }
  Result<long long> left = ParseInteger(out->replies[0].get());
  if (left.ok() && *left == 2) {
    // A release handed us the key after we gave up: end that grant (handing it on) rather than
    // leave it blocking the key for its TTL.
    Result<long long> ended = FairEnd(key, waiter_id, "handed", std::nullopt, Duration::zero());
    if (!ended.ok()) {
      Log(LogLevel::kDebug, fmt::format("releasing the grant handed to a waiter that left {}: {}",
                                        key, ended.status().ToString()));
    }
  }
}

// How long a waiter on `key` may sleep before it re-checks, read after SUBSCRIBE: nullopt if the
// key is free (with fair, and nobody queued), so retry at once.
Result<std::optional<Duration>> RedisBackend::TimeToRecheck(std::string_view key,
                                                            std::string_view waiter_id,
                                                            bool* shared) {
  *shared = false;
  if (!options_.fair) {
    std::vector<Command> call = {{"EVALSHA", pool_->shas_[kWaitState], "2",
                                  LeaseKeyName(options_.prefix, key),
                                  IntentKeyName(options_.prefix, key), std::string(waiter_id)}};
    LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
    const redisReply* reply = out.replies[0].get();
    if (IsError(reply)) {
      return ScriptErrorStatus(options_.Address(), fmt::format("reading the grants of {}", key),
                               ScriptText(kWaitState), ReplyText(reply));
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) {
      return Status::Internal("unexpected reply from redis to the wait-state script");
    }
    LH_ASSIGN_OR_RETURN(long long left, ParseInteger(reply->element[0]));
    LH_ASSIGN_OR_RETURN(long long intent_left, ParseInteger(reply->element[1]));
    if (left < 0 && intent_left < 0) {
      return std::optional<Duration>();
    }
    // If the release message is missed, the first grant to end still ends by itself (and
    // another writer's intent, which keeps readers out, expires): wake then, spread out a
    // little so that many waiters do not retry in the same instant.
    Duration remaining =
        milliseconds(left >= 0 && (intent_left < 0 || left < intent_left) ? left : intent_left);
    return std::optional<Duration>(
        remaining + Jitter(std::min(remaining / 10 + milliseconds(1), kMaxExpiryJitter)));
  }
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kQueueState], "3",
                                LeaseKeyName(options_.prefix, key),
                                QueueKeyName(options_.prefix, key),
                                QueueExpiryKeyName(options_.prefix, key), std::string(waiter_id)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("reading the queue of {}", key),
                             ScriptText(kQueueState), ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 4) {
    return Status::Internal("unexpected reply from redis to the queue-state script");
  }
  LH_ASSIGN_OR_RETURN(long long pttl, ParseInteger(reply->element[0]));
  LH_ASSIGN_OR_RETURN(long long head_left, ParseInteger(reply->element[1]));
  LH_ASSIGN_OR_RETURN(long long is_head, ParseInteger(reply->element[2]));
  LH_ASSIGN_OR_RETURN(long long is_shared, ParseInteger(reply->element[3]));
  *shared = is_shared == 1;
  if (is_head == 2) {
    return std::optional<Duration>();  // a release handed us the key: take it at once
  }
  if (pttl >= 0) {
    // Held: as without fair, the release message or the first grant's expiry. A shared or
    // semaphore key may also have room that a dead head's entry keeps from us: wake when it
    // expires too.
    Duration remaining = milliseconds(pttl);
    if (*shared && head_left >= 0 && is_head == 0) {
      remaining = std::min<Duration>(remaining, milliseconds(head_left));
    }
    return std::optional<Duration>(
        remaining + Jitter(std::min(remaining / 10 + milliseconds(1), kMaxExpiryJitter)));
  }
  if (head_left < 0 || is_head == 1) {
    return std::optional<Duration>();  // free, and nobody is ahead of the caller
  }
  // Free, but someone else heads the queue: it takes the key within a round trip if it is
  // alive, which ends in a release message later; if it is dead, its entry expires in
  // head_left and the next in line may take the key. If it leaves (AbandonWait), a message.
  Duration sleep = milliseconds(head_left) + Jitter(kMaxExpiryJitter);
  if (waiter_id.empty()) {
    // Unknown caller: it may have become the head since it last tried (the waiter ahead left,
    // or expired, before our SUBSCRIBE), which we cannot see. Re-check often.
    sleep = std::min<Duration>(sleep, kFallbackPoll + Jitter(kFallbackPoll));
  }
  return std::optional<Duration>(sleep);
}

Status RedisBackend::WaitForChange(std::string_view key, SteadyTime deadline,
                                   std::stop_token stop) {
  return WaitForTurn(key, std::string_view(), deadline, std::move(stop));
}

Status RedisBackend::WaitForTurn(std::string_view key, std::string_view waiter_id,
                                 SteadyTime deadline, std::stop_token stop) {
  std::shared_ptr<RedisSubscriber> subscriber;
  {
    MutexLock lock(&subscriber_mu_);
    if (subscriber_ == nullptr) {
      subscriber_ = std::make_shared<RedisSubscriber>(pool_, clock_);
    }
    subscriber = subscriber_;
  }
  // fair=true: also keep a "handed" message naming this waiter (kFairEndScript).
  RedisSubscriber::Watch watch = subscriber->Register(
      ChannelName(options_.prefix, key), options_.fair ? waiter_id : std::string_view());
  // Ends the registration; a "handed" message for us becomes a record the next TryAcquire takes.
  auto unregister = [&]() {
    std::optional<std::string> handed = subscriber->Unregister(watch);
    if (handed) {
      RecordHanded(waiter_id, *handed);
    }
    return handed.has_value();
  };
  const bool subscribed = subscriber->AwaitSubscribed(
      watch, std::min(deadline, clock_.Now() + options_.command_timeout), stop);

  // Read the grant's remaining time (and the queue, with fair) only now, after SUBSCRIBE: a
  // release between the caller's TryAcquire and the subscription is seen here instead of being
  // missed.
  Result<std::optional<Duration>> sleep = Status::Cancelled("wait cancelled");
  bool shared = false;
  if (!stop.stop_requested()) {
    sleep = TimeToRecheck(key, waiter_id, &shared);
  }
  const SteadyTime now = clock_.Now();
  if (sleep.ok() && !sleep->has_value()) {
    unregister();
    return Status();  // already free (or handed to us)
  }
  Duration sleep_for = sleep.ok() ? **sleep : kFallbackPoll + Jitter(kFallbackPoll);
  if (!subscribed) {
    sleep_for = std::min<Duration>(sleep_for, kFallbackPoll + Jitter(kFallbackPoll));
  }
  SteadyTime wake_at = std::min(deadline, now + sleep_for);
  while (true) {
    std::optional<std::string> message = subscriber->AwaitNext(watch, wake_at, stop);
    if (!message || !options_.fair || waiter_id.empty()) {
      break;
    }
    // fair=true: a release handed the key to another waiter. We are still queued, untouched,
    // and the key is held again: nothing for us to try until that grant ends, which its
    // release (or a force-release) tells us, or its TTL (counted from the release, before
    // now) bounds. Retrying would only cost every waiter two round trips per handoff. The
    // caller's deadline (at most 5 s away, kNotificationSafetyNet) still bounds the wait, so
    // our queue entry is refreshed well within its lifetime.
    std::optional<Duration> other_ttl = HandedToOther(*message, waiter_id);
    if (!other_ttl) {
      break;
    }
    const SteadyTime other_ends =
        clock_.Now() + *other_ttl +
        Jitter(std::min(*other_ttl / 10 + milliseconds(1), kMaxExpiryJitter));
    // A shared or semaphore key: the handed grant is one of several, and the others (whose
    // soonest end wake_at already counts) may end first.
    wake_at = std::min(deadline, shared ? std::min(wake_at, other_ends) : other_ends);
  }
  const bool handed = unregister();
  if (stop.stop_requested()) {
    return Status::Cancelled("wait cancelled");
  }
  if (!handed && clock_.Now() >= deadline) {
    return Status::DeadlineExceeded("wait ran out");
  }
  return Status();
}

RedisBackend::Stats RedisBackend::stats() const {
  std::uint64_t connects = 0;
  for (const std::shared_ptr<RedisConnectionPool>& pool : router_->AllPools()) {
    connects += pool->connects_.load(std::memory_order_relaxed);
  }
  return Stats{.round_trips = pool_->round_trips_.load(std::memory_order_relaxed),
               .connects = connects,
               .script_loads = pool_->script_loads_.load(std::memory_order_relaxed),
               .slot_map_reads = router_->refreshes()};
}

}  // namespace leasehold::internal
