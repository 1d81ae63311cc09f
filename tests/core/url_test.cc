#include "core/url.h"

#include <gtest/gtest.h>

namespace leasehold::internal {
namespace {

TEST(UrlTest, SplitsEveryPart) {
  auto url = ParseUrl("Redis://alice:s%40cret@10.0.0.1:6379,10.0.0.2:6380/3?timeout=2s&fair=true");
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  EXPECT_EQ(url->scheme, "redis");
  EXPECT_EQ(url->user, "alice");
  EXPECT_EQ(url->password, "s@cret");
  EXPECT_EQ(url->authority, "10.0.0.1:6379,10.0.0.2:6380");
  EXPECT_EQ(url->path, "/3");
  EXPECT_EQ(url->query.at("timeout"), "2s");
  EXPECT_EQ(url->query.at("fair"), "true");
  EXPECT_EQ(url->Redacted().find("s@cret"), std::string::npos);
  EXPECT_NE(url->Redacted().find("alice:***@"), std::string::npos);
}

TEST(UrlTest, SqlitePathIsEverythingBeforeTheQuery) {
  auto abs = ParseUrl("sqlite:///var/lib/app/leases%20db.sqlite?busy_timeout=1s");
  ASSERT_TRUE(abs.ok());
  EXPECT_EQ(abs->path, "/var/lib/app/leases db.sqlite");
  EXPECT_EQ(abs->query.at("busy_timeout"), "1s");
  auto rel = ParseUrl("sqlite://leases.db");
  ASSERT_TRUE(rel.ok());
  EXPECT_EQ(rel->path, "leases.db");
  auto empty = ParseUrl("sqlite://");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->path, "");
}

TEST(UrlTest, RejectsMalformedInputWithoutEchoingIt) {
  EXPECT_FALSE(ParseUrl("").ok());
  EXPECT_FALSE(ParseUrl("://x").ok());
  EXPECT_FALSE(ParseUrl("1abc://x").ok());
  EXPECT_FALSE(ParseUrl("redis://h/?a=1&a=2").ok());
  EXPECT_FALSE(ParseUrl("redis://u:p%zz@h").ok());
  EXPECT_FALSE(ParseUrl("redis://u:p%4@h").ok());
  auto bad = ParseUrl("redis:/u:topsecret@h");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().find("topsecret"), std::string_view::npos);
}

}  // namespace
}  // namespace leasehold::internal
