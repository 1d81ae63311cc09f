// File: backends/zookeeper/zk_backend.cc (internal)
//
// The zk:// store. See zk_backend.h for the design; this file holds the C client glue (every
// request asynchronous, waited for with a bound), the lock recipe and the reaper.

#include "backends/zookeeper/zk_backend.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <zookeeper/zookeeper.h>

#include "core/logging.h"
#include "core/owner_token.h"

namespace leasehold::internal {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

// A watch's wake-up, shared by the waiting caller and the watcher callback.
struct ZkWaker {
  std::mutex mu;
  std::condition_variable_any cv;
  bool fired = false;
};

// The context of one registered data watch. Owned by its session's `watches` set: freed by the
// watcher when the watch is done (a node event, or the session's end), or by the session when it
// closes with the watch still registered (a predecessor that never changed).
struct ZkWatchContext {
  std::shared_ptr<ZkWaker> waker;
  ZkSession* session = nullptr;
};

// One ZooKeeper session (one zhandle_t). The C client reconnects by itself within the session;
// once expired, the handle is useless and the backend opens another for new work. The handle is
// closed when the last reference goes (never on the client's own threads: references are held
// by the backend, its grants and callers only).
class ZkSession {
 public:
  ZkSession() = default;
  ZkSession(const ZkSession&) = delete;
  ZkSession& operator=(const ZkSession&) = delete;
  ZkSession(ZkSession&&) = delete;
  ZkSession& operator=(ZkSession&&) = delete;

  ~ZkSession() {
    if (zh != nullptr) {
      zookeeper_close(zh);  // joins the client's threads: no callback runs after this
    }
    for (ZkWatchContext* watch : watches) {
      delete watch;
    }
  }

  // Called on the client's completion thread for session events: records, signals, never blocks.
  static void Watcher(zhandle_t* /*zh*/, int type, int state, const char* /*path*/, void* ctx) {
    if (type != ZOO_SESSION_EVENT || ctx == nullptr) {
      return;
    }
    auto* self = static_cast<ZkSession*>(ctx);
    std::lock_guard<std::mutex> lock(self->mu);
    self->state = state;
    if (state == ZOO_EXPIRED_SESSION_STATE) {
      self->expired = true;
    }
    if (state == ZOO_AUTH_FAILED_STATE) {
      self->auth_failed = true;
    }
    if (state == ZOO_CONNECTED_STATE) {
      self->ever_connected = true;
    }
    self->cv.notify_all();
  }

  bool Expired() {
    std::lock_guard<std::mutex> lock(mu);
    return expired || auth_failed;
  }

  zhandle_t* zh = nullptr;
  Duration requested{};
  Duration negotiated{};
  std::int64_t session_id = 0;

  std::mutex mu;
  std::condition_variable cv;
  int state = 0;
  bool expired = false;
  bool auth_failed = false;
  bool ever_connected = false;
  std::set<ZkWatchContext*> watches;  // guarded by mu
};

namespace {

constexpr std::string_view kRootName = "leasehold";
// Children of a key's node besides the queued ones (no '-': never taken for a queued node).
constexpr std::string_view kKeptName = "kept";
constexpr std::string_view kRecordName = "record";
// How many times an operation re-reads after a race (the holder left between two reads).
constexpr int kRaceRetries = 4;
// Reaper: how often it retries background deletes, and how many times before giving up (the
// node then goes with its session).
constexpr Duration kReaperRetry = std::chrono::milliseconds(200);
constexpr int kReaperMaxAttempts = 300;

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

void SetUpClientLogging() {
  static std::once_flag once;
  std::call_once(once, [] { zoo_set_debug_level(ZOO_LOG_LEVEL_WARN); });
}

// One asynchronous request's reply, shared by the waiting caller and the completion callback
// (which may run after the caller gave up).
struct Reply {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int rc = ZOPERATIONTIMEOUT;

  struct Stat stat {};

  bool has_stat = false;
  std::string value;
  std::vector<std::string> strings;
  // Buffers the C client writes into when the reply comes (Requests::Multi).
  std::shared_ptr<void> extra;

  void Finish(int code) {
    std::lock_guard<std::mutex> lock(mu);
    rc = code;
    done = true;
    cv.notify_all();
  }
};

using ReplyPtr = std::shared_ptr<Reply>;

// One operation of a multi (Requests::Multi).
struct MultiOp {
  enum Kind { kCreate, kDelete, kSet, kCheck };

  Kind kind = kCheck;
  std::string path;
  std::string data;   // kCreate, kSet
  int version = -1;   // kDelete, kSet, kCheck: -1 = any
  int mode = 0;       // kCreate
};

struct MultiBuffers {
  explicit MultiBuffers(std::size_t n) : results(n), stats(n), paths(n) {}

