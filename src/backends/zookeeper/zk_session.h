// File: backends/zookeeper/zk_session.h (internal)
//
// The glue to ZooKeeper's C client (zookeeper_mt) under the zk:// store: ZkSession (one
// zhandle_t, i.e. one ZooKeeper session), ZkRequests (its synchronous face: every request sent
// asynchronously and waited for with a bound), ZkPending (a request sent and not yet awaited, for
// pipelining over several sessions) and the mapping of the client's return codes to Status.
// zk_session.cc and the files that include this header are the only ones that see zookeeper.h;
// zk_backend.h does not.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(std::shared_ptr<ZkSession> session,
//                       ZkSession::Open(options, /*timeout=*/10s, clock));
//   ZkRequests requests(*session, options.command_timeout);
//   std::vector<std::string> children;
//   if (int rc = requests.Children("/leasehold", &children); rc != ZOK) {
//     return ZkErrorStatus(rc, "listing leases", options);
//   }
//
// Time: every deadline here is a SteadyTime on the session's Clock (the backend's); waits on a
// CondVar convert it with ToSteady (backends/common/time.h).
//
// Thread safety: ZkSession is thread-safe; the C client calls its watcher and the completion
// callbacks on its own completion thread, and they only record results and signal condition
// variables (never blocking, never taking a backend lock). A ZkRequests or ZkPending is not
// thread-safe; confine it to one thread. Lock order: a backend's lock before a ZkSession's mu_
// (ZkSession::Expired() is called with ZkBackend::mu_ held); a waker's and a reply's lock are
// taken alone (the watch callback lets the waker's go before it takes the session's). No lock
// is held across a request, and the session's, a reply's or a waker's never across
// zookeeper_close (~ZkSession), which joins the completion thread whose callbacks take them.
// The callbacks take no backend lock, so a backend may drop a session's last reference under
// its own.

#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <zookeeper/zookeeper.h>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "backends/zookeeper/zk_options.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

struct ZkReply;  // zk_session.cc

// What a grant's node watch (ZkPending::WatchGet) has seen, shared by the backend's grant and
// the watcher callback: kLive until a node event (the node deleted, or its data changed) or the
// session's end. Set on the client's completion thread, which runs watch events and completions
// in the order they came off the connection: so once the reply of a request sent after the
// watch was set has been awaited, every event the server sent before that reply has been
// recorded here.
struct ZkNodeWatch {
  enum State : int { kLive = 0, kDeleted = 1, kChanged = 2, kSessionEnded = 3 };

  std::atomic<int> state{kLive};
};

// A watch's wake-up, shared by the waiting caller and the watcher callback.
struct ZkWaker {
  Mutex mu;
  CondVar cv{&mu};
  bool fired LH_GUARDED_BY(mu) = false;
  // The first event's type (ZOO_DELETED_EVENT, ZOO_SESSION_EVENT, ...), once fired.
  int type LH_GUARDED_BY(mu) = 0;
};

// True for the rcs that may succeed if retried (connection loss, timeouts).
bool IsZkTransient(int rc);
// True for the rcs that say the session is gone (expired, or the handle closed).
bool IsZkSessionGone(int rc);
// Maps a ZooKeeper rc that ended `what` to a Status (never kOk): kUnavailable for transient
// errors and an expired session, kPermissionDenied for ACL and auth errors, kInternal otherwise.
// The rc goes in the backend detail.
Status ZkErrorStatus(int rc, std::string_view what, const ZkOptions& options);

// Routes the C client's own log lines to leasehold's log (debug level) at most once per process.
void SetUpZkClientLogging();

// One ZooKeeper session (one zhandle_t). The C client reconnects by itself within the session;
// once expired, the handle is useless and the backend opens another for new work. The handle is
// closed when the last reference goes (never on the client's own threads: references are held
// by the backend, its grants and callers only). Thread-safe.
class ZkSession {
 public:
  // Opens a session asking for `timeout` as its session timeout, waits until it is connected
  // (at most options.connect_timeout on `clock`), and authenticates with digest if the options
  // have credentials. Returns kInvalidArgument if the client refuses the host list; kUnavailable
  // if no server answers in time; kPermissionDenied if the credentials are refused.
  static Result<std::shared_ptr<ZkSession>> Open(const ZkOptions& options, Duration timeout,
                                                 Clock& clock);

  // Closes the handle (the server deletes the session's ephemeral nodes) and frees the
  // contexts of watches that never fired.
  ~ZkSession();

  ZkSession(const ZkSession&) = delete;
  ZkSession& operator=(const ZkSession&) = delete;
  ZkSession(ZkSession&&) = delete;
  ZkSession& operator=(ZkSession&&) = delete;

  // True once the session expired or its authentication failed: open another.
  [[nodiscard]] bool Expired() LH_EXCLUDES(mu_);

