// File: backends/etcd/etcd_client.cc (internal)
//
// EtcdClient: channels, failover, auth and the background calls. See etcd_client.h.

#include "backends/etcd/etcd_client.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

namespace leasehold::internal {

namespace {

using namespace std::chrono_literals;
namespace pb = etcdserverpb;

// After a refused Authenticate (wrong user or password) no new attempt is made for this long,
// doubling up to kMaxAuthBackoff: a wrong password never turns into a tight loop of calls.
// Deterministic, not ReconnectBackoff's full jitter (backends/common/time.h): that may draw a
// wait near zero, and the floor of one second is the point here.
constexpr Duration kMinAuthBackoff = 1s;
constexpr Duration kMaxAuthBackoff = 30s;

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return std::nullopt;
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

std::chrono::system_clock::time_point GrpcDeadline(Duration from_now) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(from_now);
}

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

void CompareCreateRevision(pb::TxnRequest* txn, const std::string& key, int64_t revision) {
  pb::Compare* cmp = txn->add_compare();
  cmp->set_result(pb::Compare::EQUAL);
  cmp->set_target(pb::Compare::CREATE);
  cmp->set_key(key);
  cmp->set_create_revision(revision);
}

bool IsUnreachable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

bool IsStaleToken(const grpc::Status& s) {
  const std::string& m = s.error_message();
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         m.find("invalid auth token") != std::string::npos ||
         m.find("revision in header is old") != std::string::npos;
}

EtcdClient::EtcdClient(EtcdOptions options, Clock& clock)
    : options_(std::move(options)), clock_(clock) {}

EtcdClient::~EtcdClient() {
  WaitForBackgroundCalls();
}

Status EtcdClient::Connect() {
  grpc::ChannelArguments args;
  // Reconnect soon after a member comes back; the defaults wait up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // gRPC takes the "min reconnect backoff" as the shortest time it gives one connection attempt
  // (TCP connect plus the TLS and HTTP/2 handshakes) before it cancels it ("handshaker
  // shutdown") and fails the calls waiting on it. 100 ms failed a TLS connect on a busy machine;
  // an attempt gets as long as a command.
  args.SetInt(
      GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
      static_cast<int>(std::max<std::int64_t>(
          100, std::chrono::duration_cast<std::chrono::milliseconds>(options_.command_timeout)
                   .count())));
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
    e->cluster = pb::Cluster::NewStub(e->channel);
    e->maintenance = pb::Maintenance::NewStub(e->channel);
    endpoints_.push_back(std::move(e));
  }
  if (options_.user) {
    LH_RETURN_IF_ERROR(Authenticate(/*stale_token=*/""));
  }
  // Reachability and permission check: read one key of our prefix.
  pb::RangeRequest req;
  req.set_key(fmt::format("{}/", options_.prefix));
  req.set_range_end(PrefixEnd(req.key()));
  req.set_limit(1);
  req.set_keys_only(true);
  pb::RangeResponse resp;
  return Range("connect (Range)", req, &resp);
}

Status EtcdClient::Range(std::string_view what, const pb::RangeRequest& req,
                         pb::RangeResponse* resp, std::size_t* used_endpoint) {
  return Call(
      what, counters_.range,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Range(&ctx, req, resp); },
      used_endpoint);
}

Status EtcdClient::Txn(std::string_view what, const pb::TxnRequest& req, pb::TxnResponse* resp,
                       std::size_t* used_endpoint) {
  return Call(
      what, counters_.txn,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Txn(&ctx, req, resp); },
      used_endpoint);
}

Status EtcdClient::TxnOnce(std::string_view what, const pb::TxnRequest& req,
                           pb::TxnResponse* resp) {
  return Call(
      what, counters_.txn,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.kv->Txn(&ctx, req, resp); }, nullptr,
      /*single_member=*/true);
}

Status EtcdClient::LeaseGrant(std::string_view what, const pb::LeaseGrantRequest& req,
                              pb::LeaseGrantResponse* resp) {
  return Call(what, counters_.lease_grant, [&](Endpoint& e, grpc::ClientContext& ctx) {
    return e.lease->LeaseGrant(&ctx, req, resp);
  });
}

Status EtcdClient::LeaseRevoke(std::string_view what, const pb::LeaseRevokeRequest& req,
                               pb::LeaseRevokeResponse* resp) {
  return Call(what, counters_.lease_revoke, [&](Endpoint& e, grpc::ClientContext& ctx) {
    return e.lease->LeaseRevoke(&ctx, req, resp);
  });
}

Status EtcdClient::LeaseTimeToLive(std::string_view what, const pb::LeaseTimeToLiveRequest& req,
                                   pb::LeaseTimeToLiveResponse* resp) {
  return Call(what, counters_.lease_time_to_live, [&](Endpoint& e, grpc::ClientContext& ctx) {
    return e.lease->LeaseTimeToLive(&ctx, req, resp);
  });
}

Status EtcdClient::MemberList(std::string_view what, const pb::MemberListRequest& req,
                              pb::MemberListResponse* resp) {
  return Call(what, counters_.diagnose, [&](Endpoint& e, grpc::ClientContext& ctx) {
    return e.cluster->MemberList(&ctx, req, resp);
  });
}

