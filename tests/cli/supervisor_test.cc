// File: tests/cli/supervisor_test.cc
//
// The process-tree Supervisor (tools/cli/supervisor.h) with real processes, in every
// containment mode this machine offers (a mode that is not available here is skipped, with the
// reason): exit codes, exec failures, leftovers counted and killed, the tree signalled as a
// whole (setsid daemons included), the keeper's dead man's switch, the death of the process
// that owns the Supervisor (kill -9), and a tree of 200 processes.
//
// Liveness is read from tick files (a loop appends to a file every 10 ms): they work the same
// in a PID namespace, where the tree's own PIDs mean nothing out here.

#include "supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

extern char** environ;

namespace leasehold::cli {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<std::string> Environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    env.emplace_back(*e);
  }
  return env;
}

sigset_t EmptyMask() {
  sigset_t mask;
  sigemptyset(&mask);
  return mask;
}

long FileSize(const std::string& path) {
  struct stat st {};

  return ::stat(path.c_str(), &st) == 0 ? static_cast<long>(st.st_size) : -1;
}

// A shell loop that appends a line to `file` every 10 ms.
std::string Ticker(const std::string& file) {
  return "while :; do echo x >> " + file + "; sleep 0.01; done";
}

class SupervisorTest : public ::testing::TestWithParam<Containment> {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() /
        ("leasehold-supervisor-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
  }

  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Starts `script` under sh -c in the parameter's mode; skips the test if it is unavailable.
  std::unique_ptr<Supervisor> StartShell(const std::string& script) {
    Result<std::unique_ptr<Supervisor>> tree = Supervisor::Start({.argv = {"sh", "-c", script},
                                                                  .env = Environment(),
                                                                  .child_mask = EmptyMask(),
                                                                  .contain = GetParam()});
    if (!tree.ok() && tree.error().code() == StatusCode::kUnimplemented) {
      skipped_ = tree.error().message();
      return nullptr;
    }
    EXPECT_TRUE(tree.ok()) << tree.error().message();
    if (!tree.ok()) {
      return nullptr;
    }
    EXPECT_EQ((*tree)->mode(), GetParam());
    return std::move(*tree);
  }

  // Polls the tree until `done` holds or `limit` passes; returns whether it held.
  template <typename Pred>
  bool WaitFor(Supervisor& tree, Pred done, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      tree.Update();
      if (done()) {
        return true;
      }
      pollfd p{tree.report_fd(), POLLIN, 0};
      ::poll(&p, 1, 10);
    }
    tree.Update();
    return done();
  }

  // Waits until every file exists and has grown, i.e. every ticker runs.
  void WaitTicking(const std::vector<std::string>& files) {
    for (const std::string& f : files) {
      const auto end = Clock::now() + 5s;
      while (FileSize(f) <= 0 && Clock::now() < end) {
        std::this_thread::sleep_for(5ms);
      }
      ASSERT_GT(FileSize(f), 0) << f << " never ticked";
    }
  }

  // True if none of the files grows during `quiet`.
  static bool Silent(const std::vector<std::string>& files, std::chrono::milliseconds quiet) {
    std::vector<long> before;
    for (const std::string& f : files) {
      before.push_back(FileSize(f));
    }
    std::this_thread::sleep_for(quiet);
    for (std::size_t i = 0; i < files.size(); ++i) {
      if (FileSize(files[i]) != before[i]) {
        return false;
      }
    }
    return true;
  }

  std::filesystem::path dir_;
  std::string skipped_;
  static inline int counter_ = 0;
};

#define START_OR_SKIP(var, script)           \
  auto var = StartShell(script);             \
  if (var == nullptr && !skipped_.empty()) { \
    GTEST_SKIP() << skipped_;                \
  }                                          \
  ASSERT_NE(var, nullptr)

TEST_P(SupervisorTest, CommandExitCodeIsPassedAndTheTreeEndsWithIt) {
  START_OR_SKIP(tree, "exit 3");
  ASSERT_TRUE(WaitFor(
      *tree, [&] { return tree->done(); }, 5000ms));
  EXPECT_TRUE(tree->command_exited());
  EXPECT_EQ(tree->ShellExitCode(), 3);
  EXPECT_EQ(tree->DescribeExit(), "exited with code 3");
  EXPECT_EQ(tree->CountLeft(), 0);
}

TEST_P(SupervisorTest, DeathBySignalIsReportedAsAShellWould) {
  START_OR_SKIP(tree, "kill -TERM $$");
  ASSERT_TRUE(WaitFor(
      *tree, [&] { return tree->done(); }, 5000ms));
  EXPECT_EQ(tree->ShellExitCode(), 128 + SIGTERM);
  EXPECT_EQ(tree->DescribeExit(), "was killed by SIGTERM");
}

