// File: backends/redis/redis_connection.cc (internal)
//
// RedisTlsContext, RedisConnection (a socket of our own, OpenSSL for rediss://, hiredis 0.14's
// reply reader and command formatter); RedisConnectionPool is in redis_pool.cc.

#include "backends/redis/redis_connection.h"

#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "backends/common/url_params.h"
#include "core/backoff.h"
#include "core/duration.h"
#include "util/sigpipe_guard.h"

namespace leasehold::internal {

std::string_view ReplyText(const redisReply* reply) {
  if (reply == nullptr || reply->str == nullptr) {
    return {};
  }
  return {reply->str, reply->len};
}

bool IsError(const redisReply* reply) {
  return reply != nullptr && reply->type == REDIS_REPLY_ERROR;
}

bool IsNoScript(const redisReply* reply) {
  return IsError(reply) && ReplyText(reply).starts_with("NOSCRIPT");
}

Result<long long> ParseInteger(const redisReply* reply) {
  if (reply != nullptr && reply->type == REDIS_REPLY_INTEGER) {
    return reply->integer;
  }
  if (reply != nullptr && reply->type == REDIS_REPLY_STRING) {
    long long value = 0;
    std::string_view text = ReplyText(reply);
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc() && end == text.data() + text.size()) {
      return value;
    }
  }
  return Status::Internal("unexpected reply from redis: expected an integer");
}

// The reply text never holds a password (Redis does not echo AUTH arguments), so it goes into
// the message and the detail as is; ACL refusals name the command ("NOPERM ... 'evalsha'
// command"), which is what an operator needs to fix them.
Status ErrorReplyStatus(std::string_view address, std::string_view what, std::string_view error) {
  std::string message = fmt::format("redis at {} refused {}: {}", address, what, error);
  auto has = [&](std::string_view s) { return error.find(s) != std::string_view::npos; };
  if (has("NOPERM") || has("WRONGPASS") || has("can't run this command") || has("NOAUTH") ||
      has("invalid password") || has("invalid username-password")) {
    return Status::PermissionDenied(std::move(message), std::string(error));
  }
  if (has("OOM command not allowed")) {
    // maxmemory reached under noeviction: Redis refuses a script's first write, so nothing of
    // it was applied (an acquire fails closed; a renew that could not write counts as failed).
    return Status::Unavailable(
        fmt::format("redis at {} refused {}: out of memory (maxmemory reached, nothing was "
                    "written; free memory or raise maxmemory)",
                    address, what),
        std::string(error));
  }
  if (error.starts_with("LOADING") || error.starts_with("BUSY") ||
      error.starts_with("MASTERDOWN") || error.starts_with("READONLY") ||
      error.starts_with("TRYAGAIN") || error.starts_with("CLUSTERDOWN") ||
      error.starts_with("MOVED") || error.starts_with("ASK")) {
    return Status::Unavailable(std::move(message), std::string(error));
  }
  return Status::Internal(std::move(message), std::string(error));
}

// ---------------------------------------------------------------------------------------------
// RedisTlsContext

namespace {

// The first queued OpenSSL error as text ("" if none), the queue emptied.
std::string TakeSslError() {
  std::string text;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    if (text.empty()) {
      char buf[256];
      ERR_error_string_n(e, buf, sizeof(buf));
      // "error:0A000086:SSL routines::certificate verify failed": the part after the last ':'
      // is the reason, which is what a reader needs; keep the library for context.
      std::string_view all(buf);
      const std::size_t colon = all.rfind(':');
      text = std::string(colon == std::string_view::npos ? all : all.substr(colon + 1));
    }
  }
  return text;
}

