// Synchronised batch norm (model.batch_norm: sync), through mpirun the way
// users run vtrain (ctest label mpi): ResNet-18 (its ReLUs left out, below)
// on a batch of 64 split over
// 3 ranks ends its steps where one rank with the whole batch does, weights and
// running statistics; with `local` it does not; an idle rank and per-rank
// recomputation (memonger plans differ with the batch) take part without a
// deadlock and without changing the numbers.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "worker/train/checkpoint.h"

namespace vtrain {
namespace {

using test_support::compare;
using test_support::Difference;
using test_support::mpirun;

// What a run leaves in its last checkpoint (rank 0's buffers).
struct Weights {
  std::vector<float> parameters;
  std::vector<float> buffers;  // batch norm's running statistics
};

// What each run trains: tests/configs/smooth-resnet18.yaml, ResNet-18 with
// the small-input stem and without its ReLUs, on synthetic samples of
// `shape`, fixed conv algorithm, one thread per rank, SGD with momentum.
//
// Without the ReLUs a step is a smooth function of the weights. With them
// (the resnet18 preset) a rounding-level difference, another split's
// summation order or one rank with im2col_gemm instead of direct alike,
// flips a ReLU near zero for some seeds: the weights then end 1e-5 to 1e-2
// apart within 1 to 3 steps, nothing being wrong (9 of 13 seeds at 3
// steps; seed 10 moved 1.6e-3 in one step with one rank and another
// algorithm). On the smooth model, seeds 1-13: weights 1.4e-7 to 6.6e-7
// apart after 3 steps of 3x4x4 at lr 0.05, with local statistics
// 0.05-0.2. Longer runs at
// 3x4x4 (batch norm over 64 values where the spatial size reaches 1x1)
// amplify rounding to 1e-5-1e-3 by step 20, so the 20-step test trains
// 3x8x8 at lr 0.01.
struct Run {
  const char* shape;
  const char* lr;
  int steps;
};
constexpr Run kShort{"[3,4,4]", "0.05", 3};
constexpr Run kLong{"[3,8,8]", "0.01", 20};

std::string train_args(const Run& run, const std::string& ckpt_dir, const std::string& extra) {
  return test_support::vtrain_binary() + " " + test_support::source_dir() +
         "/tests/configs/smooth-resnet18.yaml --progress off"
         " --set data.shape=" + run.shape + " --set train.batch=64 --set train.max_steps=" +
         std::to_string(run.steps) +
         " --set train.evaluate=false --set conv.algorithm=direct --set device.threads=1"
         " --set optimizer.lr=" + run.lr + " --set optimizer.momentum=0.9 --set checkpoint.dir=" +
         ckpt_dir + " " + extra;
}

Weights train(const Run& run, const std::string& launch, const std::string& ckpt_dir,
              const std::string& extra) {
  std::string out;
  const int code = test_support::run_command(launch + train_args(run, ckpt_dir, extra), &out);
  EXPECT_EQ(code, 0) << out;
  const auto latest = worker::latest_checkpoint(ckpt_dir);
  if (code != 0 || !latest) return {};
  worker::Checkpoint ckpt = worker::load_checkpoint(*latest);
  return {std::move(ckpt.parameters), std::move(ckpt.buffers)};
}

std::string split(const std::string& batches) {
  return "--set balance.split=manual --set balance.manual=[" + batches + "]";
}

class SyncBatchNorm : public testing::Test {
 protected:
  // One rank with the whole batch: the reference every split must meet.
  static void SetUpTestSuite() {
    dir_ = new test_support::TempDir();
    whole_ = new Weights(train(kShort, "", dir_->path("one"), ""));
  }
  static void TearDownTestSuite() {
    delete whole_;
    delete dir_;
  }

