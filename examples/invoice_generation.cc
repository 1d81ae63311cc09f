// invoice_generation: a nightly job that must run once across a fleet. Every host's cron
// starts it a little after 02:00 (its own clock, its own cron); each claims the night's slot of
// the grid "every 24 h from 02:00" (Store::ClaimSlot). The first to claim it generates the
// night's invoices and records the slot as done, in the same atomic step as its release; the
// others see the slot running or done and do nothing, and so does a host that starts late or a
// retry after the winner finished. The fencing token on every invoice stops a winner that
// stalled past its TTL from writing over a successor.
//
//   invoice_generation STORE_URL OUT_DIR
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

// The nightly grid: 24 h slots from 02:00 UTC; a host up to 5 min early counts into the night.
const leasehold::SlotGrid kNightly{.period = 24h, .offset = 2h};

// Returns true if this host generated the night's invoices.
bool RunNightly(const std::string& url, const std::string& host, const std::string& out_dir) {
  auto store = leasehold::Store::Open(url);
  if (!store.ok()) {
    std::fprintf(stderr, "%s: %s\n", host.c_str(), store.status().ToString().c_str());
    return false;
  }
  auto claim = (*store)->ClaimSlot("job:invoice-generation", kNightly,
                                   {.ttl = 10s, .wait = 0s, .holder = host});
  if (claim.status().code() == leasehold::StatusCode::kHeldByAnother) {
    const leasehold::LeaseInfo* holder = claim.status().holder();
    std::printf("%s: tonight's run is on %s; nothing to do\n", host.c_str(),
                holder != nullptr ? holder->holder.c_str() : "another host");
    return false;
  }
  if (!claim.ok()) {
    std::fprintf(stderr, "%s: %s\n", host.c_str(), claim.status().ToString().c_str());
    return false;
  }
  const std::string night = leasehold::FormatSlotTime(claim->slot_start()).substr(0, 10);
  if (!claim->claimed()) {
    std::printf("%s: the %s run already finished on %s (fencing token %llu); nothing to do\n",
                host.c_str(), night.c_str(), claim->done_by()->holder.c_str(),
                static_cast<unsigned long long>(claim->done_by()->fencing_token));
    return false;
  }
  leasehold::Lease& lease = claim->lease();
  leasehold::FencedDirectory out(out_dir);
  const leasehold::FencingToken token = lease.fencing_token();
  std::printf("%s: generating invoices for %s (fencing token %llu)\n", host.c_str(), night.c_str(),
              static_cast<unsigned long long>(token));
  for (int c = 1; c <= kCustomers; ++c) {
    if (!lease.valid()) {
      std::fprintf(stderr, "%s: lease lost, stopping: %s\n", host.c_str(),
                   lease.lost_reason().ToString().c_str());
      return true;  // ~SlotClaim releases without recording: the night stays open
    }
    std::string invoice = "invoice " + night + " customer " + std::to_string(c) + " by " + host;
    if (Status s = out.Write("invoice-" + night + "-" + std::to_string(c), invoice, token);
        !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", host.c_str(), s.ToString().c_str());
      (void)claim->Finish({.succeeded = false, .exit_code = 1});
      return true;
    }
  }
  std::printf("%s: %d invoices written\n", host.c_str(), kCustomers);
  // Recorded only if the lease is still held: kLost means another run may have overlapped.
  if (Status s = claim->Finish({.succeeded = true}); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", host.c_str(), s.ToString().c_str());
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: invoice_generation STORE_URL OUT_DIR\n");
    return 64;
  }
  const std::string url = argv[1];
  const std::string out_dir = argv[2];
  // memory:// keeps its table only while a handle is open: hold one for the whole run, as a
  // real store would keep its data.
  auto keep_store = leasehold::Store::Open(url);
  if (!keep_store.ok()) {
    std::fprintf(stderr, "%s\n", keep_store.status().ToString().c_str());
    return 69;
  }
  std::atomic<int> runs{0};
  {
    std::vector<std::jthread> fleet;
    for (int h = 0; h < 4; ++h) {
      fleet.emplace_back([&, h] {
        if (RunNightly(url, "host-" + std::to_string(h), out_dir)) {
          ++runs;
        }
      });
    }
  }
  if (RunNightly(url, "host-late", out_dir)) {
    ++runs;
  }
  std::printf("%d host(s) generated tonight's invoices\n", runs.load());
  return runs == 1 ? 0 : 1;
}
