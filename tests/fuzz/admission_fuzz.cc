// File: tests/fuzz/admission_fuzz.cc
//
// The admission rule (backends/common/admission.h) over any sequence of grants ahead, of any
// limit up to kMaxLeaseLimit. Each input byte pair is a kind: the first byte's low bit the mode,
// its other bits and the second byte a limit (1 for most, a small N often, any N at times); the
// last kind is the request, and the input's first bit says whether a writer waits.
// Invariants:
// - Ahead, fed one kind at a time, decides every prefix as Admit does over the whole prefix.
// - A mismatch names the first grant ahead of another limit; a refusal names a grant ahead.
// - Granted only if no grant ahead is of another limit, and: a semaphore of N with fewer than N
//   ahead; exclusive with nothing ahead; shared with no exclusive ahead and no writer waiting.
// - The children a queue grants together (each decided with the ones before it ahead) are a set
//   a key may hold: one limit, at most N of a semaphore, an exclusive grant alone.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/common/admission.h"
#include "fuzz_check.h"

namespace {

using leasehold::LeaseMode;
using leasehold::internal::Admission;
using leasehold::internal::Admit;
using leasehold::internal::Ahead;
using leasehold::internal::GrantKind;
using leasehold::internal::Verdict;

GrantKind KindOf(std::uint8_t a, std::uint8_t b) {
  const LeaseMode mode = (a & 1) != 0 ? LeaseMode::kShared : LeaseMode::kExclusive;
  std::uint32_t limit = 1;
  switch ((a >> 1) & 3) {
    case 1:
      limit = 2 + b % 3;
      break;
    case 2:
      limit = 1 + (static_cast<std::uint32_t>(a >> 3) << 8 | b) % leasehold::kMaxLeaseLimit;
      break;
    default:
      break;
  }
  return {mode, limit};
}

bool IsExclusive(GrantKind k) {
  return k.limit == 1 && k.mode == LeaseMode::kExclusive;
}

void CheckDecision(const std::vector<GrantKind>& ahead, GrantKind mine, bool writer_waiting,
                   Admission a) {
  const std::string what = std::to_string(ahead.size()) + " ahead, limit " +
                           std::to_string(mine.limit) + ", by " + std::to_string(a.by);
  std::size_t other = ahead.size();
  std::size_t exclusive = ahead.size();
  for (std::size_t i = ahead.size(); i-- > 0;) {
    other = ahead[i].limit != mine.limit ? i : other;
    exclusive = IsExclusive(ahead[i]) ? i : exclusive;
  }
  if (a.verdict == Verdict::kMismatch) {
    FUZZ_CHECK(a.by == other && other < ahead.size(), what);
    return;
  }
  FUZZ_CHECK(other == ahead.size(), "a grant of another limit was passed over: " + what);
  if (a.verdict == Verdict::kBusy) {
    FUZZ_CHECK(a.by < ahead.size(), what);
  }
  bool room = false;
  if (mine.limit > 1) {
    room = ahead.size() < mine.limit;
  } else if (IsExclusive(mine)) {
    room = ahead.empty();
  } else {
    room = exclusive == ahead.size();
    FUZZ_CHECK(!room || (a.verdict == Verdict::kWriterWaiting) == writer_waiting, what);
    if (!room) {
      FUZZ_CHECK(a.verdict == Verdict::kBusy && a.by == exclusive, what);
    }
  }
  FUZZ_CHECK((a.verdict == Verdict::kGranted) ==
                 (room && (mine.limit > 1 || IsExclusive(mine) || !writer_waiting)),
             what);
}

bool MayHold(const std::vector<GrantKind>& grants) {
  std::size_t exclusive = 0;
  for (GrantKind g : grants) {
    if (g.limit != grants.front().limit) {
      return false;
    }
    exclusive += IsExclusive(g) ? 1 : 0;
  }
  return grants.empty() || (grants.front().limit > 1 ? grants.size() <= grants.front().limit
                                                     : exclusive == 0 || grants.size() == 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2 || size > 512) {
    return 0;
  }
  const bool writer_waiting = (data[0] & 0x80) != 0;
  std::vector<GrantKind> kinds;
  for (std::size_t i = 0; i + 1 < size; i += 2) {
    kinds.push_back(KindOf(data[i], data[i + 1]));
  }
  const GrantKind mine = kinds.back();
  kinds.pop_back();

  const Admission whole = Admit(kinds, mine, writer_waiting);
  CheckDecision(kinds, mine, writer_waiting, whole);

  Ahead ahead;
  std::vector<GrantKind> granted;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    const Admission step = ahead.Decide(kinds[i]);
    const Admission again = Admit({kinds.data(), i}, kinds[i]);
    FUZZ_CHECK(step.verdict == again.verdict && step.by == again.by,
               "incremental and whole decisions differ at child " + std::to_string(i));
    if (step.verdict == Verdict::kGranted) {
      granted.push_back(kinds[i]);
    }
    ahead.Add(kinds[i]);
  }
  const Admission last = ahead.Decide(mine, writer_waiting);
  FUZZ_CHECK(last.verdict == whole.verdict && last.by == whole.by, "last decision differs");
  FUZZ_CHECK(MayHold(granted), "a queue granted a set no key may hold");
  return 0;
}
