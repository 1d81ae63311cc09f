// File: backends/zookeeper/zk_session.cc (internal)
//
// The C client glue of the zk:// store: sessions, asynchronous requests waited for with a bound,
// watches and the rc mapping. See zk_session.h.

#include "backends/zookeeper/zk_session.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "backends/common/time.h"
#include "core/logging.h"

namespace leasehold::internal {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

// One asynchronous request's reply, shared by the waiting caller and the completion callback
// (which may run after the caller gave up).
struct ZkReply {
  Mutex mu;
  CondVar cv{&mu};
  bool done LH_GUARDED_BY(mu) = false;
  int rc LH_GUARDED_BY(mu) = ZOPERATIONTIMEOUT;
  ZkAnswer answer LH_GUARDED_BY(mu);
  // Buffers the C client writes into when the reply comes (ZkRequests::Multi). Set before the
  // request is sent.
  std::shared_ptr<void> extra;

  void Finish(int code) LH_REQUIRES(mu) {
    rc = code;
    done = true;
    cv.NotifyAll();
  }
};

// Exactly one of waker (a wait's wake-up) and node (a grant's node watch) is set.
struct ZkSession::WatchContext {
  std::shared_ptr<ZkWaker> waker;
  std::shared_ptr<ZkNodeWatch> node;
  ZkSession* session = nullptr;
  std::string exists_path;  // an exists watch's (ZkPending::WatchExists): its exists_watches_ key
};

namespace {

using ReplyPtr = std::shared_ptr<ZkReply>;

// C client log lines go to leasehold's log (debug level: a reconnect is noisy and expected; the
// backend logs what matters itself).
void ZkLogCallback(const char* message) {
  if (!LogEnabled(LogLevel::kDebug) || message == nullptr) {
    return;
  }
  std::string_view line(message);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) {
    line.remove_suffix(1);
  }
  Log(LogLevel::kDebug, fmt::format("zookeeper client: {}", line));
}

void* Hold(const ReplyPtr& reply) {
  return new ReplyPtr(reply);
}

// Takes back the reference handed to the C client in Hold().
ReplyPtr Take(const void* data) {
  auto* holder = static_cast<ReplyPtr*>(const_cast<void*>(data));
  ReplyPtr reply = std::move(*holder);
  delete holder;
  return reply;
}

// Sends one request through `send` (a zoo_a* call, given the completion's data pointer). If it
// cannot even be queued, the reply is finished at once with the client's rc.
template <typename Send>
ReplyPtr StartReply(Send send) {
  auto reply = std::make_shared<ZkReply>();
  void* data = Hold(reply);
  if (int rc = send(data); rc != ZOK) {
    Take(data);
    MutexLock lock(&reply->mu);
    reply->Finish(rc);
  }
  return reply;
}

// Waits for `reply` until `deadline` on `clock`. Returns its rc, or ZOPERATIONTIMEOUT if no
// reply came in time; copies the answer where ZOK.
int AwaitReply(ZkReply& reply, Clock& clock, SteadyTime deadline, ZkAnswer* answer) {
  MutexLock lock(&reply.mu);
  if (!reply.cv.WaitUntil(ToSteady(deadline, clock), std::stop_token(),
                          [&]() LH_REQUIRES(reply.mu) { return reply.done; })) {
    return ZOPERATIONTIMEOUT;
  }
  if (reply.rc == ZOK && answer != nullptr) {
    *answer = reply.answer;
  }
  return reply.rc;
}

void StatCompletion(int rc, const struct Stat* stat, const void* data) {
  ReplyPtr reply = Take(data);
  MutexLock lock(&reply->mu);
  if (rc == ZOK && stat != nullptr) {
    reply->answer.stat = *stat;
  }
  reply->Finish(rc);
}

void DataCompletion(int rc, const char* value, int value_len, const struct Stat* stat,
                    const void* data) {
  ReplyPtr reply = Take(data);
  MutexLock lock(&reply->mu);
  if (rc == ZOK) {
    if (value != nullptr && value_len > 0) {
      reply->answer.value.assign(value, static_cast<std::size_t>(value_len));
    }
    if (stat != nullptr) {
      reply->answer.stat = *stat;
    }
  }
  reply->Finish(rc);
}

void StringsCompletion(int rc, const struct String_vector* strings, const void* data) {
  ReplyPtr reply = Take(data);
  MutexLock lock(&reply->mu);
  if (rc == ZOK && strings != nullptr) {
    for (int i = 0; i < strings->count; ++i) {
      reply->answer.strings.emplace_back(strings->data[i]);
    }
  }
  reply->Finish(rc);
}

void StringStatCompletion(int rc, const char* value, const struct Stat* stat, const void* data) {
  ReplyPtr reply = Take(data);
  MutexLock lock(&reply->mu);
  if (rc == ZOK) {
    if (value != nullptr) {
      reply->answer.value = value;
    }
    if (stat != nullptr) {
      reply->answer.stat = *stat;
    }
  }
  reply->Finish(rc);
}

void AclCompletion(int rc, struct ACL_vector* acl, struct Stat* stat, const void* data) {
  ReplyPtr reply = Take(data);
  MutexLock lock(&reply->mu);
  if (rc == ZOK) {
    if (acl != nullptr) {
      for (int i = 0; i < acl->count; ++i) {
        const struct ACL& a = acl->data[i];
        reply->answer.acl.push_back({.perms = a.perms,
                                     .scheme = a.id.scheme != nullptr ? a.id.scheme : "",
                                     .id = a.id.id != nullptr ? a.id.id : ""});
      }
    }
    if (stat != nullptr) {
      reply->answer.stat = *stat;
    }
  }
  reply->Finish(rc);
}

void VoidCompletion(int rc, const void* data) {
  ReplyPtr reply = Take(data);
  MutexLock lock(&reply->mu);
  reply->Finish(rc);
}

void StringCompletion(int rc, const char* /*value*/, const void* data) {
  VoidCompletion(rc, data);
}

struct MultiBuffers {
  explicit MultiBuffers(std::size_t n) : results(n), stats(n), paths(n) {}

