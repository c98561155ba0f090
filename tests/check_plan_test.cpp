// `vtrain check` under a per-tensor memory.policy (auto, memonger,
// superneurons, tflms): it builds the network training would, with the
// step's costs from the perf DB's profile of the device or measured in
// place, and prints the plan (per tensor kept, offloaded or
// recomputed; the predicted step time and peak), or fails naming the tensor
// that does not fit and the least capacity that would. Run as users run it.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <regex>
#include <string>

#include "tests/test_support.h"

namespace vtrain {
namespace {

using test_support::RunResult;
using test_support::run_vtrain;
using test_support::TempDir;

// VGG-small on 28x28 synthetic data: seven plannable activations of 16 KiB
// to 3 MiB at batch 16; `direct` convolutions skip the tuning.
constexpr const char* kConfig =
    "model: {preset: vgg-small}\n"
    "data: {kind: synthetic, shape: [1, 28, 28], classes: 10, train_size: 64, test_size: 16}\n"
    "train: {batch: 16, max_steps: 1, evaluate: false}\n"
    "device: {backend: cpu, threads: 1}\n"
    "conv: {algorithm: direct}\n";

// "28.6 MiB" -> bytes (the plan report's format_bytes_fixed).
double bytes_of(const std::string& text) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(R"(([0-9.]+) (B|KiB|MiB|GiB))"))) return -1;
  const double unit = m[2] == "GiB" ? 1 << 30 : m[2] == "MiB" ? 1 << 20 : m[2] == "KiB" ? 1024 : 1;
  return std::stod(m[1]) * unit;
}

// The bytes after `label` in `output` ("capacity 242.8 MiB" -> its bytes).
double bytes_after(const std::string& output, const std::string& label) {
  const size_t at = output.find(label);
  return at == std::string::npos ? -1 : bytes_of(output.substr(at + label.size(), 16));
}

struct Counts {
  int kept = -1, offloaded = -1, recomputed = -1;
};

Counts activation_counts(const std::string& output) {
  std::smatch m;
  Counts c;
  if (std::regex_search(output, m,
                        std::regex(R"(activations: (\d+) kept \([^)]*\), (\d+) offloaded )"
                                   R"(\([^)]*\), (\d+) recomputed)"))) {
    c = {std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3])};
  }
  return c;
}

class CheckPlan : public ::testing::Test {
 protected:
  RunResult check(const std::string& policy, uint64_t memory_limit) {
    return run_vtrain("check " + config_ + " --set memory.policy=" + policy +
                      " --set device.memory_limit=" + std::to_string(memory_limit));
  }
  // Under a roomy device: what the network takes besides its pool (the ops'
  // scratch, the optimizer's state) and what keeping every activation needs.
  void measure_room() {
    const RunResult r = check("auto", kRoomy);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    overhead_ = kRoomy - bytes_after(r.output, ", capacity ");
    keep_all_ = bytes_after(r.output, ", reservation ");
    ASSERT_GT(overhead_, 0) << r.output;
    ASSERT_GT(keep_all_, 0) << r.output;
  }

  static constexpr uint64_t kRoomy = uint64_t{256} << 20;
  TempDir dir_;
  std::string config_ = dir_.write("vgg.yaml", kConfig).string();
  double overhead_ = 0, keep_all_ = 0;
};

TEST_F(CheckPlan, PrintsThePlanOfEveryPerTensorPolicy) {
  for (const char* policy : {"auto", "memonger", "superneurons", "tflms"}) {
    const RunResult r = check(policy, kRoomy);
    ASSERT_EQ(r.exit_code, 0) << policy << ": " << r.output;
    EXPECT_CONTAINS(r.output, "memory: batch 16 (one of 1 rank) on ");
    EXPECT_CONTAINS(r.output, std::string("memory plan: ") + policy + " (");
    EXPECT_CONTAINS(r.output, "predicted step ");
    const Counts c = activation_counts(r.output);
    EXPECT_EQ(c.kept + c.offloaded + c.recomputed, 7) << r.output;
    EXPECT_CONTAINS(r.output, "relu1_1.y");
  }
  // The vDNN policies plan no tensors: check builds no network for them.
  const RunResult none = check("none", kRoomy);
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_EQ(none.output.find("memory plan:"), std::string::npos) << none.output;
}

TEST_F(CheckPlan, UnderALimitBelowKeepingEverythingSomeTensorsMove) {
  measure_room();
  // A MiB less than keeping every activation reserves.
  const auto limit = static_cast<uint64_t>(overhead_ + keep_all_) - (uint64_t{1} << 20);
  const RunResult r = check("auto", limit);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "memory plan: auto (");
  const Counts c = activation_counts(r.output);
  EXPECT_EQ(c.kept + c.offloaded + c.recomputed, 7) << r.output;
  EXPECT_GE(c.offloaded + c.recomputed, 1) << r.output;
  EXPECT_LE(bytes_after(r.output, ", reservation "), bytes_after(r.output, ", capacity "))
      << r.output;
}

