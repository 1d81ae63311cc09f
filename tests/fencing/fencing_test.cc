#include "leasehold/fencing.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#if LEASEHOLD_WITH_SQLITE
#include <sqlite3.h>
#endif

#include "leasehold/store.h"

#include "backends/forwarding_backend.h"
#include "backends/memory/memory_backend.h"
#include "core/store_access.h"
#include "core/url.h"

namespace leasehold {
namespace {

TEST(FencingTest, RuleAdmitsEqualAndHigherTokensOnly) {
  EXPECT_TRUE(FenceAdmits(0, 1));
  EXPECT_TRUE(FenceAdmits(7, 7)) << "one holder makes many writes under one grant";
  EXPECT_TRUE(FenceAdmits(7, 8));
  EXPECT_FALSE(FenceAdmits(8, 7));
}

TEST(FencingTest, PostgresUpdateIsGuardedByLockVersion) {
  auto stmt = BuildFencedUpdate({.table = "invoices",
                                 .id = "2026-11",
                                 .set = {{"status", "sent"}, {"total", "12"}},
                                 .token = 42});
  ASSERT_TRUE(stmt.ok()) << stmt.status().ToString();
  EXPECT_EQ(stmt->text,
            "UPDATE \"invoices\" SET \"status\" = $1, \"total\" = $2, \"lock_version\" = $3 "
            "WHERE \"id\" = $4 AND \"lock_version\" <= $3");
  EXPECT_EQ(stmt->params, (std::vector<std::string>{"sent", "12", "42", "2026-11"}));
}

TEST(FencingTest, IdentifiersAreQuotedAndSchemaQualified) {
  auto stmt = BuildFencedUpdate({.schema = "billing",
                                 .table = "odd\"name",
                                 .id_column = "key",
                                 .version_column = "fence",
                                 .id = "x",
                                 .set = {{"v", "1"}},
                                 .token = 1,
                                 .dialect = SqlDialect::kSqlite});
  ASSERT_TRUE(stmt.ok()) << stmt.status().ToString();
  EXPECT_EQ(stmt->text,
            "UPDATE \"billing\".\"odd\"\"name\" SET \"v\" = ?1, \"fence\" = ?2 "
            "WHERE \"key\" = ?3 AND \"fence\" <= ?2");
}

TEST(FencingTest, UpsertInsertsOrUpdatesOnlyWithAHighEnoughToken) {
  auto stmt = BuildFencedUpsert({.table = "t", .id = "r", .set = {{"v", "a"}}, .token = 3});
  ASSERT_TRUE(stmt.ok()) << stmt.status().ToString();
  EXPECT_EQ(stmt->text,
            "INSERT INTO \"t\" (\"id\", \"v\", \"lock_version\") VALUES ($1, $2, $3) "
            "ON CONFLICT (\"id\") DO UPDATE SET \"v\" = excluded.\"v\", \"lock_version\" = "
            "excluded.\"lock_version\" WHERE \"t\".\"lock_version\" <= excluded.\"lock_version\"");
  EXPECT_EQ(stmt->params, (std::vector<std::string>{"r", "a", "3"}));
}

TEST(FencingTest, BadStatementsAreRejected) {
  FencedUpdate ok{.table = "t", .id = "r", .set = {{"v", "a"}}, .token = 3};
  FencedUpdate u = ok;
  u.set.clear();
  EXPECT_EQ(BuildFencedUpdate(u).status().code(), StatusCode::kInvalidArgument);
  u = ok;
  u.set.push_back({"lock_version", "9"});
  EXPECT_EQ(BuildFencedUpdate(u).status().code(), StatusCode::kInvalidArgument);
  u = ok;
  u.table.clear();
  EXPECT_EQ(BuildFencedUpsert(u).status().code(), StatusCode::kInvalidArgument);
  u = ok;
  u.set = {{std::string("a\0b", 3), "1"}};
  EXPECT_EQ(BuildFencedUpdate(u).status().code(), StatusCode::kInvalidArgument);
  u = ok;
  u.token = FencingToken{1} << 63;
  EXPECT_EQ(BuildFencedUpdate(u).status().code(), StatusCode::kInvalidArgument);
}

TEST(FencingTest, ZeroRowsMeansFencedOut) {
  EXPECT_TRUE(CheckFencedRows(1, 5).ok());
  Status s = CheckFencedRows(0, 5);
  EXPECT_EQ(s.code(), StatusCode::kLost);
  EXPECT_NE(s.message().find("fenced out"), std::string_view::npos) << s.ToString();
}

#if LEASEHOLD_WITH_SQLITE
// Runs a built statement against a real database, as a user's code would.
class SqliteTable {
 public:
  SqliteTable() {
    EXPECT_EQ(sqlite3_open(":memory:", &db_), SQLITE_OK);
    Exec(
        "CREATE TABLE invoices (id TEXT PRIMARY KEY, status TEXT, "
        "lock_version INTEGER NOT NULL DEFAULT 0)");
  }

