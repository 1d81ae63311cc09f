// File: tests/backends/redis/redis_backend_test.cc
//
// Behaviour of the redis:// store that the generic conformance suite does not cover: URL
// options, credentials and ACLs, NOSCRIPT recovery, restarts with AOF, pipelined renewals,
// the persistence warning, hash tags for awkward keys, and bounded waits. Every test starts its
// own redis-server on a free loopback port (tests/testing/redis_server.h). No timing asserts.

#include "backends/redis/redis_backend.h"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "leasehold/store.h"

#include "backends/redis/redis_options.h"
#include "backends/registry.h"
#include "core/logging.h"
#include "core/url.h"
#include "testing/redis_server.h"

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;
using leasehold::testing::RedisServer;
using leasehold::testing::RedisServerOptions;

// The commands the backend needs, as an ACL rule (README "Redis" section lists the same).
constexpr char kNeededCommands[] =
    "-@all +ping +select +evalsha +script|load +scan +subscribe +unsubscribe "
    "+exists +hmget +hget +hset +incr +pexpire +pttl +del +publish";

std::string Token(char c) {
  return std::string(32, c);
}

std::unique_ptr<RedisServer> StartServer(RedisServerOptions options = {}) {
  auto server = RedisServer::Start(std::move(options));
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server).value() : nullptr;
}

Result<std::shared_ptr<RedisBackend>> OpenUrl(const std::string& text) {
  LH_ASSIGN_OR_RETURN(Url url, ParseUrl(text));
  LH_ASSIGN_OR_RETURN(RedisOptions options, RedisOptions::FromUrl(url));
  return RedisBackend::Open(options);
}

// Calls of `command` so far, from INFO commandstats ("cmdstat_evalsha:calls=12,...").
long long CommandCalls(const RedisServer& server, std::string_view command) {
  auto info = server.Cli({"INFO", "commandstats"});
  if (!info.ok()) {
    return -1;
  }
  std::string needle = fmt::format("cmdstat_{}:calls=", command);
  std::size_t at = info->find(needle);
  if (at == std::string::npos) {
    return 0;
  }
  return std::stoll(info->substr(at + needle.size()));
}

// Collects log lines while alive.
class LogCapture {
 public:
  LogCapture() {
    SetLogSink([this](LogLevel, std::string_view line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(line);
    });
  }

  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  LogCapture(LogCapture&&) = delete;
  LogCapture& operator=(LogCapture&&) = delete;

  ~LogCapture() { SetLogSink(nullptr); }

  int Count(std::string_view needle) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const std::string& line : lines_) {
      n += line.find(needle) != std::string::npos ? 1 : 0;
    }
    return n;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST(RedisOptionsTest, ParsesEveryUrlForm) {
  auto url = ParseUrl("redis://app:s3cret@10.0.0.5:6380/2?command_timeout=250ms&prefix=jobs");
  ASSERT_TRUE(url.ok());
  auto options = RedisOptions::FromUrl(*url);
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->host, "10.0.0.5");
  EXPECT_EQ(options->port, 6380);
  EXPECT_EQ(options->db, 2);
  EXPECT_EQ(*options->user, "app");
  EXPECT_EQ(*options->password, "s3cret");
  EXPECT_EQ(options->command_timeout, 250ms);
  EXPECT_EQ(options->prefix, "jobs");
  EXPECT_EQ(options->Address(), "10.0.0.5:6380");

  auto bare = RedisOptions::FromUrl(*ParseUrl("redis://localhost"));
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->port, kRedisDefaultPort);
  EXPECT_EQ(bare->db, 0);
  EXPECT_FALSE(bare->password.has_value());

  auto password_only = RedisOptions::FromUrl(*ParseUrl("redis://:pw@h:1"));
  ASSERT_TRUE(password_only.ok());
  EXPECT_FALSE(password_only->user.has_value());
  EXPECT_EQ(*password_only->password, "pw");

  auto unix_socket = RedisOptions::FromUrl(*ParseUrl("redis+unix:///run/redis.sock?db=3"));
  ASSERT_TRUE(unix_socket.ok()) << unix_socket.status().ToString();
  EXPECT_EQ(unix_socket->unix_socket, "/run/redis.sock");
  EXPECT_EQ(unix_socket->db, 3);
  EXPECT_EQ(unix_socket->Address(), "unix:/run/redis.sock");
}

