// File: tests/backends/sqlite/sqlite_backend_test.cc
//
// Behaviour specific to the embedded sqlite:// store: file and directory creation, WAL and
// write locking, CLOCK_BOOTTIME expiry with boot ids, the fencing counter table, refusing files
// that are not leasehold databases, error mapping, and sharing one file between threads and
// processes. The generic behaviour of every backend is in tests/backends/conformance.

#include "backends/sqlite/sqlite_backend.h"

#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "leasehold/status.h"

#include "backends/sqlite/sqlite_host_queue.h"
#include "backends/sqlite/sqlite_options.h"
#include "core/url.h"
#include "testing/scoped_env.h"

namespace leasehold::internal {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kTokenA[] = "aaaaaaaa111111111111111111111111";
constexpr char kTokenB[] = "bbbbbbbb222222222222222222222222";
constexpr char kTokenC[] = "cccccccc333333333333333333333333";

// TTLs for expiry tests: short, and slept past with a margin.
constexpr Duration kShortTtl = milliseconds(50);
constexpr Duration kPastShortTtl = milliseconds(90);

std::string TokenNumber(int n) {
  return fmt::format("{:08x}{:024x}", n, n);
}

// A fresh directory under /tmp, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "leasehold_sqlite_XXXXXX");
    char* made = ::mkdtemp(templ.data());
    if (made == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
    }
    path_ = templ;
  }

  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir(TempDir&&) = delete;
  TempDir& operator=(TempDir&&) = delete;

  ~TempDir() {
    std::error_code ignored;
    // Restore permissions that a test may have removed, so that removal works for non-root.
    for (auto it = std::filesystem::recursive_directory_iterator(path_, ignored);
         it != std::filesystem::recursive_directory_iterator(); it.increment(ignored)) {
      std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::add, ignored);
    }
    std::filesystem::remove_all(path_, ignored);
  }

  [[nodiscard]] const std::string& path() const { return path_; }

  [[nodiscard]] std::string Join(std::string_view name) const {
    return path_ + "/" + std::string(name);
  }

 private:
  std::string path_;
};

using ::leasehold::testing::ScopedEnv;

// A raw SQLite connection, to plant rows, hold locks and look at the file as another process
// would.
class RawDb {
 public:
  explicit RawDb(const std::string& path, int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) {
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db_, flags, nullptr), SQLITE_OK) << path;
  }

  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;
  RawDb(RawDb&&) = delete;
  RawDb& operator=(RawDb&&) = delete;

  ~RawDb() { sqlite3_close_v2(db_); }

  void Exec(const std::string& sql) {
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
        << sql << ": " << (error != nullptr ? error : "");
    sqlite3_free(error);
  }

  std::string QueryText(const std::string& sql) {
    sqlite3_stmt* statement = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &statement, nullptr), SQLITE_OK) << sql;
    std::string value;
    if (sqlite3_step(statement) == SQLITE_ROW) {
      const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(statement, 0));
      value = text != nullptr ? text : "";
    } else {
      ADD_FAILURE() << "no row: " << sql;
    }
    sqlite3_finalize(statement);
    return value;
  }

  std::int64_t QueryInt(const std::string& sql) { return std::stoll(QueryText(sql)); }

  [[nodiscard]] sqlite3* db() const { return db_; }

 private:
  sqlite3* db_ = nullptr;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteFile(const std::string& path,  // NOLINT(bugprone-easily-swappable-parameters)
               const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

bool Exists(const std::string& path) {
  struct stat st {};

  return ::stat(path.c_str(), &st) == 0;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};

  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

Url SqliteUrl(std::string path, std::map<std::string, std::string, std::less<>> query = {}) {
  Url url;
  url.scheme = "sqlite";
  url.path = std::move(path);
  url.query = std::move(query);
  return url;
}

Result<std::shared_ptr<SqliteBackend>> OpenAt(const std::string& path,
                                              Duration busy_timeout = seconds(5),
                                              std::string boot_id = {}) {
  SqliteOptions options;
  options.path = path;
  options.busy_timeout = busy_timeout;
  options.boot_id_for_testing = std::move(boot_id);
  return SqliteBackend::Open(std::move(options));
}

GrantRequest Request(std::string key, std::string token, Duration ttl = seconds(10),
                     std::string holder = "host:42") {
  return GrantRequest{.key = std::move(key),
                      .owner_token = std::move(token),
                      .holder = std::move(holder),
                      .ttl = ttl};
}

std::vector<std::string> Keys(const std::vector<LeaseInfo>& infos) {
  std::vector<std::string> keys;
  keys.reserve(infos.size());
  for (const LeaseInfo& info : infos) {
    keys.push_back(info.key);
  }
  return keys;
}

// ---------------------------------------------------------------------------------------------
// SqliteOptions and the default path.

TEST(SqliteTimeNamespaceTest, TheBoottimeOffsetIsReadFromItsLine) {
  // As the kernel prints it: both clocks, padded, seconds then nanoseconds.
  EXPECT_EQ(*ParseBoottimeOffsetNs("monotonic           0         0\n"
                                   "boottime         3600         0\n"),
            3600'000'000'000LL);
  EXPECT_EQ(*ParseBoottimeOffsetNs("boottime -3601 500000000\nmonotonic -50 0\n"),
            -3601'000'000'000LL + 500'000'000LL);
  EXPECT_EQ(*ParseBoottimeOffsetNs("monotonic 7 0\nboottime 0 0"), 0);
}

TEST(SqliteTimeNamespaceTest, AMissingOrMalformedBoottimeLineIsAnError) {
  for (const char* text : {"", "monotonic 0 0\n", "boottime 1\n", "boottime x 0\n",
                           "boottime 1 1000000000\n", "boottime 1 -1\n", "boottime 1 0 0\n",
                           "boottime 99999999999999999999 0\n", "boottime 10000000000 0\n"}) {
    const Result<std::int64_t> offset = ParseBoottimeOffsetNs(text);
    ASSERT_FALSE(offset.ok()) << text;
    EXPECT_EQ(offset.status().code(), StatusCode::kInternal) << text;
    EXPECT_THAT(offset.status().message(), HasSubstr("boottime")) << text;
  }
}

TEST(SqliteOptionsTest, FromUrlReadsPathAndBusyTimeout) {
  Result<SqliteOptions> options =
      SqliteOptions::FromUrl(SqliteUrl("/var/lib/app/leases.db", {{"busy_timeout", "500ms"}}));
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->path, "/var/lib/app/leases.db");
  EXPECT_EQ(options->busy_timeout, milliseconds(500));
}

TEST(SqliteOptionsTest, BusyTimeoutDefaultsToTwoSeconds) {
  Result<SqliteOptions> options = SqliteOptions::FromUrl(SqliteUrl("x.db"));
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->path, "x.db");
  EXPECT_EQ(options->busy_timeout, seconds(2));
}

TEST(SqliteOptionsTest, UnknownParametersAreRejectedByName) {
  Result<SqliteOptions> options =
      SqliteOptions::FromUrl(SqliteUrl("x.db", {{"busytimeout", "1s"}, {"journal", "delete"}}));
  ASSERT_EQ(options.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(options.status().message()), HasSubstr("busytimeout"));
  EXPECT_THAT(std::string(options.status().message()), HasSubstr("journal"));
}

TEST(SqliteOptionsTest, BadBusyTimeoutIsRejected) {
  for (const char* bad : {"10", "-1s", "soon", "1000h"}) {
    Result<SqliteOptions> options =
        SqliteOptions::FromUrl(SqliteUrl("x.db", {{"busy_timeout", bad}}));
    EXPECT_EQ(options.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(SqliteOptionsTest, OtherSchemeIsRejected) {
  Url url = SqliteUrl("x.db");
  url.scheme = "redis";
  EXPECT_EQ(SqliteOptions::FromUrl(url).status().code(), StatusCode::kInvalidArgument);
}

TEST(SqliteOptionsTest, EmptyPathMeansTheHostWideDefault) {
  ScopedEnv state("LEASEHOLD_STATE_DIR", "/srv/leasehold");
  Result<SqliteOptions> options = SqliteOptions::FromUrl(SqliteUrl(""));
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->path, "/srv/leasehold/leases.db");
  EXPECT_TRUE(options->host_scope);
}

TEST(SqliteOptionsTest, ScopeIsUserUnlessAskedForAPath) {
  Result<SqliteOptions> plain = SqliteOptions::FromUrl(SqliteUrl("/x/leases.db"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->host_scope);
  Result<SqliteOptions> host =
      SqliteOptions::FromUrl(SqliteUrl("/x/leases.db", {{"scope", "host"}}));
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_TRUE(host->host_scope);
  Result<SqliteOptions> bad =
      SqliteOptions::FromUrl(SqliteUrl("/x/leases.db", {{"scope", "fleet"}}));
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("scope"));
}

TEST(DefaultSqlitePathTest, IsTheHostWideFileWhateverTheHome) {
  ScopedEnv state("LEASEHOLD_STATE_DIR", std::nullopt);
  ScopedEnv home("HOME", "/home/ann");
  ScopedEnv xdg("XDG_STATE_HOME", "/home/ann/state");
  EXPECT_EQ(DefaultSqlitePath().value(), "/var/lib/leasehold/leases.db");
}

TEST(DefaultSqlitePathTest, FollowsLeaseholdStateDir) {
  ScopedEnv state("LEASEHOLD_STATE_DIR", "/srv/leasehold");
  EXPECT_EQ(DefaultSqlitePath().value(), "/srv/leasehold/leases.db");
}

TEST(DefaultSqlitePathTest, RelativeStateDirIsInvalidArgument) {
  ScopedEnv state("LEASEHOLD_STATE_DIR", "relative/state");
  Result<std::string> path = DefaultSqlitePath();
  ASSERT_EQ(path.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(path.status().message()), HasSubstr("LEASEHOLD_STATE_DIR"));
}

// ---------------------------------------------------------------------------------------------
// Opening: files, directories, journal mode, locking.

class SqliteBackendTest : public ::testing::Test {
 protected:
  [[nodiscard]] std::string DbPath() const { return dir_.Join("leases.db"); }

  std::shared_ptr<SqliteBackend> MustOpen(Duration busy_timeout = seconds(5),
                                          std::string boot_id = {}) {
    Result<std::shared_ptr<SqliteBackend>> backend =
        OpenAt(DbPath(), busy_timeout, std::move(boot_id));
    EXPECT_TRUE(backend.ok()) << backend.status().ToString();
    return backend.ok() ? *backend : nullptr;
  }

  TempDir dir_;
};

TEST_F(SqliteBackendTest, DefaultPathIsCreatedForEveryLocalUser) {
  const std::string state_dir = dir_.Join("state/leasehold");
  ScopedEnv state("LEASEHOLD_STATE_DIR", state_dir);
  // A restrictive umask must not narrow the modes.
  const mode_t old_umask = ::umask(077);
  Result<std::shared_ptr<Backend>> backend = OpenSqliteBackend(SqliteUrl(""));
  ::umask(old_umask);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE((*backend)->TryAcquire(Request("job:x", kTokenA)).ok());
  EXPECT_EQ((*backend)->capabilities().scope, StoreScope::kHost);

  const std::string db = state_dir + "/leases.db";
  ASSERT_TRUE(Exists(db));
  EXPECT_EQ(ModeOf(db), 0666);
  EXPECT_EQ(ModeOf(state_dir), 01777) << "sticky: nobody removes another user's file";
  EXPECT_EQ(ModeOf(dir_.Join("state")), 0755);
  // SQLite gives the WAL the database file's mode; the write queue beside it too.
  ASSERT_TRUE(Exists(db + "-wal"));
  EXPECT_EQ(ModeOf(db + "-wal"), 0666);
  EXPECT_EQ(ModeOf(db + "-lhq"), 0666);
}

TEST_F(SqliteBackendTest, AnExplicitPathIsCreatedPrivate) {
  const std::string db = dir_.Join("private/deep/leases.db");
  // A permissive umask must not widen the modes.
  const mode_t old_umask = ::umask(0);
  Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(db);
  ::umask(old_umask);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE((*backend)->TryAcquire(Request("job:x", kTokenA)).ok());
  EXPECT_EQ((*backend)->capabilities().scope, StoreScope::kUser);
  EXPECT_EQ(ModeOf(db), 0600);
  EXPECT_EQ(ModeOf(dir_.Join("private/deep")), 0700);
  EXPECT_EQ(ModeOf(dir_.Join("private")), 0700);
  ASSERT_TRUE(Exists(db + "-wal"));
  EXPECT_EQ(ModeOf(db + "-wal") & 0077, 0);
  EXPECT_EQ(ModeOf(db + "-lhq"), 0600);
}

TEST_F(SqliteBackendTest, ExistingDirectoriesKeepTheirMode) {
  const std::string existing = dir_.Join("shared");
  ASSERT_EQ(::mkdir(existing.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(existing.c_str(), 0755), 0);
  Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(existing + "/new/leases.db");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  EXPECT_EQ(ModeOf(existing), 0755);
  EXPECT_EQ(ModeOf(existing + "/new"), 0700);
}

TEST_F(SqliteBackendTest, RelativePathIsRelativeToWorkingDirectory) {
  const std::string old_cwd = std::filesystem::current_path();
  ASSERT_EQ(::chdir(dir_.path().c_str()), 0);
  Result<std::shared_ptr<Backend>> backend = OpenSqliteBackend(SqliteUrl("rel/leases.db"));
  ASSERT_EQ(::chdir(old_cwd.c_str()), 0);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  EXPECT_TRUE(Exists(dir_.Join("rel/leases.db")));
}

TEST_F(SqliteBackendTest, DatabaseIsMarkedAndUsesWal) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryText("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.QueryInt("PRAGMA application_id"), kSqliteApplicationId);
  EXPECT_EQ(raw.QueryInt("PRAGMA user_version"), kSqliteSchemaVersion);
}

TEST_F(SqliteBackendTest, SchemeAndCapabilities) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->scheme(), "sqlite");
  Capabilities caps = backend->capabilities();
  EXPECT_EQ(caps.scope, StoreScope::kUser) << "a file made 0600";
  EXPECT_NE(backend->facets().wait, nullptr);
  EXPECT_TRUE(caps.fencing_survives_restart);
  // A free key: nothing to wait for.
  EXPECT_TRUE(backend->WaitForChange("job:x", BootClock::now() + seconds(1), {}).ok());
}

// ---------------------------------------------------------------------------------------------
// Waiting (the change generations in <db>-lhq) and the host write queue.

TEST_F(SqliteBackendTest, ReleaseInAnotherHandleWakesAWaiterLongBeforeTheTtl) {
  auto holder = MustOpen();
  auto waiter = MustOpen();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(waiter, nullptr);
  ASSERT_TRUE(holder->TryAcquire(Request("job:x", kTokenA, seconds(120))).ok());
  std::thread releaser([&holder] {
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(holder->Release("job:x", kTokenA).ok());
  });
  // Only the release can end this wait with OK: the grant outlives the deadline.
  Status woken = waiter->WaitForChange("job:x", BootClock::now() + seconds(60), {});
  releaser.join();
  EXPECT_TRUE(woken.ok()) << woken.ToString();
  EXPECT_TRUE(waiter->TryAcquire(Request("job:x", kTokenB)).ok());
}

TEST_F(SqliteBackendTest, ForceReleaseAndFinishWakeWaiters) {
  auto holder = MustOpen();
  auto waiter = MustOpen();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(waiter, nullptr);
  ASSERT_TRUE(holder->TryAcquire(Request("job:f", kTokenA, seconds(120))).ok());
  std::thread forcer([&holder] {
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(holder->ForceRelease("job:f").ok());
  });
  EXPECT_TRUE(waiter->WaitForChange("job:f", BootClock::now() + seconds(60), {}).ok());
  forcer.join();

  ASSERT_TRUE(holder->TryAcquire(Request("job:k", kTokenA, seconds(120))).ok());
  std::thread finisher([&holder] {
    std::this_thread::sleep_for(milliseconds(100));
    // Kept for a short while: the waiter must learn the new end and wake at it.
    EXPECT_TRUE(
        holder->Finish({.key = "job:k", .owner_token = kTokenA, .keep = milliseconds(200)}).ok());
  });
  Status woken = waiter->WaitForChange("job:k", BootClock::now() + seconds(60), {});
  finisher.join();
  EXPECT_TRUE(woken.ok()) << woken.ToString();
}

TEST_F(SqliteBackendTest, AWaiterWakesAtTheHoldersExpiryWithoutARelease) {
  auto holder = MustOpen();
  auto waiter = MustOpen();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(waiter, nullptr);
  ASSERT_TRUE(holder->TryAcquire(Request("job:x", kTokenA, milliseconds(200))).ok());
  // Nobody releases (as after a kill -9): the wait ends at the grant's expiry, not the deadline.
  Status woken = waiter->WaitForChange("job:x", BootClock::now() + seconds(60), {});
  EXPECT_TRUE(woken.ok()) << woken.ToString();
  EXPECT_TRUE(waiter->TryAcquire(Request("job:x", kTokenB)).ok());
}

TEST_F(SqliteBackendTest, WaitForChangeEndsAtTheDeadlineAndOnCancel) {
  auto holder = MustOpen();
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(holder->TryAcquire(Request("job:x", kTokenA, seconds(120))).ok());
  EXPECT_EQ(holder->WaitForChange("job:x", BootClock::now() + milliseconds(50), {}).code(),
            StatusCode::kDeadlineExceeded);
  std::stop_source stop;
  std::thread canceller([&stop] {
    std::this_thread::sleep_for(milliseconds(100));
    stop.request_stop();
  });
  EXPECT_EQ(holder->WaitForChange("job:x", BootClock::now() + seconds(60), stop.get_token()).code(),
            StatusCode::kCancelled);
  canceller.join();
}

TEST_F(SqliteBackendTest, AWriteQueueHolderKilledWithSigkillDoesNotBlockOthers) {
#if defined(__SANITIZE_THREAD__)
  // gcc 12's ThreadSanitizer does not count a timed lock that returns EOWNERDEAD (the robust
  // mutex handed on by the kernel) as taken, and reports its unlock; the normal and ASan runs
  // test this.
  GTEST_SKIP() << "ThreadSanitizer does not model a robust mutex's EOWNERDEAD from a timed lock";
#endif
  auto backend = MustOpen(seconds(5));
  ASSERT_NE(backend, nullptr);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    Result<std::unique_ptr<SqliteHostQueue>> queue = SqliteHostQueue::Open(DbPath(), "any");
    if (!queue.ok() || !(*queue)->Lock(seconds(5)).ok()) {
      ::_exit(1);
    }
    (void)!::write(ready[1], "x", 1);
    ::pause();  // Killed holding the queue.
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // The kernel handed the robust mutex on; the next writer proceeds.
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_TRUE(backend->Release("job:x", kTokenA).ok());
}

TEST_F(SqliteBackendTest, AWriterWaitsInTheQueueAtMostBusyTimeout) {
  auto backend = MustOpen(milliseconds(100));
  ASSERT_NE(backend, nullptr);
  Result<std::unique_ptr<SqliteHostQueue>> other = SqliteHostQueue::Open(DbPath(), "any");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  std::atomic<bool> held{false};
  std::atomic<bool> done{false};
  std::thread holder([&] {
    // Lock and Unlock on one thread (a PI mutex belongs to a thread).
    EXPECT_TRUE((*other)->Lock(seconds(5)).ok());
    held = true;
    while (!done) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    (*other)->Unlock();
  });
  while (!held) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  EXPECT_EQ(grant.status().code(), StatusCode::kUnavailable) << grant.status().ToString();
  EXPECT_THAT(std::string(grant.status().message()), HasSubstr("busy_timeout"));
  done = true;
  holder.join();
  EXPECT_TRUE(backend->TryAcquire(Request("job:x", kTokenA)).ok());
}

TEST_F(SqliteBackendTest, UnknownUrlParameterIsRejected) {
  Result<std::shared_ptr<Backend>> backend =
      OpenSqliteBackend(SqliteUrl(DbPath(), {{"mode", "table"}}));
  ASSERT_EQ(backend.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("mode"));
}

TEST_F(SqliteBackendTest, MutationsTakeTheWriteLockAndTimeOutAsUnavailable) {
  auto backend = MustOpen(milliseconds(50));
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(Request("job:held", kTokenA)).ok());

  RawDb other(DbPath());
  other.Exec("BEGIN IMMEDIATE");  // Another process holds the write lock.
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenB));
  ASSERT_EQ(grant.status().code(), StatusCode::kUnavailable) << grant.status().ToString();
  EXPECT_THAT(std::string(grant.status().message()), HasSubstr(DbPath()));
  EXPECT_FALSE(grant.status().detail().empty());
  EXPECT_EQ(backend->Renew({.key = "job:held", .owner_token = kTokenA, .ttl = seconds(10)}).code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(backend->Release("job:held", kTokenA).code(), StatusCode::kUnavailable);
  EXPECT_EQ(backend->ForceRelease("job:held").status().code(), StatusCode::kUnavailable);
  // WAL: readers are not blocked by the writer.
  Result<std::optional<LeaseInfo>> info = backend->Inspect("job:held");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->has_value());
  EXPECT_TRUE(backend->List("job:").ok());
  other.Exec("COMMIT");

  EXPECT_TRUE(backend->TryAcquire(Request("job:x", kTokenB)).ok());
  EXPECT_TRUE(backend->Release("job:held", kTokenA).ok());
}

