// Tests specific to the etcd:// store, against real etcd processes started on free loopback
// ports (tests/testing/etcd_server.h): URL parsing, TTL rounding, one keep-alive stream for many
// leases, auth, fenced writes and the fence guard of fencing.h against the key the store really
// wrote, and a three-member cluster losing the member a holder talks to. The generic behaviours
// are in the conformance suite.

#include "backends/etcd/etcd_backend.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "leasehold/check.h"
#include "leasehold/fencing.h"
#include "leasehold/store.h"

#include "backends/etcd/etcd_options.h"
#include "core/store_access.h"
#include "core/url.h"
#include "testing/etcd_server.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;
using internal::EtcdBackend;
using internal::EtcdOptions;
using internal::FencedWriteRequest;
using internal::GrantRequest;
using internal::RenewRequest;
using testing::EtcdCluster;
using testing::EtcdKeyValue;

Result<EtcdOptions> OptionsFor(const std::string& url) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  return EtcdOptions::FromUrl(parsed);
}

std::shared_ptr<EtcdBackend> OpenBackend(const std::string& url) {
  auto options = OptionsFor(url);
  EXPECT_TRUE(options.ok()) << options.status().ToString();
  if (!options.ok()) {
    return nullptr;
  }
  auto backend = EtcdBackend::Open(*options);
  EXPECT_TRUE(backend.ok()) << backend.status().ToString();
  return backend.ok() ? *backend : nullptr;
}

std::string Token(int i) {
  return fmt::format("{:032x}", i + 1);
}

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

TEST(EtcdOptionsTest, ParsesEndpointsPrefixAndTls) {
  auto o = OptionsFor("etcd://a:1,b,[::1]:3?prefix=jobs&command_timeout=500ms");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->endpoints, (std::vector<std::string>{"a:1", "b:2379", "[::1]:3"}));
  EXPECT_EQ(o->prefix, "jobs");
  EXPECT_EQ(o->command_timeout, 500ms);
  EXPECT_FALSE(o->tls);
  auto tls = OptionsFor("etcds://u:p@h:1?ca=/ca.pem&cert=/c.pem&key=/k.pem");
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  EXPECT_TRUE(tls->tls);
  EXPECT_EQ(tls->ca_file, "/ca.pem");
  EXPECT_EQ(*tls->user, "u");
  EXPECT_EQ(*tls->password, "p");
  auto defaults = OptionsFor("etcd://");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->endpoints, (std::vector<std::string>{"127.0.0.1:2379"}));
  EXPECT_EQ(defaults->prefix, "leasehold");
}

TEST(EtcdOptionsTest, RejectsBadUrls) {
  for (const char* url :
       {"etcd://h:1?nope=1", "etcd://h:0", "etcd://h:1?ca=/x.pem", "etcds://h:1?cert=/c.pem",
        "etcd://h:1/path", "etcd://h:1?prefix=", "etcd://h:1?command_timeout=0s", "etcd://h:x"}) {
    auto o = OptionsFor(url);
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << url;
  }
  auto o = OptionsFor("etcd://:secret@h:1");
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o.status().message().find("secret"), std::string_view::npos);
}

TEST(EtcdBackendOpenTest, UnreachableStoreIsUnavailableWithinTheDeadline) {
  int port = testing::PickFreeLoopbackPort({2379, 2380});
  auto start = std::chrono::steady_clock::now();
  auto store = Store::Open(fmt::format("etcd://127.0.0.1:{}?command_timeout=1s", port));
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable) << store.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

// One single-member etcd shared by the tests below; each test uses its own prefix.
class EtcdBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto started = EtcdCluster::Start();
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    cluster_ = std::move(started).value().release();
  }

  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  std::string Url() {
    static std::atomic<int> n{0};
    return fmt::format("{}?prefix=etcd-test-{}-{}", cluster_->Url(), getpid(), ++n);
  }

  static EtcdCluster* cluster_;
};

EtcdCluster* EtcdBackendTest::cluster_ = nullptr;

TEST_F(EtcdBackendTest, GrantedTtlIsWholeSecondsAndAtLeastTheServersMinimum) {
  auto backend = OpenBackend(Url());
  ASSERT_NE(backend, nullptr);
  auto small = backend->TryAcquire({"small", Token(1), "t", 300ms});
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_EQ(small->ttl, 2s) << "etcd raises TTLs below 2 s to 2 s; the reply says so";
  auto odd = backend->TryAcquire({"odd", Token(2), "t", 2500ms});
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->ttl, 3s) << "rounded up to whole seconds";
  auto info = backend->Inspect("odd");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->ttl, 3s);
  EXPECT_EQ((*info)->fencing_token, odd->fencing_token) << "fencing token = create revision";
  EXPECT_GT(odd->fencing_token, small->fencing_token);
}

// Finish keeps a grant by re-putting its key under a lease nobody renews (the create revision,
// so the fencing token, stays) and writes records outside every lease's key: List and Inspect
// never show a record.
TEST_F(EtcdBackendTest, FinishKeepsTheFencingTokenAndRecordsAreNeverListed) {
  auto backend = OpenBackend(Url());
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire({"a", Token(1), "holder-a", 5s}).ok());
  ASSERT_TRUE(
      backend->Finish({.key = "a", .owner_token = Token(1), .record = "ra", .record_ttl = 30s})
          .ok());
  auto b = backend->TryAcquire({"b", Token(2), "holder-b", 5s});
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(backend
                  ->Finish({.key = "b",
                            .owner_token = Token(2),
                            .keep = 2500ms,
                            .record = "rb",
                            .record_ttl = 30s})
                  .ok());
  auto list = backend->List("");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 1u) << "records are not grants";
  EXPECT_EQ((*list)[0].key, "b");
  EXPECT_EQ((*list)[0].holder, "holder-b");
  EXPECT_EQ((*list)[0].fencing_token, b->fencing_token);
  EXPECT_EQ((*list)[0].ttl, 3s) << "the keep, in whole seconds rounded up";
  auto a_info = backend->Inspect("a");
  ASSERT_TRUE(a_info.ok());
  EXPECT_FALSE(a_info->has_value());
  EXPECT_EQ(backend->Renew({"b", Token(2), 5s}).code(), StatusCode::kLost)
      << "nobody renews a kept grant";
  auto ra = backend->ReadRecord("a");
  auto rb = backend->ReadRecord("b");
  ASSERT_TRUE(ra.ok() && ra->has_value() && rb.ok() && rb->has_value());
  EXPECT_EQ(**ra, "ra");
  EXPECT_EQ(**rb, "rb");
  EXPECT_EQ(static_cast<internal::Backend&>(*backend).WallClock()->from_store, false)
      << "etcd has no server wall clock";
}

// "found N leases" from `etcdctl lease list`; -1 if unreadable.
int CountLeases(EtcdCluster& cluster) {
  auto list = cluster.Etcdctl({"lease", "list"});
  if (!list.ok()) {
    return -1;
  }
  std::size_t at = list->find("found ");
  return at == std::string::npos ? -1 : std::atoi(list->c_str() + at + 6);
}

// Polls (at most 2 s) until the cluster has `want` leases; returns the last count.
int AwaitLeaseCount(EtcdCluster& cluster, int want) {
  int leases = -1;
  for (int i = 0; i < 100; ++i) {
    leases = CountLeases(cluster);
    if (leases == want) {
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  return leases;
}

TEST_F(EtcdBackendTest, WithoutSparesConflictsUseTheSharedLeaseAndTheLastReleaseRevokesIt) {
  const int before = CountLeases(*cluster_);
  ASSERT_GE(before, 0);
  auto backend = OpenBackend(Url() + "&spare_lease=false");
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire({"job", Token(1), "t", 30s}).ok());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(backend->TryAcquire({"job", Token(2 + i), "t", 30s}).status().code(),
              StatusCode::kHeldByAnother);
  }
  EXPECT_EQ(AwaitLeaseCount(*cluster_, before + 1), before + 1) << "one shared lease, no orphans";
  EXPECT_EQ(backend->stats().lease_grant, 1u) << "the tries used the holder's shared lease";
  EXPECT_EQ(backend->stats().lease_revoke, 0u);
  ASSERT_TRUE(backend->Release("job", Token(1)).ok());
  // The revoke of the now empty lease is sent without waiting for its reply: give it a moment.
  EXPECT_EQ(AwaitLeaseCount(*cluster_, before), before) << "no spare is kept";
  EXPECT_EQ(backend->stats().lease_revoke, 1u);
}

