// File: tests/testing/redis_cluster_fixture_test.cc
//
// The Redis Cluster fixture itself (tests/testing/redis_cluster.h) against real redis-server
// nodes on loopback: three masters with a replica each, a slot moved with its key to another
// master (at once, and step by step with the source answering ASK in between), then kill -9 of
// the slot's master, its replica promoted, and the old master restarted as the new one's
// replica; and over TLS, the TLS ports announced. Prints how long Start and the failover took
// ("redis-cluster: ..." lines).

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "testing/redis_cluster.h"

namespace leasehold::testing {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<RedisClusterSetup> StartCluster(RedisClusterOptions options = {}) {
  const auto start = std::chrono::steady_clock::now();
  auto cluster = RedisClusterSetup::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status().ToString();
  if (!cluster.ok()) {
    return nullptr;
  }
  fmt::print("redis-cluster: Start took {} ms\n",
             std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now() - start)
                 .count());
  return std::move(*cluster);
}

// The value, or for a failed call its error (a port of -1) so that the expectation fails.
std::string Out(const Result<std::string>& result) {
  return result.ok() ? *result : "error: " + result.status().ToString();
}

int Out(const Result<int>& result) {
  return result.ok() ? *result : -1;
}

// The masters in slot order, as "127.0.0.1:P1,127.0.0.1:P2,...", by their TLS ports or not.
std::string Seeds(const RedisClusterSetup& cluster, bool tls) {
  std::string seeds;
  auto ranges = cluster.Slots(cluster.servers().front()->port());
  for (const auto& range : ranges.ok() ? *ranges : std::vector<RedisClusterSetup::SlotRange>{}) {
    const RedisServer* master = cluster.ServerOnPort(range.master_port);
    seeds += fmt::format("{}127.0.0.1:{}", seeds.empty() ? "" : ",",
                         tls ? master->tls_port() : master->port());
  }
  return seeds;
}

// A master other than `port`.
int OtherMaster(const RedisClusterSetup& cluster, int port) {
  for (int master : cluster.MasterPorts()) {
    if (master != port) {
      return master;
    }
  }
  return 0;
}