TEST_F(SqliteBackendTest, BusyTimeoutWaitsForAnotherWriter) {
  auto backend = MustOpen(seconds(10));
  ASSERT_NE(backend, nullptr);
  RawDb other(DbPath());
  other.Exec("BEGIN IMMEDIATE");
  std::thread committer([&other] {
    std::this_thread::sleep_for(milliseconds(100));
    other.Exec("COMMIT");
  });
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  committer.join();
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(grant->fencing_token, 1u);
}

// ---------------------------------------------------------------------------------------------
// Lease operations.

TEST_F(SqliteBackendTest, HeldByAnotherNamesHolderTokenPrefixFencingTokenAndTimeLeft) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> first = backend->TryAcquire(Request("job:x", kTokenA, seconds(10), "host:42"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->fencing_token, 1u);
  EXPECT_EQ(first->ttl, seconds(10));

  Result<Grant> second = backend->TryAcquire(Request("job:x", kTokenB, seconds(10), "web:7"));
  ASSERT_EQ(second.status().code(), StatusCode::kHeldByAnother);
  const std::string message(second.status().message());
  EXPECT_THAT(message, HasSubstr("job:x is held by host:42 (fencing token 1, "));
  EXPECT_THAT(message, HasSubstr("s left)"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr(kTokenA)));
  const LeaseInfo* holder = second.error().holder();
  ASSERT_NE(holder, nullptr);
  EXPECT_EQ(holder->key, "job:x");
  EXPECT_EQ(holder->holder, "host:42");
  EXPECT_EQ(holder->token_prefix, "aaaaaaaa");
  EXPECT_EQ(holder->fencing_token, 1u);
  EXPECT_EQ(holder->ttl, seconds(10));
  EXPECT_GT(holder->remaining, seconds(5));
  EXPECT_LE(holder->remaining, seconds(10));
}

TEST_F(SqliteBackendTest, FencingTokensIncreasePerKeyIndependently) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->TryAcquire(Request("a", kTokenA)).value().fencing_token, 1u);
  EXPECT_EQ(backend->TryAcquire(Request("b", kTokenB)).value().fencing_token, 1u);
  ASSERT_TRUE(backend->Release("a", kTokenA).ok());
  EXPECT_EQ(backend->TryAcquire(Request("a", kTokenC)).value().fencing_token, 2u);
  ASSERT_TRUE(backend->Release("a", kTokenC).ok());
  EXPECT_EQ(backend->TryAcquire(Request("a", kTokenA)).value().fencing_token, 3u);
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT last FROM fencing_counters WHERE key = 'a'"), 3);
  EXPECT_EQ(raw.QueryInt("SELECT last FROM fencing_counters WHERE key = 'b'"), 1);
}

