// Issue 4 (found by the chaos harness): a process using redis:// died of SIGPIPE when a
// connection to the server was reset, because hiredis writes with plain write(). A lease
// holder killed that way orphans the work it guards. The backend now writes under a
// SigpipeGuard; this test pins the guard's behaviour (the end-to-end reproduction through a
// resetting proxy is tests/chaos/repro/redis_sigpipe.py, run by CTest as
// regress_issue_4_redis_sigpipe).

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <gtest/gtest.h>
#include <sys/socket.h>

#include "util/sigpipe_guard.h"

namespace leasehold::internal {
namespace {

TEST(Issue4SigpipeTest, WriteToAClosedSocketFailsWithEpipeInsteadOfKillingTheProcess) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  close(fds[1]);
  errno = 0;
  ssize_t n = 0;
  {
    SigpipeGuard guard;
    n = write(fds[0], "x", 1);
  }
  int saved_errno = errno;
  close(fds[0]);
  EXPECT_EQ(n, -1);
  EXPECT_EQ(saved_errno, EPIPE);
  // Reaching this line is the test: without the guard, SIGPIPE's default action ends the
  // process. The guard leaves no SIGPIPE pending and restores the mask.
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGPIPE), 0);
  sigset_t mask;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  EXPECT_EQ(sigismember(&mask, SIGPIPE), 0);
}

}  // namespace
}  // namespace leasehold::internal
