// File: backends/redis/redis_scripts.h (internal)
//
// The Lua scripts of the redis:// store, one per operation. Each runs atomically on the server
// (no other command interleaves), so each mutation is one atomic store step: a read-then-write
// from the client could interleave with another client's and is never used. They are loaded
// once with SCRIPT LOAD and run with EVALSHA; after a NOSCRIPT reply (restart, SCRIPT FLUSH) the
// backend reloads them and runs the call again, which is safe because NOSCRIPT means the script
// did not run.
//
// Layout, for a lease named K (hex-encoded as H) under prefix P:
//   P:{H}         hash {token, holder, fence, ttl} with a PEXPIRE: the grant
//   P:{H}:fence   integer, INCR'd per grant, never deleted: the fencing counter
//   P:{H}:released  pub/sub channel, one message per release, force-release or finish
//   P:{H}:record  string with a PEXPIRE: the key's record (Backend::Finish), written only by
//                 the finish script, never deleted by a grant's end (release, expiry, force)
// and, with fair=true, the wait queue:
//   P:{H}:queue         zset waiter id -> arrival number: the queue order
//   P:{H}:queue:expiry  zset waiter id -> deadline (server time, ms): a waiter that stops
//                       re-attempting drops out of the queue at its deadline
//   P:{H}:queue:seq     integer, INCR'd per arrival: the arrival numbers
//   P:{H}:queue:data    hash "<waiter id>:token|holder|ttl|tq" -> value: what the waiter's
//                       latest attempt left for a release to grant it the key with
// The four queue keys get a PEXPIREAT at their latest entry's deadline, so a queue that every
// waiter abandons by dying leaves nothing behind. With fair=true a release, a finish without
// keep and a force-release (kFairEndScript) grant the key to the head waiter in the same step
// and publish "handed <waiter id> <fencing token> <t_q> <ttl_ms>"; the grant hash then also
// holds 'handed' (the waiter id) and 'tq' (the waiter's own send time, opaque to the server).
// Data keys, written only by the fenced-write script (Lease::Write), are the caller's own names
// and never start with "P:": the backend refuses those before sending, since they are the keys
// above (and their like for other leases).
// Every key a script touches is passed in KEYS (cluster-safe). The keys above share the {H}
// slot; a fenced write's data keys share it only if the caller names them with the same {H}
// hash tag (the "{...}" part of Lease::store_key()).
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

// The acquire script of fair=true. KEYS[1] = grant hash, KEYS[2] = fence counter,
// KEYS[3] = queue, KEYS[4] = queue expiry, KEYS[5] = queue arrival counter, KEYS[6] = queue
// entries' grant data.
// ARGV[1] = owner token, ARGV[2] = holder identity, ARGV[3] = TTL in milliseconds,
// ARGV[4] = waiter id ('' for a plain try-acquire), ARGV[5] = queue entry lifetime in ms,
// ARGV[6] = t_q: the caller's send time of this attempt, on its own steady clock (opaque here).
// Returns {1, fencing_token} when granted; {2, fencing_token, t_q, ttl_ms} when a release
// already handed the key to this waiter (kFairEndScript) under its owner token, t_q being the
// send time of the waiter's attempt whose entry the release found; or {0, holder, token_prefix,
// fencing_token, pttl_ms, ttl_ms, next_prefix, queued, position} when not: the first five
// describe the live grant (all nil, pttl -2, when the key is free but others are queued ahead),
// next_prefix is the first 8 characters of the head waiter's id, queued the queue length,
// position the caller's 0-based place in the queue (-1 when not queued).
inline constexpr std::string_view kFairAcquireScript = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', string.format('%d', now))) do
  redis.call('ZREM', KEYS[3], w)
  redis.call('HDEL', KEYS[6], w .. ':token', w .. ':holder', w .. ':ttl', w .. ':tq')
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', string.format('%d', now))
if ARGV[4] ~= '' then
  local g = redis.call('HMGET', KEYS[1], 'token', 'handed', 'fence', 'tq', 'ttl')
  if g[1] == ARGV[1] and g[2] == ARGV[4] then
    return {2, g[3], g[4], g[5]}
  end
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if redis.call('EXISTS', KEYS[1]) == 0 and (head == nil or head == ARGV[4]) then
  if head ~= nil then
    redis.call('ZREM', KEYS[3], head)
    redis.call('ZREM', KEYS[4], head)
    redis.call('HDEL', KEYS[6], head .. ':token', head .. ':holder', head .. ':ttl', head .. ':tq')
  end
  if redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('DEL', KEYS[5], KEYS[6])
  end
  local fence = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'holder', ARGV[2], 'fence', fence, 'ttl', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, fence}
