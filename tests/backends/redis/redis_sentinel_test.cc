// File: tests/backends/redis/redis_sentinel_test.cc
//
// redis+sentinel:// against a real Sentinel deployment on loopback (tests/testing/
// redis_sentinel.h: one master, one replica, three sentinels): the URL, the master learnt from
// the sentinels, one clear line for a master name no sentinel knows and for sentinels that
// cannot be reached, never a write to a replica (the ROLE check), and kill -9 of the master
// while a holder renews, with min_replicas=0 and =1: the holder keeps its lease through the
// failover or is told it is lost before anyone else holds the key, and the grants acknowledged
// just before the kill that the new master does not have are counted (printed as
// "sentinel-failover: ..." lines; the README's "Redis in production" quotes them). The
// conformance suite runs the store through Sentinel as its `redis_sentinel` row.

#include "testing/redis_sentinel.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "leasehold/store.h"

#include "backends/redis/redis_backend.h"
#include "backends/redis/redis_connection.h"
#include "backends/redis/redis_failover.h"
#include "backends/redis/redis_options.h"
#include "core/url.h"
#include "redis_test_util.h"

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;
using leasehold::testing::RedisSentinelOptions;
using leasehold::testing::RedisSentinelSetup;

using redis_test::OpenUrl;
using redis_test::Token;

std::unique_ptr<RedisSentinelSetup> StartSetup(RedisSentinelOptions options = {}) {
  return redis_test::StartOrFail<RedisSentinelSetup>(std::move(options));
}

TEST(RedisSentinelOptionsTest, ParsesTheSentinelsTheMasterNameAndTheDatabase) {
  auto options = RedisOptions::FromUrl(
      *ParseUrl("redis+sentinel://app:pw@s1:26380,s2,10.0.0.3:26381/orders/2?min_replicas=1"));
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_TRUE(options->sentinel());
  EXPECT_TRUE(options->require_master);
  ASSERT_EQ(options->sentinels.size(), 3U);
  EXPECT_EQ(options->sentinels[0], std::make_pair(std::string("s1"), 26380));
  EXPECT_EQ(options->sentinels[1], std::make_pair(std::string("s2"), kRedisSentinelDefaultPort));
  EXPECT_EQ(options->sentinel_master, "orders");
  EXPECT_EQ(options->db, 2);
  EXPECT_EQ(*options->user, "app");
  EXPECT_EQ(options->min_replicas, 1);
  EXPECT_FALSE(options->tls);
  EXPECT_EQ(options->SentinelList(), "s1:26380,s2:26379,10.0.0.3:26381");
  auto tls = RedisOptions::FromUrl(*ParseUrl("rediss+sentinel://s1/orders?ca=/ca.pem"));
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  EXPECT_TRUE(tls->tls);
  EXPECT_EQ(tls->db, 0);
  auto bad = [](const char* text) { return RedisOptions::FromUrl(*ParseUrl(text)).status(); };
  EXPECT_EQ(bad("redis+sentinel://s1").code(), StatusCode::kInvalidArgument) << "no master";
  EXPECT_EQ(bad("redis+sentinel://s1/").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("redis+sentinel://s1/m/x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("redis+sentinel://s1/m?ca=/x").code(), StatusCode::kInvalidArgument);
  Status several = bad("redis://h1:1,h2:2");
  EXPECT_NE(several.message().find("redis+sentinel://"), std::string_view::npos)
      << several.ToString();
}

TEST(RedisSentinelTest, TheMasterIsLearntFromTheSentinelsAndAnUnknownNameIsOneLine) {
  auto setup = StartSetup();
  ASSERT_NE(setup, nullptr);
  auto backend = OpenUrl(setup->Url("/0?prefix=s"));
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto grant = (*backend)->TryAcquire({"job", Token('a'), "h", 30s});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_TRUE((*backend)->Renew({"job", Token('a'), 30s}).ok());
  // The grant is on the master the sentinels name.
  auto master_port = setup->MasterPort();
  ASSERT_TRUE(master_port.ok());
  auto on_master = setup->ServerOnPort(*master_port)->Cli({"EXISTS", "s:{6a6f62}"});
  ASSERT_TRUE(on_master.ok());
  EXPECT_EQ(*on_master, "1");
  EXPECT_TRUE((*backend)->Release("job", Token('a')).ok());

  std::string unknown_url = setup->Url();
  unknown_url = unknown_url.substr(0, unknown_url.rfind('/')) + "/no-such?connect_timeout=500ms";
  const auto t0 = std::chrono::steady_clock::now();
  Status unknown = OpenUrl(unknown_url).status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument) << unknown.ToString();
  EXPECT_NE(unknown.message().find("no sentinel knows a master named 'no-such'"),
            std::string_view::npos)
      << unknown.ToString();
  EXPECT_EQ(unknown.ToString().find('\n'), std::string::npos) << unknown.ToString();
}

TEST(RedisSentinelTest, UnreachableSentinelsAreUnavailableWithinTheConnectTimeout) {
  const int a = leasehold::testing::PickFreeLoopbackPort();
  const int b = leasehold::testing::PickFreeLoopbackPort({a});
  const auto t0 = std::chrono::steady_clock::now();
  Status none = OpenUrl(fmt::format("redis+sentinel://127.0.0.1:{},127.0.0.1:{}/m"
                                    "?connect_timeout=300ms",
                                    a, b))
                    .status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(none.code(), StatusCode::kUnavailable) << none.ToString();
  EXPECT_NE(none.message().find("from its sentinels"), std::string_view::npos) << none.ToString();
  EXPECT_EQ(none.ToString().find('\n'), std::string::npos) << none.ToString();
}

// The ROLE check that every Sentinel connection makes, pointed at the replica directly.
TEST(RedisSentinelTest, AConnectionThatMustReachAMasterRefusesAReplica) {
  auto setup = StartSetup({.sentinels = 1});
  ASSERT_NE(setup, nullptr);
  auto master_port = setup->MasterPort();
  ASSERT_TRUE(master_port.ok());
  int replica_port = 0;
  RedisOptions options;
  options.host = "127.0.0.1";
  options.require_master = true;
  auto replica_info = setup->ServerOnPort(*master_port)->Cli({"INFO", "replication"});
  ASSERT_TRUE(replica_info.ok());
  // "slave0:ip=127.0.0.1,port=NNNN,state=online,..."
  const std::size_t at = replica_info->find("slave0:ip=127.0.0.1,port=");
  ASSERT_NE(at, std::string::npos) << *replica_info;
  replica_port = std::atoi(replica_info->c_str() + at + 25);
  options.port = replica_port;
  auto refused = RedisBackend::Open(options);
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("is not a master"), std::string_view::npos)
      << refused.status().ToString();
  options.port = *master_port;
  EXPECT_TRUE(RedisBackend::Open(options).ok());
}

