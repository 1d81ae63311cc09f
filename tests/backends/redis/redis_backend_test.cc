// File: tests/backends/redis/redis_backend_test.cc
//
// Behaviour of the redis:// store that the generic conformance suite does not cover: URL
// options, credentials and ACLs, NOSCRIPT recovery, restarts with AOF, pipelined renewals,
// the persistence warning, fenced writes (HSET, the prefix, all-or-none, a restart without
// persistence), hash tags for awkward keys, and bounded waits. Every test starts its
// own redis-server on a free loopback port (tests/testing/redis_server.h). No timing asserts.

#include "backends/redis/redis_backend.h"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "leasehold/schedule.h"
#include "leasehold/store.h"

#include "backends/redis/redis_options.h"
#include "backends/registry.h"
#include "core/logging.h"
#include "core/store_access.h"
#include "core/url.h"
#include "redis_test_util.h"
#include "testing/redis_server.h"

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;
using leasehold::testing::RedisServer;
using leasehold::testing::RedisServerOptions;

// The commands the backend needs, as an ACL rule (README "Redis" section lists the same).
constexpr char kNeededCommands[] =
    "-@all +ping +select +evalsha +script|load +scan +subscribe +unsubscribe "
    "+exists +hmget +hget +hset +incr +pexpire +pttl +del +publish +get +set +time +hgetall +hdel "
    "+pexpireat";

// The extra commands of fair=true (README "Redis" section lists the same).
constexpr char kFairCommands[] =
    "+zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zscore +zrank +zcard +hexists";

using redis_test::OpenUrl;
using redis_test::Token;

// A waiter id, as Store::Acquire makes one (32 hex digits).
std::string Waiter(char c) {
  return std::string(32, c);
}