  std::vector<zoo_op_result_t> results;
  std::vector<struct Stat> stats;
  std::vector<std::array<char, 1024>> paths;
};

// Waits for `reply` until `deadline` (std::chrono::steady_clock). Returns its rc, or
// ZOPERATIONTIMEOUT if no reply came in time.
int AwaitReply(Reply& reply, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(reply.mu);
  if (!reply.cv.wait_until(lock, deadline, [&] { return reply.done; })) {
    return ZOPERATIONTIMEOUT;
  }
  return reply.rc;
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

void StatCompletion(int rc, const struct Stat* stat, const void* data) {
  ReplyPtr reply = Take(data);
  if (rc == ZOK && stat != nullptr) {
    std::lock_guard<std::mutex> lock(reply->mu);
    reply->stat = *stat;
    reply->has_stat = true;
  }
  reply->Finish(rc);
}

void DataCompletion(int rc, const char* value, int value_len, const struct Stat* stat,
                    const void* data) {
  ReplyPtr reply = Take(data);
  if (rc == ZOK) {
    std::lock_guard<std::mutex> lock(reply->mu);
    if (value != nullptr && value_len > 0) {
      reply->value.assign(value, static_cast<std::size_t>(value_len));
    }
    if (stat != nullptr) {
      reply->stat = *stat;
      reply->has_stat = true;
    }
  }
  reply->Finish(rc);
}

void StringsCompletion(int rc, const struct String_vector* strings, const void* data) {
  ReplyPtr reply = Take(data);
  if (rc == ZOK && strings != nullptr) {
    std::lock_guard<std::mutex> lock(reply->mu);
    for (int i = 0; i < strings->count; ++i) {
      reply->strings.emplace_back(strings->data[i]);
    }
  }
  reply->Finish(rc);
}

void StringStatCompletion(int rc, const char* value, const struct Stat* stat, const void* data) {
  ReplyPtr reply = Take(data);
  if (rc == ZOK) {
    std::lock_guard<std::mutex> lock(reply->mu);
    if (value != nullptr) {
      reply->value = value;
    }
    if (stat != nullptr) {
      reply->stat = *stat;
      reply->has_stat = true;
    }
  }
  reply->Finish(rc);
}

void VoidCompletion(int rc, const void* data) {
  Take(data)->Finish(rc);
}

void StringCompletion(int rc, const char* /*value*/, const void* data) {
  Take(data)->Finish(rc);
}

using WakerPtr = std::shared_ptr<ZkWaker>;

// Forgets a watch context: false if it was already gone.
bool ReleaseWatch(ZkWatchContext* watch) {
  {
    std::lock_guard<std::mutex> lock(watch->session->mu);
    if (watch->session->watches.erase(watch) == 0) {
      return false;
    }
  }
  delete watch;
  return true;
}

// Watcher of one predecessor node. Data watches fire once; session events reach every watcher
// and leave it registered, so the context goes only on a node event or the session's end.
void NodeWatcher(zhandle_t* /*zh*/, int type, int state, const char* /*path*/, void* ctx) {
  auto* watch = static_cast<ZkWatchContext*>(ctx);
  {
    std::lock_guard<std::mutex> lock(watch->waker->mu);
    watch->waker->fired = true;
  }
  watch->waker->cv.notify_all();
  if (type != ZOO_SESSION_EVENT || state == ZOO_EXPIRED_SESSION_STATE ||
      state == ZOO_AUTH_FAILED_STATE) {
    (void)ReleaseWatch(watch);
  }
}

// The synchronous face of one session: each call sends one asynchronous request and waits for
// its reply at most `timeout`. If the request cannot even be queued, the C client's rc.
class Requests {
 public:
  Requests(ZkSession& session, Duration timeout)
      : session_(&session),
        zh_(session.zh),
        deadline_(std::chrono::steady_clock::now() + duration_cast<milliseconds>(timeout)) {}

  int Exists(const std::string& path, struct Stat* stat) {
    auto reply = std::make_shared<Reply>();
    void* data = Hold(reply);
    int rc = zoo_aexists(zh_, path.c_str(), 0, StatCompletion, data);
    if (rc != ZOK) {
      Take(data);
      return rc;
    }
    rc = AwaitReply(*reply, deadline_);
    if (rc == ZOK && stat != nullptr) {
      std::lock_guard<std::mutex> lock(reply->mu);
      *stat = reply->stat;
    }
    return rc;
  }

  int Get(const std::string& path, std::string* value, struct Stat* stat) {
    auto reply = std::make_shared<Reply>();
    void* data = Hold(reply);
    int rc = zoo_aget(zh_, path.c_str(), 0, DataCompletion, data);
    if (rc != ZOK) {
      Take(data);
      return rc;
    }
    rc = AwaitReply(*reply, deadline_);
    if (rc == ZOK) {
      std::lock_guard<std::mutex> lock(reply->mu);
      *value = reply->value;
      *stat = reply->stat;
    }
    return rc;
  }

  // One get per path, all sent before any reply is awaited (one round of latency), each awaited
  // until the same deadline. Returns each get's rc; values and stats are filled where ZOK.
  std::vector<int> GetAll(const std::vector<std::string>& paths, std::vector<std::string>* values,
                          std::vector<struct Stat>* stats) {
    std::vector<ReplyPtr> replies;
    replies.reserve(paths.size());
    for (const std::string& path : paths) {
      auto reply = std::make_shared<Reply>();
      void* data = Hold(reply);
      int rc = zoo_aget(zh_, path.c_str(), 0, DataCompletion, data);
      if (rc != ZOK) {
        Take(data);
        reply->Finish(rc);
      }
      replies.push_back(std::move(reply));
    }
    std::vector<int> rcs(paths.size());
    values->assign(paths.size(), std::string());
    stats->assign(paths.size(), Stat{});
    for (std::size_t i = 0; i < replies.size(); ++i) {
      rcs[i] = AwaitReply(*replies[i], deadline_);
      if (rcs[i] == ZOK) {
        std::lock_guard<std::mutex> lock(replies[i]->mu);
        (*values)[i] = std::move(replies[i]->value);
        (*stats)[i] = replies[i]->stat;
      }
    }
    return rcs;
  }

  int Children(const std::string& path, std::vector<std::string>* children) {
    auto reply = std::make_shared<Reply>();
    void* data = Hold(reply);
    int rc = zoo_aget_children(zh_, path.c_str(), 0, StringsCompletion, data);
    if (rc != ZOK) {
      Take(data);
      return rc;
    }
    rc = AwaitReply(*reply, deadline_);
    if (rc == ZOK) {
      std::lock_guard<std::mutex> lock(reply->mu);
      *children = reply->strings;
    }
    return rc;
  }

  int Create(const std::string& path, std::string_view value, const struct ACL_vector* acl,
             int mode, std::string* created, struct Stat* stat) {
    auto reply = std::make_shared<Reply>();
    void* data = Hold(reply);
    int rc = zoo_acreate2(zh_, path.c_str(), value.data(), static_cast<int>(value.size()), acl,
                          mode, StringStatCompletion, data);
    if (rc != ZOK) {
      Take(data);
      return rc;
    }
    rc = AwaitReply(*reply, deadline_);
    if (rc == ZOK) {
      std::lock_guard<std::mutex> lock(reply->mu);
      if (created != nullptr) {
        *created = reply->value;
      }
      if (stat != nullptr) {
        *stat = reply->stat;
      }
    }
    return rc;
  }

  int Delete(const std::string& path, int version) {
    auto reply = std::make_shared<Reply>();
    void* data = Hold(reply);
    int rc = zoo_adelete(zh_, path.c_str(), version, VoidCompletion, data);
    if (rc != ZOK) {
      Take(data);
      return rc;
    }
    return AwaitReply(*reply, deadline_);
  }

  int Set(const std::string& path, std::string_view value, int version) {
    auto reply = std::make_shared<Reply>();
    void* data = Hold(reply);
    int rc = zoo_aset(zh_, path.c_str(), value.data(), static_cast<int>(value.size()), version,
                      StatCompletion, data);
    if (rc != ZOK) {
      Take(data);
      return rc;
    }
    return AwaitReply(*reply, deadline_);
  }

  // As Set, returning the node's Stat (its mtime is the leader's time of the write).
  int SetStat(const std::string& path, std::string_view value, int version, struct Stat* stat) {
    auto reply = std::make_shared<Reply>();
    void* data = Hold(reply);
    int rc = zoo_aset(zh_, path.c_str(), value.data(), static_cast<int>(value.size()), version,
                      StatCompletion, data);
    if (rc != ZOK) {
      Take(data);
      return rc;
    }
    rc = AwaitReply(*reply, deadline_);
    if (rc == ZOK && stat != nullptr) {
      std::lock_guard<std::mutex> lock(reply->mu);
      *stat = reply->stat;
    }
    return rc;
  }

  // Sends `ops` as one multi (all applied or none). Returns the multi's rc (the first failing
  // op's); `errors` gets each op's own rc when the reply came.
  int Multi(const std::vector<MultiOp>& ops, const struct ACL_vector* acl,
            std::vector<int>* errors) {
    auto reply = std::make_shared<Reply>();
    // The C client serialises the ops at once but writes the results (and each create's path,
    // each set's Stat) when the reply comes, possibly after we gave up: they live with the reply.
    auto buffers = std::make_shared<MultiBuffers>(ops.size());
    reply->extra = buffers;
    std::vector<zoo_op_t> zops(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const MultiOp& op = ops[i];
      const int len = static_cast<int>(op.data.size());
      switch (op.kind) {
        case MultiOp::kCreate:
          zoo_create_op_init(&zops[i], op.path.c_str(), op.data.data(), len, acl, op.mode,
                             buffers->paths[i].data(),
                             static_cast<int>(buffers->paths[i].size()));
          break;
        case MultiOp::kDelete:
          zoo_delete_op_init(&zops[i], op.path.c_str(), op.version);
          break;
        case MultiOp::kSet:
          zoo_set_op_init(&zops[i], op.path.c_str(), op.data.data(), len, op.version,
                          &buffers->stats[i]);
          break;
        case MultiOp::kCheck:
          zoo_check_op_init(&zops[i], op.path.c_str(), op.version);
          break;
      }
    }
    void* data = Hold(reply);
    int rc = zoo_amulti(zh_, static_cast<int>(zops.size()), zops.data(), buffers->results.data(),
                        VoidCompletion, data);
    if (rc != ZOK) {
      Take(data);
      return rc;
    }
    rc = AwaitReply(*reply, deadline_);
    std::lock_guard<std::mutex> lock(reply->mu);
    if (reply->done && errors != nullptr) {
      errors->clear();
      for (const zoo_op_result_t& result : buffers->results) {
        errors->push_back(result.err);
      }
    }
    return rc;
  }

  // Sets a one-shot data watch on `path`. Returns ZNONODE if it is already gone (no watch then).
  int Watch(const std::string& path, const WakerPtr& waker) {
    auto reply = std::make_shared<Reply>();
    void* data = Hold(reply);
    auto* ctx = new ZkWatchContext{.waker = waker, .session = session_};
    {
      std::lock_guard<std::mutex> lock(session_->mu);
      session_->watches.insert(ctx);
    }
    int rc = zoo_awget(zh_, path.c_str(), NodeWatcher, ctx, DataCompletion, data);
    if (rc != ZOK) {
      Take(data);
      (void)ReleaseWatch(ctx);
      return rc;
    }
    rc = AwaitReply(*reply, deadline_);
    // ZNONODE: no watch was left behind. Any other outcome may have left one: it stays in the
    // session's set until it fires or the session closes.
    if (rc == ZNONODE) {
      (void)ReleaseWatch(ctx);
    }
    return rc;
  }

 private:
  ZkSession* session_;
  zhandle_t* zh_;
  std::chrono::steady_clock::time_point deadline_;
};

bool IsTransient(int rc) {
  return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONMOVED ||
         rc == ZCLOSING || rc == ZNOTHING;
}

bool IsSessionGone(int rc) {
  return rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE;
}

// Maps a ZooKeeper rc that ended an operation to a Status (never kOk).
Status ErrorStatus(int rc, std::string_view what, const ZkOptions& options) {
  std::string detail = fmt::format("zookeeper rc {} ({})", rc, zerror(rc));
  if (IsTransient(rc)) {
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
  if (IsSessionGone(rc)) {
    return Status::Unavailable(
        fmt::format("ZooKeeper session expired during {} at {}", what, options.Address()), detail);
  }
  return {StatusCode::kInternal,
          fmt::format("unexpected ZooKeeper reply to {} at {}", what, options.Address()), detail};
}

// Node names: [A-Za-z0-9_-] stay, every other byte becomes %XX, so any key (with '/', '.',
// control characters or bytes ZooKeeper refuses) is one valid node name.
std::string EscapeKey(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::optional<std::string> UnescapeKey(std::string_view name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      out.push_back(name[i]);
      continue;
    }
    if (i + 2 >= name.size()) {
      return std::nullopt;
    }
    unsigned value = 0;
    auto [end, ec] = std::from_chars(name.data() + i + 1, name.data() + i + 3, value, 16);
    if (ec != std::errc() || end != name.data() + i + 3) {
      return std::nullopt;
    }
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

// The sequence number ZooKeeper appended: the 10 digits after the last '-'; -1 if none.
std::int64_t SequenceOf(std::string_view name) {
  std::size_t dash = name.rfind('-');
  if (dash == std::string_view::npos) {
    return -1;
  }
  std::int64_t seq = -1;
  auto [end, ec] = std::from_chars(name.data() + dash + 1, name.data() + name.size(), seq);
  if (ec != std::errc() || end != name.data() + name.size()) {
    return -1;
  }
  return seq;
}

// Orders children by sequence (never by whole name: the prefixes are random). Nodes that are
// not ours (no sequence) go last and are never taken for a holder.
void SortBySequence(std::vector<std::string>& children) {
  std::erase_if(children, [](const std::string& n) { return SequenceOf(n) < 0; });
  std::sort(children.begin(), children.end(), [](const std::string& a, const std::string& b) {
    std::int64_t sa = SequenceOf(a);
    std::int64_t sb = SequenceOf(b);
    return sa != sb ? sa < sb : a < b;
  });
}

std::string NodeData(Duration ttl, std::string_view owner_token, std::string_view holder) {
  return fmt::format("{}\n{}\n{}", duration_cast<milliseconds>(ttl).count(),
                     owner_token.substr(0, 8), holder);
}

LeaseInfo ParseNodeData(std::string_view key, std::string_view data, const struct Stat& stat) {
  LeaseInfo info;
  info.key = std::string(key);
  info.fencing_token = static_cast<FencingToken>(stat.czxid);
  std::size_t first = data.find('\n');
  std::size_t second = first == std::string_view::npos ? first : data.find('\n', first + 1);
  if (second != std::string_view::npos) {
    std::int64_t ms = 0;
    std::from_chars(data.data(), data.data() + first, ms);
    info.ttl = milliseconds(ms);
    info.remaining = info.ttl;
    info.token_prefix = std::string(data.substr(first + 1, second - first - 1));
    info.holder = std::string(data.substr(second + 1));
  }
  return info;
}

// The kept grant (Backend::Finish with keep > 0): the persistent node <key dir>/kept holding
// "kept1\n<keep ms>\n<fencing token>\n<token prefix>\n<holder>". It is live until its mtime
// (the leader's time of the Finish) plus keep. Its name has no '-', so SortBySequence never
// takes it for a queued node.
std::string KeptData(Duration keep, FencingToken fencing, std::string_view owner_token,
                     std::string_view holder) {
  return fmt::format("kept1\n{}\n{}\n{}\n{}", duration_cast<milliseconds>(keep).count(), fencing,
                     owner_token.substr(0, 8), holder);
}

// Splits off the text up to the next '\n' as a number; false if there is none.
bool TakeNumber(std::string_view& text, std::int64_t* value) {
  std::size_t nl = text.find('\n');
  if (nl == std::string_view::npos) {
    return false;
  }
  auto [end, ec] = std::from_chars(text.data(), text.data() + nl, *value);
  if (ec != std::errc() || end != text.data() + nl) {
    return false;
  }
  text.remove_prefix(nl + 1);
  return true;
}

// Parses a kept node; nullopt if it is not in our layout. `info.ttl` is the keep.
std::optional<LeaseInfo> ParseKeptData(std::string_view key, std::string_view data) {
  constexpr std::string_view kMagic = "kept1\n";
  if (!data.starts_with(kMagic)) {
    return std::nullopt;
  }
  data.remove_prefix(kMagic.size());
  std::int64_t keep_ms = 0;
  std::int64_t fencing = 0;
  std::size_t nl = 0;
  if (!TakeNumber(data, &keep_ms) || !TakeNumber(data, &fencing) ||
      (nl = data.find('\n')) == std::string_view::npos) {
    return std::nullopt;
  }
  LeaseInfo info;
  info.key = std::string(key);
  info.ttl = milliseconds(keep_ms);
  info.fencing_token = static_cast<FencingToken>(fencing);
  info.token_prefix = std::string(data.substr(0, nl));
  info.holder = std::string(data.substr(nl + 1));
  return info;
}

// The record (Backend::ReadRecord): the persistent node <key dir>/record holding
// "<ttl ms>\n<bytes>", live until its mtime plus the TTL.
std::string RecordData(Duration ttl, std::string_view record) {
  return fmt::format("{}\n{}", duration_cast<milliseconds>(ttl).count(), record);
}

SystemTime FromZkMillis(std::int64_t ms) {
  return SystemTime(duration_cast<SystemTime::duration>(milliseconds(ms)));
}

std::chrono::steady_clock::time_point ToSteady(SteadyTime t) {
  Duration left = t - Clock::Real().Now();
  auto now = std::chrono::steady_clock::now();
  if (left > std::chrono::hours(24 * 365)) {
    return now + std::chrono::hours(24 * 365);
  }
  return now + std::max(Duration::zero(), left);
}

}  // namespace

Result<std::shared_ptr<Backend>> OpenZkBackend(const Url& url, Clock& clock) {
  (void)clock;  // TODO(#16): joined by the store's rewrite
  LH_ASSIGN_OR_RETURN(ZkOptions options, ZkOptions::FromUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkBackend> backend, ZkBackend::Open(std::move(options)));
  return std::shared_ptr<Backend>(std::move(backend));
}

ZkBackend::ZkBackend(ZkOptions options)
    : options_(std::move(options)),
      base_(options_.chroot + "/" + std::string(kRootName)),
      clock_path_(options_.chroot + "/leasehold-clock") {}

Result<std::shared_ptr<ZkBackend>> ZkBackend::Open(ZkOptions options) {
  SetUpClientLogging();
  std::shared_ptr<ZkBackend> backend(new ZkBackend(std::move(options)));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> service, backend->ServiceSession());
  // Checks the chroot and the ACLs at once, so a wrong password fails here, not at first use.
  LH_RETURN_IF_ERROR(backend->EnsureParents(*service, backend->base_));
  backend->reaper_ = std::jthread(
      [raw = backend.get()](std::stop_token stop) { raw->ReaperLoop(std::move(stop)); });
  return backend;
}

ZkBackend::~ZkBackend() {
  reaper_.request_stop();
  {
    MutexLock lock(&mu_);
    reaper_cv_.NotifyAll();
  }
  if (reaper_.joinable()) {
    reaper_.join();
  }
  // Sessions close as their last references go (members are destroyed after this body).
}

Capabilities ZkBackend::capabilities() const {
  return Capabilities{.multi_process = true,
                      .native_wait = true,
                      .fencing_survives_restart = true,
                      .fair_queue = true};
}

Result<std::shared_ptr<ZkSession>> ZkBackend::Connect(Duration timeout) {
  auto session = std::make_shared<ZkSession>();
  session->requested = timeout;
  const int timeout_ms = static_cast<int>(std::clamp<std::int64_t>(
      duration_cast<milliseconds>(timeout).count(), 1, std::numeric_limits<int>::max()));
  session->zh = zookeeper_init2(options_.hosts.c_str(), &ZkSession::Watcher, timeout_ms, nullptr,
                                session.get(), 0, &ZkLogCallback);
  if (session->zh == nullptr) {
    return Status::InvalidArgument(fmt::format("ZooKeeper client refused the host list {}: {}",
                                               options_.hosts, std::strerror(errno)));
  }
  {
    std::unique_lock<std::mutex> lock(session->mu);
    session->cv.wait_for(lock, duration_cast<milliseconds>(options_.connect_timeout), [&] {
      return session->state == ZOO_CONNECTED_STATE || session->expired || session->auth_failed;
    });
    if (session->state != ZOO_CONNECTED_STATE) {
      return Status::Unavailable(
          fmt::format("cannot reach ZooKeeper at {} within {} ms", options_.Address(),
                      duration_cast<milliseconds>(options_.connect_timeout).count()));
    }
  }
  session->negotiated = milliseconds(zoo_recv_timeout(session->zh));
  session->session_id = zoo_client_id(session->zh)->client_id;
  if (options_.user.has_value()) {
    const std::string cert = *options_.user + ":" + options_.password.value_or("");
    auto reply = std::make_shared<Reply>();
    void* data = Hold(reply);
    int rc = zoo_add_auth(session->zh, "digest", cert.data(), static_cast<int>(cert.size()),
                          VoidCompletion, data);
    if (rc != ZOK) {
      Take(data);
    } else {
      rc = AwaitReply(*reply, std::chrono::steady_clock::now() +
                                  duration_cast<milliseconds>(options_.command_timeout));
    }
    if (rc != ZOK) {
      return ErrorStatus(rc, "digest authentication", options_);
    }
  }
  LogEvent(LogLevel::kDebug, "zk_session_opened",
           {{"address", options_.Address()},
            {"requested_ms", std::to_string(timeout_ms)},
            {"negotiated_ms",
             std::to_string(duration_cast<milliseconds>(session->negotiated).count())}});
  return session;
}

Result<std::shared_ptr<ZkSession>> ZkBackend::ServiceSession() {
  {
    MutexLock lock(&mu_);
    if (service_ != nullptr && !service_->Expired()) {
      return service_;
    }
  }
  MutexLock connecting(&connect_mu_);
  {
    MutexLock lock(&mu_);
    if (service_ != nullptr && !service_->Expired()) {
      return service_;
    }
  }
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session,
                      Connect(options_.service_session_timeout));
  MutexLock lock(&mu_);
  service_ = session;
  return session;
}

Result<std::shared_ptr<ZkSession>> ZkBackend::LeaseSession(Duration ttl) {
  const std::int64_t ms = std::max<std::int64_t>(1, duration_cast<milliseconds>(ttl).count());
  auto lookup = [&]() LH_REQUIRES(mu_) -> std::shared_ptr<ZkSession> {
    auto it = sessions_.find(ms);
    if (it != sessions_.end() && !it->second->Expired()) {
      return it->second;
    }
    return nullptr;
  };
  {
    MutexLock lock(&mu_);
    if (auto s = lookup()) {
      return s;
    }
  }
  MutexLock connecting(&connect_mu_);
  {
    MutexLock lock(&mu_);
    if (auto s = lookup()) {
      return s;
    }
  }
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, Connect(milliseconds(ms)));
  MutexLock lock(&mu_);
  sessions_[ms] = session;  // an expired one it replaces closes with its last grant
  return session;
}

Status ZkBackend::EnsureParents(ZkSession& session, const std::string& dir) {
  const struct ACL_vector* acl =
      options_.user.has_value() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
  Requests requests(session, options_.command_timeout);
  // Each component after the root: the chroot's are persistent (the operator named them), ours
  // are containers.
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    std::string path = dir.substr(0, pos);
    if (path.empty()) {
      continue;
    }
    const bool ours = path.size() > options_.chroot.size();
    int rc = requests.Exists(path, nullptr);
    if (rc == ZNONODE) {
      rc = requests.Create(path, "", acl, ours ? ZOO_CONTAINER : ZOO_PERSISTENT, nullptr, nullptr);
      if (rc == ZNODEEXISTS) {
        rc = ZOK;
      }
    }
    if (rc != ZOK) {
      return ErrorStatus(rc, fmt::format("creating {}", path), options_);
    }
  }
  return Status();
}

