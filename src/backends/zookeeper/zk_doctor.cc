// File: backends/zookeeper/zk_doctor.cc (internal)
//
// The zk:// store's doctor facet: an exists as the probe, and the four-letter words, the session
// bounds and the ACLs as findings.

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backends/common/time.h"
#include "backends/zookeeper/zk_backend.h"
#include "backends/zookeeper/zk_layout.h"
#include "backends/zookeeper/zk_rules.h"
#include "backends/zookeeper/zk_session.h"
#include "core/duration.h"
#include "core/logging.h"
#include "core/owner_token.h"

namespace leasehold::internal {

namespace {

// The value of "name=value" or "name: value" on a line of a four-letter word's answer.
std::optional<std::string> FourLetterField(std::string_view text, std::string_view name) {
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (!line.starts_with(name) || line.size() == name.size()) {
      continue;
    }
    line.remove_prefix(name.size());
    if (line.front() != '=' && line.front() != ':') {
      continue;
    }
    line.remove_prefix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
      line.remove_prefix(1);
    }
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
      line.remove_suffix(1);
    }
    return std::string(line);
  }
  return std::nullopt;
}

std::optional<std::int64_t> FourLetterNumber(std::string_view text, std::string_view name) {
  std::optional<std::string> v = FourLetterField(text, name);
  if (!v || v->empty()) {
    return std::nullopt;
  }
  std::int64_t n = 0;
  for (char c : *v) {
    if (c < '0' || c > '9' || n > (std::int64_t{1} << 50)) {
      return std::nullopt;
    }
    n = n * 10 + (c - '0');
  }
  return n;
}

// The voting servers of an ensemble in a `conf` answer: its "server.N=" lines (3.5 and later)
// that are not observers.
int CountServers(std::string_view text) {
  int n = 0;
  std::size_t at = 0;
  while ((at = text.find("server.", at)) != std::string_view::npos) {
    if (at == 0 || text[at - 1] == '\n') {
      std::size_t eq = text.find('=', at);
      std::size_t nl = text.find('\n', at);
      // server.N=host:peer:election[:participant|:observer][;client]: observers do not vote.
      std::string_view line = text.substr(at, nl == std::string_view::npos ? nl : nl - at);
      if (eq != std::string_view::npos && (nl == std::string_view::npos || eq < nl) &&
          line.find(":observer") == std::string_view::npos) {
        ++n;
      }
    }
    at += 7;
  }
  return n;
}

bool NotWhitelisted(std::string_view answer) {
  return answer.find("not in the whitelist") != std::string_view::npos ||
         answer.find("not executed") != std::string_view::npos;
}

std::string PermLetters(int perms) {
  std::string out;
  for (auto [bit, letter] : {std::pair{ZOO_PERM_CREATE, 'c'}, std::pair{ZOO_PERM_DELETE, 'd'},
                             std::pair{ZOO_PERM_READ, 'r'}, std::pair{ZOO_PERM_WRITE, 'w'},
                             std::pair{ZOO_PERM_ADMIN, 'a'}}) {
    if ((perms & bit) != 0) {
      out += letter;
    }
  }
  return out.empty() ? "nothing" : out;
}

}  // namespace

Status ZkBackend::Ping() {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  ZkRequests requests(*session, options_.command_timeout);
  // A node leasehold never creates (leasehold-clock has no children): one read, no write.
  const int rc = requests.Exists(clock_path_ + "/ping", nullptr);
  if (rc == ZOK || rc == ZNONODE) {
    return Status();
  }
  return ZkErrorStatus(rc, "exists (missing node)", options_);
}

