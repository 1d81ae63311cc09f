// File: tools/cli/run_command.cc

#include "run_command.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>

#include "leasehold/clock.h"
#include "leasehold/lease.h"
#include "leasehold/options.h"
#include "leasehold/status.h"
#include "leasehold/store.h"

#include "child_process.h"
#include "cli_log.h"
#include "core/duration.h"
#include "duration_flag.h"
#include "exit_codes.h"
#include "store_flag.h"
#include "unique_fd.h"

namespace leasehold::cli {

namespace {

using internal::FormatDuration;
using std::chrono::seconds;

// Upper bound of the default --kill-grace: a longer grace only delays the SIGTERM of a lost
// lease's command, it never buys safety.
constexpr Duration kMaxDefaultKillGrace = seconds(5);

// The signals `run` supervises. SIGCONT is here only to wake the loop on resume: blocking it
// does not stop the kernel from continuing the process.
constexpr int kSupervisedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGCONT};

bool IsInterrupt(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
}

// True if a process sent the signal (kill, sigqueue, tgkill). Signals the terminal generates
// (Ctrl-C: SI_KERNEL) already reach the child through the shared process group; forwarding
// them too would make one Ctrl-C count twice.
bool SentByProcess(const signalfd_siginfo& info) {
  const int code = info.ssi_code;
  return code == SI_USER || code == SI_QUEUE || code == SI_TKILL;
}

// Reads one pending signal; returns false when none is left.
bool ReadSignal(int signal_fd, signalfd_siginfo& info) {
  for (;;) {
    ssize_t n = ::read(signal_fd, &info, sizeof info);
    if (n == static_cast<ssize_t>(sizeof info)) {
      return true;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    return false;
  }
}

void Drain(int fd) {
  std::uint64_t value = 0;
  while (::read(fd, &value, sizeof value) > 0) {
  }
}

// Wakes the supervisor loop. Async-signal-safe, allocation-free: it runs on the heartbeat
// thread from the lease callbacks.
void Poke(int event_fd) {
  const std::uint64_t one = 1;
  ssize_t n = ::write(event_fd, &one, sizeof one);
  (void)n;  // EAGAIN means the counter is already non-zero: the loop wakes anyway
}

// Watches the signalfd while the store opens and the lease is taken, on its own thread, because
// the main thread is blocked inside the library. The first SIGINT/SIGTERM/SIGHUP cancels the
// wait (exit 130); a second one, if the library is stuck in a call that cannot be cancelled
// (opening an unreachable store), exits at once.
class InterruptWatcher {
 public:
  explicit InterruptWatcher(int signal_fd)
      : signal_fd_(signal_fd), done_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    thread_ = std::jthread([this] { Watch(); });
  }

  InterruptWatcher(const InterruptWatcher&) = delete;
  InterruptWatcher& operator=(const InterruptWatcher&) = delete;
  InterruptWatcher(InterruptWatcher&&) = delete;
  InterruptWatcher& operator=(InterruptWatcher&&) = delete;

  ~InterruptWatcher() { Stop(); }

  // Ends the watch and joins the thread. Idempotent.
  void Stop() {
    if (thread_.joinable()) {
      Poke(done_fd_.get());
      thread_.join();
    }
  }

  [[nodiscard]] std::stop_token token() const { return cancel_.get_token(); }

  // Returns the interrupting signal, or 0.
  [[nodiscard]] int signal() const { return signal_.load(); }

 private:
  void Watch() {
    for (;;) {
      pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {done_fd_.get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) {
          continue;
        }
        return;
      }
      if ((fds[1].revents & POLLIN) != 0) {
        return;
      }
      signalfd_siginfo info{};
      while (ReadSignal(signal_fd_, info)) {
        const int sig = static_cast<int>(info.ssi_signo);
        if (!IsInterrupt(sig)) {
          continue;  // SIGCHLD, SIGCONT: no child yet
        }
        if (signal_.exchange(sig) != 0) {
          Error(fmt::format("{} again: giving up at once", SignalName(sig)));
          ::_exit(kExitInterrupted);
        }
        Info(fmt::format("{}: giving up on the lease", SignalName(sig)));
        cancel_.request_stop();
      }
    }
  }

  const int signal_fd_;
  UniqueFd done_fd_;
  std::stop_source cancel_;
  std::atomic<int> signal_{0};
  std::jthread thread_;
};