std::string ZkBackend::KeyDir(std::string_view key) const {
  return base_ + "/" + EscapeKey(key);
}

Result<std::optional<LeaseInfo>> ZkBackend::ReadHolder(ZkSession& session, std::string_view key) {
  const std::string dir = KeyDir(key);
  for (int attempt = 0; attempt < kRaceRetries; ++attempt) {
    Requests requests(session, options_.command_timeout);
    std::vector<std::string> children;
    int rc = requests.Children(dir, &children);
    if (rc == ZNONODE) {
      return std::optional<LeaseInfo>();
    }
    if (rc != ZOK) {
      return ErrorStatus(rc, "reading a lease", options_);
    }
    if (std::find(children.begin(), children.end(), kKeptName) != children.end()) {
      LH_ASSIGN_OR_RETURN(std::optional<Kept> kept, ReadKept(session, key, dir));
      if (kept.has_value() && kept->remaining > Duration::zero()) {
        return std::optional<LeaseInfo>(std::move(kept->info));  // ahead of any queued node
      }
    }
    SortBySequence(children);
    if (children.empty()) {
      return std::optional<LeaseInfo>();
    }
    std::string data;

    struct Stat stat {};

    rc = requests.Get(dir + "/" + children.front(), &data, &stat);
    if (rc == ZNONODE) {
      continue;  // the holder left between the two reads
    }
    if (rc != ZOK) {
      return ErrorStatus(rc, "reading a lease", options_);
    }
    return std::optional<LeaseInfo>(ParseNodeData(key, data, stat));
  }
  return Status::Unavailable(
      fmt::format("the holder of {} kept changing while it was read; try again", key));
}

