// File: backends/etcd/etcd_backend.cc (internal)
//
// EtcdBackend over gRPC C++. The only file of the library that includes gRPC and the generated
// etcd stubs. See etcd_backend.h for the design; the comments here explain the invariants.

#include "backends/etcd/etcd_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "rpc.grpc.pb.h"
#include "rpc.pb.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

namespace {

using namespace std::chrono_literals;
namespace pb = etcdserverpb;

// Shortest life of a queue entry (fair=true) without its waiter's attempts.
constexpr int64_t kMinQueueTtlSeconds = 10;

// Version of the value layout (EncodeValue).
constexpr int64_t kValueVersion = 1;

// After a failed Authenticate (wrong user or password) no new attempt is made for this long,
// doubling up to kMaxAuthBackoff: a wrong password never turns into a tight loop of calls.
constexpr Duration kMinAuthBackoff = 1s;
constexpr Duration kMaxAuthBackoff = 30s;

// Long waits are cut into pieces no longer than this (a gRPC deadline far in the future is
// pointless, and the core calls again anyway).
constexpr Duration kMaxWatchSlice = 1h;

std::chrono::system_clock::time_point WallDeadline(Duration from_now) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(from_now);
}

// "<prefix>/<key>" and the end of the range of every key that starts with `prefix`.
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// Where the waiters of `key` queue (fair=true): "<prefix>\0queue/<key>\0<waiter id>". The NUL
// bytes keep the queue out of every "<prefix>/..." range (leases, list) and make one key's
// queue no prefix of another's (lease names contain no NUL).
std::string QueuePrefix(std::string_view prefix, std::string_view key) {
  std::string q(prefix);
  q += '\0';
  q += "queue/";
  q += key;
  q += '\0';
  return q;
}

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

// The value of a grant: "v1\n<owner token>\n<granted ttl ms>\n<holder>". The holder comes last
// so it may contain anything, newlines included.
struct GrantValue {
  std::string token;
  int64_t ttl_ms = 0;
  std::string holder;
};

std::string EncodeValue(const GrantValue& v) {
  return fmt::format("v{}\n{}\n{}\n{}", kValueVersion, v.token, v.ttl_ms, v.holder);
}

std::optional<GrantValue> DecodeValue(std::string_view text) {
  GrantValue v;
  std::string_view parts[3];
  for (auto& part : parts) {
    std::size_t nl = text.find('\n');
    if (nl == std::string_view::npos) {
      return std::nullopt;
    }
    part = text.substr(0, nl);
    text.remove_prefix(nl + 1);
  }
  if (parts[0] != "v1") {
    return std::nullopt;
  }
  v.token = std::string(parts[1]);
  for (char c : parts[2]) {
    if (c < '0' || c > '9') {
      return std::nullopt;
    }
    v.ttl_ms = v.ttl_ms * 10 + (c - '0');
  }
  v.holder = std::string(text);
  return v;
}

std::string TokenPrefixOf(std::string_view token) {
  return std::string(token.substr(0, 8));
}

bool IsUnreachable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// etcd says "invalid auth token" (UNAUTHENTICATED) when its simple token expired or the member
// restarted, and "revision in header is old" when auth changed since the token was issued:
// both are cured by a fresh Authenticate.
bool IsStaleToken(const grpc::Status& s) {
  const std::string& m = s.error_message();
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         m.find("invalid auth token") != std::string::npos ||
         m.find("revision in header is old") != std::string::npos;
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return std::nullopt;
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

struct Counters {
  std::atomic<std::uint64_t> range{0};
  std::atomic<std::uint64_t> txn{0};
  std::atomic<std::uint64_t> lease_grant{0};
  std::atomic<std::uint64_t> lease_revoke{0};
  std::atomic<std::uint64_t> lease_time_to_live{0};
  std::atomic<std::uint64_t> authenticate{0};
  std::atomic<std::uint64_t> keepalive_streams{0};
  std::atomic<std::uint64_t> keepalive_requests{0};
  std::atomic<std::uint64_t> keepalive_responses{0};
  std::atomic<std::uint64_t> keepalive_rounds{0};
  std::atomic<std::uint64_t> watch_streams{0};
  std::atomic<std::uint64_t> failovers{0};
  std::atomic<std::uint64_t> spare_grants{0};
  std::atomic<std::uint64_t> spare_used{0};
};

struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
  std::unique_ptr<pb::Auth::Stub> auth;
};

// A grant this backend made and has not released: what renew and release need.
struct HeldGrant {
  std::string owner_token;
  int64_t lease_id = 0;
  int64_t create_revision = 0;
  std::string holder;  // the grant's value is re-Put with it when Finish keeps the grant
};

// A lease granted ahead of time, with no key attached yet, so that an acquire needs only its
// Txn. `refreshed` is when the request that last set its TTL (grant or keep-alive) was sent:
// etcd keeps the lease at least until refreshed + ttl.
struct SpareLease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;
  SteadyTime refreshed{};
};

// A waiter's place in a key's queue (fair=true): its key there, the create revision that orders
// it, and the lease that removes it if the waiter dies.
struct QueueEntry {
  std::string key;  // the lease name
  std::string queue_key;
  int64_t create_revision = 0;
  int64_t lease_id = 0;
  int64_t ttl_seconds = 0;
  SteadyTime refreshed{};
};

// One keep-alive request waiting for its answer.
struct KeepAliveSlot {
  bool done = false;
  bool failed = false;  // the stream ended before the answer
  int64_t ttl = 0;
};

}  // namespace

// The keep-alive stream: one bidirectional LeaseKeepAlive call and the thread that reads it.
// Answers come back in request order per lease id; the reader hands each to the oldest slot
// waiting for that id.
struct KeepAliveStream {
  std::size_t endpoint = 0;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>>
      rw;
  Mutex write_mu;  // serializes Write (gRPC allows one outstanding write per stream)
  // Guarded by EtcdBackend::Impl::ka_mu_.
  bool broken = false;
  bool auth_error = false;
  std::map<int64_t, std::deque<std::shared_ptr<KeepAliveSlot>>> pending;
  std::atomic<bool> finished{false};
  std::jthread reader;
};

class EtcdBackend::Impl {
 public:
  explicit Impl(EtcdOptions options) : options_(std::move(options)) {}

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  Impl(Impl&&) = delete;
  Impl& operator=(Impl&&) = delete;

  ~Impl() {
    // Spare leases carry no key: revoke them rather than leave them to expire.
    std::vector<int64_t> spares;
    {
      MutexLock lock(&spare_mu_);
      closing_ = true;
      for (const auto& [seconds, spare] : spares_) {
        spares.push_back(spare.id);
      }
      spares_.clear();
    }
    for (int64_t id : spares) {
      RevokeInBackground(id);
    }
    std::vector<std::shared_ptr<KeepAliveStream>> streams;
    {
      MutexLock lock(&ka_mu_);
      if (stream_ != nullptr) {
        streams.push_back(std::move(stream_));
      }
      for (auto& s : retired_) {
        streams.push_back(std::move(s));
      }
      retired_.clear();
    }
    for (auto& s : streams) {
      s->context.TryCancel();
      if (s->reader.joinable()) {
        s->reader.join();
      }
    }
    // Fire-and-forget revokes hold a pointer to this object: wait for their callbacks (each
    // has a deadline, so this ends).
    MutexLock lock(&async_mu_);
    async_cv_.Wait(std::stop_token(),
                   [this]() LH_REQUIRES(async_mu_) { return async_outstanding_ == 0; });
  }

