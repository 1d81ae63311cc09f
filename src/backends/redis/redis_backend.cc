// File: backends/redis/redis_backend.cc (internal)
//
// RedisBackend over hiredis 0.14 (synchronous API). The only file that includes hiredis.
//
// Invariants:
// - One operation is one pipelined round trip: the EVALSHA (plus WAIT with min_replicas) is
//   written in one go and every reply read back. NOSCRIPT costs one more SCRIPT LOAD and one
//   retry of exactly the calls that did not run.
// - A connection that saw an I/O error or timeout is never reused: hiredis cannot resync a
//   stream whose replies may still be in flight. The pool drops it and opens a new one.
// - Every socket read and write is bounded (SO_RCVTIMEO/SO_SNDTIMEO via redisSetTimeout), so no
//   call blocks longer than the command timeout per read, whatever the server does.

#include "backends/redis/redis_backend.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <sys/eventfd.h>
#include <sys/time.h>

#include "backends/redis/redis_scripts.h"
#include "core/duration.h"
#include "core/logging.h"
#include "util/hex.h"
#include "util/mutex.h"
#include "util/sigpipe_guard.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

namespace {

using std::chrono::milliseconds;
using Command = std::vector<std::string>;

// A waiter whose subscription is not confirmed (subscriber down) polls this often.
constexpr Duration kFallbackPoll = milliseconds(100);
// Waiters woken by a grant's expiry spread out over up to this much.
constexpr Duration kMaxExpiryJitter = milliseconds(20);
// Reconnect backoff after a failed connect: doubling from base to cap.
constexpr Duration kReconnectBackoffBase = milliseconds(50);
constexpr Duration kReconnectBackoffCap = milliseconds(1000);
// A channel stays subscribed this long after its last waiter leaves: a waiter that loses the
// race for the grant waits again at once, and must not pay for a new SUBSCRIBE every time.
constexpr auto kSubscriptionLinger = std::chrono::seconds(1);
// How long the subscriber thread sleeps in poll() when nothing happens; it is woken through an
// eventfd for every change, so this only bounds how stale a stop request can get.
constexpr int kSubscriberPollMs = 1000;
// fair=true: a waiter's queue entry lives this long past its latest attempt (plus the time two
// store calls may take, see FairEntryLifetime). Store::Acquire re-attempts on every release
// message, at the holder's expiry, and at least every 5 s (kNotificationSafetyNet in
// src/core/store.cc); twice that leaves room for one missed re-check. The price: a waiter killed
// at the head of the queue delays the next grant by up to its entry lifetime.
constexpr Duration kFairEntryBase = std::chrono::seconds(10);
// SCAN page size hint.
constexpr std::string_view kScanCount = "1000";

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};

using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* context) const { redisFree(context); }
};

using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

struct Script {
  std::string_view name;
  std::string_view body;
};

enum ScriptId {
  kAcquire = 0,
  kRenew,
  kRelease,
  kForceRelease,
  kInspect,
  kFairAcquire,
  kAbandonWait,
  kQueueState,
  kFinish,
  kScriptCount
};

constexpr Script kScripts[kScriptCount] = {
    {"acquire", kAcquireScript},          {"renew", kRenewScript},
    {"release", kReleaseScript},          {"force-release", kForceReleaseScript},
    {"inspect", kInspectScript},          {"fair acquire", kFairAcquireScript},
    {"abandon-wait", kAbandonWaitScript}, {"queue-state", kQueueStateScript},
    {"finish", kFinishScript},
};

timeval ToTimeval(Duration d) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

long long CeilMillis(Duration d) {
  return std::max<long long>(1, std::chrono::ceil<milliseconds>(d).count());
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

std::string_view ReplyText(const redisReply* reply) {
  if (reply == nullptr || reply->str == nullptr) {
    return {};
  }
  return {reply->str, reply->len};
}

bool IsError(const redisReply* reply) {
  return reply != nullptr && reply->type == REDIS_REPLY_ERROR;
}

bool IsNoScript(const redisReply* reply) {
  return IsError(reply) && ReplyText(reply).starts_with("NOSCRIPT");
}

// Maps a Redis error reply to a Status. The reply text never holds a password (Redis does not
// echo AUTH arguments), so it goes into the message and the detail as is; ACL refusals name
// the command ("NOPERM ... 'evalsha' command"), which is what an operator needs to fix them.
Status ErrorReplyStatus(std::string_view address, std::string_view what, std::string_view error) {
  std::string message = fmt::format("redis at {} refused {}: {}", address, what, error);
  auto has = [&](std::string_view s) { return error.find(s) != std::string_view::npos; };
  if (has("NOPERM") || has("WRONGPASS") || has("can't run this command") || has("NOAUTH") ||
      has("invalid password") || has("invalid username-password")) {
    return Status::PermissionDenied(std::move(message), std::string(error));
  }
  if (error.starts_with("LOADING") || error.starts_with("BUSY") ||
      error.starts_with("MASTERDOWN") || error.starts_with("READONLY") ||
      error.starts_with("TRYAGAIN") || error.starts_with("CLUSTERDOWN") ||
      error.starts_with("MOVED") || error.starts_with("ASK")) {
    return Status::Unavailable(std::move(message), std::string(error));
  }
  return Status::Internal(std::move(message), std::string(error));
}

// Returns the Redis command called on `line` (1-based) of `body`, upper-cased, or "".
std::string CommandOnLine(std::string_view body, int line) {
  std::size_t start = 0;
  for (int i = 1; i < line && start != std::string_view::npos; ++i) {
    start = body.find('\n', start);
    start = start == std::string_view::npos ? start : start + 1;
  }
  if (start == std::string_view::npos) {
    return {};
  }
  std::string_view text = body.substr(start, body.find('\n', start) - start);
  constexpr std::string_view kCall = "redis.call('";
  std::size_t at = text.find(kCall);
  if (at == std::string_view::npos) {
    return {};
  }
  text = text.substr(at + kCall.size());
  std::string name(text.substr(0, text.find('\'')));
  for (char& c : name) {
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

// As ErrorReplyStatus, for an error raised inside `script`. Redis 7.0 reports an ACL refusal
// inside a script as "ERR The user executing the script can't run this command or subcommand
// script: <sha>, on @user_script:<line>." without the command's name: recover it from the
// script's own text, so that the operator learns which command to grant.
Status ScriptErrorStatus(std::string_view address, std::string_view what, std::string_view body,
                         std::string_view error) {
  Status status = ErrorReplyStatus(address, what, error);
  constexpr std::string_view kLineTag = "@user_script:";
  std::size_t at = error.find(kLineTag);
  if (status.code() != StatusCode::kPermissionDenied || at == std::string_view::npos) {
    return status;
  }
  int line = 0;
  std::string_view digits = error.substr(at + kLineTag.size());
  std::from_chars(digits.data(), digits.data() + digits.size(), line);
  std::string command = CommandOnLine(body, line);
  if (command.empty()) {
    return status;
  }
  return Status::PermissionDenied(
      fmt::format("redis at {} refused {}: the ACL user may not run the '{}' command (add "
                  "+{} to the user's ACL rules)",
                  address, what, command,
                  [&] {
                    std::string lower = command;
                    for (char& c : lower) {
                      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                    }
                    return lower;
                  }()),
      std::string(error));
}

Result<long long> ParseInteger(const redisReply* reply) {
  if (reply != nullptr && reply->type == REDIS_REPLY_INTEGER) {
    return reply->integer;
  }
  if (reply != nullptr && reply->type == REDIS_REPLY_STRING) {
    long long value = 0;
    std::string_view text = ReplyText(reply);
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc() && end == text.data() + text.size()) {
      return value;
    }
  }
  return Status::Internal("unexpected reply from redis: expected an integer");
}

// {holder, token_prefix, fence, pttl_ms, ttl_ms} starting at element `first` of `reply`.
Result<LeaseInfo> ParseLeaseInfo(std::string key, const redisReply* reply, std::size_t first) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements < first + 5) {
    return Status::Internal("unexpected reply from redis: malformed grant");
  }
  LeaseInfo info;
  info.key = std::move(key);
  info.holder = std::string(ReplyText(reply->element[first]));
  info.token_prefix = std::string(ReplyText(reply->element[first + 1]));
  LH_ASSIGN_OR_RETURN(long long fence, ParseInteger(reply->element[first + 2]));
  LH_ASSIGN_OR_RETURN(long long pttl, ParseInteger(reply->element[first + 3]));
  Result<long long> ttl = ParseInteger(reply->element[first + 4]);
  info.fencing_token = static_cast<FencingToken>(fence);
  info.remaining = milliseconds(std::max<long long>(0, pttl));
  info.ttl = milliseconds(ttl.ok() ? *ttl : 0);
  return info;
}

