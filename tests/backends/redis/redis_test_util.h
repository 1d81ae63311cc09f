// File: tests/backends/redis/redis_test_util.h
//
// What the Redis store's tests share: a backend opened from a URL, an owner token, and a
// fixture started or the test failed (redis_backend_test, redis_tls_test, redis_sentinel_test).
//
// Thread safety: plain functions.

#pragma once

#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "backends/redis/redis_backend.h"
#include "backends/redis/redis_options.h"
#include "core/url.h"

namespace leasehold::internal::redis_test {

// A 32-hex-digit owner token of one repeated character.
inline std::string Token(char c) {
  return std::string(32, c);
}

// The redis:// family store named by `text`, opened as the registry opens it.
inline Result<std::shared_ptr<RedisBackend>> OpenUrl(const std::string& text) {
  LH_ASSIGN_OR_RETURN(Url url, ParseUrl(text));
  LH_ASSIGN_OR_RETURN(RedisOptions options, RedisOptions::FromUrl(url));
  return RedisBackend::Open(options);
}

// Fixture::Start(options), or null with the test failed (EXPECT) saying why.
template <typename Fixture, typename Options>
std::unique_ptr<Fixture> StartOrFail(Options options) {
  auto started = Fixture::Start(std::move(options));
  EXPECT_TRUE(started.ok()) << started.status().ToString();
  return started.ok() ? std::move(started).value() : nullptr;
}

}  // namespace leasehold::internal::redis_test
