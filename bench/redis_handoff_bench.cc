// File: bench/redis_handoff_bench.cc
//
// Handoff latency of the redis:// store: N processes (default 8) contend for one key; each
// acquires (waiting through pub/sub), holds briefly, releases, then pauses before contending
// again so that a waiter, not the releaser, takes the next grant. Handoff = the next grant's
// time minus the moment the release was sent, both on CLOCK_BOOTTIME (shared by every process
// on the host). Prints median and p99, and their ratio to a Redis PING round trip measured on
// the same server. No thresholds: figures only.
//
//   redis_handoff_bench [PROCESSES=8] [GRANTS_PER_PROCESS=200]

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <sys/wait.h>

#include "leasehold/clock.h"
#include "leasehold/store.h"

#include "testing/redis_server.h"

namespace {

using namespace std::chrono_literals;

// Time a holder keeps the lease, and the pause after its release before it contends again.
constexpr auto kHold = 1ms;
constexpr auto kPauseAfterRelease = 5ms;
constexpr int kPings = 2000;

// One grant as a worker saw it, on CLOCK_BOOTTIME.
struct GrantTimes {
  long long started;   // Acquire called
  long long acquired;  // Acquire returned the lease
  long long released;  // Release about to be sent
  int worker;
};

long long NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             leasehold::BootClock::now().time_since_epoch())
      .count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) {
    return 0;
  }
  std::sort(v.begin(), v.end());
  std::size_t i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

int RunWorker(const std::string& url, int worker, int grants, const std::string& out_path) {
  auto store = leasehold::Store::Open(url);
  if (!store.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", worker, store.status().ToString().c_str());
    return 1;
  }
  std::ofstream out(out_path);
  for (int i = 0; i < grants; ++i) {
    long long started = NowNs();
    auto lease = (*store)->Acquire("bench:handoff",
                                   {.ttl = 10s, .wait = 60s, .holder = fmt::format("w{}", worker)});
    long long acquired = NowNs();
    if (!lease.ok()) {
      std::fprintf(stderr, "worker %d: %s\n", worker, lease.status().ToString().c_str());
      return 1;
    }
    std::this_thread::sleep_for(kHold);
    long long released = NowNs();
    if (!lease->Release().ok()) {
      return 1;
    }
    out << started << " " << acquired << " " << released << "\n";
    std::this_thread::sleep_for(kPauseAfterRelease);
  }
  return 0;
}

std::vector<double> PingRoundTrips(int port) {
  std::vector<double> us;
  redisContext* c = redisConnect("127.0.0.1", port);
  if (c == nullptr || c->err != 0) {
    return us;
  }
  for (int i = 0; i < kPings; ++i) {
    auto start = std::chrono::steady_clock::now();
    auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                     .count());
    freeReplyObject(reply);
  }
  redisFree(c);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  const int processes = argc > 1 ? std::atoi(argv[1]) : 8;
  const int grants = argc > 2 ? std::atoi(argv[2]) : 200;
  auto server = leasehold::testing::RedisServer::Start({.aof = false});
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string url = (*server)->Url();
  const std::string dir = (*server)->dir();
  std::vector<double> ping = PingRoundTrips((*server)->port());

  // Fork before this process starts any thread of its own.
  std::vector<pid_t> children;
  for (int w = 0; w < processes; ++w) {
    pid_t pid = fork();
    if (pid == 0) {
      _exit(RunWorker(url, w, grants, fmt::format("{}/events-{}.txt", dir, w)));
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += (WIFEXITED(status) && WEXITSTATUS(status) == 0) ? 0 : 1;
  }

  std::vector<GrantTimes> all;
  for (int w = 0; w < processes; ++w) {
    std::ifstream in(fmt::format("{}/events-{}.txt", dir, w));
    GrantTimes g{.worker = w};
    while (in >> g.started >> g.acquired >> g.released) {
      all.push_back(g);
    }
  }
  std::sort(all.begin(), all.end(),
            [](const GrantTimes& a, const GrantTimes& b) { return a.acquired < b.acquired; });
  // A handoff counts only when the next holder was already waiting when the release was sent;
  // otherwise the gap is idle time, not latency.
  std::vector<double> handoff_us;
  int same_process = 0;
  for (std::size_t i = 1; i < all.size(); ++i) {
    if (all[i].started < all[i - 1].released) {
      handoff_us.push_back(static_cast<double>(all[i].acquired - all[i - 1].released) / 1000.0);
      same_process += all[i].worker == all[i - 1].worker ? 1 : 0;
    }
  }
  const double ping_median = Percentile(ping, 0.5);
  const double median = Percentile(handoff_us, 0.5);
  const double p99 = Percentile(handoff_us, 0.99);
  std::printf("redis handoff: %d processes x %d grants, hold %lld ms, pause %lld ms%s\n", processes,
              grants, static_cast<long long>(kHold.count()),
              static_cast<long long>(kPauseAfterRelease.count()),
              failed ? fmt::format(" ({} workers FAILED)", failed).c_str() : "");
  std::printf("%-28s %12s %12s %14s\n", "", "median (us)", "p99 (us)", "median / PING");
  std::printf("%-28s %12.1f %12.1f %14.1f\n", "PING round trip", ping_median,
              Percentile(ping, 0.99), 1.0);
  std::printf("%-28s %12.1f %12.1f %14.1f\n", "release -> next grant", median, p99,
              ping_median > 0 ? median / ping_median : 0.0);
  std::printf("handoffs measured: %zu (to the releasing process itself: %d)\n", handoff_us.size(),
              same_process);
  return failed == 0 ? 0 : 1;
}
