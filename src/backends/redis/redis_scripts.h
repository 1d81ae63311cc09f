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
// Shared leases (GrantRequest::mode and ::limit) keep every grant of a key in the same hash P:{H},
// so every script still touches one slot (Redis Cluster, issue 20, stays possible) and one
// DEL (force-release, an old client's too) ends them all:
//   exclusive   the hash as above, {token, holder, fence, ttl[, handed, tq]}, PEXPIRE'd: the
//               layout of every earlier leasehold, which reads and writes it unchanged;
//   shared or   the hash holds a header {kind = 'shared' | 'semaphore', limit = N, token = '-',
//   semaphore   holder = '(shared holders)' | '(semaphore of N)', fence = the latest} and one
//               field "g:<owner token>" per grant: cjson {e = expiry (server ms), s = slot,
//               f = fencing token, t = TTL ms, h = holder[, w = handed waiter id, q = t_q]}.
//               Redis 7.0 cannot expire a hash field, so every script judges e against TIME
//               (kGrantLib's lh_state drops the dead ones) and the hash's own PEXPIREAT is kept
//               at the latest grant's e: never earlier, so no grant ends before its TTL, and
//               the hash vanishes by itself when the last holder crashed.
// The header's token '-' is no owner token: an earlier leasehold's scripts find the key held
// (its acquire refuses with holder '(semaphore of N)'), never renew, release or write through it.
//   P:{H}:intent  hash {waiter, holder, ttl} with a PEXPIRE of the waiter's TTL: the writer
//                 intent of fair=false ("Writer preference", backends/backend.h). With fair=true
//                 the queue gives the order instead, and its entries' data also holds
//                 "<waiter id>:kind" and ":limit".
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

#include "backends/redis/redis_fair_scripts.h"

