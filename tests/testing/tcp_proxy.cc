// File: tests/testing/tcp_proxy.cc

#include "testing/tcp_proxy.h"

#include <poll.h>
#include <unistd.h>

#include <cstdint>
#include <utility>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace leasehold::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

bool SendAll(int fd, const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      return false;
    }
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

// Forwards between `client` and `server` through `filter` until either side closes, the filter
// cuts, or `stop`; then closes both.
void Pump(const std::stop_token& stop, int client, int server, TcpProxyFilter& filter) {
  char buf[65536];
  while (!stop.stop_requested() && !filter.Cut()) {
    pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    if (poll(p, 2, 20) <= 0) {
      continue;
    }
    if (p[0].revents != 0) {
      const ssize_t n = recv(client, buf, sizeof(buf), 0);
      if (n <= 0 || !SendAll(server, filter.FromClient({buf, static_cast<std::size_t>(n)}))) {
        break;
      }
    }
    if (p[1].revents != 0) {
      const ssize_t n = recv(server, buf, sizeof(buf), 0);
      if (n <= 0 || !SendAll(client, filter.FromServer({buf, static_cast<std::size_t>(n)}))) {
        break;
      }
    }
  }
  close(client);
  close(server);
}

}  // namespace

TcpProxy::TcpProxy(TcpProxyOptions options) : options_(std::move(options)) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 16) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "TcpProxy: cannot listen on 127.0.0.1";
    return;
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::jthread([this](const std::stop_token& stop) { Accept(stop); });
}

TcpProxy::~TcpProxy() {
  if (acceptor_.joinable()) {
    acceptor_.request_stop();
    acceptor_.join();
  }
  pumps_.clear();  // request_stop + join each
  if (listen_fd_ >= 0) {
    close(listen_fd_);
  }
}

void TcpProxy::Accept(const std::stop_token& stop) {
  while (!stop.stop_requested()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) {
      continue;
    }
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      continue;
    }
    const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const sockaddr_in addr = Loopback(options_.upstream_port);
    if (server < 0 ||
        connect(server, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(client);
      if (server >= 0) {
        close(server);
      }
      continue;
    }
    std::shared_ptr<TcpProxyFilter> filter =
        options_.filter ? options_.filter() : std::make_unique<TcpProxyFilter>();
    pumps_.emplace_back(
        [client, server, filter](const std::stop_token& s) { Pump(s, client, server, *filter); });
  }
}

}  // namespace leasehold::testing
