// File: backends/postgres/postgres_common.cc (internal)
//
// The helpers both postgres:// modes share (postgres_common.h).

#include "backends/postgres/postgres_common.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/common/sql_statement.h"
#include "backends/common/time.h"
#include "backends/postgres/postgres_sql.h"
#include "core/logging.h"
#include "util/hex.h"

namespace leasehold::internal {

namespace sql = postgres_sql;

namespace {

using std::chrono::milliseconds;

std::string QuoteLiteral(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    out += c;
    if (c == '\'') {
      out += '\'';
    }
  }
  return out + "'";
}

std::string ReplaceAll(std::string text, std::string_view from, std::string_view to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

Status NotHex(std::string_view key) {
  return Status::Internal(
      fmt::format("unexpected reply from postgres: the record of {} is not hex", key));
}

}  // namespace

std::string PgStatement(std::string_view text, const PostgresOptions& options) {
  std::string out(text);
  const std::string ident = "\"" + options.schema + "\"";
  out = ReplaceAll(std::move(out), "{schema_ident}", ident);
  out = ReplaceAll(std::move(out), "{schema}", ident);
  out = ReplaceAll(std::move(out), "{channel}", QuoteLiteral(options.schema));
  return out;
}

std::string PgFinishStatement(std::string_view finish, bool with_record,
                              const PostgresOptions& options) {
  return PgStatement(ReplaceAll(std::string(finish), "{recorded}",
                                with_record ? sql::kFinishRecorded : sql::kFinishNoRecord),
                     options);
}

std::string PgArrayLiteral(const std::vector<std::string>& items) {
  std::string out = "{";
  for (std::size_t i = 0; i < items.size(); ++i) {
    out += i == 0 ? "\"" : ",\"";
    for (char c : items[i]) {
      if (c == '"' || c == '\\') {
        out += '\\';
      }
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

SteadyTime PgDeadline(const PostgresOptions& options, Clock& clock) {
  return clock.Now() + options.command_timeout;
}

LeaseInfo PgLeaseInfo(const PgResult& r, int row) {
  LeaseInfo info;
  info.key = std::string(r.Get(row, 0));
  info.holder = std::string(r.Get(row, 1));
  info.token_prefix = std::string(r.Get(row, 2));
  info.fencing_token = static_cast<FencingToken>(r.GetInt(row, 3));
  info.ttl = StoreMillis(r.GetInt(row, 4));
  info.remaining = StoreMillis(r.GetInt(row, 5));
  return info;
}

LeaseInfo PgGrantInfo(const PgResult& r, int row) {
  LeaseInfo info = PgLeaseInfo(r, row);
  info.mode = r.Get(row, 6) == "s" ? LeaseMode::kShared : LeaseMode::kExclusive;
  info.limit = static_cast<std::uint32_t>(std::max(1LL, r.GetInt(row, 7)));
  info.slot = static_cast<std::uint32_t>(std::max(0LL, r.GetInt(row, 8)));
  return info;
}

std::string PgLiteral(std::optional<std::string_view> text) {
  if (!text.has_value()) {
    return "NULL";
  }
  std::string out = "E'";
  for (char c : *text) {
    if (c == '\'' || c == '\\') {
      out += c;
    }
    out += c;
  }
  return out + "'";
}

LeaseInfo PgRefusedBy(std::string_view key, const PgResult& r) {
  LeaseInfo info;
  info.key = std::string(key);
  info.fencing_token = static_cast<FencingToken>(r.GetInt(0, 1));
  info.holder = std::string(r.Get(0, 2));
  info.token_prefix = std::string(r.Get(0, 3));
  info.ttl = StoreMillis(r.GetInt(0, 4));
  info.remaining = StoreMillis(r.GetInt(0, 5));
  return info;
}

Status PgHeld(std::string_view key, std::optional<LeaseInfo> holder) {
  if (!holder) {
    return Status::HeldByAnother(fmt::format("{} is held by another session", key));
  }
  return Status::HeldByAnother(*holder);
}

std::string SchemaSql(const PostgresOptions& options) {
  return fmt::format(
      "-- leasehold schema for {}\n"
      "-- One row per lease key in `leases`; `fence` (the fencing counter) only ever grows.\n"
      "-- One row per key in `records`: the record a lease may leave when it ends (schedule\n"
      "-- slots). One row per live shared or semaphore grant in `shares` (key, slot), and a\n"
      "-- key's writer intent (slot -1). The role that leasehold connects as needs USAGE on the\n"
      "-- schema, SELECT, INSERT, UPDATE on `leases` and `records`, and SELECT, INSERT, UPDATE,\n"
      "-- DELETE on `shares` (without it, only exclusive leases work).\n{}\n{}\n{}\n{}\n",
      options.display, PgStatement(sql::kCreateSchema, options),
      PgStatement(sql::kCreateTable, options), PgStatement(sql::kCreateRecordsTable, options),
      PgStatement(sql::kCreateSharesTable, options));
}

Result<std::optional<std::string>> PgRecord(std::string_view key, const PgResult& r) {
  if (r.rows() == 0) {
    return std::optional<std::string>();
  }
  std::optional<std::string> value = HexDecode(r.Get(0, 0));
  if (!value.has_value()) {
    return NotHex(key);
  }
  return value;
}

Result<std::vector<std::pair<std::string, std::string>>> PgRecords(const PgResult& r) {
  std::vector<std::pair<std::string, std::string>> records;
  records.reserve(static_cast<std::size_t>(r.rows()));
  for (int i = 0; i < r.rows(); ++i) {
    std::optional<std::string> value = HexDecode(r.Get(i, 1));
    if (!value.has_value()) {
      return NotHex(r.Get(i, 0));
    }
    records.emplace_back(std::string(r.Get(i, 0)), std::move(*value));
  }
  return records;
}

StoreTime PgStoreTime(const PgResult& r) {
  return StoreTime{.time = SystemTime(std::chrono::duration_cast<SystemTime::duration>(
                       std::chrono::microseconds(r.GetInt(0, 0)))),
                   .from_store = true};
}

Status PgRecordsStatus(Status status, const PostgresOptions& options) {
  if (status.detail() != kSqlStateUndefinedTable) {
    return status;
  }
  return Status::PermissionDenied(
      fmt::format("table {}.records does not exist in the database of {} (a schema from before "
                  "records, and this role could not create the table): have someone with the "
                  "CREATE privilege run the SQL printed by `leasehold schema --store URL` ({})",
                  options.schema, options.display, status.message()),
      std::string(status.detail()));
}

Status EnsureSchema(PgConnection& conn, const PostgresOptions& options, Clock& clock) {
  const std::string table = "\"" + options.schema + "\".leases";
  const std::string records = "\"" + options.schema + "\".records";

  struct State {
    bool schema = false;
    bool leases = false;
    bool records = false;
  };

  auto state = [&]() -> Result<State> {
    LH_ASSIGN_OR_RETURN(PgResult r, conn.Exec("schema check", std::string(sql::kSchemaState),
                                              {"\"" + options.schema + "\"", table, records},
                                              PgDeadline(options, clock)));
    return State{r.GetBool(0, 0), r.GetBool(0, 1), r.GetBool(0, 2)};
  };
  LH_ASSIGN_OR_RETURN(State exists, state());
  if (exists.leases && exists.records) {
    return Status();
  }
  if (exists.leases) {
    // A schema from before records: leases work as before, so a role that may not add the table
    // still opens, and only what needs records (schedule slots) fails, naming the fix.
    auto cannot = [&](std::string_view why) {
      Log(LogLevel::kWarning,
          fmt::format("postgres at {}: table {}.records is missing and {}: leases work, but "
                      "ending one with a record (schedule slots, --once-per) fails until someone "
                      "with the CREATE privilege runs the SQL printed by `leasehold schema`",
                      options.display, options.schema, why));
      return Status();
    };
    if (!options.create_schema) {
      return cannot("create_schema=false forbids creating it");
    }
    Result<PgResult> created =
        conn.Exec("create table", PgStatement(sql::kCreateRecordsTable, options), {},
                  PgDeadline(options, clock));
    if (created.ok()) {
      Log(LogLevel::kInfo, fmt::format("postgres at {}: created {}", options.display, records));
      return Status();
    }
    LH_ASSIGN_OR_RETURN(exists, state());  // someone else may have created it meanwhile
    return exists.records
               ? Status()
               : cannot(fmt::format("cannot be created ({})", created.status().message()));
  }
  auto missing = [&](std::string_view why) {
    return fmt::format(
        "table {}.leases does not exist in the database of {} and {}: have someone with the "
        "CREATE privilege run the SQL printed by `leasehold schema --store URL`, or grant it",
        options.schema, options.display, why);
  };
  if (!options.create_schema) {
    return Status::InvalidArgument(missing("create_schema=false forbids creating it"));
  }
  std::string ddl = exists.schema ? "" : PgStatement(sql::kCreateSchema, options);
  ddl += PgStatement(sql::kCreateTable, options);
  ddl += PgStatement(sql::kCreateRecordsTable, options);
  ddl += PgStatement(sql::kCreateSharesTable, options);
  Result<PgResult> created = conn.Exec("create table", ddl, {}, PgDeadline(options, clock));
  if (created.ok()) {
    Log(LogLevel::kInfo, fmt::format("postgres at {}: created {}", options.display, table));
    return Status();
  }
  if (created.status().code() == StatusCode::kPermissionDenied) {
    return Status::PermissionDenied(
        missing(fmt::format("this role may not create it ({})", created.status().message())));
  }
  // Another process may have created it at the same moment (unique violation on the catalog).
  LH_ASSIGN_OR_RETURN(exists, state());
  return exists.leases && exists.records ? Status() : created.status();
}

Result<bool> PgSharesReady(PgConnection& conn, const PostgresOptions& options, Clock& clock) {
  const std::string shares = "\"" + options.schema + "\".shares";
  auto state = [&]() -> Result<std::pair<bool, bool>> {
    LH_ASSIGN_OR_RETURN(PgResult r, conn.Exec("shares check", std::string(sql::kSharesState),
                                              {shares}, PgDeadline(options, clock)));
    return std::make_pair(r.GetBool(0, 0), r.GetBool(0, 1));
  };
  LH_ASSIGN_OR_RETURN(auto exists, state());
  auto unusable = [&](std::string_view why) -> Result<bool> {
    Log(LogLevel::kWarning,
        fmt::format("postgres at {}: table {} {}: exclusive leases work, but shared and "
                    "semaphore leases fail until someone runs the SQL printed by `leasehold "
                    "schema` and grants SELECT, INSERT, UPDATE, DELETE on it",
                    options.display, shares, why));
    return false;
  };
  if (exists.first) {
    return exists.second ? Result<bool>(true)
                         : unusable("lacks SELECT, INSERT, UPDATE or DELETE for this role");
  }
  if (!options.create_schema) {
    return unusable("is missing and create_schema=false forbids creating it");
  }
  Result<PgResult> created =
      conn.Exec("create table", PgStatement(sql::kCreateSharesTable, options), {},
                PgDeadline(options, clock));
  if (created.ok()) {
    Log(LogLevel::kInfo, fmt::format("postgres at {}: created {}", options.display, shares));
  }
  LH_ASSIGN_OR_RETURN(exists, state());  // created by us, or by someone else meanwhile
  if (exists.first && exists.second) {
    return true;
  }
  return unusable(exists.first ? "lacks SELECT, INSERT, UPDATE or DELETE for this role"
                               : fmt::format("is missing and cannot be created ({})",
                                             created.status().message()));
}

Status PgSharesMissing(const PostgresOptions& options) {
  return Status::PermissionDenied(fmt::format(
      "shared and semaphore leases need table {0}.shares, which is missing in the database of {1} "
      "or not usable by this role: have someone with the CREATE privilege run the SQL printed by "
      "`leasehold schema --store URL`, GRANT SELECT, INSERT, UPDATE, DELETE ON \"{0}\".shares to "
      "this role, and open the store again",
      options.schema, options.display));
}

Status PgCheckFencedOps(const std::vector<FencedOp>& ops) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const FencedOp& op = ops[i];
    if (op.kind != FencedOp::Kind::kSql) {
      return Status::InvalidArgument(
          fmt::format("the postgres store has no fenced {} op", FencedOpKindName(op.kind)));
    }
    if (op.key.find('\0') != std::string::npos) {
      return Status::InvalidArgument(
          fmt::format("fenced write: statement {} contains a NUL byte", i + 1));
    }
    for (std::size_t p = 0; p < op.params.size(); ++p) {
      if (op.params[p].find('\0') != std::string::npos) {
        return Status::InvalidArgument(fmt::format(
            "fenced write: statement {}: parameter ${} contains a NUL byte, which PostgreSQL "
            "text cannot hold",
            i + 1, p + 1));
      }
    }
    const std::string leading = LeadingSqlKeywords(op.key);
    if (std::string_view word = TransactionControlKeyword(leading); !word.empty()) {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {} is {}: the write runs in a transaction of its own, which "
          "its statements may not end or split",
          i + 1, word));
    }
    if (leading.substr(0, leading.find(' ')) == "COPY") {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {} is COPY, which a fenced write cannot carry (use INSERT)",
          i + 1));
    }
  }
  return Status();
}