bool IsIpLiteral(const std::string& host) {
  in6_addr v6{};
  in_addr v4{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

}  // namespace

// OpenSSL calls this when the server asks for a client certificate and none is configured:
// noted, so that a connection the server then closes is reported as the missing certificate.
int NoteClientCertificateRequest(SSL* ssl, X509** /*cert*/, EVP_PKEY** /*key*/) {
  if (auto* connection = static_cast<RedisConnection*>(SSL_get_app_data(ssl))) {
    connection->asked_for_client_certificate_ = true;
  }
  return 0;  // none to give
}

Result<std::shared_ptr<const RedisTlsContext>> RedisTlsContext::Create(
    const RedisOptions& options) {
  if (!options.tls) {
    return std::shared_ptr<const RedisTlsContext>();
  }
  ERR_clear_error();
  SSL_CTX* raw = SSL_CTX_new(TLS_client_method());
  if (raw == nullptr) {
    return Status::Internal(
        fmt::format("rediss://: cannot create a TLS context: {}", TakeSslError()));
  }
  std::shared_ptr<const RedisTlsContext> ctx(new RedisTlsContext(raw));
  SSL_CTX_set_min_proto_version(raw, TLS1_2_VERSION);
  SSL_CTX_set_mode(raw, SSL_MODE_ENABLE_PARTIAL_WRITE);
  if (!options.tls_ca.empty()) {
    struct stat st {};

    const bool dir = stat(options.tls_ca.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    if (SSL_CTX_load_verify_locations(raw, dir ? nullptr : options.tls_ca.c_str(),
                                      dir ? options.tls_ca.c_str() : nullptr) != 1) {
      return Status::InvalidArgument(
          fmt::format("rediss:// URL parameter ca={}: cannot load it as PEM certificates: {}",
                      options.tls_ca, TakeSslError()));
    }
  } else if (SSL_CTX_set_default_verify_paths(raw) != 1) {
    return Status::InvalidArgument(fmt::format(
        "rediss://: cannot load the system's trusted certificates ({}): name a CA with ca=",
        TakeSslError()));
  }
  if (!options.tls_cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(raw, options.tls_cert.c_str()) != 1) {
      return Status::InvalidArgument(
          fmt::format("rediss:// URL parameter cert={}: cannot load it as a PEM certificate: {}",
                      options.tls_cert, TakeSslError()));
    }
    if (SSL_CTX_use_PrivateKey_file(raw, options.tls_key.c_str(), SSL_FILETYPE_PEM) != 1) {
      const std::string reason = TakeSslError();
      if (reason.find("mismatch") != std::string::npos) {
        return Status::InvalidArgument(fmt::format(
            "rediss:// URL parameters cert={} and key={}: the key is not the certificate's",
            options.tls_cert, options.tls_key));
      }
      return Status::InvalidArgument(
          fmt::format("rediss:// URL parameter key={}: cannot load it as a PEM private key: {}",
                      options.tls_key, reason));
    }
    if (SSL_CTX_check_private_key(raw) != 1) {
      return Status::InvalidArgument(fmt::format(
          "rediss:// URL parameters cert={} and key={}: the key is not the certificate's: {}",
          options.tls_cert, options.tls_key, TakeSslError()));
    }
  }
  SSL_CTX_set_verify(raw, options.tls_insecure ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, nullptr);
  if (options.tls_cert.empty()) {
    SSL_CTX_set_client_cert_cb(raw, NoteClientCertificateRequest);
  }
  return ctx;
}

RedisTlsContext::~RedisTlsContext() {
  SSL_CTX_free(ctx_);
}

// ---------------------------------------------------------------------------------------------
// RedisConnection

RedisConnection::RedisConnection(int fd, Duration io_timeout)
    : fd_(fd), reader_(redisReaderCreate()), io_timeout_(io_timeout) {}

RedisConnection::~RedisConnection() {
  if (ssl_ != nullptr) {
    SSL_free(ssl_);
  }
  if (reader_ != nullptr) {
    redisReaderFree(reader_);
  }
  if (fd_ >= 0) {
    close(fd_);
  }
}

namespace {

// A non-blocking connect to one address, bounded by `timeout`. Returns the socket, or -1 with
// errno's text in `why`.
int ConnectOne(const sockaddr* addr, socklen_t len, int family, Duration timeout,
               std::string* why) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = std::strerror(errno);
    return -1;
  }
  if (connect(fd, addr, len) != 0) {
    if (errno != EINPROGRESS) {
      *why = std::strerror(errno);
      close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int n = 0;
    do {
      n = poll(&p, 1, static_cast<int>(CeilMillis(timeout)));
    } while (n < 0 && errno == EINTR);
    int error = 0;
    socklen_t error_len = sizeof(error);
    if (n == 0) {
      *why = fmt::format("connect timed out after {}", FormatDuration(timeout));
      close(fd);
      return -1;
    }
    if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &error_len) != 0 || error != 0) {
      *why = std::strerror(n < 0 ? errno : error);
      close(fd);
      return -1;
    }
  }
  if (family != AF_UNIX) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const RedisOptions& options,
                                                                  const RedisTlsContext* tls) {
  const std::string address = options.Address();
  std::string why = "no address";
  int fd = -1;
  if (!options.unix_socket.empty()) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (options.unix_socket.size() >= sizeof(addr.sun_path)) {
      return Status::InvalidArgument(
          fmt::format("redis+unix:// socket path is too long: {}", options.unix_socket));
    }
    std::memcpy(addr.sun_path, options.unix_socket.c_str(), options.unix_socket.size() + 1);
    fd = ConnectOne(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), AF_UNIX,
                    options.connect_timeout, &why);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(options.port);
    if (int rc = getaddrinfo(options.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return Status::Unavailable(
          fmt::format("cannot connect to redis at {}: {}", address, gai_strerror(rc)),
          gai_strerror(rc));
    }
    for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
      fd = ConnectOne(a->ai_addr, a->ai_addrlen, a->ai_family, options.connect_timeout, &why);
    }
    freeaddrinfo(found);
  }
  if (fd < 0) {
    return Status::Unavailable(fmt::format("cannot connect to redis at {}: {}", address, why), why);
  }
  // AUTH, SELECT and PING are part of establishing the connection: connect_timeout bounds the
  // TLS handshake and each read of their replies too, so that a server that accepts but does not
  // answer (SIGSTOPped: the kernel still completes the TCP handshake) is "unreachable" after the
  // TCP connect plus one connect_timeout per read.
  std::unique_ptr<RedisConnection> connection(new RedisConnection(fd, options.connect_timeout));
  if (connection->reader_ == nullptr) {
    return Status::Unavailable(
        fmt::format("cannot connect to redis at {}: out of memory", address));
  }
  if (tls != nullptr) {
    LH_RETURN_IF_ERROR(connection->Handshake(options, *tls));
  }
  std::vector<Command> hello;
  if (options.password) {
    if (options.user) {
      hello.push_back({"AUTH", *options.user, *options.password});
    } else {
      hello.push_back({"AUTH", *options.password});
    }
  }
  if (options.db != 0) {
    hello.push_back({"SELECT", std::to_string(options.db)});
  }
  hello.push_back({"PING"});
  if (options.require_master) {
    hello.push_back({"ROLE"});
  }
  Result<std::vector<ReplyPtr>> answered = connection->Pipeline(hello, address);
  if (!answered.ok()) {
    const std::string_view detail = answered.status().detail();
    // TLS 1.3: the server judges our certificate after our side of the handshake is done, so
    // its refusal arrives on the first read: as an alert ("certificate required"), or as a
    // reset when the connection is closed before the alert is read.
    const bool closed = detail.find("reset") != std::string_view::npos ||
                        detail.find("closed") != std::string_view::npos;
    if (tls != nullptr &&
        (detail.find("certificate") != std::string_view::npos ||
         (closed && options.tls_cert.empty() && connection->asked_for_client_certificate_))) {
      return Status::PermissionDenied(
          fmt::format("redis at {} refused the TLS client certificate ({}): {}", address,
                      options.tls_cert.empty() ? "none given: set cert= and key="
                                               : "cert=" + options.tls_cert,
                      detail),
          std::string(detail));
    }
    std::string names;
    for (const Command& command : hello) {
      names += names.empty() ? command[0] : "/" + command[0];
    }
    return Status::Unavailable(
        fmt::format("redis at {} took the connection but its first round trip ({}) did not "
                    "succeed (each read bounded by connect_timeout, {}): {}",
                    address, names, FormatDuration(options.connect_timeout), detail),
        std::string(detail));
  }
  std::vector<ReplyPtr> replies = std::move(answered).value();
  for (std::size_t i = 0; i < replies.size(); ++i) {
    if (IsError(replies[i].get())) {
      // Name the command, never its arguments (AUTH's are credentials).
      return ErrorReplyStatus(address, hello[i][0], ReplyText(replies[i].get()));
    }
  }
  if (options.require_master) {
    // ROLE: ["master", offset, replicas] on a master; ["slave", host, port, ...] on a replica.
    const redisReply* role = replies.back().get();
    const std::string_view what =
        role != nullptr && role->type == REDIS_REPLY_ARRAY && role->elements > 0
            ? ReplyText(role->element[0])
            : std::string_view("?");
    if (what != "master") {
      return Status::Unavailable(
          fmt::format("redis at {} is not a master (ROLE says {}): the sentinels' failover has "
                      "moved it, or the address is stale; asking the sentinels again",
                      address, what),
          "not a master");
    }
  }
  // A WAIT may legitimately take replica_timeout on top of the command's own time.
  connection->io_timeout_ = options.command_timeout;
  if (options.min_replicas > 0) {
    connection->io_timeout_ += options.replica_timeout;
  }
  return connection;
}

