// File: tests/fuzz/redis_reply_fuzz.cc
//
// Bytes from a Redis server, read by hiredis' own reply reader (redisReader, what every
// RedisConnection uses), then by leasehold's decoding of those replies (redis_connection.h,
// redis_replies.h): integers, error replies, TIME, a script's error, the grant fields of the
// acquire and inspect scripts, the acquire scripts' refusal, the fair queue's "handed" message,
// and a sentinel's SENTINEL REPLICAS list and its master with its config epoch
// (redis_failover.h).
// Invariants:
// - A decoded grant has a remaining time and a TTL in [0, Duration's range] (printed with
//   FormatDuration, in nanoseconds, without overflow).
// - An error reply maps to kPermissionDenied, kUnavailable or kInternal, naming the server.
// - A refusal decodes to kHeldByAnother or kInternal, never anything else.
// - A handed-over TTL is > 0.
// - A TIME reply decodes to microseconds in [0, year 10000), or to none.
// - A replica list decodes, or is kInternal; counted, it needs no more confirmations than can
//   confirm, and none when no replica can be promoted.
// - A sentinel's master decodes to a port in 1..65535 and an epoch in 0..kMaxSentinelEpoch,
//   to none, or is kInternal.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>

#include "leasehold/duration.h"

#include "backends/redis/redis_connection.h"
#include "backends/redis/redis_failover.h"
#include "backends/redis/redis_replies.h"
#include "backends/redis/redis_scripts.h"
#include "fuzz_check.h"