std::unique_ptr<RedisServer> StartServer(RedisServerOptions options = {}) {
  return redis_test::StartOrFail<RedisServer>(std::move(options));
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

// Number of waiters queued for `key` (under the default prefix), read with ZCARD.
long long Queued(const RedisServer& server, std::string_view key) {
  auto out = server.Cli({"ZCARD", RedisBackend::QueueKeyName("leasehold", key)});
  return out.ok() ? std::stoll(*out) : -1;
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
  EXPECT_EQ(bad("redis://h?fair=yes").code(), StatusCode::kInvalidArgument);
  auto fair = RedisOptions::FromUrl(*ParseUrl("redis://h?fair=true"));
  ASSERT_TRUE(fair.ok()) << fair.status().ToString();
  EXPECT_TRUE(fair->fair);
  EXPECT_FALSE(RedisOptions::FromUrl(*ParseUrl("redis://h?fair=false"))->fair);
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
  // Schedule slots: the server's TIME, the record's GET and the finish script's SET.
  auto claim = (*a)->ClaimSlot("nightly", SlotGrid{.period = std::chrono::hours(1)},
                               {.ttl = 2s, .wait = 0s});
  ASSERT_TRUE(claim.ok()) << claim.status().ToString();
  ASSERT_TRUE(claim->claimed());
  Status finished = claim->Finish({.succeeded = true, .hold_at_least = 100ms});
  ASSERT_TRUE(finished.ok()) << finished.ToString();
  auto runs = (*b)->SlotRuns("nightly");
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  EXPECT_EQ(runs->size(), 1u);
  // Listing records: SCAN for the record keys, then their GETs.
  auto all_runs = (*b)->ListSlotRuns();
  ASSERT_TRUE(all_runs.ok()) << all_runs.status().ToString();
  ASSERT_EQ(all_runs->size(), 1u);
  EXPECT_EQ(all_runs->front().key, "nightly");
  // Once the kept grant has expired, the record key (":record") is not listed as a grant.
  std::this_thread::sleep_for(300ms);
  auto after = (*b)->List("");
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_TRUE(after->empty()) << after->front().key;
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
  auto store = internal::OpenStoreWithBackend(*backend);
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

// The item of `diagnosis` in `area`, or nullptr.
const CheckItem* ItemIn(const Diagnosis& diagnosis, std::string_view area) {
  for (const CheckItem& item : diagnosis.items) {
    if (item.area == area) {
      return &item;
    }
  }
  return nullptr;
}

TEST(RedisBackendTest, DiagnoseSaysPersistenceOffIsUnsafeAndAofAlwaysIsNot) {
  auto volatile_server = StartServer({.aof = false});
  ASSERT_NE(volatile_server, nullptr);
  auto off = OpenUrl(volatile_server->Url() + "?command_timeout=300ms&connect_timeout=300ms");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_TRUE((*off)->Ping().ok());
  auto diagnosis = (*off)->Diagnose();
  ASSERT_TRUE(diagnosis.ok()) << diagnosis.status().ToString();
  EXPECT_EQ(diagnosis->probe, "PING");
  const CheckItem* durability = ItemIn(*diagnosis, "durability");
  ASSERT_NE(durability, nullptr);
  EXPECT_EQ(durability->verdict, CheckVerdict::kUnsafe);
  EXPECT_NE(durability->found.find("fencing does not survive a restart"), std::string::npos)
      << durability->found;
  EXPECT_NE(durability->fix.find("appendonly yes"), std::string::npos) << durability->fix;
  const CheckItem* topology = ItemIn(*diagnosis, "topology");
  ASSERT_NE(topology, nullptr);
  EXPECT_EQ(topology->verdict, CheckVerdict::kWarn);
  EXPECT_EQ(topology->found.rfind("redis ", 0), 0u) << topology->found;
  EXPECT_NE(topology->found.find("no replicas"), std::string::npos) << topology->found;

  auto durable_server = StartServer({.aof = true});
  ASSERT_NE(durable_server, nullptr);
  auto on = OpenUrl(durable_server->Url());
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  auto durable = (*on)->Diagnose();
  ASSERT_TRUE(durable.ok()) << durable.status().ToString();
  durability = ItemIn(*durable, "durability");
  ASSERT_NE(durability, nullptr);
  EXPECT_EQ(durability->verdict, CheckVerdict::kPass) << durability->found;
  EXPECT_NE(durability->found.find("appendfsync always"), std::string::npos) << durability->found;
  EXPECT_TRUE(durability->fix.empty()) << durability->fix;

  // A paused server: Ping gives up within command_timeout.
  volatile_server->Pause();
  EXPECT_EQ((*off)->Ping().code(), StatusCode::kUnavailable);
  volatile_server->Resume();
}

TEST(RedisBackendTest, PermissionsFixIsTheReadmeListAndAUserWithOnlyItPassesACheck) {
  // The default handle's line names every command of the README's list (SELECT only for a db
  // other than 0).
  auto server = StartServer({.acl_users = {"user app on >pw ~* &* +@all"}});
  ASSERT_NE(server, nullptr);
  auto plain = OpenUrl(fmt::format("redis://app:pw@127.0.0.1:{}", server->port()));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  const std::string line = (*plain)->PermissionsFix();
  EXPECT_EQ(line.rfind("ACL SETUSER app on ~leasehold:* &leasehold:* -@all ", 0), 0u) << line;
  std::istringstream needed(kNeededCommands);
  for (std::string command; needed >> command;) {
    if (command != "+select") {
      EXPECT_NE(line.find(" " + command + " "), std::string::npos) << command << " in " << line;
    }
  }

  // Each variant's line, applied to a user that had everything, leaves it enough for the whole
  // cycle of a check (acquire, renew, inspect, list, the record, release, the wait).
  for (const std::string query : {"", "?fair=true", "?prefix=other"}) {
    for (const std::string db : {"", "/3"}) {
      SCOPED_TRACE(db + query);
      const std::string url =
          fmt::format("redis://app:pw@127.0.0.1:{}{}{}", server->port(), db, query);
      ASSERT_TRUE(
          server->Cli({"ACL", "SETUSER", "app", "reset", "on", ">pw", "~*", "&*", "+@all"}).ok());
      auto opened = OpenUrl(url);
      ASSERT_TRUE(opened.ok()) << opened.status().ToString();
      std::string fix = (*opened)->PermissionsFix();
      const std::size_t optional = fix.find(" (optional:");
      ASSERT_NE(optional, std::string::npos) << fix;
      std::istringstream rules(fix.substr(std::string_view("ACL SETUSER app ").size(),
                                          optional - std::string_view("ACL SETUSER app ").size()));
      std::vector<std::string> acl = {"ACL", "SETUSER", "app", "reset", ">pw"};
      for (std::string rule; rules >> rule;) {
        acl.push_back(rule);
      }
      auto set = server->Cli(acl);
      ASSERT_TRUE(set.ok() && *set == "OK") << (set.ok() ? *set : set.status().ToString());
      auto store = Store::Open(url);
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      auto report = (*store)->Check({.probes = 3, .renewals = 2});
      ASSERT_TRUE(report.ok()) << report.status().ToString();
      EXPECT_TRUE(report->cycle_done);
      // Only what the line leaves out on purpose (CONFIG GET, INFO) is a warning; the clock
      // (TIME) and everything the cycle did pass.
      for (const CheckItem& item : report->items) {
        if (item.area != "durability" && item.area != "topology" && item.area != "eviction") {
          EXPECT_EQ(item.verdict, CheckVerdict::kPass) << item.area << ": " << item.found;
        }
      }
    }
  }
}

// Runs `call` until it gives something other than kUnavailable (the first calls after a
// server restart meet broken connections and reconnect backoff), at most ~5 s.
template <typename Call>
auto UntilAnswered(Call call) {
  auto result = call();
  for (int i = 0; i < 100 && result.status().code() == StatusCode::kUnavailable; ++i) {
    std::this_thread::sleep_for(50ms);
    result = call();
  }
  return result;
}

// A fenced write of `ops` by the holder of the grant (key, owner token, fencing token).
FencedWriteRequest WriteAs(const std::string& key, const std::string& owner_token,
                           FencingToken token, const FencedWrite& write) {
  return {.key = key,
          .owner_token = owner_token,
          .fencing_token = token,
          .store_key = RedisBackend::LeaseKeyName("leasehold", key),
          .ops = write.ops()};
}

TEST(RedisBackendTest, FencedWriteSetsHashFieldsAndCountsEveryOp) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  for (bool fair : {false, true}) {
    auto store = Store::Open(server->Url() + (fair ? "?fair=true" : ""));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_TRUE((*store)->SupportsFencedOp(FencedOp::Kind::kPut));
    EXPECT_TRUE((*store)->SupportsFencedOp(FencedOp::Kind::kDelete));
    EXPECT_TRUE((*store)->SupportsFencedOp(FencedOp::Kind::kHashSet));
    EXPECT_FALSE((*store)->SupportsFencedOp(FencedOp::Kind::kSql));
    const std::string key = fair ? "fair-job" : "job";
    auto lease = (*store)->TryAcquire(key, {.ttl = 10s});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    EXPECT_EQ(lease->store_key(), RedisBackend::LeaseKeyName("leasehold", key))
        << "the grant hash, whose {...} is the key's hash tag";
    const std::string hash = "data:" + key + ":h";
    const std::string text = "data:" + key + ":s";
    auto done = lease->Write(FencedWrite()
                                 .HashSet(hash, "status", "sent")
                                 .HashSet(hash, "status", "paid")
                                 .HashSet(hash, "by", "a")
                                 .Put(text, "v")
                                 .Delete(text)
                                 .Delete(text));
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_EQ(done->affected, (std::vector<std::int64_t>{1, 1, 1, 1, 1, 0}))
        << "an HSET that overwrites a field counts 1 too";
    EXPECT_EQ(*server->Cli({"HGET", hash, "status"}), "paid");
    EXPECT_EQ(*server->Cli({"HGET", hash, "by"}), "a");
    EXPECT_EQ(*server->Cli({"EXISTS", text}), "0");
    EXPECT_TRUE(lease->valid());
  }
}

TEST(RedisBackendTest, FencedWriteTakesEqualTokensRefusesLowerOnesAndTakesLaterHolders) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto a = (*backend)->TryAcquire({"job", Token('a'), "holder-a", 10s});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->store_key, RedisBackend::LeaseKeyName("leasehold", "job"));
  // The holder, with its (equal) token, writes as often as it likes.
  for (int i = 0; i < 20; ++i) {
    auto wrote = (*backend)->FencedWrite(
        WriteAs("job", Token('a'), a->fencing_token, FencedWrite().Put("reg", std::to_string(i))));
    ASSERT_TRUE(wrote.ok()) << i << ": " << wrote.status().ToString();
  }
  EXPECT_EQ(*server->Cli({"GET", "reg"}), "19");

  // B takes over with a higher token and writes; A, with its lower token, is refused.
  ASSERT_TRUE(*(*backend)->ForceRelease("job"));
  auto b = (*backend)->TryAcquire({"job", Token('b'), "holder-b", 10s});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_GT(b->fencing_token, a->fencing_token);
  ASSERT_TRUE(
      (*backend)
          ->FencedWrite(WriteAs("job", Token('b'), b->fencing_token, FencedWrite().Put("reg", "b")))
          .ok());
  auto stale = (*backend)->FencedWrite(
      WriteAs("job", Token('a'), a->fencing_token, FencedWrite().Put("reg", "a").Put("x", "a")));
  ASSERT_EQ(stale.status().code(), StatusCode::kLost) << stale.status().ToString();
  EXPECT_NE(stale.status().message().find(fmt::format(
                "fenced out: lease job (fencing token {}) is now held by holder-b under fencing "
                "token {}",
                a->fencing_token, b->fencing_token)),
            std::string_view::npos)
      << stale.status().message();
  EXPECT_EQ(*server->Cli({"GET", "reg"}), "b");
  EXPECT_EQ(*server->Cli({"EXISTS", "x"}), "0");

  // The chaos harness's negative control skips only the owner check: the stale write lands.
  FencedWriteRequest unguarded =
      WriteAs("job", Token('a'), a->fencing_token, FencedWrite().Put("reg", "a-unguarded"));
  unguarded.skip_guard_for_testing = true;
  ASSERT_TRUE((*backend)->FencedWrite(unguarded).ok());
  EXPECT_EQ(*server->Cli({"GET", "reg"}), "a-unguarded");

  // Released: nobody holds it, and B's own write is refused too.
  ASSERT_TRUE((*backend)->Release("job", Token('b')).ok());
  auto released = (*backend)->FencedWrite(
      WriteAs("job", Token('b'), b->fencing_token, FencedWrite().Put("reg", "b-late")));
  ASSERT_EQ(released.status().code(), StatusCode::kLost) << released.status().ToString();
  EXPECT_NE(released.status().message().find("is no longer held: expired or released"),
            std::string_view::npos)
      << released.status().message();

  // A later holder (higher token again) writes.
  auto c = (*backend)->TryAcquire({"job", Token('c'), "holder-c", 10s});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_GT(c->fencing_token, b->fencing_token);
  ASSERT_TRUE(
      (*backend)
          ->FencedWrite(WriteAs("job", Token('c'), c->fencing_token, FencedWrite().Put("reg", "c")))
          .ok());
  EXPECT_EQ(*server->Cli({"GET", "reg"}), "c");

  // A grant kept after its release (finish with keep) is still live, but writes nothing.
  ASSERT_TRUE((*backend)->Finish({.key = "job", .owner_token = Token('c'), .keep = 10s}).ok());
  auto kept = (*backend)->FencedWrite(
      WriteAs("job", Token('c'), c->fencing_token, FencedWrite().Put("reg", "c-kept")));
  EXPECT_EQ(kept.status().code(), StatusCode::kLost) << kept.status().ToString();
  EXPECT_EQ(*server->Cli({"GET", "reg"}), "c");
}

