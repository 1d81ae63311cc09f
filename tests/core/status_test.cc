// Status and Result (leasehold/status.h), and the macros that propagate them.

#include "leasehold/status.h"

#include <gtest/gtest.h>

namespace leasehold {
namespace {

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

// LH_RETURN_IF_ERROR is one statement: the body of an unbraced if, and its else still binds to
// that if.
Status FirstOddIsAnError(int x, bool check, int* checked) {
  if (check)
    LH_RETURN_IF_ERROR(Half(x).status());
  else
    ++*checked;
  return Status();
}

TEST(StatusTest, ReturnIfErrorIsOneStatement) {
  int unchecked = 0;
  EXPECT_EQ(FirstOddIsAnError(3, true, &unchecked).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(FirstOddIsAnError(4, true, &unchecked).ok());
  EXPECT_EQ(unchecked, 0);
  EXPECT_TRUE(FirstOddIsAnError(3, false, &unchecked).ok());
  EXPECT_EQ(unchecked, 1);
}

TEST(StatusTest, ResultFromOkStatusIsAnInternalError) {
  Result<int> r = Status();
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace leasehold
