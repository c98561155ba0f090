// The bound on a step (worker/train/step_watch.h) with a fake peer probe:
// a step that outlasts the timeout gets a verdict naming the ranks that do
// not answer; steps that keep coming get none; a stuck rank keeps answering.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_support.h"
#include "worker/train/step_watch.h"

namespace vtrain::worker {
namespace {

using namespace std::chrono_literals;

// Ranks 2 and 3 are silent; counts the answers the watch gave.
class FakeProbe : public PeerProbe {
 public:
  void answer() override { ++answers; }
  std::vector<int> silent_ranks(std::chrono::milliseconds window) override {
    asked_window = window;
    return silent;
  }
  std::vector<int> silent{2, 3};
  std::atomic<int> answers{0};
  std::chrono::milliseconds asked_window{0};
};

// What the watch handed to on_stall (empty: nothing yet).
class Verdicts {
 public:
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& text) {
      std::lock_guard lock(mutex_);
      texts_.push_back(text);
    };
  }
  std::vector<std::string> texts() {
    std::lock_guard lock(mutex_);
    return texts_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> texts_;
};

std::string describe(int r) {
  return "rank " + std::to_string(r) + " (host node" + std::to_string(r / 2 + 1) + ")";
}

TEST(StepWatch, AStepPastTheTimeoutNamesTheRanksThatDoNotAnswer) {
  FakeProbe probe;
  Verdicts verdicts;
  StepWatch watch({.timeout = 200ms, .tick = 10ms, .probe_window = 3000ms}, &probe, describe,
                  verdicts.sink());
  watch.on_step_start({.step = 41});
  ASSERT_TRUE(test_support::wait_until([&] { return !verdicts.texts().empty(); }, 10s));
  const std::vector<std::string> texts = verdicts.texts();
  ASSERT_EQ(texts.size(), 1u);
  EXPECT_CONTAINS(texts[0], "step 41 has not finished after ");
  EXPECT_CONTAINS(texts[0], " s (train.step_timeout 0.2 s): ");
  EXPECT_CONTAINS(texts[0], "no answer within 3 s from rank 2 (host node2), rank 3 (host node2): "
                            "its host or the link to it is lost; ending the job");
  EXPECT_EQ(probe.asked_window, 3000ms);
  // The stuck rank answered the others meanwhile.
  EXPECT_GT(probe.answers.load(), 0);
}

TEST(StepWatch, StepsThatKeepStartingGetNoVerdict) {
  FakeProbe probe;
  Verdicts verdicts;
  {
    StepWatch watch({.timeout = 2000ms, .tick = 10ms}, &probe, describe, verdicts.sink());
    for (int64_t s = 0; s < 30; ++s) {
      watch.on_step_start({.step = s});
      std::this_thread::sleep_for(10ms);
    }
  }
  EXPECT_TRUE(verdicts.texts().empty());
  // Nor before the first step (setup is not watched).
  {
    StepWatch watch({.timeout = 10ms, .tick = 5ms}, &probe, describe, verdicts.sink());
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(verdicts.texts().empty());
}

TEST(StepWatch, EveryRankAnsweringMeansTheStepIsSlowNotLost) {
  FakeProbe probe;
  probe.silent.clear();
  Verdicts verdicts;
  StepWatch watch({.timeout = 50ms, .tick = 5ms}, &probe, describe, verdicts.sink());
  watch.on_step_start({.step = 0});
  ASSERT_TRUE(test_support::wait_until([&] { return !verdicts.texts().empty(); }, 10s));
  EXPECT_CONTAINS(verdicts.texts()[0], "every rank answers, so none is lost: a step this long "
                                       "needs a larger train.step_timeout");
}

TEST(StepWatch, WithoutAProbeTheVerdictNamesNoRank) {
  Verdicts verdicts;
  StepWatch watch({.timeout = 50ms, .tick = 5ms}, nullptr, describe, verdicts.sink());
  watch.on_step_start({.step = 7});
  ASSERT_TRUE(test_support::wait_until([&] { return !verdicts.texts().empty(); }, 10s));
  EXPECT_CONTAINS(verdicts.texts()[0], "a rank or its host is lost or stuck; ending the job");
}

}  // namespace
}  // namespace vtrain::worker