namespace leasehold::internal {

// Functions the scripts marked "with kGrantLib" share; the backend puts this text in front of
// theirs before SCRIPT LOAD (their line numbers below count from their own first line).
// A grant, as the functions pass it: {tok = owner token, h = holder, f = fencing token,
// t = TTL ms, left = ms until it ends, s = slot, w = handed waiter id, q = t_q, e = expiry,
// field = its "g:" field (shared/semaphore only)}. A state: {kind = 'none' | 'exclusive' |
// 'shared' | 'semaphore', limit, grants = the live grants by slot}.
inline constexpr std::string_view kGrantLib = R"lua(
local function lh_fmt(n)
  return string.format('%d', n)
end
local lh_floor = 0
local function lh_floor_of(arg)
  if arg == 'cluster' then
    local e = tonumber(string.match(redis.call('CLUSTER', 'INFO'), 'cluster_my_epoch:(%d+)'))
    return math.min(e or 0, 2097151) * 4294967296
  end
  return tonumber(arg) or 0
end
local function lh_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function lh_state(key, now, purge)
  local st = {kind = 'none', limit = 1, grants = {}}
  local kind = redis.call('HGET', key, 'kind')
  if not kind then
    local h = redis.call('HMGET', key, 'token', 'holder', 'fence', 'ttl', 'handed', 'tq')
    if h[1] then
      st.kind = 'exclusive'
      st.grants[1] = {tok = h[1], h = h[2] or '', f = h[3] or '0', t = h[4] or '0',
                      left = redis.call('PTTL', key), s = 0, w = h[5], q = h[6]}
    end
    return st
  end
  local all = redis.call('HGETALL', key)
  local last = 0
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'g:' then
      local g = cjson.decode(all[i + 1])
      if g.e > now then
        g.tok, g.field, g.left = string.sub(all[i], 3), all[i], g.e - now
        st.grants[#st.grants + 1] = g
        last = math.max(last, g.e)
      elseif purge then
        redis.call('HDEL', key, all[i])
      end
    end
  end
  if #st.grants == 0 then
    if purge then
      redis.call('DEL', key)
    end
    return st
  end
  if purge then
    redis.call('PEXPIREAT', key, lh_fmt(last))
  end
  st.kind, st.limit = kind, tonumber(redis.call('HGET', key, 'limit')) or 1
  table.sort(st.grants, function(a, b) return a.s < b.s end)
  return st
end
local function lh_info(st, g)
  local kept = string.sub(g.tok, -5) == ':kept' and ':kept' or ''
  return {g.h, string.sub(g.tok, 1, 8) .. kept, g.f, g.left, g.t, st.kind, st.limit, g.s}
end
local function lh_none()
  return {false, false, false, -2, false, false, false, false}
end
local function lh_admits(st, kind, limit, tok)
  if st.kind == 'none' then
    return 'ok'
  end
  if kind == 'semaphore' or st.kind == 'semaphore' then
    if kind ~= st.kind or limit ~= st.limit then
      return 'mismatch'
    end
  elseif kind ~= 'shared' or st.kind ~= 'shared' then
    return 'full'
  end
  for _, g in ipairs(st.grants) do
    if g.tok == tok then
      return 'full'
    end
  end
  return (kind == 'shared' or #st.grants < limit) and 'ok' or 'full'
end
local function lh_grant(key, fence_key, st, kind, limit, tok, holder, ttl, now, w, q)
  local fence = redis.call('INCR', fence_key)
  if fence < lh_floor then
    fence = lh_floor
    redis.call('SET', fence_key, lh_fmt(fence))
  end
  if kind == 'exclusive' then
    redis.call('HSET', key, 'token', tok, 'holder', holder, 'fence', lh_fmt(fence), 'ttl', ttl)
    if w then
      redis.call('HSET', key, 'handed', w, 'tq', q)
    end
    redis.call('PEXPIRE', key, ttl)
    st.kind = 'exclusive'
    st.grants[1] = {tok = tok, h = holder, f = lh_fmt(fence), t = ttl, left = tonumber(ttl), s = 0}
    return fence, 0
  end
  local used = {}
  for _, g in ipairs(st.grants) do
    used[g.s] = true
  end
  local slot = 0
  while used[slot] do
    slot = slot + 1
  end
  if st.kind == 'none' then
    redis.call('HSET', key, 'kind', kind, 'limit', limit, 'token', '-', 'holder',
               kind == 'shared' and '(shared holders)' or '(semaphore of ' .. limit .. ')')
    st.kind, st.limit = kind, limit
  end
  local g = {e = now + 1 + tonumber(ttl), s = slot, f = lh_fmt(fence), t = tonumber(ttl),
             h = holder, w = w, q = q}
  redis.call('HSET', key, 'fence', lh_fmt(fence), 'g:' .. tok, cjson.encode(g))
  local last = g.e
  for _, o in ipairs(st.grants) do
    last = math.max(last, o.e)
  end
  redis.call('PEXPIREAT', key, lh_fmt(last))
  g.tok, g.field, g.left = tok, 'g:' .. tok, g.e - now
  st.grants[#st.grants + 1] = g
  table.sort(st.grants, function(a, b) return a.s < b.s end)
  return fence, slot
end
local function lh_qdrop(data_key, w)
  redis.call('HDEL', data_key, w .. ':token', w .. ':holder', w .. ':ttl', w .. ':tq',
             w .. ':kind', w .. ':limit')
end
local function lh_qpurge(queue, expiry, data_key, now)
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', expiry, '-inf', lh_fmt(now))) do
    redis.call('ZREM', queue, w)
    lh_qdrop(data_key, w)
  end
  redis.call('ZREMRANGEBYSCORE', expiry, '-inf', lh_fmt(now))
end
local function lh_qleave(queue, expiry, seq, data_key, w)
  redis.call('ZREM', queue, w)
  redis.call('ZREM', expiry, w)
  lh_qdrop(data_key, w)
  if redis.call('EXISTS', queue) == 0 then
    redis.call('DEL', seq, data_key)
  end
end
)lua";
// Function by function:
//   lh_fmt    Numbers go back to Redis through string.format('%d'), never in exponent form.
//   lh_now    Now on the server's clock, in ms, rounded down. Redis 7 replicates a script's
//             effects, not the script, so TIME before writes is allowed and replicas store the
//             same expiries.
//   lh_state  The key's live grants. No 'kind' field: the exclusive layout (or no grant at all;
//             an expired hash reads as absent: the server checks expiry), time left from PTTL.
//             Otherwise every "g:" field whose e is after now (a grant is dead from its e on);
//             with `purge`, the dead fields are deleted, the hash too when none is left, and the
//             hash's expiry set to the latest live e (a release may have removed the latest).
//             The expiry never comes before a live grant's e, so a grant never ends early.
//   lh_info   What Inspect, Holders and a refusal show of a grant: holder, the first 8
//             characters of its owner token (the full token never leaves the server; a kept
//             grant's with ':kept' after them, backend.h's kKeptTokenSuffix), fencing token,
//             time left, TTL, kind, limit, slot.
//   lh_admits The admission rules of backend.h, "Shared leases", as Ahead::Decide in
//             common/admission.h states them with the live grants ahead: 'ok' (kGranted),
//             'full' (kBusy: held by another), or 'mismatch' (kMismatch: a semaphore and a
//             read/write request, or two limits). The writer's intent (kWriterWaiting) is
//             read by the acquire script that calls it.
//             A live grant that already holds the request's owner token (an earlier attempt of
//             the same Store::Acquire whose reply was lost) makes it 'full', as an exclusive
//             grant of one's own token always did: its expiry began before this attempt's
//             t_send, so it must not be reported as a fresh grant, nor overwritten.
//   lh_floor  The least fencing token a grant of this call may get: 0, or with Sentinel the
//             master's config epoch << 32 (redis_failover.h), or in a Cluster this node's own
//             config epoch << 32 (read here, by CLUSTER INFO's cluster_my_epoch, in the same
//             atomic step as the grant), which the granting scripts set from their last ARGV
//             ('cluster', or the number) on their first line (lh_floor_of; the epoch capped at
//             2^21 - 1, exact as a Lua double). A local of the script's own chunk (kGrantLib
//             is its first part), so every call starts from 0.
//   lh_grant  Bump the key's one fencing counter first (it survives release, expiry and
//             force-release, so every grant's token is above every earlier one of any kind),
//             and raise it to lh_floor when it is below: a counter sent back by a failover
//             that lost writes starts again above every token of the earlier epoch.
//             Exclusive: the earlier layout exactly, with PEXPIRE. Shared/semaphore: the
//             smallest slot no live grant uses, the header on the first grant, the grant's
//             field with e = now + 1 + TTL (now is rounded down: +1 keeps e at or after the
//             true time of this step plus the TTL), and the hash's expiry moved to the latest e.
//   lh_qdrop, lh_qpurge, lh_qleave  fair=true: a queue entry's data goes; expired entries
//             (their deadline passed) leave; a waiter leaves the queue, and the counter and
//             data go with the last one.

// With kGrantLib. KEYS[1] = grant hash, KEYS[2] = fence counter, KEYS[3] = writer intent.
// ARGV[1] = owner token, ARGV[2] = holder identity, ARGV[3] = TTL in milliseconds,
// ARGV[4] = kind ('exclusive', 'shared', 'semaphore'), ARGV[5] = limit, ARGV[6] = waiter id
// ('' for a plain try-acquire), ARGV[7] = the least fencing token (kGrantLib's lh_floor).
// Returns {1, fencing_token, slot} when granted; {0, <lh_info of the lowest slot>, intent}
// when held by another, intent 1 if this attempt recorded or refreshed a writer intent;
// {3, held kind, held limit, holder} on a family or limit mismatch; {4, <lh_info of the
// waiting writer>} when a writer intent keeps a shared request out.
inline constexpr std::string_view kAcquireScript = R"lua(
local now = lh_now(); lh_floor = lh_floor_of(ARGV[7])
local st = lh_state(KEYS[1], now, true)
local kind, limit = ARGV[4], tonumber(ARGV[5])
local admits = lh_admits(st, kind, limit, ARGV[1])
if admits == 'mismatch' then
  return {3, st.kind, st.limit, st.grants[1].h}
end
if admits == 'ok' and kind == 'shared' then
  local i = redis.call('HMGET', KEYS[3], 'waiter', 'holder', 'ttl')
  if i[1] then
    return {4, i[2] or '', '', 0, redis.call('PTTL', KEYS[3]), i[3], 'exclusive', 1, 0}
  end
end
if admits == 'ok' then
  local fence, slot = lh_grant(KEYS[1], KEYS[2], st, kind, limit, ARGV[1], ARGV[2], ARGV[3], now)
  if ARGV[6] ~= '' and redis.call('HGET', KEYS[3], 'waiter') == ARGV[6] then
    redis.call('DEL', KEYS[3])
  end
  return {1, fence, slot}
end
local intent = 0
if kind == 'exclusive' and ARGV[6] ~= '' then
  local w = redis.call('HGET', KEYS[3], 'waiter')
  if not w or w == ARGV[6] then
    redis.call('HSET', KEYS[3], 'waiter', ARGV[6], 'holder', ARGV[2], 'ttl', ARGV[3])
    redis.call('PEXPIRE', KEYS[3], ARGV[3])
    intent = 1
  end
end
local out = {0, unpack(lh_info(st, st.grants[1]))}
out[10] = intent
return out
)lua";
// Line by line:
//   1-2 The token floor; the key's live grants, the dead ones dropped (kGrantLib).
//   3-7 A live grant of the other family, or of another limit: refuse, naming it.
//   8-13 A shared request the rules admit still waits while another waiter's writer intent
//       lives: answer with the writer's identity and the intent's time left.
//  14-20 Admitted: grant (kGrantLib, lh_grant: exclusive exactly as every earlier version;
//       shared and semaphore as a "g:" field). A waiting writer that gets the key ends its
//       own intent.
//  21-29 Refused. A waiting writer (a waiter id) records its intent, or refreshes its own, for
//       one TTL, unless another writer's intent lives (one per key: the first waiting writer's).
//  30-32 Answer with the grant of the lowest slot and whether we hold the intent (the backend
//       then clears it if the waiter gives up: AbandonWait).

// Line by line:
//   1-2 Now, on the server's clock, and the token floor; drop every entry whose deadline has
//       passed, with its grant data: a waiter that died, or stopped waiting without
//       AbandonWait, is skipped once its entry expires.
//   3   The key's live grants (kGrantLib).
//   5-11 A waiter whose key a release handed over (kFairEndScript) while this attempt was on
//       its way, or whose notification was lost: a live grant holds its owner token and names
//       its waiter id. Answer with the fencing token, slot and the t_q the release copied from
//       the entry, not as a fresh grant: its expiry began at the release, before this attempt's
//       send time, so the caller counts its validity from that t_q (a send time before the
//       release) and renews first if too little is left (redis_backend.cc). A grant that holds
//       the caller's token without 'handed' (its own earlier attempt whose reply was lost)
//       still reads as held by another, as the core expects.
//  12-15 A mismatch is refused as by kAcquireScript, and the caller is not queued.
//  16-20 The caller's place: its rank if queued, else behind everyone (a plain try-acquire
//       never barges ahead of a queue).
//  21-35 Admitted only if the grants admit the request and everyone ahead is admitted with it
//       (backend.h, "Writer preference"): a semaphore, among the first N - live; a shared
//       request, when everyone ahead is shared (an entry without a kind is an earlier
//       version's exclusive one); an exclusive request only at the head.
//  36-42 Granted: the caller leaves the queue (with its data; the counter and data go with the
//       last entry), and the grant is made as by kAcquireScript.
//  43-47 Not granted. A waiter takes its place at the tail on its first attempt and keeps its
//       arrival number on later ones...
//  48   ...and every attempt pushes its entry's deadline to now + the entry lifetime...
//  49-51 ...and rewrites what a release needs to grant the key to it inside the release
//       (kFairEndScript): owner token, holder, TTL, this attempt's t_q, kind and limit. Every
//       attempt refreshes t_q, so the release always finds the send time of the latest attempt
//       that ran before it.
//  52-56 The queue keys live until the latest deadline, then vanish by themselves.
//  57   The caller's place.
//  59-62 Answer with the holder of the lowest slot (all nil, pttl -2, when no grant lives but
//       others are queued ahead), the head's id prefix, the queue length and our place.

// With kGrantLib. KEYS[1] = grant hash. ARGV[1] = owner token, ARGV[2] = TTL in milliseconds.
// Returns 1 if renewed, 0 if the grant is absent, expired or someone else's.
inline constexpr std::string_view kRenewScript = R"lua(
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[1], 'ttl', ARGV[2])
  return 1
end
local field = 'g:' .. ARGV[1]
local v = redis.call('HGET', KEYS[1], field)
if not v then
  return 0
end
local now = lh_now()
local g = cjson.decode(v)
if g.e <= now then
  return 0
end
g.e, g.t = now + 1 + tonumber(ARGV[2]), tonumber(ARGV[2])
redis.call('HSET', KEYS[1], field, cjson.encode(g))
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 or now + pttl < g.e + 2 then
  redis.call('PEXPIREAT', KEYS[1], lh_fmt(g.e + 2))
end
return 1
)lua";
// Line by line:
//   1-5 An exclusive grant, as every earlier version: only the owner token that made the grant
//       may extend it (HGET of a missing key is false); extend to the TTL from now on the
//       server's clock; remember the TTL for Inspect/List.
//   6-10 A shared or semaphore grant: its field, named by the owner token. (The header's token
//       '-' never equals one.)
//  11-15 Dead since its e, even if no script has dropped it yet: lost.
//  16-17 Extend it to now + TTL, as lh_grant does.
//  18-21 The hash must not expire before it: push the hash's expiry past the new e (the 2 ms
//       cover PTTL counting from the script's start while `now` is TIME's). O(1): a renewal
//       reads no other grant, so RenewMany stays cheap for a semaphore of 1024.
//  22   Renewed. Otherwise 0: not ours (or gone); the core turns this into kLost, terminal.