TEST(RedisClusterFixtureTest, MovesASlotWithItsKeyThenFailsOverItsMaster) {
  auto cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  const std::vector<int> masters = cluster->MasterPorts();
  ASSERT_EQ(masters.size(), 3U);
  ASSERT_EQ(cluster->servers().size(), 6U);
  EXPECT_EQ(cluster->Url("?prefix=x"), "redis+cluster://" + Seeds(*cluster, false) + "?prefix=x");

  const std::string key = "{fixture}lease";
  auto slot = cluster->SlotOfKey(key);
  ASSERT_TRUE(slot.ok()) << slot.status().ToString();
  auto from = cluster->MasterPortForKey(key);
  ASSERT_TRUE(from.ok()) << from.status().ToString();
  EXPECT_EQ(Out(cluster->MasterPortForSlot(*slot)), *from);
  ASSERT_EQ(Out(cluster->Cli(*from, {"SET", key, "v1"})), "OK");

  const int to = OtherMaster(*cluster, *from);
  ASSERT_NE(to, 0);
  Status moved = cluster->MoveSlot(*slot, to);
  ASSERT_TRUE(moved.ok()) << moved.ToString();
  EXPECT_EQ(Out(cluster->Cli(to, {"GET", key})), "v1");
  EXPECT_EQ(Out(cluster->MasterPortForKey(key)), to);
  EXPECT_EQ(Out(cluster->Cli(*from, {"GET", key})),
            fmt::format("MOVED {} 127.0.0.1:{}", *slot, to));
  for (RedisServer* node : cluster->servers()) {
    auto ranges = cluster->Slots(node->port());
    ASSERT_TRUE(ranges.ok()) << ranges.status().ToString();
    for (const RedisClusterSetup::SlotRange& range : *ranges) {
      if (range.first <= *slot && *slot <= range.last) {
        EXPECT_EQ(range.master_port, to) << "as node " << node->port() << " sees it";
      }
    }
  }

  // The key must be on the replica before its master dies, or the promoted one lacks it.
  EXPECT_EQ(Out(cluster->Cli(to, {"WAIT", "1", "5000"})), "1");
  auto killed = cluster->Kill9MasterOf(*slot);
  ASSERT_TRUE(killed.ok()) << killed.status().ToString();
  EXPECT_EQ(*killed, to);
  const auto kill_time = std::chrono::steady_clock::now();
  auto promoted = cluster->AwaitFailover(*slot, to, 20s);
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  fmt::print("redis-cluster: failover after kill -9 took {} ms\n",
             std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now() - kill_time)
                 .count());
  EXPECT_NE(*promoted, to);
  EXPECT_EQ(Out(cluster->Cli(*promoted, {"GET", key})), "v1");
  EXPECT_TRUE(Out(cluster->Cli(*promoted, {"ROLE"})).starts_with("master"));
  EXPECT_EQ(Out(cluster->MasterPortForKey(key)), *promoted);
  const std::vector<int> now = cluster->MasterPorts();
  EXPECT_EQ(now.size(), 3U);
  EXPECT_EQ(std::count(now.begin(), now.end(), to), 0);

  // Restarted with its nodes.conf, the old master rejoins as the new master's replica.
  ASSERT_TRUE(cluster->ServerOnPort(to)->Restart().ok());
  const auto rejoin_by = std::chrono::steady_clock::now() + 10s;
  std::string role;
  while (std::chrono::steady_clock::now() < rejoin_by) {
    role = Out(cluster->Cli(to, {"ROLE"}));
    if (role.starts_with(fmt::format("slave\n127.0.0.1\n{}\nconnected", *promoted))) {
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(role.starts_with(fmt::format("slave\n127.0.0.1\n{}\nconnected", *promoted))) << role;
}

TEST(RedisClusterFixtureTest, AHalfDoneMigrationAnswersAskForTheKeysMovedSoFar) {
  auto cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  const std::vector<std::string> keys = {"{half}a", "{half}b"};
  const int slot = Out(cluster->SlotOfKey(keys[0]));
  const int from = Out(cluster->MasterPortForSlot(slot));
  const int to = OtherMaster(*cluster, from);
  ASSERT_GE(slot, 0);
  ASSERT_GT(from, 0);
  ASSERT_GT(to, 0);
  for (const std::string& key : keys) {
    ASSERT_EQ(Out(cluster->Cli(from, {"SET", key, key})), "OK");
  }

  Status begun = cluster->BeginMigration(slot, to);
  ASSERT_TRUE(begun.ok()) << begun.ToString();
  EXPECT_EQ(cluster->BeginMigration(slot, to).code(), StatusCode::kInvalidArgument);
  ASSERT_EQ(Out(cluster->MigrateKeys(slot, 1)), 1);
  // Which key went first is up to CLUSTER GETKEYSINSLOT's order.
  const bool first_moved = Out(cluster->Cli(from, {"EXISTS", keys[0]})) == "0";
  const std::string& moved = keys[first_moved ? 0 : 1];
  const std::string& staying = keys[first_moved ? 1 : 0];
  EXPECT_EQ(Out(cluster->Cli(from, {"GET", moved})), fmt::format("ASK {} 127.0.0.1:{}", slot, to));
  EXPECT_EQ(Out(cluster->Cli(from, {"GET", staying})), staying);
  // Without ASKING the target still sends the client back: the slot is not its own yet.
  EXPECT_EQ(Out(cluster->Cli(to, {"GET", moved})),
            fmt::format("MOVED {} 127.0.0.1:{}", slot, from));
  EXPECT_EQ(cluster->FinishMigration(slot, to).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Out(cluster->MasterPortForSlot(slot)), from);

  ASSERT_EQ(Out(cluster->MigrateKeys(slot, 10)), 1);
  ASSERT_EQ(Out(cluster->MigrateKeys(slot, 10)), 0);
  Status finished = cluster->FinishMigration(slot, to);
  ASSERT_TRUE(finished.ok()) << finished.ToString();
  EXPECT_EQ(Out(cluster->MasterPortForSlot(slot)), to);
  for (const std::string& key : keys) {
    EXPECT_EQ(Out(cluster->Cli(to, {"GET", key})), key);
  }
}

TEST(RedisClusterFixtureTest, WithTlsTheClusterAnnouncesItsTlsPortsToTlsClients) {
  auto cluster = StartCluster({.tls = true});
  ASSERT_NE(cluster, nullptr);
  const std::vector<int> masters = cluster->MasterPorts();
  ASSERT_EQ(masters.size(), 3U);
  RedisServer* first = cluster->ServerOnPort(masters.front());
  EXPECT_EQ(cluster->Url("?prefix=x"),
            fmt::format("rediss+cluster://{}?prefix=x&ca={}", Seeds(*cluster, true),
                        cluster->servers().front()->TlsFile("ca.crt")));
  // Over TLS, CLUSTER SLOTS names every node by its TLS port (the plain ports are for plain
  // clients, as Slots() is).
  auto slots = RunCommand(
      fmt::format("timeout 5 redis-cli --tls --cacert {} -h 127.0.0.1 -p {} --json CLUSTER SLOTS",
                  ShellQuote(first->TlsFile("ca.crt")), first->tls_port()));
  ASSERT_TRUE(slots.ok()) << slots.status().ToString();
  for (RedisServer* node : cluster->servers()) {
    EXPECT_NE(slots->find(fmt::format(",{},", node->tls_port())), std::string::npos)
        << node->tls_port() << " in " << *slots;
    EXPECT_EQ(slots->find(fmt::format(",{},", node->port())), std::string::npos)
        << node->port() << " in " << *slots;
  }
}

}  // namespace
}  // namespace leasehold::testing