TEST(RedisOptionsTest, RejectsBadInputByName) {
  auto bad = [](const char* text) {
    auto url = ParseUrl(text);
    return url.ok() ? RedisOptions::FromUrl(*url).status() : url.status();
  };
  Status typo = bad("redis://h?comand_timeout=1s");
  EXPECT_EQ(typo.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(typo.message().find("comand_timeout"), std::string_view::npos);
  EXPECT_EQ(bad("redis://h:99999").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("redis://h/x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("redis://h?command_timeout=0s").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("redis://h?command_timeout=10").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("redis://h?prefix=a{b").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("redis://h1:1,h2:2").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("redis://h?db=1").code(), StatusCode::kInvalidArgument) << "db goes in the path";
  EXPECT_EQ(bad("redis+unix://host/sock").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("redis://h?fair=true").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(bad("sqlite:///x.db").code(), StatusCode::kInvalidArgument);
}

TEST(RedisBackendTest, DownServerIsUnavailableAtOnceAndThePasswordIsNeverShown) {
  int port = leasehold::testing::PickFreeLoopbackPort();
  auto backend = OpenUrl(fmt::format("redis://app:hunter2-secret@127.0.0.1:{}", port));
  ASSERT_EQ(backend.status().code(), StatusCode::kUnavailable) << backend.status().ToString();
  EXPECT_EQ(backend.status().ToString().find("hunter2"), std::string::npos);
  EXPECT_EQ(std::string(backend.status().detail()).find("hunter2"), std::string::npos);
  // Through the registry and Store too.
  auto store = Store::Open(fmt::format("redis://app:hunter2-secret@127.0.0.1:{}", port));
  ASSERT_EQ(store.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(store.status().ToString().find("hunter2"), std::string::npos);
}

TEST(RedisBackendTest, WrongCredentialsArePermissionDeniedWithoutThePassword) {
  auto server = StartServer({.requirepass = "right-pass"});
  ASSERT_NE(server, nullptr);
  std::string base = fmt::format("127.0.0.1:{}", server->port());
  auto wrong = OpenUrl(fmt::format("redis://:wrong-pass-xyz@{}", base));
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
  EXPECT_EQ(wrong.status().ToString().find("wrong-pass-xyz"), std::string::npos);
  auto none = OpenUrl(fmt::format("redis://{}", base));
  EXPECT_EQ(none.status().code(), StatusCode::kPermissionDenied) << none.status().ToString();
  auto right = OpenUrl(fmt::format("redis://:right-pass@{}", base));
  EXPECT_TRUE(right.ok()) << right.status().ToString();
}

TEST(RedisBackendTest, AclUserWithOnlyTheNeededCommandsCanDoEverything) {
  auto server =
      StartServer({.acl_users = {fmt::format("user app on >app-pass ~leasehold:* &leasehold:* {}",
                                             kNeededCommands)}});
  ASSERT_NE(server, nullptr);
  std::string url = fmt::format("redis://app:app-pass@127.0.0.1:{}", server->port());
  auto a = Store::Open(url);
  auto b = Store::Open(url);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto held = (*a)->TryAcquire("job", {.ttl = 2s, .renew_interval = 200ms, .holder = "a"});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  auto refused = (*b)->TryAcquire("job", {.ttl = 2s});
  ASSERT_EQ(refused.status().code(), StatusCode::kHeldByAnother) << refused.status().ToString();
  ASSERT_NE(refused.status().holder(), nullptr);
  EXPECT_EQ(refused.status().holder()->holder, "a");
  EXPECT_EQ(refused.status().holder()->token_prefix, held->token_prefix());
  auto listed = (*b)->List("");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), 1u);
  std::this_thread::sleep_for(500ms);  // a few heartbeat rounds
  EXPECT_TRUE(held->valid()) << held->lost_reason().ToString();
  std::jthread release([&] {
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE(held->Release().ok());
  });
  auto waited = (*b)->Acquire("job", {.ttl = 2s, .wait = 10s});  // SUBSCRIBE, then the release
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  auto forced = (*a)->ForceRelease("job");
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();
  EXPECT_TRUE(*forced);
}

TEST(RedisBackendTest, AclUserWithoutACommandGetsPermissionDeniedNamingIt) {
  auto server = StartServer({.acl_users = {"user noevalsha on >pw ~* &* +@all -evalsha",
                                           "user noincr on >pw ~* &* +@all -incr",
                                           "user noscriptload on >pw ~* &* +@all -script"}});
  ASSERT_NE(server, nullptr);
  auto url = [&](const char* user) {
    return fmt::format("redis://{}:pw@127.0.0.1:{}", user, server->port());
  };
  auto no_evalsha = OpenUrl(url("noevalsha"));
  ASSERT_TRUE(no_evalsha.ok()) << no_evalsha.status().ToString();
  auto refused = (*no_evalsha)->TryAcquire({"job", Token('a'), "h", 5s});
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("evalsha"), std::string_view::npos)
      << refused.status().ToString();

  // A command called inside the script is checked against the ACL too.
  auto no_incr = OpenUrl(url("noincr"));
  ASSERT_TRUE(no_incr.ok()) << no_incr.status().ToString();
  auto in_script = (*no_incr)->TryAcquire({"job", Token('a'), "h", 5s});
  EXPECT_EQ(in_script.status().code(), StatusCode::kPermissionDenied)
      << in_script.status().ToString();
  EXPECT_NE(in_script.status().message().find("'INCR'"), std::string_view::npos)
      << in_script.status().ToString();

  auto no_load = OpenUrl(url("noscriptload"));
  EXPECT_EQ(no_load.status().code(), StatusCode::kPermissionDenied) << no_load.status().ToString();
  EXPECT_NE(no_load.status().message().find("script"), std::string_view::npos)
      << no_load.status().ToString();
}

TEST(RedisBackendTest, ScriptFlushWhileHeldThenRenewAndReleaseStillSucceed) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto grant = (*backend)->TryAcquire({"job", Token('a'), "h", 5s});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  auto grant2 = (*backend)->TryAcquire({"job2", Token('b'), "h", 5s});
  ASSERT_TRUE(grant2.ok());
  const auto loads_before = (*backend)->stats().script_loads;

  ASSERT_TRUE(server->Cli({"SCRIPT", "FLUSH"}).ok());
  EXPECT_TRUE((*backend)->Renew({"job", Token('a'), 5s}).ok());
  ASSERT_TRUE(server->Cli({"SCRIPT", "FLUSH"}).ok());
  std::vector<RenewRequest> both = {{"job", Token('a'), 5s}, {"job2", Token('b'), 5s}};
  for (const Status& s : (*backend)->RenewMany(both)) {
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  ASSERT_TRUE(server->Cli({"SCRIPT", "FLUSH"}).ok());
  EXPECT_TRUE((*backend)->Release("job", Token('a')).ok());
  EXPECT_EQ((*backend)->stats().script_loads, loads_before + 3);
  auto info = (*backend)->Inspect("job");
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->has_value());
}

TEST(RedisBackendTest, Kill9WithAofThenRestartKeepsOrCleanlyLosesAndFencingKeepsRising) {
  auto server = StartServer({.aof = true});
  ASSERT_NE(server, nullptr);
  std::string url = server->Url() + "?command_timeout=500ms&connect_timeout=500ms";
  auto holder_store = Store::Open(url);
  ASSERT_TRUE(holder_store.ok()) << holder_store.status().ToString();
  FencingToken before = 0;
  for (int i = 0; i < 3; ++i) {  // the counter is at 3 before the crash
    auto lease = (*holder_store)->TryAcquire("job", {.ttl = 5s});
    ASSERT_TRUE(lease.ok());
    before = lease->fencing_token();
    ASSERT_TRUE(lease->Release().ok());
  }
  auto held = (*holder_store)->TryAcquire("job", {.ttl = 3s, .renew_interval = 300ms});
  ASSERT_TRUE(held.ok());
  before = held->fencing_token();

  server->Kill9();
  ASSERT_TRUE(server->Restart().ok());
  std::this_thread::sleep_for(1500ms);  // several renew rounds through reconnects

  auto other_store = Store::Open(url);
  ASSERT_TRUE(other_store.ok()) << other_store.status().ToString();
  auto other = (*other_store)->TryAcquire("job", {.ttl = 3s});
  const bool holder_valid = held->valid();
  std::printf("[ figure ] after kill -9 + restart the holder %s its lease\n",
              holder_valid ? "kept" : "cleanly lost");
  EXPECT_FALSE(holder_valid && other.ok()) << "two holders at once";
  if (holder_valid) {
    EXPECT_EQ(other.status().code(), StatusCode::kHeldByAnother) << other.status().ToString();
    auto info = (*other_store)->Inspect("job");
    ASSERT_TRUE(info.ok() && info->has_value());
    EXPECT_EQ((*info)->fencing_token, before) << "the grant came back from the AOF";
    ASSERT_TRUE(held->Release().ok());
    other = (*other_store)->TryAcquire("job", {.ttl = 3s});
  }
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_GT(other->fencing_token(), before) << "the fence counter survived the crash";
}

TEST(RedisBackendTest, ThousandLeasesAreRenewedInOneRoundTripPerHeartbeatRound) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  constexpr int kLeases = 1000;

  // The backend alone: one RenewMany of 1,000 is one round trip of 1,000 EVALSHAs.
  std::vector<RenewRequest> renewals;
  for (int i = 0; i < kLeases; ++i) {
    std::string key = fmt::format("k{}", i);
    ASSERT_TRUE((*backend)->TryAcquire({key, Token('a'), "h", 30s}).ok());
    renewals.push_back({key, Token('a'), 30s});
  }
  auto trips = (*backend)->stats().round_trips;
  long long evalsha = CommandCalls(*server, "evalsha");
  std::vector<Status> results = (*backend)->RenewMany(renewals);
  ASSERT_EQ(results.size(), static_cast<std::size_t>(kLeases));
  for (const Status& s : results) {
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ((*backend)->stats().round_trips - trips, 1u);
  EXPECT_EQ(CommandCalls(*server, "evalsha") - evalsha, kLeases);

  // Through a Store: the heartbeat batches every held lease into one RenewMany per round.
  auto store = Store::OpenWithBackendForTesting(*backend);
  std::vector<Lease> leases;
  for (int i = 0; i < kLeases; ++i) {
    auto lease = store->TryAcquire(fmt::format("s{}", i), {.ttl = 3s, .renew_interval = 1s});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    leases.push_back(std::move(lease).value());
  }
  // Leases taken over a long span (a loaded machine) may be renewed in a few batches at
  // first; the heartbeat pulls them into step within a round or two. Let that happen, then
  // count. Every wait here is bounded.
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  auto wait_for_renewals = [&](long long from, long long count) {
    while (CommandCalls(*server, "evalsha") - from < count &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(50ms);
    }
  };
  wait_for_renewals(CommandCalls(*server, "evalsha"), 2 * kLeases);
  trips = (*backend)->stats().round_trips;
  evalsha = CommandCalls(*server, "evalsha");
  wait_for_renewals(evalsha, 3 * kLeases);
  const long long renewed = CommandCalls(*server, "evalsha") - evalsha;
  const auto rounds = (*backend)->stats().round_trips - trips;
  std::printf("[ figure ] %lld renewals of %d leases in %llu round trips\n", renewed, kLeases,
              static_cast<unsigned long long>(rounds));
  ASSERT_GE(renewed, 3 * kLeases);
  // Three rounds of one round trip each, plus one a round in flight while counting began.
  EXPECT_LE(rounds, 4u);
  for (Lease& lease : leases) {
    EXPECT_TRUE(lease.valid());
  }
}

TEST(RedisBackendTest, PersistenceOffIsDetectedAndWarnedOnce) {
  LogCapture log;
  auto volatile_server = StartServer({.aof = false});
  ASSERT_NE(volatile_server, nullptr);
  auto first = OpenUrl(volatile_server->Url());
  auto second = OpenUrl(volatile_server->Url());
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_FALSE((*first)->capabilities().fencing_survives_restart);
  EXPECT_EQ(log.Count("persistence off"), 1);

  auto durable_server = StartServer({.aof = true});
  ASSERT_NE(durable_server, nullptr);
  auto durable = OpenUrl(durable_server->Url());
  ASSERT_TRUE(durable.ok());
  EXPECT_TRUE((*durable)->capabilities().fencing_survives_restart);
  EXPECT_EQ(log.Count("persistence off"), 1);

  // A user that may not run CONFIG: no warning, no failure.
  auto acl_server =
      StartServer({.acl_users = {fmt::format("user app on >pw ~* &* {}", kNeededCommands)}});
  ASSERT_NE(acl_server, nullptr);
  auto restricted = OpenUrl(fmt::format("redis://app:pw@127.0.0.1:{}", acl_server->port()));
  ASSERT_TRUE(restricted.ok()) << restricted.status().ToString();
  EXPECT_EQ(log.Count("persistence off"), 1);
}

TEST(RedisBackendTest, KeysWithBracesAndGlobCharactersKeepOneHashTag) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url() + "?prefix=p");
  ASSERT_TRUE(backend.ok());
  const std::vector<std::string> keys = {"}x", "{a}", "a*b", "a[b]?", "a\\b", "ключ"};
  for (const std::string& key : keys) {
    std::string lease = RedisBackend::LeaseKeyName("p", key);
    std::string fence = RedisBackend::FenceKeyName("p", key);
    auto tag = [](const std::string& k) {
      std::size_t open = k.find('{');
      std::size_t close = k.find('}', open + 1);
      return k.substr(open + 1, close - open - 1);
    };
    EXPECT_FALSE(tag(lease).empty()) << key;
    EXPECT_EQ(tag(lease), tag(fence)) << key;
    auto grant = (*backend)->TryAcquire({key, Token('a'), "h", 5s});
    ASSERT_TRUE(grant.ok()) << key << ": " << grant.status().ToString();
  }
  auto star = (*backend)->List("a*");
  ASSERT_TRUE(star.ok());
  ASSERT_EQ(star->size(), 1u) << "'*' in a prefix is literal";
  EXPECT_EQ((*star)[0].key, "a*b");
  auto bracket = (*backend)->List("a[");
  ASSERT_TRUE(bracket.ok());
  ASSERT_EQ(bracket->size(), 1u);
  auto all = (*backend)->List("");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), keys.size());
  auto brace = (*backend)->Inspect("}x");
  ASSERT_TRUE(brace.ok() && brace->has_value());
}

