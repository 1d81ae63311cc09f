// chaos_worker: one worker process of the safety harness (tests/chaos/chaos.py).
//
// Loops until its deadline: acquire a key (one of --keys, at random), then while the lease is
// valid write its fencing token to the fenced register (fenced_register.h) or, with
// --guard=native, to a data key in the lease store itself (below), hold for a random time,
// release. Every event goes to --log as one line, appended with one write(2) so that a
// SIGKILL never leaves half a line:
//
//   <CLOCK_BOOTTIME ns> <worker id> <event> key=value ...
//
// Events: start, acq-sent, acquired (token, safe_until, slot), acq-fail, renew-ok (safe_until moved
// forward), state (at_risk/held), lost (reason), valid-check (safe_until), pause-self, resumed,
// write (accepted/rejected/error; the register's max before, or the native write's t_send),
// release-sent, release-done, exit.
// All times are BootClock (CLOCK_BOOTTIME) nanoseconds: one clock shared by every process on
// the host, so the checker can compare events across workers.
//
// Modes:
//   --mode=safe    the public API (Store::Open / Acquire / Lease), fenced writes.
//   --mode=unsafe  the negative control: the internal Backend used directly, with the unsafe
//                  choices named in --unsafe=reply,nodrift,nofence,plaindelete (or "all"):
//                  validity counted from the reply's arrival, no drift allowance, register
//                  writes without fencing, release by plain delete (ForceRelease).
//
// Guards (where the writes go):
//   --guard=register  the fenced register, a SQLite file outside the store (the default).
//   --guard=native    Lease::Write (leasehold/fenced_write.h): the store checks the grant in the
//                     write's own atomic step. Key-value stores: a Put of "chaos-data/<key>"
//                     (ZooKeeper: the node "/chaos-data-<key>"); SQL stores: CREATE TABLE IF NOT
//                     EXISTS chaos_data(k, v) and an upsert of row k=<key>, in one write. The
//                     value is "<token>:<worker id>:<seq>". Logged as `write` with result
//                     accepted (OK), rejected (kLost: fenced out) or error (anything else), seq,
//                     and t_send (read just before the call: the checker judges staleness by
//                     it, not by the worker's word). --mode=unsafe writes through the internal
//                     backend with its own grant's owner token.
//   --unsafe=noguard  (with --guard=native, in either mode) the negative control of the guard:
//                     every write goes to a second internal backend on the same URL with
//                     FencedWriteRequest::skip_guard_for_testing, carrying the lease's key,
//                     fencing token and store key, so the store applies it unchecked.
//
// Semaphores (--limit=N, N > 1): every acquire asks for LeaseOptions::limit = N (the unsafe
// client: GrantRequest::limit), the `acquired` line carries the grant's slot, and the register
// writes go to the slot's own register key "<key>#s<slot>" (chaos.py's header says why).
//   --unsafe=overlimit  (in either mode) the negative control of the limit: every acquire asks
//                       for N + 1 while the run is judged by N, as a store whose admission counts
//                       one grant too few would behave (`count <= N` for `count < N`).
//   --unsafe=trustcommit  (postgres://, in either mode) the negative control of the
//                       indeterminate-outcome rule: the library's leases, on connections that
//                       trust a COMMIT whose wait for a synchronous standby was cancelled and an
//                       answer after a cancel (PgConnection::TrustUnconfirmedCommitsForTesting),
//                       as leasehold did before the rule.
//
// Pause point: on SIGUSR1 the worker stops itself (raise(SIGSTOP)) right after its next
// validity check and before the write that check allowed, so a pause lands exactly where it
// hurts most. The orchestrator sends SIGCONT.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/fenced_write.h"
#include "leasehold/lease.h"
#include "leasehold/options.h"
#include "leasehold/status.h"
#include "leasehold/store.h"

