// File: backends/redis/redis_fair_scripts.h (internal)
//
// The scripts of the fair queue (fair=true): the acquire that queues, the end that hands the
// key to the head waiter, a waiter's withdrawal and the queue's state for WaitForTurn. The key
// layout, kGrantLib and the other scripts are in redis_scripts.h, which includes this.

#pragma once

#include <string_view>

namespace leasehold::internal {

// The acquire script of fair=true, with kGrantLib. KEYS[1] = grant hash, KEYS[2] = fence
// counter, KEYS[3] = queue, KEYS[4] = queue expiry, KEYS[5] = queue arrival counter,
// KEYS[6] = queue entries' grant data.
// ARGV[1] = owner token, ARGV[2] = holder identity, ARGV[3] = TTL in milliseconds,
// ARGV[4] = waiter id ('' for a plain try-acquire), ARGV[5] = queue entry lifetime in ms,
// ARGV[6] = t_q: the caller's send time of this attempt, on its own steady clock (opaque here),
// ARGV[7] = kind, ARGV[8] = limit (as kAcquireScript), ARGV[9] = the least fencing token
// (kGrantLib's lh_floor).
// Returns {1, fencing_token, slot} when granted; {2, fencing_token, t_q, ttl_ms, slot} when a
// release already handed the key to this waiter (kFairEndScript) under its owner token, t_q
// being the send time of the waiter's attempt whose entry the release found; {3, ...} on a
// mismatch as kAcquireScript; or {0, <lh_info of the lowest slot, or lh_none when no grant
// lives>, next_prefix, queued, position} when not: next_prefix is the first 8 characters of
// the head waiter's id, queued the queue length, position the caller's 0-based place in the
// queue (-1 when not queued).
inline constexpr std::string_view kFairAcquireScript = R"lua(
local now = lh_now(); lh_floor = lh_floor_of(ARGV[9])
lh_qpurge(KEYS[3], KEYS[4], KEYS[6], now)
local st = lh_state(KEYS[1], now, true)
local kind, limit = ARGV[7], tonumber(ARGV[8])
if ARGV[4] ~= '' then
  for _, g in ipairs(st.grants) do
    if g.tok == ARGV[1] and g.w == ARGV[4] then
      return {2, g.f, g.q, g.t, g.s}
    end
  end
end
local admits = lh_admits(st, kind, limit, ARGV[1])
if admits == 'mismatch' then
  return {3, st.kind, st.limit, st.grants[1].h}
end
local rank = false
if ARGV[4] ~= '' then
  rank = redis.call('ZRANK', KEYS[3], ARGV[4])
end
local ahead = rank or redis.call('ZCARD', KEYS[3])
local fits = admits == 'ok'
if fits and ahead > 0 then
  if kind == 'semaphore' then
    fits = #st.grants + ahead < limit
  elseif kind == 'shared' then
    for _, w in ipairs(redis.call('ZRANGE', KEYS[3], 0, ahead - 1)) do
      if redis.call('HGET', KEYS[6], w .. ':kind') ~= 'shared' then
        fits = false
        break
      end
    end
  else
    fits = false
  end
end
if fits then
  if rank then
    lh_qleave(KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[4])
  end
  local fence, slot = lh_grant(KEYS[1], KEYS[2], st, kind, limit, ARGV[1], ARGV[2], ARGV[3], now)
  return {1, fence, slot}
end
local position = -1
if ARGV[4] ~= '' then
  if not rank then
    redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[5]), ARGV[4])
  end
  redis.call('ZADD', KEYS[4], lh_fmt(now + tonumber(ARGV[5])), ARGV[4])
  redis.call('HSET', KEYS[6], ARGV[4] .. ':token', ARGV[1], ARGV[4] .. ':holder', ARGV[2],
             ARGV[4] .. ':ttl', ARGV[3], ARGV[4] .. ':tq', ARGV[6], ARGV[4] .. ':kind', kind,
             ARGV[4] .. ':limit', ARGV[8])
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIREAT', KEYS[3], last)
  redis.call('PEXPIREAT', KEYS[4], last)
  redis.call('PEXPIREAT', KEYS[5], last)
  redis.call('PEXPIREAT', KEYS[6], last)
  position = redis.call('ZRANK', KEYS[3], ARGV[4])
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
local out = {0, unpack(st.grants[1] and lh_info(st, st.grants[1]) or lh_none())}
out[10], out[11], out[12] = string.sub(head or '', 1, 8), redis.call('ZCARD', KEYS[3]), position
return out
)lua";