TEST_F(EtcdBackendTest, WithSparesTheSharedLeaseStaysAsTheSpareAndCloseRevokesIt) {
  const int before = CountLeases(*cluster_);
  ASSERT_GE(before, 0);
  auto backend = OpenBackend(Url());
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire({"job", Token(1), "t", 30s}).ok());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(backend->TryAcquire({"job", Token(2 + i), "t", 30s}).status().code(),
              StatusCode::kHeldByAnother);
  }
  ASSERT_TRUE(backend->TryAcquire({"other", Token(10), "t", 30s}).ok());
  EXPECT_EQ(AwaitLeaseCount(*cluster_, before + 1), before + 1)
      << "both grants and every try on one shared lease";
  ASSERT_TRUE(backend->Release("job", Token(1)).ok());
  ASSERT_TRUE(backend->Release("other", Token(10)).ok());
  EXPECT_EQ(AwaitLeaseCount(*cluster_, before + 1), before + 1) << "kept as the spare";
  ASSERT_TRUE(backend->TryAcquire({"raw", Token(11), "t", 30s}).ok());
  EXPECT_EQ(backend->stats().lease_grant, 1u);
  backend.reset();
  EXPECT_EQ(AwaitLeaseCount(*cluster_, before), before)
      << "closing the handle revokes its shared lease (the raw grant goes with it)";
}

TEST_F(EtcdBackendTest, SpareLeaseKeepsLeaseGrantOffTheAcquirePath) {
  constexpr int kCycles = 20;
  auto backend = OpenBackend(Url());
  ASSERT_NE(backend, nullptr);
  auto warm = backend->TryAcquire({"job", Token(0), "t", 10s});
  ASSERT_TRUE(warm.ok());
  EXPECT_EQ(warm->ttl, 10s) << "a lease granted on the spot reports its full TTL";
  ASSERT_TRUE(backend->Release("job", Token(0)).ok());
  std::this_thread::sleep_for(50ms);  // the background refill arrives
  double range_ms = 0;
  for (int i = 0; i < kCycles; ++i) {  // the floor: a Range of a missing key, one round trip
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(backend->Inspect("missing").ok());
    range_ms += Ms(std::chrono::steady_clock::now() - t0);
  }
  const EtcdBackend::Stats before = backend->stats();
  double acquire_ms = 0;
  double release_ms = 0;
  for (int i = 1; i <= kCycles; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto grant = backend->TryAcquire({"job", Token(i), "t", 10s});
    auto t1 = std::chrono::steady_clock::now();
    ASSERT_TRUE(grant.ok()) << grant.status().ToString();
    EXPECT_LE(grant->ttl, 10s);
    EXPECT_GE(grant->ttl, 6600ms) << "a shared lease is used only while 2/3 of its TTL is left";
    ASSERT_TRUE(backend->Release("job", Token(i)).ok());
    auto t2 = std::chrono::steady_clock::now();
    acquire_ms += Ms(t1 - t0);
    release_ms += Ms(t2 - t1);
    std::this_thread::sleep_for(20ms);
  }
  const EtcdBackend::Stats after = backend->stats();
  const auto used = after.spare_used - before.spare_used;
  std::printf(
      "[ figure ] etcd uncontended try-acquire %.2f ms, release %.2f ms, Range of a "
      "missing key %.2f ms (means of %d); %llu of %d acquires used a spare lease\n",
      acquire_ms / kCycles, release_ms / kCycles, range_ms / kCycles, kCycles,
      static_cast<unsigned long long>(used), kCycles);
  EXPECT_EQ(used, static_cast<std::uint64_t>(kCycles)) << "every acquire used the shared lease";
  EXPECT_EQ(after.lease_grant - before.lease_grant, 0u);
  EXPECT_EQ(after.lease_revoke - before.lease_revoke, 0u) << "a release revokes nothing";
  EXPECT_EQ(after.txn - before.txn, static_cast<std::uint64_t>(2 * kCycles))
      << "one Txn per acquire and one per release";

  // A conflict with a spare at hand is one Txn and no LeaseGrant.
  ASSERT_TRUE(backend->TryAcquire({"held", Token(100), "t", 10s}).ok());
  std::this_thread::sleep_for(50ms);
  const EtcdBackend::Stats c0 = backend->stats();
  EXPECT_EQ(backend->TryAcquire({"held", Token(101), "t", 10s}).status().code(),
            StatusCode::kHeldByAnother);
  const EtcdBackend::Stats c1 = backend->stats();
  EXPECT_EQ(c1.txn - c0.txn, 1u);
  EXPECT_EQ(c1.lease_grant - c0.lease_grant, 0u);
  EXPECT_EQ(c1.lease_revoke - c0.lease_revoke, 0u);
}

TEST_F(EtcdBackendTest, AThousandLeasesAreRenewedOverOneKeepAliveStream) {
  constexpr int kLeases = 1000;
  // Without a spare lease riding along, the counts below are exact.
  auto backend = OpenBackend(Url() + "&spare_lease=false");
  ASSERT_NE(backend, nullptr);
  auto start = std::chrono::steady_clock::now();
  std::vector<RenewRequest> renewals;
  for (int i = 0; i < kLeases; ++i) {
    std::string key = fmt::format("many/{:04}", i);
    auto grant = backend->TryAcquire({key, Token(i), "t", 10s});
    ASSERT_TRUE(grant.ok()) << grant.status().ToString();
    renewals.push_back({key, Token(i), 10s});
  }
  const double acquire_ms = Ms(std::chrono::steady_clock::now() - start);
  const EtcdBackend::Stats before = backend->stats();
  EXPECT_EQ(before.lease_grant, 1u) << "one shared lease for every grant of one TTL";
  EXPECT_EQ(before.txn, static_cast<std::uint64_t>(kLeases));
  constexpr int kRounds = 3;
  double renew_ms = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<Status> results = backend->RenewMany(renewals);
    renew_ms += Ms(std::chrono::steady_clock::now() - t0);
    ASSERT_EQ(results.size(), renewals.size());
    for (const Status& s : results) {
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }
  const EtcdBackend::Stats after = backend->stats();
  EXPECT_EQ(after.keepalive_streams, 1u) << "every renewal went over one stream";
  EXPECT_EQ(after.keepalive_requests - before.keepalive_requests,
            static_cast<std::uint64_t>(kRounds))
      << "one keep-alive per round: the shared lease's";
  EXPECT_EQ(after.keepalive_responses - before.keepalive_responses,
            static_cast<std::uint64_t>(kRounds));
  EXPECT_EQ(after.keepalive_rounds - before.keepalive_rounds, static_cast<std::uint64_t>(kRounds));
  EXPECT_EQ(after.lease_grant, before.lease_grant) << "renewing grants no lease";
  EXPECT_EQ(after.txn - before.txn, static_cast<std::uint64_t>(kRounds * ((kLeases + 127) / 128)))
      << "per round, one check Txn per 128 keys";
  EXPECT_EQ(after.range, before.range) << "renewing reads nothing else";
  std::printf(
      "[ figure ] etcd: %d grants in %.0f ms; %d RenewMany rounds of %d leases: %.1f ms "
      "per round, %llu keep-alive stream(s)\n",
      kLeases, acquire_ms, kRounds, kLeases, renew_ms / kRounds,
      static_cast<unsigned long long>(after.keepalive_streams));
}

TEST_F(EtcdBackendTest, AThousandLeasesOfOneStoreShareOneStreamThroughTheHeartbeat) {
  constexpr int kLeases = 1000;
  auto backend = OpenBackend(Url());
  ASSERT_NE(backend, nullptr);
  auto store = internal::OpenStoreWithBackend(backend);
  std::vector<Lease> leases;
  for (int i = 0; i < kLeases; ++i) {
    auto lease = store->TryAcquire(fmt::format("hb/{:04}", i), {.ttl = 3s});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    leases.push_back(std::move(lease).value());
  }
  // Past the 3 s TTL: every lease lives only because the heartbeat renewed it.
  std::this_thread::sleep_for(4s);
  int valid = 0;
  for (const Lease& lease : leases) {
    valid += lease.valid() ? 1 : 0;
  }
  const EtcdBackend::Stats stats = backend->stats();
  EXPECT_EQ(valid, kLeases);
  EXPECT_EQ(stats.keepalive_streams, 1u);
  EXPECT_GE(stats.keepalive_rounds, 1u);
  EXPECT_EQ(stats.keepalive_requests, stats.keepalive_rounds)
      << "one TTL class: one keep-alive per round, however many leases";
  std::printf(
      "[ figure ] etcd heartbeat, %d leases over 4 s: %llu stream(s), %llu keep-alive "
      "requests in %llu rounds\n",
      kLeases, static_cast<unsigned long long>(stats.keepalive_streams),
      static_cast<unsigned long long>(stats.keepalive_requests),
      static_cast<unsigned long long>(stats.keepalive_rounds));
  for (Lease& lease : leases) {
    EXPECT_TRUE(lease.Release().ok());
  }
}