  std::vector<zoo_op_result_t> results;
  std::vector<struct Stat> stats;
  std::vector<std::array<char, 1024>> paths;
};

}  // namespace

bool IsZkTransient(int rc) {
  return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONMOVED ||
         rc == ZCLOSING || rc == ZNOTHING;
}

bool IsZkSessionGone(int rc) {
  return rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE;
}

Status ZkErrorStatus(int rc, std::string_view what, const ZkOptions& options) {
  std::string detail = fmt::format("zookeeper rc {} ({})", rc, zerror(rc));
  if (IsZkTransient(rc)) {
    return Status::Unavailable(
        fmt::format("ZooKeeper at {} did not answer {} in time", options.Address(), what), detail);
  }
  if (rc == ZNOAUTH || rc == ZAUTHFAILED || rc == ZINVALIDACL) {
    return Status::PermissionDenied(
        fmt::format("ZooKeeper at {} refused {}: the node's ACL does not allow this client ({}); "
                    "check the zk://user:password@ credentials",
                    options.Address(), what,
                    options.user ? "digest user " + *options.user : "no credentials"),
        detail);
  }
  if (IsZkSessionGone(rc)) {
    return Status::Unavailable(
        fmt::format("ZooKeeper session expired during {} at {}", what, options.Address()), detail);
  }
  return {StatusCode::kInternal,
          fmt::format("unexpected ZooKeeper reply to {} at {}", what, options.Address()), detail};
}

void SetUpZkClientLogging() {
  static std::once_flag once;
  std::call_once(once, [] { zoo_set_debug_level(ZOO_LOG_LEVEL_WARN); });
}