TEST(RedisBackendTest, StopTokenInterruptsAWaitAndExpiryWakesAWaiterWithoutAMessage) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url());
  ASSERT_TRUE(backend.ok());
  ASSERT_TRUE((*backend)->TryAcquire({"held", Token('a'), "h", 60s}).ok());
  std::stop_source stop;
  auto waited = std::async(std::launch::async, [&] {
    return (*backend)->WaitForChange("held", BootClock::now() + 60s, stop.get_token());
  });
  std::this_thread::sleep_for(100ms);
  stop.request_stop();
  ASSERT_EQ(waited.wait_for(10s), std::future_status::ready) << "the stop token was ignored";
  EXPECT_EQ(waited.get().code(), StatusCode::kCancelled);

  // A grant that nobody releases: the waiter wakes at its expiry, long before its deadline.
  ASSERT_TRUE((*backend)->TryAcquire({"expiring", Token('b'), "h", 300ms}).ok());
  Status woke = (*backend)->WaitForChange("expiring", BootClock::now() + 30s, {});
  EXPECT_TRUE(woke.ok()) << woke.ToString();
  auto info = (*backend)->Inspect("expiring");
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->has_value());
}

TEST(RedisBackendTest, PausedServerGivesUnavailableWithinTheTimeoutThenRecovers) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url() + "?command_timeout=200ms&connect_timeout=200ms");
  ASSERT_TRUE(backend.ok());
  ASSERT_TRUE((*backend)->TryAcquire({"job", Token('a'), "h", 30s}).ok());
  server->Pause();
  Status during = (*backend)->Renew({"job", Token('a'), 30s});
  EXPECT_EQ(during.code(), StatusCode::kUnavailable) << during.ToString();
  server->Resume();
  Status after = Status::Internal("not run");
  for (int i = 0; i < 50 && !after.ok(); ++i) {  // reconnect backoff
    after = (*backend)->Renew({"job", Token('a'), 30s});
    if (!after.ok()) {
      std::this_thread::sleep_for(50ms);
    }
  }
  EXPECT_TRUE(after.ok()) << after.ToString();
}

TEST(RedisBackendTest, MinReplicasUndoesAnAcquireThatNoReplicaConfirms) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url() + "?min_replicas=1&replica_timeout=50ms");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto grant = (*backend)->TryAcquire({"job", Token('a'), "h", 5s});
  EXPECT_EQ(grant.status().code(), StatusCode::kUnavailable) << grant.status().ToString();
  auto info = (*backend)->Inspect("job");
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->has_value()) << "the unconfirmed grant was undone";
}

}  // namespace
}  // namespace leasehold::internal
