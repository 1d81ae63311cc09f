// File: tools/cli/supervised_run.cc

#include "supervised_run.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>

#include "leasehold/clock.h"
#include "leasehold/duration.h"
#include "leasehold/lease.h"
#include "leasehold/options.h"
#include "leasehold/schedule.h"
#include "leasehold/status.h"
#include "leasehold/store.h"

#include "child_env.h"
#include "cli_log.h"
#include "duration_flag.h"
#include "exit_codes.h"
#include "grant_watch.h"
#include "interrupt_watcher.h"
#include "kill_schedule.h"
#include "observability.h"
#include "store_flag.h"
#include "unique_fd.h"

namespace leasehold::cli {

namespace {

using std::chrono::seconds;

// Upper bound of the default --kill-grace: a longer grace only delays the SIGTERM of a lost
// lease's command, it never buys safety.
constexpr Duration kMaxDefaultKillGrace = seconds(5);

// What the kill schedule must leave between the grant and the SIGTERM point of a lease whose
// renewals have not yet come back: time for the keeper and the command to start and for one
// renewal round trip on a busy host. `--ttl 100ms` left 72 ms and its command got SIGTERM
// before its first renewal returned.
constexpr Duration kScheduleSlack = std::chrono::milliseconds(150);

// Above this a crashed holder would block its key for hours: it takes --long-ttl.
constexpr Duration kLongTtl = std::chrono::hours(1);

// "in 1.2s", or "now" for an instant already reached: no negative duration in a log line.
std::string InOrNow(Duration d) {
  return d > Duration::zero() ? "in " + FormatDuration(RoundForDisplay(d)) : std::string("now");
}

// What is left of `ttl` after the drift allowance, a renew interval and the kill grace (the
// flags given, or their defaults for this ttl): the slack of the kill schedule.
Duration ScheduleSlack(Duration ttl, std::optional<Duration> renew_every,
                       std::optional<Duration> kill_grace) {
  const Duration renew = renew_every.value_or(ttl / 3);
  const Duration grace = kill_grace.value_or(std::min<Duration>(ttl / 4, kMaxDefaultKillGrace));
  return ttl - LeaseOptions::DefaultDrift(ttl) - renew - grace;
}

// The smallest whole-millisecond TTL whose schedule leaves kScheduleSlack with these flags.
Duration SmallestSafeTtl(std::optional<Duration> renew_every, std::optional<Duration> kill_grace) {
  using std::chrono::milliseconds;
  milliseconds low(0);  // too short (the schedule needs more than nothing)
  milliseconds high = std::chrono::duration_cast<milliseconds>(kLongTtl);
  if (ScheduleSlack(high, renew_every, kill_grace) < kScheduleSlack) {
    return high;
  }
  while (high - low > milliseconds(1)) {
    const milliseconds mid = low + (high - low) / 2;
    if (ScheduleSlack(mid, renew_every, kill_grace) >= kScheduleSlack) {
      high = mid;
    } else {
      low = mid;
    }
  }
  return high;
}

// The signals `run` supervises. SIGCONT is here only to wake the loop on resume: blocking it
// does not stop the kernel from continuing the process.
constexpr int kSupervisedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGCONT};

// Reads a duration flag that may be 0.
Result<Duration> ParseNonNegativeDurationFlag(std::string_view flag, std::string_view text) {
  LH_ASSIGN_OR_RETURN(Duration d, ParseWaitFlag(flag, text));
  if (d == kWaitForever) {
    return Status::InvalidArgument(fmt::format("{}: want a duration, got '{}'", flag, text));
  }
  return d;
}

// Reads --once-per and the --slot-* flags into a checked grid.
Result<std::optional<SlotGrid>> ParseSlotFlags(const RunFlags& flags) {
  const bool shaped = flags.slot_offset.has_value() || !flags.slot_zone.empty() ||
                      flags.slot_tolerance.has_value() || flags.retry_failed != "yes" ||
                      flags.keep_history.has_value();
  if (!flags.once_per.has_value()) {
    if (shaped) {
      return Status::InvalidArgument(
          "--slot-offset, --slot-zone, --slot-tolerance, --retry-failed and --keep-history need "
          "--once-per");
    }
    return std::optional<SlotGrid>();
  }
  SlotGrid grid;
  LH_ASSIGN_OR_RETURN(grid.period, ParsePositiveDurationFlag("--once-per", *flags.once_per));
  if (flags.slot_offset.has_value()) {
    LH_ASSIGN_OR_RETURN(grid.offset,
                        ParseNonNegativeDurationFlag("--slot-offset", *flags.slot_offset));
  }
  if (flags.slot_tolerance.has_value()) {
    LH_ASSIGN_OR_RETURN(grid.tolerance,
                        ParseNonNegativeDurationFlag("--slot-tolerance", *flags.slot_tolerance));
  }
  grid.zone = flags.slot_zone;
  if (Status valid = ValidateSlotGrid(grid); !valid.ok()) {
    return Status(valid.code(), fmt::format("--once-per {}: {}", *flags.once_per, valid.message()));
  }
  return std::optional<SlotGrid>(std::move(grid));
}

// Applies the lease's kill schedule (kill_schedule.h) to the command's process tree
// (supervisor.h) until every process of the tree is gone, and stops or waits for the leftovers
// of a command that exited. Logs the lease's state changes and every signal with its reason.
class LeaseGuard {
 public:
  // The descriptors the loop polls; named, as three ints are easily swapped.
  struct Fds {
    int signal_fd;  // the supervised signals
    int event_fd;   // written by the lease callbacks
    int timer_fd;   // CLOCK_BOOTTIME, the next kill-schedule instant
  };

