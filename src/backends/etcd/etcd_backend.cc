// File: backends/etcd/etcd_backend.cc (internal)
//
// EtcdBackend: the Backend methods, each a few etcd calls. The parts it is built of have files
// of their own: the channels, failover, auth and call helpers (etcd_client.h), the keep-alive
// stream (etcd_keepalive.h), the spare leases (etcd_spare_leases.h) and the fair queue
// (etcd_wait_queue.h). See etcd_backend.h for the design; the comments here explain the
// invariants.
//
// Time: every SteadyTime here (a WaitForChange deadline from the core, a spare lease's refresh
// time, a keep-alive round's deadline) is on clock_, the Clock the backend was opened with;
// nothing reads the real clock directly. gRPC deadlines are relative timeouts handed to gRPC
// (GrpcDeadline), on the system clock because that is what gRPC takes.

#include "backends/etcd/etcd_backend.h"

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
#include "backends/etcd/etcd_client.h"
#include "backends/etcd/etcd_keepalive.h"
#include "backends/etcd/etcd_spare_leases.h"
#include "backends/etcd/etcd_value.h"
#include "backends/etcd/etcd_wait_queue.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

namespace {

using namespace std::chrono_literals;
namespace pb = etcdserverpb;

// Shortest life of a queue entry (fair=true) without its waiter's attempts.
constexpr int64_t kMinQueueTtlSeconds = 10;

// Long waits are cut into pieces no longer than this (a gRPC deadline far in the future is
// pointless, and the core calls again anyway).
constexpr Duration kMaxWatchSlice = 1h;

// Where the record of `key` lives (Backend::ReadRecord): "<prefix>/\0record/<key>", on an etcd
// lease of its own. Inside "<prefix>/", so a user with read-write on that prefix can write it,
// yet never a lease's key (lease names are 1..512 bytes without NUL, so no lease name starts
// with NUL): Inspect never finds it, and List starts its range past it. No grant's revoke or
// expiry touches it.
std::string RecordKey(std::string_view prefix, std::string_view key) {
  std::string r = fmt::format("{}/", prefix);
  r += '\0';
  r += "record/";
  r += key;
  return r;
}

// An etcd lease TTL for `ttl`: whole seconds, rounded up (etcd raises small TTLs to its minimum,
// 2 s for 3.4's defaults, and says so in the grant's reply).
int64_t LeaseSeconds(Duration ttl) {
  return std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(ttl).count());
}

std::string TokenPrefixOf(std::string_view token) {
  return std::string(token.substr(0, 8));
}

// Shared leases (docs/impl.md, "The etcd store"). Every key of lease `name` is "<prefix>/<name>"
// (its base) or the base, a NUL and a suffix: no other lease's key is either (lease names have
// no NUL), and they are exactly the keys in [base, base + "\x01"), one Range.
//   base                          an exclusive grant (slot 0): the layout of every version
//   base \0 "s/" <slot>           a shared grant
//   base \0 "n/" <limit> "/" <slot>  a grant of a semaphore of <limit>
//   base \0 "w"                   the writer intent (fair=false), on its waiter's own lease
// <slot> and <limit> are 4 decimal digits (kMaxLeaseLimit is 1024), so that etcd's byte order
// is slot order.
constexpr std::string_view kSharedTag = "s/";
constexpr std::string_view kSemaphoreTag = "n/";
constexpr std::string_view kIntentTag = "w";

std::string Suffixed(std::string_view base, std::string_view suffix) {
  std::string k(base);
  k += '\0';
  k += suffix;
  return k;
}

// The end of the range of every key of the lease whose base is `base`.
std::string KeysEnd(std::string_view base) {
  std::string k(base);
  k += '\x01';
  return k;
}

std::string SharedKey(std::string_view base, std::uint32_t slot) {
  return Suffixed(base, fmt::format("{}{:04}", kSharedTag, slot));
}

std::string SemaphorePrefix(std::string_view base, std::uint32_t limit) {
  return Suffixed(base, fmt::format("{}{:04}/", kSemaphoreTag, limit));
}

std::string SemaphoreKey(std::string_view base, std::uint32_t limit, std::uint32_t slot) {
  return SemaphorePrefix(base, limit) + fmt::format("{:04}", slot);
}

// The key of a grant of `mode`/`limit` in `slot`.
std::string GrantKey(std::string_view base, LeaseMode mode, std::uint32_t limit,
                     std::uint32_t slot) {
  if (limit > 1) {
    return SemaphoreKey(base, limit, slot);
  }
  return mode == LeaseMode::kShared ? SharedKey(base, slot) : std::string(base);
}

// What one key of a lease is (ParseKey).
struct KeyKind {
  enum Kind { kGrant, kIntent, kOther } kind = kOther;

  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t limit = 1;
  std::uint32_t slot = 0;
};

bool ParseDigits(std::string_view digits, std::uint32_t* out) {
  if (digits.size() != 4) {
    return false;
  }
  std::uint32_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') {
      return false;
    }
    v = v * 10 + static_cast<std::uint32_t>(c - '0');
  }
  *out = v;
  return true;
}

// `suffix` is a key of the lease less its base: empty, or a NUL and one of the suffixes above.
KeyKind ParseKey(std::string_view suffix) {
  KeyKind k;
  if (suffix.empty()) {
    k.kind = KeyKind::kGrant;
    return k;
  }
  if (suffix[0] != '\0') {
    return k;
  }
  suffix.remove_prefix(1);
  if (suffix == kIntentTag) {
    k.kind = KeyKind::kIntent;
    return k;
  }
  if (suffix.starts_with(kSharedTag) && ParseDigits(suffix.substr(kSharedTag.size()), &k.slot)) {
    k.kind = KeyKind::kGrant;
    k.mode = LeaseMode::kShared;
    return k;
  }
  if (suffix.starts_with(kSemaphoreTag) && suffix.size() == kSemaphoreTag.size() + 9 &&
      suffix[kSemaphoreTag.size() + 4] == '/' &&
      ParseDigits(suffix.substr(kSemaphoreTag.size(), 4), &k.limit) &&
      ParseDigits(suffix.substr(kSemaphoreTag.size() + 5), &k.slot) && k.limit > 1) {
    k.kind = KeyKind::kGrant;
    return k;
  }
  return k;
}

// Lower slots whose occupancy the acquire Txn compares (etcd's --max-txn-ops, default 128,
// bounds a Txn's compares): a slot above this is the smallest free one as the previous attempt
// read it, which a release in between may have undercut.
constexpr std::uint32_t kLowerSlotCompares = 100;

// Acquire Txns per TryAcquire: a slot taken between the read and the Txn, or a writer intent
// to record, costs one more; each is one atomic Txn, so a race only fails one, never
// over-admits.
constexpr int kAdmissionTries = 6;

// A grant this backend made and has not released: what renew and release need.
struct HeldGrant {
  std::string key;  // the lease name
  std::string owner_token;
  std::string etcd_key;  // the grant's own key (the base, or a slot's key)
  int64_t lease_id = 0;  // the shared lease the key is on
  int64_t create_revision = 0;
  std::string holder;       // the grant's value is re-Put with it when Finish keeps the grant
  int64_t ttl_seconds = 0;  // the shared lease's TTL
  // The send time of the last keep-alive (or grant) of its lease after which the key was found
  // ours: etcd keeps the grant at least until confirmed + ttl_seconds, and the core's
  // safe_until is never later (its t_send is no later). Past that, the core has lost it.
  SteadyTime confirmed{};
};

// The held table's index of a grant: "<key>\0<owner token>" (a key has no NUL), so that the
// grants of one key are neighbours.
std::string HeldId(std::string_view key, std::string_view token) {
  std::string id(key);
  id += '\0';
  id += token;
  return id;
}

// A grant whose acquire Txn got no answer: it may be on a shared lease, which the other grants'
// keep-alives would keep alive. Deleted (if its value is still exactly this) before the next
// acquire of its key, or by the next renewal round.
struct Orphan {
  std::string etcd_key;
  std::string value;
  // A Txn that got no answer may still be on its way to the leader and be applied after a
  // delete of it that found nothing: the renewal rounds keep deleting it until then (two
  // command timeouts after the acquire), unless an acquire of the key by this handle resolves
  // it first (which adopts a grant that is exactly ours, as a retry does).
  SteadyTime retry_until{};
};

// Stale grants and orphans deleted per renewal round, at most: a handle that comes back from a
// long pause with thousands of lost grants drains them over a few rounds, and a round (whose
// results wait for the sweep) is never held up by more than this many fast calls, or one that
// times out (the sweep stops at the first failure).
constexpr std::size_t kSweepPerRound = 16;

// Keys checked per renewal Txn: etcd's --max-txn-ops (default 128) bounds a Txn's compares and
// each branch's ops.
constexpr std::size_t kKeysPerCheck = 128;

}  // namespace

// The parts of the backend, and the table of the grants it holds. Members are destroyed in
// reverse order: the queue and the spare leases (whose background grants call back into them:
// their destructor waits) and the keep-alive stream (its readers are joined) go before the
// client they use.
class EtcdBackend::Impl {
 public:
  Impl(EtcdOptions options, Clock& clock)
      : keep_spare(options.spare_lease),
        client(std::move(options), clock),
        keepalive(client),
        shared(client, keep_spare),
        queue(client, keepalive) {}

  std::optional<HeldGrant> FindHeld(std::string_view key, std::string_view token)
      LH_EXCLUDES(held_mu_) {
    MutexLock lock(&held_mu_);
    auto it = held_.find(HeldId(key, token));
    if (it == held_.end()) {
      return std::nullopt;
    }
    return it->second;
  }

  // Records `grant` (its key counted on its lease by the caller). A grant of the same etcd key
  // it replaces (lost, not yet dropped, or the same grant again: a retried Txn) is detached
  // from its lease: one etcd key carries one grant at a time.
  void SetHeld(HeldGrant grant) LH_EXCLUDES(held_mu_) {
    std::vector<int64_t> detach;
    {
      MutexLock lock(&held_mu_);
      const std::string first = HeldId(grant.key, "");
      for (auto it = held_.lower_bound(first); it != held_.end() && it->first.starts_with(first);) {
        if (it->second.etcd_key == grant.etcd_key) {
          detach.push_back(it->second.lease_id);
          it = held_.erase(it);
        } else {
          ++it;
        }
      }
      std::string id = HeldId(grant.key, grant.owner_token);
      if (auto it = held_.find(id); it != held_.end()) {
        detach.push_back(it->second.lease_id);
        held_.erase(it);
      }
      held_.emplace(std::move(id), std::move(grant));
    }
    for (int64_t id : detach) {
      shared.Detach(id);
    }
  }

