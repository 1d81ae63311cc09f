// File: bench/postgres_bench.cc
//
// The postgres:// store's two modes under contention: C clients (threads, each with its own
// store handle, so its own sessions) contend for one key; each acquires (waiting the mode's way:
// the server's lock queue in advisory mode, LISTEN/NOTIFY in table mode, polling through
// PgBouncer), holds 1 ms, releases, pauses 2 ms, and contends again. For C = 1, 8, 32 it prints
// acquisitions per second, and the handoff (the next grant's time minus the previous release's,
// on CLOCK_BOOTTIME) at p50 and p99, with the p50's ratio to a `SELECT 1` round trip measured on
// the same server. With one client there is no handoff: the figure is then the client's own
// release-to-next-grant time. No thresholds: figures only.
//
//   postgres_bench [SECONDS_PER_RUN=3]

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <libpq-fe.h>

#include "leasehold/clock.h"
#include "leasehold/logging.h"
#include "leasehold/store.h"

#include "testing/postgres_server.h"

namespace {

using namespace std::chrono_literals;

constexpr auto kHold = 1ms;
constexpr auto kPauseAfterRelease = 2ms;
constexpr int kPings = 2000;

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
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5)];
}

// Median `SELECT 1` round trip in microseconds, on one libpq connection.
double SelectOneMicros(int port) {
  std::string conninfo = fmt::format("host=127.0.0.1 port={} user=postgres dbname=postgres", port);
  PGconn* conn = PQconnectdb(conninfo.c_str());
  std::vector<double> us;
  for (int i = 0; i < kPings && PQstatus(conn) == CONNECTION_OK; ++i) {
    long long t0 = NowNs();
    PGresult* r = PQexec(conn, "SELECT 1");
    us.push_back(static_cast<double>(NowNs() - t0) / 1000.0);
    PQclear(r);
  }
  PQfinish(conn);
  return Percentile(us, 0.5);
}

struct GrantTimes {
  long long acquired;
  long long released;
  int client;
};

struct Figures {
  double per_second = 0;
  double p50_us = 0;
  double p99_us = 0;
  std::size_t grants = 0;
  int errors = 0;
};

Figures Run(const std::string& url, int clients, std::chrono::seconds length) {
  std::vector<std::unique_ptr<leasehold::Store>> stores;
  Figures f;
  for (int i = 0; i < clients; ++i) {
    auto store = leasehold::Store::Open(url);
    if (!store.ok()) {
      std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
      ++f.errors;
      return f;
    }
    stores.push_back(std::move(store).value());
  }
  std::mutex mu;
  std::vector<GrantTimes> grants;
  std::atomic<int> errors{0};
  std::atomic<bool> stop{false};
  const long long start = NowNs();
  {
    std::vector<std::jthread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        while (!stop) {
          auto lease = stores[c]->Acquire("bench", {.ttl = 10s, .wait = 30s});
          if (!lease.ok()) {
            ++errors;
            continue;
          }
          long long acquired = NowNs();
          std::this_thread::sleep_for(kHold);
          long long released = NowNs();
          if (!lease->Release().ok()) {
            ++errors;
          }
          {
            std::lock_guard<std::mutex> lock(mu);
            grants.push_back({acquired, released, c});
          }
          std::this_thread::sleep_for(kPauseAfterRelease);
        }
      });
    }
    std::this_thread::sleep_for(length);
    stop = true;
  }
  const double seconds = static_cast<double>(NowNs() - start) / 1e9;
  std::sort(grants.begin(), grants.end(),
            [](const GrantTimes& a, const GrantTimes& b) { return a.acquired < b.acquired; });
  std::vector<double> handoff_us;
  for (std::size_t i = 1; i < grants.size(); ++i) {
    if (clients == 1 || grants[i].client != grants[i - 1].client) {
      handoff_us.push_back(static_cast<double>(grants[i].acquired - grants[i - 1].released) /
                           1000.0);
    }
  }
  f.grants = grants.size();
  f.per_second = static_cast<double>(grants.size()) / seconds;
  f.p50_us = Percentile(handoff_us, 0.5);
  f.p99_us = Percentile(handoff_us, 0.99);
  f.errors = errors;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const auto length = std::chrono::seconds(argc > 1 ? std::atoi(argv[1]) : 3);
  leasehold::SetLogLevel(leasehold::LogLevel::kWarning);
  auto server = leasehold::testing::PostgresServer::Start();
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  auto bouncer = leasehold::testing::PgBouncer::Start(**server);
  if (!bouncer.ok()) {
    std::fprintf(stderr, "%s\n", bouncer.status().ToString().c_str());
    return 1;
  }
  const double ping_us = SelectOneMicros((*server)->port());
  std::printf(
      "postgres bench: %llds per run, hold %lld ms, pause %lld ms; SELECT 1 round trip "
      "median %.1f us\n",
      static_cast<long long>(length.count()), static_cast<long long>(kHold.count()),
      static_cast<long long>(kPauseAfterRelease.count()), ping_us);
  std::printf("%-18s %8s %12s %14s %14s %14s %7s\n", "mode", "clients", "grants/s", "handoff p50us",
              "handoff p99us", "p50/SELECT 1", "errors");

  struct ModeUrl {
    const char* name;
    std::string url;
  };

  const std::vector<ModeUrl> modes = {
      {"advisory", (*server)->Url() + "?mode=advisory&schema=bench_advisory"},
      {"table", (*server)->Url() + "?mode=table&schema=bench_table"},
      {"table+pgbouncer", (*bouncer)->Url() + "?mode=table&schema=bench_table_pgb"},
  };
  for (const ModeUrl& mode : modes) {
    for (int clients : {1, 8, 32}) {
      Figures f = Run(mode.url, clients, length);
      std::printf("%-18s %8d %12.0f %14.0f %14.0f %14.1f %7d\n", mode.name, clients, f.per_second,
                  f.p50_us, f.p99_us, f.p50_us / ping_us, f.errors);
      std::fflush(stdout);
    }
  }
  return 0;
}