TEST(RedisBackendTest, FencedWriteRefusesDataKeysUnderTheStorePrefix) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto store = Store::Open(server->Url());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto lease = (*store)->TryAcquire("job", {.ttl = 10s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const std::string fence = RedisBackend::FenceKeyName("leasehold", "job");
  const std::string before = *server->Cli({"GET", fence});
  for (const std::string& own :
       {lease->store_key(), fence, RedisBackend::RecordKeyName("leasehold", "job"),
        RedisBackend::LeaseKeyName("leasehold", "other"), std::string("leasehold:mine")}) {
    auto refused = lease->Write(FencedWrite().Put("data:first", "1").Put(own, "x"));
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument)
        << own << ": " << refused.status().ToString();
    EXPECT_NE(refused.status().message().find(own), std::string_view::npos)
        << refused.status().message();
    EXPECT_EQ(lease->Write(FencedWrite().Delete(own)).status().code(), StatusCode::kInvalidArgument)
        << own;
  }
  EXPECT_EQ(*server->Cli({"EXISTS", "data:first"}), "0") << "nothing was sent";
  EXPECT_EQ(*server->Cli({"GET", fence}), before);
  EXPECT_TRUE(lease->valid());
  // Only "<prefix>:" is the store's: a name that merely starts with the prefix is data.
  auto near = lease->Write(FencedWrite().Put("leaseholder:x", "1").Put("leasehold", "2"));
  ASSERT_TRUE(near.ok()) << near.status().ToString();
  // The data keys may carry the lease's hash tag, for its cluster slot.
  const std::string tag = lease->store_key().substr(lease->store_key().find('{'));
  auto tagged = lease->Write(FencedWrite().Put("app:" + tag + ":status", "sent"));
  ASSERT_TRUE(tagged.ok()) << tagged.status().ToString();
  EXPECT_EQ(*server->Cli({"GET", "app:" + tag + ":status"}), "sent");
}

TEST(RedisBackendTest, FencedHashSetOntoANonHashIsRefusedBeforeAnythingIsWritten) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto store = Store::Open(server->Url());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto lease = (*store)->TryAcquire("job", {.ttl = 10s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(server->Cli({"SET", "str", "text"}).ok());
  ASSERT_TRUE(server->Cli({"RPUSH", "list", "item"}).ok());

  // Redis would have applied the SET before the HSET failed; the script checks first.
  auto refused =
      lease->Write(FencedWrite().Put("first", "1").Delete("list").HashSet("str", "f", "v"));
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("str, which holds a string"), std::string_view::npos)
      << refused.status().message();
  EXPECT_EQ(*server->Cli({"EXISTS", "first"}), "0") << "the earlier SET did not happen";
  EXPECT_EQ(*server->Cli({"EXISTS", "list"}), "1") << "the earlier DEL did not happen";
  EXPECT_EQ(*server->Cli({"GET", "str"}), "text");

  // The check follows the write's own earlier ops on the same key.
  auto made_string = lease->Write(FencedWrite().Put("fresh", "1").HashSet("fresh", "f", "v"));
  EXPECT_EQ(made_string.status().code(), StatusCode::kInvalidArgument)
      << made_string.status().ToString();
  EXPECT_EQ(*server->Cli({"EXISTS", "fresh"}), "0");
  auto deleted_first =
      lease->Write(FencedWrite().Delete("list").HashSet("list", "f", "v").HashSet("h", "f", "w"));
  ASSERT_TRUE(deleted_first.ok()) << deleted_first.status().ToString();
  EXPECT_EQ(deleted_first->affected, (std::vector<std::int64_t>{1, 1, 1}));
  EXPECT_EQ(*server->Cli({"HGET", "list", "f"}), "v");
  auto onto_hash = lease->Write(FencedWrite().HashSet("h", "g", "x").Put("h", "now a string"));
  ASSERT_TRUE(onto_hash.ok()) << onto_hash.status().ToString();
  EXPECT_EQ(*server->Cli({"GET", "h"}), "now a string") << "SET replaces any type";
  EXPECT_TRUE(lease->valid());
}