// Force-releasing one key of a handle that holds three deletes that key only: its shared lease
// lives on, the holder's next round loses that grant and renews the other two.
TEST_F(EtcdBackendTest, ForceReleaseOfOneKeyLosesOnlyThatGrant) {
  auto holder = OpenBackend(Url());
  ASSERT_NE(holder, nullptr);
  std::vector<RenewRequest> renewals;
  std::vector<FencingToken> tokens;
  for (int i = 0; i < 3; ++i) {
    std::string key = fmt::format("job{}", i);
    auto grant = holder->TryAcquire({key, Token(i), "t", 30s});
    ASSERT_TRUE(grant.ok()) << grant.status().ToString();
    tokens.push_back(grant->fencing_token);
    renewals.push_back({key, Token(i), 30s});
  }
  auto other = OpenBackend("etcd://" + holder->options().endpoints.front() +
                           "?prefix=" + holder->options().prefix);
  ASSERT_NE(other, nullptr);
  auto forced = other->ForceRelease("job1");
  ASSERT_TRUE(forced.ok() && *forced) << forced.status().ToString();
  std::vector<Status> renewed = holder->RenewMany(renewals);
  ASSERT_EQ(renewed.size(), 3u);
  EXPECT_TRUE(renewed[0].ok()) << renewed[0].ToString();
  EXPECT_EQ(renewed[1].code(), StatusCode::kLost) << renewed[1].ToString();
  EXPECT_EQ(renewed[1].lost_cause(), LostCause::kStoreSaidNo);
  EXPECT_TRUE(renewed[2].ok()) << renewed[2].ToString();
  for (int i : {0, 2}) {
    auto info = other->Inspect(fmt::format("job{}", i));
    ASSERT_TRUE(info.ok() && info->has_value()) << "the other grants stay in etcd";
    EXPECT_EQ((*info)->fencing_token, tokens[static_cast<std::size_t>(i)]);
  }
  auto again = other->TryAcquire({"job1", Token(9), "t", 30s});
  ASSERT_TRUE(again.ok());
  EXPECT_GT(again->fencing_token, tokens[1]);
  renewed = holder->RenewMany(renewals);
  EXPECT_TRUE(renewed[0].ok() && renewed[2].ok());
  EXPECT_EQ(renewed[1].code(), StatusCode::kLost) << "lost stays lost";
  EXPECT_EQ(holder->Release("job1", Token(1)).code(), StatusCode::kLost);
  auto info = other->Inspect("job1");
  ASSERT_TRUE(info.ok() && info->has_value()) << "the stale release deleted nothing";
  EXPECT_EQ((*info)->fencing_token, again->fencing_token);
}

// A holder of an older leasehold (one etcd lease per grant) learns of a force-release only from
// its keep-alive: the force-release revokes a lease that carried nothing but the deleted key.
TEST_F(EtcdBackendTest, ForceReleaseRevokesALeaseThatCarriedOnlyThatKey) {
  auto admin = OpenBackend(Url());
  ASSERT_NE(admin, nullptr);
  auto granted = cluster_->Etcdctl({"lease", "grant", "60"});
  ASSERT_TRUE(granted.ok()) << granted.status().ToString();
  // "lease 694d7c8a1b2c3d4e granted with TTL(60s)"
  std::istringstream words(*granted);
  std::string word, id;
  words >> word >> id;
  ASSERT_EQ(word, "lease") << *granted;
  const std::string key = admin->options().prefix + "/old-holder-job";
  ASSERT_TRUE(cluster_->Etcdctl({"put", "--lease=" + id, key, "old"}).ok());
  auto forced = admin->ForceRelease("old-holder-job");
  ASSERT_TRUE(forced.ok() && *forced) << forced.status().ToString();
  auto ttl = cluster_->Etcdctl({"lease", "timetolive", id});
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_NE(ttl->find("already expired"), std::string::npos)
      << "the old holder's lease still lives, so its keep-alive would keep saying yes: " << *ttl;
}

// A shared lease that etcd lets expire (nobody sent its keep-alive) takes every grant on it.
TEST_F(EtcdBackendTest, ASharedLeaseThatExpiresLosesEveryGrantOnIt) {
  auto holder = OpenBackend(Url());
  ASSERT_NE(holder, nullptr);
  std::vector<RenewRequest> renewals;
  for (int i = 0; i < 3; ++i) {
    std::string key = fmt::format("job{}", i);
    ASSERT_TRUE(holder->TryAcquire({key, Token(i), "t", 2s}).ok());
    renewals.push_back({key, Token(i), 2s});
  }
  // No renewal for the 2 s TTL, then until etcd's leader has deleted the keys (bounded).
  std::this_thread::sleep_for(2500ms);
  for (int i = 0; i < 50; ++i) {
    auto info = holder->Inspect("job2");
    ASSERT_TRUE(info.ok());
    if (!info->has_value()) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  std::vector<Status> renewed = holder->RenewMany(renewals);
  for (const Status& s : renewed) {
    EXPECT_EQ(s.code(), StatusCode::kLost) << s.ToString();
    EXPECT_EQ(s.lost_cause(), LostCause::kSessionLost);
  }
  // The next acquire grants a fresh lease.
  auto again = holder->TryAcquire({"job0", Token(7), "t", 2s});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(holder->Renew({"job0", Token(7), 2s}).ok());
}

// A grant the core has lost (no renewal confirmed for a whole TTL) while the handle's other
// grants keep their shared lease alive is deleted by the next round, not kept forever.
TEST_F(EtcdBackendTest, AGrantLeftUnrenewedIsDeletedThoughItsLeaseLives) {
  auto holder = OpenBackend(Url());
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(holder->TryAcquire({"kept", Token(1), "t", 2s}).ok());
  ASSERT_TRUE(holder->TryAcquire({"left", Token(2), "t", 2s}).ok());
  const auto start = std::chrono::steady_clock::now();
  bool gone = false;
  for (int i = 0; i < 40 && !gone; ++i) {  // at most ~8 s
    std::this_thread::sleep_for(200ms);
    ASSERT_TRUE(holder->Renew({"kept", Token(1), 2s}).ok()) << "renewed every 200 ms";
    auto info = holder->Inspect("left");
    ASSERT_TRUE(info.ok());
    gone = !info->has_value();
  }
  EXPECT_TRUE(gone) << "the unrenewed grant was deleted";
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1500ms) << "not before its TTL had passed";
  EXPECT_EQ(holder->Renew({"left", Token(2), 2s}).code(), StatusCode::kLost);
  auto info = holder->Inspect("kept");
  ASSERT_TRUE(info.ok() && info->has_value());
}

// A handle that holds nothing runs no renewal rounds, so only its acquires can sweep its lost
// grants; and each acquire refreshes the shared lease that carries them. A lost grant (its
// release never sent, as when it got no answer) must still end about its TTL after its last
// confirmation while the same handle keeps trying for the key, as a holder cut off by a
// partition does: before the sweep on acquire, every try kept the old grant alive and the key
// was never free again (partition_etcd's stall).
TEST_F(EtcdBackendTest, ALostGrantEndsThoughItsHandleKeepsTryingForTheKey) {
  auto holder = OpenBackend(Url());
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(holder->TryAcquire({"hot", Token(1), "t", 2s}).ok());
  const auto start = std::chrono::steady_clock::now();
  Result<internal::Grant> again = Status::Unavailable("not tried");
  for (int i = 0; i < 40; ++i) {  // at most ~8 s
    std::this_thread::sleep_for(200ms);
    again = holder->TryAcquire({"hot", Token(2), "t", 2s});
    if (again.ok()) {
      break;
    }
    ASSERT_EQ(again.status().code(), StatusCode::kHeldByAnother) << again.status().ToString();
  }
  ASSERT_TRUE(again.ok()) << "the lost grant was kept alive by the handle's tries: "
                          << again.status().ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1500ms) << "not before its TTL had passed";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "within its TTL and a few tries";
  EXPECT_EQ(holder->Renew({"hot", Token(1), 2s}).code(), StatusCode::kLost);
  EXPECT_TRUE(holder->Renew({"hot", Token(2), 2s}).ok());
}

