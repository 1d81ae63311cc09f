// File: tests/fuzz/fuzz_check.h
//
// FUZZ_CHECK(condition, what): the invariant check of every fuzz target. A failed check prints
// the condition and `what` and aborts, which libFuzzer reports as a crash and saves the input
// (crash-<sha1>) for a regression. Not assert(): the checks must hold in every build type.
//
// Thread safety: fuzz targets run one input at a time.

#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#define FUZZ_CHECK(condition, what)                                                               \
  do {                                                                                            \
    if (!(condition)) {                                                                           \
      std::fprintf(stderr, "%s:%d: invariant broken: %s\n  %s\n", __FILE__, __LINE__, #condition, \
                   std::string(what).c_str());                                                    \
      std::abort();                                                                               \
    }                                                                                             \
  } while (false)

namespace leasehold::fuzz {

// The fuzzer's bytes as text (they may hold NUL and any byte).
inline std::string_view AsText(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// True if `haystack` contains `needle`.
inline bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

}  // namespace leasehold::fuzz
