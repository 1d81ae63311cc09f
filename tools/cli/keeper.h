// File: tools/cli/keeper.h
//
// The keeper: the process forked first, which starts the command, holds the containment open,
// applies the kill schedule it is sent and reports the command's end (see supervisor.h).

#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>

#include "child_env.h"
#include "exit_codes.h"
#include "proc_walk.h"

namespace leasehold::cli {

// Everything the keeper and the command use, prepared before the fork.
struct KeeperArgs {
  Containment mode = Containment::kGroup;
  bool direct_only = false;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  sigset_t child_mask{};
  int ctl_read = -1;
  int report_write = -1;
  int exec_write = -1;
  int cgroup_procs_write = -1;
  int cgroup_procs_read = -1;
  int cgroup_kill = -1;
  const char* cgroup_dir = nullptr;  // the leaf, removed by the keeper if leasehold is gone
  int holder_liveness_fd = -1;       // kept open by the keeper until it exits
  ProcEntry* table = nullptr;
  pid_t* tree = nullptr;
};

// The keeper process's body: starts the command and serves the protocol until the tree is gone.
// Never returns. Async-signal-safe: called in the child of a raw fork.
[[noreturn]] void RunKeeper(const KeeperArgs& args);

}  // namespace leasehold::cli