SteadyTime NowBoot() {
  return BootClock::now();
}

// CondVar waits on std::chrono::steady_clock; deadlines arrive on BootClock. Both run at the
// same rate while the machine is awake, so convert the remaining time.
std::chrono::steady_clock::time_point ToSteady(SteadyTime t) {
  Duration left = t - NowBoot();
  left = std::clamp<Duration>(left, Duration::zero(), std::chrono::hours(24));
  return std::chrono::steady_clock::now() + left;
}

Duration Jitter(Duration up_to) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  if (up_to <= Duration::zero()) {
    return Duration::zero();
  }
  std::uniform_int_distribution<Duration::rep> dist(0, up_to.count());
  return Duration(dist(rng));
}

// Warns once per server address and process that fencing tokens will not survive a restart.
void WarnPersistenceOffOnce(const std::string& address) {
  static Mutex mu;
  static std::set<std::string>* warned = new std::set<std::string>();  // never destroyed
  {
    MutexLock lock(&mu);
    if (!warned->insert(address).second) {
      return;
    }
  }
  Log(LogLevel::kWarning,
      fmt::format("redis at {} has persistence off (appendonly no, save \"\"): after a restart "
                  "of that server, leases are gone and fencing tokens start again from 1, so "
                  "a stale holder's token may be accepted. Turn on AOF (appendonly yes) for "
                  "fencing that survives restarts",
                  address));
}

// Turns the acquire scripts' refusal into kHeldByAnother: {0, holder fields (nil when the key is
// free but others are queued ahead)[, next_prefix, queued, position]}.
Status HeldReply(std::string_view key, const redisReply* reply) {
  const bool fair = reply->elements >= 9;
  std::optional<LeaseInfo> holder;
  if (reply->elements >= 2 && reply->element[1]->type != REDIS_REPLY_NIL) {
    LH_ASSIGN_OR_RETURN(holder, ParseLeaseInfo(std::string(key), reply, 1));
  }
  if (!fair) {
    if (!holder) {
      return Status::Internal("unexpected reply from redis to the acquire script");
    }
    std::string message =
        fmt::format("{} is held by {} (fencing token {}, {} left)", key, holder->holder,
                    holder->fencing_token, FormatDuration(holder->remaining));
    return Status::HeldByAnother(std::move(message), std::move(holder));
  }
  const std::string next(ReplyText(reply->element[6]));
  LH_ASSIGN_OR_RETURN(long long queued, ParseInteger(reply->element[7]));
  LH_ASSIGN_OR_RETURN(long long position, ParseInteger(reply->element[8]));
  std::string queue = queued == 0 ? std::string("no waiters queued")
                                  : fmt::format("{} waiter(s) queued, next {}", queued, next);
  if (position >= 0) {
    queue += fmt::format(", this waiter is #{}", position + 1);
  }
  std::string message =
      holder ? fmt::format("{} is held by {} (fencing token {}, {} left); {}", key, holder->holder,
                           holder->fencing_token, FormatDuration(holder->remaining), queue)
             : fmt::format("{} is free but queued for: {}", key, queue);
  return Status::HeldByAnother(std::move(message), std::move(holder));
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

}  // namespace

// One hiredis context: blocking, with connect and per-read/write timeouts.
class RedisConnection {
 public:
  explicit RedisConnection(ContextPtr context) : context_(std::move(context)) {}