  // Forgets the grant of `key` under `token` if it is still the one created at
  // `create_revision`, and detaches it from its lease. Returns whether it was known.
  bool DropHeld(std::string_view key, std::string_view token, int64_t create_revision)
      LH_EXCLUDES(held_mu_) {
    int64_t lease_id = 0;
    {
      MutexLock lock(&held_mu_);
      auto it = held_.find(HeldId(key, token));
      if (it == held_.end() || it->second.create_revision != create_revision) {
        return false;
      }
      lease_id = it->second.lease_id;
      held_.erase(it);
    }
    shared.Detach(lease_id);
    return true;
  }

  // After a renewal round sent at `sent` found these grants ours and their lease alive:
  // (held id, create revision) each.
  void Confirm(const std::vector<std::pair<std::string, int64_t>>& grants, SteadyTime sent)
      LH_EXCLUDES(held_mu_) {
    MutexLock lock(&held_mu_);
    for (const auto& [id, create_revision] : grants) {
      auto it = held_.find(id);
      if (it != held_.end() && it->second.create_revision == create_revision) {
        it->second.confirmed = std::max(it->second.confirmed, sent);
      }
    }
  }

  // Forgets every grant on lease `lease_id` (etcd says it is gone: its keys went with it).
  void DropAllOn(int64_t lease_id) LH_EXCLUDES(held_mu_) {
    MutexLock lock(&held_mu_);
    std::erase_if(held_, [&](const auto& kv) { return kv.second.lease_id == lease_id; });
  }

  // The grants past confirmed + ttl at `now` (the core has declared them lost).
  std::vector<HeldGrant> Stale(SteadyTime now) LH_EXCLUDES(held_mu_) {
    MutexLock lock(&held_mu_);
    std::vector<HeldGrant> out;
    for (const auto& [id, grant] : held_) {
      if (grant.confirmed + std::chrono::seconds(grant.ttl_seconds) < now) {
        out.push_back(grant);
      }
    }
    return out;
  }

  // The revision of the snapshot that last refused the waiter `waiter_id` on `key`: nothing
  // but a delete after it can admit the waiter (a new grant, intent or queue entry never
  // does), so its wait watches for deletes from the next revision, and misses none.
  void SetRefused(std::string_view waiter_id, std::string_view key, int64_t revision)
      LH_EXCLUDES(refused_mu_) {
    MutexLock lock(&refused_mu_);
    if (refused_.size() >= kMaxRefused) {
      refused_.clear();  // only a hint: a waiter without one reads the key first
    }
    refused_[std::string(waiter_id)] = {std::string(key), revision};
  }

  std::optional<int64_t> Refused(std::string_view waiter_id, std::string_view key)
      LH_EXCLUDES(refused_mu_) {
    MutexLock lock(&refused_mu_);
    auto it = refused_.find(waiter_id);
    if (it == refused_.end() || it->second.first != key) {
      return std::nullopt;
    }
    return it->second.second;
  }

  void ClearRefused(std::string_view waiter_id) LH_EXCLUDES(refused_mu_) {
    MutexLock lock(&refused_mu_);
    if (auto it = refused_.find(waiter_id); it != refused_.end()) {
      refused_.erase(it);
    }
  }

  const bool keep_spare;
  EtcdClient client;
  EtcdKeepAlive keepalive;
  EtcdSharedLeases shared;
  EtcdWaitQueue queue;

  // Acquire Txns without an answer (Orphan), by the grant's etcd key. Held across the delete that
  // resolves one, so that a retried acquire of the key (same owner token, so the same value)
  // never runs while a delete of the earlier attempt's value may still apply.
  Mutex orphan_mu;
  std::map<std::string, Orphan, std::less<>> orphans LH_GUARDED_BY(orphan_mu);

 private:
  static constexpr std::size_t kMaxRefused = 4096;

  Mutex held_mu_;
  // By HeldId(key, owner token).
  std::map<std::string, HeldGrant, std::less<>> held_ LH_GUARDED_BY(held_mu_);

  Mutex refused_mu_;
  // By waiter id: (key, revision).
  std::map<std::string, std::pair<std::string, int64_t>, std::less<>> refused_
      LH_GUARDED_BY(refused_mu_);
};

namespace {

// Deletes `orphan`'s key if its value is still exactly the orphan's (the owner token in it is
// unique to that acquire call). Returns OK once etcd answered (deleted or not there).
Status DeleteOrphan(EtcdClient& client, const Orphan& orphan) {
  pb::TxnRequest txn;
  pb::Compare* cmp = txn.add_compare();
  cmp->set_result(pb::Compare::EQUAL);
  cmp->set_target(pb::Compare::VALUE);
  cmp->set_key(orphan.etcd_key);
  cmp->set_value(orphan.value);
  txn.add_success()->mutable_request_delete_range()->set_key(orphan.etcd_key);
  pb::TxnResponse resp;
  return client.Txn("Txn (delete unanswered grant)", txn, &resp);
}

}  // namespace

std::string EtcdBackend::KeyName(std::string_view prefix, std::string_view key) {
  return fmt::format("{}/{}", prefix, key);
}

Result<std::shared_ptr<Backend>> OpenEtcdBackend(const Url& url, Clock& clock) {
  LH_ASSIGN_OR_RETURN(EtcdOptions options, EtcdOptions::FromUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<EtcdBackend> backend,
                      EtcdBackend::Open(std::move(options), clock));
  return std::shared_ptr<Backend>(std::move(backend));
}

EtcdBackend::EtcdBackend(EtcdOptions options, Clock& clock, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), clock_(clock), impl_(std::move(impl)) {}

Result<std::shared_ptr<EtcdBackend>> EtcdBackend::Open(EtcdOptions options, Clock& clock) {
  auto impl = std::make_unique<Impl>(options, clock);
  LH_RETURN_IF_ERROR(impl->client.Connect());
  return std::shared_ptr<EtcdBackend>(new EtcdBackend(std::move(options), clock, std::move(impl)));
}

EtcdBackend::~EtcdBackend() = default;

Capabilities EtcdBackend::capabilities() const {
  return Capabilities{.notifies_holder = true,
                      .fencing_survives_restart = true,
                      .fair_queue = options_.fair,
                      .shared_leases = true};
}

unsigned EtcdBackend::fenced_ops() const {
  return FencedOpBit(FencedOp::Kind::kPut) | FencedOpBit(FencedOp::Kind::kDelete);
}

EtcdBackend::Stats EtcdBackend::stats() const {
  const EtcdCounters& c = impl_->client.counters();
  return Stats{.range = c.range.load(),
               .txn = c.txn.load(),
               .lease_grant = c.lease_grant.load(),
               .lease_revoke = c.lease_revoke.load(),
               .lease_time_to_live = c.lease_time_to_live.load(),
               .authenticate = c.authenticate.load(),
               .keepalive_streams = c.keepalive_streams.load(),
               .keepalive_requests = c.keepalive_requests.load(),
               .keepalive_responses = c.keepalive_responses.load(),
               .keepalive_rounds = c.keepalive_rounds.load(),
               .watch_streams = c.watch_streams.load(),
               .failovers = c.failovers.load(),
               .spare_grants = c.spare_grants.load(),
               .spare_used = c.spare_used.load()};
}

Result<Grant> EtcdBackend::TryAcquire(const GrantRequest& request) {
  Result<Grant> grant = TryAcquireOnce(request);
  if (!grant.ok() && (grant.status().detail().find("lease not found") != std::string_view::npos ||
                      grant.status().message().find("lease not found") != std::string_view::npos)) {
    // The Txn was refused whole (its Put names a lease etcd no longer has): nothing was
    // applied, and the lease is forgotten, so the second attempt grants a fresh one.
    return TryAcquireOnce(request);
  }
  return grant;
}

namespace {

// Adds the compare "every key in [key, range_end) has create_revision `result` `revision`" (no
// key at all: compared as one with revision 0).
void CompareRange(pb::TxnRequest* txn, const std::string& key, const std::string& range_end,
                  pb::Compare::CompareResult result, int64_t revision) {
  pb::Compare* c = txn->add_compare();
  c->set_result(result);
  c->set_target(pb::Compare::CREATE);
  c->set_key(key);
  c->set_range_end(range_end);
  c->set_create_revision(revision);
}

// A lease's keys as one Range read them: its grants in key (so slot) order, and its intent.
struct KeySnapshot {
  struct Held {
    const mvccpb::KeyValue* kv;
    KeyKind kind;
  };

  std::vector<Held> grants;
  const mvccpb::KeyValue* intent = nullptr;
  bool exclusive = false;  // a grant at the base
  bool shared = false;
  std::optional<std::uint32_t> semaphore;  // the limit of the first semaphore grant
};

KeySnapshot Snapshot(std::string_view base, const pb::RangeResponse& range) {
  KeySnapshot snap;
  for (const mvccpb::KeyValue& kv : range.kvs()) {
    const std::string_view k = kv.key();
    if (!k.starts_with(base)) {
      continue;
    }
    KeyKind kind = ParseKey(k.substr(base.size()));
    if (kind.kind == KeyKind::kIntent) {
      snap.intent = &kv;
    } else if (kind.kind == KeyKind::kGrant) {
      snap.grants.push_back({&kv, kind});
      if (kind.limit > 1) {
        snap.semaphore = snap.semaphore.value_or(kind.limit);
      } else if (kind.mode == LeaseMode::kShared) {
        snap.shared = true;
      } else {
        snap.exclusive = true;
      }
    }
  }
  return snap;
}

// The smallest slot below `limit` that no grant of `mode`/`limit` in `snap` has, or nullopt.
std::optional<std::uint32_t> FreeSlot(const KeySnapshot& snap, LeaseMode mode, std::uint32_t limit,
                                      std::uint32_t bound) {
  std::vector<bool> used(bound, false);
  for (const KeySnapshot::Held& g : snap.grants) {
    if (g.kind.limit == limit && g.kind.mode == mode && g.kind.slot < bound) {
      used[g.kind.slot] = true;
    }
  }
  for (std::uint32_t i = 0; i < bound; ++i) {
    if (!used[i]) {
      return i;
    }
  }
  return std::nullopt;
}

LeaseInfo InfoOf(std::string_view key, const mvccpb::KeyValue& kv, const KeyKind& kind) {
  LeaseInfo info;
  info.key = std::string(key);
  info.fencing_token = static_cast<FencingToken>(kv.create_revision());
  info.mode = kind.mode;
  info.limit = kind.limit;
  info.slot = kind.slot;
  if (std::optional<GrantValue> value = DecodeValue(kv.value())) {
    info.holder = value->holder;
    info.token_prefix = TokenPrefixOf(value->token);
    info.kept = value->token.ends_with(kKeptTokenSuffix);
    info.ttl = StoreMillis(value->ttl_ms);
  }
  info.remaining = info.ttl;
  return info;
}

}  // namespace