TEST_F(EtcdBackendTest, FairQueueAWaiterThatGivesUpLeavesTheQueueAtOnce) {
  const std::string url = Url() + "&fair=true";
  auto a = Store::Open(url);
  auto b = Store::Open(url);
  auto c = Store::Open(url);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto held = (*a)->TryAcquire("job", {.ttl = 30s});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  // b queues first, then gives up; its entry must not hold up c (entries otherwise live 30 s).
  auto gave_up = (*b)->Acquire("job", {.ttl = 30s, .wait = 300ms});
  EXPECT_FALSE(gave_up.ok()) << "the key is held for 30 s";
  Result<Lease> got = Status::Internal("not run");
  std::jthread waiter([&] { got = (*c)->Acquire("job", {.ttl = 30s, .wait = 10s}); });
  std::this_thread::sleep_for(300ms);
  auto barge = (*b)->TryAcquire("job", {.ttl = 30s});
  EXPECT_EQ(barge.status().code(), StatusCode::kHeldByAnother);
  auto released_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(held->Release().ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - released_at, 5s)
      << "c waited for b's abandoned entry to expire";
  EXPECT_TRUE(got->Release().ok());
  auto free_again = (*b)->TryAcquire("job", {.ttl = 30s});
  EXPECT_TRUE(free_again.ok()) << "the queue is empty again: " << free_again.status().ToString();
}

// Shared leases: the keys the store writes for them (backends/etcd/etcd_backend.cc, "Shared
// leases"). A semaphore grant is "<prefix>/<key>\0n/<limit>/<slot>", each on the handle's
// shared etcd lease; its fencing token is that key's create revision.
GrantRequest Semaphore(std::string key, int token, std::uint32_t limit) {
  GrantRequest r{std::move(key), Token(token), fmt::format("sem-{}", token), 30s};
  r.limit = limit;
  return r;
}

GrantRequest Shared(std::string key, int token, std::string waiter = {}) {
  GrantRequest r{std::move(key), Token(token), fmt::format("reader-{}", token), 30s,
                 std::move(waiter)};
  r.mode = LeaseMode::kShared;
  return r;
}

std::string Nul(std::string_view a, std::string_view b) {
  std::string s(a);
  s += '\0';
  s += b;
  return s;
}

// The keys of the lease `base` named `key` (etcdctl, reached through a shell, cannot be given a
// key with a NUL: this reads the lease's prefix and picks).
std::vector<EtcdKeyValue> KeysNamed(EtcdCluster& cluster, const std::string& base,
                                    const std::string& key) {
  std::vector<EtcdKeyValue> out;
  auto kvs = cluster.Get(base, /*prefix=*/true);
  EXPECT_TRUE(kvs.ok()) << kvs.status().ToString();
  if (kvs.ok()) {
    for (EtcdKeyValue& kv : *kvs) {
      if (kv.key == key) {
        out.push_back(std::move(kv));
      }
    }
  }
  return out;
}

TEST_F(EtcdBackendTest, SemaphoreGrantsAreSlotKeysAdmittedByOneTxn) {
  auto backend = OpenBackend(Url());
  ASSERT_NE(backend, nullptr);
  const std::string base = backend->options().prefix + "/job";
  std::vector<FencingToken> tokens;
  for (int i = 0; i < 3; ++i) {
    const EtcdBackend::Stats before = backend->stats();
    auto grant = backend->TryAcquire(Semaphore("job", i, 3));
    ASSERT_TRUE(grant.ok()) << grant.status().ToString();
    EXPECT_EQ(grant->slot, static_cast<std::uint32_t>(i));
    EXPECT_EQ(grant->store_key, Nul(base, fmt::format("n/0003/{:04}", i)));
    // Slot 0 first; a taken slot fails that Txn whole and the next Txn takes the free one read.
    EXPECT_EQ(backend->stats().txn - before.txn, i == 0 ? 1u : 2u);
    tokens.push_back(grant->fencing_token);
  }
  EXPECT_LT(tokens[0], tokens[1]);
  EXPECT_LT(tokens[1], tokens[2]);
  auto kvs = cluster_->Get(base, /*prefix=*/true);
  ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
  ASSERT_EQ(kvs->size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const EtcdKeyValue& kv = (*kvs)[static_cast<std::size_t>(i)];
    EXPECT_EQ(kv.key, Nul(base, fmt::format("n/0003/{:04}", i)));
    EXPECT_EQ(static_cast<FencingToken>(kv.create_revision), tokens[static_cast<std::size_t>(i)]);
    EXPECT_NE(kv.lease, 0);
    EXPECT_EQ(kv.lease, (*kvs)[0].lease) << "every grant of the handle on one shared lease";
  }
  auto full = backend->TryAcquire(Semaphore("job", 9, 3));
  EXPECT_EQ(full.status().code(), StatusCode::kHeldByAnother) << full.status().ToString();
  ASSERT_NE(full.status().holder(), nullptr);
  EXPECT_EQ(full.status().holder()->slot, 0u) << "the holder of the lowest slot";
  EXPECT_EQ(full.status().holder()->holder, "sem-0");
  EXPECT_EQ(backend->TryAcquire(Semaphore("job", 10, 4)).status().code(),
            StatusCode::kInvalidArgument)
      << "another limit";
  EXPECT_EQ(backend->TryAcquire({"job", Token(11), "x", 30s}).status().code(),
            StatusCode::kInvalidArgument)
      << "an exclusive request on a semaphore key";
  // Slot 1 freed: the next grant takes it, under a higher token.
  ASSERT_TRUE(backend->Release("job", Token(1)).ok());
  auto again = backend->TryAcquire(Semaphore("job", 12, 3));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->slot, 1u);
  EXPECT_GT(again->fencing_token, tokens[2]);
  // Renewal addresses each grant by its own key.
  std::vector<RenewRequest> renewals = {
      {"job", Token(0), 30s}, {"job", Token(12), 30s}, {"job", Token(2), 30s}};
  for (const Status& s : backend->RenewMany(renewals)) {
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  auto holders = backend->Holders("job");
  ASSERT_TRUE(holders.ok()) << holders.status().ToString();
  ASSERT_EQ(holders->size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*holders)[i].slot, i);
    EXPECT_EQ((*holders)[i].limit, 3u);
  }
  EXPECT_EQ((*holders)[1].holder, "sem-12");
}

TEST_F(EtcdBackendTest, AWaitingWritersIntentKeepsNewReadersOutAndGoesWhenItIsGranted) {
  auto backend = OpenBackend(Url());
  ASSERT_NE(backend, nullptr);
  const std::string base = backend->options().prefix + "/doc";
  auto r0 = backend->TryAcquire(Shared("doc", 0));
  auto r1 = backend->TryAcquire(Shared("doc", 1));
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ(r0->store_key, Nul(base, "s/0000"));
  EXPECT_EQ(r1->store_key, Nul(base, "s/0001"));
  EXPECT_EQ(r1->slot, 1u);
  GrantRequest writer{"doc", Token(5), "writer", 30s, "waiter-5"};
  auto refused = backend->TryAcquire(writer);
  EXPECT_EQ(refused.status().code(), StatusCode::kHeldByAnother);
  ASSERT_NE(refused.status().holder(), nullptr);
  EXPECT_EQ(refused.status().holder()->holder, "reader-0");
  auto intent = KeysNamed(*cluster_, base, Nul(base, "w"));
  ASSERT_EQ(intent.size(), 1u) << "the refused writer's intent, in the same Txn's failure branch";
  auto reader_kv = KeysNamed(*cluster_, base, r0->store_key);
  ASSERT_EQ(reader_kv.size(), 1u);
  EXPECT_NE(intent[0].lease, reader_kv[0].lease) << "on the waiter's own etcd lease";
  auto reader = backend->TryAcquire(Shared("doc", 2));
  EXPECT_EQ(reader.status().code(), StatusCode::kHeldByAnother);
  ASSERT_NE(reader.status().holder(), nullptr);
  EXPECT_EQ(reader.status().holder()->holder, "writer") << reader.status().ToString();
  EXPECT_EQ(
      backend->TryAcquire(GrantRequest{"doc", Token(6), "w2", 30s, "waiter-6"}).status().code(),
      StatusCode::kHeldByAnother);
  intent = KeysNamed(*cluster_, base, Nul(base, "w"));
  ASSERT_EQ(intent.size(), 1u);
  EXPECT_NE(intent[0].value.find("\nwriter"), std::string::npos) << "still the first writer's";
  ASSERT_TRUE(backend->Release("doc", Token(0)).ok());
  ASSERT_TRUE(backend->Release("doc", Token(1)).ok());
  auto granted = backend->TryAcquire(writer);
  ASSERT_TRUE(granted.ok()) << granted.status().ToString();
  EXPECT_EQ(granted->store_key, base) << "an exclusive grant is the key of every version";
  EXPECT_GT(granted->fencing_token, r1->fencing_token);
  EXPECT_TRUE(KeysNamed(*cluster_, base, Nul(base, "w")).empty())
      << "the intent went with the grant";
  ASSERT_TRUE(backend->Release("doc", Token(5)).ok());
  EXPECT_TRUE(backend->TryAcquire(Shared("doc", 3)).ok()) << "no intent left behind";
}