#include "backends/backend.h"
#include "backends/registry.h"
#include "chaos/fenced_register.h"
#include "core/owner_token.h"
#include "core/url.h"
#ifdef LEASEHOLD_WITH_POSTGRES
#include "backends/postgres/postgres_connection.h"
#endif

namespace leasehold::chaos {
namespace {

using std::chrono::milliseconds;

std::int64_t NowNs() {
  return BootClock::now().time_since_epoch().count();
}

std::int64_t Ns(SteadyTime t) {
  return t.time_since_epoch().count();
}

// Appends whole lines to the event log; thread-safe (one write(2) per line, O_APPEND).
class EventLog {
 public:
  EventLog(int fd, std::string id) : fd_(fd), id_(std::move(id)) {}

  void Event(std::string_view event, const std::string& fields = {}) {
    std::string line = std::to_string(NowNs()) + " " + id_ + " " + std::string(event);
    if (!fields.empty()) {
      line += " " + fields;
    }
    line += "\n";
    std::lock_guard<std::mutex> lock(mu_);
    (void)!::write(fd_, line.data(), line.size());
  }

 private:
  const int fd_;
  const std::string id_;
  std::mutex mu_;
};

std::string Sanitize(std::string_view text) {
  std::string out(text.substr(0, 120));
  for (char& c : out) {
    if (c == ' ' || c == '\n' || c == '=' || c == '\t') {
      c = '_';
    }
  }
  return out;
}

struct Config {
  std::string store;
  std::vector<std::string> keys = {"hot"};
  std::string register_path;
  std::string log_path;
  std::string id = "w0";
  milliseconds ttl{1000};
  milliseconds duration{10000};
  milliseconds hold_min{50};
  milliseconds hold_max{400};
  milliseconds write_gap{20};
  milliseconds wait{2000};
  milliseconds idle_max{40};
  std::uint64_t seed = 0;
  bool unsafe = false;
  bool ignore_sigpipe = false;
  bool unsafe_reply = false;
  bool unsafe_nodrift = false;
  bool unsafe_nofence = false;
  bool unsafe_plaindelete = false;
  bool native = false;
  bool unsafe_noguard = false;
  std::uint32_t limit = 1;
  bool unsafe_overlimit = false;
  // --unsafe=trustcommit: postgres:// trusts unconfirmed commits.
  bool unsafe_trustcommit = false;

  // The limit every acquire asks for: --limit, one more with --unsafe=overlimit.
  std::uint32_t AskedLimit() const { return limit + (unsafe_overlimit ? 1 : 0); }
};

// One held lease, whichever client took it.
class Holding {
 public:
  virtual ~Holding() = default;
  virtual bool Valid() = 0;
  virtual FencingToken Token() = 0;
  // The grant's slot (Lease::slot, Grant::slot): 0 for an exclusive lease.
  virtual std::uint32_t Slot() = 0;
  virtual SteadyTime SafeUntil() = 0;
  // Where the store keeps the grant (Lease::store_key, Grant::store_key).
  virtual std::string StoreKey() = 0;
  // A data key named to live beside the grant (Lease::DataKey: in a Redis Cluster, the
  // lease's hash slot).
  virtual std::string DataKey(const std::string& name) = 0;
  // A native write, guarded by the store (--guard=native).
  virtual Status NativeWrite(const FencedWrite& write) = 0;
  // Returns "ok", "lost" or "error:<code>", and whether a grant was deleted.
  virtual std::string Release() = 0;
};

// A way of taking leases: the library (safe) or the negative control (unsafe).
class Client {
 public:
  virtual ~Client() = default;
  // Acquires `key`, waiting up to `wait`. On failure returns nullptr and sets *error.
  virtual std::unique_ptr<Holding> Acquire(const std::string& key, milliseconds wait,
                                           std::string* error) = 0;
};

// ---- safe: the public API --------------------------------------------------------------------

class LibraryHolding : public Holding {
 public:
  explicit LibraryHolding(Lease lease) : lease_(std::move(lease)) {}