// With kGrantLib. KEYS[1] = grant hash. ARGV[1] = owner token, ARGV[2] = release channel.
// Returns 1 if the grant was deleted, 0 if it was absent, expired or someone else's.
inline constexpr std::string_view kReleaseScript = R"lua(
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
local field = 'g:' .. ARGV[1]
local v = redis.call('HGET', KEYS[1], field)
if not v then
  return 0
end
local now = lh_now()
redis.call('HDEL', KEYS[1], field)
lh_state(KEYS[1], now, true)
if cjson.decode(v).e <= now then
  return 0
end
redis.call('PUBLISH', ARGV[2], 'released')
return 1
)lua";
// Line by line:
//   1-5 An exclusive grant: compare-and-delete, never someone else's grant; the fence counter
//       stays; wake every waiter subscribed to this key's channel.
//   6-10 A shared or semaphore grant: its own field, or nothing of ours: lost or stolen.
//  11-13 Delete it, then let lh_state drop the dead ones and the hash if it was the last grant,
//       and bring the hash's expiry down to the latest remaining grant's.
//  14-16 It had already expired: lost (its field is gone either way).
//  17-18 Released: wake every waiter (any grant's end may make room).

// Line by line:
//   1-2 Now and the token floor, and the key's live grants (kGrantLib; the dead ones dropped).
//   3-11 Which grant may be ended: the caller's own (compare-and-delete, as kReleaseScript),
//       any (force: all of them), the one handed to waiter ARGV[1] (its Acquire gave up before
//       it took the grant: AbandonWait), or the one with the token prefix (ForceReleaseGrant).
//  12-14 No such grant: nothing changes, no record either.
//  15-17 Finish's record, as kFinishScript.
//  18-24 End it: the whole hash for an exclusive grant or a force-release; otherwise its field,
//       then lh_state drops the hash if it was the last and fixes the hash's expiry. The fence
//       counter stays.
//  25   Drop expired queue entries (kGrantLib): a dead waiter whose entry ran out is never
//       handed the key.
//  26-53 Hand the key to as many heads as the room now admits, in arrival order, stopping at
//       the first that does not fit: one exclusive head (the key is then held); shared heads
//       until an exclusive one (which keeps later shared ones out); semaphore heads until N.
//       Each head's grant data was written by its latest attempt (kFairAcquireScript); an
//       entry without it (written by a client that predates the handoff) stops the loop, and
//       so does a head of the other family (its next attempt is refused, and its Acquire gives
//       up): both are woken with 'released' instead (54-56). Each head leaves the queue
//       (lh_qleave) and is granted exactly as kFairAcquireScript would on its next attempt
//       (lh_grant: a fencing token above the releaser's, its owner token, holder, TTL, and its
//       waiter id and t_q as 'handed'/'tq' or the grant's w/q, which its next attempt
//       recognises if the message is lost). The grant's expiry starts now, after the server
//       ran that attempt, itself after the waiter read t_q: expiry >= t_q + TTL.
//       The message: "handed <waiter id> <fencing token> <t_q> <ttl_ms>", plus " <slot>" for a
//       shared or semaphore grant (an exclusive one keeps the format earlier versions read).
//  54-57 Nobody (with grant data) was handed the key, or a head could not be: wake the waiters
//       as kReleaseScript does.

