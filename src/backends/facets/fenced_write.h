// File: backends/facets/fenced_write.h (internal)
//
// FencedWriteFacet: writes to data in the store checked against a grant in the same atomic step
// (Lease::Write), handed out by Backend::facets(). A backend without one leaves it null, and
// Lease::Write returns kUnimplemented.
//
// Thread safety: as the backend that hands it out.

#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "leasehold/fenced_write.h"
#include "leasehold/status.h"

namespace leasehold::internal {

// A write to data in the store, applied only while the grant is the caller's (Lease::Write).
struct FencedWriteRequest {
  std::string key;
  std::string owner_token;
  FencingToken fencing_token = 0;
  // Grant::store_key as the grant returned it (the lease key if the backend returned none).
  std::string store_key;
  // Checked by the core: 1..kMaxFencedOps ops of kinds in FencedWriteFacet::fenced_ops(), at
  // most kMaxFencedWriteBytes in all.
  std::vector<FencedOp> ops;
  // The chaos harness's negative control only (tests/chaos): apply the ops without the check, so
  // that the harness can show it catches the stale writes a missing guard lets through. Never
  // set by the library.
  bool skip_guard_for_testing = false;
};

// The FencedWriteFacet::fenced_ops bit of `kind`.
constexpr unsigned FencedOpBit(FencedOp::Kind kind) {
  return 1U << static_cast<unsigned>(kind);
}

// The message of a FencedWrite refused because the grant is not the caller's:
// kLost "fenced out: lease <key> (fencing token <token>) <why>", e.g. why = "is now held by
// web-2:7 under fencing token 9".
Status FencedOut(std::string_view key, FencingToken token, std::string_view why);

class FencedWriteFacet {
 public:
  FencedWriteFacet() = default;
  FencedWriteFacet(const FencedWriteFacet&) = delete;
  FencedWriteFacet& operator=(const FencedWriteFacet&) = delete;

  // The op kinds FencedWrite takes: FencedOpBit(kind) per kind.
  [[nodiscard]] virtual unsigned fenced_ops() const = 0;

  // Applies request.ops to data in the store, in order, all or none, in one atomic step that
  // first checks that the grant of request.key is live and request.owner_token's (or, where the
  // store identifies grants otherwise, that request.store_key is still the grant with
  // request.fencing_token). Returns one count per op (FencedWriteResult::affected); kLost
  // (FencedOut, naming the live grant where the store can) if the check fails; kInvalidArgument
  // for a key or statement the store refuses. Nothing is written on any error.
  virtual Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) = 0;

  // What goes in front of a data key's name to keep it beside the grant of `key`
  // (Lease::DataKey): for Redis the key's {hash tag} and ':', so that a cluster has the data in
  // the grant's slot, where one script can check the grant and write it. The default: nothing.
  [[nodiscard]] virtual std::string DataKeyPrefix(std::string_view key) const;

 protected:
  ~FencedWriteFacet() = default;
};

}  // namespace leasehold::internal
