// File: tools/cli/child_env.cc

#include "child_env.h"

#include <signal.h>

#include <cstring>
#include <iterator>
#include <string_view>

#include <fmt/format.h>

extern char** environ;

namespace leasehold::cli {

std::vector<std::string> BuildChildEnvironment(const std::vector<std::string>& drop,
                                               const std::vector<std::string>& add) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    bool dropped = false;
    for (const std::string& d : drop) {
      dropped = dropped || name == d;
    }
    if (!dropped) {
      env.emplace_back(entry);
    }
  }
  env.insert(env.end(), add.begin(), add.end());
  return env;
}

std::vector<std::string> LeaseChildEnvironment(const Lease& lease, FencingToken token,
                                               std::vector<std::string> extra) {
  // An environment cannot carry a NUL byte: the etcd store key of a shared or semaphore grant
  // has one (README, "etcd"), and goes to the command with it written as %00, and so a % as
  // %25 (a key name may have one): percent-decoding gives the key back exactly.
  std::string store_key;
  for (char c : lease.store_key()) {
    if (c == '\0') {
      store_key += "%00";
    } else if (c == '%') {
      store_key += "%25";
    } else {
      store_key += c;
    }
  }
  std::vector<std::string> add = {"LEASEHOLD_KEY=" + lease.key(),
                                  fmt::format("LEASEHOLD_FENCING_TOKEN={}", token),
                                  "LEASEHOLD_STORE_KEY=" + store_key};
  add.insert(add.end(), std::make_move_iterator(extra.begin()),
             std::make_move_iterator(extra.end()));
  std::vector<std::string> drop;
  for (const std::string& entry : add) {
    drop.push_back(entry.substr(0, entry.find('=')));
  }
  return BuildChildEnvironment(drop, add);
}

std::string SignalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev == nullptr) {
    return fmt::format("signal {}", sig);
  }
  return fmt::format("SIG{}", abbrev);
}

}  // namespace leasehold::cli