  // Connects, then AUTH, SELECT and PING in one round trip.
  static Result<std::unique_ptr<RedisConnection>> Connect(const RedisOptions& options) {
    const timeval connect_tv = ToTimeval(options.connect_timeout);
    ContextPtr context(options.unix_socket.empty()
                           ? redisConnectWithTimeout(options.host.c_str(), options.port, connect_tv)
                           : redisConnectUnixWithTimeout(options.unix_socket.c_str(), connect_tv));
    if (context == nullptr) {
      return Status::Unavailable(
          fmt::format("cannot connect to redis at {}: out of memory", options.Address()));
    }
    if (context->err != 0) {
      return Status::Unavailable(
          fmt::format("cannot connect to redis at {}: {}", options.Address(), context->errstr),
          context->errstr);
    }
    // A WAIT may legitimately take replica_timeout on top of the command's own time.
    Duration io_timeout = options.command_timeout;
    if (options.min_replicas > 0) {
      io_timeout += options.replica_timeout;
    }
    if (redisSetTimeout(context.get(), ToTimeval(io_timeout)) != REDIS_OK) {
      return Status::Unavailable(
          fmt::format("cannot set timeouts on redis connection to {}", options.Address()));
    }
    auto connection = std::make_unique<RedisConnection>(std::move(context));
    std::vector<Command> hello;
    if (options.password) {
      if (options.user) {
        hello.push_back({"AUTH", *options.user, *options.password});
      } else {
        hello.push_back({"AUTH", *options.password});
      }
    }
    if (options.db != 0) {
      hello.push_back({"SELECT", std::to_string(options.db)});
    }
    hello.push_back({"PING"});
    LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
                        connection->Pipeline(hello, options.Address()));
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (IsError(replies[i].get())) {
        // Name the command, never its arguments (AUTH's are credentials).
        return ErrorReplyStatus(options.Address(), hello[i][0], ReplyText(replies[i].get()));
      }
    }
    return connection;
  }

  // Writes every command, then reads one reply per command: one round trip. Returns
  // kUnavailable (and marks the connection broken) on an I/O error or timeout.
  Result<std::vector<ReplyPtr>> Pipeline(std::span<const Command> commands,
                                         std::string_view address) {
    SigpipeGuard no_sigpipe;  // a reset connection must fail the call, not kill the process
    std::vector<const char*> argv;
    std::vector<std::size_t> argvlen;
    for (const Command& command : commands) {
      argv.clear();
      argvlen.clear();
      for (const std::string& arg : command) {
        argv.push_back(arg.data());
        argvlen.push_back(arg.size());
      }
      if (redisAppendCommandArgv(context_.get(), static_cast<int>(argv.size()), argv.data(),
                                 argvlen.data()) != REDIS_OK) {
        return Broken(address);
      }
    }
    std::vector<ReplyPtr> replies;
    replies.reserve(commands.size());
    for (std::size_t i = 0; i < commands.size(); ++i) {
      void* raw = nullptr;
      if (redisGetReply(context_.get(), &raw) != REDIS_OK || raw == nullptr) {
        return Broken(address);
      }
      replies.emplace_back(static_cast<redisReply*>(raw));
    }
    return replies;
  }

  [[nodiscard]] bool broken() const { return broken_; }

  // For the subscriber, which drives the socket itself (poll + redisBufferRead).
  [[nodiscard]] redisContext* context() const { return context_.get(); }

 private:
  Status Broken(std::string_view address) {
    broken_ = true;
    const char* why = context_->errstr[0] != '\0' ? context_->errstr : "connection error";
    return Status::Unavailable(fmt::format("redis at {}: {}", address, why), why);
  }

  ContextPtr context_;
  bool broken_ = false;
};

// A bounded pool of RedisConnections with reconnect backoff.
class RedisConnectionPool {
 public:
  explicit RedisConnectionPool(RedisOptions options) : options_(std::move(options)), cv_(&mu_) {}

  // A borrowed connection; goes back to the pool on destruction unless broken.
  class Borrowed {
   public:
    Borrowed(RedisConnectionPool* pool, std::unique_ptr<RedisConnection> connection)
        : pool_(pool), connection_(std::move(connection)) {}

    Borrowed(const Borrowed&) = delete;
    Borrowed& operator=(const Borrowed&) = delete;
    Borrowed(Borrowed&& other) noexcept = default;
    Borrowed& operator=(Borrowed&&) = delete;

    ~Borrowed() {
      if (connection_ != nullptr) {
        pool_->GiveBack(std::move(connection_));
      }
    }

    RedisConnection* operator->() const { return connection_.get(); }

    RedisConnection& get() const { return *connection_; }

   private:
    RedisConnectionPool* pool_;
    std::unique_ptr<RedisConnection> connection_;
  };

  // Returns an idle connection, or opens one (up to pool_size), or waits up to the command
  // timeout for one to come back. Returns kUnavailable while a reconnect backoff runs.
  Result<Borrowed> Borrow() LH_EXCLUDES(mu_) {
    const auto give_up = std::chrono::steady_clock::now() + options_.command_timeout;
    {
      MutexLock lock(&mu_);
      while (true) {
        if (!idle_.empty()) {
          std::unique_ptr<RedisConnection> connection = std::move(idle_.back());
          idle_.pop_back();
          return Borrowed(this, std::move(connection));
        }
        if (open_ < options_.pool_size) {
          if (std::chrono::steady_clock::now() < retry_after_) {
            return Status::Unavailable(
                fmt::format("{} (reconnecting with backoff)", last_error_.message()),
                std::string(last_error_.detail()));
          }
          ++open_;
          break;
        }
        if (!cv_.WaitUntil(give_up, std::stop_token(), [&]() LH_REQUIRES(mu_) {
              return !idle_.empty() || open_ < options_.pool_size;
            })) {
          return Status::Unavailable(fmt::format(
              "all {} connections to redis at {} stayed busy for {}", options_.pool_size,
              options_.Address(), FormatDuration(options_.command_timeout)));
        }
      }
    }
    Result<std::unique_ptr<RedisConnection>> connection = Connect();
    if (!connection.ok()) {
      MutexLock lock(&mu_);
      --open_;
      cv_.NotifyAll();
      return connection.status();
    }
    return Borrowed(this, std::move(connection).value());
  }

  // Opens a connection outside the pool's count (the subscriber's), with the same backoff.
  Result<std::unique_ptr<RedisConnection>> Connect() LH_EXCLUDES(mu_) {
    Result<std::unique_ptr<RedisConnection>> connection = RedisConnection::Connect(options_);
    MutexLock lock(&mu_);
    if (connection.ok()) {
      connects_.fetch_add(1, std::memory_order_relaxed);
      backoff_ = Duration::zero();
      retry_after_ = {};
    } else if (connection.status().code() == StatusCode::kUnavailable) {
      backoff_ = backoff_ == Duration::zero() ? kReconnectBackoffBase
                                              : std::min(backoff_ * 2, kReconnectBackoffCap);
      retry_after_ = std::chrono::steady_clock::now() + Jitter(backoff_);
      last_error_ = connection.status();
    }
    return connection;
  }

