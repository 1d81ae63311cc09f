// File: tools/cli/grant_watch.cc
//
// GrantWatch (grant_watch.h).

#include "grant_watch.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "cli_log.h"

namespace leasehold::cli {
namespace {

using std::chrono::milliseconds;

// A wait that ends sooner than this did not wait for anything: the store reports the key as
// changed or free while this holder holds it (another permit of a semaphore came or went, a
// store that wakes at the grant's expiry as it read it). The confirmation after such a wake is
// followed by a pause, doubled after each quick wake up to the renew interval, so that the
// watch costs at most one round trip per renew interval beside the heartbeat's.
constexpr Duration kQuickWake = milliseconds(20);
constexpr Duration kFirstPause = milliseconds(20);

// Sleeps for `d` or until `stop` is requested.
void SleepFor(Duration d, const std::stop_token& stop) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  cv.wait_for(lock, stop, d, [] { return false; });
}

}  // namespace

GrantWatch::GrantWatch(Store& store, const Lease& lease, std::function<Status()> confirm)
    : store_(store), lease_(lease), confirm_(std::move(confirm)) {
  if (!store_.notifies_holder()) {
    return;
  }
  thread_ = std::thread([this] { Watch(stop_.get_token()); });
}

void GrantWatch::Stop() {
  stop_.request_stop();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void GrantWatch::Watch(std::stop_token stop) {
  // A loss the heartbeat finds ends the watch too.
  std::stop_callback on_lost(lease_.lost_token(), [this] { stop_.request_stop(); });
  Clock& clock = store_.clock();
  const std::string& key = lease_.key();
  const Duration ttl = lease_.ttl();
  const Duration renew = lease_.renew_interval();
  Duration pause = Duration::zero();
  while (!stop.stop_requested()) {
    const SteadyTime started = clock.Now();
    const Status woke = store_.WaitForChange(key, started + ttl, stop);
    if (stop.stop_requested()) {
      return;
    }
    if (woke.code() == StatusCode::kUnimplemented) {
      Info(
          fmt::format("{}: the store does not say when the grant ends ({}); a force-release is "
                      "found at the next renewal",
                      key, woke.message()));
      return;
    }
    if (woke.code() == StatusCode::kDeadlineExceeded) {
      pause = Duration::zero();
      continue;  // nothing changed for a whole TTL
    }
    if (!woke.ok()) {
      // The store did not answer: the heartbeat's renewals say what that means for the lease.
      SleepFor(renew, stop);
      continue;
    }
    if (confirm_().code() == StatusCode::kLost) {
      return;  // on_lost has run: the supervisor stops the tree
    }
    if (clock.Now() - started < kQuickWake) {
      pause = std::min<Duration>(pause == Duration::zero() ? kFirstPause : pause * 2, renew);
      SleepFor(pause, stop);
    } else {
      pause = Duration::zero();
    }
  }
}

}  // namespace leasehold::cli
