// File: backends/etcd/etcd_doctor.cc (internal)
//
// The etcd:// store's doctor facet: a Range of a missing key as the probe, and the members,
// their status and the credentials' reach as findings.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/common/time.h"
#include "backends/etcd/etcd_backend.h"
#include "backends/etcd/etcd_client.h"
#include "backends/etcd/etcd_impl.h"
#include "backends/etcd/etcd_keepalive.h"
#include "backends/etcd/etcd_spare_leases.h"
#include "backends/etcd/etcd_value.h"
#include "backends/etcd/etcd_wait_queue.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

using namespace std::chrono_literals;

namespace {

// "http://127.0.0.1:2379/" -> "127.0.0.1:2379": a member's client URL as an endpoint of ours.
std::string EndpointOfUrl(std::string_view url) {
  for (std::string_view scheme : {"http://", "https://", "unix://", "unixs://"}) {
    if (url.starts_with(scheme)) {
      url.remove_prefix(scheme.size());
      break;
    }
  }
  while (url.ends_with('/')) {
    url.remove_suffix(1);
  }
  return std::string(url);
}

std::string MemberIdHex(uint64_t id) {
  return fmt::format("{:x}", id);
}

// No member answered: Diagnose reports that as its error (the check says "unreachable").
bool IsUnavailableOrTimeout(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

}  // namespace

Status EtcdBackend::Ping() {
  pb::RangeRequest req;
  std::string key = KeyName(options_.prefix, "");
  key += '\0';
  key += "ping";
  req.set_key(std::move(key));
  req.set_keys_only(true);
  pb::RangeResponse resp;
  return impl_->client.Range("Range (missing key)", req, &resp);
}

Result<Diagnosis> EtcdBackend::Diagnose() {
  EtcdClient& client = impl_->client;
  Diagnosis d{.probe = "Range (missing key)", .ttl_granularity = std::chrono::seconds(1)};
  const std::string range = fmt::format("{}/", options_.prefix);
  // fair=true also writes "<prefix>\0queue/...", which no etcdctl argument can name (NUL):
  // the permission then goes on the bare prefix.
  d.permissions_fix =
      fmt::format("etcdctl role grant-permission <role of {}> --prefix=true readwrite {}",
                  options_.user ? *options_.user : std::string("the user"),
                  options_.fair ? options_.prefix : range);

  pb::MemberListRequest members_req;
  pb::MemberListResponse members;
  Status listed = client.MemberList("Cluster MemberList", members_req, &members);
  if (IsUnavailableOrTimeout(listed)) {
    return listed;
  }

  d.items.push_back(
      {.area = "durability",
       .found = "etcd persists revisions in its raft log and snapshots: fencing tokens (create "
                "revisions) only grow, across restarts"});

  // The shortest TTL: ask for 1 s and read what etcd grants (its minimum, 2 s with 3.4's
  // defaults), then revoke the lease. A grant whose reply was lost is not revoked: it has no
  // keys and lapses by itself within its few seconds.
  pb::LeaseGrantRequest grant_req;
  grant_req.set_ttl(1);
  pb::LeaseGrantResponse grant;
  Status granted = client.LeaseGrant("LeaseGrant (1 s)", grant_req, &grant);
  if (granted.ok() && grant.error().empty()) {
    client.RevokeInBackground(grant.id());
    d.shortest_ttl = std::chrono::seconds(grant.ttl());
    d.items.push_back(
        {.area = "session",
         .found = fmt::format("etcd counts lease TTLs in whole seconds and grants at least {} s "
                              "(a LeaseGrant of 1 s got {} s): a --ttl is rounded up to them",
                              grant.ttl(), grant.ttl())});
  } else {
    d.items.push_back(
        {.area = "session",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("etcd's shortest lease TTL could not be learnt (a LeaseGrant of "
                              "1 s failed: {})",
                              granted.ok() ? grant.error() : granted.ToString()),
         .fix = "etcd grants at least 2 s with its default settings; ask for that or more"});
  }

  if (!listed.ok()) {
    d.items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("the members could not be listed: {}", listed.ToString()),
         .fix = "grant the user Cluster MemberList, or check the cluster with etcdctl member "
                "list"});
  } else {
    const int n = members.members_size();
    int learners = 0;
    std::set<std::string> client_endpoints;
    for (const pb::Member& m : members.members()) {
      learners += m.islearner() ? 1 : 0;
      for (const std::string& url : m.clienturls()) {
        client_endpoints.insert(EndpointOfUrl(url));
      }
    }
    const int voters = n - learners;
    std::string count = fmt::format("{} member{}{}", n, n == 1 ? "" : "s",
                                    learners > 0 ? fmt::format(" ({} learners)", learners) : "");
    if (voters <= 1) {
      d.items.push_back({.area = "topology",
                         .verdict = CheckVerdict::kWarn,
                         .found = count + ": no fault tolerance (one member down stops every "
                                          "lease's renewal)",
                         .fix = "run 3 or 5 members for a store leases depend on"});
    } else if (voters % 2 == 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("{}: an even member count tolerates no more failures than one "
                                "fewer ({} of {})",
                                count, (voters - 1) / 2, voters),
           .fix = fmt::format("run {} or {} members", voters - 1, voters + 1)});
    } else {
      d.items.push_back({.area = "topology",
                         .found = fmt::format("{}: tolerates {} failed", count, (voters - 1) / 2)});
    }

    // Do the URL's endpoints reach the members? A call fails over only to the endpoints it has.
    std::vector<std::string> strangers;
    int covered = 0;
    for (const std::string& e : options_.endpoints) {
      if (client_endpoints.contains(e)) {
        ++covered;
      } else {
        strangers.push_back(e);
      }
    }
    const int quorum = voters / 2 + 1;
    if (!strangers.empty()) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found =
               fmt::format("the URL's endpoint{} {} {} not among the members' client URLs "
                           "({})",
                           strangers.size() == 1 ? "" : "s", fmt::join(strangers, ","),
                           strangers.size() == 1 ? "is" : "are", fmt::join(client_endpoints, ",")),
           .fix = "name the members' advertised client URLs in the store URL (a proxy or an "
                  "alias is fine if it reaches them): fail-over needs them"});
    }
    if (covered < quorum && voters > 1) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("the URL names {} of the {} members, fewer than a quorum ({})",
                                covered, voters, quorum),
           .fix = fmt::format("list every member in the URL ({}): fail-over needs them",
                              fmt::join(client_endpoints, ","))});
    } else if (strangers.empty()) {
      d.items.push_back({.area = "topology",
                         .found = fmt::format("the URL names {} of the {} members", covered, n)});
    }
  }

  pb::StatusRequest status_req;
  pb::StatusResponse status;
  std::size_t used = client.current();
  Status statused = client.MaintenanceStatus("Maintenance Status", status_req, &status, &used);
  if (IsUnavailableOrTimeout(statused)) {
    return statused;
  }
  if (!statused.ok()) {
    d.items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("the member's status could not be read: {}", statused.ToString()),
         .fix = "grant the user Maintenance Status, or check the leader with etcdctl endpoint "
                "status"});
  } else {
    const std::string& address = client.endpoint(used).address;
    if (status.leader() == 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kUnreachable,
           .found = fmt::format("member {} (etcd {}) knows no leader (raft term {}): no lease can "
                                "be granted or renewed",
                                address, status.version(), status.raftterm()),
           .fix = "restore a quorum of members (etcdctl endpoint status --cluster)"});
    } else {
      d.items.push_back(
          {.area = "topology",
           .found = fmt::format(
               "member {} (etcd {}{}): leader {}, raft term {}", address, status.version(),
               status.leader() == status.header().member_id() ? ", the leader" : "",
               MemberIdHex(status.leader()), status.raftterm())});
    }
    if (status.errors_size() > 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kUnsafe,
           .found = fmt::format("member {} reports: {}", address, fmt::join(status.errors(), "; ")),
           .fix = "clear the alarm (etcdctl alarm list; a NOSPACE alarm refuses every write)"});
    }
  }

  d.items.push_back(
      {.area = "permissions",
       .found = options_.user
                    ? fmt::format("auth: user {}; the cycle exercises its permissions on {}",
                                  *options_.user, range)
                    : std::string("auth: no user (the cluster answers calls without one)")});
  return d;
}

}  // namespace leasehold::internal
