// File: tools/cli/proc_walk.h
//
// The process tree read from /proc and signalled, async-signal-safe (no malloc: the tables are
// the caller's, allocated before the fork), and the members of a cgroup signalled.

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
#include "keeper_protocol.h"

namespace leasehold::cli {

struct ProcEntry {
  pid_t pid;
  pid_t ppid;
};

// Reads the pid and parent of every live (not zombie) process from /proc; returns the count.
inline int ReadProcTable(ProcEntry* table, int cap) {
  int dir = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    return 0;
  }
  int n = 0;
  alignas(8) char buf[8192];
  for (;;) {
    long got = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (got <= 0) {
      break;
    }
    for (long off = 0; off < got;) {
      auto* d = reinterpret_cast<dirent64*>(buf + off);
      off += d->d_reclen;
      long long pid = 0;
      const char* c = d->d_name;
      for (; *c >= '0' && *c <= '9'; ++c) {
        pid = pid * 10 + (*c - '0');
      }
      if (*c != '\0' || pid <= 0 || n >= cap) {
        continue;
      }
      char path[48] = "/proc/";
      char* e = PutInt(path + 6, pid);
      std::memcpy(e, "/stat", 6);
      int fd = ::open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        continue;
      }
      char stat[512];
      ssize_t len = ::read(fd, stat, sizeof stat - 1);
      ::close(fd);
      if (len <= 0) {
        continue;
      }
      stat[len] = '\0';
      // "pid (comm) S ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
      char* close_paren = nullptr;
      for (char* q = stat; *q != '\0'; ++q) {
        if (*q == ')') {
          close_paren = q;
        }
      }
      if (close_paren == nullptr || close_paren[1] != ' ' || close_paren[2] == '\0') {
        continue;
      }
      const char state = close_paren[2];
      if (state == 'Z' || state == 'X') {
        continue;
      }
      long long ppid = 0;
      for (const char* q = close_paren + 4; *q >= '0' && *q <= '9'; ++q) {
        ppid = ppid * 10 + (*q - '0');
      }
      table[n++] = ProcEntry{static_cast<pid_t>(pid), static_cast<pid_t>(ppid)};
    }
  }
  ::close(dir);
  return n;
}

// Fills `out` with the live descendants of `root` (not root itself); returns the count.
inline int Descendants(pid_t root, ProcEntry* table, int table_cap, pid_t* out, int out_cap) {
  const int n = ReadProcTable(table, table_cap);
  int count = 0;
  bool grew = true;
  while (grew) {
    grew = false;
    for (int i = 0; i < n; ++i) {
      if (table[i].pid == 0) {
        continue;  // already taken
      }
      bool parent_in = table[i].ppid == root;
      for (int j = 0; j < count && !parent_in; ++j) {
        parent_in = out[j] == table[i].ppid;
      }
      if (parent_in && count < out_cap) {
        out[count++] = table[i].pid;
        table[i].pid = 0;
        grew = true;
      }
    }
  }
  return count;
}

// Sends `sig` to every pid listed in a cgroup.procs file; returns how many were listed.
inline int SignalCgroupProcs(int procs_fd, int sig) {
  if (procs_fd < 0 || ::lseek(procs_fd, 0, SEEK_SET) < 0) {
    return 0;
  }
  int listed = 0;
  long long pid = 0;
  bool in_number = false;
  char buf[4096];
  for (;;) {
    ssize_t got = ::read(procs_fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got <= 0) {
      break;
    }
    for (ssize_t i = 0; i < got; ++i) {
      if (buf[i] >= '0' && buf[i] <= '9') {
        pid = pid * 10 + (buf[i] - '0');
        in_number = true;
      } else if (in_number) {
        ::kill(static_cast<pid_t>(pid), sig);
        ++listed;
        pid = 0;
        in_number = false;
      }
    }
  }
  if (in_number) {
    ::kill(static_cast<pid_t>(pid), sig);
    ++listed;
  }
  return listed;
}

}  // namespace leasehold::cli
