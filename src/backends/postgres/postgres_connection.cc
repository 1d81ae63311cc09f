// File: backends/postgres/postgres_connection.cc (internal)
//
// PgConnection over libpq's asynchronous API: PQsendQuery*, then poll() on the socket (and on
// an eventfd that a stop request writes to) until PQisBusy says the results are in. The only
// file that includes libpq-fe.h.
//
// Invariants:
// - No call blocks past its deadline plus a short cancel grace: sends are flushed without
//   blocking, reads happen only after poll() says the socket is readable.
// - A connection that lost a statement (no answer even after PQcancel) or saw an I/O error is
//   broken for good: nobody can tell which of its statements ran, and in advisory mode its
//   session (and with it every lock) is gone or about to go.
// - Every message that can quote libpq goes through ScrubPassword.

#include "backends/postgres/postgres_connection.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <system_error>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <libpq-fe.h>
#include <sys/eventfd.h>

#include "core/logging.h"
#include "util/mutex.h"
#include "util/sigpipe_guard.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

namespace {

// PgConnection::TrustUnconfirmedCommitsForTesting.
std::atomic<bool> trust_unconfirmed_for_testing{false};

// After a cancel, how long the statement has to end before the connection is given up.
constexpr Duration kCancelGrace = std::chrono::seconds(2);

// Cancel requests of the process still waiting for their server (PgConnection::Cancel): each is
// one thread blocked in PQcancel, for as long as the server neither answers nor refuses.
constexpr int kMaxCancelsInFlight = 8;
std::atomic<int> cancels_in_flight{0};

std::string Trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
    text.pop_back();
  }
  return text;
}

// libpq's connection errors run over several lines ("...failed: Connection refused\n\tIs the
// server running on that host..."): joined into one sentence after another ("refused. Is the
// server..."), as every leasehold message is one line.
std::string OneLine(std::string text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' || text[i] == '\t') {
      while (i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\t')) {
        ++i;
      }
      const bool ends =
          !out.empty() && std::string_view(".:;?!").find(out.back()) != std::string_view::npos;
      out += ends ? " " : ". ";
    } else {
      out += text[i];
    }
  }
  return out;
}

// True if a notice is the server's warning that it cancelled a COMMIT's wait for synchronous
// replication (syncrep.c: SQLSTATE 01000 "canceling wait for synchronous replication due to
// user request", or 57P01 "canceling the wait for synchronous replication and terminating
// connection due to administrator command"; both with the detail "The transaction has already
// committed locally, but might not have been replicated to the standby."). Matched by SQLSTATE
// and by the English text of either the message or the detail: a server with lc_messages in
// another language is caught only through this connection's own cancels (Exec).
bool IsSyncRepCancel(std::string_view sqlstate, std::string_view message, std::string_view detail) {
  if (!sqlstate.starts_with("01") && sqlstate != kSqlStateAdminShutdown) {
    return false;
  }
  return (message.find("wait for synchronous replication") != std::string_view::npos &&
          message.find("cancel") != std::string_view::npos) ||
         detail.find("committed locally") != std::string_view::npos;
}

