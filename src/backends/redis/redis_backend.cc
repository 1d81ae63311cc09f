// File: backends/redis/redis_backend.cc (internal)
//
// RedisBackend's grant core (its facets: redis_records.cc, redis_wait.cc, redis_fenced_write.cc,
// redis_doctor.cc; what they share: redis_run.h, redis_server_config.h). The operations are each
// a Lua script (redis_scripts.h) run with EVALSHA on a
// connection borrowed from the pool of the node that serves its key (redis_cluster.h: the one
// server's, or in a cluster the slot's master; redis_connection.h); waits go through the
// subscriber (redis_subscriber.h).
//
// Invariants:
// - One operation is one pipelined round trip: the EVALSHA (plus WAIT with min_replicas) is
//   written in one go and every reply read back; a batch that spans a cluster's masters is
//   written to all of them before any reply is read. NOSCRIPT costs one more SCRIPT LOAD and one
//   retry of exactly the calls that did not run; MOVED, ASK and TRYAGAIN one more round of
//   exactly those (RunEach). A call that may have run is never sent again.
// - Every time the backend reads is on clock_ (the Clock it was opened with), the clock of the
//   deadlines it receives; the grants' own expiry is the server's PEXPIRE, never a local time.

#include "backends/redis/redis_backend.h"

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

RedisBackend::RedisBackend(RedisOptions options, Clock& clock, std::shared_ptr<RedisRouter> router,
                           bool persistence_off)
    : options_(std::move(options)),
      clock_(clock),
      router_(std::move(router)),
      pool_(router_->seed_pool()),
      persistence_off_(persistence_off) {}

RedisBackend::~RedisBackend() = default;

Result<std::shared_ptr<Backend>> OpenRedisBackend(const Url& url, Clock& clock) {
  LH_ASSIGN_OR_RETURN(RedisOptions options, RedisOptions::FromUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<RedisBackend> backend, RedisBackend::Open(options, clock));
  return std::shared_ptr<Backend>(std::move(backend));
}

Result<std::shared_ptr<RedisBackend>> RedisBackend::Open(RedisOptions options, Clock& clock) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<const RedisTlsContext> tls, RedisTlsContext::Create(options));
  std::shared_ptr<RedisRouter> router;
  if (options.cluster()) {
    LH_ASSIGN_OR_RETURN(router, RedisRouter::OpenCluster(options, clock, std::move(tls)));
  } else {
    router = std::make_shared<RedisRouter>(
        std::make_shared<RedisConnectionPool>(options, clock, std::move(tls)));
  }
  RedisConnectionPool& counters = *router->seed_pool();
  bool persistence_off = false;
  // The scripts go onto every master (a cluster's: each runs the scripts of its slots; a node
  // that becomes master later answers NOSCRIPT once, and RunEach loads them there).
  LH_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RedisConnectionPool>> masters,
                      router->MasterPools());
  for (const std::shared_ptr<RedisConnectionPool>& master : masters) {
    const std::string address = master->options().Address();
    LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, master->Borrow());
    LH_ASSIGN_OR_RETURN(std::vector<std::string> shas,
                        LoadScripts(counters, connection.get(), address));
    counters.shas_ = std::move(shas);  // the SHA1 of the text: the same on every node
    // Persistence and eviction checks. CONFIG is often denied to application users: then
    // persistence is assumed on (with a debug line: the server may well persist), and eviction
    // is read from INFO memory.
    std::vector<Command> config = ServerConfigCommands();
    counters.round_trips_.fetch_add(1, std::memory_order_relaxed);
    LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies, connection->Pipeline(config, address));
    const ServerConfig server = ParseServerConfig(replies);
    if (server.known()) {
      if (server.off()) {
        persistence_off = true;
        WarnPersistenceOffOnce(fmt::format("{}/{}", address, options.db));
      }
    } else {
      Log(LogLevel::kDebug,
          fmt::format("redis at {}: cannot check persistence with CONFIG GET ({}); assuming on",
                      address, server.refusal));
    }
    std::string memory_refusal;
    const Eviction eviction =
        ReadEviction(server, InfoText(replies.back().get(), &memory_refusal), memory_refusal);
    if (eviction.can_evict()) {
      if (!options.accept_eviction) {
        return EvictionRefusal(address, eviction);
      }
      WarnOnce("eviction accepted " + address,
               fmt::format("redis at {} may evict leases ({}): opened because the URL says "
                           "accept_eviction=true",
                           address, eviction.Describe()));
    } else if (!eviction.known()) {
      WarnOnce("eviction unknown " + address,
               fmt::format("redis at {}: cannot tell whether it may evict leases ({}); make "
                           "sure maxmemory-policy is noeviction",
                           address, eviction.refusal));
    }
  }
  return std::shared_ptr<RedisBackend>(
      new RedisBackend(std::move(options), clock, std::move(router), persistence_off));
}

