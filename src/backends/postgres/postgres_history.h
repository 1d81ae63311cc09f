// File: backends/postgres/postgres_history.h (internal)
//
// What a postgres:// handle needs to stay safe on a PostgreSQL that fails over, is restored or
// loses a synchronous standby, shared by both modes:
//
// - PgHistory: the server's history as the handle has seen it, through the servers its
//   connections reached (system identifier, timeline: kServerIdentity) and the fencing tokens
//   it was granted (whose high bits are the PostgreSQL timeline: LH_PG_EPOCH, postgres_sql.h).
//   A primary or a grant on a newer timeline than any seen before is a failover the handle now
//   notices (logged as `store_failover`, counted by the caller); another database cluster, a
//   primary or a grant on an older timeline, or a grant of a key whose token is not above the
//   highest this handle was granted for it, means the store's history went backwards (a
//   restore to an earlier point, or a deposed primary that was never demoted): refused.
// - PgUnsureGrants: grants a handle may hold without knowing it (an acquire whose outcome was
//   indeterminate: PgConnection::Exec). Each is ended by an owner-checked release, tried at
//   once, then again before every later acquire of the handle while it lives.
//
// Thread safety: both are thread-safe (a mutex each, never held across a round trip).

#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "leasehold/fencing.h"
#include "leasehold/status.h"

#include "backends/backend.h"
#include "backends/postgres/postgres_connection.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// The PostgreSQL timeline a fencing token of the postgres:// store was handed out on (its bits
// 40-62 plus one; LH_PG_EPOCH).
constexpr std::uint64_t PgTokenTimeline(FencingToken token) {
  return (token >> 40) + 1;
}

// The server a connection reached, from kServerIdentity's row 0 (postgres_sql.h).
struct PgServerIdentity {
  std::string system_identifier;
  std::uint64_t timeline = 0;
  bool in_recovery = false;
};

// Reads kServerIdentity's columns 1-3 of row 0 of `r`.
PgServerIdentity PgIdentityOf(const PgResult& r);

class PgHistory {
 public:
  // Remembers the highest token per key for at most this many keys (then forgets them all but
  // the timeline: a handle that takes millions of distinct keys keeps a bounded memory).
  static constexpr std::size_t kMaxKeys = 4096;

  // Checks the token `token` just granted for `key` on the server `display`. Returns OK, with
  // *failover set if its timeline is newer than every one this handle saw before (the first
  // grant of a handle sets the baseline and is no failover); or kUnavailable naming the
  // regression ("the store's history went backwards: ...") if its timeline is older than one
  // seen before, or the key's token is not above the highest this handle was granted for it.
  Status Observe(std::string_view display, std::string_view key, FencingToken token, bool* failover)
      LH_EXCLUDES(mu_);

  // Checks the server a new connection of the handle reached (`display` names it). Returns OK,
  // with *failover set if it is a primary on a newer timeline than every one seen before; or
  // kUnavailable if it belongs to another database cluster than the first connection's (its
  // system identifier differs: a restore into a new cluster, a different server: its counters
  // are not the ones this handle's tokens came from), or is a primary on an older timeline than
  // one seen before (a deposed primary, a restore). A standby's timeline (its last checkpoint's)
  // is not judged: it grants nothing.
  Status ObserveServer(std::string_view display, const PgServerIdentity& server, bool* failover)
      LH_EXCLUDES(mu_);

 private:
  // Logs a failover to `timeline`, seen by `what`. REQUIRES: timeline > timeline_ > 0.
  void LogFailover(std::string_view display, std::uint64_t timeline, std::string_view what)
      LH_REQUIRES(mu_);

  Mutex mu_;
  std::string system_identifier_ LH_GUARDED_BY(mu_);
  std::uint64_t timeline_ LH_GUARDED_BY(mu_) = 0;
  std::unordered_map<std::string, FencingToken> highest_ LH_GUARDED_BY(mu_);
};

class PgUnsureGrants {
 public:
  // An owner-checked release of (key, owner token): OK or kLost when it is known to be over,
  // any other error when it must be tried again.
  using Release = std::function<Status(std::string_view key, std::string_view token)>;

  // At most this many other unsure grants get a release try before one acquire (each try is
  // bounded by command_timeout; a store that cannot confirm them stays slow to try).
  static constexpr std::size_t kTriesPerAcquire = 4;

  // Runs `acquire` for (key, token), with what this handle may still hold taken care of first:
  // up to kTriesPerAcquire other unsure grants get one release try each, and one under this
  // very (key, token) (an earlier attempt of the same waiting Acquire, whose grant would
  // otherwise refuse this one as held) gets one try too. No other thread touches (key, token)
  // until `acquire` returns. Then: a grant is confirmed (OK), so nothing of (key, token) is
  // unsure any more; an indeterminate outcome (PgIndeterminate) is released at once (one try)
  // and, if that is not known to be over either, remembered; any other outcome leaves things
  // as they were. Returns `acquire`'s result.
  template <typename T>
  Result<T> Acquire(std::string_view key, std::string_view token,
                    const std::function<Result<T>()>& acquire, const Release& release) {
    Begin(key, token, release);
    Result<T> out = acquire();
    End(key, token, out.ok() ? Status() : out.status(), release);
    return out;
  }

  // One release try for every unsure grant (a handle's close). Returns how many are left.
  std::size_t Flush(const Release& release) LH_EXCLUDES(mu_);

  // How many unsure grants are remembered.
  [[nodiscard]] std::size_t size() LH_EXCLUDES(mu_);

 private:
  struct Entry {
    std::string key;
    std::string token;
    // A thread is releasing it, or acquiring under its (key, token).
    bool busy = false;
  };

  void Begin(std::string_view key, std::string_view token, const Release& release) LH_EXCLUDES(mu_);
  void End(std::string_view key, std::string_view token, const Status& outcome,
           const Release& release) LH_EXCLUDES(mu_);
  // Releases each of `tries` (entries this thread marked busy) once; forgets those now known
  // to be over, and marks the others idle again, except (key, token) == `keep_busy`.
  void TryRelease(std::vector<Entry> tries, const Release& release,
                  std::pair<std::string_view, std::string_view> keep_busy) LH_EXCLUDES(mu_);

  Mutex mu_;
  CondVar idle_{&mu_};
  std::vector<Entry> entries_ LH_GUARDED_BY(mu_);
};

// `granted` (a TryAcquire's result for `request` on the server `display`) checked against
// `history` (PgHistory::Observe): a grant whose token says that the store's history went
// backwards is released (`release`, owner-checked) and refused with Observe's error. Sets
// *failover as Observe does (false unless granted).
Result<Grant> PgCheckGrant(PgHistory& history, std::string_view display,
                           const GrantRequest& request, Result<Grant> granted,
                           const PgUnsureGrants::Release& release, bool* failover);

}  // namespace leasehold::internal
