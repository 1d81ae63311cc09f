// File: tests/backends/redis/redis_tls_test.cc
//
// rediss:// (TLS over leasehold's own connections, backends/redis/redis_connection.h) against
// real TLS redis-server processes with certificates made by `openssl` in the test
// (tests/testing/redis_server.h, RedisServerOptions::tls): the URL's TLS parameters, a verified
// connection doing the whole lease cycle, and one clear line, with the code the README names,
// for each way TLS can be wrong: another CA, another name, an expired certificate, no client
// certificate where the server asks for one, a plain-text port, unreadable files. The
// conformance suite runs the store over TLS as its `rediss` row.

#include <chrono>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backends/redis/redis_backend.h"
#include "backends/redis/redis_options.h"
#include "core/url.h"
#include "redis_test_util.h"
#include "testing/redis_server.h"

namespace leasehold::internal {
namespace {

using namespace std::chrono_literals;
using leasehold::testing::RedisServer;
using leasehold::testing::RedisServerOptions;

using redis_test::OpenUrl;
using redis_test::Token;

std::unique_ptr<RedisServer> StartTlsServer(RedisServerOptions options = {}) {
  options.tls = true;
  return redis_test::StartOrFail<RedisServer>(std::move(options));
}

Status OpenStatus(const std::string& text) {
  return OpenUrl(text).status();
}

// The message is one line, and says `what`.
void ExpectOneLineSaying(const Status& status, std::string_view what) {
  const std::string text = status.ToString();
  EXPECT_NE(text.find(what), std::string::npos) << text;
  EXPECT_EQ(text.find('\n'), std::string::npos) << text;
}

TEST(RedisTlsOptionsTest, ParsesTheTlsParametersAndRefusesThemOnAPlainUrl) {
  auto url = ParseUrl(
      "rediss://app:pw@redis.example:6380/3?ca=/etc/ca.pem&cert=/c.pem&key=/k.pem&sni=r.internal");
  ASSERT_TRUE(url.ok());
  auto options = RedisOptions::FromUrl(*url);
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_TRUE(options->tls);
  EXPECT_EQ(options->host, "redis.example");
  EXPECT_EQ(options->port, 6380);
  EXPECT_EQ(options->db, 3);
  EXPECT_EQ(options->tls_ca, "/etc/ca.pem");
  EXPECT_EQ(options->tls_cert, "/c.pem");
  EXPECT_EQ(options->tls_key, "/k.pem");
  EXPECT_EQ(options->tls_sni, "r.internal");
  EXPECT_FALSE(options->tls_insecure);

  auto bare = RedisOptions::FromUrl(*ParseUrl("rediss://h"));
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_TRUE(bare->tls);
  EXPECT_TRUE(bare->tls_ca.empty()) << "the system's CAs";
  EXPECT_FALSE(RedisOptions::FromUrl(*ParseUrl("redis://h"))->tls);
  EXPECT_TRUE(RedisOptions::FromUrl(*ParseUrl("rediss://h?insecure=true"))->tls_insecure);

  auto bad = [](const char* text) { return RedisOptions::FromUrl(*ParseUrl(text)).status(); };
  Status plain = bad("redis://h?ca=/etc/ca.pem");
  EXPECT_EQ(plain.code(), StatusCode::kInvalidArgument);
  ExpectOneLineSaying(plain, "rediss://");
  EXPECT_EQ(bad("redis+unix:///s.sock?sni=x").code(), StatusCode::kInvalidArgument);
  Status half = bad("rediss://h?cert=/c.pem");
  EXPECT_EQ(half.code(), StatusCode::kInvalidArgument);
  ExpectOneLineSaying(half, "key=");
  EXPECT_EQ(bad("rediss://h?key=/k.pem").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("rediss://h?insecure=yes").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("rediss://h?ca=").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad("rediss://h?cafile=/x").code(), StatusCode::kInvalidArgument);
}

TEST(RedisTlsTest, AVerifiedConnectionDoesTheWholeLeaseCycle) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  auto backend = OpenUrl(server->TlsUrl("/0?prefix=tls"));
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto grant = (*backend)->TryAcquire({"job", Token('a'), "h", 30s});
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ((*backend)->TryAcquire({"job", Token('b'), "h", 30s}).status().code(),
            StatusCode::kHeldByAnother);
  EXPECT_TRUE((*backend)->Renew({"job", Token('a'), 30s}).ok());
  EXPECT_TRUE((*backend)->Release("job", Token('a')).ok());
  auto next = (*backend)->TryAcquire({"job", Token('b'), "h", 30s});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_GT(next->fencing_token, grant->fencing_token);
  // The name in the certificate (DNS:localhost) is checked as well as its address.
  auto by_name = OpenUrl(fmt::format("rediss://localhost:{}?prefix=tls&ca={}", server->tls_port(),
                                     server->TlsFile("ca.crt")));
  EXPECT_TRUE(by_name.ok()) << by_name.status().ToString();
  // The TLS port speaks nothing else: the plain-text client is not understood there.
  EXPECT_FALSE(
      OpenUrl(fmt::format("redis://127.0.0.1:{}?connect_timeout=500ms", server->tls_port())).ok());
}

TEST(RedisTlsTest, ACertificateOfAnotherCaIsPermissionDeniedInOneLine) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  const std::string url = fmt::format("rediss://127.0.0.1:{}?ca={}", server->tls_port(),
                                      server->TlsFile("other-ca.crt"));
  Status refused = OpenStatus(url);
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused.ToString();
  ExpectOneLineSaying(refused, "certificate is not accepted");
  ExpectOneLineSaying(refused, "other-ca.crt");
  // insecure=true, by that name only, skips verification altogether.
  auto insecure = OpenUrl(url + "&insecure=true");
  EXPECT_TRUE(insecure.ok()) << insecure.status().ToString();
}