Capabilities RedisBackend::capabilities() const {
  return Capabilities{.notifies_holder = true,
                      .fencing_survives_restart = !persistence_off_,
                      .fair_queue = options_.fair,
                      .shared_leases = true};
}

unsigned RedisBackend::fenced_ops() const {
  return FencedOpBit(FencedOp::Kind::kPut) | FencedOpBit(FencedOp::Kind::kDelete) |
         FencedOpBit(FencedOp::Kind::kHashSet);
}

std::string RedisBackend::LeaseKeyName(std::string_view prefix, std::string_view key) {
  return fmt::format("{}:{{{}}}", prefix, HexEncode(key));
}

std::string RedisBackend::FenceKeyName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":fence";
}

std::string RedisBackend::ChannelName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":released";
}

std::string RedisBackend::RecordKeyName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":record";
}

std::string RedisBackend::QueueKeyName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":queue";
}

std::string RedisBackend::QueueExpiryKeyName(std::string_view prefix, std::string_view key) {
  return QueueKeyName(prefix, key) + ":expiry";
}

std::string RedisBackend::QueueSeqKeyName(std::string_view prefix, std::string_view key) {
  return QueueKeyName(prefix, key) + ":seq";
}

std::string RedisBackend::QueueDataKeyName(std::string_view prefix, std::string_view key) {
  return QueueKeyName(prefix, key) + ":data";
}

std::string RedisBackend::IntentKeyName(std::string_view prefix, std::string_view key) {
  return LeaseKeyName(prefix, key) + ":intent";
}

