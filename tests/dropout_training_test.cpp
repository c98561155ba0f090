// Dropout's determinism in real training (issue 43): `vtrain train` of a
// LeNet with two dropout layers (tests/configs/dropout-lenet.yaml, batch
// 64) draws each sample's masks from (seed, step, global sample index,
// layer) only, so
//  - a batch split 7/13/44 over three ranks trains the weights one rank
//    trains on the same data (within rounding: the sums are ordered
//    differently);
//  - a run stopped and resumed repeats the uninterrupted run bit for bit,
//    on one rank and on the uneven split (which follows the one rank within
//    rounding), and a run resumed on another split follows the one-rank run;
//  - a step that recomputes the dropout layers' outputs in backward (a
//    per-tensor memory plan, superneurons) trains bit for bit as memory
//    policy none, on one rank and on the split (which follows the one rank).
// The runs go through mpirun as users start them (ctest label mpi).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/mpi_runs.h"
#include "tests/test_support.h"
#include "worker/train/checkpoint.h"

namespace vtrain {
namespace {

using mpi_runs::compare;
using mpi_runs::Difference;
using mpi_runs::final_parameters;
using mpi_runs::launch;
using mpi_runs::logged_losses;
using mpi_runs::run;
using mpi_runs::TempDir;

// The uneven split of the batch of 64.
const std::string kSplit = " --set balance.split=manual --set balance.manual=[7,13,44]";

// `vtrain train` of the dropout LeNet on `ranks` ranks (with `extra`
// settings) for `steps` steps into checkpoint folder `dir`, its step
// losses into `metrics`.
std::string train(int ranks, const std::string& dir, int steps, const std::string& metrics,
                  const std::string& extra = "") {
  return launch(ranks) + test_support::vtrain_binary() + " " + test_support::source_dir() +
         "/tests/configs/dropout-lenet.yaml --progress off --set train.max_steps=" +
         std::to_string(steps) +
         " --set train.evaluate=false --set conv.algorithm=direct --set device.threads=1" +
         " --set train.log_every=1 --set checkpoint.dir=" + dir + " --metrics " + metrics + " " +
         extra;
}

// Weights after the same steps within rounding of each other (as the
// split-exactness tests of mpi_test hold the smooth LeNet to).
void expect_within_rounding(const std::vector<float>& a, const std::vector<float>& b,
                            const std::string& what) {
  ASSERT_FALSE(a.empty()) << what;
  ASSERT_EQ(a.size(), b.size()) << what;
  const Difference d = compare(a, b);
  std::printf("%s: max abs diff %.3g (relative %.3g)\n", what.c_str(), d.max_abs, d.relative);
  EXPECT_LE(d.relative, 1e-5) << what;
}

TEST(DropoutTraining, AnUnevenSplitOverThreeRanksTrainsTheOneRankWeights) {
  TempDir dir;
  std::string out;
  ASSERT_EQ(run(train(1, dir / "one", 20, dir / "one.jsonl"), &out), 0) << out;
  ASSERT_EQ(run(train(3, dir / "three", 20, dir / "three.jsonl", kSplit), &out), 0) << out;
  expect_within_rounding(final_parameters(dir / "one"), final_parameters(dir / "three"),
                         "20 steps on 7/13/44 vs 1 rank");
}

// Stopped at step 10 and resumed to 24 on `ranks` ranks (with `split`):
// the losses of every step and the final weights and velocity equal the
// uninterrupted run's, bit for bit. The resumed run's weights into `resumed`.
void expect_resume_bitwise(int ranks, const std::string& split, std::vector<float>* resumed) {
  SCOPED_TRACE(std::to_string(ranks) + " ranks" + split);
  TempDir dir;
  std::string out;
  ASSERT_EQ(run(train(ranks, dir / "full", 24, dir / "full.jsonl", split), &out), 0) << out;
  ASSERT_EQ(run(train(ranks, dir / "part", 10, dir / "a.jsonl", split), &out), 0) << out;
  ASSERT_EQ(run(train(ranks, dir / "part", 24, dir / "b.jsonl", split + " --resume"), &out), 0)
      << out;
  std::vector<std::string> pieced = logged_losses(dir / "a.jsonl");
  for (const std::string& l : logged_losses(dir / "b.jsonl")) pieced.push_back(l);
  ASSERT_EQ(pieced.size(), 24u);
  EXPECT_EQ(pieced, logged_losses(dir / "full.jsonl"));
  const auto part = worker::load_checkpoint(*worker::latest_checkpoint(dir / "part"));
  const auto full = worker::load_checkpoint(*worker::latest_checkpoint(dir / "full"));
  EXPECT_EQ(part.parameters, full.parameters);
  EXPECT_EQ(part.velocity, full.velocity);
  *resumed = part.parameters;
}

// And the split's resumed run follows the one rank's.
TEST(DropoutTraining, AResumedRunRepeatsTheUninterruptedRunBitwise) {
  std::vector<float> one, three;
  expect_resume_bitwise(1, "", &one);
  expect_resume_bitwise(3, kSplit, &three);
  expect_within_rounding(one, three, "24 steps resumed at 10, on 7/13/44 vs 1 rank");
}

// The first 10 steps on 7/13/44, the rest on one rank: each sample keeps
// its masks across the change, so the weights follow the one-rank run's.
TEST(DropoutTraining, ARunResumedOnAnotherSplitFollowsTheOneRankRun) {
  TempDir dir;
  std::string out;
  ASSERT_EQ(run(train(1, dir / "one", 20, dir / "one.jsonl"), &out), 0) << out;
  ASSERT_EQ(run(train(3, dir / "moved", 10, dir / "a.jsonl", kSplit), &out), 0) << out;
  ASSERT_EQ(run(train(1, dir / "moved", 20, dir / "b.jsonl", "--resume"), &out), 0) << out;
  expect_within_rounding(final_parameters(dir / "one"), final_parameters(dir / "moved"),
                         "10 steps on 7/13/44 then 10 on 1 rank vs 20 on 1 rank");
}

// memory.policy superneurons recomputes the cheap layers' outputs in
// backward, the dropout layers' among them (as `vtrain check` shows):
// their forward runs again there and must draw the step's masks again.
TEST(DropoutTraining, RecomputingTheDropoutOutputsTrainsBitwiseAsPolicyNone) {
  TempDir dir;
  std::string out;
  const std::string policy = " --set memory.policy=superneurons";
  ASSERT_EQ(run(test_support::vtrain_binary() + " check " + test_support::source_dir() +
                    "/tests/configs/dropout-lenet.yaml --set conv.algorithm=direct"
                    " --set device.threads=1" + policy,
                &out),
            0)
      << out;
  for (const std::string tensor : {"drop1.y", "drop2.y"}) {
    const size_t at = out.find("  " + tensor + " ");
    ASSERT_NE(at, std::string::npos) << out;
    EXPECT_NE(out.substr(at, out.find('\n', at) - at).find("recompute"), std::string::npos)
        << tensor << " is not recomputed:\n" << out;
  }
  for (int ranks : {1, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const std::string split = ranks > 1 ? kSplit : "";
    const std::string none = dir / ("none" + std::to_string(ranks));
    const std::string recomputed = dir / ("recomputed" + std::to_string(ranks));
    ASSERT_EQ(run(train(ranks, none, 12, none + ".jsonl", split), &out), 0) << out;
    ASSERT_EQ(run(train(ranks, recomputed, 12, recomputed + ".jsonl", split + policy), &out), 0)
        << out;
    EXPECT_EQ(logged_losses(recomputed + ".jsonl"), logged_losses(none + ".jsonl"));
    const auto a = worker::load_checkpoint(*worker::latest_checkpoint(none));
    const auto b = worker::load_checkpoint(*worker::latest_checkpoint(recomputed));
    EXPECT_EQ(a.parameters, b.parameters);
  }
  // The split's recomputing run follows the one rank's.
  expect_within_rounding(worker::load_checkpoint(*worker::latest_checkpoint(dir / "none1")).parameters,
                         worker::load_checkpoint(*worker::latest_checkpoint(dir / "recomputed3")).parameters,
                         "12 steps recomputing on 7/13/44 vs 1 rank under none");
}

}  // namespace
}  // namespace vtrain
