// File: util/sigpipe_guard.h (internal)
//
// SigpipeGuard: while alive, a write to a closed socket in this thread cannot kill the process.
// Client libraries that write with plain write() (OpenSSL's socket BIO, under rediss:// and
// libpq's TLS) raise SIGPIPE when the peer has reset the connection; its default action ends
// the process, which for a lease holder would orphan the work it guards. The guard blocks
// SIGPIPE in the calling thread and, on destruction, consumes a SIGPIPE raised meanwhile, so
// the write just fails with EPIPE and the caller reports the store unavailable. The process's
// own SIGPIPE disposition is untouched.
//
// Thread safety: affects only the calling thread; create and destroy it on the same thread.

#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <cerrno>

namespace leasehold::internal {

class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    // A SIGPIPE that was already pending belongs to someone else: leave it.
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &saved_);
  }

  ~SigpipeGuard() {
    const int saved_errno = errno;  // callers read errno of the failed write after the guard
    if (!was_pending_) {
      timespec zero{};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
    errno = saved_errno;
  }

  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;
  SigpipeGuard(SigpipeGuard&&) = delete;
  SigpipeGuard& operator=(SigpipeGuard&&) = delete;

 private:
  sigset_t pipe_;
  sigset_t saved_;
  bool was_pending_ = false;
};

}  // namespace leasehold::internal