  [[nodiscard]] zhandle_t* zh() const { return zh_; }

  // The clock every deadline of this session's requests is on (the backend's).
  [[nodiscard]] Clock& clock() const { return clock_; }

  // The session timeout the server granted.
  [[nodiscard]] Duration negotiated() const { return negotiated_; }

  // The server's id of the session: the ephemeralOwner of the nodes it creates.
  [[nodiscard]] std::int64_t session_id() const { return session_id_; }

  // The port of the server the session is connected to; -1 if none.
  [[nodiscard]] int ConnectedPort() const;

  // Sends the four-letter word `word` ("srvr", "conf") to the server the session is connected
  // to, on a TCP connection of its own, and returns what the server wrote before closing it
  // (at most 64 KiB), all within `timeout` on the session's clock. A word outside the server's
  // 4lw.commands.whitelist is answered "... is not executed because it is not in the
  // whitelist.": the caller reads the text. Returns kUnavailable if there is no connected
  // server or it did not answer in time.
  Result<std::string> FourLetterWord(std::string_view word, Duration timeout) const;

  // The connection epoch: bumped by every session event (a disconnect, a reconnect, expiry), on
  // the completion thread, in order with the replies. Two reads that are equal, with a reply
  // awaited between them, say that reply came over the same connection as every reply awaited
  // after the first read: the watches set on it are still registered with the server (a
  // reconnect re-registers them through the client, but not in a known order with our requests).
  [[nodiscard]] std::uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }

  // The latest t_send (on the session's clock, read before sending) of a request the server is
  // known to have answered: the session cannot expire before it + negotiated(). NoteHeard keeps
  // the latest; last_heard() is SteadyTime::min() until the first.
  void NoteHeard(SteadyTime t_send);
  [[nodiscard]] SteadyTime last_heard() const;

 private:
  friend class ZkRequests;  // registers watches
  friend class ZkPending;   // registers node watches (WatchGet)

  // The context of one registered data watch (zk_session.cc). Owned by watches_: freed by the
  // watcher when the watch is done (a node event, or the session's end), or by the destructor
  // with the watch still registered (a predecessor that never changed).
  struct WatchContext;

  explicit ZkSession(Clock& clock) : clock_(clock) {}

  // Called on the client's completion thread for session events: records, signals, never
  // blocks.
  static void Watcher(zhandle_t* zh, int type, int state, const char* path, void* ctx);
  // Called on the client's completion thread for the events of a data watch.
  static void NodeWatcher(zhandle_t* zh, int type, int state, const char* path, void* ctx);

  void AddWatch(WatchContext* watch) LH_EXCLUDES(mu_);
  // Forgets and frees a watch context: false if it was already gone.
  bool ReleaseWatch(WatchContext* watch) LH_EXCLUDES(mu_);

  // Immutable once Open returns it.
  Clock& clock_;
  zhandle_t* zh_ = nullptr;
  Duration negotiated_{};
  std::int64_t session_id_ = 0;

  Mutex mu_;
  CondVar cv_{&mu_};
  int state_ LH_GUARDED_BY(mu_) = 0;
  bool expired_ LH_GUARDED_BY(mu_) = false;
  bool auth_failed_ LH_GUARDED_BY(mu_) = false;
  // The contexts of the data watches still registered with the client (ZkRequests::Watch,
  // ZkPending::WatchGet).
  std::set<WatchContext*> watches_ LH_GUARDED_BY(mu_);
  // The exists watches (ZkPending::WatchExists), one context per path, reused while unfired.
  // An unfired one stays until its node appears or the session ends, so a session that waits
  // on ever new keys would grow them without end: past kMaxExistsWatches a new one is not set
  // (WatchExists answers ZNOWATCHER, and the waiter takes the ordinary path: no handoff from
  // the delete event for that wait).
  static constexpr std::size_t kMaxExistsWatches = 4096;
  std::map<std::string, WatchContext*> exists_watches_ LH_GUARDED_BY(mu_);
  std::atomic<std::uint64_t> epoch_{1};
  std::atomic<std::int64_t> last_heard_{std::numeric_limits<std::int64_t>::min()};
};

// One entry of a node's ACL (ZkPending::GetAcl): ZOO_PERM_* bits, scheme ("world", "digest",
// "ip", ...) and id ("anyone", "user:hash", ...).
struct ZkAclEntry {
  int perms = 0;
  std::string scheme;
  std::string id;
};

// What a reply carries, where the request has it: a Stat, a node's data (get) or created path
// (create), a node's children (get children), a node's ACL (get ACL).
struct ZkAnswer {
  struct Stat stat {};

  std::string value;
  std::vector<std::string> strings;
  std::vector<ZkAclEntry> acl;
};