Result<Grant> RedisBackend::TryAcquire(const GrantRequest& request) {
  const bool queued_waiter = options_.fair && !request.waiter_id.empty();
  if (queued_waiter) {
    // A release handed this waiter the key and WaitForTurn heard it: no round trip needed.
    std::optional<Handed> handed;
    {
      MutexLock lock(&handed_mu_);
      if (auto it = handed_.find(request.waiter_id); it != handed_.end()) {
        handed = it->second;
        handed_.erase(it);
      }
    }
    if (handed) {
      Result<Grant> grant = TakeHanded(request, *handed);
      if (grant.ok() || grant.status().code() != StatusCode::kLost) {
        return grant;
      }
      // The handed grant is gone (expired, force-released): try as usual, which queues again.
    }
  }
  const long long ttl_ms = CeilMillis(request.ttl);
  const std::string lease_key = LeaseKeyName(options_.prefix, request.key);
  const std::string kind(KindArg(request.mode, request.limit));
  std::vector<Command> call;
  if (options_.fair) {
    // t_q: this attempt's send time, read after the core's t_send and before sending. The
    // queue entry keeps it; a release that hands us the key copies it (kFairEndScript).
    const SteadyTime t_q = clock_.Now();
    call.push_back({"EVALSHA", pool_->shas_[kFairAcquire], "6", lease_key,
                    FenceKeyName(options_.prefix, request.key),
                    QueueKeyName(options_.prefix, request.key),
                    QueueExpiryKeyName(options_.prefix, request.key),
                    QueueSeqKeyName(options_.prefix, request.key),
                    QueueDataKeyName(options_.prefix, request.key), request.owner_token,
                    request.holder, std::to_string(ttl_ms), request.waiter_id,
                    std::to_string(CeilMillis(FairEntryLifetime(options_, request.ttl))),
                    std::to_string(t_q.time_since_epoch().count()), kind,
                    std::to_string(request.limit), std::string(kEpochFloorArg)});
  } else {
    call.push_back({"EVALSHA", pool_->shas_[kAcquire], "3", lease_key,
                    FenceKeyName(options_.prefix, request.key),
                    IntentKeyName(options_.prefix, request.key), request.owner_token,
                    request.holder, std::to_string(ttl_ms), kind, std::to_string(request.limit),
                    request.waiter_id, std::string(kEpochFloorArg)});
  }
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, true));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("acquiring {}", request.key),
                             ScriptText(options_.fair ? kFairAcquire : kAcquire), ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 2) {
    return Status::Internal("unexpected reply from redis to the acquire script");
  }
  LH_ASSIGN_OR_RETURN(long long granted, ParseInteger(reply->element[0]));
  if (granted == 0) {
    if (!options_.fair && reply->elements >= 10 &&
        ParseInteger(reply->element[9]).value_or(0) == 1) {
      // Our writer intent lives: AbandonWait clears it if this call gives up.
      MutexLock lock(&intents_mu_);
      intents_.insert(request.waiter_id);
    }
    return HeldReply(request.key, reply);
  }
  if (granted == 3 && reply->elements >= 4) {
    // {3, held kind, held limit, holder}: the key's grants are of the other family or limit.
    LH_ASSIGN_OR_RETURN(long long held_limit, ParseInteger(reply->element[2]));
    const std::string_view held_kind = ReplyText(reply->element[1]);
    return LimitMismatch(request.key,
                         held_kind == "shared" ? LeaseMode::kShared : LeaseMode::kExclusive,
                         static_cast<std::uint32_t>(held_limit), ReplyText(reply->element[3]),
                         request.mode, request.limit);
  }
  if (granted == 4) {
    // {4, the waiting writer as a grant}: a writer intent keeps this shared request out.
    LH_ASSIGN_OR_RETURN(LeaseInfo writer, ParseLeaseInfo(request.key, reply, 1));
    writer.waiting_writer = true;
    return Status::HeldByAnother(
        fmt::format("{} waits for a writer: {} asked for it exclusively first (writer preference)",
                    request.key, writer.holder),
        writer);
  }
  LH_ASSIGN_OR_RETURN(long long fence, ParseInteger(reply->element[1]));
  if (granted == 2 && queued_waiter && reply->elements >= 5) {
    // Handed over by a release whose message we did not see: {2, fence, t_q, ttl_ms, slot}.
    LH_ASSIGN_OR_RETURN(long long t_q, ParseInteger(reply->element[2]));
    LH_ASSIGN_OR_RETURN(long long handed_ttl, ParseInteger(reply->element[3]));
    LH_ASSIGN_OR_RETURN(long long slot, ParseInteger(reply->element[4]));
    Result<Grant> grant =
        TakeHanded(request, Handed{.fencing_token = static_cast<FencingToken>(fence),
                                   .t_q = SteadyTime(Duration(t_q)),
                                   .ttl = StoreMillis(handed_ttl),
                                   .slot = static_cast<std::uint32_t>(slot)});
    if (!grant.ok() && grant.status().code() == StatusCode::kLost) {
      return Status::HeldByAnother(fmt::format(
          "{}: the grant a release handed to this waiter ended before it was taken", request.key));
    }
    return grant;
  }
  if (granted != 1 || reply->elements < 3) {
    return Status::Internal("unexpected reply from redis to the acquire script");
  }
  LH_ASSIGN_OR_RETURN(long long slot, ParseInteger(reply->element[2]));
  if (!options_.fair && !request.waiter_id.empty()) {
    // The script ended our writer intent, if we had one.
    MutexLock lock(&intents_mu_);
    intents_.erase(request.waiter_id);
  }
  if (options_.min_replicas > 0 && out.replicas < options_.min_replicas) {
    // A failover to a replica that never saw this grant would forget it: undo it. If the undo
    // itself fails, the grant simply expires after its TTL.
    std::vector<Command> undo = {{"EVALSHA", pool_->shas_[kRelease], "1", lease_key,
                                  request.owner_token, ChannelName(options_.prefix, request.key)}};
    (void)RunScripts(*router_, undo, false);
    return Status::Unavailable(fmt::format(
        "acquiring {}: only {} of {} replicas confirmed the grant within {}; undone", request.key,
        out.replicas, options_.min_replicas, FormatDuration(options_.replica_timeout)));
  }
  return Grant{.fencing_token = static_cast<FencingToken>(fence),
               .ttl = milliseconds(ttl_ms),
               .store_key = lease_key,
               .slot = static_cast<std::uint32_t>(slot)};
}