  SqliteTable(const SqliteTable&) = delete;
  SqliteTable& operator=(const SqliteTable&) = delete;
  SqliteTable(SqliteTable&&) = delete;
  SqliteTable& operator=(SqliteTable&&) = delete;

  ~SqliteTable() { sqlite3_close(db_); }

  void Exec(const char* sql) {
    ASSERT_EQ(sqlite3_exec(db_, sql, nullptr, nullptr, nullptr), SQLITE_OK);
  }

  // Returns the number of rows changed.
  long long Run(const SqlStatement& stmt) {
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, stmt.text.c_str(), -1, &s, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db_);
    for (std::size_t i = 0; i < stmt.params.size(); ++i) {
      sqlite3_bind_text(s, static_cast<int>(i + 1), stmt.params[i].c_str(), -1, SQLITE_TRANSIENT);
    }
    EXPECT_EQ(sqlite3_step(s), SQLITE_DONE) << sqlite3_errmsg(db_);
    sqlite3_finalize(s);
    return sqlite3_changes(db_);
  }

  std::string Row(const char* id) {
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db_, "SELECT status || '@' || lock_version FROM invoices WHERE id = ?1", -1,
                       &s, nullptr);
    sqlite3_bind_text(s, 1, id, -1, SQLITE_TRANSIENT);
    std::string out = sqlite3_step(s) == SQLITE_ROW
                          ? reinterpret_cast<const char*>(sqlite3_column_text(s, 0))
                          : "missing";
    sqlite3_finalize(s);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

TEST(FencingTest, SqliteRejectsTheStaleWriterOfAGuardedUpdate) {
  SqliteTable table;
  table.Exec("INSERT INTO invoices (id, status) VALUES ('nov', 'draft')");
  auto write = [&](const char* status, FencingToken token) {
    auto stmt = BuildFencedUpdate({.table = "invoices",
                                   .id = "nov",
                                   .set = {{"status", status}},
                                   .token = token,
                                   .dialect = SqlDialect::kSqlite});
    EXPECT_TRUE(stmt.ok());
    return CheckFencedRows(table.Run(*stmt), token);
  };
  EXPECT_TRUE(write("by-5", 5).ok());
  EXPECT_TRUE(write("by-5-again", 5).ok());
  EXPECT_EQ(write("by-4", 4).code(), StatusCode::kLost);
  EXPECT_EQ(table.Row("nov"), "by-5-again@5");
  EXPECT_TRUE(write("by-6", 6).ok());
  EXPECT_EQ(write("by-5-late", 5).code(), StatusCode::kLost);
  EXPECT_EQ(table.Row("nov"), "by-6@6");
}

TEST(FencingTest, SqliteUpsertCreatesTheRowThenFences) {
  SqliteTable table;
  auto write = [&](const char* status, FencingToken token) {
    auto stmt = BuildFencedUpsert({.table = "invoices",
                                   .id = "dec",
                                   .set = {{"status", status}},
                                   .token = token,
                                   .dialect = SqlDialect::kSqlite});
    EXPECT_TRUE(stmt.ok());
    return CheckFencedRows(table.Run(*stmt), token);
  };
  EXPECT_TRUE(write("by-3", 3).ok());
  EXPECT_EQ(table.Row("dec"), "by-3@3");
  EXPECT_EQ(write("by-2", 2).code(), StatusCode::kLost);
  EXPECT_TRUE(write("by-9", 9).ok());
  EXPECT_EQ(table.Row("dec"), "by-9@9");
}
#endif

class FencedDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/leasehold-fencing-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }

  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string Read(const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  std::string dir_;
};

TEST_F(FencedDirectoryTest, AcceptsEqualOrHigherTokensAndRefusesLowerOnes) {
  FencedDirectory store(dir_);
  EXPECT_EQ(*store.HighestToken("report"), 0u);
  ASSERT_TRUE(store.Write("report", "v1 by 3", 3).ok());
  ASSERT_TRUE(store.Write("report", "v2 by 3", 3).ok());
  Status stale = store.Write("report", "v? by 2", 2);
  EXPECT_EQ(stale.code(), StatusCode::kLost) << stale.ToString();
  EXPECT_NE(stale.message().find("fenced out"), std::string_view::npos);
  EXPECT_EQ(Read("report"), "v2 by 3") << "a refused write leaves the data alone";
  ASSERT_TRUE(store.Write("report", "v3 by 7", 7).ok());
  EXPECT_EQ(store.Write("report", "late by 3", 3).code(), StatusCode::kLost);
  EXPECT_EQ(Read("report"), "v3 by 7");
  EXPECT_EQ(*store.HighestToken("report"), 7u);
  EXPECT_TRUE(store.Write("other", "independent", 1).ok()) << "records are fenced separately";
}

TEST_F(FencedDirectoryTest, BadNamesAreRejected) {
  FencedDirectory store(dir_);
  for (std::string name : {std::string(), std::string(".hidden"), std::string("a/b"),
                           std::string("a\0b", 3), std::string(201, 'x')}) {
    EXPECT_EQ(store.Write(name, "x", 1).code(), StatusCode::kInvalidArgument) << name;
  }
  FencedDirectory missing(dir_ + "/does-not-exist");
  EXPECT_EQ(missing.Write("r", "x", 1).code(), StatusCode::kUnavailable);
}

TEST_F(FencedDirectoryTest, ConcurrentWritersEndWithTheHighestToken) {
  constexpr int kWriters = 8;
  constexpr int kWrites = 20;
  std::vector<std::jthread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([this, w] {
      FencedDirectory store(dir_);  // one handle each, like separate processes
      for (int i = 0; i < kWrites; ++i) {
        const FencingToken token = static_cast<FencingToken>(i * kWriters + w + 1);
        Status s = store.Write("shared", "written by " + std::to_string(token), token);
        EXPECT_TRUE(s.ok() || s.code() == StatusCode::kLost) << s.ToString();
      }
    });
  }
  writers.clear();
  const FencingToken highest = kWriters * kWrites;
  EXPECT_EQ(*FencedDirectory(dir_).HighestToken("shared"), highest);
  EXPECT_EQ(Read("shared"), "written by " + std::to_string(highest));
}