// A grant written by an older leasehold (its own etcd lease, the key "<prefix>/<key>") is an
// exclusive grant to this one: shared requests wait for it, semaphores are refused.
TEST_F(EtcdBackendTest, AnOlderClientsGrantIsExclusive) {
  auto backend = OpenBackend(Url());
  ASSERT_NE(backend, nullptr);
  auto granted = cluster_->Etcdctl({"lease", "grant", "60"});
  ASSERT_TRUE(granted.ok()) << granted.status().ToString();
  std::istringstream words(*granted);
  std::string word, id;
  words >> word >> id;
  ASSERT_EQ(word, "lease") << *granted;
  const std::string key = backend->options().prefix + "/old-job";
  ASSERT_TRUE(
      cluster_->Etcdctl({"put", "--lease=" + id, key, "v1\n" + Token(1) + "\n60000\nold-holder"})
          .ok());
  auto shared = backend->TryAcquire(Shared("old-job", 2));
  EXPECT_EQ(shared.status().code(), StatusCode::kHeldByAnother);
  ASSERT_NE(shared.status().holder(), nullptr);
  EXPECT_EQ(shared.status().holder()->holder, "old-holder");
  EXPECT_EQ(backend->TryAcquire(Semaphore("old-job", 3, 2)).status().code(),
            StatusCode::kInvalidArgument);
  auto info = backend->Inspect("old-job");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->mode, LeaseMode::kExclusive);
  EXPECT_EQ((*info)->limit, 1u);
  auto forced = backend->ForceRelease("old-job");
  ASSERT_TRUE(forced.ok() && *forced) << forced.status().ToString();
  auto ttl = cluster_->Etcdctl({"lease", "timetolive", id});
  ASSERT_TRUE(ttl.ok());
  EXPECT_NE(ttl->find("already expired"), std::string::npos) << "its lease revoked too: " << *ttl;
}

// ForceReleaseGrant deletes one slot's key: that holder's next round loses it, the others stay.
TEST_F(EtcdBackendTest, ForceReleaseGrantDeletesOneSlotAndListShowsEverySlot) {
  auto holder = OpenBackend(Url());
  ASSERT_NE(holder, nullptr);
  // Tokens whose first 8 digits (LeaseInfo::token_prefix) differ.
  const auto token = [](int i) { return fmt::format("{:08x}{:024x}", i + 1, 0); };
  for (int i = 0; i < 3; ++i) {
    GrantRequest r = Semaphore("pool", i, 4);
    r.owner_token = token(i);
    ASSERT_TRUE(holder->TryAcquire(r).ok());
  }
  ASSERT_TRUE(holder->TryAcquire({"pool2", Token(7), "x", 30s}).ok());
  auto list = holder->List("pool");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 4u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*list)[i].key, "pool");
    EXPECT_EQ((*list)[i].slot, i);
    EXPECT_EQ((*list)[i].limit, 4u);
  }
  EXPECT_EQ((*list)[3].key, "pool2");
  auto forced = holder->ForceReleaseGrant("pool", token(1).substr(0, 8));
  ASSERT_TRUE(forced.ok() && *forced) << forced.status().ToString();
  std::vector<RenewRequest> renewals = {
      {"pool", token(0), 30s}, {"pool", token(1), 30s}, {"pool", token(2), 30s}};
  std::vector<Status> renewed = holder->RenewMany(renewals);
  EXPECT_TRUE(renewed[0].ok()) << renewed[0].ToString();
  EXPECT_EQ(renewed[1].code(), StatusCode::kLost) << renewed[1].ToString();
  EXPECT_TRUE(renewed[2].ok()) << renewed[2].ToString();
  auto holders = holder->Holders("pool");
  ASSERT_TRUE(holders.ok() && holders->size() == 2u);
  EXPECT_EQ((*holders)[1].slot, 2u);
  auto all = holder->ForceRelease("pool");
  ASSERT_TRUE(all.ok() && *all);
  holders = holder->Holders("pool");
  ASSERT_TRUE(holders.ok());
  EXPECT_TRUE(holders->empty());
  auto other = holder->Inspect("pool2");
  ASSERT_TRUE(other.ok() && other->has_value()) << "another key's grant stays";
}

TEST_F(EtcdBackendTest, WaitForChangeHonoursDeadlineAndStop) {
  auto backend = OpenBackend(Url());
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->TryAcquire({"job", Token(1), "t", 30s}).ok());
  auto t0 = std::chrono::steady_clock::now();
  Status s = backend->WaitForChange("job", Clock::Real().Now() + 300ms, {});
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_GE(Ms(std::chrono::steady_clock::now() - t0), 250);
  std::stop_source stop;
  std::jthread stopper([&] {
    std::this_thread::sleep_for(200ms);
    stop.request_stop();
  });
  s = backend->WaitForChange("job", Clock::Real().Now() + 30s, stop.get_token());
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_TRUE(backend->WaitForChange("free-key", Clock::Real().Now() + 30s, {}).ok())
      << "a free key returns at once";
}

// The prefix= parameter of an etcd:// URL.
std::string PrefixOf(const std::string& url) {
  const std::size_t at = url.find("prefix=") + 7;
  return url.substr(at, url.find('&', at) - at);
}

// A fenced write's Txn compares the grant key's create revision: the grant's own token passes
// any number of times; a lower one (a grant that was replaced) and any other number are refused,
// and the newer holder's higher token passes.
TEST_F(EtcdBackendTest, FencedWriteAcceptsOnlyTheCurrentGrantsToken) {
  auto a = OpenBackend(Url());
  ASSERT_NE(a, nullptr);
  const std::string prefix = a->options().prefix;
  const std::string data = fmt::format("data-{}/register", prefix);
  auto first = a->TryAcquire({"job", Token(1), "holder-a", 30s});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->store_key, prefix + "/job");
  auto write = [&](FencingToken token, const std::string& value) {
    return a->FencedWrite({.key = "job",
                           .owner_token = Token(1),
                           .fencing_token = token,
                           .store_key = prefix + "/job",
                           .ops = {{.kind = FencedOp::Kind::kPut, .key = data, .value = value}}});
  };
  for (int i = 0; i < 5; ++i) {
    auto done = write(first->fencing_token, fmt::format("a{}", i));
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_EQ(*done, std::vector<std::int64_t>{1});
  }
  auto kvs = cluster_->Get(data);
  ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
  ASSERT_EQ(kvs->size(), 1u);
  EXPECT_EQ((*kvs)[0].value, "a4");
  EXPECT_EQ((*kvs)[0].lease, 0) << "data carries no etcd lease: it outlives the grant";
  EXPECT_EQ(write(first->fencing_token + 1, "not-a-grant").status().code(), StatusCode::kLost)
      << "a token that is not the grant's create revision is no fence";

  // The grant is replaced: a lower token is refused, naming the new holder; the higher passes.
  ASSERT_TRUE(a->ForceRelease("job").ok());
  auto b = OpenBackend(cluster_->Url() + "?prefix=" + prefix);
  ASSERT_NE(b, nullptr);
  auto second = b->TryAcquire({"job", Token(2), "holder-b", 30s});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_GT(second->fencing_token, first->fencing_token);
  auto stale = write(first->fencing_token, "stale");
  ASSERT_EQ(stale.status().code(), StatusCode::kLost) << stale.status().ToString();
  EXPECT_NE(stale.status().message().find(fmt::format(
                "is now held by holder-b under fencing token {}", second->fencing_token)),
            std::string_view::npos)
      << stale.status().message();
  auto newer = b->FencedWrite({.key = "job",
                               .owner_token = Token(2),
                               .fencing_token = second->fencing_token,
                               .store_key = second->store_key,
                               .ops = {{.kind = FencedOp::Kind::kPut, .key = data, .value = "b"},
                                       {.kind = FencedOp::Kind::kDelete, .key = data + "-x"}}});
  ASSERT_TRUE(newer.ok()) << newer.status().ToString();
  EXPECT_EQ(*newer, (std::vector<std::int64_t>{1, 0}));
  ASSERT_TRUE(b->Release("job", Token(2)).ok());
  auto released =
      b->FencedWrite({.key = "job",
                      .owner_token = Token(2),
                      .fencing_token = second->fencing_token,
                      .ops = {{.kind = FencedOp::Kind::kPut, .key = data, .value = "x"}}});
  ASSERT_EQ(released.status().code(), StatusCode::kLost);
  EXPECT_NE(released.status().message().find("is no longer held"), std::string_view::npos)
      << released.status().message();
  // Token 0 would compare "the grant key is absent", which it now is: refused before sending.
  auto zero = b->FencedWrite({.key = "job",
                              .owner_token = Token(2),
                              .fencing_token = 0,
                              .ops = {{.kind = FencedOp::Kind::kPut, .key = data, .value = "0"}}});
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument) << zero.status().ToString();
  kvs = cluster_->Get(data);
  ASSERT_TRUE(kvs.ok() && kvs->size() == 1u);
  EXPECT_EQ((*kvs)[0].value, "b") << "no refused write changed anything";

  // The chaos harness's negative control: without the compare, the stale write lands.
  auto unguarded = write(first->fencing_token, "unguarded");
  EXPECT_EQ(unguarded.status().code(), StatusCode::kLost);
  FencedWriteRequest control{.key = "job",
                             .owner_token = Token(1),
                             .fencing_token = first->fencing_token,
                             .ops = {{.kind = FencedOp::Kind::kPut, .key = data, .value = "u"}},
                             .skip_guard_for_testing = true};
  ASSERT_TRUE(a->FencedWrite(control).ok());
  kvs = cluster_->Get(data);
  ASSERT_TRUE(kvs.ok() && kvs->size() == 1u);
  EXPECT_EQ((*kvs)[0].value, "u");
}

