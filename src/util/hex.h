// File: util/hex.h (internal)
//
// Lowercase hex, and back: Redis key names carry user keys hex-encoded (any bytes, no glob or
// hash-tag characters), and PostgreSQL records travel as text the server decodes
// (decode(.., 'hex')).
//
// Thread safety: pure functions.

#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace leasehold::internal {

inline std::string HexEncode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 0xF];
  }
  return out;
}

// Returns nullopt for text that is not lowercase hex of whole bytes.
inline std::optional<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) {
    return std::nullopt;
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') {
      return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
      return c - 'a' + 10;
    }
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]);
    const int lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) {
      return std::nullopt;
    }
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

}  // namespace leasehold::internal