// The string form, for a lease held by another process (LEASEHOLD_STORE_KEY): the key as given.
TEST(FencingTest, EtcdGuardComparesTheLeaseKeysCreateRevision) {
  auto guard = MakeEtcdFenceGuard("leasehold/election:svc", 1234);
  ASSERT_TRUE(guard.ok());
  EXPECT_EQ(guard->create_revision, 1234);
  EXPECT_EQ(
      guard->ToJson(),
      "{\"key\":\"bGVhc2Vob2xkL2VsZWN0aW9uOnN2Yw==\",\"target\":\"CREATE\",\"result\":\"EQUAL\","
      "\"create_revision\":\"1234\"}");
  EXPECT_EQ(MakeEtcdFenceGuard("ab", 1)->ToJson().substr(0, 13), "{\"key\":\"YWI=\"");
  EXPECT_EQ(MakeEtcdFenceGuard("a", 1)->ToJson().substr(0, 13), "{\"key\":\"YQ==\"");
  EXPECT_EQ(MakeEtcdFenceGuard("", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeEtcdFenceGuard("k", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeEtcdFenceGuard("k", FencingToken{1} << 63).status().code(),
            StatusCode::kInvalidArgument);
}

// memory:// whose grants say they live at "<prefix>/<key>", as etcd://'s do: a Lease shaped like
// an etcd lease without an etcd server (the etcd backend's own test builds the guard from real
// ones and checks it against what etcd holds).
class EtcdShapedBackend : public internal::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  Result<internal::Grant> TryAcquire(const internal::GrantRequest& request) override {
    auto grant = ForwardingBackend::TryAcquire(request);
    if (grant.ok()) {
      grant->store_key = "leasehold/" + request.key;
    }
    return grant;
  }
};

std::unique_ptr<Store> OpenMemory(const std::string& name, bool etcd_shaped) {
  auto url = internal::ParseUrl("memory://" + name);
  EXPECT_TRUE(url.ok());
  auto backend = internal::OpenMemoryBackend(*url, Clock::Real());
  EXPECT_TRUE(backend.ok());
  if (etcd_shaped) {
    return internal::OpenStoreWithBackend(std::make_shared<EtcdShapedBackend>(*backend));
  }
  return internal::OpenStoreWithBackend(*backend);
}

TEST(FencingTest, EtcdGuardOfALeaseTakesItsStoreKeyAndToken) {
  auto store = OpenMemory("fencing-etcd-shaped", true);
  auto lease = store->TryAcquire("jobs/nightly");
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_EQ(lease->store_key(), "leasehold/jobs/nightly");
  auto guard = MakeEtcdFenceGuard(*lease);
  ASSERT_TRUE(guard.ok()) << guard.status().ToString();
  EXPECT_EQ(guard->lease_key, "leasehold/jobs/nightly") << "the key the store wrote, not the name";
  EXPECT_EQ(guard->create_revision, static_cast<std::int64_t>(lease->fencing_token()));
}

TEST(FencingTest, EtcdGuardRefusesAnEmptyLeaseAndLeasesOfOtherStores) {
  EXPECT_EQ(MakeEtcdFenceGuard(Lease()).status().code(), StatusCode::kInvalidArgument);
  // memory:// (and the SQL stores): the store key is the lease key itself, no "<prefix>/".
  auto store = OpenMemory("fencing-plain", false);
  auto lease = store->TryAcquire("jobs/nightly");
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_EQ(lease->store_key(), "jobs/nightly");
  auto guard = MakeEtcdFenceGuard(*lease);
  EXPECT_EQ(guard.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(guard.status().message().find("not a lease of an etcd:// store"),
            std::string_view::npos)
      << guard.status().message();
}

}  // namespace
}  // namespace leasehold