Result<Grant> EtcdBackend::TryAcquireOnce(const GrantRequest& request) {
  Impl& impl = *impl_;
  // Read after the core read t_send: every TTL reported below is measured from a time no
  // earlier than the core's, so the core's safe_until is never later than etcd's expiry.
  const SteadyTime now = clock_.Now();
  const int64_t seconds = LeaseSeconds(request.ttl);
  const std::string base = KeyName(options_.prefix, request.key);
  const std::string keys_end = KeysEnd(base);
  const bool semaphore = request.limit > 1;
  const bool shared = !semaphore && request.mode == LeaseMode::kShared;
  const bool exclusive = !semaphore && !shared;
  // Grants of this handle that the core has declared lost and whose keys are still in etcd (a
  // release that got no answer, or none sent) are deleted first. The renewal rounds' sweep does
  // that too, but a handle that holds nothing runs no rounds, and this acquire's use of their
  // shared lease (its refresh below, then the grant's keep-alives) would keep them alive: a
  // partition's lost holder that kept trying for its key kept its old grant of it alive, and
  // nobody got the key (partition_etcd's stall).
  SweepLost();
  {
    // An earlier acquire of this key whose Txn got no answer may have put a key on a shared
    // lease: delete it first (only if it is still exactly that grant), under orphan_mu so that
    // no round's delete of it can apply after this acquire's Txn.
    MutexLock lock(&impl.orphan_mu);
    for (auto it = impl.orphans.lower_bound(base);
         it != impl.orphans.end() && it->first < keys_end;) {
      LH_RETURN_IF_ERROR(DeleteOrphan(impl.client, it->second));
      it = impl.orphans.erase(it);
    }
  }
  // fair=true: a waiter takes (or keeps) its place in the key's queue first. Its entry lives
  // max(ttl, 10 s) without the waiter's attempts (each refreshes it once a third has passed);
  // a shared or semaphore waiter's only its ttl (etcd's 2 s at least): such waiters are many
  // and come and go, and every one that dies holds up the whole queue until its entry expires.
  const bool exclusive_waiter = request.limit == 1 && request.mode == LeaseMode::kExclusive;
  const int64_t queue_ttl = exclusive_waiter ? std::max(seconds, kMinQueueTtlSeconds) : seconds;
  std::optional<QueueEntry> entry;
  if (options_.fair && !request.waiter_id.empty()) {
    LH_ASSIGN_OR_RETURN(entry, impl.queue.Enqueue(request.key, request.waiter_id, queue_ttl));
  }
  // fair=false: a waiting writer's intent rides on a lease of its own (granted when it is first
  // refused, below), refreshed by its attempts.
  const bool wants_intent = !options_.fair && exclusive && !request.waiter_id.empty();
  std::optional<int64_t> intent_lease;
  if (wants_intent) {
    LH_ASSIGN_OR_RETURN(intent_lease, impl.queue.IntentLease(request.key, request.waiter_id));
  }
  // The key goes on the live shared lease of its TTL class (counted on it from here on; every
  // path below that does not keep the grant detaches it again).
  std::optional<SharedLease> attached = impl.shared.Attach(seconds);
  if (attached && (now - attached->refreshed) * 3 > std::chrono::seconds(attached->ttl_seconds)) {
    // Less than 2/3 of its TTL left (an idle spare: rounds run only while keys are held):
    // refresh it first with one keep-alive, sent after `sent` (itself after the core's t_send).
    const SteadyTime sent = clock_.Now();
    std::vector<std::optional<int64_t>> ttl = impl.keepalive.KeepAlive({attached->id});
    impl.shared.Renewed(attached->id, ttl[0], sent);
    if (ttl[0] && *ttl[0] > 0) {
      attached->refreshed = sent;
    } else {
      impl.shared.Detach(attached->id);
      if (!ttl[0]) {
        return Status::Unavailable(
            fmt::format("no etcd member of {} answered the keep-alive of the shared lease for {}",
                        options_.Address(), request.key));
      }
      attached.reset();  // gone in etcd (forgotten by Renewed): grant a new one
    }
  }
  SharedLease lease;
  if (attached) {
    lease = *attached;
    impl.client.counters().spare_used.fetch_add(1, std::memory_order_relaxed);
  } else {
    pb::LeaseGrantRequest grant_req;
    grant_req.set_ttl(seconds);
    pb::LeaseGrantResponse grant_resp;
    LH_RETURN_IF_ERROR(impl.client.LeaseGrant("LeaseGrant", grant_req, &grant_resp));
    lease = SharedLease{grant_resp.id(), grant_resp.ttl(), now};
    if (lease.id == 0 || lease.ttl_seconds <= 0) {
      return Status::Internal(
          fmt::format("etcd granted lease {} with TTL {} s", lease.id, lease.ttl_seconds),
          grant_resp.error());
    }
    impl.client.counters().spare_grants.fetch_add(1, std::memory_order_relaxed);
    impl.shared.AddCurrent(seconds, lease);
  }
  // What the core may count on: the lease's TTL less the time since it was last set (zero for
  // a lease granted just now: `now` was read before the grant was sent).
  const Duration reported =
      std::chrono::seconds(lease.ttl_seconds) - std::max(Duration::zero(), now - lease.refreshed);

  const std::string value =
      EncodeValue({request.owner_token, lease.ttl_seconds * 1000, request.holder});
  const std::string intent_key = Suffixed(base, kIntentTag);
  const std::string shared_prefix = Suffixed(base, kSharedTag);
  const std::string semaphores = Suffixed(base, kSemaphoreTag);
  std::uint32_t slot = 0;  // the first try: slot 0; a miss retries the smallest free one read
  for (int attempt = 0;; ++attempt) {
    const std::string grant_key = GrantKey(base, request.mode, request.limit, slot);
    // One Txn decides. Compares: the grants that would keep this request out are absent (each
    // family's keys are one range), its slot is free, and the lower slots are taken (the slot
    // is the smallest free one). Success: the Put (plus taking our queue entry or our intent
    // out). Failure: a Range of every key of the lease (plus recording our intent).
    pb::TxnRequest txn;
    if (exclusive) {
      CompareCreateRevision(&txn, base, 0);
      CompareRange(&txn, shared_prefix, PrefixEnd(shared_prefix), pb::Compare::EQUAL, 0);
      CompareRange(&txn, semaphores, PrefixEnd(semaphores), pb::Compare::EQUAL, 0);
    } else if (shared) {
      CompareCreateRevision(&txn, base, 0);
      CompareRange(&txn, semaphores, PrefixEnd(semaphores), pb::Compare::EQUAL, 0);
      CompareCreateRevision(&txn, intent_key, 0);
      CompareCreateRevision(&txn, grant_key, 0);
    } else {
      const std::string mine = SemaphorePrefix(base, request.limit);
      CompareCreateRevision(&txn, base, 0);
      CompareRange(&txn, shared_prefix, PrefixEnd(shared_prefix), pb::Compare::EQUAL, 0);
      // Every semaphore grant asks our limit: none below our limit's range, none above it.
      CompareRange(&txn, semaphores, mine, pb::Compare::EQUAL, 0);
      CompareRange(&txn, PrefixEnd(mine), PrefixEnd(semaphores), pb::Compare::EQUAL, 0);
      CompareCreateRevision(&txn, grant_key, 0);
    }
    if (!exclusive) {
      for (std::uint32_t j = slot > kLowerSlotCompares ? slot - kLowerSlotCompares : 0; j < slot;
           ++j) {
        pb::Compare* c = txn.add_compare();
        c->set_result(pb::Compare::GREATER);
        c->set_target(pb::Compare::CREATE);
        c->set_key(GrantKey(base, request.mode, request.limit, j));
        c->set_create_revision(0);
      }
    }
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(grant_key);
    put->set_value(value);
    put->set_lease(lease.id);
    pb::RangeRequest* read = txn.add_failure()->mutable_request_range();
    read->set_key(base);
    read->set_range_end(keys_end);
    if (intent_lease) {
      // Granted: our intent goes (only ours: compare its lease). Refused: our intent is
      // recorded unless a live one (another waiter's, or ours already) is there.
      pb::TxnRequest* clear = txn.add_success()->mutable_request_txn();
      pb::Compare* c = clear->add_compare();
      c->set_result(pb::Compare::EQUAL);
      c->set_target(pb::Compare::LEASE);
      c->set_key(intent_key);
      c->set_lease(*intent_lease);
      clear->add_success()->mutable_request_delete_range()->set_key(intent_key);
      pb::TxnRequest* record = txn.add_failure()->mutable_request_txn();
      CompareCreateRevision(record, intent_key, 0);
      CompareRange(record, semaphores, PrefixEnd(semaphores), pb::Compare::EQUAL, 0);
      pb::PutRequest* intent = record->add_success()->mutable_request_put();
      intent->set_key(intent_key);
      intent->set_value(EncodeValue({request.waiter_id, seconds * 1000, request.holder}));
      intent->set_lease(*intent_lease);
    }
    if (options_.fair) {
      // The queue must be empty, or (for a waiter) have nobody ahead of us: every entry's
      // create revision at least ours. The grant then takes our entry out of the queue. Every
      // kind admits the head only; its grant deletes its entry, which wakes the next waiter
      // (docs/impl.md).
      const std::string queue = EtcdWaitQueue::Prefix(options_.prefix, request.key);
      if (entry) {
        CompareRange(&txn, queue, PrefixEnd(queue), pb::Compare::GREATER,
                     entry->create_revision - 1);
        txn.add_success()->mutable_request_delete_range()->set_key(entry->queue_key);
      } else {
        CompareRange(&txn, queue, PrefixEnd(queue), pb::Compare::EQUAL, 0);
      }
    }
    pb::TxnResponse txn_resp;
    Status s = impl.client.Txn("Txn (acquire)", txn, &txn_resp);
    if (!s.ok()) {
      impl.shared.Detach(lease.id);
      if (s.detail().find("lease not found") != std::string_view::npos ||
          s.message().find("lease not found") != std::string_view::npos) {
        if (intent_lease) {
          // The intent's lease may be the one gone: forget it (the retry grants another).
          impl.queue.Dequeue(request.key, request.waiter_id, /*revoke=*/false);
        } else {
          impl.shared.Forget(lease.id);  // revoked behind our back: TryAcquire tries once more
        }
        return s;
      }
      // Unknown outcome: the Put may have been applied, and the shared lease (kept alive for
      // the other grants) would keep the key forever. Delete it if it is exactly our grant,
      // now or, if etcd does not answer, before the next acquire of the key or in the next
      // round.
      Orphan orphan{grant_key, value, clock_.Now() + 2 * options_.command_timeout};
      MutexLock lock(&impl.orphan_mu);
      (void)DeleteOrphan(impl.client, orphan);
      impl.orphans[grant_key] = std::move(orphan);
      return s;
    }
    if (txn_resp.succeeded()) {
      // The Put is the Txn's only write of a key it creates: the Txn's revision is the key's
      // create revision.
      const int64_t revision = txn_resp.header().revision();
      impl.SetHeld({request.key, request.owner_token, grant_key, lease.id, revision, request.holder,
                    lease.ttl_seconds, lease.refreshed});
      if (entry || intent_lease) {
        impl.queue.Dequeue(request.key, request.waiter_id);  // the entry or intent went with it
      }
      if (!request.waiter_id.empty()) {
        impl.ClearRefused(request.waiter_id);
      }
      return Grant{.fencing_token = static_cast<FencingToken>(revision),
                   .ttl = reported,
                   .store_key = grant_key,
                   .slot = slot};
    }
    const pb::RangeResponse* range =
        txn_resp.responses_size() > 0 && txn_resp.responses(0).has_response_range()
            ? &txn_resp.responses(0).response_range()
            : nullptr;
    if (range == nullptr) {
      impl.shared.Detach(lease.id);
      return Status::Unavailable(
          fmt::format("etcd Txn for {} neither created the key nor read it", base));
    }
    const KeySnapshot snap = Snapshot(base, *range);
    for (const KeySnapshot::Held& g : snap.grants) {
      std::optional<GrantValue> mine = DecodeValue(g.kv->value());
      if (mine && mine->token == request.owner_token && g.kv->lease() == lease.id) {
        // An earlier attempt of this very Txn was applied before its reply was lost (a
        // deadline or a failover): the grant is ours, on this lease.
        impl.SetHeld({request.key, request.owner_token, g.kv->key(), lease.id,
                      g.kv->create_revision(), request.holder, lease.ttl_seconds, lease.refreshed});
        return Grant{.fencing_token = static_cast<FencingToken>(g.kv->create_revision()),
                     .ttl = reported,
                     .store_key = g.kv->key(),
                     .slot = g.kind.slot};
      }
    }
    // A live grant of the other family, or of another limit: refused, naming both.
    const auto mismatch = [&](const KeySnapshot::Held& g) {
      std::optional<GrantValue> v = DecodeValue(g.kv->value());
      return LimitMismatch(request.key, g.kind.mode, g.kind.limit, v ? v->holder : "", request.mode,
                           request.limit);
    };
    for (const KeySnapshot::Held& g : snap.grants) {
      if ((g.kind.limit > 1) != semaphore || (semaphore && g.kind.limit != request.limit)) {
        impl.shared.Detach(lease.id);
        return mismatch(g);
      }
    }
    // Room left, as this snapshot tells: retry on the smallest free slot.
    std::optional<std::uint32_t> free;
    if (semaphore) {
      free = FreeSlot(snap, request.mode, request.limit, request.limit);
    } else if (shared && !snap.exclusive && snap.intent == nullptr) {
      free = FreeSlot(snap, LeaseMode::kShared, 1, kMaxLeaseLimit);
    } else if (exclusive && snap.grants.empty()) {
      free = 0;
    }
    const bool queued = options_.fair && free && *free == slot;  // the queue said no
    if (free && !queued && attempt + 1 < kAdmissionTries) {
      slot = *free;
      continue;
    }
    if (wants_intent && !intent_lease && !free && attempt + 1 < kAdmissionTries) {
      // Refused: record our intent, in a Txn that also tries once more.
      LH_ASSIGN_OR_RETURN(int64_t granted,
                          impl.queue.GrantIntentLease(request.key, request.waiter_id, seconds));
      intent_lease = granted;
      continue;
    }
    // No key of ours was attached: the shared lease serves the next acquire (a conflict costs
    // one Txn); without spares an empty lease is revoked.
    impl.shared.Detach(lease.id);
    if (!request.waiter_id.empty()) {
      impl.SetRefused(request.waiter_id, request.key, txn_resp.header().revision());
    }
    if (queued || (options_.fair && snap.grants.empty())) {
      return Status::HeldByAnother(
          fmt::format("{} is free but waiters are queued for it (fair=true)", request.key));
    }
    if (shared && !snap.exclusive && snap.intent != nullptr) {
      std::optional<GrantValue> v = DecodeValue(snap.intent->value());
      LeaseInfo writer;
      writer.key = request.key;
      writer.holder = v ? v->holder : "";
      writer.ttl = v ? StoreMillis(v->ttl_ms) : std::chrono::milliseconds(0);
      writer.remaining = writer.ttl;
      writer.waiting_writer = true;
      return Status::HeldByAnother(
          fmt::format("{} is kept for a waiting writer, {} (writer preference)", request.key,
                      writer.holder.empty() ? "another owner" : writer.holder),
          writer);
    }
    if (snap.grants.empty()) {
      return Status::HeldByAnother(
          fmt::format("{} was taken and released while this acquire tried", request.key));
    }
    // The grant of the lowest slot (the snapshot is in key order: the base first, then slot
    // order). Its TTL bounds its time left; its age is not known here.
    return Status::HeldByAnother(
        InfoOf(request.key, *snap.grants.front().kv, snap.grants.front().kind), {},
        /*remaining_is_upper_bound=*/true);
  }
}