Status PgFencedStatementStatus(const Status& status, bool connection_ok) {
  const std::string_view sqlstate = status.detail();
  if (connection_ok && sqlstate == kSqlStateProtocolViolation) {
    // A Bind with more or fewer parameters than the statement has ("bind message supplies 2
    // parameters, but prepared statement "" requires 1"): the server says 08P01, yet the
    // session is fine and the mistake is the caller's.
    return Status(StatusCode::kInvalidArgument, std::string(status.message()),
                  std::string(sqlstate));
  }
  if (status.code() != StatusCode::kInternal) {
    return status;
  }
  for (std::string_view cls : {"0A", "21", "22", "23", "25", "27", "2D", "42", "44", "P0"}) {
    if (sqlstate.starts_with(cls)) {
      return Status(StatusCode::kInvalidArgument, std::string(status.message()),
                    std::string(sqlstate));
    }
  }
  return status;
}

std::int64_t PgRowsChanged(const PgResult& r) {
  const std::string_view tag = r.command_tag();
  const std::string_view command = tag.substr(0, tag.find(' '));
  if (command == "INSERT" || command == "UPDATE" || command == "DELETE" || command == "MERGE") {
    return r.rows_processed();
  }
  return 0;
}

PgFencedOutcome PgFencedWrite(PgConnection& conn, const FencedWriteRequest& request,
                              const std::string& check, const PgParams& check_params,
                              SteadyTime deadline, Clock& clock, const PostgresOptions& options,
                              const std::function<Status()>& refused) {
  PgFencedOutcome outcome;
  auto rollback = [&] {
    if (conn.broken()) {
      return;
    }
    // A failed statement left the transaction aborted; a connection that cannot end it is of no
    // use to anyone (and in advisory mode would fail every later heartbeat).
    Result<PgResult> r = conn.Exec("fenced write rollback", std::string(sql::kRollback), {},
                                   PgDeadline(options, clock));
    if (!r.ok() && !conn.broken()) {
      conn.Discard(fmt::format("ROLLBACK of a fenced write failed: {}", r.status().message()));
    }
  };
  if (Result<PgResult> begun =
          conn.Exec("fenced write begin", std::string(sql::kBegin), {}, deadline);
      !begun.ok()) {
    rollback();  // in case BEGIN ran and only its answer was lost
    outcome.result = begun.status();
    return outcome;
  }
  if (!request.skip_guard_for_testing) {
    Result<PgResult> checked = conn.Exec("fenced write check", check, check_params, deadline);
    if (!checked.ok()) {
      rollback();
      outcome.result = checked.status();
      return outcome;
    }
    if (checked->rows() == 0) {
      rollback();
      outcome.refused = true;
      outcome.result =
          conn.broken()
              ? Status::Unavailable(fmt::format("fenced write of {}: the connection broke while "
                                                "ending a refused write",
                                                request.key))
              : refused();
      return outcome;
    }
  }
  std::vector<std::int64_t> affected;
  affected.reserve(request.ops.size());
  for (std::size_t i = 0; i < request.ops.size(); ++i) {
    const FencedOp& op = request.ops[i];
    PgParams params(op.params.begin(), op.params.end());
    Result<PgResult> r =
        conn.ExecOnce(fmt::format("fenced write statement {}", i + 1), op.key, params, deadline);
    if (!r.ok()) {
      rollback();
      outcome.result = PgFencedStatementStatus(r.status(), !conn.broken());
      return outcome;
    }
    affected.push_back(PgRowsChanged(*r));
  }
  outcome.commit_sent = true;
  Result<PgResult> committed =
      conn.Exec("fenced write commit", std::string(sql::kCommit), {}, deadline);
  if (!committed.ok()) {
    if (conn.broken() || PgIndeterminate(committed.status())) {
      outcome.result = Status::Unavailable(
          fmt::format("fenced write of {}: whether the write committed (and will survive a "
                      "failover) is unknown: {}",
                      request.key, committed.status().message()),
          std::string(committed.status().detail()));
      return outcome;
    }
    // The server answered COMMIT with an error (a deferred constraint, a serialization failure):
    // the transaction is over and nothing was written.
    rollback();
    outcome.result = PgFencedStatementStatus(committed.status(), !conn.broken());
    return outcome;
  }
  if (committed->command_tag() == "ROLLBACK") {
    // COMMIT of a transaction that had failed answers ROLLBACK instead of an error.
    outcome.result = Status::Internal(fmt::format(
        "fenced write of {}: the server rolled the transaction back at COMMIT", request.key));
    return outcome;
  }
  outcome.result = std::move(affected);
  return outcome;
}