Status EtcdClient::MaintenanceStatus(std::string_view what, const pb::StatusRequest& req,
                                     pb::StatusResponse* resp, std::size_t* used_endpoint) {
  return Call(
      what, counters_.diagnose,
      [&](Endpoint& e, grpc::ClientContext& ctx) { return e.maintenance->Status(&ctx, req, resp); },
      used_endpoint);
}

void EtcdClient::MoveOn(std::size_t failed) {
  if (endpoints_.size() < 2) {
    return;
  }
  std::size_t expected = failed;
  if (current_.compare_exchange_strong(expected, (failed + 1) % endpoints_.size())) {
    counters_.failovers.fetch_add(1, std::memory_order_relaxed);
  }
}

Status EtcdClient::MapError(const grpc::Status& s, std::string_view what,
                            std::string_view address) const {
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
      return Status::Internal(fmt::format("etcd at {} answered {} with gRPC code {}", address, what,
                                          static_cast<int>(s.error_code())),
                              m);
  }
}

std::string EtcdClient::CurrentToken() {
  MutexLock lock(&auth_mu_);
  return token_;
}

Status EtcdClient::Authenticate(const std::string& stale_token) {
  MutexLock lock(&auth_mu_);
  if (!token_.empty() && token_ != stale_token) {
    return Status();
  }
  const SteadyTime now = clock_.Now();
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
    ctx.set_deadline(GrpcDeadline(options_.command_timeout));
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
  Status error = IsUnreachable(last)
                     ? Status::Unavailable(fmt::format("no etcd member of {} answered Authenticate",
                                                       options_.Address()),
                                           last.error_message())
                     : MapError(last, "Authenticate", address);
  if (error.code() != StatusCode::kUnavailable) {
    auth_backoff_ = std::clamp(auth_backoff_ * 2, kMinAuthBackoff, kMaxAuthBackoff);
    auth_retry_at_ = now + auth_backoff_;
    auth_error_ = error;
  }
  return error;
}

void EtcdClient::AddToken(grpc::ClientContext& ctx) {
  const std::string token = CurrentToken();
  if (!token.empty()) {
    ctx.AddMetadata("token", token);
  }
}

void EtcdClient::BeginBackgroundCall() {
  MutexLock lock(&async_mu_);
  ++async_outstanding_;
}

void EtcdClient::EndBackgroundCall() {
  MutexLock lock(&async_mu_);
  --async_outstanding_;
  async_cv_.NotifyAll();
}

void EtcdClient::WaitForBackgroundCalls() {
  MutexLock lock(&async_mu_);
  async_cv_.Wait(std::stop_token(),
                 [this]() LH_REQUIRES(async_mu_) { return async_outstanding_ == 0; });
}

void EtcdClient::RevokeInBackground(int64_t lease_id) {
  struct RevokeCall {
    grpc::ClientContext ctx;
    pb::LeaseRevokeRequest req;
    pb::LeaseRevokeResponse resp;
  };

  auto* call = new RevokeCall();
  call->ctx.set_deadline(GrpcDeadline(options_.command_timeout));
  AddToken(call->ctx);
  call->req.set_id(lease_id);
  BeginBackgroundCall();
  counters_.lease_revoke.fetch_add(1, std::memory_order_relaxed);
  endpoints_[current_.load()]->lease->async()->LeaseRevoke(&call->ctx, &call->req, &call->resp,
                                                           [this, call](const grpc::Status&) {
                                                             delete call;
                                                             EndBackgroundCall();
                                                           });
}

std::future<grpc::Status> EtcdClient::StartRevoke(int64_t lease_id) {
  struct RevokeCall {
    grpc::ClientContext ctx;
    pb::LeaseRevokeRequest req;
    pb::LeaseRevokeResponse resp;
    std::promise<grpc::Status> done;
  };

  auto* call = new RevokeCall();
  call->ctx.set_deadline(GrpcDeadline(options_.command_timeout));
  AddToken(call->ctx);
  call->req.set_id(lease_id);
  std::future<grpc::Status> answer = call->done.get_future();
  BeginBackgroundCall();
  counters_.lease_revoke.fetch_add(1, std::memory_order_relaxed);
  endpoints_[current_.load()]->lease->async()->LeaseRevoke(&call->ctx, &call->req, &call->resp,
                                                           [this, call](grpc::Status s) {
                                                             call->done.set_value(std::move(s));
                                                             delete call;
                                                             EndBackgroundCall();
                                                           });
  return answer;
}

void EtcdClient::GrantInBackground(
    int64_t ttl_seconds,
    std::function<void(const grpc::Status&, const pb::LeaseGrantResponse&)> done) {
  struct GrantCall {
    grpc::ClientContext ctx;
    pb::LeaseGrantRequest req;
    pb::LeaseGrantResponse resp;
    std::function<void(const grpc::Status&, const pb::LeaseGrantResponse&)> done;
  };

  auto* call = new GrantCall();
  call->ctx.set_deadline(GrpcDeadline(options_.command_timeout));
  AddToken(call->ctx);
  call->req.set_ttl(ttl_seconds);
  call->done = std::move(done);
  BeginBackgroundCall();
  counters_.lease_grant.fetch_add(1, std::memory_order_relaxed);
  endpoints_[current_.load()]->lease->async()->LeaseGrant(&call->ctx, &call->req, &call->resp,
                                                          [this, call](const grpc::Status& s) {
                                                            call->done(s, call->resp);
                                                            delete call;
                                                            EndBackgroundCall();
                                                          });
}

}  // namespace leasehold::internal
