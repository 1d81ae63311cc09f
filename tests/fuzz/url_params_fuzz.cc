// File: tests/fuzz/url_params_fuzz.cc
//
// The shared URL readers (backends/common/url_params.h, host_port.h) on a URL parsed from the
// input. Every store's options go through them. Invariants:
// - A Read* that succeeds gives a value inside the bounds it was given; one that fails returns
//   kInvalidArgument and leaves the output alone; an absent parameter leaves it alone too.
// - ParseWholeNumber agrees with the text: the number printed is the text (no sign, no leading
//   zero) when the text is canonical.
// - ParseHostPorts gives ports in [1, 65535] and, printed with ToString and read back, the
//   same host and port.

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "backends/common/host_port.h"
#include "backends/common/url_params.h"
#include "core/url.h"
#include "fuzz_check.h"

namespace {

using leasehold::Duration;
using leasehold::Status;
using leasehold::StatusCode;
using namespace leasehold::internal;

void CheckRefusal(const Status& status) {
  FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument, status.message());
}

void CheckDurations(const Url& url, const std::string& name) {
  const Duration sentinel = std::chrono::nanoseconds(-7);
  Duration d = sentinel;
  Status s = ReadTimeoutParam(url, name, &d);
  if (s.ok()) {
    FUZZ_CHECK(d == sentinel || (d > Duration::zero() && d <= kMaxUrlTimeout), name);
  } else {
    CheckRefusal(s);
    FUZZ_CHECK(d == sentinel, "a refused timeout changed the output");
  }
  d = sentinel;
  const Duration min = std::chrono::milliseconds(1);
  const Duration max = std::chrono::seconds(30);
  s = ReadDurationParam(url, name, min, max, &d);
  if (s.ok()) {
    FUZZ_CHECK(d == sentinel || (d >= min && d <= max), name);
  } else {
    CheckRefusal(s);
    FUZZ_CHECK(d == sentinel, "a refused duration changed the output");
  }
}

void CheckNumbers(const Url& url, const std::string& name, const std::string& value) {
  int n = -12345;
  Status s = ReadIntParam(url, name, -5, 70000, &n);
  if (s.ok()) {
    FUZZ_CHECK(n == -12345 || (n >= -5 && n <= 70000), value);
  } else {
    CheckRefusal(s);
    FUZZ_CHECK(n == -12345, "a refused number changed the output");
  }
  int whole = 0;
  if (ParseWholeNumber(value, 0, 1 << 30, &whole)) {
    FUZZ_CHECK(whole >= 0 && whole <= (1 << 30), value);
    // Canonical text (no sign, no leading zero) is the number printed; "-0" and "007" read
    // as 0 and 7 too.
    if (value[0] != '-' && (value.size() == 1 || value[0] != '0')) {
      FUZZ_CHECK(std::to_string(whole) == value, value);
    }
  }
  bool flag = false;
  s = ReadBoolParam(url, name, &flag);
  FUZZ_CHECK(s.ok() == (value == "true" || value == "false"), value);
  if (s.ok()) {
    FUZZ_CHECK(flag == (value == "true"), value);
  }
  std::string text = "unset";
  s = ReadStringParam(url, name, &text);
  FUZZ_CHECK(s.ok() == !value.empty(), value);
  FUZZ_CHECK(s.ok() ? text == value : text == "unset", value);
}

void CheckHosts(const Url& url) {
  for (bool allow_empty : {false, true}) {
    leasehold::Result<std::vector<HostPort>> hosts = ParseHostPorts(
        url.scheme, url.authority, 2379, allow_empty ? "" : "127.0.0.1", allow_empty);
    if (!hosts.ok()) {
      CheckRefusal(hosts.status());
      continue;
    }
    FUZZ_CHECK(!hosts->empty(), url.authority);
    for (const HostPort& host : *hosts) {
      FUZZ_CHECK(host.port >= 1 && host.port <= 65535, url.authority);
      FUZZ_CHECK(allow_empty || !host.host.empty(), url.authority);
      if (host.host.empty()) {
        continue;
      }
      leasehold::Result<HostPort> again = ParseHostPort(url.scheme, host.ToString(), 1);
      FUZZ_CHECK(again.ok(), host.ToString() + ": " + std::string(again.status().message()));
      FUZZ_CHECK(again->host == host.host && again->port == host.port,
                 url.authority + " -> " + host.ToString());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  leasehold::Result<Url> url = ParseUrl(leasehold::fuzz::AsText(data, size));
  if (!url.ok()) {
    return 0;
  }
  for (const auto& [name, value] : url->query) {
    CheckDurations(*url, name);
    CheckNumbers(*url, name, value);
  }
  // Absent parameters leave the output alone.
  Duration d = std::chrono::seconds(3);
  if (url->query.find("absent\x7f") == url->query.end()) {
    FUZZ_CHECK(ReadTimeoutParam(*url, "absent\x7f", &d).ok() && d == std::chrono::seconds(3),
               "absent");
  }
  const std::string_view known[] = {"command_timeout", "fair"};
  Status unknown = RefuseUnknownParams(*url, known);
  bool all_known = true;
  for (const auto& [name, value] : url->query) {
    all_known = all_known && (name == "command_timeout" || name == "fair");
  }
  FUZZ_CHECK(unknown.ok() == all_known, unknown.message());
  CheckHosts(*url);
  return 0;
}
