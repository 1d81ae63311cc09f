#include "backends/memory/memory_backend.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "core/duration.h"
#include "core/owner_token.h"
#include "util/mutex.h"

namespace leasehold::internal {

namespace {

// One table of grants, shared by every handle opened with the same name.
class MemoryTable {
 public:
  explicit MemoryTable(Clock& clock) : clock_(clock) {}

  [[nodiscard]] const Clock* clock() const { return &clock_; }

  Result<Grant> TryAcquire(const GrantRequest& request) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    auto it = grants_.find(request.key);
    if (it != grants_.end() && it->second.expires > now) {
      return Status::HeldByAnother(InfoLocked(it->first, it->second, now));
    }
    FencingToken fencing = ++fences_[request.key];
    grants_[request.key] = Entry{request.owner_token, request.holder, fencing,
                                 now + request.ttl, request.ttl};
    return Grant{fencing, request.ttl};
  }

  Status Renew(const RenewRequest& request) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    auto it = grants_.find(request.key);
    if (it == grants_.end() || it->second.token != request.owner_token ||
        it->second.expires <= now) {
      return LostLocked(request.key, request.owner_token, now);
    }
    it->second.expires = now + request.ttl;
    it->second.ttl = request.ttl;
    return Status();
  }

  Status Release(std::string_view key, std::string_view token) LH_EXCLUDES(mu_) {
    Status result;
    {
      MutexLock lock(&mu_);
      SteadyTime now = clock_.Now();
      auto it = grants_.find(key);
      if (it == grants_.end() || it->second.token != token) {
        return LostLocked(key, token, now);
      }
      if (it->second.expires <= now) {
        result = Status::Lost(fmt::format("lease {} was lost or stolen: it expired", key));
      }
      grants_.erase(it);
      WakeLocked(key);
    }
    return result;
  }

