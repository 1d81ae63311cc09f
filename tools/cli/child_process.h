// File: tools/cli/child_process.h
//
// ChildProcess: the command that `leasehold run` supervises. Everything the child needs (argv,
// envp) is built before fork(), so that the child runs only async-signal-safe calls between
// fork() and exec: another thread (the heartbeat) may hold the malloc lock at fork time.
//
// Between fork and exec the child asks for SIGKILL when its parent thread dies
// (PR_SET_PDEATHSIG), so a `kill -9` of leasehold takes the command with it; it then checks
// that the parent did not die before the request took effect, restores the caller's signal
// mask and execs. An exec failure is reported back through a close-on-exec pipe, so Start()
// can tell "running" from "not found" the way a shell does.
//
// Example:
//
//   ChildProcess child({"sleep", "3"}, {"LEASEHOLD_KEY=job"});
//   if (int err = child.Start(saved_mask); err != 0) { ... strerror(err) ... }
//   child.Signal(SIGTERM);
//   while (!child.TryReap()) { ... wait for SIGCHLD ... }
//   return child.ShellExitCode();
//
// PDEATHSIG follows the thread that forked, so call Start() from the thread that lives longest
// (the main thread).
//
// Thread safety: not thread-safe; confine to one thread.

#pragma once

#include <signal.h>

#include <string>
#include <vector>

#include <sys/types.h>

namespace leasehold::cli {

class ChildProcess {
 public:
  // Prepares to run argv[0] (searched in $PATH) with `argv` and the environment `env`
  // ("NAME=value" strings). REQUIRES: !argv.empty().
  ChildProcess(std::vector<std::string> argv, std::vector<std::string> env);

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ChildProcess(ChildProcess&&) = delete;
  ChildProcess& operator=(ChildProcess&&) = delete;

  // Kills (SIGKILL) and reaps a child that is still running: no orphan outlives leasehold.
  ~ChildProcess();

  // Forks and execs; the child starts with `child_mask` as its signal mask. Returns 0 once the
  // exec succeeded, else the errno of the failed fork or exec (the child is then reaped).
  int Start(const sigset_t& child_mask);

  // Returns the child's pid; -1 before Start().
  [[nodiscard]] pid_t pid() const { return pid_; }

  // Returns true between a successful Start() and the reaping of the child.
  [[nodiscard]] bool running() const { return pid_ > 0 && !reaped_; }

  // Sends `sig` to the child if it is still running (never to a reaped, possibly reused pid).
  void Signal(int sig);

  // Reaps the child if it has exited, without blocking. Returns true once it is reaped.
  bool TryReap();

  // Returns the child's exit code as a shell reports it: its own code, or 128+N for death by
  // signal N. REQUIRES: reaped.
  [[nodiscard]] int ShellExitCode() const;

  // Returns "exited with code 3" or "killed by SIGKILL". REQUIRES: reaped.
  [[nodiscard]] std::string DescribeExit() const;

 private:
  // Immutable after construction: owned strings and the pointer arrays into them.
  std::vector<std::string> argv_;
  std::vector<std::string> env_;
  std::vector<char*> argv_ptrs_;
  std::vector<char*> env_ptrs_;

  pid_t pid_ = -1;
  bool reaped_ = false;
  int wait_status_ = 0;
};

// Returns the current environment without any variable named in `drop`, plus `add`.
std::vector<std::string> BuildChildEnvironment(const std::vector<std::string>& drop,
                                               const std::vector<std::string>& add);

// Returns "SIGTERM" for SIGTERM, "signal 42" for an unnamed one.
std::string SignalName(int sig);

}  // namespace leasehold::cli
