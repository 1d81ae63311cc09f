// File: tests/testing/spawned_process.h
//
// SpawnedProcess: a child process (e.g. tests/backends/conformance/lease_holder) whose stdout a
// test reads line by line. The destructor kills (SIGKILL) and reaps it if it is still running.
//
// Thread safety: not thread-safe; one test thread.

#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <sys/wait.h>

extern char** environ;

namespace leasehold::testing {

class SpawnedProcess {
 public:
  // Starts args[0] (a path) with args; its stdout goes to a pipe read by ReadLine().
  explicit SpawnedProcess(const std::vector<std::string>& args) {
    int fds[2];
    // Close-on-exec: a child spawned meanwhile by another thread must not inherit this pipe's
    // write end (its EOF would then wait for that other child to exit).
    if (pipe2(fds, O_CLOEXEC) != 0) {
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<char*> argv;
    for (const auto& a : args) {
      argv.push_back(const_cast<char*>(a.c_str()));
    }
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }

  SpawnedProcess(const SpawnedProcess&) = delete;
  SpawnedProcess& operator=(const SpawnedProcess&) = delete;
  SpawnedProcess(SpawnedProcess&&) = delete;
  SpawnedProcess& operator=(SpawnedProcess&&) = delete;

  ~SpawnedProcess() {
    if (pid_ > 0 && !reaped_) {
      Kill9();
    }
    if (out_ != nullptr) {
      fclose(out_);
    }
  }

  // Returns the next line of output without its newline ("" at end of output).
  std::string ReadLine() {
    char buf[512];
    if (out_ == nullptr || fgets(buf, sizeof(buf), out_) == nullptr) {
      return "";
    }
    std::string line(buf);
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
    }
    return line;
  }

  // Waits for the process; returns its exit code, or 128+signal.
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Kills the process with SIGKILL and reaps it.
  void Kill9() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      (void)Wait();
    }
  }

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  bool reaped_ = false;
};

}  // namespace leasehold::testing
