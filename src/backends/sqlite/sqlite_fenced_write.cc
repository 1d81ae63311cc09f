// File: backends/sqlite/sqlite_fenced_write.cc (internal)
//
// The sqlite:// store's fenced-write facet: SQL run in the grant check's own BEGIN IMMEDIATE
// transaction, under an authorizer that keeps it off the lease tables and the transaction's end.

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

namespace {

// The tables of leasehold's own schema in the file: a fenced write's statements may read them,
// never change them.
constexpr std::array<std::string_view, 4> kLeaseTables = {"grants", "fencing_counters", "records",
                                                          "writer_intents"};

bool IsLeaseTable(const char* db_name, const char* table) {
  if (table == nullptr || (db_name != nullptr && std::string_view(db_name) != "main")) {
    return false;
  }
  const std::string_view name(table);
  return std::any_of(kLeaseTables.begin(), kLeaseTables.end(), [&](std::string_view t) {
    return sqlite3_strnicmp(t.data(), name.data(), static_cast<int>(t.size())) == 0 &&
           name.size() == t.size();
  });
}

// The authorizer (sqlite3_set_authorizer) while a fenced write's statement is prepared and
// stepped. SQLite calls it for every action the statement compiles to, triggers' included, so
// it sees what a look at the statement's first word cannot (a CTE, a trigger's body). The first
// refusal's reason goes to `refused`, SQLite's own message being only "not authorized".
struct FencedAuthorizer {
  std::string refused;

  static int Callback(void* self, int action, const char* a, const char* b, const char* db_name,
                      const char* /*trigger*/) {
    auto* authorizer = static_cast<FencedAuthorizer*>(self);
    std::string why;
    switch (action) {
      case SQLITE_TRANSACTION:
        why = fmt::format("{} would end the fenced write's own transaction", a ? a : "it");
        break;
      case SQLITE_SAVEPOINT:
        why = "SAVEPOINT and RELEASE would split the fenced write's own transaction";
        break;
      case SQLITE_ATTACH:
      case SQLITE_DETACH:
        why = "ATTACH and DETACH are not allowed in a fenced write";
        break;
      case SQLITE_PRAGMA:
        why = fmt::format(
            "PRAGMA {} is not allowed in a fenced write (it would change the "
            "connection or file leasehold uses)",
            a ? a : "");
        break;
      case SQLITE_INSERT:
      case SQLITE_UPDATE:
      case SQLITE_DELETE:
      case SQLITE_DROP_TABLE:
        if (IsLeaseTable(db_name, a)) {
          why = fmt::format("table {} is leasehold's own: a fenced write may not change it", a);
        }
        break;
      case SQLITE_CREATE_TEMP_TABLE:
      case SQLITE_CREATE_TEMP_VIEW:
      case SQLITE_CREATE_TEMP_TRIGGER:
        // leasehold's own statements name its tables without a schema, and SQLite looks in
        // "temp" first: a temp "grants" would hide the real one from this connection.
        why =
            "TEMP tables, views and triggers are not allowed in a fenced write (they could "
            "shadow leasehold's own tables on the connection it shares)";
        break;
      case SQLITE_CREATE_TRIGGER:
        // A trigger's body is authorized only when a statement fires it: one fired later by
        // leasehold's own statements or another connection would run outside these checks.
        why =
            "CREATE TRIGGER is not allowed in a fenced write (its body would run later, "
            "outside the fenced write's checks)";
        break;
      case SQLITE_ALTER_TABLE:  // a: the database, b: the table
      case SQLITE_CREATE_INDEX:
      case SQLITE_DROP_INDEX:
      case SQLITE_DROP_TRIGGER:
        if (IsLeaseTable(action == SQLITE_ALTER_TABLE ? a : db_name, b)) {
          why = fmt::format("table {} is leasehold's own: a fenced write may not change it", b);
        }
        break;
      default:
        break;
    }
    if (why.empty()) {
      return SQLITE_OK;
    }
    if (authorizer->refused.empty()) {
      authorizer->refused = std::move(why);
    }
    return SQLITE_DENY;
  }
};

// Installs a FencedAuthorizer on `db` for the scope.
class ScopedAuthorizer {
 public:
  ScopedAuthorizer(sqlite3* db, FencedAuthorizer& authorizer) : db_(db) {
    sqlite3_set_authorizer(db_, &FencedAuthorizer::Callback, &authorizer);
  }