Result<SystemTime> ZkBackend::LeaderNow(ZkSession& session) {
  Requests requests(session, options_.command_timeout);

  struct Stat stat {};

  // A write goes through the leader, which stamps it with its own wall clock (the transaction
  // time becomes the node's mtime): the store's clock in one round trip.
  int rc = requests.SetStat(clock_path_, "", -1, &stat);
  if (rc == ZNONODE) {
    const struct ACL_vector* acl =
        options_.user.has_value() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
    rc = requests.Create(clock_path_, "", acl, ZOO_PERSISTENT, nullptr, &stat);
    if (rc == ZNODEEXISTS) {
      rc = requests.SetStat(clock_path_, "", -1, &stat);
    }
  }
  if (rc != ZOK) {
    return ErrorStatus(rc, "reading the leader's clock", options_);
  }
  return FromZkMillis(stat.mtime);
}

Result<std::optional<ZkBackend::Kept>> ZkBackend::ReadKept(ZkSession& session,
                                                           std::string_view key,
                                                           const std::string& dir) {
  std::string data;

  struct Stat stat {};

  {
    Requests requests(session, options_.command_timeout);
    int rc = requests.Get(dir + "/" + std::string(kKeptName), &data, &stat);
    if (rc == ZNONODE) {
      return std::optional<Kept>();
    }
    if (rc != ZOK) {
      return ErrorStatus(rc, "reading a kept grant", options_);
    }
  }
  std::optional<LeaseInfo> info = ParseKeptData(key, data);
  if (!info.has_value()) {
    return std::optional<Kept>();  // not our layout: never taken for a grant
  }
  // Judged on the leader's clock, read after the node: an mtime is never ahead of it.
  LH_ASSIGN_OR_RETURN(SystemTime now, LeaderNow(session));
  Kept kept{.info = std::move(*info), .version = stat.version};
  kept.remaining = duration_cast<Duration>(FromZkMillis(stat.mtime) + kept.info.ttl - now);
  kept.info.remaining =
      std::chrono::ceil<milliseconds>(std::max(Duration::zero(), kept.remaining));
  return std::optional<Kept>(std::move(kept));
}