// SAFETY (DESIGN.md: safe_until = t_send + ttl - drift). The release that handed us the key ran
// on the server after the attempt whose entry it found (the server ran that attempt's script
// first: the entry, with its t_q, exists only once it has), and that attempt's script ran after
// we read its t_q. So the grant's expiry, release time + TTL, is at least t_q + TTL. `now` is
// read here, after the core read its t_send for this TryAcquire, so reporting
// Grant::ttl = TTL - (now - t_q) gives the core safe_until = t_send + TTL - (now - t_q) - drift
// <= t_q + TTL - drift: never later than the rule allows from our own send time t_q. The
// notification's arrival time plays no part. When that leaves under 3/4 of the TTL (a long
// wait since our last queue refresh), or replicas must confirm the grant, we renew first:
// the renewal's expiry starts when the server runs it, after `now`, so a full TTL counts from
// the core's t_send.
Result<Grant> RedisBackend::TakeHanded(const GrantRequest& request, const Handed& handed) {
  const std::string lease_key = LeaseKeyName(options_.prefix, request.key);
  const SteadyTime now = clock_.Now();
  const Duration requested = milliseconds(CeilMillis(request.ttl));
  // t_q and the TTL came back through the store and a pub/sub message: they are judged by
  // comparisons that cannot overflow before any arithmetic (a TTL above the one this waiter
  // asked for, or a t_q after now or more than a TTL ago, is not a usable handover).
  if (options_.min_replicas == 0 && handed.ttl > Duration::zero() && handed.ttl <= requested &&
      handed.t_q <= now && handed.t_q >= now - handed.ttl) {
    const Duration left = handed.ttl - (now - handed.t_q);
    if (left >= handed.ttl / kHandedMinLeftDen * kHandedMinLeftNum) {
      return Grant{.fencing_token = handed.fencing_token,
                   .ttl = left,
                   .store_key = lease_key,
                   .slot = handed.slot};
    }
  }
  LH_RETURN_IF_ERROR(Renew({request.key, request.owner_token, request.ttl}));
  return Grant{.fencing_token = handed.fencing_token,
               .ttl = requested,
               .store_key = lease_key,
               .slot = handed.slot};
}

void RedisBackend::RecordHanded(std::string_view waiter_id, std::string_view payload) {
  // "handed <waiter id> <fencing token> <t_q> <ttl_ms>[ <slot>]"
  std::vector<std::string_view> parts;
  std::size_t pos = 0;
  while (pos <= payload.size() && parts.size() < 7) {
    std::size_t space = payload.find(' ', pos);
    if (space == std::string_view::npos) {
      space = payload.size();
    }
    parts.push_back(payload.substr(pos, space - pos));
    pos = space + 1;
  }
  long long values[4] = {0, 0, 0, 0};
  if ((parts.size() != 5 && parts.size() != 6) || parts[0] != "handed" || parts[1] != waiter_id) {
    return;
  }
  for (std::size_t i = 0; i + 2 < parts.size(); ++i) {
    std::string_view text = parts[2 + i];
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), values[i]);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return;  // not ours to trust: the next attempt asks the server (kFairAcquireScript 5-11)
    }
  }
  MutexLock lock(&handed_mu_);
  handed_[std::string(waiter_id)] = Handed{
      .fencing_token = static_cast<FencingToken>(values[0]),
      .t_q = SteadyTime(Duration(values[1])),
      .ttl = StoreMillis(values[2]),
      .slot = static_cast<std::uint32_t>(std::clamp<long long>(values[3], 0, kMaxLeaseLimit))};
}

Result<long long> RedisBackend::FairEnd(std::string_view key, std::string_view who,
                                        std::string_view mode,
                                        const std::optional<std::string>& record,
                                        Duration record_ttl) {
  std::vector<Command> call = {
      {"EVALSHA", pool_->shas_[kFairEnd], "7", LeaseKeyName(options_.prefix, key),
       FenceKeyName(options_.prefix, key), QueueKeyName(options_.prefix, key),
       QueueExpiryKeyName(options_.prefix, key), QueueSeqKeyName(options_.prefix, key),
       QueueDataKeyName(options_.prefix, key), RecordKeyName(options_.prefix, key),
       std::string(who), ChannelName(options_.prefix, key), std::string(mode), record ? "1" : "0",
       record ? *record : std::string(), record ? std::to_string(CeilMillis(record_ttl)) : "0",
       std::string(kEpochFloorArg)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, record.has_value()));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("ending the grant of {}", key),
                             ScriptText(kFairEnd), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long ended, ParseInteger(reply));
  if (ended != 0 && record && options_.min_replicas > 0 && out.replicas < options_.min_replicas) {
    return Status::Unavailable(fmt::format(
        "finished {}, but only {} of the {} replicas asked for (min_replicas) acknowledged it "
        "within {}: a failover now could lose its record",
        key, out.replicas, options_.min_replicas, FormatDuration(options_.replica_timeout)));
  }
  return ended;
}

