// File: backends/etcd/etcd_value.cc (internal)

#include "backends/etcd/etcd_value.h"

#include <limits>

#include <fmt/format.h>

namespace leasehold::internal {

namespace {

// Version of the value layout (EncodeValue).
constexpr int64_t kValueVersion = 1;

}  // namespace

std::string EncodeValue(const GrantValue& v) {
  return fmt::format("v{}\n{}\n{}\n{}", kValueVersion, v.token, v.ttl_ms, v.holder);
}

std::optional<GrantValue> DecodeValue(std::string_view text) {
  GrantValue v;
  std::string_view parts[3];
  for (auto& part : parts) {
    std::size_t nl = text.find('\n');
    if (nl == std::string_view::npos) {
      return std::nullopt;
    }
    part = text.substr(0, nl);
    text.remove_prefix(nl + 1);
  }
  if (parts[0] != "v1") {
    return std::nullopt;
  }
  v.token = std::string(parts[1]);
  for (char c : parts[2]) {
    // A value any client may have put: more digits than int64 holds is not ours either.
    if (c < '0' || c > '9' || v.ttl_ms > (std::numeric_limits<int64_t>::max() - (c - '0')) / 10) {
      return std::nullopt;
    }
    v.ttl_ms = v.ttl_ms * 10 + (c - '0');
  }
  v.holder = std::string(text);
  return v;
}

}  // namespace leasehold::internal