  bool Valid() override { return lease_.valid(); }

  FencingToken Token() override { return lease_.fencing_token(); }

  std::uint32_t Slot() override { return lease_.slot(); }

  SteadyTime SafeUntil() override { return lease_.safe_until(); }

  std::string StoreKey() override { return lease_.store_key(); }

  std::string DataKey(const std::string& name) override { return lease_.DataKey(name); }

  Status NativeWrite(const FencedWrite& write) override { return lease_.Write(write).status(); }

  std::string Release() override {
    Status s = lease_.Release();
    if (s.ok()) {
      return "ok";
    }
    return s.code() == StatusCode::kLost ? "lost" : "error:" + Sanitize(s.ToString());
  }

 private:
  Lease lease_;
};

class LibraryClient : public Client {
 public:
  LibraryClient(std::unique_ptr<Store> store, const Config& config, EventLog& log)
      : store_(std::move(store)), config_(config), log_(log) {}

  std::unique_ptr<Holding> Acquire(const std::string& key, milliseconds wait,
                                   std::string* error) override {
    LeaseOptions options;
    options.ttl = config_.ttl;
    options.wait = wait;
    options.holder = config_.id;
    options.limit = config_.AskedLimit();
    // Callbacks run on the heartbeat threads; the worker holds one lease at a time, so the
    // checker attributes these lines to the worker's current grant.
    options.on_state_change = [this, key](LeaseState state, const Status& reason) {
      if (state == LeaseState::kLost) {
        std::string kind = reason.message().find("no renewal confirmed before safe_until") !=
                                   std::string_view::npos
                               ? "expired"
                               : "store";
        log_.Event("lost",
                   "key=" + key + " reason=" + kind + " msg=" + Sanitize(reason.ToString()));
      } else {
        log_.Event("state", "key=" + key + " state=" +
                                std::string(state == LeaseState::kAtRisk ? "at_risk" : "held"));
      }
    };
    Result<Lease> lease = store_->Acquire(key, options);
    if (!lease.ok()) {
      *error = Sanitize(lease.status().ToString());
      return nullptr;
    }
    return std::make_unique<LibraryHolding>(std::move(*lease));
  }

 private:
  std::unique_ptr<Store> store_;
  const Config& config_;
  EventLog& log_;
};

// ---- unsafe: the negative control ------------------------------------------------------------

class UnsafeHolding : public Holding {
 public:
  UnsafeHolding(std::shared_ptr<internal::Backend> backend, const Config& config, EventLog& log,
                std::string key, std::string owner, const internal::Grant& grant, SteadyTime t_send,
                SteadyTime t_reply)
      : backend_(std::move(backend)),
        config_(config),
        log_(log),
        key_(std::move(key)),
        owner_(std::move(owner)),
        token_(grant.fencing_token),
        slot_(grant.slot),
        store_key_(grant.store_key.empty() ? key_ : grant.store_key) {
    safe_until_ = Bound(t_send, t_reply);
    renewer_ = std::jthread([this](std::stop_token stop) { RenewLoop(stop); });
  }

  ~UnsafeHolding() override {
    renewer_.request_stop();
    if (renewer_.joinable()) {
      renewer_.join();
    }
  }

  bool Valid() override {
    std::lock_guard<std::mutex> lock(mu_);
    return !lost_ && BootClock::now() < safe_until_;
  }

  FencingToken Token() override { return token_; }

  std::uint32_t Slot() override { return slot_; }

  SteadyTime SafeUntil() override {
    std::lock_guard<std::mutex> lock(mu_);
    return safe_until_;
  }

  std::string StoreKey() override { return store_key_; }

  std::string DataKey(const std::string& name) override {
    return backend_->DataKeyPrefix(key_) + name;
  }

  Status NativeWrite(const FencedWrite& write) override {
    return backend_
        ->FencedWrite({.key = key_,
                       .owner_token = owner_,
                       .fencing_token = token_,
                       .store_key = store_key_,
                       .ops = write.ops()})
        .status();
  }