struct FailoverFigures {
  int acknowledged = 0;  // grants sent while the replica lagged and acknowledged before the kill
  int lost = 0;          // of those, the ones the new master does not have
  int before_lag = 0;    // grants acknowledged in the 300 ms before the lag began
  int before_lag_lost = 0;
  bool holder_kept = false;
  bool holder_lost = false;
  bool overlap = false;  // a contender held the key while the holder was still valid
  double failover_ms = 0;
};

// kill -9 of the master while `holder` renews and a contender tries to take the key, and while
// a writer acquires fresh keys as fast as it can; then the new master is read. The replica is
// SIGSTOPped and its link cut `lag` before the kill (and continued after it), so that the
// master acknowledges writes the replica never gets: the replication lag a real network has,
// which loopback does not.
FailoverFigures KillTheMasterDuringRenewals(RedisSentinelSetup& setup, int min_replicas,
                                            std::chrono::milliseconds lag) {
  FailoverFigures f;
  const std::string url = setup.Url(
      fmt::format("/0?prefix=f{}&min_replicas={}&replica_timeout=200ms&command_timeout=500ms"
                  "&connect_timeout=500ms",
                  min_replicas, min_replicas));
  auto holder_store = Store::Open(url);
  auto contender_store = Store::Open(url);
  auto writer = OpenUrl(url);
  EXPECT_TRUE(holder_store.ok() && contender_store.ok() && writer.ok())
      << holder_store.status().ToString() << " " << writer.status().ToString();
  if (!holder_store.ok() || !contender_store.ok() || !writer.ok()) {
    return f;
  }
  auto holder = (*holder_store)->TryAcquire("hot", {.ttl = 4s});
  EXPECT_TRUE(holder.ok()) << holder.status().ToString();
  if (!holder.ok()) {
    return f;
  }
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> acked;
  std::atomic<std::chrono::steady_clock::time_point> kill_at{
      std::chrono::steady_clock::time_point::max()};
  std::thread acquirer([&] {
    for (int i = 0; !stop.load(); ++i) {
      const std::string key = fmt::format("ack-{}", i);
      // The send time: a grant sent before the link was cut may be in the stopped replica's
      // socket buffer, and survive, whenever its reply came.
      const auto sent = std::chrono::steady_clock::now();
      if ((*writer)->TryAcquire({key, Token('w'), "w", 60s}).ok() &&
          std::chrono::steady_clock::now() < kill_at.load()) {
        std::lock_guard lock(mu);
        acked.emplace_back(key, sent);
      }
    }
  });
  std::this_thread::sleep_for(500ms);
  std::vector<leasehold::testing::RedisServer*> replicas = setup.Replicas();
  for (auto* replica : replicas) {
    replica->Pause();
  }
  // A stopped replica's kernel still buffers the stream for it; cutting the link on the master
  // makes what follows never reach it (the stopped replica cannot reconnect).
  if (auto port = setup.MasterPort(); port.ok()) {
    (void)setup.ServerOnPort(*port)->Cli({"CLIENT", "KILL", "TYPE", "replica"});
  }
  const auto lag_from = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(lag);
  kill_at = std::chrono::steady_clock::now();
  auto killed = setup.Kill9Master();
  const auto kill_time = kill_at.load();
  for (auto* replica : replicas) {
    replica->Resume();
  }
  EXPECT_TRUE(killed.ok()) << killed.status().ToString();
  // The contender tries every 50 ms; whenever it gets the key, the holder must already know it
  // lost it.
  std::optional<Lease> taken;
  Result<int> new_port = Status::Unavailable("not yet");
  const auto give_up = kill_time + 30s;
  while (std::chrono::steady_clock::now() < give_up) {
    if (!new_port.ok()) {
      Result<int> port = setup.MasterPort();
      if (port.ok() && killed.ok() && *port != *killed) {
        new_port = port;
        f.failover_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - kill_time)
                .count();
      }
    }
    const bool holder_valid = holder->valid();
    auto attempt = (*contender_store)->TryAcquire("hot", {.ttl = 4s});
    if (attempt.ok()) {
      f.overlap = holder_valid && holder->valid();
      taken = std::move(attempt).value();
      break;
    }
    if (new_port.ok() &&
        std::chrono::steady_clock::now() - kill_time > 8s + 1s * f.failover_ms / 1000) {
      break;  // the holder rode it out: a few renewals on the new master
    }
    std::this_thread::sleep_for(50ms);
  }
  stop = true;
  acquirer.join();
  f.holder_kept = holder->valid() && !taken;
  f.holder_lost = !holder->valid();
  EXPECT_TRUE(new_port.ok()) << new_port.status().ToString();
  if (new_port.ok()) {
    // One EXISTS per grant, pipelined on one connection (a redis-cli per key took ~20 ms each).
    RedisOptions direct;
    direct.host = "127.0.0.1";
    direct.port = *new_port;
    auto connection = RedisConnection::Connect(direct, nullptr);
    EXPECT_TRUE(connection.ok()) << connection.status().ToString();
    std::lock_guard lock(mu);
    std::vector<Command> reads;
    std::vector<bool> lagging;
    for (const auto& [key, at] : acked) {
      if (at < lag_from && lag_from - at > 300ms) {
        continue;
      }
      lagging.push_back(at >= lag_from);
      reads.push_back(
          {"EXISTS", RedisBackend::LeaseKeyName(fmt::format("f{}", min_replicas), key)});
    }
    auto replies = connection.ok() ? (*connection)->Pipeline(reads, direct.Address())
                                   : Result<std::vector<ReplyPtr>>(connection.status());
    EXPECT_TRUE(replies.ok()) << replies.status().ToString();
    for (std::size_t i = 0; replies.ok() && i < reads.size(); ++i) {
      Result<long long> exists = ParseInteger((*replies)[i].get());
      const bool lost = exists.ok() && *exists == 0;
      (lagging[i] ? f.acknowledged : f.before_lag) += 1;
      (lagging[i] ? f.lost : f.before_lag_lost) += lost ? 1 : 0;
    }
  }
  std::printf(
      "sentinel-failover: min_replicas=%d replica_lag_ms=%lld failover_ms=%.0f "
      "holder=%s overlap=%d acknowledged_while_lagging=%d lost_in_failover=%d "
      "acknowledged_before_lag=%d of_those_lost=%d\n",
      min_replicas, static_cast<long long>(lag.count()), f.failover_ms,
      f.holder_kept ? "kept" : (f.holder_lost ? "lost-before-takeover" : "?"), f.overlap ? 1 : 0,
      f.acknowledged, f.lost, f.before_lag, f.before_lag_lost);
  return f;
}