struct RunSettings {
  Duration ttl{};
  std::optional<Duration> renew_interval;
  // nullopt: try once.
  std::optional<Duration> wait;
  Duration kill_grace{};
};

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
  if (flags.wait.has_value()) {
    LH_ASSIGN_OR_RETURN(s.wait, ParseWaitFlag("--wait", *flags.wait));
  }
  if (flags.kill_grace.has_value()) {
    LH_ASSIGN_OR_RETURN(s.kill_grace, ParsePositiveDurationFlag("--kill-grace", *flags.kill_grace));
  } else {
    s.kill_grace = std::min<Duration>(s.ttl / 4, kMaxDefaultKillGrace);
  }
  // A healthy lease is renewed every renew_interval and then has at least
  // ttl - drift - renew_interval left; the SIGTERM point must lie beyond that, or a lease whose
  // renewals all succeed would still stop its command. drift is the library's default.
  const Duration renew = s.renew_interval.value_or(s.ttl / 3);
  const Duration drift = s.ttl / 100 + std::chrono::milliseconds(2);
  if (renew + s.kill_grace >= s.ttl - drift) {
    return Status::InvalidArgument(fmt::format(
        "--kill-grace {} plus the renew interval {} must be less than --ttl {} minus the drift "
        "allowance {}: lower --kill-grace or --renew-every",
        FormatDuration(s.kill_grace), FormatDuration(renew), FormatDuration(s.ttl),
        FormatDuration(drift)));
  }
  return s;
}

// Describes who holds `key` after a failed acquire, asking the store when the status does not say.
std::string HeldMessage(Store& store, const std::string& key, const Status& status, bool waited) {
  std::optional<LeaseInfo> holder;
  if (status.holder() != nullptr) {
    holder = *status.holder();
  } else {
    Result<std::optional<LeaseInfo>> info = store.Inspect(key);
    if (info.ok()) {
      holder = *info;
    }
  }
  std::string what = waited ? fmt::format("gave up waiting for {}", key)
                            : fmt::format("{} is held by another", key);
  if (holder.has_value()) {
    return fmt::format("{}: held by {}", what, DescribeHolder(*holder));
  }
  return fmt::format("{}: {}", what, Describe(status));
}

// The state of one supervised child, and what the lease has made us do to it.
class Supervisor {
 public:
  // The descriptors the loop polls; named, as three ints are easily swapped.
  struct Fds {
    int signal_fd;  // the supervised signals
    int event_fd;   // written by the lease callbacks
    int timer_fd;   // CLOCK_BOOTTIME, the next kill-schedule instant
  };

  Supervisor(Lease& lease, ChildProcess& child, Duration kill_grace, Fds fds)
      : lease_(lease),
        child_(child),
        kill_grace_(kill_grace),
        signal_fd_(fds.signal_fd),
        event_fd_(fds.event_fd),
        timer_fd_(fds.timer_fd) {}

  // Runs until the child is reaped.
  void Run() {
    Clock& clock = Clock::Real();
    while (!child_.TryReap()) {
      const SteadyTime now = clock.Now();
      std::optional<SteadyTime> next = Step(now);
      ArmTimer(next, now);
      pollfd fds[3] = {{signal_fd_, POLLIN, 0}, {event_fd_, POLLIN, 0}, {timer_fd_, POLLIN, 0}};
      if (::poll(fds, 3, -1) < 0 && errno != EINTR) {
        Error(fmt::format("poll failed: {}; stopping the command", std::strerror(errno)));
        child_.Signal(SIGKILL);
        stopped_for_lease_ = true;
        continue;
      }
      Drain(event_fd_);
      Drain(timer_fd_);
      HandleSignals();
    }
  }

  // True if the lease was lost while the child ran.
  [[nodiscard]] bool lost() const { return lost_; }