  LeaseGuard(const Lease& lease, Supervisor& tree, const TreeSettings& settings, Fds fds)
      : lease_(lease),
        tree_(tree),
        kill_grace_(settings.kill_grace),
        term_on_risk_(settings.term_on_risk),
        wait_children_(settings.wait_children),
        signal_fd_(fds.signal_fd),
        event_fd_(fds.event_fd),
        timer_fd_(fds.timer_fd),
        schedule_(settings.kill_grace, settings.term_on_risk) {}

  // Runs until every process of the tree is gone.
  void Run() {
    Clock& clock = Clock::Real();
    for (;;) {
      tree_.Update();
      if (tree_.done()) {
        break;
      }
      const SteadyTime now = clock.Now();
      std::optional<SteadyTime> next = Step(now);
      if (std::optional<SteadyTime> left = StepLeftovers(now); left.has_value()) {
        next = next.has_value() ? std::min(*next, *left) : *left;
      }
      ArmTimer(next, now);
      pollfd fds[4] = {{signal_fd_, POLLIN, 0},
                       {event_fd_, POLLIN, 0},
                       {timer_fd_, POLLIN, 0},
                       {tree_.report_fd(), POLLIN, 0}};
      if (::poll(fds, 4, -1) < 0 && errno != EINTR) {
        Error(fmt::format("poll failed: {}; stopping the command", std::strerror(errno)));
        tree_.KillTree();
        stopped_for_lease_ = true;
        continue;
      }
      Drain(event_fd_);
      Drain(timer_fd_);
      HandleSignals();
    }
    if (const int sig = tree_.deadline_signal();
        (sig == SIGKILL && !schedule_.kill_sent()) || (sig == SIGTERM && !schedule_.term_sent())) {
      // leasehold did not act at that instant (stopped, or starved): the keeper did, alone.
      Alarm(
          fmt::format("leasehold's keeper applied the kill schedule of {} by itself while "
                      "leasehold did not run: {} to the command's tree{}",
                      lease_.key(), SignalName(sig),
                      sig == SIGTERM ? " at safe_until - kill-grace (SIGKILL at safe_until for "
                                       "anything left)"
                                     : " at safe_until"));
      stopped_for_lease_ = true;
    }
  }

  // True if the lease was lost while the tree ran.
  [[nodiscard]] bool lost() const { return schedule_.lost(); }

  // True if we signalled the tree because of the lease (lost or at risk past the grace).
  [[nodiscard]] bool stopped_for_lease() const { return stopped_for_lease_; }

  // True if SIGINT, SIGTERM or SIGHUP reached us while the tree ran (`elect --again` then
  // stops campaigning).
  [[nodiscard]] bool interrupted() const { return interrupted_; }

