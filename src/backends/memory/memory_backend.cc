#include "backends/memory/memory_backend.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "backends/common/admission.h"
#include "core/duration.h"
#include "core/owner_token.h"
#include "util/mutex.h"

namespace leasehold::internal {

namespace {

// One table of grants, shared by every handle opened with the same name: per key, its live
// grants (one exclusive, several shared, or up to N of a semaphore), and a waiting writer's
// intent (backend.h, "Shared leases"). The reference implementation of the admission rules.
class MemoryTable {
 public:
  explicit MemoryTable(Clock& clock) : clock_(clock) {}

  [[nodiscard]] const Clock* clock() const { return &clock_; }

  Result<Grant> TryAcquire(const GrantRequest& request) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    KeyState& state = keys_[request.key];
    PruneLocked(state, now);
    const bool semaphore = request.limit > 1;
    Ahead ahead;
    for (const Entry& e : state.grants) {
      ahead.Add({e.mode, e.limit});
    }
    const Admission admission = ahead.Decide(
        {request.mode, request.limit}, state.intent.has_value() && state.intent->expires > now);
    if (admission.verdict == Verdict::kMismatch) {
      const Entry& e = state.grants[admission.by];
      return LimitMismatch(request.key, e.mode, e.limit, e.holder, request.mode, request.limit);
    }
    for (const Entry& e : state.grants) {
      // This owner token holds a grant of the key already (a re-sent attempt whose first reply
      // was lost): held, never a second slot.
      if (e.token == request.owner_token) {
        return Status::HeldByAnother(InfoLocked(request.key, e, now));
      }
    }
    if (admission.verdict == Verdict::kWriterWaiting) {
      return Status::HeldByAnother(IntentInfo(request.key, *state.intent, now),
                                   "an exclusive holder is waiting for the key");
    }
    const Entry* blocker =
        admission.verdict == Verdict::kBusy ? &state.grants[admission.by] : nullptr;
    if (blocker != nullptr) {
      Status held = Status::HeldByAnother(InfoLocked(request.key, *blocker, now));
      if (!semaphore && request.mode == LeaseMode::kExclusive && !request.waiter_id.empty() &&
          (!state.intent.has_value() || state.intent->expires <= now ||
           state.intent->waiter_id == request.waiter_id)) {
        state.intent = Intent{request.waiter_id, request.holder, request.ttl, now + request.ttl};
      }
      return held;
    }
    if (state.intent.has_value() && state.intent->waiter_id == request.waiter_id) {
      state.intent.reset();
    }
    std::uint32_t slot = 0;
    while (std::any_of(state.grants.begin(), state.grants.end(),
                       [slot](const Entry& e) { return e.slot == slot; })) {
      ++slot;
    }
    FencingToken fencing = ++fences_[request.key];
    Entry entry{request.owner_token, request.holder, fencing,       now + request.ttl,
                request.ttl,         request.mode,   request.limit, slot};
    state.grants.insert(
        std::upper_bound(state.grants.begin(), state.grants.end(), entry,
                         [](const Entry& a, const Entry& b) { return a.slot < b.slot; }),
        entry);
    return Grant{.fencing_token = fencing, .ttl = request.ttl, .slot = slot};
  }

  Status Renew(const RenewRequest& request) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    Entry* e = FindLocked(request.key, request.owner_token);
    if (e == nullptr || e->expires <= now) {
      return LostLocked(request.key, request.owner_token, now);
    }
    e->expires = now + request.ttl;
    e->ttl = request.ttl;
    return Status();
  }

  Status Release(std::string_view key, std::string_view token) LH_EXCLUDES(mu_) {
    Status result;
    {
      MutexLock lock(&mu_);
      SteadyTime now = clock_.Now();
      Entry* e = FindLocked(key, token);
      if (e == nullptr) {
        return LostLocked(key, token, now);
      }
      if (e->expires <= now) {
        result = Status::Lost(fmt::format("lease {} was lost or stolen: it expired", key));
      }
      EraseLocked(key, e);
      WakeLocked(key);
    }
    return result;
  }