// ---- ZkSession ----

Result<std::shared_ptr<ZkSession>> ZkSession::Open(const ZkOptions& options, Duration timeout,
                                                   Clock& clock) {
  std::shared_ptr<ZkSession> session(new ZkSession(clock));
  const int timeout_ms = static_cast<int>(std::clamp<std::int64_t>(
      duration_cast<milliseconds>(timeout).count(), 1, std::numeric_limits<int>::max()));
  // From here the client's threads may call Watcher, which touches only the guarded state.
  session->zh_ = zookeeper_init2(options.hosts.c_str(), &ZkSession::Watcher, timeout_ms, nullptr,
                                 session.get(), 0, &ZkLogCallback);
  if (session->zh_ == nullptr) {
    return Status::InvalidArgument(fmt::format("ZooKeeper client refused the host list {}: {}",
                                               options.hosts, std::strerror(errno)));
  }
  const SteadyTime connect_deadline =
      clock.Now() + duration_cast<milliseconds>(options.connect_timeout);
  {
    ZkSession& s = *session;
    MutexLock lock(&s.mu_);
    s.cv_.WaitUntil(ToSteady(connect_deadline, clock), std::stop_token(), [&]() LH_REQUIRES(s.mu_) {
      return s.state_ == ZOO_CONNECTED_STATE || s.expired_ || s.auth_failed_;
    });
    if (s.state_ != ZOO_CONNECTED_STATE) {
      return Status::Unavailable(
          fmt::format("cannot reach ZooKeeper at {} within {} ms", options.Address(),
                      duration_cast<milliseconds>(options.connect_timeout).count()));
    }
  }
  session->negotiated_ = milliseconds(zoo_recv_timeout(session->zh_));
  session->session_id_ = zoo_client_id(session->zh_)->client_id;
  if (options.user.has_value()) {
    const std::string cert = *options.user + ":" + options.password.value_or("");
    ReplyPtr reply = StartReply([&](void* data) {
      return zoo_add_auth(session->zh_, "digest", cert.data(), static_cast<int>(cert.size()),
                          VoidCompletion, data);
    });
    const int rc =
        AwaitReply(*reply, clock, clock.Now() + options.command_timeout, /*answer=*/nullptr);
    if (rc != ZOK) {
      return ZkErrorStatus(rc, "digest authentication", options);
    }
  }
  LogEvent(LogLevel::kDebug, "zk_session_opened",
           {{"address", options.Address()},
            {"requested_ms", std::to_string(timeout_ms)},
            {"negotiated_ms",
             std::to_string(duration_cast<milliseconds>(session->negotiated_).count())}});
  return session;
}

ZkSession::~ZkSession() {
  if (zh_ != nullptr) {
    zookeeper_close(zh_);  // joins the client's threads: no callback runs after this
  }
  for (WatchContext* watch : watches_) {
    delete watch;
  }
}

void ZkSession::Watcher(zhandle_t* /*zh*/, int type, int state, const char* /*path*/, void* ctx) {
  if (type != ZOO_SESSION_EVENT || ctx == nullptr) {
    return;
  }
  auto* self = static_cast<ZkSession*>(ctx);
  self->epoch_.fetch_add(1, std::memory_order_acq_rel);
  MutexLock lock(&self->mu_);
  self->state_ = state;
  if (state == ZOO_EXPIRED_SESSION_STATE) {
    self->expired_ = true;
  }
  if (state == ZOO_AUTH_FAILED_STATE) {
    self->auth_failed_ = true;
  }
  self->cv_.NotifyAll();
}

