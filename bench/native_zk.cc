// File: bench/native_zk.cc
//
// ZooKeeper native lock (bench/native.h) on the same C client as the zk:// backend, a session
// of its own: take = create the fixed ephemeral node <chroot>/leasehold-native-lock-<key>
// (ZNODEEXISTS: held); release = delete it at version 0. That is owner-checked by the
// session: the node is ephemeral and only one can exist, so while this session is alive (a
// request on an expired session fails) a node at that path created by our create is ours. A
// waiter sets an exists watch on the node and retries its create when the watch fires.

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>
#include <zookeeper/zookeeper.h>

#include "backends/zookeeper/zk_options.h"
#include "bench/native.h"
#include "core/url.h"

namespace leasehold::bench {
namespace {

// Session state and watch events, from the client's event thread.
struct Events {
  std::mutex mu;
  std::condition_variable cv;
  int state = 0;
  std::uint64_t node_events = 0;
};

void SessionWatcher(zhandle_t* /*zh*/, int type, int state, const char* /*path*/, void* ctx) {
  if (type != ZOO_SESSION_EVENT || ctx == nullptr) {
    return;
  }
  auto* events = static_cast<Events*>(ctx);
  std::lock_guard<std::mutex> lock(events->mu);
  events->state = state;
  events->cv.notify_all();
}

void NodeWatcher(zhandle_t* /*zh*/, int /*type*/, int /*state*/, const char* /*path*/, void* ctx) {
  auto* events = static_cast<Events*>(ctx);
  std::lock_guard<std::mutex> lock(events->mu);
  ++events->node_events;
  events->cv.notify_all();
}

void Quiet(const char* /*message*/) {}

class ZkNative final : public NativeLock {
 public:
  ZkNative(zhandle_t* zh, std::unique_ptr<Events> events, std::string path)
      : zh_(zh), events_(std::move(events)), path_(std::move(path)) {}

  ~ZkNative() override { zookeeper_close(zh_); }

  ZkNative(const ZkNative&) = delete;
  ZkNative& operator=(const ZkNative&) = delete;

  Result<bool> TryAcquire() override {
    int rc = zoo_create(zh_, path_.c_str(), "", 0, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL, nullptr, 0);
    if (rc == ZOK) {
      return true;
    }
    if (rc == ZNODEEXISTS) {
      return false;
    }
    return Status::Unavailable(fmt::format("zoo_create: {}", zerror(rc)));
  }

  Status Acquire(std::chrono::steady_clock::time_point deadline) override {
    for (;;) {
      LH_ASSIGN_OR_RETURN(bool got, TryAcquire());
      if (got) {
        return Status();
      }
      std::uint64_t seen = 0;
      {
        std::lock_guard<std::mutex> lock(events_->mu);
        seen = events_->node_events;
      }

      struct Stat stat {};

      int rc = zoo_wexists(zh_, path_.c_str(), NodeWatcher, events_.get(), &stat);
      if (rc == ZNONODE) {
        continue;  // deleted meanwhile: try again (the watch set stays, and is harmless)
      }
      if (rc != ZOK) {
        return Status::Unavailable(fmt::format("zoo_wexists: {}", zerror(rc)));
      }
      std::unique_lock<std::mutex> lock(events_->mu);
      if (!events_->cv.wait_until(lock, deadline, [&] { return events_->node_events != seen; })) {
        return Status::DeadlineExceeded("zk native lock: wait timed out");
      }
    }
  }

  Status Release() override {
    int rc = zoo_delete(zh_, path_.c_str(), 0);
    if (rc == ZOK) {
      return Status();
    }
    return rc == ZNONODE || rc == ZBADVERSION
               ? Status::Lost("zk native lock: not held at release")
               : Status::Unavailable(fmt::format("zoo_delete: {}", zerror(rc)));
  }

 private:
  zhandle_t* zh_;
  std::unique_ptr<Events> events_;  // the watchers' context, alive as long as zh_
  std::string path_;
};

}  // namespace

Result<std::unique_ptr<NativeLock>> OpenZkNative(const std::string& url, const std::string& key) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(internal::ZkOptions options, internal::ZkOptions::FromUrl(parsed));
  auto events = std::make_unique<Events>();
  zhandle_t* zh = zookeeper_init2(options.hosts.c_str(), SessionWatcher, 10'000, nullptr,
                                  events.get(), 0, Quiet);
  if (zh == nullptr) {
    return Status::Unavailable(fmt::format("zookeeper_init2 failed: {}", std::strerror(errno)));
  }
  {
    std::unique_lock<std::mutex> lock(events->mu);
    if (!events->cv.wait_for(
            lock, std::chrono::duration_cast<std::chrono::milliseconds>(options.connect_timeout),
            [&] { return events->state == ZOO_CONNECTED_STATE; })) {
      lock.unlock();
      zookeeper_close(zh);
      return Status::Unavailable(fmt::format("cannot reach ZooKeeper at {}", options.Address()));
    }
  }
  if (options.user.has_value()) {
    const std::string cert = *options.user + ":" + options.password.value_or("");
    (void)zoo_add_auth(zh, "digest", cert.data(), static_cast<int>(cert.size()), nullptr, nullptr);
  }
  if (!options.chroot.empty()) {
    (void)zoo_create(zh, options.chroot.c_str(), "", 0, &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
  }
  std::string name = key;
  for (char& c : name) {
    c = c == '/' ? '_' : c;
  }
  return std::unique_ptr<NativeLock>(new ZkNative(
      zh, std::move(events), fmt::format("{}/leasehold-native-lock-{}", options.chroot, name)));
}

}  // namespace leasehold::bench