  Status Finish(const FinishRequest& request) LH_EXCLUDES(mu_) {
    LH_RETURN_IF_ERROR(CheckFinishRequest(request));
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    Entry* e = FindLocked(request.key, request.owner_token);
    if (e == nullptr || e->expires <= now) {
      return LostLocked(request.key, request.owner_token, now);
    }
    if (request.record.has_value()) {
      records_[request.key] = Record{*request.record, now + request.record_ttl};
    }
    if (request.keep > Duration::zero()) {
      // No owner sends this token: a renewal already in flight cannot touch the kept grant.
      e->token += kKeptTokenSuffix;
      e->expires = now + request.keep;
      e->ttl = request.keep;
    } else {
      EraseLocked(request.key, e);
      WakeLocked(request.key);
    }
    return Status();
  }

  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request)
      LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const SteadyTime now = clock_.Now();
    Entry* e = FindLocked(request.key, request.owner_token);
    if (!request.skip_guard_for_testing && (e == nullptr || e->expires <= now)) {
      const Entry* other = nullptr;
      if (auto it = keys_.find(request.key); it != keys_.end()) {
        for (const Entry& g : it->second.grants) {
          if (g.expires > now && g.token != request.owner_token &&
              (other == nullptr || g.fencing > other->fencing)) {
            other = &g;
          }
        }
      }
      return FencedOut(request.key, request.fencing_token,
                       other != nullptr ? fmt::format("is now held by {} under fencing token {}",
                                                      other->holder, other->fencing)
                                        : std::string("is no longer held: expired or released"));
    }
    std::vector<std::int64_t> affected;
    for (const FencedOp& op : request.ops) {
      if (op.kind == FencedOp::Kind::kPut) {
        data_[op.key] = op.value;
        affected.push_back(1);
      } else {
        affected.push_back(static_cast<std::int64_t>(data_.erase(op.key)));
      }
    }
    return affected;
  }

  std::optional<std::string> ReadData(std::string_view key) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = data_.find(key);
    return it == data_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }

  Result<std::optional<std::string>> ReadRecord(std::string_view key) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = records_.find(key);
    if (it == records_.end() || it->second.expires <= clock_.Now()) {
      return std::optional<std::string>();
    }
    return std::optional<std::string>(it->second.value);
  }

  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(std::string_view prefix)
      LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const SteadyTime now = clock_.Now();
    std::vector<std::pair<std::string, std::string>> out;
    for (auto it = records_.lower_bound(prefix);
         it != records_.end() && std::string_view(it->first).starts_with(prefix); ++it) {
      if (it->second.expires > now) {
        out.emplace_back(it->first, it->second.value);
      }
    }
    return out;
  }

  Result<std::vector<LeaseInfo>> Holders(std::string_view key) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    std::vector<LeaseInfo> out;
    if (auto it = keys_.find(key); it != keys_.end()) {
      AppendLiveLocked(it->first, it->second, now, out);
      if (const std::optional<Intent>& intent = it->second.intent;
          intent.has_value() && intent->expires > now) {
        out.push_back(IntentInfo(key, *intent, now));
      }
    }
    return out;
  }

  Result<std::vector<LeaseInfo>> List(std::string_view prefix) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    std::vector<LeaseInfo> out;
    for (auto it = keys_.lower_bound(prefix);
         it != keys_.end() && std::string_view(it->first).starts_with(prefix); ++it) {
      AppendLiveLocked(it->first, it->second, now, out);
    }
    return out;
  }

  Result<bool> ForceRelease(std::string_view key, std::string_view token_prefix) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = keys_.find(key);
    if (it == keys_.end()) {
      return false;
    }
    const SteadyTime now = clock_.Now();
    bool live = false;
    bool one_deleted = false;
    // Every grant, or (a token prefix) the one of the lowest slot that has it.
    std::erase_if(it->second.grants, [&](const Entry& e) {
      if (!token_prefix.empty() &&
          (one_deleted || !std::string_view(e.token).starts_with(token_prefix))) {
        return false;
      }
      one_deleted = true;
      live = live || e.expires > now;
      return true;
    });
    if (live || token_prefix.empty()) {
      forced_.insert(std::string(key));
    }
    WakeLocked(key);
    return live;
  }

  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop)
      LH_EXCLUDES(mu_) {
    std::stop_source woken;
    SteadyTime wake_at = deadline;
    {
      MutexLock lock(&mu_);
      const SteadyTime now = clock_.Now();
      auto it = keys_.find(key);
      if (it == keys_.end()) {
        return Status();
      }
      // Without a release a grant ends by itself at its expiry: wake at the first of those.
      std::optional<SteadyTime> first_expiry;
      for (const Entry& e : it->second.grants) {
        if (e.expires > now && (!first_expiry || e.expires < *first_expiry)) {
          first_expiry = e.expires;
        }
      }
      if (!first_expiry.has_value()) {
        return Status();
      }
      wake_at = std::min(deadline, *first_expiry);
      waiters_.emplace(std::string(key), woken);
    }
    std::stop_callback forward(stop, [&woken] { woken.request_stop(); });
    clock_.SleepUntil(wake_at, woken.get_token());
    {
      MutexLock lock(&mu_);
      auto [first, last] = waiters_.equal_range(std::string(key));
      for (auto it = first; it != last; ++it) {
        if (it->second == woken) {
          waiters_.erase(it);
          break;
        }
      }
    }
    if (stop.stop_requested()) {
      return Status::Cancelled("wait cancelled");
    }
    if (clock_.Now() >= deadline) {
      return Status::DeadlineExceeded("wait ran out");
    }
    return Status();
  }

  void AbandonWait(std::string_view key, std::string_view waiter_id) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = keys_.find(key);
    if (it != keys_.end() && it->second.intent.has_value() &&
        it->second.intent->waiter_id == waiter_id) {
      it->second.intent.reset();
      // Readers held off by the intent may go now.
      WakeLocked(key);
    }
  }

 private:
  struct Entry {
    std::string token;
    std::string holder;
    FencingToken fencing = 0;
    SteadyTime expires;
    Duration ttl;
    LeaseMode mode = LeaseMode::kExclusive;
    std::uint32_t limit = 1;
    std::uint32_t slot = 0;
  };

  // A waiting exclusive Acquire that keeps new shared holders out (writer preference).
  struct Intent {
    std::string waiter_id;
    std::string holder;
    Duration ttl;
    SteadyTime expires;
  };

  // A live writer intent as Holders and a refused shared request show it.
  static LeaseInfo IntentInfo(std::string_view key, const Intent& intent, SteadyTime now) {
    return {
        .key = std::string(key),
        .holder = intent.holder,
        .remaining = std::chrono::duration_cast<std::chrono::milliseconds>(intent.expires - now),
        .ttl = std::chrono::duration_cast<std::chrono::milliseconds>(intent.ttl),
        .waiting_writer = true};
  }

  // The grants of one key, ordered by slot, and its writer intent. Expired grants stay until
  // the next acquire of the key prunes them (a late Renew or Release of one still finds it and
  // reports that it expired).
  struct KeyState {
    std::vector<Entry> grants;
    std::optional<Intent> intent;
  };

  struct Record {
    std::string value;
    SteadyTime expires;
  };

  static void PruneLocked(KeyState& state, SteadyTime now) {
    std::erase_if(state.grants, [now](const Entry& e) { return e.expires <= now; });
    if (state.intent.has_value() && state.intent->expires <= now) {
      state.intent.reset();
    }
  }

  Entry* FindLocked(std::string_view key, std::string_view token) LH_REQUIRES(mu_) {
    auto it = keys_.find(key);
    if (it == keys_.end()) {
      return nullptr;
    }
    for (Entry& e : it->second.grants) {
      if (e.token == token) {
        return &e;
      }
    }
    return nullptr;
  }

  void EraseLocked(std::string_view key, const Entry* e) LH_REQUIRES(mu_) {
    auto& grants = keys_.find(key)->second.grants;
    grants.erase(grants.begin() + (e - grants.data()));
  }

  LeaseInfo InfoLocked(const std::string& key, const Entry& e, SteadyTime now) LH_REQUIRES(mu_) {
    return LeaseInfo{
        .key = key,
        .holder = e.holder,
        .token_prefix = TokenPrefix(e.token),
        .fencing_token = e.fencing,
        .remaining = std::chrono::duration_cast<std::chrono::milliseconds>(e.expires - now),
        .ttl = std::chrono::duration_cast<std::chrono::milliseconds>(e.ttl),
        .mode = e.mode,
        .limit = e.limit,
        .slot = e.slot,
        .kept = e.token.ends_with(kKeptTokenSuffix)};
  }

  void AppendLiveLocked(const std::string& key, const KeyState& state, SteadyTime now,
                        std::vector<LeaseInfo>& out) LH_REQUIRES(mu_) {
    for (const Entry& e : state.grants) {
      if (e.expires > now) {
        out.push_back(InfoLocked(key, e, now));
      }
    }
  }

  Status LostLocked(std::string_view key, std::string_view token, SteadyTime now) LH_REQUIRES(mu_) {
    const Entry* mine = FindLocked(key, token);
    if (mine != nullptr) {
      return Status::Lost(fmt::format("lease {} was lost or stolen: it expired", key));
    }
    auto it = keys_.find(key);
    if (it != keys_.end()) {
      for (const Entry& e : it->second.grants) {
        // An exclusive key held by another: ours was taken over. (Among several holders of a
        // shared or semaphore key, another's grant says nothing about ours.)
        if (e.expires > now && e.mode == LeaseMode::kExclusive && e.limit == 1) {
          return Status::Lost(
              fmt::format("lease {} was lost or stolen: taken over by {}", key, e.holder),
              LostCause::kStolen);
        }
      }
    }
    if (forced_.contains(key)) {
      return Status::Lost(
          fmt::format("lease {} was lost or stolen: released by force or expired", key));
    }
    return Status::Lost(fmt::format("lease {} was lost or stolen: expired or released", key));
  }

  void WakeLocked(std::string_view key) LH_REQUIRES(mu_) {
    auto [first, last] = waiters_.equal_range(std::string(key));
    for (auto it = first; it != last; ++it) {
      it->second.request_stop();
    }
  }

  Clock& clock_;
  Mutex mu_;
  std::map<std::string, KeyState, std::less<>> keys_ LH_GUARDED_BY(mu_);
  std::map<std::string, FencingToken, std::less<>> fences_ LH_GUARDED_BY(mu_);
  std::set<std::string, std::less<>> forced_ LH_GUARDED_BY(mu_);
  std::map<std::string, Record, std::less<>> records_ LH_GUARDED_BY(mu_);
  // Data written by fenced writes (Put, Delete).
  std::map<std::string, std::string, std::less<>> data_ LH_GUARDED_BY(mu_);
  std::multimap<std::string, std::stop_source> waiters_ LH_GUARDED_BY(mu_);
};

