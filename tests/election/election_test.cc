#include "leasehold/election.h"

#include <atomic>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "leasehold/store.h"
#include "leasehold/testing/fake_clock.h"

namespace leasehold {
namespace {

using namespace std::chrono_literals;

class ElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> n{0};
    auto store = Store::Open("memory://election-" + std::to_string(++n), {.clock = &clock_});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
  }

  testing::FakeClock clock_;
  std::unique_ptr<Store> store_;
};

TEST_F(ElectionTest, BadNamesAndIdsAreRejectedByEveryCall) {
  for (auto [name, id] :
       std::vector<std::pair<std::string, std::string>>{{"", "a"},
                                                        {"svc", ""},
                                                        {"svc", std::string(257, 'x')},
                                                        {std::string(600, 'n'), "a"},
                                                        {std::string("s\0v", 3), "a"}}) {
    Election election(*store_, name, id);
    EXPECT_EQ(election.Campaign(0s).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(election.Leader().status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(election.Observe([](const auto&) {}, {}).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(election.CampaignLoop([](Leadership&) { return Status(); }, {}).code(),
              StatusCode::kInvalidArgument);
  }
}

TEST_F(ElectionTest, LeadershipIsALeaseOnElectionKeyWithTheCandidateAsHolder) {
  Election election(*store_, "svc", "worker-1", {.lease = {.ttl = 6s}});
  auto leadership = election.Campaign(0s);
  ASSERT_TRUE(leadership.ok()) << leadership.status().ToString();
  EXPECT_EQ(leadership->lease().key(), "election:svc");
  EXPECT_EQ(leadership->lease().ttl(), 6s) << "the lease options are passed through";
  auto info = store_->Inspect("election:svc");
  ASSERT_TRUE(info.ok() && info->has_value());
  EXPECT_EQ((*info)->holder, "worker-1");
  EXPECT_EQ((*info)->fencing_token, leadership->term());
  EXPECT_TRUE(leadership->Resign().ok());
  EXPECT_FALSE(leadership->valid());
  auto leader = election.Leader();
  ASSERT_TRUE(leader.ok());
  EXPECT_FALSE(leader->has_value());
}

TEST_F(ElectionTest, EventsSayNotElectedThenElected) {
  Election first(*store_, "svc", "first");
  auto leading = first.Campaign(0s);
  ASSERT_TRUE(leading.ok());
  std::vector<std::pair<ElectionEvent, LeaderInfo>> events;
  Election second(*store_, "svc", "second",
                  {.on_event = [&](ElectionEvent e, const LeaderInfo& l, const Status&) {
                    events.emplace_back(e, l);
                  }});
  EXPECT_EQ(second.Campaign(0s).status().code(), StatusCode::kHeldByAnother);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].first, ElectionEvent::kNotElected);
  EXPECT_EQ(events[0].second.id, "first");
  EXPECT_EQ(events[0].second.term, leading->term());
  ASSERT_TRUE(leading->Resign().ok());
  auto elected = second.Campaign(0s);
  ASSERT_TRUE(elected.ok());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].first, ElectionEvent::kElected);
  EXPECT_EQ(events[1].second.id, "second");
  EXPECT_EQ(events[1].second.term, elected->term());
  EXPECT_EQ(ElectionEventName(ElectionEvent::kLostLeadership), "lost leadership");
}

TEST_F(ElectionTest, CampaignLoopCampaignsAgainAfterLossAndStopsOnError) {
  Election election(*store_, "svc", "looper");
  std::vector<FencingToken> terms;
  Status result = election.CampaignLoop(
      [&](Leadership& leadership) {
        terms.push_back(leadership.term());
        if (terms.size() == 1) {
          return Status();  // done: resign and campaign again
        }
        if (terms.size() == 2) {
          return Status::Lost("as if leadership was lost: campaign again");
        }
        return Status::Internal("give up");
      },
      {});
  EXPECT_EQ(result.code(), StatusCode::kInternal);
  ASSERT_EQ(terms.size(), 3u);
  EXPECT_LT(terms[0], terms[1]);
  EXPECT_LT(terms[1], terms[2]);
  auto leader = election.Leader();
  ASSERT_TRUE(leader.ok());
  EXPECT_FALSE(leader->has_value()) << "the loop resigns when `lead` returns";
}

TEST_F(ElectionTest, CampaignLoopReturnsOkWhenStopped) {
  Election election(*store_, "svc", "looper");
  std::stop_source stop;
  int led = 0;
  Status result = election.CampaignLoop(
      [&](Leadership&) {
        ++led;
        stop.request_stop();
        return Status();
      },
      stop.get_token());
  EXPECT_TRUE(result.ok()) << result.ToString();
  EXPECT_EQ(led, 1);
}

TEST_F(ElectionTest, CancelledCampaignReturnsCancelled) {
  Election first(*store_, "svc", "first");
  auto leading = first.Campaign(0s);
  ASSERT_TRUE(leading.ok());
  std::stop_source cancel;
  cancel.request_stop();
  Election second(*store_, "svc", "second");
  EXPECT_EQ(second.Campaign(kWaitForever, cancel.get_token()).status().code(),
            StatusCode::kCancelled);
}

}  // namespace
}  // namespace leasehold