  std::string Release() override {
    renewer_.request_stop();
    {
      std::lock_guard<std::mutex> lock(mu_);
      lost_ = true;
    }
    if (config_.unsafe_plaindelete) {
      Result<bool> deleted = backend_->ForceRelease(key_);
      if (!deleted.ok()) {
        return "error:" + Sanitize(deleted.status().ToString());
      }
      return *deleted ? "ok" : "lost";
    }
    Status s = backend_->Release(key_, owner_);
    return s.ok() ? "ok" : (s.code() == StatusCode::kLost ? "lost" : "error");
  }

 private:
  SteadyTime Bound(SteadyTime t_send, SteadyTime t_reply) const {
    Duration drift =
        config_.unsafe_nodrift ? Duration::zero() : Duration(config_.ttl) / 100 + milliseconds(2);
    return (config_.unsafe_reply ? t_reply : t_send) + config_.ttl - drift;
  }

  void RenewLoop(std::stop_token stop) {
    const Duration interval = Duration(config_.ttl) / 3;
    while (!stop.stop_requested()) {
      Clock::Real().SleepUntil(BootClock::now() + interval, stop);
      if (stop.stop_requested()) {
        return;
      }
      SteadyTime t_send = BootClock::now();
      Status s = backend_->Renew({.key = key_, .owner_token = owner_, .ttl = config_.ttl});
      SteadyTime t_reply = BootClock::now();
      std::lock_guard<std::mutex> lock(mu_);
      if (lost_) {
        return;
      }
      if (s.ok()) {
        // Unsafe on purpose: no check that the old bound had not lapsed first.
        safe_until_ = Bound(t_send, t_reply);
        log_.Event("renew-ok", "key=" + key_ + " token=" + std::to_string(token_) +
                                   " safe_until=" + std::to_string(Ns(safe_until_)));
      } else if (s.code() == StatusCode::kLost) {
        lost_ = true;
        log_.Event("lost", "key=" + key_ + " reason=store msg=" + Sanitize(s.ToString()));
        return;
      }
    }
  }

  const std::shared_ptr<internal::Backend> backend_;
  const Config& config_;
  EventLog& log_;
  const std::string key_;
  const std::string owner_;
  const FencingToken token_;
  const std::uint32_t slot_;
  const std::string store_key_;
  std::mutex mu_;
  SteadyTime safe_until_;
  bool lost_ = false;
  std::jthread renewer_;
};

class UnsafeClient : public Client {
 public:
  UnsafeClient(std::shared_ptr<internal::Backend> backend, const Config& config, EventLog& log)
      : backend_(std::move(backend)), config_(config), log_(log), rng_(config.seed ^ 0x5eed) {}

  std::unique_ptr<Holding> Acquire(const std::string& key, milliseconds wait,
                                   std::string* error) override {
    const SteadyTime deadline = BootClock::now() + wait;
    Result<std::string> owner = internal::NewOwnerToken();
    if (!owner.ok()) {
      *error = "owner_token";
      return nullptr;
    }
    while (true) {
      SteadyTime t_send = BootClock::now();
      Result<internal::Grant> grant = backend_->TryAcquire({.key = key,
                                                            .owner_token = *owner,
                                                            .holder = config_.id,
                                                            .ttl = config_.ttl,
                                                            .limit = config_.AskedLimit()});
      SteadyTime t_reply = BootClock::now();
      if (grant.ok()) {
        return std::make_unique<UnsafeHolding>(backend_, config_, log_, key, *owner, *grant, t_send,
                                               t_reply);
      }
      if (BootClock::now() >= deadline) {
        *error = Sanitize(grant.status().ToString());
        return nullptr;
      }
      std::uniform_int_distribution<int> pause(2, 20);
      std::this_thread::sleep_for(milliseconds(pause(rng_)));
    }
  }

