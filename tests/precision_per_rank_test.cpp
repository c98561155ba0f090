// A precision per rank (train.precision as a list, auto or a map by device
// name), run through mpirun as users run it (ctest label mpi): jobs that
// mix fp32, bf16 and fp16 ranks train, repeat bitwise, and end near the
// all-fp32 job; an overflow on one fp16 rank skips the step on every rank.
//
// The CPU computes bf16 only with AVX-512 BF16 or AMX and fp16 not at all,
// so these runs set VTRAIN_EMULATE_HALF=1 (worker/device/test_only/
// half_emulation.h: half storage, f32 compute, the device named "(half
// emulated, test only)"); on a CPU with native bf16 the bf16 ranks compute
// natively all the same.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/mpi_runs.h"
#include "common/machine.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

using mpi_runs::compare;
using mpi_runs::Difference;
using mpi_runs::final_parameters;
using mpi_runs::mpirun;
using mpi_runs::run;
using mpi_runs::TempDir;
using mpi_runs::train_args;

const std::string kEmulate = "VTRAIN_EMULATE_HALF=1 ";


// Trains `ranks` ranks for 20 steps with `precision` (a train.precision
// value) into `dir`; returns the final weights, the output in `out`.
std::vector<float> train_in(const TempDir& dir, const std::string& name, int ranks,
                            const std::string& precision, std::string* out,
                            const std::string& extra = "") {
  const std::string args =
      train_args(dir / name, 20,
                 "--progress line --set 'train.precision=" + precision + "' " + extra,
                 mpi_runs::kSmoothLeNetConfig);
  EXPECT_EQ(run(kEmulate + mpirun(ranks) + args, out), 0) << *out;
  return final_parameters(dir / name);
}

// A mixed job against the all-fp32 job of the same ranks. Its tolerance
// is the distance from fp32 of the job all in the mix's coarsest half
// type (`half`; bf16 keeps 8 significant bits, fp16 11): what rounding to
// it does to these 20 steps. A mix, whose fp32 ranks do not round, must
// stay within it. Twice the same mixed job gives the same bits.
void expect_mixed_job_near_fp32(int ranks, const std::string& mixed, const std::string& half) {
  TempDir dir;
  std::string out;
  const std::vector<float> fp32 = train_in(dir, "fp32", ranks, "fp32", &out);
  const std::vector<float> all_half = train_in(dir, "half", ranks, half, &out);
  const std::vector<float> first = train_in(dir, "mixed", ranks, mixed, &out);
  EXPECT_NE(out.find("precision per rank: "), std::string::npos) << out;
  const std::vector<float> second = train_in(dir, "again", ranks, mixed, &out);
  ASSERT_FALSE(fp32.empty());
  ASSERT_EQ(first.size(), fp32.size());
  EXPECT_EQ(first, second) << "the same mixed job twice gave different weights";
  const Difference yardstick = compare(fp32, all_half);
  const Difference d = compare(fp32, first);
  std::printf("%d ranks, 20 steps, relative to fp32: %s %.3g, all %s %.3g\n", ranks,
              mixed.c_str(), d.relative, half.c_str(), yardstick.relative);
  EXPECT_GT(d.max_abs, 0.0) << "the half ranks changed nothing";
  EXPECT_LT(d.relative, yardstick.relative);
}

TEST(PrecisionPerRank, Fp32AndBf16OnTwoRanksRepeatBitwiseAndStayNearFp32) {
  expect_mixed_job_near_fp32(2, "[fp32, bf16]", "bf16");
}

// The fp16 rank scales its loss (auto) and unscales before the exchange;
// the others do not scale. (All in fp16 the job stays 3x closer to fp32
// than all in bf16 here.)
TEST(PrecisionPerRank, Fp32Bf16AndFp16OnThreeRanksRepeatBitwiseAndStayNearFp32) {
  expect_mixed_job_near_fp32(3, "[fp32, bf16, fp16]", "bf16");
}

// A scale no fp16 gradient survives (2^100): the fp16 rank overflows,
// rank 0 computes in fp32 and scales nothing, yet it reports the skip
// (it sees the non-finite sum): every rank skips and halves alike, and
// the weights stay finite and trained.
TEST(PrecisionPerRank, AnOverflowOnTheFp16RankSkipsTheStepOnEveryRank) {
  TempDir dir;
  std::string out;
  const std::vector<float> w =
      train_in(dir, "overflow", 2, "[fp32, fp16]", &out,
               "--set train.loss_scaling.initial=1267650600228229401496703205376");
  EXPECT_NE(out.find("loss scaled on rank 1 (unscaled before the exchange)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("overflowed at scale 1.26765e+30; update skipped"), std::string::npos) << out;
  ASSERT_FALSE(w.empty());
  for (float v : w) ASSERT_TRUE(std::isfinite(v));
}

// train.precision: auto takes the first of train.precisions each device
// offers: with the emulation bf16 on every rank, fp16 where it is put
// first; a map by device name gives the named device its own.
TEST(PrecisionPerRank, AutoAndAMapByDeviceNameChooseOnEachRank) {
  TempDir dir;
  std::string out;
  train_in(dir, "auto", 2, "auto", &out);
  EXPECT_NE(out.find("    bf16      24"), std::string::npos) << out;
  train_in(dir, "auto16", 2, "auto", &out, "--set 'train.precisions=[fp16, fp32]'");
  EXPECT_NE(out.find("    fp16      24"), std::string::npos) << out;
  // This CPU named in the map trains in fp32 where auto would take bf16.
  const std::string map = "{\"" + common::cpu_model_name() + "\": fp32, \"Some GPU\": fp16}";
  train_in(dir, "map", 2, map, &out, "--set 'train.precisions=[bf16]'");
  EXPECT_NE(out.find("    fp32      24"), std::string::npos) << out;
  EXPECT_EQ(out.find("    bf16      24"), std::string::npos) << out;
}

}  // namespace
}  // namespace vtrain