TEST(RedisBackendTest, FencedWriteThatTheAclForbidsPartWayWritesNothing) {
  // May run the backend's commands and TYPE on its own keys and data:*, but not SET.
  auto server = StartServer(
      {.acl_users = {fmt::format("user app on >pw ~leasehold:* ~data:* &leasehold:* {} +type -set",
                                 kNeededCommands)}});
  ASSERT_NE(server, nullptr);
  auto store = Store::Open(fmt::format("redis://app:pw@127.0.0.1:{}", server->port()));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto lease = (*store)->TryAcquire("job", {.ttl = 10s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  auto no_set = lease->Write(FencedWrite().HashSet("data:h", "f", "v").Put("data:s", "x"));
  EXPECT_EQ(no_set.status().code(), StatusCode::kPermissionDenied) << no_set.status().ToString();
  EXPECT_NE(no_set.status().message().find("SET on data:s"), std::string_view::npos)
      << no_set.status().message();
  EXPECT_EQ(*server->Cli({"EXISTS", "data:h"}), "0") << "the earlier HSET did not happen";
  auto other_key = lease->Write(FencedWrite().HashSet("data:h", "f", "v").HashSet("x:h", "f", "v"));
  EXPECT_EQ(other_key.status().code(), StatusCode::kPermissionDenied)
      << other_key.status().ToString();
  EXPECT_EQ(*server->Cli({"EXISTS", "data:h"}), "0");
  auto allowed = lease->Write(FencedWrite().HashSet("data:h", "f", "v").Delete("data:s"));
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  EXPECT_EQ(*server->Cli({"HGET", "data:h", "f"}), "v");
  EXPECT_TRUE(lease->valid());
}

TEST(RedisBackendTest, WithoutPersistenceARestartRepeatsTokensButStillFencesOutTheOldHolder) {
  auto server = StartServer({.aof = false});
  ASSERT_NE(server, nullptr);
  const std::string url = server->Url() + "?command_timeout=500ms&connect_timeout=500ms";
  auto a_backend = OpenUrl(url);
  auto b_backend = OpenUrl(url);
  ASSERT_TRUE(a_backend.ok() && b_backend.ok());
  ASSERT_FALSE((*a_backend)->capabilities().fencing_survives_restart);
  Result<Grant> a = Status::Internal("not acquired");
  for (int i = 0; i < 3; ++i) {  // A's grant is the third: fencing token 3
    a = (*a_backend)->TryAcquire({"job", Token('a'), "holder-a", 30s});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    if (i < 2) {
      ASSERT_TRUE((*a_backend)->Release("job", Token('a')).ok());
    }
  }
  ASSERT_EQ(a->fencing_token, 3u);
  ASSERT_TRUE(
      (*a_backend)
          ->FencedWrite(WriteAs("job", Token('a'), a->fencing_token, FencedWrite().Put("reg", "a")))
          .ok());

  // The server restarts with nothing: no grant, no data, no fencing counter.
  ASSERT_TRUE(server->Restart().ok());
  auto b = UntilAnswered([&] {
    return (*b_backend)->TryAcquire({"job", Token('b'), "holder-b", 30s});
  });
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::printf("[ figure ] after a restart without persistence, B's token is %llu, A's was %llu\n",
              static_cast<unsigned long long>(b->fencing_token),
              static_cast<unsigned long long>(a->fencing_token));
  EXPECT_EQ(b->fencing_token, 1u) << "the counter started again";
  EXPECT_LE(b->fencing_token, a->fencing_token) << "a later holder's token is not higher";
  auto stale = UntilAnswered([&] {
    return (*a_backend)
        ->FencedWrite(
            WriteAs("job", Token('a'), a->fencing_token, FencedWrite().Put("reg", "a-stale")));
  });
  ASSERT_EQ(stale.status().code(), StatusCode::kLost) << stale.status().ToString();
  EXPECT_EQ(*server->Cli({"EXISTS", "reg"}), "0") << "A's old write died with the server";

  // Even when B's token equals A's, the owner tokens differ: A stays fenced out.
  for (FencingToken t = b->fencing_token; t < a->fencing_token; ++t) {
    ASSERT_TRUE((*b_backend)->Release("job", Token('b')).ok());
    b = (*b_backend)->TryAcquire({"job", Token('b'), "holder-b", 30s});
    ASSERT_TRUE(b.ok()) << b.status().ToString();
  }
  ASSERT_EQ(b->fencing_token, a->fencing_token);
  ASSERT_TRUE(
      (*b_backend)
          ->FencedWrite(WriteAs("job", Token('b'), b->fencing_token, FencedWrite().Put("reg", "b")))
          .ok());
  auto same_number = (*a_backend)
                         ->FencedWrite(WriteAs("job", Token('a'), a->fencing_token,
                                               FencedWrite().Put("reg", "a-stale")));
  ASSERT_EQ(same_number.status().code(), StatusCode::kLost) << same_number.status().ToString();
  EXPECT_NE(same_number.status().message().find(
                "(fencing token 3) is now held by holder-b under fencing token 3"),
            std::string_view::npos)
      << same_number.status().message();
  EXPECT_EQ(*server->Cli({"GET", "reg"}), "b");
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

TEST(RedisBackendTest, AclUserWithTheFairCommandsCanUseFairQueues) {
  auto server = StartServer(
      {.acl_users = {fmt::format("user app on >app-pass ~leasehold:* &leasehold:* {} {}",
                                 kNeededCommands, kFairCommands)}});
  ASSERT_NE(server, nullptr);
  std::string url = fmt::format("redis://app:app-pass@127.0.0.1:{}?fair=true", server->port());
  auto a = Store::Open(url);
  auto b = Store::Open(url);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto held = (*a)->TryAcquire("job", {.ttl = 2s, .holder = "a"});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  // Queues, waits, gives up and leaves the queue (the abandon-wait script).
  auto timed_out = (*b)->Acquire("job", {.ttl = 2s, .wait = 200ms});
  EXPECT_EQ(timed_out.status().code(), StatusCode::kDeadlineExceeded)
      << timed_out.status().ToString();
  EXPECT_EQ(Queued(*server, "job"), 0);
  std::jthread release([&] {
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE(held->Release().ok());
  });
  auto waited = (*b)->Acquire("job", {.ttl = 2s, .wait = 10s});
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
}

// The fencing token of the live grant of `key`, or -1.
long long LiveFence(RedisBackend& backend, std::string_view key) {
  auto info = backend.Inspect(key);
  return info.ok() && info->has_value() ? static_cast<long long>((*info)->fencing_token) : -1;
}

// The holder of the live grant of `key`, or "" if none.
std::string LiveHolder(RedisBackend& backend, std::string_view key) {
  auto info = backend.Inspect(key);
  return info.ok() && info->has_value() ? (*info)->holder : std::string();
}

TEST(RedisBackendTest, FairReleaseHandsTheKeyToADeadHeadWaiterWhichBlocksItOnlyForItsTtl) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url() + "?fair=true");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE((*backend)->capabilities().fair_queue);
  ASSERT_TRUE((*backend)->TryAcquire({"job", Token('a'), "h", 5s}).ok());
  // 'd' queues first and then dies (never re-attempts); 'l' queues behind it.
  auto dead = (*backend)->TryAcquire({"job", Token('b'), "d", 5s, Waiter('d')});
  ASSERT_EQ(dead.status().code(), StatusCode::kHeldByAnother) << dead.status().ToString();
  auto live = (*backend)->TryAcquire({"job", Token('c'), "l", 5s, Waiter('e')});
  ASSERT_EQ(live.status().code(), StatusCode::kHeldByAnother);
  EXPECT_NE(live.status().message().find("#2"), std::string_view::npos) << live.status().ToString();
  EXPECT_EQ(Queued(*server, "job"), 2);

  // The entry's deadline is the server's now plus the entry lifetime (max(ttl, 10 s) plus two
  // command timeouts: 14 s here), and the queue keys vanish by themselves after it.
  const std::string expiry_key = RedisBackend::QueueExpiryKeyName("leasehold", "job");
  auto deadline = server->Cli({"ZSCORE", expiry_key, Waiter('d')});
  auto time = server->Cli({"TIME"});
  ASSERT_TRUE(deadline.ok() && time.ok());
  const long long now_ms = std::stoll(*time) * 1000;
  const long long left_ms = std::stoll(*deadline) - now_ms;
  std::printf("[ figure ] a queue entry lives %lld ms past its waiter's latest attempt\n", left_ms);
  EXPECT_GT(left_ms, 12'000);
  EXPECT_LE(left_ms, 15'000);
  for (const std::string& queue_key : {RedisBackend::QueueKeyName("leasehold", "job"),
                                       RedisBackend::QueueDataKeyName("leasehold", "job")}) {
    auto pttl = server->Cli({"PTTL", queue_key});
    ASSERT_TRUE(pttl.ok());
    EXPECT_GT(std::stoll(*pttl), 0) << queue_key << " must not outlive its entries";
  }

  // The release hands the key to the head, dead or not: it holds it under its own token...
  const long long releaser_fence = LiveFence(**backend, "job");
  ASSERT_TRUE((*backend)->Release("job", Token('a')).ok());
  EXPECT_EQ(LiveHolder(**backend, "job"), "d");
  EXPECT_GT(LiveFence(**backend, "job"), releaser_fence);
  auto pttl = server->Cli({"PTTL", RedisBackend::LeaseKeyName("leasehold", "job")});
  ASSERT_TRUE(pttl.ok());
  EXPECT_GT(std::stoll(*pttl), 4000) << "the handed grant lives the waiter's own TTL (5 s)";
  EXPECT_LE(std::stoll(*pttl), 5000);
  auto not_yet = (*backend)->TryAcquire({"job", Token('c'), "l", 5s, Waiter('e')});
  ASSERT_EQ(not_yet.status().code(), StatusCode::kHeldByAnother)
      << "the dead waiter holds the key until its grant expires";
  ASSERT_NE(not_yet.status().holder(), nullptr);
  EXPECT_EQ(not_yet.status().holder()->holder, "d");
  EXPECT_EQ(Queued(*server, "job"), 1) << "the dead waiter left the queue when handed the key";

  // ...until its grant expires (shortened here, as time would).
  ASSERT_TRUE(server->Cli({"PEXPIRE", RedisBackend::LeaseKeyName("leasehold", "job"), "1"}).ok());
  std::this_thread::sleep_for(20ms);
  auto granted = (*backend)->TryAcquire({"job", Token('c'), "l", 5s, Waiter('e')});
  ASSERT_TRUE(granted.ok()) << granted.status().ToString();
  EXPECT_EQ(Queued(*server, "job"), 0);
  auto left = server->Cli({"EXISTS", RedisBackend::QueueKeyName("leasehold", "job"), expiry_key,
                           RedisBackend::QueueSeqKeyName("leasehold", "job"),
                           RedisBackend::QueueDataKeyName("leasehold", "job")});
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, "0") << "an empty queue leaves no keys behind";
}

// The head of the queue in arrival order gets the key inside each release, under its own owner
// token and a fencing token above the releaser's; a waiter that never heard the message (no
// WaitForTurn here at all) still acquires on its next attempt, with its validity counted from
// its own latest queue refresh, not as a fresh grant.
TEST(RedisBackendTest, FairReleaseHandsTheKeyToTheHeadInArrivalOrderWithHigherFencingTokens) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url() + "?fair=true");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto first = (*backend)->TryAcquire({"job", Token('a'), "h", 5s});
  ASSERT_TRUE(first.ok());
  const std::string names[] = {"w1", "w2", "w3"};
  const char ids[] = {'1', '2', '3'};
  const char tokens[] = {'b', 'c', 'd'};
  for (int i = 0; i < 3; ++i) {
    auto queued = (*backend)->TryAcquire({"job", Token(tokens[i]), names[i], 5s, Waiter(ids[i])});
    ASSERT_EQ(queued.status().code(), StatusCode::kHeldByAnother);
  }
  std::string releaser_token = Token('a');
  FencingToken releaser_fence = first->fencing_token;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*backend)->Release("job", releaser_token).ok());
    EXPECT_EQ(LiveHolder(**backend, "job"), names[i]) << "handoff " << i << " skipped the head";
    // The later waiters are still queued, behind the new holder.
    for (int j = i + 1; j < 3; ++j) {
      auto behind = (*backend)->TryAcquire({"job", Token(tokens[j]), names[j], 5s, Waiter(ids[j])});
      ASSERT_EQ(behind.status().code(), StatusCode::kHeldByAnother) << behind.status().ToString();
    }
    auto taken = (*backend)->TryAcquire({"job", Token(tokens[i]), names[i], 5s, Waiter(ids[i])});
    ASSERT_TRUE(taken.ok()) << taken.status().ToString();
    EXPECT_GT(taken->fencing_token, releaser_fence);
    EXPECT_EQ(static_cast<long long>(taken->fencing_token), LiveFence(**backend, "job"));
    EXPECT_LT(taken->ttl, 5s) << "counted from the waiter's queue refresh, before the release";
    EXPECT_GE(taken->ttl, 5s * 3 / 4);
    // The grant is the waiter's: it renews and releases it with its own token.
    EXPECT_TRUE((*backend)->Renew({"job", Token(tokens[i]), 5s}).ok());
    releaser_token = Token(tokens[i]);
    releaser_fence = taken->fencing_token;
  }
  ASSERT_TRUE((*backend)->Release("job", releaser_token).ok());
  EXPECT_EQ(LiveHolder(**backend, "job"), "") << "nobody is left to hand the key to";
  EXPECT_EQ(Queued(*server, "job"), 0);
}