// min_replicas is judged against the replicas a failover may promote: Sentinel ranks them by
// priority, then by a replication offset it read up to seconds ago, so the one promoted can be
// any reachable replica of non-zero priority, and WAIT counts any replica: every replica that
// can confirm must.
TEST(RedisFailoverCopiesTest, EveryReplicaThatCanConfirmMustConfirm) {
  auto count = [](std::vector<SentinelReplica> replicas, int connected) {
    return CountFailoverCopies(replicas, connected);
  };
  FailoverCopies equal = count({{"a:1", 100, "slave"}, {"b:2", 100, "slave"}}, 2);
  EXPECT_EQ(equal.promotable, 2);
  EXPECT_EQ(equal.needed, 2) << "the offset Sentinel ranks equals by lags: either may be promoted";
  FailoverCopies never = count({{"a:1", 100, "slave"}, {"b:2", 0, "slave"}}, 2);
  EXPECT_EQ(never.promotable, 1);
  EXPECT_EQ(never.needed, 2) << "WAIT 1 can be confirmed by the replica never promoted";
  EXPECT_EQ(never.listing, "a:1 priority 100, b:2 priority 0 (never promoted)");
  FailoverCopies down = count({{"a:1", 100, "slave"}, {"b:2", 10, "slave,s_down"}}, 1);
  EXPECT_EQ(down.promotable, 1) << "a replica the sentinels cannot reach is not promoted";
  EXPECT_EQ(down.needed, 1);
  EXPECT_NE(down.listing.find("b:2 down (slave,s_down)"), std::string::npos) << down.listing;
  FailoverCopies none = count({{"a:1", 0, "slave"}}, 1);
  EXPECT_EQ(none.promotable, 0);
  EXPECT_EQ(none.needed, 0);
  FailoverCopies unseen = count({{"a:1", 100, "slave"}}, 3);
  EXPECT_EQ(unseen.confirming, 3) << "replicas the sentinels have not seen yet confirm WAIT too";
  EXPECT_EQ(unseen.needed, 3);
}

