// File: backends/etcd/etcd_backend.cc (internal)
//
// The etcd:// store's grant core: opening, renewal, the ends of grants, listing and
// force-release; the acquire is in etcd_acquire.cc, the facets in etcd_records.cc,
// etcd_wait.cc, etcd_fenced_write.cc and etcd_doctor.cc, what they share in etcd_impl.h.
// Each method is a few etcd calls. The parts it is built of have files of their own: the channels,
// failover, auth and call helpers (etcd_client.h), the keep-alive stream (etcd_keepalive.h), the
// spare leases (etcd_spare_leases.h) and the fair queue (etcd_wait_queue.h). See etcd_backend.h for
// the design; the comments here explain the invariants.
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
#include "backends/etcd/etcd_impl.h"
#include "backends/etcd/etcd_keepalive.h"
#include "backends/etcd/etcd_spare_leases.h"
#include "backends/etcd/etcd_value.h"
#include "backends/etcd/etcd_wait_queue.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

using namespace std::chrono_literals;

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

}  // namespace leasehold::internal