  // True if we signalled the child because of the lease (lost or at risk past the grace).
  [[nodiscard]] bool stopped_for_lease() const { return stopped_for_lease_; }

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
        Info(
            fmt::format("renewals of {} are failing (at risk): SIGTERM to the command in {}, "
                        "SIGKILL in {} unless a renewal succeeds",
                        lease_.key(), FormatDuration(safe_until - kill_grace_ - now),
                        FormatDuration(safe_until - now)));
      } else if (state == LeaseState::kHeld) {
        Info(fmt::format("renewals of {} succeed again", lease_.key()));
      }
      last_state_ = state;
    }
    if (state == LeaseState::kLost && !lost_) {
      // The library has logged the loss with its reason; RunCommand reports it again at exit.
      lost_ = true;
      lost_at_ = now;
    }
    // Without a loss: SIGTERM at safe_until - grace, SIGKILL at safe_until. safe_until moves
    // forward with every successful renew, so a healthy lease never gets there.
    // After a loss: SIGTERM at once, SIGKILL after the grace, and never later than safe_until.
    const SteadyTime term_at = lost_ ? lost_at_ : safe_until - kill_grace_;
    const SteadyTime kill_at = lost_ ? std::min(safe_until, lost_at_ + kill_grace_) : safe_until;
    if (!kill_sent_ && now >= kill_at) {
      SignalChild(SIGKILL, now >= safe_until ? "safe_until has passed" : "grace period over");
      kill_sent_ = true;
      term_sent_ = true;
    } else if (!term_sent_ && now >= term_at) {
      SignalChild(SIGTERM, lost_ ? "the lease is lost"
                                 : fmt::format("the lease cannot be confirmed; SIGKILL in {}",
                                               FormatDuration(kill_at - now)));
      term_sent_ = true;
    }
    if (kill_sent_) {
      return std::nullopt;
    }
    return term_sent_ ? kill_at : term_at;
  }

  void SignalChild(int sig, const std::string& why) {
    Info(fmt::format("sending {} to the command (pid {}): {}", SignalName(sig), child_.pid(), why));
    child_.Signal(sig);
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

  void HandleSignals() {
    signalfd_siginfo info{};
    while (ReadSignal(signal_fd_, info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (IsInterrupt(sig) && SentByProcess(info)) {
        Info(fmt::format("forwarding {} to the command (pid {})", SignalName(sig), child_.pid()));
        child_.Signal(sig);
      }
      // SIGCHLD, SIGCONT and terminal signals only wake the loop.
    }
  }

  Lease& lease_;
  ChildProcess& child_;
  const Duration kill_grace_;
  const int signal_fd_;
  const int event_fd_;
  const int timer_fd_;

  LeaseState last_state_ = LeaseState::kHeld;
  bool lost_ = false;
  SteadyTime lost_at_{};
  bool term_sent_ = false;
  bool kill_sent_ = false;
  bool stopped_for_lease_ = false;
};

}  // namespace

