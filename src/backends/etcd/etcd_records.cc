// File: backends/etcd/etcd_records.cc (internal)
//
// The etcd:// store's records facet: a key's record, on an etcd lease of its own.

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

Result<std::optional<std::string>> EtcdBackend::ReadRecord(std::string_view key) {
  Impl& impl = *impl_;
  pb::RangeRequest req;
  req.set_key(RecordKey(options_.prefix, key));
  pb::RangeResponse resp;
  LH_RETURN_IF_ERROR(impl.client.Range("Range (record)", req, &resp));
  if (resp.kvs_size() == 0) {
    return std::optional<std::string>();
  }
  return std::optional<std::string>(resp.kvs(0).value());
}

Result<std::vector<std::pair<std::string, std::string>>> EtcdBackend::ListRecords(
    std::string_view prefix) {
  Impl& impl = *impl_;
  // Every record key is "<prefix>/\0record/<key>", so the record keys of the keys that start
  // with `prefix` are exactly the etcd keys that start with RecordKey(prefix): a byte range,
  // never a pattern. etcd returns a range in byte order, which is the order of the keys.
  const std::string base = RecordKey(options_.prefix, "");
  pb::RangeRequest req;
  req.set_key(base + std::string(prefix));
  req.set_range_end(PrefixEnd(req.key()));
  req.set_sort_order(pb::RangeRequest::ASCEND);
  req.set_sort_target(pb::RangeRequest::KEY);
  pb::RangeResponse resp;
  LH_RETURN_IF_ERROR(impl.client.Range("Range (list records)", req, &resp));
  // As ReadRecord: a record is live while etcd still has its key. Telling an expired lease
  // whose key the leader has not deleted yet (at most its 500 ms check, or longer while it
  // rate-limits revokes) would cost a LeaseTimeToLive per record, and that only says "expired"
  // a whole second late (it truncates to seconds): no better than waiting for the delete.
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(static_cast<std::size_t>(resp.kvs_size()));
  for (const mvccpb::KeyValue& kv : resp.kvs()) {
    out.emplace_back(std::string(std::string_view(kv.key()).substr(base.size())), kv.value());
  }
  return out;
}

}  // namespace leasehold::internal
