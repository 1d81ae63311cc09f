// File: backends/sqlite/sqlite_wait.cc (internal)
//
// The sqlite:// store's wait facet: sleeping on a key's change generation in the host's shared
// queue file (sqlite_host_queue.h), and withdrawing a waiter's writer intent.

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "backends/common/sql_statement.h"
#include "backends/sqlite/sqlite_backend.h"
#include "backends/sqlite/sqlite_connection.h"
#include "backends/sqlite/sqlite_holder_anchor.h"
#include "backends/sqlite/sqlite_host_queue.h"
#include "core/duration.h"

namespace leasehold::internal {

void SqliteBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  MutexLock lock(&mu_);
  if (auto it = refused_at_.find(waiter_id); it != refused_at_.end()) {
    refused_at_.erase(it);
  }
  if (waiter_id.empty()) {
    return;
  }
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  // Best effort (Backend::AbandonWait): an intent left behind expires by itself within its ttl.
  // Not durable, as a release: an intent lost in a power cut is of the old boot, dead anyway.
  if (!transaction.Begin("abandon the wait", /*durable=*/false).ok()) {
    return;
  }
  {
    StatementRun erase(connection, kAbandonIntent, "abandon the wait");
    erase.Bind(1, key);
    erase.Bind(2, waiter_id);
    if (!erase.Finish().ok()) {
      return;
    }
  }
  if (sqlite3_changes(connection.db()) > 0) {
    // Shared requests the intent kept out may be admitted now.
    transaction.NotifyOnCommit(key);
  }
  (void)transaction.Commit("abandon the wait");
}

Status SqliteBackend::WaitForChange(std::string_view key, SteadyTime deadline,
                                    std::stop_token stop) {
  return WaitForKey(key, {}, std::nullopt, deadline, std::move(stop));
}

Status SqliteBackend::WaitForTurn(std::string_view key, std::string_view waiter_id,
                                  SteadyTime deadline, std::stop_token stop) {
  std::optional<std::uint32_t> seen;
  {
    MutexLock lock(&mu_);
    if (auto it = refused_at_.find(waiter_id); it != refused_at_.end()) {
      if (it->second.key == key) {
        seen = it->second.generation;
      }
      // Taken: the next attempt's refusal records the generation it read.
      refused_at_.erase(it);
    }
  }
  return WaitForKey(key, waiter_id, seen, deadline, std::move(stop));
}

Status SqliteBackend::WaitForKey(std::string_view key, std::string_view waiter_id,
                                 std::optional<std::uint32_t> seen, SteadyTime deadline,
                                 std::stop_token stop) {
  // Cancellation bumps the slot too, so that a stop requested between the check below and the
  // futex wait is not missed (the other waiters on the slot see a spurious wake-up).
  SqliteHostQueue* queue = nullptr;
  {
    MutexLock lock(&mu_);
    queue = &connection_->queue();
  }
  std::stop_callback on_stop(stop, [queue, key] { queue->Notify(key); });
  // While holders' liveness is polled: the first expiry the last round saw. Passing it is a
  // change (as the end of a plain wait at that expiry would be), though the next read of the
  // grants no longer shows the expired one.
  std::optional<std::int64_t> polled_expiry_ns;
  while (true) {
    if (stop.stop_requested()) {
      return Status::Cancelled("wait cancelled");
    }
    const SteadyTime now = clock_.Now();
    if (now >= deadline) {
      return Status::DeadlineExceeded("wait ran out");
    }
    // The generation first, then the grants: a grant's end that commits after this read of
    // the grants bumps the generation after the read of the generation. A waiter's refused
    // TryAcquire read it before its own read of the grants (WaitForTurn): a grant that ended
    // since then (a semaphore's slot freed while others still hold the key) has moved it.
    const std::uint32_t generation = seen.value_or(queue->Generation(key));
    seen.reset();  // a later round (after a timeout) reads afresh
    std::optional<std::int64_t> first_expiry_ns;
    // A grant of another process that proves its holder alive: nobody bumps the generation
    // when that holder dies, so its liveness is asked again every kLivenessPollInterval.
    bool watch_liveness = false;
    std::int64_t now_ns = 0;
    {
      MutexLock lock(&mu_);
      now_ns = NowNs();
      if (polled_expiry_ns.has_value() && now_ns >= *polled_expiry_ns) {
        return Status::Ok();
      }
      {
        StatementRun live(*connection_, kSelectHolders, "wait");
        live.Bind(1, key);
        live.Bind(2, boot_id_);
        live.Bind(3, now_ns);
        while (true) {
          LH_ASSIGN_OR_RETURN(bool row, live.Next());
          if (!row) {
            break;
          }
          if (live.Int(9) == 0) {
            return Status::Ok();  // a grant whose holder is gone: its slot is free now
          }
          first_expiry_ns = std::min(first_expiry_ns.value_or(live.Int(5)), live.Int(5));
          watch_liveness =
              watch_liveness || (!live.IsNull(10) && live.Int(10) != anchor_->offset());
        }
      }
      if (!first_expiry_ns.has_value() && waiter_id.empty()) {
        return Status::Ok();  // WaitForChange: the key is free
      }
      if (!first_expiry_ns.has_value()) {
        // A waiter (WaitForTurn) on a free key: another waiter's writer intent still holds its
        // shared request off. The intent ends by itself (a writer that died waiting: wake at
        // its expiry) or by its writer's grant or AbandonWait (which wakes us). The waiter's
        // own intent, or none: the key is its to take. (Its writer's grant, which clears it,
        // wakes us too: we then wait for that grant's end.)
        StatementRun intent(*connection_, kSelectLiveIntent, "wait");
        intent.Bind(1, key);
        intent.Bind(2, boot_id_);
        intent.Bind(3, now_ns);
        LH_ASSIGN_OR_RETURN(bool has_intent, intent.Next());
        if (!has_intent || intent.Text(0) == waiter_id) {
          return Status::Ok();
        }
        first_expiry_ns = intent.Int(3);
      }
    }
    // Without a release (a holder killed) a grant ends by itself: wake then at the latest. The
    // first expiry is a change too, though other grants may still hold the key.
    const Duration until_expiry =
        Duration(*first_expiry_ns - now_ns) + std::chrono::milliseconds(1);
    const bool until_an_expiry = until_expiry <= deadline - now;
    Duration timeout = std::min<Duration>(deadline - now, until_expiry);
    if (watch_liveness && timeout > kLivenessPollInterval) {
      if (queue->WaitChange(key, generation, kLivenessPollInterval) && !stop.stop_requested()) {
        return Status::Ok();
      }
      // The grants are read again: a gone holder's no longer counts, and the first expiry, if
      // it has passed meanwhile, ends the wait.
      polled_expiry_ns = *first_expiry_ns;
      continue;
    }
    if ((queue->WaitChange(key, generation, timeout) || until_an_expiry) &&
        !stop.stop_requested()) {
      return Status::Ok();
    }
  }
}

}  // namespace leasehold::internal