// Data watches fire once; session events reach every watcher and leave it registered, so the
// context goes only on a node event or the session's end.
void ZkSession::NodeWatcher(zhandle_t* /*zh*/, int type, int state, const char* /*path*/,
                            void* ctx) {
  auto* watch = static_cast<WatchContext*>(ctx);
  if (watch->node != nullptr) {
    // A grant's node: only a node event or the session's end says anything; a disconnect or a
    // reconnect leaves the watch registered (the client re-registers it).
    int seen = ZkNodeWatch::kLive;
    if (type == ZOO_DELETED_EVENT) {
      seen = ZkNodeWatch::kDeleted;
    } else if (type != ZOO_SESSION_EVENT) {
      seen = ZkNodeWatch::kChanged;  // a change, or the watch removed: no longer watched
    } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
      seen = ZkNodeWatch::kSessionEnded;
    }
    if (seen != ZkNodeWatch::kLive) {
      int live = ZkNodeWatch::kLive;
      (void)watch->node->state.compare_exchange_strong(live, seen, std::memory_order_acq_rel);
    }
  } else {
    ZkWaker& waker = *watch->waker;
    {
      MutexLock lock(&waker.mu);
      if (!waker.fired) {
        waker.type = type;
      }
      waker.fired = true;
    }
    waker.cv.NotifyAll();
  }
  if (type != ZOO_SESSION_EVENT || state == ZOO_EXPIRED_SESSION_STATE ||
      state == ZOO_AUTH_FAILED_STATE) {
    (void)watch->session->ReleaseWatch(watch);
  }
}

bool ZkSession::Expired() {
  MutexLock lock(&mu_);
  return expired_ || auth_failed_;
}

void ZkSession::AddWatch(WatchContext* watch) {
  MutexLock lock(&mu_);
  watches_.insert(watch);
}

bool ZkSession::ReleaseWatch(WatchContext* watch) {
  {
    MutexLock lock(&mu_);
    if (watches_.erase(watch) == 0) {
      return false;
    }
    if (!watch->exists_path.empty()) {
      auto it = exists_watches_.find(watch->exists_path);
      if (it != exists_watches_.end() && it->second == watch) {
        exists_watches_.erase(it);
      }
    }
  }
  delete watch;
  return true;
}

void ZkSession::NoteHeard(SteadyTime t_send) {
  const std::int64_t t = t_send.time_since_epoch().count();
  std::int64_t seen = last_heard_.load(std::memory_order_acquire);
  while (seen < t && !last_heard_.compare_exchange_weak(seen, t, std::memory_order_acq_rel)) {
  }
}

SteadyTime ZkSession::last_heard() const {
  return SteadyTime(SteadyTime::duration(last_heard_.load(std::memory_order_acquire)));
}

int ZkSession::ConnectedPort() const {
  struct sockaddr_storage addr {};

  socklen_t len = sizeof(addr);
  if (zookeeper_get_connected_host(zh_, reinterpret_cast<struct sockaddr*>(&addr), &len) ==
      nullptr) {
    return -1;
  }
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<struct sockaddr_in*>(&addr)->sin_port);
  }
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<struct sockaddr_in6*>(&addr)->sin6_port);
  }
  return -1;
}

// ---- ZkPending ----

