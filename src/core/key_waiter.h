// File: core/key_waiter.h (internal)
//
// KeyWaiter: how a loop that waits on one key sleeps between two reads of it: on the store's
// change notification where it has one, else by polling with capped exponential backoff and
// full jitter, never past the holder's remaining TTL (the grant ends by itself then). Shared by
// Store::Acquire (a queued waiter: Backend::WaitForTurn) and Election::Observe (through the
// public Store::WaitForChange), so that both wait the same way.
//
// Example (one round of a waiting loop, after a read found the key held):
//
//   KeyWaiter waiter(clock, [&](SteadyTime d, std::stop_token s) { return wait(d, s); },
//                    notifies, kPollBase, kPollCap);
//   if (waiter.notifies()) {
//     Status w = waiter.AwaitStore(now + kSafetyNet, stop);
//     if (w.code() != StatusCode::kUnimplemented) continue;  // woken: read again
//   }
//   waiter.SleepPoll(holder_remaining, now, deadline, stop);
//
// Thread safety: not thread-safe; one KeyWaiter per waiting call.

#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <stop_token>
#include <utility>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "core/backoff.h"

namespace leasehold::internal {

class KeyWaiter {
 public:
  // The store's own wait for the key: returns OK when woken, kDeadlineExceeded, kCancelled, or
  // kUnimplemented if the store has no change notification (Backend::WaitForChange).
  using StoreWait = std::function<Status(SteadyTime deadline, std::stop_token stop)>;

  // `native`: the store notifies changes (the backend has a wait facet). REQUIRES: 0 < poll_base
  // <= poll_cap. `clock` must outlive the KeyWaiter.
  KeyWaiter(Clock& clock, StoreWait store_wait, bool native, Duration poll_base, Duration poll_cap)
      : clock_(clock),
        store_wait_(std::move(store_wait)),
        native_(native),
        poll_(poll_base, poll_cap) {}

  // Returns true while the store's notification is used (false once it said kUnimplemented).
  [[nodiscard]] bool notifies() const { return native_; }

  // Waits on the store's notification until `deadline` (on the clock) or `stop`. Returns what
  // the store returned; kUnimplemented (and notifies() turns false) if it has no notification.
  Status AwaitStore(SteadyTime deadline, std::stop_token stop) {
    if (!native_) {
      return Status::Unimplemented("this store has no change notification; poll instead");
    }
    Status w = store_wait_(deadline, std::move(stop));
    if (w.code() == StatusCode::kUnimplemented) {
      native_ = false;
    }
    return w;
  }

  // Sleeps one poll interval from `now`, at most until the holder's grant ends by itself
  // (`holder_remaining`, if the key is held) and never past `deadline`. Returns early on `stop`.
  void SleepPoll(const std::optional<Duration>& holder_remaining, SteadyTime now,
                 SteadyTime deadline, std::stop_token stop) {
    Duration sleep = poll_.Next();
    if (holder_remaining.has_value()) {
      sleep = std::min<Duration>(sleep, *holder_remaining + std::chrono::milliseconds(1));
    }
    clock_.SleepUntil(std::min(now + sleep, deadline), std::move(stop));
  }

  // Starts the poll backoff again from its base (after progress: a change was seen).
  void ResetPoll() { poll_.Reset(); }

 private:
  Clock& clock_;
  const StoreWait store_wait_;
  bool native_;
  Backoff poll_;
};

}  // namespace leasehold::internal