class MemoryBackend final : public Backend,
                            public WaitFacet,
                            public RecordsFacet,
                            public FencedWriteFacet,
                            public DoctorFacet {
 public:
  explicit MemoryBackend(std::shared_ptr<MemoryTable> table) : table_(std::move(table)) {}

  std::string_view scheme() const override { return "memory"; }

  Capabilities capabilities() const override {
    return {.scope = StoreScope::kProcess,
            .notifies_holder = true,
            .fencing_survives_restart = false,
            .shared_leases = true};
  }

  Facets facets() override {
    return {.wait = this, .records = this, .fenced_write = this, .doctor = this};
  }

  Result<Grant> TryAcquire(const GrantRequest& request) override {
    return table_->TryAcquire(request);
  }

  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override {
    return RenewEach(requests, [&](const RenewRequest& request) { return table_->Renew(request); });
  }

  Status Finish(const FinishRequest& request) override {
    if (request.keep == Duration::zero() && !request.record.has_value()) {
      return table_->Release(request.key, request.owner_token);
    }
    return table_->Finish(request);
  }

  Result<std::vector<LeaseInfo>> Holders(std::string_view key) override {
    return table_->Holders(key);
  }

  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override {
    return table_->List(prefix);
  }

  Result<bool> ForceEnd(std::string_view key, std::string_view token_prefix) override {
    return table_->ForceRelease(key, token_prefix);
  }

  // ---- RecordsFacet.

  Result<std::optional<std::string>> ReadRecord(std::string_view key) override {
    return table_->ReadRecord(key);
  }

  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override {
    return table_->ListRecords(prefix);
  }

  // ---- FencedWriteFacet.

  unsigned fenced_ops() const override {
    return FencedOpBit(FencedOp::Kind::kPut) | FencedOpBit(FencedOp::Kind::kDelete);
  }

  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) override {
    return table_->FencedWrite(request);
  }

  // ---- DoctorFacet.

  // No round trip: the table is in this process.
  Status Ping() override { return Status(); }

  Result<Diagnosis> Diagnose() override {
    return Diagnosis{
        .probe = "in-process call",
        .items = {{.area = "durability",
                   .verdict = CheckVerdict::kUnsafe,
                   .found = "memory:// keeps leases in this process only: they and their fencing "
                            "counters end with it",
                   .fix = "use memory:// for tests; use sqlite:// or a server store for real "
                          "work"}}};
  }

  // ---- WaitFacet.

  void AbandonWait(std::string_view key, std::string_view waiter_id) override {
    table_->AbandonWait(key, waiter_id);
  }

  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) override {
    return table_->WaitForChange(key, deadline, std::move(stop));
  }

 private:
  const std::shared_ptr<MemoryTable> table_;
};