int RunCommand(const RunFlags& flags) {
  if (Status s = ValidateKey(flags.key); !s.ok()) {
    return ReportFailure(s);
  }
  if (flags.command.empty()) {
    return ReportFailure(Status::InvalidArgument("run: missing COMMAND after KEY --"));
  }
  Result<RunSettings> settings = ParseSettings(flags);
  if (!settings.ok()) {
    return ReportFailure(settings.error());
  }

  // Block before any library thread exists, so that all of them inherit the mask and every
  // supervised signal lands on the signalfd. SIGPIPE is blocked too, so that a closed stderr
  // or store socket gives EPIPE instead of killing us and orphaning the lease's command.
  sigset_t supervised;
  sigemptyset(&supervised);
  for (int sig : kSupervisedSignals) {
    sigaddset(&supervised, sig);
  }
  sigset_t blocked = supervised;
  sigaddset(&blocked, SIGPIPE);
  sigset_t saved_mask;
  if (int err = ::pthread_sigmask(SIG_BLOCK, &blocked, &saved_mask); err != 0) {
    return ReportFailure(Status::Internal(fmt::format("pthread_sigmask: {}", std::strerror(err))));
  }
  // These descriptors outlive the lease: its callbacks write to event_fd until it is destroyed.
  UniqueFd signal_fd(::signalfd(-1, &supervised, SFD_CLOEXEC | SFD_NONBLOCK));
  UniqueFd event_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  UniqueFd timer_fd(::timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!signal_fd.valid() || !event_fd.valid() || !timer_fd.valid()) {
    return ReportFailure(
        Status::Internal(fmt::format("signalfd/eventfd/timerfd: {}", std::strerror(errno))));
  }

  auto watcher = std::make_unique<InterruptWatcher>(signal_fd.get());
  auto store = OpenStoreFromFlag(flags.store_url);
  if (!store.ok()) {
    return ReportFailure(store.error());
  }
  if (watcher->signal() != 0) {
    Error(fmt::format("interrupted before acquiring {}", flags.key));
    return kExitInterrupted;
  }

  const int wake_fd = event_fd.get();
  LeaseOptions options{
      .ttl = settings->ttl,
      .renew_interval = settings->renew_interval,
      .drift = std::nullopt,  // the library's default; ParseSettings assumes it
      .wait = kWaitForever,   // used only by Acquire, set below
      .holder = flags.holder,
      .on_lost = [wake_fd](const Status&) { Poke(wake_fd); },
      .on_state_change = [wake_fd](LeaseState, const Status&) { Poke(wake_fd); },
  };
  Result<Lease> lease = (*store)->TryAcquire(flags.key, options);
  bool waited = false;
  if (!lease.ok() && lease.error().code() == StatusCode::kHeldByAnother &&
      settings->wait.has_value() && *settings->wait > Duration::zero() && watcher->signal() == 0) {
    const Duration wait = *settings->wait;
    const LeaseInfo* holder = lease.error().holder();
    Info(fmt::format("{} is held by {}; waiting {}", flags.key,
                     holder != nullptr ? DescribeHolder(*holder) : std::string("another"),
                     wait == kWaitForever ? std::string("for as long as it takes")
                                          : "up to " + FormatDuration(wait)));
    options.wait = wait;
    waited = true;
    lease = (*store)->Acquire(flags.key, options, watcher->token());
  }
  watcher->Stop();
  const int interrupted_by = watcher->signal();
  watcher.reset();
  if (interrupted_by != 0) {
    if (lease.ok()) {
      (void)lease->Release();
    }
    Error(fmt::format("interrupted by {} while waiting for {}", SignalName(interrupted_by),
                      flags.key));
    return kExitInterrupted;
  }
  if (!lease.ok()) {
    const StatusCode code = lease.error().code();
    if (code == StatusCode::kHeldByAnother || code == StatusCode::kDeadlineExceeded) {
      Error(HeldMessage(**store, flags.key, lease.error(), waited));
      return kExitHeldByAnother;
    }
    return ReportFailure(lease.error());
  }

  Info(fmt::format("acquired {} (fencing token {}, token {}..., ttl {}, renew every {})",
                   lease->key(), lease->fencing_token(), lease->token_prefix(),
                   FormatDuration(lease->ttl()), FormatDuration(lease->renew_interval())));

  // Everything the child needs is allocated here, before fork().
  std::vector<std::string> env =
      BuildChildEnvironment({"LEASEHOLD_KEY", "LEASEHOLD_FENCING_TOKEN"},
                            {"LEASEHOLD_KEY=" + lease->key(),
                             fmt::format("LEASEHOLD_FENCING_TOKEN={}", lease->fencing_token())});
  ChildProcess child(flags.command, std::move(env));
  if (int err = child.Start(saved_mask); err != 0) {
    Status released = lease->Release();
    Error(fmt::format("cannot run '{}': {}{}", flags.command.front(), std::strerror(err),
                      released.ok() ? "" : "; release failed: " + Describe(released)));
    return err == ENOENT ? kExitCommandNotFound : kExitCannotExecute;
  }
  Info(fmt::format("started the command (pid {})", child.pid()));

  Supervisor supervisor(
      *lease, child, settings->kill_grace,
      {.signal_fd = signal_fd.get(), .event_fd = event_fd.get(), .timer_fd = timer_fd.get()});
  supervisor.Run();

  const int child_code = child.ShellExitCode();
  if (supervisor.lost() || supervisor.stopped_for_lease() || lease->state() == LeaseState::kLost) {
    Status reason = lease->lost_reason();
    // Release now rather than in ~Lease: it deletes the grant if the lease was only at risk, and
    // the destructor's best-effort release would log a lost lease as a failure.
    (void)lease->Release();
    Error(fmt::format("lease {} lost{}; the command was stopped ({})", flags.key,
                      reason.ok() ? std::string() : ": " + Describe(reason), child.DescribeExit()));
    return kExitLeaseLost;
  }
  Info(fmt::format("the command (pid {}) {}", child.pid(), child.DescribeExit()));
  if (Status released = lease->Release(); !released.ok()) {
    Error(fmt::format("release of {} failed: {}", flags.key, Describe(released)));
    if (released.code() == StatusCode::kLost) {
      return kExitLeaseLost;
    }
  } else {
    Info(fmt::format("released {}", flags.key));
  }
  return child_code;
}

}  // namespace leasehold::cli
