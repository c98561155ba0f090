// Online re-balancing through mpirun, as users run vtrain (ctest label mpi):
// a rank slowed down 2x mid-run (VTRAIN_SLOW_*) gets fewer samples within
// 20 steps and the weights stay those of one rank with the whole batch; an
// undisturbed run of 1,000 steps keeps its split.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "worker/train/checkpoint.h"

namespace vtrain {
namespace {

using test_support::source_dir;

// Unbound ranks are one device: they share one profile, so the static
// split is even and does not depend on how the profiling went.
std::string mpirun(int ranks) {
  return "env OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 " + source_dir() +
         "/scripts/mpirun.sh --oversubscribe --bind-to none -np " + std::to_string(ranks) + " ";
}

// LeNet on synthetic data; with `auto_split`, profiled in place and split
// by rank 0 (the re-balancer's curves), the exchange left out of the model.
std::string train_args(const test_support::TempDir& dir, int64_t batch, int steps,
                       bool auto_split, const std::string& extra = "") {
  std::string args = test_support::vtrain_binary() + " " + source_dir() +
                     "/configs/synthetic-lenet.yaml --progress line --set train.evaluate=false"
                     " --set conv.algorithm=direct --set device.threads=1 --set train.epochs=100"
                     " --set train.batch=" + std::to_string(batch) +
                     " --set train.max_steps=" + std::to_string(steps) +
                     " --set checkpoint.dir=" + dir.path("ck") +
                     " --metrics " + dir.path("metrics.jsonl") + " " + extra;
  if (auto_split) {
    args += " --set balance.split=auto --set balance.granularity=4 --set profile.db=" +
            dir.path("perf.db") + " --set profile.repeats=5 --set profile.warmup=1" +
            " --set balance.allreduce=none";
  }
  return args;
}

std::vector<std::string> records(const std::string& path, const std::string& event) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\": \"" + event + "\"") != std::string::npos) out.push_back(line);
  }
  return out;
}

// The integers of the JSON array `key` in `record`.
std::vector<int64_t> int_array(const std::string& record, const std::string& key) {
  const size_t at = record.find("\"" + key + "\": [");
  if (at == std::string::npos) return {};
  std::vector<int64_t> out;
  const char* p = record.c_str() + record.find('[', at) + 1;
  while (*p != ']') {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

int64_t number(const std::string& record, const std::string& key) {
  const size_t at = record.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::stoll(record.substr(at + key.size() + 4));
}

std::vector<float> final_parameters(const test_support::TempDir& dir) {
  const auto latest = worker::latest_checkpoint(dir.path("ck"));
  return latest ? worker::load_checkpoint(*latest).parameters : std::vector<float>{};
}

// Max |a - b| over max |a|.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(a[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

TEST(RebalanceMpi, ASlowedRankGetsFewerSamplesWithinTwentyStepsAndWeightsStayExact) {
  constexpr int kSlowFrom = 25, kSteps = 60;
  test_support::TempDir one, two;
  std::string out;
  ASSERT_EQ(test_support::run_command(train_args(one, 48, kSteps, false), &out), 0) << out;
  ASSERT_EQ(test_support::run_command("VTRAIN_SLOW_RANK=1 VTRAIN_SLOW_AT_STEP=" +
                                          std::to_string(kSlowFrom) + " " + mpirun(2) +
                                          train_args(two, 48, kSteps, true),
                                      &out),
            0)
      << out;
  EXPECT_NE(out.find("rebalance: calibrated"), std::string::npos) << out;
  const std::vector<std::string> switches = records(two.path("metrics.jsonl"), "rebalance");
  ASSERT_FALSE(switches.empty()) << out;
  const std::string& first = switches.front();
  const int64_t at = number(first, "step");  // the first step (1-based) on the new split
  EXPECT_GT(at, kSlowFrom) << first;
  EXPECT_LE(at - 1 - kSlowFrom, 20) << first;
  const std::vector<int64_t> before = int_array(first, "previous_split");
  const std::vector<int64_t> after = int_array(first, "split");
  ASSERT_EQ(before.size(), 2u) << first;
  ASSERT_EQ(after.size(), 2u) << first;
  EXPECT_LT(after[1], before[1]) << first;
  EXPECT_EQ(after[0] + after[1], 48) << first;
  EXPECT_NE(out.find("rebalance: from step " + std::to_string(at)), std::string::npos) << out;

  // The same global batches, whatever the split: the weights of one rank.
  const std::vector<float> a = final_parameters(one), b = final_parameters(two);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  const double d = relative_difference(a, b);
  std::printf("switched at step %lld (%s -> %s); after %d steps vs 1 rank: relative %.3g\n",
              static_cast<long long>(at), std::to_string(before[1]).c_str(),
              std::to_string(after[1]).c_str(), kSteps, d);
  EXPECT_LE(d, 1e-5);
}

TEST(RebalanceMpi, AnUndisturbedRunOfAThousandStepsKeepsItsSplit) {
  test_support::TempDir dir;
  std::string out;
  ASSERT_EQ(test_support::run_command(
                mpirun(2) + train_args(dir, 16, 1000, true, "--set train.log_every=100"), &out),
            0)
      << out;
  // The re-balancer ran (it calibrated), and never switched.
  EXPECT_NE(out.find("rebalance: calibrated"), std::string::npos) << out;
  EXPECT_TRUE(records(dir.path("metrics.jsonl"), "rebalance").empty()) << out;
  const std::vector<std::string> end = records(dir.path("metrics.jsonl"), "end");
  ASSERT_EQ(end.size(), 1u) << out;
  EXPECT_EQ(number(end.front(), "steps"), 1000);
  EXPECT_EQ(number(end.front(), "rebalances"), 0);
}

}  // namespace
}  // namespace vtrain