namespace {

// A quoted SQL identifier for the GRANT lines: "app", "we""ird".
std::string QuoteIdent(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    out += c;
    if (c == '"') {
      out += '"';
    }
  }
  return out + "\"";
}

// kDiagnose's row, by column (see postgres_sql.h).
struct PgSettings {
  std::optional<std::string> fsync;
  std::optional<std::string> synchronous_commit;
  std::optional<std::string> full_page_writes;
  std::optional<std::string> standby_names;
  std::string version;
  long long version_num = 0;
  bool in_recovery = false;
  int backend_pid = 0;
  std::string role;
  bool schema_exists = false;
  bool schema_usage = false;
  bool schema_create = false;
  bool database_create = false;

  struct Table {
    bool exists = false;
    bool select = false;
    bool insert = false;
    bool update = false;
  };

  Table leases;
  Table records;
  std::optional<long long> replicas;
  // Of those, the synchronous ones (sync_state sync or quorum).
  std::optional<long long> sync_replicas;
  Table shares;
  bool shares_delete = false;
  // The server's timeline (the primary's WAL insert position's; a standby's last checkpoint's).
  long long timeline = 0;
  std::string system_identifier;
  std::string cluster_name;
  // A session of Patroni's is visible in pg_stat_activity (application_name "Patroni...").
  bool patroni_seen = false;
};

