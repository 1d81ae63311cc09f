// File: tools/cli/interrupt_watcher.cc

#include "interrupt_watcher.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include <fmt/format.h>
#include <sys/eventfd.h>

#include "child_env.h"
#include "cli_log.h"
#include "exit_codes.h"

namespace leasehold::cli {

bool IsInterrupt(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
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

void Poke(int event_fd) {
  const std::uint64_t one = 1;
  ssize_t n = ::write(event_fd, &one, sizeof one);
  (void)n;  // EAGAIN means the counter is already non-zero: the loop wakes anyway
}

void InterruptWatcher::Watch() {
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
      Notice("interrupted", fmt::format("{}: stopping", SignalName(sig)));
      cancel_.request_stop();
    }
  }
}

}  // namespace leasehold::cli