// With kGrantLib. KEYS[1] = grant hash, KEYS[2] = record. ARGV[1] = owner token, ARGV[2] =
// release channel, ARGV[3] = keep in milliseconds ('0': delete the grant), ARGV[4] = '1' to
// write the record, ARGV[5] = the record, ARGV[6] = the record's TTL in milliseconds.
// Returns 1 if the grant was ended, 0 if it was absent, expired or someone else's.
inline constexpr std::string_view kFinishScript = R"lua(
local field = 'g:' .. ARGV[1]
local exclusive = redis.call('HGET', KEYS[1], 'token') == ARGV[1]
local now, g = 0, nil
if not exclusive then
  local v = redis.call('HGET', KEYS[1], field)
  if not v then
    return 0
  end
  now, g = lh_now(), cjson.decode(v)
  if g.e <= now then
    return 0
  end
end
if ARGV[4] == '1' then
  redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[6])
end
if exclusive and ARGV[3] == '0' then
  redis.call('DEL', KEYS[1])
elseif exclusive then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('HSET', KEYS[1], 'ttl', ARGV[3], 'token', ARGV[1] .. ':kept')
else
  redis.call('HDEL', KEYS[1], field)
  if ARGV[3] ~= '0' then
    g.e, g.t = now + 1 + tonumber(ARGV[3]), tonumber(ARGV[3])
    redis.call('HSET', KEYS[1], field .. ':kept', cjson.encode(g))
  end
  lh_state(KEYS[1], now, true)