  ScopedAuthorizer(const ScopedAuthorizer&) = delete;
  ScopedAuthorizer& operator=(const ScopedAuthorizer&) = delete;
  ScopedAuthorizer(ScopedAuthorizer&&) = delete;
  ScopedAuthorizer& operator=(ScopedAuthorizer&&) = delete;

  ~ScopedAuthorizer() { sqlite3_set_authorizer(db_, nullptr, nullptr); }

 private:
  sqlite3* const db_;
};

struct StatementFinalizer {
  void operator()(sqlite3_stmt* statement) const { sqlite3_finalize(statement); }
};

using OwnedStatement = std::unique_ptr<sqlite3_stmt, StatementFinalizer>;

// The 1-based parameter number of a "$N" or "?N" name, or 0 if `name` is not of that form.
std::size_t NumberedParameter(const char* name) {
  if (name == nullptr || (name[0] != '$' && name[0] != '?') || name[1] == '\0') {
    return 0;
  }
  std::size_t n = 0;
  for (const char* c = name + 1; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9' || n > kMaxFencedOps * 1000) {
      return 0;
    }
    n = n * 10 + static_cast<std::size_t>(*c - '0');
  }
  return n;
}

// Binds `params` to `statement` as text: a parameter named $N or ?N takes params[N-1] (so "$1"
// means the same as on PostgreSQL, wherever it stands), an anonymous "?" the value of its index.
// Returns why not (kInvalidArgument) if the statement names a parameter the op does not have
// (":name", "$9" of two...) or the op has one the statement never uses: PostgreSQL refuses both
// as well, and a silent NULL would be worse.
Status BindFencedParameters(sqlite3_stmt* statement, const std::vector<std::string>& params,
                            std::size_t op) {
  std::vector<bool> used(params.size(), false);
  const int count = sqlite3_bind_parameter_count(statement);
  for (int index = 1; index <= count; ++index) {
    const char* name = sqlite3_bind_parameter_name(statement, index);
    const std::size_t n =
        name == nullptr ? static_cast<std::size_t>(index) : NumberedParameter(name);
    if (n == 0) {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {}: parameter {} is not numbered (write $1, $2... or ?1, ?2...)",
          op + 1, name));
    }
    if (n > params.size()) {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {} uses parameter {} but has {} parameter(s)", op + 1,
          name != nullptr ? std::string(name) : fmt::format("?{}", index), params.size()));
    }
    const std::string& value = params[n - 1];
    const int rc = sqlite3_bind_text(statement, index, value.data(), static_cast<int>(value.size()),
                                     SQLITE_STATIC);
    if (rc != SQLITE_OK) {
      return Status::InvalidArgument(fmt::format("fenced write: statement {}: cannot bind {}: {}",
                                                 op + 1, n, sqlite3_errstr(rc)));
    }
    used[n - 1] = true;
  }
  for (std::size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {} has parameter ${} but never uses it", op + 1, i + 1));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::int64_t>> SqliteBackend::FencedWrite(const FencedWriteRequest& request) {
  // What can be told from the text alone, before the file is locked.
  for (std::size_t i = 0; i < request.ops.size(); ++i) {
    const FencedOp& op = request.ops[i];
    if (op.kind != FencedOp::Kind::kSql) {
      return Status::InvalidArgument(
          fmt::format("the sqlite store has no fenced {} op", FencedOpKindName(op.kind)));
    }
    if (op.key.find('\0') != std::string::npos) {
      return Status::InvalidArgument(
          fmt::format("fenced write: statement {} contains a NUL byte", i + 1));
    }
    if (std::string_view word = TransactionControlKeyword(LeadingSqlKeywords(op.key));
        !word.empty()) {
      return Status::InvalidArgument(fmt::format(
          "fenced write: statement {} is {}: the write runs in a transaction of its own, which "
          "its statements may not end, split or leave",
          i + 1, word));
    }
  }
  MutexLock lock(&mu_);
  SqliteConnection& connection = *connection_;
  sqlite3* const db = connection.db();
  WriteTransaction transaction(connection);
  LH_RETURN_IF_ERROR(transaction.Begin("fenced write"));
  // After the write lock, as everywhere: no other writer can change the grant until COMMIT.
  const std::int64_t now_ns = NowNs();
  if (!request.skip_guard_for_testing) {
    bool ours = false;
    {
      // The caller's grant among the key's (one of several, for a shared or semaphore lease).
      StatementRun own(connection, kSelectOwnLiveGrant, "fenced write");
      own.Bind(1, request.key);
      own.Bind(2, boot_id_);
      own.Bind(3, now_ns);
      own.Bind(4, request.owner_token);
      LH_ASSIGN_OR_RETURN(bool found, own.Next());
      ours = found && static_cast<FencingToken>(own.Int(3)) == request.fencing_token;
    }
    if (!ours) {
      // Another owner's exclusive grant names its holder; our own kept grant (token + ":kept",
      // Finish), other holders of a shared or semaphore key, or none at all: ours ended.
      StatementRun live(connection, kSelectLiveGrants, "fenced write");
      live.Bind(1, request.key);
      live.Bind(2, boot_id_);
      live.Bind(3, now_ns);
      LH_ASSIGN_OR_RETURN(bool found, live.Next());
      const bool other = found && static_cast<FencingToken>(live.Int(3)) != request.fencing_token &&
                         ModeFromText(live.Text(7)) == LeaseMode::kExclusive && live.Int(8) == 1;
      return FencedOut(
          request.key, request.fencing_token,
          other ? fmt::format("is now held by {} under fencing token {}", live.Text(1), live.Int(3))
                : std::string("is no longer held: expired or released"));
    }
  }
  std::vector<std::int64_t> affected;
  affected.reserve(request.ops.size());
  for (std::size_t i = 0; i < request.ops.size(); ++i) {
    const FencedOp& op = request.ops[i];
    FencedAuthorizer authorizer;
    ScopedAuthorizer authorize(db, authorizer);
    sqlite3_stmt* raw = nullptr;
    const char* tail = nullptr;
    int rc = sqlite3_prepare_v3(db, op.key.data(), static_cast<int>(op.key.size()), 0, &raw, &tail);
    OwnedStatement statement(raw);
    if (rc != SQLITE_OK) {
      if (!authorizer.refused.empty()) {
        return Status::InvalidArgument(
            fmt::format("sqlite database {}: fenced write: statement {} refused: {}", path_, i + 1,
                        authorizer.refused));
      }
      return connection.StatementError(rc, i);
    }
    if (statement == nullptr) {
      return Status::InvalidArgument(
          fmt::format("fenced write: statement {} is empty (only white space or comments)", i + 1));
    }
    // Only white space, comments and semicolons may follow: preparing them yields no statement.
    const std::string_view rest(tail, op.key.data() + op.key.size() - tail);
    if (rest.find_first_not_of(" \t\r\n;") != std::string_view::npos) {
      sqlite3_stmt* next = nullptr;
      rc = sqlite3_prepare_v3(db, rest.data(), static_cast<int>(rest.size()), 0, &next, nullptr);
      OwnedStatement second(next);
      if (rc != SQLITE_OK || second != nullptr) {
        return Status::InvalidArgument(fmt::format(
            "fenced write: statement {} holds more than one statement (one per op)", i + 1));
      }
    }
    LH_RETURN_IF_ERROR(BindFencedParameters(statement.get(), op.params, i));
    // Rows changed: sqlite3_changes counts only INSERT, UPDATE and DELETE and keeps its value
    // through any other statement, so it is read only if the total moved (a statement that
    // changes rows directly moves the total; CREATE TABLE, DROP TABLE and SELECT never do).
    const std::int64_t total_before = sqlite3_total_changes64(db);
    do {
      rc = sqlite3_step(statement.get());
    } while (rc == SQLITE_ROW);
    if (rc != SQLITE_DONE) {
      if (!authorizer.refused.empty()) {
        return Status::InvalidArgument(
            fmt::format("sqlite database {}: fenced write: statement {} refused: {}", path_, i + 1,
                        authorizer.refused));
      }
      return connection.StatementError(rc, i);
    }
    if (sqlite3_get_autocommit(db) != 0) {
      // The authorizer refuses every statement that could do this; should one slip through,
      // say so rather than report a write that may be half committed as done.
      return Status::Internal(fmt::format(
          "sqlite database {}: fenced write: statement {} ended the write's transaction", path_,
          i + 1));
    }
    affected.push_back(sqlite3_total_changes64(db) != total_before ? sqlite3_changes64(db) : 0);
  }
  LH_RETURN_IF_ERROR(transaction.Commit("fenced write"));
  return affected;
}

}  // namespace leasehold::internal
