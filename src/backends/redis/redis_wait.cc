// File: backends/redis/redis_wait.cc (internal)
//
// The redis:// store's wait facet: the key's channel through the subscriber, the fair queue's
// turn, and a waiter withdrawn from the queue.

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
#include "backends/redis/redis_backend.h"
#include "backends/redis/redis_cluster.h"
#include "backends/redis/redis_connection.h"
#include "backends/redis/redis_replies.h"
#include "backends/redis/redis_run.h"
#include "backends/redis/redis_scripts.h"
#include "backends/redis/redis_server_config.h"
#include "backends/redis/redis_subscriber.h"
#include "core/duration.h"
#include "core/logging.h"
#include "util/hex.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

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

}  // namespace leasehold::internal
