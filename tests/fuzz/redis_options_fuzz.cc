// File: tests/fuzz/redis_options_fuzz.cc
//
// RedisOptions::FromUrl (backends/redis/redis_options.h) on redis://, rediss://, redis+unix://
// and redis+sentinel:// URLs.
// Invariants: success gives every field inside its documented bounds; failure is
// kInvalidArgument; neither Address() nor an error depends on the password.

#include <chrono>
#include <string>

#include "backends/common/url_params.h"
#include "backends/redis/redis_options.h"
#include "options_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using leasehold::Duration;
  using leasehold::internal::RedisOptions;
  using namespace leasehold::fuzz;
  std::optional<leasehold::internal::Url> url =
      SteeredUrl(AsText(data, size), {"redis", "rediss", "redis+unix", "redis+sentinel"});
  if (!url) {
    return 0;
  }
  leasehold::Result<RedisOptions> options = RedisOptions::FromUrl(*url);
  if (!options.ok()) {
    FUZZ_CHECK(options.status().code() == leasehold::StatusCode::kInvalidArgument,
               options.status().message());
    CheckErrorHidesPassword(*url, options.status(), RedisOptions::FromUrl);
    return 0;
  }
  const RedisOptions& o = *options;
  auto timeout_ok = [](Duration d) {
    return d > Duration::zero() && d <= leasehold::internal::kMaxUrlTimeout;
  };
  FUZZ_CHECK(o.tls == url->scheme.starts_with("rediss"), url->scheme);
  FUZZ_CHECK(o.tls_cert.empty() == o.tls_key.empty(), "a certificate without its key");
  if (o.sentinel()) {
    FUZZ_CHECK(url->scheme.ends_with("+sentinel"), url->scheme);
    FUZZ_CHECK(!o.sentinels.empty() && o.require_master, "sentinel without sentinels");
    for (const auto& [host, port] : o.sentinels) {
      FUZZ_CHECK(!host.empty() && port >= 1 && port <= 65535, host);
    }
  } else if (o.unix_socket.empty()) {
    FUZZ_CHECK(url->scheme == "redis" || url->scheme == "rediss", url->scheme);
    FUZZ_CHECK(!o.host.empty(), "empty host");
    FUZZ_CHECK(o.port >= 1 && o.port <= 65535, std::to_string(o.port));
  } else {
    FUZZ_CHECK(url->scheme == "redis+unix" && o.unix_socket.size() >= 2, o.unix_socket);
  }
  FUZZ_CHECK(o.db >= 0 && o.db <= (1 << 20), std::to_string(o.db));
  FUZZ_CHECK(timeout_ok(o.connect_timeout) && timeout_ok(o.command_timeout) &&
                 timeout_ok(o.replica_timeout),
             "timeout out of bounds");
  FUZZ_CHECK(o.min_replicas >= 0 && o.min_replicas <= 100, std::to_string(o.min_replicas));
  FUZZ_CHECK(o.pool_size >= 1 && o.pool_size <= 64, std::to_string(o.pool_size));
  FUZZ_CHECK(!o.prefix.empty() && o.prefix.find_first_of("{}") == std::string::npos, o.prefix);
  FUZZ_CHECK(!o.user || !o.user->empty(), "an empty user is kept");
  FUZZ_CHECK(o.password == url->password, "the password changed on the way");
  leasehold::Result<RedisOptions> marked = RedisOptions::FromUrl(WithMarkerPassword(*url));
  FUZZ_CHECK(marked.ok(), "the password decided whether the URL is accepted");
  FUZZ_CHECK(marked->Address() == o.Address() && !Contains(o.Address(), kSecretMarker),
             o.Address());
  return 0;
}