  Status Init() {
    grpc::ChannelArguments args;
    // Reconnect soon after a member comes back; the defaults wait up to two minutes.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // Own connections per backend: counters and failures of one handle are its own.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::ChannelCredentials> creds;
    if (options_.tls) {
      grpc::SslCredentialsOptions ssl;
      for (auto [path, field] : {std::pair{&options_.ca_file, &ssl.pem_root_certs},
                                 std::pair{&options_.cert_file, &ssl.pem_cert_chain},
                                 std::pair{&options_.key_file, &ssl.pem_private_key}}) {
        if (path->empty()) {
          continue;
        }
        std::optional<std::string> pem = ReadFile(*path);
        if (!pem) {
          return Status::InvalidArgument(
              fmt::format("etcds:// URL names the file {}, which cannot be read", *path));
        }
        *field = std::move(*pem);
      }
      creds = grpc::SslCredentials(ssl);
    } else {
      creds = grpc::InsecureChannelCredentials();
    }
    for (const std::string& address : options_.endpoints) {
      auto e = std::make_unique<Endpoint>();
      e->address = address;
      e->channel = grpc::CreateCustomChannel(address, creds, args);
      e->kv = pb::KV::NewStub(e->channel);
      e->lease = pb::Lease::NewStub(e->channel);
      e->watch = pb::Watch::NewStub(e->channel);
      e->auth = pb::Auth::NewStub(e->channel);
      endpoints_.push_back(std::move(e));
    }
    if (options_.user) {
      LH_RETURN_IF_ERROR(Authenticate(/*stale_token=*/""));
    }
    // Reachability and permission check: read one key of our prefix.
    pb::RangeRequest req;
    req.set_key(KeyName(options_.prefix, ""));
    req.set_range_end(PrefixEnd(req.key()));
    req.set_limit(1);
    req.set_keys_only(true);
    pb::RangeResponse resp;
    return Call("connect (Range)", counters_.range, [&](Endpoint& e, grpc::ClientContext& ctx) {
      return e.kv->Range(&ctx, req, &resp);
    });
  }

  // Runs one unary call `fn(endpoint, context)` with the deadline and the auth token, moving on
  // to the next endpoint when this one is unreachable (each endpoint is tried once), and
  // authenticating again once when the token went stale. Maps the final gRPC status.
  template <typename Fn>
  Status Call(std::string_view what, std::atomic<std::uint64_t>& counter, Fn&& fn,
              std::size_t* used_endpoint = nullptr) {
    bool reauthenticated = false;
    if (options_.user && CurrentToken().empty()) {
      // No token (a refused Authenticate): ask again, or get the remembered refusal while its
      // backoff lasts. A call without a token would only be refused less clearly.
      LH_RETURN_IF_ERROR(Authenticate(""));
    }
    std::size_t tried = 0;
    grpc::Status last;
    std::string last_address;
    while (tried < endpoints_.size()) {
      const std::size_t index = current_.load();
      Endpoint& e = *endpoints_[index];
      grpc::ClientContext ctx;
      ctx.set_deadline(WallDeadline(options_.command_timeout));
      const std::string token = CurrentToken();
      if (!token.empty()) {
        ctx.AddMetadata("token", token);
      }
      counter.fetch_add(1, std::memory_order_relaxed);
      last = fn(e, ctx);
      last_address = e.address;
      if (last.ok()) {
        if (used_endpoint != nullptr) {
          *used_endpoint = index;
        }
        return Status();
      }
      if (IsUnreachable(last)) {
        MoveOn(index);
        ++tried;
        continue;
      }
      if (options_.user && !reauthenticated && IsStaleToken(last)) {
        reauthenticated = true;
        LH_RETURN_IF_ERROR(Authenticate(token));
        continue;
      }
      return MapError(last, what, e.address);
    }
    return Status::Unavailable(
        fmt::format("no etcd member of {} answered {} within {} ms", options_.Address(), what,
                    std::chrono::duration_cast<std::chrono::milliseconds>(options_.command_timeout)
                        .count()),
        fmt::format("{}: {}", last_address, last.error_message()));
  }

  // Moves the current endpoint past `failed` (unless another thread already did).
  void MoveOn(std::size_t failed) {
    if (endpoints_.size() < 2) {
      return;
    }
    std::size_t expected = failed;
    if (current_.compare_exchange_strong(expected, (failed + 1) % endpoints_.size())) {
      counters_.failovers.fetch_add(1, std::memory_order_relaxed);
    }
  }

  Status MapError(const grpc::Status& s, std::string_view what, std::string_view address) {
    const std::string& m = s.error_message();
    switch (s.error_code()) {
      case grpc::StatusCode::PERMISSION_DENIED:
        return Status::PermissionDenied(
            fmt::format("etcd at {} refused {}: permission denied for user '{}' on prefix '{}/'",
                        address, what, options_.user.value_or("(none)"), options_.prefix),
            m);
      case grpc::StatusCode::UNAUTHENTICATED:
        return Status::PermissionDenied(
            fmt::format("etcd at {} refused {}: not authenticated (permission denied)", address,
                        what),
            m);
      case grpc::StatusCode::INVALID_ARGUMENT:
        if (m.find("user name is empty") != std::string::npos) {
          return Status::PermissionDenied(
              fmt::format("etcd at {} has auth enabled: permission denied without a user; put "
                          "user:password@ in the URL",
                          address),
              m);
        }
        if (m.find("authentication failed") != std::string::npos) {
          return Status::PermissionDenied(
              fmt::format("etcd at {} refused the credentials of user '{}' (permission denied: "
                          "wrong user or password)",
                          address, options_.user.value_or("")),
              m);
        }
        return Status::Internal(fmt::format("etcd at {} rejected {}", address, what), m);
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::DEADLINE_EXCEEDED:
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
      case grpc::StatusCode::ABORTED:
        return Status::Unavailable(fmt::format("etcd at {} did not complete {}", address, what), m);
      case grpc::StatusCode::FAILED_PRECONDITION:
        if (m.find("auth") != std::string::npos) {
          return Status::PermissionDenied(
              fmt::format("etcd at {} refused {}: permission denied", address, what), m);
        }
        return Status::Internal(fmt::format("etcd at {} rejected {}", address, what), m);
      default:
        return Status::Internal(fmt::format("etcd at {} answered {} with gRPC code {}", address,
                                            what, static_cast<int>(s.error_code())),
                                m);
    }
  }

  std::string CurrentToken() {
    MutexLock lock(&auth_mu_);
    return token_;
  }

  // Fetches a new token unless another thread already replaced `stale_token`. After a refusal
  // it does not ask again before the backoff has passed: callers get the remembered error.
  Status Authenticate(const std::string& stale_token) {
    MutexLock lock(&auth_mu_);
    if (!token_.empty() && token_ != stale_token) {
      return Status();
    }
    const SteadyTime now = Clock::Real().Now();
    if (!auth_error_.ok() && now < auth_retry_at_) {
      return auth_error_;
    }
    pb::AuthenticateRequest req;
    req.set_name(*options_.user);
    req.set_password(options_.password.value_or(""));
    pb::AuthenticateResponse resp;
    grpc::Status last;
    std::string address;
    for (std::size_t tried = 0; tried < endpoints_.size(); ++tried) {
      const std::size_t index = current_.load();
      Endpoint& e = *endpoints_[index];
      grpc::ClientContext ctx;
      ctx.set_deadline(WallDeadline(options_.command_timeout));
      counters_.authenticate.fetch_add(1, std::memory_order_relaxed);
      last = e.auth->Authenticate(&ctx, req, &resp);
      address = e.address;
      if (!IsUnreachable(last)) {
        break;
      }
      MoveOn(index);
    }
    if (last.ok()) {
      token_ = resp.token();
      auth_error_ = Status();
      auth_backoff_ = Duration::zero();
      return Status();
    }
    token_.clear();
    Status error =
        IsUnreachable(last)
            ? Status::Unavailable(
                  fmt::format("no etcd member of {} answered Authenticate", options_.Address()),
                  last.error_message())
            : MapError(last, "Authenticate", address);
    if (error.code() != StatusCode::kUnavailable) {
      auth_backoff_ = std::clamp(auth_backoff_ * 2, kMinAuthBackoff, kMaxAuthBackoff);
      auth_retry_at_ = now + auth_backoff_;
      auth_error_ = error;
    }
    return error;
  }

