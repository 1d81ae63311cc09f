// File: tools/cli/observability.h
//
// The observability flags shared by `run` and `elect`: --metrics-addr (Prometheus text at
// /metrics, served by cpp-httplib), --metrics-textfile (the same text in a file, for
// node_exporter's textfile collector), --log-format=text|json and --on-risk=wait|term.
//
// Example:
//
//   ObservabilityFlags obs;
//   AddObservabilityOptions(*run, obs);                 // while building the CLI11 app
//   ...
//   LH_RETURN_IF_ERROR(ApplyLogFormat(obs.log_format));  // before any event is logged
//   auto server = MetricsServer::Start(obs.metrics_addr, store->metrics());
//
// Thread safety: MetricsServer is thread-safe; the rest is for the main thread.

#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>

#include "leasehold/metrics.h"
#include "leasehold/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace leasehold::cli {

struct ObservabilityFlags {
  // --metrics-addr HOST:PORT; empty: no HTTP server.
  std::string metrics_addr;
  // --metrics-textfile PATH: node_exporter's textfile collector format, written atomically;
  // empty: none.
  std::string metrics_textfile;
  // --log-format: "text" (leasehold: event key=value ...) or "json" (one object per line).
  std::string log_format = "text";
  // --on-risk: "wait" (SIGTERM at safe_until - kill-grace, the default) or "term" (SIGTERM as
  // soon as the lease is at risk; SIGKILL still at safe_until).
  std::string on_risk = "wait";
};

// Adds --metrics-addr, --log-format and --on-risk to `app`, bound to `flags`.
void AddObservabilityOptions(CLI::App& app, ObservabilityFlags& flags);

// Returns true for --on-risk=term. REQUIRES: flags validated by CLI11 (wait|term).
bool TermOnRisk(const ObservabilityFlags& flags);

// The URL a server bound from `addr` ("HOST:PORT") on `port` answers at:
// "http://HOST:PORT/metrics" with the real port (addr may say 0).
std::string MetricsUrl(const std::string& addr, int port);

// `text` (Prometheus text format) with `key="<key>"` added to every sample's labels: the
// textfile collector merges files from many jobs, and the key tells their leases apart.
std::string WithKeyLabel(const std::string& text, const std::string& key);

// Writes the store's metrics to a node_exporter textfile (--metrics-textfile): the text of
// WithKeyLabel to PATH.tmp.PID, then rename(2) over PATH, so that the collector never reads a
// half-written file. A failed write is one warning line (once), never a reason to stop the job.
// Request() is for the lease callbacks, which run on the heartbeat's threads: it only wakes a
// writer thread of its own, so that no file I/O ever delays a renewal. WriteNow() writes on the
// caller's thread (after the grant, and at the end of the run, once every count is final).
// Thread safety: thread-safe.
class MetricsTextfile {
 public:
  MetricsTextfile(std::string path, std::string key, std::shared_ptr<Metrics> metrics);
  MetricsTextfile(const MetricsTextfile&) = delete;
  MetricsTextfile& operator=(const MetricsTextfile&) = delete;
  MetricsTextfile(MetricsTextfile&&) = delete;
  MetricsTextfile& operator=(MetricsTextfile&&) = delete;
  ~MetricsTextfile();

  void Request();
  void WriteNow();

 private:
  void WriterLoop(const std::stop_token& stop);

  const std::string path_;
  const std::string key_;
  const std::shared_ptr<Metrics> metrics_;
  std::mutex write_mu_;  // one write at a time
  bool warned_ = false;  // guarded by write_mu_
  std::mutex mu_;
  std::condition_variable_any cv_;
  bool requested_ = false;  // guarded by mu_
  std::jthread writer_;     // last: stopped and joined first
};

// Serves GET /metrics (Prometheus text format 0.0.4) on one listener thread, until destroyed.
class MetricsServer {
 public:
  // Binds `addr` ("HOST:PORT", "[::1]:PORT"; port 0 picks a free one) and starts serving.
  // Returns nullptr for an empty addr; kInvalidArgument for a malformed one; kUnavailable if
  // the address cannot be bound.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& addr,
                                                      std::shared_ptr<Metrics> metrics);

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  MetricsServer(MetricsServer&&) = delete;
  MetricsServer& operator=(MetricsServer&&) = delete;
  ~MetricsServer();

  // The bound port (useful with port 0).
  [[nodiscard]] int port() const { return port_; }

 private:
  struct Impl;
  MetricsServer(std::unique_ptr<Impl> impl, int port);

  std::unique_ptr<Impl> impl_;
  int port_;
  std::jthread listener_;
};

}  // namespace leasehold::cli