Status RedisConnection::Handshake(const RedisOptions& options, const RedisTlsContext& tls) {
  SigpipeGuard no_sigpipe;  // OpenSSL's socket BIO writes with write(): alerts too
  const std::string address = options.Address();
  ERR_clear_error();
  ssl_ = SSL_new(tls.get());
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1 || SSL_set_app_data(ssl_, this) != 1) {
    return Status::Unavailable(
        fmt::format("redis at {}: cannot start TLS: {}", address, TakeSslError()));
  }
  // The name the certificate must carry: sni= if given, else the URL's host, as an IP address
  // (checked against the certificate's IP entries, and not sent as SNI) or a DNS name.
  const std::string& name = options.tls_sni.empty() ? options.host : options.tls_sni;
  const bool ip = IsIpLiteral(name);
  if (!ip) {
    SSL_set_tlsext_host_name(ssl_, name.c_str());
  }
  if (!options.tls_insecure) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl_);
    if (ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) != 1
           : SSL_set1_host(ssl_, name.c_str()) != 1) {
      return Status::InvalidArgument(
          fmt::format("rediss://: cannot check the certificate for the name '{}'", name));
    }
  }
  const auto give_up = std::chrono::steady_clock::now() + options.connect_timeout;
  while (true) {
    ERR_clear_error();
    const int rc = SSL_connect(ssl_);
    if (rc == 1) {
      return Status();
    }
    const int error = SSL_get_error(ssl_, rc);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      const Duration left =
          std::chrono::duration_cast<Duration>(give_up - std::chrono::steady_clock::now());
      if (left <= Duration::zero() ||
          !Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, left, address, "the handshake")
               .ok()) {
        // A plain-text Redis port reads the ClientHello as a command line and never answers.
        return Broken(address,
                      fmt::format("TLS handshake timed out after {} (connect_timeout): is that "
                                  "port plain-text Redis (rediss:// needs the server's tls-port), "
                                  "or the server stopped?",
                                  FormatDuration(options.connect_timeout)));
      }
      continue;
    }
    const long verified = SSL_get_verify_result(ssl_);
    std::string reason = TakeSslError();
    broken_ = true;
    if (verified == X509_V_OK && ((options.tls_cert.empty() && asked_for_client_certificate_) ||
                                  (reason.find("alert") != std::string::npos &&
                                   reason.find("certificate") != std::string::npos))) {
      // TLS 1.2: the server refuses a missing or unknown client certificate in the handshake.
      return Status::PermissionDenied(
          fmt::format("redis at {} refused the TLS client certificate ({}): {}", address,
                      options.tls_cert.empty() ? "none given: set cert= and key="
                                               : "cert=" + options.tls_cert,
                      reason.empty() ? "the handshake failed" : reason),
          reason);
    }
    if (verified != X509_V_OK) {
      std::string why = X509_verify_cert_error_string(verified);
      return Status::PermissionDenied(
          fmt::format("redis at {}: TLS: the server's certificate is not accepted: {} (checked "
                      "against {}, for the name '{}')",
                      address, why, options.tls_ca.empty() ? "the system's CAs" : options.tls_ca,
                      name),
          why);
    }
    if (reason.empty()) {
      reason = error == SSL_ERROR_SYSCALL && errno != 0 ? std::strerror(errno)
                                                        : "the server closed the connection";
    }
    const bool plain = reason.find("wrong version number") != std::string::npos ||
                       reason.find("packet length too long") != std::string::npos;
    return Status::Unavailable(
        fmt::format("redis at {}: TLS handshake failed: {}{}", address, reason,
                    plain ? " (is that port plain-text Redis? rediss:// needs the server's "
                            "tls-port)"
                          : ""),
        reason);
  }
}