  void AddToken(grpc::ClientContext& ctx) {
    const std::string token = CurrentToken();
    if (!token.empty()) {
      ctx.AddMetadata("token", token);
    }
  }

  // --- keep-alive stream ---

  // Returns the live stream, opening one on the current endpoint if there is none. Joins the
  // readers of retired streams that have finished.
  std::shared_ptr<KeepAliveStream> EnsureStream() {
    std::vector<std::shared_ptr<KeepAliveStream>> done;
    std::shared_ptr<KeepAliveStream> stream;
    bool reauth = false;
    {
      MutexLock lock(&ka_mu_);
      for (auto it = retired_.begin(); it != retired_.end();) {
        if ((*it)->finished.load()) {
          done.push_back(std::move(*it));
          it = retired_.erase(it);
        } else {
          ++it;
        }
      }
      if (stream_ != nullptr && !stream_->broken) {
        stream = stream_;
      } else if (stream_ != nullptr) {
        reauth = stream_->auth_error;
        retired_.push_back(std::move(stream_));
      }
    }
    for (auto& s : done) {
      s->reader.join();
    }
    if (stream != nullptr) {
      return stream;
    }
    if (reauth && options_.user) {
      (void)Authenticate(CurrentToken());
    }
    auto fresh = std::make_shared<KeepAliveStream>();
    fresh->endpoint = current_.load();
    AddToken(fresh->context);
    Endpoint& e = *endpoints_[fresh->endpoint];
    counters_.keepalive_streams.fetch_add(1, std::memory_order_relaxed);
    fresh->rw = e.lease->LeaseKeepAlive(&fresh->context);
    KeepAliveStream* raw = fresh.get();
    fresh->reader = std::jthread([this, raw] { ReadStream(raw); });
    MutexLock lock(&ka_mu_);
    if (stream_ != nullptr) {  // another thread opened one meanwhile: keep theirs
      fresh->context.TryCancel();
      retired_.push_back(std::move(fresh));
      return stream_;
    }
    stream_ = fresh;
    return fresh;
  }

  void ReadStream(KeepAliveStream* s) {
    pb::LeaseKeepAliveResponse resp;
    while (s->rw->Read(&resp)) {
      counters_.keepalive_responses.fetch_add(1, std::memory_order_relaxed);
      MutexLock lock(&ka_mu_);
      auto it = s->pending.find(resp.id());
      if (it != s->pending.end() && !it->second.empty()) {
        it->second.front()->done = true;
        it->second.front()->ttl = resp.ttl();
        it->second.pop_front();
        if (it->second.empty()) {
          s->pending.erase(it);
        }
      }
      ka_cv_.NotifyAll();
    }
    grpc::Status final_status;
    {
      MutexLock write_lock(&s->write_mu);  // Finish must not race a Write
      final_status = s->rw->Finish();
    }
    {
      MutexLock lock(&ka_mu_);
      s->broken = true;
      s->auth_error = IsStaleToken(final_status);
      for (auto& [id, slots] : s->pending) {
        for (auto& slot : slots) {
          slot->done = true;
          slot->failed = true;
        }
      }
      s->pending.clear();
      ka_cv_.NotifyAll();
    }
    // A stream that ended by itself (member died, lost its leader...) was on a bad endpoint.
    if (!final_status.ok() && final_status.error_code() != grpc::StatusCode::CANCELLED) {
      MoveOn(s->endpoint);
    }
    s->finished.store(true);
  }

  // Sends one keep-alive per id and waits for the answers until `deadline`. Returns, per id,
  // the TTL answered, or nullopt for no answer. Re-opens a broken stream (on the next endpoint)
  // and re-sends what was not answered, while the deadline lasts.
  std::vector<std::optional<int64_t>> KeepAlive(const std::vector<int64_t>& ids) {
    std::vector<std::optional<int64_t>> result(ids.size());
    if (ids.empty()) {
      return result;
    }
    counters_.keepalive_rounds.fetch_add(1, std::memory_order_relaxed);
    const auto deadline = std::chrono::steady_clock::now() + options_.command_timeout;
    std::vector<std::size_t> todo(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      todo[i] = i;
    }
    for (std::size_t attempt = 0; attempt < endpoints_.size() + 1 && !todo.empty(); ++attempt) {
      if (std::chrono::steady_clock::now() >= deadline) {
        break;
      }
      std::shared_ptr<KeepAliveStream> stream = EnsureStream();
      std::vector<std::shared_ptr<KeepAliveSlot>> slots(todo.size());
      {
        MutexLock lock(&ka_mu_);
        for (std::size_t j = 0; j < todo.size(); ++j) {
          slots[j] = std::make_shared<KeepAliveSlot>();
          if (stream->broken) {
            slots[j]->done = slots[j]->failed = true;
          } else {
            stream->pending[ids[todo[j]]].push_back(slots[j]);
          }
        }
      }
      {
        MutexLock write_lock(&stream->write_mu);
        pb::LeaseKeepAliveRequest req;
        for (std::size_t j = 0; j < todo.size(); ++j) {
          req.set_id(ids[todo[j]]);
          counters_.keepalive_requests.fetch_add(1, std::memory_order_relaxed);
          if (!stream->rw->Write(req)) {
            break;  // the reader sees the stream end and fails the slots
          }
        }
      }
      bool all_done = false;
      {
        MutexLock lock(&ka_mu_);
        all_done = ka_cv_.WaitUntil(deadline, std::stop_token(), [&]() LH_REQUIRES(ka_mu_) {
          for (const auto& slot : slots) {
            if (!slot->done) {
              return false;
            }
          }
          return true;
        });
        if (!all_done) {
          // No answer in time: this stream (or its member) is stuck. Give up on it; the
          // next round opens a new one on the next endpoint.
          stream->broken = true;
        }
      }
      if (!all_done) {
        stream->context.TryCancel();
        MoveOn(stream->endpoint);
      }
      std::vector<std::size_t> again;
      {
        MutexLock lock(&ka_mu_);
        for (std::size_t j = 0; j < todo.size(); ++j) {
          if (slots[j]->done && !slots[j]->failed) {
            result[todo[j]] = slots[j]->ttl;
          } else {
            again.push_back(todo[j]);
          }
        }
      }
      todo = std::move(again);
      if (!all_done) {
        break;  // the deadline passed
      }
    }
    return result;
  }

  // --- async revoke ---

