// zk_holder: a lease holder in its own process, for tests that pause it (SIGSTOP).
//   zk_holder URL KEY TTL_MS
// Takes KEY with TryAcquire and prints "acquired FENCING_TOKEN TTL_MS" (the granted TTL), then
// checks Lease::valid() every 5 ms and prints "lost REASON" as soon as it is false, then exits 0.
// Exits 1 (printing "error ...") if it cannot take the key; gives up after 120 s (exit 2).
// Output is flushed per line so the test can read it while the process runs.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "leasehold/store.h"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  if (argc != 4) {
    std::fprintf(stderr, "usage: zk_holder URL KEY TTL_MS\n");
    return 2;
  }
  auto store = leasehold::Store::Open(argv[1]);
  if (!store.ok()) {
    std::printf("error %s\n", store.status().ToString().c_str());
    return 1;
  }
  auto lease = (*store)->TryAcquire(
      argv[2], {.ttl = std::chrono::milliseconds(std::atoll(argv[3])), .holder = "zk_holder"});
  if (!lease.ok()) {
    std::printf("error %s\n", lease.status().ToString().c_str());
    return 1;
  }
  std::printf("acquired %llu %lld\n", static_cast<unsigned long long>(lease->fencing_token()),
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(lease->ttl()).count()));
  std::fflush(stdout);
  for (int i = 0; i < 120'000 / 5; ++i) {
    if (!lease->valid()) {
      std::printf("lost %s\n", lease->lost_reason().ToString().c_str());
      std::fflush(stdout);
      return 0;
    }
    std::this_thread::sleep_for(5ms);
  }
  return 2;
}
