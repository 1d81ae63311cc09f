// File: tools/cli/interrupt_watcher.h
//
// Signal plumbing shared by the subcommands that block: `run` and `elect` (while the lease is
// taken) and `leader --watch`. The caller blocks the signals first and reads them from a
// signalfd, so that every library thread inherits the mask and no handler runs on a random
// thread.
//
// Thread safety: InterruptWatcher is thread-safe; the functions are async-signal-safe.

#pragma once

#include <atomic>
#include <stop_token>
#include <thread>

#include <sys/eventfd.h>
#include <sys/signalfd.h>

#include "unique_fd.h"

namespace leasehold::cli {

// True for SIGINT, SIGTERM and SIGHUP: the signals that mean "stop".
bool IsInterrupt(int sig);

// Reads one pending signal from a non-blocking signalfd; returns false when none is left.
bool ReadSignal(int signal_fd, signalfd_siginfo& info);

// Empties a non-blocking eventfd or timerfd.
void Drain(int fd);

// Wakes a poll() on `event_fd`. Async-signal-safe and allocation-free: lease callbacks call it
// from the heartbeat thread.
void Poke(int event_fd);

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
  void Watch();

  const int signal_fd_;
  UniqueFd done_fd_;
  std::stop_source cancel_;
  std::atomic<int> signal_{0};
  std::jthread thread_;
};

}  // namespace leasehold::cli