// leasehold check on a Sentinel URL: with a replica of replica-priority 0 beside a promotable
// one, min_replicas=1 is unsafe (WAIT 1 may be the unpromotable replica's confirmation) and the
// fix names min_replicas=2, which passes; the priority 0 is named.
TEST(RedisSentinelTest, CheckJudgesMinReplicasAgainstTheReplicasAFailoverPromotes) {
  auto setup = StartSetup({.replicas = 2, .replica_priorities = {100, 0}, .wait_for_quorum = true});
  ASSERT_NE(setup, nullptr);
  // The sentinels read each replica's priority from its INFO (every 10 s): wait until the
  // first one, which the check asks first, reports the 0.
  const auto deadline = std::chrono::steady_clock::now() + 25s;
  std::string listed;
  while (std::chrono::steady_clock::now() < deadline) {
    auto replicas = setup->SentinelCli(0, {"SENTINEL", "REPLICAS", "leasehold"});
    listed = replicas.ok() ? *replicas : replicas.status().ToString();
    if (listed.find("slave-priority\n0\n") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_NE(listed.find("slave-priority\n0\n"), std::string::npos) << listed;
  for (int min_replicas : {1, 2}) {
    auto backend = OpenUrl(setup->Url(fmt::format("/0?min_replicas={}", min_replicas)));
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    auto diagnosis = (*backend)->Diagnose();
    ASSERT_TRUE(diagnosis.ok()) << diagnosis.status().ToString();
    const CheckItem* topology = nullptr;
    for (const CheckItem& item : diagnosis->items) {
      topology = item.area == "topology" ? &item : topology;
    }
    ASSERT_NE(topology, nullptr);
    EXPECT_NE(topology->found.find("priority 0 (never promoted)"), std::string::npos)
        << topology->found;
    if (min_replicas == 1) {
      EXPECT_EQ(topology->verdict, CheckVerdict::kUnsafe) << topology->found;
      EXPECT_NE(topology->fix.find("min_replicas=2"), std::string::npos) << topology->fix;
    } else {
      EXPECT_EQ(topology->verdict, CheckVerdict::kPass) << topology->found;
      EXPECT_NE(topology->found.find("every replica ("), std::string::npos) << topology->found;
    }
  }
}

// Without WAIT, what the master acknowledged while its replica lagged is gone after the
// failover: the figure this measures, and a check that the measurement can see a loss. Two
// valid holders are possible here too (the holder's last renewals may not have reached the
// replica), so they are counted, not refused: min_replicas is the remedy, below.
TEST(RedisSentinelFailoverTest, WithoutReplicaAcksAGrantAcknowledgedDuringReplicationLagIsLost) {
  auto setup = StartSetup({.wait_for_quorum = true});
  ASSERT_NE(setup, nullptr);
  FailoverFigures f = KillTheMasterDuringRenewals(*setup, 0, 300ms);
  EXPECT_GT(f.acknowledged, 0) << "the writer acknowledged nothing while the replica lagged";
  EXPECT_EQ(f.lost, f.acknowledged) << "the replica was stopped: it cannot have any of them";
}

// With WAIT 1, nothing is acknowledged that the replica does not have, so the failover loses no
// acknowledged grant, and the holder keeps its lease or is told it lost it before anyone else
// holds the key.
TEST(RedisSentinelFailoverTest, WithMinReplicasOneNoAcknowledgedGrantIsLostAndNoTwoHolders) {
  auto setup = StartSetup({.wait_for_quorum = true});
  ASSERT_NE(setup, nullptr);
  FailoverFigures f = KillTheMasterDuringRenewals(*setup, 1, 300ms);
  EXPECT_FALSE(f.overlap);
  EXPECT_TRUE(f.holder_kept || f.holder_lost);
  EXPECT_EQ(f.acknowledged, 0) << "WAIT 1 cannot be confirmed by a stopped replica";
  EXPECT_GT(f.before_lag, 0) << "nothing was acknowledged before the lag";
  EXPECT_EQ(f.before_lag_lost, 0) << "WAIT 1 confirmed each of them on the replica";
}

// One sentinel's pipelined replies, as RESP bytes read by hiredis' own reader.
ReplyPtr ReadReply(std::string_view resp) {
  redisReader* reader = redisReaderCreate();
  void* reply = nullptr;
  if (redisReaderFeed(reader, resp.data(), resp.size()) != REDIS_OK ||
      redisReaderGetReply(reader, &reply) != REDIS_OK) {
    reply = nullptr;
  }
  redisReaderFree(reader);
  return ReplyPtr(static_cast<redisReply*>(reply));
}

TEST(RedisSentinelMasterTest, AddressAndEpochComeFromOneSentinelsReplies) {
  const ReplyPtr address = ReadReply("*2\r\n$9\r\n127.0.0.1\r\n$4\r\n7002\r\n");
  // SENTINEL MASTER during a failover: ip/port still the old master's, the epoch the new one's.
  const ReplyPtr master = ReadReply(
      "*6\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nport\r\n$4\r\n7001\r\n"
      "$12\r\nconfig-epoch\r\n$1\r\n7\r\n");
  ASSERT_NE(address, nullptr);
  ASSERT_NE(master, nullptr);
  auto parsed = ParseSentinelMaster(address.get(), master.get());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(parsed->has_value());
  EXPECT_EQ((*parsed)->host, "127.0.0.1");
  EXPECT_EQ((*parsed)->port, 7002) << "the address is get-master-addr-by-name's";
  EXPECT_EQ((*parsed)->epoch, 7);

  const ReplyPtr nil = ReadReply("*-1\r\n");
  ASSERT_NE(nil, nullptr);
  auto unknown = ParseSentinelMaster(nil.get(), master.get());
  ASSERT_TRUE(unknown.ok()) << unknown.status().ToString();
  EXPECT_FALSE(unknown->has_value()) << "a sentinel that knows no such master names none";

  const ReplyPtr huge = ReadReply("*2\r\n$12\r\nconfig-epoch\r\n$7\r\n2097152\r\n");
  EXPECT_EQ(ParseSentinelMaster(address.get(), huge.get()).status().code(), StatusCode::kInternal)
      << "2^21: epoch << 32 would not fit a Lua number exactly";
  const ReplyPtr no_epoch = ReadReply("*2\r\n$2\r\nip\r\n$1\r\nx\r\n");
  EXPECT_EQ(ParseSentinelMaster(address.get(), no_epoch.get()).status().code(),
            StatusCode::kInternal);
  const ReplyPtr bad_port = ReadReply("*2\r\n$1\r\nh\r\n$1\r\n0\r\n");
  EXPECT_EQ(ParseSentinelMaster(bad_port.get(), master.get()).status().code(),
            StatusCode::kInternal);
}

// The config epoch a sentinel reports for the master (SENTINEL MASTER's "config-epoch").
Result<long long> ConfigEpoch(const RedisSentinelSetup& setup) {
  LH_ASSIGN_OR_RETURN(std::string out, setup.SentinelCli(0, {"SENTINEL", "MASTER", "leasehold"}));
  const std::size_t at = out.find("config-epoch\n");
  if (at == std::string::npos) {
    return Status::Internal("no config-epoch in: " + out);
  }
  return std::atoll(out.c_str() + at + 13);
}

// A failover that lost writes sends the fencing counter back (here: set back to 0 on the new
// master, as a promoted replica that never got the bumps has it). Tokens granted after it start
// at the new config epoch << 32, above every token of the earlier epoch.
TEST(RedisSentinelTest, AfterAFailoverTokensStartAtTheNewEpochEvenWhenTheCounterWentBack) {
  auto setup = StartSetup({.wait_for_quorum = true});
  ASSERT_NE(setup, nullptr);
  auto backend = OpenUrl(setup->Url("/0?prefix=e&command_timeout=500ms&connect_timeout=500ms"));
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto first = (*backend)->TryAcquire({"k", Token('a'), "h", 30s});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE((*backend)->Release("k", Token('a')).ok());
  auto before = ConfigEpoch(*setup);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_GE(first->fencing_token, static_cast<FencingToken>(*before) << 32);

  auto old_port = setup->MasterPort();
  ASSERT_TRUE(old_port.ok());
  ASSERT_TRUE(setup->SentinelCli(0, {"SENTINEL", "FAILOVER", "leasehold"}).ok());
  auto new_port = setup->AwaitFailover(*old_port, 30s);
  ASSERT_TRUE(new_port.ok()) << new_port.status().ToString();
  // Until the sentinels turn the old master into a replica (they notice it at their next INFO,
  // up to 10 s) it still takes writes, the window whose writes a failover loses: a grant made
  // there would come from the old epoch's counter. Do at once what they will do.
  ASSERT_TRUE(setup->ServerOnPort(*old_port)
                  ->Cli({"REPLICAOF", "127.0.0.1", std::to_string(*new_port)})
                  .ok());
  const std::string fence = RedisBackend::FenceKeyName("e", "k");
  ASSERT_TRUE(setup->ServerOnPort(*new_port)->Cli({"SET", fence, "0"}).ok());
  auto after = ConfigEpoch(*setup);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_GT(*after, *before);

  // The store learns the new master when its connection to the old one fails the next call.
  Result<Grant> second = Status::Unavailable("not tried");
  for (int i = 0; i < 100 && !second.ok(); ++i) {
    second = (*backend)->TryAcquire({"k", Token('b'), "h", 30s});
    if (!second.ok()) {
      std::this_thread::sleep_for(100ms);
    }
  }
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  std::printf(
      "sentinel-epoch: epoch_before=%lld first_token=%llu epoch_after=%lld "
      "token_after_counter_reset=%llu\n",
      *before, static_cast<unsigned long long>(first->fencing_token), *after,
      static_cast<unsigned long long>(second->fencing_token));
  EXPECT_GE(second->fencing_token, static_cast<FencingToken>(*after) << 32);
  EXPECT_GT(second->fencing_token, first->fencing_token);
  auto third = (*backend)->TryAcquire({"k2", Token('c'), "h", 30s});
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(third->fencing_token, static_cast<FencingToken>(*after) << 32)
      << "a key's first grant at this epoch is the floor itself";
}

}  // namespace
}  // namespace leasehold::internal
