// File: backends/sqlite/sqlite_backend.cc (internal)
//
// The embedded sqlite:// store's grant core (its facets: sqlite_records.cc, sqlite_doctor.cc,
// sqlite_wait.cc, sqlite_fenced_write.cc; the connection: sqlite_connection.h). Invariants:
// - Every mutation runs in one BEGIN IMMEDIATE transaction, which takes the database's write
//   lock before the first read: the check for a live grant and the write that follows cannot
//   interleave with another process's.
// - Time is the host's CLOCK_BOOTTIME in nanoseconds since boot, read after the write lock is
//   held. A grant is live only if its boot_id is the current boot's and expires_ns > now. It is
//   read through the backend's Clock (SqliteBackend::NowNs), which is Clock::Real(), minus the
//   CLOCK_BOOTTIME offset of the process's time namespace (/proc/self/timens_offsets: CRIU,
//   `unshare --time`, OCI timeOffsets): the values are shared through the file with every other
//   process on the host, whatever its namespace, so they must be on the one time base they all
//   share, and the registry refuses any other clock for sqlite://.
// - fencing_counters rows are never deleted, so fencing tokens keep increasing per key.
// - records (a key's schedule-slot record) are judged on the wall clock, CLOCK_REALTIME, not
//   CLOCK_BOOTTIME: a record must outlive a reboot, and it never decides who holds a lease.
// - A file is modified only once it is known to be a leasehold database (application_id and
//   user_version) or to be empty. Anything else is reported, never recreated.
// - A fenced write's statements run only inside its BEGIN IMMEDIATE transaction, after the
//   grant check, under an authorizer that refuses what would end that transaction or touch the
//   lease tables; the authorizer is installed only while they are prepared and stepped.

#include "backends/sqlite/sqlite_backend.h"

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

#include "backends/common/admission.h"
#include "backends/common/sql_statement.h"
#include "backends/sqlite/sqlite_connection.h"
#include "backends/sqlite/sqlite_holder_anchor.h"
#include "backends/sqlite/sqlite_host_queue.h"
#include "core/duration.h"