Result<Diagnosis> ZkBackend::Diagnose() {
  using std::chrono::hours;
  using std::chrono::milliseconds;
  Diagnosis d{.probe = "exists (missing node)"};
  const std::string identity =
      options_.user ? fmt::format("digest user {}", *options_.user) : std::string("world:anyone");
  d.permissions_fix =
      options_.user
          ? fmt::format(
                "the nodes under {} need CREATE, DELETE, READ and WRITE for {}: in zkCli, "
                "addauth digest {}:<password>, then setAcl -R {} auth::cdrwa",
                base_, identity, *options_.user, base_)
          : fmt::format(
                "the nodes under {} need CREATE, DELETE, READ and WRITE for "
                "world:anyone: in zkCli, setAcl -R {} world:anyone:cdrwa",
                base_, base_);
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> service, ServiceSession());

  d.items.push_back(
      {.area = "durability",
       .found = "ZooKeeper persists its transaction log: czxids (fencing tokens) only grow, "
                "across restarts"});

  // What the server the service session is connected to says of itself (4lw srvr and conf:
  // only srvr is in ZooKeeper's default 4lw.commands.whitelist).
  auto srvr = service->FourLetterWord("srvr", options_.command_timeout);
  auto conf = service->FourLetterWord("conf", options_.command_timeout);
  const bool conf_ok = conf.ok() && !NotWhitelisted(*conf) && !conf->empty();
  // tickTime in ms; 0 if conf did not say.
  const std::int64_t tick = conf_ok ? FourLetterNumber(*conf, "tickTime").value_or(0) : 0;

  // The session bounds: the server clamps a requested timeout to [min, max]. conf prints them
  // where it is allowed; otherwise they are learnt by asking for very little and for a day, and
  // reading what each short-lived session was granted. "Very little" is kShortestAsk, not 1 ms:
  // the C client also times its connection attempts by the requested timeout, and asking for
  // 1 ms it never connected (3.8.0, on loopback); for the same reason the short session is
  // tried up to three times (a busy machine can miss a 100 ms handshake). A server whose minimum
  // is below kShortestAsk grants kShortestAsk itself: the minimum is then known only to be at
  // most that. A bounds session that does not connect while the service session is connected
  // is a warning, not "unreachable".
  constexpr Duration kShortestAsk = milliseconds(100);
  constexpr int kShortTries = 3;
  std::optional<Duration> lo;
  std::optional<Duration> hi;
  bool lo_exact = false;
  std::string bounds_error;
  const std::optional<std::int64_t> conf_min =
      conf_ok ? FourLetterNumber(*conf, "minSessionTimeout") : std::nullopt;
  const std::optional<std::int64_t> conf_max =
      conf_ok ? FourLetterNumber(*conf, "maxSessionTimeout") : std::nullopt;
  if (conf_min && conf_max && *conf_min > 0 && *conf_max >= *conf_min) {
    lo = milliseconds(*conf_min);
    hi = milliseconds(*conf_max);
    lo_exact = true;
  } else {
    for (auto [asked, out] : {std::pair{kShortestAsk, &lo}, std::pair{Duration(hours(24)), &hi}}) {
      const int tries = asked == kShortestAsk ? kShortTries : 1;
      for (int i = 0; i < tries && !out->has_value(); ++i) {
        auto session = ZkSession::Open(options_, asked, clock_);
        if (session.ok()) {
          *out = (*session)->negotiated();
        } else if (session.status().code() == StatusCode::kUnavailable &&
                   service->ConnectedPort() < 0) {
          return session.status();  // the server is not answering: the check says so
        } else {
          bounds_error = fmt::format("a session asking for {} did not connect: {}",
                                     FormatDuration(asked), session.status().ToString());
        }
      }
    }
    lo_exact = lo && *lo > kShortestAsk;
  }
  if (lo_exact) {
    d.shortest_ttl = *lo;
  }

  if (lo && hi) {
    std::string found = fmt::format(
        "the server grants session timeouts (TTLs) in [{}, {}]{}", FormatDuration(*lo),
        FormatDuration(*hi),
        lo_exact ? "" : " (the minimum may be lower: a session asking for that got it)");
    if (tick > 0) {
      d.ttl_granularity = milliseconds(tick);
      d.items.push_back({.area = "session",
                         .found = fmt::format("{}, in ticks of {} (conf)", found,
                                              FormatDuration(d.ttl_granularity))});
    } else if (lo_exact && *hi == *lo * 10) {
      // ZooKeeper's defaults are 2 and 20 ticks: bounds 1:10 are those of tickTime = min / 2,
      // if the bounds are the defaults (a zoo.cfg could set others in that ratio: a guess, said).
      d.ttl_granularity = *lo / 2;
      d.items.push_back({.area = "session",
                         .found = fmt::format("{}: as ZooKeeper's default 2 and 20 ticks, so "
                                              "taken as a tickTime of {} (conf could not be read)",
                                              found, FormatDuration(d.ttl_granularity))});
    } else {
      d.items.push_back(
          {.area = "session",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("{}; its tickTime could not be read (conf: {}), so TTL advice is "
                                "not rounded to ticks",
                                found,
                                conf.ok() ? (conf_ok ? "no tickTime" : "not in the 4lw whitelist")
                                          : conf.status().message()),
           .fix = "add conf to 4lw.commands.whitelist to let check read tickTime"});
    }
  } else {
    d.items.push_back(
        {.area = "session",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("the session bounds could not be learnt: {}", bounds_error),
         .fix = "minSessionTimeout and maxSessionTimeout (default 2 and 20 ticks) "
                "clamp every TTL: check them in zoo.cfg"});
  }
  if (!srvr.ok()) {
    d.items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("the server's mode could not be read: {}", srvr.status().ToString()),
         .fix = "check the ensemble with zkServer.sh status"});
  } else if (NotWhitelisted(*srvr)) {
    d.items.push_back({.area = "topology",
                       .verdict = CheckVerdict::kWarn,
                       .found = "the server refused the four-letter word srvr (not in "
                                "4lw.commands.whitelist): its mode and ensemble are unknown",
                       .fix = "add srvr to 4lw.commands.whitelist (it is in the default one)"});
  } else if (srvr->find("not currently serving") != std::string::npos) {
    d.items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kUnreachable,
         .found = fmt::format("the server on port {} is not serving requests (no quorum)",
                              service->ConnectedPort()),
         .fix = "restore a quorum of the ensemble's servers"});
  } else {
    const std::string mode = FourLetterField(*srvr, "Mode").value_or("unknown");
    std::string version = FourLetterField(*srvr, "Zookeeper version").value_or("?");
    version = version.substr(0, version.find_first_of(", -"));
    const int servers = conf_ok ? CountServers(*conf) : 0;
    const std::string where =
        fmt::format("the server on port {} (ZooKeeper {})", service->ConnectedPort(), version);
    if (mode == "standalone") {
      d.items.push_back({.area = "topology",
                         .verdict = CheckVerdict::kWarn,
                         .found = where + " is standalone: no fault tolerance",
                         .fix = "run an ensemble of 3 or 5 servers for a store leases depend on"});
    } else if (servers == 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("{} is a {} of an ensemble whose size could not be read (conf {})",
                                where, mode, conf_ok ? "names no servers" : "is not whitelisted"),
           .fix = "add conf to 4lw.commands.whitelist to let check count the ensemble"});
    } else if (servers % 2 == 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("{} is a {} of {} servers: an even count tolerates no more "
                                "failures than one fewer",
                                where, mode, servers),
           .fix = fmt::format("run {} or {} servers", servers - 1, servers + 1)});
    } else {
      d.items.push_back({.area = "topology",
                         .found = fmt::format("{} is a {} of {} servers: tolerates {} failed",
                                              where, mode, servers, (servers - 1) / 2)});
    }
  }

  // The ACL of <chroot>/leasehold: every key's node is created below it.
  ZkAnswer acl;
  const int rc =
      ZkPending::GetAcl(*service, base_).Await(clock_.Now() + options_.command_timeout, &acl);
  if (IsZkTransient(rc) || IsZkSessionGone(rc)) {
    return ZkErrorStatus(rc, "getACL", options_);
  }
  const int needed = ZOO_PERM_CREATE | ZOO_PERM_DELETE | ZOO_PERM_READ | ZOO_PERM_WRITE;
  if (rc != ZOK) {
    d.items.push_back(
        {.area = "permissions",
         .verdict = rc == ZNOAUTH ? CheckVerdict::kPermissionDenied : CheckVerdict::kWarn,
         .found = fmt::format("the ACL of {} could not be read: {}", base_, zerror(rc)),
         .fix = d.permissions_fix});
  } else {
    int granted = 0;
    bool unjudged = false;
    for (const ZkAclEntry& e : acl.acl) {
      if (e.scheme == "world" && e.id == "anyone") {
        granted |= e.perms;
      } else if (e.scheme == "digest" && options_.user && e.id.starts_with(*options_.user + ":")) {
        granted |= e.perms;
      } else if (e.scheme != "digest") {
        unjudged = true;  // ip, sasl, x509: which identity this handle has there is not known
      }
    }
    if ((granted & needed) == needed) {
      d.items.push_back({.area = "permissions",
                         .found = fmt::format("the ACL of {} grants {} {}", base_, identity,
                                              PermLetters(granted))});
    } else {
      d.items.push_back(
          {.area = "permissions",
           .verdict = unjudged ? CheckVerdict::kWarn : CheckVerdict::kPermissionDenied,
           .found = fmt::format("the ACL of {} grants {} {}{} (needed: cdrw)", base_, identity,
                                PermLetters(granted),
                                unjudged ? ", and other schemes this check cannot judge" : ""),
           .fix = d.permissions_fix});
    }
  }
  return d;
}

}  // namespace leasehold::internal
