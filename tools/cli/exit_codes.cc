// File: tools/cli/exit_codes.cc

#include "exit_codes.h"

#include <cerrno>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

namespace leasehold::cli {
namespace {

struct Outcome {
  std::string_view name;
  int code;
};

constexpr Outcome kOutcomes[] = {
    {"usage", kExitUsage},
    {"unavailable", kExitUnavailable},
    {"internal", kExitInternal},
    {"held", kExitHeldByAnother},
    {"permission", kExitPermissionDenied},
    {"lost", kExitLeaseLost},
    {"done", kExitSlotDone},
    {"unsafe", kExitCheckUnsafe},
    {"cannot-execute", kExitCannotExecute},
    {"not-found", kExitCommandNotFound},
    {"interrupted", kExitInterrupted},
};

std::string OutcomeNames() {
  std::string names;
  for (const Outcome& o : kOutcomes) {
    names += fmt::format("{}{}", names.empty() ? "" : ", ", o.name);
  }
  return names;
}

}  // namespace

Result<std::map<int, int>> ParseExitCodeMap(const std::vector<std::string>& specs) {
  std::map<int, int> map;
  for (const std::string& spec : specs) {
    const std::size_t equals = spec.find('=');
    const std::string name = spec.substr(0, equals);
    const Outcome* outcome = nullptr;
    for (const Outcome& o : kOutcomes) {
      if (o.name == name) {
        outcome = &o;
      }
    }
    const std::string value = equals == std::string::npos ? "" : spec.substr(equals + 1);
    char* end = nullptr;
    errno = 0;
    const long code = value.empty() ? -1 : std::strtol(value.c_str(), &end, 10);
    if (outcome == nullptr || value.empty() || *end != '\0' || errno != 0 || code < 0 ||
        code > 255) {
      return Status::InvalidArgument(
          fmt::format("--exit-code '{}' must be OUTCOME=N with N in 0..255 and OUTCOME one of {}",
                      spec, OutcomeNames()));
    }
    map[outcome->code] = static_cast<int>(code);
  }
  return map;
}

}  // namespace leasehold::cli