 private:
  // Applies the kill schedule at `now`; returns the next instant at which it must run again.
  std::optional<SteadyTime> Step(SteadyTime now) {
    // valid() marks the lease lost if it finds safe_until passed (e.g. after SIGSTOP), even if
    // the heartbeat has not run yet.
    (void)lease_.valid();
    const LeaseState state = lease_.state();
    const SteadyTime safe_until = lease_.safe_until();
    if (state != last_state_) {
      if (state == LeaseState::kAtRisk) {
        Alarm(
            fmt::format("renewals of {} are failing (at risk): SIGTERM to the command's tree {}, "
                        "SIGKILL {} unless a renewal succeeds",
                        lease_.key(),
                        term_on_risk_ ? std::string("now (--on-risk=term)")
                                      : InOrNow(safe_until - kill_grace_ - now),
                        InOrNow(safe_until - now)));
      } else if (state == LeaseState::kHeld) {
        Alarm(fmt::format("renewals of {} succeed again", lease_.key()));
      }
      last_state_ = state;
    }
    // The library has logged a loss with its reason; RunCommand reports it again at exit.
    const KillSchedule::Step step = schedule_.At(now, state, safe_until);
    if (step.signal == SIGKILL) {
      SignalTree(SIGKILL, KillSchedule::Why(step.reason));
    } else if (step.signal == SIGTERM) {
      SignalTree(SIGTERM, step.reason == KillSchedule::Reason::kLost
                              ? std::string(KillSchedule::Why(step.reason))
                              : fmt::format("{}; SIGKILL in {}", KillSchedule::Why(step.reason),
                                            FormatDuration(RoundForDisplay(step.kill_at - now))));
    }
    // The keeper's dead man's switch follows the same schedule (KillSchedule).
    tree_.SetDeadline(step.keeper_term_at, step.keeper_kill_at);
    return step.next;
  }

  // Once the command's own process has exited: stops the rest of the tree (SIGTERM, grace,
  // SIGKILL) or, with --wait-children, lets it finish. Returns when to look again.
  std::optional<SteadyTime> StepLeftovers(SteadyTime now) {
    if (!tree_.command_exited()) {
      return std::nullopt;
    }
    if (!leftovers_seen_) {
      leftovers_seen_ = true;
      const int left = tree_.CountLeft();
      if (left == 0) {
        return std::nullopt;  // the keeper is exiting: done() follows
      }
      if (wait_children_) {
        Info(
            fmt::format("the command {}; waiting for the {} leftover process{} of its tree "
                        "(--wait-children), still holding {}",
                        tree_.DescribeExit(), left, left == 1 ? "" : "es", lease_.key()));
        return std::nullopt;
      }
      Info(
          fmt::format("the command {}; stopping the {} leftover process{} of its tree before "
                      "releasing {}: SIGTERM now, SIGKILL in {}",
                      tree_.DescribeExit(), left, left == 1 ? "" : "es", lease_.key(),
                      FormatDuration(kill_grace_)));
      tree_.SignalTree(SIGTERM);
      leftover_kill_at_ = now + kill_grace_;
    }
    if (wait_children_ || leftover_kill_at_ == SteadyTime{} || leftover_killed_) {
      return std::nullopt;
    }
    if (now >= leftover_kill_at_) {
      Info(fmt::format("sending SIGKILL to what is left of the command's tree ({} process{})",
                       tree_.CountLeft(), tree_.CountLeft() == 1 ? "" : "es"));
      tree_.KillTree();
      leftover_killed_ = true;
      return std::nullopt;
    }
    return leftover_kill_at_;
  }

  void SignalTree(int sig, const std::string& why) {
    Alarm(fmt::format("sending {} to the command's tree (keeper pid {}): {}", SignalName(sig),
                      tree_.keeper_pid(), why));
    if (sig == SIGKILL) {
      tree_.KillTree();
    } else {
      tree_.SignalTree(sig);
    }
    stopped_for_lease_ = true;
  }

