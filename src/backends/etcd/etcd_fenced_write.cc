// File: backends/etcd/etcd_fenced_write.cc (internal)
//
// The etcd:// store's fenced-write facet: one Txn whose compare is the grant's key.

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

// `key` for a message: NUL bytes (the fair queue's separators) shown as "\0".
std::string Printable(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '\0') {
      out += "\\0";
    } else {
      out += c;
    }
  }
  return out;
}

// Refuses the data keys a fenced write may not touch, before anything is sent:
//   - the store's own keys: "<prefix>/..." (grants, records) and "<prefix>\0..." (the fair
//     queue). A Put or Delete there could forge or delete a grant, someone else's included;
//   - a key put twice, or both put and deleted: etcd refuses such a Txn as a whole ("duplicate
//     key given in txn request"), so it is refused here with a message that says what to merge.
//     Deleting one key twice is fine (the second delete counts 0, as in order).
Status CheckDataKeys(std::string_view prefix, const std::vector<FencedOp>& ops) {
  const std::string grants = fmt::format("{}/", prefix);
  std::string queue(prefix);
  queue += '\0';
  std::set<std::string_view> put;
  std::set<std::string_view> deleted;
  for (const FencedOp& op : ops) {
    const std::string_view key = op.key;
    if (key.starts_with(grants) || key.starts_with(queue)) {
      return Status::InvalidArgument(fmt::format(
          "data key '{}' is one of the etcd store's own keys ('{}...' holds its grants and "
          "records, '{}\\0...' its fair queue): a fenced write does not touch them",
          Printable(key), grants, prefix));
    }
    const bool is_put = op.kind == FencedOp::Kind::kPut;
    if (put.contains(key) || (is_put && deleted.contains(key))) {
      return Status::InvalidArgument(fmt::format(
          "a fenced write on etcd puts key '{}' twice or both puts and deletes it, which an etcd "
          "Txn refuses: merge the ops on that key into one",
          Printable(key)));
    }
    (is_put ? put : deleted).insert(key);
  }
  return Status();
}

}  // namespace

Result<std::vector<std::int64_t>> EtcdBackend::FencedWrite(const FencedWriteRequest& request) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, request.key);
  // The grant's own key: the base, or one slot's key of a shared or semaphore grant.
  const std::string etcd_key = request.store_key.empty() ? base : request.store_key;
  if (!etcd_key.starts_with(base) ||
      ParseKey(std::string_view(etcd_key).substr(base.size())).kind != KeyKind::kGrant) {
    return Status::InvalidArgument(fmt::format(
        "store key '{}' is not this store's key of a grant of lease {} ('{}' or '{}\\0...'): a "
        "lease of another etcd store or prefix",
        Printable(request.store_key), request.key, base, base));
  }
  // create_revision == 0 would mean "the grant key is absent": never a fence.
  if (request.fencing_token == 0 ||
      request.fencing_token > static_cast<FencingToken>(std::numeric_limits<int64_t>::max())) {
    return Status::InvalidArgument(fmt::format(
        "fencing token {} is not an etcd create revision (1..INT64_MAX)", request.fencing_token));
  }
  LH_RETURN_IF_ERROR(CheckDataKeys(options_.prefix, request.ops));

  // One Txn: the compare is the grant's identity (a create revision belongs to one creation of
  // the key: it fails once the grant is deleted, expired or re-created by a newer holder, whose
  // revision is higher), the success branch is the ops in order, the failure branch reads the
  // grant key to name whoever holds it now. Puts carry no lease: the data outlives the grant.
  pb::TxnRequest txn;
  if (!request.skip_guard_for_testing) {
    CompareCreateRevision(&txn, etcd_key, static_cast<int64_t>(request.fencing_token));
  }
  for (const FencedOp& op : request.ops) {
    if (op.kind == FencedOp::Kind::kPut) {
      pb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
    } else if (op.kind == FencedOp::Kind::kDelete) {
      txn.add_success()->mutable_request_delete_range()->set_key(op.key);
    } else {
      return Status::Unimplemented(
          fmt::format("the etcd store has no fenced {} op", FencedOpKindName(op.kind)));
    }
  }
  txn.add_failure()->mutable_request_range()->set_key(etcd_key);
  pb::TxnResponse resp;
  // Sent once: a fenced write retried on another member after no answer could apply twice.
  Status s = impl.client.TxnOnce("Txn (fenced write)", txn, &resp);
  // etcd's refusal of a key the user's roles do not cover ("etcdserver: permission denied"; an
  // auth failure, such as a changed password, keeps its own message).
  if (s.code() == StatusCode::kPermissionDenied &&
      s.detail().find("etcdserver: permission denied") != std::string_view::npos) {
    std::string keys;
    for (std::size_t i = 0; i < request.ops.size() && i < 3; ++i) {
      keys += fmt::format("{}'{}'", i > 0 ? ", " : "", Printable(request.ops[i].key));
    }
    if (request.ops.size() > 3) {
      keys += fmt::format(" and {} more", request.ops.size() - 3);
    }
    return Status::PermissionDenied(
        fmt::format("etcd refused the fenced write of lease {}: permission denied for user '{}', "
                    "who needs read access to the grant key '{}' and write access to the data "
                    "keys {}",
                    request.key, options_.user.value_or("(none)"), etcd_key, keys),
        std::string(s.detail()));
  }
  LH_RETURN_IF_ERROR(s);
  if (resp.succeeded()) {
    if (resp.responses_size() != static_cast<int>(request.ops.size())) {
      return Status::Internal(fmt::format("etcd answered a fenced write of {} ops with {} replies",
                                          request.ops.size(), resp.responses_size()));
    }
    std::vector<std::int64_t> affected;
    affected.reserve(request.ops.size());
    for (int i = 0; i < resp.responses_size(); ++i) {
      affected.push_back(request.ops[static_cast<std::size_t>(i)].kind == FencedOp::Kind::kPut
                             ? 1
                             : resp.responses(i).response_delete_range().deleted());
    }
    return affected;
  }
  const pb::RangeResponse* range =
      resp.responses_size() > 0 && resp.responses(0).has_response_range()
          ? &resp.responses(0).response_range()
          : nullptr;
  if (range == nullptr || range->kvs_size() == 0) {
    return FencedOut(request.key, request.fencing_token, "is no longer held: expired or released");
  }
  const mvccpb::KeyValue& kv = range->kvs(0);
  std::optional<GrantValue> value = DecodeValue(kv.value());
  return FencedOut(request.key, request.fencing_token,
                   fmt::format("is now held by {} under fencing token {}",
                               value && !value->holder.empty() ? value->holder
                                                               : std::string("an unknown holder"),
                               kv.create_revision()));
}

}  // namespace leasehold::internal
