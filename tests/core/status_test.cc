#include "leasehold/status.h"

#include <gtest/gtest.h>

#include "core/backoff.h"
#include "core/owner_token.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;

Result<int> Half(int x) {
  if (x % 2 != 0) {
    return Status::InvalidArgument("odd");
  }
  return x / 2;
}

Status Quarter(int x, int* out) {
  LH_ASSIGN_OR_RETURN(int h, Half(x));
  LH_ASSIGN_OR_RETURN(*out, Half(h));
  return Status();
}

TEST(StatusTest, OkIsCheapAndErrorsCarryCodeMessageAndHolder) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  Status held = Status::HeldByAnother("k is held", LeaseInfo{.key = "k", .holder = "h:1"});
  EXPECT_EQ(held.code(), StatusCode::kHeldByAnother);
  ASSERT_NE(held.holder(), nullptr);
  EXPECT_EQ(held.holder()->holder, "h:1");
  Status copy = held.WithContext("acquire");
  EXPECT_EQ(copy.message(), "acquire: k is held");
  ASSERT_NE(copy.holder(), nullptr);
  EXPECT_EQ(Status::Unavailable("x", "ECONNREFUSED").ToString(), "Unavailable: x (ECONNREFUSED)");
}

TEST(StatusTest, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(Quarter(6, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Half(3).value_or(-1), -1);
}

TEST(StatusTest, ResultFromOkStatusIsAnInternalError) {
  Result<int> r = Status();
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(OwnerTokenTest, TokensAre128RandomBitsInHex) {
  auto a = internal::NewOwnerToken();
  auto b = internal::NewOwnerToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(internal::TokenPrefix(*a), a->substr(0, 8));
}

TEST(BackoffTest, FullJitterStaysUnderTheCappedCeiling) {
  internal::Backoff backoff(1ms, 50ms);
  Duration ceiling = 1ms;
  bool saw_nonzero = false;
  for (int i = 0; i < 40; ++i) {
    Duration d = backoff.Next();
    EXPECT_GE(d, Duration::zero());
    EXPECT_LE(d, ceiling);
    saw_nonzero = saw_nonzero || d > Duration::zero();
    ceiling = std::min<Duration>(ceiling * 2, 50ms);
  }
  EXPECT_TRUE(saw_nonzero);
}

}  // namespace
}  // namespace leasehold
