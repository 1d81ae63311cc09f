// File: backends/etcd/etcd_client.h (internal)
//
// EtcdClient: the gRPC side of the etcd:// store. It owns one channel (and the KV, Lease,
// Watch, Auth, Cluster and Maintenance stubs) per endpoint, the index of the current endpoint,
// the auth token, and the call helpers every part of the store uses:
//
//   Range, Txn, LeaseGrant, LeaseRevoke, LeaseTimeToLive
//                        one unary call with the deadline (command_timeout) and the token,
//                        moving on to the next endpoint when this one is unreachable, and
//                        authenticating again once when the token went stale;
//   TxnOnce              a Txn sent to one member only, never again after no answer (fenced
//                        writes: a second copy of an applied Txn could apply it twice);
//   RevokeInBackground   LeaseRevoke without waiting for the answer;
//   StartRevoke          LeaseRevoke whose answer is collected later (a future);
//   GrantInBackground    LeaseGrant whose answer goes to a callback.
//
// The background calls hold a pointer to the client: its destructor waits for their callbacks
// (each call has a deadline, so that ends), and so must WaitForBackgroundCalls() in the
// destructor of any object their callbacks use.
//
// Included only by the etcd folder's .cc files: it brings in gRPC and the generated stubs,
// which etcd_backend.h (included by the registry) keeps out.
//
// Example:
//
//   etcdserverpb::RangeRequest req;
//   req.set_key(key);
//   etcdserverpb::RangeResponse resp;
//   LH_RETURN_IF_ERROR(client.Range("Range (inspect)", req, &resp));
//
// MemberList and MaintenanceStatus (Cluster and Maintenance services) serve Diagnose only.
//
// Thread safety: thread-safe. gRPC stubs are; the current endpoint is an atomic, the token and
// the auth backoff are guarded by auth_mu_, the count of background calls by async_mu_.

#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "backends/etcd/etcd_options.h"
#include "rpc.grpc.pb.h"
#include "rpc.pb.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// Client-side counts of calls made (EtcdBackend::Stats reads them).
struct EtcdCounters {
  std::atomic<std::uint64_t> range{0};
  std::atomic<std::uint64_t> txn{0};
  std::atomic<std::uint64_t> lease_grant{0};
  std::atomic<std::uint64_t> lease_revoke{0};
  std::atomic<std::uint64_t> lease_time_to_live{0};
  std::atomic<std::uint64_t> authenticate{0};
  // Cluster MemberList and Maintenance Status (Diagnose only).
  std::atomic<std::uint64_t> diagnose{0};
  std::atomic<std::uint64_t> keepalive_streams{0};
  std::atomic<std::uint64_t> keepalive_requests{0};
  std::atomic<std::uint64_t> keepalive_responses{0};
  std::atomic<std::uint64_t> keepalive_rounds{0};
  std::atomic<std::uint64_t> watch_streams{0};
  std::atomic<std::uint64_t> failovers{0};
  std::atomic<std::uint64_t> spare_grants{0};
  std::atomic<std::uint64_t> spare_used{0};
};

// The gRPC deadline `from_now` ahead. gRPC takes deadlines on the system clock only: this is a
// relative timeout handed to gRPC (its own timer measures it), not a time the store reasons with;
// every SteadyTime of the store is on its Clock.
std::chrono::system_clock::time_point GrpcDeadline(Duration from_now);

// The end of the range of every key that starts with `prefix` (RangeRequest.range_end).
std::string PrefixEnd(std::string prefix);

// Adds to `txn` the compare "create_revision(key) == revision": the key is that very grant
// (a create revision is unique to one creation of a key), or, for 0, does not exist.
void CompareCreateRevision(etcdserverpb::TxnRequest* txn, const std::string& key, int64_t revision);

// UNAVAILABLE or DEADLINE_EXCEEDED: the member did not answer; try the next one.
bool IsUnreachable(const grpc::Status& s);

