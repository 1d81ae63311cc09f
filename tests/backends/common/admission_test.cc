// The admission rule (src/backends/common/admission.h), checked against its specification over
// every sequence of up to five grants of four kinds: a request is granted beside a set of live
// grants exactly when the set with it is still one a key may hold, refused as a mismatch exactly
// when a grant ahead is of another limit, and the grant it names is the one that refuses it.

#include "backends/common/admission.h"

#include <cstddef>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace leasehold::internal {
namespace {

constexpr GrantKind kExclusive{LeaseMode::kExclusive, 1};
constexpr GrantKind kShared{LeaseMode::kShared, 1};
constexpr GrantKind kSemaphore2{LeaseMode::kExclusive, 2};
constexpr GrantKind kSemaphore3{LeaseMode::kShared, 3};  // a semaphore's mode does not count
constexpr GrantKind kKinds[] = {kExclusive, kShared, kSemaphore2, kSemaphore3};

bool IsExclusive(GrantKind k) {
  return k.limit == 1 && k.mode == LeaseMode::kExclusive;
}

// The specification: the grants a key may hold at once. One family (every grant of one limit);
// a semaphore of N: at most N grants; limit 1: one exclusive grant alone, or shared grants only.
bool MayHold(const std::vector<GrantKind>& grants) {
  if (grants.empty()) {
    return true;
  }
  const std::uint32_t limit = grants.front().limit;
  std::size_t exclusive = 0;
  for (GrantKind g : grants) {
    if (g.limit != limit) {
      return false;
    }
    exclusive += IsExclusive(g) ? 1 : 0;
  }
  if (limit > 1) {
    return grants.size() <= limit;
  }
  return exclusive == 0 || grants.size() == 1;
}

std::string Name(GrantKind k) {
  return k.limit > 1 ? "sem" + std::to_string(k.limit) : IsExclusive(k) ? "X" : "S";
}

std::string Describe(const std::vector<GrantKind>& ahead, GrantKind mine) {
  std::string s;
  for (GrantKind g : ahead) {
    s += Name(g) + " ";
  }
  return "[" + s + "] + " + Name(mine);
}

// Every sequence of up to `n` kinds.
std::vector<std::vector<GrantKind>> Sequences(std::size_t n) {
  std::vector<std::vector<GrantKind>> out{{}};
  for (std::size_t begin = 0, len = 0; len < n; ++len) {
    const std::size_t end = out.size();
    for (std::size_t i = begin; i < end; ++i) {
      for (GrantKind k : kKinds) {
        std::vector<GrantKind> next = out[i];
        next.push_back(k);
        out.push_back(std::move(next));
      }
    }
    begin = end;
  }
  return out;
}

// Checks what `a` says of `mine` beside `ahead` against the clauses of the rule, for any
// sequence ahead (a queue's children need not be a set a key may hold).
void ExpectClauses(const std::vector<GrantKind>& ahead, GrantKind mine, bool writer_waiting,
                   Admission a) {
  const std::string what = Describe(ahead, mine) + (writer_waiting ? " (writer waiting)" : "");
  std::size_t other_limit = ahead.size();
  for (std::size_t i = 0; i < ahead.size() && other_limit == ahead.size(); ++i) {
    if (ahead[i].limit != mine.limit) {
      other_limit = i;
    }
  }
  if (other_limit < ahead.size()) {
    EXPECT_EQ(a.verdict, Verdict::kMismatch) << what;
    EXPECT_EQ(a.by, other_limit) << what;
    return;
  }
  if (mine.limit > 1) {
    EXPECT_EQ(a.verdict, ahead.size() < mine.limit ? Verdict::kGranted : Verdict::kBusy) << what;
    EXPECT_EQ(a.by, 0u) << what;
    return;
  }
  if (IsExclusive(mine)) {
    EXPECT_EQ(a.verdict, ahead.empty() ? Verdict::kGranted : Verdict::kBusy) << what;
    EXPECT_EQ(a.by, 0u) << what;
    return;
  }
  std::size_t exclusive = ahead.size();
  for (std::size_t i = 0; i < ahead.size() && exclusive == ahead.size(); ++i) {
    if (IsExclusive(ahead[i])) {
      exclusive = i;
    }
  }
  if (exclusive < ahead.size()) {
    EXPECT_EQ(a.verdict, Verdict::kBusy) << what;
    EXPECT_EQ(a.by, exclusive) << what;
  } else {
    EXPECT_EQ(a.verdict, writer_waiting ? Verdict::kWriterWaiting : Verdict::kGranted) << what;
  }
}

TEST(AdmissionTest, GrantsExactlyWhatAKeyMayHoldBesideItsLiveGrants) {
  int held_sets = 0;
  for (const std::vector<GrantKind>& live : Sequences(5)) {
    if (!MayHold(live)) {
      continue;
    }
    ++held_sets;
    for (GrantKind mine : kKinds) {
      std::vector<GrantKind> with = live;
      with.push_back(mine);
      const Admission a = Admit(live, mine);
      EXPECT_EQ(a.verdict == Verdict::kGranted, MayHold(with)) << Describe(live, mine);
      bool other_limit = false;
      for (GrantKind g : live) {
        other_limit = other_limit || g.limit != mine.limit;
      }
      EXPECT_EQ(a.verdict == Verdict::kMismatch, other_limit) << Describe(live, mine);
    }
  }
  // {}, X, S..S (5), sem2 (2), sem3 (3) sequences of length <= 5, and nothing else.
  EXPECT_EQ(held_sets, 1 + 1 + 5 + 2 + 3);
}

TEST(AdmissionTest, EveryClauseHoldsOverAnySequenceAhead) {
  for (const std::vector<GrantKind>& ahead : Sequences(5)) {
    for (GrantKind mine : kKinds) {
      for (bool writer_waiting : {false, true}) {
        ExpectClauses(ahead, mine, writer_waiting, Admit(ahead, mine, writer_waiting));
      }
    }
  }
}

TEST(AdmissionTest, AQueueDecidedOneChildAtATimeAgreesWithEachPrefix) {
  for (const std::vector<GrantKind>& queue : Sequences(5)) {
    Ahead ahead;
    for (std::size_t i = 0; i < queue.size(); ++i) {
      const std::vector<GrantKind> prefix(queue.begin(), queue.begin() + static_cast<long>(i));
      const Admission incremental = ahead.Decide(queue[i]);
      const Admission whole = Admit(prefix, queue[i]);
      EXPECT_EQ(incremental.verdict, whole.verdict) << Describe(prefix, queue[i]);
      EXPECT_EQ(incremental.by, whole.by) << Describe(prefix, queue[i]);
      ahead.Add(queue[i]);
      EXPECT_EQ(ahead.size(), i + 1);
    }
  }
}

TEST(AdmissionTest, TheGrantedChildrenOfAnyQueueAreASetAKeyMayHold) {
  // Children only leave a queue and later ones only join behind: whatever the queue, the
  // children the rule grants together are a set a key may hold (ZooKeeper's safety argument).
  for (const std::vector<GrantKind>& queue : Sequences(5)) {
    Ahead ahead;
    std::vector<GrantKind> granted;
    for (GrantKind child : queue) {
      if (ahead.Decide(child).verdict == Verdict::kGranted) {
        granted.push_back(child);
      }
      ahead.Add(child);
    }
    EXPECT_TRUE(MayHold(granted)) << Describe(queue, {});
  }
}

TEST(AdmissionTest, AWaitingWriterKeepsOnlySharedRequestsOut) {
  EXPECT_EQ(Admit({}, kShared, true).verdict, Verdict::kWriterWaiting);
  EXPECT_EQ(Admit({}, kExclusive, true).verdict, Verdict::kGranted);
  EXPECT_EQ(Admit({}, kSemaphore2, true).verdict, Verdict::kGranted);
  const std::vector<GrantKind> readers{kShared, kShared};
  EXPECT_EQ(Admit(readers, kShared, true).verdict, Verdict::kWriterWaiting);
  EXPECT_EQ(Admit(readers, kShared, false).verdict, Verdict::kGranted);
}

TEST(AdmissionTest, TheLargestLimitCountsEveryGrantAhead) {
  const GrantKind big{LeaseMode::kExclusive, kMaxLeaseLimit};
  Ahead ahead;
  for (std::uint32_t i = 0; i + 1 < kMaxLeaseLimit; ++i) {
    ahead.Add(big);
  }
  EXPECT_EQ(ahead.Decide(big).verdict, Verdict::kGranted);
  ahead.Add(big);
  EXPECT_EQ(ahead.Decide(big).verdict, Verdict::kBusy);
}

}  // namespace
}  // namespace leasehold::internal