  void ArmTimer(std::optional<SteadyTime> deadline, SteadyTime now) {
    itimerspec spec{};
    if (deadline.has_value()) {
      // Relative, on CLOCK_BOOTTIME like Clock::Real(): it keeps counting through suspend.
      auto left = std::max<Duration>(*deadline - now, std::chrono::nanoseconds(1));
      spec.it_value.tv_sec = static_cast<time_t>(left.count() / 1'000'000'000);
      spec.it_value.tv_nsec = static_cast<long>(left.count() % 1'000'000'000);
    }
    ::timerfd_settime(timer_fd_, 0, &spec, nullptr);
  }

  // SIGINT/SIGTERM/SIGHUP, from a process or the terminal, go to the command's process group
  // as a shell's job control would: the command is not in leasehold's (foreground) group, so
  // nothing reaches it twice. Once the command itself has exited, they go to the whole tree.
  // The second one escalates: SIGKILL to the whole tree at once (a command that ignores or is
  // slow to honour the first would otherwise keep an impatient operator waiting).
  void HandleSignals() {
    signalfd_siginfo info{};
    while (ReadSignal(signal_fd_, info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (IsInterrupt(sig) && ++interrupts_ >= 2) {
        Notice("interrupted",
               fmt::format("{} again: SIGKILL to the command's whole tree", SignalName(sig)));
        tree_.KillTree();
      } else if (IsInterrupt(sig) && tree_.command_exited()) {
        // Only leftovers are running (--wait-children, or their grace): the whole tree, or a
        // setsid daemon would keep us waiting after the user asked to stop.
        interrupted_ = true;
        Info(fmt::format("forwarding {} to the leftovers of the command's tree", SignalName(sig)));
        tree_.SignalTree(sig);
      } else if (IsInterrupt(sig)) {
        interrupted_ = true;
        Notice("interrupted",
               fmt::format("forwarding {} to the command's process group (a second one sends "
                           "SIGKILL to its whole tree)",
                           SignalName(sig)));
        tree_.SignalGroup(sig);
      }
      // SIGCHLD and SIGCONT only wake the loop.
    }
  }

  const Lease& lease_;
  Supervisor& tree_;
  const Duration kill_grace_;
  const bool term_on_risk_;
  const bool wait_children_;
  const int signal_fd_;
  const int event_fd_;
  const int timer_fd_;

  KillSchedule schedule_;
  LeaseState last_state_ = LeaseState::kHeld;
  bool stopped_for_lease_ = false;
  bool interrupted_ = false;
  // SIGINT/SIGTERM/SIGHUP received while the tree runs.
  int interrupts_ = 0;
  bool leftovers_seen_ = false;
  SteadyTime leftover_kill_at_{};
  bool leftover_killed_ = false;
};

// The test-only negative control of the chaos harness (supervisor.h): the old behaviour.
bool UnsafeDirectChildOnly() {
  const char* v = std::getenv("LEASEHOLD_TEST_UNSAFE_DIRECT_CHILD_ONLY");
  return v != nullptr && std::string_view(v) == "1";
}

}  // namespace

// Reads and cross-checks the duration flags, naming the flag in every error.
Result<RunSettings> ParseSettings(const RunFlags& flags) {
  RunSettings s;
  LH_ASSIGN_OR_RETURN(s.ttl, ParsePositiveDurationFlag("--ttl", flags.ttl));
  if (flags.renew_every.has_value()) {
    LH_ASSIGN_OR_RETURN(s.renew_interval,
                        ParsePositiveDurationFlag("--renew-every", *flags.renew_every));
    if (*s.renew_interval >= s.ttl) {
      return Status::InvalidArgument(fmt::format(
          "--renew-every {} must be less than --ttl {}: the lease would expire between renewals",
          *flags.renew_every, flags.ttl));
    }
  }
  LH_ASSIGN_OR_RETURN(s.contain, ParseContainment(flags.contain));
  if (flags.wait.has_value()) {
    LH_ASSIGN_OR_RETURN(s.wait, ParseWaitFlag("--wait", *flags.wait));
  }
  LH_ASSIGN_OR_RETURN(s.slot, ParseSlotFlags(flags));
  if (flags.retry_failed != "yes" && flags.retry_failed != "no") {
    return Status::InvalidArgument(
        fmt::format("--retry-failed: want yes or no, got '{}'", flags.retry_failed));
  }
  s.retry_failed = flags.retry_failed == "yes";
  if (flags.hold_at_least.has_value()) {
    LH_ASSIGN_OR_RETURN(s.hold_at_least,
                        ParsePositiveDurationFlag("--hold-at-least", *flags.hold_at_least));
    if (s.hold_at_least > kMaxHoldAtLeast) {
      return Status::InvalidArgument(fmt::format(
          "--hold-at-least {}: at most {}", *flags.hold_at_least, FormatDuration(kMaxHoldAtLeast)));
    }
  }
  if (flags.keep_history.has_value()) {
    LH_ASSIGN_OR_RETURN(s.keep_history,
                        ParsePositiveDurationFlag("--keep-history", *flags.keep_history));
    if (s.keep_history > kMaxKeepHistory) {
      return Status::InvalidArgument(fmt::format(
          "--keep-history {}: at most {}", *flags.keep_history, FormatDuration(kMaxKeepHistory)));
    }
  }
  std::optional<Duration> given_grace;
  if (flags.kill_grace.has_value()) {
    LH_ASSIGN_OR_RETURN(given_grace, ParsePositiveDurationFlag("--kill-grace", *flags.kill_grace));
  }
  s.kill_grace = given_grace.value_or(std::min<Duration>(s.ttl / 4, kMaxDefaultKillGrace));
  if (s.ttl > kLongTtl && !flags.long_ttl) {
    return Status::InvalidArgument(fmt::format(
        "--ttl {}: a crashed holder would block the key that long; TTLs above {} need "
        "--long-ttl (the heartbeat renews a lease however long the command runs: the TTL only "
        "bounds how long a dead holder keeps it)",
        flags.ttl, FormatDuration(kLongTtl)));
  }
  // A healthy lease is renewed every renew_interval and then has at least
  // ttl - drift - renew_interval left; the SIGTERM point must lie beyond that by the time the
  // command needs to start and a renewal to come back (kScheduleSlack), or a lease whose
  // renewals all succeed would still stop its command. drift is the library's default.
  const Duration renew = s.renew_interval.value_or(s.ttl / 3);
  const Duration drift = LeaseOptions::DefaultDrift(s.ttl);
  if (ScheduleSlack(s.ttl, s.renew_interval, given_grace) < kScheduleSlack) {
    const Duration smallest = SmallestSafeTtl(s.renew_interval, given_grace);
    if (!s.renew_interval.has_value() && !given_grace.has_value()) {
      return Status::InvalidArgument(fmt::format(
          "--ttl {} is too short for the kill schedule: the command would get SIGTERM before "
          "its first renewal could come back; the smallest --ttl is {}",
          flags.ttl, FormatDuration(smallest)));
    }
    return Status::InvalidArgument(fmt::format(
        "--ttl {} minus the drift allowance {}, the renew interval {} and the kill grace {} "
        "leaves {}, under the {} the command needs to start and a renewal to come back: use "
        "--ttl {} or more with these flags, or lower --kill-grace or --renew-every",
        flags.ttl, FormatDuration(drift), FormatDuration(RoundForDisplay(renew)),
        FormatDuration(s.kill_grace),
        FormatDuration(RoundForDisplay(
            std::max(Duration::zero(), ScheduleSlack(s.ttl, s.renew_interval, given_grace)))),
        FormatDuration(kScheduleSlack), FormatDuration(smallest)));
  }
  return s;
}

TreeSettings TreeSettingsFor(const RunSettings& settings, const RunFlags& flags) {
  return TreeSettings{.kill_grace = settings.kill_grace,
                      .contain = settings.contain,
                      .term_on_risk = TermOnRisk(flags.observability),
                      .wait_children = flags.wait_children};
}

// Blocks the supervised signals before any library thread exists, so that all of them inherit
// the mask and every supervised signal lands on the signalfd. SIGPIPE is blocked too, so that a
// closed stderr or store socket gives EPIPE instead of killing us and orphaning the command.
Result<std::unique_ptr<Supervision>> BlockSignals() {
  auto sup = std::make_unique<Supervision>();
  sigset_t supervised;
  sigemptyset(&supervised);
  for (int sig : kSupervisedSignals) {
    sigaddset(&supervised, sig);
  }
  sigset_t blocked = supervised;
  sigaddset(&blocked, SIGPIPE);
  if (int err = ::pthread_sigmask(SIG_BLOCK, &blocked, &sup->saved_mask); err != 0) {
    return Status::Internal(fmt::format("pthread_sigmask: {}", std::strerror(err)));
  }
  sup->signal_fd = UniqueFd(::signalfd(-1, &supervised, SFD_CLOEXEC | SFD_NONBLOCK));
  sup->event_fd = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  sup->timer_fd = UniqueFd(::timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!sup->signal_fd.valid() || !sup->event_fd.valid() || !sup->timer_fd.valid()) {
    return Status::Internal(fmt::format("signalfd/eventfd/timerfd: {}", std::strerror(errno)));
  }
  return sup;
}

std::optional<int> RefuseUnrunnableCommand(const std::vector<std::string>& command) {
  const std::string& name = command.front();
  // What execvp would try, in order.
  std::vector<std::string> candidates;
  if (name.find('/') != std::string::npos) {
    candidates.push_back(name);
  } else if (!name.empty()) {
    const char* env_path = std::getenv("PATH");
    const std::string path = env_path != nullptr ? env_path : "/bin:/usr/bin";
    std::size_t at = 0;
    while (at <= path.size()) {
      std::size_t end = path.find(':', at);
      if (end == std::string::npos) {
        end = path.size();
      }
      const std::string dir = path.substr(at, end - at);
      candidates.push_back(dir.empty() ? name : dir + "/" + name);  // empty: the working dir
      at = end + 1;
    }
  }
  std::string not_executable;
  for (const std::string& candidate : candidates) {
    struct stat st {};

    if (::stat(candidate.c_str(), &st) != 0) {
      continue;
    }
    if (S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return std::nullopt;
    }
    if (not_executable.empty()) {
      not_executable = candidate;
    }
  }
  if (!not_executable.empty()) {
    Error(fmt::format("cannot run '{}': {} is not an executable file; nothing was taken", name,
                      not_executable));
    return kExitCannotExecute;
  }
  Error(fmt::format("cannot run '{}': command not found{}; nothing was taken", name,
                    name.find('/') != std::string::npos ? std::string() : " in $PATH"));
  return kExitCommandNotFound;
}

Result<SupervisedSetup> StartSupervision(const RunFlags& flags, const std::string& key) {
  SupervisedSetup setup;
  LH_ASSIGN_OR_RETURN(setup.sup, BlockSignals());
  setup.watcher = std::make_unique<InterruptWatcher>(setup.sup->signal_fd.get());
  LH_ASSIGN_OR_RETURN(setup.store, OpenStoreFromFlag(flags.store_url));
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(flags.observability.metrics_addr, setup.store->metrics());
  if (!server.ok() && server.error().code() != StatusCode::kUnavailable) {
    return server.error();  // a malformed address: a usage error
  }
  if (!server.ok()) {
    Warn(fmt::format("{}; running without /metrics", Describe(server.error())));
  } else if (*server != nullptr) {
    setup.metrics_server = std::move(server).value();
    Info(fmt::format("serving metrics at {}",
                     MetricsUrl(flags.observability.metrics_addr, setup.metrics_server->port())));
  }
  if (!flags.observability.metrics_textfile.empty()) {
    setup.sup->textfile = std::make_shared<MetricsTextfile>(flags.observability.metrics_textfile,
                                                            key, setup.store->metrics());
  }
  return setup;
}

void WriteMetricsTextfile(const Supervision& sup) {
  if (sup.textfile != nullptr) {
    sup.textfile->WriteNow();
  }
}

int EndWait(std::unique_ptr<InterruptWatcher>& watcher) {
  watcher->Stop();
  const int interrupted_by = watcher->signal();
  watcher.reset();
  return interrupted_by;
}

// Lease options whose callbacks wake the supervisor loop.
LeaseOptions SupervisedLeaseOptions(const RunSettings& settings, const Supervision& sup) {
  const int wake_fd = sup.event_fd.get();
  std::shared_ptr<MetricsTextfile> textfile = sup.textfile;
  return LeaseOptions{
      .ttl = settings.ttl,
      .renew_interval = settings.renew_interval,
      .drift = std::nullopt,  // the library's default; ParseSettings assumes it
      .wait = kWaitForever,   // used only by Acquire, set by the caller
      .holder = {},
      .on_lost =
          [wake_fd, textfile](const Status&) {
            Poke(wake_fd);
            if (textfile != nullptr) {
              textfile->Request();  // written by its own thread, never this one
            }
          },
      .on_state_change =
          [wake_fd, textfile](LeaseState, const Status&) {
            Poke(wake_fd);
            if (textfile != nullptr) {
              textfile->Request();  // written by its own thread, never this one
            }
          },
      // A new safe_until goes to the keeper's dead man's switch at once.
      .on_renewed = [wake_fd](SteadyTime) { Poke(wake_fd); },
  };
}

ChildOutcome RunUnderLease(const HeldLease& held, const std::vector<std::string>& command,
                           std::vector<std::string> env, const TreeSettings& settings,
                           Supervision& sup) {
  const Lease& lease = held.lease;
  const std::function<Status(int)>& release = held.release;
  const std::string& what = held.what;
  Result<std::unique_ptr<Supervisor>> started =
      Supervisor::Start({.argv = command,
                         .env = std::move(env),
                         .child_mask = sup.saved_mask,
                         .contain = settings.contain,
                         .holder_liveness_fd = lease.holder_liveness_fd(),
                         .unsafe_direct_child_only = UnsafeDirectChildOnly()});
  if (!started.ok()) {
    Status released = release(ExitCodeFor(started.error()));
    Error(fmt::format("cannot run '{}': {}{}", command.front(), Describe(started.error()),
                      released.ok() ? "" : "; release failed: " + Describe(released)));
    return {.exit_code = ExitCodeFor(started.error())};
  }
  Supervisor& tree = **started;
  if (int err = tree.exec_errno(); err != 0) {
    const int code = err == ENOENT ? kExitCommandNotFound : kExitCannotExecute;
    Status released = release(code);
    Error(fmt::format("cannot run '{}': {}{}", command.front(), std::strerror(err),
                      released.ok() ? "" : "; release failed: " + Describe(released)));
    return {.exit_code = code};
  }
  Info(fmt::format("containment: {}", tree.mode_note()));
  if (tree.weak()) {
    Info(
        fmt::format("warning: only the process group contains the command's tree here (no "
                    "writable cgroup v2, no PID namespace): a process of it that outlives "
                    "leasehold's keeper (pid {}) escapes; see --contain in --help",
                    tree.keeper_pid()));
  }
  Info(fmt::format("started the command (keeper pid {})", tree.keeper_pid()));

  LeaseGuard guard(lease, tree, settings,
                   {.signal_fd = sup.signal_fd.get(),
                    .event_fd = sup.event_fd.get(),
                    .timer_fd = sup.timer_fd.get()});
  {
    GrantWatch watch(held.store, lease, held.confirm);
    guard.Run();
  }  // the watch is joined before the lease is released (Lease::Confirm's rule)

  const int child_code = tree.ShellExitCode();
  if (guard.lost() || guard.stopped_for_lease() || lease.state() == LeaseState::kLost) {
    Status reason = lease.lost_reason();
    // Release now rather than in the destructor: it deletes the grant if the lease was only at
    // risk, and the destructor's best-effort release would log a lost lease as a failure.
    (void)release(kExitLeaseLost);
    Error(fmt::format("{} lost{}; the command was stopped: it {}", what,
                      reason.ok() ? std::string() : ": " + Describe(reason), tree.DescribeExit()));
    return {.exit_code = kExitLeaseLost, .interrupted = guard.interrupted()};
  }
  Info(fmt::format("the command {}; its whole tree is gone", tree.DescribeExit()));
  if (Status released = release(child_code); !released.ok()) {
    Error(fmt::format("release of {} failed: {}", what, Describe(released)));
    if (released.code() == StatusCode::kLost) {
      return {.exit_code = kExitLeaseLost, .interrupted = guard.interrupted()};
    }
  }
  // A successful release was logged by the library ("released key=... fencing_token=...").
  return {.exit_code = child_code, .from_command = true, .interrupted = guard.interrupted()};
}

}  // namespace leasehold::cli