  [[nodiscard]] const RedisOptions& options() const { return options_; }

  std::atomic<std::uint64_t> round_trips_{0};
  std::atomic<std::uint64_t> connects_{0};
  std::atomic<std::uint64_t> script_loads_{0};
  // SHA1 of each script, as SCRIPT LOAD returned it at open. Immutable after Open().
  std::vector<std::string> shas_;

 private:
  void GiveBack(std::unique_ptr<RedisConnection> connection) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (connection->broken()) {
      --open_;  // dropped: a stream with replies possibly in flight cannot be reused
    } else {
      idle_.push_back(std::move(connection));
    }
    cv_.NotifyAll();
  }

  const RedisOptions options_;
  Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<RedisConnection>> idle_ LH_GUARDED_BY(mu_);
  int open_ LH_GUARDED_BY(mu_) = 0;
  Duration backoff_ LH_GUARDED_BY(mu_) = Duration::zero();
  std::chrono::steady_clock::time_point retry_after_ LH_GUARDED_BY(mu_);
  Status last_error_ LH_GUARDED_BY(mu_);
};

namespace {

// Loads every script on `connection` and returns their SHA1s.
Result<std::vector<std::string>> LoadScripts(RedisConnectionPool& pool,
                                             RedisConnection& connection) {
  std::vector<Command> loads;
  for (const Script& script : kScripts) {
    loads.push_back({"SCRIPT", "LOAD", std::string(script.body)});
  }
  pool.script_loads_.fetch_add(1, std::memory_order_relaxed);
  pool.round_trips_.fetch_add(1, std::memory_order_relaxed);
  LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
                      connection.Pipeline(loads, pool.options().Address()));
  std::vector<std::string> shas;
  for (std::size_t i = 0; i < replies.size(); ++i) {
    if (IsError(replies[i].get())) {
      return ErrorReplyStatus(pool.options().Address(),
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

// What one batch of script calls produced.
struct ScriptReplies {
  std::vector<ReplyPtr> replies;
  // Replicas that acknowledged (WAIT's reply), when the options ask for WAIT.
  long long replicas = 0;
};

// Runs `calls` (EVALSHA commands) in one round trip, followed by WAIT when `wait_replicas`.
// Calls that got NOSCRIPT are rerun once after reloading the scripts: NOSCRIPT means they did
// not run, so rerunning them cannot apply anything twice.
Result<ScriptReplies> RunScripts(RedisConnectionPool& pool, std::vector<Command> calls,
                                 bool wait_replicas) {
  const RedisOptions& options = pool.options();
  LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, pool.Borrow());
  Command wait = {"WAIT", std::to_string(options.min_replicas),
                  std::to_string(CeilMillis(options.replica_timeout))};
  const bool waiting = wait_replicas && options.min_replicas > 0;
  if (waiting) {
    calls.push_back(wait);
  }
  pool.round_trips_.fetch_add(1, std::memory_order_relaxed);
  LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
                      connection->Pipeline(calls, options.Address()));

  std::vector<std::size_t> rerun;
  for (std::size_t i = 0; i < replies.size(); ++i) {
    if (IsNoScript(replies[i].get())) {
      rerun.push_back(i);
    }
  }
  if (!rerun.empty()) {
    LH_RETURN_IF_ERROR(LoadScripts(pool, connection.get()).status());
    std::vector<Command> again;
    for (std::size_t i : rerun) {
      again.push_back(calls[i]);
    }
    if (waiting) {
      again.push_back(wait);
    }
    pool.round_trips_.fetch_add(1, std::memory_order_relaxed);
    LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> second,
                        connection->Pipeline(again, options.Address()));
    for (std::size_t j = 0; j < rerun.size(); ++j) {
      replies[rerun[j]] = std::move(second[j]);
    }
    if (waiting) {
      replies.back() = std::move(second.back());
    }
  }
  ScriptReplies out;
  if (waiting) {
    ReplyPtr wait_reply = std::move(replies.back());
    replies.pop_back();
    if (IsError(wait_reply.get())) {
      return ErrorReplyStatus(options.Address(), "WAIT", ReplyText(wait_reply.get()));
    }
    LH_ASSIGN_OR_RETURN(out.replicas, ParseInteger(wait_reply.get()));
  }
  out.replies = std::move(replies);
  return out;
}

}  // namespace

