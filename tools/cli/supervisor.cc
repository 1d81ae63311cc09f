// File: tools/cli/supervisor.cc
//
// The keeper (KeeperMain) and the command (CommandMain) run in processes forked from a
// multi-threaded leasehold and never call malloc, locks or stdio: system calls only, on
// buffers the Supervisor allocated before the fork. Forks are raw clone() system calls, so no
// library's pthread_atfork handler runs in a child.

#include "supervisor.h"

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

namespace leasehold::cli {

namespace {

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
constexpr int kProcTableCap = 1 << 15;
// Upper bound of one tree walk's result.
constexpr int kTreeCap = 1 << 14;
// Rounds of "find and SIGKILL" before a group/cgroup kill gives up on a tree that forks faster.
constexpr int kKillRounds = 200;

// ---- async-signal-safe helpers (used in the keeper and the command, and from leasehold) ---------

pid_t RawFork(unsigned long flags) {
  // clone(flags, newsp = 0: the child runs on a copy of this stack, like fork()).
  return static_cast<pid_t>(
      ::syscall(SYS_clone, flags | SIGCHLD, nullptr, nullptr, nullptr, nullptr));
}

bool WriteAll(int fd, const void* data, std::size_t len) {
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
bool SendMessage(int fd, const Message& m) {
  for (;;) {
    ssize_t n = ::send(fd, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    return n == static_cast<ssize_t>(sizeof m);
  }
}

// Reads exactly one Message; returns 1, 0 at EOF, -1 if none is ready (or on error).
int ReadMessage(int fd, Message& m) {
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
char* PutInt(char* p, long long v) {
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

long long NowBootNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

struct ProcEntry {
  pid_t pid;
  pid_t ppid;
};

// Reads the pid and parent of every live (not zombie) process from /proc; returns the count.
int ReadProcTable(ProcEntry* table, int cap) {
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
int Descendants(pid_t root, ProcEntry* table, int table_cap, pid_t* out, int out_cap) {
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
int SignalCgroupProcs(int procs_fd, int sig) {
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

[[noreturn]] void CommandMain(const KeeperArgs& a, pid_t keeper) {
  auto fail = [&a](std::int32_t stage, int err) {
    ExecFailure f{stage, err};
    WriteAll(a.exec_write, &f, sizeof f);
    ::_exit(stage == kStageExec && err == ENOENT ? kExitCommandNotFound : kExitCannotExecute);
  };
  if (a.mode == Containment::kCgroup && !WriteAll(a.cgroup_procs_write, "0", 1)) {
    fail(kStageCgroup, errno);
  }
  if (!a.direct_only) {
    ::setpgid(0, 0);
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The keeper may have died before the request took effect: then nobody guards the lease.
  if (::getppid() != keeper) {
    ::_exit(kExitLeaseLost);
  }
  ::sigprocmask(SIG_SETMASK, &a.child_mask, nullptr);
  ::execvpe(a.argv[0], a.argv, a.envp);
  fail(kStageExec, errno);
  ::_exit(kExitCannotExecute);  // not reached
}

// Closes every descriptor but 0-2 and the ones the keeper uses (the store's sockets, files and
// signalfd of leasehold must not be held open by the keeper after leasehold is gone), and the
// holder liveness lock, which it holds for the tree.
void CloseOthers(const KeeperArgs& a) {
  int keep[] = {a.ctl_read,          a.report_write, a.exec_write,        a.cgroup_procs_write,
                a.cgroup_procs_read, a.cgroup_kill,  a.holder_liveness_fd};
  std::sort(std::begin(keep), std::end(keep));
  unsigned int next = 3;
  for (int fd : keep) {
    if (fd < static_cast<int>(next)) {
      continue;
    }
    if (static_cast<unsigned int>(fd) > next) {
      ::syscall(SYS_close_range, next, static_cast<unsigned int>(fd) - 1, 0);
    }
    next = static_cast<unsigned int>(fd) + 1;
  }
  ::syscall(SYS_close_range, next, ~0U, 0);
}

class Keeper {
 public:
  explicit Keeper(const KeeperArgs& a) : a_(a) {}

  [[noreturn]] void Main() {
    // In a PID namespace we are its init: when we die, the kernel kills every process in it,
    // but only after our descriptors are closed (do_exit closes files before it zaps the
    // namespace), which would end the holder liveness lock while the tree still runs. So we do
    // not die with leasehold: its end of the control socket closes, and we kill the tree and
    // exit once it is gone (HandleControl), as in the other modes.
    if (a_.mode != Containment::kPidNamespace) {
      ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    }
    ::setsid();
    CloseOthers(a_);
    sigset_t all;
    sigfillset(&all);
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sig_fd_ = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    timer_fd_ = ::timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK);
    // leasehold may have died before PDEATHSIG took effect: its end of the socket is closed.
    pollfd probe{a_.ctl_read, POLLIN, 0};
    if (::poll(&probe, 1, 0) == 1 && (probe.revents & POLLHUP) != 0) {
      ::_exit(0);
    }
    const pid_t self = static_cast<pid_t>(::syscall(SYS_getpid));
    command_ = RawFork(0);
    if (command_ == 0) {
      CommandMain(a_, self);
    }
    if (command_ < 0) {
      ExecFailure f{kStageExec, errno};
      WriteAll(a_.exec_write, &f, sizeof f);
      ::_exit(kExitInternal);
    }
    ::close(a_.exec_write);
    if (!a_.direct_only) {
      ::setpgid(command_, command_);  // as shells do: no race with the child's own call
    }
    Loop();
  }

 private:
  [[noreturn]] void Loop() {
    for (;;) {
      Reap();
      ArmTimer();
      pollfd fds[3] = {
          {ctl_open_ ? a_.ctl_read : -1, POLLIN, 0}, {sig_fd_, POLLIN, 0}, {timer_fd_, POLLIN, 0}};
      if (::poll(fds, 3, -1) < 0) {
        continue;  // EINTR: nothing is handled, everything is blocked
      }
      if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        HandleControl();
      }
      if ((fds[1].revents & POLLIN) != 0) {
        signalfd_siginfo info;
        while (::read(sig_fd_, &info, sizeof info) == sizeof info) {
        }
      }
      if ((fds[2].revents & POLLIN) != 0) {
        std::uint64_t ticks;
        (void)!::read(timer_fd_, &ticks, sizeof ticks);
        OnTimer();
      }
    }
  }

  void Reap() {
    for (;;) {
      int status = 0;
      pid_t p = ::waitpid(-1, &status, WNOHANG | __WALL);
      if (p > 0) {
        if (p == command_) {
          command_alive_ = false;
          Report(kOpCommandExited, status);
          if (a_.direct_only) {
            ::_exit(0);  // the old behaviour: the rest of the tree is left running
          }
        }
        continue;
      }
      if (p < 0 && errno == EINTR) {
        continue;
      }
      if (p < 0 && errno == ECHILD) {
        // The tree is empty: a subreaper without children has no descendants.
        if (!ctl_open_ && a_.cgroup_dir != nullptr) {
          RemoveLeaf();  // leasehold is gone and cannot
        }
        ::_exit(0);
      }
      return;
    }
  }

  void HandleControl() {
    Message m;
    int r = 0;
    while ((r = ReadMessage(a_.ctl_read, m)) == 1) {
      switch (m.op) {
        case kOpSignalGroup:
          if (a_.direct_only) {
            SignalCommand(m.arg);
          } else {
            ::kill(-command_, m.arg);
          }
          break;
        case kOpSignalTree:
          SignalAll(m.arg);
          break;
        case kOpKillTree:
          KillAll();
          break;
        case kOpDeadline:
          if (!a_.direct_only) {
            term_at_ = m.a;
            kill_at_ = m.b;
            term_done_ = false;
            kill_done_ = false;
          }
          break;
        default:
          break;
      }
    }
    if (r == 0) {
      // EOF: leasehold is gone (exit, crash, kill -9). Nobody guards the lease now.
      ctl_open_ = false;
      if (a_.direct_only) {
        ::_exit(0);
      }
      // Then Reap exits once the tree is gone: only then may the liveness lock end.
      KillAll();
    }
  }

  void ArmTimer() {
    itimerspec spec{};
    long long at = 0;
    if (!term_done_ && term_at_ > 0) {
      at = term_at_;
    } else if (!kill_done_ && kill_at_ > 0) {
      at = kill_at_;
    }
    if (at > 0) {
      spec.it_value.tv_sec = static_cast<time_t>(at / 1'000'000'000LL);
      spec.it_value.tv_nsec = static_cast<long>(at % 1'000'000'000LL);
      if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) {
        spec.it_value.tv_nsec = 1;
      }
    }
    ::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
  }

  void OnTimer() {
    const long long now = NowBootNs();
    // Report first: in group mode KillAll reaps, and exits the keeper once the tree is empty.
    if (!kill_done_ && kill_at_ > 0 && now >= kill_at_) {
      Report(kOpDeadlineFired, SIGKILL);
      kill_done_ = true;
      term_done_ = true;
      KillAll();
    } else if (!term_done_ && term_at_ > 0 && now >= term_at_) {
      Report(kOpDeadlineFired, SIGTERM);
      term_done_ = true;
      SignalAll(SIGTERM);
    }
  }

  void SignalCommand(int sig) {
    if (command_alive_) {
      ::kill(command_, sig);
    }
  }

  void SignalAll(int sig) {
    if (sig == SIGKILL) {
      KillAll();
      return;
    }
    switch (a_.mode) {
      case Containment::kPidNamespace:
        ::kill(-1, sig);  // every process of the namespace but its init
        return;
      case Containment::kCgroup:
        SignalCgroupProcs(a_.cgroup_procs_read, sig);
        return;
      default:
        if (a_.direct_only) {
          SignalCommand(sig);
          return;
        }
        ::kill(-command_, sig);
        SignalDescendants(sig);
        return;
    }
  }

  // Returns how many processes were signalled.
  int SignalDescendants(int sig) {
    const int n = Descendants(self_pid(), a_.table, kProcTableCap, a_.tree, kTreeCap);
    for (int i = 0; i < n; ++i) {
      ::kill(a_.tree[i], sig);
    }
    return n;
  }

  void KillAll() {
    if (a_.direct_only) {
      SignalCommand(SIGKILL);
      return;
    }
    switch (a_.mode) {
      case Containment::kPidNamespace:
        ::kill(-1, SIGKILL);
        return;
      case Containment::kCgroup:
        if (a_.cgroup_kill >= 0 && WriteAll(a_.cgroup_kill, "1", 1)) {
          return;
        }
        for (int round = 0; round < kKillRounds; ++round) {
          if (SignalCgroupProcs(a_.cgroup_procs_read, SIGKILL) == 0) {
            return;
          }
        }
        return;
      default:
        ::kill(-command_, SIGKILL);
        for (int round = 0; round < kKillRounds; ++round) {
          if (SignalDescendants(SIGKILL) == 0) {
            return;
          }
          Reap();
        }
        return;
    }
  }

  void Report(std::int32_t op, std::int32_t arg) {
    Message m{op, arg, 0, 0};
    SendMessage(a_.report_write, m);
  }

  static pid_t self_pid() { return static_cast<pid_t>(::syscall(SYS_getpid)); }

  // rmdir fails with EBUSY until the kernel has seen the leaf's last process go.
  void RemoveLeaf() {
    for (int i = 0; i < 200 && ::rmdir(a_.cgroup_dir) != 0 && errno == EBUSY; ++i) {
      timespec pause{0, 5'000'000};
      ::nanosleep(&pause, nullptr);
    }
  }

  const KeeperArgs& a_;
  int sig_fd_ = -1;
  int timer_fd_ = -1;
  pid_t command_ = -1;
  bool command_alive_ = true;
  bool ctl_open_ = true;
  long long term_at_ = 0;
  long long kill_at_ = 0;
  bool term_done_ = false;
  bool kill_done_ = false;
};

// ---- leasehold side ----------------------------------------------------------------------------

std::vector<char*> PointersTo(std::vector<std::string>& strings) {
  std::vector<char*> ptrs;
  ptrs.reserve(strings.size() + 1);
  for (std::string& s : strings) {
    ptrs.push_back(s.data());
  }
  ptrs.push_back(nullptr);
  return ptrs;
}

std::string ReadFirstLine(const std::string& path, std::string_view prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      return line;
    }
  }
  return {};
}

// Returns the mount point of the cgroup v2 hierarchy, or "".
std::string FindCgroup2Mount() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // "36 25 0:30 / /sys/fs/cgroup/unified rw,... shared:9 - cgroup2 cgroup2 rw"
    const std::size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) {
      continue;
    }
    std::size_t pos = 0;
    for (int field = 0; field < 4 && pos != std::string::npos; ++field) {
      pos = line.find(' ', pos + 1);
    }
    if (pos == std::string::npos) {
      continue;
    }
    const std::size_t end = line.find(' ', pos + 1);
    return line.substr(pos + 1, end - pos - 1);
  }
  return {};
}

std::string ErrnoText(int err) {
  return std::strerror(err);
}

// Everything a cgroup run needs, or why there is none.
struct CgroupLeaf {
  std::string dir;
  UniqueFd procs_write;
  UniqueFd procs_read;
  UniqueFd kill;
  std::string why_not;  // non-empty: not available
};

CgroupLeaf PrepareCgroup() {
  static int sequence = 0;
  CgroupLeaf leaf;
  const std::string mount = FindCgroup2Mount();
  if (mount.empty()) {
    leaf.why_not = "no cgroup v2 hierarchy is mounted";
    return leaf;
  }
  std::string own = ReadFirstLine("/proc/self/cgroup", "0::");
  if (own.size() < 3) {
    leaf.why_not = "this process is in no cgroup v2 group";
    return leaf;
  }
  own = own.substr(3);
  if (own == "/") {
    own.clear();
  }
  // The pid alone does not make the name unique: leasehold as PID 1 of a container's namespace
  // shares it with every other such container under the same parent.
  int made = -1;
  for (int attempt = 0; attempt < 100 && made != 0; ++attempt) {
    leaf.dir = fmt::format("{}{}/leasehold-{}-{}", mount, own, ::getpid(), ++sequence);
    made = ::mkdir(leaf.dir.c_str(), 0755);
    if (made != 0 && errno != EEXIST) {
      break;
    }
  }
  if (made != 0) {
    leaf.why_not = fmt::format("cannot create {}: {}", leaf.dir, ErrnoText(errno));
    leaf.dir.clear();
    return leaf;
  }
  leaf.procs_write = UniqueFd(::open((leaf.dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  leaf.procs_read = UniqueFd(::open((leaf.dir + "/cgroup.procs").c_str(), O_RDONLY | O_CLOEXEC));
  leaf.kill = UniqueFd(::open((leaf.dir + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC));
  if (!leaf.procs_write.valid() || !leaf.procs_read.valid()) {
    leaf.why_not = fmt::format("cannot open {}/cgroup.procs: {}", leaf.dir, ErrnoText(errno));
  } else {
    // A process may not be allowed to move into it (delegation, the no-internal-process rule):
    // find out with a throwaway child rather than with the command.
    const int fd = leaf.procs_write.get();
    pid_t probe = RawFork(0);
    if (probe == 0) {
      ::_exit(WriteAll(fd, "0", 1) ? 0 : (errno & 0x7f));
    }
    int status = 0;
    while (probe > 0 && ::waitpid(probe, &status, 0) < 0 && errno == EINTR) {
    }
    if (probe < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      leaf.why_not =
          fmt::format("cannot move a process into {}: {}", leaf.dir,
                      probe < 0 ? ErrnoText(errno)
                                : ErrnoText(WIFEXITED(status) ? WEXITSTATUS(status) : EINVAL));
    }
  }
  if (!leaf.why_not.empty()) {
    leaf.procs_write.Reset();
    leaf.procs_read.Reset();
    leaf.kill.Reset();
    ::rmdir(leaf.dir.c_str());
    leaf.dir.clear();
  }
  return leaf;
}

std::string Guarantee(Containment mode) {
  switch (mode) {
    case Containment::kCgroup:
      return "every process the command starts stays in the group, setsid daemons included; "
             "kill -9 of leasehold makes its keeper kill the whole group";
    case Containment::kPidNamespace:
      return "every process the command starts stays in the namespace; if leasehold dies, its "
             "keeper kills them all, and if the keeper dies, the kernel does (the command sees "
             "namespace PIDs)";
    default:
      return "the command's process group and every descendant found under the keeper are "
             "signalled; a process of the tree that outlives the keeper escapes";
  }
}

}  // namespace

std::string_view ContainmentName(Containment mode) {
  switch (mode) {
    case Containment::kAuto:
      return "auto";
    case Containment::kCgroup:
      return "cgroup";
    case Containment::kPidNamespace:
      return "pidns";
    case Containment::kGroup:
      return "group";
  }
  return "?";
}

Result<Containment> ParseContainment(std::string_view text) {
  for (Containment mode : {Containment::kAuto, Containment::kCgroup, Containment::kPidNamespace,
                           Containment::kGroup}) {
    if (text == ContainmentName(mode)) {
      return mode;
    }
  }
  return Status::InvalidArgument(
      fmt::format("--contain '{}': expected auto, cgroup, pidns or group", text));
}

// The buffers the keeper walks, allocated once per process before any fork.
struct WalkBuffers {
  std::vector<ProcEntry> table = std::vector<ProcEntry>(kProcTableCap);
  std::vector<pid_t> tree = std::vector<pid_t>(kTreeCap);
};

WalkBuffers& Buffers() {
  static WalkBuffers* buffers = new WalkBuffers();  // never freed: forked keepers use it
  return *buffers;
}

Result<std::unique_ptr<Supervisor>> Supervisor::Start(SupervisorOptions options) {
  std::unique_ptr<Supervisor> sup(new Supervisor());
  sup->direct_only_ = options.unsafe_direct_child_only;
  std::vector<char*> argv = PointersTo(options.argv);
  std::vector<char*> envp = PointersTo(options.env);
  WalkBuffers& buffers = Buffers();

  // leasehold too is a subreaper: if the keeper is killed, its orphans come to us, not init.
  if (!sup->direct_only_) {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }

  std::vector<Containment> candidates;
  if (sup->direct_only_) {
    candidates = {Containment::kGroup};
  } else if (options.contain == Containment::kAuto) {
    candidates = {Containment::kCgroup, Containment::kPidNamespace, Containment::kGroup};
  } else {
    candidates = {options.contain};
  }
  std::string fallbacks;
  for (Containment mode : candidates) {
    CgroupLeaf leaf;
    if (mode == Containment::kCgroup) {
      leaf = PrepareCgroup();
      if (!leaf.why_not.empty()) {
        if (options.contain == Containment::kCgroup) {
          return Status::Unimplemented(
              fmt::format("--contain=cgroup is not available here: {}", leaf.why_not));
        }
        fallbacks += fmt::format("{}no cgroup: {}", fallbacks.empty() ? "" : "; ", leaf.why_not);
        continue;
      }
    }
    // Non-blocking both ways: the keeper drains its control socket until EAGAIN, and leasehold
    // never blocks on a keeper that does not read (a kill is then done from here).
    int ctl[2];
    int report[2];
    int exec[2];
    constexpr int kSocket = SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK;
    if (::socketpair(AF_UNIX, kSocket, 0, ctl) != 0 ||
        ::socketpair(AF_UNIX, kSocket, 0, report) != 0 || ::pipe2(exec, O_CLOEXEC) != 0) {
      return Status::Internal(fmt::format("socketpair/pipe2: {}", ErrnoText(errno)));
    }
    KeeperArgs args;
    args.mode = mode;
    args.direct_only = sup->direct_only_;
    args.argv = argv.data();
    args.envp = envp.data();
    args.child_mask = options.child_mask;
    args.ctl_read = ctl[0];
    args.report_write = report[1];
    args.exec_write = exec[1];
    args.cgroup_procs_write = leaf.procs_write.get();
    args.cgroup_procs_read = leaf.procs_read.get();
    args.cgroup_kill = leaf.kill.get();
    args.cgroup_dir = leaf.dir.empty() ? nullptr : leaf.dir.c_str();
    args.holder_liveness_fd = options.holder_liveness_fd;
    args.table = buffers.table.data();
    args.tree = buffers.tree.data();
    const pid_t keeper = RawFork(mode == Containment::kPidNamespace ? CLONE_NEWPID : 0);
    if (keeper == 0) {
      Keeper(args).Main();
    }
    const int fork_errno = errno;
    ::close(ctl[0]);
    ::close(report[1]);
    ::close(exec[1]);
    if (keeper < 0) {
      ::close(ctl[1]);
      ::close(report[0]);
      ::close(exec[0]);
      if (!leaf.dir.empty()) {
        ::rmdir(leaf.dir.c_str());
      }
      if (mode == Containment::kPidNamespace && options.contain == Containment::kAuto) {
        fallbacks += fmt::format("{}no PID namespace: {}", fallbacks.empty() ? "" : "; ",
                                 ErrnoText(fork_errno));
        continue;
      }
      if (mode == Containment::kPidNamespace) {
        return Status::Unimplemented(
            fmt::format("--contain=pidns is not available here: clone(CLONE_NEWPID): {}",
                        ErrnoText(fork_errno)));
      }
      return Status::Internal(fmt::format("fork: {}", ErrnoText(fork_errno)));
    }
    sup->mode_ = mode;
    sup->keeper_pid_ = keeper;
    sup->ctl_fd_ = UniqueFd(ctl[1]);
    sup->report_fd_ = UniqueFd(report[0]);
    sup->cgroup_dir_ = leaf.dir;
    sup->cgroup_kill_fd_ = std::move(leaf.kill);
    sup->cgroup_procs_fd_ = std::move(leaf.procs_read);
    // EOF: the command exec'd (the pipe closed on exec) or never started; a record: it failed.
    ExecFailure failure;
    ssize_t n = 0;
    do {
      n = ::read(exec[0], &failure, sizeof failure);
    } while (n < 0 && errno == EINTR);
    ::close(exec[0]);
    if (n == static_cast<ssize_t>(sizeof failure)) {
      if (failure.stage == kStageCgroup) {
        return Status::Internal(fmt::format("the command could not join {}: {}", sup->cgroup_dir_,
                                            ErrnoText(failure.err)));
      }
      sup->exec_errno_ = failure.err != 0 ? failure.err : ENOEXEC;
    }
    sup->mode_note_ =
        fmt::format("{}{}{}: {}", ContainmentName(mode),
                    mode == Containment::kCgroup ? " " + sup->cgroup_dir_ : "",
                    fallbacks.empty() ? "" : " (" + fallbacks + ")",
                    sup->direct_only_ ? "UNSAFE test-only switch LEASEHOLD_TEST_UNSAFE_DIRECT_"
                                        "CHILD_ONLY: only the command's own process is guarded"
                                      : Guarantee(mode));
    return sup;
  }
  return Status::Internal("no containment could be started");  // kGroup always can
}

Supervisor::~Supervisor() {
  if (keeper_pid_ > 0 && !keeper_reaped_) {
    KillTree();
    ctl_fd_.Reset();  // EOF: the keeper kills what is left and exits
    for (int i = 0; i < 1000 && !keeper_reaped_; ++i) {
      Update();
      if (!keeper_reaped_) {
        ::usleep(1000);
      }
    }
    if (!keeper_reaped_) {
      ::kill(keeper_pid_, SIGKILL);
      int status = 0;
      while (::waitpid(keeper_pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  if (!cgroup_dir_.empty()) {
    // The leaf empties as its last processes are reaped; rmdir fails (EBUSY) until then.
    for (int i = 0; i < 200 && ::rmdir(cgroup_dir_.c_str()) != 0 && errno == EBUSY; ++i) {
      ::usleep(5000);
    }
  }
}

void Supervisor::Update() {
  Message m;
  while (ReadMessage(report_fd_.get(), m) == 1) {
    if (m.op == kOpCommandExited) {
      command_exited_ = true;
      command_status_ = m.arg;
    } else if (m.op == kOpDeadlineFired) {
      deadline_signal_ = deadline_signal_ == SIGKILL ? SIGKILL : m.arg;  // SIGKILL is the last word
    }
  }
  // Reap the keeper, and any orphan that came to us because it died.
  for (;;) {
    int status = 0;
    pid_t p = ::waitpid(-1, &status, WNOHANG | __WALL);
    if (p < 0 && errno == EINTR) {
      continue;
    }
    if (p <= 0) {
      break;
    }
    if (p == keeper_pid_) {
      keeper_reaped_ = true;
      keeper_status_ = status;
      while (ReadMessage(report_fd_.get(), m) == 1) {  // what it wrote before it died
        if (m.op == kOpCommandExited) {
          command_exited_ = true;
          command_status_ = m.arg;
        } else if (m.op == kOpDeadlineFired) {
          deadline_signal_ =
              deadline_signal_ == SIGKILL ? SIGKILL : m.arg;  // SIGKILL is the last word
        }
      }
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !direct_only_) {
        // The keeper was killed: whatever it guarded must go now.
        KillTreeDirectly();
      }
    }
  }
}

int Supervisor::ShellExitCode() const {
  if (!command_exited_) {
    return kExitInternal;
  }
  if (WIFEXITED(command_status_)) {
    return WEXITSTATUS(command_status_);
  }
  if (WIFSIGNALED(command_status_)) {
    return kExitSignalBase + WTERMSIG(command_status_);
  }
  return kExitInternal;
}

std::string Supervisor::DescribeExit() const {
  if (!command_exited_) {
    return WIFSIGNALED(keeper_status_)
               ? fmt::format("is gone: leasehold's keeper process was killed by {}",
                             SignalName(WTERMSIG(keeper_status_)))
               : std::string("is gone: leasehold's keeper process ended before it");
  }
  if (WIFSIGNALED(command_status_)) {
    return fmt::format("was killed by {}", SignalName(WTERMSIG(command_status_)));
  }
  return fmt::format("exited with code {}", ShellExitCode());
}

int Supervisor::CountLeft() const {
  if (keeper_pid_ <= 0) {
    return 0;
  }
  std::vector<ProcEntry> table(kProcTableCap);
  std::vector<pid_t> tree(kTreeCap);
  const pid_t root = keeper_reaped_ ? ::getpid() : keeper_pid_;
  return Descendants(root, table.data(), kProcTableCap, tree.data(), kTreeCap);
}

void Supervisor::Send(int op, int arg, long long value) {
  Message m{op, arg, value, 0};
  if (op == kOpDeadline) {
    m.a = sent_term_ns_;
    m.b = sent_kill_ns_;
  }
  if (keeper_reaped_ || !ctl_fd_.valid() || !SendMessage(ctl_fd_.get(), m)) {
    if (op == kOpDeadline) {
      sent_term_ns_ = sent_kill_ns_ = -1;  // not delivered: send again next time
    }
    if (op == kOpKillTree || (op == kOpSignalTree && arg == SIGKILL)) {
      KillTreeDirectly();
    } else if (op == kOpSignalTree || op == kOpSignalGroup) {
      if (mode_ == Containment::kCgroup) {
        SignalCgroupProcs(cgroup_procs_fd_.get(), arg);
      }
    }
  }
}

void Supervisor::SignalGroup(int sig) {
  Send(kOpSignalGroup, sig, 0);
}

void Supervisor::SignalTree(int sig) {
  if (sig == SIGKILL) {
    KillTree();
    return;
  }
  Send(kOpSignalTree, sig, 0);
}

void Supervisor::KillTree() {
  if (direct_only_) {
    Send(kOpKillTree, 0, 0);
    return;
  }
  if (mode_ == Containment::kCgroup) {
    KillTreeDirectly();  // one write, atomic against forks
  }
  Send(kOpKillTree, 0, 0);
  if (mode_ == Containment::kGroup) {
    KillTreeDirectly();
  }
}

void Supervisor::KillTreeDirectly() {
  if (direct_only_) {
    return;
  }
  switch (mode_) {
    case Containment::kCgroup:
      if (cgroup_kill_fd_.valid() && WriteAll(cgroup_kill_fd_.get(), "1", 1)) {
        return;
      }
      for (int round = 0; round < kKillRounds; ++round) {
        if (SignalCgroupProcs(cgroup_procs_fd_.get(), SIGKILL) == 0) {
          return;
        }
      }
      return;
    case Containment::kPidNamespace:
      if (!keeper_reaped_) {
        ::kill(keeper_pid_, SIGKILL);  // the kernel kills the namespace with its init
      }
      return;
    default: {
      // Under the keeper while it lives; under us (the orphans' subreaper) once it is gone.
      std::vector<ProcEntry> table(kProcTableCap);
      std::vector<pid_t> tree(kTreeCap);
      for (int round = 0; round < kKillRounds; ++round) {
        const pid_t root = keeper_reaped_ ? ::getpid() : keeper_pid_;
        const int n = Descendants(root, table.data(), kProcTableCap, tree.data(), kTreeCap);
        if (n == 0) {
          return;
        }
        for (int i = 0; i < n; ++i) {
          ::kill(tree[i], SIGKILL);
        }
        if (keeper_reaped_) {
          int status = 0;
          while (::waitpid(-1, &status, WNOHANG | __WALL) > 0) {
          }
        }
      }
      return;
    }
  }
}

void Supervisor::SetDeadline(SteadyTime term_at, SteadyTime kill_at) {
  const long long term_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(term_at.time_since_epoch()).count();
  const long long kill_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(kill_at.time_since_epoch()).count();
  if (term_ns == sent_term_ns_ && kill_ns == sent_kill_ns_) {
    return;
  }
  sent_term_ns_ = term_ns;
  sent_kill_ns_ = kill_ns;
  Send(kOpDeadline, 0, 0);
}

}  // namespace leasehold::cli
