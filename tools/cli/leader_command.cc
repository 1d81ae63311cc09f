// File: tools/cli/leader_command.cc

#include "leader_command.h"

#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/signalfd.h>

#include "leasehold/duration.h"
#include "leasehold/election.h"
#include "leasehold/store.h"

#include "cli_log.h"
#include "exit_codes.h"
#include "interrupt_watcher.h"
#include "store_flag.h"
#include "unique_fd.h"

namespace leasehold::cli {

namespace {

// Election needs a candidate id even to look: this one never campaigns.
constexpr const char* kObserverId = "leasehold-cli-observer";

void PrintLeader(const std::string& name, const std::optional<LeaderInfo>& leader, bool json) {
  std::string line;
  if (json) {
    nlohmann::ordered_json j;
    j["name"] = name;
    j["leader"] = leader.has_value();
    if (leader.has_value()) {
      j["id"] = leader->id;
      j["term"] = leader->term;
      j["remaining_ms"] = leader->remaining.count();
    }
    line = j.dump();
  } else if (leader.has_value()) {
    line = fmt::format("{}: leader {} (term {}, {} left)", Printable(name), Printable(leader->id),
                       leader->term, FormatDuration(RoundForDisplay(leader->remaining)));
  } else {
    line = fmt::format("{}: no leader", Printable(name));
  }
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);  // --watch feeds pipes: one line per change, as it happens
}

}  // namespace

int LeaderCommand(const std::string& store_url, const std::string& name, bool watch, bool json) {
  if (!watch) {
    auto store = OpenStoreFromFlag(store_url);
    if (!store.ok()) {
      return ReportFailure(store.error());
    }
    Election election(**store, name, kObserverId);
    Result<std::optional<LeaderInfo>> leader = election.Leader();
    if (!leader.ok()) {
      return ReportFailure(leader.error());
    }
    PrintLeader(name, *leader, json);
    return 0;
  }

  // Block before the store's threads exist; the interrupts arrive on the signalfd and stop the
  // watch. SIGPIPE too: a closed stdout then fails a write instead of killing us silently.
  sigset_t interrupts;
  sigemptyset(&interrupts);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    sigaddset(&interrupts, sig);
  }
  sigset_t blocked = interrupts;
  sigaddset(&blocked, SIGPIPE);
  if (int err = ::pthread_sigmask(SIG_BLOCK, &blocked, nullptr); err != 0) {
    return ReportFailure(Status::Internal(fmt::format("pthread_sigmask: {}", std::strerror(err))));
  }
  UniqueFd signal_fd(::signalfd(-1, &interrupts, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd.valid()) {
    return ReportFailure(Status::Internal(fmt::format("signalfd: {}", std::strerror(errno))));
  }
  InterruptWatcher watcher(signal_fd.get());
  auto store = OpenStoreFromFlag(store_url);
  if (!store.ok()) {
    return ReportFailure(store.error());
  }
  Election election(**store, name, kObserverId);
  Status watched = election.Observe(
      [&](const std::optional<LeaderInfo>& leader) { PrintLeader(name, leader, json); },
      watcher.token());
  watcher.Stop();
  if (!watched.ok()) {
    return ReportFailure(watched);
  }
  return 0;
}

}  // namespace leasehold::cli