// A waiter hears the "handed" message in WaitForTurn and takes the grant from it with no round
// trip at all; one whose last queue refresh is old renews first and reports a full TTL.
TEST(RedisBackendTest, FairHandedGrantIsTakenFromTheMessageOrRenewedFirstWhenOld) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto holder = OpenUrl(server->Url() + "?fair=true");
  auto waiter = OpenUrl(server->Url() + "?fair=true");
  ASSERT_TRUE(holder.ok() && waiter.ok());
  for (const bool old_refresh : {false, true}) {
    SCOPED_TRACE(old_refresh ? "old queue refresh" : "fresh queue refresh");
    // A key per case: the first case's subscription lingers, and a release before the second
    // waiter registers would not be kept for it.
    const std::string key = old_refresh ? "job2" : "job1";
    const std::string channel = RedisBackend::ChannelName("leasehold", key);
    const Duration ttl = old_refresh ? Duration(2s) : Duration(5s);
    ASSERT_TRUE((*holder)->TryAcquire({key, Token('a'), "h", 5s}).ok());
    ASSERT_FALSE((*waiter)->TryAcquire({key, Token('b'), "w", ttl, Waiter('w')}).ok());
    std::future<Status> wait = std::async(std::launch::async, [&] {
      return (*waiter)->WaitForTurn(key, Waiter('w'), BootClock::now() + 20s, {});
    });
    // Once the waiter's SUBSCRIBE is in, the message cannot be missed.
    for (int i = 0; i < 500; ++i) {
      auto subs = server->Cli({"PUBSUB", "NUMSUB", channel});
      if (subs.ok() && subs->ends_with("\n1")) {
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    if (old_refresh) {
      std::this_thread::sleep_for(600ms);  // over 1/4 of the waiter's 2 s TTL
    }
    ASSERT_TRUE((*holder)->Release(key, Token('a')).ok());
    ASSERT_EQ(wait.wait_for(10s), std::future_status::ready);
    EXPECT_TRUE(wait.get().ok());
    const long long calls = CommandCalls(*server, "evalsha");
    auto taken = (*waiter)->TryAcquire({key, Token('b'), "w", ttl, Waiter('w')});
    ASSERT_TRUE(taken.ok()) << taken.status().ToString();
    const long long calls_after = CommandCalls(*server, "evalsha");
    EXPECT_EQ(static_cast<long long>(taken->fencing_token), LiveFence(**holder, key));
    if (old_refresh) {
      EXPECT_EQ(calls_after, calls + 1) << "renewed first";
      EXPECT_EQ(taken->ttl, ttl) << "a renewal counts a full TTL from after the core's t_send";
    } else {
      EXPECT_EQ(calls_after, calls) << "no round trip";
      EXPECT_LT(taken->ttl, ttl);
      EXPECT_GE(taken->ttl, ttl * 3 / 4);
    }
    ASSERT_TRUE((*waiter)->Release(key, Token('b')).ok());
  }
}

// A waiter that gives up after a release handed it the key (Store::Acquire's deadline or
// cancellation came first) does not leave the key held: AbandonWait ends that grant and hands
// the key on to the next in line, or frees it.
TEST(RedisBackendTest, FairWaiterThatAbandonsAfterBeingHandedTheKeyDoesNotLeaveItHeld) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url() + "?fair=true");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE((*backend)->TryAcquire({"job", Token('a'), "h", 5s}).ok());
  ASSERT_FALSE((*backend)->TryAcquire({"job", Token('b'), "x", 5s, Waiter('1')}).ok());
  ASSERT_FALSE((*backend)->TryAcquire({"job", Token('c'), "y", 5s, Waiter('2')}).ok());
  ASSERT_TRUE((*backend)->Release("job", Token('a')).ok());
  ASSERT_EQ(LiveHolder(**backend, "job"), "x");
  (*backend)->AbandonWait("job", Waiter('1'));
  EXPECT_EQ(LiveHolder(**backend, "job"), "y") << "handed on to the next waiter";
  (*backend)->AbandonWait("job", Waiter('1'));  // twice is harmless
  EXPECT_EQ(LiveHolder(**backend, "job"), "y");
  (*backend)->AbandonWait("job", Waiter('2'));
  EXPECT_EQ(LiveHolder(**backend, "job"), "") << "nobody waits: the key is free";
  EXPECT_EQ(Queued(*server, "job"), 0);
  // A grant of the waiter's own making (not handed) is never ended by AbandonWait.
  auto own = (*backend)->TryAcquire({"job", Token('d'), "z", 5s, Waiter('3')});
  ASSERT_TRUE(own.ok());
  (*backend)->AbandonWait("job", Waiter('3'));
  EXPECT_EQ(LiveHolder(**backend, "job"), "z");
}

