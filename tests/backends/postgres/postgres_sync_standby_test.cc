// File: tests/backends/postgres/postgres_sync_standby_test.cc
//
// The indeterminate-outcome rule (PgConnection::Exec) on a real PostgreSQL 15 whose synchronous
// standby never confirms: synchronous_standby_names names a standby that does not exist, so
// every COMMIT that writes waits for it, exactly as when the standby's WAL stream is cut. The
// server answers a cancelled wait with *success* and a WARNING; the store must never report
// such a statement as done. Every lease-changing statement is tried in both modes: acquire,
// renew, release, finish (hold-at-least), force-release and a fenced write; then the two ways
// the wait ends without this process's own cancel: an operator's pg_cancel_backend (success and
// the warning) and pg_terminate_backend (the warning, then the connection ends). Also the
// history check of fencing tokens (PgHistory) and the unsure-grant bookkeeping
// (PgUnsureGrants) on their own.

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "leasehold/fenced_write.h"
#include "leasehold/store.h"

#include "backends/postgres/postgres_connection.h"
#include "backends/postgres/postgres_history.h"
#include "testing/postgres_server.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using internal::PgHistory;
using internal::PgUnsureGrants;

class SyncStandbyTest : public ::testing::TestWithParam<std::string> {
 public:
  static void SetUpTestSuite() {
    auto server = testing::PostgresServer::Start();
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value().release();
    // The fixture starts the server with synchronous_commit=off (speed); a database setting
    // outranks the command line for every new session.
    auto on = server_->Psql("ALTER DATABASE postgres SET synchronous_commit = on");
    ASSERT_TRUE(on.ok()) << on.status().ToString();
  }

  static void TearDownTestSuite() { delete server_; }

  void TearDown() override { StandbyConfirms(true); }

  // A fresh schema per call; statements time out after `timeout`.
  static std::string Url(std::string_view mode, std::string_view timeout = "300ms") {
    static int n = 0;
    return fmt::format("{}?mode={}&schema=s_{}_{}&command_timeout={}", server_->Url(), mode,
                       getpid(), ++n, timeout);
  }

