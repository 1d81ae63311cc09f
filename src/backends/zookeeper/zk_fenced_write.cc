// File: backends/zookeeper/zk_fenced_write.cc (internal)
//
// The zk:// store's fenced-write facet: one multi whose first op checks the grant's node.

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

// A FencedWrite as one multi, planned against what is known of its nodes before the write.
struct FencedPlan {
  // The check of the grant's node first (unless unguarded), then the ops that do something.
  std::vector<ZkMultiOp> ops;
  // Per multi op: the index of its FencedOp (-1 for the check).
  std::vector<int> op_of;
  // Per FencedOp: its count if the multi commits.
  std::vector<std::int64_t> affected;
};

// Plans `ops` as setData/create/delete on absolute paths (chroot + key). `present` says whether
// a node exists before the write; a node it does not name is taken to exist (the common case:
// a Put overwrites). Each op sees the ops before it on the same node (a Put leaves it present,
// a Delete absent), as the multi applies them in order; a Delete of an absent node is dropped
// and counts 0. So a multi planned this way can only miss on the first op of a node (its state
// before the write), which is what ZkBackend::FencedWrite learns from a failed attempt.
FencedPlan PlanFencedWrite(const std::vector<FencedOp>& ops, const std::string& chroot,
                           const std::string& check_path,
                           const std::map<std::string, bool>& present) {
  FencedPlan plan;
  if (!check_path.empty()) {
    // Version -1: the node exists. Its name is never reused (zk_backend.h), so that is this
    // grant's node, whose czxid is the fencing token.
    plan.ops.push_back({.kind = ZkMultiOp::kCheck, .path = check_path});
    plan.op_of.push_back(-1);
  }
  std::map<std::string, bool> state = present;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const FencedOp& op = ops[i];
    auto it = state.try_emplace(chroot + op.key, true).first;
    const bool exists = it->second;
    if (op.kind == FencedOp::Kind::kPut) {
      if (exists) {
        plan.ops.push_back({.kind = ZkMultiOp::kSet, .path = it->first, .data = op.value});
      } else {
        plan.ops.push_back({.kind = ZkMultiOp::kCreate,
                            .path = it->first,
                            .data = op.value,
                            .mode = ZOO_PERSISTENT});
      }
      plan.op_of.push_back(static_cast<int>(i));
      plan.affected.push_back(1);
      it->second = true;
    } else {
      if (exists) {
        plan.ops.push_back({.kind = ZkMultiOp::kDelete, .path = it->first});
        plan.op_of.push_back(static_cast<int>(i));
      }
      plan.affected.push_back(exists ? 1 : 0);
      it->second = false;
    }
  }
  return plan;
}

}  // namespace

