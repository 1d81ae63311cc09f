// File: backends/etcd/etcd_value.h (internal)
//
// The value an etcd:// grant's key holds, written and read in one place (no gRPC here, so the
// fuzz target tests/fuzz/etcd_value_fuzz.cc reads it without a server):
//
//   "v1\n<owner token>\n<granted ttl ms>\n<holder>"
//
// The holder comes last so it may contain anything, newlines included.
//
// Thread safety: a plain value type and functions.

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace leasehold::internal {

struct GrantValue {
  std::string token;
  int64_t ttl_ms = 0;
  std::string holder;
};

// Returns the value's bytes.
std::string EncodeValue(const GrantValue& v);

// Reads a value; nullopt if it is not in this layout (another version, a missing line, a ttl
// that is not a whole number or does not fit in 64 bits).
std::optional<GrantValue> DecodeValue(std::string_view text);

}  // namespace leasehold::internal