std::vector<Status> RedisBackend::RenewMany(std::span<const RenewRequest> requests) {
  std::vector<Status> results;
  if (requests.empty()) {
    return results;
  }
  std::vector<Command> calls;
  calls.reserve(requests.size());
  for (const RenewRequest& request : requests) {
    calls.push_back({"EVALSHA", pool_->shas_[kRenew], "1",
                     LeaseKeyName(options_.prefix, request.key), request.owner_token,
                     std::to_string(CeilMillis(request.ttl))});
  }
  // The server's wall clock, by which it expires the grants, read in the same round trip after
  // the renewals (backends/common/store_clock.h). Not in a cluster: each master has its own
  // clock, and TIME would go to one of them.
  const bool read_time = !router_->cluster();
  if (read_time) {
    calls.push_back({"TIME"});
  }
  // In a cluster each request goes to its key's master, and only a node that fails fails its
  // own requests.
  const SteadyTime t_send = clock_.Now();
  ScriptReplies out = RunEach(*router_, calls, true);
  if (read_time && out.errors.back().ok()) {
    if (std::optional<std::int64_t> us = ParseServerTime(out.replies.back().get())) {
      ObserveStoreTime({t_send, clock_.Now(), *us});
    }
  }
  results.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (!out.errors[i].ok()) {
      results.push_back(std::move(out.errors[i]));
      continue;
    }
    const redisReply* reply = out.replies[i].get();
    const bool replicas_short =
        options_.min_replicas > 0 && out.replicas_of[i] < options_.min_replicas;
    if (IsError(reply)) {
      results.push_back(ScriptErrorStatus(options_.Address(),
                                          fmt::format("renewing {}", requests[i].key),
                                          ScriptText(kRenew), ReplyText(reply)));
      continue;
    }
    Result<long long> renewed = ParseInteger(reply);
    if (!renewed.ok()) {
      results.push_back(renewed.status());
    } else if (*renewed == 0) {
      results.push_back(Status::Lost(fmt::format(
          "lease {} was lost: the grant expired, was force-released or is someone else's",
          requests[i].key)));
    } else if (replicas_short) {
      results.push_back(Status::Unavailable(fmt::format(
          "renewing {}: only {} of {} replicas confirmed within {}", requests[i].key,
          out.replicas_of[i], options_.min_replicas, FormatDuration(options_.replica_timeout))));
    } else {
      results.emplace_back();
    }
  }
  return results;
}

Status RedisBackend::Delete(std::string_view key, std::string_view owner_token) {
  if (options_.fair) {
    // The head waiter, if any, is granted the key inside the release (kFairEndScript).
    LH_ASSIGN_OR_RETURN(long long released,
                        FairEnd(key, owner_token, "owner", std::nullopt, Duration::zero()));
    if (released == 0) {
      return Status::Lost(fmt::format(
          "lease {} was lost or stolen: the grant expired, was force-released or is someone "
          "else's; nothing was deleted",
          key));
    }
    return Status();
  }
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kRelease], "1",
                                LeaseKeyName(options_.prefix, key), std::string(owner_token),
                                ChannelName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("releasing {}", key),
                             ScriptText(kRelease), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long released, ParseInteger(reply));
  if (released == 0) {
    return Status::Lost(fmt::format(
        "lease {} was lost or stolen: the grant expired, was force-released or is someone "
        "else's; nothing was deleted",
        key));
  }
  return Status();
}