  // Sends LeaseRevoke without waiting for the answer (a lease granted for a failed try).
  void RevokeInBackground(int64_t lease_id) {
    struct Call {
      grpc::ClientContext ctx;
      pb::LeaseRevokeRequest req;
      pb::LeaseRevokeResponse resp;
    };

    auto* call = new Call();
    call->ctx.set_deadline(WallDeadline(options_.command_timeout));
    AddToken(call->ctx);
    call->req.set_id(lease_id);
    {
      MutexLock lock(&async_mu_);
      ++async_outstanding_;
    }
    counters_.lease_revoke.fetch_add(1, std::memory_order_relaxed);
    endpoints_[current_.load()]->lease->async()->LeaseRevoke(&call->ctx, &call->req, &call->resp,
                                                             [this, call](const grpc::Status&) {
                                                               delete call;
                                                               MutexLock lock(&async_mu_);
                                                               --async_outstanding_;
                                                               async_cv_.NotifyAll();
                                                             });
  }

  // --- spare leases ---

  // Takes the spare lease of `seconds` if it is young enough: its remaining TTL, judged from
  // `now` (read after the core's t_send), must be at least 3/4 of its TTL. An older one is
  // revoked.
  std::optional<SpareLease> TakeSpare(int64_t seconds, SteadyTime now) {
    std::optional<SpareLease> stale;
    std::optional<SpareLease> taken;
    {
      MutexLock lock(&spare_mu_);
      auto it = spares_.find(seconds);
      if (it == spares_.end()) {
        return std::nullopt;
      }
      const Duration age = now - it->second.refreshed;
      if (age >= Duration::zero() && age * 4 <= std::chrono::seconds(it->second.ttl_seconds)) {
        taken = it->second;
      } else {
        stale = it->second;
      }
      spares_.erase(it);
    }
    if (stale) {
      RevokeInBackground(stale->id);
    }
    return taken;
  }

  // Keeps `spare` (unused: no key attached) for the next acquire of `seconds`, unless one is
  // kept already, in which case it is revoked.
  void KeepSpare(int64_t seconds, SpareLease spare) {
    bool extra = false;
    {
      MutexLock lock(&spare_mu_);
      if (closing_ || spares_.count(seconds) != 0 || spares_.size() >= kMaxSpares) {
        extra = true;
      } else {
        spares_[seconds] = spare;
      }
    }
    if (extra) {
      RevokeInBackground(spare.id);
    }
  }

  // Grants a spare lease of `seconds` in the background (no waiting for the reply), unless one
  // is kept or on its way.
  void RefillSpare(int64_t seconds) {
    {
      MutexLock lock(&spare_mu_);
      if (closing_ || spares_.count(seconds) != 0 || refilling_.count(seconds) != 0 ||
          spares_.size() + refilling_.size() >= kMaxSpares) {
        return;
      }
      refilling_.insert(seconds);
    }

    struct GrantCall {
      grpc::ClientContext ctx;
      pb::LeaseGrantRequest req;
      pb::LeaseGrantResponse resp;
      SteadyTime sent{};
    };

    auto* call = new GrantCall();
    call->ctx.set_deadline(WallDeadline(options_.command_timeout));
    AddToken(call->ctx);
    call->req.set_ttl(seconds);
    {
      MutexLock lock(&async_mu_);
      ++async_outstanding_;
    }
    counters_.lease_grant.fetch_add(1, std::memory_order_relaxed);
    counters_.spare_grants.fetch_add(1, std::memory_order_relaxed);
    call->sent = Clock::Real().Now();  // before the send: the lease lives at least until sent + ttl
    endpoints_[current_.load()]->lease->async()->LeaseGrant(
        &call->ctx, &call->req, &call->resp, [this, call, seconds](const grpc::Status& s) {
          {
            MutexLock lock(&spare_mu_);
            refilling_.erase(seconds);
          }
          if (s.ok() && call->resp.id() != 0 && call->resp.ttl() > 0) {
            KeepSpare(seconds, {call->resp.id(), call->resp.ttl(), call->sent});
          }
          delete call;
          MutexLock lock(&async_mu_);
          --async_outstanding_;
          async_cv_.NotifyAll();
        });
  }

  // The spare leases, for a keep-alive round.
  std::vector<SpareLease> Spares() {
    MutexLock lock(&spare_mu_);
    std::vector<SpareLease> out;
    for (const auto& [seconds, spare] : spares_) {
      out.push_back(spare);
    }
    return out;
  }

  // After a keep-alive round sent at `sent`: moves a spare's refresh time forward, or drops it
  // if etcd says it is gone.
  void SpareRenewed(int64_t id, std::optional<int64_t> ttl, SteadyTime sent) {
    MutexLock lock(&spare_mu_);
    for (auto it = spares_.begin(); it != spares_.end(); ++it) {
      if (it->second.id != id) {
        continue;
      }
      if (ttl && *ttl <= 0) {
        spares_.erase(it);
      } else if (ttl) {
        it->second.refreshed = std::max(it->second.refreshed, sent);
      }
      return;
    }
  }

  // --- fair queue ---

  // Returns the waiter's queue entry for `key`, creating it (a lease of `ttl_seconds` and a
  // Put if absent) or refreshing its lease (a keep-alive, once a third of its TTL has passed).
  Result<QueueEntry> Enqueue(std::string_view key, std::string_view waiter_id,
                             int64_t ttl_seconds) {
    const SteadyTime now = Clock::Real().Now();
    std::optional<QueueEntry> entry;
    {
      MutexLock lock(&waiter_mu_);
      auto it = waiters_.find(waiter_id);
      if (it != waiters_.end() && it->second.key == key) {
        entry = it->second;
      }
    }
    if (entry) {
      if ((now - entry->refreshed) * 3 < std::chrono::seconds(entry->ttl_seconds)) {
        return *entry;
      }
      std::vector<std::optional<int64_t>> ttl = KeepAlive({entry->lease_id});
      if (!ttl[0]) {
        return Status::Unavailable(fmt::format(
            "no etcd member of {} answered the keep-alive of a queue entry", options_.Address()));
      }
      if (*ttl[0] > 0) {
        MutexLock lock(&waiter_mu_);
        auto it = waiters_.find(waiter_id);
        if (it != waiters_.end()) {
          it->second.refreshed = now;
          return it->second;
        }
      }
      // The entry expired (the waiter was away too long): queue again, at the back.
      Dequeue(key, waiter_id);
    }
    pb::LeaseGrantRequest grant_req;
    grant_req.set_ttl(ttl_seconds);
    pb::LeaseGrantResponse grant_resp;
    LH_RETURN_IF_ERROR(Call("LeaseGrant (queue)", counters_.lease_grant,
                            [&](Endpoint& e, grpc::ClientContext& ctx) {
                              return e.lease->LeaseGrant(&ctx, grant_req, &grant_resp);
                            }));
    QueueEntry fresh;
    fresh.key = std::string(key);
    fresh.queue_key = QueuePrefix(options_.prefix, key) + std::string(waiter_id);
    fresh.lease_id = grant_resp.id();
    fresh.ttl_seconds = grant_resp.ttl();
    fresh.refreshed = now;
    pb::TxnRequest txn;
    pb::Compare* cmp = txn.add_compare();
    cmp->set_result(pb::Compare::EQUAL);
    cmp->set_target(pb::Compare::CREATE);
    cmp->set_key(fresh.queue_key);
    cmp->set_create_revision(0);
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(fresh.queue_key);
    put->set_lease(fresh.lease_id);
    txn.add_failure()->mutable_request_range()->set_key(fresh.queue_key);
    pb::TxnResponse resp;
    Status s = Call("Txn (enqueue)", counters_.txn, [&](Endpoint& e, grpc::ClientContext& ctx) {
      return e.kv->Txn(&ctx, txn, &resp);
    });
    if (!s.ok()) {
      RevokeInBackground(fresh.lease_id);
      return s;
    }
    if (resp.succeeded()) {
      fresh.create_revision = resp.header().revision();
    } else {
      // Queued by an earlier attempt whose reply was lost: keep that entry and its lease.
      const auto& kvs = resp.responses(0).response_range().kvs();
      if (kvs.empty()) {
        RevokeInBackground(fresh.lease_id);
        return Status::Unavailable("etcd queue entry vanished while being created");
      }
      RevokeInBackground(fresh.lease_id);
      fresh.create_revision = kvs[0].create_revision();
      fresh.lease_id = kvs[0].lease();
    }
    MutexLock lock(&waiter_mu_);
    waiters_[std::string(waiter_id)] = fresh;
    return fresh;
  }

