// File: bench/leasehold_bench.cc
//
// leasehold-bench: every store, one run, every figure next to the store's own round trip (its
// "floor", bench/floor.h). It starts the stores itself on loopback (the test fixtures), measures
// in this order, and prints a table plus a JSON file:
//
//   1 floor        the store's cheapest round trip from the backend's client library
//   1b native      the store's native lock (bench/native.h: the cheapest correct lock a user
//                  writes by hand with the same client library, e.g. Redis SET NX PX +
//                  compare-and-delete): its uncontended try-acquire + release and its handoff,
//                  measured exactly as steps 2 and 4 (same counts, same 8 processes, hold and
//                  pause). Every uncontended and handoff figure of leasehold is also given as a
//                  ratio to it ("ratio_to_native", "handoff_ratio_to_native",
//                  "grants_ratio_to_native"; the "/nat" columns); variants compare with their
//                  store's lock (redis_fair with Redis', etcd_fair with etcd's, postgres_table
//                  with the table lock, postgres_advisory with the advisory one). A run whose
//                  --steps= leaves out `native` prints no such ratios.
//   2 uncontended  TryAcquire + Release of one key, sequential      (ratio to 2 x floor)
//   3 conflict     TryAcquire of a key another handle holds          (ratio to 1 x floor)
//   4 handoff      8 processes contend for one key, each holds 1 ms and pauses 1 ms after its
//                  release: grants/s, release -> next grant by another process (CLOCK_BOOTTIME,
//                  shared by every process on the host), fewest/most grants per process, and the
//                  longest wait in hold times
//   4b semaphore   the handoff of step 4 on a counting semaphore (LeaseOptions::limit = 4, issue
//                  19): 8 processes, each holds 1 ms and pauses 1 ms; grants/s and the handoff
//                  (a release -> the grant that took its permit, by another process that was
//                  waiting: permits are matched to grants first come first served), each also
//                  as a ratio to the exclusive lease of the same store (step 4; "/excl"). A
//                  store without shared leases (Capabilities::shared_leases) is noted, not run.
//   5 independent  16 threads, each its own handle and key: (acquire + release)/s, against the
//                  floor command's throughput from 16 threads, each its own connection
//   6 heartbeat    N leases held by one handle: CPU of this process, renewal calls and leases per
//                  heartbeat round, the round's latency in floors, resident memory per lease
//   7 takeover     the holder is killed with -9: time until a waiting handle holds the key,
//                  against the TTL the store granted
//
// No thresholds decide the exit code: it is 0 when every measurement ran. The targets of issue
// #10 are printed beside the figures ("ok" or "MISS xN") so a reader sees how far off they are.
//
//   leasehold-bench [--quick] [--stores=sqlite,redis,...] [--steps=floor,native,heartbeat,...]
//                   [--handoff-processes=8] [--json=FILE]
//
// Step names for --steps=: floor native uncontended conflict handoff semaphore independent
// heartbeat takeover (the ratios to a floor need `floor`, those to the native lock need `native`).
//
// --quick (the test suite's smoke run) uses small counts: its figures are noisy. Full mode is
// the one quoted in bench/RESULTS.md.

#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <sys/wait.h>

#include "leasehold/clock.h"
#include "leasehold/logging.h"
#include "leasehold/store.h"

#include "backends/forwarding_backend.h"
#include "backends/registry.h"
#include "core/store_access.h"
#include "core/url.h"
#include "floor.h"
#include "native.h"
#include "testing/server_process.h"
#include "testing/spawned_process.h"
#include "testing/store_fixtures.h"