// The one subscriber connection of a backend: a std::jthread that owns a hiredis context in
// subscribe mode, multiplexing every channel some waiter waits on. Waiters register a channel,
// wait for the SUBSCRIBE to be confirmed, and then for a message on it. If the connection
// breaks, every waiter is woken (a spurious wake-up: it retries and waits again) and the thread
// reconnects with backoff and resubscribes.
class RedisSubscriber {
 public:
  explicit RedisSubscriber(std::shared_ptr<RedisConnectionPool> pool)
      : pool_(std::move(pool)), cv_(&mu_), wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
  }

  RedisSubscriber(const RedisSubscriber&) = delete;
  RedisSubscriber& operator=(const RedisSubscriber&) = delete;
  RedisSubscriber(RedisSubscriber&&) = delete;
  RedisSubscriber& operator=(RedisSubscriber&&) = delete;

  ~RedisSubscriber() {
    thread_.request_stop();
    Wake();
    thread_.join();
    if (wake_fd_ >= 0) {
      close(wake_fd_);
    }
  }

  // A registration of one waiter on one channel.
  struct Watch {
    std::string channel;
    std::uint64_t generation = 0;
    std::uint64_t seen = 0;
  };

  // Registers interest in `channel`. Returns at once; see AwaitSubscribed.
  Watch Register(const std::string& channel) LH_EXCLUDES(mu_) {
    Watch watch{.channel = channel};
    {
      MutexLock lock(&mu_);
      Channel& state = channels_[channel];
      if (state.generation == 0) {
        state.generation = ++next_generation_;
      }
      ++state.waiters;
      watch.generation = state.generation;
      watch.seen = state.events;
    }
    Wake();
    return watch;
  }

  // Blocks until the channel's SUBSCRIBE is confirmed (true), or `until` or `stop` (false).
  bool AwaitSubscribed(const Watch& watch, SteadyTime until, std::stop_token stop)
      LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return cv_.WaitUntil(ToSteady(until), std::move(stop), [&]() LH_REQUIRES(mu_) {
      auto it = channels_.find(watch.channel);
      return it != channels_.end() && (it->second.confirmed || it->second.events != watch.seen);
    });
  }

  // Blocks until a message (or a reconnect) on the channel since Register, `until` or `stop`.
  // Returns true if woken by an event.
  bool AwaitEvent(const Watch& watch, SteadyTime until, std::stop_token stop) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return cv_.WaitUntil(ToSteady(until), std::move(stop), [&]() LH_REQUIRES(mu_) {
      auto it = channels_.find(watch.channel);
      return it != channels_.end() && it->second.events != watch.seen;
    });
  }

  void Unregister(const Watch& watch) LH_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      auto it = channels_.find(watch.channel);
      if (it != channels_.end()) {
        if (--it->second.waiters == 0) {
          it->second.idle_since = std::chrono::steady_clock::now();
        }
      }
    }
    Wake();
  }

 private:
  struct Channel {
    int waiters = 0;
    // Identifies this registration of the channel, so that the reply to an earlier
    // SUBSCRIBE (before an UNSUBSCRIBE) does not confirm a later one.
    std::uint64_t generation = 0;
    bool sent = false;
    bool confirmed = false;
    // Messages received plus reconnects: waiters wake when it changes.
    std::uint64_t events = 0;
    // When the last waiter left; the subscription lingers for kSubscriptionLinger after that.
    std::chrono::steady_clock::time_point idle_since;
  };

  struct Sent {
    bool subscribe;
    std::string channel;
    std::uint64_t generation;
  };

  void Wake() {
    std::uint64_t one = 1;
    if (wake_fd_ >= 0) {
      (void)!write(wake_fd_, &one, sizeof(one));
    }
  }

  void DrainWake() {
    std::uint64_t value = 0;
    (void)!read(wake_fd_, &value, sizeof(value));
  }

  // Wakes every waiter and forgets subscriptions: the connection is gone.
  void Disconnected() LH_EXCLUDES(mu_) {
    connection_.reset();
    in_flight_.clear();
    MutexLock lock(&mu_);
    for (auto& [name, state] : channels_) {
      state.sent = false;
      state.confirmed = false;
      ++state.events;
    }
    cv_.NotifyAll();
  }

  // Opens the subscriber's own connection (AUTH, SELECT, PING as for commands). Pub/sub
  // channels are server-wide, so the database does not matter.
  bool ConnectContext() {
    Result<std::unique_ptr<RedisConnection>> connection = pool_->Connect();
    if (!connection.ok()) {
      return false;
    }
    connection_ = std::move(connection).value();
    return true;
  }

  // Sends SUBSCRIBE/UNSUBSCRIBE for every channel whose wanted state changed.
  bool SendChanges() LH_EXCLUDES(mu_) {
    std::vector<Sent> to_send;
    {
      MutexLock lock(&mu_);
      for (auto it = channels_.begin(); it != channels_.end();) {
        Channel& state = it->second;
        if (state.waiters > 0 && !state.sent) {
          state.sent = true;
          to_send.push_back({true, it->first, state.generation});
          ++it;
        } else if (state.waiters == 0 &&
                   std::chrono::steady_clock::now() - state.idle_since >= kSubscriptionLinger) {
          if (state.sent) {
            to_send.push_back({false, it->first, state.generation});
          }
          it = channels_.erase(it);
        } else {
          ++it;
        }
      }
    }
    SigpipeGuard no_sigpipe;
    for (const Sent& sent : to_send) {
      const char* argv[] = {sent.subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE", sent.channel.c_str()};
      std::size_t argvlen[] = {std::strlen(argv[0]), sent.channel.size()};
      if (redisAppendCommandArgv(connection_->context(), 2, argv, argvlen) != REDIS_OK) {
        return false;
      }
      in_flight_.push_back(sent);
    }
    int done = 0;
    while (done == 0) {
      if (redisBufferWrite(connection_->context(), &done) != REDIS_OK) {
        return false;
      }
    }
    return true;
  }

  // Handles one pub/sub reply: ["subscribe"|"unsubscribe", channel, n] or
  // ["message", channel, payload].
  void Handle(const redisReply* reply) LH_EXCLUDES(mu_) {
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3) {
      return;
    }
    std::string_view kind = ReplyText(reply->element[0]);
    std::string channel(ReplyText(reply->element[1]));
    MutexLock lock(&mu_);
    if (kind == "message") {
      if (auto it = channels_.find(channel); it != channels_.end()) {
        ++it->second.events;
        cv_.NotifyAll();
      }
    } else if (kind == "subscribe" || kind == "unsubscribe") {
      if (in_flight_.empty()) {
        return;
      }
      Sent sent = std::move(in_flight_.front());
      in_flight_.pop_front();
      auto it = channels_.find(sent.channel);
      if (sent.subscribe && it != channels_.end() && it->second.generation == sent.generation) {
        it->second.confirmed = true;
        cv_.NotifyAll();
      }
    }
  }

  void Run(std::stop_token stop) {
    Duration backoff = kReconnectBackoffBase;
    while (!stop.stop_requested()) {
      if (connection_ == nullptr) {
        if (!ConnectContext()) {
          pollfd wake{wake_fd_, POLLIN, 0};
          (void)poll(&wake, 1, static_cast<int>(CeilMillis(Jitter(backoff) + milliseconds(1))));
          DrainWake();
          backoff = std::min(backoff * 2, kReconnectBackoffCap);
          continue;
        }
        backoff = kReconnectBackoffBase;
      }
      if (!SendChanges()) {
        Disconnected();
        continue;
      }
      pollfd fds[2] = {{connection_->context()->fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      int n = poll(fds, 2, kSubscriberPollMs);
      if (n < 0) {
        continue;  // EINTR
      }
      if ((fds[1].revents & POLLIN) != 0) {
        DrainWake();
      }
      if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        if (redisBufferRead(connection_->context()) != REDIS_OK) {
          Disconnected();
          continue;
        }
        bool ok = true;
        while (true) {
          void* raw = nullptr;
          if (redisGetReplyFromReader(connection_->context(), &raw) != REDIS_OK) {
            ok = false;
            break;
          }
          if (raw == nullptr) {
            break;
          }
          ReplyPtr reply(static_cast<redisReply*>(raw));
          Handle(reply.get());
        }
        if (!ok) {
          Disconnected();
        }
      }
    }
  }

  const std::shared_ptr<RedisConnectionPool> pool_;
  Mutex mu_;
  CondVar cv_;
  std::map<std::string, Channel> channels_ LH_GUARDED_BY(mu_);
  std::uint64_t next_generation_ LH_GUARDED_BY(mu_) = 0;
  const int wake_fd_;
  // Owned by the subscriber thread only.
  std::unique_ptr<RedisConnection> connection_;
  std::deque<Sent> in_flight_;
  std::jthread thread_;
};