end
local position = -1
if ARGV[4] ~= '' then
  if not redis.call('ZSCORE', KEYS[3], ARGV[4]) then
    redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[5]), ARGV[4])
  end
  redis.call('ZADD', KEYS[4], string.format('%d', now + tonumber(ARGV[5])), ARGV[4])
  redis.call('HSET', KEYS[6], ARGV[4] .. ':token', ARGV[1], ARGV[4] .. ':holder', ARGV[2],
             ARGV[4] .. ':ttl', ARGV[3], ARGV[4] .. ':tq', ARGV[6])
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIREAT', KEYS[3], last)
  redis.call('PEXPIREAT', KEYS[4], last)
  redis.call('PEXPIREAT', KEYS[5], last)
  redis.call('PEXPIREAT', KEYS[6], last)
  head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  position = redis.call('ZRANK', KEYS[3], ARGV[4])
end
local queued = redis.call('ZCARD', KEYS[3])
local first = string.sub(head or '', 1, 8)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, false, false, false, -2, false, first, queued, position}
end
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'fence', 'ttl')
return {0, h[1], string.sub(h[2] or '', 1, 8), h[3], redis.call('PTTL', KEYS[1]), h[4], first,
        queued, position}
)lua";
// Line by line:
//   1-2 Now, on the server's clock, in ms. Redis 7 replicates a script's effects, not the
//       script, so TIME before writes is allowed and replicas store the same deadlines. Numbers
//       go back to Redis through string.format('%d'), never in exponent form.
//   3-7 Drop every entry whose deadline has passed, with its grant data: a waiter that died,
//       or stopped waiting without AbandonWait, is skipped once its entry expires.
//   8-13 A waiter whose key a release handed over (kFairEndScript) while this attempt was on
//       its way, or whose notification was lost: the live grant holds its owner token and
//       names its waiter id. Answer with the fencing token and the t_q the release copied from
//       the entry, not as a fresh grant: its expiry began at the release, before this
//       attempt's send time, so the caller counts its validity from that t_q (a send time
//       before the release) and renews first if too little is left (redis_backend.cc). A
//       grant that holds the caller's token without 'handed' (its own earlier attempt whose
//       reply was lost) still reads as held by another, as the core expects.
//  14   The head of the queue: the lowest arrival number still live.
//  15   Grant only if the key is free and nobody is queued ahead: the queue is empty or its
//       head is the caller. A plain try-acquire (ARGV[4] == '') never matches a head.
//  16-20 The caller was the head: it leaves the queue, with its grant data.
//  21-23 The queue is now empty: drop its arrival counter and data too.
//  24-27 As kAcquireScript: bump the fencing counter, record the grant, set its TTL.
//  30-33 Not granted. A waiter (ARGV[4] set) takes its place at the tail on its first attempt
//       and keeps its arrival number on later ones...
//  34   ...and every attempt pushes its entry's deadline to now + the entry lifetime...
//  35-36 ...and rewrites what a release needs to grant the key to it inside the release
//       (kFairEndScript): owner token, holder, TTL, and this attempt's t_q. Every attempt
//       refreshes t_q, so the release always finds the send time of the latest attempt that
//       ran before it.
//  37-41 The queue keys live until the latest deadline, then vanish by themselves.
//  42-43 The (possibly new) head and the caller's place.
//  45-52 Answer with the queue and, when the key is held, the holder (as kAcquireScript).

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