 private:
  std::shared_ptr<internal::Backend> backend_;
  const Config& config_;
  EventLog& log_;
  std::mt19937_64 rng_;
};

// ---- native writes (--guard=native) ----------------------------------------------------------

// The SQL stores' data table (chaos.py creates it before the workers start, so that the
// CREATE TABLE of concurrent first writes never races on PostgreSQL; reads it for the audit).
constexpr const char* kCreateDataTable =
    "CREATE TABLE IF NOT EXISTS chaos_data(k TEXT PRIMARY KEY, v TEXT NOT NULL)";
constexpr const char* kUpsertData =
    "INSERT INTO chaos_data(k, v) VALUES($1, $2) ON CONFLICT(k) DO UPDATE SET v = excluded.v";

// Builds the write of one value and sends it: through the holding (the store's guard) or, for
// --unsafe=noguard, straight to a backend with the guard skipped.
class NativeWriter {
 public:
  // `scheme` is the store URL's; `noguard` is the backend of --unsafe=noguard (else null).
  NativeWriter(std::string_view scheme, std::shared_ptr<internal::Backend> noguard)
      : sql_(scheme == "sqlite" || scheme == "postgres" || scheme == "postgresql"),
        zk_(scheme == "zk"),
        noguard_(std::move(noguard)) {}

  // The data key of lease `key`: the SQL row's k, the ZooKeeper node, or the KV key.
  std::string DataKey(const std::string& key) const {
    if (sql_) {
      return key;
    }
    return zk_ ? "/chaos-data-" + key : "chaos-data/" + key;
  }

  Status Write(Holding& holding, const std::string& key, const std::string& value) const {
    FencedWrite write;
    if (sql_) {
      write.Sql(kCreateDataTable).Sql(kUpsertData, {DataKey(key), value});
    } else {
      write.Put(holding.DataKey(DataKey(key)), value);
    }
    if (noguard_ == nullptr) {
      return holding.NativeWrite(write);
    }
    // The owner token is the Lease's secret; with the guard skipped the store never reads it.
    return noguard_
        ->FencedWrite({.key = key,
                       .fencing_token = holding.Token(),
                       .store_key = holding.StoreKey(),
                       .ops = write.ops(),
                       .skip_guard_for_testing = true})
        .status();
  }

