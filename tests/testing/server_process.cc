// File: tests/testing/server_process.cc

#include "testing/server_process.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

namespace leasehold::testing {

using namespace std::chrono_literals;

int PickFreeLoopbackPort(std::initializer_list<int> avoid) {
  for (int attempt = 0; attempt < 20; ++attempt) {
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
    if (port > 0 && std::find(avoid.begin(), avoid.end(), port) == avoid.end()) {
      return port;
    }
  }
  return -1;
}

Result<pid_t> SpawnServer(const std::vector<std::string>& args, const std::string& log,
                          const RunAs& who) {
  // Everything the child needs is prepared before fork: only async-signal-safe calls follow.
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  if (argv.size() < 2 || access(argv[0], X_OK) != 0) {
    return Status::Unavailable(fmt::format("cannot execute {}", args.empty() ? "" : args[0]));
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    return Status::Unavailable("fork failed");
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
      _exit(127);
    }
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    if (who.drop && (setgroups(0, nullptr) != 0 || setgid(who.gid) != 0 || setuid(who.uid) != 0)) {
      _exit(126);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // setuid clears it
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

Status AwaitReady(pid_t& pid, const std::function<bool()>& ready, std::chrono::milliseconds timeout,
                  const std::string& log, std::string_view what) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < give_up) {
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      return Status::Unavailable(fmt::format("{} exited at start: {}", what, TailFile(log)));
    }
    if (ready()) {
      return Status();
    }
    std::this_thread::sleep_for(20ms);
  }
  return Status::Unavailable(fmt::format("{} not ready in time: {}", what, TailFile(log)));
}

void StopPid(pid_t& pid, int first_signal, std::chrono::milliseconds grace) {
  if (pid <= 0) {
    return;
  }
  kill(pid, SIGCONT);
  kill(pid, first_signal);
  const auto give_up = std::chrono::steady_clock::now() + grace;
  while (first_signal != SIGKILL && std::chrono::steady_clock::now() < give_up) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      pid = -1;
      return;
    }
    std::this_thread::sleep_for(10ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  pid = -1;
}

std::string TailFile(const std::string& path, std::size_t max_bytes) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  return all.size() > max_bytes ? all.substr(all.size() - max_bytes) : all;
}

bool LogShowsPortInUse(const std::string& path) {
  const std::string all = TailFile(path, 1 << 20);
  return all.find("Address already in use") != std::string::npos ||
         all.find("BindException") != std::string::npos;
}

std::string ShellQuote(std::string_view arg) {
  std::string quoted = "'";
  for (char c : arg) {
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return quoted + "'";
}

Result<std::string> RunCommand(const std::string& command_line) {
  std::string command = command_line + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return Status::Unavailable(fmt::format("cannot run: {}", command_line));
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
    return Status::Unavailable(fmt::format("command failed ({}): {}", command_line, out));
  }
  return out;
}

}  // namespace leasehold::testing
