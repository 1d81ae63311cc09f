// File: core/owner_token.h (internal)
//
// Owner tokens: 128 bits from the kernel CSPRNG (getrandom), as 32 lowercase hex digits.
// A token identifies one grant; it is never logged in full (use TokenPrefix) and never handed
// to child processes.
//
// Thread safety: thread-safe.

#pragma once

#include <string>
#include <string_view>

#include "leasehold/status.h"

namespace leasehold::internal {

// Returns a fresh token. kInternal only if the kernel refuses getrandom (it does not block
// after boot).
Result<std::string> NewOwnerToken();

// Returns the first 8 characters: enough to tell grants apart in logs.
std::string TokenPrefix(std::string_view token);

}  // namespace leasehold::internal