end
redis.call('PUBLISH', ARGV[2], 'released')
return 1
)lua";
// Line by line:
//   1-13 Compare first, as kReleaseScript: the exclusive grant's token, or a live "g:" field of
//       ours; someone else's grant (or none) changes nothing, and the record is not written.
//  14-16 Replace the record, with its own expiry: a key separate from the grant, so that no
//       grant's end (release, expiry, force-release) touches it.
//  17-18 Exclusive, keep = 0: delete the grant, as a release does; the fence counter stays.
//  19-21 Exclusive, keep > 0: the grant stays, same holder and fencing token, and now ends by
//       itself after keep. Its token gains ':kept', which no owner sends: a renewal of the
//       owner's already on its way (the heartbeat does not wait for one in flight) finds it
//       someone else's and cannot extend or shorten it. The token prefix shown is unchanged.
//  22-28 Shared or semaphore: the field goes; with keep > 0 it comes back as
//       "g:<token>:kept" (same slot, holder, fencing token) ending keep from now, which no
//       renewal names; lh_state then sets the hash's expiry to the latest grant's.
//  30   Wake the waiters either way: after a delete the head of a fair queue (or the quickest
//       waiter) takes the key, as after a release; after a keep they re-read the now shorter
//       remaining time instead of sleeping to the old expiry.

