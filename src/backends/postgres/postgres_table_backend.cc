// File: backends/postgres/postgres_table_backend.cc (internal)
//
// PostgresTableBackend: mode=table (see postgres_table_backend.h).
//
// Invariants:
// - Every operation is one statement on a pooled connection (postgres_sql.h); a connection is
//   borrowed by one thread at a time and dropped when broken.
// - Expiry is judged only by the server's clock (clock_timestamp() in the statements).
// - A waiter subscribes (the shared LISTEN connection is up and counts it) before it reads the
//   holder's remaining time: a release between the two is either seen by the read (the key is
//   free: return at once) or delivered as a NOTIFY afterwards.
// - Local time (statement deadlines, waits, the listener's reconnect pace) is read only from
//   clock_.

#include "backends/postgres/postgres_table_backend.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "backends/common/time.h"
#include "backends/postgres/postgres_common.h"
#include "backends/postgres/postgres_sql.h"
#include "core/logging.h"
#include "util/hex.h"

namespace leasehold::internal {

namespace sql = postgres_sql;

namespace {

using std::chrono::milliseconds;

// While the LISTEN connection is down, waiters re-check this often.
constexpr Duration kFallbackPoll = milliseconds(100);
// Waiters woken by a grant's expiry spread out over up to this much.
constexpr Duration kMaxExpiryJitter = milliseconds(20);
// The listener's reconnect backoff (ReconnectBackoff: full jitter up to a doubling ceiling).
constexpr Duration kListenRetryBase = milliseconds(50);
constexpr Duration kListenRetryCap = milliseconds(2000);
// Idle connections kept for reuse in table mode.
constexpr std::size_t kMaxIdleConnections = 4;

// left(token, 8) of the marker of a key with shared grants (LH_PG_SHARED_MARKER).
constexpr std::string_view kSharedMarkerPrefix = "(shared)";

// `text` with each name of `fills` replaced by its value, in one pass (a value is never scanned
// again, so a literal that contains "{holder}" stays as it is).
std::string FillTemplate(std::string_view text,
                         std::initializer_list<std::pair<std::string_view, std::string>> fills) {
  std::string out;
  out.reserve(text.size() + 256);
  std::size_t at = 0;
  while (at < text.size()) {
    bool filled = false;
    if (text[at] == '{') {
      for (const auto& [name, value] : fills) {
        if (text.substr(at, name.size()) == name) {
          out += value;
          at += name.size();
          filled = true;
          break;
        }
      }
    }
    if (!filled) {
      out += text[at++];
    }
  }
  return out;
}

// A connection, whether a pooler sits between it and the server, and the server it reached.
struct Probed {
  std::unique_ptr<PgConnection> conn;
  bool pooled = false;
  PgServerIdentity server;
};

// Opens a connection and reads kServerIdentity on it.
Result<Probed> ConnectAndProbe(const PostgresOptions& options, Clock& clock) {
  LH_ASSIGN_OR_RETURN(std::unique_ptr<PgConnection> conn, PgConnection::Connect(options, clock));
  LH_ASSIGN_OR_RETURN(PgResult r, conn->Exec("server identity", std::string(sql::kServerIdentity),
                                             {}, PgDeadline(options, clock)));
  const bool pooled = r.GetInt(0, 0) != conn->startup_pid();
  return Probed{.conn = std::move(conn), .pooled = pooled, .server = PgIdentityOf(r)};
}

}  // namespace

// Idle connections for statements. Thread-safe.
struct PostgresTableBackend::Pool {
  Pool(const PostgresOptions& o, Clock& c, bool direct) : options(o), clock(c), prepare(direct) {}

  Result<std::unique_ptr<PgConnection>> Borrow(bool* reused) {
    *reused = false;
    {
      MutexLock lock(&mu);
      if (!idle.empty()) {
        *reused = true;
        std::unique_ptr<PgConnection> conn = std::move(idle.back());
        idle.pop_back();
        return conn;
      }
    }
    return Connect();
  }

  // A new connection, set up as the pool's own, once `check` accepts the server it reached.
  Result<std::unique_ptr<PgConnection>> Connect() {
    LH_ASSIGN_OR_RETURN(std::unique_ptr<PgConnection> conn, PgConnection::Connect(options, clock));
    if (check) {
      LH_RETURN_IF_ERROR(check(*conn));
    }
    if (prepare) {
      conn->PrepareStatements();
    }
    return conn;
  }