bool IsAuthFailure(std::string_view message) {
  for (std::string_view s :
       {"password authentication failed", "no password supplied", "pg_hba.conf",
        "authentication failed", "role \"", "permission denied"}) {
    if (message.find(s) != std::string_view::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

PgResult::PgResult(pg_result* result) : result_(result) {}

void PgResult::Deleter::operator()(pg_result* r) const {
  PQclear(r);
}

int PgResult::rows() const {
  return result_ ? PQntuples(result_.get()) : 0;
}

bool PgResult::IsNull(int row, int col) const {
  return !result_ || row >= rows() || col >= PQnfields(result_.get()) ||
         PQgetisnull(result_.get(), row, col) != 0;
}

std::string_view PgResult::Get(int row, int col) const {
  if (IsNull(row, col)) {
    return {};
  }
  return {PQgetvalue(result_.get(), row, col),
          static_cast<std::size_t>(PQgetlength(result_.get(), row, col))};
}

long long PgResult::GetInt(int row, int col) const {
  std::string_view text = Get(row, col);
  long long value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

bool PgResult::GetBool(int row, int col) const {
  return Get(row, col) == "t";
}

std::string_view PgResult::command_tag() const {
  return result_ ? std::string_view(PQcmdStatus(result_.get())) : std::string_view();
}

long long PgResult::rows_processed() const {
  if (!result_) {
    return 0;
  }
  std::string_view text = PQcmdTuples(result_.get());
  long long value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

Result<std::unique_ptr<PgConnection>> PgConnection::Connect(const PostgresOptions& options,
                                                            Clock& clock) {
  std::vector<const char*> keywords;
  std::vector<const char*> values;
  for (const auto& [k, v] : options.libpq_params) {
    keywords.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keywords.push_back(nullptr);
  values.push_back(nullptr);
  SigpipeGuard no_sigpipe;
  pg_conn* conn = PQconnectdbParams(keywords.data(), values.data(), /*expand_dbname=*/0);
  if (conn == nullptr) {
    return Status::Unavailable(
        fmt::format("cannot connect to postgres at {}: out of memory", options.display));
  }
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string reason = ScrubPassword(OneLine(Trim(PQerrorMessage(conn))), options.password);
    PQfinish(conn);
    std::string message =
        fmt::format("cannot connect to postgres at {}: {}", options.display, reason);
    if (IsAuthFailure(reason)) {
      return Status::PermissionDenied(std::move(message));
    }
    if (reason.find("invalid connection option") != std::string::npos ||
        reason.find("invalid sslmode") != std::string::npos ||
        reason.find("invalid integer value") != std::string::npos) {
      return Status::InvalidArgument(std::move(message));
    }
    return Status::Unavailable(std::move(message));
  }
  if (PQsetnonblocking(conn, 1) != 0) {
    PQfinish(conn);
    return Status::Unavailable(
        fmt::format("cannot use postgres at {}: non-blocking mode refused", options.display));
  }
  std::unique_ptr<PgConnection> out(new PgConnection(conn, options, clock));
  PQsetNoticeReceiver(conn, &PgConnection::OnNotice, out.get());
  return out;
}

void PgConnection::TrustUnconfirmedCommitsForTesting(bool trust) {
  trust_unconfirmed_for_testing = trust;
}

bool PgIndeterminate(const Status& status) {
  return status.detail() == kIndeterminate;
}

void PgConnection::OnNotice(void* self, const pg_result* notice) {
  // The server's NOTICEs and WARNINGs (a fenced write's "relation ... already exists,
  // skipping"): into leasehold's log at debug level, never onto the application's stderr, where
  // libpq's default receiver prints them.
  auto field = [notice](int code) {
    const char* v = PQresultErrorField(notice, code);
    return std::string_view(v != nullptr ? v : "");
  };
  const std::string text = Trim(PQresultErrorMessage(notice));
  Log(LogLevel::kDebug, fmt::format("postgres notice: {}", text));
  if (IsSyncRepCancel(field(PG_DIAG_SQLSTATE), field(PG_DIAG_MESSAGE_PRIMARY),
                      field(PG_DIAG_MESSAGE_DETAIL))) {
    static_cast<PgConnection*>(self)->sync_rep_cancelled_ =
        std::string(field(PG_DIAG_MESSAGE_PRIMARY));
  }
}

Status PgConnection::Indeterminate(std::string_view what, std::string_view why,
                                   StatusCode code) const {
  return Status(code,
                fmt::format("the store may have applied {}: postgres at {} {}; its outcome is "
                            "unknown, so it is not reported as done",
                            what, display_, why),
                std::string(kIndeterminate));
}

PgConnection::PgConnection(pg_conn* conn, const PostgresOptions& options, Clock& clock)
    : conn_(conn),
      clock_(clock),
      cancel_(PQgetCancel(conn),
              [](pg_cancel* cancel) {
                if (cancel != nullptr) {
                  PQfreeCancel(cancel);
                }
              }),
      display_(options.display),
      password_(options.password),
      startup_pid_(PQbackendPID(conn)),
      wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

PgConnection::~PgConnection() {
  SigpipeGuard no_sigpipe;
  PQfinish(conn_);
  if (wake_fd_ >= 0) {
    close(wake_fd_);
  }
}

// One cancel request, sent by a thread of its own (PgConnection::StartCancel).
struct PgConnection::CancelRequest {
  Mutex mu;
  CondVar answered_cv{&mu};
  bool answered LH_GUARDED_BY(mu) = false;

  // True once the server took the request (or refused it), false if `wait` passed first.
  bool AwaitAnswer(Duration wait) {
    MutexLock lock(&mu);
    return answered_cv.WaitUntil(std::chrono::steady_clock::now() + wait, {},
                                 [&]() LH_NO_THREAD_SAFETY_ANALYSIS { return answered; });
  }

  void Answered() {
    {
      MutexLock lock(&mu);
      answered = true;
    }
    answered_cv.NotifyAll();
  }
};

void PgConnection::Cancel() {
  (void)StartCancel();
}

std::shared_ptr<PgConnection::CancelRequest> PgConnection::StartCancel() {
  if (cancel_ == nullptr) {
    return nullptr;
  }
  if (cancels_in_flight.fetch_add(1) >= kMaxCancelsInFlight) {
    cancels_in_flight.fetch_sub(1);
    Log(LogLevel::kDebug,
        fmt::format("postgres at {}: cancel request skipped ({} earlier ones still unanswered)",
                    display_, kMaxCancelsInFlight));
    return nullptr;
  }
  auto request = std::make_shared<CancelRequest>();
  try {
    std::thread([cancel = cancel_, request] {
      {
        SigpipeGuard no_sigpipe;
        char err[256];
        (void)PQcancel(cancel.get(), err, sizeof(err));
      }
      request->Answered();
      cancels_in_flight.fetch_sub(1);
    }).detach();
  } catch (const std::system_error& e) {
    cancels_in_flight.fetch_sub(1);
    Log(LogLevel::kDebug,
        fmt::format("postgres at {}: no thread for a cancel request: {}", display_, e.what()));
    return nullptr;
  }
  return request;
}

Status PgConnection::MarkBroken(std::string_view what, std::string reason) {
  const bool in_flight = busy_;
  broken_ = true;
  busy_ = false;
  broken_reason_ = ScrubPassword(Trim(std::move(reason)), password_);
  if (in_flight) {
    return Indeterminate(what,
                         fmt::format("lost the connection after it was sent ({})", broken_reason_),
                         StatusCode::kUnavailable);
  }
  return Status::Unavailable(fmt::format("connection to postgres at {} failed during {}: {}",
                                         display_, what, broken_reason_));
}

Status PgConnection::ResultStatus(std::string_view what, pg_result* result) {
  ExecStatusType st = PQresultStatus(result);
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_EMPTY_QUERY) {
    return Status();
  }
  const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  std::string sqlstate = state != nullptr ? state : "";
  std::string text = ScrubPassword(Trim(PQresultErrorMessage(result)), password_);
  if (text.starts_with("ERROR:  ") || text.starts_with("FATAL:  ")) {
    text = text.substr(8);
  }
  std::string message = fmt::format("postgres at {} refused {}: {}", display_, what, text);
  if (sqlstate.starts_with("28") || sqlstate == kSqlStateInsufficientPrivilege) {
    return Status::PermissionDenied(std::move(message), sqlstate);
  }
  if (sqlstate.starts_with("08") || sqlstate.starts_with("57") || sqlstate.starts_with("53") ||
      sqlstate.starts_with("40") || sqlstate == kSqlStateLockNotAvailable || sqlstate.empty()) {
    return Status::Unavailable(std::move(message), sqlstate);
  }
  return Status::Internal(std::move(message), sqlstate);
}

void PgConnection::Discard(std::string reason) {
  if (!broken_) {
    (void)MarkBroken("discard", std::move(reason));
  }
}

Status PgConnection::Send(std::string_view what, const std::string& sql, const PgParams& params) {
  return SendStatement(what, sql, params, /*once=*/false);
}

Status PgConnection::SendStatement(std::string_view what, const std::string& sql,
                                   const PgParams& params, bool once) {
  if (broken_) {
    return Status::Unavailable(
        fmt::format("connection to postgres at {} is closed: {}", display_, broken_reason_));
  }
  if (busy_) {
    return Status::Internal(fmt::format("{}: connection busy with another statement", what));
  }
  SigpipeGuard no_sigpipe;
  int sent = 0;
  if (params.empty() && !once) {
    sent = PQsendQuery(conn_, sql.c_str());
  } else {
    std::vector<const char*> values;
    values.reserve(params.size());
    for (const auto& p : params) {
      values.push_back(p ? p->c_str() : nullptr);
    }
    if (auto it = once ? prepared_.end() : prepared_.find(sql); it != prepared_.end()) {
      sent = PQsendQueryPrepared(conn_, it->second.c_str(), static_cast<int>(params.size()),
                                 values.data(), nullptr, nullptr, 0);
    } else {
      sent = PQsendQueryParams(conn_, sql.c_str(), static_cast<int>(params.size()), nullptr,
                               values.data(), nullptr, nullptr, 0);
    }
  }
  if (sent != 1) {
    return MarkBroken(what, PQerrorMessage(conn_));
  }
  Started();
  return Status();
}

void PgConnection::Started() {
  busy_ = true;
  sync_rep_cancelled_.clear();
  pending_error_.reset();
  pending_result_ = PgResult();
}

Result<std::optional<PgResult>> PgConnection::Await(std::string_view what, SteadyTime deadline,
                                                    std::stop_token stop) {
  if (!busy_) {
    return Status::Internal(fmt::format("{}: no statement in flight", what));
  }
  const int wake_fd = wake_fd_;
  std::stop_callback wake(stop, [wake_fd] {
    std::uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  });
  SigpipeGuard no_sigpipe;
  while (true) {
    int flushed = PQflush(conn_);
    if (flushed < 0) {
      return MarkBroken(what, PQerrorMessage(conn_));
    }
    while (flushed == 0 && PQisBusy(conn_) == 0) {
      pg_result* r = PQgetResult(conn_);
      if (r == nullptr) {
        if (PQstatus(conn_) == CONNECTION_BAD) {
          // busy_ still set: MarkBroken reports an outcome nobody can vouch for.
          return MarkBroken(what, pending_error_ ? std::string(pending_error_->message())
                                                 : std::string(PQerrorMessage(conn_)));
        }
        busy_ = false;
        if (!sync_rep_cancelled_.empty() && !trust_unconfirmed_for_testing) {
          return Indeterminate(
              what,
              fmt::format("cancelled its COMMIT's wait for synchronous replication (\"{}\"): it "
                          "committed on that server and on no standby, and a failover undoes it",
                          sync_rep_cancelled_),
              StatusCode::kUnavailable);
        }
        if (pending_error_) {
          return *pending_error_;
        }
        return std::optional<PgResult>(std::move(pending_result_));
      }
      if (Status s = ResultStatus(what, r); !s.ok()) {
        if (!pending_error_) {
          pending_error_ = s;
        }
        PQclear(r);
      } else {
        pending_result_ = PgResult(r);
      }
    }
    SteadyTime now = clock_.Now();
    if (now >= deadline || stop.stop_requested()) {
      return std::optional<PgResult>();
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd fds[2] = {
        {PQsocket(conn_), static_cast<short>(POLLIN | (flushed == 1 ? POLLOUT : 0)), 0},
        {wake_fd_, POLLIN, 0}};
    int n = poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) {
      return MarkBroken(what, "poll failed");
    }
    if ((fds[1].revents & POLLIN) != 0) {
      std::uint64_t drained = 0;
      (void)!read(wake_fd_, &drained, sizeof(drained));
    }
    if ((fds[0].revents & (POLLIN | POLLERR | POLLHUP)) != 0 && PQconsumeInput(conn_) == 0) {
      return MarkBroken(what, PQerrorMessage(conn_));
    }
  }
}

Result<std::vector<std::string>> PgConnection::ReadNotifications(std::string_view channel,
                                                                 SteadyTime deadline,
                                                                 std::stop_token stop) {
  if (broken_) {
    return Status::Unavailable(
        fmt::format("connection to postgres at {} is closed: {}", display_, broken_reason_));
  }
  const int wake_fd = wake_fd_;
  std::stop_callback wake(stop, [wake_fd] {
    std::uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  });
  std::vector<std::string> payloads;
  auto drain = [&] {
    while (PGnotify* n = PQnotifies(conn_)) {
      if (channel == n->relname) {
        payloads.emplace_back(n->extra);
      }
      PQfreemem(n);
    }
  };
  drain();
  while (payloads.empty() && !stop.stop_requested()) {
    SteadyTime now = clock_.Now();
    if (now >= deadline) {
      break;
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd fds[2] = {{PQsocket(conn_), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int n = poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) {
      return MarkBroken("LISTEN", "poll failed");
    }
    if ((fds[1].revents & POLLIN) != 0) {
      std::uint64_t drained = 0;
      (void)!read(wake_fd_, &drained, sizeof(drained));
    }
    if ((fds[0].revents & (POLLIN | POLLERR | POLLHUP)) != 0) {
      if (PQconsumeInput(conn_) == 0 || PQstatus(conn_) == CONNECTION_BAD) {
        return MarkBroken("LISTEN", PQerrorMessage(conn_));
      }
      drain();
    }
  }
  return payloads;
}

Result<PgResult> PgConnection::Exec(std::string_view what, const std::string& sql,
                                    const PgParams& params, SteadyTime deadline,
                                    std::stop_token stop) {
  if (prepare_ && !params.empty() && !prepared_.contains(sql) && !broken_ && !busy_) {
    std::string name = fmt::format("leasehold_{}", prepared_.size() + 1);
    SigpipeGuard no_sigpipe;
    if (PQsendPrepare(conn_, name.c_str(), sql.c_str(), static_cast<int>(params.size()), nullptr) !=
        1) {
      return MarkBroken(what, PQerrorMessage(conn_));
    }
    Started();
    LH_RETURN_IF_ERROR(Finish(what, deadline, stop).status());
    prepared_.emplace(sql, std::move(name));
  }
  LH_RETURN_IF_ERROR(Send(what, sql, params));
  return Finish(what, deadline, stop);
}

Result<PgResult> PgConnection::ExecOnce(std::string_view what, const std::string& sql,
                                        const PgParams& params, SteadyTime deadline) {
  LH_RETURN_IF_ERROR(SendStatement(what, sql, params, /*once=*/true));
  return Finish(what, deadline, {});
}

Result<PgResult> PgConnection::Finish(std::string_view what, SteadyTime deadline,
                                      std::stop_token stop) {
  LH_ASSIGN_OR_RETURN(std::optional<PgResult> result, Await(what, deadline, stop));
  if (result) {
    return std::move(*result);
  }
  const bool stopped = stop.stop_requested();
  const SteadyTime grace_end = clock_.Now() + kCancelGrace;
  std::shared_ptr<CancelRequest> request = StartCancel();
  Result<std::optional<PgResult>> after = Await(what, grace_end, {});
  if (after.ok() && !after->has_value()) {
    return MarkBroken(what, "no answer even after a cancel request");
  }
  if (request != nullptr && !broken_ && !request->AwaitAnswer(grace_end - clock_.Now())) {
    // The server has not taken the cancel request yet and may act on it later, against
    // whatever this connection runs next: the connection is not used again.
    (void)MarkBroken(what, "its cancel request was not answered");
  }
  const StatusCode code = stopped ? StatusCode::kCancelled : StatusCode::kUnavailable;
  if (after.ok() && trust_unconfirmed_for_testing && !stopped) {
    return std::move(**after);
  }
  if (after.ok()) {
    // It finished just as we gave up, or the cancel only ended a COMMIT's wait for a standby
    // (success with a warning, which Await turns into an error): never trusted (Exec).
    return Indeterminate(what, "answered only after it was cancelled at its deadline", code);
  }
  if (PgIndeterminate(after.status())) {
    return Status(code, std::string(after.status().message()), std::string(kIndeterminate));
  }
  if (stopped) {
    return Status::Cancelled(fmt::format("{} cancelled", what));
  }
  return Status::Unavailable(
      fmt::format("postgres at {} did not answer {} in time (cancelled)", display_, what),
      std::string(after.status().detail()));
}

}  // namespace leasehold::internal
