// Acceptance runs: real data, full recipes, minutes each (ctest label slow).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/metrics_records.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using test_support::source_dir;

int run_vtrain(const std::string& args, std::string& output) {
  return test_support::run_command(test_support::vtrain_binary() + " " + args, &output);
}

// The acceptance run of the foundation issue: LeNet, batch 64, SGD lr 0.05
// momentum 0.9 on Fashion-MNIST reaches >= 88% test accuracy within 10 epochs.
// train.target_accuracy ends the run at the first epoch that does (the
// schedule is still the 10 epochs' cosine): 3 epochs here, not 10. The algorithm is
// pinned: `auto` picks by timing, which could change the floating-point path
// between machines.
TEST(Slow, FashionMnistLenetReaches88Percent) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Debian package dataset-fashion-mnist is not installed";
  }
  const std::string metrics =
      (fs::temp_directory_path() / ("vtrain_fmnist_" + std::to_string(getpid()) + ".jsonl")).string();
  std::string output;
  const int code = run_vtrain(source_dir() + "/configs/fmnist-lenet.yaml --progress line "
                              "--set train.log_every=1000 --set conv.algorithm=direct "
                              "--set train.target_accuracy=0.88 --metrics " + metrics,
                              output);
  ASSERT_EQ(code, 0) << output;
  const std::vector<double> accuracy =
      test_support::metric_values(metrics, "epoch", "test_accuracy");
  const int epochs = static_cast<int>(accuracy.size());
  const double best = epochs > 0 ? *std::max_element(accuracy.begin(), accuracy.end()) : 0.0;
  EXPECT_LE(epochs, 10);
  EXPECT_NE(output.find("reached train.target_accuracy 0.88 after epoch " + std::to_string(epochs)),
            std::string::npos)
      << output;
  fs::remove(metrics);
  EXPECT_GE(best, 0.88) << output;
  std::printf("best test accuracy %.4f in %d epochs\n", best, epochs);
}

}  // namespace
}  // namespace vtrain