Status RedisConnection::Wait(short events, Duration timeout, std::string_view address,
                             std::string_view what) {
  pollfd p{fd_, events, 0};
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const Duration left =
        std::chrono::duration_cast<Duration>(give_up - std::chrono::steady_clock::now());
    const int n = poll(&p, 1, static_cast<int>(CeilMillis(std::max(left, Duration::zero()))));
    if (n > 0) {
      return Status();
    }
    if (n == 0) {
      return Broken(address,
                    fmt::format("no progress on {} within {}", what, FormatDuration(timeout)));
    }
    if (errno != EINTR) {
      return Broken(address, std::strerror(errno));
    }
  }
}

Status RedisConnection::WriteAll(std::string_view bytes, std::string_view address) {
  while (!bytes.empty()) {
    if (ssl_ != nullptr) {
      SigpipeGuard no_sigpipe;  // SSL_write writes with write(): a reset must fail, not kill
      ERR_clear_error();
      const int n = SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size()));
      if (n > 0) {
        bytes.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      const int error = SSL_get_error(ssl_, n);
      if (error == SSL_ERROR_WANT_WRITE || error == SSL_ERROR_WANT_READ) {
        LH_RETURN_IF_ERROR(
            Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, io_timeout_, address, "a write"));
        continue;
      }
      std::string reason = TakeSslError();
      if (reason.empty()) {
        reason = errno != 0 ? std::strerror(errno) : "the server closed the connection";
      }
      return Broken(address, reason);
    }
    const ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      LH_RETURN_IF_ERROR(Wait(POLLOUT, io_timeout_, address, "a write"));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return Broken(address, std::strerror(errno));
    }
  }
  return Status();
}