// One request sent through a session and not yet awaited, so that several (over several
// sessions) share one round of latency. Copyable; the reply outlives a caller that gave up.
class ZkPending {
 public:
  static ZkPending Exists(ZkSession& session, const std::string& path);
  static ZkPending Get(ZkSession& session, const std::string& path);
  static ZkPending Children(ZkSession& session, const std::string& path);
  static ZkPending GetAcl(ZkSession& session, const std::string& path);
  static ZkPending Create(ZkSession& session, const std::string& path, std::string_view value,
                          const struct ACL_vector* acl, int mode);
  static ZkPending Delete(ZkSession& session, const std::string& path, int version);
  static ZkPending Set(ZkSession& session, const std::string& path, std::string_view value,
                       int version);
  // A sync through the leader: the session's later reads are served no older than it.
  static ZkPending Sync(ZkSession& session);
  // A get of `path` that leaves a one-shot data watch recording into `*node` (ZkNodeWatch):
  // the node's delete or change, or the session's end. No watch is left if the node is absent
  // (ZNONODE).
  static ZkPending WatchGet(ZkSession& session, const std::string& path,
                            const std::shared_ptr<ZkNodeWatch>& node);
  // An exists of `path` that leaves a watch (also when the node is absent: it fires on its
  // create) recording into `*node`. One context per path and session, reused while it has not
  // fired (the client and the server keep one watch per path then), so waiting many times on a
  // key adds no watches; it goes when it fires or the session ends.
  static ZkPending WatchExists(ZkSession& session, const std::string& path,
                               std::shared_ptr<ZkNodeWatch>* node);

  // Waits for the reply until `deadline` (on the session's clock). Returns its rc (the client's
  // own if the request could not even be queued), or ZOPERATIONTIMEOUT if no reply came in time;
  // fills `*answer` (if not null) where ZOK.
  int Await(SteadyTime deadline, ZkAnswer* answer = nullptr);

 private:
  ZkPending(Clock& clock, std::shared_ptr<ZkReply> reply)
      : clock_(&clock), reply_(std::move(reply)) {}

  Clock* clock_;
  std::shared_ptr<ZkReply> reply_;
};

// One operation of a multi (ZkRequests::Multi).
struct ZkMultiOp {
  enum Kind { kCreate, kDelete, kSet, kCheck };

  Kind kind = kCheck;
  std::string path;
  std::string data;  // kCreate, kSet
  int version = -1;  // kDelete, kSet, kCheck: -1 = any
  int mode = 0;      // kCreate
};

// The synchronous face of one session: each call sends one asynchronous request and waits for
// its reply, every call of one ZkRequests until the same deadline (the session's clock at
// construction + `timeout`). Each returns the ZooKeeper rc; ZOPERATIONTIMEOUT if the deadline
// passed first. Not thread-safe.
class ZkRequests {
 public:
  ZkRequests(ZkSession& session, Duration timeout);

  int Exists(const std::string& path, struct Stat* stat);
  int Get(const std::string& path, std::string* value, struct Stat* stat);

  // One get per path, all sent before any reply is awaited (one round of latency). Returns each
  // get's rc; values and stats are filled where ZOK.
  std::vector<int> GetAll(const std::vector<std::string>& paths, std::vector<std::string>* values,
                          std::vector<struct Stat>* stats);

  // One exists per path, all sent before any reply is awaited (one round of latency). Returns
  // each one's rc: ZOK (the node exists), ZNONODE, or an error.
  std::vector<int> ExistsAll(const std::vector<std::string>& paths);

  int Children(const std::string& path, std::vector<std::string>* children);
  // `created` and `stat` may be null.
  int Create(const std::string& path, std::string_view value, const struct ACL_vector* acl,
             int mode, std::string* created, struct Stat* stat);
  int Delete(const std::string& path, int version);
  // `stat` (may be null) gets the node's Stat: its mtime is the leader's time of the write.
  int Set(const std::string& path, std::string_view value, int version,
          struct Stat* stat = nullptr);

  // Sends `ops` as one multi (all applied or none). Returns the multi's rc (the first failing
  // op's); `errors` gets each op's own rc when the reply came.
  int Multi(const std::vector<ZkMultiOp>& ops, const struct ACL_vector* acl,
            std::vector<int>* errors);

  // Sets a one-shot data watch on `path` that sets waker->fired. Returns ZNONODE if the node is
  // already gone (no watch then).
  int Watch(const std::string& path, const std::shared_ptr<ZkWaker>& waker);
  // As Watch, for every path at once, all sent before any reply is awaited (one round of
  // latency), all firing the one waker. Returns ZNONODE if any node is already gone (the waiter
  // need not sleep), else the first error, else ZOK.
  int WatchAny(const std::vector<std::string>& paths, const std::shared_ptr<ZkWaker>& waker);

 private:
  ZkSession* const session_;
  const SteadyTime deadline_;
};

}  // namespace leasehold::internal