std::vector<Status> EtcdBackend::RenewMany(std::span<const RenewRequest> requests) {
  // SAFETY (docs/impl.md, "The etcd store"). The core read t_send before this call. A grant's
  // key rides on a lease shared with the handle's other grants of its TTL, so renewing it takes
  // two pieces of evidence, both obtained by requests sent after `sent` (itself after t_send):
  //   1. the keep-alive of its lease answered TTL > 0: etcd keeps the lease, and so every key
  //      still on it, until at least sent + ttl;
  //   2. a Txn whose compare create_revision(key) == ours held when etcd applied it, after
  //      `sent`: the key was still our grant then (not deleted, expired or re-created).
  // Only a delete of the key after the Txn (release --force, etcdctl del) can end the grant
  // before sent + ttl, as a revoke after the round could in the one-lease-per-grant design:
  // the next round's compare fails and the grant is kLost. The keep-alive says nothing about
  // one key, so a grant is never renewed on it alone. A lease answering TTL <= 0 loses every
  // grant on it at once.
  Impl& impl = *impl_;
  std::vector<Status> results(requests.size());

  struct Item {
    std::size_t index;  // in `requests`
    int64_t lease_id;
    int64_t create_revision;
    std::string etcd_key;  // the grant's own key
  };

  std::vector<Item> items;
  items.reserve(requests.size());
  std::vector<int64_t> ids;  // one keep-alive per lease
  for (std::size_t i = 0; i < requests.size(); ++i) {
    std::optional<HeldGrant> held = impl.FindHeld(requests[i].key, requests[i].owner_token);
    if (!held) {
      results[i] = Status::Lost(
          fmt::format("{} is not held by this owner token (released, lost or someone else's)",
                      requests[i].key));
      continue;
    }
    if (std::find(ids.begin(), ids.end(), held->lease_id) == ids.end()) {
      ids.push_back(held->lease_id);
    }
    items.push_back({i, held->lease_id, held->create_revision, std::move(held->etcd_key)});
  }
  // Every other lease of ours rides along (spares of idle classes, leases of grants not due in
  // this round), so they stay young enough to be used.
  const std::size_t held_leases = ids.size();
  if (!items.empty()) {
    for (const SharedLease& lease : impl.shared.All()) {
      if (std::find(ids.begin(), ids.end(), lease.id) == ids.end()) {
        ids.push_back(lease.id);
      }
    }
  }
  const SteadyTime sent = clock_.Now();
  std::vector<std::optional<int64_t>> ttls = impl.keepalive.KeepAlive(ids);
  std::map<int64_t, std::optional<int64_t>> ttl_of;
  for (std::size_t j = 0; j < ids.size(); ++j) {
    impl.shared.Renewed(ids[j], ttls[j], sent);
    if (j < held_leases) {
      ttl_of[ids[j]] = ttls[j];
    } else if (ttls[j] && *ttls[j] <= 0) {
      impl.DropAllOn(ids[j]);
    }
  }
  const auto ms = [](Duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  // The keys whose lease is alive are checked, kKeysPerCheck per Txn.
  std::vector<const Item*> to_check;
  for (const Item& item : items) {
    const std::optional<int64_t>& ttl = ttl_of[item.lease_id];
    const RenewRequest& req = requests[item.index];
    if (!ttl) {
      results[item.index] = Status::Unavailable(
          fmt::format("no etcd member of {} answered the keep-alive of {} within {} ms",
                      options_.Address(), req.key, ms(options_.command_timeout)));
    } else if (*ttl <= 0) {
      results[item.index] = Status::Lost(
          fmt::format("etcd lease of {} expired or was revoked (keep-alive answered TTL {})",
                      req.key, *ttl),
          LostCause::kSessionLost);
    } else {
      to_check.push_back(&item);
    }
  }
  for (const auto& [id, ttl] : ttl_of) {
    if (ttl && *ttl <= 0) {
      impl.DropAllOn(id);  // every grant on it is lost (its keys went with it)
    }
  }
  std::vector<std::pair<std::string, int64_t>> confirmed;
  confirmed.reserve(to_check.size());
  for (std::size_t begin = 0; begin < to_check.size(); begin += kKeysPerCheck) {
    const std::size_t end = std::min(to_check.size(), begin + kKeysPerCheck);
    pb::TxnRequest txn;
    for (std::size_t k = begin; k < end; ++k) {
      CompareCreateRevision(&txn, to_check[k]->etcd_key, to_check[k]->create_revision);
    }
    pb::TxnResponse resp;
    Status s = impl.client.Txn("Txn (renewal check)", txn, &resp);
    // A failed compare (rare: a key deleted or re-created) says only that one of them is not
    // ours: one read-only Txn (a keys-only Range of each) then tells which. It is also sent
    // after `sent`, so a key it finds ours was ours after t_send.
    pb::TxnResponse which;
    if (s.ok() && !resp.succeeded()) {
      pb::TxnRequest read;
      for (std::size_t k = begin; k < end; ++k) {
        pb::RangeRequest* r = read.add_success()->mutable_request_range();
        r->set_key(to_check[k]->etcd_key);
        r->set_keys_only(true);
      }
      s = impl.client.Txn("Txn (renewal check, which keys)", read, &which);
      if (s.ok() && which.responses_size() != static_cast<int>(end - begin)) {
        s = Status::Internal("a reply with the wrong number of ranges");
      }
    }
    for (std::size_t k = begin; k < end; ++k) {
      const Item& item = *to_check[k];
      const RenewRequest& req = requests[item.index];
      if (!s.ok()) {
        results[item.index] =
            Status::Unavailable(fmt::format("etcd did not answer the renewal check of {}", req.key),
                                std::string(s.message()));
        continue;
      }
      bool ours = resp.succeeded();
      if (!ours) {
        const auto& kvs = which.responses(static_cast<int>(k - begin)).response_range().kvs();
        ours = !kvs.empty() && kvs[0].create_revision() == item.create_revision;
      }
      if (ours) {
        confirmed.emplace_back(HeldId(req.key, req.owner_token), item.create_revision);
      } else {
        impl.DropHeld(req.key, req.owner_token, item.create_revision);
        results[item.index] = Status::Lost(
            fmt::format("{} is gone from etcd or re-created (force-released, deleted or taken "
                        "over) while its shared lease lives",
                        req.key),
            LostCause::kStoreSaidNo);
      }
    }
  }
  impl.Confirm(confirmed, sent);
  SweepLost();
  return results;
}

void EtcdBackend::SweepLost() {
  // A grant the core declared lost (its safe_until passed: no confirmation for a whole TTL)
  // would be kept in etcd by the other grants' keep-alives (and by acquires that use its shared
  // lease: TryAcquireOnce sweeps too) until its release: delete it (only
  // that very grant: compare on its create revision). If etcd does not answer, the next round
  // tries again; a lease that etcd no longer hears from expires with its keys.
  // At most kSweepPerRound calls, stopping at the first failure, so that this round's results
  // (which wait for the sweep) are not held up. The delete also compares the key's lease with
  // the shared lease the grant was on: a grant a Finish kept (re-Put under its keep lease by a
  // Txn whose answer was lost: same create revision) must outlive its holder, not be swept.
  Impl& impl = *impl_;
  std::size_t budget = kSweepPerRound;
  for (const HeldGrant& grant : impl.Stale(clock_.Now())) {
    if (budget == 0) {
      return;
    }
    --budget;
    const std::string& etcd_key = grant.etcd_key;
    pb::TxnRequest txn;
    CompareCreateRevision(&txn, etcd_key, grant.create_revision);
    pb::Compare* on_lease = txn.add_compare();
    on_lease->set_result(pb::Compare::EQUAL);
    on_lease->set_target(pb::Compare::LEASE);
    on_lease->set_key(etcd_key);
    on_lease->set_lease(grant.lease_id);
    txn.add_success()->mutable_request_delete_range()->set_key(etcd_key);
    pb::TxnResponse resp;
    if (!impl.client.Txn("Txn (delete lost grant)", txn, &resp).ok()) {
      return;
    }
    impl.DropHeld(grant.key, grant.owner_token, grant.create_revision);
  }
  MutexLock lock(&impl.orphan_mu);
  const SteadyTime now = clock_.Now();
  for (auto it = impl.orphans.begin(); it != impl.orphans.end() && budget > 0; --budget) {
    if (!DeleteOrphan(impl.client, it->second).ok()) {
      return;
    }
    it = now >= it->second.retry_until ? impl.orphans.erase(it) : std::next(it);
  }
}

Status EtcdBackend::Delete(std::string_view key, std::string_view owner_token) {
  Impl& impl = *impl_;
  std::optional<HeldGrant> held = impl.FindHeld(key, owner_token);
  if (!held) {
    return Status::Lost(fmt::format(
        "{} is not held by this owner token (already released, lost or someone else's)", key));
  }
  const std::string& etcd_key = held->etcd_key;
  // One conditional delete (one raft entry): the lease is shared with the handle's other
  // grants, so it is never revoked here. The compare is on this grant's create revision: a
  // newer grant of the key (ours again, or anyone's) is never deleted by it.
  pb::TxnRequest txn;
  CompareCreateRevision(&txn, etcd_key, held->create_revision);
  pb::DeleteRangeRequest* del = txn.add_success()->mutable_request_delete_range();
  del->set_key(etcd_key);
  pb::TxnResponse txn_resp;
  LH_RETURN_IF_ERROR(impl.client.Txn("Txn (release)", txn, &txn_resp));
  // Unknown outcome above: the grant stays known for a retry (and the round's sweep deletes it
  // once its TTL has passed unconfirmed).
  impl.DropHeld(key, owner_token, held->create_revision);
  if (txn_resp.succeeded()) {
    return Status();
  }
  return Status::Lost(
      fmt::format("{} was no longer ours (expired, force-released or taken over)", key),
      LostCause::kSessionLost);
}

namespace {

// A fresh etcd lease of LeaseSeconds(ttl): its id and the TTL etcd granted.
struct FreshLease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;
};

Result<FreshLease> GrantLease(EtcdClient& client, Duration ttl, std::string_view what) {
  pb::LeaseGrantRequest req;
  req.set_ttl(LeaseSeconds(ttl));
  pb::LeaseGrantResponse resp;
  LH_RETURN_IF_ERROR(client.LeaseGrant(what, req, &resp));
  if (resp.id() == 0 || resp.ttl() <= 0) {
    return Status::Internal(
        fmt::format("etcd granted lease {} with TTL {} s", resp.id(), resp.ttl()), resp.error());
  }
  return FreshLease{resp.id(), resp.ttl()};
}

}  // namespace