Status RedisBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  // keep and record_ttl are rounded up to whole ms: a grant or record never ends early. A
  // positive keep never rounds to the '0' that means "delete".
  const std::string keep_ms =
      request.keep > Duration::zero() ? std::to_string(CeilMillis(request.keep)) : "0";
  if (options_.fair && request.keep == Duration::zero()) {
    // Deleted: hand the key to the head waiter in the same step, as Release does.
    LH_ASSIGN_OR_RETURN(long long finished, FairEnd(request.key, request.owner_token, "owner",
                                                    request.record, request.record_ttl));
    if (finished == 0) {
      return Status::Lost(fmt::format(
          "lease {} was lost or stolen: the grant expired, was force-released or is someone "
          "else's; nothing was deleted or written",
          request.key));
    }
    return Status();
  }
  const bool write_record = request.record.has_value();
  std::vector<Command> call = {
      {"EVALSHA", pool_->shas_[kFinish], "2", LeaseKeyName(options_.prefix, request.key),
       RecordKeyName(options_.prefix, request.key), request.owner_token,
       ChannelName(options_.prefix, request.key), keep_ms, write_record ? "1" : "0",
       write_record ? *request.record : std::string(),
       write_record ? std::to_string(CeilMillis(request.record_ttl)) : "0"}};
  // A record or a kept grant is what keeps the next host out: with min_replicas, WAIT for it as
  // an acquire does, so a failover right after is as unlikely to lose it as to lose a grant.
  const bool wait_replicas = write_record || request.keep > Duration::zero();
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, wait_replicas));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("finishing {}", request.key),
                             ScriptText(kFinish), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long finished, ParseInteger(reply));
  if (finished == 0) {
    return Status::Lost(fmt::format(
        "lease {} was lost or stolen: the grant expired, was force-released or is someone "
        "else's; nothing was deleted or written",
        request.key));
  }
  if (wait_replicas && options_.min_replicas > 0 && out.replicas < options_.min_replicas) {
    // Done on the master and not undoable; say that a failover now could forget it.
    return Status::Unavailable(fmt::format(
        "finished {}, but only {} of the {} replicas asked for (min_replicas) acknowledged it "
        "within {}: a failover now could lose its record or kept grant",
        request.key, out.replicas, options_.min_replicas,
        FormatDuration(options_.replica_timeout)));
  }
  return Status();
}

namespace {

// Reads kHoldersScript's reply for `key`: the live grants, by slot.
Result<std::vector<LeaseInfo>> ParseHolders(const std::string& address, const std::string& key,
                                            const redisReply* reply) {
  if (IsError(reply)) {
    return ScriptErrorStatus(address, fmt::format("inspecting {}", key), ScriptText(kHolders),
                             ReplyText(reply));
  }
  if (reply->type != REDIS_REPLY_ARRAY) {
    return Status::Internal("unexpected reply from redis to the holders script");
  }
  std::vector<LeaseInfo> holders;
  holders.reserve(reply->elements);
  for (std::size_t i = 0; i < reply->elements; ++i) {
    LH_ASSIGN_OR_RETURN(LeaseInfo info, ParseLeaseInfo(key, reply->element[i], 0));
    holders.push_back(std::move(info));
  }
  return holders;
}

}  // namespace

Result<std::vector<LeaseInfo>> RedisBackend::Holders(std::string_view key) {
  // The grants, then the writer intent (fair=false; none exists with fair=true): two one-key
  // scripts in one round trip (kIntentScript says why not one).
  std::vector<Command> call = {
      {"EVALSHA", pool_->shas_[kHolders], "1", LeaseKeyName(options_.prefix, key)},
      {"EVALSHA", pool_->shas_[kIntent], "1", IntentKeyName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
  LH_ASSIGN_OR_RETURN(std::vector<LeaseInfo> holders,
                      ParseHolders(options_.Address(), std::string(key), out.replies[0].get()));
  const redisReply* intent = out.replies[1].get();
  if (IsError(intent)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("inspecting {}", key),
                             ScriptText(kIntent), ReplyText(intent));
  }
  if (intent->type == REDIS_REPLY_ARRAY && intent->elements >= 8) {
    LH_ASSIGN_OR_RETURN(LeaseInfo writer, ParseLeaseInfo(std::string(key), intent, 0));
    writer.waiting_writer = true;
    holders.push_back(std::move(writer));
  }
  return holders;
}

Result<std::vector<LeaseInfo>> RedisBackend::List(std::string_view prefix) {
  // Grant keys are "<prefix>:{<hex>}"; hex(prefix) is a prefix of hex(key) exactly when prefix
  // is a prefix of key, and hex digits are never glob metacharacters. The trailing "}" keeps
  // the fence counters (":fence"), records (":record"), intents and queues out of the match.
  const std::string head = options_.prefix + ":{";
  const std::string pattern = GlobEscape(head) + HexEncode(prefix) + "*}";
  std::vector<LeaseInfo> leases;
  std::set<std::string> seen;  // SCAN may return a key more than once
  // In a cluster, every master's keys: each SCAN walks one node.
  LH_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RedisConnectionPool>> masters,
                      router_->MasterPools());
  for (std::size_t m = 0; m < masters.size(); ++m) {
    const std::string address = masters[m]->options().Address();
    std::string cursor = "0";
    do {
      ScanPage page;
      {
        // The connection goes back to the pool before the page's grants are read (RunScripts
        // borrows its own).
        LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, masters[m]->Borrow());
        LH_ASSIGN_OR_RETURN(page, Scan(*pool_, connection.get(), address, pattern, cursor));
      }
      cursor = std::move(page.cursor);
      std::vector<std::string> keys;
      std::vector<Command> reads;
      for (std::string& redis_key : page.keys) {
        std::optional<std::string> key = LeaseNameOf(redis_key, head, "}");
        if (!key || !seen.insert(*key).second) {
          continue;  // not one of ours, or seen on an earlier page
        }
        keys.push_back(std::move(*key));
        reads.push_back({"EVALSHA", pool_->shas_[kHolders], "1", std::move(redis_key)});
      }
      if (reads.empty()) {
        continue;
      }
      LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, reads, false));
      for (std::size_t i = 0; i < keys.size(); ++i) {
        LH_ASSIGN_OR_RETURN(std::vector<LeaseInfo> holders,
                            ParseHolders(options_.Address(), keys[i], out.replies[i].get()));
        for (LeaseInfo& info : holders) {
          leases.push_back(std::move(info));
        }
      }
    } while (cursor != "0");
  }
  // By key (std::string compares as unsigned bytes, the order the other stores give), then
  // slot; stable, so each key's grants stay in the slot order the script gave.
  std::stable_sort(leases.begin(), leases.end(), [](const LeaseInfo& a, const LeaseInfo& b) {
    return a.key != b.key ? a.key < b.key : a.slot < b.slot;
  });
  return leases;
}