namespace leasehold::bench {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

constexpr auto kHold = 1ms;
constexpr auto kPauseAfterRelease = 1ms;
constexpr int kIndependentThreads = 16;

struct Config {
  bool quick = false;
  int handoff_processes = 8;
  // Only these measurements (--steps=floor,heartbeat); empty: all.
  std::vector<std::string> steps;
  int floor_calls = 2000;
  int sequential_calls = 2000;
  std::chrono::seconds handoff_time{10};
  // Step 4b: the semaphore's limit (its processes are handoff_processes), and how long it runs
  // after its lead (the workers' time to open their handles).
  std::uint32_t semaphore_limit = 4;
  std::chrono::milliseconds semaphore_time{10'000};
  std::chrono::milliseconds semaphore_lead{1500};
  std::chrono::seconds independent_time{5};
  int heartbeat_leases = 10'000;
  std::chrono::seconds heartbeat_hold{60};
  std::chrono::seconds heartbeat_ttl{10};
  int takeover_repeats = 5;
  std::chrono::milliseconds takeover_ttl{2000};
};

Config QuickConfig() {
  Config c;
  c.quick = true;
  c.floor_calls = 300;
  c.sequential_calls = 200;
  // The test suite's smoke run (bench_quick_smoke, beside other tests): every step once on
  // every store, about 14 s a store (137 s for the 10 default rows); figures from it are noise
  // and it checks only that every step runs and reports.
  c.handoff_time = 1s;
  c.semaphore_time = 500ms;
  c.semaphore_lead = 500ms;
  c.independent_time = 1s;
  c.heartbeat_leases = 500;
  c.heartbeat_hold = 1s;
  c.heartbeat_ttl = 2s;
  c.takeover_repeats = 1;
  c.takeover_ttl = 1000ms;
  return c;
}

long long NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(BootClock::now().time_since_epoch())
      .count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) {
    return 0;
  }
  std::sort(v.begin(), v.end());
  auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct Dist {
  double median_us = 0;
  double p99_us = 0;
  std::size_t n = 0;
};

Dist Summarize(const std::vector<double>& us) {
  return {Percentile(us, 0.5), Percentile(us, 0.99), us.size()};
}

json ToJson(const Dist& d) {
  return {{"median_us", d.median_us}, {"p99_us", d.p99_us}, {"n", d.n}};
}

template <typename F>
double TimeUs(F&& f) {
  auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// One store (and mode) under test.
struct Subject {
  std::string name;
  std::string url;
  // True for stores that queue waiters (the fairness target applies).
  bool fair = false;
  std::function<Result<std::unique_ptr<FloorProbe>>()> open_floor;
  // SQLite, etcd, ZooKeeper: a write that reaches the disk, the least a grant costs (floor.h).
  std::function<Result<std::unique_ptr<FloorProbe>>()> open_durable_floor;
  // The store's own count of requests it has read, where it keeps one (Redis:
  // total_reads_processed; PostgreSQL: transactions committed), for requests per heartbeat round.
  std::function<std::optional<double>()> server_requests;
  std::string server_requests_what;
  // The kind of the store's native lock (bench/native.h); empty: none.
  std::string native_kind;
};

// ---- worker processes (the handoff contenders and the takeover holder) ----

// `limit`: LeaseOptions::limit (1: the exclusive lease of step 4; N: the semaphore of step 4b).
int HandoffWorker(const std::string& url, const std::string& key, int id, long long until_ns,
                  const std::string& out_path, std::uint32_t limit = 1) {
  auto store = Store::Open(url);
  if (!store.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", id, store.status().ToString().c_str());
    return 1;
  }
  std::ofstream out(out_path);
  while (NowNs() < until_ns) {
    long long started = NowNs();
    auto wait = std::chrono::nanoseconds(std::max(0LL, until_ns - started));
    auto lease = (*store)->Acquire(key, {.ttl = 10s,
                                         .wait = std::chrono::duration_cast<Duration>(wait),
                                         .limit = limit,
                                         .holder = fmt::format("w{}", id)});
    long long acquired = NowNs();
    if (!lease.ok()) {
      if (lease.status().code() == StatusCode::kDeadlineExceeded) {
        break;
      }
      std::fprintf(stderr, "worker %d: %s\n", id, lease.status().ToString().c_str());
      return 1;
    }
    std::this_thread::sleep_for(kHold);
    long long released = NowNs();
    if (Status s = lease->Release(); !s.ok()) {
      std::fprintf(stderr, "worker %d: release: %s\n", id, s.ToString().c_str());
      return 1;
    }
    out << started << " " << acquired << " " << released << "\n";
    std::this_thread::sleep_for(kPauseAfterRelease);
  }
  return 0;
}

// The handoff contender of the native step: the same loop as HandoffWorker, on the store's
// native lock (its wait strategy: bench/native.h). The lock is opened before the start.
int NativeHandoffWorker(NativeLock& lock, int id, long long until_ns, const std::string& out_path) {
  std::ofstream out(out_path);
  while (NowNs() < until_ns) {
    long long started = NowNs();
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::nanoseconds(std::max(0LL, until_ns - started));
    Status acquired_status = lock.Acquire(deadline);
    long long acquired = NowNs();
    if (!acquired_status.ok()) {
      if (acquired_status.code() == StatusCode::kDeadlineExceeded) {
        break;
      }
      std::fprintf(stderr, "native worker %d: %s\n", id, acquired_status.ToString().c_str());
      return 1;
    }
    std::this_thread::sleep_for(kHold);
    long long released = NowNs();
    if (Status s = lock.Release(); !s.ok()) {
      std::fprintf(stderr, "native worker %d: release: %s\n", id, s.ToString().c_str());
      return 1;
    }
    out << started << " " << acquired << " " << released << "\n";
    std::this_thread::sleep_for(kPauseAfterRelease);
  }
  return 0;
}

int TakeoverHolder(const std::string& url, const std::string& key, long long ttl_ms) {
  auto store = Store::Open(url);
  if (!store.ok()) {
    std::printf("error %s\n", store.status().ToString().c_str());
    return 1;
  }
  auto lease = (*store)->Acquire(key, {.ttl = std::chrono::milliseconds(ttl_ms), .wait = 30s});
  if (!lease.ok()) {
    std::printf("error %s\n", lease.status().ToString().c_str());
    return 1;
  }
  std::printf("held %llu\n", static_cast<unsigned long long>(lease->fencing_token()));
  std::fflush(stdout);
  std::this_thread::sleep_for(120s);  // killed with -9 long before
  return 0;
}

std::string SelfPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("leasehold-bench");
}

// ---- a Backend that counts the heartbeat's renewal calls (and times them) ----

class CountingBackend final : public internal::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  std::vector<Status> RenewMany(std::span<const internal::RenewRequest> requests) override {
    calls_.fetch_add(1);
    leases_.fetch_add(requests.size());
    auto start = std::chrono::steady_clock::now();
    std::vector<Status> out = inner().RenewMany(requests);
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard lock(mu_);
    round_us_.push_back(us);
    for (const Status& s : out) {
      failures_ += s.ok() ? 0 : 1;
    }
    return out;
  }

  std::uint64_t calls() const { return calls_.load(); }

  std::uint64_t leases() const { return leases_.load(); }

  std::vector<double> round_us() {
    std::lock_guard lock(mu_);
    return round_us_;
  }

  std::uint64_t failures() {
    std::lock_guard lock(mu_);
    return failures_;
  }

  void Reset() {
    calls_ = 0;
    leases_ = 0;
    std::lock_guard lock(mu_);
    round_us_.clear();
    failures_ = 0;
  }

 private:
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> leases_{0};
  std::mutex mu_;
  std::vector<double> round_us_;
  std::uint64_t failures_ = 0;
};

long ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  long size = 0;
  long resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

std::size_t HeapBytesInUse() {
  struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto secs = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
  };
  return secs(usage.ru_utime) + secs(usage.ru_stime);
}

// ---- the measurements ----

class Runner {
 public:
  Runner(Config config, Subject subject) : config_(config), s_(std::move(subject)) {}

  // Runs every measurement; returns the JSON record (with "error" when one failed).
  json Run() {
    json out = {{"store", s_.name}, {"fair", s_.fair}};
    auto step = [&](const char* name, const std::function<Result<json>()>& f) {
      if (!config_.steps.empty() && std::find(config_.steps.begin(), config_.steps.end(),
                                              std::string(name)) == config_.steps.end()) {
        return;
      }
      std::fprintf(stderr, "  %s: %s...\n", s_.name.c_str(), name);
      Result<json> r = f();
      if (!r.ok()) {
        out["errors"].push_back(fmt::format("{}: {}", name, r.status().ToString()));
        failed_ = true;
        return;
      }
      out[name] = *r;
    };
    // A store without a floor probe of the bench's own is measured without the ratios to it.
    const bool floor = static_cast<bool>(s_.open_floor);
    if (!floor) {
      out["notes"].push_back("no floor probe (bench/floor.h): floor and independent not measured");
    }
    if (floor) {
      step("floor", [&] { return Floor(); });
    }
    if (!s_.native_kind.empty()) {
      step("native", [&] { return Native(); });
    } else {
      out["notes"].push_back("no native lock (bench/native.h): no ratios to it");
    }
    step("uncontended", [&] { return Uncontended(); });
    step("conflict", [&] { return Conflict(); });
    step("handoff", [&] { return Handoff(); });
    step("semaphore", [&] { return Semaphore(); });
    if (floor) {
      step("independent", [&] { return Independent(); });
    }
    step("heartbeat", [&] { return Heartbeat(); });
    step("takeover", [&] { return Takeover(); });
    return out;
  }