TEST_F(SqliteBackendTest, ExpiredGrantIsTakenOverWithTheNextFencingToken) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(Request("job:x", kTokenA, kShortTtl)).ok());
  std::this_thread::sleep_for(kPastShortTtl);

  Result<std::optional<LeaseInfo>> info = backend->Inspect("job:x");
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->has_value());
  Result<Grant> taken = backend->TryAcquire(Request("job:x", kTokenB));
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_EQ(taken->fencing_token, 2u);

  Status renew = backend->Renew({.key = "job:x", .owner_token = kTokenA, .ttl = seconds(10)});
  EXPECT_EQ(renew.code(), StatusCode::kLost);
  EXPECT_THAT(std::string(renew.message()), HasSubstr("taken over by another owner"));
  EXPECT_EQ(backend->Release("job:x", kTokenA).code(), StatusCode::kLost);
  // The old owner's release deleted nothing of the new owner's.
  info = backend->Inspect("job:x");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->token_prefix, "bbbbbbbb");
}

TEST_F(SqliteBackendTest, RenewExtendsOnlyTheOwnersLiveGrant) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(Request("job:x", kTokenA, milliseconds(300))).ok());
  ASSERT_TRUE(backend->Renew({.key = "job:x", .owner_token = kTokenA, .ttl = seconds(10)}).ok());
  std::this_thread::sleep_for(milliseconds(350));  // Past the original TTL.
  Result<std::optional<LeaseInfo>> info = backend->Inspect("job:x");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->ttl, seconds(10));
  EXPECT_GT((*info)->remaining, seconds(5));
  EXPECT_EQ(backend->TryAcquire(Request("job:x", kTokenB)).status().code(),
            StatusCode::kHeldByAnother);

  Status wrong = backend->Renew({.key = "job:x", .owner_token = kTokenB, .ttl = seconds(10)});
  EXPECT_EQ(wrong.code(), StatusCode::kLost);
  EXPECT_THAT(std::string(wrong.message()), HasSubstr("lease job:x was lost"));
  Status absent = backend->Renew({.key = "job:none", .owner_token = kTokenA, .ttl = seconds(1)});
  EXPECT_EQ(absent.code(), StatusCode::kLost);
  EXPECT_THAT(std::string(absent.message()), HasSubstr("no longer exists"));
}

TEST_F(SqliteBackendTest, RenewAfterExpiryIsLostEvenWithoutATakeover) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(Request("job:x", kTokenA, kShortTtl)).ok());
  std::this_thread::sleep_for(kPastShortTtl);
  Status renew = backend->Renew({.key = "job:x", .owner_token = kTokenA, .ttl = seconds(10)});
  EXPECT_EQ(renew.code(), StatusCode::kLost);
  EXPECT_THAT(std::string(renew.message()), HasSubstr("lease job:x was lost: expired"));
  // A lost renew must not have revived the grant.
  Result<std::optional<LeaseInfo>> info = backend->Inspect("job:x");
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->has_value());
}

TEST_F(SqliteBackendTest, RenewManyReturnsOneStatusPerRequestInOrder) {
  auto backend = MustOpen(milliseconds(50));
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(Request("a", kTokenA, seconds(1))).ok());
  ASSERT_TRUE(backend->TryAcquire(Request("b", kTokenB, seconds(1))).ok());
  std::vector<RenewRequest> requests = {
      {.key = "a", .owner_token = kTokenA, .ttl = seconds(20)},
      {.key = "b", .owner_token = kTokenA, .ttl = seconds(20)},  // Not ours.
      {.key = "c", .owner_token = kTokenC, .ttl = seconds(20)},  // Absent.
      {.key = "b", .owner_token = kTokenB, .ttl = seconds(30)},
  };
  std::vector<Status> results = backend->RenewMany(requests);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_TRUE(results[0].ok()) << results[0].ToString();
  EXPECT_EQ(results[1].code(), StatusCode::kLost);
  EXPECT_EQ(results[2].code(), StatusCode::kLost);
  EXPECT_TRUE(results[3].ok()) << results[3].ToString();
  EXPECT_EQ(backend->Inspect("a").value()->ttl, seconds(20));
  EXPECT_EQ(backend->Inspect("b").value()->ttl, seconds(30));
  EXPECT_TRUE(backend->RenewMany({}).empty());

  // One transaction: when the write lock cannot be had, every request reports it.
  RawDb other(DbPath());
  other.Exec("BEGIN IMMEDIATE");
  results = backend->RenewMany(requests);
  other.Exec("COMMIT");
  ASSERT_EQ(results.size(), 4u);
  for (const Status& status : results) {
    EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  }
}

TEST_F(SqliteBackendTest, ReleaseDeletesOnlyTheOwnersLiveGrant) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(Request("job:x", kTokenA)).ok());
  Status wrong = backend->Release("job:x", kTokenB);
  EXPECT_EQ(wrong.code(), StatusCode::kLost);
  EXPECT_TRUE(backend->Inspect("job:x").value().has_value());

  EXPECT_TRUE(backend->Release("job:x", kTokenA).ok());
  EXPECT_FALSE(backend->Inspect("job:x").value().has_value());
  EXPECT_EQ(backend->Release("job:x", kTokenA).code(), StatusCode::kLost);
  EXPECT_EQ(backend->Release("job:never", kTokenA).code(), StatusCode::kLost);
  EXPECT_EQ(backend->TryAcquire(Request("job:x", kTokenB)).value().fencing_token, 2u);
}

TEST_F(SqliteBackendTest, ReleaseOfOwnExpiredGrantIsLostAndTidiesTheRow) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(Request("job:x", kTokenA, kShortTtl)).ok());
  std::this_thread::sleep_for(kPastShortTtl);
  Status release = backend->Release("job:x", kTokenA);
  EXPECT_EQ(release.code(), StatusCode::kLost);
  EXPECT_THAT(std::string(release.message()), HasSubstr("expired"));
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM grants WHERE key = 'job:x'"), 0);
  EXPECT_EQ(raw.QueryInt("SELECT last FROM fencing_counters WHERE key = 'job:x'"), 1);
}

TEST_F(SqliteBackendTest, ForceReleaseDeletesAnyGrantAndKeepsTheCounter) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(Request("job:x", kTokenA)).ok());
  Result<bool> forced = backend->ForceRelease("job:x");
  ASSERT_TRUE(forced.ok());
  EXPECT_TRUE(*forced);
  EXPECT_FALSE(backend->ForceRelease("job:x").value());
  EXPECT_FALSE(backend->ForceRelease("job:never").value());

  Status renew = backend->Renew({.key = "job:x", .owner_token = kTokenA, .ttl = seconds(10)});
  EXPECT_EQ(renew.code(), StatusCode::kLost);
  EXPECT_THAT(std::string(renew.message()), HasSubstr("released by force"));
  EXPECT_EQ(backend->TryAcquire(Request("job:x", kTokenB)).value().fencing_token, 2u);

  // An expired grant is not live: force-releasing it reports false.
  ASSERT_TRUE(backend->TryAcquire(Request("job:y", kTokenA, kShortTtl)).ok());
  std::this_thread::sleep_for(kPastShortTtl);
  EXPECT_FALSE(backend->ForceRelease("job:y").value());
}

TEST_F(SqliteBackendTest, InspectAndListShowLiveGrantsOnlyOrderedByKey) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(Request("job:dead", TokenNumber(1), kShortTtl)).ok());
  std::this_thread::sleep_for(kPastShortTtl);
  int n = 2;
  for (const char* key :
       {"job:b", "job:a", "job:%x", "job_1", "jobs", "other", "job:\xC3\xA9t\xC3\xA9"}) {
    ASSERT_TRUE(backend->TryAcquire(Request(key, TokenNumber(n++), seconds(7), "h")).ok()) << key;
  }

  Result<std::vector<LeaseInfo>> jobs = backend->List("job:");
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  EXPECT_THAT(Keys(*jobs), ElementsAre("job:%x", "job:a", "job:b", "job:\xC3\xA9t\xC3\xA9"));
  // LIKE wildcards in a prefix are plain characters.
  EXPECT_THAT(Keys(backend->List("job_").value()), ElementsAre("job_1"));
  EXPECT_TRUE(backend->List("job%").value().empty());
  EXPECT_THAT(Keys(backend->List("job:\xC3\xA9").value()), ElementsAre("job:\xC3\xA9t\xC3\xA9"));
  EXPECT_THAT(
      Keys(backend->List("").value()),
      ElementsAre("job:%x", "job:a", "job:b", "job:\xC3\xA9t\xC3\xA9", "job_1", "jobs", "other"));
  // A default-constructed view (Store::List's default prefix, data() null) is the empty prefix,
  // not a NULL that matches no key.
  EXPECT_EQ(backend->List(std::string_view()).value().size(), 7u);

  for (const LeaseInfo& info : *jobs) {
    EXPECT_EQ(info.holder, "h");
    EXPECT_EQ(info.ttl, seconds(7));
    EXPECT_GT(info.remaining, milliseconds(0));
    EXPECT_LE(info.remaining, seconds(7));
    EXPECT_EQ(info.token_prefix.size(), 8u);
    EXPECT_GE(info.fencing_token, 1u);
  }
  EXPECT_FALSE(backend->Inspect("job:dead").value().has_value());
  Result<std::optional<LeaseInfo>> a = backend->Inspect("job:a");
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ((*a)->token_prefix, TokenNumber(3).substr(0, 8));
}

// ---------------------------------------------------------------------------------------------
// Boot ids and durability of the fencing counter.

TEST_F(SqliteBackendTest, GrantsFromAnotherBootCountAsExpiredAndTheCounterContinues) {
  // Its holder stays open throughout: a grant whose holder is gone is not live in any boot.
  auto before = MustOpen(seconds(5), "boot-before");
  ASSERT_NE(before, nullptr);
  EXPECT_EQ(before->TryAcquire(Request("job:x", kTokenA)).value().fencing_token, 1u);
  {
    // Another handle in the same boot: the grant is live.
    auto same_boot = MustOpen(seconds(5), "boot-before");
    ASSERT_NE(same_boot, nullptr);
    EXPECT_TRUE(same_boot->Inspect("job:x").value().has_value());
  }
  auto after = MustOpen(seconds(5), "boot-after");
  ASSERT_NE(after, nullptr);
  EXPECT_FALSE(after->Inspect("job:x").value().has_value());
  EXPECT_TRUE(after->List("").value().empty());
  Status renew = after->Renew({.key = "job:x", .owner_token = kTokenA, .ttl = seconds(10)});
  EXPECT_EQ(renew.code(), StatusCode::kLost);
  EXPECT_THAT(std::string(renew.message()), HasSubstr("rebooted"));
  EXPECT_EQ(after->TryAcquire(Request("job:x", kTokenB)).value().fencing_token, 2u);
}

TEST_F(SqliteBackendTest, PlantedGrantWithForeignBootIdIsIgnored) {
  {
    auto backend = MustOpen();
    ASSERT_NE(backend, nullptr);
    EXPECT_FALSE(backend->boot_id().empty());
  }
  {
    RawDb raw(DbPath());
    // A grant far from expiry on CLOCK_BOOTTIME, but made under another boot.
    raw.Exec(
        "INSERT INTO grants (key, token, holder, fencing_token, boot_id, ttl_ns, expires_ns) "
        "VALUES ('job:x', 'dddddddd444444444444444444444444', 'old', 41, "
        "'00000000-0000-0000-0000-000000000000', 10000000000, 9223372036854775807);"
        "INSERT INTO fencing_counters (key, last) VALUES ('job:x', 41);");
  }
  auto backend = MustOpen();  // The real kernel boot id.
  ASSERT_NE(backend, nullptr);
  EXPECT_FALSE(backend->Inspect("job:x").value().has_value());
  EXPECT_TRUE(backend->List("job").value().empty());
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(grant->fencing_token, 42u);
}

