// File: tests/testing/zk_server.h
//
// ZkEnsemble: throwaway ZooKeeper 3.8 servers for tests and benchmarks: one standalone server
// or an N-server ensemble, every server on free 127.0.0.1 ports in its own temporary directory
// (zoo.cfg, myid), never a system instance or port 2181. Servers are JVMs (-Xmx128m), stopped by
// PID (SIGKILL, then reaped) when the object is destroyed; they die with the process that
// started them (PR_SET_PDEATHSIG).
//
// Example:
//
//   auto zk = leasehold::testing::ZkEnsemble::Start({.servers = 3, .tick_time = 200ms});
//   ASSERT_TRUE(zk.ok()) << zk.status().ToString();
//   std::string url = (*zk)->Url("/test");        // zk://127.0.0.1:P1,127.0.0.1:P2,.../test
//   (*zk)->Kill9(1);  (*zk)->Restart(1);           // server index 0..N-1
//
// Thread safety: not thread-safe; use from one test thread.

#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "leasehold/status.h"

#include "testing/server_process.h"

namespace leasehold::testing {

struct ZkEnsembleOptions {
  // 1: a standalone server; 3 (or more): an ensemble on loopback. Default: 1.
  int servers = 1;
  // ZooKeeper's tick. Session timeouts are clamped to [min_session, max_session], which default
  // (when not set below) to 2 and 20 ticks. Default: 2000 ms (ZooKeeper's own default).
  std::chrono::milliseconds tick_time{2000};
  // minSessionTimeout / maxSessionTimeout; 0 leaves ZooKeeper's 2 and 20 ticks.
  std::chrono::milliseconds min_session{0};
  std::chrono::milliseconds max_session{0};
  // How long Start/Restart wait for the servers to serve. Default: 60 s (a JVM on a busy box).
  std::chrono::milliseconds ready_timeout{60'000};
};

// Reads the data of the node `path` in the chroot of the zk:// `url` with ZooKeeper's own C
// client (a session of its own, closed before returning), for tests that check what a fenced
// write (Lease::Write) left in the store. Returns nullopt if there is no such node; kUnavailable
// if no server answers within 10 s; kUnimplemented for a URL with credentials.
Result<std::optional<std::string>> ReadZkNodeData(const std::string& url, const std::string& path);

class ZkEnsemble {
 public:
  // Starts every server and waits until each serves requests ("srvr" answers with a Mode).
  // Returns kUnavailable if java or ZooKeeper is missing or a server does not come up in time.
  static Result<std::unique_ptr<ZkEnsemble>> Start(ZkEnsembleOptions options = {});

  ZkEnsemble(const ZkEnsemble&) = delete;
  ZkEnsemble& operator=(const ZkEnsemble&) = delete;
  ZkEnsemble(ZkEnsemble&&) = delete;
  ZkEnsemble& operator=(ZkEnsemble&&) = delete;

  // Kills every server (SIGKILL by PID) and removes the temporary directory.
  ~ZkEnsemble();

  [[nodiscard]] int size() const { return static_cast<int>(servers_.size()); }

  [[nodiscard]] int client_port(int i) const { return servers_[i].client_port; }

  [[nodiscard]] pid_t pid(int i) const { return servers_[i].pid; }

  // Index of the server with this client port, or -1.
  [[nodiscard]] int IndexOfPort(int client_port) const;

  // Returns "zk://127.0.0.1:P1[,...]" + chroot.
  [[nodiscard]] std::string Url(const std::string& chroot = "") const;

  // kill -9 of server i, and reap. Its ports and data directory stay for Restart(i).
  void Kill9(int i);

  // Starts server i again with its data and waits until it serves.
  Status Restart(int i);

  // SIGSTOP / SIGCONT of server i.
  void Pause(int i);
  void Resume(int i);

  // Sends a four-letter word (ruok, srvr) to server i and returns the answer ("" on failure).
  [[nodiscard]] std::string FourLetter(int i, const std::string& word) const;

 private:
  struct Server {
    int client_port = 0;
    int peer_port = 0;
    int election_port = 0;
    std::string dir;
    pid_t pid = -1;
  };

  ZkEnsemble(ZkEnsembleOptions options, std::string dir);

  // Picks ports for n servers, writes their configs, launches them and waits until each serves.
  Status StartOnFreshPorts(int n);
  Status WriteConfig(int i);
  Status Launch(int i);
  Status AwaitServing(int i);

  const ZkEnsembleOptions options_;
  const std::string dir_;
  std::vector<Server> servers_;
};

}  // namespace leasehold::testing