Result<std::string> ZkSession::FourLetterWord(std::string_view word, Duration timeout) const {
  const SteadyTime deadline = clock_.Now() + timeout;

  struct sockaddr_storage addr {};

  socklen_t len = sizeof(addr);
  if (zookeeper_get_connected_host(zh_, reinterpret_cast<struct sockaddr*>(&addr), &len) ==
      nullptr) {
    return Status::Unavailable("the session is not connected to a ZooKeeper server");
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return Status::Unavailable(fmt::format("socket: {}", std::strerror(errno)));
  }

  struct Closer {
    int fd;

    ~Closer() { close(fd); }
  } closer{fd};

  // Waits for `events` on the socket until the deadline: false if it passed first.
  auto wait = [&](short events) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_.Now()).count();
      if (left <= 0) {
        return false;
      }
      struct pollfd p {
        .fd = fd, .events = events, .revents = 0
      };
      const int n = poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, 1000)));
      if (n > 0) {
        return true;
      }
      if (n < 0 && errno != EINTR) {
        return false;
      }
    }
  };
  const std::string what = fmt::format("the four-letter word {}", word);
  if (connect(fd, reinterpret_cast<struct sockaddr*>(&addr), len) != 0) {
    int err = errno;
    if (err == EINPROGRESS) {
      if (!wait(POLLOUT)) {
        return Status::Unavailable(fmt::format("{}: no connection in time", what));
      }
      socklen_t err_len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
    }
    if (err != 0 && err != EINPROGRESS) {
      return Status::Unavailable(fmt::format("{}: connect: {}", what, std::strerror(err)));
    }
  }
  std::string_view rest = word;
  while (!rest.empty()) {
    const ssize_t n = send(fd, rest.data(), rest.size(), MSG_NOSIGNAL);
    if (n > 0) {
      rest.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait(POLLOUT)) {
        return Status::Unavailable(fmt::format("{}: not sent in time", what));
      }
    } else {
      return Status::Unavailable(fmt::format("{}: send: {}", what, std::strerror(errno)));
    }
  }
  constexpr std::size_t kMaxAnswer = 64 * 1024;
  std::string out;
  std::array<char, 4096> buf{};
  while (out.size() < kMaxAnswer) {
    const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
    if (n > 0) {
      out.append(buf.data(), static_cast<std::size_t>(n));
    } else if (n == 0) {
      break;  // the server closes the connection after its answer
    } else if (errno == EAGAIN || errno == EINTR) {
      if (!wait(POLLIN)) {
        return Status::Unavailable(fmt::format("{}: no answer in time", what));
      }
    } else {
      return Status::Unavailable(fmt::format("{}: recv: {}", what, std::strerror(errno)));
    }
  }
  return out;
}

ZkPending ZkPending::Exists(ZkSession& session, const std::string& path) {
  return {session.clock(), StartReply([&](void* data) {
            return zoo_aexists(session.zh(), path.c_str(), 0, StatCompletion, data);
          })};
}

ZkPending ZkPending::GetAcl(ZkSession& session, const std::string& path) {
  return {session.clock(), StartReply([&](void* data) {
            return zoo_aget_acl(session.zh(), path.c_str(), AclCompletion, data);
          })};
}

ZkPending ZkPending::Get(ZkSession& session, const std::string& path) {
  return {session.clock(), StartReply([&](void* data) {
            return zoo_aget(session.zh(), path.c_str(), 0, DataCompletion, data);
          })};
}

ZkPending ZkPending::Children(ZkSession& session, const std::string& path) {
  return {session.clock(), StartReply([&](void* data) {
            return zoo_aget_children(session.zh(), path.c_str(), 0, StringsCompletion, data);
          })};
}

ZkPending ZkPending::Create(ZkSession& session, const std::string& path, std::string_view value,
                            const struct ACL_vector* acl, int mode) {
  return {session.clock(), StartReply([&](void* data) {
            return zoo_acreate2(session.zh(), path.c_str(), value.data(),
                                static_cast<int>(value.size()), acl, mode, StringStatCompletion,
                                data);
          })};
}

ZkPending ZkPending::Delete(ZkSession& session, const std::string& path, int version) {
  return {session.clock(), StartReply([&](void* data) {
            return zoo_adelete(session.zh(), path.c_str(), version, VoidCompletion, data);
          })};
}

ZkPending ZkPending::Set(ZkSession& session, const std::string& path, std::string_view value,
                         int version) {
  return {session.clock(), StartReply([&](void* data) {
            return zoo_aset(session.zh(), path.c_str(), value.data(),
                            static_cast<int>(value.size()), version, StatCompletion, data);
          })};
}

ZkPending ZkPending::Sync(ZkSession& session) {
  return {session.clock(), StartReply([&](void* data) {
            return zoo_async(session.zh(), "/", StringCompletion, data);
          })};
}

