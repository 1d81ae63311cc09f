// File: tests/testing/redis_cluster.h
//
// RedisClusterSetup: a throwaway Redis Cluster for tests and benchmarks: masters and their
// replicas, each a RedisServer in cluster mode (RedisServerOptions::cluster: its own free
// loopback port, cluster bus port and temporary directory), joined by `redis-cli --cluster
// create` with all 16384 slots spread over the masters. Start returns once every node agrees on
// the slot map and every replica is in sync. Slots can then be moved between masters (at once,
// or step by step to leave a migration half done for ASK redirects), and a slot's master killed
// to watch its replica take over. Everything is killed with the object, or with the process
// that started it.
//
// Example:
//
//   auto cluster = RedisClusterSetup::Start();
//   ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
//   std::string url = (*cluster)->Url("?prefix=x");  // redis+cluster://127.0.0.1:P1,...?prefix=x
//   int slot = *(*cluster)->SlotOfKey("{job}lease");
//   ASSERT_TRUE((*cluster)->MoveSlot(slot, other_master_port).ok());
//   int old_port = *(*cluster)->Kill9MasterOf(slot);
//   auto new_port = (*cluster)->AwaitFailover(slot, old_port, 20s);
//
// Thread safety: not thread-safe; use from one test thread.

#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "leasehold/status.h"

#include "testing/redis_server.h"

namespace leasehold::testing {

struct RedisClusterOptions {
  // Masters (redis-cli needs at least 3) and replicas of each. Default: 3 and 1.
  int masters = 3;
  int replicas_per_master = 1;
  // Every node's appendonly (RedisServerOptions::aof). Default: true.
  bool aof = true;
  // cluster-node-timeout: a master unreachable for this long is suspected failing, and a
  // replica takes over about a second or two later. Default: 1000 ms.
  std::chrono::milliseconds node_timeout{1000};
  // How long Start, and the wait for agreement after FinishMigration, may take. Default: 30 s.
  std::chrono::milliseconds ready_timeout{30'000};
  // Every node with a TLS port (RedisServerOptions::tls, one test CA for all), the cluster bus
  // and replication over TLS; Url() is then rediss+cluster:// with the TLS ports and ca=.
  // Cli() and the fixture's own commands still use the plain ports. Default: false.
  bool tls = false;
};

class RedisClusterSetup {
 public:
  static constexpr int kSlots = 16384;

  // One range of CLUSTER SLOTS: slots first..last, served by the master on master_port.
  struct SlotRange {
    int first = 0;
    int last = 0;
    int master_port = 0;
    std::string master_id;
    std::vector<int> replica_ports;

    friend bool operator==(const SlotRange&, const SlotRange&) = default;
  };

  // Starts the servers, creates the cluster and waits (up to ready_timeout) until every node
  // says cluster_state:ok with all slots assigned, every node's CLUSTER SLOTS names the same
  // masters, and every replica's link to its master is up. Returns kInvalidArgument for fewer
  // than 3 masters, kUnavailable if a server or the cluster does not come up.
  static Result<std::unique_ptr<RedisClusterSetup>> Start(RedisClusterOptions options = {});

  RedisClusterSetup(const RedisClusterSetup&) = delete;
  RedisClusterSetup& operator=(const RedisClusterSetup&) = delete;
  ~RedisClusterSetup();

  // "redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3" + path_and_query ("?prefix=x"):
  // the masters at Start, in slot order, as seeds (they stay the seeds after a failover or a
  // slot move). A cluster has only database 0, so path_and_query is a query or empty. With
  // tls: "rediss+cluster://" with the TLS ports and the test CA as ca= in the query.
  [[nodiscard]] std::string Url(const std::string& path_and_query = "") const;

  // CLUSTER SLOTS as the node on `port` sees it, in slot order.
  Result<std::vector<SlotRange>> Slots(int port) const;

  // The slot of `key` (CLUSTER KEYSLOT, asked of a live node).
  Result<int> SlotOfKey(const std::string& key) const;

  // The port of the master that a live node's CLUSTER SLOTS names for `slot`, or for the slot
  // of `key`. kUnavailable if no live node answers or the slot is unassigned.
  Result<int> MasterPortForSlot(int slot) const;
  Result<int> MasterPortForKey(const std::string& key) const;

  // The node on `port`, or null.
  [[nodiscard]] RedisServer* ServerOnPort(int port) const;

  // The masters' ports now (a live node's CLUSTER SLOTS), sorted; empty if no node answers.
  [[nodiscard]] std::vector<int> MasterPorts() const;

  // Every node, masters and replicas, dead or alive.
  [[nodiscard]] std::vector<RedisServer*> servers() const;

  // kill -9 of the master serving `slot` (RedisServer::Kill9: its port and data stay for
  // Restart); returns its port.
  Result<int> Kill9MasterOf(int slot);

  // Waits until a live node's CLUSTER SLOTS names a master other than `old_port` for `slot`,
  // and that master answers ROLE as master and CLUSTER INFO with cluster_state:ok. Returns its
  // port, or kUnavailable after `timeout`.
  Result<int> AwaitFailover(int slot, int old_port, std::chrono::milliseconds timeout) const;

  // Moves `slot` with its keys to the master on `to_port`, as `redis-cli --cluster reshard`
  // does, and waits until every live node names that master for it: BeginMigration, then
  // MigrateKeys until none are left, then FinishMigration.
  Status MoveSlot(int slot, int to_port);

  // A move in steps, so that a test can act while the slot is half moved (the source answers
  // ASK for keys it no longer has, the target serves those after ASKING). BeginMigration sets
  // the slot IMPORTING on the master on `to_port` and MIGRATING on its current master.
  // MigrateKeys moves up to `count` of its keys still on the source (CLUSTER GETKEYSINSLOT,
  // MIGRATE ... KEYS) and returns how many it moved (0: none left). FinishMigration assigns the
  // slot to the target on every master (CLUSTER SETSLOT NODE; kInvalidArgument while keys are
  // left on the source) and waits until every live node agrees. Keys must not contain newlines.
  Status BeginMigration(int slot, int to_port);
  Result<int> MigrateKeys(int slot, int count);
  Status FinishMigration(int slot, int to_port);

  // Runs one command with redis-cli against the node on `port` (RedisServer::Cli; no -c, so a
  // MOVED or ASK reply is returned as text, like any error reply, with OK status).
  Result<std::string> Cli(int port, const std::vector<std::string>& args) const;

  // CLUSTER MYID of the node on `port`.
  Result<std::string> NodeId(int port) const;

 private:
  struct Migration {
    int from_port = 0;
    int to_port = 0;
  };

  explicit RedisClusterSetup(RedisClusterOptions options);

  Status Create() const;
  Status AwaitReady() const;
  // What Start still waits for (AwaitReady), or "" when the cluster is ready.
  std::string WhyNotReady() const;
  // Slots() of the first live node that answers.
  Result<std::vector<SlotRange>> SlotsOfAnyLiveNode() const;
  // Waits until every live node's CLUSTER SLOTS names the master on `port` for `slot`.
  Status AwaitSlotOwner(int slot, int port) const;

  const RedisClusterOptions options_;
  std::vector<std::unique_ptr<RedisServer>> servers_;
  std::vector<int> seed_ports_;          // the masters at Start, in slot order
  std::map<int, Migration> migrations_;  // by slot, from BeginMigration to FinishMigration
};

}  // namespace leasehold::testing