  // Forgets the waiter's entry; with `revoke`, revokes its lease (which deletes the entry and
  // wakes the waiters behind it).
  void Dequeue(std::string_view key, std::string_view waiter_id, bool revoke = true) {
    std::optional<QueueEntry> entry;
    {
      MutexLock lock(&waiter_mu_);
      auto it = waiters_.find(waiter_id);
      if (it == waiters_.end() || it->second.key != key) {
        return;
      }
      entry = it->second;
      waiters_.erase(it);
    }
    if (revoke) {
      RevokeInBackground(entry->lease_id);
    }
  }

  // When the waiter should be back for its entry's keep-alive (SteadyTime::max() if unknown).
  SteadyTime QueueRefreshDue(std::string_view waiter_id) {
    MutexLock lock(&waiter_mu_);
    auto it = waiters_.find(waiter_id);
    if (it == waiters_.end()) {
      return SteadyTime::max();
    }
    return it->second.refreshed +
           std::chrono::duration_cast<Duration>(std::chrono::seconds(it->second.ttl_seconds)) / 3;
  }

  // --- held grants ---

  std::optional<HeldGrant> FindHeld(std::string_view key, std::string_view token) {
    MutexLock lock(&held_mu_);
    auto it = held_.find(key);
    if (it == held_.end() || it->second.owner_token != token) {
      return std::nullopt;
    }
    return it->second;
  }

  void SetHeld(std::string_view key, HeldGrant grant) {
    MutexLock lock(&held_mu_);
    held_[std::string(key)] = std::move(grant);
  }

  // Forgets the grant of `key` if it is still the one with `lease_id`.
  void DropHeld(std::string_view key, int64_t lease_id) {
    MutexLock lock(&held_mu_);
    auto it = held_.find(key);
    if (it != held_.end() && it->second.lease_id == lease_id) {
      held_.erase(it);
    }
  }

  Endpoint& endpoint(std::size_t i) { return *endpoints_[i]; }

  std::size_t current() const { return current_.load(); }

  const EtcdOptions options_;
  Counters counters_;

 private:
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<std::size_t> current_{0};

  Mutex auth_mu_;
  std::string token_ LH_GUARDED_BY(auth_mu_);
  Status auth_error_ LH_GUARDED_BY(auth_mu_);
  SteadyTime auth_retry_at_ LH_GUARDED_BY(auth_mu_){};
  Duration auth_backoff_ LH_GUARDED_BY(auth_mu_){};

  Mutex ka_mu_;
  CondVar ka_cv_{&ka_mu_};
  std::shared_ptr<KeepAliveStream> stream_ LH_GUARDED_BY(ka_mu_);
  std::vector<std::shared_ptr<KeepAliveStream>> retired_ LH_GUARDED_BY(ka_mu_);

  Mutex held_mu_;
  std::map<std::string, HeldGrant, std::less<>> held_ LH_GUARDED_BY(held_mu_);

  // At most this many spare leases (one per distinct TTL in whole seconds).
  static constexpr std::size_t kMaxSpares = 4;
  Mutex spare_mu_;
  std::map<int64_t, SpareLease> spares_ LH_GUARDED_BY(spare_mu_);  // by TTL seconds
  std::set<int64_t> refilling_ LH_GUARDED_BY(spare_mu_);
  bool closing_ LH_GUARDED_BY(spare_mu_) = false;

  Mutex waiter_mu_;
  std::map<std::string, QueueEntry, std::less<>> waiters_ LH_GUARDED_BY(waiter_mu_);

  Mutex async_mu_;
  CondVar async_cv_{&async_mu_};
  int async_outstanding_ LH_GUARDED_BY(async_mu_) = 0;
};

std::string EtcdBackend::KeyName(std::string_view prefix, std::string_view key) {
  return fmt::format("{}/{}", prefix, key);
}

Result<std::shared_ptr<Backend>> OpenEtcdBackend(const Url& url, Clock& clock) {
  (void)clock;  // TODO(#16): joined by the store's rewrite
  LH_ASSIGN_OR_RETURN(EtcdOptions options, EtcdOptions::FromUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<EtcdBackend> backend, EtcdBackend::Open(std::move(options)));
  return std::shared_ptr<Backend>(std::move(backend));
}

EtcdBackend::EtcdBackend(EtcdOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}

Result<std::shared_ptr<EtcdBackend>> EtcdBackend::Open(EtcdOptions options) {
  auto impl = std::make_unique<Impl>(options);
  LH_RETURN_IF_ERROR(impl->Init());
  return std::shared_ptr<EtcdBackend>(new EtcdBackend(std::move(options), std::move(impl)));
}

EtcdBackend::~EtcdBackend() = default;

Capabilities EtcdBackend::capabilities() const {
  return Capabilities{.multi_process = true,
                      .native_wait = true,
                      .fencing_survives_restart = true,
                      .fair_queue = options_.fair};
}

