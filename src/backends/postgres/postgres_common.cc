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
  TakeKeptMark(info);
  info.fencing_token = static_cast<FencingToken>(r.GetInt(row, 3));
  info.ttl = StoreMillis(r.GetInt(row, 4));
  info.remaining = StoreMillis(r.GetInt(row, 5));
  return info;
}

LeaseInfo PgGrantInfo(const PgResult& r, int row) {
  LeaseInfo info = PgLeaseInfo(r, row);
  info.mode = r.Get(row, 6) == "s" ? LeaseMode::kShared : LeaseMode::kExclusive;
  info.waiting_writer = r.Get(row, 6) == "w";
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
  TakeKeptMark(info);
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

}  // namespace leasehold::internal
