// File: backends/etcd/etcd_keepalive.cc (internal)
//
// EtcdKeepAlive: the keep-alive stream and its reader. See etcd_keepalive.h.

#include "backends/etcd/etcd_keepalive.h"

#include <atomic>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "backends/common/time.h"

namespace leasehold::internal {

namespace pb = etcdserverpb;

// One keep-alive request waiting for its answer.
struct EtcdKeepAlive::Slot {
  bool done = false;
  bool failed = false;  // the stream ended before the answer
  int64_t ttl = 0;
};

// One bidirectional LeaseKeepAlive call and the thread that reads it.
struct EtcdKeepAlive::Stream {
  std::size_t endpoint = 0;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>>
      rw;
  Mutex write_mu;  // serializes Write (gRPC allows one outstanding write per stream)
  // Guarded by EtcdKeepAlive::mu_.
  bool broken = false;
  bool auth_error = false;
  std::map<int64_t, std::deque<std::shared_ptr<Slot>>> pending;
  std::atomic<bool> finished{false};
  std::jthread reader;
};

EtcdKeepAlive::~EtcdKeepAlive() {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    MutexLock lock(&mu_);
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
}

std::shared_ptr<EtcdKeepAlive::Stream> EtcdKeepAlive::EnsureStream() {
  std::vector<std::shared_ptr<Stream>> done;
  std::shared_ptr<Stream> stream;
  bool reauth = false;
  {
    MutexLock lock(&mu_);
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
  if (reauth && client_.options().user) {
    (void)client_.Authenticate(client_.CurrentToken());
  }
  auto fresh = std::make_shared<Stream>();
  fresh->endpoint = client_.current();
  client_.AddToken(fresh->context);
  EtcdClient::Endpoint& e = client_.endpoint(fresh->endpoint);
  fresh->rw = e.lease->LeaseKeepAlive(&fresh->context);
  Stream* raw = fresh.get();
  fresh->reader = std::jthread([this, raw] { ReadStream(raw); });
  MutexLock lock(&mu_);
  if (stream_ != nullptr) {  // another thread opened one meanwhile: keep theirs
    fresh->context.TryCancel();
    retired_.push_back(std::move(fresh));
    return stream_;
  }
  // Counted here, once adopted: a stream that lost the race above carried nothing.
  client_.counters().keepalive_streams.fetch_add(1, std::memory_order_relaxed);
  stream_ = fresh;
  return fresh;
}

void EtcdKeepAlive::ReadStream(Stream* s) {
  pb::LeaseKeepAliveResponse resp;
  while (s->rw->Read(&resp)) {
    client_.counters().keepalive_responses.fetch_add(1, std::memory_order_relaxed);
    MutexLock lock(&mu_);
    auto it = s->pending.find(resp.id());
    if (it != s->pending.end() && !it->second.empty()) {
      it->second.front()->done = true;
      it->second.front()->ttl = resp.ttl();
      it->second.pop_front();
      if (it->second.empty()) {
        s->pending.erase(it);
      }
    }
    cv_.NotifyAll();
  }
  grpc::Status final_status;
  {
    MutexLock write_lock(&s->write_mu);  // Finish must not race a Write
    final_status = s->rw->Finish();
  }
  {
    MutexLock lock(&mu_);
    s->broken = true;
    s->auth_error = IsStaleToken(final_status);
    for (auto& [id, slots] : s->pending) {
      for (auto& slot : slots) {
        slot->done = true;
        slot->failed = true;
      }
    }
    s->pending.clear();
    cv_.NotifyAll();
  }
  // A stream that ended by itself (member died, lost its leader...) was on a bad endpoint.
  if (!final_status.ok() && final_status.error_code() != grpc::StatusCode::CANCELLED) {
    client_.MoveOn(s->endpoint);
  }
  s->finished.store(true);
}

std::vector<std::optional<int64_t>> EtcdKeepAlive::KeepAlive(const std::vector<int64_t>& ids) {
  std::vector<std::optional<int64_t>> result(ids.size());
  if (ids.empty()) {
    return result;
  }
  client_.counters().keepalive_rounds.fetch_add(1, std::memory_order_relaxed);
  Clock& clock = client_.clock();
  const SteadyTime deadline = clock.Now() + client_.options().command_timeout;
  std::vector<std::size_t> todo(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    todo[i] = i;
  }
  for (std::size_t attempt = 0; attempt < client_.endpoint_count() + 1 && !todo.empty();
       ++attempt) {
    if (clock.Now() >= deadline) {
      break;
    }
    std::shared_ptr<Stream> stream = EnsureStream();
    std::vector<std::shared_ptr<Slot>> slots(todo.size());
    {
      MutexLock lock(&mu_);
      for (std::size_t j = 0; j < todo.size(); ++j) {
        slots[j] = std::make_shared<Slot>();
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
        client_.counters().keepalive_requests.fetch_add(1, std::memory_order_relaxed);
        if (!stream->rw->Write(req)) {
          break;  // the reader sees the stream end and fails the slots
        }
      }
    }
    bool all_done = false;
    {
      MutexLock lock(&mu_);
      all_done =
          cv_.WaitUntil(ToSteady(deadline, clock), std::stop_token(), [&]() LH_REQUIRES(mu_) {
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
      client_.MoveOn(stream->endpoint);
    }
    std::vector<std::size_t> again;
    {
      MutexLock lock(&mu_);
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

}  // namespace leasehold::internal
