// File: tests/fuzz/zk_options_fuzz.cc
//
// ZkOptions::FromUrl (backends/zookeeper/zk_options.h) on zk:// URLs. Invariants: success gives
// a host list whose every entry reads back with a port in [1, 65535], a chroot that is "" or a
// valid ZooKeeper path (absolute, no empty, "." or ".." component, no trailing '/', no NUL),
// timeouts in (0, 1 h], credentials as a pair; failure is kInvalidArgument; neither Address()
// nor an error depends on the password.

#include <string>
#include <string_view>

#include "backends/common/host_port.h"
#include "backends/common/url_params.h"
#include "backends/zookeeper/zk_options.h"
#include "options_fuzz.h"

namespace {

bool ValidChroot(std::string_view chroot) {
  if (chroot.empty()) {
    return true;
  }
  if (chroot.front() != '/' || chroot.back() == '/' ||
      chroot.find('\0') != std::string_view::npos) {
    return false;
  }
  std::string_view rest = chroot.substr(1);
  while (true) {
    std::size_t slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    if (part.empty() || part == "." || part == "..") {
      return false;
    }
    if (slash == std::string_view::npos) {
      return true;
    }
    rest.remove_prefix(slash + 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using leasehold::Duration;
  using leasehold::internal::ZkOptions;
  using namespace leasehold::fuzz;
  std::optional<leasehold::internal::Url> url = SteeredUrl(AsText(data, size), {"zk"});
  if (!url) {
    return 0;
  }
  leasehold::Result<ZkOptions> options = ZkOptions::FromUrl(*url);
  if (!options.ok()) {
    FUZZ_CHECK(options.status().code() == leasehold::StatusCode::kInvalidArgument,
               options.status().message());
    CheckErrorHidesPassword(*url, options.status(), ZkOptions::FromUrl);
    return 0;
  }
  const ZkOptions& o = *options;
  FUZZ_CHECK(ValidChroot(o.chroot), o.chroot);
  std::string_view hosts = o.hosts;
  FUZZ_CHECK(!hosts.empty(), "no hosts");
  while (true) {
    std::size_t comma = hosts.find(',');
    std::string_view entry = hosts.substr(0, comma);
    leasehold::Result<leasehold::internal::HostPort> again =
        leasehold::internal::ParseHostPort("zk", entry, 1);
    FUZZ_CHECK(again.ok() && again->port_given && !again->host.empty(), std::string(entry));
    if (comma == std::string_view::npos) {
      break;
    }
    hosts.remove_prefix(comma + 1);
  }
  auto timeout_ok = [](Duration d) {
    return d > Duration::zero() && d <= leasehold::internal::kMaxUrlTimeout;
  };
  FUZZ_CHECK(timeout_ok(o.connect_timeout) && timeout_ok(o.command_timeout), "timeout");
  FUZZ_CHECK(o.user.has_value() == o.password.has_value(), "half a credential");
  leasehold::Result<ZkOptions> marked = ZkOptions::FromUrl(WithMarkerPassword(*url));
  FUZZ_CHECK(marked.ok() && marked->Address() == o.Address(), o.Address());
  FUZZ_CHECK(!Contains(o.Address(), kSecretMarker), o.Address());
  return 0;
}