EtcdBackend::Stats EtcdBackend::stats() const {
  const Counters& c = impl_->counters_;
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
  Impl& impl = *impl_;
  // Read after the core read t_send: every TTL reported below is measured from a time no
  // earlier than the core's, so the core's safe_until is never later than etcd's expiry.
  const SteadyTime now = Clock::Real().Now();
  // Whole seconds, rounded up: etcd leases have a TTL in seconds (and at least 2 s).
  const int64_t seconds =
      std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(request.ttl).count());
  // fair=true: a waiter takes (or keeps) its place in the key's queue first. Its entry lives
  // max(ttl, 10 s) without the waiter's attempts (each refreshes it once a third has passed).
  std::optional<QueueEntry> entry;
  if (options_.fair && !request.waiter_id.empty()) {
    LH_ASSIGN_OR_RETURN(entry, impl.Enqueue(request.key, request.waiter_id,
                                            std::max<int64_t>(seconds, kMinQueueTtlSeconds)));
  }
  SpareLease lease;
  std::optional<SpareLease> spare =
      options_.spare_lease ? impl.TakeSpare(seconds, now) : std::nullopt;
  if (spare) {
    lease = *spare;
    impl.counters_.spare_used.fetch_add(1, std::memory_order_relaxed);
  } else {
    pb::LeaseGrantRequest grant_req;
    grant_req.set_ttl(seconds);
    pb::LeaseGrantResponse grant_resp;
    LH_RETURN_IF_ERROR(impl.Call("LeaseGrant", impl.counters_.lease_grant,
                                 [&](Endpoint& e, grpc::ClientContext& ctx) {
                                   return e.lease->LeaseGrant(&ctx, grant_req, &grant_resp);
                                 }));
    lease = SpareLease{grant_resp.id(), grant_resp.ttl(), now};
    if (lease.id == 0 || lease.ttl_seconds <= 0) {
      return Status::Internal(
          fmt::format("etcd granted lease {} with TTL {} s", lease.id, lease.ttl_seconds),
          grant_resp.error());
    }
  }
  // What the core may count on: the lease's TTL less the time since it was last set (zero for
  // a lease granted just now: `now` was read before the grant was sent).
  const Duration reported =
      std::chrono::seconds(lease.ttl_seconds) - std::max(Duration::zero(), now - lease.refreshed);

  const std::string etcd_key = KeyName(options_.prefix, request.key);
  pb::TxnRequest txn;
  pb::Compare* cmp = txn.add_compare();
  cmp->set_result(pb::Compare::EQUAL);
  cmp->set_target(pb::Compare::CREATE);
  cmp->set_key(etcd_key);
  cmp->set_create_revision(0);
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(etcd_key);
  put->set_value(EncodeValue({request.owner_token, lease.ttl_seconds * 1000, request.holder}));
  put->set_lease(lease.id);
  txn.add_failure()->mutable_request_range()->set_key(etcd_key);
  if (options_.fair) {
    // The queue must be empty, or (for a waiter) have nobody ahead of us: every entry's create
    // revision at least ours. The grant then takes our entry out of the queue.
    const std::string queue = QueuePrefix(options_.prefix, request.key);
    pb::Compare* q = txn.add_compare();
    q->set_target(pb::Compare::CREATE);
    q->set_key(queue);
    q->set_range_end(PrefixEnd(queue));
    if (entry) {
      q->set_result(pb::Compare::GREATER);
      q->set_create_revision(entry->create_revision - 1);
      txn.add_success()->mutable_request_delete_range()->set_key(entry->queue_key);
    } else {
      q->set_result(pb::Compare::EQUAL);
      q->set_create_revision(0);
    }
  }
  pb::TxnResponse txn_resp;
  Status s = impl.Call(
      "Txn (acquire)", impl.counters_.txn,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Txn(&ctx, txn, &txn_resp); });
  if (!s.ok()) {
    impl.RevokeInBackground(lease.id);  // the Txn may have attached it: never reuse it
    return s;
  }
  if (txn_resp.succeeded()) {
    // The Put is the Txn's only write: the Txn's revision is the key's create revision.
    const int64_t revision = txn_resp.header().revision();
    impl.SetHeld(request.key, {request.owner_token, lease.id, revision, request.holder});
    if (entry) {
      impl.Dequeue(request.key, request.waiter_id);  // its key went with the grant
    }
    if (options_.spare_lease) {
      impl.RefillSpare(seconds);
    }
    return Grant{.fencing_token = static_cast<FencingToken>(revision), .ttl = reported};
  }
  const pb::RangeResponse* range =
      txn_resp.responses_size() > 0 && txn_resp.responses(0).has_response_range()
          ? &txn_resp.responses(0).response_range()
          : nullptr;
  if (options_.fair && range != nullptr && range->kvs_size() == 0) {
    // Free, but waiters are queued ahead of us.
    if (options_.spare_lease) {
      impl.KeepSpare(seconds, lease);
    } else {
      impl.RevokeInBackground(lease.id);
    }
    return Status::HeldByAnother(
        fmt::format("{} is free but waiters are queued for it (fair=true)", request.key));
  }
  if (range == nullptr || range->kvs_size() == 0) {
    impl.RevokeInBackground(lease.id);
    return Status::Unavailable(
        fmt::format("etcd Txn for {} neither created the key nor returned its holder", etcd_key));
  }
  const mvccpb::KeyValue& kv = range->kvs(0);
  std::optional<GrantValue> value = DecodeValue(kv.value());
  if (value && value->token == request.owner_token && kv.lease() == lease.id) {
    // An earlier attempt of this very Txn was applied before its reply was lost (a deadline
    // or a failover): the grant is ours, on this lease.
    impl.SetHeld(request.key,
                 {request.owner_token, lease.id, kv.create_revision(), request.holder});
    return Grant{.fencing_token = static_cast<FencingToken>(kv.create_revision()), .ttl = reported};
  }
  // Held by another: the lease has no key attached, so it can serve the next acquire (a
  // conflict costs one Txn when a spare exists); without spares it is revoked.
  if (options_.spare_lease) {
    impl.KeepSpare(seconds, lease);
  } else {
    impl.RevokeInBackground(lease.id);
  }
  LeaseInfo holder;
  holder.key = request.key;
  holder.fencing_token = static_cast<FencingToken>(kv.create_revision());
  if (value) {
    holder.holder = value->holder;
    holder.token_prefix = TokenPrefixOf(value->token);
    holder.ttl = std::chrono::milliseconds(value->ttl_ms);
    holder.remaining = holder.ttl;
  }
  return Status::HeldByAnother(
      fmt::format("{} is held by {} (fencing token {})", request.key,
                  holder.holder.empty() ? "another owner" : holder.holder, holder.fencing_token),
      holder);
}

Status EtcdBackend::Renew(const RenewRequest& request) {
  std::vector<Status> results = RenewMany(std::span<const RenewRequest>(&request, 1));
  return std::move(results.front());
}

std::vector<Status> EtcdBackend::RenewMany(std::span<const RenewRequest> requests) {
  Impl& impl = *impl_;
  std::vector<Status> results(requests.size());
  std::vector<int64_t> ids;
  std::vector<std::size_t> index_of;  // position in `requests` of each id sent
  std::vector<int64_t> lease_of(requests.size(), 0);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    std::optional<HeldGrant> held = impl.FindHeld(requests[i].key, requests[i].owner_token);
    if (!held) {
      results[i] = Status::Lost(
          fmt::format("{} is not held by this owner token (released, lost or someone else's)",
                      requests[i].key));
      continue;
    }
    lease_of[i] = held->lease_id;
    ids.push_back(held->lease_id);
    index_of.push_back(i);
  }
  // Spare leases ride along in the same round, so they stay young enough to be used.
  const std::size_t held_count = ids.size();
  std::vector<SpareLease> spares = impl.Spares();
  if (held_count > 0) {
    for (const SpareLease& spare : spares) {
      ids.push_back(spare.id);
    }
  }
  const SteadyTime sent = Clock::Real().Now();
  std::vector<std::optional<int64_t>> ttls = impl.KeepAlive(ids);
  for (std::size_t j = held_count; j < ids.size(); ++j) {
    impl.SpareRenewed(ids[j], ttls[j], sent);
  }
  for (std::size_t j = 0; j < held_count; ++j) {
    const std::size_t i = index_of[j];
    if (!ttls[j]) {
      results[i] = Status::Unavailable(fmt::format(
          "no etcd member of {} answered the keep-alive of {} within {} ms", options_.Address(),
          requests[i].key,
          std::chrono::duration_cast<std::chrono::milliseconds>(options_.command_timeout).count()));
    } else if (*ttls[j] <= 0) {
      impl.DropHeld(requests[i].key, lease_of[i]);
      results[i] = Status::Lost(
          fmt::format("etcd lease of {} expired or was revoked (keep-alive answered TTL {})",
                      requests[i].key, *ttls[j]),
          LostCause::kSessionLost);
    }
  }
  return results;
}