Status RedisConnection::ReadOnce(bool wait, std::string_view address) {
  char buf[16 * 1024];
  while (true) {
    if (ssl_ != nullptr) {
      SigpipeGuard no_sigpipe;  // SSL_read may write (an alert, a KeyUpdate reply)
      ERR_clear_error();
      const int n = SSL_read(ssl_, buf, sizeof(buf));
      if (n > 0) {
        redisReaderFeed(reader_, buf, static_cast<std::size_t>(n));
        return Status();
      }
      const int error = SSL_get_error(ssl_, n);
      if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
        if (!wait && error == SSL_ERROR_WANT_READ) {
          return Status();  // e.g. a TLS 1.3 session ticket: no application data
        }
        LH_RETURN_IF_ERROR(
            Wait(error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, io_timeout_, address, "a read"));
        continue;
      }
      if (error == SSL_ERROR_ZERO_RETURN) {
        return Broken(address, "the server closed the connection");
      }
      std::string reason = TakeSslError();
      if (reason.empty()) {
        reason = error == SSL_ERROR_SYSCALL && errno != 0 ? std::strerror(errno)
                                                          : "the server closed the connection";
      }
      return Broken(address, reason);
    }
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      redisReaderFeed(reader_, buf, static_cast<std::size_t>(n));
      return Status();
    }
    if (n == 0) {
      return Broken(address, "the server closed the connection");
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Broken(address, std::strerror(errno));
    }
    if (!wait) {
      return Status();
    }
    LH_RETURN_IF_ERROR(Wait(POLLIN, io_timeout_, address, "a read"));
  }
}

