// File: backends/postgres/postgres_history.cc (internal)

#include "backends/postgres/postgres_history.h"

#include <algorithm>

#include <fmt/format.h>

#include "backends/postgres/postgres_connection.h"
#include "core/logging.h"

namespace leasehold::internal {

namespace {

// A release that is known to be over: done, or nothing of ours was there.
bool Over(const Status& s) {
  return s.ok() || s.code() == StatusCode::kLost;
}

bool Is(std::string_view key, std::string_view token, const std::string& k, const std::string& t) {
  return key == k && token == t;
}

}  // namespace

Status PgHistory::Observe(std::string_view display, std::string_view key, FencingToken token,
                          bool* failover) {
  *failover = false;
  const std::uint64_t timeline = PgTokenTimeline(token);
  MutexLock lock(&mu_);
  if (timeline < timeline_) {
    return Status::Unavailable(fmt::format(
        "the store's history went backwards: postgres at {} granted {} fencing token {} on "
        "timeline {}, and this handle was granted tokens on timeline {} before (a restore to an "
        "earlier point, or an old primary that was never demoted): refused, as its holder "
        "could overlap one of the newer timeline",
        display, key, token, timeline, timeline_));
  }
  if (auto it = highest_.find(std::string(key)); it != highest_.end() && token <= it->second) {
    return Status::Unavailable(fmt::format(
        "the store's history went backwards: postgres at {} granted {} fencing token {}, and "
        "this handle was granted {} for it before (a restore to an earlier point on the same "
        "timeline): refused, as the token would repeat",
        display, key, token, it->second));
  }
  if (timeline_ != 0 && timeline > timeline_) {
    *failover = true;
    LogFailover(display, timeline, fmt::format("a grant of {}", key));
  }
  timeline_ = std::max(timeline_, timeline);
  if (highest_.size() >= kMaxKeys && !highest_.contains(std::string(key))) {
    highest_.clear();
  }
  highest_[std::string(key)] = token;
  return Status();
}

PgServerIdentity PgIdentityOf(const PgResult& r) {
  return {.system_identifier = std::string(r.Get(0, 1)),
          .timeline = static_cast<std::uint64_t>(r.GetInt(0, 2)),
          .in_recovery = r.GetBool(0, 3)};
}

Status PgHistory::ObserveServer(std::string_view display, const PgServerIdentity& server,
                                bool* failover) {
  *failover = false;
  MutexLock lock(&mu_);
  if (!server.system_identifier.empty()) {
    if (system_identifier_.empty()) {
      system_identifier_ = server.system_identifier;
    } else if (server.system_identifier != system_identifier_) {
      return Status::Unavailable(fmt::format(
          "postgres at {} is another database cluster (system identifier {}) than the one this "
          "handle was granted leases by ({}): its fencing counters are not the ones this "
          "handle's tokens came from, so it is refused; a new handle (a restart) may use it",
          display, server.system_identifier, system_identifier_));
    }
  }
  if (server.in_recovery || server.timeline == 0) {
    return Status();
  }
  if (server.timeline < timeline_) {
    return Status::Unavailable(fmt::format(
        "the store's history went backwards: postgres at {} is a primary on timeline {}, and "
        "this handle was granted tokens on timeline {} before (an old primary that was never "
        "demoted, or a restore to an earlier point): refused",
        display, server.timeline, timeline_));
  }
  if (timeline_ != 0 && server.timeline > timeline_) {
    *failover = true;
    LogFailover(display, server.timeline, "a new connection");
  }
  timeline_ = std::max(timeline_, server.timeline);
  return Status();
}

void PgHistory::LogFailover(std::string_view display, std::uint64_t timeline,
                            std::string_view what) {
  LogEvent(LogLevel::kWarning, "store_failover",
           {{"store", display},
            {"timeline", std::to_string(timeline)},
            {"previous_timeline", std::to_string(timeline_)},
            {"seen_by", what}});
}

void PgUnsureGrants::Begin(std::string_view key, std::string_view token, const Release& release) {
  std::vector<Entry> tries;
  {
    MutexLock lock(&mu_);
    idle_.Wait({}, [&]() LH_NO_THREAD_SAFETY_ANALYSIS {
      return std::none_of(entries_.begin(), entries_.end(),
                          [&](const Entry& e) { return e.busy && Is(key, token, e.key, e.token); });
    });
    for (Entry& e : entries_) {
      if (e.busy) {
        continue;
      }
      const bool own = Is(key, token, e.key, e.token);
      if (own || tries.size() < kTriesPerAcquire) {
        e.busy = true;
        tries.push_back(e);
      }
    }
    // Tried ones go to the back, so that the next acquire tries others first.
    std::stable_partition(entries_.begin(), entries_.end(), [](const Entry& e) { return !e.busy; });
  }
  TryRelease(std::move(tries), release, {key, token});
}

void PgUnsureGrants::End(std::string_view key, std::string_view token, const Status& outcome,
                         const Release& release) {
  bool unsure = false;
  if (PgIndeterminate(outcome)) {
    const Status released = release(key, token);
    unsure = !Over(released);
    if (unsure) {
      // Debug: the acquire's own error already says the store may have applied it.
      Log(LogLevel::kDebug,
          fmt::format("{}: a grant this handle may hold is not released yet (tried again before "
                      "its next acquire; else its TTL ends it): {}",
                      key, released.message()));
    }
  }
  MutexLock lock(&mu_);
  auto own = std::find_if(entries_.begin(), entries_.end(),
                          [&](const Entry& e) { return Is(key, token, e.key, e.token); });
  if (own == entries_.end()) {
    if (unsure) {
      entries_.push_back({std::string(key), std::string(token), false});
    }
  } else if (outcome.ok() || (PgIndeterminate(outcome) && !unsure)) {
    // Confirmed under this token (a later release would end the live grant), or over.
    entries_.erase(own);
  } else {
    own->busy = false;
  }
  idle_.NotifyAll();
}

void PgUnsureGrants::TryRelease(std::vector<Entry> tries, const Release& release,
                                std::pair<std::string_view, std::string_view> keep_busy) {
  std::vector<bool> over(tries.size());
  for (std::size_t i = 0; i < tries.size(); ++i) {
    over[i] = Over(release(tries[i].key, tries[i].token));
  }
  MutexLock lock(&mu_);
  for (std::size_t i = 0; i < tries.size(); ++i) {
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
      return Is(tries[i].key, tries[i].token, e.key, e.token);
    });
    if (it == entries_.end()) {
      continue;
    }
    if (over[i]) {
      entries_.erase(it);
    } else if (!Is(keep_busy.first, keep_busy.second, it->key, it->token)) {
      it->busy = false;
    }
  }
  idle_.NotifyAll();
}

std::size_t PgUnsureGrants::Flush(const Release& release) {
  std::vector<Entry> tries;
  {
    MutexLock lock(&mu_);
    for (Entry& e : entries_) {
      if (!e.busy) {
        e.busy = true;
        tries.push_back(e);
      }
    }
  }
  TryRelease(std::move(tries), release, {});
  return size();
}

Result<Grant> PgCheckGrant(PgHistory& history, std::string_view display,
                           const GrantRequest& request, Result<Grant> granted,
                           const PgUnsureGrants::Release& release, bool* failover) {
  *failover = false;
  if (!granted.ok()) {
    return granted;
  }
  if (Status s = history.Observe(display, request.key, granted->fencing_token, failover); !s.ok()) {
    (void)release(request.key, request.owner_token);
    return s;
  }
  return granted;
}

std::size_t PgUnsureGrants::size() {
  MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace leasehold::internal