  static std::unique_ptr<Store> Open(const std::string& url) {
    auto store = Store::Open(url);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  // confirms=false: every commit from now on waits for a standby that never answers.
  static void StandbyConfirms(bool confirms) {
    // Two calls: psql -c runs several statements as one transaction, which ALTER SYSTEM refuses.
    auto set = server_->Psql(fmt::format("ALTER SYSTEM SET synchronous_standby_names = '{}'",
                                         confirms ? "" : "ghost_standby"));
    ASSERT_TRUE(set.ok()) << set.status().ToString();
    auto reload = server_->Psql("SELECT pg_reload_conf()");
    ASSERT_TRUE(reload.ok()) << reload.status().ToString();
    // pg_reload_conf() signals; every backend reads the file at its next command.
    std::this_thread::sleep_for(100ms);
  }

  // Ends, from another session, the first wait for synchronous replication seen within 5 s,
  // with `function` (pg_cancel_backend or pg_terminate_backend). Returns whether it found one.
  static bool EndSyncRepWait(const std::string& function) {
    for (int i = 0; i < 100; ++i) {
      auto r = server_->Psql(fmt::format(
          "SELECT {}(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep' LIMIT 1", function));
      if (r.ok() && *r == "t") {
        return true;
      }
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  static void ExpectIndeterminate(const Status& s) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_EQ(s.detail(), internal::kIndeterminate) << s.ToString();
    EXPECT_NE(s.message().find("may have applied"), std::string_view::npos) << s.ToString();
  }

  static testing::PostgresServer* server_;
};

testing::PostgresServer* SyncStandbyTest::server_ = nullptr;

TEST_P(SyncStandbyTest, AnAcquireWhoseCommitIsNotConfirmedIsNeverGranted) {
  const std::string url = Url(GetParam());
  auto store = Open(url);
  ASSERT_NE(store, nullptr);
  StandbyConfirms(false);
  auto lease = store->TryAcquire("hot", {.ttl = 10s});
  ASSERT_FALSE(lease.ok()) << "granted on a commit no standby confirmed";
  ExpectIndeterminate(lease.status());
  EXPECT_NE(lease.status().message().find("synchronous replication"), std::string_view::npos)
      << lease.status().ToString();
  // What the attempt left on the primary is not a grant anyone runs under: released by its
  // owner (table mode: owner-checked release, itself committed locally; advisory mode: the
  // lock unlocked), so another handle gets the key once commits are confirmed again.
  StandbyConfirms(true);
  auto other = Open(url);
  ASSERT_NE(other, nullptr);
  auto next = other->TryAcquire("hot", {.ttl = 10s});
  EXPECT_TRUE(next.ok()) << next.status().ToString();
}

TEST_P(SyncStandbyTest, ARenewalThatIsNotConfirmedIsNoConfirmation) {
  auto store = Open(Url(GetParam()));
  ASSERT_NE(store, nullptr);
  auto lease = store->TryAcquire("hot", {.ttl = 3s, .renew_interval = 500ms});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  StandbyConfirms(false);
  // Renewals keep "succeeding" on the primary (committed locally, then cancelled): none of them
  // may move safe_until, so the lease is lost by its first grant's safe_until.
  const auto start = std::chrono::steady_clock::now();
  while (lease->valid() && std::chrono::steady_clock::now() - start < 6s) {
    std::this_thread::sleep_for(50ms);
  }
  const auto held_for = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(lease->valid()) << "still valid after 6 s without a confirmed renewal";
  EXPECT_LT(held_for, 3s) << "held past the grant's own safe_until";
}

TEST_P(SyncStandbyTest, ReleaseFinishAndForceReleaseAreNotReportedDoneUnconfirmed) {
  auto store = Open(Url(GetParam()));
  ASSERT_NE(store, nullptr);
  auto a = store->TryAcquire("a", {.ttl = 10s});
  auto b = store->TryAcquire("b", {.ttl = 10s});
  auto c = store->TryAcquire("c", {.ttl = 10s});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  StandbyConfirms(false);
  if (GetParam() == "table") {
    // Advisory mode's release is an unlock (no write, no commit to wait for): done at once.
    Status released = a->Release();
    ExpectIndeterminate(released);
  }
  Status finished = b->Release({.hold_at_least = 5s});
  ExpectIndeterminate(finished);
  auto forced = store->ForceRelease("c");
  if (GetParam() == "table") {
    ASSERT_FALSE(forced.ok()) << "force-release reported done unconfirmed";
    ExpectIndeterminate(forced.status());
  } else {
    // Advisory mode force-releases by ending the holder's session (pg_terminate_backend): no
    // commit to wait for, and a lock that is gone on every server at once.
    EXPECT_TRUE(forced.ok()) << forced.status().ToString();
  }
}

TEST_P(SyncStandbyTest, AFencedWriteWhoseCommitIsNotConfirmedSaysItsOutcomeIsUnknown) {
  const std::string url = Url(GetParam());
  auto store = Open(url);
  ASSERT_NE(store, nullptr);
  auto lease = store->TryAcquire("hot", {.ttl = 10s});
  ASSERT_TRUE(lease.ok());
  const std::size_t at = url.find("schema=") + 7;
  const std::string schema = url.substr(at, url.find('&', at) - at);
  FencedWrite create;
  create.Sql(fmt::format("CREATE TABLE IF NOT EXISTS \"{}\".data (k text PRIMARY KEY)", schema));
  ASSERT_TRUE(lease->Write(create).ok());
  StandbyConfirms(false);
  FencedWrite insert;
  insert.Sql(fmt::format("INSERT INTO \"{}\".data VALUES ('x')", schema));
  auto wrote = lease->Write(insert);
  ASSERT_FALSE(wrote.ok()) << "a write no standby confirmed reported as applied";
  EXPECT_EQ(wrote.status().code(), StatusCode::kUnavailable) << wrote.status().ToString();
  EXPECT_NE(wrote.status().message().find("unknown"), std::string_view::npos)
      << wrote.status().ToString();
}

// An acquire on `store` whose wait for the standby another session ends with `function`
// (pg_cancel_backend or pg_terminate_backend) while command_timeout is still far.
Result<Lease> AcquireEndedByAnOperator(Store& store, const std::string& function) {
  SyncStandbyTest::StandbyConfirms(false);
  std::thread op([&] { EXPECT_TRUE(SyncStandbyTest::EndSyncRepWait(function)); });
  auto lease = store.TryAcquire("hot", {.ttl = 30s});
  op.join();
  return lease;
}

TEST_P(SyncStandbyTest, AnOperatorsCancelOfTheWaitIsCaughtByItsWarning) {
  // The server answers the acquire with success and the warning, before command_timeout.
  auto store = Open(Url(GetParam(), "3s"));
  ASSERT_NE(store, nullptr);
  auto lease = AcquireEndedByAnOperator(*store, "pg_cancel_backend");
  ASSERT_FALSE(lease.ok()) << "granted on a commit whose wait an operator cancelled";
  ExpectIndeterminate(lease.status());
  EXPECT_NE(lease.status().message().find("canceling wait for synchronous replication"),
            std::string_view::npos)
      << lease.status().ToString();
}

TEST_P(SyncStandbyTest, AConnectionEndedDuringTheWaitIsIndeterminate) {
  // The warning, then FATAL and the end of the connection.
  auto store = Open(Url(GetParam(), "3s"));
  ASSERT_NE(store, nullptr);
  auto lease = AcquireEndedByAnOperator(*store, "pg_terminate_backend");
  ASSERT_FALSE(lease.ok()) << "granted on a commit whose session was terminated in the wait";
  EXPECT_EQ(lease.status().code(), StatusCode::kUnavailable) << lease.status().ToString();
  EXPECT_NE(lease.status().message().find("may have applied"), std::string_view::npos)
      << lease.status().ToString();
}

TEST_P(SyncStandbyTest, TheNegativeControlGrantsOnAnUnconfirmedCommitAsBeforeTheRule) {
  // The switch behind chaos_worker --unsafe=trustcommit reproduces the behaviour the tests
  // above refuse: granted on a commit no standby confirmed.
  auto store = Open(Url(GetParam()));
  ASSERT_NE(store, nullptr);
  StandbyConfirms(false);
  internal::PgConnection::TrustUnconfirmedCommitsForTesting(true);
  auto lease = store->TryAcquire("hot", {.ttl = 10s});
  internal::PgConnection::TrustUnconfirmedCommitsForTesting(false);
  EXPECT_TRUE(lease.ok()) << lease.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Modes, SyncStandbyTest, ::testing::Values("table", "advisory"));

// PgHistory on its own: what the tokens' timelines say.
constexpr FencingToken Token(std::uint64_t timeline, std::uint64_t count) {
  return ((timeline - 1) << 40) | count;
}

TEST(PgHistoryTest, ANewerTimelineIsAFailoverAndAnOlderOneOrARepeatedTokenIsRefused) {
  PgHistory history;
  bool failover = true;
  ASSERT_TRUE(history.Observe("pg", "k", Token(1, 7), &failover).ok());
  EXPECT_FALSE(failover) << "the first grant sets the baseline";
  ASSERT_TRUE(history.Observe("pg", "k", Token(1, 8), &failover).ok());
  EXPECT_FALSE(failover);
  // The last bumps of timeline 1 were lost: timeline 2 counts again from the epoch.
  ASSERT_TRUE(history.Observe("pg", "k", Token(2, 8), &failover).ok());
  EXPECT_TRUE(failover);
  EXPECT_GT(Token(2, 1), Token(1, (1ULL << 40) - 1)) << "every token of a timeline is above "
                                                        "every one of the timeline before";
  Status old = history.Observe("pg", "j", Token(1, 100), &failover);
  EXPECT_EQ(old.code(), StatusCode::kUnavailable);
  EXPECT_NE(old.message().find("history went backwards"), std::string_view::npos) << old.ToString();
  Status repeated = history.Observe("pg", "k", Token(2, 8), &failover);
  EXPECT_EQ(repeated.code(), StatusCode::kUnavailable);
  EXPECT_NE(repeated.message().find("token would repeat"), std::string_view::npos)
      << repeated.ToString();
  EXPECT_EQ(internal::PgTokenTimeline(Token(3, 5)), 3U);
}

TEST(PgHistoryTest, AServerOfAnotherClusterOrAnOlderTimelineIsRefusedAndANewerOneIsAFailover) {
  PgHistory history;
  bool failover = true;
  ASSERT_TRUE(
      history.ObserveServer("pg", {.system_identifier = "7", .timeline = 2}, &failover).ok());
  EXPECT_FALSE(failover) << "the first server sets the baseline";
  // A standby's checkpoint timeline lags and is not judged; it grants nothing anyway.
  EXPECT_TRUE(history
                  .ObserveServer("pg",
                                 {.system_identifier = "7", .timeline = 1, .in_recovery = true},
                                 &failover)
                  .ok());
  Status deposed =
      history.ObserveServer("pg", {.system_identifier = "7", .timeline = 1}, &failover);
  EXPECT_EQ(deposed.code(), StatusCode::kUnavailable);
  EXPECT_NE(deposed.message().find("history went backwards"), std::string_view::npos)
      << deposed.ToString();
  ASSERT_TRUE(
      history.ObserveServer("pg", {.system_identifier = "7", .timeline = 3}, &failover).ok());
  EXPECT_TRUE(failover);
  Status other = history.ObserveServer("pg", {.system_identifier = "8", .timeline = 3}, &failover);
  EXPECT_EQ(other.code(), StatusCode::kUnavailable);
  EXPECT_NE(other.message().find("another database cluster"), std::string_view::npos)
      << other.ToString();
  // A grant's token on the timeline before the newest server's is refused too.
  EXPECT_FALSE(history.Observe("pg", "k", Token(2, 9), &failover).ok());
}

// PgUnsureGrants on its own, with a release that says what a store would.
TEST(PgUnsureGrantsTest, AnUnsureGrantIsReleasedUntilKnownOverAndNeverAfterItsTokenIsConfirmed) {
  PgUnsureGrants unsure;
  std::vector<std::string> released;
  Status next_release = Status::Unavailable("still not confirmed");
  const PgUnsureGrants::Release release = [&](std::string_view key, std::string_view token) {
    released.push_back(fmt::format("{}/{}", key, token));
    return next_release;
  };
  const Status indeterminate =
      Status(StatusCode::kUnavailable, "the store may have applied acquire", "indeterminate");
  auto fail = [&] { return Result<int>(indeterminate); };
  auto grant = [] { return Result<int>(1); };
  // An indeterminate acquire is released at once; not confirmed, it is remembered.
  EXPECT_FALSE(unsure.Acquire<int>("k", "t1", fail, release).ok());
  EXPECT_EQ(released, (std::vector<std::string>{"k/t1"}));
  EXPECT_EQ(unsure.size(), 1U);
  // The next acquire of another key tries it again first.
  released.clear();
  EXPECT_TRUE(unsure.Acquire<int>("j", "t2", grant, release).ok());
  EXPECT_EQ(released, (std::vector<std::string>{"k/t1"}));
  EXPECT_EQ(unsure.size(), 1U);
  // The same Acquire call tries again under t1 and is granted: t1's grant is confirmed now, so
  // it must never be released behind the holder's back.
  released.clear();
  EXPECT_TRUE(unsure.Acquire<int>("k", "t1", grant, release).ok());
  EXPECT_EQ(released, (std::vector<std::string>{"k/t1"}));
  EXPECT_EQ(unsure.size(), 0U);
  released.clear();
  EXPECT_EQ(unsure.Flush(release), 0U);
  EXPECT_TRUE(released.empty());
  // A release known to be over (nothing of ours there: kLost) forgets it.
  EXPECT_FALSE(unsure.Acquire<int>("k", "t3", fail, release).ok());
  EXPECT_EQ(unsure.size(), 1U);
  next_release = Status::Lost("not ours");
  EXPECT_EQ(unsure.Flush(release), 0U);
}

}  // namespace
}  // namespace leasehold
