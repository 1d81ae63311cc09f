// File: backends/redis/redis_fenced_write.cc (internal)
//
// The redis:// store's fenced-write facet: one script that checks the grant, then writes data
// keys in the grant's hash slot (DataKeyPrefix).

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backends/common/time.h"
#include "backends/redis/redis_backend.h"
#include "backends/redis/redis_cluster.h"
#include "backends/redis/redis_connection.h"
#include "backends/redis/redis_replies.h"
#include "backends/redis/redis_run.h"
#include "backends/redis/redis_scripts.h"
#include "backends/redis/redis_server_config.h"
#include "backends/redis/redis_subscriber.h"
#include "core/duration.h"
#include "core/logging.h"
#include "util/hex.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

std::string RedisBackend::DataKeyPrefix(std::string_view key) const {
  // The hash tag first (the first {...} of a name is its tag), then the store's prefix, so that
  // two namespaces' leases of one name never share data; the name never starts with
  // "<prefix>:", the store's own keys.
  return fmt::format("{{{}}}:{}:", HexEncode(key), options_.prefix);
}

Result<std::vector<std::int64_t>> RedisBackend::FencedWrite(const FencedWriteRequest& request) {
  // The grant hash is named from the lease key, as every other operation names it, rather than
  // taken from request.store_key: a fenced write can only ever be checked against this key's
  // grant. (Both are the same for a grant this backend made.)
  const std::string lease_key = LeaseKeyName(options_.prefix, request.key);
  const std::string own = options_.prefix + ":";
  Command call = {"EVALSHA", pool_->shas_[kFencedWrite], std::to_string(1 + request.ops.size()),
                  lease_key};
  for (const FencedOp& op : request.ops) {
    if (op.key.starts_with(own)) {
      return Status::InvalidArgument(fmt::format(
          "fenced {} of {}: keys under '{}' are leasehold's own (grants, fencing counters, "
          "records, queues), not data; nothing was written",
          FencedOpKindName(op.kind), op.key, own));
    }
    if (op.kind != FencedOp::Kind::kPut && op.kind != FencedOp::Kind::kDelete &&
        op.kind != FencedOp::Kind::kHashSet) {
      return Status::Unimplemented(
          fmt::format("the redis store has no fenced {} op", FencedOpKindName(op.kind)));
    }
    if (options_.cluster() && KeySlot(op.key) != KeySlot(lease_key)) {
      // One script checks the grant and writes the data: in a cluster its keys must share a
      // slot, or the server refuses it (CROSSSLOT).
      return Status::InvalidArgument(fmt::format(
          "fenced {} of {}: in a Redis Cluster a data key must share the lease's hash slot; "
          "name it with Lease::DataKey (\"{}{}\"); nothing was written",
          FencedOpKindName(op.kind), op.key, DataKeyPrefix(request.key), op.key));
    }
    call.push_back(op.key);
  }
  call.push_back(request.owner_token);
  call.push_back(request.skip_guard_for_testing ? "0" : "1");
  for (const FencedOp& op : request.ops) {
    call.push_back(op.kind == FencedOp::Kind::kPut      ? "put"
                   : op.kind == FencedOp::Kind::kDelete ? "del"
                                                        : "hset");
    call.push_back(op.kind == FencedOp::Kind::kHashSet ? op.field : std::string());
    call.push_back(op.kind == FencedOp::Kind::kDelete ? std::string() : op.value);
  }
  std::vector<Command> calls;
  calls.push_back(std::move(call));
  // With min_replicas the write waits for replicas, as a finish does (same round trip).
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, calls, true));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("the fenced write of {}", request.key),
                             ScriptText(kFencedWrite), ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 1) {
    return Status::Internal("unexpected reply from redis to the fenced-write script");
  }
  LH_ASSIGN_OR_RETURN(long long outcome, ParseInteger(reply->element[0]));
  if (outcome == 0) {
    const std::string_view state =
        reply->elements >= 2 ? ReplyText(reply->element[1]) : std::string_view();
    if (state == "none") {
      return FencedOut(request.key, request.fencing_token,
                       "is no longer held: expired or released");
    }
    if (state == "kept") {
      return FencedOut(request.key, request.fencing_token,
                       "was released: its grant is kept until it expires, but writes nothing");
    }
    if (state != "other" || reply->elements < 4) {
      return Status::Internal("unexpected reply from redis to the fenced-write script");
    }
    LH_ASSIGN_OR_RETURN(long long fence, ParseInteger(reply->element[3]));
    return FencedOut(request.key, request.fencing_token,
                     fmt::format("is now held by {} under fencing token {}",
                                 ReplyText(reply->element[2]), fence));
  }
  if (outcome < 0) {
    if (reply->elements < 3) {
      return Status::Internal("unexpected reply from redis to the fenced-write script");
    }
    LH_ASSIGN_OR_RETURN(long long index, ParseInteger(reply->element[1]));
    if (index < 1 || static_cast<std::size_t>(index) > request.ops.size()) {
      return Status::Internal("unexpected reply from redis to the fenced-write script");
    }
    const FencedOp& op = request.ops[static_cast<std::size_t>(index - 1)];
    if (outcome == -1) {
      return Status::InvalidArgument(fmt::format(
          "fenced write of {}: op {} sets field '{}' of {}, which holds a {}, not a hash; nothing "
          "was written",
          request.key, index, op.field, op.key, ReplyText(reply->element[2])));
    }
    return Status::PermissionDenied(fmt::format(
        "redis at {} refused the fenced write of {}: the ACL user may not run {} on {} (op {}); "
        "nothing was written",
        options_.Address(), request.key, ReplyText(reply->element[2]), op.key, index));
  }
  if (reply->elements != 1 + request.ops.size()) {
    return Status::Internal("unexpected reply from redis to the fenced-write script");
  }
  std::vector<std::int64_t> affected;
  affected.reserve(request.ops.size());
  for (std::size_t i = 0; i < request.ops.size(); ++i) {
    LH_ASSIGN_OR_RETURN(long long n, ParseInteger(reply->element[i + 1]));
    affected.push_back(n);
  }
  if (options_.min_replicas > 0 && out.replicas < options_.min_replicas) {
    return Status::Unavailable(fmt::format(
        "the fenced write of {} was applied, but only {} of {} replicas confirmed it within {}: "
        "a failover now could lose it",
        request.key, out.replicas, options_.min_replicas,
        FormatDuration(options_.replica_timeout)));
  }
  return affected;
}

}  // namespace leasehold::internal
