// File: tests/core/host_config_test.cc
//
// The host's configuration file (core/host_config.h) and Store::DefaultUrl's order:
// $LEASEHOLD_STORE, then the file's `store = URL`, then the host-wide embedded store.

#include "core/host_config.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "leasehold/store.h"

#include "testing/scoped_env.h"

namespace leasehold::internal {
namespace {

using ::testing::HasSubstr;

using ::leasehold::testing::ScopedEnv;

TEST(HostConfigTest, ReadsKeyValueLinesSkippingCommentsAndBlanks) {
  const std::string text =
      "# the fleet's store\n"
      "\n"
      "  store =  redis://leases.internal/0  \n"
      "other = x\r\n";
  auto store = ConfigValue(text, "f", "store");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(*store, "redis://leases.internal/0");
  EXPECT_EQ(ConfigValue(text, "f", "other").value(), "x");
  EXPECT_EQ(ConfigValue(text, "f", "missing").value(), std::nullopt);
  EXPECT_EQ(ConfigValue("store = a\nstore = b\n", "f", "store").value(), "b") << "the last wins";
}

TEST(HostConfigTest, ALineThatIsNotKeyValueNamesFileAndLine) {
  auto bad = ConfigValue("store = a\nredis://x\n", "/etc/leasehold/leasehold.conf", "store");
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("/etc/leasehold/leasehold.conf:2"));
  EXPECT_EQ(ConfigValue("= x\n", "f", "store").status().code(), StatusCode::kInvalidArgument);
}

TEST(HostConfigTest, DefaultUrlComesFromTheEnvironmentThenTheFileThenTheHostWideStore) {
  char dir_template[] = "/tmp/leasehold-config-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string file = std::string(dir_template) + "/leasehold.conf";
  std::ofstream(file) << "store = redis://from-the-file/0\n";
  ScopedEnv state("LEASEHOLD_STATE_DIR", "/srv/leasehold");
  {
    ScopedEnv config("LEASEHOLD_CONFIG", file);
    ScopedEnv store("LEASEHOLD_STORE", "redis://from-the-environment/0");
    EXPECT_EQ(Store::DefaultUrl().value(), "redis://from-the-environment/0");
  }
  {
    ScopedEnv config("LEASEHOLD_CONFIG", file);
    ScopedEnv store("LEASEHOLD_STORE", std::nullopt);
    EXPECT_EQ(Store::DefaultUrl().value(), "redis://from-the-file/0");
  }
  std::ofstream(file, std::ios::trunc) << "# nothing set\n";
  {
    ScopedEnv config("LEASEHOLD_CONFIG", file);
    ScopedEnv store("LEASEHOLD_STORE", std::nullopt);
    EXPECT_EQ(Store::DefaultUrl().value(), "sqlite:///srv/leasehold/leases.db?scope=host");
  }
  {
    ScopedEnv config("LEASEHOLD_CONFIG", file + ".missing");
    ScopedEnv store("LEASEHOLD_STORE", std::nullopt);
    auto missing = Store::DefaultUrl();
    ASSERT_EQ(missing.status().code(), StatusCode::kInvalidArgument) << "it was asked for";
    EXPECT_THAT(std::string(missing.status().message()), HasSubstr("LEASEHOLD_CONFIG"));
  }
  ::unlink(file.c_str());
  ::rmdir(dir_template);
}

}  // namespace
}  // namespace leasehold::internal