// etcd says "invalid auth token" (UNAUTHENTICATED) when its simple token expired or the member
// restarted, and "revision in header is old" when auth changed since the token was issued:
// both are cured by a fresh Authenticate.
bool IsStaleToken(const grpc::Status& s);

class EtcdClient {
 public:
  // One member: its channel and stubs.
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
    std::unique_ptr<etcdserverpb::Cluster::Stub> cluster;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  };

  // `clock` paces the Authenticate backoff. REQUIRES: `clock` outlives the client.
  EtcdClient(EtcdOptions options, Clock& clock);

  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;
  EtcdClient(EtcdClient&&) = delete;
  EtcdClient& operator=(EtcdClient&&) = delete;

  // Waits for the callbacks of the background calls.
  ~EtcdClient();

  // Opens a channel per endpoint, authenticates if a user is given, and reads one key of the
  // prefix (reachability and permission). Returns kInvalidArgument for an unreadable TLS file,
  // else as Call.
  Status Connect();

  // One unary call each, through Call (below): `what` names it in messages. Range and Txn set
  // *used_endpoint to the endpoint that answered (a watch that follows goes to the same one).
  Status Range(std::string_view what, const etcdserverpb::RangeRequest& req,
               etcdserverpb::RangeResponse* resp, std::size_t* used_endpoint = nullptr);
  Status Txn(std::string_view what, const etcdserverpb::TxnRequest& req,
             etcdserverpb::TxnResponse* resp, std::size_t* used_endpoint = nullptr);
  // As Txn, sent to the current member only: an unreachable member moves the current endpoint
  // on (for the caller's next call) and the Txn is not sent again, because an unanswered Txn may
  // have been applied and a second copy could apply it twice (a fenced write whose ops are not
  // idempotent, or that a later write of the same holder overtook). Returns kUnavailable then.
  Status TxnOnce(std::string_view what, const etcdserverpb::TxnRequest& req,
                 etcdserverpb::TxnResponse* resp);
  Status LeaseGrant(std::string_view what, const etcdserverpb::LeaseGrantRequest& req,
                    etcdserverpb::LeaseGrantResponse* resp);
  Status LeaseRevoke(std::string_view what, const etcdserverpb::LeaseRevokeRequest& req,
                     etcdserverpb::LeaseRevokeResponse* resp);
  Status LeaseTimeToLive(std::string_view what, const etcdserverpb::LeaseTimeToLiveRequest& req,
                         etcdserverpb::LeaseTimeToLiveResponse* resp);
  // Cluster MemberList and Maintenance Status (of the member that answers: *used_endpoint),
  // for Diagnose.
  Status MemberList(std::string_view what, const etcdserverpb::MemberListRequest& req,
                    etcdserverpb::MemberListResponse* resp);
  Status MaintenanceStatus(std::string_view what, const etcdserverpb::StatusRequest& req,
                           etcdserverpb::StatusResponse* resp, std::size_t* used_endpoint);

  // Moves the current endpoint past `failed` (unless another thread already did).
  void MoveOn(std::size_t failed);

  // Maps a failed call to a Status (kPermissionDenied for auth refusals, kUnavailable for an
  // unreachable or overloaded member, kInternal otherwise).
  Status MapError(const grpc::Status& s, std::string_view what, std::string_view address) const;

  // Fetches a new token unless another thread already replaced `stale_token`. After a refusal
  // it does not ask again before the backoff has passed: callers get the remembered error.
  Status Authenticate(const std::string& stale_token) LH_EXCLUDES(auth_mu_);

  std::string CurrentToken() LH_EXCLUDES(auth_mu_);

  // Adds the auth token (if any) to a call's metadata.
  void AddToken(grpc::ClientContext& ctx) LH_EXCLUDES(auth_mu_);

  // Sends LeaseRevoke on the current endpoint without waiting for the answer (a lease granted
  // for a failed try, a spare nobody needs).
  void RevokeInBackground(int64_t lease_id) LH_EXCLUDES(async_mu_);

  // Sends LeaseRevoke on the current endpoint; the future holds its answer.
  std::future<grpc::Status> StartRevoke(int64_t lease_id) LH_EXCLUDES(async_mu_);

  // Sends LeaseGrant(ttl_seconds) on the current endpoint; `done` runs on a gRPC thread with
  // the answer. REQUIRES: whatever `done` uses outlives the call (see the file comment).
  void GrantInBackground(
      int64_t ttl_seconds,
      std::function<void(const grpc::Status&, const etcdserverpb::LeaseGrantResponse&)> done)
      LH_EXCLUDES(async_mu_);

  // Returns once no background call is outstanding.
  void WaitForBackgroundCalls() LH_EXCLUDES(async_mu_);

  Endpoint& endpoint(std::size_t i) { return *endpoints_[i]; }

  [[nodiscard]] std::size_t endpoint_count() const { return endpoints_.size(); }

  [[nodiscard]] std::size_t current() const { return current_.load(); }

  [[nodiscard]] const EtcdOptions& options() const { return options_; }

  [[nodiscard]] Clock& clock() const { return clock_; }

  EtcdCounters& counters() { return counters_; }

 private:
  // Runs one unary call `fn(endpoint, context)` with the deadline and the auth token, moving on
  // to the next endpoint when this one is unreachable (each endpoint is tried once; with
  // `single_member`, only the current one), and authenticating again once when the token went
  // stale (a refusal: nothing was applied). Counts the call in `counter`. Maps the final gRPC
  // status (kUnavailable when no member answered); sets *used_endpoint to the endpoint that
  // answered.
  template <typename Fn>
  Status Call(std::string_view what, std::atomic<std::uint64_t>& counter, Fn&& fn,
              std::size_t* used_endpoint = nullptr, bool single_member = false);

  // Counts a background call in (Begin) and out (End, from its callback).
  void BeginBackgroundCall() LH_EXCLUDES(async_mu_);
  void EndBackgroundCall() LH_EXCLUDES(async_mu_);

  // Immutable after construction (endpoints_: after Connect, which runs before any other call).
  const EtcdOptions options_;
  Clock& clock_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;

  EtcdCounters counters_;
  std::atomic<std::size_t> current_{0};

  Mutex auth_mu_;
  std::string token_ LH_GUARDED_BY(auth_mu_);
  Status auth_error_ LH_GUARDED_BY(auth_mu_);
  SteadyTime auth_retry_at_ LH_GUARDED_BY(auth_mu_){};
  Duration auth_backoff_ LH_GUARDED_BY(auth_mu_){};

  Mutex async_mu_;
  CondVar async_cv_{&async_mu_};
  int async_outstanding_ LH_GUARDED_BY(async_mu_) = 0;
};

template <typename Fn>
Status EtcdClient::Call(std::string_view what, std::atomic<std::uint64_t>& counter, Fn&& fn,
                        std::size_t* used_endpoint, bool single_member) {
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
    ctx.set_deadline(GrpcDeadline(options_.command_timeout));
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
      if (single_member) {
        break;
      }
      continue;
    }
    if (options_.user && !reauthenticated && IsStaleToken(last)) {
      reauthenticated = true;
      LH_RETURN_IF_ERROR(Authenticate(token));
      continue;
    }
    return MapError(last, what, e.address);
  }
  if (single_member) {
    return Status::Unavailable(
        fmt::format("etcd member {} did not answer {} within {} ms (not sent again: it may have "
                    "been applied)",
                    last_address, what,
                    std::chrono::duration_cast<std::chrono::milliseconds>(options_.command_timeout)
                        .count()),
        last.error_message());
  }
  return Status::Unavailable(
      fmt::format(
          "no etcd member of {} answered {} within {} ms", options_.Address(), what,
          std::chrono::duration_cast<std::chrono::milliseconds>(options_.command_timeout).count()),
      fmt::format("{}: {}", last_address, last.error_message()));
}

}  // namespace leasehold::internal
