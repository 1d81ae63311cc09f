// lease_holder: a second process for the conformance suite.
//   lease_holder URL KEY try TTL_MS            try once; print "acquired N" (exit 0) or
//                                              "held N HOLDER" (exit 3); errors exit 1
//   lease_holder URL KEY hold TTL_MS HOLD_MS   acquire (waiting up to 10 s), print
//                                              "acquired N GRANTED_TTL_MS", hold HOLD_MS,
//                                              release, exit 0 (a store may grant more than
//                                              TTL_MS: etcd rounds up to whole seconds, >= 2 s)
//   lease_holder URL KEY linger TTL_MS KEEP_MS acquire, print "acquired N", release with
//                                              hold_at_least KEEP_MS at once, exit 0
//   lease_holder URL KEY race TTL_MS SECONDS   for SECONDS: acquire (waiting up to 2 s), print
//                                              "start NS FENCE SLOT" (CLOCK_MONOTONIC ns, read
//                                              after the grant), hold 5..50 ms while valid(),
//                                              print "end NS" (read before the release), release
//   lease_holder URL KEY fork TTL_MS           acquire, print "acquired N", then fork three
//                                              children in turn: one calls exit(0) (the Store
//                                              and Lease are statics: their destructors run),
//                                              one _exit(0), one uses them (valid() false,
//                                              Write and Release kLost, TryAcquire refused) and
//                                              exits 0 only if all that held; print "children
//                                              A B C" (their exit codes; -1: still running
//                                              after 30 s, killed), sleep 3 renew
//                                              intervals, print "parent VALID INTACT N"
//                                              (valid() and a fenced Put where the store has
//                                              one; the grant as a second handle's Inspect
//                                              reads it: same token and holder; the fencing
//                                              token), release: exit 0 if that was ok
// Options after the mode's arguments: limit=N (a semaphore of N), shared (a shared lease).
// Output is flushed per line so the test can read it while the process runs.

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <thread>

#include <sys/wait.h>

#include "leasehold/fenced_write.h"
#include "leasehold/store.h"

// LeakSanitizer's exit check, off in the fork mode's children: the parent's threads are not in a
// child, so what only their stacks referenced (a watcher's vector, a request in flight) looks
// unreachable there, and so does the StoreCore a child never destroys on purpose (fork_guard.h).
// LeakSanitizer calls this hook, where it is linked in, before its check at exit.
namespace {
bool g_in_fork_child = false;
}  // namespace

extern "C" int __lsan_is_turned_off();

extern "C" int __lsan_is_turned_off() {
  return g_in_fork_child ? 1 : 0;
}