  bool failed() const { return failed_; }

 private:
  Result<json> Floor() {
    LH_ASSIGN_OR_RETURN(std::unique_ptr<FloorProbe> probe, s_.open_floor());
    std::vector<double> us;
    for (int i = 0; i < config_.floor_calls + 50; ++i) {
      Status st;
      double t = TimeUs([&] { st = probe->Call(); });
      LH_RETURN_IF_ERROR(st);
      if (i >= 50) {  // warm-up
        us.push_back(t);
      }
    }
    floor_ = Summarize(us);
    json out = ToJson(floor_);
    if (s_.open_durable_floor) {
      LH_ASSIGN_OR_RETURN(std::unique_ptr<FloorProbe> durable, s_.open_durable_floor());
      std::vector<double> dus;
      for (int i = 0; i < std::min(config_.floor_calls, 300) + 5; ++i) {
        Status st;
        double t = TimeUs([&] { st = durable->Call(); });
        LH_RETURN_IF_ERROR(st);
        if (i >= 5) {
          dus.push_back(t);
        }
      }
      durable_floor_ = Summarize(dus);
      out["durable"] = ToJson(durable_floor_);
    }
    return out;
  }

  Result<json> Uncontended() {
    LH_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(s_.url));
    std::vector<double> pair_us;
    std::vector<double> acquire_us;
    std::vector<double> release_us;
    for (int i = 0; i < config_.sequential_calls + 20; ++i) {
      Result<Lease> lease = Status::Internal("unset");
      double a = TimeUs([&] { lease = store->TryAcquire("bench:uncontended", {.ttl = 10s}); });
      LH_RETURN_IF_ERROR(lease.status());
      Status released;
      double r = TimeUs([&] { released = lease->Release(); });
      LH_RETURN_IF_ERROR(released);
      if (i >= 20) {
        pair_us.push_back(a + r);
        acquire_us.push_back(a);
        release_us.push_back(r);
      }
    }
    Dist pair = Summarize(pair_us);
    json out = {{"pair", ToJson(pair)},
                {"acquire", ToJson(Summarize(acquire_us))},
                {"release", ToJson(Summarize(release_us))},
                {"ratio_to_2_floors", pair.median_us / (2 * floor_.median_us)}};
    if (durable_floor_.n > 0) {
      out["ratio_to_2_durable_floors"] = pair.median_us / (2 * durable_floor_.median_us);
    }
    if (native_pair_.n > 0) {
      out["ratio_to_native"] = pair.median_us / native_pair_.median_us;
    }
    return out;
  }

  // The native lock (bench/native.h), measured as Uncontended and Handoff measure leasehold.
  Result<json> Native() {
    LH_ASSIGN_OR_RETURN(std::unique_ptr<NativeLock> lock,
                        OpenNativeLock(s_.native_kind, s_.url, "bench:native:uncontended"));
    std::vector<double> pair_us;
    std::vector<double> acquire_us;
    std::vector<double> release_us;
    for (int i = 0; i < config_.sequential_calls + 20; ++i) {
      Result<bool> got = false;
      double a = TimeUs([&] { got = lock->TryAcquire(); });
      LH_RETURN_IF_ERROR(got.status());
      if (!*got) {
        return Status::Internal("native lock: uncontended try-acquire refused");
      }
      Status released;
      double r = TimeUs([&] { released = lock->Release(); });
      LH_RETURN_IF_ERROR(released);
      if (i >= 20) {
        pair_us.push_back(a + r);
        acquire_us.push_back(a);
        release_us.push_back(r);
      }
    }
    lock.reset();
    native_pair_ = Summarize(pair_us);
    json uncontended = {{"pair", ToJson(native_pair_)},
                        {"acquire", ToJson(Summarize(acquire_us))},
                        {"release", ToJson(Summarize(release_us))}};
    if (floor_.n > 0) {
      uncontended["ratio_to_2_floors"] = native_pair_.median_us / (2 * floor_.median_us);
    }
    const std::string key = fmt::format("bench:native:handoff:{}", NowNs());
    LH_ASSIGN_OR_RETURN(
        json handoff,
        RunHandoff([&](int w, long long start_ns, long long until_ns, const std::string& out) {
          return std::vector<std::string>{
              SelfPath(),        "--worker=native-handoff", s_.native_kind,           s_.url, key,
              std::to_string(w), std::to_string(start_ns),  std::to_string(until_ns), out};
        }));
    native_handoff_median_us_ = handoff["handoff"]["median_us"].get<double>();
    native_grants_per_second_ = handoff["grants_per_second"].get<double>();
    return json{{"kind", s_.native_kind}, {"uncontended", uncontended}, {"handoff", handoff}};
  }

  Result<json> Conflict() {
    LH_ASSIGN_OR_RETURN(std::unique_ptr<Store> holder_store, Store::Open(s_.url));
    LH_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(s_.url));
    LH_ASSIGN_OR_RETURN(Lease held, holder_store->TryAcquire("bench:conflict", {.ttl = 30s}));
    std::vector<double> us;
    for (int i = 0; i < config_.sequential_calls + 20; ++i) {
      Result<Lease> lease = Status::Internal("unset");
      double t = TimeUs([&] { lease = store->TryAcquire("bench:conflict", {.ttl = 30s}); });
      if (lease.ok() || lease.status().code() != StatusCode::kHeldByAnother) {
        return Status::Internal(fmt::format("conflict try returned {}",
                                            lease.ok() ? "a lease" : lease.status().ToString()));
      }
      if (i >= 20) {
        us.push_back(t);
      }
    }
    LH_RETURN_IF_ERROR(held.Release());
    Dist d = Summarize(us);
    return json{{"try", ToJson(d)}, {"ratio_to_floor", d.median_us / floor_.median_us}};
  }

  Result<json> Handoff() {
    const std::string key = fmt::format("bench:handoff:{}", NowNs());
    LH_ASSIGN_OR_RETURN(json out, RunHandoff([&](int w, long long start_ns, long long until_ns,
                                                 const std::string& events) {
                          return std::vector<std::string>{SelfPath(),
                                                          "--worker=handoff",
                                                          s_.url,
                                                          key,
                                                          std::to_string(w),
                                                          std::to_string(start_ns),
                                                          std::to_string(until_ns),
                                                          events};
                        }));
    if (native_handoff_median_us_ > 0) {
      out["handoff_ratio_to_native"] =
          out["handoff"]["median_us"].get<double>() / native_handoff_median_us_;
    }
    if (native_grants_per_second_ > 0) {
      out["grants_ratio_to_native"] =
          out["grants_per_second"].get<double>() / native_grants_per_second_;
    }
    exclusive_grants_per_second_ = out["grants_per_second"].get<double>();
    exclusive_handoff_median_us_ = out["handoff"]["median_us"].get<double>();
    return out;
  }

  // Step 4b: step 4's handoff on a semaphore of config_.semaphore_limit permits.
  Result<json> Semaphore() {
    const std::uint32_t limit = config_.semaphore_limit;
    const std::string key = fmt::format("bench:semaphore:{}", NowNs());
    {
      // A store without shared leases refuses before sending anything: noted, not measured.
      LH_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(s_.url));
      Result<Lease> probe = store->TryAcquire(key, {.ttl = 10s, .limit = limit});
      if (!probe.ok() && probe.status().code() == StatusCode::kUnimplemented) {
        return json{{"limit", limit}, {"skipped", probe.status().ToString()}};
      }
      LH_RETURN_IF_ERROR(probe.status());
      LH_RETURN_IF_ERROR(probe->Release());
    }
    LH_ASSIGN_OR_RETURN(
        json out,
        RunHandoff(
            [&](int w, long long start_ns, long long until_ns, const std::string& events) {
              return std::vector<std::string>{SelfPath(),
                                              "--worker=semaphore-handoff",
                                              s_.url,
                                              key,
                                              std::to_string(w),
                                              std::to_string(start_ns),
                                              std::to_string(until_ns),
                                              events,
                                              std::to_string(limit)};
            },
            limit, config_.semaphore_time, config_.semaphore_lead));
    out["limit"] = limit;
    if (exclusive_grants_per_second_ > 0) {
      out["grants_ratio_to_exclusive"] =
          out["grants_per_second"].get<double>() / exclusive_grants_per_second_;
    }
    if (exclusive_handoff_median_us_ > 0 && out["handoff"]["n"].get<std::size_t>() > 0) {
      out["handoff_ratio_to_exclusive"] =
          out["handoff"]["median_us"].get<double>() / exclusive_handoff_median_us_;
    }
    return out;
  }

  // The handoff measurement: config_.handoff_processes processes, started by argv_for(worker,
  // start, until, events file), each writing "started acquired released" per grant, on a key
  // of `limit` permits (1: exclusive), for `run_for` after a lead of `lead`.
  using WorkerArgv =
      std::function<std::vector<std::string>(int, long long, long long, const std::string&)>;

  Result<json> RunHandoff(const WorkerArgv& argv_for) {
    return RunHandoff(argv_for, 1, config_.handoff_time, 1500ms);
  }

  Result<json> RunHandoff(const WorkerArgv& argv_for, std::uint32_t limit, Duration run_for,
                          Duration lead) {
    char tmpl[] = "/tmp/leasehold-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      return Status::Unavailable("mkdtemp failed");
    }
    const std::string dir = tmpl;
    const long long start_ns =
        NowNs() + std::chrono::nanoseconds(lead).count();  // time for every worker to open
    const long long until_ns = start_ns + std::chrono::nanoseconds(run_for).count();
    std::vector<std::unique_ptr<testing::SpawnedProcess>> workers;
    for (int w = 0; w < config_.handoff_processes; ++w) {
      workers.push_back(std::make_unique<testing::SpawnedProcess>(
          argv_for(w, start_ns, until_ns, fmt::format("{}/events-{}.txt", dir, w))));
    }
    int failed = 0;
    for (auto& w : workers) {
      failed += w->Wait() == 0 ? 0 : 1;
    }

    struct GrantTimes {
      long long started, acquired, released;
      int worker;
    };

    std::vector<GrantTimes> all;
    std::vector<int> per_worker(config_.handoff_processes, 0);
    for (int w = 0; w < config_.handoff_processes; ++w) {
      std::ifstream in(fmt::format("{}/events-{}.txt", dir, w));
      GrantTimes g{0, 0, 0, w};
      while (in >> g.started >> g.acquired >> g.released) {
        all.push_back(g);
        ++per_worker[static_cast<std::size_t>(w)];
      }
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    if (failed > 0) {
      return Status::Internal(fmt::format("{} handoff workers failed", failed));
    }
    std::sort(all.begin(), all.end(),
              [](const GrantTimes& a, const GrantTimes& b) { return a.acquired < b.acquired; });
    // A handoff: the permit a release freed went to another process that was already waiting
    // when the release was sent. Its latency is release sent -> grant returned. Each grant takes
    // the permit of the earliest release not yet taken (the first `limit` grants the key's free
    // permits); with limit 1 that is the previous grant's release.
    std::vector<double> handoff_us;
    std::vector<double> wait_us;
    int to_self = 0;

    struct Freed {
      long long at;
      int worker;
    };

    std::vector<Freed> releases;
    releases.reserve(all.size());
    for (const GrantTimes& g : all) {
      releases.push_back({g.released, g.worker});
    }
    std::sort(releases.begin(), releases.end(),
              [](const Freed& a, const Freed& b) { return a.at < b.at; });
    std::size_t next_release = 0;  // releases[next_release..] not yet taken
    std::uint32_t free_permits = limit;
    for (std::size_t i = 0; i < all.size(); ++i) {
      wait_us.push_back(static_cast<double>(all[i].acquired - all[i].started) / 1000.0);
      if (free_permits > 0) {
        --free_permits;
        continue;
      }
      if (next_release >= releases.size() || releases[next_release].at > all[i].acquired) {
        continue;  // no release before this grant (clock noise): nothing to match
      }
      const Freed& freed = releases[next_release++];
      if (freed.worker == all[i].worker) {
        ++to_self;
      } else if (all[i].started < freed.at) {
        handoff_us.push_back(static_cast<double>(all[i].acquired - freed.at) / 1000.0);
      }
    }
    const auto [fewest, most] = std::minmax_element(per_worker.begin(), per_worker.end());
    const double seconds = std::chrono::duration<double>(run_for).count();
    Dist h = Summarize(handoff_us);
    const double hold_us = std::chrono::duration<double, std::micro>(kHold).count();
    return json{
        {"processes", config_.handoff_processes},
        {"grants", all.size()},
        {"grants_per_second", static_cast<double>(all.size()) / seconds},
        {"handoff", ToJson(h)},
        {"handoff_median_floors", floor_.n > 0 ? h.median_us / floor_.median_us : 0.0},
        {"grants_to_the_releaser", to_self},
        {"fewest", *fewest},
        {"most", *most},
        {"fairness", *most > 0 ? static_cast<double>(*fewest) / *most : 0.0},
        {"wait", ToJson(Summarize(wait_us))},
        {"max_wait_holds",
         wait_us.empty() ? 0.0 : *std::max_element(wait_us.begin(), wait_us.end()) / hold_us},
        {"p99_wait_holds", Percentile(wait_us, 0.99) / hold_us}};
  }

  Result<json> Independent() {
    const auto run_for = config_.independent_time;
    // The store's own throughput: the floor command from 16 threads, each its own connection.
    std::vector<std::unique_ptr<FloorProbe>> probes;
    for (int t = 0; t < kIndependentThreads; ++t) {
      LH_ASSIGN_OR_RETURN(std::unique_ptr<FloorProbe> probe, s_.open_floor());
      probes.push_back(std::move(probe));
    }
    std::atomic<long> floor_ops{0};
    std::atomic<bool> errors{false};
    {
      auto until = std::chrono::steady_clock::now() + run_for;
      std::vector<std::jthread> threads;
      for (auto& probe : probes) {
        threads.emplace_back([&, p = probe.get()] {
          while (std::chrono::steady_clock::now() < until) {
            if (!p->Call().ok()) {
              errors = true;
              return;
            }
            ++floor_ops;
          }
        });
      }
    }
    probes.clear();
    std::vector<std::unique_ptr<Store>> stores;
    for (int t = 0; t < kIndependentThreads; ++t) {
      LH_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(s_.url));
      stores.push_back(std::move(store));
    }
    std::atomic<long> pairs{0};
    std::mutex error_mu;
    Status first_error;
    {
      auto until = std::chrono::steady_clock::now() + run_for;
      std::vector<std::jthread> threads;
      for (int t = 0; t < kIndependentThreads; ++t) {
        threads.emplace_back([&, t] {
          const std::string key = fmt::format("bench:independent:{}", t);
          while (std::chrono::steady_clock::now() < until) {
            auto lease = stores[static_cast<std::size_t>(t)]->TryAcquire(key, {.ttl = 10s});
            Status s = lease.ok() ? lease->Release() : lease.status();
            if (!s.ok()) {
              std::lock_guard lock(error_mu);
              if (first_error.ok()) {
                first_error = s;
              }
              errors = true;
              return;
            }
            ++pairs;
          }
        });
      }
    }
    if (errors) {
      return Status::Internal(
          fmt::format("an operation failed under concurrency: {}",
                      first_error.ok() ? "a floor call" : first_error.ToString()));
    }
    const double secs = std::chrono::duration<double>(run_for).count();
    const double pairs_per_s = static_cast<double>(pairs.load()) / secs;
    const double floor_per_s = static_cast<double>(floor_ops.load()) / secs;
    // Acquire and release are one operation each: the ratio compares operations per second.
    return json{{"threads", kIndependentThreads},
                {"pairs_per_second", pairs_per_s},
                {"floor_ops_per_second", floor_per_s},
                {"ratio_ops_to_floor_ops", 2 * pairs_per_s / floor_per_s}};
  }

  Result<json> Heartbeat() {
    LH_ASSIGN_OR_RETURN(internal::Url url, internal::ParseUrl(s_.url));
    LH_ASSIGN_OR_RETURN(std::shared_ptr<internal::Backend> backend,
                        internal::OpenBackend(url, Clock::Real()));
    auto counting = std::make_shared<CountingBackend>(std::move(backend));
    std::unique_ptr<Store> store = internal::OpenStoreWithBackend(counting);
    std::vector<Lease> leases;
    leases.reserve(static_cast<std::size_t>(config_.heartbeat_leases));
    // Warm up the handle (connections, threads) before the memory baseline.
    LH_ASSIGN_OR_RETURN(Lease first, store->TryAcquire("bench:hb:warm", {.ttl = 10s}));
    LH_RETURN_IF_ERROR(first.Release());
    const long rss_before = ResidentBytes();
    const std::size_t heap_before = HeapBytesInUse();
    auto acquire_start = std::chrono::steady_clock::now();
    const std::string prefix = fmt::format("bench:hb:{}:", NowNs());
    for (int i = 0; i < config_.heartbeat_leases; ++i) {
      LH_ASSIGN_OR_RETURN(Lease lease, store->TryAcquire(fmt::format("{}{}", prefix, i),
                                                         {.ttl = config_.heartbeat_ttl}));
      leases.push_back(std::move(lease));
    }
    const double acquire_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - acquire_start).count();
    const long rss_after = ResidentBytes();
    const std::size_t heap_after = HeapBytesInUse();
    // PostgreSQL publishes a session's statistics up to a second after its transactions:
    // let the acquisitions' land before the first reading, and the last round's before the
    // second.
    constexpr auto kStatsSettle = 1500ms;
    if (s_.server_requests) {
      std::this_thread::sleep_for(kStatsSettle);
    }
    counting->Reset();
    const std::optional<double> server_before =
        s_.server_requests ? s_.server_requests() : std::nullopt;
    const double cpu_before = CpuSeconds();
    std::this_thread::sleep_for(config_.heartbeat_hold);
    const double cpu = CpuSeconds() - cpu_before;
    const double rounds = static_cast<double>(counting->calls());
    const std::uint64_t leases_renewed = counting->leases();
    std::optional<double> server_after;
    double server_rounds = rounds;
    if (s_.server_requests) {
      std::this_thread::sleep_for(kStatsSettle);
      server_after = s_.server_requests();
      server_rounds = static_cast<double>(counting->calls());
    }
    std::size_t valid = 0;
    for (const Lease& l : leases) {
      valid += l.valid() ? 1 : 0;
    }
    std::vector<double> round_us = counting->round_us();
    json out = {
        {"leases", config_.heartbeat_leases},
        {"ttl_s", config_.heartbeat_ttl.count()},
        {"hold_s", config_.heartbeat_hold.count()},
        {"acquire_all_s", acquire_s},
        {"still_valid", valid},
        {"renew_failures", counting->failures()},
        {"cpu_s", cpu},
        {"cpu_percent_of_one_core",
         100.0 * cpu / std::chrono::duration<double>(config_.heartbeat_hold).count()},
        {"renew_calls", rounds},
        {"leases_renewed", leases_renewed},
        {"leases_per_call", rounds > 0 ? static_cast<double>(leases_renewed) / rounds : 0.0},
        {"round", ToJson(Summarize(round_us))},
        {"round_median_floors", Percentile(round_us, 0.5) / floor_.median_us},
        // malloc's bytes in use: exact for what this process allocated for the leases (the
        // handle's Lease objects, the backend's bookkeeping). RSS may not grow at all when the
        // heap has room left by earlier measurements, so it is shown for reference only.
        {"heap_bytes_per_lease",
         static_cast<double>(heap_after - heap_before) / config_.heartbeat_leases},
        {"rss_bytes_per_lease",
         static_cast<double>(rss_after - rss_before) / config_.heartbeat_leases}};
    if (server_before && server_after && server_rounds > 0) {
      // The reading itself costs the store a request or two (redis-cli, psql): not subtracted.
      out["server_requests_per_call"] = (*server_after - *server_before) / server_rounds;
      out["server_requests_what"] = s_.server_requests_what;
    }
    for (Lease& l : leases) {
      (void)l.Release();
    }
    return out;
  }

  Result<json> Takeover() {
    std::vector<double> ms;
    double granted_ttl_ms = 0;
    for (int r = 0; r < config_.takeover_repeats; ++r) {
      const std::string key = fmt::format("bench:takeover:{}", NowNs());
      testing::SpawnedProcess holder(
          {SelfPath(), "--worker=hold", s_.url, key, std::to_string(config_.takeover_ttl.count())});
      std::string line = holder.ReadLine();
      if (line.rfind("held ", 0) != 0) {
        return Status::Internal(fmt::format("holder: {}", line));
      }
      LH_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(s_.url));
      LH_ASSIGN_OR_RETURN(std::optional<LeaseInfo> info, store->Inspect(key));
      if (info) {
        granted_ttl_ms = static_cast<double>(info->ttl.count());
      }
      std::atomic<long long> acquired_ns{0};
      Status waiter_status;
      std::jthread waiter([&] {
        auto lease = store->Acquire(key, {.ttl = 10s, .wait = 60s});
        acquired_ns = NowNs();
        waiter_status = lease.status();
      });
      std::this_thread::sleep_for(200ms);  // the waiter is waiting
      const long long killed_ns = NowNs();
      holder.Kill9();
      waiter.join();
      LH_RETURN_IF_ERROR(waiter_status);
      ms.push_back(static_cast<double>(acquired_ns.load() - killed_ns) / 1e6);
    }
    Dist d = Summarize(ms);
    return json{{"repeats", ms.size()},
                {"requested_ttl_ms", config_.takeover_ttl.count()},
                {"granted_ttl_ms", granted_ttl_ms},
                {"median_ms", d.median_us},
                {"max_ms", ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end())},
                {"median_minus_ttl_ms", d.median_us - granted_ttl_ms}};
  }

  Config config_;
  Subject s_;
  Dist floor_;
  Dist durable_floor_;
  // The native lock's figures (step `native`); zero when it did not run.
  Dist native_pair_;
  double native_handoff_median_us_ = 0;
  double native_grants_per_second_ = 0;
  // Step 4's figures, for step 4b's ratios; zero when it did not run.
  double exclusive_grants_per_second_ = 0;
  double exclusive_handoff_median_us_ = 0;
  bool failed_ = false;
};