  void Return(std::unique_ptr<PgConnection> conn) {
    if (conn == nullptr || conn->broken() || conn->busy()) {
      return;
    }
    MutexLock lock(&mu);
    if (idle.size() < kMaxIdleConnections) {
      idle.push_back(std::move(conn));
    }
  }

  const PostgresOptions options;
  Clock& clock;
  // Connected straight to the server (no transaction-pooling proxy, where a prepared statement
  // would not stay ours): statements are prepared once per connection.
  const bool prepare;
  // Set once by Open before the pool is shared: the backend's CheckServer.
  std::function<Status(PgConnection&)> check;
  Mutex mu;
  std::vector<std::unique_ptr<PgConnection>> idle LH_GUARDED_BY(mu);
};

// The shared LISTEN connection: a std::jthread that (re)connects, LISTENs on the schema's
// channel and counts NOTIFYs per watched key. Its waits are on `clock` (ToSteady). Thread-safe.
class PostgresTableBackend::Listener {
 public:
  Listener(const PostgresOptions& options, Clock& clock) : options_(options), clock_(clock) {
    thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
  }

  ~Listener() {
    thread_.request_stop();
    thread_.join();
  }

  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  Listener(Listener&&) = delete;
  Listener& operator=(Listener&&) = delete;

  // Registers interest in `key`; returns its generation and whether LISTEN is active now.
  std::pair<std::uint64_t, bool> Watch(const std::string& key) {
    MutexLock lock(&mu_);
    Entry& e = keys_[key];
    ++e.watchers;
    return {e.generation, listening_};
  }

  void Unwatch(const std::string& key) {
    MutexLock lock(&mu_);
    auto it = keys_.find(key);
    if (it != keys_.end() && --it->second.watchers == 0) {
      keys_.erase(it);
    }
  }

  // Waits until `key`'s generation moves past `seen`, `until` or `stop`; while not listening,
  // returns after kFallbackPoll. Returns true if woken by a notification.
  bool Wait(const std::string& key, std::uint64_t seen, SteadyTime until, std::stop_token stop) {
    MutexLock lock(&mu_);
    if (!listening_) {
      until = std::min(until, clock_.Now() + kFallbackPoll);
    }
    return cv_.WaitUntil(ToSteady(until, clock_), std::move(stop), [&]() LH_REQUIRES(mu_) {
      auto it = keys_.find(key);
      return it == keys_.end() || it->second.generation != seen;
    });
  }

  // Waits up to `timeout` for LISTEN to be active (the first waiter gives it a moment).
  void AwaitListening(Duration timeout) {
    MutexLock lock(&mu_);
    cv_.WaitUntil(ToSteady(clock_.Now() + timeout, clock_), {},
                  [&]() LH_REQUIRES(mu_) { return listening_; });
  }

 private:
  struct Entry {
    std::uint64_t generation = 0;
    int watchers = 0;
  };

  void Run(std::stop_token stop) {
    ReconnectBackoff backoff(clock_, kListenRetryBase, kListenRetryCap);
    const std::string listen = PgStatement(sql::kListen, options_);
    while (!stop.stop_requested()) {
      Result<std::unique_ptr<PgConnection>> conn = PgConnection::Connect(options_, clock_);
      Status s = conn.ok() ? conn.value()
                                 ->Exec("LISTEN", listen, {}, PgDeadline(options_, clock_), stop)
                                 .status()
                           : conn.status();
      if (!s.ok()) {
        Log(LogLevel::kInfo,
            fmt::format("postgres LISTEN connection down, retrying: {}", s.ToString()));
        backoff.Failed();
        (void)clock_.SleepUntil(backoff.retry_at(), stop);
        continue;
      }
      backoff.Succeeded();
      SetListening(true);
      while (!stop.stop_requested()) {
        Result<std::vector<std::string>> keys = conn.value()->ReadNotifications(
            options_.schema, clock_.Now() + std::chrono::seconds(1), stop);
        if (!keys.ok()) {
          break;
        }
        if (!keys->empty()) {
          MutexLock lock(&mu_);
          for (const std::string& key : *keys) {
            if (auto it = keys_.find(key); it != keys_.end()) {
              ++it->second.generation;
            }
          }
          cv_.NotifyAll();
        }
      }
      SetListening(false);
    }
  }