TEST_P(SupervisorTest, ExecFailureIsReportedWithItsErrno) {
  Result<std::unique_ptr<Supervisor>> tree =
      Supervisor::Start({.argv = {"/nonexistent/leasehold-test-command"},
                         .env = Environment(),
                         .child_mask = EmptyMask(),
                         .contain = GetParam()});
  if (!tree.ok() && tree.error().code() == StatusCode::kUnimplemented) {
    GTEST_SKIP() << tree.error().message();
  }
  ASSERT_TRUE(tree.ok()) << tree.error().message();
  EXPECT_EQ((*tree)->exec_errno(), ENOENT);
}

TEST_P(SupervisorTest, LeftoversOfAnExitedCommandAreCountedThenKilledSetsidDaemonsIncluded) {
  const std::string bg = Path("bg.tick");
  const std::string daemon = Path("daemon.tick");
  START_OR_SKIP(tree, "(" + Ticker(bg) + ") & (setsid sh -c '" + Ticker(daemon) + "' &); exit 0");
  ASSERT_TRUE(WaitFor(
      *tree, [&] { return tree->command_exited(); }, 5000ms));
  WaitTicking({bg, daemon});
  EXPECT_EQ(tree->ShellExitCode(), 0);
  EXPECT_FALSE(tree->done());
  EXPECT_GE(tree->CountLeft(), 2);  // two shells at least (and their sleeps)
  tree->KillTree();
  ASSERT_TRUE(WaitFor(
      *tree, [&] { return tree->done(); }, 2000ms));
  EXPECT_EQ(tree->CountLeft(), 0);
  EXPECT_TRUE(Silent({bg, daemon}, 300ms));
}

TEST_P(SupervisorTest, SignalTreeReachesEveryProcessButSignalGroupOnlyTheCommandsGroup) {
  const std::string fg = Path("fg.tick");
  const std::string daemon = Path("daemon.tick");
  START_OR_SKIP(tree, "(setsid sh -c '" + Ticker(daemon) + "' &); " + Ticker(fg));
  WaitTicking({fg, daemon});
  tree->SignalGroup(SIGTERM);  // job control: the daemon is in a session of its own
  ASSERT_TRUE(WaitFor(
      *tree, [&] { return tree->command_exited(); }, 2000ms));
  EXPECT_TRUE(Silent({fg}, 200ms));
  EXPECT_FALSE(Silent({daemon}, 200ms));
  tree->SignalTree(SIGTERM);
  ASSERT_TRUE(WaitFor(
      *tree, [&] { return tree->done(); }, 2000ms));
  EXPECT_TRUE(Silent({daemon}, 300ms));
}

TEST_P(SupervisorTest, TheKeepersDeadlineKillsTheTreeWithoutAnyHelp) {
  const std::string fg = Path("fg.tick");
  const std::string daemon = Path("daemon.tick");
  // The command ignores SIGTERM: only the SIGKILL at kill_at ends it.
  START_OR_SKIP(tree, "trap '' TERM; (setsid sh -c \"trap '' TERM; " + Ticker(daemon) + "\" &); " +
                          Ticker(fg));
  WaitTicking({fg, daemon});
  const SteadyTime now = BootClock::now();
  tree->SetDeadline(now + 100ms, now + 300ms);
  // No Update(), no signal from here: the keeper acts alone.
  std::this_thread::sleep_for(600ms);
  EXPECT_TRUE(Silent({fg, daemon}, 300ms));
  ASSERT_TRUE(WaitFor(
      *tree, [&] { return tree->done(); }, 2000ms));
  EXPECT_EQ(tree->deadline_signal(), SIGKILL);
  EXPECT_EQ(tree->ShellExitCode(), 128 + SIGKILL);
}

TEST_P(SupervisorTest, AMovedDeadlineDoesNotFire) {
  const std::string fg = Path("fg.tick");
  START_OR_SKIP(tree, Ticker(fg));
  WaitTicking({fg});
  for (int i = 0; i < 5; ++i) {  // a healthy lease: the deadline keeps moving ahead
    const SteadyTime now = BootClock::now();
    tree->SetDeadline(now + 150ms, now + 250ms);
    std::this_thread::sleep_for(100ms);
  }
  const SteadyTime now = BootClock::now();
  tree->SetDeadline(now + 10s, now + 20s);
  tree->Update();
  EXPECT_EQ(tree->deadline_signal(), 0);
  EXPECT_FALSE(Silent({fg}, 100ms));
}