// A fenced write (Backend::FencedWrite), with kGrantLib: ops on data keys, applied only while
// the grant is the caller's. KEYS[1] = grant hash, KEYS[1 + i] = the data key of op i
// (i = 1..#KEYS - 1). ARGV[1] = owner token, ARGV[2] = '1' to check the grant ('0' skips the
// check: the chaos harness's negative control only); for op i, ARGV[3i] = 'put', 'del' or
// 'hset', ARGV[3i + 1] = the hash field ('' unless hset), ARGV[3i + 2] = the value ('' for
// del).
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
    local state = token == ARGV[1] .. ':kept' and 'kept' or 'other'
    if token == '-' then
      local now = lh_now()
      local mine = redis.call('HMGET', KEYS[1], 'g:' .. ARGV[1], 'g:' .. ARGV[1] .. ':kept')
      if mine[1] and cjson.decode(mine[1]).e > now then
        state = 'ours'
      elseif mine[2] and cjson.decode(mine[2]).e > now then
        state = 'kept'
      end
    end
    if state ~= 'ours' then
      local h = redis.call('HMGET', KEYS[1], 'holder', 'fence')
      return {0, state, h[1], h[2]}
    end
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
//   1-22 The guard: the grant is still the caller's. An exclusive grant: the hash holds the
//       caller's owner token. A shared or semaphore grant (header token '-'): the caller's
//       "g:" field is there and its e is still ahead on the server's clock. It compares the
//       owner token, not the fencing token: with persistence off a restarted server counts
//       fencing tokens from 1 again, so a later holder's number may equal or undercut an old
//       one's, but an owner token (32 random hex digits) never repeats. HGET of an absent or
//       expired grant is false (the server checks expiry): no live grant, nobody to name. A
//       token (or field) that is the caller's plus ':kept' is the caller's own grant after a
//       finish with keep (kFinishScript): released, no longer the caller's to write with.
//       Otherwise answer with the holder and fencing token (for a shared key: its description
//       and the latest fencing token), for the "is now held by" message.
//  23-43 Check everything that could fail before the first write: Redis does not undo the
//       earlier writes of a script whose later command errors. SET and DEL succeed on any key;
//       HSET fails (WRONGTYPE) on a key holding anything but a hash, so each HSET target's type
//       is read with TYPE, or taken from the earlier ops of this write on the same key (a put
//       makes it a string, a del makes it absent, an hset a hash). The ACL's command and key
//       rules are checked inside scripts per command, so each op's call is checked first with
//       redis.acl_check_cmd (Redis 7.0 and later; older servers, which lack it, check only at
//       the call). The server-state refusals (OOM, a read-only replica, min-replicas-to-write)
//       come at the first write or never: once a script has written, Redis runs it to the end.
//  44-49 Apply the ops in order and count: DEL's own count; SET and HSET count 1 (HSET's reply
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
//   1   Delete whoever's grants they are, every grant of a shared or semaphore key with them
//       (operator break-glass); the fence counter stays, a writer intent expires by itself.
//   2   Wake waiters, as a release does.
//   3   A grant was deleted. (A shared hash whose grants all expired but which no script has
//       dropped yet counts as one, for the 2 ms at most that the hash outlives its latest
//       grant: kRenewScript 18-21.)
//   5   The key was already free.