  void SetListening(bool on) {
    MutexLock lock(&mu_);
    listening_ = on;
    // Notifications may have been missed while down: wake everyone to re-check.
    for (auto& [key, entry] : keys_) {
      ++entry.generation;
    }
    cv_.NotifyAll();
  }

  const PostgresOptions& options_;
  Clock& clock_;
  Mutex mu_;
  CondVar cv_{&mu_};
  std::map<std::string, Entry, std::less<>> keys_ LH_GUARDED_BY(mu_);
  bool listening_ LH_GUARDED_BY(mu_) = false;
  std::jthread thread_;
};

Result<std::shared_ptr<PostgresTableBackend>> PostgresTableBackend::Open(PostgresOptions options,
                                                                         Clock& clock) {
  LH_ASSIGN_OR_RETURN(Probed probed, ConnectAndProbe(options, clock));
  LH_RETURN_IF_ERROR(EnsureSchema(*probed.conn, options, clock));
  LH_ASSIGN_OR_RETURN(const bool shares_ready, PgSharesReady(*probed.conn, options, clock));
  auto pool = std::make_unique<Pool>(options, clock, /*direct=*/!probed.pooled);
  if (!probed.pooled) {
    probed.conn->PrepareStatements();
  }
  std::shared_ptr<PostgresTableBackend> backend(new PostgresTableBackend(
      std::move(options), clock, std::move(pool), probed.pooled, shares_ready));
  bool failover = false;
  LH_RETURN_IF_ERROR(
      backend->history_.ObserveServer(backend->options_.display, probed.server, &failover));
  backend->pool_->check = [b = backend.get()](PgConnection& conn) { return b->CheckServer(conn); };
  backend->pool_->Return(std::move(probed.conn));
  return backend;
}

Status PostgresTableBackend::CheckServer(PgConnection& conn) {
  LH_ASSIGN_OR_RETURN(PgResult r, conn.Exec("server identity", std::string(sql::kServerIdentity),
                                            {}, PgDeadline(options_, clock_)));
  bool failover = false;
  LH_RETURN_IF_ERROR(history_.ObserveServer(options_.display, PgIdentityOf(r), &failover));
  if (failover) {
    CountStoreFailover();
  }
  return Status();
}

PostgresTableBackend::PostgresTableBackend(PostgresOptions options, Clock& clock,
                                           std::unique_ptr<Pool> pool, bool pooled,
                                           bool shares_ready)
    : options_(std::move(options)),
      clock_(clock),
      pool_(std::move(pool)),
      pooled_(pooled),
      shares_ready_(shares_ready) {}

std::string PostgresTableBackend::Sql(std::string_view shared, std::string_view legacy) const {
  return PgStatement(shares_ready_ ? shared : legacy, options_);
}

PostgresTableBackend::~PostgresTableBackend() {
  {
    MutexLock lock(&listener_mu_);
    listener_.reset();
  }
  // A last try for grants this handle may hold (each bounded by command_timeout).
  (void)unsure_.Flush(
      [this](std::string_view key, std::string_view token) { return Release(key, token); });
}

Capabilities PostgresTableBackend::capabilities() const {
  return Capabilities{.notifies_holder = !pooled_,
                      .fencing_survives_restart = true,
                      .fair_queue = false,
                      .shared_leases = true};
}

unsigned PostgresTableBackend::fenced_ops() const {
  return FencedOpBit(FencedOp::Kind::kSql);
}

Result<PgResult> PostgresTableBackend::Run(std::string_view what, const std::string& statement,
                                           const PgParams& params, bool retry) {
  bool reused = false;
  LH_ASSIGN_OR_RETURN(std::unique_ptr<PgConnection> conn, pool_->Borrow(&reused));
  Result<PgResult> r = conn->Exec(what, statement, params, PgDeadline(options_, clock_));
  if (!r.ok() && conn->broken() && reused && retry) {
    // An idle connection from the pool may have been closed by the server meanwhile (restart,
    // idle timeout): one more try on a fresh connection.
    LH_ASSIGN_OR_RETURN(conn, pool_->Connect());
    r = conn->Exec(what, statement, params, PgDeadline(options_, clock_));
  }
  pool_->Return(std::move(conn));
  return r;
}

Result<Grant> PostgresTableBackend::TryAcquire(const GrantRequest& request) {
  const PgUnsureGrants::Release release = [this](std::string_view key, std::string_view token) {
    return Release(key, token);
  };
  Result<Grant> granted = unsure_.Acquire<Grant>(
      request.key, request.owner_token, [&] { return AcquireOnce(request); }, release);
  bool failover = false;
  granted =
      PgCheckGrant(history_, options_.display, request, std::move(granted), release, &failover);
  if (failover) {
    CountStoreFailover();
  }
  return granted;
}

Result<Grant> PostgresTableBackend::AcquireOnce(const GrantRequest& request) {
  const bool plain = request.mode == LeaseMode::kExclusive && request.limit == 1;
  if (!plain && !shares_ready_) {
    return PgSharesMissing(options_);
  }
  if (!plain || (shares_ready_ && !request.waiter_id.empty())) {
    return AcquireShared(request);
  }
  LH_ASSIGN_OR_RETURN(PgResult r, Run("acquire", PgStatement(sql::kTableAcquire, options_),
                                      {request.key, request.owner_token, request.holder,
                                       std::to_string(CeilMillis(request.ttl))}));
  if (r.rows() >= 1 && r.GetBool(0, 0)) {
    return Grant{.fencing_token = static_cast<FencingToken>(r.GetInt(0, 1)), .ttl = request.ttl};
  }
  if (r.rows() == 0) {
    return PgHeld(request.key, std::nullopt);
  }
  if (shares_ready_ && r.Get(0, 3) == kSharedMarkerPrefix) {
    // The key is marked as shared: only the transaction that reads `shares` may decide.
    return AcquireShared(request);
  }
  return PgHeld(request.key, PgRefusedBy(request.key, r));
}

Result<Grant> PostgresTableBackend::AcquireShared(const GrantRequest& request) {
  if (request.holder.find('\0') != std::string::npos) {
    return Status::InvalidArgument("the holder contains a NUL byte, which text cannot hold");
  }
  const std::string ttl_ms = std::to_string(CeilMillis(request.ttl));
  const std::string statement =
      FillTemplate(PgStatement(sql::kTableAcquireShared, options_),
                   {{"{key}", PgLiteral(request.key)},
                    {"{token}", PgLiteral(request.owner_token)},
                    {"{holder}", PgLiteral(request.holder)},
                    {"{waiter}", request.waiter_id.empty() ? PgLiteral(std::nullopt)
                                                           : PgLiteral(request.waiter_id)},
                    {"{ttl_ms}", ttl_ms},
                    {"{limit}", std::to_string(request.limit)},
                    {"{mode}", request.mode == LeaseMode::kShared ? "'s'" : "'x'"}});
  LH_ASSIGN_OR_RETURN(PgResult r, Run("acquire", statement, {}));
  if (r.rows() != 1) {
    return Status::Internal(
        fmt::format("unexpected reply from postgres: the acquire of {} returned {} rows",
                    request.key, r.rows()));
  }
  const std::string_view outcome = r.Get(0, 0);
  if (outcome == "granted") {
    return Grant{.fencing_token = static_cast<FencingToken>(r.GetInt(0, 1)),
                 .ttl = request.ttl,
                 .slot = static_cast<std::uint32_t>(r.GetInt(0, 2))};
  }
  LeaseInfo holder;
  holder.key = request.key;
  holder.holder = std::string(r.Get(0, 3));
  holder.token_prefix = std::string(r.Get(0, 4));
  TakeKeptMark(holder);
  holder.fencing_token = static_cast<FencingToken>(r.GetInt(0, 5));
  holder.ttl = StoreMillis(r.GetInt(0, 6));
  holder.remaining = StoreMillis(r.GetInt(0, 7));
  holder.mode = r.Get(0, 8) == "s" ? LeaseMode::kShared : LeaseMode::kExclusive;
  holder.limit = static_cast<std::uint32_t>(std::max(1LL, r.GetInt(0, 9)));
  holder.slot = static_cast<std::uint32_t>(std::max(0LL, r.GetInt(0, 10)));
  // A shared request refused by a waiting writer's intent: the writer, with no token (a grant
  // always has one) and fence 0 (kTableAcquireShared).
  holder.waiting_writer = outcome == "held" && !r.IsNull(0, 3) && holder.token_prefix.empty();
  if (outcome == "mismatch") {
    return LimitMismatch(request.key, holder.mode, holder.limit, holder.holder, request.mode,
                         request.limit);
  }
  if (r.IsNull(0, 3) && r.IsNull(0, 6)) {
    return PgHeld(request.key, std::nullopt);
  }
  return PgHeld(request.key, std::move(holder));
}

std::vector<Status> PostgresTableBackend::RenewMany(std::span<const RenewRequest> requests) {
  std::vector<std::string> keys;
  std::vector<std::string> tokens;
  std::vector<std::string> ttls;
  for (const RenewRequest& r : requests) {
    keys.push_back(r.key);
    tokens.push_back(r.owner_token);
    ttls.push_back(std::to_string(CeilMillis(r.ttl)));
  }
  const SteadyTime t_send = clock_.Now();
  Result<PgResult> r = Run("renew", Sql(sql::kTableRenewManyShared, sql::kTableRenewMany),
                           {PgArrayLiteral(keys), PgArrayLiteral(tokens), PgArrayLiteral(ttls)});
  if (!r.ok()) {
    return std::vector<Status>(requests.size(), r.status());
  }
  const SteadyTime t_recv = clock_.Now();
  // One lookup per request (a scan of the rows per request cost 40 % of a core at 10,000
  // leases: leasehold-bench).
  std::unordered_set<std::string> renewed_rows;
  renewed_rows.reserve(static_cast<std::size_t>(r->rows()));
  for (int i = 0; i < r->rows(); ++i) {
    if (!r->IsNull(i, 0)) {
      renewed_rows.insert(fmt::format("{}\n{}", r->Get(i, 0), r->Get(i, 1)));
      continue;
    }
    // The server's clock (kTableRenewMany's last row).
    std::int64_t us = 0;
    const std::string_view text = r->Get(i, 2);
    if (auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), us);
        ec == std::errc() && end == text.data() + text.size()) {
      ObserveStoreTime({t_send, t_recv, us});
    }
  }
  std::vector<Status> results;
  results.reserve(requests.size());
  for (const RenewRequest& request : requests) {
    const bool renewed =
        renewed_rows.contains(fmt::format("{}\n{}", request.key, request.owner_token));
    results.push_back(
        renewed ? Status()
                : Status::Lost(fmt::format("{} is no longer held by this owner (expired, released "
                                           "or force-released)",
                                           request.key)));
  }
  return results;
}