RedisBackend::RedisBackend(RedisOptions options, std::shared_ptr<RedisConnectionPool> pool,
                           bool persistence_off)
    : options_(std::move(options)), pool_(std::move(pool)), persistence_off_(persistence_off) {}

RedisBackend::~RedisBackend() = default;

Result<std::shared_ptr<Backend>> OpenRedisBackend(const Url& url, Clock& clock) {
  (void)clock;  // TODO(#16): joined by the store's rewrite
  LH_ASSIGN_OR_RETURN(RedisOptions options, RedisOptions::FromUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<RedisBackend> backend, RedisBackend::Open(options));
  return std::shared_ptr<Backend>(std::move(backend));
}

Result<std::shared_ptr<RedisBackend>> RedisBackend::Open(RedisOptions options) {
  auto pool = std::make_shared<RedisConnectionPool>(options);
  bool persistence_off = false;
  {
    LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, pool->Borrow());
    LH_ASSIGN_OR_RETURN(pool->shas_, LoadScripts(*pool, connection.get()));
    // Persistence check. CONFIG is often denied to application users: then say nothing more
    // than a debug line, since the server may well persist.
    std::vector<Command> config = {{"CONFIG", "GET", "appendonly"}, {"CONFIG", "GET", "save"}};
    pool->round_trips_.fetch_add(1, std::memory_order_relaxed);
    LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
                        connection->Pipeline(config, options.Address()));
    auto value = [](const redisReply* r) -> std::optional<std::string> {
      if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
        return std::nullopt;
      }
      return std::string(ReplyText(r->element[1]));
    };
    std::optional<std::string> aof = value(replies[0].get());
    std::optional<std::string> save = value(replies[1].get());
    if (aof && save) {
      persistence_off = *aof == "no" && save->empty();
    } else {
      Log(LogLevel::kDebug,
          fmt::format("redis at {}: cannot check persistence with CONFIG GET ({}); assuming on",
                      options.Address(),
                      IsError(replies[0].get()) ? ReplyText(replies[0].get()) : "no answer"));
    }
  }
  if (persistence_off) {
    WarnPersistenceOffOnce(fmt::format("{}/{}", options.Address(), options.db));
  }
  return std::shared_ptr<RedisBackend>(
      new RedisBackend(std::move(options), std::move(pool), persistence_off));
}

Capabilities RedisBackend::capabilities() const {
  return Capabilities{.multi_process = true,
                      .native_wait = true,
                      .fencing_survives_restart = !persistence_off_,
                      .fair_queue = options_.fair};
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

Result<Grant> RedisBackend::TryAcquire(const GrantRequest& request) {
  const long long ttl_ms = CeilMillis(request.ttl);
  const std::string lease_key = LeaseKeyName(options_.prefix, request.key);
  std::vector<Command> call;
  if (options_.fair) {
    call.push_back({"EVALSHA", pool_->shas_[kFairAcquire], "5", lease_key,
                    FenceKeyName(options_.prefix, request.key),
                    QueueKeyName(options_.prefix, request.key),
                    QueueExpiryKeyName(options_.prefix, request.key),
                    QueueSeqKeyName(options_.prefix, request.key), request.owner_token,
                    request.holder, std::to_string(ttl_ms), request.waiter_id,
                    std::to_string(CeilMillis(FairEntryLifetime(options_, request.ttl)))});
  } else {
    call.push_back({"EVALSHA", pool_->shas_[kAcquire], "2", lease_key,
                    FenceKeyName(options_.prefix, request.key), request.owner_token, request.holder,
                    std::to_string(ttl_ms)});
  }
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*pool_, std::move(call), true));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("acquiring {}", request.key),
                             options_.fair ? kFairAcquireScript : kAcquireScript, ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 2) {
    return Status::Internal("unexpected reply from redis to the acquire script");
  }
  LH_ASSIGN_OR_RETURN(long long granted, ParseInteger(reply->element[0]));
  if (granted == 0) {
    return HeldReply(request.key, reply);
  }
  LH_ASSIGN_OR_RETURN(long long fence, ParseInteger(reply->element[1]));
  if (options_.min_replicas > 0 && out.replicas < options_.min_replicas) {
    // A failover to a replica that never saw this grant would forget it: undo it. If the undo
    // itself fails, the grant simply expires after its TTL.
    std::vector<Command> undo = {{"EVALSHA", pool_->shas_[kRelease], "1", lease_key,
                                  request.owner_token, ChannelName(options_.prefix, request.key)}};
    (void)RunScripts(*pool_, std::move(undo), false);
    return Status::Unavailable(fmt::format(
        "acquiring {}: only {} of {} replicas confirmed the grant within {}; undone", request.key,
        out.replicas, options_.min_replicas, FormatDuration(options_.replica_timeout)));
  }
  return Grant{.fencing_token = static_cast<FencingToken>(fence), .ttl = milliseconds(ttl_ms)};
}

Status RedisBackend::Renew(const RenewRequest& request) {
  std::vector<Status> results = RenewMany(std::span<const RenewRequest>(&request, 1));
  return std::move(results[0]);
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
  Result<ScriptReplies> out = RunScripts(*pool_, std::move(calls), true);
  if (!out.ok()) {
    results.assign(requests.size(), out.status());
    return results;
  }
  const bool replicas_short = options_.min_replicas > 0 && out->replicas < options_.min_replicas;
  results.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const redisReply* reply = out->replies[i].get();
    if (IsError(reply)) {
      results.push_back(ScriptErrorStatus(options_.Address(),
                                          fmt::format("renewing {}", requests[i].key), kRenewScript,
                                          ReplyText(reply)));
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
          "renewing {}: only {} of {} replicas confirmed within {}", requests[i].key, out->replicas,
          options_.min_replicas, FormatDuration(options_.replica_timeout))));
    } else {
      results.emplace_back();
    }
  }
  return results;
}