namespace leasehold::internal {

Result<std::int64_t> ParseBoottimeOffsetNs(std::string_view timens_offsets) {
  const auto malformed = [&] {
    return Status::Internal(fmt::format("no valid \"boottime <s> <ns>\" line in {}: \"{}\"",
                                        kTimensOffsetsPath, timens_offsets));
  };
  std::size_t at = 0;
  while (at < timens_offsets.size()) {
    std::size_t end = timens_offsets.find('\n', at);
    if (end == std::string_view::npos) {
      end = timens_offsets.size();
    }
    // The line's fields, split on blanks.
    std::vector<std::string_view> fields;
    for (std::size_t i = at; i < end;) {
      while (i < end && (timens_offsets[i] == ' ' || timens_offsets[i] == '\t')) {
        ++i;
      }
      const std::size_t start = i;
      while (i < end && timens_offsets[i] != ' ' && timens_offsets[i] != '\t') {
        ++i;
      }
      if (i > start) {
        fields.push_back(timens_offsets.substr(start, i - start));
      }
    }
    at = end + 1;
    if (fields.empty() || fields[0] != "boottime") {
      continue;
    }
    std::int64_t seconds = 0;
    std::int64_t nanos = 0;
    const auto number = [](std::string_view text, std::int64_t& out) {
      const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
      return ec == std::errc() && ptr == text.data() + text.size();
    };
    // The kernel bounds an offset to what a timespec64 holds; more than ~292 years overflows ns.
    constexpr std::int64_t kMaxSeconds =
        std::numeric_limits<std::int64_t>::max() / 1'000'000'000 - 1;
    if (fields.size() != 3 || !number(fields[1], seconds) || !number(fields[2], nanos) ||
        nanos < 0 || nanos >= 1'000'000'000 || seconds > kMaxSeconds || seconds < -kMaxSeconds) {
      return malformed();
    }
    return seconds * 1'000'000'000 + nanos;
  }
  return malformed();
}

Result<std::string> DefaultSqlitePath() {
  const char* dir = std::getenv("LEASEHOLD_STATE_DIR");
  if (dir == nullptr || dir[0] == '\0') {
    return fmt::format("{}/leases.db", kDefaultSqliteStateDir);
  }
  if (dir[0] != '/') {
    return Status::InvalidArgument(fmt::format(
        "LEASEHOLD_STATE_DIR must be an absolute path (the host-wide store's directory), got "
        "\"{}\"",
        dir));
  }
  return fmt::format("{}/leases.db", dir);
}

Result<std::shared_ptr<Backend>> OpenSqliteBackend(const Url& url, Clock& clock) {
  LH_ASSIGN_OR_RETURN(SqliteOptions options, SqliteOptions::FromUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<SqliteBackend> backend,
                      SqliteBackend::Open(std::move(options), clock));
  return std::shared_ptr<Backend>(std::move(backend));
}

Result<std::shared_ptr<SqliteBackend>> SqliteBackend::Open(SqliteOptions options, Clock& clock) {
  if (options.path.empty()) {
    LH_ASSIGN_OR_RETURN(options.path, DefaultSqlitePath());
  }
  if (options.busy_timeout < Duration::zero() || options.busy_timeout > kSqliteMaxBusyTimeout) {
    return Status::InvalidArgument(
        fmt::format("sqlite busy_timeout must be between 0 and {}, got {}",
                    FormatDuration(kSqliteMaxBusyTimeout), FormatDuration(options.busy_timeout)));
  }
  std::string boot_id = options.boot_id_for_testing;
  if (boot_id.empty()) {
    LH_ASSIGN_OR_RETURN(boot_id, ReadBootId());
  }
  LH_ASSIGN_OR_RETURN(const std::int64_t boot_offset_ns, ReadBoottimeOffsetNs());

  LH_RETURN_IF_ERROR(CreateParentDirectories(options.path, options.host_scope));
  LH_ASSIGN_OR_RETURN(const mode_t mode,
                      CreateOrCheckDatabaseFile(options.path, options.host_scope));
  // Whoever may write the file shares its leases: others too when group or others may.
  const StoreScope scope = (mode & 0022) != 0 ? StoreScope::kHost : StoreScope::kUser;
  auto connection = std::make_unique<SqliteConnection>(options.path, options.busy_timeout, clock);
  LH_RETURN_IF_ERROR(connection->Open());
  LH_RETURN_IF_ERROR(connection->CheckOrInitialize());
  LH_RETURN_IF_ERROR(connection->Configure());
  LH_ASSIGN_OR_RETURN(std::unique_ptr<SqliteHostQueue> queue,
                      SqliteHostQueue::Open(options.path, boot_id));
  connection->set_queue(std::move(queue));
  LH_ASSIGN_OR_RETURN(std::unique_ptr<SqliteHolderAnchor> anchor,
                      SqliteHolderAnchor::Open(options.path + "-lhq"));
  LH_RETURN_IF_ERROR(connection->DefineLiveness(anchor.get()));
  LH_RETURN_IF_ERROR(connection->PrepareAll());
  return std::shared_ptr<SqliteBackend>(
      new SqliteBackend(std::move(options.path), scope, std::move(boot_id), boot_offset_ns, clock,
                        std::move(anchor), std::move(connection)));
}

SqliteBackend::SqliteBackend(std::string path, StoreScope scope, std::string boot_id,
                             std::int64_t boot_offset_ns, Clock& clock,
                             std::unique_ptr<SqliteHolderAnchor> anchor,
                             std::unique_ptr<SqliteConnection> connection)
    : path_(std::move(path)),
      scope_(scope),
      boot_id_(std::move(boot_id)),
      boot_offset_ns_(boot_offset_ns),
      clock_(clock),
      anchor_(std::move(anchor)),
      connection_(std::move(connection)) {
  // The holder liveness lock (sqlite_holder_anchor.h): every grant this backend makes counts as
  // live, TTL permitting, until each process that has this descriptor open has closed it.
  set_holder_liveness_fd(anchor_->fd());
}

SqliteBackend::~SqliteBackend() = default;

std::int64_t SqliteBackend::NowNs() const {
  return clock_.Now().time_since_epoch().count() - boot_offset_ns_;
}

Capabilities SqliteBackend::capabilities() const {
  return Capabilities{
      .scope = scope_,
      .notifies_holder = true,
      .fencing_survives_restart = true,
      .shared_leases = true,
      .holder_liveness = true,
  };
}

unsigned SqliteBackend::fenced_ops() const {
  return FencedOpBit(FencedOp::Kind::kSql);
}

Result<Grant> SqliteBackend::TryAcquire(const GrantRequest& request) {
  LH_RETURN_IF_ERROR(CheckTtl(request.key, request.ttl));
  MutexLock lock(&mu_);
  // Read before the transaction: a grant's end that this attempt does not see commits after
  // its read of the grants, and bumps the generation after that, so after this read; the
  // waiter's WaitForTurn sleeps on this value and cannot miss it.
  const std::uint32_t generation = connection_->queue().Generation(request.key);
  Result<Grant> result = TryAcquireLocked(request);
  if (!request.waiter_id.empty()) {
    if (result.ok() || result.status().code() != StatusCode::kHeldByAnother) {
      refused_at_.erase(request.waiter_id);
    } else {
      if (refused_at_.size() >= kMaxRefusedWaiters && !refused_at_.contains(request.waiter_id)) {
        refused_at_.clear();
      }
      refused_at_.insert_or_assign(request.waiter_id,
                                   RefusedAt{.key = request.key, .generation = generation});
    }
  }
  return result;
}

namespace {

// The admission rule (common/admission.h) for `request` with the key's live grants ahead.
Admission AdmitBeside(const std::vector<LeaseInfo>& live, const GrantRequest& request) {
  Ahead ahead;
  for (const LeaseInfo& held : live) {
    ahead.Add({held.mode, held.limit});
  }
  return ahead.Decide({request.mode, request.limit});
}

}  // namespace

Result<Grant> SqliteBackend::TryAcquireLocked(const GrantRequest& request) {
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("try-acquire"));
  // Read the clock only now that the write lock is held: the wait for it may be long, and the
  // grant's expiry must not be earlier than the caller's t_send + ttl.
  const std::int64_t now_ns = NowNs();
  // The key's live grants, by slot; and which of them, if any, is already this owner token's.
  std::vector<LeaseInfo> live;
  std::optional<std::size_t> own;
  {
    StatementRun select(connection, kSelectLiveGrants, "try-acquire");
    select.Bind(1, request.key);
    select.Bind(2, boot_id_);
    select.Bind(3, now_ns);
    while (true) {
      LH_ASSIGN_OR_RETURN(bool row, select.Next());
      if (!row) {
        break;
      }
      if (select.Text(2) == request.owner_token) {
        own = live.size();
      }
      live.push_back(LeaseInfoFromRow(select, now_ns));
    }
  }
  // The admission rule with the live grants ahead; a waiting writer's intent is read below, only
  // where it can refuse the request (shared, not otherwise refused).
  const bool asks_semaphore = request.limit > 1;
  const Admission admission = AdmitBeside(live, request);
  if (admission.verdict == Verdict::kMismatch) {
    const LeaseInfo& held = live[admission.by];
    return LimitMismatch(request.key, held.mode, held.limit, held.holder, request.mode,
                         request.limit);
  }
  if (own.has_value()) {
    // An earlier attempt of the same call was granted under this token and its reply was lost:
    // its expiry began before this attempt's t_send, so it cannot be adopted (see Store::Acquire);
    // it is refused as held and expires by itself.
    return Status::HeldByAnother(live[*own], "a grant under this owner token already exists");
  }