Status PostgresTableBackend::Delete(std::string_view key, std::string_view owner_token) {
  LH_ASSIGN_OR_RETURN(PgResult r, Run("release", Sql(sql::kTableReleaseShared, sql::kTableRelease),
                                      {std::string(key), std::string(owner_token)}));
  if (r.rows() == 0) {
    return Status::Lost(
        fmt::format("{} was not held by this owner (lost or stolen): nothing released", key));
  }
  return Status();
}

Status PostgresTableBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  const bool write_record = request.record.has_value();
  if (request.keep == Duration::zero() && !write_record) {
    return Delete(request.key, request.owner_token);
  }
  Result<PgResult> r =
      Run("finish",
          PgFinishStatement(shares_ready_ ? sql::kTableFinishShared : sql::kTableFinish,
                            write_record, options_),
          {request.key, request.owner_token,
           request.keep > Duration::zero() ? std::to_string(CeilMillis(request.keep))
                                           : std::string("0"),
           write_record ? std::optional<std::string>(HexEncode(*request.record)) : std::nullopt,
           std::to_string(write_record ? CeilMillis(request.record_ttl) : 0)});
  if (!r.ok()) {
    return PgRecordsStatus(r.status(), options_);
  }
  if (r->rows() == 0) {
    return Status::Lost(
        fmt::format("{} was not held by this owner (lost or stolen): nothing released or written",
                    request.key));
  }
  return Status();
}

