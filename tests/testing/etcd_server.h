// File: tests/testing/etcd_server.h
//
// EtcdCluster: throwaway etcd members (one, or an N-member cluster) for tests and benchmarks,
// on free 127.0.0.1 client and peer ports, each in its own data directory under one temporary
// directory; never a system instance and never ports 2379/2380. Members are stopped by PID
// (SIGKILL, then reaped) when the object is destroyed, and die with the process that started
// them (PR_SET_PDEATHSIG).
//
// Example:
//
//   auto cluster = leasehold::testing::EtcdCluster::Start({.members = 3});
//   ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
//   std::string url = (*cluster)->Url();     // etcd://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
//   (*cluster)->Kill9(1);  (*cluster)->Restart(1);
//   (*cluster)->Etcdctl({"put", "k", "v"});
//   auto kvs = (*cluster)->Get("leasehold/", /*prefix=*/true);   // key, value, create_revision
//
// Thread safety: not thread-safe; use from one test thread.

#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "leasehold/status.h"

#include "testing/server_process.h"

namespace leasehold::testing {

struct EtcdClusterOptions {
  // Number of members. Default: 1.
  int members = 1;
  // How long Start/Restart wait for a member to report healthy. Default: 20 s.
  std::chrono::milliseconds ready_timeout{20'000};
  // Clients talk TLS (https client URLs), with certificates made by openssl in the temporary
  // directory: ca.pem, server.pem/server-key.pem (SAN IP 127.0.0.1), client.pem/client-key.pem.
  // Default: false.
  bool tls = false;
  // With tls: members require a client certificate signed by the CA. Default: false.
  bool client_cert_auth = false;
};

// One key as `etcdctl get -w json` shows it: key and value decoded from base64.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t lease = 0;
};

class EtcdCluster {
 public:
  // Starts every member and waits until each is healthy (the cluster has a leader). Returns
  // kUnavailable if /usr/bin/etcd is missing or a member does not come up (log tail included).
  static Result<std::unique_ptr<EtcdCluster>> Start(EtcdClusterOptions options = {});

  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;
  EtcdCluster(EtcdCluster&&) = delete;
  EtcdCluster& operator=(EtcdCluster&&) = delete;

  // Kills every member (SIGKILL by PID) and removes the temporary directory.
  ~EtcdCluster();

  [[nodiscard]] int size() const { return static_cast<int>(members_.size()); }

  [[nodiscard]] int client_port(int i) const { return members_[i].client_port; }

  [[nodiscard]] pid_t pid(int i) const { return members_[i].pid; }

  // "127.0.0.1:P" of member i, and all of them joined with ','.
  [[nodiscard]] std::string Endpoint(int i) const;
  [[nodiscard]] std::string Endpoints() const;

  // "etcd://" + Endpoints() (add user info and query as needed); "etcds://" with tls.
  [[nodiscard]] std::string Url() const;

  // With tls: the path of a PEM file in the temporary directory ("ca.pem", "client.pem"...).
  [[nodiscard]] std::string CertPath(const std::string& name) const { return dir_ + "/" + name; }

  // kill -9 of member i, and reap. Its ports and data directory stay for Restart(i).
  void Kill9(int i);

  // Starts member i again on its ports and data directory and waits until it is healthy.
  Status Restart(int i);

  // SIGSTOP / SIGCONT of member i: it stops answering without closing connections.
  void Pause(int i);
  void Resume(int i);

  // Index of the member that is the raft leader, asking each live member; nullopt if none
  // says so.
  std::optional<int> LeaderIndex() const;

  // Runs `etcdctl` (API v3, 5 s timeout) against every live member (or only member i), as the
  // user set by SetEtcdctlUser, and returns its output without the trailing newline.
  Result<std::string> Etcdctl(const std::vector<std::string>& args, int member = -1) const;

  // Runs `etcdctl get KEY [--prefix] -w json` and returns the keys it lists (in key order; empty
  // if none). The key goes to etcdctl as an argument, so it cannot contain a NUL byte.
  Result<std::vector<EtcdKeyValue>> Get(const std::string& key, bool prefix = false) const;

  // Creates user root with `root_password`, enables auth, and makes Etcdctl run as root.
  Status EnableAuth(const std::string& root_password);

 private:
  struct Member {
    std::string name;
    std::string dir;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };

  EtcdCluster(EtcdClusterOptions options, std::string dir);

  Status MakeCertificates();
  Status Launch(int i);
  Status AwaitHealthy(int i);

  const EtcdClusterOptions options_;
  const std::string dir_;
  std::string initial_cluster_;
  std::vector<Member> members_;
  std::string etcdctl_user_;
};

}  // namespace leasehold::testing