  auto read_intent = [&] {
    return ReadLiveIntent(connection, request.key, boot_id_, now_ns, "try-acquire");
  };

  const bool busy = admission.verdict == Verdict::kBusy;
  if (asks_semaphore) {
    if (busy) {
      return Status::HeldByAnother(live.front(),
                                   fmt::format("all {} slots are held", request.limit));
    }
  } else if (request.mode == LeaseMode::kShared) {
    if (busy) {
      return Status::HeldByAnother(live.front());
    }
    LH_ASSIGN_OR_RETURN(std::optional<LiveIntent> intent, read_intent());
    if (intent.has_value() && intent->waiter_id != request.waiter_id) {
      const LeaseInfo& writer = intent->info;
      return Status::HeldByAnother(
          fmt::format("{} is kept for {}, a writer waiting for it ({} left of its intent); "
                      "shared holders are admitted after it",
                      request.key, writer.holder.empty() ? "another owner" : writer.holder,
                      FormatDuration(RoundForDisplay(writer.remaining))),
          writer);
    }
  } else if (busy) {
    Status held = Status::HeldByAnother(live.front());
    if (request.waiter_id.empty()) {
      return held;
    }
    // Writer preference: record this waiter's intent, or refresh it, unless another waiter's
    // live intent came first (one intent per key: the first waiting writer's).
    LH_ASSIGN_OR_RETURN(std::optional<LiveIntent> intent, read_intent());
    if (intent.has_value() && intent->waiter_id != request.waiter_id) {
      return held;
    }
    {
      StatementRun put(connection, kPutIntent, "try-acquire");
      put.Bind(1, request.key);
      put.Bind(2, request.waiter_id);
      put.Bind(3, request.holder);
      put.Bind(4, boot_id_);
      put.Bind(5, request.ttl.count());
      put.Bind(6, SaturatingAdd(now_ns, request.ttl.count()));
      LH_RETURN_IF_ERROR(put.Finish());
    }
    LH_RETURN_IF_ERROR(transaction.Commit("try-acquire"));
    return held;
  }