// ---- the stores ----

struct Started {
  std::vector<Subject> subjects;
  std::vector<std::shared_ptr<void>> servers;  // kept alive for the run
  std::vector<std::string> errors;
};

bool Wanted(const std::vector<std::string>& only, const std::string& name) {
  return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
}

// The bench's own probes of each store's cheapest round trip (floor.h), by fixture name; a store
// without a row is measured without a floor ("n/a" in the ratios).
struct Floors {
  const char* name;
  Result<std::unique_ptr<FloorProbe>> (*open_floor)(const std::string& url);
  Result<std::unique_ptr<FloorProbe>> (*open_durable_floor)(const std::string& url);
};

constexpr Floors kFloors[] = {
#if LEASEHOLD_WITH_SQLITE
    {"sqlite", OpenSqliteFloor, OpenSqliteDurableFloor},
#endif
#if LEASEHOLD_WITH_REDIS
    {"redis", OpenRedisFloor, nullptr},
    {"redis_fair", OpenRedisFloor, nullptr},
    {"rediss", OpenRedisFloor, nullptr},
    {"redis_sentinel", OpenRedisFloor, nullptr},
    {"redis_cluster", OpenRedisFloor, nullptr},
#endif
#if LEASEHOLD_WITH_POSTGRES
    {"postgres_advisory", OpenPostgresFloor, nullptr},
    {"postgres_table", OpenPostgresFloor, nullptr},
#endif
#if LEASEHOLD_WITH_ETCD
    {"etcd", OpenEtcdFloor, OpenEtcdDurableFloor},
    {"etcd_fair", OpenEtcdFloor, OpenEtcdDurableFloor},
#endif
#if LEASEHOLD_WITH_ZOOKEEPER
    {"zk", OpenZkFloor, OpenZkDurableFloor},
#endif
};

