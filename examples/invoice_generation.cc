// invoice_generation: a nightly job that must run once across a fleet. Every host's cron
// starts it at 02:00; whichever host takes the lease "job:invoice-generation:<night>" generates
// the night's invoices, and the others see who is running it and do nothing. A "done" record,
// written with the lease's fencing token like every invoice, makes a host that starts late (or a
// retry after the winner finished) skip the night too: the lease stops concurrent runs, the
// record stops repeated ones, and the fencing token stops a winner that stalled past its TTL
// from writing over a successor.
//
//   invoice_generation STORE_URL OUT_DIR [NIGHT]
//
// Simulates four hosts (threads with their own Store handle; with sqlite:// or redis:// they
// could be four machines), then a late fifth. Exits 0 if exactly one host generated invoices.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "leasehold/leasehold.h"

namespace {

using namespace std::chrono_literals;
using leasehold::Status;

constexpr int kCustomers = 5;

// Returns true if this host generated the night's invoices.
bool RunNightly(const std::string& url, const std::string& host, const std::string& night,
                const std::string& out_dir) {
  auto store = leasehold::Store::Open(url);
  if (!store.ok()) {
    std::fprintf(stderr, "%s: %s\n", host.c_str(), store.status().ToString().c_str());
    return false;
  }
  auto lease =
      (*store)->TryAcquire("job:invoice-generation:" + night, {.ttl = 10s, .holder = host});
  if (lease.status().code() == leasehold::StatusCode::kHeldByAnother) {
    const leasehold::LeaseInfo* holder = lease.status().holder();
    std::printf("%s: the %s run is on %s; nothing to do\n", host.c_str(), night.c_str(),
                holder != nullptr ? holder->holder.c_str() : "another host");
    return false;
  }
  if (!lease.ok()) {
    std::fprintf(stderr, "%s: %s\n", host.c_str(), lease.status().ToString().c_str());
    return false;
  }
  leasehold::FencedDirectory out(out_dir);
  auto done = out.HighestToken("done-" + night);
  if (done.ok() && *done > 0) {
    std::printf("%s: the %s run already finished (fencing token %llu); nothing to do\n",
                host.c_str(), night.c_str(), static_cast<unsigned long long>(*done));
    return false;  // ~Lease releases
  }
  const leasehold::FencingToken token = lease->fencing_token();
  std::printf("%s: generating invoices for %s (fencing token %llu)\n", host.c_str(), night.c_str(),
              static_cast<unsigned long long>(token));
  for (int c = 1; c <= kCustomers; ++c) {
    if (!lease->valid()) {
      std::fprintf(stderr, "%s: lease lost, stopping: %s\n", host.c_str(),
                   lease->lost_reason().ToString().c_str());
      return true;
    }
    std::string invoice = "invoice " + night + " customer " + std::to_string(c) + " by " + host;
    if (Status s = out.Write("invoice-" + night + "-" + std::to_string(c), invoice, token);
        !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", host.c_str(), s.ToString().c_str());
      return true;
    }
  }
  if (Status s = out.Write("done-" + night, host + "\n", token); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", host.c_str(), s.ToString().c_str());
  }
  std::printf("%s: %d invoices written\n", host.c_str(), kCustomers);
  if (Status s = lease->Release(); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", host.c_str(), s.ToString().c_str());
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: invoice_generation STORE_URL OUT_DIR [NIGHT]\n");
    return 64;
  }
  const std::string url = argv[1];
  const std::string out_dir = argv[2];
  const std::string night = argc == 4 ? argv[3] : "2026-11-28";
  std::atomic<int> runs{0};
  {
    std::vector<std::jthread> fleet;
    for (int h = 0; h < 4; ++h) {
      fleet.emplace_back([&, h] {
        if (RunNightly(url, "host-" + std::to_string(h), night, out_dir)) {
          ++runs;
        }
      });
    }
  }
  if (RunNightly(url, "host-late", night, out_dir)) {
    ++runs;
  }
  std::printf("%d host(s) generated the %s invoices\n", runs.load(), night.c_str());
  return runs == 1 ? 0 : 1;
}
