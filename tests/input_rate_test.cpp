// A rank's input in the split, outside the balancer's brute force
// (balancer_test.cpp): the throttle's variable, the plan's per-rank input
// fields (file and printout), the re-balancer's input-bound ratio, and,
// through mpirun as users run it, a throttled rank that gets fewer samples
// because its input binds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "balancer/plan.h"
#include "tests/test_support.h"
#include "worker/profile/planning.h"
#include "worker/train/input_rate.h"
#include "worker/train/rebalancer.h"

namespace vtrain {
namespace {

using test_support::error_message;
using test_support::source_dir;

TEST(InputRateLimit, ParsesRanksAndRates) {
  EXPECT_EQ(worker::parse_input_rate_limit("1:400", 1), 400.0);
  EXPECT_EQ(worker::parse_input_rate_limit("1:400", 0), std::nullopt);
  EXPECT_EQ(worker::parse_input_rate_limit("0:2.5e3,3:800", 3), 800.0);
}

TEST(InputRateLimit, BadEntriesNameTheVariableAndTheEntry) {
  auto error = [](const std::string& text) {
    return error_message<std::invalid_argument>([&] { worker::parse_input_rate_limit(text, 0); });
  };
  const std::string expected = " (expected RANK:IMAGES_PER_S[,RANK:IMAGES_PER_S...], e.g. 1:400)";
  EXPECT_EQ(error("400"), "VTRAIN_INPUT_RATE_LIMIT: entry '400': no ':' between the rank and the rate" + expected);
  EXPECT_EQ(error("x:400"), "VTRAIN_INPUT_RATE_LIMIT: entry 'x:400': the rank is not an integer >= 0" + expected);
  EXPECT_EQ(error("1:0"), "VTRAIN_INPUT_RATE_LIMIT: entry '1:0': the rate is not a number of images/s > 0" +
                              expected);
  EXPECT_EQ(error("1:5,1:6"), "VTRAIN_INPUT_RATE_LIMIT: entry '1:6': rank 1 is limited twice" + expected);
}

// A plan of two ranks, the second input-bound.
balancer::TrainingPlan input_bound_plan() {
  balancer::TrainingPlan plan;
  plan.model = "m";
  plan.global_batch = 96;
  plan.predicted_step_ms = 120;
  plan.ranks.resize(2);
  plan.ranks[0] = {{"cpu a"}, std::nullopt, 64, 100.0, 2e6, balancer::Binding::kCompute, 0, std::nullopt, {}};
  plan.ranks[1] = {{"cpu b"}, std::nullopt, 32, 120.0, 400.0, balancer::Binding::kInput, 0, std::nullopt, {}};
  return plan;
}

TEST(InputRatePlan, TheFileKeepsEachRanksRateAndBinding) {
  const balancer::TrainingPlan back = balancer::parse_plan(balancer::plan_to_yaml(input_bound_plan()), "p.yaml");
  ASSERT_EQ(back.ranks.size(), 2u);
  EXPECT_EQ(back.ranks[1].input_rate, 400.0);
  EXPECT_EQ(back.ranks[1].binds, balancer::Binding::kInput);
  EXPECT_EQ(back.ranks[0].binds, balancer::Binding::kCompute);
  // A plan without them (older plans) reads as not priced.
  balancer::TrainingPlan plain = input_bound_plan();
  plain.ranks[1].input_rate.reset();
  plain.ranks[1].binds.reset();
  EXPECT_EQ(balancer::parse_plan(balancer::plan_to_yaml(plain), "p.yaml").ranks[1].input_rate, std::nullopt);
}

TEST(InputRatePlan, ABadBindingIsAnErrorNamingTheKey) {
  std::string text = balancer::plan_to_yaml(input_bound_plan());
  text.replace(text.find("binds: input"), 12, "binds: disk");
  const std::string error = error_message<balancer::PlanError>([&] { balancer::parse_plan(text, "p.yaml"); });
  EXPECT_NE(error.find("p.yaml"), std::string::npos) << error;
  EXPECT_NE(error.find("binds"), std::string::npos) << error;
  EXPECT_NE(error.find("compute"), std::string::npos) << error;
}

TEST(InputRatePlan, ThePrintoutSaysEachRanksRateAndWhatBinds) {
  const std::string text = worker::describe_plan(input_bound_plan());
  EXPECT_NE(text.find("rank 1 (cpu b): batch 32, predicted 120.00 ms"), std::string::npos) << text;
  EXPECT_NE(text.find("    input: 400 images/s (80.00 ms for its batch); input binds\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("    input: 2000000 images/s (0.03 ms for its batch); compute binds\n"), std::string::npos)
      << text;
}

// Rank 1's input slows to half its rate mid-run: its wait for input
// enters the drift as a slower compute would, and the re-solve moves
// samples off it.
TEST(InputRateRebalance, AnInputSlowdownMovesSamplesAwayFromTheRank) {
  worker::RebalanceOptions options;
  options.settings.window = 3;
  options.settings.patience = 2;
  options.settings.min_gain_ms = 0;
  options.split_options.granularity = 4;
  for (int r = 0; r < 2; ++r) {
    balancer::DeviceProfile p;
    p.name = "rank " + std::to_string(r);
    p.memory_capacity_bytes = uint64_t{1} << 30;
    for (int64_t b = 8; b <= 88; b += 8) p.steps.push_back({b, double(b), 1024});
    options.profiles.push_back(p);
  }
  options.profiles[1].input_rate = 1000;  // 1 ms a sample: as fast as its compute
  const std::vector<int64_t> split = {48, 48};
  worker::Rebalancer zero(options, 0, 2, 96), one({options.settings, {}, {}}, 1, 2, 96);
  std::optional<worker::SplitSwitch> switched;
  for (int64_t step = 0; step < 20 && !switched; ++step) {
    // From step 6 on rank 1's input delivers 500 images/s: it computes its
    // 48 samples in 48 ms, then waits 48 ms more for the next batch.
    const double wait = step >= 6 ? 48.0 : 0.0;
    std::vector<double> a{0, 0, 0}, b{0, 0, 0};
    zero.contribute(48, 0, a);
    one.contribute(48, 0, b, wait);
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    const auto s0 = zero.after_step(std::span<const double>(a).subspan(3), split, step);
    one.after_step(std::span<const double>(a).subspan(3), split, step);
    if (s0) switched = s0;
  }
  ASSERT_TRUE(switched.has_value()) << "no switch within 20 steps";
  EXPECT_LT(switched->split[1], 48);
  EXPECT_NEAR(switched->ratios[1], 2.0, 1e-9);
}

// Two ranks of one device, both inputs throttled far below what their
// compute takes (LeNet on one core: well over a thousand images/s on these
// machines, and still several hundred on a loaded one), rank 1's to a
// quarter of rank 0's: the split follows the inputs (about 76 + 20), and the
// plan says input binds on both. (With only rank 1 throttled, a fast
// machine rightly gives rank 1 nothing, and an idle rank binds on nothing.)
TEST(InputRateMpi, AThrottledRankGetsFewerSamplesAndItsInputBinds) {
  test_support::TempDir dir;
  const std::string plan_path = dir.path("plan.yaml");
  std::string output;
  const int rc = test_support::run_command(
      "env VTRAIN_INPUT_RATE_LIMIT=0:200,1:50 " + test_support::mpirun(2, "--bind-to none") +
          test_support::vtrain_binary() + " " + source_dir() +
          "/configs/synthetic-lenet.yaml --progress line --set train.evaluate=false"
          " --set conv.algorithm=direct --set device.threads=1 --set train.batch=96"
          " --set train.max_steps=2 --set balance.split=auto --set balance.granularity=4"
          " --set balance.allreduce=none --set profile.repeats=2 --set profile.warmup=1"
          " --set profile.db=" + dir.path("perf.db") + " --set output.plan=" + plan_path,
      &output);
  ASSERT_EQ(rc, 0) << output;
  const balancer::TrainingPlan plan = balancer::load_plan(plan_path);
  ASSERT_EQ(plan.ranks.size(), 2u);
  EXPECT_LT(plan.ranks[1].batch, plan.ranks[0].batch) << output;
  EXPECT_GT(plan.ranks[1].batch, 0) << output;
  EXPECT_EQ(plan.ranks[0].input_rate, 200.0);
  EXPECT_EQ(plan.ranks[1].input_rate, 50.0);
  EXPECT_EQ(plan.ranks[0].binds, balancer::Binding::kInput) << output;
  EXPECT_EQ(plan.ranks[1].binds, balancer::Binding::kInput) << output;
  EXPECT_NE(output.find("input: 50 images/s"), std::string::npos) << output;
}

// data.workers as a list gives each rank its own decoding pool, and each
// rank's rate is measured with its own: the perf DB holds one rate per
// worker count. A list of another length than the job's ranks is a config
// error naming the key.
TEST(InputRateMpi, EachRankMeasuresItsOwnDataWorkers) {
  test_support::TempDir dir;
  const std::string db = dir.path("perf.db");
  const std::string run = test_support::mpirun(2, "--bind-to none") + test_support::vtrain_binary() + " " +
                          source_dir() +
                          "/configs/synthetic-lenet.yaml --progress off --set train.evaluate=false"
                          " --set conv.algorithm=direct --set device.threads=1 --set train.batch=32"
                          " --set train.max_steps=2 --set balance.split=auto --set balance.allreduce=none"
                          " --set profile.repeats=1 --set profile.warmup=0"
                          " --set 'data.train_transform={crop: random, pad: 4, flip: true}'"
                          " --set profile.db=" + db;
  std::string output;
  ASSERT_EQ(test_support::run_command(run + " --set 'data.workers=[1, 2]'", &output), 0) << output;
  ASSERT_EQ(test_support::run_command(test_support::vtrain_binary() + " db export --table input_rates --db " + db +
                                          " --format jsonl",
                                      &output),
            0)
      << output;
  EXPECT_NE(output.find("\"workers\":1,"), std::string::npos) << output;
  EXPECT_NE(output.find("\"workers\":2,"), std::string::npos) << output;
  EXPECT_NE(output.find("random (pad 4) + flip + normalise"), std::string::npos) << output;
  EXPECT_EQ(test_support::run_command(run + " --set 'data.workers=[1, 2, 3]'", &output), 2) << output;
  EXPECT_NE(output.find("data.workers: has 3 per-rank values but the job has 2 ranks"), std::string::npos)
      << output;
}

}  // namespace
}  // namespace vtrain