Result<Grant> ZkBackend::TryAcquire(const GrantRequest& request) {
  // Our own t_send, read after the core's: the local deadline is never before safe_until.
  const SteadyTime t_send = Clock::Real().Now();
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, LeaseSession(request.ttl));
  const std::string dir = KeyDir(request.key);
  const bool waiting = !request.waiter_id.empty();
  std::string id;
  if (waiting) {
    id = "w" + request.waiter_id;
  } else {
    LH_ASSIGN_OR_RETURN(std::string random, NewOwnerToken());
    id = "g" + random;
  }
  const std::string prefix = id + "-";
  const KeyAndId waiter_key{request.key, request.waiter_id};
  const std::string data = NodeData(session->negotiated, request.owner_token, request.holder);
  const struct ACL_vector* acl =
      options_.user.has_value() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;

  Requests requests(*session, options_.command_timeout);
  std::string my_name;

  struct Stat my_stat {};

  bool have_stat = false;
  std::vector<std::string> children;
  if (waiting) {
    // The waiter's node, if an earlier attempt made one, is found by its prefix: also after a
    // create whose reply was lost (it is adopted). The listing goes through the same session
    // as the create, after it, so a create the server applied is seen.
    {
      MutexLock lock(&mu_);
      Queued& queued = waiters_[waiter_key];
      if (queued.session != session) {
        queued = Queued{.session = session};  // an expired session took its node with it
      }
    }
    int rc = requests.Children(dir, &children);
    if (rc != ZOK && rc != ZNONODE) {
      return ErrorStatus(rc, fmt::format("reading the queue of {}", request.key), options_);
    }
    for (const std::string& child : children) {
      if (child.starts_with(prefix)) {
        my_name = child;
      }
    }
  }
  if (my_name.empty()) {
    std::string created;
    int rc = requests.Create(dir + "/" + prefix, data, acl, ZOO_EPHEMERAL_SEQUENTIAL, &created,
                             &my_stat);
    if (rc == ZNONODE) {
      LH_RETURN_IF_ERROR(EnsureParents(*session, dir));
      rc = requests.Create(dir + "/" + prefix, data, acl, ZOO_EPHEMERAL_SEQUENTIAL, &created,
                           &my_stat);
    }
    if (rc == ZOK) {
      have_stat = true;
      my_name = created.substr(created.rfind('/') + 1);
    } else if (IsTransient(rc)) {
      // The server may have created the node and the reply been lost. A waiter adopts it on
      // its next attempt (or AbandonWait deletes it); a plain try-acquire's node is deleted by
      // the reaper, which looks for the unique prefix through this same session (after the
      // create, so it sees it if it was made).
      if (!waiting) {
        Doom({.session = session, .dir = dir, .prefix = prefix});
      }
      return ErrorStatus(rc, fmt::format("acquiring {}", request.key), options_);
    } else {
      if (IsSessionGone(rc)) {
        return Status::Unavailable(
            fmt::format("ZooKeeper session for {} expired; a new one is opened on the next try",
                        request.key),
            fmt::format("zookeeper rc {}", rc));
      }
      return ErrorStatus(rc, fmt::format("acquiring {}", request.key), options_);
    }
  }
  const std::string my_path = dir + "/" + my_name;
  // After a transient error: a plain try-acquire's node goes (its name is never used again); a
  // waiter's stays queued for its next attempt, or for AbandonWait.
  auto forget_node = [&] {
    if (!waiting) {
      Doom({.session = session, .path = my_path});
    }
  };

  for (int attempt = 0; attempt < kRaceRetries; ++attempt) {
    children.clear();
    int rc = requests.Children(dir, &children);
    if (rc != ZOK) {
      forget_node();
      return ErrorStatus(rc, fmt::format("acquiring {}", request.key), options_);
    }
    const bool kept_present =
        std::find(children.begin(), children.end(), kKeptName) != children.end();
    SortBySequence(children);
    auto mine = std::find(children.begin(), children.end(), my_name);
    if (mine == children.end()) {
      // Our node is gone: the session expired under us, or someone force-released the queue.
      {
        MutexLock lock(&mu_);
        waiters_.erase(waiter_key);
      }
      return Status::Unavailable(fmt::format(
          "the node of {} vanished while acquiring (session expiry?); try again", request.key));
    }
    // A kept grant (Finish with keep > 0) holds the key ahead of every queued node while it is
    // live. It is only ever created together with the delete of the holder's node, so a
    // listing without that node (we are lowest) already shows it.
    std::optional<Kept> kept;
    if (kept_present) {
      Result<std::optional<Kept>> read = ReadKept(*session, request.key, dir);
      if (!read.ok()) {
        forget_node();
        return read.status();
      }
      kept = std::move(*read);
    }
    const bool kept_live = kept.has_value() && kept->remaining > Duration::zero();
    if (mine == children.begin() && kept.has_value() && !kept_live) {
      // Expired: take over. The versioned delete fails if someone else already did (or a
      // force-release); the check fails if our node went. Either way: decide again.
      std::vector<int> errors;
      rc = requests.Multi({{.kind = MultiOp::kCheck, .path = my_path},
                           {.kind = MultiOp::kDelete,
                            .path = dir + "/" + std::string(kKeptName),
                            .version = kept->version}},
                          acl, &errors);
      if (rc == ZNONODE || rc == ZBADVERSION) {
        continue;
      }
      if (rc != ZOK) {
        forget_node();
        return ErrorStatus(rc, fmt::format("taking over the kept grant of {}", request.key),
                           options_);
      }
    }
    if (mine == children.begin() && !kept_live) {
      if (!have_stat) {
        rc = requests.Exists(my_path, &my_stat);
        if (rc != ZOK) {
          forget_node();
          return ErrorStatus(rc, fmt::format("acquiring {}", request.key), options_);
        }
        // A queued node carries the token of the attempt that created it: show this one's.
        (void)requests.Set(my_path, data, my_stat.version);
      }
      if (my_stat.ephemeralOwner != session->session_id) {
        return Status::Internal(fmt::format("node {} is not owned by this session", my_path));
      }
      {
        MutexLock lock(&mu_);
        waiters_.erase(waiter_key);
        grants_[{request.key, request.owner_token}] =
            Held{.session = session,
                 .path = my_path,
                 .czxid = static_cast<FencingToken>(my_stat.czxid),
                 .holder = request.holder,
                 .ttl = session->negotiated,
                 .deadline = t_send + session->negotiated};
        reaper_cv_.NotifyAll();
      }
      return Grant{.fencing_token = static_cast<FencingToken>(my_stat.czxid),
                   .ttl = session->negotiated};
    }
    if (kept_live) {
      if (waiting) {
        MutexLock lock(&mu_);
        waiters_[waiter_key] = Queued{.session = session, .path = my_path};
      } else {
        (void)DeleteOrDoom(session, my_path);
      }
      std::string message = fmt::format(
          "{} is held by {} (fencing token {}), kept after its holder for {} ms more",
          request.key, kept->info.holder, kept->info.fencing_token,
          duration_cast<milliseconds>(kept->remaining).count());
      return Status::HeldByAnother(std::move(message), std::move(kept->info));
    }
    // Not lowest: report the holder (the lowest child).
    std::string holder_data;

    struct Stat holder_stat {};

    rc = requests.Get(dir + "/" + children.front(), &holder_data, &holder_stat);
    if (rc == ZNONODE) {
      continue;  // the holder just left: decide again
    }
    if (waiting) {
      MutexLock lock(&mu_);
      waiters_[waiter_key] = Queued{.session = session, .path = my_path};
    } else {
      (void)DeleteOrDoom(session, my_path);
    }
    if (rc != ZOK) {
      return ErrorStatus(rc, fmt::format("reading the holder of {}", request.key), options_);
    }
    LeaseInfo holder = ParseNodeData(request.key, holder_data, holder_stat);
    // The message first: argument evaluation order is unspecified.
    std::string message = fmt::format("{} is held by {} (fencing token {})", request.key,
                                      holder.holder, holder.fencing_token);
    return Status::HeldByAnother(std::move(message), std::move(holder));
  }
  if (!waiting) {
    (void)DeleteOrDoom(session, my_path);
  }
  return Status::Unavailable(
      fmt::format("the holder of {} kept changing while acquiring; try again", request.key));
}

Status ZkBackend::Renew(const RenewRequest& request) {
  return RenewMany(std::span<const RenewRequest>(&request, 1)).front();
}

