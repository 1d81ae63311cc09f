// File: backends/redis/redis_pool.cc (internal)
//
// RedisConnectionPool (redis_connection.h): the connections to one server, borrowed and given
// back, and with Sentinel the master found, followed and watched.

#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "backends/common/url_params.h"
#include "backends/redis/redis_connection.h"
#include "core/backoff.h"
#include "core/duration.h"
#include "util/sigpipe_guard.h"

namespace leasehold::internal {

RedisConnectionPool::RedisConnectionPool(RedisOptions options, Clock& clock,
                                         std::shared_ptr<const RedisTlsContext> tls)
    : options_(std::move(options)),
      clock_(clock),
      tls_(std::move(tls)),
      cv_(&mu_),
      backoff_(clock, kRedisReconnectBackoffBase, kRedisReconnectBackoffCap) {
  if (options_.sentinel()) {
    watcher_ = std::jthread([this](std::stop_token stop) { WatchSentinels(stop); });
  }
}

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
        return Status::Unavailable(
            fmt::format("all {} connections to redis at {} stayed busy for {}", options_.pool_size,
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
  Result<std::unique_ptr<RedisConnection>> connection = ConnectToMaster();
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

Result<std::unique_ptr<RedisConnection>> RedisConnectionPool::ConnectToMaster() {
  if (options_.cluster() && options_.port == 0) {
    // A cluster's seed pool (the subscriber's): the first node that answers.
    std::string unreachable;
    for (const auto& [host, port] : options_.cluster_nodes) {
      RedisOptions node = options_;
      node.host = host;
      node.port = port;
      Result<std::unique_ptr<RedisConnection>> connection =
          RedisConnection::Connect(node, tls_.get());
      if (connection.ok() || connection.status().code() != StatusCode::kUnavailable) {
        return connection;
      }
      unreachable +=
          fmt::format("{}{}", unreachable.empty() ? "" : "; ", connection.status().message());
    }
    return Status::Unavailable(
        fmt::format("no node of redis {} answers: {}", options_.Address(), unreachable));
  }
  if (!options_.sentinel()) {
    return RedisConnection::Connect(options_, tls_.get());
  }
  // Twice at most: a failover can move the master while a connect is under way.
  for (int attempt = 0;; ++attempt) {
    RedisOptions target = options_;
    std::uint64_t generation = 0;
    {
      MutexLock lock(&mu_);
      target.host = master_host_;
      target.port = master_port_;
      generation = generation_;
    }
    if (target.port == 0) {
      LH_ASSIGN_OR_RETURN(SentinelMaster master, AskSentinels());
      MutexLock lock(&mu_);
      if (generation_ == generation || master_port_ == 0) {
        master_host_ = master.host;
        master_port_ = master.port;
        master_epoch_ = master.epoch;
      }
      target.host = master_host_;
      target.port = master_port_;
      generation = generation_;
    }
    Result<std::unique_ptr<RedisConnection>> connection =
        RedisConnection::Connect(target, tls_.get());
    if (!connection.ok()) {
      if (connection.status().code() == StatusCode::kUnavailable) {
        // Down, or a replica now: ask the sentinels on the next connect, unless a newer
        // address came meanwhile (+switch-master), which stands.
        ForgetMaster(generation);
      }
      return connection.status();
    }
    {
      MutexLock lock(&mu_);
      if (generation_ == generation) {
        (*connection)->generation = generation;
        (*connection)->epoch = master_epoch_;
        return connection;
      }
    }
    if (attempt == 1) {
      return Status::Unavailable(
          fmt::format("redis master '{}' moved twice while connecting to it; retrying later",
                      options_.sentinel_master));
    }
    // The master moved while this connect was under way: this one goes to the old one.
  }
}

void RedisConnectionPool::ForgetMaster(std::uint64_t generation) {
  std::vector<std::unique_ptr<RedisConnection>> closing;
  MutexLock lock(&mu_);
  if (generation_ != generation) {
    return;
  }
  master_port_ = 0;
  ++generation_;
  open_ -= static_cast<int>(idle_.size());
  closing.swap(idle_);
  cv_.NotifyAll();
}

std::uint64_t RedisConnectionPool::generation() const {
  MutexLock lock(&mu_);
  return generation_;
}

// A sentinel is reached as a plain server would be (TLS alike), without AUTH or SELECT.
RedisOptions RedisConnectionPool::SentinelOptions(const std::string& host, int port) const {
  RedisOptions s;
  s.host = host;
  s.port = port;
  s.connect_timeout = options_.connect_timeout;
  s.command_timeout = options_.command_timeout;
  s.tls = options_.tls;
  s.tls_sni = options_.tls_sni;
  s.tls_insecure = options_.tls_insecure;
  return s;
}

Result<SentinelMaster> RedisConnectionPool::AskSentinels() const {
  std::string unreachable;
  std::string unknown;
  std::optional<SentinelMaster> best;
  std::size_t answered = 0;  // sentinels that named a master or knew none
  const std::size_t majority = options_.sentinels.size() / 2 + 1;
  for (const auto& [host, port] : options_.sentinels) {
    if (answered >= majority) {
      break;
    }
    const RedisOptions s = SentinelOptions(host, port);
    const std::string at = s.Address();
    auto failed = [&](std::string_view why) {
      unreachable += fmt::format("{}{}: {}", unreachable.empty() ? "" : "; ", at, why);
    };
    Result<std::unique_ptr<RedisConnection>> connection = RedisConnection::Connect(s, tls_.get());
    if (!connection.ok()) {
      failed(connection.status().message());
      continue;
    }
    const std::vector<Command> ask = {
        {"SENTINEL", "get-master-addr-by-name", options_.sentinel_master},
        {"SENTINEL", "MASTER", options_.sentinel_master}};
    Result<std::vector<ReplyPtr>> replies = (*connection)->Pipeline(ask, at);
    if (!replies.ok()) {
      failed(replies.status().message());
      continue;
    }
    const redisReply* address = (*replies)[0].get();
    if (IsError(address)) {
      failed(ReplyText(address));
      continue;
    }
    Result<std::optional<SentinelMaster>> master =
        ParseSentinelMaster(address, (*replies)[1].get());
    if (!master.ok()) {
      failed(master.status().message());
      continue;
    }
    ++answered;
    if (!master->has_value()) {
      unknown += (unknown.empty() ? "" : ", ") + at;
    } else if (!best || (*master)->epoch > best->epoch) {
      best = std::move(**master);
    }
  }
  if (best) {
    return std::move(*best);
  }
  if (unreachable.empty()) {
    return Status::InvalidArgument(fmt::format(
        "no sentinel knows a master named '{}' (asked {}): check MASTER_NAME in the URL "
        "(SENTINEL MASTERS lists the names a sentinel monitors)",
        options_.sentinel_master, unknown));
  }
  return Status::Unavailable(
      fmt::format("cannot learn the address of redis master '{}' from its sentinels: {}{}",
                  options_.sentinel_master, unreachable,
                  unknown.empty() ? "" : fmt::format(" (and {} know no such master)", unknown)));
}

Result<std::vector<SentinelReplica>> RedisConnectionPool::AskSentinelsForReplicas() const {
  std::string errors;
  for (const auto& [host, port] : options_.sentinels) {
    const RedisOptions s = SentinelOptions(host, port);
    const std::string at = s.Address();
    Result<std::unique_ptr<RedisConnection>> connection = RedisConnection::Connect(s, tls_.get());
    const std::vector<Command> ask = {{"SENTINEL", "REPLICAS", options_.sentinel_master}};
    Result<std::vector<ReplyPtr>> replies =
        connection.ok() ? (*connection)->Pipeline(ask, at)
                        : Result<std::vector<ReplyPtr>>(connection.status());
    Result<std::vector<SentinelReplica>> replicas =
        !replies.ok() ? Result<std::vector<SentinelReplica>>(replies.status())
        : IsError((*replies)[0].get())
            ? Status::Unavailable(std::string(ReplyText((*replies)[0].get())))
            : ParseSentinelReplicas((*replies)[0].get());
    if (replicas.ok()) {
      return replicas;
    }
    errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", at, replicas.status().message());
  }
  return Status::Unavailable(
      fmt::format("no sentinel listed the replicas of '{}': {}", options_.sentinel_master, errors));
}

void RedisConnectionPool::MasterMoved(std::optional<std::pair<std::string, int>> to) {
  std::vector<std::unique_ptr<RedisConnection>> closing;
  {
    MutexLock lock(&mu_);
    if (to && to->first == master_host_ && to->second == master_port_) {
      return;
    }
    if (to) {
      backoff_.Succeeded();  // the failures were the old master's: a new one is named
    }
    master_port_ = 0;
    ++generation_;
    open_ -= static_cast<int>(idle_.size());
    closing.swap(idle_);
    cv_.NotifyAll();
  }
  // `closing` closes its sockets here, outside the lock.
}

void RedisConnectionPool::WatchSentinels(std::stop_token stop) {
  Backoff backoff(kRedisReconnectBackoffBase, kRedisReconnectBackoffCap);
  std::size_t next = 0;
  constexpr int kPollMs = 200;
  while (!stop.stop_requested()) {
    const auto& [host, port] = options_.sentinels[next++ % options_.sentinels.size()];
    const RedisOptions s = SentinelOptions(host, port);
    const std::string at = s.Address();
    Result<std::unique_ptr<RedisConnection>> connection = RedisConnection::Connect(s, tls_.get());
    const std::vector<Command> subscribe = {{"SUBSCRIBE", "+switch-master"}};
    if (!connection.ok() || !(*connection)->Send(subscribe, at).ok()) {
      const auto wait = backoff.Next();
      for (auto slept = Duration::zero(); slept < wait && !stop.stop_requested();
           slept += std::chrono::milliseconds(kPollMs)) {
        std::this_thread::sleep_for(
            std::min<Duration>(wait - slept, std::chrono::milliseconds(kPollMs)));
      }
      continue;
    }
    backoff.Reset();
    // Until this sentinel's connection breaks or goes quiet: "<name> <old ip> <old port> <new
    // ip> <new port>" messages. The SUBSCRIBE must be confirmed, and a PING (allowed in
    // subscribed mode) answered, within command_timeout, or the next sentinel is tried: a
    // sentinel whose host died without a reset would otherwise leave this thread deaf.
    using SteadyNow = std::chrono::steady_clock;
    const auto started = SteadyNow::now();
    bool confirmed = false;
    bool ping_out = false;  // a PING sent at last_ping and not answered yet
    auto last_ping = SteadyNow::now();
    const std::vector<Command> ping = {{"PING"}};
    while (!stop.stop_requested()) {
      RedisConnection& c = **connection;
      const auto now = SteadyNow::now();
      if ((!confirmed && now - started > options_.command_timeout) ||
          (ping_out && now - last_ping > options_.command_timeout)) {
        break;
      }
      if (confirmed && !ping_out && now - last_ping > std::chrono::seconds(1)) {
        if (!c.Send(ping, at).ok()) {
          break;
        }
        ping_out = true;
        last_ping = now;
      }
      pollfd p{c.fd(), POLLIN, 0};
      const int n = c.HasBufferedInput() ? 1 : poll(&p, 1, kPollMs);
      if (n <= 0) {
        continue;
      }
      if (!c.ReadAvailable(at).ok()) {
        break;
      }
      bool ok = true;
      while (true) {
        Result<ReplyPtr> reply = c.NextReply(at);
        if (!reply.ok()) {
          ok = false;
          break;
        }
        if (*reply == nullptr) {
          break;
        }
        const redisReply* r = reply->get();
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 1) {
          continue;
        }
        const std::string_view kind = ReplyText(r->element[0]);
        if (kind == "subscribe") {
          confirmed = true;
        } else if (kind == "pong") {
          ping_out = false;
        }
        if (kind != "message" || r->elements < 3) {
          continue;
        }
        std::istringstream words{std::string(ReplyText(r->element[2]))};
        std::string name, old_host, old_port, new_host;
        int new_port = 0;
        if (words >> name >> old_host >> old_port >> new_host >> new_port &&
            name == options_.sentinel_master && new_port > 0) {
          switches_.fetch_add(1, std::memory_order_relaxed);
          MasterMoved(std::make_pair(new_host, new_port));
        }
      }
      if (!ok) {
        break;
      }
    }
    // The sentinel went away: a switch may have been missed meanwhile, so ask again.
    MasterMoved();
  }
}

void RedisConnectionPool::GiveBack(std::unique_ptr<RedisConnection> connection) {
  std::vector<std::unique_ptr<RedisConnection>> closing;
  {
    MutexLock lock(&mu_);
    if (!connection->broken() && connection->generation == generation_) {
      idle_.push_back(std::move(connection));
    } else {
      // Dropped: a stream with replies possibly in flight cannot be reused, and one to an old
      // master must not be.
      --open_;
      if (connection->broken() && options_.sentinel() && connection->generation == generation_) {
        // Perhaps the master went: ask the sentinels on the next connect, and close the idle
        // connections to it too.
        master_port_ = 0;
        ++generation_;
        open_ -= static_cast<int>(idle_.size());
        closing.swap(idle_);
      }
    }
    cv_.NotifyAll();
  }
  // `connection` (if dropped) and `closing` close their sockets here, outside the lock.
}

}  // namespace leasehold::internal