// ---------------------------------------------------------------------------------------------
// Files that are not leasehold databases: reported, never modified or recreated.

TEST_F(SqliteBackendTest, TextFileIsRejectedAndLeftUntouched) {
  for (const std::string& contents :
       {std::string("hi\n"), std::string(5000, 'x') + "\nnot a database\n"}) {
    WriteFile(DbPath(), contents);
    Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(DbPath());
    ASSERT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status().ToString();
    EXPECT_THAT(std::string(backend.status().message()), HasSubstr(DbPath()));
    EXPECT_THAT(std::string(backend.status().message()), HasSubstr("not a leasehold database"));
    EXPECT_FALSE(backend.status().detail().empty());
    EXPECT_EQ(ReadFile(DbPath()), contents);
    EXPECT_FALSE(Exists(DbPath() + "-wal"));
  }
}

TEST_F(SqliteBackendTest, OtherApplicationsDatabaseIsRejectedAndLeftUntouched) {
  {
    RawDb raw(DbPath());
    raw.Exec(
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT);"
        "INSERT INTO customers (name) VALUES ('ann');");
  }
  const std::string before = ReadFile(DbPath());
  Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(DbPath());
  ASSERT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status().ToString();
  EXPECT_THAT(std::string(backend.status().message()),
              HasSubstr(DbPath() + " is not a leasehold database"));
  EXPECT_EQ(ReadFile(DbPath()), before);
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryText("PRAGMA journal_mode"), "delete");
}

TEST_F(SqliteBackendTest, EmptyDatabaseOfAnotherApplicationIdIsRejected) {
  {
    RawDb raw(DbPath());
    raw.Exec("PRAGMA application_id = 1234");
  }
  const std::string before = ReadFile(DbPath());
  Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(DbPath());
  ASSERT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status().ToString();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("not a leasehold database"));
  EXPECT_EQ(ReadFile(DbPath()), before);
}

TEST_F(SqliteBackendTest, EmptyFileIsInitialised) {
  WriteFile(DbPath(), "");
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  EXPECT_TRUE(backend->TryAcquire(Request("job:x", kTokenA)).ok());
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("PRAGMA application_id"), kSqliteApplicationId);
}

TEST_F(SqliteBackendTest, SqliteDatabaseWithoutTablesIsInitialised) {
  {
    RawDb raw(DbPath());
    raw.Exec("CREATE TABLE t (x); DROP TABLE t;");
  }
  ASSERT_GT(ReadFile(DbPath()).size(), 0u);
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  EXPECT_TRUE(backend->TryAcquire(Request("job:x", kTokenA)).ok());
}

TEST_F(SqliteBackendTest, NewerSchemaVersionIsRejected) {
  ASSERT_NE(MustOpen(), nullptr);  // Closed at once: the WAL is checkpointed away.
  {
    RawDb raw(DbPath());
    raw.Exec(fmt::format("PRAGMA user_version = {}", kSqliteSchemaVersion + 1));
  }
  Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(DbPath());
  ASSERT_EQ(backend.status().code(), StatusCode::kUnimplemented) << backend.status().ToString();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("newer leasehold"));
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr(DbPath()));
}

// The schema of version 1 exactly as its builds created it (records came later, additively,
// under the same version: a file may have it or not).
constexpr char kVersion1SchemaSql[] = R"sql(
CREATE TABLE fencing_counters (
  key  TEXT PRIMARY KEY NOT NULL,
  last INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE grants (
  key           TEXT PRIMARY KEY NOT NULL,
  token         TEXT NOT NULL,
  holder        TEXT NOT NULL,
  fencing_token INTEGER NOT NULL,
  boot_id       TEXT NOT NULL,
  ttl_ns        INTEGER NOT NULL,
  expires_ns    INTEGER NOT NULL
) WITHOUT ROWID;
PRAGMA application_id = 1279607123;
PRAGMA user_version = 1;
)sql";

// Version 1's statements that a version 1 binary prepared at open: its live-grant read and its
// grant write (they name no slot, mode or limit).
constexpr char kVersion1SelectLiveGrantSql[] =
    "SELECT key, holder, token, fencing_token, ttl_ns, expires_ns FROM grants "
    "WHERE key = ?1 AND boot_id = ?2 AND CAST(expires_ns AS INTEGER) > ?3";
constexpr char kVersion1PutGrantSql[] =
    "INSERT OR REPLACE INTO grants (key, token, holder, fencing_token, boot_id, ttl_ns, "
    "expires_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

std::string RealBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

std::int64_t BootNowNs() {
  return BootClock::now().time_since_epoch().count();
}

// Writes a version 1 file at `path` with a live grant of job:x (owner kTokenA, fencing token 7,
// 60 s left) made in this boot, as a version 1 binary would have left it.
void WriteVersion1File(const std::string& path, bool with_records) {
  RawDb raw(path);
  raw.Exec(kVersion1SchemaSql);
  if (with_records) {
    raw.Exec(
        "CREATE TABLE records (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL, "
        "expires_unix_ns INTEGER NOT NULL) WITHOUT ROWID;");
  }
  raw.Exec(
      fmt::format("INSERT INTO grants VALUES ('job:x', '{}', 'old:1', 7, '{}', 60000000000, {});"
                  "INSERT INTO fencing_counters VALUES ('job:x', 7);",
                  kTokenA, RealBootId(), BootNowNs() + 60'000'000'000));
}

TEST_F(SqliteBackendTest, AVersion1FileIsMigratedAndKeepsItsLiveGrants) {
  for (const bool with_records : {false, true}) {
    SCOPED_TRACE(with_records ? "with records" : "made before records");
    std::filesystem::remove(DbPath());
    WriteVersion1File(DbPath(), with_records);
    auto backend = MustOpen();
    ASSERT_NE(backend, nullptr);
    {
      RawDb raw(DbPath());
      EXPECT_EQ(raw.QueryInt("PRAGMA user_version"), 2);
      EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM sqlite_schema WHERE name = 'records'"), 1);
      EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM sqlite_schema WHERE name = 'writer_intents'"),
                1);
      EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM sqlite_schema WHERE name = 'grants_v2'"), 0);
      EXPECT_EQ(raw.QueryText("SELECT slot || ' ' || mode || ' ' || lease_limit FROM grants"),
                "0 exclusive 1");
    }
    auto info = backend->Inspect("job:x");
    ASSERT_TRUE(info.ok() && info->has_value()) << "the live grant survives the upgrade";
    EXPECT_EQ((*info)->holder, "old:1");
    EXPECT_EQ((*info)->fencing_token, 7u);
    EXPECT_EQ((*info)->mode, LeaseMode::kExclusive);
    EXPECT_EQ((*info)->limit, 1u);
    EXPECT_EQ((*info)->slot, 0u);
    EXPECT_EQ(backend->TryAcquire(Request("job:x", kTokenB)).status().code(),
              StatusCode::kHeldByAnother);
    GrantRequest shared = Request("job:x", kTokenB);
    shared.mode = LeaseMode::kShared;
    EXPECT_EQ(backend->TryAcquire(shared).status().code(), StatusCode::kHeldByAnother);
    // Its owner renews, finishes with a record and releases it as before.
    EXPECT_TRUE(backend->Renew({.key = "job:x", .owner_token = kTokenA, .ttl = seconds(10)}).ok());
    ASSERT_TRUE(backend
                    ->Finish({.key = "job:x",
                              .owner_token = kTokenA,
                              .record = std::string("r\0b", 3),
                              .record_ttl = std::chrono::seconds(10)})
                    .ok());
    auto record = backend->ReadRecord("job:x");
    ASSERT_TRUE(record.ok() && record->has_value()) << record.status().ToString();
    EXPECT_EQ(**record, std::string("r\0b", 3)) << "records are bytes, NULs included";
    EXPECT_EQ(backend->TryAcquire(Request("job:x", kTokenB)).value().fencing_token, 8u)
        << "the counter goes on";
    // Opened again (while the grant's holder lives): already version 2, nothing to migrate.
    auto again = MustOpen();
    ASSERT_NE(again, nullptr);
    EXPECT_EQ(again->Inspect("job:x").value()->fencing_token, 8u);
  }
}

TEST_F(SqliteBackendTest, AVersion1ConnectionOpenDuringTheMigrationKeepsWorkingExclusively) {
  WriteVersion1File(DbPath(), /*with_records=*/true);
  // A version 1 process that had the file open: its statements were prepared against the old
  // table.
  RawDb old(DbPath());
  sqlite3_stmt* select = nullptr;
  sqlite3_stmt* put = nullptr;
  ASSERT_EQ(sqlite3_prepare_v3(old.db(), kVersion1SelectLiveGrantSql, -1, SQLITE_PREPARE_PERSISTENT,
                               &select, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_prepare_v3(old.db(), kVersion1PutGrantSql, -1, SQLITE_PREPARE_PERSISTENT, &put,
                               nullptr),
            SQLITE_OK);
  auto backend = MustOpen();  // migrates
  ASSERT_NE(backend, nullptr);
  GrantRequest semaphore = Request("job:s", kTokenB);
  semaphore.limit = 3;
  ASSERT_EQ(backend->TryAcquire(semaphore).value().slot, 0u);
  semaphore.owner_token = kTokenC;
  ASSERT_EQ(backend->TryAcquire(semaphore).value().slot, 1u);

  // Its live-grant read, compiled again against the new table, sees the semaphore's grants.
  const std::string boot_id = RealBootId();
  sqlite3_bind_text(select, 1, "job:s", -1, SQLITE_STATIC);
  sqlite3_bind_text(select, 2, boot_id.c_str(), -1, SQLITE_STATIC);
  sqlite3_bind_int64(select, 3, BootNowNs());
  EXPECT_EQ(sqlite3_step(select), SQLITE_ROW) << sqlite3_errmsg(old.db());
  sqlite3_finalize(select);
  // Its grant of a free key is an exclusive grant in slot 0 to the new version.
  sqlite3_bind_text(put, 1, "job:o", -1, SQLITE_STATIC);
  sqlite3_bind_text(put, 2, "dddddddd444444444444444444444444", -1, SQLITE_STATIC);
  sqlite3_bind_text(put, 3, "old:2", -1, SQLITE_STATIC);
  sqlite3_bind_int64(put, 4, 1);
  sqlite3_bind_text(put, 5, boot_id.c_str(), -1, SQLITE_STATIC);
  sqlite3_bind_int64(put, 6, 60'000'000'000);
  sqlite3_bind_int64(put, 7, BootNowNs() + 60'000'000'000);
  EXPECT_EQ(sqlite3_step(put), SQLITE_DONE) << sqlite3_errmsg(old.db());
  sqlite3_finalize(put);
  auto info = backend->Inspect("job:o");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->holder, "old:2");
  EXPECT_EQ((*info)->mode, LeaseMode::kExclusive);
  EXPECT_EQ((*info)->limit, 1u);
  semaphore.key = "job:o";
  EXPECT_EQ(backend->TryAcquire(semaphore).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(SqliteBackendTest, CorruptDatabaseIsReportedAndLeftUntouched) {
  {
    auto backend = MustOpen();
    ASSERT_NE(backend, nullptr);
    ASSERT_TRUE(backend->TryAcquire(Request("job:x", kTokenA)).ok());
  }
  ASSERT_FALSE(Exists(DbPath() + "-wal"));
  const std::string good = ReadFile(DbPath());
  ASSERT_GE(good.size(), 4096u);

  // Garbage in the schema page (after the 100-byte header), then in the header magic.
  std::string bad_schema = good;
  std::fill(bad_schema.begin() + 100, bad_schema.begin() + 4096, '\x55');
  std::string bad_magic = good;
  std::fill(bad_magic.begin(), bad_magic.begin() + 16, 'Z');
  for (const std::string& bad : {bad_schema, bad_magic}) {
    WriteFile(DbPath(), bad);
    Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(DbPath());
    ASSERT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status().ToString();
    EXPECT_THAT(std::string(backend.status().message()),
                HasSubstr(DbPath() + " is not a leasehold database or is corrupt"));
    EXPECT_THAT(std::string(backend.status().detail()), HasSubstr("sqlite3 error"));
    EXPECT_EQ(ReadFile(DbPath()), bad);
  }
}

TEST_F(SqliteBackendTest, PathUnderARegularFileIsPermissionDenied) {
  WriteFile(dir_.Join("file"), "x");
  const std::string path = dir_.Join("file/sub/leases.db");
  Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(path);
  ASSERT_EQ(backend.status().code(), StatusCode::kPermissionDenied) << backend.status().ToString();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("Not a directory"));

  // /proc refuses new directories even to root.
  backend = OpenAt("/proc/leasehold-sqlite-test/leases.db");
  EXPECT_EQ(backend.status().code(), StatusCode::kPermissionDenied) << backend.status().ToString();
}

TEST_F(SqliteBackendTest, DirectoryAsDatabasePathIsInvalidArgument) {
  Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(dir_.path());
  ASSERT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status().ToString();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr(dir_.path()));
}

TEST_F(SqliteBackendTest, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "root ignores permission bits";
  }
  WriteFile(DbPath(), "");
  ASSERT_EQ(::chmod(DbPath().c_str(), 0), 0);
  Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(DbPath());
  ASSERT_EQ(backend.status().code(), StatusCode::kPermissionDenied) << backend.status().ToString();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr(DbPath()));
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("Permission denied"));
}

