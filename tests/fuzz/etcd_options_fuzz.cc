// File: tests/fuzz/etcd_options_fuzz.cc
//
// EtcdOptions::FromUrl (backends/etcd/etcd_options.h) on etcd:// and etcds:// URLs.
// Invariants: success gives endpoints that read back as host:port with a port in [1, 65535],
// a non-empty prefix, a timeout in (0, 1 h], TLS files only for etcds://; failure is
// kInvalidArgument; neither Address() nor an error depends on the password.

#include <string>

#include "backends/common/host_port.h"
#include "backends/common/url_params.h"
#include "backends/etcd/etcd_options.h"
#include "options_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using leasehold::Duration;
  using leasehold::internal::EtcdOptions;
  using namespace leasehold::fuzz;
  std::optional<leasehold::internal::Url> url = SteeredUrl(AsText(data, size), {"etcd", "etcds"});
  if (!url) {
    return 0;
  }
  leasehold::Result<EtcdOptions> options = EtcdOptions::FromUrl(*url);
  if (!options.ok()) {
    FUZZ_CHECK(options.status().code() == leasehold::StatusCode::kInvalidArgument,
               options.status().message());
    CheckErrorHidesPassword(*url, options.status(), EtcdOptions::FromUrl);
    return 0;
  }
  const EtcdOptions& o = *options;
  FUZZ_CHECK(!o.endpoints.empty(), "no endpoint");
  for (const std::string& endpoint : o.endpoints) {
    leasehold::Result<leasehold::internal::HostPort> again =
        leasehold::internal::ParseHostPort("etcd", endpoint, 1);
    FUZZ_CHECK(again.ok() && again->port_given && again->port >= 1 && again->port <= 65535 &&
                   !again->host.empty(),
               endpoint);
  }
  FUZZ_CHECK(!o.prefix.empty(), "empty prefix");
  FUZZ_CHECK(o.command_timeout > Duration::zero() &&
                 o.command_timeout <= leasehold::internal::kMaxUrlTimeout,
             "timeout out of bounds");
  FUZZ_CHECK(o.tls == (url->scheme == "etcds"), url->scheme);
  FUZZ_CHECK(o.tls || (o.ca_file.empty() && o.cert_file.empty() && o.key_file.empty()),
             "TLS files on plaintext");
  FUZZ_CHECK(o.cert_file.empty() == o.key_file.empty(), "cert without key");
  FUZZ_CHECK(!o.user || !o.user->empty(), "empty user");
  FUZZ_CHECK(o.user.has_value() == o.password.has_value(), "user without password");
  leasehold::Result<EtcdOptions> marked = EtcdOptions::FromUrl(WithMarkerPassword(*url));
  FUZZ_CHECK(marked.ok() && marked->Address() == o.Address(), o.Address());
  FUZZ_CHECK(!Contains(o.Address(), kSecretMarker), o.Address());
  return 0;
}
