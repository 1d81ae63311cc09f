// File: backends/redis/redis_connection.cc (internal)
//
// RedisConnection and RedisConnectionPool over hiredis 0.14 (synchronous API).

#include "backends/redis/redis_connection.h"

#include <charconv>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sys/time.h>

#include "core/duration.h"
#include "util/sigpipe_guard.h"

namespace leasehold::internal {

namespace {

timeval ToTimeval(Duration d) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

}  // namespace

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

// The reply text never holds a password (Redis does not echo AUTH arguments), so it goes into
// the message and the detail as is; ACL refusals name the command ("NOPERM ... 'evalsha'
// command"), which is what an operator needs to fix them.
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

// ---------------------------------------------------------------------------------------------
// RedisConnection

Result<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const RedisOptions& options) {
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
  // AUTH, SELECT and PING are part of establishing the connection: connect_timeout bounds each
  // read of their replies too (SO_RCVTIMEO), so that a server that accepts but does not answer
  // (SIGSTOPped: the kernel still completes the TCP handshake) is "unreachable" after the TCP
  // connect plus one connect_timeout (at most about twice connect_timeout in all).
  if (redisSetTimeout(context.get(), ToTimeval(options.connect_timeout)) != REDIS_OK) {
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
  Result<std::vector<ReplyPtr>> answered = connection->Pipeline(hello, options.Address());
  if (!answered.ok()) {
    std::string names;
    for (const Command& command : hello) {
      names += names.empty() ? command[0] : "/" + command[0];
    }
    return Status::Unavailable(
        fmt::format("redis at {} took the connection but its first round trip ({}) did not "
                    "succeed (each read bounded by connect_timeout, {}): {}",
                    options.Address(), names, FormatDuration(options.connect_timeout),
                    answered.status().detail()),
        std::string(answered.status().detail()));
  }
  std::vector<ReplyPtr> replies = std::move(answered).value();
  for (std::size_t i = 0; i < replies.size(); ++i) {
    if (IsError(replies[i].get())) {
      // Name the command, never its arguments (AUTH's are credentials).
      return ErrorReplyStatus(options.Address(), hello[i][0], ReplyText(replies[i].get()));
    }
  }
  // A WAIT may legitimately take replica_timeout on top of the command's own time.
  Duration io_timeout = options.command_timeout;
  if (options.min_replicas > 0) {
    io_timeout += options.replica_timeout;
  }
  if (redisSetTimeout(connection->context(), ToTimeval(io_timeout)) != REDIS_OK) {
    return Status::Unavailable(
        fmt::format("cannot set timeouts on redis connection to {}", options.Address()));
  }
  return connection;
}

Result<std::vector<ReplyPtr>> RedisConnection::Pipeline(std::span<const Command> commands,
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

Status RedisConnection::Broken(std::string_view address) {
  broken_ = true;
  const char* why = context_->errstr[0] != '\0' ? context_->errstr : "connection error";
  return Status::Unavailable(fmt::format("redis at {}: {}", address, why), why);
}

// ---------------------------------------------------------------------------------------------
// RedisConnectionPool

RedisConnectionPool::RedisConnectionPool(RedisOptions options, Clock& clock)
    : options_(std::move(options)),
      clock_(clock),
      cv_(&mu_),
      backoff_(clock, kRedisReconnectBackoffBase, kRedisReconnectBackoffCap) {}

Result<RedisConnectionPool::Borrowed> RedisConnectionPool::Borrow() {
  const SteadyTime give_up = clock_.Now() + options_.command_timeout;
  {
    MutexLock lock(&mu_);
    while (true) {
      if (!idle_.empty()) {
        std::unique_ptr<RedisConnection> connection = std::move(idle_.back());
        idle_.pop_back();
        return Borrowed(this, std::move(connection));
      }
      if (open_ < options_.pool_size) {
        if (!backoff_.Ready()) {
          return Status::Unavailable(
              fmt::format("{} (reconnecting with backoff)", last_error_.message()),
              std::string(last_error_.detail()));
        }
        ++open_;
        break;
      }
      if (!cv_.WaitUntil(ToSteady(give_up, clock_), std::stop_token(), [&]() LH_REQUIRES(mu_) {
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

Result<std::unique_ptr<RedisConnection>> RedisConnectionPool::Connect() {
  Result<std::unique_ptr<RedisConnection>> connection = RedisConnection::Connect(options_);
  MutexLock lock(&mu_);
  if (connection.ok()) {
    connects_.fetch_add(1, std::memory_order_relaxed);
    backoff_.Succeeded();
  } else if (connection.status().code() == StatusCode::kUnavailable) {
    // Only an unreachable server is paced: a refusal (wrong password, ACL) is reported at once,
    // every time.
    backoff_.Failed();
    last_error_ = connection.status();
  }
  return connection;
}

void RedisConnectionPool::GiveBack(std::unique_ptr<RedisConnection> connection) {
  MutexLock lock(&mu_);
  if (connection->broken()) {
    --open_;  // dropped: a stream with replies possibly in flight cannot be reused
  } else {
    idle_.push_back(std::move(connection));
  }
  cv_.NotifyAll();
}

}  // namespace leasehold::internal
