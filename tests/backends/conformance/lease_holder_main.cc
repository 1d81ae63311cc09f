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
// Options after the mode's arguments: limit=N (a semaphore of N), shared (a shared lease).
// Output is flushed per line so the test can read it while the process runs.

#include <unistd.h>

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <thread>

#include "leasehold/store.h"

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