Status EtcdBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  if (request.keep == Duration::zero() && !request.record.has_value()) {
    return Delete(request.key, request.owner_token);
  }
  Impl& impl = *impl_;
  std::optional<HeldGrant> held = impl.FindHeld(request.key, request.owner_token);
  if (!held) {
    return Status::Lost(
        fmt::format("{} is not held by this owner token (already released, lost or someone else's)",
                    request.key));
  }
  // The leases for the new TTLs come first, so that one Txn does the rest. Each is counted
  // from its grant, which etcd applies before the Txn: the kept grant and the record last at
  // least `keep` and `record_ttl` from the call. The kept grant and the record get a lease each
  // (never a shared one): a force-release revokes the grant's lease, which must not take the
  // record with it.
  std::optional<FreshLease> keep_lease;
  std::optional<FreshLease> record_lease;
  if (request.keep > Duration::zero()) {
    LH_ASSIGN_OR_RETURN(keep_lease, GrantLease(impl.client, request.keep, "LeaseGrant (keep)"));
  }
  if (request.record.has_value()) {
    Result<FreshLease> granted = GrantLease(impl.client, request.record_ttl, "LeaseGrant (record)");
    if (!granted.ok()) {
      if (keep_lease) {
        impl.client.RevokeInBackground(keep_lease->id);
      }
      return granted.status();
    }
    record_lease = *granted;
  }

  // One Txn, guarded by the grant's create revision (the owner check, as in Release). Keeping
  // re-Puts the key under the keep lease: a Put on an existing key keeps its create revision,
  // so the holder and the fencing token stay, and nothing renews the new lease; the value's
  // token gains kKeptTokenSuffix (Holders shows the grant kept). The key then leaves the shared
  // lease, which stays for the handle's other grants.
  const std::string& etcd_key = held->etcd_key;
  const std::string record_key = RecordKey(options_.prefix, request.key);
  pb::TxnRequest txn;
  CompareCreateRevision(&txn, etcd_key, held->create_revision);
  if (keep_lease) {
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(etcd_key);
    put->set_value(EncodeValue({request.owner_token + std::string(kKeptTokenSuffix),
                                keep_lease->ttl_seconds * 1000, held->holder}));
    put->set_lease(keep_lease->id);
  } else {
    txn.add_success()->mutable_request_delete_range()->set_key(etcd_key);
  }
  if (record_lease) {
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(record_key);
    put->set_value(*request.record);
    put->set_lease(record_lease->id);
  }
  // On failure: what is there now, to recognise an earlier attempt of this very Txn that was
  // applied before its reply was lost (Call moved on to another member).
  txn.add_failure()->mutable_request_range()->set_key(etcd_key);
  txn.add_failure()->mutable_request_range()->set_key(record_key);
  pb::TxnResponse txn_resp;
  Status s = impl.client.Txn("Txn (finish)", txn, &txn_resp);
  if (!s.ok()) {
    // Unknown outcome. The new leases are left to expire by themselves (at most keep and
    // record_ttl): if the Txn was applied they carry the kept grant and the record, and a
    // revoke would undo them. The grant stays known for a retry, as in Release.
    return s;
  }
  bool applied = txn_resp.succeeded();
  if (!applied && txn_resp.responses_size() == 2) {
    const auto& grant_kvs = txn_resp.responses(0).response_range().kvs();
    const auto& record_kvs = txn_resp.responses(1).response_range().kvs();
    applied = keep_lease ? !grant_kvs.empty() && grant_kvs[0].lease() == keep_lease->id
                         : !record_kvs.empty() && record_kvs[0].lease() == record_lease->id;
  }
  impl.DropHeld(request.key, request.owner_token,
                held->create_revision);  // off the shared lease either way
  if (!applied) {
    for (const auto& fresh : {keep_lease, record_lease}) {
      if (fresh) {
        impl.client.RevokeInBackground(fresh->id);
      }
    }
    return Status::Lost(
        fmt::format("{} was no longer ours (expired, force-released or taken over)", request.key),
        LostCause::kSessionLost);
  }
  return Status();
}

