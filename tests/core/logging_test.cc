// The public log hook (leasehold/logging.h): one structured record per lease event.

#include "leasehold/logging.h"

#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "leasehold/store.h"
#include "leasehold/testing/fake_clock.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;

struct Captured {
  LogLevel level;
  std::string event;
  std::vector<std::pair<std::string, std::string>> fields;
  std::string line;

  std::string Field(std::string_view name) const {
    for (const auto& [n, v] : fields) {
      if (n == name) {
        return v;
      }
    }
    return "<absent>";
  }
};

class LogHookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([this](const LogRecord& r) {
      Captured c{r.level, std::string(r.event), {}, std::string(r.line)};
      for (const LogField& f : r.fields) {
        c.fields.emplace_back(f.name, f.value);
      }
      std::lock_guard<std::mutex> lock(mu_);
      records_.push_back(std::move(c));
    });
  }

  void TearDown() override { SetLogSink(nullptr); }

  std::vector<Captured> Events(std::string_view event) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Captured> out;
    for (const Captured& c : records_) {
      if (c.event == event) {
        out.push_back(c);
      }
    }
    return out;
  }

  std::mutex mu_;
  std::vector<Captured> records_;
};

TEST_F(LogHookTest, AcquireAndReleaseAreOneRecordEachWithKeyTokenAndLatency) {
  testing::FakeClock clock;
  auto store = Store::Open("memory://log-hook", {.clock = &clock});
  ASSERT_TRUE(store.ok());
  auto lease = (*store)->TryAcquire("job:log", {.ttl = 3s});
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(lease->Release().ok());
  auto acquired = Events("acquired");
  ASSERT_EQ(acquired.size(), 1U);
  EXPECT_EQ(acquired[0].level, LogLevel::kInfo);
  EXPECT_EQ(acquired[0].Field("key"), "job:log");
  EXPECT_EQ(acquired[0].Field("fencing_token"), std::to_string(lease->fencing_token()));
  EXPECT_EQ(acquired[0].Field("token"), lease->token_prefix());
  EXPECT_EQ(acquired[0].Field("token").size(), 8U);
  EXPECT_EQ(acquired[0].Field("latency_seconds"), "0.000000");  // the fake clock stood still
  EXPECT_EQ(acquired[0].line.rfind("acquired key=job:log fencing_token=", 0), 0U)
      << acquired[0].line;
  auto released = Events("released");
  ASSERT_EQ(released.size(), 1U);
  EXPECT_EQ(released[0].Field("outcome"), "ok");
  EXPECT_EQ(released[0].Field("key"), "job:log");
}

TEST_F(LogHookTest, ValuesWithSpacesAreQuotedInTheTextLine) {
  testing::FakeClock clock;
  auto store = Store::Open("memory://log-hook-2", {.clock = &clock});
  ASSERT_TRUE(store.ok());
  auto lease = (*store)->TryAcquire("a key \"quoted\"", {.ttl = 3s});
  ASSERT_TRUE(lease.ok());
  auto acquired = Events("acquired");
  ASSERT_EQ(acquired.size(), 1U);
  EXPECT_NE(acquired[0].line.find("key=\"a key \\\"quoted\\\"\" "), std::string::npos)
      << acquired[0].line;
}

TEST_F(LogHookTest, LevelFiltersBeforeTheSink) {
  SetLogLevel(LogLevel::kWarning);
  testing::FakeClock clock;
  auto store = Store::Open("memory://log-hook-3", {.clock = &clock});
  ASSERT_TRUE(store.ok());
  auto lease = (*store)->TryAcquire("quiet", {.ttl = 3s});
  ASSERT_TRUE(lease.ok());
  SetLogLevel(LogLevel::kInfo);
  EXPECT_TRUE(Events("acquired").empty());
}

}  // namespace
}  // namespace leasehold