// ForceRelease and Finish (without keep) hand over as Release does; Finish with keep does not.
TEST(RedisBackendTest, FairForceReleaseAndFinishHandTheKeyToTheHead) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url() + "?fair=true");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE((*backend)->TryAcquire({"job", Token('a'), "h", 5s}).ok());
  ASSERT_FALSE((*backend)->TryAcquire({"job", Token('b'), "x", 5s, Waiter('1')}).ok());
  ASSERT_FALSE((*backend)->TryAcquire({"job", Token('c'), "y", 5s, Waiter('2')}).ok());
  auto forced = (*backend)->ForceRelease("job");
  ASSERT_TRUE(forced.ok() && *forced);
  EXPECT_EQ(LiveHolder(**backend, "job"), "x");
  auto x = (*backend)->TryAcquire({"job", Token('b'), "x", 5s, Waiter('1')});
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  ASSERT_TRUE(
      (*backend)
          ->Finish({.key = "job", .owner_token = Token('b'), .record = "r1", .record_ttl = 60s})
          .ok());
  EXPECT_EQ(LiveHolder(**backend, "job"), "y");
  auto record = (*backend)->ReadRecord("job");
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ(**record, "r1");
  EXPECT_EQ((*backend)->Release("job", Token('b')).code(), StatusCode::kLost)
      << "the old holder's token no longer matches";
  auto y = (*backend)->TryAcquire({"job", Token('c'), "y", 5s, Waiter('2')});
  ASSERT_TRUE(y.ok());
  ASSERT_FALSE((*backend)->TryAcquire({"job", Token('d'), "z", 5s, Waiter('3')}).ok());
  ASSERT_TRUE((*backend)->Finish({.key = "job", .owner_token = Token('c'), .keep = 5s}).ok());
  EXPECT_EQ(LiveHolder(**backend, "job"), "y") << "a kept grant stays until keep runs out";
}

TEST(RedisBackendTest, FairAbandonWaitRemovesTheEntryAndTheNextWaiterMovesUp) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url() + "?fair=true");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE((*backend)->TryAcquire({"job", Token('a'), "h", 5s}).ok());
  ASSERT_FALSE((*backend)->TryAcquire({"job", Token('b'), "x", 5s, Waiter('1')}).ok());
  ASSERT_FALSE((*backend)->TryAcquire({"job", Token('c'), "y", 5s, Waiter('2')}).ok());
  ASSERT_TRUE((*backend)->Release("job", Token('a')).ok());
  ASSERT_FALSE((*backend)->TryAcquire({"job", Token('c'), "y", 5s, Waiter('2')}).ok())
      << "waiter 2 is behind waiter 1";
  // The release handed the key to waiter 1; leaving, it hands it on to waiter 2.
  (*backend)->AbandonWait("job", Waiter('1'));
  EXPECT_EQ(Queued(*server, "job"), 0);
  (*backend)->AbandonWait("job", Waiter('1'));  // twice is harmless
  auto granted = (*backend)->TryAcquire({"job", Token('c'), "y", 5s, Waiter('2')});
  ASSERT_TRUE(granted.ok()) << granted.status().ToString();
  EXPECT_EQ(Queued(*server, "job"), 0);

  // Through Store::Acquire: a waiter that gives up leaves the queue at once.
  auto store = Store::Open(server->Url() + "?fair=true");
  ASSERT_TRUE(store.ok());
  auto gave_up = (*store)->Acquire("job", {.ttl = 5s, .wait = 300ms});
  EXPECT_EQ(gave_up.status().code(), StatusCode::kDeadlineExceeded) << gave_up.status().ToString();
  EXPECT_EQ(Queued(*server, "job"), 0);
  std::stop_source cancel;
  auto cancelled = std::async(std::launch::async, [&] {
    return (*store)->Acquire("job", {.ttl = 5s, .wait = 60s}, cancel.get_token());
  });
  for (int i = 0; i < 200 && Queued(*server, "job") != 1; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(Queued(*server, "job"), 1);
  cancel.request_stop();
  ASSERT_EQ(cancelled.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(cancelled.get().status().code(), StatusCode::kCancelled);
  EXPECT_EQ(Queued(*server, "job"), 0);
}

TEST(RedisBackendTest, FairReleaserThatLoopsNeverBargesAheadOfWaiters) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string url = server->Url() + "?fair=true";
  auto releaser = Store::Open(url);
  ASSERT_TRUE(releaser.ok());
  auto held = (*releaser)->TryAcquire("job", {.ttl = 5s});
  ASSERT_TRUE(held.ok());
  constexpr int kWaiters = 3;
  std::atomic<int> done{0};
  std::vector<std::jthread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&] {
      auto store = Store::Open(url);
      ASSERT_TRUE(store.ok());
      auto lease = (*store)->Acquire("job", {.ttl = 5s, .wait = 30s});
      ASSERT_TRUE(lease.ok()) << lease.status().ToString();
      std::this_thread::sleep_for(20ms);
      done.fetch_add(1);  // before the release: from here on the releaser may win
      EXPECT_TRUE(lease->Release().ok());
    });
  }
  for (int i = 0; i < 500 && Queued(*server, "job") != kWaiters; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(Queued(*server, "job"), kWaiters);
  ASSERT_TRUE(held->Release().ok());
  int barged = 0;
  int attempts = 0;
  for (; attempts < 2000 && done.load() < kWaiters; ++attempts) {
    auto again = (*releaser)->TryAcquire("job", {.ttl = 5s});
    if (again.ok()) {
      barged += done.load() < kWaiters ? 1 : 0;
      ASSERT_TRUE(again->Release().ok());
    } else {
      ASSERT_EQ(again.status().code(), StatusCode::kHeldByAnother) << again.status().ToString();
    }
    std::this_thread::sleep_for(1ms);
  }
  waiters.clear();
  std::printf("[ figure ] a looping releaser tried %d times while %d waiters were served\n",
              attempts, kWaiters);
  EXPECT_EQ(done.load(), kWaiters);
  EXPECT_EQ(barged, 0) << "the releaser took the key while waiters were queued";
}

// The issue's claim: under contention no waiter starves. 8 participants, each on its own
// handle, loop acquire / hold 1 ms / release; each must get the key every round, the longest
// wait must stay near one pass of the queue (participants x hold + handoffs; a functional bound
// with generous slack, not a benchmark: bench/ has those), and nobody is overtaken more than
// about once by each other participant. The figures are printed.
TEST(RedisBackendTest, FairQueueLetsNoWaiterStarveUnderContention) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string url = server->Url() + "?fair=true";
  constexpr int kParticipants = 8;
  constexpr int kRounds = 25;
  constexpr auto kHold = 1ms;
  std::vector<int> grants(kParticipants, 0);
  std::vector<Duration> max_wait(kParticipants, Duration::zero());
  // Grants so far, and the most grants others got while one participant waited (its "bypass"
  // count; about participants - 1 when the queue is first come, first served).
  std::atomic<int> granted{0};
  std::vector<int> max_bypass(kParticipants, 0);
  std::atomic<int> ready{0};
  {
    std::vector<std::jthread> threads;
    for (int p = 0; p < kParticipants; ++p) {
      threads.emplace_back([&, p] {
        auto store = Store::Open(url);
        ASSERT_TRUE(store.ok()) << store.status().ToString();
        ready.fetch_add(1);
        while (ready.load() < kParticipants) {
          std::this_thread::yield();
        }
        for (int r = 0; r < kRounds; ++r) {
          const auto start = BootClock::now();
          const int granted_before = granted.load();
          auto lease = (*store)->Acquire("hot", {.ttl = 5s, .wait = 60s});
          ASSERT_TRUE(lease.ok()) << lease.status().ToString();
          max_wait[p] = std::max<Duration>(max_wait[p], BootClock::now() - start);
          max_bypass[p] = std::max(max_bypass[p], granted.fetch_add(1) - granted_before);
          ++grants[p];
          std::this_thread::sleep_for(kHold);
          ASSERT_TRUE(lease->Release().ok());
        }
      });
    }
  }
  Duration worst = Duration::zero();
  int worst_bypass = 0;
  for (int p = 0; p < kParticipants; ++p) {
    EXPECT_EQ(grants[p], kRounds) << "participant " << p << " starved";
    worst = std::max(worst, max_wait[p]);
    worst_bypass = std::max(worst_bypass, max_bypass[p]);
  }
  const auto worst_ms = std::chrono::duration<double, std::milli>(worst).count();
  std::printf(
      "[ figure ] fair redis, %d participants x %d rounds, hold 1 ms: longest wait %.1f ms, "
      "most grants to others during one wait %d\n",
      kParticipants, kRounds, worst_ms, worst_bypass);
  // One pass of the queue is 7 others x (1 ms hold + a handoff of a few ms); 2 s is generous
  // slack for a loaded machine, and still far below an unfair lock's multi-second starvation.
  EXPECT_LT(worst, kParticipants * kHold + 2s);
  // First come, first served: while one participant waits, each other one gets the key at most
  // once after it queued (7 here). Without fair=true this reads 100 and more. The bound is loose
  // because a thread can be descheduled between reading the count and queueing.
  EXPECT_LE(worst_bypass, 4 * (kParticipants - 1));
}

