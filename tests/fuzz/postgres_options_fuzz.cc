// File: tests/fuzz/postgres_options_fuzz.cc
//
// PostgresOptions::FromUrl and ScrubPassword (backends/postgres/postgres_options.h) on
// postgres:// URLs (the conninfo form has its own target). Invariants: success gives a plain
// identifier as schema, a timeout in (0, 1 h], the password libpq gets as `password`, and a
// `display` that does not depend on any secret; failure is kInvalidArgument and does not depend
// on the password; ScrubPassword leaves no trace of a password of 3 bytes or more.

#include <string>

#include "backends/common/url_params.h"
#include "backends/postgres/postgres_options.h"
#include "options_fuzz.h"

namespace {

bool IsSecretName(std::string_view name) {
  return name == "password" || name == "pass" || name == "token" || name == "sslpassword";
}

// `url` with the marker as its password and as every secret query value.
leasehold::internal::Url WithMarkerSecrets(leasehold::internal::Url url) {
  url = leasehold::fuzz::WithMarkerPassword(std::move(url));
  for (auto& [name, value] : url.query) {
    if (IsSecretName(name)) {
      value = std::string(leasehold::fuzz::kSecretMarker);
    }
  }
  return url;
}

bool PlainIdentifier(std::string_view s) {
  if (s.empty() || s.size() > 63 || (s[0] >= '0' && s[0] <= '9')) {
    return false;
  }
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using leasehold::Duration;
  using leasehold::internal::PostgresOptions;
  using leasehold::internal::ScrubPassword;
  using namespace leasehold::fuzz;
  const std::string_view text = AsText(data, size);
  std::optional<leasehold::internal::Url> url = SteeredUrl(text, {"postgres", "postgresql"});
  if (url) {
    leasehold::Result<PostgresOptions> options = PostgresOptions::FromUrl(*url);
    if (!options.ok()) {
      FUZZ_CHECK(options.status().code() == leasehold::StatusCode::kInvalidArgument,
                 options.status().message());
      CheckErrorHidesPassword(*url, options.status(), PostgresOptions::FromUrl);
    } else {
      const PostgresOptions& o = *options;
      FUZZ_CHECK(PlainIdentifier(o.schema), o.schema);
      FUZZ_CHECK(o.command_timeout > Duration::zero() &&
                     o.command_timeout <= leasehold::internal::kMaxUrlTimeout,
                 "timeout");
      // Every password libpq is given is the one scrubbed from its messages.
      for (const auto& [name, value] : o.libpq_params) {
        if (name == "password") {
          FUZZ_CHECK(o.password && *o.password == value, "libpq gets a password not scrubbed");
        }
      }
      leasehold::Result<PostgresOptions> marked = PostgresOptions::FromUrl(WithMarkerSecrets(*url));
      FUZZ_CHECK(marked.ok(), "a secret decided whether the URL is accepted");
      FUZZ_CHECK(!Contains(marked->display, kSecretMarker), marked->display);
      FUZZ_CHECK(marked->display == o.display, o.display + " vs " + marked->display);
    }
  }
  // ScrubPassword on the input as a libpq message, with a password taken from its first line.
  std::size_t nl = text.find('\n');
  if (nl != std::string_view::npos && nl >= 3) {
    const std::string password(text.substr(0, nl));
    const std::string scrubbed = ScrubPassword(std::string(text.substr(nl + 1)), password);
    FUZZ_CHECK(!Contains(scrubbed, password), scrubbed);
  }
  return 0;
}