  // Trains on 3 ranks: its weights and running statistics must equal the
  // one-rank run's within 1e-5 relative (`equal`), or differ by over 1e-3.
  static void expect_whole_batch(const std::string& name, const std::string& extra, bool equal) {
    ASSERT_FALSE(whole_->parameters.empty());
    ASSERT_FALSE(whole_->buffers.empty());
    const Weights w = train(kShort, mpirun(3), dir_->path(name), extra);
    ASSERT_EQ(w.parameters.size(), whole_->parameters.size());
    ASSERT_EQ(w.buffers.size(), whole_->buffers.size());
    const Difference p = compare(whole_->parameters, w.parameters);
    const Difference b = compare(whole_->buffers, w.buffers);
    std::printf("%s: after %d steps vs 1 rank: weights %.3g relative (max abs %.3g), running "
                "statistics %.3g relative (max abs %.3g)\n",
                name.c_str(), kShort.steps, p.relative, p.max_abs, b.relative, b.max_abs);
    for (const Difference& d : {p, b}) {
      if (equal) {
        EXPECT_LE(d.relative, 1e-5);
      } else {
        EXPECT_GT(d.relative, 1e-3);
      }
    }
  }

  static test_support::TempDir* dir_;
  static Weights* whole_;
};

test_support::TempDir* SyncBatchNorm::dir_ = nullptr;
Weights* SyncBatchNorm::whole_ = nullptr;

// Rank 0 trains on 7 samples, yet its running statistics (in the
// checkpoint) are those of all 64.
TEST_F(SyncBatchNorm, UnevenSplitMatchesOneRankWithTheWholeBatch) {
  expect_whole_batch("sync-7-13-44", split("7,13,44"), true);
}

// Without synchronisation each rank normalises its own samples: the same
// split gives other weights (so the test above can fail).
TEST_F(SyncBatchNorm, LocalStatisticsDependOnTheSplit) {
  expect_whole_batch("local-7-13-44", split("7,13,44") + " --set model.batch_norm=local", false);
}

// Rank 0 has no samples but joins every collective (contributing zeros) and
// keeps the same running statistics; the others recompute activations in
// backward (memonger), batch norm's included, with the saved global
// statistics and no collective, though their plans differ.
TEST_F(SyncBatchNorm, IdleRankAndRecomputationKeepTheNumbers) {
  expect_whole_batch("sync-0-20-44-memonger",
                     split("0,20,44") + " --set memory.policy=memonger", true);
}

// After 20 steps (issue 14's target): a synchronised split 7/13/44 equals
// one rank with the whole batch within 1e-5 relative, weights and running
// statistics; local statistics end far from it (seeds 1-13: sync within
// 1.2e-7 and 2.1e-6, local 7.5e-3 and 0.2 or more; one rank with another
// convolution algorithm, for scale, seeds 1-3: 1.2e-7 to 2.4e-7 and up to
// 6e-6).
TEST(SyncBatchNormTwentySteps, UnevenSplitEqualsTheWholeBatchAfterTwentySteps) {
  test_support::TempDir dir;
  const Weights whole = train(kLong, "", dir.path("one"), "");
  const Weights sync = train(kLong, mpirun(3), dir.path("sync"), split("7,13,44"));
  const Weights local = train(kLong, mpirun(3), dir.path("local"),
                              split("7,13,44") + " --set model.batch_norm=local");
  for (const Weights* w : {&sync, &local}) {
    ASSERT_EQ(w->parameters.size(), whole.parameters.size());
    ASSERT_EQ(w->buffers.size(), whole.buffers.size());
  }
  const auto print = [&](const char* name, const Weights& w) {
    const Difference p = compare(whole.parameters, w.parameters);
    const Difference b = compare(whole.buffers, w.buffers);
    std::printf("%s after %d steps vs 1 rank: weights %.3g relative, running statistics %.3g "
                "relative\n", name, kLong.steps, p.relative, b.relative);
    return std::pair{p.relative, b.relative};
  };
  const auto [sync_w, sync_b] = print("sync 7/13/44", sync);
  const auto [local_w, local_b] = print("local 7/13/44", local);
  EXPECT_LE(sync_w, 1e-5);
  EXPECT_LE(sync_b, 1e-5);
  EXPECT_GT(local_w, 1e-3);
  EXPECT_GT(local_b, 1e-3);
}

}  // namespace
}  // namespace vtrain
