// File: tests/testing/server_process.h
//
// The parts every throwaway-server fixture (redis_server, postgres_server, and the etcd and
// ZooKeeper ones) shares: a free loopback port, fork + exec of a server that dies with the test
// process, a bounded wait until it answers, stop by PID, and running a client command.
//
// Example:
//
//   int port = PickFreeLoopbackPort({2379, 2380});
//   LH_ASSIGN_OR_RETURN(pid_t pid, SpawnServer({"/usr/bin/etcd", ...}, dir + "/etcd.log"));
//   LH_RETURN_IF_ERROR(AwaitReady(pid, [&] { return Probe(port); }, 10s, dir + "/etcd.log",
//                                 "etcd"));
//   StopPid(pid, SIGKILL);
//
// Thread safety: free functions without shared state.

#pragma once

#include <chrono>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

#include "leasehold/status.h"

namespace leasehold::testing {

// Returns a TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close),
// never one of `avoid` (the store's well-known ports, so a test never meets a system instance).
int PickFreeLoopbackPort(std::initializer_list<int> avoid = {6379});

// Who the server runs as: root must run PostgreSQL as the `postgres` user.
struct RunAs {
  bool drop = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Forks and execs args (args[0] is an absolute path), stdout and stderr appended to `log`,
// optionally as `who`. The child gets SIGKILL when the calling process dies
// (PR_SET_PDEATHSIG). Returns the child's pid.
Result<pid_t> SpawnServer(const std::vector<std::string>& args, const std::string& log,
                          const RunAs& who = {});

// Polls `ready` every 20 ms until it returns true (OK), the process exits (kUnavailable with the
// tail of `log`; pid becomes -1) or `timeout` passes (kUnavailable with the log tail; the
// process is left running for the caller to stop).
Status AwaitReady(pid_t& pid, const std::function<bool()>& ready, std::chrono::milliseconds timeout,
                  const std::string& log, std::string_view what);

// Sends SIGCONT (a paused server cannot die of SIGTERM) and `first_signal`, waits up to `grace`
// for the process to exit, then SIGKILLs and reaps it. pid becomes -1. No-op if pid <= 0.
void StopPid(pid_t& pid, int first_signal,
             std::chrono::milliseconds grace = std::chrono::milliseconds(5000));

// Returns the last `max_bytes` of a file (for error messages about a server that failed).
std::string TailFile(const std::string& path, std::size_t max_bytes = 800);

// True if a server's log says it could not bind a port ("Address already in use", Java's
// BindException): a port picked free was taken by another test's server meanwhile, and the
// caller may retry on new ports.
bool LogShowsPortInUse(const std::string& path);

// Quotes one argument for /bin/sh.
std::string ShellQuote(std::string_view arg);

// Runs a shell command line (stderr merged into stdout) and returns its output without the
// trailing newlines; kUnavailable with the output if it exits non-zero. Bound the command
// yourself (e.g. prefix `timeout 5`).
Result<std::string> RunCommand(const std::string& command_line);

}  // namespace leasehold::testing