namespace {

// `key` for a message: NUL bytes (the fair queue's separators) shown as "\0".
std::string Printable(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '\0') {
      out += "\\0";
    } else {
      out += c;
    }
  }
  return out;
}

// Refuses the data keys a fenced write may not touch, before anything is sent:
//   - the store's own keys: "<prefix>/..." (grants, records) and "<prefix>\0..." (the fair
//     queue). A Put or Delete there could forge or delete a grant, someone else's included;
//   - a key put twice, or both put and deleted: etcd refuses such a Txn as a whole ("duplicate
//     key given in txn request"), so it is refused here with a message that says what to merge.
//     Deleting one key twice is fine (the second delete counts 0, as in order).
Status CheckDataKeys(std::string_view prefix, const std::vector<FencedOp>& ops) {
  const std::string grants = fmt::format("{}/", prefix);
  std::string queue(prefix);
  queue += '\0';
  std::set<std::string_view> put;
  std::set<std::string_view> deleted;
  for (const FencedOp& op : ops) {
    const std::string_view key = op.key;
    if (key.starts_with(grants) || key.starts_with(queue)) {
      return Status::InvalidArgument(fmt::format(
          "data key '{}' is one of the etcd store's own keys ('{}...' holds its grants and "
          "records, '{}\\0...' its fair queue): a fenced write does not touch them",
          Printable(key), grants, prefix));
    }
    const bool is_put = op.kind == FencedOp::Kind::kPut;
    if (put.contains(key) || (is_put && deleted.contains(key))) {
      return Status::InvalidArgument(fmt::format(
          "a fenced write on etcd puts key '{}' twice or both puts and deletes it, which an etcd "
          "Txn refuses: merge the ops on that key into one",
          Printable(key)));
    }
    (is_put ? put : deleted).insert(key);
  }
  return Status();
}

}  // namespace

Result<std::vector<std::int64_t>> EtcdBackend::FencedWrite(const FencedWriteRequest& request) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, request.key);
  // The grant's own key: the base, or one slot's key of a shared or semaphore grant.
  const std::string etcd_key = request.store_key.empty() ? base : request.store_key;
  if (!etcd_key.starts_with(base) ||
      ParseKey(std::string_view(etcd_key).substr(base.size())).kind != KeyKind::kGrant) {
    return Status::InvalidArgument(fmt::format(
        "store key '{}' is not this store's key of a grant of lease {} ('{}' or '{}\\0...'): a "
        "lease of another etcd store or prefix",
        Printable(request.store_key), request.key, base, base));
  }
  // create_revision == 0 would mean "the grant key is absent": never a fence.
  if (request.fencing_token == 0 ||
      request.fencing_token > static_cast<FencingToken>(std::numeric_limits<int64_t>::max())) {
    return Status::InvalidArgument(fmt::format(
        "fencing token {} is not an etcd create revision (1..INT64_MAX)", request.fencing_token));
  }
  LH_RETURN_IF_ERROR(CheckDataKeys(options_.prefix, request.ops));

  // One Txn: the compare is the grant's identity (a create revision belongs to one creation of
  // the key: it fails once the grant is deleted, expired or re-created by a newer holder, whose
  // revision is higher), the success branch is the ops in order, the failure branch reads the
  // grant key to name whoever holds it now. Puts carry no lease: the data outlives the grant.
  pb::TxnRequest txn;
  if (!request.skip_guard_for_testing) {
    CompareCreateRevision(&txn, etcd_key, static_cast<int64_t>(request.fencing_token));
  }
  for (const FencedOp& op : request.ops) {
    if (op.kind == FencedOp::Kind::kPut) {
      pb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
    } else if (op.kind == FencedOp::Kind::kDelete) {
      txn.add_success()->mutable_request_delete_range()->set_key(op.key);
    } else {
      return Status::Unimplemented(
          fmt::format("the etcd store has no fenced {} op", FencedOpKindName(op.kind)));
    }
  }
  txn.add_failure()->mutable_request_range()->set_key(etcd_key);
  pb::TxnResponse resp;
  // Sent once: a fenced write retried on another member after no answer could apply twice.
  Status s = impl.client.TxnOnce("Txn (fenced write)", txn, &resp);
  // etcd's refusal of a key the user's roles do not cover ("etcdserver: permission denied"; an
  // auth failure, such as a changed password, keeps its own message).
  if (s.code() == StatusCode::kPermissionDenied &&
      s.detail().find("etcdserver: permission denied") != std::string_view::npos) {
    std::string keys;
    for (std::size_t i = 0; i < request.ops.size() && i < 3; ++i) {
      keys += fmt::format("{}'{}'", i > 0 ? ", " : "", Printable(request.ops[i].key));
    }
    if (request.ops.size() > 3) {
      keys += fmt::format(" and {} more", request.ops.size() - 3);
    }
    return Status::PermissionDenied(
        fmt::format("etcd refused the fenced write of lease {}: permission denied for user '{}', "
                    "who needs read access to the grant key '{}' and write access to the data "
                    "keys {}",
                    request.key, options_.user.value_or("(none)"), etcd_key, keys),
        std::string(s.detail()));
  }
  LH_RETURN_IF_ERROR(s);
  if (resp.succeeded()) {
    if (resp.responses_size() != static_cast<int>(request.ops.size())) {
      return Status::Internal(fmt::format("etcd answered a fenced write of {} ops with {} replies",
                                          request.ops.size(), resp.responses_size()));
    }
    std::vector<std::int64_t> affected;
    affected.reserve(request.ops.size());
    for (int i = 0; i < resp.responses_size(); ++i) {
      affected.push_back(request.ops[static_cast<std::size_t>(i)].kind == FencedOp::Kind::kPut
                             ? 1
                             : resp.responses(i).response_delete_range().deleted());
    }
    return affected;
  }
  const pb::RangeResponse* range =
      resp.responses_size() > 0 && resp.responses(0).has_response_range()
          ? &resp.responses(0).response_range()
          : nullptr;
  if (range == nullptr || range->kvs_size() == 0) {
    return FencedOut(request.key, request.fencing_token, "is no longer held: expired or released");
  }
  const mvccpb::KeyValue& kv = range->kvs(0);
  std::optional<GrantValue> value = DecodeValue(kv.value());
  return FencedOut(request.key, request.fencing_token,
                   fmt::format("is now held by {} under fencing token {}",
                               value && !value->holder.empty() ? value->holder
                                                               : std::string("an unknown holder"),
                               kv.create_revision()));
}

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

namespace {

// Remaining TTLs of etcd leases, read once per lease in one call of Inspect/Holders/List (the
// grants of a handle share one lease).
using LeaseTtls = std::map<int64_t, int64_t>;

// Reads a grant key (and its lease's remaining time) into a LeaseInfo; nullopt if the key is
// not a grant of leasehold's or its lease already expired (etcd deletes such keys a moment
// later).
Result<std::optional<LeaseInfo>> ToInfo(EtcdClient& client, std::string_view key,
                                        const mvccpb::KeyValue& kv, const KeyKind& kind,
                                        LeaseTtls& ttls) {
  if (kind.kind != KeyKind::kGrant || kv.lease() == 0) {
    return std::optional<LeaseInfo>();  // an intent, or not a leasehold grant
  }
  LeaseInfo info = InfoOf(key, kv, kind);
  auto it = ttls.find(kv.lease());
  if (it == ttls.end()) {
    pb::LeaseTimeToLiveRequest req;
    req.set_id(kv.lease());
    pb::LeaseTimeToLiveResponse resp;
    LH_RETURN_IF_ERROR(client.LeaseTimeToLive("LeaseTimeToLive", req, &resp));
    it = ttls.emplace(kv.lease(), resp.ttl()).first;
  }
  if (it->second < 0) {
    return std::optional<LeaseInfo>();
  }
  // etcd counts a lease's time left in whole seconds, cut down: up to a second more is left.
  // The bound is capped at the TTL the lease was granted with (whole seconds, rounded up).
  Duration left = std::chrono::seconds(it->second + 1);
  if (info.ttl > Duration::zero()) {
    left = std::min<Duration>(left, std::chrono::ceil<std::chrono::seconds>(info.ttl));
  }
  info.remaining = std::chrono::duration_cast<std::chrono::milliseconds>(left);
  info.remaining_is_upper_bound = true;
  return std::optional<LeaseInfo>(std::move(info));
}

}  // namespace