// fair=true: the end of a grant that hands the key to the head of the queue in the same step:
// Release, Finish without keep, ForceRelease, and AbandonWait of a waiter that was handed the
// key after it gave up. KEYS[1] = grant hash, KEYS[2] = fence counter, KEYS[3] = queue,
// KEYS[4] = queue expiry, KEYS[5] = queue arrival counter, KEYS[6] = queue entries' grant data,
// KEYS[7] = record. ARGV[1] = owner token ('owner'), unused ('force') or waiter id ('handed'),
// ARGV[2] = release channel, ARGV[3] = which grant may be ended: 'owner' (the one holding
// ARGV[1]), 'force' (any), 'handed' (the one a release handed to waiter ARGV[1]),
// ARGV[4] = '1' to write the record, ARGV[5] = the record, ARGV[6] = its TTL in milliseconds.
// Returns 0 if no such grant was live (nothing changes), 1 if it was deleted and nobody waits,
// 2 if it was deleted and the key handed to the head waiter.
inline constexpr std::string_view kFairEndScript = R"lua(
local g = redis.call('HMGET', KEYS[1], 'token', 'handed')
if ARGV[3] == 'owner' and g[1] ~= ARGV[1] then
  return 0
elseif ARGV[3] == 'handed' and (not g[1] or g[2] ~= ARGV[1]) then
  return 0
elseif not g[1] then
  return 0
end
if ARGV[4] == '1' then
  redis.call('SET', KEYS[7], ARGV[5], 'PX', ARGV[6])
end
redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', string.format('%d', now))) do
  redis.call('ZREM', KEYS[3], w)
  redis.call('HDEL', KEYS[6], w .. ':token', w .. ':holder', w .. ':ttl', w .. ':tq')
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', string.format('%d', now))
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if head then
  local e = redis.call('HMGET', KEYS[6], head .. ':token', head .. ':holder', head .. ':ttl',
                       head .. ':tq')
  if e[1] and e[2] and e[3] and e[4] then
    redis.call('ZREM', KEYS[3], head)
    redis.call('ZREM', KEYS[4], head)
    redis.call('HDEL', KEYS[6], head .. ':token', head .. ':holder', head .. ':ttl', head .. ':tq')
    if redis.call('EXISTS', KEYS[3]) == 0 then
      redis.call('DEL', KEYS[5], KEYS[6])
    end
    local fence = redis.call('INCR', KEYS[2])
    redis.call('HSET', KEYS[1], 'token', e[1], 'holder', e[2], 'fence', fence, 'ttl', e[3],
               'handed', head, 'tq', e[4])
    redis.call('PEXPIRE', KEYS[1], e[3])
    redis.call('PUBLISH', ARGV[2], 'handed ' .. head .. ' ' .. fence .. ' ' .. e[4] .. ' ' .. e[3])
    return 2
  end
end
redis.call('PUBLISH', ARGV[2], 'released')
return 1
)lua";
// Line by line:
//   1-8 Which grant may be ended: the caller's own (compare-and-delete, as kReleaseScript), any
//       live one (force), or the one handed to waiter ARGV[1] (its Acquire gave up before it
//       took the grant: AbandonWait). No such grant: nothing changes, no record either.
//   9-11 Finish's record, as kFinishScript 4-6.
//  12   End the grant; the fence counter stays.
//  13-19 Drop expired queue entries, as kFairAcquireScript 1-7: a dead waiter whose entry ran
//       out is never handed the key.
//  20   The head of the queue, if anyone is still queued.
//  21-24 Its grant data, written by its latest attempt (kFairAcquireScript 35-36). An entry
//       without it (written by a client that predates the handoff) is woken as before (39-40).
//  25-27 The head leaves the queue, with its data...
//  28-30 ...and the queue's counter and data go when nobody is left, as kFairAcquireScript.
//  31-34 Grant it the key, exactly as kFairAcquireScript 24-26 would on its next attempt: bump
//       the fencing counter (so its token is above the releaser's), record its owner token,
//       holder, TTL, and 'handed' (its waiter id) and 'tq' (its latest attempt's send time),
//       which its next attempt recognises (kFairAcquireScript 8-13) if the message is lost.
//       The grant's expiry starts now, after the server ran that attempt, itself after the
//       waiter read t_q: expiry >= t_q + TTL on any clock that does not run fast beyond drift.
//  35   Tell it: "handed <waiter id> <fencing token> <t_q> <ttl_ms>". Others on the channel
//       learn the key is held again.
//  36   Handed over.
//  39-40 Nobody (with grant data) waits: wake the waiters as kReleaseScript does.

