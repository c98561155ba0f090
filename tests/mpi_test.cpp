// Multi-rank tests, run through mpirun the way users run vtrain (ctest label
// mpi): gradient equivalence for any split, failure of one rank, checkpoint
// resume, and the stop signal. Resume on another rank count: elastic_test.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/metrics_records.h"
#include "tests/mpi_runs.h"
#include "tests/test_support.h"
#include "balancer/plan.h"
#include "worker/device/backend.h"
#include "worker/train/checkpoint.h"


namespace vtrain {
namespace {

namespace fs = std::filesystem;

using mpi_runs::compare;
using mpi_runs::Difference;
using mpi_runs::final_parameters;
using mpi_runs::logged_losses;
using mpi_runs::mpirun;
using mpi_runs::run;
using mpi_runs::TempDir;
using mpi_runs::train_args;
using test_support::source_dir;

std::string binary() { return test_support::vtrain_binary(); }

// The smooth LeNet (tests/configs/smooth-lenet.yaml): with max pools and
// ReLUs, rounding alone can move a gradient to another pixel. Batch 64 on
// one rank against the uneven split 7/13/44 over three ranks and
// 20/0/44, whose idle rank still takes every update.
void expect_equivalent_splits(const std::string& optimizer) {
  TempDir dir;
  std::string out;
  const std::string& model = mpi_runs::kSmoothLeNetConfig;
  const std::string args = optimizer + " --set train.batch=64";
  ASSERT_EQ(run(train_args(dir / "one", 20, args, model), &out), 0) << out;
  for (const char* split : {"7,13,44", "20,0,44"}) {
    ASSERT_EQ(run(mpirun(3) + train_args(dir / split, 20,
                                         args + " --set balance.split=manual"
                                                " --set balance.manual=[" + split + "]",
                                         model),
                  &out),
              0)
        << out;
  }
  const std::vector<float> one = final_parameters(dir / "one");
  const std::vector<float> uneven = final_parameters(dir / "7,13,44");
  const std::vector<float> idle = final_parameters(dir / "20,0,44");
  ASSERT_FALSE(one.empty());
  ASSERT_EQ(one.size(), uneven.size());
  ASSERT_EQ(one.size(), idle.size());
  const Difference d3 = compare(one, uneven), d0 = compare(one, idle);
  std::printf("after 20 steps vs 1 rank: 7/13/44 max abs diff %.3g (relative %.3g), "
              "20/0/44 max abs diff %.3g (relative %.3g)\n",
              d3.max_abs, d3.relative, d0.max_abs, d0.relative);
  EXPECT_LE(d3.relative, 1e-5);
  EXPECT_LE(d0.relative, 1e-5);
}

TEST(Mpi, PlainSgdWeightsAgreeOnOneRankAndUnevenSplits) {
  expect_equivalent_splits("--set optimizer.momentum=0");
}

TEST(Mpi, MomentumAndWeightDecayWeightsAgreeOnOneRankAndUnevenSplits) {
  expect_equivalent_splits("--set optimizer.momentum=0.9 --set optimizer.weight_decay=5e-4");
}

// The other optimizers and recipe knobs (docs/optimizers.md): the
// gradient, so the norm clip_norm takes and the trust ratios LARS takes,
// is the full batch's on every rank, whatever the split.
const std::string kNesterovRecipe =
    "--set optimizer.momentum=0.9 --set optimizer.nesterov=true --set optimizer.weight_decay=5e-4 "
    "--set optimizer.no_decay=[bias] --set train.label_smoothing=0.1 --set train.ema=0.9";
// AdamW divides each gradient component by its own root mean square, so a
// component near zero steps by about lr whatever its size: rounding-level
// differences there (another summation order) become differences of order
// lr. With eps 1e-8, uninterrupted runs on 1 and 2 ranks of the elastic
// test end 1e-4 apart (relative); eps 1e-5 damps those components and
// brings it to 3e-7, so that the tolerance of the other optimizers holds.
const std::string kAdamW =
    "--set optimizer.type=adamw --set optimizer.momentum=0 --set optimizer.lr=0.001 "
    "--set optimizer.weight_decay=0.05 --set optimizer.betas=[0.9,0.99] --set optimizer.eps=1e-5";
const std::string kLarsClipped =
    "--set optimizer.type=lars --set optimizer.lr=0.5 --set optimizer.trust=0.02 "
    "--set optimizer.momentum=0.9 --set optimizer.weight_decay=5e-4 --set optimizer.no_decay=[bias] "
    "--set optimizer.clip_norm=0.5";

TEST(Mpi, NesterovWithLabelSmoothingAndEmaWeightsAgreeOnOneRankAndUnevenSplits) {
  expect_equivalent_splits(kNesterovRecipe);
}

TEST(Mpi, AdamWWeightsAgreeOnOneRankAndUnevenSplits) { expect_equivalent_splits(kAdamW); }

// clip_norm below the gradient's norm for the first 9 steps (its metric
// gradient_norm: 0.63 to 1.45 there on one rank at batch 64), so that it clips.
TEST(Mpi, ClippedLarsWeightsAgreeOnOneRankAndUnevenSplits) {
  expect_equivalent_splits(kLarsClipped);
}

// Recomputation trains bitwise as memory.policy none with every optimizer
// and recipe knob: memonger recomputes LeNet's conv1, pool1, pool2 and
// relu3 outputs in backward (`vtrain check` shows the plan), which repeats
// forward exactly, so the gradients and every update are the same bits.
TEST(Mpi, RecomputingTrainsBitwiseAsPolicyNoneWithEveryOptimizer) {
  const std::string recompute = " --set memory.policy=memonger";
  std::string out;
  ASSERT_EQ(run(binary() + " check " + source_dir() + "/" + mpi_runs::kLeNetConfig +
                    " --set train.batch=48" + recompute,
                &out),
            0)
      << out;
  ASSERT_NE(out.find("4 recomputed"), std::string::npos) << out;
  for (const std::string& optimizer :
       {std::string("--set optimizer.momentum=0.9"), kNesterovRecipe, kAdamW, kLarsClipped}) {
    SCOPED_TRACE(optimizer);
    TempDir dir;
    ASSERT_EQ(run(train_args(dir / "none", 12, optimizer), &out), 0) << out;
    ASSERT_EQ(run(train_args(dir / "recompute", 12, optimizer + recompute), &out), 0) << out;
    const auto none = worker::load_checkpoint(*worker::latest_checkpoint(dir / "none"));
    const auto again = worker::load_checkpoint(*worker::latest_checkpoint(dir / "recompute"));
    ASSERT_FALSE(none.parameters.empty());
    EXPECT_EQ(again.parameters, none.parameters);
    EXPECT_EQ(again.velocity, none.velocity);
    EXPECT_EQ(again.second_moment, none.second_moment);
    EXPECT_EQ(again.weight_average, none.weight_average);
  }
}

// train.target_accuracy on two ranks: the evaluation's counts are summed
// over both, so both decide alike after the same epoch and the job ends
// (a rank that went on alone would hang in its next allreduce). The run
// stops after the first epoch whose logged accuracy reaches the target.
TEST(Mpi, ATargetAccuracyEndsEveryRankAfterTheSameEpoch) {
  TempDir dir;
  std::string out;
  const std::string metrics = dir / "m.jsonl";
  ASSERT_EQ(run("timeout 120 " + mpirun(2) + binary() + " " + source_dir() + "/" +
                    mpi_runs::kLeNetConfig +
                    " --progress line --set train.batch=8 --set data.train_size=64"
                    " --set data.test_size=64 --set train.epochs=4 --set conv.algorithm=direct"
                    " --set device.threads=1 --set optimizer.lr=0.02"
                    " --set train.target_accuracy=0.5 --set checkpoint.dir=" + dir / "ck" +
                    " --metrics " + metrics,
                &out),
            0)
      << out;
  const std::vector<double> accuracy =
      test_support::metric_values(metrics, "epoch", "test_accuracy");
  ASSERT_FALSE(accuracy.empty()) << out;
  size_t first = 0;
  while (first < accuracy.size() && accuracy[first] < 0.5) ++first;
  ASSERT_LT(first, 4u) << "the model reaches 50% within 4 epochs:\n" << out;
  EXPECT_EQ(accuracy.size(), first + 1) << out;
  EXPECT_EQ(test_support::metric_values(metrics, "end", "target_epoch"),
            std::vector<double>{double(first + 1)});
  EXPECT_NE(out.find("training ends here"), std::string::npos) << out;
}

TEST(Mpi, OneFailingRankEndsTheJobQuickly) {
  TempDir dir;
  std::string out;
  const auto start = std::chrono::steady_clock::now();
  const int code = run("VTRAIN_FAIL_RANK=1 VTRAIN_FAIL_AT_STEP=5 timeout 60 " + mpirun(2) +
                           train_args(dir / "ck", 50),
                       &out);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(code, 124) << "the job hung until timeout killed it:\n" << out;
  EXPECT_LT(seconds, 30.0) << out;
  EXPECT_NE(out.find("[rank 1] error: injected failure at step 5"), std::string::npos) << out;
}

// The same in the middle of backward, with a gradient allreduce in flight:
// the failing rank waits for it before freeing its buffers, then ends the
// job (no crash, no hang).
TEST(Mpi, ARankFailingInBackwardEndsTheJobCleanly) {
  TempDir dir;
  std::string out;
  const int code = run("VTRAIN_FAIL_RANK=1 VTRAIN_FAIL_AT_STEP=5 VTRAIN_FAIL_IN=backward timeout 60 " +
                           mpirun(2) + train_args(dir / "ck", 50, "--set train.allreduce_bucket=64KiB"),
                       &out);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(code, 124) << "the job hung until timeout killed it:\n" << out;
  EXPECT_NE(out.find("[rank 1] error: injected failure in backward at step 5"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("Segmentation fault"), std::string::npos) << out;
}

// A run stopped at step 10 and resumed repeats the uninterrupted run's
// losses and ends with its weights and optimizer state (and weight
// average), bit for bit.
void expect_resume_bitwise(int ranks, const std::string& optimizer = "") {
  SCOPED_TRACE(std::to_string(ranks) + " ranks " + optimizer);
  TempDir dir;
  const std::string launch = ranks > 1 ? mpirun(ranks) : "";
  const std::string args = optimizer + " --set train.log_every=1 --metrics ";
  std::string out;
  ASSERT_EQ(run(launch + train_args(dir / "full", 24, args + dir / "full.jsonl"), &out), 0) << out;
  ASSERT_EQ(run(launch + train_args(dir / "part", 10, args + dir / "a.jsonl"), &out), 0) << out;
  ASSERT_EQ(run(launch + train_args(dir / "part", 24,
                                    "--resume --progress line " + args + dir / "b.jsonl"),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  EXPECT_EQ(out.find("it was written by a run of"), std::string::npos) << out;
  std::vector<std::string> pieced = logged_losses(dir / "a.jsonl");
  for (const std::string& l : logged_losses(dir / "b.jsonl")) pieced.push_back(l);
  EXPECT_EQ(pieced, logged_losses(dir / "full.jsonl"));
  const auto part = worker::load_checkpoint(*worker::latest_checkpoint(dir / "part"));
  const auto full = worker::load_checkpoint(*worker::latest_checkpoint(dir / "full"));
  EXPECT_EQ(part.parameters, full.parameters);
  EXPECT_EQ(part.velocity, full.velocity);
  EXPECT_EQ(part.second_moment, full.second_moment);
  EXPECT_EQ(part.optimizer_updates, full.optimizer_updates);
  EXPECT_EQ(part.weight_average, full.weight_average);
}

TEST(Mpi, ResumedRunRepeatsTheUninterruptedLossesBitwise) {
  for (int ranks : {1, 2}) expect_resume_bitwise(ranks);
}

TEST(Mpi, ResumedRunRepeatsTheUninterruptedRunBitwiseWithEveryOptimizer) {
  for (const std::string& optimizer : {kNesterovRecipe, kAdamW, kLarsClipped}) {
    expect_resume_bitwise(2, optimizer);
  }
  // The average is saved and restored: the checkpoints hold it.
  TempDir dir;
  std::string out;
  ASSERT_EQ(run(train_args(dir / "ema", 4, kNesterovRecipe), &out), 0) << out;
  const auto ckpt = worker::load_checkpoint(*worker::latest_checkpoint(dir / "ema"));
  ASSERT_EQ(ckpt.weight_average.size(), ckpt.parameters.size());
  EXPECT_NE(ckpt.weight_average, ckpt.parameters);
}

// train.gradient_allreduce: half under bf16 on 2 ranks follows the fp32
// allreduce. Each gradient is rounded to bf16 (8 significant bits) before
// the sum and the sum once more, so each update moves by ~2^-8 of itself
// from fp32's; over 20 steps with momentum that grows, as bf16's own
// rounding of activations and weights does. The tolerance is that yardstick:
// the weights stay closer to the fp32 allreduce's than bf16 training stays
// to fp32 training (measured here: 0.017 against 0.054 of the largest
// weight). They are not identical: the option does something.
TEST(Mpi, HalfGradientAllreduceFollowsFp32UnderBf16) {
  auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  if (auto why = backend->precision_unavailable(common::Precision::kBf16)) GTEST_SKIP() << *why;
  TempDir dir;
  std::string out;
  const std::string bf16 = "--set train.precision=bf16";
  ASSERT_EQ(run(mpirun(2) + train_args(dir / "fp32", 20), &out), 0) << out;
  ASSERT_EQ(run(mpirun(2) + train_args(dir / "bf16", 20, bf16), &out), 0) << out;
  ASSERT_EQ(run(mpirun(2) + train_args(dir / "half", 20,
                                       bf16 + " --set train.gradient_allreduce=half"),
                &out),
            0)
      << out;
  const std::vector<float> bf16_weights = final_parameters(dir / "bf16");
  const std::vector<float> half_weights = final_parameters(dir / "half");
  ASSERT_FALSE(bf16_weights.empty());
  ASSERT_EQ(bf16_weights.size(), half_weights.size());
  const Difference yardstick = compare(final_parameters(dir / "fp32"), bf16_weights);
  const Difference d = compare(bf16_weights, half_weights);
  std::printf("bf16, 2 ranks, 20 steps: half vs fp32 allreduce relative diff %.3g; bf16 vs "
              "fp32 training %.3g\n",
              d.relative, yardstick.relative);
  EXPECT_GT(d.max_abs, 0.0);
  EXPECT_LT(d.relative, yardstick.relative);
}

// Gradients summed through pinned host memory (what ranks sharing a GPU
// use, NCCL needing a GPU per rank; forced here by the testing aid
// VTRAIN_STAGE_GRADIENTS=1) sum the same bytes as MPI on device memory:
// the weights are bit-identical, and rank 0 says which path it took. Small
// buckets (many slots), and a rank without samples (sums of zeros).
TEST(Mpi, GradientsStagedThroughHostMemoryTrainToTheSameWeights) {
  for (const std::string& extra :
       {std::string(), std::string("--set train.allreduce_bucket=4096 --set balance.split=manual "
                                   "--set balance.manual=[48,0]")}) {
    SCOPED_TRACE(extra);
    TempDir dir;
    std::string out;
    ASSERT_EQ(run(mpirun(2) + train_args(dir / "direct", 12, extra), &out), 0) << out;
    EXPECT_EQ(out.find("through pinned host memory"), std::string::npos) << out;
    ASSERT_EQ(run("VTRAIN_STAGE_GRADIENTS=1 " + mpirun(2) + train_args(dir / "staged", 12, extra),
                  &out),
              0)
        << out;
    EXPECT_NE(out.find("gradients: summed over MPI through pinned host memory: "
                       "VTRAIN_STAGE_GRADIENTS=1 on rank 0"),
              std::string::npos)
        << out;
    const std::vector<float> direct = final_parameters(dir / "direct");
    ASSERT_FALSE(direct.empty());
    EXPECT_EQ(final_parameters(dir / "staged"), direct);
  }
}

// Resuming on another number of ranks, and the refusal of another model's
// checkpoint: elastic_test.cpp.

// CPU processes that share the host's cores profile together: each
// measures every item at the same time as the other, so each measurement
// meets the contention training will (in every round of the steps, too).
TEST(Mpi, CpuProcessesOnOneHostProfileTogether) {
  TempDir dir;
  const std::string args = binary() + " profile " + source_dir() +
                           "/configs/synthetic-lenet.yaml --set profile.repeats=1 "
                           "--set device.threads=1 --set profile.batches=[32] "
                           "--set profile.step_rounds=2 "
                           "--set profile.micro_batches=powerOfTwo --db " + dir / "p.db";
  std::string out;
  // Unbound, both ranks see every core and so are the same device. (Open MPI
  // binds each of 2 ranks to a core of its own by default on some machines,
  // which makes them two devices, "(cpus 0)" and "(cpus 1)", by design.)
  ASSERT_EQ(run(mpirun(2) + "--bind-to none " + args, &out), 0) << out;
  EXPECT_NE(out.find("together, 1 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("together, 2 of 2"), std::string::npos) << out;
  // Both measured every kernel item, none from the other's rows.
  std::vector<int> measured;
  for (size_t at = out.find("kernel items measured"); at != std::string::npos;
       at = out.find("kernel items measured", at + 1)) {
    const size_t start = out.rfind(": ", at) + 2;
    measured.push_back(std::stoi(out.substr(start, at - start)));
  }
  ASSERT_EQ(measured.size(), 2u) << out;
  EXPECT_GT(measured[0], 0) << out;
  EXPECT_EQ(measured[0], measured[1]) << out;
  EXPECT_NE(out.find("kernel items measured, 0 cached; 1 steps measured, 0 cached"),
            std::string::npos)
      << out;
  // A single process now finds it all in the one file.
  ASSERT_EQ(run(args, &out), 0) << out;
  EXPECT_NE(out.find(": 0 kernel items measured"), std::string::npos) << out;
  EXPECT_NE(out.find("0 steps measured, 1 cached"), std::string::npos) << out;
}

// Processes of other devices that share the cores (another thread count
// here; another CPU quota in bench_hetero.py) profile together too, each
// into its own device's rows, the one done first with an item running it
// again until the other is done (Communicator::barrier_while). Rank 1's
// memory holds no step at batch 512: it waits for rank 0's without work.
TEST(Mpi, CpuProcessesOfOtherDevicesOnSharedCoresProfileTogether) {
  TempDir dir;
  const std::string args = binary() + " profile " + source_dir() +
                           "/configs/synthetic-lenet.yaml --set profile.repeats=1 "
                           "--set profile.batches=[16,32,512] "
                           "--set profile.micro_batches=undivided --db " + dir / "p.db";
  std::string out;
  ASSERT_EQ(run("timeout 300 " + mpirun(1, "--bind-to none") + args +
                    " --set device.threads=1 : -np 1 " + args +
                    " --set device.threads=2 --set device.memory_limit=64MiB",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("no step under memory.policy none fits batch 512"), std::string::npos)
      << out;
  EXPECT_NE(out.find("together, 1 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("together, 2 of 2"), std::string::npos) << out;
  ASSERT_EQ(run(binary() + " db stats --db " + dir / "p.db", &out), 0) << out;
  EXPECT_NE(out.find("2 devices"), std::string::npos) << out;
  // Each device has both batches' steps of its own.
  EXPECT_NE(out.find("1 threads, host"), std::string::npos) << out;
  EXPECT_NE(out.find("2 threads, host"), std::string::npos) << out;
  EXPECT_NE(out.find(" kernel, 3 step, "), std::string::npos) << out;  // rank 0: all three
  EXPECT_NE(out.find(" kernel, 2 step, "), std::string::npos) << out;  // rank 1: 16 and 32
}

// An MPMD run whose processes on shared cores ask for other items (another
// profile.batches) stops at once with the difference named, where the
// members would otherwise wait on each other for ever (timeout: 124).
TEST(Mpi, ProcessesProfilingTogetherWithOtherSettingsAreRefused) {
  TempDir dir;
  const std::string args = binary() + " profile " + source_dir() +
                           "/configs/synthetic-lenet.yaml --set profile.repeats=1 "
                           "--set profile.micro_batches=undivided --db " + dir / "p.db";
  std::string out;
  const int rc = run("timeout 120 " + mpirun(1, "--bind-to none") + args +
                         " --set profile.batches=[16,32] : -np 1 " + args +
                         " --set profile.batches=[16]",
                     &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(rc, 124) << "the members waited on each other\n" << out;
  EXPECT_NE(out.find("rank 0 has profile.batches: 16, 32 where rank 1 has profile.batches: 16;"),
            std::string::npos)
      << out;
}

TEST(Mpi, StopSignalCheckpointsAndExitsWithThree) {
  TempDir dir;
  const std::string log = dir / "log.txt";
  const std::string command = mpirun(2) + train_args(dir / "ck", 100000,
                                                     "--set checkpoint.every=5 --set train.epochs=1000 "
                                                     "--progress line") +
                              " > " + log + " 2>&1";
  const pid_t pid = test_support::spawn_shell(command);
  ASSERT_GT(pid, 0);
  // Wait (bounded) for training to be under way: the first checkpoint.
  ASSERT_TRUE(test_support::wait_until(
      [&] { return worker::latest_checkpoint(dir / "ck").has_value(); }, std::chrono::seconds(60)))
      << "no checkpoint within 60 s";
  // sh -c runs mpirun as its only child; signal the whole process group of
  // the shell is not ours to take, so find mpirun by parent pid.
  std::string out;
  run("pkill -USR1 -P " + std::to_string(pid) + " mpirun", &out);
  const std::optional<int> code = test_support::wait_exit(pid, std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "the job did not stop within 60 s of SIGUSR1";
  const std::string text = test_support::read_file(log);
  ASSERT_NE(*code, -1) << text;
  EXPECT_EQ(*code, 3) << text;
  EXPECT_NE(text.find("stopped by a signal after checkpointing"), std::string::npos) << text;
}

// The memory part the way users run it: vDNN offloading with the static
// planner on 2 ranks trains to the weights of the baseline, and --trace
// writes one Chrome trace with a process per rank; a device too small for
// the model is a runtime error naming what does not fit.
TEST(Mpi, MemoryPolicyTrainsLikeNoneAndTracesEveryRank) {
  TempDir dir;
  std::string out;
  ASSERT_EQ(run(mpirun(2) + train_args(dir / "none", 6), &out), 0) << out;
  const std::string trace = dir / "trace.json";
  ASSERT_EQ(run(mpirun(2) + train_args(dir / "conv", 6,
                                       "--set memory.policy=conv --set memory.planner=static "
                                       "--progress line --trace " + trace),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("memory: policy conv, planner static"), std::string::npos) << out;
  EXPECT_NE(out.find("trace: " + trace), std::string::npos) << out;
  const std::vector<float> none = final_parameters(dir / "none");
  ASSERT_FALSE(none.empty());
  EXPECT_EQ(final_parameters(dir / "conv"), none);
  const std::string json = test_support::read_file(trace);
  EXPECT_EQ(json.rfind("{\"traceEvents\":", 0), 0u) << json.substr(0, 80);
  EXPECT_NE(json.find("\"pid\":0"), std::string::npos);
  EXPECT_NE(json.find("\"pid\":1"), std::string::npos);
  EXPECT_NE(json.find("\"cat\":\"offload\""), std::string::npos);
  // scripts/trace_summary.py reads it: each rank's steps, the first left
  // out, and its layer types' time.
  ASSERT_EQ(test_support::run_command("/usr/bin/python3 " + test_support::source_dir() +
                                          "/scripts/trace_summary.py " + trace + " --layers 2",
                                      &out),
            0)
      << out;
  for (const char* rank : {"rank 0: 5 steps (1 left out)", "rank 1: 5 steps (1 left out)"}) {
    EXPECT_NE(out.find(rank), std::string::npos) << out;
  }
  EXPECT_NE(out.find("  conv "), std::string::npos) << out;
  EXPECT_NE(out.find("slowest calls"), std::string::npos) << out;
  EXPECT_NE(test_support::run_command("/usr/bin/python3 " + test_support::source_dir() +
                                          "/scripts/trace_summary.py " + std::string(dir / "none"),
                                      &out),
            0);
  EXPECT_NE(out.find("trace_summary: " + std::string(dir / "none") + ": cannot read it"),
            std::string::npos)
      << out;

  // LeNet's ops need ~2 MB of scratch of their own (the fc weights'
  // reorder), reserved before the pool: under 2 MiB nothing is left for it.
  EXPECT_EQ(run(train_args(dir / "small", 2, "--set device.memory_limit=2MiB"), &out), 1) << out;
  EXPECT_NE(out.find("no device memory left for the network: the device serves 2.0 MiB"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("of it the ops' scratch"), std::string::npos) << out;
  EXPECT_EQ(run(train_args(dir / "tiny", 2, "--set device.memory_limit=256KiB"), &out), 1) << out;
  EXPECT_NE(out.find("no device memory left for the network: the device serves 256.0 KiB"),
            std::string::npos)
      << out;
}

// balance.split: auto: every rank profiles in place, rank 0 solves the split
// and a WD workspace plan and broadcasts it, every rank follows it.
TEST(Mpi, AutoSplitProfilesSolvesAndFollowsThePlan) {
  TempDir dir;
  std::string out;
  const std::string plan = dir / "plan.yaml";
  ASSERT_EQ(run(mpirun(2) + train_args(dir / "ck", 4,
                                       "--set balance.split=auto --set balance.workspace=wd "
                                       "--set balance.workspace_limit=4MiB --set balance.granularity=8 "
                                       "--set profile.db=" + std::string(dir / "perf.db") +
                                       " --set profile.repeats=1 --set profile.warmup=0 "
                                       "--set profile.micro_batches=powerOfTwo "
                                       "--set output.plan=" + plan + " --progress line"),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("plan: split "), std::string::npos) << out;
  EXPECT_NE(out.find("of 48, workspace wd 4.0 MiB"), std::string::npos) << out;
  EXPECT_NE(out.find("plan: wrote " + plan), std::string::npos) << out;
  EXPECT_NE(out.find("done: 4 steps"), std::string::npos) << out;
  const balancer::TrainingPlan p = balancer::load_plan(plan);
  ASSERT_EQ(p.ranks.size(), 2u);
  EXPECT_EQ(p.ranks[0].batch + p.ranks[1].batch, 48);
  EXPECT_EQ(p.ranks[0].batch % 8, 0);
  // The measured allreduce is part of the predicted step, once.
  const std::string tag = "profile: allreduce of 431080 gradients: ";
  const size_t at = out.find(tag);
  ASSERT_NE(at, std::string::npos) << out;
  const double allreduce_ms = std::stod(out.substr(at + tag.size()));
  EXPECT_GT(allreduce_ms, 0.0);
  double slowest = 0;
  for (const balancer::RankPlan& r : p.ranks) slowest = std::max(slowest, r.predicted_ms);
  EXPECT_NEAR(p.predicted_step_ms, slowest + allreduce_ms, 0.01);  // printed to 0.01 ms
}

}  // namespace
}  // namespace vtrain