Result<std::optional<std::string>> PostgresTableBackend::ReadRecord(std::string_view key) {
  Result<PgResult> r =
      Run("read record", PgStatement(sql::kReadRecord, options_), {std::string(key)});
  if (!r.ok()) {
    return PgRecordsStatus(r.status(), options_);
  }
  return PgRecord(key, *r);
}

Result<std::vector<std::pair<std::string, std::string>>> PostgresTableBackend::ListRecords(
    std::string_view prefix) {
  Result<PgResult> r =
      Run("list records", PgStatement(sql::kListRecords, options_), {std::string(prefix)});
  if (!r.ok()) {
    return PgRecordsStatus(r.status(), options_);
  }
  return PgRecords(*r);
}

Result<StoreTime> PostgresTableBackend::WallClock() {
  LH_ASSIGN_OR_RETURN(PgResult r, Run("clock", std::string(sql::kWallClock), {}));
  return PgStoreTime(r);
}

Status PostgresTableBackend::Ping() {
  return Run("ping", std::string(sql::kPing), {}, /*retry=*/false).status();
}

Result<Diagnosis> PostgresTableBackend::Diagnose() {
  bool reused = false;
  LH_ASSIGN_OR_RETURN(std::unique_ptr<PgConnection> conn, pool_->Borrow(&reused));
  Result<Diagnosis> d = PgDiagnose(*conn, options_, clock_);
  pool_->Return(std::move(conn));  // a broken one is dropped
  return d;
}

