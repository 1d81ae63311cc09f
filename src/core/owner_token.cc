#include "core/owner_token.h"

#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <sys/random.h>

namespace leasehold::internal {

Result<std::string> NewOwnerToken() {
  std::array<unsigned char, 16> bytes{};
  std::size_t filled = 0;
  while (filled < bytes.size()) {
    ssize_t n = getrandom(bytes.data() + filled, bytes.size() - filled, 0);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return Status::Internal(fmt::format("getrandom failed: {}", std::strerror(errno)));
    }
    filled += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token(32, '0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    token[2 * i] = kHex[bytes[i] >> 4];
    token[2 * i + 1] = kHex[bytes[i] & 0xF];
  }
  return token;
}

std::string TokenPrefix(std::string_view token) {
  return std::string(token.substr(0, 8));
}

}  // namespace leasehold::internal