Status EtcdBackend::Release(std::string_view key, std::string_view owner_token) {
  Impl& impl = *impl_;
  std::optional<HeldGrant> held = impl.FindHeld(key, owner_token);
  if (!held) {
    return Status::Lost(fmt::format(
        "{} is not held by this owner token (already released, lost or someone else's)", key));
  }
  const std::string etcd_key = KeyName(options_.prefix, key);

  // The revoke goes out first, without waiting: its lease carries only this key, so it can
  // delete nothing of anyone else's, and the two round trips overlap.
  struct RevokeCall {
    grpc::ClientContext ctx;
    pb::LeaseRevokeRequest req;
    pb::LeaseRevokeResponse resp;
    std::promise<grpc::Status> done;
  };

  RevokeCall revoke;
  revoke.ctx.set_deadline(WallDeadline(options_.command_timeout));
  impl.AddToken(revoke.ctx);
  revoke.req.set_id(held->lease_id);
  std::future<grpc::Status> revoked = revoke.done.get_future();
  impl.counters_.lease_revoke.fetch_add(1, std::memory_order_relaxed);
  impl.endpoint(impl.current())
      .lease->async()
      ->LeaseRevoke(&revoke.ctx, &revoke.req, &revoke.resp,
                    [&revoke](grpc::Status s) { revoke.done.set_value(std::move(s)); });

  pb::TxnRequest txn;
  pb::Compare* cmp = txn.add_compare();
  cmp->set_result(pb::Compare::EQUAL);
  cmp->set_target(pb::Compare::CREATE);
  cmp->set_key(etcd_key);
  cmp->set_create_revision(held->create_revision);
  pb::DeleteRangeRequest* del = txn.add_success()->mutable_request_delete_range();
  del->set_key(etcd_key);
  pb::TxnResponse txn_resp;
  Status s = impl.Call(
      "Txn (release)", impl.counters_.txn,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Txn(&ctx, txn, &txn_resp); });
  const grpc::Status revoke_status = revoked.get();  // the callback has run: `revoke` is free
  if (s.ok() && txn_resp.succeeded()) {
    impl.DropHeld(key, held->lease_id);
    if (IsUnreachable(revoke_status)) {
      impl.RevokeInBackground(held->lease_id);  // its member was down: the Txn failed over
    }
    return Status();
  }
  // The Txn found the key gone or re-created. If our revoke found the lease alive, the revoke
  // was applied first and deleted our key with it: a live release all the same.
  if (revoke_status.ok()) {
    impl.DropHeld(key, held->lease_id);
    return Status();
  }
  if (!s.ok()) {
    if (revoke_status.error_code() == grpc::StatusCode::NOT_FOUND) {
      impl.DropHeld(key, held->lease_id);
      return Status::Lost(fmt::format("the etcd lease of {} had already expired", key),
                          LostCause::kSessionLost);
    }
    return s;  // unknown outcome: keep the grant for a retry; it expires by itself otherwise
  }
  impl.DropHeld(key, held->lease_id);
  return Status::Lost(
      fmt::format("{} was no longer ours (expired, force-released or taken over)", key),
      LostCause::kSessionLost);
}

namespace {

// A fresh etcd lease of `ttl`, in whole seconds rounded up (etcd raises small TTLs to its
// minimum, 2 s for 3.4's defaults): its id and the TTL etcd granted.
struct FreshLease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;
};

Result<FreshLease> GrantLease(EtcdBackend::Impl& impl, Duration ttl, std::string_view what) {
  pb::LeaseGrantRequest req;
  req.set_ttl(std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(ttl).count()));
  pb::LeaseGrantResponse resp;
  LH_RETURN_IF_ERROR(impl.Call(what, impl.counters_.lease_grant,
                               [&](Endpoint& e, grpc::ClientContext& ctx) {
                                 return e.lease->LeaseGrant(&ctx, req, &resp);
                               }));
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
    return Release(request.key, request.owner_token);  // its revoke overlaps its Txn
  }
  Impl& impl = *impl_;
  std::optional<HeldGrant> held = impl.FindHeld(request.key, request.owner_token);
  if (!held) {
    return Status::Lost(fmt::format(
        "{} is not held by this owner token (already released, lost or someone else's)",
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
    LH_ASSIGN_OR_RETURN(keep_lease, GrantLease(impl, request.keep, "LeaseGrant (keep)"));
  }
  if (request.record.has_value()) {
    Result<FreshLease> granted = GrantLease(impl, request.record_ttl, "LeaseGrant (record)");
    if (!granted.ok()) {
      if (keep_lease) {
        impl.RevokeInBackground(keep_lease->id);
      }
      return granted.status();
    }
    record_lease = *granted;
  }

  // One Txn, guarded by the grant's create revision (the owner check, as in Release). Keeping
  // re-Puts the key under the keep lease: a Put on an existing key keeps its create revision,
  // so the holder and the fencing token stay, and nothing renews the new lease. The old lease
  // then carries no key and is revoked below.
  const std::string etcd_key = KeyName(options_.prefix, request.key);
  const std::string record_key = RecordKey(options_.prefix, request.key);
  pb::TxnRequest txn;
  pb::Compare* cmp = txn.add_compare();
  cmp->set_result(pb::Compare::EQUAL);
  cmp->set_target(pb::Compare::CREATE);
  cmp->set_key(etcd_key);
  cmp->set_create_revision(held->create_revision);
  if (keep_lease) {
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(etcd_key);
    put->set_value(
        EncodeValue({request.owner_token, keep_lease->ttl_seconds * 1000, held->holder}));
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
  Status s = impl.Call(
      "Txn (finish)", impl.counters_.txn,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Txn(&ctx, txn, &txn_resp); });
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
  impl.DropHeld(request.key, held->lease_id);
  if (!applied) {
    for (const auto& fresh : {keep_lease, record_lease}) {
      if (fresh) {
        impl.RevokeInBackground(fresh->id);
      }
    }
    return Status::Lost(
        fmt::format("{} was no longer ours (expired, force-released or taken over)", request.key),
        LostCause::kSessionLost);
  }
  // The grant's own lease carries no key now (it moved to the keep lease, or was deleted).
  impl.RevokeInBackground(held->lease_id);
  return Status();
}

Result<std::optional<std::string>> EtcdBackend::ReadRecord(std::string_view key) {
  Impl& impl = *impl_;
  pb::RangeRequest req;
  req.set_key(RecordKey(options_.prefix, key));
  pb::RangeResponse resp;
  LH_RETURN_IF_ERROR(impl.Call(
      "Range (record)", impl.counters_.range,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Range(&ctx, req, &resp); }));
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
  LH_RETURN_IF_ERROR(impl.Call(
      "Range (list records)", impl.counters_.range,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Range(&ctx, req, &resp); }));
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

// Reads the key (and its lease's remaining time) into a LeaseInfo; nullopt if the key is absent
// or its lease already expired (etcd deletes such keys a moment later).
Result<std::optional<LeaseInfo>> ToInfo(EtcdBackend::Impl& impl, std::string_view key,
                                        const mvccpb::KeyValue& kv) {
  LeaseInfo info;
  info.key = std::string(key);
  info.fencing_token = static_cast<FencingToken>(kv.create_revision());
  if (std::optional<GrantValue> value = DecodeValue(kv.value())) {
    info.holder = value->holder;
    info.token_prefix = TokenPrefixOf(value->token);
    info.ttl = std::chrono::milliseconds(value->ttl_ms);
  }
  if (kv.lease() == 0) {
    return std::optional<LeaseInfo>();  // not a leasehold grant
  }
  pb::LeaseTimeToLiveRequest req;
  req.set_id(kv.lease());
  pb::LeaseTimeToLiveResponse resp;
  LH_RETURN_IF_ERROR(impl.Call("LeaseTimeToLive", impl.counters_.lease_time_to_live,
                               [&](Endpoint& e, grpc::ClientContext& ctx) {
                                 return e.lease->LeaseTimeToLive(&ctx, req, &resp);
                               }));
  if (resp.ttl() < 0) {
    return std::optional<LeaseInfo>();
  }
  info.remaining = std::chrono::seconds(resp.ttl());
  return std::optional<LeaseInfo>(std::move(info));
}

}  // namespace

