// File: tests/testing/redis_server.cc
//
// RedisServer: redis-server with every setting on the command line (started by
// testing/server_process.h), readiness by PING through redis-cli, stop by PID.

#include "testing/redis_server.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace leasehold::testing {

using namespace std::chrono_literals;

RedisServer::RedisServer(RedisServerOptions options, std::string dir, int port, int tls_port,
                         int cluster_port)
    : options_(std::move(options)),
      dir_(std::move(dir)),
      port_(port),
      tls_port_(tls_port),
      cluster_port_(cluster_port) {}

Result<std::unique_ptr<RedisServer>> RedisServer::Start(RedisServerOptions options) {
  // A port picked free can be taken by another test's server before this one binds it (ctest -j
  // runs clusters of six side by side): such a start is retried on new ports, any other failure
  // is returned.
  constexpr int kStartAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    LH_ASSIGN_OR_RETURN(std::unique_ptr<RedisServer> server, Prepare(options));
    Status launched = server->Launch();
    if (launched.ok()) {
      return server;
    }
    if (attempt == kStartAttempts || !LogShowsPortInUse(server->dir_ + "/redis.log")) {
      return launched;
    }
  }
}

Result<std::unique_ptr<RedisServer>> RedisServer::Prepare(const RedisServerOptions& options) {
  char tmpl[] = "/tmp/leasehold-redis-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return Status::Unavailable("cannot create a temporary directory for redis-server");
  }
  const int port = PickFreeLoopbackPort();
  const int tls_port = options.tls ? PickFreeLoopbackPort({6379, 6380, port}) : 0;
  // Not port + 10000 (Redis's default bus port), which nobody checked was free.
  const int cluster_port =
      options.cluster ? PickFreeLoopbackPort({6379, 16379, port, tls_port}) : 0;
  std::unique_ptr<RedisServer> server(new RedisServer(options, tmpl, port, tls_port, cluster_port));
  if (port <= 0 || tls_port < 0 || cluster_port < 0) {
    return Status::Unavailable("no free loopback port");
  }
  if (server->options_.tls && !server->options_.tls_certificates_from.empty()) {
    std::error_code error;
    std::filesystem::copy(server->options_.tls_certificates_from, server->dir_ + "/tls",
                          std::filesystem::copy_options::recursive, error);
    if (error) {
      return Status::Unavailable(fmt::format("cannot copy the test certificates from {}: {}",
                                             server->options_.tls_certificates_from,
                                             error.message()));
    }
  } else if (server->options_.tls) {
    LH_RETURN_IF_ERROR(server->MakeCertificates());
  }
  if (!server->options_.acl_users.empty()) {
    std::ofstream acl(server->dir_ + "/users.acl");
    acl << "user default on nopass ~* &* +@all\n";
    for (const std::string& line : server->options_.acl_users) {
      acl << line << "\n";
    }
  }
  return server;
}