Status RedisBackend::Release(std::string_view key, std::string_view owner_token) {
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kRelease], "1",
                                LeaseKeyName(options_.prefix, key), std::string(owner_token),
                                ChannelName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*pool_, std::move(call), false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("releasing {}", key), kReleaseScript,
                             ReplyText(reply));
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
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*pool_, std::move(call), wait_replicas));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("finishing {}", request.key),
                             kFinishScript, ReplyText(reply));
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

Result<std::optional<std::string>> RedisBackend::ReadRecord(std::string_view key) {
  // A plain GET is one atomic read; the server drops the record at its PX expiry.
  std::vector<Command> get = {{"GET", RecordKeyName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, pool_->Borrow());
  pool_->round_trips_.fetch_add(1, std::memory_order_relaxed);
  LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
                      connection->Pipeline(get, options_.Address()));
  const redisReply* reply = replies[0].get();
  if (IsError(reply)) {
    return ErrorReplyStatus(options_.Address(), "GET", ReplyText(reply));
  }
  if (reply->type == REDIS_REPLY_NIL) {
    return std::optional<std::string>();
  }
  if (reply->type != REDIS_REPLY_STRING) {
    return Status::Internal(fmt::format("unexpected reply from redis to GET of the record of {}",
                                        key));
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
  std::string cursor = "0";
  LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, pool_->Borrow());
  do {
    std::vector<Command> scan = {
        {"SCAN", cursor, "MATCH", pattern, "COUNT", std::string(kScanCount)}};
    pool_->round_trips_.fetch_add(1, std::memory_order_relaxed);
    LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> scanned,
                        connection->Pipeline(scan, options_.Address()));
    const redisReply* page = scanned[0].get();
    if (IsError(page)) {
      return ErrorReplyStatus(options_.Address(), "SCAN", ReplyText(page));
    }
    if (page->type != REDIS_REPLY_ARRAY || page->elements != 2 ||
        page->element[1]->type != REDIS_REPLY_ARRAY) {
      return Status::Internal("unexpected reply from redis to SCAN");
    }
    cursor = std::string(ReplyText(page->element[0]));
    std::vector<std::string> keys;
    std::vector<Command> reads;
    for (std::size_t i = 0; i < page->element[1]->elements; ++i) {
      std::string_view redis_key = ReplyText(page->element[1]->element[i]);
      if (!redis_key.starts_with(head) || !redis_key.ends_with(kTail)) {
        continue;
      }
      std::optional<std::string> key =
          HexDecode(redis_key.substr(head.size(), redis_key.size() - head.size() - kTail.size()));
      if (!key) {
        continue;  // not one of ours
      }
      keys.push_back(std::move(*key));
      reads.push_back({"GET", std::string(redis_key)});
    }
    if (reads.empty()) {
      continue;
    }
    pool_->round_trips_.fetch_add(1, std::memory_order_relaxed);
    LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> values,
                        connection->Pipeline(reads, options_.Address()));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const redisReply* reply = values[i].get();
      if (IsError(reply)) {
        return ErrorReplyStatus(options_.Address(), "GET", ReplyText(reply));
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
  std::vector<Command> time = {{"TIME"}};
  LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, pool_->Borrow());
  pool_->round_trips_.fetch_add(1, std::memory_order_relaxed);
  LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
                      connection->Pipeline(time, options_.Address()));
  const redisReply* reply = replies[0].get();
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

Result<std::optional<LeaseInfo>> RedisBackend::Inspect(std::string_view key) {
  std::vector<Command> call = {
      {"EVALSHA", pool_->shas_[kInspect], "1", LeaseKeyName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*pool_, std::move(call), false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("inspecting {}", key), kInspectScript,
                             ReplyText(reply));
  }
  if (reply->type == REDIS_REPLY_NIL) {
    return std::optional<LeaseInfo>();
  }
  LH_ASSIGN_OR_RETURN(LeaseInfo info, ParseLeaseInfo(std::string(key), reply, 0));
  return std::optional<LeaseInfo>(std::move(info));
}

Result<std::vector<LeaseInfo>> RedisBackend::List(std::string_view prefix) {
  // Grant keys are "<prefix>:{<hex>}"; hex(prefix) is a prefix of hex(key) exactly when prefix
  // is a prefix of key, and hex digits are never glob metacharacters. The trailing "}" keeps
  // the fence counters (":fence"), records (":record") and queues out of the match.
  const std::string head = options_.prefix + ":{";
  const std::string pattern = GlobEscape(head) + HexEncode(prefix) + "*}";
  std::vector<LeaseInfo> leases;
  std::string cursor = "0";
  do {
    std::vector<Command> scan = {
        {"SCAN", cursor, "MATCH", pattern, "COUNT", std::string(kScanCount)}};
    std::vector<std::string> found;
    {
      LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, pool_->Borrow());
      pool_->round_trips_.fetch_add(1, std::memory_order_relaxed);
      LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
                          connection->Pipeline(scan, options_.Address()));
      const redisReply* reply = replies[0].get();
      if (IsError(reply)) {
        return ErrorReplyStatus(options_.Address(), "SCAN", ReplyText(reply));
      }
      if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
          reply->element[1]->type != REDIS_REPLY_ARRAY) {
        return Status::Internal("unexpected reply from redis to SCAN");
      }
      cursor = std::string(ReplyText(reply->element[0]));
      for (std::size_t i = 0; i < reply->element[1]->elements; ++i) {
        found.emplace_back(ReplyText(reply->element[1]->element[i]));
      }
    }
    std::vector<std::string> keys;
    std::vector<Command> reads;
    for (const std::string& redis_key : found) {
      std::string_view hex = redis_key;
      if (!hex.starts_with(head) || !hex.ends_with("}")) {
        continue;
      }
      hex = hex.substr(head.size(), hex.size() - head.size() - 1);
      std::optional<std::string> key = HexDecode(hex);
      if (!key) {
        continue;  // not one of ours
      }
      keys.push_back(std::move(*key));
      reads.push_back({"EVALSHA", pool_->shas_[kInspect], "1", redis_key});
    }
    if (reads.empty()) {
      continue;
    }
    LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*pool_, std::move(reads), false));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const redisReply* reply = out.replies[i].get();
      if (IsError(reply)) {
        return ScriptErrorStatus(options_.Address(), fmt::format("inspecting {}", keys[i]),
                                 kInspectScript, ReplyText(reply));
      }
      if (reply->type == REDIS_REPLY_NIL) {
        continue;  // expired or released since SCAN saw it
      }
      LH_ASSIGN_OR_RETURN(LeaseInfo info, ParseLeaseInfo(std::move(keys[i]), reply, 0));
      leases.push_back(std::move(info));
    }
  } while (cursor != "0");
  std::sort(leases.begin(), leases.end(),
            [](const LeaseInfo& a, const LeaseInfo& b) { return a.key < b.key; });
  // SCAN may return a key more than once.
  leases.erase(std::unique(leases.begin(), leases.end(),
                           [](const LeaseInfo& a, const LeaseInfo& b) { return a.key == b.key; }),
               leases.end());
  return leases;
}