 private:
  const bool sql_;
  const bool zk_;
  const std::shared_ptr<internal::Backend> noguard_;
};

// ---- the loop --------------------------------------------------------------------------------

std::atomic<bool> g_pause_requested{false};

extern "C" void OnPauseRequest(int /*signo*/) {
  g_pause_requested.store(true);
}

bool ParseFlag(const char* arg, Config* c) {
  std::string a(arg);
  auto eq = a.find('=');
  if (a.rfind("--", 0) != 0 || eq == std::string::npos) {
    return false;
  }
  std::string name = a.substr(2, eq - 2);
  std::string value = a.substr(eq + 1);
  auto ms = [&] { return milliseconds(std::atoll(value.c_str())); };
  if (name == "store") {
    c->store = value;
  } else if (name == "keys") {
    c->keys.clear();
    std::stringstream ss(value);
    for (std::string k; std::getline(ss, k, ',');) {
      c->keys.push_back(k);
    }
  } else if (name == "register") {
    c->register_path = value;
  } else if (name == "log") {
    c->log_path = value;
  } else if (name == "id") {
    c->id = value;
  } else if (name == "ttl-ms") {
    c->ttl = ms();
  } else if (name == "duration-ms") {
    c->duration = ms();
  } else if (name == "hold-min-ms") {
    c->hold_min = ms();
  } else if (name == "hold-max-ms") {
    c->hold_max = ms();
  } else if (name == "write-gap-ms") {
    c->write_gap = ms();
  } else if (name == "idle-max-ms") {
    c->idle_max = ms();
  } else if (name == "wait-ms") {
    c->wait = ms();
  } else if (name == "seed") {
    c->seed = std::strtoull(value.c_str(), nullptr, 10);
  } else if (name == "ignore-sigpipe") {
    c->ignore_sigpipe = value == "1";
  } else if (name == "mode") {
    c->unsafe = value == "unsafe";
  } else if (name == "guard") {
    if (value != "register" && value != "native") {
      return false;
    }
    c->native = value == "native";
  } else if (name == "unsafe") {
    bool all = value == "all";
    c->unsafe_reply = all || value.find("reply") != std::string::npos;
    c->unsafe_nodrift = all || value.find("nodrift") != std::string::npos;
    c->unsafe_nofence = all || value.find("nofence") != std::string::npos;
    c->unsafe_plaindelete = all || value.find("plaindelete") != std::string::npos;
    c->unsafe_noguard = value.find("noguard") != std::string::npos;
    c->unsafe_overlimit = value.find("overlimit") != std::string::npos;
    c->unsafe_trustcommit = value.find("trustcommit") != std::string::npos;
  } else if (name == "limit") {
    long n = std::atol(value.c_str());
    if (n < 1 || n > static_cast<long>(kMaxLeaseLimit)) {
      return false;
    }
    c->limit = static_cast<std::uint32_t>(n);
  } else {
    return false;
  }
  return true;
}

int Run(const Config& config) {
  int fd = ::open(config.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror("chaos_worker: open log");
    return 1;
  }
  EventLog log(fd, config.id);
  log.Event("start",
            "pid=" + std::to_string(getpid()) + " mode=" + (config.unsafe ? "unsafe" : "safe") +
                " guard=" + (config.native ? "native" : "register") +
                (config.unsafe_noguard ? " noguard=1" : "") + " limit=" +
                std::to_string(config.limit) + (config.unsafe_overlimit ? " overlimit=1" : "") +
                " ttl_ms=" + std::to_string(config.ttl.count()));
  const SteadyTime deadline = BootClock::now() + config.duration;

  // Opening is retried: a store under fault injection may be down at start (a failover under
  // way takes up to 15 s on a loaded machine). It is asked again every 100 ms until the worker's
  // deadline, as a service would keep trying: a store down that long is no finding.
  auto retry = [&](auto open) {
    auto result = open();
    while (!result.ok() && result.status().code() == StatusCode::kUnavailable &&
           BootClock::now() < deadline) {
      log.Event("open-retry", "msg=" + Sanitize(result.status().ToString()));
      std::this_thread::sleep_for(milliseconds(100));
      result = open();
    }
    return result;
  };
  std::unique_ptr<FencedRegister> reg;
  if (!config.native) {
    Result<std::unique_ptr<FencedRegister>> opened = retry([&] {
      return FencedRegister::Open(config.register_path, /*fenced=*/!config.unsafe_nofence);
    });
    if (!opened.ok()) {
      log.Event("fatal", "what=register msg=" + Sanitize(opened.status().ToString()));
      return 1;
    }
    reg = std::move(*opened);
  }

  Result<internal::Url> url = internal::ParseUrl(config.store);
  if (!url.ok()) {
    log.Event("fatal", "what=url");
    return 1;
  }
  auto open_backend = [&]() -> std::shared_ptr<internal::Backend> {
    Result<std::shared_ptr<internal::Backend>> backend =
        retry([&] { return internal::OpenBackend(*url, Clock::Real()); });
    if (!backend.ok()) {
      log.Event("fatal", "what=backend msg=" + Sanitize(backend.status().ToString()));
      return nullptr;
    }
    return *backend;
  };
  std::optional<NativeWriter> native;
  if (config.native) {
    std::shared_ptr<internal::Backend> noguard;
    if (config.unsafe_noguard && (noguard = open_backend()) == nullptr) {
      return 1;
    }
    native.emplace(url->scheme, std::move(noguard));
  }

  std::unique_ptr<Client> client;
  if (config.unsafe) {
    std::shared_ptr<internal::Backend> backend = open_backend();
    if (backend == nullptr) {
      return 1;
    }
    client = std::make_unique<UnsafeClient>(std::move(backend), config, log);
  } else {
    Result<std::unique_ptr<Store>> store = retry([&] { return Store::Open(config.store); });
    if (!store.ok() && store.status().code() == StatusCode::kUnavailable &&
        BootClock::now() >= deadline) {
      log.Event("unavailable-to-the-end", "msg=" + Sanitize(store.status().ToString()));
      return 0;  // it never held anything: nothing to judge, nothing that failed
    }
    if (!store.ok()) {
      log.Event("fatal", "what=store msg=" + Sanitize(store.status().ToString()));
      return 1;
    }
    client = std::make_unique<LibraryClient>(std::move(*store), config, log);
  }

  // The monitor logs every forward move of safe_until (a confirmed renewal) within ~2 ms, so
  // that a holder killed between writes still has its last confirmed bound in the log.
  std::mutex current_mu;
  Holding* current = nullptr;
  std::string current_key;
  std::jthread monitor([&](std::stop_token stop) {
    std::int64_t last = 0;
    Holding* last_holding = nullptr;
    while (!stop.stop_requested()) {
      {
        std::lock_guard<std::mutex> lock(current_mu);
        if (current != nullptr && !config.unsafe) {
          std::int64_t s = Ns(current->SafeUntil());
          if (current != last_holding) {
            last_holding = current;
            last = s;
          } else if (s > last) {
            last = s;
            log.Event("renew-ok", "key=" + current_key +
                                      " token=" + std::to_string(current->Token()) +
                                      " safe_until=" + std::to_string(s));
          }
        }
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
  });

  std::mt19937_64 rng(config.seed);
  std::uniform_int_distribution<std::size_t> pick_key(0, config.keys.size() - 1);
  std::uniform_int_distribution<std::int64_t> pick_hold(config.hold_min.count(),
                                                        config.hold_max.count());
  std::uint64_t writes = 0;  // the native writes' seq
  while (BootClock::now() < deadline) {
    const std::string& key = config.keys[pick_key(rng)];
    auto left = std::chrono::duration_cast<milliseconds>(deadline - BootClock::now());
    if (left <= milliseconds(0)) {
      break;
    }
    log.Event("acq-sent", "key=" + key);
    std::string error;
    std::unique_ptr<Holding> holding = client->Acquire(key, std::min(config.wait, left), &error);
    if (holding == nullptr) {
      log.Event("acq-fail", "key=" + key + " msg=" + error);
      if (error.find("Unimplemented") != std::string::npos) {
        // The store refuses the kind at once (no shared leases): no busy loop of refusals.
        std::this_thread::sleep_for(milliseconds(100));
      }
      continue;
    }
    const FencingToken token = holding->Token();
    const std::string tok = std::to_string(token);
    const std::uint32_t slot = holding->Slot();
    log.Event("acquired", "key=" + key + " token=" + tok +
                              " safe_until=" + std::to_string(Ns(holding->SafeUntil())) +
                              " slot=" + std::to_string(slot));
    // A semaphore's holders each write their slot's own register (chaos.py's header).
    const std::string reg_key = config.limit > 1 ? key + "#s" + std::to_string(slot) : key;
    {
      std::lock_guard<std::mutex> lock(current_mu);
      current = holding.get();
      current_key = key;
    }
    const SteadyTime hold_until = BootClock::now() + milliseconds(pick_hold(rng));
    bool lost = false;
    while (true) {
      if (!holding->Valid()) {
        lost = true;
        log.Event("invalid", "key=" + key + " token=" + tok);
        break;
      }
      log.Event("valid-check", "key=" + key + " token=" + tok +
                                   " safe_until=" + std::to_string(Ns(holding->SafeUntil())));
      if (g_pause_requested.exchange(false)) {
        log.Event("pause-self", "key=" + key + " token=" + tok);
        ::raise(SIGSTOP);
        log.Event("resumed", "key=" + key + " token=" + tok);
      }
      // The write the validity check above allowed; after a pause it may be stale, and then the
      // register (or the store's guard) must reject it.
      if (native) {
        const std::string seq = std::to_string(++writes);
        const std::int64_t t_send = NowNs();
        Status s = native->Write(*holding, key, tok + ":" + config.id + ":" + seq);
        const std::int64_t t_reply = NowNs();
        std::string fields =
            "key=" + key + " token=" + tok + " result=" +
            (s.ok() ? "accepted" : (s.code() == StatusCode::kLost ? "rejected" : "error")) +
            " guard=native seq=" + seq + " t_send=" + std::to_string(t_send) +
            " t_reply=" + std::to_string(t_reply);
        if (!s.ok()) {
          fields += " msg=" + Sanitize(s.ToString());
        }
        log.Event("write", fields);
      } else {
        WriteResult w = reg->Write(reg_key, token, config.id);
        log.Event("write", "key=" + key + " token=" + tok + " result=" + w.outcome +
                               " max_before=" + std::to_string(w.max_before) +
                               " t_commit=" + std::to_string(w.t_commit_ns));
      }
      if (BootClock::now() >= hold_until || BootClock::now() >= deadline) {
        break;
      }
      std::this_thread::sleep_for(config.write_gap);
    }
    {
      std::lock_guard<std::mutex> lock(current_mu);
      current = nullptr;
    }
    log.Event("release-sent",
              "key=" + key + " token=" + tok + " after_invalid=" + (lost ? "1" : "0"));
    std::string released = holding->Release();
    log.Event("release-done", "key=" + key + " token=" + tok + " result=" + released);
    holding.reset();
    std::uniform_int_distribution<std::int64_t> pick_idle(0, config.idle_max.count());
    std::this_thread::sleep_for(milliseconds(pick_idle(rng)));
  }
  monitor.request_stop();
  monitor.join();
  log.Event("exit");
  return 0;
}

}  // namespace
}  // namespace leasehold::chaos

int main(int argc, char** argv) {
  leasehold::chaos::Config config;
  for (int i = 1; i < argc; ++i) {
    if (!leasehold::chaos::ParseFlag(argv[i], &config)) {
      std::fprintf(stderr, "chaos_worker: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (config.store.empty() || (config.register_path.empty() && !config.native) ||
      config.log_path.empty() || config.keys.empty() || (config.unsafe_noguard && !config.native)) {
    std::fprintf(stderr,
                 "usage: chaos_worker --store=URL --register=PATH --log=PATH [--id=ID] "
                 "[--keys=a,b] [--ttl-ms=N] [--duration-ms=N] [--hold-min-ms=N] "
                 "[--hold-max-ms=N] [--write-gap-ms=N] [--idle-max-ms=N] [--wait-ms=N] [--seed=N] "
                 "[--mode=safe|unsafe] [--unsafe=all|reply,nodrift,nofence,plaindelete] "
                 "[--guard=register|native] [--unsafe=noguard (native only)] "
                 "[--limit=N] [--unsafe=overlimit] [--ignore-sigpipe=1]\n"
                 "  (--register is not needed with --guard=native)\n");
    return 2;
  }

  struct sigaction sa {};

  sa.sa_handler = leasehold::chaos::OnPauseRequest;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
#ifdef LEASEHOLD_WITH_POSTGRES
  if (config.unsafe_trustcommit) {
    leasehold::internal::PgConnection::TrustUnconfirmedCommitsForTesting(true);
  }
#endif
  if (config.ignore_sigpipe) {
    // Off by default: the library must not need it (tests/chaos/repro/redis_sigpipe.py).
    signal(SIGPIPE, SIG_IGN);
  }
  return leasehold::chaos::Run(config);
}