TEST_F(SqliteBackendTest, UnwritableDirectoryIsPermissionDenied) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "root ignores permission bits";
  }
  const std::string locked = dir_.Join("locked");
  ASSERT_EQ(::mkdir(locked.c_str(), 0500), 0);
  Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(locked + "/leases.db");
  ASSERT_EQ(backend.status().code(), StatusCode::kPermissionDenied) << backend.status().ToString();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr(locked));
}

// ---------------------------------------------------------------------------------------------
// Sharing: threads on one backend, processes on one file.

TEST_F(SqliteBackendTest, ThreadsSharingOneBackendNeverHoldAKeyTogether) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  std::atomic<int> holders{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> errors{0};
  std::vector<std::vector<FencingToken>> tokens(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const std::string token = TokenNumber(t * 1000 + i);
        Result<Grant> grant = backend->TryAcquire(Request("job:shared", token));
        if (!grant.ok()) {
          if (grant.status().code() != StatusCode::kHeldByAnother) {
            ++errors;
          }
          continue;
        }
        if (holders.fetch_add(1) != 0) {
          ++overlaps;
        }
        tokens[t].push_back(grant->fencing_token);
        holders.fetch_sub(1);
        if (!backend->Release("job:shared", token).ok()) {
          ++errors;
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  std::set<FencingToken> distinct;
  std::size_t total = 0;
  for (const auto& per_thread : tokens) {
    total += per_thread.size();
    distinct.insert(per_thread.begin(), per_thread.end());
  }
  EXPECT_GT(total, 0u);
  EXPECT_EQ(distinct.size(), total);
  EXPECT_EQ(*distinct.rbegin(), total);  // 1..total, none skipped or repeated.
}

TEST_F(SqliteBackendTest, ProcessesSharingTheFileNeverHoldAKeyTogether) {
  ASSERT_NE(MustOpen(), nullptr);  // Create the database once; children open their own.
  constexpr int kProcesses = 4;
  constexpr int kRounds = 30;
  // Counts current holders across processes.
  void* shared = ::mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* holders = new (shared) std::atomic<int>(0);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);

  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(pipe_fds[0]);
      // Exit codes: 0 fine, 3 open failed, 4 unexpected status, 5 overlap.
      Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(DbPath(), seconds(10));
      if (!backend.ok()) {
        ::_exit(3);
      }
      int code = 0;
      for (int i = 0; i < kRounds; ++i) {
        const std::string token = TokenNumber(p * 1000 + i);
        Result<Grant> grant = (*backend)->TryAcquire(Request("job:shared", token));
        if (!grant.ok()) {
          if (grant.status().code() != StatusCode::kHeldByAnother) {
            code = 4;
          }
          continue;
        }
        if (holders->fetch_add(1) != 0) {
          code = 5;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        holders->fetch_sub(1);
        const FencingToken fencing_token = grant->fencing_token;
        if (::write(pipe_fds[1], &fencing_token, sizeof fencing_token) !=
            static_cast<ssize_t>(sizeof fencing_token)) {
          code = 4;
        }
        if (!(*backend)->Release("job:shared", token).ok()) {
          code = 4;
        }
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  ::close(pipe_fds[1]);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child " << pid;
  }
  std::vector<FencingToken> tokens;
  FencingToken token = 0;
  while (::read(pipe_fds[0], &token, sizeof token) == static_cast<ssize_t>(sizeof token)) {
    tokens.push_back(token);
  }
  ::close(pipe_fds[0]);
  ::munmap(shared, sizeof(std::atomic<int>));

  ASSERT_FALSE(tokens.empty());
  std::set<FencingToken> distinct(tokens.begin(), tokens.end());
  EXPECT_EQ(distinct.size(), tokens.size());
  EXPECT_EQ(*distinct.rbegin(), tokens.size());
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT last FROM fencing_counters WHERE key = 'job:shared'"),
            static_cast<std::int64_t>(tokens.size()));
}

// ---------------------------------------------------------------------------------------------
// Fenced writes: Sql ops in the grant's own BEGIN IMMEDIATE transaction.

FencedWriteRequest SqlWrite(std::string key, std::string token, FencingToken fence,
                            std::vector<std::pair<std::string, std::vector<std::string>>> ops) {
  FencedWriteRequest request{.key = std::move(key),
                             .owner_token = std::move(token),
                             .fencing_token = fence,
                             .store_key = {}};
  request.store_key = request.key;
  for (auto& [statement, params] : ops) {
    request.ops.push_back(
        {.kind = FencedOp::Kind::kSql, .key = std::move(statement), .params = std::move(params)});
  }
  return request;
}

constexpr char kCreateData[] = "CREATE TABLE IF NOT EXISTS data (k TEXT PRIMARY KEY, v TEXT)";
constexpr char kUpsertData[] =
    "INSERT INTO data (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v";

TEST_F(SqliteBackendTest, FencedWritesTakeSqlOpsOnly) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->fenced_ops(), FencedOpBit(FencedOp::Kind::kSql));
}

TEST_F(SqliteBackendTest, FencedWriteCommitsForTheHolderAndCountsChangedRowsOnly) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  auto wrote = backend->FencedWrite(SqlWrite(
      "job:x", kTokenA, grant->fencing_token,
      {{kCreateData, {}},
       {kUpsertData, {"a", "1"}},
       {"INSERT INTO data (k, v) VALUES (?1, ?2), (?3, ?2)", {"b", "2", "c"}},
       // After an INSERT, statements that change no rows count 0, not the INSERT's rows again.
       {kCreateData, {}},
       {"SELECT count(*) FROM data", {}},
       {"UPDATE data SET v = 'x' WHERE k IN ('a', 'b', 'c')", {}},
       {"DELETE FROM data WHERE k = $1", {"nothing"}}}));
  ASSERT_TRUE(wrote.ok()) << wrote.status().ToString();
  EXPECT_THAT(*wrote, ElementsAre(0, 1, 2, 0, 0, 3, 0));
  // The same grant writes any number of times (its token is equal every time).
  for (int i = 0; i < 20; ++i) {
    auto again = backend->FencedWrite(SqlWrite("job:x", kTokenA, grant->fencing_token,
                                               {{kUpsertData, {"a", std::to_string(i)}}}));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_THAT(*again, ElementsAre(1));
  }
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryText("SELECT v FROM data WHERE k = 'a'"), "19");
  EXPECT_TRUE(backend->Renew({.key = "job:x", .owner_token = kTokenA, .ttl = seconds(10)}).ok());
}

TEST_F(SqliteBackendTest, FencedWriteOfALowerTokenIsRefusedAndAHigherOneCommits) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> old = backend->TryAcquire(Request("job:x", kTokenA, seconds(10), "host:a"));
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE(backend
                  ->FencedWrite(SqlWrite("job:x", kTokenA, old->fencing_token,
                                         {{kCreateData, {}}, {kUpsertData, {"k", "a"}}}))
                  .ok());
  ASSERT_TRUE(backend->ForceRelease("job:x").ok());
  Result<Grant> newer = backend->TryAcquire(Request("job:x", kTokenB, seconds(10), "host:b"));
  ASSERT_TRUE(newer.ok());
  ASSERT_GT(newer->fencing_token, old->fencing_token);
  auto stale = backend->FencedWrite(
      SqlWrite("job:x", kTokenA, old->fencing_token, {{kUpsertData, {"k", "a-stale"}}}));
  ASSERT_EQ(stale.status().code(), StatusCode::kLost) << stale.status().ToString();
  EXPECT_THAT(
      std::string(stale.status().message()),
      HasSubstr(fmt::format("is now held by host:b under fencing token {}", newer->fencing_token)));
  // The owner token is what counts: the old owner claiming the newer number is refused too.
  EXPECT_EQ(backend
                ->FencedWrite(SqlWrite("job:x", kTokenA, newer->fencing_token,
                                       {{kUpsertData, {"k", "a-stale"}}}))
                .status()
                .code(),
            StatusCode::kLost);
  auto fresh = backend->FencedWrite(
      SqlWrite("job:x", kTokenB, newer->fencing_token, {{kUpsertData, {"k", "b"}}}));
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryText("SELECT v FROM data WHERE k = 'k'"), "b");
}

TEST_F(SqliteBackendTest, FencedWriteOfAnExpiredOrReleasedGrantIsRefused) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA, kShortTtl));
  ASSERT_TRUE(grant.ok());
  std::this_thread::sleep_for(kPastShortTtl);
  auto late =
      backend->FencedWrite(SqlWrite("job:x", kTokenA, grant->fencing_token, {{kCreateData, {}}}));
  ASSERT_EQ(late.status().code(), StatusCode::kLost) << late.status().ToString();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("is no longer held"));
  Result<Grant> again = backend->TryAcquire(Request("job:y", kTokenB));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(backend->Release("job:y", kTokenB).ok());
  EXPECT_EQ(
      backend->FencedWrite(SqlWrite("job:y", kTokenB, again->fencing_token, {{kCreateData, {}}}))
          .status()
          .code(),
      StatusCode::kLost);
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM sqlite_schema WHERE name = 'data'"), 0);
}

TEST_F(SqliteBackendTest, FencedWriteOfAGrantKeptAfterItsHolderIsRefused) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok());
  ASSERT_TRUE(backend->Finish({.key = "job:x", .owner_token = kTokenA, .keep = seconds(30)}).ok());
  auto kept =
      backend->FencedWrite(SqlWrite("job:x", kTokenA, grant->fencing_token, {{kCreateData, {}}}));
  ASSERT_EQ(kept.status().code(), StatusCode::kLost) << kept.status().ToString();
  EXPECT_THAT(std::string(kept.status().message()), HasSubstr("is no longer held"));
}

