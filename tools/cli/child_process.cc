// File: tools/cli/child_process.cc

#include "child_process.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "exit_codes.h"

extern char** environ;

namespace leasehold::cli {

namespace {

std::vector<char*> PointersTo(std::vector<std::string>& strings) {
  std::vector<char*> ptrs;
  ptrs.reserve(strings.size() + 1);
  for (std::string& s : strings) {
    ptrs.push_back(s.data());
  }
  ptrs.push_back(nullptr);
  return ptrs;
}

// Writes all of `len` bytes, retrying on EINTR. Async-signal-safe.
void WriteAll(int fd, const void* data, std::size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;
    }
    p += n;
    len -= static_cast<std::size_t>(n);
  }
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv, std::vector<std::string> env)
    : argv_(std::move(argv)), env_(std::move(env)) {
  argv_ptrs_ = PointersTo(argv_);
  env_ptrs_ = PointersTo(env_);
}

ChildProcess::~ChildProcess() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

int ChildProcess::Start(const sigset_t& child_mask) {
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    return errno;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(exec_pipe[0]);
    ::close(exec_pipe[1]);
    return err;
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only from here to exec.
    ::close(exec_pipe[0]);
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
      int err = errno;
      WriteAll(exec_pipe[1], &err, sizeof err);
      ::_exit(kExitCannotExecute);
    }
    // The parent may have died between fork() and prctl(): then nobody guards the lease.
    if (::getppid() != parent) {
      ::_exit(kExitLeaseLost);
    }
    ::sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    ::execvpe(argv_ptrs_[0], argv_ptrs_.data(), env_ptrs_.data());
    int err = errno;
    WriteAll(exec_pipe[1], &err, sizeof err);
    ::_exit(err == ENOENT ? kExitCommandNotFound : kExitCannotExecute);
  }
  pid_ = pid;
  reaped_ = false;
  ::close(exec_pipe[1]);
  // EOF means the exec succeeded (the pipe closed on exec); an int means it failed.
  int exec_errno = 0;
  ssize_t n = 0;
  do {
    n = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof exec_errno)) {
    while (::waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return exec_errno != 0 ? exec_errno : ENOEXEC;
  }
  return 0;
}

void ChildProcess::Signal(int sig) {
  if (running()) {
    ::kill(pid_, sig);
  }
}

bool ChildProcess::TryReap() {
  if (pid_ <= 0) {
    return false;
  }
  if (reaped_) {
    return true;
  }
  int status = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    wait_status_ = status;
    reaped_ = true;
  }
  return reaped_;
}

int ChildProcess::ShellExitCode() const {
  if (WIFEXITED(wait_status_)) {
    return WEXITSTATUS(wait_status_);
  }
  if (WIFSIGNALED(wait_status_)) {
    return kExitSignalBase + WTERMSIG(wait_status_);
  }
  return kExitInternal;
}

std::string ChildProcess::DescribeExit() const {
  if (WIFSIGNALED(wait_status_)) {
    return fmt::format("killed by {}", SignalName(WTERMSIG(wait_status_)));
  }
  return fmt::format("exited with code {}", ShellExitCode());
}

std::vector<std::string> BuildChildEnvironment(const std::vector<std::string>& drop,
                                               const std::vector<std::string>& add) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    bool dropped = false;
    for (const std::string& d : drop) {
      dropped = dropped || name == d;
    }
    if (!dropped) {
      env.emplace_back(entry);
    }
  }
  env.insert(env.end(), add.begin(), add.end());
  return env;
}

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev == nullptr) {
    return fmt::format("signal {}", sig);
  }
  return fmt::format("SIG{}", abbrev);
}

}  // namespace leasehold::cli
