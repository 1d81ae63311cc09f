// File: tests/testing/redis_server.cc
//
// RedisServer: fork + exec of redis-server with every setting on the command line, readiness by
// PING through redis-cli, stop by PID. Nothing here sleeps longer than 20 ms at a time, and
// every wait has a bound.

#include "testing/redis_server.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

namespace leasehold::testing {

namespace {

using namespace std::chrono_literals;

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  return all.size() > 600 ? all.substr(all.size() - 600) : all;
}

}  // namespace

int PickFreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port == 6379 ? PickFreeLoopbackPort() : port;
}

RedisServer::RedisServer(RedisServerOptions options, std::string dir, int port)
    : options_(std::move(options)), dir_(std::move(dir)), port_(port) {}

Result<std::unique_ptr<RedisServer>> RedisServer::Start(RedisServerOptions options) {
  char tmpl[] = "/tmp/leasehold-redis-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return Status::Unavailable("cannot create a temporary directory for redis-server");
  }
  int port = PickFreeLoopbackPort();
  if (port <= 0) {
    return Status::Unavailable("no free loopback port");
  }
  std::unique_ptr<RedisServer> server(new RedisServer(std::move(options), tmpl, port));
  if (!server->options_.acl_users.empty()) {
    std::ofstream acl(server->dir_ + "/users.acl");
    acl << "user default on nopass ~* &* +@all\n";
    for (const std::string& line : server->options_.acl_users) {
      acl << line << "\n";
    }
  }
  LH_RETURN_IF_ERROR(server->Launch());
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

Status RedisServer::Launch() {
  std::vector<std::string> args = {"redis-server",
                                   "--bind",
                                   "127.0.0.1",
                                   "--port",
                                   std::to_string(port_),
                                   "--dir",
                                   dir_,
                                   "--save",
                                   "",
                                   "--daemonize",
                                   "no",
                                   "--logfile",
                                   dir_ + "/redis.log",
                                   "--protected-mode",
                                   "no"};
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
  std::vector<char*> argv;
  for (std::string& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  // Resolve the binary before fork: only async-signal-safe calls may follow it.
  std::string binary = "/usr/bin/redis-server";
  if (access(binary.c_str(), X_OK) != 0) {
    binary = "/usr/local/bin/redis-server";
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    return Status::Unavailable("fork failed");
  }
  if (pid == 0) {
    // Die with the test process, whatever happens to it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
      _exit(127);
    }
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  pid_ = pid;
  const auto give_up = std::chrono::steady_clock::now() + options_.ready_timeout;
  while (std::chrono::steady_clock::now() < give_up) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable(
          fmt::format("redis-server exited at start: {}", Tail(dir_ + "/redis.log")));
    }
    Result<std::string> pong = Cli({"PING"});
    if (pong.ok() && pong->find("PONG") != std::string::npos) {
      return Status();
    }
    std::this_thread::sleep_for(20ms);
  }
  Kill9();
  return Status::Unavailable(
      fmt::format("redis-server did not answer PING in time: {}", Tail(dir_ + "/redis.log")));
}

void RedisServer::Kill9() {
  if (pid_ > 0) {
    kill(pid_, SIGCONT);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

void RedisServer::Stop() {
  if (pid_ > 0) {
    kill(pid_, SIGCONT);
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
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
    std::string quoted = "'";
    for (char c : arg) {
      quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    }
    command += " " + quoted + "'";
  }
  command += " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return Status::Unavailable("cannot run redis-cli");
  }
  std::string out;
  std::array<char, 4096> buf;
  std::size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) {
    out.append(buf.data(), n);
  }
  int rc = pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) {
    out.pop_back();
  }
  if (rc != 0) {
    return Status::Unavailable(fmt::format("redis-cli failed: {}", out));
  }
  return out;
}

}  // namespace leasehold::testing