TEST_F(SqliteBackendTest, AFailingStatementRollsBackTheWholeFencedWrite) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok());
  const FencingToken fence = grant->fencing_token;
  ASSERT_TRUE(backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{kCreateData, {}}})).ok());
  // A constraint: the first INSERT goes too.
  auto duplicate =
      backend->FencedWrite(SqlWrite("job:x", kTokenA, fence,
                                    {{"INSERT INTO data (k, v) VALUES ($1, $2)", {"a", "1"}},
                                     {"INSERT INTO data (k, v) VALUES ($1, $2)", {"a", "2"}}}));
  ASSERT_EQ(duplicate.status().code(), StatusCode::kInvalidArgument)
      << duplicate.status().ToString();
  EXPECT_THAT(std::string(duplicate.status().message()), HasSubstr("UNIQUE constraint failed"));
  EXPECT_THAT(std::string(duplicate.status().message()), HasSubstr("statement 2"));
  // Syntax, a missing table, a table created earlier in the same write.
  for (const char* bad :
       {"INSRT INTO data VALUES (1, 2)", "INSERT INTO no_such_table VALUES (1)"}) {
    auto refused = backend->FencedWrite(
        SqlWrite("job:x", kTokenA, fence,
                 {{"CREATE TABLE other (x)", {}}, {kUpsertData, {"b", "1"}}, {bad, {}}}));
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument)
        << bad << ": " << refused.status().ToString();
  }
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM data"), 0);
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM sqlite_schema WHERE name = 'other'"), 0);
  // The lease is untouched, and writes again.
  EXPECT_TRUE(backend->Renew({.key = "job:x", .owner_token = kTokenA, .ttl = seconds(10)}).ok());
  EXPECT_TRUE(
      backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{kUpsertData, {"a", "1"}}})).ok());
}

TEST_F(SqliteBackendTest, FencedStatementsThatWouldEndTheTransactionAreRefused) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok());
  const FencingToken fence = grant->fencing_token;
  ASSERT_TRUE(backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{kCreateData, {}}})).ok());
  for (const char* control :
       {"COMMIT", "commit transaction", "END", "ROLLBACK", "BEGIN", "BEGIN IMMEDIATE",
        "SAVEPOINT s", "RELEASE s", "ROLLBACK TO s", "ATTACH ':memory:' AS other", "DETACH other",
        "VACUUM", "  /* a comment */ -- and another\n  Commit"}) {
    auto refused = backend->FencedWrite(
        SqlWrite("job:x", kTokenA, fence, {{kUpsertData, {"a", "1"}}, {control, {}}}));
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument)
        << control << ": " << refused.status().ToString();
  }
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM data"), 0);
  EXPECT_TRUE(backend->Renew({.key = "job:x", .owner_token = kTokenA, .ttl = seconds(10)}).ok());
}

TEST_F(SqliteBackendTest, OneStatementPerFencedOp) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok());
  const FencingToken fence = grant->fencing_token;
  ASSERT_TRUE(backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{kCreateData, {}}})).ok());
  for (const char* two : {"INSERT INTO data VALUES ('a', '1'); INSERT INTO data VALUES ('b', '2')",
                          "INSERT INTO data VALUES ('a', '1'); COMMIT",
                          "INSERT INTO data VALUES ('a', '1');DELETE FROM grants"}) {
    auto refused = backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{two, {}}}));
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument)
        << two << ": " << refused.status().ToString();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("more than one statement"));
  }
  for (const char* empty : {"", "  ", "-- nothing", ";"}) {
    EXPECT_EQ(
        backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{empty, {}}})).status().code(),
        StatusCode::kInvalidArgument)
        << "'" << empty << "'";
  }
  // A trailing semicolon, white space or comment is still one statement.
  auto one = backend->FencedWrite(
      SqlWrite("job:x", kTokenA, fence, {{"INSERT INTO data VALUES ('a', '1');  -- done\n", {}}}));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_THAT(*one, ElementsAre(1));
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM data"), 1);
}

TEST_F(SqliteBackendTest, FencedWritesMayReadButNeverChangeTheLeaseTables) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok());
  const FencingToken fence = grant->fencing_token;
  for (const char* own : {"DELETE FROM grants", "UPDATE fencing_counters SET last = 0",
                          "INSERT INTO records VALUES ('k', x'00', 0)", "DROP TABLE grants",
                          "ALTER TABLE grants ADD COLUMN x", "CREATE INDEX i ON Grants (holder)",
                          "CREATE TRIGGER t AFTER INSERT ON grants BEGIN SELECT 1; END",
                          "PRAGMA user_version = 9", "PRAGMA journal_mode = DELETE"}) {
    auto refused = backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{own, {}}}));
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument)
        << own << ": " << refused.status().ToString();
  }
  // Nor by hiding them on this connection (SQLite looks in "temp" before "main", and leasehold's
  // statements name no schema), nor by a trigger whose body would run later, unchecked.
  ASSERT_TRUE(backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{kCreateData, {}}})).ok());
  for (const char* hiding :
       {"CREATE TEMP TABLE grants (key, token, holder, fencing_token, boot_id, ttl_ns, expires_ns)",
        "CREATE TEMPORARY TABLE scratch (x)", "CREATE TEMP VIEW grants AS SELECT 1",
        "CREATE TEMP TRIGGER t AFTER INSERT ON data BEGIN SELECT 1; END",
        "CREATE TRIGGER wipe AFTER INSERT ON data BEGIN DELETE FROM grants; END"}) {
    auto refused = backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{hiding, {}}}));
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument)
        << hiding << ": " << refused.status().ToString();
  }
  Result<Grant> other = backend->TryAcquire(Request("job:x", kTokenB));
  EXPECT_EQ(other.status().code(), StatusCode::kHeldByAnother)
      << "the grant is still seen after the refused writes";
  auto read = backend->FencedWrite(
      SqlWrite("job:x", kTokenA, fence,
               {{"INSERT INTO data (k, v) SELECT key, fencing_token FROM grants WHERE key = $1",
                 {"job:x"}}}));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_THAT(*read, ElementsAre(1));
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM grants"), 1);
  EXPECT_EQ(raw.QueryInt("PRAGMA user_version"), kSqliteSchemaVersion);
  EXPECT_EQ(raw.QueryText("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.QueryText("SELECT v FROM data WHERE k = 'job:x'"), std::to_string(fence));
}

TEST_F(SqliteBackendTest, FencedParametersBindAsTextByNumber) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok());
  const FencingToken fence = grant->fencing_token;
  // $N means parameter N wherever it stands, as on PostgreSQL; ?N and ? by index.
  auto wrote = backend->FencedWrite(
      SqlWrite("job:x", kTokenA, fence,
               {{kCreateData, {}},
                {"INSERT INTO data (v, k) VALUES ($2, $1)", {"a", "first"}},
                {"INSERT INTO data (k, v) VALUES (?2, ?1)", {"second", "b"}},
                {"INSERT INTO data (k, v) VALUES (?, ?)", {"c", "third"}},
                {"INSERT INTO data (k, v) VALUES ($1, $1 || $1)", {"d"}},
                {"INSERT INTO data (k, v) VALUES ($1, typeof($2))", {"e", "12"}}}));
  ASSERT_TRUE(wrote.ok()) << wrote.status().ToString();
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryText("SELECT v FROM data WHERE k = 'a'"), "first");
  EXPECT_EQ(raw.QueryText("SELECT v FROM data WHERE k = 'b'"), "second");
  EXPECT_EQ(raw.QueryText("SELECT v FROM data WHERE k = 'c'"), "third");
  EXPECT_EQ(raw.QueryText("SELECT v FROM data WHERE k = 'd'"), "dd");
  EXPECT_EQ(raw.QueryText("SELECT v FROM data WHERE k = 'e'"), "text");
  for (const auto& [statement, params] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"INSERT INTO data (k, v) VALUES ($1, $2)", {"only-one"}},
           {"INSERT INTO data (k, v) VALUES ($1, 'x')", {"f", "unused"}},
           {"INSERT INTO data (k, v) VALUES (:k, :v)", {"g", "h"}},
           {"INSERT INTO data (k, v) VALUES ($1, $3)", {"g", "h"}}}) {
    auto refused = backend->FencedWrite(SqlWrite("job:x", kTokenA, fence, {{statement, params}}));
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument)
        << statement << ": " << refused.status().ToString();
  }
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM data"), 5);
}

TEST_F(SqliteBackendTest, FencedWriteWaitsForTheWriteLockAndTimesOutAsUnavailable) {
  auto backend = MustOpen(milliseconds(50));
  ASSERT_NE(backend, nullptr);
  Result<Grant> grant = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(grant.ok());
  RawDb other(DbPath());
  other.Exec("BEGIN IMMEDIATE");
  auto busy =
      backend->FencedWrite(SqlWrite("job:x", kTokenA, grant->fencing_token, {{kCreateData, {}}}));
  EXPECT_EQ(busy.status().code(), StatusCode::kUnavailable) << busy.status().ToString();
  other.Exec("COMMIT");
  EXPECT_TRUE(
      backend->FencedWrite(SqlWrite("job:x", kTokenA, grant->fencing_token, {{kCreateData, {}}}))
          .ok());
}

TEST_F(SqliteBackendTest, SkipGuardForTestingWritesWithoutTheCheck) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  FencedWriteRequest request = SqlWrite("job:none", kTokenC, 7, {{kCreateData, {}}});
  EXPECT_EQ(backend->FencedWrite(request).status().code(), StatusCode::kLost);
  request.skip_guard_for_testing = true;
  EXPECT_TRUE(backend->FencedWrite(request).ok());
}

// ---------------------------------------------------------------------------------------------
// Shared leases: one grants row per (key, slot), writer intents in writer_intents.

GrantRequest SemaphoreRequest(std::string key, std::string token, std::uint32_t limit,
                              Duration ttl = seconds(120)) {
  GrantRequest request = Request(std::move(key), std::move(token), ttl, "host:sem");
  request.limit = limit;
  return request;
}

GrantRequest SharedRequest(std::string key, std::string token, Duration ttl = seconds(120)) {
  GrantRequest request = Request(std::move(key), std::move(token), ttl, "host:reader");
  request.mode = LeaseMode::kShared;
  return request;
}

GrantRequest WriterRequest(std::string key, std::string token, std::string waiter_id,
                           Duration ttl = seconds(120)) {
  GrantRequest request = Request(std::move(key), std::move(token), ttl, "host:writer");
  request.waiter_id = std::move(waiter_id);
  return request;
}

TEST_F(SqliteBackendTest, SchemeAndCapabilitiesIncludeSharedLeases) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  EXPECT_TRUE(backend->capabilities().shared_leases);
  EXPECT_FALSE(backend->capabilities().fair_queue) << "writer intents, not a queue";
}

TEST_F(SqliteBackendTest, ASemaphoreIsOneRowPerSlotAndReusesTheSmallestFreeSlot) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  for (int i = 0; i < 3; ++i) {
    Result<Grant> grant = backend->TryAcquire(SemaphoreRequest("pool", TokenNumber(i), 3));
    ASSERT_TRUE(grant.ok()) << grant.status().ToString();
    EXPECT_EQ(grant->slot, static_cast<std::uint32_t>(i));
    EXPECT_EQ(grant->fencing_token, static_cast<FencingToken>(i + 1));
  }
  {
    RawDb raw(DbPath());
    EXPECT_EQ(raw.QueryText("SELECT group_concat(slot || ':' || mode || ':' || lease_limit || ':' "
                            "|| fencing_token, ' ') FROM (SELECT * FROM grants WHERE key = 'pool' "
                            "ORDER BY slot)"),
              "0:exclusive:3:1 1:exclusive:3:2 2:exclusive:3:3");
    EXPECT_EQ(raw.QueryInt("SELECT last FROM fencing_counters WHERE key = 'pool'"), 3)
        << "one counter for every grant of the key";
  }
  Result<Grant> full = backend->TryAcquire(SemaphoreRequest("pool", TokenNumber(9), 3));
  ASSERT_EQ(full.status().code(), StatusCode::kHeldByAnother);
  ASSERT_NE(full.status().holder(), nullptr);
  EXPECT_EQ(full.status().holder()->slot, 0u) << "the lowest slot's holder";
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("all 3 slots are held"));
  Result<Grant> other_limit = backend->TryAcquire(SemaphoreRequest("pool", TokenNumber(9), 4));
  EXPECT_EQ(other_limit.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(other_limit.status().message()), HasSubstr("limit 3"));
  EXPECT_EQ(backend->TryAcquire(Request("pool", TokenNumber(9))).status().code(),
            StatusCode::kInvalidArgument);

  ASSERT_TRUE(backend->Release("pool", TokenNumber(1)).ok());
  Result<Grant> again = backend->TryAcquire(SemaphoreRequest("pool", TokenNumber(9), 3));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->slot, 1u) << "the freed slot, the smallest free";
  EXPECT_EQ(again->fencing_token, 4u);
  Result<std::vector<LeaseInfo>> holders = backend->Holders("pool");
  ASSERT_TRUE(holders.ok());
  ASSERT_EQ(holders->size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*holders)[i].slot, i);
    EXPECT_EQ((*holders)[i].limit, 3u);
    EXPECT_EQ((*holders)[i].mode, LeaseMode::kExclusive);
  }
  EXPECT_EQ((*holders)[1].token_prefix, TokenNumber(9).substr(0, 8));
  // Renew and release each name one grant among the three.
  EXPECT_TRUE(
      backend->Renew({.key = "pool", .owner_token = TokenNumber(2), .ttl = seconds(5)}).ok());
  EXPECT_EQ(backend->Holders("pool").value()[2].ttl, seconds(5));
  EXPECT_EQ(backend->Holders("pool").value()[0].ttl, seconds(120));
  EXPECT_TRUE(backend->ForceRelease("pool").value());
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM grants WHERE key = 'pool'"), 0)
      << "force-release deletes every grant of the key";
}