Result<ReplyPtr> RedisConnection::NextReply(std::string_view address) {
  void* raw = nullptr;
  if (redisReaderGetReply(reader_, &raw) != REDIS_OK) {
    return Broken(address, fmt::format("protocol error: {}", reader_->errstr));
  }
  return ReplyPtr(static_cast<redisReply*>(raw));
}

bool RedisConnection::HasBufferedInput() const {
  return ssl_ != nullptr && SSL_pending(ssl_) > 0;
}

Status RedisConnection::ReadAvailable(std::string_view address) {
  return ReadOnce(/*wait=*/false, address);
}

Status RedisConnection::Send(std::span<const Command> commands, std::string_view address) {
  if (broken_) {
    return Status::Unavailable(fmt::format("redis at {}: connection is broken", address));
  }
  std::string out;
  std::vector<const char*> argv;
  std::vector<std::size_t> argvlen;
  for (const Command& command : commands) {
    argv.clear();
    argvlen.clear();
    for (const std::string& arg : command) {
      argv.push_back(arg.data());
      argvlen.push_back(arg.size());
    }
    char* formatted = nullptr;
    const int len = redisFormatCommandArgv(&formatted, static_cast<int>(argv.size()), argv.data(),
                                           argvlen.data());
    if (len < 0 || formatted == nullptr) {
      return Broken(address, "out of memory formatting a command");
    }
    out.append(formatted, static_cast<std::size_t>(len));
    redisFreeCommand(formatted);
  }
  return WriteAll(out, address);
}

Result<std::vector<ReplyPtr>> RedisConnection::Pipeline(std::span<const Command> commands,
                                                        std::string_view address) {
  LH_RETURN_IF_ERROR(Send(commands, address));
  return ReadReplies(commands.size(), address);
}

Result<std::vector<ReplyPtr>> RedisConnection::ReadReplies(std::size_t count,
                                                           std::string_view address) {
  std::vector<ReplyPtr> replies;
  replies.reserve(count);
  while (replies.size() < count) {
    LH_ASSIGN_OR_RETURN(ReplyPtr reply, NextReply(address));
    if (reply != nullptr) {
      replies.push_back(std::move(reply));
      continue;
    }
    LH_RETURN_IF_ERROR(ReadOnce(/*wait=*/true, address));
  }
  for (const ReplyPtr& reply : replies) {
    if (IsError(reply.get()) && ReplyText(reply.get()).starts_with("READONLY")) {
      // A replica now (a failover demoted the server under this connection): never reused, so
      // the pool's next connect finds the master again.
      broken_ = true;
    }
  }
  return replies;
}

Status RedisConnection::Broken(std::string_view address, std::string why) {
  broken_ = true;
  std::string message = fmt::format("redis at {}: {}", address, why);
  return Status::Unavailable(std::move(message), std::move(why));
}

}  // namespace leasehold::internal
