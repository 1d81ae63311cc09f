// File: backends/redis/redis_run.h (internal)
//
// How the redis:// store's files run their scripts: the script table (SCRIPT LOAD on NOSCRIPT),
// one pipelined round trip per operation routed to the node of each key (RunEach: MOVED, ASK and
// TRYAGAIN redone for exactly the calls they hit), SCAN pages, and the key names' parsing. Only
// the redis_*.cc files include it.

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

using std::chrono::milliseconds;

// A waiter whose subscription is not confirmed (subscriber down) polls this often.
inline constexpr Duration kFallbackPoll = milliseconds(100);
// Waiters woken by a grant's expiry spread out over up to this much.
inline constexpr Duration kMaxExpiryJitter = milliseconds(20);
// fair=true: a waiter's queue entry lives this long past its latest attempt (plus the time two
// store calls may take, see FairEntryLifetime). Store::Acquire re-attempts on every release
// message, at the holder's expiry, and at least every 5 s (kNotificationSafetyNet in
// src/core/store.cc); twice that leaves room for one missed re-check. The price: a waiter killed
// at the head of the queue delays the next grant by up to its entry lifetime.
inline constexpr Duration kFairEntryBase = std::chrono::seconds(10);
// fair=true: a grant handed over inside a release is taken without a round trip only while at
// least this share of its TTL is left, counted from the waiter's t_q (as etcd's spare leases);
// otherwise the waiter renews it first.
inline constexpr int kHandedMinLeftNum = 3;
inline constexpr int kHandedMinLeftDen = 4;
// SCAN page size hint.
inline constexpr std::string_view kScanCount = "1000";

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

inline constexpr Script kScripts[kScriptCount] = {
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
inline const std::string& ScriptText(ScriptId id) {
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
inline std::string_view KindArg(LeaseMode mode, std::uint32_t limit) {
  return limit > 1 ? "semaphore" : mode == LeaseMode::kShared ? "shared" : "exclusive";
}

// Escapes Redis glob metacharacters (* ? [ ] \) so that `text` matches only itself in SCAN
// MATCH.
inline std::string GlobEscape(std::string_view text) {
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
inline void WarnOnce(const std::string& what, const std::string& message) {
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
inline void WarnPersistenceOffOnce(const std::string& address) {
  WarnOnce("persistence off " + address,
           fmt::format("redis at {} has persistence off (appendonly no, save \"\"): after a "
                       "restart of that server, leases are gone and fencing tokens start again "
                       "from 1, so a stale holder's token may be accepted. Turn on AOF "
                       "(appendonly yes) for fencing that survives restarts",
                       address));
}

// How long a queue entry outlives the waiter's latest attempt: max(ttl, kFairEntryBase), plus
// two command timeouts (a WaitForChange's queue read and the next try-acquire may each take
// that long before the entry is refreshed), plus the WAIT bound with min_replicas. The ttl term
// means a killed waiter never costs more than max(a killed holder, 10 s) plus those margins.
inline Duration FairEntryLifetime(const RedisOptions& options, Duration ttl) {
  Duration lifetime = std::max(ttl, kFairEntryBase) + 2 * options.command_timeout;
  if (options.min_replicas > 0) {
    lifetime += options.replica_timeout;
  }
  return lifetime;
}

// Loads every script on `connection` (to the node at `address`) and returns their SHA1s; counts
// on `pool`.
inline Result<std::vector<std::string>> LoadScripts(RedisConnectionPool& pool,
                                                    RedisConnection& connection,
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
inline constexpr int kMaxRedirectRounds = 5;
// The pause before the round after a TRYAGAIN (a slot half migrated, keys of one command on
// both sides).
inline constexpr Duration kTryAgainPause = milliseconds(20);

// The last argument of a granting script (kAcquireScript, kFairAcquireScript, kFairEndScript):
// RunEach puts in its place the least fencing token of the connection it sends the call on
// (BindEpochFloor). Not a number, so a call sent without it reads as floor 0.
inline constexpr std::string_view kEpochFloorArg = "(epoch floor)";

// `call` as it goes out on `connection`: a trailing kEpochFloorArg becomes the connection's
// master's config epoch << 32 (0 without Sentinel; redis_failover.h), or in a cluster
// 'cluster': the script reads the node's own config epoch in the grant's atomic step
// (kGrantLib's lh_floor_of), so a connection kept across the node's role changes never grants
// from an old epoch.
inline Command BindEpochFloor(const Command& call, const RedisConnection& connection,
                              bool cluster) {
  Command out = call;
  if (!out.empty() && out.back() == kEpochFloorArg) {
    out.back() = cluster ? std::string("cluster") : std::to_string(connection.epoch << 32);
  }
  return out;
}

// The key a command is routed by: EVALSHA's first key, GET's key; none (any master) otherwise.
inline std::optional<std::string_view> RoutingKey(const Command& command) {
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
inline ScriptReplies RunEach(RedisRouter& router, const std::vector<Command>& calls,
                             bool wait_replicas) {
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
inline Result<std::vector<ReplyPtr>> PipelineOn(RedisRouter& router, RedisConnectionPool& node,
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
inline Result<ScriptReplies> RunScripts(RedisRouter& router, const std::vector<Command>& calls,
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
inline Result<ScanPage> Scan(RedisConnectionPool& counters, RedisConnection& connection,
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
inline std::optional<std::string> LeaseNameOf(std::string_view redis_key, std::string_view head,
                                              std::string_view tail) {
  if (!redis_key.starts_with(head) || !redis_key.ends_with(tail)) {
    return std::nullopt;
  }
  return HexDecode(redis_key.substr(head.size(), redis_key.size() - head.size() - tail.size()));
}

}  // namespace leasehold::internal