PgSettings ReadSettings(const PgResult& r) {
  auto text = [&](int col) -> std::optional<std::string> {
    if (r.IsNull(0, col)) {
      return std::nullopt;
    }
    return std::string(r.Get(0, col));
  };
  auto table = [&](int col) {
    return PgSettings::Table{.exists = r.GetBool(0, col),
                             .select = r.GetBool(0, col + 1),
                             .insert = r.GetBool(0, col + 2),
                             .update = r.GetBool(0, col + 3)};
  };
  PgSettings s;
  s.fsync = text(0);
  s.synchronous_commit = text(1);
  s.full_page_writes = text(2);
  s.standby_names = text(3);
  s.version = std::string(r.Get(0, 4));
  s.version_num = r.GetInt(0, 5);
  s.in_recovery = r.GetBool(0, 6);
  s.backend_pid = static_cast<int>(r.GetInt(0, 7));
  s.role = std::string(r.Get(0, 8));
  s.schema_exists = r.GetBool(0, 9);
  s.schema_usage = r.GetBool(0, 10);
  s.schema_create = r.GetBool(0, 11);
  s.database_create = r.GetBool(0, 12);
  s.leases = table(13);
  s.records = table(17);
  if (!r.IsNull(0, 21)) {
    s.replicas = r.GetInt(0, 21);
  }
  if (!r.IsNull(0, 22)) {
    s.sync_replicas = r.GetInt(0, 22);
  }
  s.shares = table(23);
  s.shares_delete = r.GetBool(0, 27);
  s.timeline = r.GetInt(0, 28);
  s.system_identifier = std::string(r.Get(0, 29));
  s.cluster_name = std::string(r.Get(0, 30));
  s.patroni_seen = r.GetBool(0, 31);
  return s;
}