TEST_F(SqliteBackendTest, AnExpiredSlotIsTakenOverWhileTheOthersStay) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(SemaphoreRequest("pool", kTokenA, 2, kShortTtl)).ok());
  ASSERT_TRUE(backend->TryAcquire(SemaphoreRequest("pool", kTokenB, 2)).ok());
  std::this_thread::sleep_for(kPastShortTtl);
  Result<Grant> grant = backend->TryAcquire(SemaphoreRequest("pool", kTokenC, 2));
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(grant->slot, 0u) << "the dead row's slot";
  Status renew = backend->Renew({.key = "pool", .owner_token = kTokenA, .ttl = seconds(10)});
  EXPECT_EQ(renew.code(), StatusCode::kLost);
  EXPECT_EQ(backend->Holders("pool").value().size(), 2u);
}

TEST_F(SqliteBackendTest, AnOwnerTokenAlreadyLiveIsRefusedRatherThanGrantedTwice) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(SemaphoreRequest("pool", kTokenA, 3)).ok());
  // As a retry of Store::Acquire whose first reply was lost would.
  Result<Grant> twice = backend->TryAcquire(SemaphoreRequest("pool", kTokenA, 3));
  EXPECT_EQ(twice.status().code(), StatusCode::kHeldByAnother);
  EXPECT_EQ(backend->Holders("pool").value().size(), 1u);
  ASSERT_TRUE(backend->TryAcquire(SharedRequest("rw", kTokenA)).ok());
  EXPECT_EQ(backend->TryAcquire(SharedRequest("rw", kTokenA)).status().code(),
            StatusCode::kHeldByAnother);
}

TEST_F(SqliteBackendTest, SharedGrantsTakeSlotsAndAnExclusiveOneWaitsForAllOfThem) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->TryAcquire(SharedRequest("rw", kTokenA)).value().slot, 0u);
  EXPECT_EQ(backend->TryAcquire(SharedRequest("rw", kTokenB)).value().slot, 1u);
  {
    RawDb raw(DbPath());
    EXPECT_EQ(raw.QueryText("SELECT group_concat(mode || ':' || lease_limit, ' ') FROM grants"),
              "shared:1 shared:1");
  }
  EXPECT_EQ(backend->TryAcquire(Request("rw", kTokenC)).status().code(),
            StatusCode::kHeldByAnother);
  EXPECT_EQ(backend->TryAcquire(SemaphoreRequest("rw", kTokenC, 2)).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(backend->Release("rw", kTokenA).ok());
  EXPECT_EQ(backend->TryAcquire(Request("rw", kTokenC)).status().code(),
            StatusCode::kHeldByAnother);
  ASSERT_TRUE(backend->Release("rw", kTokenB).ok());
  Result<Grant> writer = backend->TryAcquire(Request("rw", kTokenC));
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  EXPECT_EQ(writer->slot, 0u);
  EXPECT_EQ(writer->fencing_token, 3u);
  EXPECT_EQ(backend->TryAcquire(SharedRequest("rw", kTokenA)).status().code(),
            StatusCode::kHeldByAnother);
}

TEST_F(SqliteBackendTest, AWaitingWritersIntentIsARowThatKeepsNewReadersOut) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(SharedRequest("rw", kTokenA)).ok());
  // A plain TryAcquire records no intent.
  EXPECT_EQ(backend->TryAcquire(Request("rw", kTokenB)).status().code(),
            StatusCode::kHeldByAnother);
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM writer_intents"), 0);
  // A waiting writer's does.
  EXPECT_EQ(backend->TryAcquire(WriterRequest("rw", kTokenB, "waiter-1")).status().code(),
            StatusCode::kHeldByAnother);
  EXPECT_EQ(raw.QueryText("SELECT key || ' ' || waiter_id || ' ' || holder FROM writer_intents"),
            "rw waiter-1 host:writer");
  // A second waiting writer does not replace the first one's.
  EXPECT_EQ(backend->TryAcquire(WriterRequest("rw", kTokenC, "waiter-2")).status().code(),
            StatusCode::kHeldByAnother);
  EXPECT_EQ(raw.QueryText("SELECT waiter_id FROM writer_intents"), "waiter-1");
  Result<Grant> reader = backend->TryAcquire(SharedRequest("rw", kTokenC));
  ASSERT_EQ(reader.status().code(), StatusCode::kHeldByAnother);
  ASSERT_NE(reader.status().holder(), nullptr);
  EXPECT_EQ(reader.status().holder()->holder, "host:writer") << "the waiting writer";
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("a writer waiting"));
  // The writer is granted once the reader leaves, and its intent goes with it.
  ASSERT_TRUE(backend->Release("rw", kTokenA).ok());
  ASSERT_TRUE(backend->TryAcquire(WriterRequest("rw", kTokenB, "waiter-1")).ok());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM writer_intents"), 0);
}

TEST_F(SqliteBackendTest, AWriterIntentEndsWithAbandonWaitOrByItself) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire(SharedRequest("rw", kTokenA)).ok());
  EXPECT_FALSE(backend->TryAcquire(WriterRequest("rw", kTokenB, "waiter-1")).ok());
  EXPECT_FALSE(backend->TryAcquire(SharedRequest("rw", kTokenC)).ok());
  backend->AbandonWait("rw", "waiter-1");
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM writer_intents"), 0);
  ASSERT_TRUE(backend->TryAcquire(SharedRequest("rw", kTokenC)).ok());

  // A writer that dies waiting holds readers off for its ttl at most.
  EXPECT_FALSE(backend->TryAcquire(WriterRequest("rw", kTokenB, "waiter-2", kShortTtl)).ok());
  EXPECT_FALSE(backend->TryAcquire(SharedRequest("rw", TokenNumber(4))).ok());
  std::this_thread::sleep_for(kPastShortTtl);
  EXPECT_TRUE(backend->TryAcquire(SharedRequest("rw", TokenNumber(4))).ok());
}

TEST_F(SqliteBackendTest, AGrantOfTheOldLayoutIsAnExclusiveGrantInSlotZero) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  {
    // As a version 1 binary's INSERT writes it: no slot, mode or limit.
    RawDb raw(DbPath());
    raw.Exec(fmt::format(
        "INSERT INTO grants (key, token, holder, fencing_token, boot_id, ttl_ns, expires_ns) "
        "VALUES ('job:old', '{}', 'old:3', 5, '{}', 60000000000, 9223372036854775807);",
        kTokenA, backend->boot_id()));
  }
  auto info = backend->Inspect("job:old");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->slot, 0u);
  EXPECT_EQ((*info)->mode, LeaseMode::kExclusive);
  EXPECT_EQ((*info)->limit, 1u);
  EXPECT_EQ(backend->TryAcquire(SharedRequest("job:old", kTokenB)).status().code(),
            StatusCode::kHeldByAnother);
  EXPECT_EQ(backend->TryAcquire(SemaphoreRequest("job:old", kTokenB, 2)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(SqliteBackendTest, ForceReleaseGrantDeletesOneRowByTokenPrefixAndWakesWaiters) {
  auto backend = MustOpen();
  auto waiter = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_NE(waiter, nullptr);
  for (const char* token : {kTokenA, kTokenB, kTokenC}) {
    ASSERT_TRUE(backend->TryAcquire(SemaphoreRequest("pool", token, 3)).ok());
  }
  std::thread forcer([&backend] {
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(backend->ForceReleaseGrant("pool", "bbbbbbbb").value());
  });
  // The grants outlive the deadline: only the forced release can end this wait with OK.
  Status woken = waiter->WaitForChange("pool", BootClock::now() + seconds(60), {});
  forcer.join();
  EXPECT_TRUE(woken.ok()) << woken.ToString();
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryText("SELECT group_concat(slot, ' ') FROM grants WHERE key = 'pool'"), "0 2");
  EXPECT_FALSE(backend->ForceReleaseGrant("pool", "bbbbbbbb").value());
  EXPECT_FALSE(backend->ForceReleaseGrant("pool", "eeee").value());
  EXPECT_EQ(backend->Renew({.key = "pool", .owner_token = kTokenB, .ttl = seconds(10)}).code(),
            StatusCode::kLost);
  EXPECT_TRUE(backend->Renew({.key = "pool", .owner_token = kTokenC, .ttl = seconds(10)}).ok());
}

TEST_F(SqliteBackendTest, AWaiterWakesWhenAnyOfSeveralGrantsEndsByReleaseOrExpiry) {
  auto backend = MustOpen();
  auto waiter = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_NE(waiter, nullptr);
  ASSERT_TRUE(backend->TryAcquire(SharedRequest("rw", kTokenA)).ok());
  ASSERT_TRUE(backend->TryAcquire(SharedRequest("rw", kTokenB)).ok());
  std::thread releaser([&backend] {
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(backend->Release("rw", kTokenB).ok());
  });
  Status woken = waiter->WaitForChange("rw", BootClock::now() + seconds(60), {});
  releaser.join();
  EXPECT_TRUE(woken.ok()) << woken.ToString();
  // Nobody releases the second grant (as after a kill -9): the wait ends at its expiry, the
  // first of the two, not at the other's or the deadline.
  ASSERT_TRUE(backend->TryAcquire(SharedRequest("rw", kTokenC, milliseconds(200))).ok());
  woken = waiter->WaitForChange("rw", BootClock::now() + seconds(60), {});
  EXPECT_TRUE(woken.ok()) << woken.ToString();
  EXPECT_EQ(waiter->Holders("rw").value().size(), 1u);
}

TEST_F(SqliteBackendTest, AWaiterRefusedByAFullSemaphoreIsWokenByASlotFreedBeforeItWaits) {
  auto backend = MustOpen();
  auto waiter = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_NE(waiter, nullptr);
  ASSERT_TRUE(backend->TryAcquire(SemaphoreRequest("pool", kTokenA, 2)).ok());
  ASSERT_TRUE(backend->TryAcquire(SemaphoreRequest("pool", kTokenB, 2)).ok());
  GrantRequest request = SemaphoreRequest("pool", kTokenC, 2);
  request.waiter_id = "waiter-1";
  ASSERT_EQ(waiter->TryAcquire(request).status().code(), StatusCode::kHeldByAnother);
  // A slot is freed between the refusal and the wait: the key is still held (by B), so only
  // the generation the refused attempt read can tell the waiter.
  ASSERT_TRUE(backend->Release("pool", kTokenA).ok());
  Status woken = waiter->WaitForTurn("pool", "waiter-1", BootClock::now() + seconds(5), {});
  EXPECT_TRUE(woken.ok()) << woken.ToString();
  EXPECT_TRUE(waiter->TryAcquire(request).ok());
  // Without a refusal to go by, the wait reads the generation afresh (and sleeps).
  EXPECT_EQ(waiter->WaitForTurn("pool", "waiter-1", BootClock::now() + milliseconds(50), {}).code(),
            StatusCode::kDeadlineExceeded);
}

TEST_F(SqliteBackendTest, AReaderWaitingOnAWritersIntentWakesWhenTheWriterAbandons) {
  auto backend = MustOpen();
  auto waiter = MustOpen();
  ASSERT_NE(backend, nullptr);
  ASSERT_NE(waiter, nullptr);
  ASSERT_TRUE(backend->TryAcquire(SharedRequest("rw", kTokenA, kShortTtl)).ok());
  ASSERT_FALSE(backend->TryAcquire(WriterRequest("rw", kTokenB, "writer")).ok());
  std::this_thread::sleep_for(kPastShortTtl);  // the key is free; the intent holds readers off
  GrantRequest reader = SharedRequest("rw", kTokenC);
  reader.waiter_id = "reader";
  ASSERT_EQ(waiter->TryAcquire(reader).status().code(), StatusCode::kHeldByAnother);
  EXPECT_EQ(waiter->WaitForTurn("rw", "reader", BootClock::now() + milliseconds(50), {}).code(),
            StatusCode::kDeadlineExceeded)
      << "a free key held off by another's intent is not the reader's turn";
  EXPECT_TRUE(backend->WaitForTurn("rw", "writer", BootClock::now() + seconds(5), {}).ok())
      << "but the writer's";
  std::thread abandoner([&backend] {
    std::this_thread::sleep_for(milliseconds(100));
    backend->AbandonWait("rw", "writer");
  });
  Status woken = waiter->WaitForTurn("rw", "reader", BootClock::now() + seconds(60), {});
  abandoner.join();
  EXPECT_TRUE(woken.ok()) << woken.ToString();
  EXPECT_TRUE(waiter->TryAcquire(reader).ok());
}

TEST_F(SqliteBackendTest, FencedWriteChecksTheCallersGrantAmongSeveral) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  Result<Grant> a = backend->TryAcquire(SemaphoreRequest("pool", kTokenA, 2));
  Result<Grant> b = backend->TryAcquire(SemaphoreRequest("pool", kTokenB, 2));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(
      backend->FencedWrite(SqlWrite("pool", kTokenB, b->fencing_token, {{kCreateData, {}}})).ok())
      << "slot 1's holder, though slot 0 is another's";
  ASSERT_TRUE(backend->Release("pool", kTokenB).ok());
  auto late =
      backend->FencedWrite(SqlWrite("pool", kTokenB, b->fencing_token, {{kCreateData, {}}}));
  EXPECT_EQ(late.status().code(), StatusCode::kLost);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("is no longer held"));
}