TEST_P(SupervisorTest, DeathOfItsOwnerTakesTheTreeDownAtOnce) {
  const std::string fg = Path("fg.tick");
  const std::string bg = Path("bg.tick");
  const std::string daemon = Path("daemon.tick");
  const std::string skip = Path("skip");
  // The owner is a forked copy of this test: it starts the tree, then dies of SIGKILL.
  const pid_t owner = ::fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    auto tree = Supervisor::Start({.argv = {"sh", "-c",
                                            "(" + Ticker(bg) + ") & (setsid sh -c '" +
                                                Ticker(daemon) + "' &); " + Ticker(fg)},
                                   .env = Environment(),
                                   .child_mask = EmptyMask(),
                                   .contain = GetParam()});
    if (!tree.ok()) {
      ::close(::open(skip.c_str(), O_CREAT | O_WRONLY, 0644));
      ::_exit(0);
    }
    while (FileSize(fg) <= 0 || FileSize(bg) <= 0 || FileSize(daemon) <= 0) {
      std::this_thread::sleep_for(5ms);
    }
    ::kill(::getpid(), SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(owner, &status, 0), owner);
  if (FileSize(skip) >= 0) {
    GTEST_SKIP() << ContainmentName(GetParam()) << " is not available here";
  }
  ASSERT_TRUE(WIFSIGNALED(status));
  const auto killed = Clock::now();
  // The last growth of any tick file after the kill.
  std::vector<std::string> files = {fg, bg, daemon};
  std::vector<long> sizes(files.size(), 0);
  auto last_growth = killed;
  while (Clock::now() - killed < 1500ms) {
    for (std::size_t i = 0; i < files.size(); ++i) {
      const long now_size = FileSize(files[i]);
      if (now_size != sizes[i]) {
        sizes[i] = now_size;
        last_growth = Clock::now();
      }
    }
    std::this_thread::sleep_for(2ms);
  }
  const auto gone_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(last_growth - killed).count();
  std::printf("  [figure] %s: tree gone %lld ms after kill -9 of its owner\n",
              std::string(ContainmentName(GetParam())).c_str(), static_cast<long long>(gone_ms));
  // The target is 100 ms (the figure above: 0 ms here, ticks are 10 ms apart); the bound is
  // generous so that a busy CI machine does not make a timing test flake.
  EXPECT_LE(gone_ms, 1000);
  EXPECT_TRUE(Silent(files, 300ms));
  // The keeper removes the owner's cgroup leaf once the tree is gone (nobody else would).
  const std::string leaf_prefix = "leasehold-" + std::to_string(owner) + "-";
  for (const char* mount : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(mount, ec)) {
      EXPECT_NE(entry.path().filename().string().rfind(leaf_prefix, 0), 0u) << entry.path();
    }
  }
}

TEST_P(SupervisorTest, ATreeOf200ProcessesIsTornDownCompletely) {
  // 20 shells of 10 sleeps each, plus the shells: > 200 descendants.
  START_OR_SKIP(tree,
                "i=0; while [ $i -lt 20 ]; do sh -c 'j=0; while [ $j -lt 10 ]; do sleep 60 & "
                "j=$((j+1)); done; wait' & i=$((i+1)); done; wait");
  ASSERT_TRUE(WaitFor(
      *tree, [&] { return tree->CountLeft() >= 200; }, 10000ms))
      << tree->CountLeft();
  std::printf("  [figure] %s: %d processes in the tree\n",
              std::string(ContainmentName(GetParam())).c_str(), tree->CountLeft());
  tree->KillTree();
  ASSERT_TRUE(WaitFor(
      *tree, [&] { return tree->done(); }, 5000ms))
      << tree->CountLeft();
  EXPECT_EQ(tree->CountLeft(), 0);
}

INSTANTIATE_TEST_SUITE_P(EveryMode, SupervisorTest,
                         ::testing::Values(Containment::kCgroup, Containment::kPidNamespace,
                                           Containment::kGroup),
                         [](const ::testing::TestParamInfo<Containment>& info) {
                           return std::string(ContainmentName(info.param));
                         });

TEST(ContainmentTest, ParsesTheFourNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseContainment("auto"), Containment::kAuto);
  EXPECT_EQ(*ParseContainment("cgroup"), Containment::kCgroup);
  EXPECT_EQ(*ParseContainment("pidns"), Containment::kPidNamespace);
  EXPECT_EQ(*ParseContainment("group"), Containment::kGroup);
  Result<Containment> bad = ParseContainment("bogus");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("auto, cgroup, pidns or group"), std::string::npos);
}

TEST(ContainmentTest, AutoPicksAModeAndSaysWhich) {
  Result<std::unique_ptr<Supervisor>> tree =
      Supervisor::Start({.argv = {"true"}, .env = Environment(), .child_mask = EmptyMask()});
  ASSERT_TRUE(tree.ok()) << tree.error().message();
  EXPECT_NE((*tree)->mode(), Containment::kAuto);
  EXPECT_EQ((*tree)->mode_note().rfind(std::string(ContainmentName((*tree)->mode())), 0), 0u)
      << (*tree)->mode_note();
}

}  // namespace
}  // namespace leasehold::cli