CheckItem Unreadable(std::string_view area, std::string_view setting) {
  return CheckItem{
      .area = std::string(area),
      .verdict = CheckVerdict::kWarn,
      .found = fmt::format("the server does not report {} (current_setting is NULL): its "
                           "durability cannot be judged",
                           setting),
      .fix =
          fmt::format("check {} on the server by hand (SHOW {} as its owner)", setting, setting)};
}

// The durability of committed grants and fencing counter bumps on this server.
void DurabilityItems(const PgSettings& s, std::vector<CheckItem>& items) {
  const std::size_t first = items.size();
  if (!s.fsync) {
    items.push_back(Unreadable("durability", "fsync"));
  } else if (*s.fsync == "off") {
    items.push_back(
        {.area = "durability",
         .verdict = CheckVerdict::kUnsafe,
         .found = "fsync is off: a crash of the server host can lose or corrupt grants and "
                  "fencing counters",
         .fix = "set fsync = on (ALTER SYSTEM SET fsync = on; SELECT pg_reload_conf())"});
  }
  // synchronous_commit = off acknowledges a COMMIT before its WAL is flushed: a server crash
  // (not only a host crash) can then lose the last commits, among them a grant's fence bump that
  // its holder already received. After the restart the counter is lower than a token in use,
  // and the next grant hands out that same fencing token again: two holders with one token is
  // exactly what fencing must rule out, so this is unsafe, not a warning. `local` flushes
  // locally and only skips waiting for synchronous standbys: the same as `on` without any,
  // a failover risk (as asynchronous standbys are, below) with them.
  if (!s.synchronous_commit) {
    items.push_back(Unreadable("durability", "synchronous_commit"));
  } else if (*s.synchronous_commit == "off") {
    items.push_back(
        {.area = "durability",
         .verdict = CheckVerdict::kUnsafe,
         .found = "synchronous_commit is off for this role's sessions: a server crash can lose "
                  "the last committed grants and fence bumps, and the next grant would reuse a "
                  "fencing token already handed out",
         .fix = "set synchronous_commit = on for leasehold's role and database (ALTER ROLE ... "
                "RESET synchronous_commit, or ALTER SYSTEM SET synchronous_commit = on)"});
  } else if (*s.synchronous_commit == "local" && s.standby_names && !s.standby_names->empty()) {
    items.push_back({.area = "durability",
                     .verdict = CheckVerdict::kWarn,
                     .found =
                         "synchronous_commit is local: commits do not wait for the synchronous "
                         "standbys, so a failover can lose the last grants and fence bumps",
                     .fix = "set synchronous_commit = on (or remote_apply) for leasehold's role"});
  }
  if (!s.full_page_writes) {
    items.push_back(Unreadable("durability", "full_page_writes"));
  } else if (*s.full_page_writes == "off") {
    items.push_back(
        {.area = "durability",
         .verdict = CheckVerdict::kUnsafe,
         .found = "full_page_writes is off: a crash during a page write can leave torn pages "
                  "in the leases table (lost or corrupt fencing counters)",
         .fix = "set full_page_writes = on (unless the storage writes 8 kB pages atomically)"});
  }
  if (items.size() == first) {
    items.push_back({.area = "durability",
                     .found = fmt::format("fsync {}, synchronous_commit {}, full_page_writes {}: "
                                          "committed grants and fencing counters survive a crash "
                                          "of the server",
                                          *s.fsync, *s.synchronous_commit, *s.full_page_writes)});
  }
}