// With kGrantLib. KEYS[1] = grant hash. ARGV[1] = token prefix, ARGV[2] = release channel.
// Returns 1 if the live grant whose owner token starts with ARGV[1] was deleted, else 0.
inline constexpr std::string_view kForceGrantScript = R"lua(
local now = lh_now()
local st = lh_state(KEYS[1], now, true)
for _, g in ipairs(st.grants) do
  if string.sub(g.tok, 1, #ARGV[1]) == ARGV[1] then
    if st.kind == 'exclusive' then
      redis.call('DEL', KEYS[1])
    else
      redis.call('HDEL', KEYS[1], g.field)
      lh_state(KEYS[1], now, true)
    end
    redis.call('PUBLISH', ARGV[2], 'released')
    return 1
  end
end
return 0
)lua";
// Line by line:
//   1-2 The key's live grants.
//   3-4 The first (lowest slot) whose owner token starts with the prefix (the backend refuses
//       an empty prefix before sending).
//   5-10 Delete it: the whole hash for an exclusive grant, else its field (and the hash with
//       the last one, its expiry fixed, by lh_state). The others and the fence counter stay.
//  11-12 Wake waiters, as a release does.

// With kGrantLib. KEYS[1] = grant hash.
// Returns the live grants by slot, each {holder, token_prefix, fencing_token, pttl_ms, ttl_ms,
// kind, limit, slot}; an empty array if the key is free. Writes nothing.
inline constexpr std::string_view kHoldersScript = R"lua(
local st = lh_state(KEYS[1], lh_now(), false)
local out = {}
for i, g in ipairs(st.grants) do
  out[i] = lh_info(st, g)