// The native lock (bench/native.h) a fixture's figures are compared with; empty: none.
std::string NativeKindOf(const std::string& fixture) {
  for (const char* kind :
       {"sqlite", "redis", "postgres_advisory", "postgres_table", "etcd", "zk"}) {
    if (fixture == kind || fixture == std::string(kind) + "_fair") {
      return kind;
    }
  }
  return "";
}

// The stores of the shared fixtures (tests/testing/store_fixtures.h) that the run measures.
Started StartStores(const std::vector<std::string>& only) {
  Started st;
  // Redis without persistence, and room for the handoff and independent-keys connections.
  testing::SetStoreFixtureOptions({.redis_aof = false, .postgres_max_connections = 200});
  for (const testing::StoreFixture& fixture : testing::AllStoreFixtures()) {
    if (only.empty() ? !fixture.in_bench : !Wanted(only, fixture.name)) {
      continue;
    }
    if (Status started = fixture.start(); !started.ok()) {
      st.errors.push_back(started.ToString());
      continue;
    }
    char tmpl[] = "/tmp/leasehold-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      st.errors.push_back(fmt::format("mkdtemp: {}", std::strerror(errno)));
      continue;
    }
    std::string dir = tmpl;
    st.servers.push_back(std::shared_ptr<void>(nullptr, [dir](void*) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }));
    const std::string url = fixture.new_store_url(dir);
    (void)Store::Open(url);  // creates what the store needs (the sqlite file the floor opens)
    Subject subject{fixture.name,
                    url,
                    fixture.fair,
                    {},
                    {},
                    fixture.server_requests,
                    fixture.server_requests_what};
    subject.native_kind = NativeKindOf(fixture.name);
    for (const Floors& floors : kFloors) {
      if (fixture.name == floors.name) {
        subject.open_floor = [url, open = floors.open_floor] { return open(url); };
        if (floors.open_durable_floor != nullptr) {
          subject.open_durable_floor = [url, open = floors.open_durable_floor] {
            return open(url);
          };
        }
      }
    }
    st.subjects.push_back(std::move(subject));
  }
  return st;
}

