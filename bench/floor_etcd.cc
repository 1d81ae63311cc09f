// File: bench/floor_etcd.cc
//
// The etcd floor: one KV Range of a key that does not exist, through the same generated gRPC
// stubs the etcd:// backend uses, on a channel of its own (first endpoint of the URL; with a
// user, one Authenticate first). Plaintext etcd:// only.

#include <chrono>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "backends/etcd/etcd_options.h"
#include "core/url.h"
#include "floor.h"
#include "rpc.grpc.pb.h"

namespace leasehold::bench {

namespace {

class EtcdFloor final : public FloorProbe {
 public:
  // write: Put `key` (the durable floor) instead of a Range of it.
  EtcdFloor(std::shared_ptr<grpc::Channel> channel, std::string key, std::string token,
            std::chrono::nanoseconds timeout, bool write)
      : channel_(std::move(channel)),
        kv_(etcdserverpb::KV::NewStub(channel_)),
        token_(std::move(token)),
        timeout_(timeout),
        write_(write) {
    request_.set_key(key);
    put_.set_key(std::move(key));
    put_.set_value("x");
  }

  Status Call() override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(timeout_));
    if (!token_.empty()) {
      ctx.AddMetadata("token", token_);
    }
    if (write_) {
      etcdserverpb::PutResponse put_response;
      grpc::Status s = kv_->Put(&ctx, put_, &put_response);
      return s.ok() ? Status() : Status::Unavailable("etcd Put failed", s.error_message());
    }
    etcdserverpb::RangeResponse response;
    grpc::Status s = kv_->Range(&ctx, request_, &response);
    if (!s.ok()) {
      return Status::Unavailable("etcd Range failed", s.error_message());
    }
    if (response.kvs_size() != 0) {
      return Status::Internal("the floor probe's key exists");
    }
    return Status();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  etcdserverpb::RangeRequest request_;
  etcdserverpb::PutRequest put_;
  const std::string token_;
  const std::chrono::nanoseconds timeout_;
  const bool write_;
};

}  // namespace

static Result<std::unique_ptr<FloorProbe>> OpenEtcdProbe(const std::string& url, bool write) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(internal::EtcdOptions options, internal::EtcdOptions::FromUrl(parsed));
  if (options.tls) {
    return Status::Unimplemented("the etcd floor probe speaks plaintext etcd:// only");
  }
  auto channel = grpc::CreateChannel(options.endpoints.front(), grpc::InsecureChannelCredentials());
  std::string token;
  if (options.user) {
    auto auth = etcdserverpb::Auth::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::duration_cast<std::chrono::system_clock::duration>(options.command_timeout));
    etcdserverpb::AuthenticateRequest req;
    req.set_name(*options.user);
    req.set_password(options.password.value_or(""));
    etcdserverpb::AuthenticateResponse resp;
    grpc::Status s = auth->Authenticate(&ctx, req, &resp);
    if (!s.ok()) {
      return Status::PermissionDenied("etcd floor probe: Authenticate failed", s.error_message());
    }
    token = resp.token();
  }
  auto probe =
      std::make_unique<EtcdFloor>(channel,
                                  fmt::format("{}/leasehold-floor-probe-{}", options.prefix,
                                              write ? "scratch-write" : "missing-key"),
                                  token, options.command_timeout, write);
  // The first call connects: make it here so that Call() is one round trip.
  LH_RETURN_IF_ERROR(probe->Call());
  return std::unique_ptr<FloorProbe>(std::move(probe));
}

Result<std::unique_ptr<FloorProbe>> OpenEtcdFloor(const std::string& url) {
  return OpenEtcdProbe(url, /*write=*/false);
}

Result<std::unique_ptr<FloorProbe>> OpenEtcdDurableFloor(const std::string& url) {
  return OpenEtcdProbe(url, /*write=*/true);
}

}  // namespace leasehold::bench