  Status Finish(const FinishRequest& request) LH_EXCLUDES(mu_) {
    LH_RETURN_IF_ERROR(CheckFinishRequest(request));
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    auto it = grants_.find(request.key);
    if (it == grants_.end() || it->second.token != request.owner_token ||
        it->second.expires <= now) {
      return LostLocked(request.key, request.owner_token, now);
    }
    if (request.record.has_value()) {
      records_[request.key] = Record{*request.record, now + request.record_ttl};
    }
    if (request.keep > Duration::zero()) {
      // No owner sends this token: a renewal already in flight cannot touch the kept grant.
      it->second.token += ":kept";
      it->second.expires = now + request.keep;
      it->second.ttl = request.keep;
    } else {
      grants_.erase(it);
      WakeLocked(request.key);
    }
    return Status();
  }

  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request)
      LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const SteadyTime now = clock_.Now();
    auto it = grants_.find(request.key);
    if (!request.skip_guard_for_testing &&
        (it == grants_.end() || it->second.token != request.owner_token ||
         it->second.expires <= now)) {
      const bool other = it != grants_.end() && it->second.token != request.owner_token &&
                         it->second.expires > now;
      return FencedOut(request.key, request.fencing_token,
                       other ? fmt::format("is now held by {} under fencing token {}",
                                           it->second.holder, it->second.fencing)
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

  Result<std::optional<LeaseInfo>> Inspect(std::string_view key) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    auto it = grants_.find(key);
    if (it == grants_.end() || it->second.expires <= now) {
      return std::optional<LeaseInfo>();
    }
    return std::optional<LeaseInfo>(InfoLocked(it->first, it->second, now));
  }

  Result<std::vector<LeaseInfo>> List(std::string_view prefix) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    SteadyTime now = clock_.Now();
    std::vector<LeaseInfo> out;
    for (auto it = grants_.lower_bound(prefix);
         it != grants_.end() && std::string_view(it->first).starts_with(prefix); ++it) {
      if (it->second.expires > now) {
        out.push_back(InfoLocked(it->first, it->second, now));
      }
    }
    return out;
  }

  Result<bool> ForceRelease(std::string_view key) LH_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = grants_.find(key);
    if (it == grants_.end()) {
      return false;
    }
    bool live = it->second.expires > clock_.Now();
    grants_.erase(it);
    forced_.insert(std::string(key));
    WakeLocked(key);
    return live;
  }

  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop)
      LH_EXCLUDES(mu_) {
    std::stop_source woken;
    SteadyTime wake_at = deadline;
    {
      MutexLock lock(&mu_);
      auto it = grants_.find(key);
      if (it == grants_.end() || it->second.expires <= clock_.Now()) {
        return Status();
      }
      // Without a release the key frees itself at expiry: wake then at the latest.
      wake_at = std::min(deadline, it->second.expires);
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

 private:
  struct Entry {
    std::string token;
    std::string holder;
    FencingToken fencing = 0;
    SteadyTime expires;
    Duration ttl;
  };

  struct Record {
    std::string value;
    SteadyTime expires;
  };

  LeaseInfo InfoLocked(const std::string& key, const Entry& e, SteadyTime now)
      LH_REQUIRES(mu_) {
    return LeaseInfo{key, e.holder, TokenPrefix(e.token), e.fencing,
                     std::chrono::duration_cast<std::chrono::milliseconds>(e.expires - now),
                     std::chrono::duration_cast<std::chrono::milliseconds>(e.ttl)};
  }

  Status LostLocked(std::string_view key, std::string_view token, SteadyTime now)
      LH_REQUIRES(mu_) {
    auto it = grants_.find(key);
    if (it != grants_.end() && it->second.token != token && it->second.expires > now) {
      return Status::Lost(
          fmt::format("lease {} was lost or stolen: taken over by {}", key, it->second.holder),
          LostCause::kStolen);
    }
    if (it != grants_.end() && it->second.token == token) {
      return Status::Lost(fmt::format("lease {} was lost or stolen: it expired", key));
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
  std::map<std::string, Entry, std::less<>> grants_ LH_GUARDED_BY(mu_);
  std::map<std::string, FencingToken, std::less<>> fences_ LH_GUARDED_BY(mu_);
  std::set<std::string, std::less<>> forced_ LH_GUARDED_BY(mu_);
  std::map<std::string, Record, std::less<>> records_ LH_GUARDED_BY(mu_);
  // Data written by fenced writes (Put, Delete).
  std::map<std::string, std::string, std::less<>> data_ LH_GUARDED_BY(mu_);
  std::multimap<std::string, std::stop_source> waiters_ LH_GUARDED_BY(mu_);
};

class MemoryBackend final : public Backend {
 public:
  explicit MemoryBackend(std::shared_ptr<MemoryTable> table) : table_(std::move(table)) {}

  std::string_view scheme() const override { return "memory"; }

  Capabilities capabilities() const override {
    return {.multi_process = false,
            .native_wait = true,
            .fencing_survives_restart = false,
            .fenced_ops = FencedOpBit(FencedOp::Kind::kPut) | FencedOpBit(FencedOp::Kind::kDelete)};
  }

  Result<Grant> TryAcquire(const GrantRequest& request) override {
    return table_->TryAcquire(request);
  }

  Status Renew(const RenewRequest& request) override { return table_->Renew(request); }

  Status Release(std::string_view key, std::string_view owner_token) override {
    return table_->Release(key, owner_token);
  }

  Status Finish(const FinishRequest& request) override { return table_->Finish(request); }

  Result<std::optional<std::string>> ReadRecord(std::string_view key) override {
    return table_->ReadRecord(key);
  }

  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) override {
    return table_->FencedWrite(request);
  }

  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override {
    return table_->ListRecords(prefix);
  }

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

  Result<std::optional<LeaseInfo>> Inspect(std::string_view key) override {
    return table_->Inspect(key);
  }

  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override {
    return table_->List(prefix);
  }

  Result<bool> ForceRelease(std::string_view key) override { return table_->ForceRelease(key); }

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