  // Admitted. The smallest slot no live grant has (live is ordered by slot).
  std::uint32_t slot = 0;
  for (const LeaseInfo& held : live) {
    if (held.slot == slot) {
      ++slot;
    } else if (held.slot > slot) {
      break;
    }
  }
  std::int64_t fencing_token = 0;
  {
    StatementRun bump(connection, kBumpFence, "try-acquire");
    bump.Bind(1, request.key);
    LH_ASSIGN_OR_RETURN(bool row, bump.Next());
    if (!row) {
      return Status::Internal(
          fmt::format("sqlite database {}: try-acquire of {}: the fencing counter returned no "
                      "row",
                      path_, request.key));
    }
    fencing_token = bump.Int(0);
    LH_RETURN_IF_ERROR(bump.Finish());
  }
  {
    StatementRun put(connection, kPutGrant, "try-acquire");
    put.Bind(1, request.key);
    put.Bind(2, static_cast<std::int64_t>(slot));
    put.Bind(3, request.owner_token);
    put.Bind(4, request.holder);
    put.Bind(5, fencing_token);
    put.Bind(6, boot_id_);
    put.Bind(7, request.ttl.count());
    put.Bind(8, SaturatingAdd(now_ns, request.ttl.count()));
    put.Bind(9, ModeText(request.mode));
    put.Bind(10, static_cast<std::int64_t>(request.limit));
    put.Bind(11, anchor_->offset());
    LH_RETURN_IF_ERROR(put.Finish());
  }
  {
    // The waiter's own intent is done with; a dead one of anybody's is tidied.
    StatementRun clear(connection, kClearIntent, "try-acquire");
    clear.Bind(1, request.key);
    clear.Bind(2, request.waiter_id);
    clear.Bind(3, boot_id_);
    clear.Bind(4, now_ns);
    LH_RETURN_IF_ERROR(clear.Finish());
    if (sqlite3_changes(connection.db()) > 0) {
      // Waiters on a free key that the intent held off sleep until its expiry (WaitForKey):
      // wake them, so that they wait for this grant's end instead.
      transaction.NotifyOnCommit(request.key);
    }
  }
  LH_RETURN_IF_ERROR(transaction.Commit("try-acquire"));
  return Grant{
      .fencing_token = static_cast<FencingToken>(fencing_token), .ttl = request.ttl, .slot = slot};
}

