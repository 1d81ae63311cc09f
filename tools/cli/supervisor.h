// File: tools/cli/supervisor.h
//
// Supervisor: runs the command of `leasehold run` / `elect` as a process TREE that leasehold
// controls as a whole (the README's "The process tree is what the lease guards").
//
//   1. A keeper process, forked by leasehold, starts the command and is the parent of the whole
//      tree: it is a child subreaper (PR_SET_CHILD_SUBREAPER), so every orphan of the tree
//      (a `cmd &` whose shell returned, a double-forked `setsid` daemon) is reparented to it,
//      not to init; in pidns mode it is the namespace's init. It runs in a session of its own,
//      so a signal to leasehold's process group (Ctrl-Z, `kill -STOP -PGID`) does not reach it.
//      The command runs in its own process group inside the keeper's session.
//   2. Containment, chosen at start (`--contain`, Containment below; auto = the first available
//      of cgroup, pidns, group):
//        - cgroup: the command joins a fresh cgroup v2 leaf (a child of leasehold's own cgroup)
//          before it execs; nothing it starts can leave it without write access to another
//          cgroup. The tree is killed with `cgroup.kill` (freeze + SIGKILL each + thaw on
//          kernels before 5.14). PIDs stay the host's.
//        - pidns: the keeper is the init of a new PID namespace; when it dies the kernel kills
//          every process in the namespace, so the tree cannot outlive the keeper even if the
//          keeper itself is killed. The command sees namespace PIDs ($$ is small; a pid file
//          it writes is not a host PID): hence second in `auto`.
//        - group: no kernel containment. The keeper signals the command's process group and
//          every descendant it finds under itself in /proc (the subreaper keeps orphans and
//          setsid daemons under it). What escapes: processes of the tree alive when the keeper
//          itself is killed (they are reparented to init).
//   3. The keeper ends the tree by itself when leasehold cannot: at EOF on its control socket
//      (leasehold died, kill -9 included: the kernel closes it) it kills the tree at once;
//      and it keeps a dead man's switch: SIGTERM at term_at and SIGKILL at kill_at, the
//      deadlines leasehold sends it whenever safe_until moves (SetDeadline). So a leasehold that
//      is stopped (SIGSTOP, a frozen VM slice with the keeper outside it) does not leave its
//      command running past safe_until.
//   4. The keeper exits when the last process of the tree is gone (waitpid says ECHILD: with a
//      subreaper, no child means no descendant); done() then turns true. Command exit and tree
//      end are separate events: the caller decides whether leftovers are stopped or waited for.
//
// Everything the keeper and the command need is built before fork(): between fork and exec
// only async-signal-safe system calls run (a library thread may hold the malloc lock at fork
// time). The keeper never execs: its loop is written with system calls only.
//
// Example:
//
//   auto tree = Supervisor::Start({.argv = {"sh", "-c", "job & other"}, .env = env,
//                                  .child_mask = saved_mask});
//   if (!tree.ok()) { ... }
//   (*tree)->SetDeadline(safe_until - grace, safe_until);
//   while (!(*tree)->done()) { poll((*tree)->report_fd()) or SIGCHLD; (*tree)->Update(); ... }
//   return (*tree)->ShellExitCode();
//
// Thread safety: not thread-safe; confine to one thread (the main thread: the keeper's
// PR_SET_PDEATHSIG, used in pidns mode, follows the thread that forked).

#pragma once

#include <signal.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "unique_fd.h"

namespace leasehold::cli {

enum class Containment {
  kAuto,          // the first available of kCgroup, kPidNamespace, kGroup
  kCgroup,        // a cgroup v2 leaf per run
  kPidNamespace,  // a PID namespace whose init is the keeper
  kGroup,         // process group + subreaper only
};

// Returns "auto", "cgroup", "pidns" or "group".
std::string_view ContainmentName(Containment mode);

// Parses --contain. Errors: kInvalidArgument naming the accepted values.
Result<Containment> ParseContainment(std::string_view text);

struct SupervisorOptions {
  // The command and its arguments (argv[0] is searched in $PATH). REQUIRES: not empty.
  std::vector<std::string> argv;
  // Its environment, "NAME=value" strings.
  std::vector<std::string> env;
  // The command's signal mask (the caller's mask before it blocked its own signals).
  sigset_t child_mask{};
  // Default: kAuto.
  Containment contain = Containment::kAuto;
  // Lease::holder_liveness_fd(), or -1: the keeper keeps it open until the tree is gone, so
  // that after a kill -9 of leasehold the grant stays alive (sqlite://) exactly as long as a
  // process of the tree may still act under it, and not a moment longer.
  int holder_liveness_fd = -1;
  // Test-only negative control (LEASEHOLD_TEST_UNSAFE_DIRECT_CHILD_ONLY=1): the behaviour
  // before trees were supervised. Signals reach the command's own process only, the keeper
  // leaves the rest of the tree running when the command exits or leasehold dies, and no
  // deadline is kept. Never use it outside the chaos harness's negative control.
  bool unsafe_direct_child_only = false;
};

class Supervisor {
 public:
  // Chooses the containment (kAuto: the first that works here), starts the keeper and the
  // command, and returns once the command has exec'd. Errors: kUnimplemented if the requested
  // containment is not available on this machine (with the reason); kInternal if a socket, fork
  // or cgroup step fails; a failed exec is kNotFound-like: see exec_errno().
  static Result<std::unique_ptr<Supervisor>> Start(SupervisorOptions options);

  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  Supervisor(Supervisor&&) = delete;
  Supervisor& operator=(Supervisor&&) = delete;

