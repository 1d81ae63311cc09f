// File: tools/cli/keeper_protocol.h
//
// The keeper's wire protocol (fixed 24-byte messages on a SOCK_SEQPACKET pair) and the
// async-signal-safe helpers the keeper, the command and leasehold share: raw fork, whole writes,
// the boot clock. System calls only: they run in processes forked from a multi-threaded
// leasehold.

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
#include "supervisor.h"

namespace leasehold::cli {

// ---- the keeper protocol: fixed 24-byte messages on a SOCK_SEQPACKET pair (one message per
// send, EOF when the peer is gone, and MSG_NOSIGNAL: no SIGPIPE for a caller that does not
// block it) --------------------------------------------------------------------------------------

enum Op : std::int32_t {
  // leasehold -> keeper
  kOpSignalGroup = 1,  // arg: signal; to the command's process group
  kOpSignalTree = 2,   // arg: signal; to every process of the tree
  kOpKillTree = 3,     // SIGKILL to every process of the tree
  // a: term_at, b: kill_at (CLOCK_BOOTTIME ns, as leasehold reads it: the keeper is its fork,
  // so both are in one time namespace and need no host clock, unlike the sqlite store's file)
  kOpDeadline = 4,
  // keeper -> leasehold
  kOpCommandExited = 10,  // arg: wait status
  kOpDeadlineFired = 11,  // arg: SIGTERM (at term_at) or SIGKILL (at kill_at) sent to the tree
};

struct Message {
  std::int32_t op = 0;
  std::int32_t arg = 0;
  std::int64_t a = 0;
  std::int64_t b = 0;
};

static_assert(sizeof(Message) == 24);

// What the command reports through the exec pipe when it cannot start.
enum Stage : std::int32_t { kStageCgroup = 1, kStageExec = 2 };

struct ExecFailure {
  std::int32_t stage = 0;
  std::int32_t err = 0;
};

// Upper bound of the /proc table the keeper walks (processes on the host, not in the tree).
inline constexpr int kProcTableCap = 1 << 15;
// Upper bound of one tree walk's result.
inline constexpr int kTreeCap = 1 << 14;
// Rounds of "find and SIGKILL" before a group/cgroup kill gives up on a tree that forks faster.
inline constexpr int kKillRounds = 200;

// ---- async-signal-safe helpers (used in the keeper and the command, and from leasehold) ---------

inline pid_t RawFork(unsigned long flags) {
  // clone(flags, newsp = 0: the child runs on a copy of this stack, like fork()).
  return static_cast<pid_t>(
      ::syscall(SYS_clone, flags | SIGCHLD, nullptr, nullptr, nullptr, nullptr));
}

inline bool WriteAll(int fd, const void* data, std::size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return false;
    }
    p += n;
    len -= static_cast<std::size_t>(n);
  }
  return true;
}

// Sends one Message without blocking; false if it could not (peer gone, buffer full).
inline bool SendMessage(int fd, const Message& m) {
  for (;;) {
    ssize_t n = ::send(fd, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    return n == static_cast<ssize_t>(sizeof m);
  }
}

// Reads exactly one Message; returns 1, 0 at EOF, -1 if none is ready (or on error).
inline int ReadMessage(int fd, Message& m) {
  for (;;) {
    ssize_t n = ::read(fd, &m, sizeof m);
    if (n == static_cast<ssize_t>(sizeof m)) {
      return 1;
    }
    if (n == 0) {
      return 0;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    return -1;
  }
}

// Writes the decimal digits of v at p; returns the end.
inline char* PutInt(char* p, long long v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  while (n > 0) {
    *p++ = tmp[--n];
  }
  return p;
}

inline long long NowBootNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

}  // namespace leasehold::cli
