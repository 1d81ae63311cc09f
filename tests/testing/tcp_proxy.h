// File: tests/testing/tcp_proxy.h
//
// TcpProxy: a TCP proxy on a free 127.0.0.1 port in front of one loopback server, for tests
// that need a store's bytes changed on the wire: replies lost (zk_backend_test), replies
// rewritten (redis_clock_step_test). Each accepted connection gets its own upstream connection
// and its own TcpProxyFilter, which sees every chunk in both directions and says what to
// forward; with no filter the bytes pass unchanged.
//
// Example:
//
//   TcpProxy proxy({.upstream_port = server->port(),
//                   .filter = [] { return std::make_unique<MyFilter>(); }});
//   auto store = Store::Open(fmt::format("redis://127.0.0.1:{}", proxy.port()));
//
// Thread safety: the proxy's methods are for one test thread; each connection is pumped by its
// own thread, which alone calls that connection's filter. Destruction stops and joins them all.

#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace leasehold::testing {

// What one proxied connection forwards. A filter may hold bytes back (say, an incomplete reply)
// and return them with a later chunk.
class TcpProxyFilter {
 public:
  virtual ~TcpProxyFilter() = default;

  // What to send the server for `bytes` from the client.
  virtual std::string FromClient(std::string_view bytes) { return std::string(bytes); }

  // What to send the client for `bytes` from the server.
  virtual std::string FromServer(std::string_view bytes) { return std::string(bytes); }

  // True to cut the connection now (both sockets closed: the client sees a connection loss).
  // Asked at least every 20 ms.
  virtual bool Cut() { return false; }
};

struct TcpProxyOptions {
  // The server's port on 127.0.0.1.
  int upstream_port = 0;
  // Makes each connection's filter. Default: none (bytes pass unchanged).
  std::function<std::unique_ptr<TcpProxyFilter>()> filter;
};

class TcpProxy {
 public:
  // Listens at once; a failure to listen fails the calling test (port() is then 0).
  explicit TcpProxy(TcpProxyOptions options);
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;
  TcpProxy(TcpProxy&&) = delete;
  TcpProxy& operator=(TcpProxy&&) = delete;
  ~TcpProxy();

  int port() const { return port_; }

 private:
  void Accept(const std::stop_token& stop);

  const TcpProxyOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<std::jthread> pumps_;  // touched by the acceptor thread only, then the destructor
  std::jthread acceptor_;
};

}  // namespace leasehold::testing