// KEYS[1] = grant hash, KEYS[2] = record. ARGV[1] = owner token, ARGV[2] = release channel,
// ARGV[3] = keep in milliseconds ('0': delete the grant), ARGV[4] = '1' to write the record,
// ARGV[5] = the record, ARGV[6] = the record's TTL in milliseconds.
// Returns 1 if the grant was ended, 0 if it was absent, expired or someone else's.
inline constexpr std::string_view kFinishScript = R"lua(
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return 0
end
if ARGV[4] == '1' then
  redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[6])
end
if ARGV[3] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('HSET', KEYS[1], 'ttl', ARGV[3], 'token', ARGV[1] .. ':kept')
end
redis.call('PUBLISH', ARGV[2], 'released')
return 1
)lua";
// Line by line:
//   1-3 Compare first, as kReleaseScript: someone else's grant (or none) changes nothing, and
//       the record is not written either.
//   4-6 Replace the record, with its own expiry: a key separate from the grant, so that no
//       grant's end (release, expiry, force-release) touches it.
//   7-8 keep = 0: delete the grant, as a release does; the fence counter stays.
//   9-11 keep > 0: the grant stays, same holder and fencing token, and now ends by itself
//       after keep. Its token gains ':kept', which no owner sends: a renewal of the owner's
//       already on its way (the heartbeat does not wait for one in flight) finds it someone
//       else's and cannot extend or shorten it. The token prefix shown to others is unchanged.
//  13   Wake the waiters either way: after a delete the head of a fair queue (or the quickest
//       waiter) takes the key, as after a release; after a keep they re-read the now shorter
//       remaining time instead of sleeping to the old expiry.

// A fenced write (Backend::FencedWrite): ops on data keys, applied only while the grant is the
// caller's. KEYS[1] = grant hash, KEYS[1 + i] = the data key of op i (i = 1..#KEYS - 1).
// ARGV[1] = owner token, ARGV[2] = '1' to check the grant ('0' skips the check: the chaos
// harness's negative control only); for op i, ARGV[3i] = 'put', 'del' or 'hset',
// ARGV[3i + 1] = the hash field ('' unless hset), ARGV[3i + 2] = the value ('' for del).
// Returns {1, count_1, ..., count_n} when applied (del: keys deleted; put, hset: 1);
// {0, 'none'} when there is no live grant; {0, 'other' or 'kept', holder, fencing_token} when
// the live grant is someone else's, or the caller's own kept past its release (kFinishScript);
// {-1, i, type} when op i is an hset onto a key holding a `type` other than a hash; {-2, i,
// command} when the ACL user may not run op i's command on its key. Nothing is written unless
// the reply starts with 1.
inline constexpr std::string_view kFencedWriteScript = R"lua(
if ARGV[2] == '1' then
  local token = redis.call('HGET', KEYS[1], 'token')
  if not token then
    return {0, 'none'}
  end
  if token ~= ARGV[1] then
    local h = redis.call('HMGET', KEYS[1], 'holder', 'fence')
    return {0, token == ARGV[1] .. ':kept' and 'kept' or 'other', h[1], h[2]}
  end
end
local calls, types = {}, {}
for i = 1, #KEYS - 1 do
  local key, kind = KEYS[i + 1], ARGV[3 * i]
  if kind == 'put' then
    calls[i] = {'SET', key, ARGV[3 * i + 2]}
    types[key] = 'string'
  elseif kind == 'del' then
    calls[i] = {'DEL', key}
    types[key] = 'none'
  else
    local t = types[key] or redis.call('TYPE', key)['ok']
    if t ~= 'hash' and t ~= 'none' then
      return {-1, i, t}
    end
    calls[i] = {'HSET', key, ARGV[3 * i + 1], ARGV[3 * i + 2]}
    types[key] = 'hash'
  end
  if redis.acl_check_cmd and not redis.acl_check_cmd(unpack(calls[i])) then
    return {-2, i, calls[i][1]}
  end
end
local out = {1}
for i = 1, #calls do
  local n = redis.call(unpack(calls[i]))
  out[i + 1] = calls[i][1] == 'DEL' and n or 1
