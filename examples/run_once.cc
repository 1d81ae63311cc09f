// run_once: the classic cron guard. However many copies of this program start at once (on one
// host with sqlite://, or anywhere with a shared store), exactly one does the work; the others
// see who is running it and exit quietly. The work stops the moment the lease is lost.
//
//   run_once [STORE_URL]      (default: $LEASEHOLD_STORE, else the embedded SQLite file)

#include <chrono>
#include <cstdio>
#include <thread>

#include "leasehold/leasehold.h"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  auto url = argc > 1 ? leasehold::Result<std::string>(argv[1]) : leasehold::Store::DefaultUrl();
  if (!url.ok()) {
    std::fprintf(stderr, "run_once: %s\n", url.status().ToString().c_str());
    return 64;
  }
  auto store = leasehold::Store::Open(*url);
  if (!store.ok()) {
    std::fprintf(stderr, "run_once: %s\n", store.status().ToString().c_str());
    return 69;
  }
  auto lease = (*store)->TryAcquire("example:run-once", {.ttl = 5s});
  if (lease.status().code() == leasehold::StatusCode::kHeldByAnother) {
    const leasehold::LeaseInfo* holder = lease.status().holder();
    std::printf("run_once: already running on %s; nothing to do\n",
                holder != nullptr ? holder->holder.c_str() : "another process");
    return 0;
  }
  if (!lease.ok()) {
    std::fprintf(stderr, "run_once: %s\n", lease.status().ToString().c_str());
    return 69;
  }
  std::stop_token lost = lease->lost_token();
  for (int step = 1; step <= 5; ++step) {
    if (lost.stop_requested()) {
      std::fprintf(stderr, "run_once: lease lost, stopping: %s\n",
                   lease->lost_reason().ToString().c_str());
      return 79;
    }
    std::printf("run_once: step %d of 5 (fencing token %llu)\n", step,
                static_cast<unsigned long long>(lease->fencing_token()));
    std::this_thread::sleep_for(20ms);
  }
  leasehold::Status released = lease->Release();
  if (!released.ok()) {
    std::fprintf(stderr, "run_once: %s\n", released.ToString().c_str());
    return 79;
  }
  return 0;
}
