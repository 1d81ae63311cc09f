// File: backends/redis/redis_subscriber.h (internal to backends/redis)
//
// RedisSubscriber: the one pub/sub connection of a redis:// backend. A std::jthread owns a
// RedisConnection in subscribe mode and multiplexes every channel some waiter waits on. Waiters
// register a channel, wait for the SUBSCRIBE to be confirmed, and then for a message on it. If
// the connection breaks, every waiter is woken (a spurious wake-up: it retries and waits again)
// and the thread reconnects with backoff and resubscribes. A channel stays subscribed a little
// while after its last waiter leaves, so that a waiter that loses the race for a grant and
// waits again at once does not pay for a new SUBSCRIBE.
//
// Example:
//
//   RedisSubscriber subscriber(pool, clock);
//   RedisSubscriber::Watch watch = subscriber.Register(channel);
//   if (subscriber.AwaitSubscribed(watch, clock.Now() + 2s, stop)) {
//     // ... read the key's state: a release from now on is not missed ...
//     subscriber.AwaitEvent(watch, deadline, stop);
//   }
//   subscriber.Unregister(watch);
//
// Thread safety: thread-safe. The destructor stops and joins the thread.

#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>

#include "leasehold/clock.h"

#include "util/mutex.h"
#include "util/thread_annotations.h"

struct redisReply;  // hiredis; only redis_subscriber.cc and redis_connection.h include it

namespace leasehold::internal {

class RedisConnection;
class RedisConnectionPool;

class RedisSubscriber {
 public:
  // Connects through `pool` (which paces reconnects) and starts the thread. `clock` must
  // outlive the subscriber; every deadline given to it is on that clock.
  RedisSubscriber(std::shared_ptr<RedisConnectionPool> pool, Clock& clock);

  RedisSubscriber(const RedisSubscriber&) = delete;
  RedisSubscriber& operator=(const RedisSubscriber&) = delete;
  RedisSubscriber(RedisSubscriber&&) = delete;
  RedisSubscriber& operator=(RedisSubscriber&&) = delete;

  ~RedisSubscriber();

  // A registration of one waiter on one channel.
  struct Watch {
    std::string channel;
    // fair=true: the waiter id (GrantRequest::waiter_id) whose "handed" messages to keep
    // (redis_scripts.h, kFairEndScript); empty for none.
    std::string waiter_id;
    std::uint64_t generation = 0;
    std::uint64_t seen = 0;
  };

  // Registers interest in `channel`, and in the "handed <waiter_id> ..." messages on it if
  // `waiter_id` is not empty. Returns at once; see AwaitSubscribed.
  Watch Register(const std::string& channel, std::string_view waiter_id = {}) LH_EXCLUDES(mu_);

  // Blocks until the channel's SUBSCRIBE is confirmed (true), or `until` or `stop` (false).
  bool AwaitSubscribed(const Watch& watch, SteadyTime until, std::stop_token stop) LH_EXCLUDES(mu_);

  // Blocks until a message (or a reconnect) on the channel since Register, `until` or `stop`.
  // Returns true if woken by an event.
  bool AwaitEvent(const Watch& watch, SteadyTime until, std::stop_token stop) LH_EXCLUDES(mu_);

  // As AwaitEvent, and moves the watch past the events it saw: returns nullopt on `until` or
  // `stop`, else the payload of the one message since the watch last looked, or "" if there
  // were several or a reconnect (the caller cannot tell what happened: treat as a wake-up).
  std::optional<std::string> AwaitNext(Watch& watch, SteadyTime until, std::stop_token stop)
      LH_EXCLUDES(mu_);

  // Ends the registration; the channel lingers subscribed for a while if it was the last.
  // Returns the payload of the "handed" message for the watch's waiter id received since
  // Register, if one came (later ones are no longer kept).
  std::optional<std::string> Unregister(const Watch& watch) LH_EXCLUDES(mu_);

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
    // The latest message's payload; "" after a reconnect.
    std::string last_payload;
    // When the last waiter left (on clock_); the subscription lingers a while after that.
    SteadyTime idle_since{};
  };

  struct Sent {
    bool subscribe;
    std::string channel;
    std::uint64_t generation;
  };

  void Wake();
  void DrainWake();

  // Wakes every waiter and forgets subscriptions: the connection is gone.
  void Disconnected() LH_EXCLUDES(mu_);

  // Opens the subscriber's own connection (AUTH, SELECT, PING as for commands).
  bool ConnectContext();

  // Sends SUBSCRIBE/UNSUBSCRIBE for every channel whose wanted state changed.
  bool SendChanges() LH_EXCLUDES(mu_);

  // Handles one pub/sub reply: ["subscribe"|"unsubscribe", channel, n] or
  // ["message", channel, payload].
  void Handle(const redisReply* reply) LH_EXCLUDES(mu_);

  // The thread: connect (with backoff), send changes, poll the socket and the wake-up eventfd.
  void Run(std::stop_token stop);

  // Immutable after construction.
  const std::shared_ptr<RedisConnectionPool> pool_;
  Clock& clock_;
  const int wake_fd_;

  Mutex mu_;
  CondVar cv_;
  std::map<std::string, Channel> channels_ LH_GUARDED_BY(mu_);
  // Waiter ids with a live registration -> the "handed" payload received for it, if any. Only
  // this process's waiters are kept: other processes' handoffs on the same channel are not.
  std::map<std::string, std::optional<std::string>, std::less<>> handed_ LH_GUARDED_BY(mu_);
  std::uint64_t next_generation_ LH_GUARDED_BY(mu_) = 0;

  // Owned by the subscriber thread only.
  std::unique_ptr<RedisConnection> connection_;
  std::deque<Sent> in_flight_;

  // Last: started by the constructor once everything above exists, joined first.
  std::jthread thread_;
};

}  // namespace leasehold::internal
