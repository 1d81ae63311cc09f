// File: bench/floor_zk.cc
//
// The ZooKeeper floor: one synchronous zoo_exists of a node that does not exist, on a session
// of the probe's own (the same C client the zk:// backend uses), so leasehold-bench can divide
// the store's figures by ZooKeeper's cheapest round trip.

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>
#include <zookeeper/zookeeper.h>

#include "backends/zookeeper/zk_options.h"
#include "bench/floor.h"
#include "core/url.h"

namespace leasehold::bench {

namespace {

struct Connected {
  std::mutex mu;
  std::condition_variable cv;
  int state = 0;
};

void Watcher(zhandle_t* /*zh*/, int type, int state, const char* /*path*/, void* ctx) {
  if (type != ZOO_SESSION_EVENT || ctx == nullptr) {
    return;
  }
  auto* connected = static_cast<Connected*>(ctx);
  std::lock_guard<std::mutex> lock(connected->mu);
  connected->state = state;
  connected->cv.notify_all();
}

void Quiet(const char* /*message*/) {}

class ZkFloor final : public FloorProbe {
 public:
  // write: setData of `path` (the durable floor) instead of exists.
  ZkFloor(zhandle_t* zh, std::unique_ptr<Connected> connected, std::string path, bool write)
      : zh_(zh), connected_(std::move(connected)), path_(std::move(path)), write_(write) {}

  ZkFloor(const ZkFloor&) = delete;
  ZkFloor& operator=(const ZkFloor&) = delete;
  ZkFloor(ZkFloor&&) = delete;
  ZkFloor& operator=(ZkFloor&&) = delete;

  ~ZkFloor() override { zookeeper_close(zh_); }

  Status Call() override {
    struct Stat stat {};

    int rc =
        write_ ? zoo_set(zh_, path_.c_str(), "x", 1, -1) : zoo_exists(zh_, path_.c_str(), 0, &stat);
    if (rc == ZOK || rc == ZNONODE) {
      return Status();
    }
    return Status::Unavailable("zoo_exists failed",
                               fmt::format("zookeeper rc {} ({})", rc, zerror(rc)));
  }

 private:
  zhandle_t* zh_;
  std::unique_ptr<Connected> connected_;  // the watcher's context, alive as long as zh_
  std::string path_;
  bool write_;
};

}  // namespace

static Result<std::unique_ptr<FloorProbe>> OpenZkProbe(const std::string& url, bool write) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(internal::ZkOptions options, internal::ZkOptions::FromUrl(parsed));
  auto connected = std::make_unique<Connected>();
  zhandle_t* zh =
      zookeeper_init2(options.hosts.c_str(), Watcher, 10'000, nullptr, connected.get(), 0, Quiet);
  if (zh == nullptr) {
    return Status::Unavailable(fmt::format("zookeeper_init2 failed: {}", std::strerror(errno)));
  }
  {
    std::unique_lock<std::mutex> lock(connected->mu);
    if (!connected->cv.wait_for(
            lock, std::chrono::duration_cast<std::chrono::milliseconds>(options.connect_timeout),
            [&] { return connected->state == ZOO_CONNECTED_STATE; })) {
      lock.unlock();
      zookeeper_close(zh);
      return Status::Unavailable(fmt::format("cannot reach ZooKeeper at {}", options.Address()));
    }
  }
  if (options.user.has_value()) {
    const std::string cert = *options.user + ":" + options.password.value_or("");
    // Synchronous enough for a probe: the next request queues behind the auth packet.
    (void)zoo_add_auth(zh, "digest", cert.data(), static_cast<int>(cert.size()), nullptr, nullptr);
  }
  if (!write) {
    return std::unique_ptr<FloorProbe>(new ZkFloor(
        zh, std::move(connected), options.chroot + "/leasehold-floor-probe-missing", false));
  }
  // A persistent scratch node (and the chroot's own node, which may not exist yet).
  const std::string path = options.chroot + "/leasehold-floor-probe-write";
  if (!options.chroot.empty()) {
    (void)zoo_create(zh, options.chroot.c_str(), "", 0, &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
  }
  int rc = zoo_create(zh, path.c_str(), "", 0, &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
  if (rc != ZOK && rc != ZNODEEXISTS) {
    zookeeper_close(zh);
    return Status::Unavailable(fmt::format("cannot create {}: {}", path, zerror(rc)));
  }
  return std::unique_ptr<FloorProbe>(new ZkFloor(zh, std::move(connected), path, true));
}

Result<std::unique_ptr<FloorProbe>> OpenZkFloor(const std::string& url) {
  return OpenZkProbe(url, /*write=*/false);
}

Result<std::unique_ptr<FloorProbe>> OpenZkDurableFloor(const std::string& url) {
  return OpenZkProbe(url, /*write=*/true);
}

}  // namespace leasehold::bench