end
return out
)lua";
// Line by line:
//   1-11 The guard: the grant hash still holds the caller's owner token. It compares the owner
//       token, not the fencing token: with persistence off a restarted server counts fencing
//       tokens from 1 again, so a later holder's number may equal or undercut an old one's, but
//       an owner token (32 random hex digits) never repeats. HGET of an absent or expired grant
//       is false (the server checks expiry): no live grant, nobody to name. A token that is the
//       caller's plus ':kept' is the caller's own grant after a finish with keep (kFinishScript
//       9-11): released, no longer the caller's to write with. Otherwise answer with the holder
//       and its fencing token, for the "is now held by" message.
//  12-32 Check everything that could fail before the first write: Redis does not undo the
//       earlier writes of a script whose later command errors. SET and DEL succeed on any key;
//       HSET fails (WRONGTYPE) on a key holding anything but a hash, so each HSET target's type
//       is read with TYPE, or taken from the earlier ops of this write on the same key (a put
//       makes it a string, a del makes it absent, an hset a hash). The ACL's command and key
//       rules are checked inside scripts per command, so each op's call is checked first with
//       redis.acl_check_cmd (Redis 7.0 and later; older servers, which lack it, check only at
//       the call). The server-state refusals (OOM, a read-only replica, min-replicas-to-write)
//       come at the first write or never: once a script has written, Redis runs it to the end.
//  33-38 Apply the ops in order and count: DEL's own count; SET and HSET count 1 (HSET's reply
//       is the number of new fields, 0 when the field is overwritten).

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

// fair=true: a waiter gives up (Backend::AbandonWait). KEYS[1] = grant hash, KEYS[2] = queue,
// KEYS[3] = queue expiry, KEYS[4] = queue arrival counter, KEYS[5] = queue entries' grant data.
// ARGV[1] = waiter id, ARGV[2] = release channel. Returns 1 if the waiter was queued, 2 if a
// release already handed it the key (the caller then ends that grant with kFairEndScript,
// 'handed'), else 0.
inline constexpr std::string_view kAbandonWaitScript = R"lua(
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  if redis.call('HGET', KEYS[1], 'handed') == ARGV[1] then
    return 2
  end
  return 0
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1] .. ':token', ARGV[1] .. ':holder', ARGV[1] .. ':ttl',
           ARGV[1] .. ':tq')
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[4], KEYS[5])
elseif redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('PUBLISH', ARGV[2], 'next')
end
return 1
)lua";
// Line by line:
//   1-6 Leave the queue. Not queued: either a release handed the key to this waiter after it
//       gave up (the grant names it in 'handed': answer 2, and the backend deletes that grant,
//       handing it on, rather than leave it blocking the key for its TTL), or it was never
//       queued, expired, or was granted by its own attempt: nothing to do.
//   7-9 Drop the entry's deadline and grant data too.
//  10-11 Nobody is left: drop the arrival counter and the data.
//  12-13 The key is free and others wait: the one behind us may now be the head. Wake the
//       waiters as a release does (the head takes the key; the others wait again).

// fair=true: what a waiter that was refused needs in order to sleep well (WaitForChange).
// KEYS[1] = grant hash, KEYS[2] = queue, KEYS[3] = queue expiry. ARGV[1] = the caller's waiter
// id, or '' if unknown.
// Returns {pttl_ms, head_left_ms, is_head}: the grant's remaining time (-2 if the key is free),
// the time until the head waiter's entry expires (-1 if nobody is queued), and 1 if the caller
// is the head, 2 if a release handed the live grant to the caller (its message may have gone
// before the caller subscribed).
inline constexpr std::string_view kQueueStateScript = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', string.format('%d', now))) do
  redis.call('ZREM', KEYS[2], w)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%d', now))
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'handed') == ARGV[1] then
  return {pttl, -1, 2}
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if head == nil then
  return {pttl, -1, 0}
end
local deadline = redis.call('ZSCORE', KEYS[3], head)
return {pttl, math.max(0, (tonumber(deadline) or now) - now), head == ARGV[1] and 1 or 0}
)lua";
// Line by line:
//   1-6 Drop expired entries, as kFairAcquireScript does, so that a dead head is not reported.
//       (Their grant data stays until the next acquire or end script drops it, or the data
//       key's own expiry.)
//   7   The grant's remaining time; -2 if there is no live grant.
//   8-10 The live grant was handed to the caller: it should take it at once.
//  11-14 Nobody queued.
//  15-16 How long until the head's entry expires (if the key is free and that waiter is dead,
//       the next one in line may take the key then), and whether the head is the caller.

}  // namespace leasehold::internal
