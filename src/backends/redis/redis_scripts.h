// File: backends/redis/redis_scripts.h (internal)
//
// The Lua scripts of the redis:// store, one per operation. Each runs atomically on the server
// (no other command interleaves), so each mutation is one atomic store step as DESIGN.md
// section 2 requires. They are loaded once with SCRIPT LOAD and run with EVALSHA; after a
// NOSCRIPT reply (restart, SCRIPT FLUSH) the backend reloads them and runs the call again,
// which is safe because NOSCRIPT means the script did not run.
//
// Layout, for a lease named K (hex-encoded as H) under prefix P:
//   P:{H}         hash {token, holder, fence, ttl} with a PEXPIRE: the grant
//   P:{H}:fence   integer, INCR'd per grant, never deleted: the fencing counter
//   P:{H}:released  pub/sub channel, one message per release or force-release
// Every key a script touches is passed in KEYS (cluster-safe; both share the {H} slot).
//
// Thread safety: constants only.

#pragma once

#include <string_view>

namespace leasehold::internal {

// KEYS[1] = grant hash, KEYS[2] = fence counter.
// ARGV[1] = owner token, ARGV[2] = holder identity, ARGV[3] = TTL in milliseconds.
// Returns {1, fencing_token} when granted, or
// {0, holder, token_prefix, fencing_token, pttl_ms, ttl_ms} when someone else holds it.
inline constexpr std::string_view kAcquireScript = R"lua(
if redis.call('EXISTS', KEYS[1]) == 1 then
  local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'fence', 'ttl')
  return {0, h[1], string.sub(h[2] or '', 1, 8), h[3], redis.call('PTTL', KEYS[1]), h[4]}
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'holder', ARGV[2], 'fence', fence, 'ttl', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, fence}
)lua";
// Line by line:
//   1   A live grant exists (an expired one reads as absent: the server checks expiry).
//   2   Read who holds it, for the kHeldByAnother reply.
//   3   Answer with the holder, only the first 8 characters of its owner token (the full token
//       never leaves the server), its fencing token, the time left and its TTL.
//   5   Bump the fencing counter first: it survives release, expiry and force-release, so the
//       next grant's token is always higher than every earlier one.
//   6   Record the grant: owner token (checked by renew/release), holder, fencing token, TTL.
//   7   The grant ends by itself after the TTL unless renewed.
//   8   Granted, with its fencing token.

// KEYS[1] = grant hash. ARGV[1] = owner token, ARGV[2] = TTL in milliseconds.
// Returns 1 if renewed, 0 if the grant is absent, expired or someone else's.
inline constexpr std::string_view kRenewScript = R"lua(
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[1], 'ttl', ARGV[2])
  return 1
end
return 0
)lua";
// Line by line:
//   1   Only the owner token that made the grant may extend it (HGET of a missing key is false).
//   2   Extend to the TTL from now, on the server's clock.
//   3   Remember the TTL for Inspect/List.
//   4   Renewed.
//   6   Not ours (or gone): the core turns this into kLost, terminal.

// KEYS[1] = grant hash. ARGV[1] = owner token, ARGV[2] = release channel.
// Returns 1 if the grant was deleted, 0 if it was absent, expired or someone else's.
inline constexpr std::string_view kReleaseScript = R"lua(
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
)lua";
// Line by line:
//   1   Compare-and-delete: never delete someone else's grant.
//   2   Delete the grant; the fence counter stays.
//   3   Wake every waiter subscribed to this key's channel.
//   4   Released.
//   6   Lost or stolen: nothing is deleted.

// KEYS[1] = grant hash. ARGV[1] = release channel.
// Returns 1 if a live grant was deleted, 0 if the key was free.
inline constexpr std::string_view kForceReleaseScript = R"lua(
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], 'released')
  return 1
end
return 0
)lua";
// Line by line:
//   1   Delete whoever's grant it is (operator break-glass); the fence counter stays.
//   2   Wake waiters, as a release does.
//   3   A grant was deleted.
//   5   The key was already free.

// KEYS[1] = grant hash.
// Returns nil if there is no live grant, else {holder, token_prefix, fencing_token, pttl_ms,
// ttl_ms}.
inline constexpr std::string_view kInspectScript = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'fence', 'ttl')
return {h[1], string.sub(h[2] or '', 1, 8), h[3], redis.call('PTTL', KEYS[1]), h[4]}
)lua";
// Line by line:
//   1-3 No live grant: a nil reply.
//   4   Read the grant's fields.
//   5   Answer with the same view as the acquire script's refusal, read in the same atomic
//       step as the PTTL so that the fields and the time left belong to one grant.

}  // namespace leasehold::internal