namespace {

// "http://127.0.0.1:2379/" -> "127.0.0.1:2379": a member's client URL as an endpoint of ours.
std::string EndpointOfUrl(std::string_view url) {
  for (std::string_view scheme : {"http://", "https://", "unix://", "unixs://"}) {
    if (url.starts_with(scheme)) {
      url.remove_prefix(scheme.size());
      break;
    }
  }
  while (url.ends_with('/')) {
    url.remove_suffix(1);
  }
  return std::string(url);
}

std::string MemberIdHex(uint64_t id) {
  return fmt::format("{:x}", id);
}

// No member answered: Diagnose reports that as its error (the check says "unreachable").
bool IsUnavailableOrTimeout(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

}  // namespace

Status EtcdBackend::Ping() {
  pb::RangeRequest req;
  std::string key = KeyName(options_.prefix, "");
  key += '\0';
  key += "ping";
  req.set_key(std::move(key));
  req.set_keys_only(true);
  pb::RangeResponse resp;
  return impl_->client.Range("Range (missing key)", req, &resp);
}

Result<Diagnosis> EtcdBackend::Diagnose() {
  EtcdClient& client = impl_->client;
  Diagnosis d{.probe = "Range (missing key)", .ttl_granularity = std::chrono::seconds(1)};
  const std::string range = fmt::format("{}/", options_.prefix);
  // fair=true also writes "<prefix>\0queue/...", which no etcdctl argument can name (NUL):
  // the permission then goes on the bare prefix.
  d.permissions_fix =
      fmt::format("etcdctl role grant-permission <role of {}> --prefix=true readwrite {}",
                  options_.user ? *options_.user : std::string("the user"),
                  options_.fair ? options_.prefix : range);

  pb::MemberListRequest members_req;
  pb::MemberListResponse members;
  Status listed = client.MemberList("Cluster MemberList", members_req, &members);
  if (IsUnavailableOrTimeout(listed)) {
    return listed;
  }

  d.items.push_back(
      {.area = "durability",
       .found = "etcd persists revisions in its raft log and snapshots: fencing tokens (create "
                "revisions) only grow, across restarts"});

  // The shortest TTL: ask for 1 s and read what etcd grants (its minimum, 2 s with 3.4's
  // defaults), then revoke the lease. A grant whose reply was lost is not revoked: it has no
  // keys and lapses by itself within its few seconds.
  pb::LeaseGrantRequest grant_req;
  grant_req.set_ttl(1);
  pb::LeaseGrantResponse grant;
  Status granted = client.LeaseGrant("LeaseGrant (1 s)", grant_req, &grant);
  if (granted.ok() && grant.error().empty()) {
    client.RevokeInBackground(grant.id());
    d.shortest_ttl = std::chrono::seconds(grant.ttl());
    d.items.push_back(
        {.area = "session",
         .found = fmt::format("etcd counts lease TTLs in whole seconds and grants at least {} s "
                              "(a LeaseGrant of 1 s got {} s): a --ttl is rounded up to them",
                              grant.ttl(), grant.ttl())});
  } else {
    d.items.push_back(
        {.area = "session",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("etcd's shortest lease TTL could not be learnt (a LeaseGrant of "
                              "1 s failed: {})",
                              granted.ok() ? grant.error() : granted.ToString()),
         .fix = "etcd grants at least 2 s with its default settings; ask for that or more"});
  }

  if (!listed.ok()) {
    d.items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("the members could not be listed: {}", listed.ToString()),
         .fix = "grant the user Cluster MemberList, or check the cluster with etcdctl member "
                "list"});
  } else {
    const int n = members.members_size();
    int learners = 0;
    std::set<std::string> client_endpoints;
    for (const pb::Member& m : members.members()) {
      learners += m.islearner() ? 1 : 0;
      for (const std::string& url : m.clienturls()) {
        client_endpoints.insert(EndpointOfUrl(url));
      }
    }
    const int voters = n - learners;
    std::string count = fmt::format("{} member{}{}", n, n == 1 ? "" : "s",
                                    learners > 0 ? fmt::format(" ({} learners)", learners) : "");
    if (voters <= 1) {
      d.items.push_back({.area = "topology",
                         .verdict = CheckVerdict::kWarn,
                         .found = count + ": no fault tolerance (one member down stops every "
                                          "lease's renewal)",
                         .fix = "run 3 or 5 members for a store leases depend on"});
    } else if (voters % 2 == 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("{}: an even member count tolerates no more failures than one "
                                "fewer ({} of {})",
                                count, (voters - 1) / 2, voters),
           .fix = fmt::format("run {} or {} members", voters - 1, voters + 1)});
    } else {
      d.items.push_back({.area = "topology",
                         .found = fmt::format("{}: tolerates {} failed", count, (voters - 1) / 2)});
    }

    // Do the URL's endpoints reach the members? A call fails over only to the endpoints it has.
    std::vector<std::string> strangers;
    int covered = 0;
    for (const std::string& e : options_.endpoints) {
      if (client_endpoints.contains(e)) {
        ++covered;
      } else {
        strangers.push_back(e);
      }
    }
    const int quorum = voters / 2 + 1;
    if (!strangers.empty()) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found =
               fmt::format("the URL's endpoint{} {} {} not among the members' client URLs "
                           "({})",
                           strangers.size() == 1 ? "" : "s", fmt::join(strangers, ","),
                           strangers.size() == 1 ? "is" : "are", fmt::join(client_endpoints, ",")),
           .fix = "name the members' advertised client URLs in the store URL (a proxy or an "
                  "alias is fine if it reaches them): fail-over needs them"});
    }
    if (covered < quorum && voters > 1) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("the URL names {} of the {} members, fewer than a quorum ({})",
                                covered, voters, quorum),
           .fix = fmt::format("list every member in the URL ({}): fail-over needs them",
                              fmt::join(client_endpoints, ","))});
    } else if (strangers.empty()) {
      d.items.push_back({.area = "topology",
                         .found = fmt::format("the URL names {} of the {} members", covered, n)});
    }
  }

  pb::StatusRequest status_req;
  pb::StatusResponse status;
  std::size_t used = client.current();
  Status statused = client.MaintenanceStatus("Maintenance Status", status_req, &status, &used);
  if (IsUnavailableOrTimeout(statused)) {
    return statused;
  }
  if (!statused.ok()) {
    d.items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("the member's status could not be read: {}", statused.ToString()),
         .fix = "grant the user Maintenance Status, or check the leader with etcdctl endpoint "
                "status"});
  } else {
    const std::string& address = client.endpoint(used).address;
    if (status.leader() == 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kUnreachable,
           .found = fmt::format("member {} (etcd {}) knows no leader (raft term {}): no lease can "
                                "be granted or renewed",
                                address, status.version(), status.raftterm()),
           .fix = "restore a quorum of members (etcdctl endpoint status --cluster)"});
    } else {
      d.items.push_back(
          {.area = "topology",
           .found = fmt::format(
               "member {} (etcd {}{}): leader {}, raft term {}", address, status.version(),
               status.leader() == status.header().member_id() ? ", the leader" : "",
               MemberIdHex(status.leader()), status.raftterm())});
    }
    if (status.errors_size() > 0) {
      d.items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kUnsafe,
           .found = fmt::format("member {} reports: {}", address, fmt::join(status.errors(), "; ")),
           .fix = "clear the alarm (etcdctl alarm list; a NOSPACE alarm refuses every write)"});
    }
  }

  d.items.push_back(
      {.area = "permissions",
       .found = options_.user
                    ? fmt::format("auth: user {}; the cycle exercises its permissions on {}",
                                  *options_.user, range)
                    : std::string("auth: no user (the cluster answers calls without one)")});
  return d;
}

Result<std::vector<LeaseInfo>> EtcdBackend::Holders(std::string_view key) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, key);
  pb::RangeRequest req;
  req.set_key(base);
  req.set_range_end(KeysEnd(base));
  pb::RangeResponse resp;
  LH_RETURN_IF_ERROR(impl.client.Range("Range", req, &resp));
  std::vector<LeaseInfo> out;
  LeaseTtls ttls;
  const mvccpb::KeyValue* intent = nullptr;
  // etcd answers in key order: the base first, then the slots in order.
  for (const mvccpb::KeyValue& kv : resp.kvs()) {
    const KeyKind kind = ParseKey(std::string_view(kv.key()).substr(base.size()));
    if (kind.kind == KeyKind::kIntent) {
      intent = &kv;
      continue;
    }
    LH_ASSIGN_OR_RETURN(std::optional<LeaseInfo> info, ToInfo(impl.client, key, kv, kind, ttls));
    if (info) {
      out.push_back(std::move(*info));
    }
  }
  // The writer intent, last: on its waiter's own lease, so it lives while that lease does.
  if (intent != nullptr) {
    LH_ASSIGN_OR_RETURN(
        std::optional<LeaseInfo> writer,
        ToInfo(impl.client, key, *intent,
               KeyKind{.kind = KeyKind::kGrant, .mode = LeaseMode::kExclusive}, ttls));
    if (writer) {
      writer->fencing_token = 0;
      writer->token_prefix.clear();
      writer->kept = false;
      writer->waiting_writer = true;
      out.push_back(std::move(*writer));
    }
  }
  return out;
}

Result<std::vector<LeaseInfo>> EtcdBackend::List(std::string_view prefix) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, "");
  pb::RangeRequest req;
  req.set_key(base + std::string(prefix));
  req.set_range_end(PrefixEnd(req.key()));
  if (prefix.empty()) {
    // From the first byte a lease name can start with: records ("<prefix>/\0record/...") sort
    // before every lease and are left out.
    req.set_key(base + std::string(1, '\x01'));
  }
  req.set_sort_order(pb::RangeRequest::ASCEND);
  req.set_sort_target(pb::RangeRequest::KEY);
  pb::RangeResponse resp;
  LH_RETURN_IF_ERROR(impl.client.Range("Range (list)", req, &resp));
  std::vector<LeaseInfo> out;
  LeaseTtls ttls;
  // Key order is lease order, then slot order: a lease's keys are its name, then a NUL (the
  // smallest byte) and the slot.
  for (const mvccpb::KeyValue& kv : resp.kvs()) {
    std::string_view rest = std::string_view(kv.key()).substr(base.size());
    const std::string_view name = rest.substr(0, rest.find('\0'));
    const KeyKind kind = ParseKey(rest.substr(name.size()));
    LH_ASSIGN_OR_RETURN(std::optional<LeaseInfo> info, ToInfo(impl.client, name, kv, kind, ttls));
    if (info) {
      out.push_back(std::move(*info));
    }
  }
  return out;
}

