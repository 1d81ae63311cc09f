// File: tools/cli/store_flag.cc

#include "store_flag.h"

#include <fmt/format.h>

#include "leasehold/duration.h"

#include "cli_log.h"
#include "exit_codes.h"

namespace leasehold::cli {

Result<std::unique_ptr<Store>> OpenStoreFromFlag(const std::string& url) {
  if (!url.empty()) {
    return Store::Open(url);
  }
  LH_ASSIGN_OR_RETURN(std::string default_url, Store::DefaultUrl());
  return Store::Open(default_url);
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

std::string DescribeHolder(const LeaseInfo& info) {
  const bool plain = info.mode == LeaseMode::kExclusive && info.limit <= 1;
  return fmt::format("{} ({}fencing token {}, expires in {})",
                     info.holder.empty() ? std::string("an unnamed holder") : info.holder,
                     plain ? std::string()
                           : fmt::format("{} slot {}, ", LeaseKindName(info.mode, info.limit),
                                         info.slot),
                     info.fencing_token, FormatDuration(RoundForDisplay(info.remaining)));
}

}  // namespace leasehold::cli