// Primary or standby, the version, a pooler in between, the standbys.
void TopologyItems(const PgSettings& s, const PgConnection& conn, const PostgresOptions& options,
                   std::vector<CheckItem>& items) {
  if (s.in_recovery) {
    items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kUnsafe,
         .found = fmt::format("PostgreSQL {} is a standby (pg_is_in_recovery()): it refuses "
                              "every write, so it can grant no lease",
                              s.version),
         .fix = "point the URL at the primary (a host list with target_session_attrs=read-write "
                "follows a failover)"});
  } else if (options.mode == PostgresMode::kAdvisory && s.version_num > 0 &&
             s.version_num < 140000) {
    items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kUnsafe,
         .found = fmt::format("PostgreSQL {} has no idle_session_timeout (14 and later): "
                              "mode=advisory bounds a grant's session with it",
                              s.version),
         .fix = "upgrade to PostgreSQL 14 or later, or use mode=table"});
  } else {
    items.push_back(
        {.area = "topology",
         .found = fmt::format("PostgreSQL {}, a primary (not in recovery)", s.version)});
  }

  // The pooler check the backend makes at open (postgres_connection.h, startup_pid): PgBouncer
  // sends the client a backend pid of its own at startup, never the server's pg_backend_pid().
  const bool pooled = s.backend_pid != conn.startup_pid();
  if (options.mode == PostgresMode::kAdvisory) {
    if (pooled) {
      items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kUnsafe,
           .found = fmt::format("a connection pooler sits in between (startup backend pid {}, "
                                "pg_backend_pid() {}): advisory locks belong to the server "
                                "session, which a pooler hands to other clients",
                                conn.startup_pid(), s.backend_pid),
           .fix = "use mode=table through poolers, or connect to PostgreSQL directly"});
    } else {
      items.push_back({.area = "topology",
                       .found = "a server session of its own (the startup backend pid is "
                                "pg_backend_pid(): no pooler seen), as mode=advisory needs"});
    }
  } else {
    items.push_back(
        {.area = "topology",
         .found = pooled ? fmt::format("through a connection pooler (startup backend pid {}, "
                                       "pg_backend_pid() {}): mode=table is pooler-safe; waiters "
                                       "poll instead of LISTEN",
                                       conn.startup_pid(), s.backend_pid)
                         : "a direct connection (no pooler seen); mode=table is pooler-safe, "
                           "waiters LISTEN"});
  }

  // The server's history, as fencing tokens carry it (LH_PG_EPOCH, postgres_sql.h).
  std::string manager;
  if (s.patroni_seen) {
    manager = fmt::format(
        "; a Patroni session is connected{}",
        s.cluster_name.empty() ? "" : fmt::format(" (cluster_name '{}')", s.cluster_name));
  } else if (!s.cluster_name.empty()) {
    manager = fmt::format("; cluster_name '{}'", s.cluster_name);
  }
  items.push_back({.area = "topology",
                   .found = fmt::format(
                       "timeline {}, system identifier {}{}: fencing tokens granted here "
                       "start above {} (the timeline in their high bits), so every token "
                       "after a failover or a promoting restore is greater than every one "
                       "before it",
                       s.timeline, s.system_identifier.empty() ? "unknown" : s.system_identifier,
                       manager, s.timeline > 1 ? ((s.timeline - 1) << 40) : 0)});

  if (s.in_recovery) {
    return;  // a standby's own (cascading) standbys say nothing about the primary's copies
  }
  const bool sync_wait =
      s.synchronous_commit && *s.synchronous_commit != "off" && *s.synchronous_commit != "local";
  if (!s.replicas) {
    items.push_back({.area = "topology",
                     .verdict = CheckVerdict::kWarn,
                     .found = "pg_stat_replication is not readable by this role: the standbys "
                              "cannot be counted",
                     .fix = "check the standbys by hand: an asynchronous one loses the last "
                            "commits at a failover"});
  } else if (*s.replicas == 0) {
    items.push_back({.area = "topology",
                     .verdict = CheckVerdict::kWarn,
                     .found = "no standby streams from this server: its storage is the only "
                              "copy of the fencing counters",
                     .fix = "for a store that must outlive this host, add a synchronous standby "
                            "(synchronous_standby_names)"});
  } else if (s.sync_replicas.value_or(0) == 0 || !sync_wait) {
    items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format(
             "{} standby(s), none of which confirms leasehold's commits (synchronous standbys: "
             "{}; synchronous_standby_names '{}', synchronous_commit {}): a failover loses the "
             "last grants, renewals and fence bumps. A lost grant's holder runs on until its "
             "next renewal finds the grant gone while a new holder may already run; fencing "
             "tokens still only grow (they carry the timeline), so fenced writes stay safe",
             *s.replicas, s.sync_replicas ? std::to_string(*s.sync_replicas) : "unknown",
             s.standby_names.value_or(""), s.synchronous_commit.value_or("unknown")),
         .fix = "set synchronous_standby_names (and synchronous_commit = on or remote_apply) so "
                "that every grant waits for a standby, or fence every write and accept the "
                "failover window (README: PostgreSQL in production)"});
  } else {
    items.push_back(
        {.area = "topology",
         .found = fmt::format("{} standby(s), {} synchronous (synchronous_standby_names '{}', "
                              "synchronous_commit {}): a failover to a synchronous standby keeps "
                              "every grant leasehold reported; a commit the standby did not "
                              "confirm is never reported as granted",
                              *s.replicas, *s.sync_replicas, s.standby_names.value_or(""),
                              *s.synchronous_commit)});
  }
  if (options.mode == PostgresMode::kAdvisory && s.replicas.value_or(0) > 0) {
    items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = "mode=advisory: advisory locks are not replicated, so after a failover the new "
                  "primary grants every key at once, while a holder learns of it only when its "
                  "session to the old primary ends (at once if that server died; after the "
                  "session bounds if it hangs): fencing covers that window",
         .fix = "use mode=table with a synchronous standby for no overlap across a failover"});
  }
}

