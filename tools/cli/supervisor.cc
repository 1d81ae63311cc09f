// File: tools/cli/supervisor.cc
//
// The parent side: Supervisor starts the keeper (keeper.h) with everything it needs prepared
// before the fork, then talks to it (keeper_protocol.h). Forks are raw clone() system calls, so
// no library's pthread_atfork handler runs in a child. The cgroup leaf: cgroup_leaf.h; the
// process tree: proc_walk.h.

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

#include "cgroup_leaf.h"
#include "child_env.h"
#include "exit_codes.h"
#include "keeper.h"

namespace leasehold::cli {

namespace {

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
      RunKeeper(args);
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
