// File: tools/cli/keeper.cc
//
// The keeper (Keeper::Main) and the command (CommandMain) run in processes forked from a
// multi-threaded leasehold and never call malloc, locks or stdio: system calls only, on
// buffers the Supervisor allocated before the fork.

#include "keeper.h"

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

}  // namespace

void RunKeeper(const KeeperArgs& args) {
  Keeper(args).Main();
}

}  // namespace leasehold::cli