// fair=true, with kGrantLib: the end of a grant that hands the key to the head(s) of the queue
// in the same step: Release, Finish without keep, ForceRelease, ForceReleaseGrant, and
// AbandonWait of a waiter that was handed the key after it gave up. KEYS[1] = grant hash,
// KEYS[2] = fence counter, KEYS[3] = queue, KEYS[4] = queue expiry, KEYS[5] = queue arrival
// counter, KEYS[6] = queue entries' grant data, KEYS[7] = record. ARGV[1] = owner token
// ('owner'), unused ('force'), waiter id ('handed') or token prefix ('prefix'), ARGV[2] =
// release channel, ARGV[3] = which grant may be ended: 'owner' (the one holding ARGV[1]),
// 'force' (all), 'handed' (the one a release handed to waiter ARGV[1]), 'prefix' (the one whose
// token starts with ARGV[1]), ARGV[4] = '1' to write the record, ARGV[5] = the record,
// ARGV[6] = its TTL in milliseconds, ARGV[7] = the least fencing token of a grant to a waiter
// (kGrantLib's lh_floor).
// Returns 0 if no such grant was live (nothing changes), 1 if it was deleted and nobody was
// handed the key, 2 if it was deleted and the key handed to one or more head waiters.
inline constexpr std::string_view kFairEndScript = R"lua(
local now = lh_now(); lh_floor = lh_floor_of(ARGV[7])
local st = lh_state(KEYS[1], now, true)
local victim = nil
for _, g in ipairs(st.grants) do
  if ARGV[3] == 'force' or (ARGV[3] == 'owner' and g.tok == ARGV[1]) or
      (ARGV[3] == 'handed' and g.w == ARGV[1]) or
      (ARGV[3] == 'prefix' and string.sub(g.tok, 1, #ARGV[1]) == ARGV[1]) then
    victim = g
    break
  end
end
if not victim then
  return 0
end
if ARGV[4] == '1' then
  redis.call('SET', KEYS[7], ARGV[5], 'PX', ARGV[6])
end
if st.kind == 'exclusive' or ARGV[3] == 'force' then
  redis.call('DEL', KEYS[1])
  st = {kind = 'none', limit = 1, grants = {}}
else
  redis.call('HDEL', KEYS[1], victim.field)
  st = lh_state(KEYS[1], now, true)
end
lh_qpurge(KEYS[3], KEYS[4], KEYS[6], now)
local handed, stuck = 0, false
while true do
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then
    break
  end
  local e = redis.call('HMGET', KEYS[6], head .. ':token', head .. ':holder', head .. ':ttl',
                       head .. ':tq', head .. ':kind', head .. ':limit')
  if not (e[1] and e[2] and e[3] and e[4]) then
    stuck = true
    break
  end
  local kind, limit = e[5] or 'exclusive', tonumber(e[6]) or 1
  local admits = lh_admits(st, kind, limit, e[1])
  if admits ~= 'ok' then
    stuck = admits == 'mismatch'
    break
  end
  lh_qleave(KEYS[3], KEYS[4], KEYS[5], KEYS[6], head)
  local fence, slot = lh_grant(KEYS[1], KEYS[2], st, kind, limit, e[1], e[2], e[3], now, head,
                               e[4])
  local message = 'handed ' .. head .. ' ' .. lh_fmt(fence) .. ' ' .. e[4] .. ' ' .. e[3]
  if kind ~= 'exclusive' then
    message = message .. ' ' .. slot
  end
  redis.call('PUBLISH', ARGV[2], message)
  handed = handed + 1
end
if handed == 0 or stuck then
  redis.call('PUBLISH', ARGV[2], 'released')
end
return handed > 0 and 2 or 1
)lua";

// fair=true, with kGrantLib: a waiter gives up (Backend::AbandonWait). KEYS[1] = grant hash,
// KEYS[2] = queue, KEYS[3] = queue expiry, KEYS[4] = queue arrival counter, KEYS[5] = queue
// entries' grant data. ARGV[1] = waiter id, ARGV[2] = release channel. Returns 1 if the waiter
// was queued, 2 if a release already handed it the key (the caller then ends that grant with
// kFairEndScript, 'handed'), else 0.
inline constexpr std::string_view kAbandonWaitScript = R"lua(
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  for _, g in ipairs(lh_state(KEYS[1], lh_now(), false).grants) do
    if g.w == ARGV[1] then
      return 2
    end
  end
  return 0
end
redis.call('ZREM', KEYS[3], ARGV[1])
lh_qdrop(KEYS[5], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[4], KEYS[5])
elseif redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'kind') == 1 then
  redis.call('PUBLISH', ARGV[2], 'next')
end
return 1
)lua";

// fair=true, with kGrantLib: what a waiter that was refused needs in order to sleep well
// (WaitForChange). KEYS[1] = grant hash, KEYS[2] = queue, KEYS[3] = queue expiry.
// ARGV[1] = the caller's waiter id, or '' if unknown.
// Returns {left_ms, head_left_ms, is_head, shared}: the time until the first live grant ends
// (-2 if the key is free), the time until the head waiter's entry expires (-1 if nobody is
// queued), 1 if the caller is the head, 2 if a release handed a live grant to the caller (its
// message may have gone before the caller subscribed), and 1 if the key is shared or a
// semaphore.
inline constexpr std::string_view kQueueStateScript = R"lua(
local now = lh_now()
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', lh_fmt(now))) do
  redis.call('ZREM', KEYS[2], w)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', lh_fmt(now))
local st = lh_state(KEYS[1], now, false)
local left = -2
for _, g in ipairs(st.grants) do
  if ARGV[1] ~= '' and g.w == ARGV[1] then
    return {g.left, -1, 2, 0}
  end
  if left < 0 or g.left < left then
    left = g.left
  end
end
local shared = (st.kind == 'shared' or st.kind == 'semaphore') and 1 or 0
local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if head == nil then
  return {left, -1, 0, shared}
end
local deadline = redis.call('ZSCORE', KEYS[3], head)
return {left, math.max(0, (tonumber(deadline) or now) - now), head == ARGV[1] and 1 or 0, shared}
)lua";

}  // namespace leasehold::internal