std::vector<Status> ZkBackend::RenewMany(std::span<const RenewRequest> requests) {
  const SteadyTime t_send = Clock::Real().Now();
  std::vector<Status> results(requests.size());

  struct Pending {
    std::size_t index;
    Held held;
    ReplyPtr reply;
  };

  std::vector<Pending> pending;
  {
    MutexLock lock(&mu_);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      auto it = grants_.find({requests[i].key, requests[i].owner_token});
      if (it == grants_.end()) {
        results[i] = Status::Lost(
            fmt::format("{} is not held with this token (released, expired or never granted)",
                        requests[i].key));
        continue;
      }
      pending.push_back({i, it->second, nullptr});
    }
  }
  // First a sync per session: it goes through the leader, and the server answers the session's
  // later reads only after it, so the exists below cannot be a stale read from a follower that
  // lags the leader (or is cut off from it while still serving us). Then every exists, before
  // awaiting any reply: one round of latency for the whole batch.
  std::map<ZkSession*, ReplyPtr> syncs;
  for (Pending& p : pending) {
    ReplyPtr& sync = syncs[p.held.session.get()];
    if (sync == nullptr) {
      sync = std::make_shared<Reply>();
      void* data = Hold(sync);
      int rc = zoo_async(p.held.session->zh, "/", StringCompletion, data);
      if (rc != ZOK) {
        Take(data);
        sync->Finish(rc);
      }
    }
  }
  for (Pending& p : pending) {
    p.reply = std::make_shared<Reply>();
    void* data = Hold(p.reply);
    int rc = zoo_aexists(p.held.session->zh, p.held.path.c_str(), 0, StatCompletion, data);
    if (rc != ZOK) {
      Take(data);
      p.reply->Finish(rc);
    }
  }
  const auto deadline =
      std::chrono::steady_clock::now() + duration_cast<milliseconds>(options_.command_timeout);
  for (Pending& p : pending) {
    const RenewRequest& request = requests[p.index];
    int rc = AwaitReply(*syncs[p.held.session.get()], deadline);
    if (rc == ZOK) {
      rc = AwaitReply(*p.reply, deadline);
    }

    struct Stat stat {};

    if (rc == ZOK) {
      std::lock_guard<std::mutex> lock(p.reply->mu);
      stat = p.reply->stat;
    }
    const KeyAndId grant_key{request.key, request.owner_token};
    if (rc == ZOK && stat.ephemeralOwner == p.held.session->session_id &&
        static_cast<FencingToken>(stat.czxid) == p.held.czxid) {
      MutexLock lock(&mu_);
      auto it = grants_.find(grant_key);
      if (it == grants_.end()) {
        results[p.index] = Status::Lost(fmt::format("{} was released or expired", request.key));
      } else if (Clock::Real().Now() >= it->second.deadline) {
        // Confirmed too late: the holder has already given the lease up.
        results[p.index] =
            Status::Lost(fmt::format("renewal of {} confirmed after its deadline", request.key),
                         LostCause::kExpired);
        doomed_.push_back({.session = it->second.session, .path = it->second.path});
        grants_.erase(it);
        reaper_cv_.NotifyAll();
      } else {
        it->second.deadline = std::max(it->second.deadline, t_send + it->second.ttl);
      }
      continue;
    }
    if (rc == ZOK || rc == ZNONODE || IsSessionGone(rc)) {
      const bool session_gone = IsSessionGone(rc) || p.held.session->Expired();
      LostCause cause = session_gone ? LostCause::kSessionLost
                        : rc == ZOK  ? LostCause::kStolen
                                     : LostCause::kStoreSaidNo;
      {
        MutexLock lock(&mu_);
        grants_.erase(grant_key);
      }
      results[p.index] =
          Status::Lost(fmt::format("the ZooKeeper node of {} is {}", request.key,
                                   session_gone ? "gone with its expired session"
                                   : rc == ZOK  ? "not ours any more"
                                                : "gone (force-released, or its session expired)"),
                       cause);
      continue;
    }
    results[p.index] = ErrorStatus(rc, fmt::format("renewing {}", request.key), options_);
  }
  return results;
}

Status ZkBackend::Release(std::string_view key, std::string_view owner_token) {
  Held held;
  {
    MutexLock lock(&mu_);
    auto it = grants_.find({std::string(key), std::string(owner_token)});
    if (it == grants_.end()) {
      return Status::Lost(
          fmt::format("{} is not held with this token (released, expired or never granted)", key));
    }
    held = it->second;
    grants_.erase(it);
  }
  if (held.session->Expired()) {
    return Status::Lost(fmt::format("the ZooKeeper session that held {} expired", key),
                        LostCause::kSessionLost);
  }
  Requests requests(*held.session, options_.command_timeout);

  struct Stat stat {};

  int rc = requests.Exists(held.path, &stat);
  if (rc == ZOK && (stat.ephemeralOwner != held.session->session_id ||
                    static_cast<FencingToken>(stat.czxid) != held.czxid)) {
    return Status::Lost(fmt::format("the node of {} is not ours any more", key),
                        LostCause::kStolen);
  }
  if (rc == ZOK) {
    rc = requests.Delete(held.path, stat.version);
  }
  if (rc == ZOK) {
    return Status();
  }
  if (rc == ZNONODE) {
    return Status::Lost(fmt::format("the node of {} was already gone", key));
  }
  if (IsSessionGone(rc)) {
    return Status::Lost(fmt::format("the ZooKeeper session that held {} expired", key),
                        LostCause::kSessionLost);
  }
  // Unknown outcome: the reaper deletes the node once the session answers again, so the key is
  // not left blocked by a grant nobody holds.
  Doom({.session = held.session, .path = held.path});
  return ErrorStatus(rc, fmt::format("releasing {}", key), options_);
}

Status ZkBackend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  if (request.keep == Duration::zero() && !request.record.has_value()) {
    return Release(request.key, request.owner_token);
  }
  Held held;
  {
    MutexLock lock(&mu_);
    auto it = grants_.find({request.key, request.owner_token});
    if (it == grants_.end()) {
      return Status::Lost(fmt::format(
          "{} is not held with this token (released, expired or never granted)", request.key));
    }
    held = it->second;
    grants_.erase(it);
  }
  if (held.session->Expired()) {
    return Status::Lost(fmt::format("the ZooKeeper session that held {} expired", request.key),
                        LostCause::kSessionLost);
  }
  if (Clock::Real().Now() >= held.deadline) {
    // Not renewed in time: given up already (the reaper was about to delete it).
    Doom({.session = held.session, .path = held.path});
    return Status::Lost(fmt::format("{} passed its deadline before it was finished", request.key),
                        LostCause::kExpired);
  }
  const std::string dir = held.path.substr(0, held.path.rfind('/'));
  const struct ACL_vector* acl =
      options_.user.has_value() ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
  Requests requests(*held.session, options_.command_timeout);
  int rc = ZOK;
  for (int attempt = 0; attempt < kRaceRetries; ++attempt) {
    struct Stat stat {};

    rc = requests.Exists(held.path, &stat);
    if (rc == ZOK && (stat.ephemeralOwner != held.session->session_id ||
                      static_cast<FencingToken>(stat.czxid) != held.czxid)) {
      return Status::Lost(fmt::format("the node of {} is not ours any more", request.key),
                          LostCause::kStolen);
    }
    if (rc == ZNONODE) {
      return Status::Lost(fmt::format("the node of {} was already gone", request.key));
    }
    if (rc != ZOK) {
      break;
    }
    // The versioned delete of our node is the owner check; the kept node and the record are
    // created or set in the same multi (an exists says which; if that changes before the multi,
    // the multi fails and we look again).
    std::vector<MultiOp> ops{{.kind = MultiOp::kDelete, .path = held.path, .version = stat.version}};
    auto write = [&](std::string_view name, std::string data) -> int {
      const std::string path = dir + "/" + std::string(name);

      struct Stat existing {};

      const int erc = requests.Exists(path, &existing);
      if (erc == ZNONODE) {
        ops.push_back({.kind = MultiOp::kCreate,
                       .path = path,
                       .data = std::move(data),
                       .mode = ZOO_PERSISTENT});
        return ZOK;
      }
      if (erc == ZOK) {
        ops.push_back({.kind = MultiOp::kSet,
                       .path = path,
                       .data = std::move(data),
                       .version = existing.version});
      }
      return erc;
    };
    if (request.keep > Duration::zero()) {
      rc = write(kKeptName,
                 KeptData(request.keep, held.czxid, request.owner_token, held.holder));
    }
    if (rc == ZOK && request.record.has_value()) {
      rc = write(kRecordName, RecordData(request.record_ttl, *request.record));
    }
    if (rc != ZOK) {
      break;
    }
    std::vector<int> errors;
    rc = requests.Multi(ops, acl, &errors);
    if (rc == ZOK) {
      return Status();
    }
    if (!errors.empty() && errors.front() != ZOK) {
      // The delete failed (ops before the failing one report ZOK): our node changed or went.
      return Status::Lost(fmt::format("the node of {} is not ours any more", request.key),
                          LostCause::kStolen);
    }
    if (rc != ZNONODE && rc != ZNODEEXISTS && rc != ZBADVERSION) {
      break;
    }
  }
  if (IsSessionGone(rc)) {
    return Status::Lost(fmt::format("the ZooKeeper session that held {} expired", request.key),
                        LostCause::kSessionLost);
  }
  // Unknown outcome (or the record kept changing). If the multi was not applied, our node is
  // still there: with keep it stays until the keep has passed (then the reaper deletes it, as
  // for any grant past its deadline), without keep it goes now, as in Release.
  if (request.keep > Duration::zero()) {
    held.deadline = std::max(held.deadline, Clock::Real().Now() + request.keep);
    MutexLock lock(&mu_);
    grants_[{request.key, request.owner_token}] = held;
    reaper_cv_.NotifyAll();
  } else {
    Doom({.session = held.session, .path = held.path});
  }
  if (rc == ZNONODE || rc == ZNODEEXISTS || rc == ZBADVERSION) {
    return Status::Unavailable(
        fmt::format("the record of {} kept changing while finishing; try again", request.key));
  }
  return ErrorStatus(rc, fmt::format("finishing {}", request.key), options_);
}