// ---------------------------------------------------------------------------------------------
// Holder liveness (sqlite_holder_anchor.h): a grant whose holder and every process that
// inherited its liveness descriptor are gone holds nothing.

// A process that takes `key` on its own backend of the file and then waits to be killed;
// with `grandchild`, it first forks one more process that inherits the backend's descriptors
// and outlives it (as `leasehold run`'s keeper does), and `keep` ends the grant with a keep
// (hold-at-least) and exits normally instead.
class HolderProcess {
 public:
  struct Options {
    bool grandchild = false;
    Duration keep{};
  };

  HolderProcess(const std::string& db_path, const std::string& key, const std::string& token,
                Options options) {
    if (options.grandchild) {
      // The grandchild is reparented to this process when its parent dies, which reaps it.
      ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    }
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      Result<std::shared_ptr<SqliteBackend>> backend = OpenAt(db_path);
      Result<Grant> grant =
          backend.ok() ? (*backend)->TryAcquire(Request(key, token)) : Result<Grant>(Status::Ok());
      if (!backend.ok() || !grant.ok()) {
        ::_exit(1);
      }
      pid_t grandchild = 0;
      if (options.grandchild) {
        grandchild = ::fork();
        if (grandchild == 0) {
          ::pause();
          ::_exit(0);
        }
      }
      if (options.keep > Duration::zero()) {
        Status kept = (*backend)->Finish({.key = key, .owner_token = token, .keep = options.keep});
        if (!kept.ok()) {
          ::_exit(2);
        }
      }
      const std::int64_t reply[2] = {static_cast<std::int64_t>(grant->fencing_token), grandchild};
      (void)!::write(ready[1], reply, sizeof reply);
      if (options.keep > Duration::zero()) {
        ::_exit(0);  // the backend's descriptors close with the process
      }
      ::pause();
      ::_exit(0);
    }
    ::close(ready[1]);
    std::int64_t reply[2] = {0, 0};
    EXPECT_EQ(::read(ready[0], reply, sizeof reply), static_cast<ssize_t>(sizeof reply));
    ::close(ready[0]);
    fencing_token_ = static_cast<FencingToken>(reply[0]);
    grandchild_ = static_cast<pid_t>(reply[1]);
    if (options.keep > Duration::zero()) {
      Reap(pid_);
    }
  }

  HolderProcess(const HolderProcess&) = delete;
  HolderProcess& operator=(const HolderProcess&) = delete;
  HolderProcess(HolderProcess&&) = delete;
  HolderProcess& operator=(HolderProcess&&) = delete;

  ~HolderProcess() {
    KillGrandchild();
    Kill();
  }

  [[nodiscard]] FencingToken fencing_token() const { return fencing_token_; }

  // kill -9 of the holder, reaped: its grandchild, if any, lives on (reparented).
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Reap(pid_);
    }
  }

  void KillGrandchild() {
    if (grandchild_ > 0) {
      ::kill(grandchild_, SIGKILL);
      Reap(grandchild_);  // ours since its parent died (a subreaper), or its parent's zombie
    }
  }

 private:
  static void Reap(pid_t& pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = 0;
  }

  pid_t pid_ = 0;
  pid_t grandchild_ = 0;
  FencingToken fencing_token_ = 0;
};

TEST_F(SqliteBackendTest, AKilledHoldersGrantIsTakenAtOnceWithAHigherToken) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  constexpr int kTries = 50;
  std::vector<double> takeover_ms;
  for (int i = 0; i < kTries; ++i) {
    HolderProcess holder(DbPath(), "job:x", TokenNumber(100 + i), {});
    ASSERT_GT(holder.fencing_token(), 0U);
    Result<Grant> refused = backend->TryAcquire(Request("job:x", kTokenA));
    ASSERT_EQ(refused.status().code(), StatusCode::kHeldByAnother) << i;
    const auto killed = std::chrono::steady_clock::now();
    holder.Kill();
    if (i == 0) {
      // Gone, and not yet taken: shown by Holders only, and counted by nothing else.
      Result<std::vector<LeaseInfo>> holders = backend->Holders("job:x");
      ASSERT_TRUE(holders.ok());
      ASSERT_EQ(holders->size(), 1U);
      EXPECT_TRUE(holders->front().holder_gone);
      EXPECT_EQ(holders->front().fencing_token, holder.fencing_token());
      EXPECT_FALSE(backend->Inspect("job:x")->has_value());
      EXPECT_TRUE(backend->List("job:")->empty());
    }
    Result<Grant> taken = backend->TryAcquire(Request("job:x", kTokenA));
    takeover_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed)
            .count());
    ASSERT_TRUE(taken.ok()) << i << ": " << taken.status().ToString();
    EXPECT_GT(taken->fencing_token, holder.fencing_token());
    ASSERT_TRUE(backend->Release("job:x", kTokenA).ok());
  }
  std::sort(takeover_ms.begin(), takeover_ms.end());
  std::printf("library holder kill -9 -> taken (incl. reaping): p50 %.2f ms, max %.2f ms over %d\n",
              takeover_ms[kTries / 2], takeover_ms.back(), kTries);
}

TEST_F(SqliteBackendTest, ALiveHolderIsNeverTakenAndItsOwnGrantsStayLive) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  HolderProcess holder(DbPath(), "job:x", kTokenB, {});
  EXPECT_EQ(backend->TryAcquire(Request("job:x", kTokenA)).status().code(),
            StatusCode::kHeldByAnother);
  Result<std::vector<LeaseInfo>> holders = backend->Holders("job:x");
  ASSERT_TRUE(holders.ok());
  ASSERT_EQ(holders->size(), 1U);
  EXPECT_FALSE(holders->front().holder_gone);
  // This backend's own grant: its lock never conflicts with its own probe.
  ASSERT_TRUE(backend->TryAcquire(Request("job:y", kTokenA)).ok());
  EXPECT_TRUE(backend->Inspect("job:y")->has_value());
  EXPECT_EQ(backend->TryAcquire(Request("job:y", kTokenC)).status().code(),
            StatusCode::kHeldByAnother);
  // Another backend of this process has a description of its own: it too sees the grant alive.
  auto other = MustOpen();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->TryAcquire(Request("job:y", kTokenC)).status().code(),
            StatusCode::kHeldByAnother);
}

TEST_F(SqliteBackendTest, AForkedProcessThatKeepsTheDescriptorKeepsTheGrantAlive) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  HolderProcess holder(DbPath(), "job:x", kTokenB, {.grandchild = true});
  holder.Kill();
  EXPECT_EQ(backend->TryAcquire(Request("job:x", kTokenA)).status().code(),
            StatusCode::kHeldByAnother);
  holder.KillGrandchild();
  Result<Grant> taken = backend->TryAcquire(Request("job:x", kTokenA));
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_GT(taken->fencing_token, holder.fencing_token());
}

TEST_F(SqliteBackendTest, AKeptGrantOutlivesItsHoldersExit) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  HolderProcess holder(DbPath(), "job:x", kTokenB, {.keep = seconds(30)});
  Result<Grant> refused = backend->TryAcquire(Request("job:x", kTokenA));
  EXPECT_EQ(refused.status().code(), StatusCode::kHeldByAnother);
  Result<std::vector<LeaseInfo>> holders = backend->Holders("job:x");
  ASSERT_TRUE(holders.ok());
  ASSERT_EQ(holders->size(), 1U);
  EXPECT_FALSE(holders->front().holder_gone);
}

TEST_F(SqliteBackendTest, AWaiterWakesWhenTheHolderDies) {
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  HolderProcess holder(DbPath(), "job:x", kTokenB, {});
  std::thread killer([&holder] {
    std::this_thread::sleep_for(milliseconds(100));
    holder.Kill();
  });
  // The holder's TTL is 10 s and nobody releases: only its death can end the wait this early.
  const Status woke =
      backend->WaitForChange("job:x", Clock::Real().Now() + seconds(5), std::stop_token());
  killer.join();
  EXPECT_TRUE(woke.ok()) << woke.ToString();
  EXPECT_TRUE(backend->TryAcquire(Request("job:x", kTokenA)).ok());
}

TEST_F(SqliteBackendTest, AFileWithoutTheLiveAtColumnGainsIt) {
  {
    auto backend = MustOpen();
    ASSERT_NE(backend, nullptr);
  }
  {
    RawDb raw(DbPath());
    raw.Exec("ALTER TABLE grants DROP COLUMN live_at");
    raw.Exec(
        fmt::format("INSERT INTO grants (key, slot, token, holder, fencing_token, boot_id, ttl_ns, "
                    "expires_ns) VALUES ('job:old', 0, '{}', 'old:1', 7, '{}', 1, {})",
                    kTokenB, ReadFile("/proc/sys/kernel/random/boot_id").substr(0, 36),
                    std::numeric_limits<std::int64_t>::max()));
  }
  auto backend = MustOpen();
  ASSERT_NE(backend, nullptr);
  RawDb raw(DbPath());
  EXPECT_EQ(raw.QueryInt("SELECT count(*) FROM pragma_table_info('grants') WHERE name = "
                         "'live_at'"),
            1);
  // An older binary's grant has no liveness byte: judged by its TTL alone.
  EXPECT_EQ(backend->TryAcquire(Request("job:old", kTokenA)).status().code(),
            StatusCode::kHeldByAnother);
}

}  // namespace
}  // namespace leasehold::internal
