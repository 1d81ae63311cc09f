// File: tools/cli/observability.cc

#include "observability.h"

#include <fcntl.h>
#include <httplib.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sys/socket.h>

#include "cli_log.h"

namespace leasehold::cli {

namespace {

// Splits "host:port" or "[v6]:port".
Result<std::pair<std::string, int>> ParseAddr(const std::string& addr) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) {
    return Status::InvalidArgument(
        fmt::format("--metrics-addr '{}' must be HOST:PORT, e.g. 127.0.0.1:9464", addr));
  }
  std::string host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = addr.substr(colon + 1);
  int port = -1;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return Status::InvalidArgument(
        fmt::format("--metrics-addr '{}': port must be a number from 0 to 65535", addr));
  }
  return std::make_pair(host, port);
}

}  // namespace

std::string MetricsUrl(const std::string& addr, int port) {
  const std::size_t colon = addr.rfind(':');
  return fmt::format("http://{}:{}/metrics", addr.substr(0, colon), port);
}

std::string WithKeyLabel(const std::string& text, const std::string& key) {
  std::string escaped;
  for (const char c : key) {
    if (c == '\\' || c == '"') {
      escaped += '\\';
    }
    escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  const std::string label = fmt::format("key=\"{}\"", escaped);
  std::string out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) {
      end = text.size();
    }
    std::string line = text.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.front() != '#') {
      const std::size_t brace = line.find('{');
      const std::size_t space = line.find(' ');
      if (brace != std::string::npos && brace < space) {
        line.insert(brace + 1, line[brace + 1] == '}' ? label : label + ",");
      } else if (space != std::string::npos) {
        line.insert(space, "{" + label + "}");
      }
    }
    out += line;
    out += '\n';
  }
  return out;
}

MetricsTextfile::MetricsTextfile(std::string path, std::string key,
                                 std::shared_ptr<Metrics> metrics)
    : path_(std::move(path)),
      key_(std::move(key)),
      metrics_(std::move(metrics)),
      writer_([this](const std::stop_token& stop) { WriterLoop(stop); }) {}

MetricsTextfile::~MetricsTextfile() {
  writer_.request_stop();
  cv_.notify_all();
}

void MetricsTextfile::Request() {
  {
    std::lock_guard lock(mu_);
    requested_ = true;
  }
  cv_.notify_all();
}

void MetricsTextfile::WriterLoop(const std::stop_token& stop) {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, stop, [this] { return requested_; });
      if (stop.stop_requested()) {
        return;
      }
      requested_ = false;
    }
    WriteNow();
  }
}

void MetricsTextfile::WriteNow() {
  std::lock_guard lock(write_mu_);
  const std::string text = WithKeyLabel(metrics_->PrometheusText(), key_);
  const std::string tmp = fmt::format("{}.tmp.{}", path_, ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "we");
  bool ok = f != nullptr;
  int err = errno;
  if (ok) {
    ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    err = errno;
    ok = (std::fclose(f) == 0) && ok;
    ok = ok && std::rename(tmp.c_str(), path_.c_str()) == 0;
    err = ok ? 0 : errno;
    if (!ok) {
      std::remove(tmp.c_str());
    }
  }
  if (!ok && !warned_) {
    warned_ = true;
    Warn(fmt::format("cannot write --metrics-textfile {}: {}; the job runs on", path_,
                     std::strerror(err)));
  }
}

void AddObservabilityOptions(CLI::App& app, ObservabilityFlags& flags) {
  app.add_option("--metrics-addr", flags.metrics_addr,
                 "Serve Prometheus metrics (text format 0.0.4) at http://HOST:PORT/metrics "
                 "while running (port 0: a free one, printed). An address that cannot be bound "
                 "is a warning: the job runs without it. Default: off")
      ->type_name("HOST:PORT");
  app.add_option("--metrics-textfile", flags.metrics_textfile,
                 "Write the same metrics, each with the label key=\"KEY\", to PATH for "
                 "node_exporter's textfile collector (e.g. /var/lib/node_exporter/"
                 "leasehold-KEY.prom): atomically, at each change of the lease's state and at "
                 "the end of the run. Default: off")
      ->type_name("PATH");
  app.add_option("--log-format", flags.log_format,
                 "Event lines on stderr as 'text' (leasehold: event key=value ...) or 'json' "
                 "(one object per line). Default: text")
      ->check(CLI::IsMember({"text", "json"}).description(""))
      ->type_name("text|json")
      ->envname("LEASEHOLD_LOG_FORMAT");
  app.add_option("--on-risk", flags.on_risk,
                 "When renewals fail (at risk): 'wait' sends SIGTERM at safe_until - kill-grace; "
                 "'term' sends SIGTERM at once. SIGKILL comes at safe_until either way. "
                 "Default: wait")
      ->check(CLI::IsMember({"wait", "term"}).description(""))
      ->type_name("wait|term");
}

bool TermOnRisk(const ObservabilityFlags& flags) {
  return flags.on_risk == "term";
}

struct MetricsServer::Impl {
  httplib::Server server;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& addr,
                                                            std::shared_ptr<Metrics> metrics) {
  if (addr.empty()) {
    return std::unique_ptr<MetricsServer>();
  }
  LH_ASSIGN_OR_RETURN(auto host_port, ParseAddr(addr));
  auto impl = std::make_unique<Impl>();
  httplib::Server& server = impl->server;
  // One worker: a scrape is cheap, and the command's supervision must not compete with a
  // crowd of HTTP threads.
  server.new_task_queue = [] { return new httplib::ThreadPool(1); };
  // Not httplib's default, which sets SO_REUSEPORT: a second leasehold given the same address
  // must fail to bind, not silently share the port. And the listening socket must not leak
  // into the supervised command (it would keep the port bound after leasehold exits).
  server.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    ::fcntl(sock, F_SETFD, FD_CLOEXEC);
  });
  server.Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics->PrometheusText(), std::string(kPrometheusTextContentType).c_str());
  });
  int port = host_port.second;
  if (port == 0) {
    port = server.bind_to_any_port(host_port.first);
  } else if (!server.bind_to_port(host_port.first, port)) {
    port = -1;
  }
  if (port < 0) {
    return Status::Unavailable(
        fmt::format("--metrics-addr {}: cannot listen there (address in use, or not an "
                    "address of this host)",
                    addr));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl), port));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {
  httplib::Server* server = &impl_->server;
  listener_ = std::jthread([server] { server->listen_after_bind(); });
}

MetricsServer::~MetricsServer() {
  impl_->server.stop();
  if (listener_.joinable()) {
    listener_.join();
  }
}

}  // namespace leasehold::cli