Result<std::optional<LeaseInfo>> EtcdBackend::Inspect(std::string_view key) {
  Impl& impl = *impl_;
  pb::RangeRequest req;
  req.set_key(KeyName(options_.prefix, key));
  pb::RangeResponse resp;
  LH_RETURN_IF_ERROR(impl.Call(
      "Range", impl.counters_.range,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Range(&ctx, req, &resp); }));
  if (resp.kvs_size() == 0) {
    return std::optional<LeaseInfo>();
  }
  return ToInfo(impl, key, resp.kvs(0));
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
  LH_RETURN_IF_ERROR(impl.Call(
      "Range (list)", impl.counters_.range,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Range(&ctx, req, &resp); }));
  std::vector<LeaseInfo> out;
  for (const mvccpb::KeyValue& kv : resp.kvs()) {
    LH_ASSIGN_OR_RETURN(std::optional<LeaseInfo> info,
                        ToInfo(impl, std::string_view(kv.key()).substr(base.size()), kv));
    if (info) {
      out.push_back(std::move(*info));
    }
  }
  return out;
}

Result<bool> EtcdBackend::ForceRelease(std::string_view key) {
  Impl& impl = *impl_;
  const std::string etcd_key = KeyName(options_.prefix, key);
  pb::RangeRequest range;
  range.set_key(etcd_key);
  pb::RangeResponse range_resp;
  LH_RETURN_IF_ERROR(
      impl.Call("Range", impl.counters_.range, [&](Endpoint& e, grpc::ClientContext& ctx) {
        return e.kv->Range(&ctx, range, &range_resp);
      }));
  if (range_resp.kvs_size() == 0) {
    return false;
  }
  const mvccpb::KeyValue& kv = range_resp.kvs(0);
  if (kv.lease() != 0) {
    // Revoking the lease deletes the key in the same step, and the holder's next keep-alive
    // answers TTL 0: it is lost at once instead of at safe_until.
    pb::LeaseRevokeRequest req;
    req.set_id(kv.lease());
    pb::LeaseRevokeResponse resp;
    Status s = impl.Call("LeaseRevoke", impl.counters_.lease_revoke,
                         [&](Endpoint& e, grpc::ClientContext& ctx) {
                           return e.lease->LeaseRevoke(&ctx, req, &resp);
                         });
    if (s.ok()) {
      return true;
    }
    if (s.detail().find("lease not found") == std::string_view::npos) {
      return s;
    }
    // The lease expired between the Range and the revoke: fall through to delete what is left.
  }
  pb::TxnRequest txn;
  pb::Compare* cmp = txn.add_compare();
  cmp->set_result(pb::Compare::EQUAL);
  cmp->set_target(pb::Compare::CREATE);
  cmp->set_key(etcd_key);
  cmp->set_create_revision(kv.create_revision());
  txn.add_success()->mutable_request_delete_range()->set_key(etcd_key);
  pb::TxnResponse txn_resp;
  LH_RETURN_IF_ERROR(impl.Call(
      "Txn (force release)", impl.counters_.txn,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Txn(&ctx, txn, &txn_resp); }));
  return txn_resp.succeeded() && kv.lease() == 0;
}

namespace {

// Watches `ranges` (key, range_end; empty range_end: one key) for deletes from `start_revision`
// on the member `index`, until one happens (OK), `slice_end` (OK: a spurious wake-up, the
// caller re-checks), `deadline` (kDeadlineExceeded) or `stop` (kCancelled).
Status WatchForDeletes(EtcdBackend::Impl& impl, std::size_t index,
                       const std::vector<std::pair<std::string, std::string>>& ranges,
                       int64_t start_revision, SteadyTime slice_end, SteadyTime deadline,
                       std::stop_token stop, std::string_view what) {
  const Duration left = std::min(slice_end, deadline) - Clock::Real().Now();
  if (Clock::Real().Now() >= deadline) {
    return Status::DeadlineExceeded(fmt::format("wait for {} ran out", what));
  }
  if (stop.stop_requested()) {
    return Status::Cancelled(fmt::format("wait for {} cancelled", what));
  }
  if (left <= Duration::zero()) {
    return Status();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(WallDeadline(std::min(left, kMaxWatchSlice)));
  impl.AddToken(ctx);
  std::stop_callback cancel(stop, [&ctx] { ctx.TryCancel(); });
  impl.counters_.watch_streams.fetch_add(1, std::memory_order_relaxed);
  auto stream = impl.endpoint(index).watch->Watch(&ctx);
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
  if (Clock::Real().Now() >= deadline) {
    return Status::DeadlineExceeded(fmt::format("wait for {} ran out", what));
  }
  if (IsUnreachable(final_status)) {
    impl.MoveOn(index);
  }
  return Status();  // the stream ended early, or the slice ran out: the caller re-checks
}

}  // namespace

Status EtcdBackend::WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) {
  Impl& impl = *impl_;
  const std::string etcd_key = KeyName(options_.prefix, key);
  pb::RangeRequest range;
  range.set_key(etcd_key);
  range.set_keys_only(true);
  pb::RangeResponse range_resp;
  std::size_t index = 0;
  LH_RETURN_IF_ERROR(impl.Call(
      "Range (wait)", impl.counters_.range,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Range(&ctx, range, &range_resp); },
      &index));
  if (range_resp.kvs_size() == 0) {
    return Status();  // free already
  }
  return WatchForDeletes(impl, index, {{etcd_key, ""}}, range_resp.header().revision() + 1,
                         SteadyTime::max(), deadline, std::move(stop), key);
}

Status EtcdBackend::WaitForTurn(std::string_view key, std::string_view waiter_id,
                                SteadyTime deadline, std::stop_token stop) {
  if (!options_.fair) {
    return WaitForChange(key, deadline, std::move(stop));
  }
  Impl& impl = *impl_;
  const std::string etcd_key = KeyName(options_.prefix, key);
  const std::string queue = QueuePrefix(options_.prefix, key);
  const std::string me = queue + std::string(waiter_id);
  // One read-only Txn: the grant, and the head of the queue (lowest create revision).
  pb::TxnRequest txn;
  pb::RangeRequest* grant = txn.add_success()->mutable_request_range();
  grant->set_key(etcd_key);
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
  LH_RETURN_IF_ERROR(impl.Call(
      "Txn (queue read)", impl.counters_.txn,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Txn(&ctx, txn, &resp); }, &index));
  if (resp.responses_size() != 2) {
    return Status::Internal("etcd answered a two-range Txn with a different number of replies");
  }
  const auto& grant_kvs = resp.responses(0).response_range().kvs();
  const auto& head_kvs = resp.responses(1).response_range().kvs();
  if (grant_kvs.empty() && (head_kvs.empty() || head_kvs[0].key() == me)) {
    return Status();  // free, and our turn
  }
  // Wake on the grant's delete or any queue entry's delete (a waiter ahead took the key,
  // left, or died). Come back in time for the caller's next attempt to refresh our entry.
  return WatchForDeletes(impl, index, {{etcd_key, ""}, {queue, PrefixEnd(queue)}},
                         resp.header().revision() + 1, impl.QueueRefreshDue(waiter_id), deadline,
                         std::move(stop), key);
}

void EtcdBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  if (options_.fair) {
    impl_->Dequeue(key, waiter_id);
  }
}

}  // namespace leasehold::internal