namespace {

// What a WatchGet's completion needs to free the watch context when no watch was left.
struct WatchGetExtra {
  ZkSession* session = nullptr;
  void* context = nullptr;
  bool (*release)(ZkSession*, void*) = nullptr;
};

void WatchGetCompletion(int rc, const char* value, int value_len, const struct Stat* stat,
                        const void* data) {
  ReplyPtr reply = Take(data);
  if (rc == ZNONODE) {
    // No watch was left with the client: its context goes now (the session outlives the
    // completion thread, which zookeeper_close joins).
    const auto* extra = static_cast<const WatchGetExtra*>(reply->extra.get());
    (void)extra->release(extra->session, extra->context);
  }
  MutexLock lock(&reply->mu);
  if (rc == ZOK) {
    if (value != nullptr && value_len > 0) {
      reply->answer.value.assign(value, static_cast<std::size_t>(value_len));
    }
    if (stat != nullptr) {
      reply->answer.stat = *stat;
    }
  }
  reply->Finish(rc);
}

}  // namespace

ZkPending ZkPending::WatchGet(ZkSession& session, const std::string& path,
                              const std::shared_ptr<ZkNodeWatch>& node) {
  auto* watch = new ZkSession::WatchContext{.node = node, .session = &session};
  session.AddWatch(watch);
  auto reply = std::make_shared<ZkReply>();
  auto extra = std::make_shared<WatchGetExtra>();
  extra->session = &session;
  extra->context = watch;
  extra->release = [](ZkSession* s, void* w) {
    return s->ReleaseWatch(static_cast<ZkSession::WatchContext*>(w));
  };
  reply->extra = extra;
  void* data = Hold(reply);
  if (int rc = zoo_awget(session.zh(), path.c_str(), &ZkSession::NodeWatcher, watch,
                         WatchGetCompletion, data);
      rc != ZOK) {
    Take(data);
    (void)session.ReleaseWatch(watch);
    MutexLock lock(&reply->mu);
    reply->Finish(rc);
  }
  return {session.clock(), std::move(reply)};
}

ZkPending ZkPending::WatchExists(ZkSession& session, const std::string& path,
                                 std::shared_ptr<ZkNodeWatch>* node) {
  auto reply = std::make_shared<ZkReply>();
  void* data = Hold(reply);
  // The session's lock is held across the send, so the context cannot fire and be freed
  // between the lookup and the registration (the watcher takes this lock; zoo_awexists only
  // queues the request).
  int rc = ZOK;
  {
    MutexLock lock(&session.mu_);
    if (session.exists_watches_.size() >= ZkSession::kMaxExistsWatches &&
        session.exists_watches_.count(path) == 0) {
      rc = ZNOWATCHER;  // none set (see kMaxExistsWatches): answered below
    } else {
      ZkSession::WatchContext*& watch = session.exists_watches_[path];
      const bool fresh = watch == nullptr;
      if (fresh) {
        watch = new ZkSession::WatchContext{
            .node = std::make_shared<ZkNodeWatch>(), .session = &session, .exists_path = path};
        session.watches_.insert(watch);
      }
      *node = watch->node;
      rc = zoo_awexists(session.zh(), path.c_str(), &ZkSession::NodeWatcher, watch, StatCompletion,
                        data);
      if (rc != ZOK && fresh) {
        session.watches_.erase(watch);
        delete watch;
        session.exists_watches_.erase(path);
      }
    }
  }
  if (rc != ZOK) {
    Take(data);
    MutexLock reply_lock(&reply->mu);  // alone: the session's lock is released
    reply->Finish(rc);
  }
  return {session.clock(), std::move(reply)};
}

int ZkPending::Await(SteadyTime deadline, ZkAnswer* answer) {
  return AwaitReply(*reply_, *clock_, deadline, answer);
}

// ---- ZkRequests ----