// Shared leases (backends/backend.h, "Shared leases"; layout in redis_scripts.h).

GrantRequest SemaphoreRequest(char token, std::string holder, std::uint32_t limit, Duration ttl,
                              std::string waiter = {}) {
  return GrantRequest{.key = "pool",
                      .owner_token = Token(token),
                      .holder = std::move(holder),
                      .ttl = ttl,
                      .waiter_id = std::move(waiter),
                      .mode = LeaseMode::kExclusive,
                      .limit = limit};
}

GrantRequest RwRequest(char token, std::string holder, LeaseMode mode, Duration ttl,
                       std::string waiter = {}) {
  return GrantRequest{.key = "doc",
                      .owner_token = Token(token),
                      .holder = std::move(holder),
                      .ttl = ttl,
                      .waiter_id = std::move(waiter),
                      .mode = mode,
                      .limit = 1};
}

TEST(RedisBackendTest, SemaphoreGrantsAreFieldsOfTheOneGrantHashEachAcquireOneScript) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE((*backend)->capabilities().shared_leases);
  const long long before = CommandCalls(*server, "evalsha");
  auto a = (*backend)->TryAcquire(SemaphoreRequest('a', "w-a", 2, 5s));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(CommandCalls(*server, "evalsha") - before, 1) << "one script per acquire";
  auto b = (*backend)->TryAcquire(SemaphoreRequest('b', "w-b", 2, 5s));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->slot, 0u);
  EXPECT_EQ(b->slot, 1u);
  EXPECT_GT(b->fencing_token, a->fencing_token);
  EXPECT_EQ(a->store_key, RedisBackend::LeaseKeyName("leasehold", "pool"));

  // One hash, one slot of a cluster: the header and one field per grant, nothing else.
  const std::string hash = RedisBackend::LeaseKeyName("leasehold", "pool");
  auto kind = server->Cli({"HMGET", hash, "kind", "limit", "token"});
  ASSERT_TRUE(kind.ok());
  EXPECT_EQ(*kind, "semaphore\n2\n-");
  auto fields = server->Cli({"HLEN", hash});
  ASSERT_TRUE(fields.ok());
  EXPECT_EQ(*fields, "7") << "kind, limit, token, holder, fence and two grants";
  auto field = server->Cli({"HEXISTS", hash, "g:" + Token('a')});
  ASSERT_TRUE(field.ok());
  EXPECT_EQ(*field, "1");
  auto keys = server->Cli({"KEYS", "leasehold:*"});
  ASSERT_TRUE(keys.ok());
  std::vector<std::string> names;
  std::istringstream listed(*keys);
  for (std::string name; std::getline(listed, name);) {
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names,
            (std::vector<std::string>{hash, RedisBackend::FenceKeyName("leasehold", "pool")}))
      << "only the grant hash and the fence counter";

  // Full: the holder of the lowest slot; another limit or an exclusive request: a mismatch.
  auto full = (*backend)->TryAcquire(SemaphoreRequest('c', "w-c", 2, 5s));
  ASSERT_EQ(full.status().code(), StatusCode::kHeldByAnother) << full.status().ToString();
  ASSERT_NE(full.status().holder(), nullptr);
  EXPECT_EQ(full.status().holder()->holder, "w-a");
  EXPECT_EQ(full.status().holder()->slot, 0u);
  EXPECT_EQ(full.status().holder()->limit, 2u);
  auto other_limit = (*backend)->TryAcquire(SemaphoreRequest('c', "w-c", 3, 5s));
  EXPECT_EQ(other_limit.status().code(), StatusCode::kInvalidArgument)
      << other_limit.status().ToString();
  auto exclusive = (*backend)->TryAcquire({"pool", Token('c'), "w-c", 5s});
  EXPECT_EQ(exclusive.status().code(), StatusCode::kInvalidArgument)
      << exclusive.status().ToString();

  // Holders by slot; RenewMany of both (and a stranger) in one round trip.
  auto holders = (*backend)->Holders("pool");
  ASSERT_TRUE(holders.ok()) << holders.status().ToString();
  ASSERT_EQ(holders->size(), 2u);
  EXPECT_EQ((*holders)[0].holder, "w-a");
  EXPECT_EQ((*holders)[1].holder, "w-b");
  EXPECT_EQ((*holders)[1].slot, 1u);
  const std::uint64_t trips = (*backend)->stats().round_trips;
  const RenewRequest renewals[] = {
      {"pool", Token('a'), 6s}, {"pool", Token('b'), 6s}, {"pool", Token('z'), 6s}};
  std::vector<Status> renewed = (*backend)->RenewMany(renewals);
  EXPECT_EQ((*backend)->stats().round_trips - trips, 1u);
  EXPECT_TRUE(renewed[0].ok() && renewed[1].ok()) << renewed[0].ToString();
  EXPECT_EQ(renewed[2].code(), StatusCode::kLost);
  auto pttl = server->Cli({"PTTL", hash});
  ASSERT_TRUE(pttl.ok());
  EXPECT_GT(std::stoll(*pttl), 5000) << "the hash outlives its latest grant";

  // Releasing one frees its slot for the next; the last release removes the hash.
  ASSERT_TRUE((*backend)->Release("pool", Token('a')).ok());
  EXPECT_EQ((*backend)->Release("pool", Token('a')).code(), StatusCode::kLost);
  auto c = (*backend)->TryAcquire(SemaphoreRequest('c', "w-c", 2, 5s));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->slot, 0u);
  auto one = (*backend)->ForceReleaseGrant("pool", Token('c').substr(0, 8));
  ASSERT_TRUE(one.ok() && *one);
  ASSERT_TRUE((*backend)->Release("pool", Token('b')).ok());
  auto exists = server->Cli({"EXISTS", hash});
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(*exists, "0");
  auto now_exclusive = (*backend)->TryAcquire({"pool", Token('d'), "x", 5s});
  EXPECT_TRUE(now_exclusive.ok()) << "a free key takes either family";
}

// The hash's own expiry is the latest grant's; each grant's is judged on the server's clock.
TEST(RedisBackendTest, ACrashedSemaphoreHoldersPermitReturnsAtItsTtlAndNotBefore) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE((*backend)->TryAcquire(SemaphoreRequest('a', "crashed", 2, 600ms)).ok());
  ASSERT_TRUE((*backend)->TryAcquire(SemaphoreRequest('b', "alive", 2, 5s)).ok());
  std::this_thread::sleep_for(300ms);
  auto early = (*backend)->TryAcquire(SemaphoreRequest('c', "next", 2, 5s));
  EXPECT_EQ(early.status().code(), StatusCode::kHeldByAnother) << "before its TTL: still held";
  std::this_thread::sleep_for(400ms);
  auto holders = (*backend)->Holders("pool");
  ASSERT_TRUE(holders.ok());
  ASSERT_EQ(holders->size(), 1u) << "Holders skips the expired grant";
  auto late = (*backend)->TryAcquire(SemaphoreRequest('c', "next", 2, 5s));
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_EQ(late->slot, 0u) << "the crashed holder's slot";
  EXPECT_EQ((*backend)->Renew({"pool", Token('a'), 5s}).code(), StatusCode::kLost);
}