end
return out
)lua";
// Line by line:
//   1   The live grants, read in the same atomic step as their time left, so that the fields
//       and the time left belong to one grant; the dead ones are skipped, not dropped (a read
//       writes nothing).
//   2-6 Answer with each as lh_info shows it (Inspect takes the first: the lowest slot).

// fair=false: the writer waiting for a key, as Holders lists it last. KEYS[1] = writer intent.
// Returns {holder, '', 0, time left ms, ttl ms, 'exclusive', 1, 0} (lh_info's fields, fencing
// token 0), or {} if no intent lives. A script of its own, one key, sent beside kHoldersScript:
// a script naming both keys would be refused with TRYAGAIN while the slot is half migrated and
// the intent (which rarely exists) is missing on the node that serves the grant.
inline constexpr std::string_view kIntentScript = R"lua(
local i = redis.call('HMGET', KEYS[1], 'holder', 'ttl')
if not i[1] then
  return {}
end
return {i[1], '', 0, redis.call('PTTL', KEYS[1]), i[2], 'exclusive', 1, 0}
)lua";

// Line by line:
//   1-8 Leave the queue. Not queued: either a release handed the key to this waiter after it
//       gave up (a live grant names it in 'handed' or w: answer 2, and the backend deletes that
//       grant, handing it on, rather than leave it blocking the key for its TTL), or it was
//       never queued, expired, or was granted by its own attempt: nothing to do.
//   9-10 Drop the entry's deadline and grant data too.
//  11-12 Nobody is left: drop the arrival counter and the data.
//  13-14 Others wait and the key is free, or shared (there may be room: an exclusive waiter
//       that leaves may have kept shared ones behind it out): the one behind us may now be
//       admitted. Wake the waiters as a release does (they retry; the others wait again).

// Line by line:
//   1-5 Drop expired entries, as kFairAcquireScript does, so that a dead head is not reported.
//       (Their grant data stays until the next acquire or end script drops it, or the data
//       key's own expiry.)
//   6-15 The live grants: one handed to the caller means it should take it at once; else the
//       soonest end of any grant (an exclusive one's PTTL; any grant's end may make room).
//  16   Shared or semaphore: the caller also re-checks when the head's entry expires.
//  17-20 Nobody queued.
//  21-22 How long until the head's entry expires (if the key is free and that waiter is dead,
//       the next one in line may take the key then), and whether the head is the caller.

// fair=false, with kGrantLib: what a refused waiter needs in order to sleep well.
// KEYS[1] = grant hash, KEYS[2] = writer intent. ARGV[1] = the caller's waiter id, or ''.
// Returns {left_ms, intent_left_ms}: the time until the first live grant ends (-2 if the key is
// free), and the time until another waiter's writer intent expires (-2 if there is none).
inline constexpr std::string_view kWaitStateScript = R"lua(
local left = -2
for _, g in ipairs(lh_state(KEYS[1], lh_now(), false).grants) do
  if left < 0 or g.left < left then
    left = g.left
  end
end
local w = redis.call('HGET', KEYS[2], 'waiter')
if w and w ~= ARGV[1] then
  return {left, redis.call('PTTL', KEYS[2])}
end
return {left, -2}
)lua";
// Line by line:
//   1-6 The soonest end of any live grant (for an exclusive grant its PTTL, as before).
//   7-11 Another waiter's writer intent keeps shared requests out until its writer takes the
//       key (no message: the waiter then finds an exclusive grant), leaves (AbandonWait
//       publishes) or dies (the intent expires): wake at its expiry at the latest.

// fair=false: a waiting writer gives up (Backend::AbandonWait). KEYS[1] = writer intent.
// ARGV[1] = waiter id, ARGV[2] = release channel. Returns 1 if its intent was deleted, else 0.
inline constexpr std::string_view kClearIntentScript = R"lua(
if redis.call('HGET', KEYS[1], 'waiter') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
)lua";
// Line by line:
//   1-5 Only the waiter's own intent; the shared requests it kept out may now be admitted:
//       wake them as a release does.

}  // namespace leasehold::internal
