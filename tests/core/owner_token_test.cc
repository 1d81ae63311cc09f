// Owner tokens (src/core/owner_token.h): 128 random bits in hex, and their printable prefix.

#include "core/owner_token.h"

#include <string>

#include <gtest/gtest.h>

namespace leasehold {
namespace {

TEST(OwnerTokenTest, TokensAre128RandomBitsInHex) {
  auto a = internal::NewOwnerToken();
  auto b = internal::NewOwnerToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(internal::TokenPrefix(*a), a->substr(0, 8));
}

}  // namespace
}  // namespace leasehold
