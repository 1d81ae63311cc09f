#include "core/fork_guard.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

#include <fmt/format.h>

namespace leasehold::internal {

namespace {

std::atomic<std::uint64_t> g_forks{0};

void OnForkInChild() {
  g_forks.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

ProcessStamp CurrentProcess() {
  // Registered once, before any StoreCore exists: a fork before that has nothing to guard.
  static const bool registered = [] {
    return ::pthread_atfork(nullptr, nullptr, &OnForkInChild) == 0;
  }();
  (void)registered;  // without it (ENOMEM), the pid alone tells a child
  return ProcessStamp{.pid = ::getpid(), .forks = g_forks.load(std::memory_order_relaxed)};
}

bool IsForkedFrom(const ProcessStamp& stamp) {
  return g_forks.load(std::memory_order_relaxed) != stamp.forks || ::getpid() != stamp.pid;
}

Status ForkedChildStatus(std::string_view what, const ProcessStamp& stamp) {
  return Status::Lost(
      fmt::format(
          "{} belongs to process {}, and this is a fork of it (pid {}): a forked child never "
          "ends, renews or writes through its parent's grants or connections (the parent keeps "
          "them); open a new Store in the child",
          what, stamp.pid, ::getpid()),
      LostCause::kSessionLost);
}

}  // namespace leasehold::internal