Result<bool> RedisBackend::ForceRelease(std::string_view key) {
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kForceRelease], "1",
                                LeaseKeyName(options_.prefix, key),
                                ChannelName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*pool_, std::move(call), false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("force-releasing {}", key),
                             kForceReleaseScript, ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long deleted, ParseInteger(reply));
  return deleted == 1;
}

void RedisBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  if (!options_.fair || waiter_id.empty()) {
    return;
  }
  std::vector<Command> call = {
      {"EVALSHA", pool_->shas_[kAbandonWait], "4", LeaseKeyName(options_.prefix, key),
       QueueKeyName(options_.prefix, key), QueueExpiryKeyName(options_.prefix, key),
       QueueSeqKeyName(options_.prefix, key), std::string(waiter_id),
       ChannelName(options_.prefix, key)}};
  Result<ScriptReplies> out = RunScripts(*pool_, std::move(call), false);
  // Best effort: if this fails, the entry expires by itself within its lifetime.
  if (!out.ok()) {
    Log(LogLevel::kDebug,
        fmt::format("leaving the wait queue of {}: {}", key, out.status().ToString()));
  } else if (IsError(out->replies[0].get())) {
    Log(LogLevel::kDebug,
        fmt::format("leaving the wait queue of {}: {}", key,
                    ScriptErrorStatus(options_.Address(), "abandon-wait", kAbandonWaitScript,
                                      ReplyText(out->replies[0].get()))
                        .ToString()));
  }
}

// How long a waiter on `key` may sleep before it re-checks, read after SUBSCRIBE: nullopt if the
// key is free (with fair, and nobody queued), so retry at once.
Result<std::optional<Duration>> RedisBackend::TimeToRecheck(std::string_view key,
                                                            std::string_view waiter_id) {
  if (!options_.fair) {
    LH_ASSIGN_OR_RETURN(std::optional<LeaseInfo> info, Inspect(key));
    if (!info) {
      return std::optional<Duration>();
    }
    // If the release message is missed, the grant still ends by itself: wake then, spread out
    // a little so that many waiters do not retry in the same instant.
    Duration remaining = info->remaining;
    return std::optional<Duration>(
        remaining + Jitter(std::min(remaining / 10 + milliseconds(1), kMaxExpiryJitter)));
  }
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kQueueState], "3",
                                LeaseKeyName(options_.prefix, key),
                                QueueKeyName(options_.prefix, key),
                                QueueExpiryKeyName(options_.prefix, key), std::string(waiter_id)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*pool_, std::move(call), false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("reading the queue of {}", key),
                             kQueueStateScript, ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3) {
    return Status::Internal("unexpected reply from redis to the queue-state script");
  }
  LH_ASSIGN_OR_RETURN(long long pttl, ParseInteger(reply->element[0]));
  LH_ASSIGN_OR_RETURN(long long head_left, ParseInteger(reply->element[1]));
  LH_ASSIGN_OR_RETURN(long long is_head, ParseInteger(reply->element[2]));
  if (pttl >= 0) {
    // Held: as without fair, the release message or the grant's expiry.
    const Duration remaining = milliseconds(pttl);
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
      subscriber_ = std::make_shared<RedisSubscriber>(pool_);
    }
    subscriber = subscriber_;
  }
  RedisSubscriber::Watch watch = subscriber->Register(ChannelName(options_.prefix, key));
  const bool subscribed = subscriber->AwaitSubscribed(
      watch, std::min(deadline, NowBoot() + options_.command_timeout), stop);

  // Read the grant's remaining time (and the queue, with fair) only now, after SUBSCRIBE: a
  // release between the caller's TryAcquire and the subscription is seen here instead of being
  // missed.
  Result<std::optional<Duration>> sleep = Status::Cancelled("wait cancelled");
  if (!stop.stop_requested()) {
    sleep = TimeToRecheck(key, waiter_id);
  }
  const SteadyTime now = NowBoot();
  if (sleep.ok() && !sleep->has_value()) {
    subscriber->Unregister(watch);
    return Status();  // already free
  }
  Duration sleep_for = sleep.ok() ? **sleep : kFallbackPoll + Jitter(kFallbackPoll);
  if (!subscribed) {
    sleep_for = std::min<Duration>(sleep_for, kFallbackPoll + Jitter(kFallbackPoll));
  }
  const SteadyTime wake_at = std::min(deadline, now + sleep_for);
  subscriber->AwaitEvent(watch, wake_at, stop);
  subscriber->Unregister(watch);
  if (stop.stop_requested()) {
    return Status::Cancelled("wait cancelled");
  }
  if (NowBoot() >= deadline) {
    return Status::DeadlineExceeded("wait ran out");
  }
  return Status();
}

RedisBackend::Stats RedisBackend::stats() const {
  return Stats{.round_trips = pool_->round_trips_.load(std::memory_order_relaxed),
               .connects = pool_->connects_.load(std::memory_order_relaxed),
               .script_loads = pool_->script_loads_.load(std::memory_order_relaxed)};
}

}  // namespace leasehold::internal
