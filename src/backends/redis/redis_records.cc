// File: backends/redis/redis_records.cc (internal)
//
// The redis:// store's records facet: a key's record string, and the server's TIME as its wall
// clock.

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

Result<std::optional<std::string>> RedisBackend::ReadRecord(std::string_view key) {
  // A plain GET is one atomic read; the server drops the record at its PX expiry.
  std::vector<Command> get = {{"GET", RecordKeyName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, get, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ErrorReplyStatus(options_.Address(), "GET", ReplyText(reply));
  }
  if (reply->type == REDIS_REPLY_NIL) {
    return std::optional<std::string>();
  }
  if (reply->type != REDIS_REPLY_STRING) {
    return Status::Internal(
        fmt::format("unexpected reply from redis to GET of the record of {}", key));
  }
  return std::optional<std::string>(std::string(ReplyText(reply)));
}

Result<std::vector<std::pair<std::string, std::string>>> RedisBackend::ListRecords(
    std::string_view prefix) {
  // Record keys are "<prefix>:{<hex>}:record": the prefix match works as in List(), and since
  // hex digits are never '}', a key ending in "}:record" whose middle decodes is a record. The
  // values come with plain GETs pipelined per SCAN page (one round trip each, like List, and no
  // command beyond the ACL's +get; MGET would need +mget and one slot in a cluster).
  const std::string head = options_.prefix + ":{";
  constexpr std::string_view kTail = "}:record";
  const std::string pattern = GlobEscape(head) + HexEncode(prefix) + "*" + std::string(kTail);
  std::vector<std::pair<std::string, std::string>> records;
  // In a cluster, every master's keys: each SCAN walks one node.
  LH_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RedisConnectionPool>> masters,
                      router_->MasterPools());
  for (const std::shared_ptr<RedisConnectionPool>& master : masters) {
    const std::string address = master->options().Address();
    LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, master->Borrow());
    std::string cursor = "0";
    do {
      LH_ASSIGN_OR_RETURN(ScanPage page, Scan(*pool_, connection.get(), address, pattern, cursor));
      cursor = std::move(page.cursor);
      std::vector<std::string> keys;
      std::vector<Command> reads;
      for (std::string& redis_key : page.keys) {
        std::optional<std::string> key = LeaseNameOf(redis_key, head, kTail);
        if (!key) {
          continue;  // not one of ours
        }
        keys.push_back(std::move(*key));
        reads.push_back({"GET", std::move(redis_key)});
      }
      if (reads.empty()) {
        continue;
      }
      pool_->round_trips_.fetch_add(1, std::memory_order_relaxed);
      LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> values, connection->Pipeline(reads, address));
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const redisReply* reply = values[i].get();
        if (IsError(reply) && ParseRedirection(ReplyText(reply))) {
          continue;  // migrated since SCAN saw it: the target's walk finds it, or has
        }
        if (IsError(reply)) {
          return ErrorReplyStatus(address, "GET", ReplyText(reply));
        }
        if (reply->type == REDIS_REPLY_NIL) {
          continue;  // expired since SCAN saw it
        }
        if (reply->type != REDIS_REPLY_STRING) {
          return Status::Internal(
              fmt::format("unexpected reply from redis to GET of the record of {}", keys[i]));
        }
        records.emplace_back(std::move(keys[i]), std::string(ReplyText(reply)));
      }
    } while (cursor != "0");
  }
  // std::string compares as unsigned bytes (char_traits<char>::lt), the order the other stores
  // give.
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  // SCAN may return a key more than once.
  records.erase(std::unique(records.begin(), records.end(),
                            [](const auto& a, const auto& b) { return a.first == b.first; }),
                records.end());
  return records;
}

Result<StoreTime> RedisBackend::WallClock() {
  // In a cluster, the clock of slot 0's master.
  std::vector<Command> time = {{"TIME"}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, time, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ErrorReplyStatus(options_.Address(), "TIME", ReplyText(reply));
  }
  // {unix seconds, microseconds within the second}, both as strings.
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) {
    return Status::Internal("unexpected reply from redis to TIME");
  }
  LH_ASSIGN_OR_RETURN(long long seconds, ParseInteger(reply->element[0]));
  LH_ASSIGN_OR_RETURN(long long micros, ParseInteger(reply->element[1]));
  return StoreTime{.time = SystemTime(std::chrono::duration_cast<SystemTime::duration>(
                       std::chrono::seconds(seconds) + std::chrono::microseconds(micros))),
                   .from_store = true};
}

}  // namespace leasehold::internal
