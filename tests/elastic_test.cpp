// Elastic resume (ctest label mpi): a checkpoint written by N ranks
// continues on M ranks, the split solved for the M ranks present, from the
// same global sample, to the weights an uninterrupted M-rank run reaches;
// what may not change (the model, train.batch, train.seed) is refused with a
// clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "balancer/batch_split.h"
#include "tests/mpi_runs.h"
#include "tests/test_support.h"
#include "worker/train/checkpoint.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;

using mpi_runs::compare;
using mpi_runs::Difference;
using mpi_runs::final_parameters;
using mpi_runs::launch;
using mpi_runs::run;
using mpi_runs::TempDir;

// The smooth LeNet (tests/configs/smooth-lenet.yaml: no max pool or ReLU
// whose near-tie rounding could flip, which left LeNet's other rank counts
// 2e-4 to 4e-4 apart after 16 steps for 2 of 13 seeds) on 480 samples in
// batches of 48: 10 steps an epoch.
// The first run stops after kFirst steps, mid-epoch; the continuation runs
// on into the second epoch, so both the position inside an epoch and the
// next epoch's shuffle are exercised. Momentum and weight decay make the
// optimizer state part of what must carry over.
constexpr int kFirst = 7;
constexpr int kTotal = 16;
constexpr int kBatch = 48;
// Relative to the weights' scale: runs that add the same gradients in
// another order (another rank count) stay this close (seeds 1-13: at most
// 1.0e-6); the continuation itself moves the weights by more than 1e-2.
constexpr double kTolerance = 1e-5;

std::string lenet(const std::string& ckpt_dir, int steps, const std::string& extra = "",
                  const std::string& config = mpi_runs::kSmoothLeNetConfig) {
  return mpi_runs::train_args(ckpt_dir, steps,
                              "--set data.train_size=480 --set optimizer.momentum=0.9 "
                              "--set optimizer.weight_decay=5e-4 " + extra,
                              config);
}

// Runs `ranks` ranks for `steps` steps with checkpoints in `ckpt_dir`;
// the output, or a test failure with it.
std::string train(int ranks, const std::string& ckpt_dir, int steps,
                  const std::string& extra = "") {
  std::string out;
  EXPECT_EQ(run(launch(ranks) + lenet(ckpt_dir, steps, extra), &out), 0) << out;
  return out;
}