namespace {

// The fork mode's Store and Lease: statics, so that a child's exit(0) destroys them.
std::unique_ptr<leasehold::Store> g_store;
leasehold::Lease g_lease;

// A fork() child's checks: every operation refuses without touching the parent's grant.
int ForkedChildUses() {
  int failed = 0;
  if (g_lease.valid() || g_lease.state() != leasehold::LeaseState::kLost) {
    failed |= 1;
  }
  auto wrote =
      g_lease.Write(leasehold::FencedWrite().Put(g_lease.DataKey("/lh-fork-child"), "child"));
  if (wrote.status().code() != leasehold::StatusCode::kLost) {
    failed |= 2;
  }
  if (g_lease.Release().code() != leasehold::StatusCode::kLost) {
    failed |= 4;
  }
  auto other = g_store->TryAcquire("fork-other");
  if (other.status().code() != leasehold::StatusCode::kFailedPrecondition) {
    failed |= 8;
  }
  return failed;
}

// The exit code of child `pid` (128 + N if signal N ended it), or -1 if it was still running
// after `limit`: then it is killed, so that a child stuck in a lock the fork copied held fails
// the case at once instead of hanging it.
int WaitForChild(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (done < 0 || std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int ForkMode(const char* url, const char* key, const leasehold::LeaseOptions& options) {
  auto lease = g_store->TryAcquire(key, options);
  if (!lease.ok()) {
    std::printf("error %s\n", lease.status().ToString().c_str());
    return 1;
  }
  g_lease = std::move(lease).value();
  std::printf("acquired %llu\n", static_cast<unsigned long long>(g_lease.fencing_token()));
  std::fflush(stdout);
  int codes[3] = {-1, -1, -1};
  for (int variant = 0; variant < 3; ++variant) {
    const pid_t pid = fork();
    if (pid == 0) {
      g_in_fork_child = true;
      if (variant == 0) {
        std::exit(0);
      }
      if (variant == 1) {
        _exit(0);
      }
      std::exit(ForkedChildUses());
    }
    if (pid < 0) {
      return 1;
    }
    codes[variant] = WaitForChild(pid, std::chrono::seconds(30));
  }
  std::printf("children %d %d %d\n", codes[0], codes[1], codes[2]);
  std::fflush(stdout);
  std::this_thread::sleep_for(3 * g_lease.renew_interval());
  bool valid = g_lease.valid();
  if (valid && g_store->SupportsFencedOp(leasehold::FencedOp::Kind::kPut)) {
    // Absolute, for ZooKeeper; this process's own, on a shared server; deleted after.
    const std::string data = g_lease.DataKey("/lh-fork-" + std::to_string(getpid()));
    auto wrote = g_lease.Write(leasehold::FencedWrite().Put(data, "parent"));
    if (wrote.ok() && g_store->SupportsFencedOp(leasehold::FencedOp::Kind::kDelete)) {
      wrote = g_lease.Write(leasehold::FencedWrite().Delete(data));
    }
    if (!wrote.ok()) {
      std::fprintf(stderr, "the parent's fenced write: %s\n", wrote.status().ToString().c_str());
      valid = false;
    }
  }
  // The grant as a second handle reads it from the store.
  bool intact = false;
  if (auto reader = leasehold::Store::Open(url); reader.ok()) {
    auto info = (*reader)->Inspect(key);
    intact = info.ok() && info->has_value() && (*info)->fencing_token == g_lease.fencing_token() &&
             (*info)->holder == options.holder;
  }
  std::printf("parent %d %d %llu\n", valid ? 1 : 0, intact ? 1 : 0,
              static_cast<unsigned long long>(g_lease.fencing_token()));
  std::fflush(stdout);
  const bool released = g_lease.Release().ok();
  g_store.reset();
  return released ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  if (argc < 5) {
    std::fprintf(stderr, "usage: lease_holder URL KEY try|hold|linger TTL_MS [HOLD_MS|KEEP_MS]\n");
    return 2;
  }
  std::string mode = argv[3];
  auto ttl = std::chrono::milliseconds(std::atoll(argv[4]));
  auto store = leasehold::Store::Open(argv[1]);
  if (!store.ok()) {
    std::printf("error %s\n", store.status().ToString().c_str());
    return 1;
  }
  leasehold::LeaseOptions options{.ttl = ttl, .holder = "lease_holder:" + std::to_string(getpid())};
  for (int i = 5; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.starts_with("limit=")) {
      options.limit = static_cast<std::uint32_t>(std::atoi(argv[i] + 6));
    } else if (arg == "shared") {
      options.mode = leasehold::LeaseMode::kShared;
    }
  }
  if (mode == "fork") {
    g_store = std::move(store).value();
    return ForkMode(argv[1], argv[2], options);
  }
  if (mode == "race" && argc >= 6) {
    auto now_ns = [] {
      timespec ts{};
      clock_gettime(CLOCK_MONOTONIC, &ts);
      return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
    };
    std::mt19937 rng(static_cast<unsigned>(getpid()));
    options.wait = 2s;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(std::atoi(argv[5]));
    while (std::chrono::steady_clock::now() < until) {
      auto lease = (*store)->Acquire(argv[2], options);
      if (!lease.ok()) {
        if (lease.status().code() == leasehold::StatusCode::kDeadlineExceeded ||
            lease.status().code() == leasehold::StatusCode::kUnavailable) {
          continue;
        }
        std::printf("error %s\n", lease.status().ToString().c_str());
        return 1;
      }
      std::printf("start %lld %llu %u\n", now_ns(),
                  static_cast<unsigned long long>(lease->fencing_token()), lease->slot());
      std::fflush(stdout);
      const auto hold_until =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(5 + rng() % 46);
      while (std::chrono::steady_clock::now() < hold_until && lease->valid()) {
        std::this_thread::sleep_for(1ms);
      }
      std::printf("end %lld\n", now_ns());
      std::fflush(stdout);
      (void)lease->Release();
    }
    std::printf("done\n");
    return 0;
  }
  if (mode == "try") {
    auto lease = (*store)->TryAcquire(argv[2], options);
    if (lease.ok()) {
      std::printf("acquired %llu\n", static_cast<unsigned long long>(lease->fencing_token()));
      return 0;
    }
    if (lease.status().code() == leasehold::StatusCode::kHeldByAnother) {
      const leasehold::LeaseInfo* h = lease.status().holder();
      std::printf("held %llu %s\n", h ? static_cast<unsigned long long>(h->fencing_token) : 0ULL,
                  h ? h->holder.c_str() : "?");
      return 3;
    }
    std::printf("error %s\n", lease.status().ToString().c_str());
    return 1;
  }
  if (mode == "hold" && argc >= 6) {
    options.wait = 10s;
    auto lease = (*store)->Acquire(argv[2], options);
    if (!lease.ok()) {
      std::printf("error %s\n", lease.status().ToString().c_str());
      return 1;
    }
    std::printf("acquired %llu %lld %u\n", static_cast<unsigned long long>(lease->fencing_token()),
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(lease->ttl()).count()),
                lease->slot());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(argv[5])));
    return lease->Release().ok() ? 0 : 1;
  }
  if (mode == "linger" && argc >= 6) {
    auto lease = (*store)->TryAcquire(argv[2], options);
    if (!lease.ok()) {
      std::printf("error %s\n", lease.status().ToString().c_str());
      return 1;
    }
    std::printf("acquired %llu\n", static_cast<unsigned long long>(lease->fencing_token()));
    std::fflush(stdout);
    leasehold::Status released =
        lease->Release({.hold_at_least = std::chrono::milliseconds(std::atoll(argv[5]))});
    if (!released.ok()) {
      std::printf("error %s\n", released.ToString().c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