TEST(RedisTlsTest, ACertificateForAnotherNameIsPermissionDenied) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  Status refused = OpenStatus(server->TlsUrl("?sni=redis.elsewhere.example"));
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused.ToString();
  ExpectOneLineSaying(refused, "redis.elsewhere.example");
  // An address the certificate does not list.
  Status other_ip = OpenStatus(server->TlsUrl("?sni=127.0.0.2"));
  EXPECT_EQ(other_ip.code(), StatusCode::kPermissionDenied) << other_ip.ToString();
}

TEST(RedisTlsTest, AnExpiredCertificateIsPermissionDeniedSayingSo) {
  auto started = RedisServer::Start({.tls = true, .tls_expired = true});
  if (!started.ok() && started.status().message().find("faketime") != std::string_view::npos) {
    GTEST_SKIP() << started.status().ToString();
  }
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Status refused = OpenStatus((*started)->TlsUrl());
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused.ToString();
  ExpectOneLineSaying(refused, "certificate has expired");
}

TEST(RedisTlsTest, AServerThatAsksForAClientCertificateGetsOursOrRefusesInOneLine) {
  auto server = StartTlsServer({.tls_auth_clients = true});
  ASSERT_NE(server, nullptr);
  Status without = OpenStatus(server->TlsUrl("?connect_timeout=2s"));
  EXPECT_EQ(without.code(), StatusCode::kPermissionDenied) << without.ToString();
  ExpectOneLineSaying(without, "client certificate");
  auto with = OpenUrl(server->TlsUrl(fmt::format("?cert={}&key={}", server->TlsFile("client.crt"),
                                                 server->TlsFile("client.key"))));
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_TRUE((*with)->TryAcquire({"job", Token('a'), "h", 30s}).ok());
  // A key that is not the certificate's is refused before any connection.
  Status mismatched = OpenStatus(server->TlsUrl(
      fmt::format("?cert={}&key={}", server->TlsFile("client.crt"), server->TlsFile("ca.key"))));
  EXPECT_EQ(mismatched.code(), StatusCode::kInvalidArgument) << mismatched.ToString();
  ExpectOneLineSaying(mismatched, "is not the certificate's");
}

TEST(RedisTlsTest, APlainTextPortAndUnreadableFilesAreOneLineEach) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  Status plain = OpenStatus(fmt::format("rediss://127.0.0.1:{}?ca={}&connect_timeout=1s",
                                        server->port(), server->TlsFile("ca.crt")));
  EXPECT_EQ(plain.code(), StatusCode::kUnavailable) << plain.ToString();
  ExpectOneLineSaying(plain, "plain-text");
  Status no_ca =
      OpenStatus(fmt::format("rediss://127.0.0.1:{}?ca=/nonexistent/ca.pem", server->tls_port()));
  EXPECT_EQ(no_ca.code(), StatusCode::kInvalidArgument) << no_ca.ToString();
  ExpectOneLineSaying(no_ca, "/nonexistent/ca.pem");
  Status no_cert = OpenStatus(server->TlsUrl("?cert=/nonexistent/c.pem&key=/nonexistent/k.pem"));
  EXPECT_EQ(no_cert.code(), StatusCode::kInvalidArgument) << no_cert.ToString();
  ExpectOneLineSaying(no_cert, "/nonexistent/c.pem");
}

// A server that accepts the TCP connection but never answers (SIGSTOPped: the kernel completes
// the handshake) costs connect_timeout for the TLS handshake and no more.
TEST(RedisTlsTest, AStoppedServerIsUnavailableAfterTheConnectTimeoutNotAHang) {
  auto server = StartTlsServer();
  ASSERT_NE(server, nullptr);
  server->Pause();
  const auto t0 = std::chrono::steady_clock::now();
  Status stopped = OpenStatus(server->TlsUrl("?connect_timeout=300ms"));
  const auto took = std::chrono::steady_clock::now() - t0;
  server->Resume();
  EXPECT_EQ(stopped.code(), StatusCode::kUnavailable) << stopped.ToString();
  ExpectOneLineSaying(stopped, "connect_timeout");
  // One connect_timeout per step at most (TCP connect, handshake), with room for a busy machine.
  EXPECT_LT(took, 300ms * 2 + 3s);
}

}  // namespace
}  // namespace leasehold::internal
