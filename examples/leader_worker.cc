// leader_worker: a worker pool where one elected leader does the work, and everyone can see who
// leads and how it is doing. Each worker runs Election::CampaignLoop, so it never silently stops
// competing; the leader writes a status record every tick (leader id, term, tick, lease state)
// through a fenced directory, so a deposed leader's late status can never overwrite its
// successor's; an observer prints every change of leader (Election::Observe).
//
//   leader_worker STORE_URL STATUS_DIR
//
// Three workers share one process here (with a sqlite:// or redis:// store they could as well
// be three hosts). Each leader works three ticks and steps down; the program ends after six
// terms. Exits 0 if the terms increased and the status record names the last leader.

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "leasehold/leasehold.h"

namespace {

using namespace std::chrono_literals;
using leasehold::Status;

constexpr int kTermsToRun = 6;
constexpr int kTicksPerTerm = 3;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: leader_worker STORE_URL STATUS_DIR\n");
    return 64;
  }
  const std::string url = argv[1];
  const std::string status_dir = argv[2];

  std::mutex mu;
  std::condition_variable cv;
  std::vector<leasehold::FencingToken> terms;  // in the order leaders started
  std::string last_leader;
  std::stop_source stop;

  // The observer: who leads, as anyone (a dashboard, `leasehold leader svc --watch`) sees it.
  auto observer_store = leasehold::Store::Open(url);
  if (!observer_store.ok()) {
    std::fprintf(stderr, "%s\n", observer_store.status().ToString().c_str());
    return 69;
  }
  leasehold::Election watch(**observer_store, "example-worker", "observer");
  std::jthread observer([&] {
    Status s = watch.Observe(
        [](const std::optional<leasehold::LeaderInfo>& leader) {
          if (leader.has_value()) {
            std::printf("[observer] leader is %s (term %llu)\n", leader->id.c_str(),
                        static_cast<unsigned long long>(leader->term));
          } else {
            std::printf("[observer] no leader\n");
          }
          std::fflush(stdout);
        },
        stop.get_token());
    if (!s.ok()) {
      std::fprintf(stderr, "observer: %s\n", s.ToString().c_str());
    }
  });

  std::vector<Status> results(3);
  std::vector<std::unique_ptr<leasehold::Store>> stores;
  for (int w = 0; w < 3; ++w) {
    auto store = leasehold::Store::Open(url);
    if (!store.ok()) {
      std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
      return 69;
    }
    stores.push_back(std::move(store).value());
  }
  std::vector<std::jthread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&, w] {
      const std::string id = "worker-" + std::to_string(w);
      leasehold::Election election(
          *stores[w], "example-worker", id,
          {.lease = {.ttl = 3s},
           .on_event = [id](leasehold::ElectionEvent e, const leasehold::LeaderInfo& l,
                            const Status& why) {
             if (e == leasehold::ElectionEvent::kLostLeadership) {
               std::printf("[%s] lost leadership of term %llu: %s\n", id.c_str(),
                           static_cast<unsigned long long>(l.term), why.ToString().c_str());
             }
           }});
      leasehold::FencedDirectory status(status_dir);
      results[w] = election.CampaignLoop(
          [&](leasehold::Leadership& leadership) {
            {
              std::lock_guard<std::mutex> lock(mu);
              terms.push_back(leadership.term());
              last_leader = id;
            }
            for (int tick = 1; tick <= kTicksPerTerm; ++tick) {
              if (!leadership.valid()) {
                return leadership.lost_reason();  // kLost: CampaignLoop campaigns again
              }
              // The heartbeat-visible status: anyone can read STATUS_DIR/status.
              std::string line = id + " term=" + std::to_string(leadership.term()) +
                                 " tick=" + std::to_string(tick) + " lease=" +
                                 std::string(leasehold::LeaseStateName(leadership.state())) + "\n";
              if (Status s = status.Write("status", line, leadership.term()); !s.ok()) {
                return s;  // fenced out: a newer leader exists; stop acting as leader
              }
              std::printf("[%s] %s", id.c_str(), line.c_str());
              std::fflush(stdout);
              // One unit of "work"; a real worker would pass leadership.lost_token() down.
              std::this_thread::sleep_for(10ms);
            }
            std::lock_guard<std::mutex> lock(mu);
            if (terms.size() >= kTermsToRun) {
              stop.request_stop();
            }
            return Status();  // step down; the loop resigns and campaigns again
          },
          stop.get_token());
    });
  }
  workers.clear();
  stop.request_stop();
  observer.join();

  int rc = 0;
  for (const Status& r : results) {
    if (!r.ok()) {
      std::fprintf(stderr, "worker ended with %s\n", r.ToString().c_str());
      rc = 1;
    }
  }
  for (std::size_t i = 1; i < terms.size(); ++i) {
    if (terms[i] <= terms[i - 1]) {
      std::fprintf(stderr, "terms did not increase: %llu then %llu\n",
                   static_cast<unsigned long long>(terms[i - 1]),
                   static_cast<unsigned long long>(terms[i]));
      rc = 1;
    }
  }
  std::ifstream in(status_dir + "/status");
  std::stringstream record;
  record << in.rdbuf();
  std::printf("final status record: %s", record.str().c_str());
  if (terms.size() < kTermsToRun || record.str().rfind(last_leader + " term=", 0) != 0) {
    std::fprintf(stderr, "the status record does not name the last leader %s\n",
                 last_leader.c_str());
    rc = 1;
  }
  return rc;
}