Result<std::optional<std::string>> ZkBackend::ReadRecord(std::string_view key) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  // The clock first: it is a write, so the get after it in this session is served no older
  // than the leader's state at that time (a lagging follower cannot hide a fresh record).
  LH_ASSIGN_OR_RETURN(SystemTime now, LeaderNow(*session));
  Requests requests(*session, options_.command_timeout);
  std::string data;

  struct Stat stat {};

  int rc = requests.Get(KeyDir(key) + "/" + std::string(kRecordName), &data, &stat);
  if (rc == ZNONODE) {
    return std::optional<std::string>();
  }
  if (rc != ZOK) {
    return ErrorStatus(rc, fmt::format("reading the record of {}", key), options_);
  }
  std::string_view text = data;
  std::int64_t ttl_ms = 0;
  if (!TakeNumber(text, &ttl_ms)) {
    return Status::Internal(fmt::format("the record node of {} is not in leasehold's layout", key));
  }
  if (FromZkMillis(stat.mtime) + milliseconds(ttl_ms) <= now) {
    return std::optional<std::string>();  // expired (the node stays until replaced)
  }
  return std::optional<std::string>(std::string(text));
}

namespace {

// The keys among the key nodes `names` that start with `prefix`, in key order. Children come in
// no particular order, and escaped names would not sort as the keys do ("%2E" for '.' sorts
// before '-'): decode, filter and sort the keys themselves.
std::vector<std::string> KeysWithPrefix(const std::vector<std::string>& names,
                                        std::string_view prefix) {
  std::vector<std::string> keys;
  for (const std::string& name : names) {
    std::optional<std::string> key = UnescapeKey(name);
    if (key.has_value() && key->starts_with(prefix)) {
      keys.push_back(std::move(*key));
    }
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace

Result<std::vector<std::pair<std::string, std::string>>> ZkBackend::ListRecords(
    std::string_view prefix) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  // One clock read for the whole list, first for the reason ReadRecord gives (the reads after
  // this write in the session see at least the leader's state at its time, key nodes
  // included). A record written after it has an mtime past `now`, so it is judged live.
  LH_ASSIGN_OR_RETURN(SystemTime now, LeaderNow(*session));
  // One deadline for the children and every get: the list costs one command_timeout at most,
  // however many keys there are.
  Requests requests(*session, options_.command_timeout);
  std::vector<std::string> names;
  int rc = requests.Children(base_, &names);
  if (rc == ZNONODE) {
    return std::vector<std::pair<std::string, std::string>>();
  }
  if (rc != ZOK) {
    return ErrorStatus(rc, "listing records", options_);
  }
  const std::vector<std::string> keys = KeysWithPrefix(names, prefix);
  std::vector<std::string> paths;
  paths.reserve(keys.size());
  for (const std::string& key : keys) {
    paths.push_back(KeyDir(key) + "/" + std::string(kRecordName));
  }
  std::vector<std::string> values;
  std::vector<struct Stat> stats;
  const std::vector<int> rcs = requests.GetAll(paths, &values, &stats);
  std::vector<std::pair<std::string, std::string>> out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (rcs[i] == ZNONODE) {
      continue;  // a key without a record (or removed since the children were read)
    }
    if (rcs[i] != ZOK) {
      return ErrorStatus(rcs[i], fmt::format("reading the record of {}", keys[i]), options_);
    }
    std::string_view text = values[i];
    std::int64_t ttl_ms = 0;
    if (!TakeNumber(text, &ttl_ms)) {
      return Status::Internal(
          fmt::format("the record node of {} is not in leasehold's layout", keys[i]));
    }
    if (FromZkMillis(stats[i].mtime) + milliseconds(ttl_ms) <= now) {
      continue;  // expired, as ReadRecord judges it
    }
    out.emplace_back(std::move(keys[i]), std::string(text));
  }
  return out;
}

Result<StoreTime> ZkBackend::WallClock() {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  LH_ASSIGN_OR_RETURN(SystemTime now, LeaderNow(*session));
  return StoreTime{.time = now, .from_store = true};
}

Status ZkBackend::DeleteOrDoom(const std::shared_ptr<ZkSession>& session, const std::string& path) {
  Requests requests(*session, options_.command_timeout);
  int rc = requests.Delete(path, -1);  // the name is unique to us: -1 cannot hit another's
  if (rc == ZOK || rc == ZNONODE || IsSessionGone(rc)) {
    return Status();
  }
  Doom({.session = session, .path = path});
  return ErrorStatus(rc, "deleting a node", options_);
}

void ZkBackend::Doom(Doomed doomed) {
  MutexLock lock(&mu_);
  doomed_.push_back(std::move(doomed));
  reaper_cv_.NotifyAll();
}

Result<std::optional<LeaseInfo>> ZkBackend::Inspect(std::string_view key) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  return ReadHolder(*session, key);
}

Result<std::vector<LeaseInfo>> ZkBackend::List(std::string_view prefix) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  std::vector<std::string> names;
  {
    Requests requests(*session, options_.command_timeout);
    int rc = requests.Children(base_, &names);
    if (rc == ZNONODE) {
      return std::vector<LeaseInfo>();
    }
    if (rc != ZOK) {
      return ErrorStatus(rc, "listing leases", options_);
    }
  }
  const std::vector<std::string> keys = KeysWithPrefix(names, prefix);
  std::vector<LeaseInfo> out;
  for (const std::string& key : keys) {
    LH_ASSIGN_OR_RETURN(std::optional<LeaseInfo> info, ReadHolder(*session, key));
    if (info.has_value()) {
      out.push_back(std::move(*info));
    }
  }
  return out;
}

Result<bool> ZkBackend::ForceRelease(std::string_view key) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  const std::string dir = KeyDir(key);
  for (int attempt = 0; attempt < kRaceRetries; ++attempt) {
    Requests requests(*session, options_.command_timeout);
    std::vector<std::string> children;
    int rc = requests.Children(dir, &children);
    if (rc == ZNONODE) {
      return false;
    }
    if (rc != ZOK) {
      return ErrorStatus(rc, fmt::format("force-releasing {}", key), options_);
    }
    if (std::find(children.begin(), children.end(), kKeptName) != children.end()) {
      LH_ASSIGN_OR_RETURN(std::optional<Kept> kept, ReadKept(*session, key, dir));
      if (kept.has_value()) {
        rc = requests.Delete(dir + "/" + std::string(kKeptName), kept->version);
        if (rc == ZNONODE || rc == ZBADVERSION) {
          continue;  // taken over or replaced meanwhile: decide again
        }
        if (rc != ZOK) {
          return ErrorStatus(rc, fmt::format("force-releasing {}", key), options_);
        }
        if (kept->remaining > Duration::zero()) {
          LogEvent(LogLevel::kWarning, "zk_force_release", {{"key", std::string(key)},
                                                            {"node", std::string(kKeptName)}});
          return true;  // the kept grant was the holder; queued nodes stay queued
        }
        // An expired one, tidied away: the holder is the lowest queued node, if any.
      }
    }
    SortBySequence(children);
    if (children.empty()) {
      return false;
    }
    rc = requests.Delete(dir + "/" + children.front(), -1);
    if (rc == ZOK) {
      LogEvent(LogLevel::kWarning, "zk_force_release",
               {{"key", std::string(key)}, {"node", children.front().substr(0, 9)}});
      return true;
    }
    if (rc != ZNONODE) {
      return ErrorStatus(rc, fmt::format("force-releasing {}", key), options_);
    }
  }
  return Status::Unavailable(
      fmt::format("the holder of {} kept changing while force-releasing; try again", key));
}

