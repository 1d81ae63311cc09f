// File: tests/backends/redis/redis_cluster_test.cc
//
// redis+cluster:// against a real Redis Cluster on loopback (tests/testing/redis_cluster.h:
// three masters and a replica each, made with `redis-cli --cluster create`): the URL, the
// hash-slot function against the server's CLUSTER KEYSLOT, one clear line for a node list that
// is not a cluster and for seeds that cannot be reached, leases spread over every master with
// a batch of renewals still one round of the pipeline, a fenced write's data kept in the
// lease's slot, a resharding of a held key's slot (done at once, and step by step through ASK
// and TRYAGAIN), and kill -9 of a held key's master with min_replicas=1: the grant survives on
// the promoted replica, which loads the scripts it never had. The conformance suite runs the
// store on a cluster as its `redis_cluster` row.

#include "testing/redis_cluster.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "leasehold/store.h"

#include "backends/redis/redis_backend.h"
#include "backends/redis/redis_cluster.h"
#include "backends/redis/redis_options.h"
#include "core/url.h"
#include "redis_test_util.h"
#include "testing/redis_server.h"

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;
using leasehold::testing::RedisClusterOptions;
using leasehold::testing::RedisClusterSetup;
using leasehold::testing::RedisServer;

using redis_test::OpenUrl;
using redis_test::Token;

// One cluster for the whole file: starting one takes a few seconds.
RedisClusterSetup* SharedCluster() {
  static std::unique_ptr<RedisClusterSetup> cluster =
      redis_test::StartOrFail<RedisClusterSetup>(RedisClusterOptions{});
  return cluster.get();
}

// A prefix of its own for each test, on the shared cluster.
std::string Prefix() {
  static int n = 0;
  return fmt::format("cluster-test-{}-{}", getpid(), ++n);
}

TEST(RedisClusterSlotTest, Crc16AndKeySlotAreRedisCluster) {
  // The check value of CRC16/XMODEM, and slots from the Redis Cluster specification.
  EXPECT_EQ(Crc16("123456789"), 0x31C3);
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(KeySlot("foo{}{bar}"), Crc16("foo{}{bar}") & 16383) << "an empty tag: the whole key";
  EXPECT_NE(KeySlot("foo{}{bar}"), KeySlot("bar"));
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), KeySlot("{bar"));
  EXPECT_EQ(KeySlot("foo{bar}{zap}"), KeySlot("bar"));
  // A lease's keys share one slot.
  const std::string lease = RedisBackend::LeaseKeyName("app", "job:{x}*");
  EXPECT_EQ(KeySlot(lease), KeySlot(RedisBackend::FenceKeyName("app", "job:{x}*")));
  EXPECT_EQ(KeySlot(lease), KeySlot(RedisBackend::QueueDataKeyName("app", "job:{x}*")));
}

