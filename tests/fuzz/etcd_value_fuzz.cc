// File: tests/fuzz/etcd_value_fuzz.cc
//
// DecodeValue (backends/etcd/etcd_value.h): the value of a grant's key, which leasehold reads
// back from etcd, where any client with write access to the prefix may have put something else.
// Invariants: decoding is well defined (UBSan: no signed overflow); a decoded TTL is >= 0; a
// decoded value, encoded again, decodes to the same fields.

#include <string>

#include "backends/etcd/etcd_value.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using leasehold::internal::DecodeValue;
  using leasehold::internal::EncodeValue;
  using leasehold::internal::GrantValue;
  std::optional<GrantValue> value = DecodeValue(leasehold::fuzz::AsText(data, size));
  if (!value) {
    return 0;
  }
  FUZZ_CHECK(value->ttl_ms >= 0, std::to_string(value->ttl_ms));
  FUZZ_CHECK(value->token.find('\n') == std::string::npos, "a token with a newline");
  std::optional<GrantValue> again = DecodeValue(EncodeValue(*value));
  FUZZ_CHECK(again && again->token == value->token && again->ttl_ms == value->ttl_ms &&
                 again->holder == value->holder,
             "does not read back");
  return 0;
}
