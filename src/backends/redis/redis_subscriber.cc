// File: backends/redis/redis_subscriber.cc (internal)
//
// RedisSubscriber on a RedisConnection of its own: the thread drives the socket itself (poll,
// then ReadAvailable and NextReply), since a subscribed connection only reads pushes.

#include "backends/redis/redis_subscriber.h"

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <utility>
#include <vector>

#include <sys/eventfd.h>

#include "backends/common/time.h"
#include "backends/redis/redis_connection.h"
#include "core/backoff.h"

namespace leasehold::internal {

namespace {

// A channel stays subscribed this long after its last waiter leaves: a waiter that loses the
// race for the grant waits again at once, and must not pay for a new SUBSCRIBE every time.
constexpr Duration kSubscriptionLinger = std::chrono::seconds(1);
// How long the subscriber thread sleeps in poll() when nothing happens; it is woken through an
// eventfd for every change, so this only bounds how stale a stop request can get.
constexpr int kSubscriberPollMs = 1000;

}  // namespace

RedisSubscriber::RedisSubscriber(std::shared_ptr<RedisConnectionPool> pool, Clock& clock)
    : pool_(std::move(pool)),
      clock_(clock),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      cv_(&mu_) {
  thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
}

RedisSubscriber::~RedisSubscriber() {
  thread_.request_stop();
  Wake();
  thread_.join();
  if (wake_fd_ >= 0) {
    close(wake_fd_);
  }
}

RedisSubscriber::Watch RedisSubscriber::Register(const std::string& channel,
                                                 std::string_view waiter_id) {
  Watch watch{.channel = channel, .waiter_id = std::string(waiter_id)};
  {
    MutexLock lock(&mu_);
    if (!watch.waiter_id.empty()) {
      handed_[watch.waiter_id].reset();
    }
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

bool RedisSubscriber::AwaitSubscribed(const Watch& watch, SteadyTime until, std::stop_token stop) {
  MutexLock lock(&mu_);
  return cv_.WaitUntil(ToSteady(until, clock_), std::move(stop), [&]() LH_REQUIRES(mu_) {
    auto it = channels_.find(watch.channel);
    return it != channels_.end() && (it->second.confirmed || it->second.events != watch.seen);
  });
}

bool RedisSubscriber::AwaitEvent(const Watch& watch, SteadyTime until, std::stop_token stop) {
  MutexLock lock(&mu_);
  return cv_.WaitUntil(ToSteady(until, clock_), std::move(stop), [&]() LH_REQUIRES(mu_) {
    auto it = channels_.find(watch.channel);
    return it != channels_.end() && it->second.events != watch.seen;
  });
}

std::optional<std::string> RedisSubscriber::AwaitNext(Watch& watch, SteadyTime until,
                                                      std::stop_token stop) {
  MutexLock lock(&mu_);
  const bool woken =
      cv_.WaitUntil(ToSteady(until, clock_), std::move(stop), [&]() LH_REQUIRES(mu_) {
        auto it = channels_.find(watch.channel);
        return it != channels_.end() && it->second.events != watch.seen;
      });
  auto it = channels_.find(watch.channel);
  if (!woken || it == channels_.end()) {
    return std::nullopt;
  }
  const bool one = it->second.events == watch.seen + 1;
  watch.seen = it->second.events;
  return one ? it->second.last_payload : std::string();
}

std::optional<std::string> RedisSubscriber::Unregister(const Watch& watch) {
  std::optional<std::string> handed;
  {
    MutexLock lock(&mu_);
    if (auto h = handed_.find(watch.waiter_id); !watch.waiter_id.empty() && h != handed_.end()) {
      handed = std::move(h->second);
      handed_.erase(h);
    }
    auto it = channels_.find(watch.channel);
    if (it != channels_.end()) {
      if (--it->second.waiters == 0) {
        it->second.idle_since = clock_.Now();
      }
    }
  }
  Wake();
  return handed;
}

void RedisSubscriber::Wake() {
  std::uint64_t one = 1;
  if (wake_fd_ >= 0) {
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

void RedisSubscriber::DrainWake() {
  std::uint64_t value = 0;
  (void)!read(wake_fd_, &value, sizeof(value));
}

void RedisSubscriber::Disconnected() {
  connection_.reset();
  in_flight_.clear();
  MutexLock lock(&mu_);
  for (auto& [name, state] : channels_) {
    state.sent = false;
    state.confirmed = false;
    ++state.events;
    state.last_payload.clear();
  }
  cv_.NotifyAll();
}

// Pub/sub channels are server-wide, so the database the connection selects does not matter.
bool RedisSubscriber::ConnectContext() {
  Result<std::unique_ptr<RedisConnection>> connection = pool_->Connect();
  if (!connection.ok()) {
    return false;
  }
  connection_ = std::move(connection).value();
  return true;
}

bool RedisSubscriber::SendChanges() {
  std::vector<Sent> to_send;
  {
    MutexLock lock(&mu_);
    const SteadyTime now = clock_.Now();
    for (auto it = channels_.begin(); it != channels_.end();) {
      Channel& state = it->second;
      if (state.waiters > 0 && !state.sent) {
        state.sent = true;
        to_send.push_back({true, it->first, state.generation});
        ++it;
      } else if (state.waiters == 0 && now - state.idle_since >= kSubscriptionLinger) {
        if (state.sent) {
          to_send.push_back({false, it->first, state.generation});
        }
        it = channels_.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::vector<Command> commands;
  for (const Sent& sent : to_send) {
    commands.push_back({sent.subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE", sent.channel});
    in_flight_.push_back(sent);
  }
  return commands.empty() || connection_->Send(commands, pool_->options().Address()).ok();
}

void RedisSubscriber::Handle(const redisReply* reply) {
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3) {
    return;
  }
  std::string_view kind = ReplyText(reply->element[0]);
  std::string channel(ReplyText(reply->element[1]));
  MutexLock lock(&mu_);
  if (kind == "message") {
    // "handed <waiter id> <fencing token> <t_q> <ttl_ms>" (kFairEndScript): kept for a waiter
    // of this process, which reads it when it unregisters.
    std::string_view payload = ReplyText(reply->element[2]);
    if (payload.starts_with("handed ")) {
      std::string_view rest = payload.substr(7);
      std::string_view id = rest.substr(0, rest.find(' '));
      if (auto h = handed_.find(id); h != handed_.end() && !h->second) {
        h->second = std::string(payload);
      }
    }
    if (auto it = channels_.find(channel); it != channels_.end()) {
      ++it->second.events;
      it->second.last_payload = std::string(payload);
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

void RedisSubscriber::Run(std::stop_token stop) {
  // A sleep loop, so the plain full-jitter Backoff: the wait is a poll() on the wake-up eventfd,
  // which a stop request cuts short.
  Backoff backoff(kRedisReconnectBackoffBase, kRedisReconnectBackoffCap);
  while (!stop.stop_requested()) {
    if (connection_ == nullptr) {
      if (!ConnectContext()) {
        pollfd wake{wake_fd_, POLLIN, 0};
        const Duration wait = backoff.Next() + std::chrono::milliseconds(1);
        (void)poll(&wake, 1, static_cast<int>(CeilMillis(wait)));
        DrainWake();
        continue;
      }
      backoff.Reset();
    }
    if (pool_->options().sentinel() && connection_->generation != pool_->generation()) {
      // The master moved (a failover): this connection is to the old one, where the releases
      // are no longer published. Waiters wake (spuriously) and the next turn connects anew.
      Disconnected();
      continue;
    }
    if (!SendChanges()) {
      Disconnected();
      continue;
    }
    const std::string address = pool_->options().Address();
    pollfd fds[2] = {{connection_->fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // Decrypted TLS data already taken off the socket is invisible to poll: read it first.
    const int n = connection_->HasBufferedInput() ? 0 : poll(fds, 2, kSubscriberPollMs);
    if (n < 0) {
      continue;  // EINTR
    }
    if ((fds[1].revents & POLLIN) != 0) {
      DrainWake();
    }
    if (connection_->HasBufferedInput() || (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      if (!connection_->ReadAvailable(address).ok()) {
        Disconnected();
        continue;
      }
      bool ok = true;
      while (true) {
        Result<ReplyPtr> reply = connection_->NextReply(address);
        if (!reply.ok()) {
          ok = false;
          break;
        }
        if (*reply == nullptr) {
          break;
        }
        Handle(reply->get());
      }
      if (!ok) {
        Disconnected();
      }
    }
  }
}

}  // namespace leasehold::internal