namespace {

using leasehold::Duration;
using leasehold::LeaseInfo;
using leasehold::Status;
using leasehold::StatusCode;
using namespace leasehold::internal;

void CheckErrorStatus(const Status& status) {
  FUZZ_CHECK(status.code() == StatusCode::kPermissionDenied ||
                 status.code() == StatusCode::kUnavailable ||
                 status.code() == StatusCode::kInternal,
             status.message());
  FUZZ_CHECK(status.message().starts_with("redis at 127.0.0.1:6379 refused "), status.message());
}

void CheckGrant(const redisReply* reply, std::size_t first) {
  leasehold::Result<LeaseInfo> info = ParseLeaseInfo("k", reply, first);
  if (!info.ok()) {
    FUZZ_CHECK(info.status().code() == StatusCode::kInternal, info.status().message());
    return;
  }
  // In [0, Duration's range]: callers print them with FormatDuration (nanoseconds).
  constexpr auto kMax = std::chrono::duration_cast<std::chrono::milliseconds>(Duration::max());
  FUZZ_CHECK(info->remaining >= Duration::zero() && info->remaining <= kMax,
             std::to_string(info->remaining.count()));
  FUZZ_CHECK(info->ttl >= Duration::zero() && info->ttl <= kMax, std::to_string(info->ttl.count()));
  (void)leasehold::FormatDuration(info->ttl);
  (void)leasehold::FormatDuration(info->remaining);
}

void CheckReply(const redisReply* reply, int depth) {
  const std::string_view text = ReplyText(reply);
  leasehold::Result<long long> integer = ParseInteger(reply);
  if (integer.ok() && reply->type == REDIS_REPLY_INTEGER) {
    FUZZ_CHECK(*integer == reply->integer, "integer changed");
  }
  if (IsError(reply)) {
    CheckErrorStatus(ErrorReplyStatus("127.0.0.1:6379", "acquiring k", text));
    CheckErrorStatus(ScriptErrorStatus("127.0.0.1:6379", "acquiring k", kAcquireScript, text));
    CheckErrorStatus(ScriptErrorStatus("127.0.0.1:6379", "acquiring k", kFairAcquireScript, text));
  }
  if (std::optional<Duration> ttl = HandedToOther(text, "w1")) {
    FUZZ_CHECK(*ttl > Duration::zero(), std::string(text));
  }
  if (std::optional<std::int64_t> us = ParseServerTime(reply)) {
    FUZZ_CHECK(*us >= 0 && *us < 253'402'300'800'000'000, std::to_string(*us));
  }
  if (reply->type != REDIS_REPLY_ARRAY) {
    return;
  }
  CheckGrant(reply, 0);
  CheckGrant(reply, 1);
  leasehold::Result<std::vector<SentinelReplica>> replicas = ParseSentinelReplicas(reply);
  if (!replicas.ok()) {
    FUZZ_CHECK(replicas.status().code() == StatusCode::kInternal, replicas.status().message());
  } else {
    const FailoverCopies copies = CountFailoverCopies(*replicas, 1);
    FUZZ_CHECK(copies.needed <= copies.confirming && copies.promotable <= copies.confirming,
               copies.listing);
    FUZZ_CHECK(copies.promotable > 0 || copies.needed == 0, copies.listing);
  }
  // As AskSentinels calls it: the reply as both answers, and its first two elements as the pair.
  auto master = [](const redisReply* address, const redisReply* fields) {
    leasehold::Result<std::optional<SentinelMaster>> m = ParseSentinelMaster(address, fields);
    if (!m.ok()) {
      FUZZ_CHECK(m.status().code() == StatusCode::kInternal, m.status().message());
    } else if (m->has_value()) {
      FUZZ_CHECK((*m)->port >= 1 && (*m)->port <= 65535, (*m)->host);
      FUZZ_CHECK((*m)->epoch >= 0 && (*m)->epoch <= kMaxSentinelEpoch, (*m)->host);
    }
  };
  master(reply, reply);
  if (reply->elements >= 2) {
    master(reply->element[0], reply->element[1]);
  }
  // As RedisBackend::TryAcquire calls it: an array of at least 2 whose first element is 0.
  if (reply->elements >= 2) {
    leasehold::Result<long long> granted = ParseInteger(reply->element[0]);
    if (granted.ok() && *granted == 0) {
      Status held = HeldReply("k", reply);
      FUZZ_CHECK(held.code() == StatusCode::kHeldByAnother || held.code() == StatusCode::kInternal,
                 held.message());
    }
  }
  if (depth < 8) {
    for (std::size_t i = 0; i < reply->elements; ++i) {
      CheckReply(reply->element[i], depth + 1);
    }
  }
}

// True if some "*<count>" header in `bytes` declares more than a million elements. hiredis
// 0.14 allocates the element array as soon as it reads the header (it has no maxelements
// limit, which hiredis 1.0 added), so a server can make a client allocate any amount: a
// limitation of the Debian 12 hiredis, noted in tests/chaos/RESULTS.md, not a leasehold bug,
// and not what this target looks for.
bool DeclaresHugeArray(std::string_view bytes) {
  for (std::size_t at = bytes.find('*'); at != std::string_view::npos;
       at = bytes.find('*', at + 1)) {
    std::size_t digits = 0;
    while (at + 1 + digits < bytes.size() && bytes[at + 1 + digits] >= '0' &&
           bytes[at + 1 + digits] <= '9') {
      ++digits;
    }
    if (digits > 6) {
      return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (DeclaresHugeArray(leasehold::fuzz::AsText(data, size))) {
    return 0;
  }
  redisReader* reader = redisReaderCreate();
  FUZZ_CHECK(reader != nullptr, "out of memory");
  if (redisReaderFeed(reader, reinterpret_cast<const char*>(data), size) == REDIS_OK) {
    // Every complete reply in the bytes, as a pipelined read takes them; a protocol error ends
    // the read (the connection would be marked broken).
    for (int replies = 0; replies < 64; ++replies) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader, &raw) != REDIS_OK || raw == nullptr) {
        break;
      }
      auto* reply = static_cast<redisReply*>(raw);
      CheckReply(reply, 0);
      freeReplyObject(reply);
    }
  }
  redisReaderFree(reader);
  return 0;
}