// USAGE and CREATE on the schema, SELECT, INSERT, UPDATE on both tables.
void PermissionItems(const PgSettings& s, const PostgresOptions& options,
                     std::vector<CheckItem>& items) {
  const std::string role = QuoteIdent(s.role);
  const std::string schema = QuoteIdent(options.schema);
  const std::size_t first = items.size();
  auto denied = [&](std::string found, std::string fix) {
    items.push_back({.area = "permissions",
                     .verdict = CheckVerdict::kPermissionDenied,
                     .found = std::move(found),
                     .fix = std::move(fix)});
  };
  if (!s.schema_exists) {
    if (!s.database_create) {
      denied(fmt::format("schema {} does not exist and role {} lacks CREATE on the database to "
                         "make it",
                         schema, role),
             fmt::format("have a DBA run the SQL of `leasehold schema --store URL`, then GRANT "
                         "USAGE ON SCHEMA {} TO {}",
                         schema, role));
    }
  } else if (!s.schema_usage) {
    denied(fmt::format("role {} lacks USAGE on schema {}", role, schema),
           fmt::format("GRANT USAGE ON SCHEMA {} TO {}", schema, role));
  } else {
    for (const auto& [name, t] :
         {std::pair<std::string_view, const PgSettings::Table&>{"leases", s.leases},
          {"records", s.records}}) {
      const std::string table = fmt::format("{}.{}", schema, name);
      if (!t.exists) {
        if (!s.schema_create) {
          denied(fmt::format("table {} does not exist and role {} lacks CREATE on schema {} to "
                             "make it{}",
                             table, role, schema,
                             name == "records" ? " (schedule slots, --once-per, fail)" : ""),
                 fmt::format("have a DBA run the SQL of `leasehold schema --store URL` (it "
                             "creates what is missing), then GRANT SELECT, INSERT, UPDATE ON {} "
                             "TO {}",
                             table, role));
        }
        continue;
      }
      std::vector<std::string_view> missing;
      for (const auto& [privilege, held] : {std::pair<std::string_view, bool>{"SELECT", t.select},
                                            {"INSERT", t.insert},
                                            {"UPDATE", t.update}}) {
        if (!held) {
          missing.push_back(privilege);
        }
      }
      if (!missing.empty()) {
        denied(fmt::format("role {} lacks {} on {}", role, fmt::join(missing, ", "), table),
               fmt::format("GRANT SELECT, INSERT, UPDATE ON {} TO {}", table, role));
      }
    }
  }
  if (items.size() == first) {
    items.push_back(
        {.area = "permissions",
         .found = fmt::format("role {} has USAGE on schema {} and SELECT, INSERT, UPDATE on its "
                              "tables (or may create them); LISTEN and the advisory lock "
                              "functions need no grant",
                              role, schema)});
  }
  // Shared and semaphore leases (mode=table only): without the shares table, exclusive leases
  // work as before, so this is a warning, not a refusal.
  if (options.mode == PostgresMode::kTable && s.schema_exists && s.schema_usage) {
    const std::string table = fmt::format("{}.shares", schema);
    const std::string grant =
        fmt::format("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}", table, role);
    if (!s.shares.exists && !s.schema_create) {
      items.push_back(
          {.area = "permissions",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("table {} does not exist and role {} lacks CREATE on schema {} to "
                                "make it: shared and semaphore leases fail (exclusive ones work)",
                                table, role, schema),
           .fix = fmt::format("have a DBA run the SQL of `leasehold schema --store URL`, then {}",
                              grant)});
    } else if (s.shares.exists &&
               !(s.shares.select && s.shares.insert && s.shares.update && s.shares_delete)) {
      items.push_back({.area = "permissions",
                       .verdict = CheckVerdict::kWarn,
                       .found = fmt::format("role {} lacks some of SELECT, INSERT, UPDATE, DELETE "
                                            "on {}: shared and semaphore leases fail (exclusive "
                                            "ones work)",
                                            role, table),
                       .fix = grant});
    }
  }
}

