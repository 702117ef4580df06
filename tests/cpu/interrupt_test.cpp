// SIGINT and SIGTERM during a recorded run (suites/interrupt.h): the signal reaches the child that
// run_recorded_command waits for (at once, or as soon as it is registered), the caught signal
// turns into Interrupted between cases, and the handlers are restored afterwards. No GPU needed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "suites/interrupt.h"
#include "suites/recorded_command.h"

namespace fusekit::suites {
namespace {

using Clock = std::chrono::steady_clock;

class InterruptTest : public ::testing::Test {
 protected:
  void SetUp() override { reset_interrupt_for_testing(); }
  void TearDown() override { reset_interrupt_for_testing(); }
};

// `exec` so that the signal reaches sleep itself, not a shell that would leave it running.
const std::vector<std::string> kSleeper = {"sh", "-c", "exec sleep 30"};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

TEST_F(InterruptTest, TheSignalReachesTheChildAndStopsTheNextCase) {
  const InterruptScope scope;
  std::thread sender([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(getpid(), SIGTERM);
  });
  const Clock::time_point start = Clock::now();
  const int code = run_recorded_command("unused.db", 1, kSleeper, 1000, false);
  sender.join();
  EXPECT_EQ(code, 128 + SIGTERM) << "the child was not killed by the signal passed on";
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_EQ(interrupt_signal(), SIGTERM);
  try {
    throw_if_interrupted();
    FAIL() << "no Interrupted after a caught signal";
  } catch (const Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGTERM);
    EXPECT_EQ(e.exit_code(), 143);
    EXPECT_STREQ(e.what(), "interrupted by SIGTERM");
  }
}

TEST_F(InterruptTest, ASignalCaughtBeforeTheChildStartsStillStopsIt) {
  const InterruptScope scope;
  raise(SIGINT);  // caught: fusekit survives it
  EXPECT_EQ(interrupt_signal(), SIGINT);
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(run_recorded_command("unused.db", 1, kSleeper, 1000, false), 128 + SIGINT);
  EXPECT_LT(seconds_since(start), 10.0);
}

// timeout and a terminal deliver a signal twice (to fusekit and to its process group): the repeat
// within a second is ignored; a repeat after that terminates, as a second Ctrl-C should.
TEST_F(InterruptTest, ARepeatWithinASecondIsIgnoredALaterOneTerminates) {
  {
    const InterruptScope scope;
    raise(SIGTERM);
    raise(SIGTERM);  // would terminate the test program if it were not ignored
    EXPECT_EQ(interrupt_signal(), SIGTERM);
  }
  reset_interrupt_for_testing();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // a process of its own, which the second signal must end
    const InterruptScope scope;
    raise(SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(1300));
    raise(SIGINT);
    _exit(0);  // reached only if the second signal was swallowed
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << "status " << status;
}

TEST_F(InterruptTest, NothingCaughtNothingThrownAndHandlersRestored) {
  struct sigaction before;
  sigaction(SIGTERM, nullptr, &before);
  {
    const InterruptScope scope;
    EXPECT_NO_THROW(throw_if_interrupted());
    EXPECT_EQ(run_recorded_command("unused.db", 1, {"sh", "-c", "exit 3"}, 1000, false), 3);
    struct sigaction during;
    sigaction(SIGTERM, nullptr, &during);
    EXPECT_NE(during.sa_handler, before.sa_handler);
  }
  struct sigaction after;
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  EXPECT_EQ(interrupt_signal(), 0);
}

}  // namespace
}  // namespace fusekit::suites