std::vector<Status> SqliteBackend::RenewMany(std::span<const RenewRequest> requests) {
  std::vector<Status> results;
  if (requests.empty()) {
    return results;
  }
  MutexLock lock(&mu_);
  WriteTransaction transaction(*connection_);
  if (Status begun = transaction.Begin("renew"); !begun.ok()) {
    return std::vector<Status>(requests.size(), begun);
  }
  // After the write lock, as in TryAcquire: expiry counts from no earlier than t_send.
  const std::int64_t now_ns = NowNs();
  results.reserve(requests.size());
  for (const RenewRequest& request : requests) {
    results.push_back(RenewLocked(request, now_ns));
  }
  if (Status committed = transaction.Commit("renew"); !committed.ok()) {
    return std::vector<Status>(requests.size(), committed);
  }
  return results;
}

Status SqliteBackend::RenewLocked(const RenewRequest& request, std::int64_t now_ns) {
  LH_RETURN_IF_ERROR(CheckTtl(request.key, request.ttl));
  SqliteConnection& connection = *connection_;
  {
    StatementRun renew(connection, kRenewGrant, "renew");
    renew.Bind(1, request.key);
    renew.Bind(2, request.owner_token);
    renew.Bind(3, request.ttl.count());
    renew.Bind(4, now_ns);
    renew.Bind(5, SaturatingAdd(now_ns, request.ttl.count()));
    renew.Bind(6, boot_id_);
    LH_RETURN_IF_ERROR(renew.Finish());
    if (sqlite3_changes(connection.db()) == 1) {
      return Status::Ok();
    }
  }
  return LostStatusLocked(request.key, request.owner_token, now_ns);
}

// NOLINTNEXTLINE(bugprone-easily-swappable-parameters): the order of Backend::Release.
Status SqliteBackend::LostStatusLocked(std::string_view key, std::string_view owner_token,
                                       std::int64_t now_ns) {
  StatementRun any(*connection_, kSelectAnyGrant, "check the grant");
  any.Bind(1, key);
  any.Bind(2, owner_token);
  Result<bool> row = any.Next();
  if (!row.ok()) {
    // The grant is known not to be live and ours; only the reason is unknown.
    return Status(StatusCode::kLost, fmt::format("lease {} was lost", key),
                  std::string(row.status().message()));
  }
  if (!*row) {
    return Status::Lost(fmt::format(
        "lease {} was lost: its grant no longer exists (released by force, or expired and was "
        "taken over since)",
        key));
  }
  if (any.Text(0) != owner_token) {
    // No row of ours (rows of ours sort first). Another owner's exclusive grant in slot 0 took
    // the key after ours (which was in slot 0 too, or ended with every other grant of the key
    // before it could be taken exclusively). A shared or semaphore grant of another owner says
    // nothing about ours, which may have been in another slot.
    if (any.Int(3) == 0 && ModeFromText(any.Text(4)) == LeaseMode::kExclusive && any.Int(5) == 1) {
      return Status::Lost(fmt::format("lease {} was lost: taken over by another owner", key),
                          LostCause::kStolen);
    }
    return Status::Lost(fmt::format(
        "lease {} was lost: its grant no longer exists (released by force, or expired and its "
        "slot was taken since)",
        key));
  }
  if (any.Text(1) != boot_id_) {
    return Status::Lost(
        fmt::format("lease {} was lost: expired (the host rebooted since it was granted)", key));
  }
  return Status::Lost(
      fmt::format("lease {} was lost: expired {} ago", key, HumanDuration(now_ns - any.Int(2))));
}