// The store's own keys are not data: a put there could forge or delete a grant (the fair queue's
// entries included). A key put twice (which etcd refuses in one Txn) is refused before sending.
TEST_F(EtcdBackendTest, FencedWriteRefusesTheStoresOwnKeysAndLeavesTheLeaseHeld) {
  const std::string url = Url() + "&fair=true";
  auto store = Store::Open(url);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto lease = (*store)->TryAcquire("job", {.ttl = 30s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const std::string prefix = PrefixOf(url);
  ASSERT_EQ(lease->store_key(), prefix + "/job");
  std::string queue_key = prefix;
  queue_key += '\0';
  queue_key += "queue/job";
  queue_key += '\0';
  queue_key += "someone";
  for (const std::string& own : {lease->store_key(), prefix + "/other", prefix + "/", queue_key}) {
    auto put = lease->Write(FencedWrite().Put(own, "forged"));
    EXPECT_EQ(put.status().code(), StatusCode::kInvalidArgument) << put.status().ToString();
    auto del = lease->Write(FencedWrite().Put("fine-" + prefix, "v").Delete(own));
    EXPECT_EQ(del.status().code(), StatusCode::kInvalidArgument) << del.status().ToString();
  }
  auto twice = lease->Write(FencedWrite().Put("k-" + prefix, "1").Put("k-" + prefix, "2"));
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument) << twice.status().ToString();
  auto put_delete = lease->Write(FencedWrite().Delete("k-" + prefix).Put("k-" + prefix, "2"));
  EXPECT_EQ(put_delete.status().code(), StatusCode::kInvalidArgument);
  auto delete_twice = lease->Write(FencedWrite().Delete("k-" + prefix).Delete("k-" + prefix));
  ASSERT_TRUE(delete_twice.ok()) << delete_twice.status().ToString();
  EXPECT_EQ(delete_twice->affected, (std::vector<std::int64_t>{0, 0}));
  auto all = cluster_->Get(prefix + "/", /*prefix=*/true);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 1u) << "only the grant: nothing was written";
  EXPECT_EQ((*all)[0].key, lease->store_key());
  auto fine = cluster_->Get("fine-" + prefix);
  ASSERT_TRUE(fine.ok());
  EXPECT_TRUE(fine->empty()) << "no op of a refused write is applied";
  EXPECT_TRUE(lease->valid());
  EXPECT_TRUE(lease->Write(FencedWrite().Put("fine-" + prefix, "ok")).ok());
  EXPECT_TRUE(lease->Release().ok());
}

std::string Base64(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (unsigned char c : in) {
    bits = (bits << 8) | c;
    count += 8;
    while (count >= 6) {
      count -= 6;
      out += kAlphabet[(bits >> count) & 63];
    }
  }
  if (count > 0) {
    out += kAlphabet[(bits << (6 - count)) & 63];
  }
  while (out.size() % 4 != 0) {
    out += '=';
  }
  return out;
}

// POSTs a Txn to etcd's JSON gateway: if `guard`, then put `data_key` = `value`. Returns the
// gateway's answer.
Result<std::string> GatewayTxn(const EtcdCluster& cluster, const EtcdFenceGuard& guard,
                               const std::string& data_key, const std::string& value) {
  const std::string body =
      fmt::format(R"({{"compare":[{}],"success":[{{"request_put":{{"key":"{}","value":"{}"}}}}]}})",
                  guard.ToJson(), Base64(data_key), Base64(value));
  return testing::RunCommand(
      fmt::format("timeout 5 curl -s -X POST {} -d {}",
                  testing::ShellQuote("http://" + cluster.Endpoint(0) + "/v3/kv/txn"),
                  testing::ShellQuote(body)));
}

// The issue's requirement: the guard fencing.h builds from a real Lease compares the key the
// store really wrote (read back with etcdctl, not through leasehold), and a Txn of another etcd
// client carrying it commits for the holder and not after the key was taken over.
TEST_F(EtcdBackendTest, TheFenceGuardOfARealLeaseComparesTheKeyTheStoreWrote) {
  const std::string url = Url();
  auto store = Store::Open(url);
  auto other = Store::Open(url);
  ASSERT_TRUE(store.ok() && other.ok());
  auto lease = (*store)->TryAcquire("jobs/nightly", {.ttl = 30s, .holder = "holder-a"});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  auto guard = MakeEtcdFenceGuard(*lease);
  ASSERT_TRUE(guard.ok()) << guard.status().ToString();
  EXPECT_EQ(guard->lease_key, lease->store_key());
  EXPECT_EQ(guard->create_revision, static_cast<std::int64_t>(lease->fencing_token()));

  const std::string prefix = PrefixOf(url);
  auto written = cluster_->Get(prefix + "/", /*prefix=*/true);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  ASSERT_EQ(written->size(), 1u) << "the store wrote one key: the grant";
  EXPECT_EQ((*written)[0].key, guard->lease_key) << "the guard compares the key the store wrote";
  EXPECT_EQ((*written)[0].create_revision, guard->create_revision)
      << "the fencing token is that key's create revision";
  EXPECT_NE((*written)[0].lease, 0) << "the grant lives on an etcd lease";

  const std::string data = "gateway-" + prefix;
  auto holder_txn = GatewayTxn(*cluster_, *guard, data, "from-holder");
  ASSERT_TRUE(holder_txn.ok()) << holder_txn.status().ToString();
  EXPECT_NE(holder_txn->find("\"succeeded\":true"), std::string::npos) << *holder_txn;
  auto read = cluster_->Get(data);
  ASSERT_TRUE(read.ok() && read->size() == 1u);
  EXPECT_EQ((*read)[0].value, "from-holder");

  // An operator takes the key from the holder; a new holder gets it with a higher token.
  auto forced = (*other)->ForceRelease("jobs/nightly");
  ASSERT_TRUE(forced.ok() && *forced) << forced.status().ToString();
  auto newer = (*other)->TryAcquire("jobs/nightly", {.ttl = 30s, .holder = "holder-b"});
  ASSERT_TRUE(newer.ok()) << newer.status().ToString();
  ASSERT_GT(newer->fencing_token(), lease->fencing_token());
  auto stale_txn = GatewayTxn(*cluster_, *guard, data, "stale");
  ASSERT_TRUE(stale_txn.ok()) << stale_txn.status().ToString();
  EXPECT_NE(stale_txn->find("\"header\""), std::string::npos) << "an answer, not an error";
  EXPECT_EQ(stale_txn->find("\"succeeded\":true"), std::string::npos)
      << "the stale guard's Txn must fail: " << *stale_txn;
  read = cluster_->Get(data);
  ASSERT_TRUE(read.ok() && read->size() == 1u);
  EXPECT_EQ((*read)[0].value, "from-holder") << "the stale Txn wrote nothing";
  // Lease::Write refuses the old lease too, and the new lease's guard commits.
  EXPECT_EQ(lease->Write(FencedWrite().Put(data, "stale")).status().code(), StatusCode::kLost);
  auto new_guard = MakeEtcdFenceGuard(*newer);
  ASSERT_TRUE(new_guard.ok());
  auto newer_txn = GatewayTxn(*cluster_, *new_guard, data, "from-newer");
  ASSERT_TRUE(newer_txn.ok());
  EXPECT_NE(newer_txn->find("\"succeeded\":true"), std::string::npos) << *newer_txn;
  EXPECT_TRUE(newer->Release().ok());
}

