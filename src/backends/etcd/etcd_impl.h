// File: backends/etcd/etcd_impl.h (internal)
//
// What the etcd:// store's files share: its key layout (the shared and semaphore key names and
// their parsing), the grants a handle holds, EtcdBackend::Impl (the client, the keep-alive
// stream, the spare leases, the wait queue and the table of grants) and the reading of a key's
// Range. Only the etcd_*.cc files include it.

#pragma once

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

#include "backends/common/admission.h"
#include "backends/common/time.h"
#include "backends/etcd/etcd_client.h"
#include "backends/etcd/etcd_keepalive.h"
#include "backends/etcd/etcd_spare_leases.h"
#include "backends/etcd/etcd_value.h"
#include "backends/etcd/etcd_wait_queue.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

namespace pb = etcdserverpb;

// Shortest life of a queue entry (fair=true) without its waiter's attempts.
inline constexpr int64_t kMinQueueTtlSeconds = 10;

// Long waits are cut into pieces no longer than this (a gRPC deadline far in the future is
// pointless, and the core calls again anyway).
inline constexpr Duration kMaxWatchSlice = std::chrono::hours(1);

// Where the record of `key` lives (Backend::ReadRecord): "<prefix>/\0record/<key>", on an etcd
// lease of its own. Inside "<prefix>/", so a user with read-write on that prefix can write it,
// yet never a lease's key (lease names are 1..512 bytes without NUL, so no lease name starts
// with NUL): Inspect never finds it, and List starts its range past it. No grant's revoke or
// expiry touches it.
inline std::string RecordKey(std::string_view prefix, std::string_view key) {
  std::string r = fmt::format("{}/", prefix);
  r += '\0';
  r += "record/";
  r += key;
  return r;
}

// An etcd lease TTL for `ttl`: whole seconds, rounded up (etcd raises small TTLs to its minimum,
// 2 s for 3.4's defaults, and says so in the grant's reply).
inline int64_t LeaseSeconds(Duration ttl) {
  return std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(ttl).count());
}

inline std::string TokenPrefixOf(std::string_view token) {
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
inline constexpr std::string_view kSharedTag = "s/";
inline constexpr std::string_view kSemaphoreTag = "n/";
inline constexpr std::string_view kIntentTag = "w";

inline std::string Suffixed(std::string_view base, std::string_view suffix) {
  std::string k(base);
  k += '\0';
  k += suffix;
  return k;
}

// The end of the range of every key of the lease whose base is `base`.
inline std::string KeysEnd(std::string_view base) {
  std::string k(base);
  k += '\x01';
  return k;
}

inline std::string SharedKey(std::string_view base, std::uint32_t slot) {
  return Suffixed(base, fmt::format("{}{:04}", kSharedTag, slot));
}

inline std::string SemaphorePrefix(std::string_view base, std::uint32_t limit) {
  return Suffixed(base, fmt::format("{}{:04}/", kSemaphoreTag, limit));
}

inline std::string SemaphoreKey(std::string_view base, std::uint32_t limit, std::uint32_t slot) {
  return SemaphorePrefix(base, limit) + fmt::format("{:04}", slot);
}

// The key of a grant of `mode`/`limit` in `slot`.
inline std::string GrantKey(std::string_view base, LeaseMode mode, std::uint32_t limit,
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

inline bool ParseDigits(std::string_view digits, std::uint32_t* out) {
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
inline KeyKind ParseKey(std::string_view suffix) {
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
inline constexpr std::uint32_t kLowerSlotCompares = 100;

// Acquire Txns per TryAcquire: a slot taken between the read and the Txn, or a writer intent
// to record, costs one more; each is one atomic Txn, so a race only fails one, never
// over-admits.
inline constexpr int kAdmissionTries = 6;

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
inline std::string HeldId(std::string_view key, std::string_view token) {
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
inline constexpr std::size_t kSweepPerRound = 16;

// Keys checked per renewal Txn: etcd's --max-txn-ops (default 128) bounds a Txn's compares and
// each branch's ops.
inline constexpr std::size_t kKeysPerCheck = 128;

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

// Deletes `orphan`'s key if its value is still exactly the orphan's (the owner token in it is
// unique to that acquire call). Returns OK once etcd answered (deleted or not there).
inline Status DeleteOrphan(EtcdClient& client, const Orphan& orphan) {
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

// Adds the compare "every key in [key, range_end) has create_revision `result` `revision`" (no
// key at all: compared as one with revision 0).
inline void CompareRange(pb::TxnRequest* txn, const std::string& key, const std::string& range_end,
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
};

inline KeySnapshot Snapshot(std::string_view base, const pb::RangeResponse& range) {
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
    }
  }
  return snap;
}

// The admission rule for `request` with the snapshot's grants ahead, in key order, and its
// writer intent.
inline Admission AdmitBeside(const KeySnapshot& snap, const GrantRequest& request) {
  Ahead ahead;
  for (const KeySnapshot::Held& g : snap.grants) {
    ahead.Add({g.kind.mode, g.kind.limit});
  }
  return ahead.Decide({request.mode, request.limit}, snap.intent != nullptr);
}

// The smallest slot below `limit` that no grant of `mode`/`limit` in `snap` has, or nullopt.
inline std::optional<std::uint32_t> FreeSlot(const KeySnapshot& snap, LeaseMode mode,
                                             std::uint32_t limit, std::uint32_t bound) {
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

inline LeaseInfo InfoOf(std::string_view key, const mvccpb::KeyValue& kv, const KeyKind& kind) {
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

}  // namespace leasehold::internal