Status SqliteBackend::Delete(std::string_view key, std::string_view owner_token) {
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  // Not durable: a release lost in a power cut is a grant of the old boot, expired anyway.
  // This saves one fsync on every handoff (WriteTransaction::Begin).
  LH_RETURN_IF_ERROR(transaction.Begin("release", /*durable=*/false));
  transaction.NotifyOnCommit(key);
  const std::int64_t now_ns = NowNs();
  // The rows of this token: the live grant, if any, and dead ones of earlier grants under it
  // (an attempt of Store::Acquire whose reply was lost). Whether one of them was live decides.
  bool found = false;
  bool live = false;
  std::optional<std::int64_t> expired_ns;  // the latest expiry of this boot's dead rows
  {
    StatementRun erase(connection, kDeleteOwnGrant, "release");
    erase.Bind(1, key);
    erase.Bind(2, owner_token);
    while (true) {
      LH_ASSIGN_OR_RETURN(bool row, erase.Next());
      if (!row) {
        break;
      }
      found = true;
      const std::int64_t expires_ns = erase.Int(1);
      if (erase.Text(0) != boot_id_) {
        continue;
      }
      if (expires_ns > now_ns) {
        live = true;
      } else {
        expired_ns = std::max(expired_ns.value_or(expires_ns), expires_ns);
      }
    }
  }
  Status result;
  if (!found) {
    // Absent, or someone else's: nothing was deleted.
    result = LostStatusLocked(key, owner_token, now_ns);
  } else if (!live && !expired_ns.has_value()) {
    result = Status::Lost(fmt::format(
        "lease {} was lost before release: expired (the host rebooted since it was granted)", key));
  } else if (!live) {
    result = Status::Lost(fmt::format("lease {} was lost before release: expired {} ago", key,
                                      HumanDuration(now_ns - *expired_ns)));
  }
  // Commit even when lost: deleting our own expired row is harmless and tidies the table.
  LH_RETURN_IF_ERROR(transaction.Commit("release"));
  return result;
}

Status SqliteBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  if (request.keep == Duration::zero() && !request.record.has_value()) {
    return Delete(request.key, request.owner_token);
  }
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("finish"));
  // Deleted or kept, the grant's end has moved: waiters re-read it.
  transaction.NotifyOnCommit(request.key);
  const std::int64_t now_ns = NowNs();
  if (request.keep > Duration::zero()) {
    StatementRun keep(connection, kKeepGrant, "finish");
    keep.Bind(1, request.key);
    keep.Bind(2, request.owner_token);
    keep.Bind(3, now_ns);
    keep.Bind(4, SaturatingAdd(now_ns, request.keep.count()));
    keep.Bind(5, request.keep.count());
    keep.Bind(6, boot_id_);
    LH_RETURN_IF_ERROR(keep.Finish());
    if (sqlite3_changes(connection.db()) != 1) {
      return LostStatusLocked(request.key, request.owner_token, now_ns);  // rolls back
    }
  } else {
    // Only a live grant of ours may end with a record: dead ones (of this token) are deleted
    // without it.
    StatementRun erase(connection, kDeleteOwnGrant, "finish");
    erase.Bind(1, request.key);
    erase.Bind(2, request.owner_token);
    bool found = false;
    bool live = false;
    while (true) {
      LH_ASSIGN_OR_RETURN(bool row, erase.Next());
      if (!row) {
        break;
      }
      found = true;
      live = live || (erase.Text(0) == boot_id_ && erase.Int(1) > now_ns);
    }
    if (!found) {
      return LostStatusLocked(request.key, request.owner_token, now_ns);  // rolls back
    }
    if (!live) {
      Status lost = Status::Lost(
          fmt::format("lease {} was lost before release: expired (nothing recorded)", request.key));
      LH_RETURN_IF_ERROR(transaction.Commit("finish"));
      return lost;
    }
  }
  if (request.record.has_value()) {
    StatementRun put(connection, kPutRecord, "finish");
    put.Bind(1, request.key);
    put.BindBlob(2, *request.record);
    put.Bind(3, SaturatingAdd(WallNowNs(), request.record_ttl.count()));
    LH_RETURN_IF_ERROR(put.Finish());
  }
  LH_RETURN_IF_ERROR(transaction.Commit("finish"));
  return Status::Ok();
}