RedisServer::~RedisServer() {
  Kill9();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string RedisServer::Url() const {
  return fmt::format("redis://127.0.0.1:{}", port_);
}

std::string RedisServer::TlsUrl(const std::string& path_and_query) const {
  const char* join = path_and_query.find('?') == std::string::npos ? "?" : "&";
  return fmt::format("rediss://127.0.0.1:{}{}{}ca={}", tls_port_, path_and_query, join,
                     TlsFile("ca.crt"));
}

std::string RedisServer::TlsFile(const std::string& name) const {
  return dir_ + "/tls/" + name;
}

// EC keys (fast to make); every certificate signed by the test CA but other-ca.crt's.
Status RedisServer::MakeCertificates() const {
  const std::string tls = dir_ + "/tls";
  std::filesystem::create_directories(tls);
  {
    std::ofstream san(tls + "/server.ext");
    san << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  }
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::string script = fmt::format(
      "set -e; cd {0}; "
      "openssl req -x509 {1} -keyout ca.key -out ca.crt -days 30 -subj /CN=leasehold-test-ca; "
      "openssl req -x509 {1} -keyout other-ca.key -out other-ca.crt -days 30 "
      "-subj /CN=leasehold-other-ca; "
      "openssl req {1} -keyout server.key -out server.csr -subj /CN=localhost; "
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
      "-out server.crt -days 30 -extfile server.ext; "
      "openssl req {1} -keyout client.key -out client.csr -subj /CN=leasehold-test-client; "
      "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
      "-out client.crt -days 30",
      ShellQuote(tls), key);
  if (options_.tls_expired) {
    script +=
        "; faketime '2020-01-01 00:00:00' openssl x509 -req -in server.csr -CA ca.crt "
        "-CAkey ca.key -CAcreateserial -out expired.crt -days 1 -extfile server.ext";
  }
  Result<std::string> made =
      RunCommand(fmt::format("timeout 30 sh -c {} 2>&1", ShellQuote(script)));
  if (!made.ok()) {
    return Status::Unavailable(fmt::format("cannot make the test certificates with openssl{}: {}",
                                           options_.tls_expired ? " (and faketime)" : "",
                                           made.status().message()));
  }
  return Status();
}

Status RedisServer::Launch() {
  std::vector<std::string> args = {
      "redis-server", "--bind", "127.0.0.1", "--port", std::to_string(port_), "--dir", dir_,
      "--save", "", "--daemonize", "no", "--logfile", dir_ + "/redis.log", "--protected-mode", "no",
      // A replica's first sync starts at once (Redis 7 waits 5 s
      // for more replicas to share a diskless transfer).
      "--repl-diskless-sync-delay", "0"};
  if (options_.aof) {
    args.insert(args.end(), {"--appendonly", "yes", "--appendfsync", "always"});
  } else {
    args.insert(args.end(), {"--appendonly", "no"});
  }
  if (!options_.acl_users.empty()) {
    args.insert(args.end(), {"--aclfile", dir_ + "/users.acl"});
  }
  if (!options_.requirepass.empty()) {
    args.insert(args.end(), {"--requirepass", options_.requirepass});
  }
  if (options_.replica_of > 0) {
    args.insert(args.end(), {"--replicaof", "127.0.0.1", std::to_string(options_.replica_of)});
  }
  if (options_.replica_priority != 100) {
    args.insert(args.end(), {"--replica-priority", std::to_string(options_.replica_priority)});
  }
  if (options_.tls) {
    args.insert(args.end(),
                {"--tls-port", std::to_string(tls_port_), "--tls-cert-file",
                 TlsFile(options_.tls_expired ? "expired.crt" : "server.crt"), "--tls-key-file",
                 TlsFile("server.key"), "--tls-ca-cert-file", TlsFile("ca.crt"),
                 "--tls-auth-clients", options_.tls_auth_clients ? "yes" : "no"});
  }
  if (options_.cluster) {
    args.insert(args.end(),
                {"--cluster-enabled", "yes", "--cluster-config-file", dir_ + "/nodes.conf",
                 "--cluster-node-timeout", std::to_string(options_.cluster_node_timeout.count()),
                 "--cluster-port", std::to_string(cluster_port_),
                 // A replica may take over however long ago it last heard from its master (the
                 // default refuses one whose data is older than 10 node timeouts), and notices a
                 // dead master within a second.
                 "--cluster-replica-validity-factor", "0", "--repl-ping-replica-period", "1"});
    if (options_.tls) {
      args.insert(args.end(), {"--tls-cluster", "yes", "--tls-replication", "yes"});
    }
  }
  // Resolve the binary: Debian's, else a local build.
  args[0] = access("/usr/bin/redis-server", X_OK) == 0 ? "/usr/bin/redis-server"
                                                       : "/usr/local/bin/redis-server";
  LH_ASSIGN_OR_RETURN(pid_, SpawnServer(args, dir_ + "/redis-stdout.log"));
  Status ready = AwaitReady(
      pid_,
      [this] {
        // This server's own process_id, not just a PONG: if its port was taken meanwhile, the
        // server answering there is another test's.
        Result<std::string> info = Cli({"INFO", "server"});
        return info.ok() && info->find(fmt::format("process_id:{}\r", pid_)) != std::string::npos;
      },
      options_.ready_timeout, dir_ + "/redis.log", "redis-server");
  if (!ready.ok()) {
    Kill9();
  }
  return ready;
}

void RedisServer::Kill9() {
  StopPid(pid_, SIGKILL);
}

void RedisServer::Stop() {
  StopPid(pid_, SIGTERM);
}

Status RedisServer::Restart() {
  Kill9();
  return Launch();
}

void RedisServer::Pause() {
  if (pid_ > 0) {
    kill(pid_, SIGSTOP);
  }
}

void RedisServer::Resume() {
  if (pid_ > 0) {
    kill(pid_, SIGCONT);
  }
}

Result<std::string> RedisServer::Cli(const std::vector<std::string>& args) const {
  std::string command = fmt::format("timeout 5 redis-cli -h 127.0.0.1 -p {}", port_);
  if (!options_.requirepass.empty()) {
    command += fmt::format(" --no-auth-warning -a '{}'", options_.requirepass);
  }
  for (const std::string& arg : args) {
    command += " " + ShellQuote(arg);
  }
  return RunCommand(command);
}

}  // namespace leasehold::testing
