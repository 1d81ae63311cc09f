// File: backends/postgres/postgres_advisory_parts.h (internal)
//
// What the files of PostgreSQL's advisory mode share: its bounds, the statements it fills in,
// the session limits of a TTL, and the backend's sessions, held grants and waiters. Only the
// postgres_advisory_*.cc files include it.

#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "backends/common/time.h"
#include "backends/postgres/postgres_advisory_backend.h"
#include "backends/postgres/postgres_common.h"
#include "backends/postgres/postgres_sql.h"
#include "core/logging.h"
#include "util/hex.h"

namespace leasehold::internal {

namespace sql = postgres_sql;

// Why mode=advisory refuses shared and semaphore leases (Capabilities::no_shared_leases_why).
inline constexpr std::string_view kNoSharedLeases =
    "postgres mode=advisory has only exclusive leases; use postgres://...?mode=table for "
    "shared and semaphore leases";

using std::chrono::milliseconds;

// lock_timeout of a wait in the server's queue: the backstop for a wait nobody abandons. A wait
// that reaches it re-queues at the back on its next WaitForTurn.
inline constexpr long long kWaitBackstopMs = 60'000;
// After AbandonWait's cancel, how long the wait has to end before its session is dropped.
inline constexpr Duration kAbandonGrace = std::chrono::seconds(2);
// Idle sessions kept for future waits.
inline constexpr std::size_t kMaxIdleSessions = 2;
// Bound on remembered reasons for lost grants.
inline constexpr std::size_t kMaxLostReasons = 1024;
// A waiter refused by a kept grant it cannot see yet re-checks after this long.
inline constexpr Duration kKeptRecheck = milliseconds(100);

inline std::atomic<bool> skip_pooler_check_for_testing{false};

// Explains why a session's connection broke, for the kLost message.
inline std::string SessionEndReason(const Status& status, std::string_view conn_reason) {
  std::string_view detail = status.detail();
  std::string text = std::string(conn_reason.empty() ? status.message() : conn_reason);
  // libpq's text runs over several lines ("server closed the connection unexpectedly..."):
  // the first one names the cause.
  text = text.substr(0, text.find('\n'));
  if (text.starts_with("FATAL:  ")) {
    text = text.substr(8);
  }
  if (detail == kSqlStateAdminShutdown || text.find("administrator command") != std::string::npos) {
    return fmt::format(
        "the server ended this lease's session ({}): pg_terminate_backend, `leasehold release "
        "--force` or a server shutdown; advisory locks die with their session",
        text);
  }
  if (detail == kSqlStateIdleSessionTimeout || text.find("idle-session") != std::string::npos) {
    return fmt::format(
        "the server closed this lease's session after idle_session_timeout: no renewal reached "
        "it within the ttl ({})",
        text);
  }
  return fmt::format(
      "the connection holding this lease's session failed ({}); advisory locks "
      "die with their session",
      text);
}

inline std::string Fill(std::string_view text, std::string_view name, long long value) {
  std::string out(text);
  std::size_t at = out.find(name);
  if (at != std::string::npos) {
    out.replace(at, name.size(), std::to_string(value));
  }
  return out;
}

inline std::string UnlockStatement(std::int64_t lock_id) {
  return Fill(sql::kAdvisoryUnlock, "{lock_id}", lock_id);
}

inline std::string WaitStatement(std::int64_t lock_id) {
  return Fill(Fill(sql::kAdvisoryWait, "{timeout_ms}", kWaitBackstopMs), "{lock_id}", lock_id);
}

// One server session. Its connection is used under mu; pid and the lost flag are set once.
struct PostgresAdvisoryBackend::Session {
  Mutex mu;
  std::unique_ptr<PgConnection> conn LH_GUARDED_BY(mu);
  int pid = 0;
  std::atomic<bool> lost{false};
};

struct PostgresAdvisoryBackend::Held {
  std::string key;
  std::string token;
  std::string holder;
  std::shared_ptr<Session> session;
  std::int64_t lock_id = 0;
  FencingToken fence = 0;
  Duration ttl{};
  // Past this instant, with no renewal, the grant has expired: it is unlocked, never renewed.
  SteadyTime expires{};
};

// A waiter of Store::Acquire, queued in the server on its own session. Fields are used by the
// waiter's own thread under session->mu.
struct PostgresAdvisoryBackend::Waiting {
  std::string key;
  std::int64_t lock_id = 0;
  std::shared_ptr<Session> session;
  bool in_flight = false;
  bool got = false;
  // The lock is ours but a kept grant refused us: its end, until which WaitForTurn sleeps.
  SteadyTime kept_until{};
};

// The session limits for a largest TTL `t` (see postgres_advisory_backend.h): idle_session_timeout
// (ms), tcp_keepalives_idle (s), tcp_user_timeout (ms).
struct Limits {
  std::string idle_ms;
  std::string keepalive_idle_s;
  std::string user_timeout_ms;
};

inline Limits LimitsFor(Duration t) {
  long long ms = CeilMillis(t);
  return Limits{std::to_string(ms), std::to_string((ms + 999) / 1000), std::to_string(ms + 1000)};
}

}  // namespace leasehold::internal