TEST(RedisClusterSlotTest, RedirectionsAreParsed) {
  auto moved = ParseRedirection("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(moved);
  EXPECT_FALSE(moved->ask);
  EXPECT_EQ(moved->slot, 3999);
  EXPECT_EQ(moved->host, "127.0.0.1");
  EXPECT_EQ(moved->port, 6381);
  auto ask = ParseRedirection("ASK 12 [::1]:7000");
  ASSERT_TRUE(ask);
  EXPECT_TRUE(ask->ask);
  EXPECT_EQ(ask->host, "::1");
  EXPECT_EQ(ask->port, 7000);
  auto no_host = ParseRedirection("MOVED 5 :7001");
  ASSERT_TRUE(no_host);
  EXPECT_EQ(no_host->host, "");
  EXPECT_FALSE(ParseRedirection("ERR unknown command"));
  EXPECT_FALSE(ParseRedirection("MOVED 16384 127.0.0.1:1"));
  EXPECT_FALSE(ParseRedirection("MOVED x 127.0.0.1:1"));
}

TEST(RedisClusterOptionsTest, ParsesTheSeedsAndRefusesADatabase) {
  auto options = RedisOptions::FromUrl(
      *ParseUrl("redis+cluster://app:pw@n1:7000,n2,10.0.0.3:7002?min_replicas=1"));
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_TRUE(options->cluster());
  ASSERT_EQ(options->cluster_nodes.size(), 3U);
  EXPECT_EQ(options->cluster_nodes[1], std::make_pair(std::string("n2"), kRedisDefaultPort));
  EXPECT_EQ(*options->user, "app");
  EXPECT_EQ(options->Address(), "cluster via n1:7000,n2:6379,10.0.0.3:7002");
  EXPECT_TRUE(RedisOptions::FromUrl(*ParseUrl("redis+cluster://n1:7000/0")).ok());
  auto db = RedisOptions::FromUrl(*ParseUrl("redis+cluster://n1:7000/2"));
  EXPECT_EQ(db.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(db.status().message().find("only database 0"), std::string::npos)
      << db.status().message();
  auto tls = RedisOptions::FromUrl(*ParseUrl("rediss+cluster://n1:7000?ca=/x.pem"));
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  EXPECT_TRUE(tls->tls);
  EXPECT_EQ(RedisOptions::FromUrl(*ParseUrl("redis+cluster://n1:7000?ca=/x.pem")).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(RedisClusterTest, ANodeThatIsNotAClusterIsOneClearLine) {
  auto server = redis_test::StartOrFail<RedisServer>(leasehold::testing::RedisServerOptions{});
  ASSERT_NE(server, nullptr);
  const auto started = std::chrono::steady_clock::now();
  auto opened = OpenUrl(fmt::format("redis+cluster://127.0.0.1:{}", server->port()));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  ASSERT_EQ(opened.status().code(), StatusCode::kInvalidArgument) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("is not a cluster node"), std::string::npos)
      << opened.status().message();
  EXPECT_EQ(opened.status().message().find('\n'), std::string::npos);
}

// A loopback listener that never accepts, its one-place accept queue filled by one connection:
// Linux drops the SYNs of every further connect, so those time out (without leaving loopback).
class SilentListener {
 public:
  SilentListener() {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (listener_ < 0 || bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listener_, 0) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    filler_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (filler_ >= 0 && connect(filler_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }

  ~SilentListener() {
    for (int fd : {filler_, listener_}) {
      if (fd >= 0) {
        close(fd);
      }
    }
  }

  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;

  int port() const { return port_; }  // 0: not set up

 private:
  int listener_ = -1;
  int filler_ = -1;
  int port_ = 0;
};

TEST(RedisClusterTest, UnreachableSeedsAreUnavailableWithinTheConnectTimeout) {
  SilentListener silent;
  ASSERT_NE(silent.port(), 0) << "cannot set up a listener whose connects time out";
  const auto started = std::chrono::steady_clock::now();
  // Port 1 refuses; the silent listener's connect times out.
  auto opened = OpenUrl(
      fmt::format("redis+cluster://127.0.0.1:1,127.0.0.1:{}?connect_timeout=300ms", silent.port()));
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_GE(took, 250ms) << "the silent seed's connect did not wait for connect_timeout";
  EXPECT_LT(took, 2s);
  ASSERT_EQ(opened.status().code(), StatusCode::kUnavailable) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("cannot read the slot map"), std::string::npos)
      << opened.status().message();
}

TEST(RedisClusterTest, LeasesSpreadOverEveryMasterAndABatchOfRenewalsIsOneRound) {
  RedisClusterSetup* cluster = SharedCluster();
  ASSERT_NE(cluster, nullptr);
  const std::string prefix = Prefix();
  auto backend = OpenUrl(cluster->Url("?prefix=" + prefix));
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  std::vector<RenewRequest> renewals;
  std::set<int> masters;
  for (int i = 0; i < 24; ++i) {
    const std::string key = fmt::format("job-{}", i);
    auto grant =
        (*backend)->TryAcquire({.key = key, .owner_token = Token('a'), .holder = "h", .ttl = 10s});
    ASSERT_TRUE(grant.ok()) << grant.status().ToString();
    // The server's own slot function places the grant where ours routed it.
    auto slot = cluster->SlotOfKey(grant->store_key);
    ASSERT_TRUE(slot.ok()) << slot.status().ToString();
    EXPECT_EQ(*slot, KeySlot(grant->store_key));
    auto port = cluster->MasterPortForSlot(*slot);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    auto exists = cluster->Cli(*port, {"EXISTS", grant->store_key});
    ASSERT_TRUE(exists.ok());
    EXPECT_EQ(*exists, "1") << key << " is on the master of its slot";
    masters.insert(*port);
    renewals.push_back({key, Token('a'), 10s});
  }
  EXPECT_EQ(masters.size(), 3U) << "24 keys land on all three masters";
  const auto before = (*backend)->stats().round_trips;
  std::vector<Status> renewed = (*backend)->RenewMany(renewals);
  EXPECT_EQ((*backend)->stats().round_trips - before, 1U)
      << "one round: every master's renewals are sent before any reply is read";
  for (const Status& s : renewed) {
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  auto listed = (*backend)->List("job-");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), 24U) << "List walks every master";
}

TEST(RedisClusterTest, AFencedWriteKeepsItsDataInTheLeasesSlot) {
  RedisClusterSetup* cluster = SharedCluster();
  ASSERT_NE(cluster, nullptr);
  auto store = Store::Open(cluster->Url("?prefix=" + Prefix()));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto lease = (*store)->TryAcquire("ledger", {.ttl = 10s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const std::string data = lease->DataKey("balance");
  EXPECT_EQ(data, (*store)->DataKey("ledger", "balance"));
  EXPECT_EQ(KeySlot(data), KeySlot(lease->store_key()));
  auto wrote = lease->Write(FencedWrite().Put(data, "42"));
  ASSERT_TRUE(wrote.ok()) << wrote.status().ToString();
  auto port = cluster->MasterPortForKey(data);
  ASSERT_TRUE(port.ok());
  EXPECT_EQ(*cluster->Cli(*port, {"GET", data}), "42");
  // A key of another slot cannot be written in the same script: refused before sending.
  std::string elsewhere = "balance";
  for (int i = 0; KeySlot(elsewhere) == KeySlot(data); ++i) {
    elsewhere = fmt::format("balance-{}", i);
  }
  auto refused = lease->Write(FencedWrite().Put(elsewhere, "1"));
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("Lease::DataKey"), std::string::npos);
  EXPECT_TRUE(lease->valid());
}

TEST(RedisClusterTest, RedissClusterVerifiesEveryNodeAndServesLeases) {
  auto cluster = redis_test::StartOrFail<RedisClusterSetup>(RedisClusterOptions{.tls = true});
  ASSERT_NE(cluster, nullptr);
  const std::string url = cluster->Url("?prefix=" + Prefix());
  ASSERT_TRUE(url.starts_with("rediss+cluster://")) << url;
  auto backend = OpenUrl(url);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  std::vector<RenewRequest> renewals;
  for (int i = 0; i < 12; ++i) {
    const std::string key = fmt::format("tls-{}", i);
    auto grant =
        (*backend)->TryAcquire({.key = key, .owner_token = Token('t'), .holder = "h", .ttl = 10s});
    ASSERT_TRUE(grant.ok()) << grant.status().ToString();
    renewals.push_back({key, Token('t'), 10s});
  }
  for (const Status& s : (*backend)->RenewMany(renewals)) {
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  // Without the test CA no node's certificate is accepted: one line, permission denied.
  std::string no_ca = url.substr(0, url.find("&ca="));
  auto refused = OpenUrl(no_ca);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
}

// A free master other than the one serving `slot`.
int OtherMaster(RedisClusterSetup& cluster, int slot) {
  const int owner = cluster.MasterPortForSlot(slot).value_or(0);
  for (int port : cluster.MasterPorts()) {
    if (port != owner) {
      return port;
    }
  }
  return 0;
}

TEST(RedisClusterTest, AHeldKeysSlotReshardedAtOnceKeepsTheGrantAndItsFencing) {
  RedisClusterSetup* cluster = SharedCluster();
  ASSERT_NE(cluster, nullptr);
  const std::string prefix = Prefix();
  auto a = OpenUrl(cluster->Url("?prefix=" + prefix));
  auto b = OpenUrl(cluster->Url("?prefix=" + prefix));
  ASSERT_TRUE(a.ok() && b.ok());
  auto grant =
      (*a)->TryAcquire({.key = "job", .owner_token = Token('a'), .holder = "a", .ttl = 20s});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  const int slot = KeySlot(grant->store_key);
  const int to = OtherMaster(*cluster, slot);
  ASSERT_TRUE(cluster->MoveSlot(slot, to).ok());
  ASSERT_EQ(cluster->MasterPortForSlot(slot).value_or(0), to);
  // Both handles' maps are stale: MOVED sends them to the new master.
  EXPECT_TRUE((*a)->Renew({"job", Token('a'), 20s}).ok());
  EXPECT_EQ((*b)->TryAcquire({.key = "job", .owner_token = Token('b'), .holder = "b", .ttl = 20s})
                .status()
                .code(),
            StatusCode::kHeldByAnother);
  ASSERT_TRUE((*a)->Release("job", Token('a')).ok());
  auto next =
      (*b)->TryAcquire({.key = "job", .owner_token = Token('b'), .holder = "b", .ttl = 20s});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_GT(next->fencing_token, grant->fencing_token) << "the counter moved with the slot";
}

TEST(RedisClusterTest, AHalfMigratedSlotIsServedThroughAskAndTryAgain) {
  RedisClusterSetup* cluster = SharedCluster();
  ASSERT_NE(cluster, nullptr);
  const std::string prefix = Prefix();
  auto a = OpenUrl(cluster->Url("?prefix=" + prefix));
  auto b = OpenUrl(cluster->Url("?prefix=" + prefix));
  ASSERT_TRUE(a.ok() && b.ok());
  auto grant =
      (*a)->TryAcquire({.key = "job", .owner_token = Token('a'), .holder = "a", .ttl = 20s});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  const int slot = KeySlot(grant->store_key);
  const int to = OtherMaster(*cluster, slot);
  ASSERT_TRUE(cluster->BeginMigration(slot, to).ok());
  // The grant hash and the fence counter are two keys: move one of them, so that a script
  // naming both finds them on two nodes (TRYAGAIN until the migration moves on).
  auto moved = cluster->MigrateKeys(slot, 1);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  ASSERT_EQ(*moved, 1);
  auto split = (*a)->Renew({"job", Token('a'), 20s});
  if (!split.ok()) {
    EXPECT_EQ(split.code(), StatusCode::kUnavailable) << split.ToString();
  }
  // Every key on the importing node: the source answers ASK, the target serves after ASKING.
  while (cluster->MigrateKeys(slot, 100).value_or(0) > 0) {
  }
  EXPECT_TRUE((*a)->Renew({"job", Token('a'), 20s}).ok());
  // The acquire script names the grant, its counter and the writer intent, which does not
  // exist: the importing node answers TRYAGAIN to a multi-key script while any of its keys is
  // missing, until the slot is assigned to it. So a rival's acquire is refused as unavailable
  // (never granted) for as long as the migration is half done.
  auto rival =
      (*b)->TryAcquire({.key = "job", .owner_token = Token('b'), .holder = "b", .ttl = 20s});
  EXPECT_EQ(rival.status().code(), StatusCode::kUnavailable) << rival.status().ToString();
  EXPECT_NE(rival.status().message().find("TRYAGAIN"), std::string::npos)
      << rival.status().message();
  auto holders = (*b)->Holders("job");
  ASSERT_TRUE(holders.ok()) << holders.status().ToString();
  ASSERT_EQ(holders->size(), 1U);
  EXPECT_EQ(holders->front().holder, "a");
  ASSERT_TRUE(cluster->FinishMigration(slot, to).ok());
  EXPECT_TRUE((*a)->Renew({"job", Token('a'), 20s}).ok());
  EXPECT_EQ((*b)->TryAcquire({.key = "job", .owner_token = Token('b'), .holder = "b", .ttl = 20s})
                .status()
                .code(),
            StatusCode::kHeldByAnother);
  ASSERT_TRUE((*a)->Release("job", Token('a')).ok());
}

// The config epoch of the node on `port`, as CLUSTER INFO gives it (-1 if unreadable).
long long MyEpoch(const RedisClusterSetup& cluster, int port) {
  auto info = cluster.Cli(port, {"CLUSTER", "INFO"});
  const std::string field = "cluster_my_epoch:";
  const std::size_t at = info.ok() ? info->find(field) : std::string::npos;
  return at == std::string::npos ? -1 : std::atoll(info->c_str() + at + field.size());
}

// Last: it kills a master of the shared cluster (its replica takes over, and the old master
// comes back as that one's replica). Then the write a failover can lose: the new master's
// fencing counter set back to 0 by hand, as an unreplicated bump would leave it; the next
// grant still comes above every earlier token, from the new master's config epoch.
TEST(RedisClusterTest, ZKillOfAHeldKeysMasterWithMinReplicasKeepsTheGrant) {
  RedisClusterSetup* cluster = SharedCluster();
  ASSERT_NE(cluster, nullptr);
  const std::string prefix = Prefix();
  const std::string url = cluster->Url("?min_replicas=1&connect_timeout=500ms&prefix=" + prefix);
  auto a = OpenUrl(url);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto grant =
      (*a)->TryAcquire({.key = "job", .owner_token = Token('a'), .holder = "a", .ttl = 30s});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  const int slot = KeySlot(grant->store_key);
  const long long epoch_before = MyEpoch(*cluster, cluster->MasterPortForSlot(slot).value_or(0));
  ASSERT_GT(epoch_before, 0);
  EXPECT_EQ(grant->fencing_token, static_cast<std::uint64_t>(epoch_before) << 32)
      << "a key's first grant is its master's config epoch << 32";
  auto old_port = cluster->Kill9MasterOf(slot);
  ASSERT_TRUE(old_port.ok()) << old_port.status().ToString();
  EXPECT_EQ((*a)->Renew({"job", Token('a'), 30s}).code(), StatusCode::kUnavailable)
      << "the master is gone and no replica has taken over yet";
  auto new_port = cluster->AwaitFailover(slot, *old_port, 30s);
  ASSERT_TRUE(new_port.ok()) << new_port.status().ToString();
  // The new master has no replica until the old one comes back as its replica (WAIT answers 0
  // meanwhile, and each renewal says so).
  ASSERT_TRUE(cluster->ServerOnPort(*old_port)->Restart().ok());
  // The promoted replica had the grant (WAIT saw it acknowledge); it never loaded the scripts,
  // so the first call there answers NOSCRIPT and is sent again after SCRIPT LOAD.
  Status renewed;
  for (int i = 0; i < 50; ++i) {
    renewed = (*a)->Renew({"job", Token('a'), 30s});
    if (renewed.code() != StatusCode::kUnavailable) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(renewed.ok()) << renewed.ToString();
  auto b = OpenUrl(url);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->TryAcquire({.key = "job", .owner_token = Token('b'), .holder = "b", .ttl = 30s})
                .status()
                .code(),
            StatusCode::kHeldByAnother);

  ASSERT_TRUE((*a)->Release("job", Token('a')).ok());
  const long long epoch_after = MyEpoch(*cluster, *new_port);
  EXPECT_GT(epoch_after, epoch_before) << "a failover bumps the promoted node's config epoch";
  ASSERT_TRUE(
      cluster->Cli(*new_port, {"SET", RedisBackend::FenceKeyName(prefix, "job"), "0"}).ok());
  auto next =
      (*b)->TryAcquire({.key = "job", .owner_token = Token('b'), .holder = "b", .ttl = 30s});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  std::printf(
      "cluster-epoch: epoch_before=%lld first_token=%llu epoch_after=%lld "
      "token_after_counter_reset=%llu\n",
      epoch_before, static_cast<unsigned long long>(grant->fencing_token), epoch_after,
      static_cast<unsigned long long>(next->fencing_token));
  EXPECT_GT(next->fencing_token, grant->fencing_token);
  EXPECT_EQ(next->fencing_token, static_cast<std::uint64_t>(epoch_after) << 32);
}

}  // namespace
}  // namespace leasehold::internal