Result<std::vector<LeaseInfo>> PostgresTableBackend::Holders(std::string_view key) {
  if (!shares_ready_) {
    // A table made before shared leases: one grant per key.
    LH_ASSIGN_OR_RETURN(
        PgResult r, Run("inspect", PgStatement(sql::kTableInspect, options_), {std::string(key)}));
    std::vector<LeaseInfo> one;
    if (r.rows() > 0) {
      one.push_back(PgLeaseInfo(r, 0));
    }
    return one;
  }
  LH_ASSIGN_OR_RETURN(
      PgResult r, Run("holders", PgStatement(sql::kTableHolders, options_), {std::string(key)}));
  std::vector<LeaseInfo> out;
  for (int i = 0; i < r.rows(); ++i) {
    out.push_back(PgGrantInfo(r, i));
  }
  return out;
}

Result<std::vector<LeaseInfo>> PostgresTableBackend::List(std::string_view prefix) {
  LH_ASSIGN_OR_RETURN(
      PgResult r, Run("list", Sql(sql::kTableListShared, sql::kTableList), {std::string(prefix)}));
  std::vector<LeaseInfo> out;
  for (int i = 0; i < r.rows(); ++i) {
    out.push_back(shares_ready_ ? PgGrantInfo(r, i) : PgLeaseInfo(r, i));
  }
  return out;
}

Result<bool> PostgresTableBackend::ForceEnd(std::string_view key, std::string_view token_prefix) {
  return token_prefix.empty() ? ForceReleaseAll(key) : ForceReleaseOne(key, token_prefix);
}

Result<bool> PostgresTableBackend::ForceReleaseAll(std::string_view key) {
  if (shares_ready_) {
    LH_ASSIGN_OR_RETURN(PgResult r,
                        Run("force-release", PgStatement(sql::kTableForceReleaseShared, options_),
                            {std::string(key), std::nullopt}));
    return r.rows() > 0;
  }
  LH_ASSIGN_OR_RETURN(
      PgResult r,
      Run("force-release", PgStatement(sql::kTableForceRelease, options_), {std::string(key)}));
  return r.rows() > 0;
}

Result<bool> PostgresTableBackend::ForceReleaseOne(std::string_view key,
                                                   std::string_view token_prefix) {
  if (!shares_ready_) {
    return Status::Unimplemented(fmt::format(
        "force-releasing one grant needs table {}.shares (run the SQL printed by `leasehold "
        "schema`); release --force of the whole key works",
        options_.schema));
  }
  if (token_prefix.empty()) {
    return Status::InvalidArgument("force-release of one grant needs a token prefix");
  }
  LH_ASSIGN_OR_RETURN(
      PgResult r, Run("force-release grant", PgStatement(sql::kTableForceReleaseShared, options_),
                      {std::string(key), std::string(token_prefix)}));
  return r.rows() > 0;
}

void PostgresTableBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  if (!shares_ready_ || waiter_id.empty()) {
    return;
  }
  Result<PgResult> r = Run("abandon wait", PgStatement(sql::kTableAbandonIntent, options_),
                           {std::string(key), std::string(waiter_id)});
  if (!r.ok()) {
    // Best effort: the intent expires by itself within its ttl.
    Log(LogLevel::kInfo, fmt::format("postgres: could not withdraw the writer intent on {}: {}",
                                     key, r.status().ToString()));
  }
}

