// File: backends/etcd/etcd_keepalive.h (internal)
//
// EtcdKeepAlive: the one bidirectional LeaseKeepAlive stream of an etcd:// backend, which
// carries the keep-alives of every lease it holds (its grants' shared leases, queue entries),
// and the thread that reads it. KeepAlive(ids) writes one request per lease and waits (at most
// command_timeout, on the client's Clock) for all the answers. Answers come back in request
// order per lease id: the reader hands each to the oldest request waiting for that id. A stream
// that breaks, or does not answer in time, is given up (its member is passed over) and the next
// round opens a new one on the next endpoint; the unanswered requests are sent again on it while
// the deadline lasts.
//
// Example:
//
//   EtcdKeepAlive keepalive(client);
//   std::vector<std::optional<int64_t>> ttls = keepalive.KeepAlive({lease_id});
//   if (!ttls[0]) { /* no answer in time */ } else if (*ttls[0] <= 0) { /* lease gone */ }
//
// Thread safety: thread-safe. Streams and their pending requests are guarded by mu_; writes on
// one stream are serialized by its own write_mu (gRPC allows one outstanding write per stream).
// The reader threads (one std::jthread per stream, owned by the stream) are joined here: when
// a retired stream has finished, and all of them in the destructor.

#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backends/etcd/etcd_client.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

class EtcdKeepAlive {
 public:
  // REQUIRES: `client` outlives this object and is connected.
  explicit EtcdKeepAlive(EtcdClient& client) : client_(client) {}

  EtcdKeepAlive(const EtcdKeepAlive&) = delete;
  EtcdKeepAlive& operator=(const EtcdKeepAlive&) = delete;
  EtcdKeepAlive(EtcdKeepAlive&&) = delete;
  EtcdKeepAlive& operator=(EtcdKeepAlive&&) = delete;

  // Cancels every stream and joins its reader.
  ~EtcdKeepAlive();

  // Sends one keep-alive per id and waits for the answers until command_timeout has passed.
  // Returns, per id, the TTL answered (<= 0: the lease is gone), or nullopt for no answer.
  std::vector<std::optional<int64_t>> KeepAlive(const std::vector<int64_t>& ids) LH_EXCLUDES(mu_);

 private:
  struct Stream;
  struct Slot;

  // Returns the live stream, opening one on the current endpoint if there is none. Joins the
  // readers of retired streams that have finished.
  std::shared_ptr<Stream> EnsureStream() LH_EXCLUDES(mu_);

  // The reader thread of `s`: hands each answer to its slot; at the end of the stream fails the
  // slots still waiting, and passes over the endpoint if the stream ended by itself.
  void ReadStream(Stream* s) LH_EXCLUDES(mu_);

  EtcdClient& client_;

  Mutex mu_;
  CondVar cv_{&mu_};
  std::shared_ptr<Stream> stream_ LH_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Stream>> retired_ LH_GUARDED_BY(mu_);
};

}  // namespace leasehold::internal
