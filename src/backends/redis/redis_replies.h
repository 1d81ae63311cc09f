// File: backends/redis/redis_replies.h (internal)
//
// Reading what the redis:// store gets back from the server beyond a bare integer (that is
// ParseInteger, redis_connection.h): the grant fields of the acquire and inspect scripts, the
// acquire scripts' refusal, a script's error reply, the "handed" pub/sub message of the fair
// queue, and TIME. Plain functions of hiredis replies and strings, so that the fuzz target
// tests/fuzz/redis_reply_fuzz.cc reads them from bytes fed through hiredis' own reader.
//
// Thread safety: plain functions.

#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <hiredis/hiredis.h>

#include "leasehold/clock.h"
#include "leasehold/lease_info.h"
#include "leasehold/status.h"

#include "backends/redis/redis_connection.h"

namespace leasehold::internal {

// As ErrorReplyStatus, for an error raised inside the script whose text is `body`. Redis 7.0
// reports an ACL refusal inside a script as "ERR The user executing the script can't run this
// command or subcommand script: <sha>, on @user_script:<line>." without the command's name: it
// is recovered from the script's own text, so that the operator learns which command to grant.
Status ScriptErrorStatus(std::string_view address, std::string_view what, std::string_view body,
                         std::string_view error);

// Reads {holder, token_prefix, fence, pttl_ms, ttl_ms[, kind, limit, slot]} starting at element
// `first` of the array `reply` (without the last three: an exclusive grant, slot 0). Returns
// kInternal if the reply is not such an array.
Result<LeaseInfo> ParseLeaseInfo(std::string key, const redisReply* reply, std::size_t first);

// Turns the acquire scripts' refusal, the array {0, 8 holder fields (nil when the key is free but
// others are queued ahead), intent | next_prefix, queued, position}, into kHeldByAnother;
// kInternal if the reply is not one.
Status HeldReply(std::string_view key, const redisReply* reply);

// The TTL of the grant a "handed <waiter id> <fencing token> <t_q> <ttl_ms>[ <slot>]" message
// (kFairEndScript) reports, if it went to a waiter other than `waiter_id`; nullopt otherwise
// (ours, another kind of message, or unreadable).
std::optional<Duration> HandedToOther(std::string_view payload, std::string_view waiter_id);

// The server's wall clock from TIME's reply {unix seconds, microseconds}, in microseconds since
// the Unix epoch; nullopt for any other reply (an error, another shape, a number out of range).
std::optional<std::int64_t> ParseServerTime(const redisReply* reply);

}  // namespace leasehold::internal
