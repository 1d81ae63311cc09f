// File: tools/cli/store_flag.cc

#include "store_flag.h"

#include <fmt/format.h>

#include "leasehold/duration.h"

#include "cli_log.h"
#include "exit_codes.h"

namespace leasehold::cli {

Result<std::unique_ptr<Store>> OpenStoreFromFlag(const std::string& url) {
  std::string chosen = url;
  if (chosen.empty()) {
    LH_ASSIGN_OR_RETURN(chosen, Store::DefaultUrl());
  }
  LH_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(chosen));
  if (store->scope() == StoreScope::kProcess) {
    // Each leasehold command is a process of its own: two of them never exclude each other.
    return Status::InvalidArgument(fmt::format(
        "{} keeps leases inside one process, so no other leasehold command would ever see "
        "them: use the host-wide embedded store (the default) or a server store",
        store->display_url()));
  }
  return store;
}

std::string DescribeStore(const Store& store) {
  return fmt::format("store {} (shared by {})", store.display_url(), StoreScopeName(store.scope()));
}

std::string Describe(const Status& status) {
  std::string text(status.message());
  if (text.empty()) {
    text = std::string(StatusCodeName(status.code()));
  }
  if (!status.detail().empty() && text.find(status.detail()) == std::string::npos) {
    text += fmt::format(" ({})", status.detail());
  }
  return text;
}

int ReportFailure(const Status& status) {
  Error(Describe(status));
  return ExitCodeFor(status);
}

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const bool c1 = byte == 0xC2 && i + 1 < text.size() &&
                    static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9F;
    if (byte < 0x20 || byte == 0x7F || byte == '\\' || c1) {
      out += fmt::format("\\x{:02x}", byte);
      if (c1) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[++i]));
      }
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string DescribeHolder(const LeaseInfo& info) {
  if (info.waiting_writer) {
    return fmt::format(
        "{}, a writer waiting for it (writer preference: shared holders come after it; its "
        "intent lasts {} unless it asks again)",
        info.holder.empty() ? std::string("an unnamed holder") : Printable(info.holder),
        FormatDuration(RoundForDisplay(info.remaining)));
  }
  const bool plain = info.mode == LeaseMode::kExclusive && info.limit <= 1;
  return fmt::format(
      "{} ({}fencing token {}, {} {})",
      info.holder.empty() ? std::string("an unnamed holder") : Printable(info.holder),
      plain ? std::string()
            : fmt::format("{} slot {}, ", LeaseKindName(info.mode, info.limit), info.slot),
      info.fencing_token,
      info.kept                       ? "released, kept for"
      : info.remaining_is_upper_bound ? "expires in at most"
                                      : "expires in",
      FormatDuration(RoundForDisplay(info.remaining)));
}

}  // namespace leasehold::cli