Result<std::vector<std::int64_t>> PostgresTableBackend::FencedWrite(
    const FencedWriteRequest& request) {
  LH_RETURN_IF_ERROR(PgCheckFencedOps(request.ops));
  const std::string check = Sql(sql::kTableFencedCheckShared, sql::kTableFencedCheck);
  const PgParams check_params = {request.key, request.owner_token,
                                 std::to_string(request.fencing_token)};
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    LH_ASSIGN_OR_RETURN(std::unique_ptr<PgConnection> conn,
                        attempt == 0 ? pool_->Borrow(&reused) : pool_->Connect());
    PgConnection& c = *conn;
    // Names the grant that refuses us, read after the ROLLBACK on the same connection.
    auto refused = [&]() -> Status {
      Result<PgResult> r =
          c.Exec("fenced write holder", Sql(sql::kTableHolders, sql::kTableInspect), {request.key},
                 PgDeadline(options_, clock_));
      if (r.ok() && r->rows() > 0 &&
          static_cast<FencingToken>(r->GetInt(0, 3)) != request.fencing_token) {
        return FencedOut(
            request.key, request.fencing_token,
            fmt::format("is now held by {} under fencing token {}", r->Get(0, 1), r->GetInt(0, 3)));
      }
      return FencedOut(request.key, request.fencing_token,
                       "is no longer held: expired or released");
    };
    PgFencedOutcome outcome = PgFencedWrite(
        c, request, check, check_params, PgDeadline(options_, clock_), clock_, options_, refused);
    const bool retry = !outcome.result.ok() && c.broken() && reused && !outcome.commit_sent;
    pool_->Return(std::move(conn));
    if (retry && attempt == 0) {
      // An idle connection the server closed meanwhile, as in Run: nothing was committed on it
      // (COMMIT was never sent), so the write may run once more on a fresh one.
      continue;
    }
    return std::move(outcome.result);
  }
}

Status PostgresTableBackend::WaitForChange(std::string_view key, SteadyTime deadline,
                                           std::stop_token stop) {
  return Wait(key, "", deadline, std::move(stop));
}

Status PostgresTableBackend::WaitForTurn(std::string_view key, std::string_view waiter_id,
                                         SteadyTime deadline, std::stop_token stop) {
  return Wait(key, waiter_id, deadline, std::move(stop));
}

Status PostgresTableBackend::Wait(std::string_view key_view, std::string_view waiter_id,
                                  SteadyTime deadline, std::stop_token stop) {
  if (pooled_) {
    return Status::Unimplemented("LISTEN does not work through a transaction pooler; polling");
  }
  std::shared_ptr<Listener> listener;
  {
    MutexLock lock(&listener_mu_);
    if (listener_ == nullptr) {
      listener_ = std::make_shared<Listener>(options_, clock_);
    }
    listener = listener_;
  }
  const std::string key(key_view);
  auto [seen, listening] = listener->Watch(key);
  if (!listening) {
    listener->AwaitListening(milliseconds(500));
    std::tie(seen, listening) = listener->Watch(key);
    listener->Unwatch(key);
  }

  struct Unwatch {
    Listener& l;
    const std::string& k;

    ~Unwatch() { l.Unwatch(k); }
  } unwatch{*listener, key};

  // Subscribed: now read how long the current grant may last by itself.
  Result<PgResult> r =
      shares_ready_
          ? Run("wait", PgStatement(sql::kTableRemainingShared, options_),
                {key, waiter_id.empty() ? std::nullopt
                                        : std::optional<std::string>(std::string(waiter_id))})
          : Run("wait", PgStatement(sql::kTableRemaining, options_), {key});
  if (!r.ok()) {
    return r.status();
  }
  if (r->rows() == 0) {
    return Status();  // free already
  }
  SteadyTime until =
      std::min(deadline, clock_.Now() + milliseconds(r->GetInt(0, 0)) + Jitter(kMaxExpiryJitter));
  while (true) {
    if (listener->Wait(key, seen, until, stop)) {
      return Status();
    }
    if (stop.stop_requested()) {
      return Status::Cancelled(fmt::format("cancelled while waiting for {}", key));
    }
    SteadyTime now = clock_.Now();
    if (now >= deadline) {
      return Status::DeadlineExceeded(fmt::format("deadline while waiting for {}", key));
    }
    if (now >= until) {
      return Status();  // the holder's grant has expired by now, or LISTEN is down: re-check
    }
  }
}

}  // namespace leasehold::internal