  // Kills whatever is left of the tree, reaps the keeper and removes the cgroup leaf.
  ~Supervisor();

  // The containment in force (never kAuto).
  [[nodiscard]] Containment mode() const { return mode_; }

  // One line for the log: the mode and what it guarantees, or why `auto` fell back.
  [[nodiscard]] const std::string& mode_note() const { return mode_note_; }

  // True if the mode leaves a gap worth a warning (group: see the header comment).
  [[nodiscard]] bool weak() const { return mode_ == Containment::kGroup; }

  // The keeper's pid.
  [[nodiscard]] pid_t keeper_pid() const { return keeper_pid_; }

  // The errno of a failed exec of the command (ENOENT: not found), or 0 once it exec'd.
  [[nodiscard]] int exec_errno() const { return exec_errno_; }

  // Readable when the keeper has something to report; poll it (with SIGCHLD), then Update().
  [[nodiscard]] int report_fd() const { return report_fd_.get(); }

  // Reads the keeper's reports and reaps it once it has exited. Never blocks.
  void Update();

  // True once the command's own process has exited (its code: ShellExitCode()).
  [[nodiscard]] bool command_exited() const { return command_exited_; }

  // The command's code as a shell reports it (128+N for signal N); kExitInternal if the keeper
  // died before it could say. REQUIRES: command_exited() or done().
  [[nodiscard]] int ShellExitCode() const;

  // What became of the command, to follow "the command ": "exited with code 3", "was killed
  // by SIGKILL", "is gone: ..." (the keeper died first). REQUIRES: command_exited() or done().
  [[nodiscard]] std::string DescribeExit() const;

  // True once every process of the tree is gone (the keeper has exited and been reaped).
  [[nodiscard]] bool done() const { return keeper_reaped_; }

  // The strongest signal the keeper's dead man's switch sent to the tree by itself: SIGTERM at
  // term_at, SIGKILL at kill_at, or 0 if it never fired.
  [[nodiscard]] int deadline_signal() const { return deadline_signal_; }

  // The number of live processes of the tree, the keeper not counted (a /proc walk).
  [[nodiscard]] int CountLeft() const;

  // Sends `sig` to the command's process group, as a shell's job control would.
  void SignalGroup(int sig);

  // Sends `sig` to every process of the tree.
  void SignalTree(int sig);

  // SIGKILL to every process of the tree: one atomic step where the mode allows (cgroup.kill;
  // in pidns, the keeper's death).
  void KillTree();

  // The dead man's switch: the keeper sends SIGTERM to the tree at term_at and SIGKILL at
  // kill_at (CLOCK_BOOTTIME) unless a later call moves them. Sends only when they changed.
  void SetDeadline(SteadyTime term_at, SteadyTime kill_at);

 private:
  Supervisor() = default;

  // Sends one control message to the keeper; falls back to acting directly if it is gone.
  void Send(int op, int arg, long long value);

  // When the keeper is gone: kills what is left of the tree from here.
  void KillTreeDirectly();

  Containment mode_ = Containment::kGroup;
  std::string mode_note_;
  bool direct_only_ = false;
  std::string cgroup_dir_;  // empty unless kCgroup
  UniqueFd cgroup_kill_fd_;
  UniqueFd cgroup_procs_fd_;  // read: the pids in the leaf
  UniqueFd ctl_fd_;           // to the keeper
  UniqueFd report_fd_;        // from the keeper
  pid_t keeper_pid_ = -1;
  int exec_errno_ = 0;
  bool command_exited_ = false;
  int command_status_ = 0;
  bool keeper_reaped_ = false;
  int keeper_status_ = 0;
  int deadline_signal_ = 0;
  long long sent_term_ns_ = -1;
  long long sent_kill_ns_ = -1;
};

}  // namespace leasehold::cli
