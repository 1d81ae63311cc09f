// File: backends/common/admission.cc

#include "backends/common/admission.h"

namespace leasehold::internal {

void Ahead::Add(GrantKind kind) {
  if (count_ == 0) {
    first_limit_ = kind.limit;
  } else if (!other_limit_ && kind.limit != first_limit_) {
    other_limit_ = count_;
  }
  if (!first_exclusive_ && kind.limit == 1 && kind.mode == LeaseMode::kExclusive) {
    first_exclusive_ = count_;
  }
  ++count_;
}

Admission Ahead::Decide(GrantKind mine, bool writer_waiting) const {
  // The first grant of another limit than mine: grant 0 if its limit differs, else the first
  // that differs from grant 0's.
  if (count_ > 0 && first_limit_ != mine.limit) {
    return {Verdict::kMismatch, 0};
  }
  if (other_limit_) {
    return {Verdict::kMismatch, *other_limit_};
  }
  if (mine.limit > 1) {
    return count_ < mine.limit ? Admission{} : Admission{Verdict::kBusy, 0};
  }
  if (mine.mode == LeaseMode::kShared) {
    if (first_exclusive_) {
      return {Verdict::kBusy, *first_exclusive_};
    }
    return writer_waiting ? Admission{Verdict::kWriterWaiting, 0} : Admission{};
  }
  return count_ == 0 ? Admission{} : Admission{Verdict::kBusy, 0};
}

Admission Admit(std::span<const GrantKind> ahead, GrantKind mine, bool writer_waiting) {
  Ahead a;
  for (const GrantKind& kind : ahead) {
    a.Add(kind);
  }
  return a.Decide(mine, writer_waiting);
}

}  // namespace leasehold::internal
