// File: bench/native_etcd.cc
//
// etcd native lock (bench/native.h), through the same generated gRPC stubs as the etcd://
// backend, on a channel of its own (first endpoint, plaintext, as bench/floor_etcd.cc):
// - one etcd lease granted when the lock opens (TTL 60 s: longer than any bench run, so no
//   keep-alive is needed; a user's session would keep it alive off the acquire path);
// - take: one Txn, create_revision(key) == 0 -> Put(key, token, lease);
// - release: one Txn, create_revision(key) == the revision of our Put -> DeleteRange (owner
//   checked: a later holder's key has another create revision);
// - wait: a Watch of the key from the refused Txn's revision + 1, delete events only; the
//   waiter retries its Txn on the first delete (or when the watch ends).

#include <chrono>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "backends/etcd/etcd_options.h"
#include "core/url.h"
#include "native.h"
#include "rpc.grpc.pb.h"

namespace leasehold::bench {
namespace {

constexpr int kLeaseTtlSeconds = 60;

class EtcdNative final : public NativeLock {
 public:
  EtcdNative(std::shared_ptr<grpc::Channel> channel, std::string key,
             std::chrono::nanoseconds timeout)
      : channel_(std::move(channel)),
        kv_(etcdserverpb::KV::NewStub(channel_)),
        watch_(etcdserverpb::Watch::NewStub(channel_)),
        lease_stub_(etcdserverpb::Lease::NewStub(channel_)),
        key_(std::move(key)),
        timeout_(timeout) {}

  Status GrantLease() {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    etcdserverpb::LeaseGrantRequest req;
    req.set_ttl(kLeaseTtlSeconds);
    etcdserverpb::LeaseGrantResponse resp;
    grpc::Status s = lease_stub_->LeaseGrant(&ctx, req, &resp);
    if (!s.ok()) {
      return Status::Unavailable("etcd LeaseGrant failed", s.error_message());
    }
    lease_ = resp.id();
    return Status();
  }

  Result<bool> TryAcquire() override {
    token_ = NativeOwnerToken();
    etcdserverpb::TxnRequest txn;
    auto* cmp = txn.add_compare();
    cmp->set_key(key_);
    cmp->set_target(etcdserverpb::Compare::CREATE);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_create_revision(0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key_);
    put->set_value(token_);
    put->set_lease(lease_);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    etcdserverpb::TxnResponse resp;
    grpc::Status s = kv_->Txn(&ctx, txn, &resp);
    if (!s.ok()) {
      return Status::Unavailable("etcd Txn (take) failed", s.error_message());
    }
    // Succeeded: the Put is the Txn's only write, so the key's create revision is the Txn's
    // revision. Refused: the revision the refusal saw, where a waiter's watch starts after.
    if (resp.succeeded()) {
      created_ = resp.header().revision();
    } else {
      refused_at_ = resp.header().revision();
    }
    return resp.succeeded();
  }

  Status Acquire(std::chrono::steady_clock::time_point deadline) override {
    for (;;) {
      LH_ASSIGN_OR_RETURN(bool got, TryAcquire());
      if (got) {
        return Status();
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::DeadlineExceeded("etcd native lock: wait timed out");
      }
      LH_RETURN_IF_ERROR(WaitForDelete(deadline));
    }
  }

  Status Release() override {
    etcdserverpb::TxnRequest txn;
    auto* cmp = txn.add_compare();
    cmp->set_key(key_);
    cmp->set_target(etcdserverpb::Compare::CREATE);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_create_revision(created_);
    txn.add_success()->mutable_request_delete_range()->set_key(key_);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    etcdserverpb::TxnResponse resp;
    grpc::Status s = kv_->Txn(&ctx, txn, &resp);
    if (!s.ok()) {
      return Status::Unavailable("etcd Txn (release) failed", s.error_message());
    }
    return resp.succeeded() ? Status() : Status::Lost("etcd native lock: not held at release");
  }

 private:
  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(timeout_));
  }

  // Returns after a delete of the key since the refusal (or the deadline, or the watch's end).
  // The watch is created without waiting for its "created" answer: events from start_revision
  // come on it whenever it was created.
  Status WaitForDelete(std::chrono::steady_clock::time_point deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(
                         deadline - std::chrono::steady_clock::now()));
    auto stream = watch_->Watch(&ctx);
    etcdserverpb::WatchRequest req;
    auto* create = req.mutable_create_request();
    create->set_key(key_);
    create->set_start_revision(refused_at_ + 1);
    create->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
    if (!stream->Write(req)) {
      (void)stream->Finish();
      return Status();  // the stream ended (deadline): the caller retries or times out
    }
    etcdserverpb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (resp.canceled() || resp.events_size() > 0) {
        break;
      }
    }
    ctx.TryCancel();
    (void)stream->Finish();
    return Status();
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_stub_;
  std::string key_;
  std::chrono::nanoseconds timeout_;
  std::int64_t lease_ = 0;
  std::int64_t created_ = 0;
  std::int64_t refused_at_ = 0;
  std::string token_;
};

}  // namespace

Result<std::unique_ptr<NativeLock>> OpenEtcdNative(const std::string& url, const std::string& key) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(internal::EtcdOptions options, internal::EtcdOptions::FromUrl(parsed));
  if (options.tls || options.user) {
    return Status::Unimplemented("the etcd native lock speaks plaintext etcd:// without auth only");
  }
  auto channel = grpc::CreateChannel(options.endpoints.front(), grpc::InsecureChannelCredentials());
  auto lock = std::make_unique<EtcdNative>(
      channel, fmt::format("{}/leasehold-native-lock/{}", options.prefix, key),
      options.command_timeout);
  LH_RETURN_IF_ERROR(lock->GrantLease());  // also connects the channel
  return std::unique_ptr<NativeLock>(std::move(lock));
}

}  // namespace leasehold::bench