// The one line naming what the role needs (Diagnosis::permissions_fix).
std::string PermissionsFix(std::string_view role_name, const PostgresOptions& options) {
  const std::string role = QuoteIdent(role_name);
  const std::string schema = QuoteIdent(options.schema);
  std::string fix = fmt::format(
      "GRANT USAGE ON SCHEMA {0} TO {1}; GRANT SELECT, INSERT, UPDATE ON {0}.leases, "
      "{0}.records TO {1} (a DBA first runs the SQL of `leasehold schema --store URL` if the "
      "role may not create them)",
      schema, role);
  if (options.mode == PostgresMode::kAdvisory) {
    fix += fmt::format("; release --force also needs GRANT pg_signal_backend TO {}", role);
  } else {
    fix += fmt::format(
        "; shared and semaphore leases also need GRANT SELECT, INSERT, UPDATE, "
        "DELETE ON {}.shares TO {}",
        schema, role);
  }
  return fix;
}

}  // namespace

Result<Diagnosis> PgDiagnose(PgConnection& conn, const PostgresOptions& options, Clock& clock) {
  const std::string statement = PgStatement(sql::kDiagnose, options);
  auto run = [&](std::string_view replicas) {
    // ExecOnce: never prepared, so one round trip even on a connection that prepares.
    return conn.ExecOnce("diagnose", ReplaceAll(statement, "{replicas}", replicas),
                         {options.schema}, PgDeadline(options, clock));
  };
  Result<PgResult> r = run(sql::kDiagnoseReplicas);
  if (!r.ok() && r.status().detail() == kSqlStateInsufficientPrivilege && !conn.broken()) {
    // Only pg_stat_replication can be refused here (every other part is open to any role):
    // ask again without it, and say so.
    r = run(sql::kDiagnoseNoReplicas);
  }
  LH_RETURN_IF_ERROR(r.status());
  const PgSettings s = ReadSettings(*r);
  // PostgreSQL counts TTLs in milliseconds (intervals, idle_session_timeout): finer than the
  // advice's own rounding, so no granularity.
  Diagnosis d{.probe = std::string(sql::kPing)};
  DurabilityItems(s, d.items);
  TopologyItems(s, conn, options, d.items);
  PermissionItems(s, options, d.items);
  d.permissions_fix = PermissionsFix(s.role, options);
  return d;
}

}  // namespace leasehold::internal