Result<std::vector<LeaseInfo>> SqliteBackend::Holders(std::string_view key) {
  MutexLock lock(&mu_);
  const std::int64_t now_ns = NowNs();
  StatementRun live(*connection_, kSelectHolders, "holders");
  live.Bind(1, key);
  live.Bind(2, boot_id_);
  live.Bind(3, now_ns);
  std::vector<LeaseInfo> infos;
  while (true) {
    LH_ASSIGN_OR_RETURN(bool row, live.Next());
    if (!row) {
      break;
    }
    infos.push_back(LeaseInfoFromRow(live, now_ns));
    infos.back().holder_gone = live.Int(9) == 0;
  }
  LH_ASSIGN_OR_RETURN(std::optional<LiveIntent> intent,
                      ReadLiveIntent(*connection_, key, boot_id_, now_ns, "holders"));
  if (intent.has_value()) {
    infos.push_back(std::move(intent->info));
  }
  return infos;
}

Result<std::vector<LeaseInfo>> SqliteBackend::List(std::string_view prefix) {
  MutexLock lock(&mu_);
  const std::int64_t now_ns = NowNs();
  const std::optional<std::string> upper = PrefixUpperBound(prefix);
  StatementRun live(*connection_, kListLiveGrants, "list");
  live.Bind(1, boot_id_);
  live.Bind(2, now_ns);
  live.Bind(3, prefix);
  if (upper.has_value()) {
    live.Bind(4, *upper);
  } else {
    live.BindNull(4);
  }
  std::vector<LeaseInfo> infos;
  while (true) {
    LH_ASSIGN_OR_RETURN(bool row, live.Next());
    if (!row) {
      return infos;
    }
    infos.push_back(LeaseInfoFromRow(live, now_ns));
  }
}

Result<bool> SqliteBackend::ForceEnd(std::string_view key, std::string_view token_prefix) {
  return token_prefix.empty() ? ForceReleaseAll(key) : ForceReleaseOne(key, token_prefix);
}

Result<bool> SqliteBackend::ForceReleaseAll(std::string_view key) {
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("force-release", /*durable=*/false));
  transaction.NotifyOnCommit(key);
  const std::int64_t now_ns = NowNs();
  bool was_live = false;
  {
    StatementRun erase(connection, kDeleteAnyGrant, "force-release");
    erase.Bind(1, key);
    while (true) {
      LH_ASSIGN_OR_RETURN(bool row, erase.Next());
      if (!row) {
        break;
      }
      was_live = was_live || (erase.Text(0) == boot_id_ && erase.Int(1) > now_ns);
    }
  }
  LH_RETURN_IF_ERROR(transaction.Commit("force-release"));
  return was_live;
}

Result<bool> SqliteBackend::ForceReleaseOne(std::string_view key, std::string_view token_prefix) {
  if (token_prefix.empty()) {
    return Status::InvalidArgument("force-release of one grant: the token prefix is empty");
  }
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("force-release", /*durable=*/false));
  transaction.NotifyOnCommit(key);
  const std::int64_t now_ns = NowNs();
  bool deleted = false;
  {
    StatementRun erase(connection, kDeleteGrantByPrefix, "force-release");
    erase.Bind(1, key);
    erase.Bind(2, token_prefix);
    erase.Bind(3, boot_id_);
    erase.Bind(4, now_ns);
    LH_ASSIGN_OR_RETURN(deleted, erase.Next());
    LH_RETURN_IF_ERROR(erase.Finish());
  }
  LH_RETURN_IF_ERROR(transaction.Commit("force-release"));
  return deleted;
}

}  // namespace leasehold::internal