// ---- output ----

std::string Verdict(double value, double target, bool at_most = true) {
  if (value <= 0) {
    return "n/a";
  }
  bool ok = at_most ? value <= target : value >= target;
  if (ok) {
    return "ok";
  }
  return fmt::format("MISS x{:.1f}", at_most ? value / target : target / value);
}

void PrintTable(const json& results) {
  // "/nat": the figure over the store's native lock's (bench/native.h), "-" when not measured.
  auto native_ratio = [](const json& j, const char* field) {
    return j.contains(field) ? fmt::format("{:.2f}", j[field].get<double>()) : std::string("-");
  };
  std::printf("\n%-18s %9s %9s | %9s %6s %-9s %6s | %9s %6s %-9s\n", "store", "floor", "floor",
              "acq+rel", "/2fl", "<=1.25", "/nat", "conflict", "/fl", "<=1.25");
  std::printf("%-18s %9s %9s | %9s %6s %-9s %6s | %9s %6s %-9s\n", "", "p50 us", "p99 us", "p50 us",
              "", "", "", "p50 us", "", "");
  for (const json& r : results) {
    if (!r.contains("floor") || !r.contains("uncontended") || !r.contains("conflict")) {
      continue;
    }
    double u = r["uncontended"]["ratio_to_2_floors"];
    double c = r["conflict"]["ratio_to_floor"];
    std::printf("%-18s %9.1f %9.1f | %9.1f %6.2f %-9s %6s | %9.1f %6.2f %-9s\n",
                r["store"].get<std::string>().c_str(), r["floor"]["median_us"].get<double>(),
                r["floor"]["p99_us"].get<double>(),
                r["uncontended"]["pair"]["median_us"].get<double>(), u, Verdict(u, 1.25).c_str(),
                native_ratio(r["uncontended"], "ratio_to_native").c_str(),
                r["conflict"]["try"]["median_us"].get<double>(), c, Verdict(c, 1.25).c_str());
  }
  for (const json& r : results) {
    if (r.contains("floor") && r["floor"].contains("durable") && r.contains("uncontended")) {
      double u = r["uncontended"]["ratio_to_2_durable_floors"];
      std::printf(
          "%-18s durable floor (the store's cheapest write) p50 %.1f us: acq+rel / 2 durable "
          "floors = %.2f %s\n",
          r["store"].get<std::string>().c_str(), r["floor"]["durable"]["median_us"].get<double>(),
          u, Verdict(u, 1.25).c_str());
    }
  }
  std::printf("\n%-18s %-17s %9s %9s %9s %9s %9s %7s\n", "native lock", "(bench/native.h)",
              "acq+rel", "/2fl", "handoff", "grants/s", "handoff", "fair");
  std::printf("%-18s %-17s %9s %9s %9s %9s %9s %7s\n", "", "kind", "p50 us", "", "p50 us", "",
              "p99 us", "");
  for (const json& r : results) {
    if (!r.contains("native")) {
      continue;
    }
    const json& n = r["native"];
    std::printf(
        "%-18s %-17s %9.1f %9s %9.1f %9.0f %9.1f %7.2f\n", r["store"].get<std::string>().c_str(),
        n["kind"].get<std::string>().c_str(), n["uncontended"]["pair"]["median_us"].get<double>(),
        native_ratio(n["uncontended"], "ratio_to_2_floors").c_str(),
        n["handoff"]["handoff"]["median_us"].get<double>(),
        n["handoff"]["grants_per_second"].get<double>(),
        n["handoff"]["handoff"]["p99_us"].get<double>(), n["handoff"]["fairness"].get<double>());
  }
  std::printf("\n%-18s %8s %6s %9s %9s %7s %-9s %6s %7s %-9s %8s\n", "handoff", "grants/s", "/nat",
              "p50 us", "p99 us", "/floor", "<=3", "/nat", "fair", ">=0.8*", "maxwait");
  for (const json& r : results) {
    if (!r.contains("handoff")) {
      continue;
    }
    const json& h = r["handoff"];
    double f = h["handoff_median_floors"];
    double fair = h["fairness"];
    std::printf("%-18s %8.0f %6s %9.1f %9.1f %7.1f %-9s %6s %7.2f %-9s %7.0fx\n",
                r["store"].get<std::string>().c_str(), h["grants_per_second"].get<double>(),
                native_ratio(h, "grants_ratio_to_native").c_str(),
                h["handoff"]["median_us"].get<double>(), h["handoff"]["p99_us"].get<double>(), f,
                Verdict(f, 3).c_str(), native_ratio(h, "handoff_ratio_to_native").c_str(), fair,
                r["fair"].get<bool>() ? Verdict(fair, 0.8, false).c_str() : "(unfair)",
                h["max_wait_holds"].get<double>());
  }
  std::printf("(* fairness target for fair stores only; maxwait in hold times, target <= 10x)\n");
  bool semaphore_header = false;
  int semaphore_processes = 0;
  for (const json& r : results) {
    if (!r.contains("semaphore")) {
      continue;
    }
    const json& h = r["semaphore"];
    if (!semaphore_header) {
      semaphore_header = true;
      std::printf("\n%-18s %8s %6s %9s %9s %7s %6s %7s %8s\n",
                  fmt::format("semaphore N={}", h["limit"].get<std::uint32_t>()).c_str(),
                  "grants/s", "/excl", "p50 us", "p99 us", "/floor", "/excl", "fair", "maxwait");
    }
    if (h.contains("skipped")) {
      std::printf("%-18s (not run: %s)\n", r["store"].get<std::string>().c_str(),
                  h["skipped"].get<std::string>().c_str());
      continue;
    }
    semaphore_processes = h["processes"].get<int>();
    std::printf("%-18s %8.0f %6s %9.1f %9.1f %7.1f %6s %7.2f %7.0fx\n",
                r["store"].get<std::string>().c_str(), h["grants_per_second"].get<double>(),
                native_ratio(h, "grants_ratio_to_exclusive").c_str(),
                h["handoff"]["median_us"].get<double>(), h["handoff"]["p99_us"].get<double>(),
                h["handoff_median_floors"].get<double>(),
                native_ratio(h, "handoff_ratio_to_exclusive").c_str(), h["fairness"].get<double>(),
                h["max_wait_holds"].get<double>());
  }
  if (semaphore_processes > 0) {
    std::printf(
        "(%d processes, each hold 1 ms then pause 1 ms; /excl: over the exclusive "
        "lease's handoff row above)\n",
        semaphore_processes);
  }
  std::printf("\n%-18s %10s %10s %7s %-9s\n", "independent (16t)", "acq+rel/s", "floor/s", "ops/fl",
              ">=0.5");
  for (const json& r : results) {
    if (!r.contains("independent")) {
      continue;
    }
    const json& i = r["independent"];
    double ratio = i["ratio_ops_to_floor_ops"];
    std::printf("%-18s %10.0f %10.0f %7.2f %-9s\n", r["store"].get<std::string>().c_str(),
                i["pairs_per_second"].get<double>(), i["floor_ops_per_second"].get<double>(), ratio,
                Verdict(ratio, 0.5, false).c_str());
  }
  std::printf("\n%-18s %7s %6s %7s %-9s %8s %9s %8s %7s %-9s\n", "heartbeat", "leases", "cpu%", "",
              "<=2%", "calls", "lease/cl", "srv/call", "heapB/ls", "<=1024");
  for (const json& r : results) {
    if (!r.contains("heartbeat")) {
      continue;
    }
    const json& h = r["heartbeat"];
    double cpu = h["cpu_percent_of_one_core"];
    double bytes = h["heap_bytes_per_lease"];
    std::string srv = h.contains("server_requests_per_call")
                          ? fmt::format("{:.1f}", h["server_requests_per_call"].get<double>())
                          : "-";
    std::printf("%-18s %7d %6.2f %7s %-9s %8.0f %9.0f %8s %7.0f %-9s\n",
                r["store"].get<std::string>().c_str(), h["leases"].get<int>(), cpu, "",
                Verdict(cpu, 2.0).c_str(), h["renew_calls"].get<double>(),
                h["leases_per_call"].get<double>(), srv.c_str(), bytes,
                Verdict(bytes, 1024).c_str());
  }
  std::printf("\n%-18s %8s %10s %10s %12s\n", "takeover (kill -9)", "ttl ms", "median ms", "max ms",
              "median-ttl");
  for (const json& r : results) {
    if (!r.contains("takeover")) {
      continue;
    }
    const json& t = r["takeover"];
    std::printf("%-18s %8.0f %10.1f %10.1f %12.1f\n", r["store"].get<std::string>().c_str(),
                t["granted_ttl_ms"].get<double>(), t["median_ms"].get<double>(),
                t["max_ms"].get<double>(), t["median_minus_ttl_ms"].get<double>());
  }
  for (const json& r : results) {
    if (r.contains("errors")) {
      for (const auto& e : r["errors"]) {
        std::printf("ERROR %s: %s\n", r["store"].get<std::string>().c_str(),
                    e.get<std::string>().c_str());
      }
    }
  }
}

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) {
      out.push_back(item);
    }
  }
  return out;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "--worker=handoff" && args.size() == 7) {
    const long long start_ns = std::stoll(args[4]);
    while (NowNs() < start_ns) {
      std::this_thread::sleep_for(1ms);
    }
    return HandoffWorker(args[1], args[2], std::stoi(args[3]), std::stoll(args[5]), args[6]);
  }
  if (!args.empty() && args[0] == "--worker=semaphore-handoff" && args.size() == 8) {
    const long long start_ns = std::stoll(args[4]);
    while (NowNs() < start_ns) {
      std::this_thread::sleep_for(1ms);
    }
    return HandoffWorker(args[1], args[2], std::stoi(args[3]), std::stoll(args[5]), args[6],
                         static_cast<std::uint32_t>(std::stoul(args[7])));
  }
  if (!args.empty() && args[0] == "--worker=native-handoff" && args.size() == 8) {
    auto lock = OpenNativeLock(args[1], args[2], args[3]);
    if (!lock.ok()) {
      std::fprintf(stderr, "native worker %s: %s\n", args[4].c_str(),
                   lock.status().ToString().c_str());
      return 1;
    }
    const long long start_ns = std::stoll(args[5]);
    while (NowNs() < start_ns) {
      std::this_thread::sleep_for(1ms);
    }
    return NativeHandoffWorker(**lock, std::stoi(args[4]), std::stoll(args[6]), args[7]);
  }
  if (!args.empty() && args[0] == "--worker=hold" && args.size() == 4) {
    return TakeoverHolder(args[1], args[2], std::stoll(args[3]));
  }
  Config config;
  int handoff_processes = 8;
  std::vector<std::string> steps;
  std::vector<std::string> only;
  std::string json_path = "leasehold-bench.json";
  for (const std::string& a : args) {
    if (a == "--quick") {
      config = QuickConfig();
    } else if (a.rfind("--stores=", 0) == 0) {
      only = Split(a.substr(9));
    } else if (a.rfind("--handoff-processes=", 0) == 0) {
      handoff_processes = std::max(2, std::atoi(a.c_str() + 20));
    } else if (a.rfind("--steps=", 0) == 0) {
      steps = Split(a.substr(8));
    } else if (a.rfind("--json=", 0) == 0) {
      json_path = a.substr(7);
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: leasehold-bench [--quick] [--stores=NAME,...] [--handoff-processes=8] "
          "[--json=FILE]\n"
          "Starts every store on loopback and measures floor, native lock, uncontended,\n"
          "conflict, handoff, semaphore handoff (limit 4),\n"
          "independent keys, heartbeat at scale and takeover; prints a table and writes JSON\n"
          "(default leasehold-bench.json). Stores: sqlite redis redis_fair rediss "
          "redis_cluster\n"
          "postgres_advisory postgres_table etcd etcd_fair zk (those compiled in; redis_sentinel\n"
          "and postgres_table_pgbouncer on request).\n");
      return 0;
    } else {
      std::fprintf(stderr, "leasehold-bench: unknown argument '%s' (see --help)\n", a.c_str());
      return 64;
    }
  }
  config.handoff_processes = handoff_processes;
  config.steps = steps;
  signal(SIGPIPE, SIG_IGN);
  SetLogSink([](const LogRecord&) {});  // the library's warnings would garble the table
  Started started = StartStores(only);
  for (const std::string& e : started.errors) {
    std::fprintf(stderr, "leasehold-bench: %s\n", e.c_str());
  }
  json results = json::array();
  bool failed = !started.errors.empty();
  for (const Subject& subject : started.subjects) {
    Runner runner(config, subject);
    results.push_back(runner.Run());
    failed = failed || runner.failed();
  }
  json doc = {{"mode", config.quick ? "quick" : "full"},
              {"results", results},
              {"hold_ms", kHold.count()},
              {"pause_after_release_ms", kPauseAfterRelease.count()}};
  std::ofstream(json_path) << doc.dump(2) << "\n";
  PrintTable(results);
  std::printf("\nJSON: %s\n", json_path.c_str());
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace leasehold::bench

int main(int argc, char** argv) {
  return leasehold::bench::Main(argc, argv);
}
