// File: backends/redis/redis_replies.cc (internal)
//
// Reading the replies of leasehold's Lua scripts and pub/sub messages (redis_replies.h).

#include "backends/redis/redis_replies.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "backends/backend.h"
#include "backends/common/time.h"

namespace leasehold::internal {

namespace {

// Returns the Redis command called on `line` (1-based) of `body`, upper-cased, or "".
std::string CommandOnLine(std::string_view body, int line) {
  std::size_t start = 0;
  for (int i = 1; i < line && start != std::string_view::npos; ++i) {
    start = body.find('\n', start);
    start = start == std::string_view::npos ? start : start + 1;
  }
  if (start == std::string_view::npos) {
    return {};
  }
  std::string_view text = body.substr(start, body.find('\n', start) - start);
  constexpr std::string_view kCall = "redis.call('";
  std::size_t at = text.find(kCall);
  if (at == std::string_view::npos) {
    return {};
  }
  text = text.substr(at + kCall.size());
  std::string name(text.substr(0, text.find('\'')));
  for (char& c : name) {
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

}  // namespace

// As ErrorReplyStatus, for an error raised inside `script`. Redis 7.0 reports an ACL refusal
// inside a script as "ERR The user executing the script can't run this command or subcommand
// script: <sha>, on @user_script:<line>." without the command's name: recover it from the
// script's own text, so that the operator learns which command to grant.
Status ScriptErrorStatus(std::string_view address, std::string_view what, std::string_view body,
                         std::string_view error) {
  Status status = ErrorReplyStatus(address, what, error);
  constexpr std::string_view kLineTag = "@user_script:";
  std::size_t at = error.find(kLineTag);
  if (status.code() != StatusCode::kPermissionDenied || at == std::string_view::npos) {
    return status;
  }
  int line = 0;
  std::string_view digits = error.substr(at + kLineTag.size());
  std::from_chars(digits.data(), digits.data() + digits.size(), line);
  std::string command = CommandOnLine(body, line);
  if (command.empty()) {
    return status;
  }
  return Status::PermissionDenied(
      fmt::format("redis at {} refused {}: the ACL user may not run the '{}' command (add "
                  "+{} to the user's ACL rules)",
                  address, what, command,
                  [&] {
                    std::string lower = command;
                    for (char& c : lower) {
                      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                    }
                    return lower;
                  }()),
      std::string(error));
}

// {holder, token_prefix, fence, pttl_ms, ttl_ms[, kind, limit, slot]} starting at element
// `first` of `reply`.
Result<LeaseInfo> ParseLeaseInfo(std::string key, const redisReply* reply, std::size_t first) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements < first + 5) {
    return Status::Internal("unexpected reply from redis: malformed grant");
  }
  LeaseInfo info;
  info.key = std::move(key);
  info.holder = std::string(ReplyText(reply->element[first]));
  info.token_prefix = std::string(ReplyText(reply->element[first + 1]));
  TakeKeptMark(info);
  LH_ASSIGN_OR_RETURN(long long fence, ParseInteger(reply->element[first + 2]));
  LH_ASSIGN_OR_RETURN(long long pttl, ParseInteger(reply->element[first + 3]));
  Result<long long> ttl = ParseInteger(reply->element[first + 4]);
  info.fencing_token = static_cast<FencingToken>(fence);
  info.remaining = StoreMillis(pttl);
  info.ttl = StoreMillis(ttl.ok() ? *ttl : 0);
  if (reply->elements >= first + 8 && reply->element[first + 5]->type != REDIS_REPLY_NIL) {
    const std::string_view kind = ReplyText(reply->element[first + 5]);
    Result<long long> limit = ParseInteger(reply->element[first + 6]);
    Result<long long> slot = ParseInteger(reply->element[first + 7]);
    info.mode = kind == "shared" ? LeaseMode::kShared : LeaseMode::kExclusive;
    info.limit = static_cast<std::uint32_t>(
        std::clamp<long long>(limit.ok() ? *limit : 1, 1, kMaxLeaseLimit));
    info.slot =
        static_cast<std::uint32_t>(std::clamp<long long>(slot.ok() ? *slot : 0, 0, kMaxLeaseLimit));
  }
  return info;
}

// Turns the acquire scripts' refusal into kHeldByAnother: {0, the 8 holder fields (nil when the
// key is free but others are queued ahead), then intent (fair=false) or next_prefix, queued,
// position (fair=true)}.
Status HeldReply(std::string_view key, const redisReply* reply) {
  const bool fair = reply->elements >= 12;
  std::optional<LeaseInfo> holder;
  if (reply->elements >= 2 && reply->element[1]->type != REDIS_REPLY_NIL) {
    LH_ASSIGN_OR_RETURN(holder, ParseLeaseInfo(std::string(key), reply, 1));
  }
  if (!fair) {
    if (!holder) {
      return Status::Internal("unexpected reply from redis to the acquire script");
    }
    return Status::HeldByAnother(*holder);
  }
  const std::string next(ReplyText(reply->element[9]));
  LH_ASSIGN_OR_RETURN(long long queued, ParseInteger(reply->element[10]));
  LH_ASSIGN_OR_RETURN(long long position, ParseInteger(reply->element[11]));
  std::string queue = queued == 0 ? std::string("no waiters queued")
                                  : fmt::format("{} waiter(s) queued, next {}", queued, next);
  if (position >= 0) {
    queue += fmt::format(", this waiter is #{}", position + 1);
  }
  if (holder) {
    return Status::HeldByAnother(*holder, queue);
  }
  return Status::HeldByAnother(fmt::format("{} is free but queued for: {}", key, queue));
}

// The TTL of the grant a "handed <waiter id> <fencing token> <t_q> <ttl_ms>[ <slot>]" message
// (kFairEndScript) reports, if it went to a waiter other than `waiter_id`; nullopt otherwise
// (ours, another kind of message, or unreadable).
std::optional<Duration> HandedToOther(std::string_view payload, std::string_view waiter_id) {
  if (!payload.starts_with("handed ")) {
    return std::nullopt;
  }
  std::string_view rest = payload.substr(7);
  const std::size_t id_end = rest.find(' ');
  if (id_end == std::string_view::npos || rest.substr(0, id_end) == waiter_id) {
    return std::nullopt;
  }
  // The fourth word after "handed " (the slot, for a shared or semaphore grant, follows it).
  std::string_view ttl_text = rest;
  for (int i = 0; i < 3; ++i) {
    const std::size_t space = ttl_text.find(' ');
    if (space == std::string_view::npos) {
      return std::nullopt;
    }
    ttl_text = ttl_text.substr(space + 1);
  }
  ttl_text = ttl_text.substr(0, ttl_text.find(' '));
  long long ttl_ms = 0;
  auto [end, ec] = std::from_chars(ttl_text.data(), ttl_text.data() + ttl_text.size(), ttl_ms);
  if (ec != std::errc() || end != ttl_text.data() + ttl_text.size() || ttl_ms <= 0) {
    return std::nullopt;
  }
  return StoreMillis(ttl_ms);
}

std::optional<std::int64_t> ParseServerTime(const redisReply* reply) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) {
    return std::nullopt;
  }
  std::int64_t parts[2] = {0, 0};
  // Seconds up to year 9999; microseconds below one second.
  constexpr std::int64_t kLimits[2] = {253'402'300'799, 999'999};
  for (int i = 0; i < 2; ++i) {
    const redisReply* e = reply->element[i];
    if (e == nullptr || e->type != REDIS_REPLY_STRING) {
      return std::nullopt;
    }
    const std::string_view text = ReplyText(e);
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, parts[i]);
    if (ec != std::errc() || ptr != end || parts[i] < 0 || parts[i] > kLimits[i]) {
      return std::nullopt;
    }
  }
  return parts[0] * 1'000'000 + parts[1];
}

}  // namespace leasehold::internal