// Auth on: a user with a role on the prefix works; one without gets a clear permission error;
// a wrong password is refused clearly and never retried in a tight loop.
TEST(EtcdAuthTest, PermissionsAndWrongPasswords) {
  auto started = EtcdCluster::Start();
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  EtcdCluster& cluster = **started;
  ASSERT_TRUE(cluster.EnableAuth("rootpw").ok());
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"user", "add", "app:apppw"},
           {"user", "add", "nobody:nopw"},
           {"role", "add", "app-role"},
           {"role", "grant-permission", "app-role", "--prefix=true", "readwrite", "apps/"},
           {"user", "grant-role", "app", "app-role"}}) {
    auto out = cluster.Etcdctl(args);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
  }
  const std::string hosts = cluster.Endpoints();

  auto app = Store::Open(fmt::format("etcd://app:apppw@{}?prefix=apps", hosts));
  ASSERT_TRUE(app.ok()) << app.status().ToString();
  auto lease = (*app)->TryAcquire("job", {.ttl = 5s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_TRUE(lease->Release().ok());
  {
    // Kept grants and records live under the user's prefix too.
    auto finishing = OpenBackend(fmt::format("etcd://app:apppw@{}?prefix=apps", hosts));
    ASSERT_NE(finishing, nullptr);
    ASSERT_TRUE(finishing->TryAcquire({"slot", Token(7), "t", 5s}).ok());
    Status finished = finishing->Finish(
        {.key = "slot", .owner_token = Token(7), .keep = 2s, .record = "r", .record_ttl = 10s});
    EXPECT_TRUE(finished.ok()) << finished.ToString();
    auto record = finishing->ReadRecord("slot");
    ASSERT_TRUE(record.ok()) << record.status().ToString();
    EXPECT_EQ(record->value_or(""), "r");
  }

  {
    // A fenced write needs read on the grant key and write on its data keys.
    auto store = Store::Open(fmt::format("etcd://app:apppw@{}?prefix=apps", hosts));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto held = (*store)->TryAcquire("fenced", {.ttl = 5s});
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    auto denied = held->Write(FencedWrite().Put("appdata/x", "v"));
    ASSERT_EQ(denied.status().code(), StatusCode::kPermissionDenied) << denied.status().ToString();
    EXPECT_NE(denied.status().message().find("'appdata/x'"), std::string_view::npos)
        << denied.status().message();
    EXPECT_NE(denied.status().message().find("'apps/fenced'"), std::string_view::npos)
        << denied.status().message();
    std::printf("[ message ] %s\n", denied.status().ToString().c_str());
    ASSERT_TRUE(cluster
                    .Etcdctl({"role", "grant-permission", "app-role", "--prefix=true", "readwrite",
                              "appdata/"})
                    .ok());
    auto allowed = held->Write(FencedWrite().Put("appdata/x", "v"));
    EXPECT_TRUE(allowed.ok()) << allowed.status().ToString();
    EXPECT_TRUE(held->valid());
    EXPECT_TRUE(held->Release().ok());
  }

  auto nobody = Store::Open(fmt::format("etcd://nobody:nopw@{}?prefix=apps", hosts));
  ASSERT_EQ(nobody.status().code(), StatusCode::kPermissionDenied) << nobody.status().ToString();
  EXPECT_NE(nobody.status().message().find("permission"), std::string_view::npos)
      << nobody.status().ToString();

  auto anonymous = Store::Open(fmt::format("etcd://{}?prefix=apps", hosts));
  ASSERT_EQ(anonymous.status().code(), StatusCode::kPermissionDenied)
      << anonymous.status().ToString();
  EXPECT_NE(anonymous.status().message().find("permission"), std::string_view::npos);

  auto start = std::chrono::steady_clock::now();
  auto wrong = Store::Open(fmt::format("etcd://app:wrong@{}?prefix=apps", hosts));
  ASSERT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("password"), std::string_view::npos);
  EXPECT_EQ(wrong.status().ToString().find("wrong@"), std::string::npos) << "no password shown";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);

  // The password changes under a running handle: its token is invalidated, the re-Authenticate
  // is refused, and 2 s of calls in a loop make only a few Authenticate calls (backoff).
  auto backend = OpenBackend(fmt::format("etcd://app:apppw@{}?prefix=apps", hosts));
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->Inspect("job").ok());
  const std::uint64_t auth_before = backend->stats().authenticate;
  auto changed = testing::RunCommand(fmt::format(
      "echo newpw | ETCDCTL_API=3 timeout 10 /usr/bin/etcdctl --endpoints={} --user=root:rootpw "
      "user passwd app --interactive=false",
      hosts));
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  int calls = 0;
  int refused = 0;
  Status last;
  auto loop_start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - loop_start < 2s && calls < 10000) {
    auto r = backend->Inspect("job");
    ++calls;
    if (r.status().code() == StatusCode::kPermissionDenied) {
      ++refused;
      last = r.status();
    }
    std::this_thread::sleep_for(1ms);
  }
  const std::uint64_t auth_calls = backend->stats().authenticate - auth_before;
  std::printf(
      "[ figure ] etcd wrong password after a change: %d calls in 2 s, %d refused, %llu "
      "Authenticate calls\n",
      calls, refused, static_cast<unsigned long long>(auth_calls));
  EXPECT_GT(refused, 0) << "the changed password must be noticed";
  EXPECT_NE(last.message().find("password"), std::string_view::npos) << last.ToString();
  EXPECT_LE(auth_calls, 4u) << "Authenticate is retried with backoff, never in a tight loop";
}

// etcds://: TLS with the CA given by ca=, and a client certificate (cert=, key=) when the
// members require one.
TEST(EtcdTlsTest, EtcdsUrlsTalkTlsWithClientCertificates) {
  auto started = EtcdCluster::Start({.tls = true, .client_cert_auth = true});
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  EtcdCluster& cluster = **started;
  const std::string url =
      fmt::format("{}?prefix=tls&ca={}&cert={}&key={}", cluster.Url(), cluster.CertPath("ca.pem"),
                  cluster.CertPath("client.pem"), cluster.CertPath("client-key.pem"));
  auto store = Store::Open(url);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto lease = (*store)->TryAcquire("job", {.ttl = 3s});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_TRUE(lease->Release().ok());

  auto no_client_cert = Store::Open(fmt::format("{}?prefix=tls&ca={}&command_timeout=1s",
                                                cluster.Url(), cluster.CertPath("ca.pem")));
  EXPECT_FALSE(no_client_cert.ok()) << "the members require a client certificate";
  auto plaintext =
      Store::Open(fmt::format("etcd://{}?prefix=tls&command_timeout=1s", cluster.Endpoints()));
  EXPECT_EQ(plaintext.status().code(), StatusCode::kUnavailable) << plaintext.status().ToString();
  auto missing = Store::Open(fmt::format("{}?ca=/nonexistent/ca.pem", cluster.Url()));
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument) << missing.status().ToString();
}

// Three members on loopback. The holder's first endpoint is the victim (the raft leader, or a
// follower); it is killed with SIGKILL (or paused with SIGSTOP) while the lease is held. The
// holder either keeps its lease through the failover or is told it lost it before anyone else
// can take the key, never both; once the cluster has recovered, a new holder gets a higher
// fencing token.
// The victim is the leader or a follower, killed with SIGKILL or paused with SIGSTOP (a member
// that stops answering without closing its connections: only deadlines notice).
// The store doctor's view of a three-member cluster: Ping is one Range, Diagnose counts the
// members, names the leader, and says when the URL's endpoints are fewer than a quorum.
const CheckItem* FindItem(const internal::Diagnosis& d, std::string_view area,
                          std::string_view contains) {
  for (const CheckItem& item : d.items) {
    if (item.area == area && item.found.find(contains) != std::string::npos) {
      return &item;
    }
  }
  return nullptr;
}