Result<std::vector<std::int64_t>> ZkBackend::FencedWrite(const FencedWriteRequest& request) {
  // Every path is checked before anything is sent: a bad one refuses the whole write.
  for (const FencedOp& op : request.ops) {
    if (op.kind != FencedOp::Kind::kPut && op.kind != FencedOp::Kind::kDelete) {
      return Status::Unimplemented(
          fmt::format("the zk store has no fenced {} op", FencedOpKindName(op.kind)));
    }
    if (std::string why = zk_layout::DataPathProblem(options_.chroot, op.key); !why.empty()) {
      return Status::InvalidArgument(
          fmt::format("zk:// cannot {} {}: {}", FencedOpKindName(op.kind), op.key, why));
    }
  }
  // The grant's own session (zk_backend.h says why); unguarded writes (the chaos harness's
  // negative control) go through the service session, with no grant at all.
  std::shared_ptr<ZkSession> session;
  std::string check_path;
  if (request.skip_guard_for_testing) {
    LH_ASSIGN_OR_RETURN(session, ServiceSession());
  } else {
    std::optional<Held> held;
    {
      MutexLock lock(&mu_);
      auto it = grants_.find({request.key, request.owner_token});
      if (it != grants_.end()) {
        held = it->second;
      }
    }
    if (!held.has_value() || held->path != options_.chroot + request.store_key ||
        held->czxid != request.fencing_token) {
      // Lost (a renewal found the node gone), expired or finished: name the holder now if the
      // store says.
      Result<std::shared_ptr<ZkSession>> service = ServiceSession();
      return FencedOut(request.key, request.fencing_token,
                       service.ok() ? FencedOutWhy(**service, request.key, request.fencing_token)
                                    : std::string("is no longer held: released, expired or lost"));
    }
    // Past the local deadline the holder has given the grant up (its safe_until is behind it)
    // and the reaper is deleting the node: nothing is sent.
    if (clock_.Now() >= held->deadline) {
      return FencedOut(request.key, request.fencing_token,
                       "is no longer held: it expired (not renewed before its deadline)");
    }
    // An expired session's ephemeral nodes are gone: the grant with them.
    if (held->session->Expired()) {
      return FencedOut(request.key, request.fencing_token,
                       "is no longer held: its ZooKeeper session expired");
    }
    session = held->session;
    check_path = held->path;
  }
  const struct ACL_vector* acl = NodeAcl(options_);
  // One bound for every round trip of the write.
  ZkRequests requests(*session, options_.command_timeout);
  std::map<std::string, bool> present;
  bool looked = false;
  for (int attempt = 0; attempt < kFencedAttempts; ++attempt) {
    const FencedPlan plan = PlanFencedWrite(request.ops, options_.chroot, check_path, present);
    if (plan.ops.empty()) {
      return plan.affected;  // unguarded deletes of absent nodes only: nothing to send
    }
    std::vector<int> errors;
    const int rc = requests.Multi(plan.ops, acl, &errors);
    if (rc == ZOK) {
      return plan.affected;
    }
    if (IsZkTransient(rc) || IsZkSessionGone(rc)) {
      return ZkErrorStatus(
          rc, fmt::format("a fenced write under {} (applied or not: unknown)", request.key),
          options_);
    }
    // A multi that failed reports ZOK for the ops before the failing one: all or none applied,
    // none here.
    const auto failed = std::find_if(errors.begin(), errors.end(), [](int e) { return e != ZOK; });
    if (failed == errors.end() ||
        static_cast<std::size_t>(failed - errors.begin()) >= plan.ops.size()) {
      if (rc == ZBADARGUMENTS) {
        return Status::InvalidArgument(
            fmt::format("ZooKeeper's client refused a path of the write under {}", request.key));
      }
      return ZkErrorStatus(rc, fmt::format("a fenced write under {}", request.key), options_);
    }
    const std::size_t at = static_cast<std::size_t>(failed - errors.begin());
    const int op_rc = *failed;
    if (plan.op_of[at] < 0) {
      if (op_rc == ZNONODE || op_rc == ZBADVERSION) {
        return FencedOut(request.key, request.fencing_token,
                         FencedOutWhy(*session, request.key, request.fencing_token));
      }
      return ZkErrorStatus(op_rc, fmt::format("checking the grant of {}", request.key), options_);
    }
    const FencedOp& op = request.ops[static_cast<std::size_t>(plan.op_of[at])];
    const ZkMultiOp& zop = plan.ops[at];
    const bool missed_absent =
        op_rc == ZNONODE && (zop.kind == ZkMultiOp::kSet || zop.kind == ZkMultiOp::kDelete);
    const bool missed_present = op_rc == ZNODEEXISTS && zop.kind == ZkMultiOp::kCreate;
    if (!missed_absent && !missed_present) {
      return FencedOpStatus(op, op_rc, request.key);
    }
    // The node was created or deleted by someone else since we looked (or we guessed): plan
    // again. After the first miss, look at every node at once (one pipelined round).
    present[zop.path] = missed_present;
    if (!looked) {
      looked = true;
      std::vector<std::string> paths;
      for (const FencedOp& each : request.ops) {
        paths.push_back(options_.chroot + each.key);
      }
      std::sort(paths.begin(), paths.end());
      paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
      const std::vector<int> rcs = requests.ExistsAll(paths);
      for (std::size_t i = 0; i < paths.size(); ++i) {
        if (rcs[i] != ZOK && rcs[i] != ZNONODE) {
          return ZkErrorStatus(
              rcs[i], fmt::format("a fenced write under {} (nothing was written)", request.key),
              options_);
        }
        present[paths[i]] = rcs[i] == ZOK;
      }
    }
  }
  return Status::Unavailable(fmt::format(
      "the nodes of a fenced write under {} kept changing under other clients; nothing was "
      "written; try again",
      request.key));
}

Status ZkBackend::FencedOpStatus(const FencedOp& op, int rc, std::string_view key) const {
  const char* kind = FencedOpKindName(op.kind);
  switch (rc) {
    case ZNONODE:  // of a create: its parent
      return Status::InvalidArgument(fmt::format(
          "zk:// cannot {} {}: its parent {} does not exist (create it first, in this write or "
          "before); nothing was written",
          kind, op.key, ParentOf(op.key)));
    case ZNOCHILDRENFOREPHEMERALS:
      return Status::InvalidArgument(fmt::format(
          "zk:// cannot {} {}: its parent {} is an ephemeral node, which cannot have children; "
          "nothing was written",
          kind, op.key, ParentOf(op.key)));
    case ZNOTEMPTY:
      return Status::InvalidArgument(fmt::format(
          "zk:// cannot {} {}: it has children (delete them first); nothing was written", kind,
          op.key));
    case ZBADARGUMENTS:
      return Status::InvalidArgument(
          fmt::format("ZooKeeper refused to {} {}; nothing was written", kind, op.key));
    default:
      return ZkErrorStatus(rc, fmt::format("{} of {} under {}", kind, op.key, key), options_);
  }
}

std::string ZkBackend::FencedOutWhy(ZkSession& session, std::string_view key, FencingToken token) {
  Result<std::optional<LeaseInfo>> holder = ReadHolder(session, key);
  // Our own token: the node is still there, on its way out (the reaper forgets a grant before it
  // deletes the node), or kept after us (Finish).
  if (holder.ok() && holder->has_value() && (*holder)->fencing_token != token) {
    const LeaseInfo& info = **holder;
    return fmt::format("is now held by {} under fencing token {}",
                       info.holder.empty() ? std::string("another holder") : info.holder,
                       info.fencing_token);
  }
  return "is no longer held: its node is gone (released, expired, force-released or its session "
         "ended)";
}

}  // namespace leasehold::internal