ZkRequests::ZkRequests(ZkSession& session, Duration timeout)
    : session_(&session), deadline_(session.clock().Now() + duration_cast<milliseconds>(timeout)) {}

int ZkRequests::Exists(const std::string& path, struct Stat* stat) {
  ZkAnswer answer;
  const int rc = ZkPending::Exists(*session_, path).Await(deadline_, &answer);
  if (rc == ZOK && stat != nullptr) {
    *stat = answer.stat;
  }
  return rc;
}

int ZkRequests::Get(const std::string& path, std::string* value, struct Stat* stat) {
  ZkAnswer answer;
  const int rc = ZkPending::Get(*session_, path).Await(deadline_, &answer);
  if (rc == ZOK) {
    *value = std::move(answer.value);
    *stat = answer.stat;
  }
  return rc;
}

std::vector<int> ZkRequests::GetAll(const std::vector<std::string>& paths,
                                    std::vector<std::string>* values,
                                    std::vector<struct Stat>* stats) {
  std::vector<ZkPending> gets;
  gets.reserve(paths.size());
  for (const std::string& path : paths) {
    gets.push_back(ZkPending::Get(*session_, path));
  }
  std::vector<int> rcs(paths.size());
  values->assign(paths.size(), std::string());
  stats->assign(paths.size(), Stat{});
  for (std::size_t i = 0; i < gets.size(); ++i) {
    ZkAnswer answer;
    rcs[i] = gets[i].Await(deadline_, &answer);
    if (rcs[i] == ZOK) {
      (*values)[i] = std::move(answer.value);
      (*stats)[i] = answer.stat;
    }
  }
  return rcs;
}

std::vector<int> ZkRequests::ExistsAll(const std::vector<std::string>& paths) {
  std::vector<ZkPending> pending;
  pending.reserve(paths.size());
  for (const std::string& path : paths) {
    pending.push_back(ZkPending::Exists(*session_, path));
  }
  std::vector<int> rcs;
  rcs.reserve(pending.size());
  for (ZkPending& p : pending) {
    rcs.push_back(p.Await(deadline_));
  }
  return rcs;
}

int ZkRequests::Children(const std::string& path, std::vector<std::string>* children) {
  ZkAnswer answer;
  const int rc = ZkPending::Children(*session_, path).Await(deadline_, &answer);
  if (rc == ZOK) {
    *children = std::move(answer.strings);
  }
  return rc;
}

int ZkRequests::Create(const std::string& path, std::string_view value,
                       const struct ACL_vector* acl, int mode, std::string* created,
                       struct Stat* stat) {
  ZkAnswer answer;
  const int rc = ZkPending::Create(*session_, path, value, acl, mode).Await(deadline_, &answer);
  if (rc == ZOK) {
    if (created != nullptr) {
      *created = std::move(answer.value);
    }
    if (stat != nullptr) {
      *stat = answer.stat;
    }
  }
  return rc;
}

int ZkRequests::Delete(const std::string& path, int version) {
  return ZkPending::Delete(*session_, path, version).Await(deadline_);
}

int ZkRequests::Set(const std::string& path, std::string_view value, int version,
                    struct Stat* stat) {
  ZkAnswer answer;
  const int rc = ZkPending::Set(*session_, path, value, version).Await(deadline_, &answer);
  if (rc == ZOK && stat != nullptr) {
    *stat = answer.stat;
  }
  return rc;
}