// An exclusive grant in the layout every earlier version writes (a plain hash) is read, refuses
// a semaphore, and is renewed and released by its owner; an earlier version's acquire script
// (the plain EXISTS check) finds a semaphore key held and cannot over-admit.
TEST(RedisBackendTest, AnOldLayoutExclusiveGrantAndAnOldClientSeeTheOtherFamily) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  const std::string hash = RedisBackend::LeaseKeyName("leasehold", "pool");
  ASSERT_TRUE(
      server->Cli({"HSET", hash, "token", Token('o'), "holder", "old", "fence", "7", "ttl", "5000"})
          .ok());
  ASSERT_TRUE(server->Cli({"PEXPIRE", hash, "5000"}).ok());
  auto info = (*backend)->Inspect("pool");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->holder, "old");
  EXPECT_EQ((*info)->fencing_token, 7u);
  EXPECT_EQ((*info)->mode, LeaseMode::kExclusive);
  EXPECT_EQ((*info)->limit, 1u);
  auto semaphore = (*backend)->TryAcquire(SemaphoreRequest('a', "new", 3, 5s));
  EXPECT_EQ(semaphore.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(semaphore.status().message().find("old"), std::string_view::npos)
      << semaphore.status().ToString();
  auto shared = (*backend)->TryAcquire({.key = "pool",
                                        .owner_token = Token('b'),
                                        .holder = "r",
                                        .ttl = 5s,
                                        .mode = LeaseMode::kShared});
  EXPECT_EQ(shared.status().code(), StatusCode::kHeldByAnother) << "same family, held";
  EXPECT_TRUE((*backend)->Renew({"pool", Token('o'), 5s}).ok());
  EXPECT_TRUE((*backend)->Release("pool", Token('o')).ok());

  ASSERT_TRUE((*backend)->TryAcquire(SemaphoreRequest('a', "new", 3, 5s)).ok());
  // The acquire script of the previous version, as it was.
  constexpr std::string_view kOldAcquire = R"lua(
if redis.call('EXISTS', KEYS[1]) == 1 then
  local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'fence', 'ttl')
  return {0, h[1], string.sub(h[2] or '', 1, 8), h[3], redis.call('PTTL', KEYS[1]), h[4]}
end
return {1}
)lua";
  auto old =
      server->Cli({"EVAL", std::string(kOldAcquire), "2", hash,
                   RedisBackend::FenceKeyName("leasehold", "pool"), Token('x'), "old", "5000"});
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->substr(0, 2), "0\n") << *old;
  EXPECT_NE(old->find("(semaphore of 3)"), std::string::npos) << *old;
}

// fair=false: a refused waiting writer records its intent (one key beside the hash), which
// keeps new readers out until it acquires or abandons.
TEST(RedisBackendTest, WriterIntentIsOneKeyThatKeepsReadersOutUntilTheWriterLeaves) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url());
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  ASSERT_TRUE((*backend)->TryAcquire(RwRequest('a', "reader-1", LeaseMode::kShared, 5s)).ok());
  ASSERT_TRUE((*backend)->TryAcquire(RwRequest('b', "reader-2", LeaseMode::kShared, 5s)).ok());
  auto writer =
      (*backend)->TryAcquire(RwRequest('w', "writer", LeaseMode::kExclusive, 5s, Waiter('w')));
  ASSERT_EQ(writer.status().code(), StatusCode::kHeldByAnother);
  const std::string intent = RedisBackend::IntentKeyName("leasehold", "doc");
  auto recorded = server->Cli({"HGET", intent, "waiter"});
  ASSERT_TRUE(recorded.ok());
  EXPECT_EQ(*recorded, Waiter('w'));
  auto reader = (*backend)->TryAcquire(RwRequest('c', "reader-3", LeaseMode::kShared, 5s));
  ASSERT_EQ(reader.status().code(), StatusCode::kHeldByAnother) << reader.status().ToString();
  ASSERT_NE(reader.status().holder(), nullptr);
  EXPECT_EQ(reader.status().holder()->holder, "writer") << "the waiting writer is named";

  (*backend)->AbandonWait("doc", Waiter('w'));
  auto gone = server->Cli({"EXISTS", intent});
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(*gone, "0");
  auto admitted = (*backend)->TryAcquire(RwRequest('c', "reader-3", LeaseMode::kShared, 5s));
  ASSERT_TRUE(admitted.ok()) << admitted.status().ToString();
  EXPECT_EQ(admitted->slot, 2u);

  // Granted, the writer ends its own intent.
  for (char token : {'a', 'b', 'c'}) {
    ASSERT_TRUE((*backend)->Release("doc", Token(token)).ok());
  }
  ASSERT_TRUE((*backend)
                  ->TryAcquire(RwRequest('w', "writer", LeaseMode::kExclusive, 5s, Waiter('w')))
                  .ok());
  gone = server->Cli({"EXISTS", intent});
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(*gone, "0");
}

// fair=true: the end of a grant hands the room to as many heads as it admits, in order; an
// exclusive waiter keeps the shared ones behind it out.
TEST(RedisBackendTest, FairEndHandsTheRoomToAsManyHeadsAsItAdmits) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->Url() + "?fair=true");
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  for (char token : {'a', 'b', 'c'}) {
    ASSERT_TRUE((*backend)->TryAcquire(SemaphoreRequest(token, {token}, 3, 5s)).ok());
  }
  for (char id : {'1', '2', '3'}) {
    auto queued = (*backend)->TryAcquire(
        SemaphoreRequest(static_cast<char>(id + 'k' - '1'), {'q', id}, 3, 5s, Waiter(id)));
    ASSERT_EQ(queued.status().code(), StatusCode::kHeldByAnother) << queued.status().ToString();
  }
  // Two grants end by force: the first two waiters get them inside that one script.
  ASSERT_TRUE(*(*backend)->ForceReleaseGrant("pool", Token('a').substr(0, 8)));
  ASSERT_TRUE(*(*backend)->ForceReleaseGrant("pool", Token('b').substr(0, 8)));
  auto holders = (*backend)->Holders("pool");
  ASSERT_TRUE(holders.ok());
  ASSERT_EQ(holders->size(), 3u);
  EXPECT_EQ((*holders)[0].holder, "q1");
  EXPECT_EQ((*holders)[1].holder, "q2");
  EXPECT_EQ(Queued(*server, "pool"), 1);
  auto taken = (*backend)->TryAcquire(SemaphoreRequest('k', "q1", 3, 5s, Waiter('1')));
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_EQ(taken->slot, 0u);
  // A ForceRelease frees all three: q3 gets one, and nobody else waits.
  ASSERT_TRUE(*(*backend)->ForceRelease("pool"));
  holders = (*backend)->Holders("pool");
  ASSERT_TRUE(holders.ok());
  ASSERT_EQ(holders->size(), 1u);
  EXPECT_EQ((*holders)[0].holder, "q3");

  // Read/write: readers hold; a writer queues; a later reader waits behind it.
  ASSERT_TRUE((*backend)->TryAcquire(RwRequest('r', "r1", LeaseMode::kShared, 5s)).ok());
  auto writer =
      (*backend)->TryAcquire(RwRequest('w', "writer", LeaseMode::kExclusive, 5s, Waiter('w')));
  ASSERT_EQ(writer.status().code(), StatusCode::kHeldByAnother);
  auto reader = (*backend)->TryAcquire(RwRequest('s', "r2", LeaseMode::kShared, 5s, Waiter('s')));
  ASSERT_EQ(reader.status().code(), StatusCode::kHeldByAnother) << "behind the queued writer";
  ASSERT_TRUE((*backend)->Release("doc", Token('r')).ok());
  EXPECT_EQ(LiveHolder(**backend, "doc"), "writer") << "handed to the writer only";
  ASSERT_TRUE((*backend)->Release("doc", Token('w')).ok());
  EXPECT_EQ(LiveHolder(**backend, "doc"), "r2") << "then to the reader";
}

}  // namespace
}  // namespace leasehold::internal