std::string Items(const internal::Diagnosis& d) {
  std::string out;
  for (const CheckItem& item : d.items) {
    out += fmt::format("  {} {} {} | {}\n", item.area, CheckVerdictName(item.verdict), item.found,
                       item.fix);
  }
  return out;
}

TEST(EtcdDiagnoseTest, ThreeMembersAndTheEndpointsThatReachThem) {
  auto started = EtcdCluster::Start({.members = 3});
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  EtcdCluster& cluster = **started;
  const std::string query = fmt::format("?prefix=diagnose-{}&command_timeout=2s", getpid());

  auto one = OpenBackend(fmt::format("etcd://{}{}", cluster.Endpoint(1), query));
  ASSERT_NE(one, nullptr);
  EXPECT_TRUE(one->Ping().ok());
  const std::uint64_t ranges = one->stats().range;
  EXPECT_TRUE(one->Ping().ok());
  EXPECT_EQ(one->stats().range, ranges + 1) << "Ping is exactly one Range";
  auto d = one->Diagnose();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  std::printf("[ figure ] Diagnose of one endpoint of three:\n%s", Items(*d).c_str());
  EXPECT_EQ(d->probe, "Range (missing key)");
  EXPECT_EQ(d->ttl_granularity, 1s);
  const CheckItem* members = FindItem(*d, "topology", "3 members: tolerates 1 failed");
  ASSERT_NE(members, nullptr) << Items(*d);
  EXPECT_EQ(members->verdict, CheckVerdict::kPass);
  const CheckItem* quorum = FindItem(*d, "topology", "fewer than a quorum (2)");
  ASSERT_NE(quorum, nullptr) << Items(*d);
  EXPECT_EQ(quorum->verdict, CheckVerdict::kWarn);
  EXPECT_NE(quorum->fix.find("fail-over needs them"), std::string::npos);
  const CheckItem* leader = FindItem(*d, "topology", "raft term");
  ASSERT_NE(leader, nullptr) << Items(*d);
  EXPECT_EQ(leader->verdict, CheckVerdict::kPass);
  EXPECT_NE(leader->found.find(cluster.Endpoint(1)), std::string::npos) << leader->found;
  const CheckItem* shortest = FindItem(*d, "session", "at least 2 s");
  ASSERT_NE(shortest, nullptr) << Items(*d);
  EXPECT_NE(d->permissions_fix.find("readwrite diagnose-"), std::string::npos)
      << d->permissions_fix;

  auto all = OpenBackend(fmt::format("etcd://{}{}", cluster.Endpoints(), query));
  ASSERT_NE(all, nullptr);
  auto d_all = all->Diagnose();
  ASSERT_TRUE(d_all.ok()) << d_all.status().ToString();
  EXPECT_NE(FindItem(*d_all, "topology", "the URL names 3 of the 3 members"), nullptr)
      << Items(*d_all);
  for (const CheckItem& item : d_all->items) {
    EXPECT_EQ(item.verdict, CheckVerdict::kPass) << Items(*d_all);
  }
}

struct Failure {
  bool leader = true;
  bool pause = false;
};

class EtcdClusterFailoverTest : public ::testing::TestWithParam<Failure> {};

TEST_P(EtcdClusterFailoverTest, HolderSurvivesOrIsLostBeforeAnyoneElseHolds) {
  const bool kill_leader = GetParam().leader;
  const bool pause = GetParam().pause;
  auto started = EtcdCluster::Start({.members = 3});
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  EtcdCluster& cluster = **started;
  std::optional<int> leader;
  for (int i = 0; i < 100 && !leader; ++i) {
    leader = cluster.LeaderIndex();
    if (!leader) {
      std::this_thread::sleep_for(50ms);
    }
  }
  ASSERT_TRUE(leader.has_value());
  const int victim = kill_leader ? *leader : (*leader + 1) % 3;
  std::vector<std::string> order = {cluster.Endpoint(victim)};
  for (int i = 0; i < 3; ++i) {
    if (i != victim) {
      order.push_back(cluster.Endpoint(i));
    }
  }
  const std::string query = fmt::format("?prefix=failover-{}&command_timeout=1s", getpid());
  auto holder_backend =
      OpenBackend(fmt::format("etcd://{},{},{}{}", order[0], order[1], order[2], query));
  ASSERT_NE(holder_backend, nullptr);
  auto holder_store = internal::OpenStoreWithBackend(holder_backend);
  std::atomic<bool> lost{false};
  std::atomic<std::int64_t> lost_at_ns{0};
  auto held = holder_store->TryAcquire(
      "job", {.ttl = 5s, .on_lost = [&](const Status&) {
                lost_at_ns = std::chrono::steady_clock::now().time_since_epoch().count();
                lost = true;
              }});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  const FencingToken first = held->fencing_token();
  // The contender talks to the survivors only.
  auto contender = Store::Open(fmt::format("etcd://{},{}{}", order[1], order[2], query));
  ASSERT_TRUE(contender.ok()) << contender.status().ToString();
  std::this_thread::sleep_for(500ms);  // a keep-alive stream is open to the victim now

  if (pause) {
    cluster.Pause(victim);
  } else {
    cluster.Kill9(victim);
  }
  const auto killed_at = std::chrono::steady_clock::now();
  // For 8 s (longer than the 5 s TTL), the contender tries every 50 ms. Each success must come
  // after the holder was told it lost the lease.
  int overlaps = 0;
  int tries = 0;
  int errors = 0;
  std::optional<Lease> taken;
  while (std::chrono::steady_clock::now() - killed_at < 8s && !taken) {
    auto attempt = (*contender)->TryAcquire("job", {.ttl = 5s});
    ++tries;
    if (attempt.ok()) {
      const auto now_ns = std::chrono::steady_clock::now().time_since_epoch().count();
      if (held->valid() || !lost || lost_at_ns > now_ns) {
        ++overlaps;
      }
      taken = std::move(attempt).value();
    } else if (attempt.status().code() != StatusCode::kHeldByAnother) {
      ++errors;
    }
    std::this_thread::sleep_for(50ms);
  }
  const EtcdBackend::Stats stats = holder_backend->stats();
  std::printf(
      "[ figure ] etcd %s of the %s the holder used: holder %s; contender: %d "
      "tries, %d errors, %s; holder made %llu failovers, opened %llu keep-alive "
      "streams\n",
      pause ? "SIGSTOP" : "kill -9", kill_leader ? "leader" : "follower",
      lost ? fmt::format("lost after {:.0f} ms",
                         (lost_at_ns - killed_at.time_since_epoch().count()) / 1e6)
                 .c_str()
           : "kept its lease",
      tries, errors, taken ? "took the key" : "never got the key",
      static_cast<unsigned long long>(stats.failovers),
      static_cast<unsigned long long>(stats.keepalive_streams));
  EXPECT_EQ(overlaps, 0) << "two holders at once";
  if (!lost) {
    EXPECT_TRUE(held->valid());
    EXPECT_FALSE(taken.has_value());
    EXPECT_GE(stats.keepalive_streams, 2u) << "the stream moved to a surviving member";
  }

  if (pause) {
    cluster.Resume(victim);
  } else {
    ASSERT_TRUE(cluster.Restart(victim).ok());
  }
  if (!lost) {
    EXPECT_TRUE(held->Release().ok());
  }
  if (taken) {
    EXPECT_GT(taken->fencing_token(), first);
    EXPECT_TRUE(taken->Release().ok());
  }
  auto next = (*contender)->Acquire("job", {.ttl = 5s, .wait = 10s});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_GT(next->fencing_token(), first) << "fencing tokens only grow across the failover";
  EXPECT_TRUE(next->Release().ok());
}

INSTANTIATE_TEST_SUITE_P(LoseMember, EtcdClusterFailoverTest,
                         ::testing::Values(Failure{.leader = true}, Failure{.leader = false},
                                           Failure{.leader = true, .pause = true}),
                         [](const auto& info) {
                           return std::string(info.param.pause ? "Pause" : "Kill9") +
                                  (info.param.leader ? "Leader" : "Follower");
                         });

}  // namespace
}  // namespace leasehold