int ZkRequests::Multi(const std::vector<ZkMultiOp>& ops, const struct ACL_vector* acl,
                      std::vector<int>* errors) {
  auto reply = std::make_shared<ZkReply>();
  // The C client serialises the ops at once but writes the results (and each create's path,
  // each set's Stat) when the reply comes, possibly after we gave up: they live with the reply.
  auto buffers = std::make_shared<MultiBuffers>(ops.size());
  reply->extra = buffers;
  std::vector<zoo_op_t> zops(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const ZkMultiOp& op = ops[i];
    const int len = static_cast<int>(op.data.size());
    switch (op.kind) {
      case ZkMultiOp::kCreate:
        zoo_create_op_init(&zops[i], op.path.c_str(), op.data.data(), len, acl, op.mode,
                           buffers->paths[i].data(), static_cast<int>(buffers->paths[i].size()));
        break;
      case ZkMultiOp::kDelete:
        zoo_delete_op_init(&zops[i], op.path.c_str(), op.version);
        break;
      case ZkMultiOp::kSet:
        zoo_set_op_init(&zops[i], op.path.c_str(), op.data.data(), len, op.version,
                        &buffers->stats[i]);
        break;
      case ZkMultiOp::kCheck:
        zoo_check_op_init(&zops[i], op.path.c_str(), op.version);
        break;
    }
  }
  void* data = Hold(reply);
  int rc = zoo_amulti(session_->zh(), static_cast<int>(zops.size()), zops.data(),
                      buffers->results.data(), VoidCompletion, data);
  if (rc != ZOK) {
    Take(data);
    return rc;
  }
  rc = AwaitReply(*reply, session_->clock(), deadline_, /*answer=*/nullptr);
  MutexLock lock(&reply->mu);
  if (reply->done && errors != nullptr) {
    errors->clear();
    for (const zoo_op_result_t& result : buffers->results) {
      errors->push_back(result.err);
    }
  }
  return rc;
}

int ZkRequests::Watch(const std::string& path, const std::shared_ptr<ZkWaker>& waker) {
  auto* watch = new ZkSession::WatchContext{.waker = waker, .session = session_};
  session_->AddWatch(watch);
  auto reply = std::make_shared<ZkReply>();
  void* data = Hold(reply);
  int rc =
      zoo_awget(session_->zh(), path.c_str(), &ZkSession::NodeWatcher, watch, DataCompletion, data);
  if (rc != ZOK) {
    Take(data);
    (void)session_->ReleaseWatch(watch);
    return rc;
  }
  rc = AwaitReply(*reply, session_->clock(), deadline_, /*answer=*/nullptr);
  // ZNONODE: no watch was left behind. Any other outcome may have left one: it stays in the
  // session's set until it fires or the session closes.
  if (rc == ZNONODE) {
    (void)session_->ReleaseWatch(watch);
  }
  return rc;
}

int ZkRequests::WatchAny(const std::vector<std::string>& paths,
                         const std::shared_ptr<ZkWaker>& waker) {
  struct Sent {
    ZkSession::WatchContext* watch;
    ReplyPtr reply;
    int rc;
  };

  std::vector<Sent> sent;
  sent.reserve(paths.size());
  for (const std::string& path : paths) {
    auto* watch = new ZkSession::WatchContext{.waker = waker, .session = session_};
    session_->AddWatch(watch);
    auto reply = std::make_shared<ZkReply>();
    void* data = Hold(reply);
    int rc = zoo_awget(session_->zh(), path.c_str(), &ZkSession::NodeWatcher, watch, DataCompletion,
                       data);
    if (rc != ZOK) {
      Take(data);
      (void)session_->ReleaseWatch(watch);
    }
    sent.push_back({watch, std::move(reply), rc});
  }
  int result = ZOK;
  for (Sent& s : sent) {
    int rc = s.rc;
    if (rc == ZOK) {
      rc = AwaitReply(*s.reply, session_->clock(), deadline_, /*answer=*/nullptr);
      // As in Watch: only ZNONODE is known to have left no watch behind.
      if (rc == ZNONODE) {
        (void)session_->ReleaseWatch(s.watch);
      }
    }
    if (rc == ZNONODE) {
      result = ZNONODE;
    } else if (rc != ZOK && result == ZOK) {
      result = rc;
    }
  }
  return result;
}

}  // namespace leasehold::internal