namespace {

// A holder of an older leasehold gives every grant an etcd lease of its own and learns of a
// force-release only from its keep-alive (TTL <= 0): deleting the key alone would leave it
// renewing, and believing it holds the key, while someone else takes it (a rollout runs old
// and new side by side). So revoke the grant's lease too when the deleted key was the only one
// on it: that is always the case for an old holder, and for a shared lease of ours it ends only
// a lease with no grant left (its holder grants a new one when it needs it; a grant put on it
// in between is lost by its holder's next round, as after any revoke). Best effort: the key is
// already deleted, which is what a new holder's renewal checks.
void RevokeIfEmpty(EtcdClient& client, int64_t lease_id) {
  if (lease_id == 0) {
    return;
  }
  pb::LeaseTimeToLiveRequest ttl_req;
  ttl_req.set_id(lease_id);
  ttl_req.set_keys(true);
  pb::LeaseTimeToLiveResponse ttl_resp;
  if (client.LeaseTimeToLive("LeaseTimeToLive (force release)", ttl_req, &ttl_resp).ok() &&
      ttl_resp.ttl() > 0 && ttl_resp.keys_size() == 0) {
    pb::LeaseRevokeRequest revoke;
    revoke.set_id(lease_id);
    pb::LeaseRevokeResponse revoke_resp;
    (void)client.LeaseRevoke("LeaseRevoke (force release)", revoke, &revoke_resp);
  }
}

}  // namespace

Result<bool> EtcdBackend::ForceEnd(std::string_view key, std::string_view token_prefix) {
  return token_prefix.empty() ? ForceReleaseAll(key) : ForceReleaseOne(key, token_prefix);
}

Result<bool> EtcdBackend::ForceReleaseAll(std::string_view key) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, key);
  // One Txn deleting every grant of the key (the base and both slot ranges; the writer intent
  // is left to expire), never a lease: a lease is shared by the holder's other grants, which a
  // revoke would take with it. Each holder's next renewal round finds its key gone (its
  // compare fails) and loses that grant alone.
  pb::TxnRequest txn;
  for (const std::string& from :
       {base, Suffixed(base, kSharedTag), Suffixed(base, kSemaphoreTag)}) {
    pb::DeleteRangeRequest* del = txn.add_success()->mutable_request_delete_range();
    del->set_key(from);
    if (from != base) {
      del->set_range_end(PrefixEnd(from));
    }
    del->set_prev_kv(true);
  }
  pb::TxnResponse txn_resp;
  LH_RETURN_IF_ERROR(impl.client.Txn("Txn (force release)", txn, &txn_resp));
  std::set<int64_t> leases;
  for (const pb::ResponseOp& op : txn_resp.responses()) {
    for (const mvccpb::KeyValue& kv : op.response_delete_range().prev_kvs()) {
      leases.insert(kv.lease());
    }
  }
  for (int64_t id : leases) {
    RevokeIfEmpty(impl.client, id);
  }
  return !leases.empty();
}

Result<bool> EtcdBackend::ForceReleaseOne(std::string_view key, std::string_view token_prefix) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, key);
  pb::RangeRequest range;
  range.set_key(base);
  range.set_range_end(KeysEnd(base));
  pb::RangeResponse range_resp;
  LH_RETURN_IF_ERROR(impl.client.Range("Range", range, &range_resp));
  for (const mvccpb::KeyValue& kv : range_resp.kvs()) {
    if (ParseKey(std::string_view(kv.key()).substr(base.size())).kind != KeyKind::kGrant) {
      continue;
    }
    std::optional<GrantValue> value = DecodeValue(kv.value());
    if (!value || token_prefix.empty() || !value->token.starts_with(token_prefix)) {
      continue;
    }
    // That very grant only: the delete compares its create revision, so a grant that took the
    // slot since the read is never deleted.
    pb::TxnRequest txn;
    CompareCreateRevision(&txn, kv.key(), kv.create_revision());
    txn.add_success()->mutable_request_delete_range()->set_key(kv.key());
    pb::TxnResponse txn_resp;
    LH_RETURN_IF_ERROR(impl.client.Txn("Txn (force release grant)", txn, &txn_resp));
    if (!txn_resp.succeeded()) {
      return false;
    }
    RevokeIfEmpty(impl.client, kv.lease());
    return true;
  }
  return false;
}

namespace {

// Watches `ranges` (key, range_end; empty range_end: one key) for deletes from `start_revision`
// on the member `index`, until one happens (OK), `slice_end` (OK: a spurious wake-up, the
// caller re-checks), `deadline` (kDeadlineExceeded) or `stop` (kCancelled).
Status WatchForDeletes(EtcdClient& client, Clock& clock, std::size_t index,
                       const std::vector<std::pair<std::string, std::string>>& ranges,
                       int64_t start_revision, SteadyTime slice_end, SteadyTime deadline,
                       std::stop_token stop, std::string_view what) {
  // `deadline` and `slice_end` are on the backend's clock (the core's deadline, a queue entry's
  // refresh time): so is every reading they are compared with.
  const SteadyTime now = clock.Now();
  const Duration left = std::min(slice_end, deadline) - now;
  if (now >= deadline) {
    return Status::DeadlineExceeded(fmt::format("wait for {} ran out", what));
  }
  if (stop.stop_requested()) {
    return Status::Cancelled(fmt::format("wait for {} cancelled", what));
  }
  if (left <= Duration::zero()) {
    return Status();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(std::min(left, kMaxWatchSlice)));
  client.AddToken(ctx);
  std::stop_callback cancel(stop, [&ctx] { ctx.TryCancel(); });
  client.counters().watch_streams.fetch_add(1, std::memory_order_relaxed);
  auto stream = client.endpoint(index).watch->Watch(&ctx);
  bool written = true;
  for (const auto& [key, range_end] : ranges) {
    pb::WatchRequest req;
    pb::WatchCreateRequest* create = req.mutable_create_request();
    create->set_key(key);
    create->set_range_end(range_end);
    // Everything after the revision we read: a delete between the read and now is replayed.
    create->set_start_revision(start_revision);
    create->add_filters(pb::WatchCreateRequest::NOPUT);
    written = written && stream->Write(req);
  }
  bool woken = false;
  if (written) {
    pb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (resp.events_size() > 0 || resp.canceled()) {
        woken = true;  // deleted (released, expired, revoked), or the watch ended: re-check
        break;
      }
    }
  }
  if (woken) {
    ctx.TryCancel();
  }
  grpc::Status final_status = stream->Finish();
  if (woken) {
    return Status();
  }
  if (stop.stop_requested()) {
    return Status::Cancelled(fmt::format("wait for {} cancelled", what));
  }
  if (clock.Now() >= deadline) {
    return Status::DeadlineExceeded(fmt::format("wait for {} ran out", what));
  }
  if (IsUnreachable(final_status)) {
    client.MoveOn(index);
  }
  return Status();  // the stream ended early, or the slice ran out: the caller re-checks
}

}  // namespace

Status EtcdBackend::WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, key);
  pb::RangeRequest range;
  range.set_key(base);
  range.set_range_end(KeysEnd(base));
  range.set_keys_only(true);
  pb::RangeResponse range_resp;
  std::size_t index = 0;
  LH_RETURN_IF_ERROR(impl.client.Range("Range (wait)", range, &range_resp, &index));
  if (range_resp.kvs_size() == 0) {
    return Status();  // free already
  }
  // Any delete of the lease's keys: a grant released, expired or force-released, or the
  // writer intent gone.
  return WatchForDeletes(impl.client, clock_, index, {{base, KeysEnd(base)}},
                         range_resp.header().revision() + 1, SteadyTime::max(), deadline,
                         std::move(stop), key);
}

Status EtcdBackend::WaitForTurn(std::string_view key, std::string_view waiter_id,
                                SteadyTime deadline, std::stop_token stop) {
  Impl& impl = *impl_;
  const std::string base = KeyName(options_.prefix, key);
  const std::string queue = EtcdWaitQueue::Prefix(options_.prefix, key);
  std::vector<std::pair<std::string, std::string>> ranges = {{base, KeysEnd(base)}};
  if (options_.fair) {
    ranges.emplace_back(queue, PrefixEnd(queue));
  }
  const SteadyTime refresh = options_.fair ? impl.queue.RefreshDue(waiter_id) : SteadyTime::max();
  if (std::optional<int64_t> refused = impl.Refused(waiter_id, key)) {
    // Our last attempt was refused on the snapshot at `refused`: only a delete since (a grant
    // ended, an intent or a queue entry ahead gone) can let us in, and the watch replays every
    // delete from the next revision on. No read first, so none is missed in between.
    return WatchForDeletes(impl.client, clock_, impl.client.current(), ranges, *refused + 1,
                           refresh, deadline, std::move(stop), key);
  }
  if (!options_.fair) {
    return WaitForChange(key, deadline, std::move(stop));
  }
  const std::string me = queue + std::string(waiter_id);
  // One read-only Txn: the grants, and the head of the queue (lowest create revision).
  pb::TxnRequest txn;
  pb::RangeRequest* grant = txn.add_success()->mutable_request_range();
  grant->set_key(base);
  grant->set_range_end(KeysEnd(base));
  grant->set_keys_only(true);
  pb::RangeRequest* head = txn.add_success()->mutable_request_range();
  head->set_key(queue);
  head->set_range_end(PrefixEnd(queue));
  head->set_sort_order(pb::RangeRequest::ASCEND);
  head->set_sort_target(pb::RangeRequest::CREATE);
  head->set_limit(1);
  head->set_keys_only(true);
  pb::TxnResponse resp;
  std::size_t index = 0;
  LH_RETURN_IF_ERROR(impl.client.Txn("Txn (queue read)", txn, &resp, &index));
  if (resp.responses_size() != 2) {
    return Status::Internal("etcd answered a two-range Txn with a different number of replies");
  }
  const auto& grant_kvs = resp.responses(0).response_range().kvs();
  const auto& head_kvs = resp.responses(1).response_range().kvs();
  if (grant_kvs.empty() && (head_kvs.empty() || head_kvs[0].key() == me)) {
    return Status();  // free, and our turn
  }
  // Wake on a grant's delete or any queue entry's delete (a waiter ahead took the key, left,
  // or died). Come back in time for the caller's next attempt to refresh our entry.
  return WatchForDeletes(impl.client, clock_, index, ranges, resp.header().revision() + 1, refresh,
                         deadline, std::move(stop), key);
}

void EtcdBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  // The queue entry (fair=true) or the writer intent (fair=false) goes with its lease.
  impl_->queue.Dequeue(key, waiter_id);
  impl_->ClearRefused(waiter_id);
}

}  // namespace leasehold::internal