// The named tables, kept while a handle has them open.
struct TableRegistry {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<MemoryTable>> tables;
};

TableRegistry& Tables() {
  static auto* registry = new TableRegistry();
  return *registry;
}

}  // namespace

std::optional<std::string> ReadMemoryDataForTesting(std::string_view name, std::string_view key) {
  TableRegistry& registry = Tables();
  std::shared_ptr<MemoryTable> table;
  {
    std::lock_guard<std::mutex> lock(registry.mu);
    auto it = registry.tables.find(std::string(name));
    if (it != registry.tables.end()) {
      table = it->second.lock();
    }
  }
  return table ? table->ReadData(key) : std::nullopt;
}

Result<std::shared_ptr<Backend>> OpenMemoryBackend(const Url& url, Clock& clock) {
  if (!url.query.empty() || !url.path.empty() || url.user) {
    return Status::InvalidArgument("memory:// takes only a name: memory://NAME");
  }
  if (url.authority.empty()) {
    return std::shared_ptr<Backend>(
        std::make_shared<MemoryBackend>(std::make_shared<MemoryTable>(clock)));
  }
  TableRegistry& registry = Tables();
  std::lock_guard<std::mutex> lock(registry.mu);
  std::shared_ptr<MemoryTable> table = registry.tables[url.authority].lock();
  if (!table) {
    table = std::make_shared<MemoryTable>(clock);
    registry.tables[url.authority] = table;
  } else if (table->clock() != &clock) {
    // The table's grants expire on its first opener's clock: a handle on another clock would
    // compare its deadlines with that one.
    return Status::InvalidArgument(fmt::format(
        "memory://{} is open on another clock: open every handle of one name on the same Clock",
        url.authority));
  }
  return std::shared_ptr<Backend>(std::make_shared<MemoryBackend>(std::move(table)));
}

}  // namespace leasehold::internal