std::string copy_of(const std::string& from, const std::string& to) {
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

TEST(Elastic, EveryRankCountContinuesEveryOther) {
  TempDir dir;
  std::vector<std::vector<float>> uninterrupted(4);  // by ranks, kTotal steps from step 0
  for (int m = 1; m <= 3; ++m) {
    train(m, dir / ("full-" + std::to_string(m)), kTotal);
    uninterrupted[m] = final_parameters(dir / ("full-" + std::to_string(m)));
    ASSERT_FALSE(uninterrupted[m].empty());
  }
  // The continuation has to move the weights well beyond the tolerances
  // below, or agreeing with the uninterrupted runs would prove nothing.
  train(1, dir / "first-1", kFirst);
  EXPECT_GT(compare(uninterrupted[1], final_parameters(dir / "first-1")).relative, 1e-2);
  for (int n = 2; n <= 3; ++n) train(n, dir / ("first-" + std::to_string(n)), kFirst);

  for (int n = 1; n <= 3; ++n) {
    for (int m = 1; m <= 3; ++m) {
      const std::string name = std::to_string(n) + "-to-" + std::to_string(m);
      SCOPED_TRACE(name);
      const std::string ckpt = copy_of(dir / ("first-" + std::to_string(n)), dir / name);
      const std::string out = train(m, ckpt, kTotal, "--resume --progress line");
      const std::string written = ckpt + "/ckpt-0000000007.vtc";
      const std::string resumed = "resumed from " + written + " (step 7, epoch 1)";
      const std::string split = balancer::join_batches(balancer::even_split(kBatch, m));
      const std::string was = balancer::join_batches(balancer::even_split(kBatch, n));
      if (n == m) {
        EXPECT_NE(out.find(resumed + "\n"), std::string::npos) << out;
      } else {
        EXPECT_NE(out.find(resumed + "; it was written by a run of " + std::to_string(n) +
                           " rank(s), this run has " + std::to_string(m) + ": batch 48 split " +
                           split + " (was " + was + "), from global sample 336 of epoch 1\n"),
                  std::string::npos)
            << out;
      }
      EXPECT_NE(out.find("done: 16 steps"), std::string::npos) << out;
      const std::vector<float> continued = final_parameters(ckpt);
      ASSERT_EQ(continued.size(), uninterrupted[m].size());
      const Difference to_m = compare(uninterrupted[m], continued);
      const Difference to_one = compare(uninterrupted[1], continued);
      std::printf("%s: vs %d rank(s) uninterrupted max abs %.3g (relative %.3g), vs 1 rank "
                  "max abs %.3g (relative %.3g)\n",
                  name.c_str(), m, to_m.max_abs, to_m.relative, to_one.max_abs, to_one.relative);
      // The same ranks sum the same gradients in the same order: bit for
      // bit. Other rank counts add the gradients' parts in another order
      // (seen: up to 1.0e-6 relative over seeds 1-13).
      if (n == m) {
        EXPECT_EQ(continued, uninterrupted[m]);
      }
      EXPECT_LE(to_m.relative, kTolerance);
      EXPECT_LE(to_one.relative, kTolerance);
    }
  }
}

// Every optimizer's state (and train.ema's average) carries over to another
// rank count: a checkpoint of one rank continues on two (or one of two on
// one) to the weights, state and average of an uninterrupted run.
TEST(Elastic, EveryOptimizerContinuesOnAnotherRankCount) {
  struct Case {
    std::string optimizer;
    int n, m;  // ranks that wrote the checkpoint, ranks that continue
  };
  const Case cases[] = {
      {"--set optimizer.nesterov=true --set optimizer.no_decay=[bias] "
       "--set train.label_smoothing=0.1 --set train.ema=0.9",
       1, 2},
      // eps 1e-5: see kAdamW in mpi_test.cpp (with 1e-8, uninterrupted
      // runs on 1 and 2 ranks end 1e-4 apart).
      {"--set optimizer.type=adamw --set optimizer.momentum=0 --set optimizer.lr=0.001 "
       "--set optimizer.weight_decay=0.05 --set optimizer.eps=1e-5",
       2, 1},
      {"--set optimizer.type=lars --set optimizer.lr=0.5 --set optimizer.trust=0.02 "
       "--set optimizer.clip_norm=0.5 --set train.ema=0.9",
       1, 2}};
  for (const auto& [optimizer, n, m] : cases) {
    {
      SCOPED_TRACE(std::to_string(n) + " to " + std::to_string(m) + " ranks: " + optimizer);
      TempDir dir;
      train(m, dir / "full", kTotal, optimizer);
      train(n, dir / "ck", kFirst, optimizer);
      const std::string out = train(m, dir / "ck", kTotal, optimizer + " --resume --progress line");
      EXPECT_NE(out.find("it was written by a run of " + std::to_string(n) + " rank(s)"),
                std::string::npos)
          << out;
      const auto full = worker::load_checkpoint(*worker::latest_checkpoint(dir / "full"));
      const auto continued = worker::load_checkpoint(*worker::latest_checkpoint(dir / "ck"));
      EXPECT_EQ(continued.step, kTotal);
      EXPECT_EQ(continued.optimizer_updates, full.optimizer_updates);
      // Other rank counts add the gradients' parts in another order.
      EXPECT_LE(compare(full.parameters, continued.parameters).relative, kTolerance);
      EXPECT_LE(compare(full.velocity, continued.velocity).relative, kTolerance);
      EXPECT_EQ(continued.second_moment.empty(), full.second_moment.empty());
      if (!full.second_moment.empty()) {
        EXPECT_LE(compare(full.second_moment, continued.second_moment).relative, kTolerance);
      }
      ASSERT_EQ(continued.weight_average.size(), full.weight_average.size());
      if (!full.weight_average.empty()) {
        EXPECT_LE(compare(full.weight_average, continued.weight_average).relative, kTolerance);
      }
    }
  }
}

// balance.split: auto profiles the devices present and solves the split for
// them: a checkpoint from one rank continues on two with the solved split.
TEST(Elastic, AutoSplitIsSolvedForTheRanksPresent) {
  TempDir dir;
  train(1, dir / "full", kTotal);
  train(1, dir / "ck", kFirst);
  const std::string out =
      train(2, dir / "ck", kTotal,
            "--resume --progress line --set balance.split=auto --set balance.granularity=8 "
            "--set profile.db=" + dir / "perf.db" + " --set profile.repeats=1 "
            "--set profile.warmup=0 --set profile.micro_batches=undivided "
            "--set profile.batches=[16,32]");
  const size_t plan = out.find("plan: split ");
  ASSERT_NE(plan, std::string::npos) << out;
  // "plan: split 32+16 of 48, ...": the resume line names the same split.
  std::string split = out.substr(plan + 12, out.find(' ', plan + 12) - plan - 12);
  std::replace(split.begin(), split.end(), '+', ',');
  EXPECT_NE(out.find("this run has 2: batch 48 split " + split + " (was 48)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("done: 16 steps"), std::string::npos) << out;
  const Difference d = compare(final_parameters(dir / "full"), final_parameters(dir / "ck"));
  std::printf("1 rank -> 2 ranks split %s: vs 1 rank uninterrupted relative %.3g\n",
              split.c_str(), d.relative);
  EXPECT_LE(d.relative, kTolerance);
}

// What must stay the same is refused on every rank count, before any step:
// another global batch, another model.
TEST(Elastic, ChangedBatchOrModelIsRefusedOnAnyRankCount) {
  TempDir dir;
  train(2, dir / "ck", kFirst);
  const std::string written = dir / "ck/ckpt-0000000007.vtc";
  std::string out;
  EXPECT_EQ(run(launch(3) + lenet(dir / "ck", kTotal, "--resume --set train.batch=32"), &out), 1)
      << out;
  EXPECT_NE(out.find(written + " was written with train.batch 48, this run has train.batch 32; "
                               "it stopped before global sample 336 of epoch 1"),
            std::string::npos)
      << out;
  // Another model: LeNet with its max pools and ReLUs.
  EXPECT_EQ(run(launch(3) + lenet(dir / "ck", kTotal, "--resume", mpi_runs::kLeNetConfig), &out),
            1)
      << out;
  EXPECT_NE(out.find(written + " was written for another model"), std::string::npos) << out;
  // Nothing was written over the checkpoint.
  EXPECT_EQ(worker::latest_checkpoint(dir / "ck"), written);
}

// A checkpoint of 2 ranks (16 + 48 of a batch of 64), 3 steps into epoch 3.
worker::Checkpoint written_by_two_ranks() {
  return {.model_signature = "lenet:abc", .step = 7, .epoch = 2, .step_in_epoch = 3,
          .seed = 42, .world_size = 2, .global_batch = 64, .epoch_sample = 3 * 64,
          .split = {16, 48}, .parameters = {}, .buffers = {}, .velocity = {}, .loss_scaler = {}};
}

std::string resume_error(const std::function<void()>& fn) {
  return test_support::error_message<worker::CheckpointError>(fn);
}

// Elastic resume keeps the global batch and the seed; the errors name the
// config field, both values and where the checkpoint stopped.
TEST(ElasticChecks, ResumableOnlyWithTheSameBatchAndSeed) {
  const worker::Checkpoint c = written_by_two_ranks();
  const std::string path = "run/ckpt-0000000007.vtc";
  EXPECT_NO_THROW(worker::check_checkpoint_resumable(c, path, 64, 42));
  EXPECT_EQ(resume_error([&] { worker::check_checkpoint_resumable(c, path, 32, 42); }),
            path + " was written with train.batch 64, this run has train.batch 32; it stopped "
                   "before global sample 192 of epoch 3. A run may resume on other ranks and "
                   "devices (the split is solved again), but with the global batch it began "
                   "with: set train.batch=64, or start afresh in another checkpoint.dir");
  EXPECT_EQ(resume_error([&] { worker::check_checkpoint_resumable(c, path, 64, 7); }),
            path + " was written with train.seed 42, this run has train.seed 7; it stopped "
                   "before global sample 192 of epoch 3. The seed fixes every epoch's sample "
                   "order: set train.seed=42, or start afresh in another checkpoint.dir");
  worker::Checkpoint torn = c;
  torn.epoch_sample = 100;
  EXPECT_EQ(resume_error([&] { worker::check_checkpoint_resumable(torn, path, 64, 42); }),
            path + ": inconsistent data position: global sample 100 is not the start of step 4 "
                   "of batch 64");
}

TEST(ElasticChecks, ResumeChangeSaysWhatTheNewRanksDo) {
  const worker::Checkpoint c = written_by_two_ranks();
  EXPECT_EQ(worker::resume_change(c, {16, 48}), "");
  EXPECT_EQ(worker::resume_change(c, {32, 32}),
            "it was written by a run of 2 rank(s), this run has 2: batch 64 split 32,32 "
            "(was 16,48), from global sample 192 of epoch 3");
  EXPECT_EQ(worker::resume_change(c, {20, 20, 24}),
            "it was written by a run of 2 rank(s), this run has 3: batch 64 split 20,20,24 "
            "(was 16,48), from global sample 192 of epoch 3");
  worker::Checkpoint v1 = c;  // no split recorded
  v1.split.clear();
  EXPECT_EQ(worker::resume_change(v1, {32, 32}), "");
  EXPECT_EQ(worker::resume_change(v1, {64}),
            "it was written by a run of 2 rank(s), this run has 1: batch 64 split 64, "
            "from global sample 192 of epoch 3");
}

}  // namespace
}  // namespace vtrain