TEST_F(CheckPlan, AnImpossibleLimitNamesATensorAndTheLeastCapacity) {
  measure_room();
  // Room to measure each layer alone, far too little for a step.
  const auto limit = static_cast<uint64_t>(overhead_ + 0.6 * keep_all_);
  const RunResult r = check("auto", limit);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "vtrain: error: memory.policy auto: ");
  EXPECT_CONTAINS(r.output, "out of memory allocating '");
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(allocating '[a-z0-9_]+\.y')")))
      << r.output;
  const double least = bytes_after(r.output, "the least capacity auto finds a plan for is ");
  EXPECT_GT(least, 0.6 * keep_all_) << r.output;
  EXPECT_EQ(r.output.find("effective config"), std::string::npos) << r.output;
}

// --ranks N plans one rank's share of the batch (train.batch / N, or the
// largest balance.manual entry); a count other than balance.manual's is a
// usage error, and so is one below 1.
TEST_F(CheckPlan, RanksPlanOneRanksShare) {
  const RunResult four = run_vtrain("check " + config_ + " --set memory.policy=auto --ranks 4");
  ASSERT_EQ(four.exit_code, 0) << four.output;
  EXPECT_CONTAINS(four.output, "memory: batch 4 (one of 4 ranks) on ");
  const std::string manual = " --set balance.split=manual --set balance.manual=[4,12]";
  const RunResult two = run_vtrain("check " + config_ + " --set memory.policy=auto" + manual);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_CONTAINS(two.output, "memory: batch 12 (one of 2 ranks) on ");
  const RunResult mismatch =
      run_vtrain("check " + config_ + " --set memory.policy=auto --ranks 3" + manual);
  EXPECT_EQ(mismatch.exit_code, 2) << mismatch.output;
  EXPECT_CONTAINS(mismatch.output,
                  "--ranks 3: " + config_ + " splits the batch over 2 ranks (balance.manual)");
  const RunResult zero = run_vtrain("check " + config_ + " --ranks 0");
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_CONTAINS(zero.output, "--ranks must be a whole number of ranks >= 1, got '0'");
}

// A half gradient exchange over several ranks stages every gradient in the
// half type on the device (2 bytes a parameter): check leaves that room
// out of the capacity it plans in, as training does. Needs bf16 on this
// CPU (native AVX-512 BF16 or AMX); skipped elsewhere.
TEST_F(CheckPlan, AHalfGradientExchangeOverSeveralRanksTakesItsStagingFromTheCapacity) {
  const std::string half = " --set memory.policy=auto --set device.memory_limit=" +
                           std::to_string(kRoomy) +
                           " --set train.precision=bf16 --set train.gradient_allreduce=half";
  const RunResult one = run_vtrain("check " + config_ + half + " --ranks 1");
  if (one.exit_code != 0 && one.output.find("needs native bf16") != std::string::npos) {
    GTEST_SKIP() << "bf16 is refused on this CPU: " << one.output;
  }
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const RunResult two = run_vtrain("check " + config_ + half + " --ranks 2");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(one.output, m, std::regex(R"(model: \d+ layers, (\d+) parameters)")))
      << one.output;
  const double parameters = std::stod(m[1]);
  // The capacity is printed to 0.1 MiB; the staging is 2 bytes a parameter.
  EXPECT_NEAR(bytes_after(one.output, ", capacity ") - bytes_after(two.output, ", capacity "),
              2 * parameters, 0.1 * (1 << 20))
      << one.output << "\n" << two.output;
}

// With a perf DB that holds this device's profile at the batch, check
// plans with its costs (`vtrain profile` records them, the calls as its
// step made them); without the file it measures them in place and creates
// nothing.
TEST_F(CheckPlan, PlansWithTheProfiledCostsWhenThePerfDbHoldsThem) {
  const std::string db = dir_.path("perf.db");
  const std::string args = config_ + " --set memory.policy=auto --set device.memory_limit=" +
                           std::to_string(kRoomy) + " --set profile.db=" + db;
  const RunResult before = run_vtrain("check " + args);
  ASSERT_EQ(before.exit_code, 0) << before.output;
  EXPECT_CONTAINS(before.output, "; costs measured in place in 3 steps");
  EXPECT_FALSE(std::filesystem::exists(db));
  const RunResult profiled =
      run_vtrain("profile " + args + " --set profile.batches=[16] --set profile.repeats=1");
  ASSERT_EQ(profiled.exit_code, 0) << profiled.output;
  const RunResult after = run_vtrain("check " + args);
  ASSERT_EQ(after.exit_code, 0) << after.output;
  EXPECT_CONTAINS(after.output, "; costs profiled in " + db);
  EXPECT_CONTAINS(after.output, "memory plan: auto (");
}

}  // namespace
}  // namespace vtrain