Result<bool> RedisBackend::ForceReleaseOne(std::string_view key, std::string_view token_prefix) {
  if (token_prefix.empty()) {
    return Status::InvalidArgument(
        fmt::format("force-releasing one grant of {}: the token prefix is empty", key));
  }
  if (options_.fair) {
    // The room goes to the head waiters in the same step, as after a release.
    LH_ASSIGN_OR_RETURN(long long deleted,
                        FairEnd(key, token_prefix, "prefix", std::nullopt, Duration::zero()));
    return deleted != 0;
  }
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kForceGrant], "1",
                                LeaseKeyName(options_.prefix, key), std::string(token_prefix),
                                ChannelName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("force-releasing a grant of {}", key),
                             ScriptText(kForceGrant), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long deleted, ParseInteger(reply));
  return deleted == 1;
}

Result<bool> RedisBackend::ForceEnd(std::string_view key, std::string_view token_prefix) {
  return token_prefix.empty() ? ForceReleaseAll(key) : ForceReleaseOne(key, token_prefix);
}

Result<bool> RedisBackend::ForceReleaseAll(std::string_view key) {
  if (options_.fair) {
    // The head waiter is granted the key in the same step, as after a release.
    LH_ASSIGN_OR_RETURN(long long deleted,
                        FairEnd(key, std::string_view(), "force", std::nullopt, Duration::zero()));
    return deleted != 0;
  }
  std::vector<Command> call = {{"EVALSHA", pool_->shas_[kForceRelease], "1",
                                LeaseKeyName(options_.prefix, key),
                                ChannelName(options_.prefix, key)}};
  LH_ASSIGN_OR_RETURN(ScriptReplies out, RunScripts(*router_, call, false));
  const redisReply* reply = out.replies[0].get();
  if (IsError(reply)) {
    return ScriptErrorStatus(options_.Address(), fmt::format("force-releasing {}", key),
                             ScriptText(kForceRelease), ReplyText(reply));
  }
  LH_ASSIGN_OR_RETURN(long long deleted, ParseInteger(reply));
  return deleted == 1;
}

RedisBackend::Stats RedisBackend::stats() const {
  std::uint64_t connects = 0;
  for (const std::shared_ptr<RedisConnectionPool>& pool : router_->AllPools()) {
    connects += pool->connects_.load(std::memory_order_relaxed);
  }
  return Stats{.round_trips = pool_->round_trips_.load(std::memory_order_relaxed),
               .connects = connects,
               .script_loads = pool_->script_loads_.load(std::memory_order_relaxed),
               .slot_map_reads = router_->refreshes()};
}

}  // namespace leasehold::internal