void ZkBackend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  if (waiter_id.empty()) {
    return;
  }
  Queued queued;
  {
    MutexLock lock(&mu_);
    auto it = waiters_.find({std::string(key), std::string(waiter_id)});
    if (it == waiters_.end()) {
      return;
    }
    queued = std::move(it->second);
    waiters_.erase(it);
  }
  if (queued.session == nullptr || queued.session->Expired()) {
    return;
  }
  // By prefix, through the waiter's own session: this also finds a node whose create reply was
  // lost. The waiter is done, so its prefix is never used again.
  Doomed doomed{
      .session = queued.session, .dir = KeyDir(key), .prefix = "w" + std::string(waiter_id) + "-"};
  if (!queued.path.empty()) {
    Requests requests(*queued.session, options_.command_timeout);
    int rc = requests.Delete(queued.path, -1);
    if (rc == ZOK || rc == ZNONODE || IsSessionGone(rc)) {
      return;
    }
  } else {
    Requests requests(*queued.session, options_.command_timeout);
    std::vector<std::string> children;
    int rc = requests.Children(doomed.dir, &children);
    if (rc == ZNONODE) {
      return;
    }
    bool all_gone = rc == ZOK;
    for (const std::string& child : children) {
      if (child.starts_with(doomed.prefix)) {
        int drc = requests.Delete(doomed.dir + "/" + child, -1);
        all_gone = all_gone && (drc == ZOK || drc == ZNONODE);
      }
    }
    if (all_gone) {
      return;
    }
  }
  Doom(std::move(doomed));
}

Status ZkBackend::WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, ServiceSession());
  return Wait(session, KeyDir(key), std::string_view(), deadline, std::move(stop));
}

Status ZkBackend::WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                              std::stop_token stop) {
  std::shared_ptr<ZkSession> session;
  std::string my_name;
  if (!waiter_id.empty()) {
    MutexLock lock(&mu_);
    auto it = waiters_.find({std::string(key), std::string(waiter_id)});
    if (it != waiters_.end()) {
      session = it->second.session;
      my_name = it->second.path.substr(it->second.path.rfind('/') + 1);
    }
  }
  if (session == nullptr) {
    return WaitForChange(key, deadline, std::move(stop));
  }
  return Wait(session, KeyDir(key), my_name, deadline, std::move(stop));
}

Status ZkBackend::Wait(const std::shared_ptr<ZkSession>& session, const std::string& dir,
                       std::string_view my_name, SteadyTime deadline, std::stop_token stop) {
  if (stop.stop_requested()) {
    return Status::Cancelled("cancelled while waiting");
  }
  Requests requests(*session, options_.command_timeout);
  std::vector<std::string> children;
  int rc = requests.Children(dir, &children);
  if (rc == ZNONODE) {
    return Status();  // no node at all: the key is free
  }
  if (rc != ZOK) {
    return ErrorStatus(rc, "waiting for a lease", options_);
  }
  // A live kept grant holds the key until its expiry, which nothing announces (the node is not
  // deleted then): wait until then at most, watching the node for an earlier delete.
  SteadyTime until = deadline;
  bool kept_live = false;
  if (std::find(children.begin(), children.end(), kKeptName) != children.end()) {
    LH_ASSIGN_OR_RETURN(std::optional<Kept> kept, ReadKept(*session, "", dir));
    if (kept.has_value() && kept->remaining > Duration::zero()) {
      kept_live = true;
      until = std::min(deadline, Clock::Real().Now() + kept->remaining);
    }
  }
  SortBySequence(children);
  std::string watched;
  if (my_name.empty()) {
    if (children.empty()) {
      if (!kept_live) {
        return Status();
      }
      watched = kKeptName;
    } else {
      watched = children.front();
    }
  } else {
    auto mine = std::find(children.begin(), children.end(), my_name);
    if (mine == children.end()) {
      return Status();  // our node is gone: the next try says why
    }
    if (mine == children.begin()) {
      if (!kept_live) {
        return Status();  // our turn
      }
      watched = kKeptName;
    } else {
      watched = *(mine - 1);  // the predecessor only: no herd when the holder leaves
    }
  }
  auto waker = std::make_shared<ZkWaker>();
  rc = requests.Watch(dir + "/" + watched, waker);
  if (rc == ZNONODE) {
    return Status();
  }
  if (rc != ZOK) {
    return ErrorStatus(rc, "waiting for a lease", options_);
  }
  std::unique_lock<std::mutex> lock(waker->mu);
  if (waker->cv.wait_until(lock, stop, ToSteady(until), [&] { return waker->fired; })) {
    return Status();
  }
  if (stop.stop_requested()) {
    return Status::Cancelled("cancelled while waiting");
  }
  if (Clock::Real().Now() < deadline) {
    return Status();  // the kept grant has expired
  }
  return Status::DeadlineExceeded("the lease did not change before the deadline");
}

void ZkBackend::ReaperLoop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    std::vector<Doomed> work;
    {
      MutexLock lock(&mu_);
      const SteadyTime now = Clock::Real().Now();
      SteadyTime next = now + std::chrono::seconds(1);
      for (auto it = grants_.begin(); it != grants_.end();) {
        if (now >= it->second.deadline) {
          // Not renewed in time: the holder has given it up (its safe_until has passed), so
          // the node must not block the key any longer, whether or not its session lives.
          LogEvent(LogLevel::kInfo, "zk_grant_expired", {{"key", it->first.first}});
          doomed_.push_back({.session = it->second.session, .path = it->second.path});
          it = grants_.erase(it);
        } else {
          next = std::min(next, it->second.deadline);
          ++it;
        }
      }
      work.swap(doomed_);
      if (work.empty()) {
        reaper_cv_.WaitUntil(ToSteady(next), stop, [&]() LH_NO_THREAD_SAFETY_ANALYSIS {
          return !doomed_.empty() ||
                 std::any_of(grants_.begin(), grants_.end(),
                             [&](const auto& g) { return g.second.deadline < next; });
        });
        continue;
      }
    }
    std::vector<Doomed> retry;
    for (Doomed& d : work) {
      if (d.session->Expired()) {
        continue;  // its ephemeral nodes went with it
      }
      Requests requests(*d.session, options_.command_timeout);
      std::vector<std::string> paths;
      int rc = ZOK;
      if (d.path.empty()) {
        std::vector<std::string> children;
        rc = requests.Children(d.dir, &children);
        for (const std::string& child : children) {
          if (child.starts_with(d.prefix)) {
            paths.push_back(d.dir + "/" + child);
          }
        }
      } else {
        paths.push_back(d.path);
      }
      bool done = rc == ZOK || rc == ZNONODE || IsSessionGone(rc);
      if (rc == ZOK) {
        for (const std::string& path : paths) {
          int drc = requests.Delete(path, -1);  // unique name: never another's node
          done = done && (drc == ZOK || drc == ZNONODE || IsSessionGone(drc));
        }
      }
      if (done) {
        continue;
      }
      if (++d.attempts < kReaperMaxAttempts) {
        retry.push_back(std::move(d));
      }
    }
    MutexLock lock(&mu_);
    for (Doomed& d : retry) {
      doomed_.push_back(std::move(d));
    }
    if (!retry.empty()) {
      reaper_cv_.WaitUntil(std::chrono::steady_clock::now() + kReaperRetry, stop,
                           [] { return false; });
    }
  }
}

Result<Duration> ZkBackend::NegotiatedTimeoutForTesting(Duration ttl) {
  LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session, LeaseSession(ttl));
  return session->negotiated;
}

int ZkBackend::ConnectedPortForTesting(Duration ttl) {
  std::shared_ptr<ZkSession> session;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(duration_cast<milliseconds>(ttl).count());
    if (it == sessions_.end()) {
      return -1;
    }
    session = it->second;
  }

  struct sockaddr_storage addr {};

  socklen_t len = sizeof(addr);
  if (zookeeper_get_connected_host(session->zh, reinterpret_cast<struct sockaddr*>(&addr), &len) ==
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

}  // namespace leasehold::internal
