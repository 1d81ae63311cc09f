// File: tests/backends/sqlite/sqlite_contention_test.cc
//
// Many writers on one sqlite:// file (issue #18, item 5): 32 handles in 4 processes hammer one
// file with try-acquire/release of a few hot keys while 100 leases (2 s TTL, so their
// heartbeats renew every 667 ms) are held through them. No operation may fail because
// other writers hold the write lock, and no lease may be lost. Uses only the public API, in
// forked children (the test forks before it starts any thread). Runs ~25 s
// (LEASEHOLD_CONTENTION_SECONDS to change); labelled "contention", not "unit", so that the
// sanitizer runs (scripts/test.sh) leave it out.

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "leasehold/lease.h"
#include "leasehold/options.h"
#include "leasehold/status.h"
#include "leasehold/store.h"

namespace leasehold {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kProcesses = 4;
constexpr int kHandlesPerProcess = 8;
constexpr int kLeasesPerProcess = 25;  // 100 in all
constexpr int kHotKeys = 32;

int HammerSeconds() {
  const char* env = std::getenv("LEASEHOLD_CONTENTION_SECONDS");
  const int n = env != nullptr ? std::atoi(env) : 25;
  return n > 0 && n <= 120 ? n : 25;
}

struct ChildResult {
  long ops = 0;
  long errors = 0;
  long lost = 0;
  std::string first_error;
};

// One process: 8 handles (Stores), 25 held leases spread over them, 8 hammering threads.
ChildResult RunChild(const std::string& url, int child, int hammer_seconds) {
  ChildResult result;
  std::mutex mu;
  auto note_error = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    ++result.errors;
    if (result.first_error.empty()) {
      result.first_error = what;
    }
  };
  std::vector<std::unique_ptr<Store>> stores;
  for (int h = 0; h < kHandlesPerProcess; ++h) {
    Result<std::unique_ptr<Store>> store = Store::Open(url);
    if (!store.ok()) {
      note_error(fmt::format("open: {}", store.status().ToString()));
      return result;
    }
    stores.push_back(std::move(*store));
  }
  std::vector<Lease> leases;
  for (int j = 0; j < kLeasesPerProcess; ++j) {
    Result<Lease> lease = stores[static_cast<std::size_t>(j % kHandlesPerProcess)]->TryAcquire(
        fmt::format("renewed:{}:{}", child, j), {.ttl = seconds(2)});
    if (!lease.ok()) {
      note_error(fmt::format("acquire a renewed lease: {}", lease.status().ToString()));
      continue;
    }
    leases.push_back(std::move(*lease));
  }
  std::atomic<long> ops{0};
  const auto end = std::chrono::steady_clock::now() + seconds(hammer_seconds);
  std::vector<std::thread> threads;
  for (int h = 0; h < kHandlesPerProcess; ++h) {
    threads.emplace_back([&, h] {
      Store& store = *stores[static_cast<std::size_t>(h)];
      std::minstd_rand rng(static_cast<unsigned>(child * 100 + h + 1));
      while (std::chrono::steady_clock::now() < end) {
        const std::string key = fmt::format("hot:{}", rng() % kHotKeys);
        Result<Lease> lease = store.TryAcquire(key, {.ttl = seconds(5)});
        ops.fetch_add(1);
        if (lease.ok()) {
          if (Status released = lease->Release(); !released.ok()) {
            note_error(fmt::format("release {}: {}", key, released.ToString()));
          }
        } else if (lease.status().code() != StatusCode::kHeldByAnother) {
          note_error(fmt::format("try-acquire {}: {}", key, lease.status().ToString()));
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  result.ops = ops.load();
  for (Lease& lease : leases) {
    if (!lease.valid() || !lease.lost_reason().ok()) {
      ++result.lost;
      if (result.first_error.empty()) {
        result.first_error =
            fmt::format("lost {}: {}", lease.key(), lease.lost_reason().ToString());
      }
      continue;
    }
    if (Status released = lease.Release(); !released.ok()) {
      ++result.lost;
      if (result.first_error.empty()) {
        result.first_error = fmt::format("release {}: {}", lease.key(), released.ToString());
      }
    }
  }
  return result;
}

TEST(SqliteContentionTest, ThirtyTwoHandlesInFourProcessesNeitherFailNorLoseLeases) {
  std::string dir_template =
      (std::filesystem::temp_directory_path() / "leasehold_contention_XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir_template.data()), nullptr);
  const std::string dir = dir_template;
  const std::string url = "sqlite://" + dir + "/leases.db";
  {
    // Create the file once, before the children race to.
    Result<std::unique_ptr<Store>> store = Store::Open(url);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
  }
  const int hammer_seconds = HammerSeconds();
  std::vector<pid_t> children;
  std::vector<FILE*> pipes;
  for (int c = 0; c < kProcesses; ++c) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      ChildResult r = RunChild(url, c, hammer_seconds);
      for (char& ch : r.first_error) {
        if (ch == '\n') {
          ch = ' ';
        }
      }
      const std::string line = fmt::format("{} {} {} {}\n", r.ops, r.errors, r.lost, r.first_error);
      (void)!::write(fds[1], line.data(), line.size());
      ::_exit(0);
    }
    ::close(fds[1]);
    children.push_back(pid);
    pipes.push_back(::fdopen(fds[0], "r"));
  }
  // Bounded: the hammering time plus a generous margin for setup and the final releases.
  const auto give_up = std::chrono::steady_clock::now() + seconds(hammer_seconds + 30);
  std::vector<bool> done(children.size(), false);
  std::size_t remaining = children.size();
  while (remaining > 0 && std::chrono::steady_clock::now() < give_up) {
    for (std::size_t i = 0; i < children.size(); ++i) {
      if (done[i]) {
        continue;
      }
      int status = 0;
      if (::waitpid(children[i], &status, WNOHANG) == children[i]) {
        done[i] = true;
        --remaining;
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << i;
      }
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  for (std::size_t i = 0; i < children.size(); ++i) {
    if (!done[i]) {
      ADD_FAILURE() << "child " << i << " did not finish in time";
      ::kill(children[i], SIGKILL);
      ::waitpid(children[i], nullptr, 0);
    }
  }
  long total_ops = 0;
  for (std::size_t i = 0; i < pipes.size(); ++i) {
    char buffer[2048] = {};
    const bool read = std::fgets(buffer, sizeof buffer, pipes[i]) != nullptr;
    std::fclose(pipes[i]);
    ASSERT_TRUE(read) << "child " << i << " reported nothing";
    long ops = 0;
    long errors = 0;
    long lost = 0;
    int consumed = 0;
    ASSERT_EQ(std::sscanf(buffer, "%ld %ld %ld %n", &ops, &errors, &lost, &consumed), 3) << buffer;
    std::string first_error = buffer + consumed;
    while (!first_error.empty() && first_error.back() == '\n') {
      first_error.pop_back();
    }
    std::printf("child %zu: %ld operations, %ld errors, %ld leases lost %s\n", i, ops, errors, lost,
                first_error.c_str());
    EXPECT_EQ(errors, 0) << "child " << i << ": " << buffer + consumed;
    EXPECT_EQ(lost, 0) << "child " << i << ": " << buffer + consumed;
    EXPECT_GT(ops, 0) << "child " << i;
    total_ops += ops;
  }
  std::printf("%ld operations in %d s across %d handles\n", total_ops, hammer_seconds,
              kProcesses * kHandlesPerProcess);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace leasehold
