// Online re-balancing through mpirun, as users run vtrain (ctest label mpi):
// a rank slowed down 2x mid-run (VTRAIN_SLOW_*) gets fewer samples within
// 20 steps and the gradient stays the whole batch's across the switch; a
// rank left with no samples gets them back when it recovers; an
// undisturbed run of 1,000 steps switches at most twice, each time on a
// drift over the threshold (this VM's own slowdowns).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "balancer/batch_split.h"
#include "balancer/plan.h"
#include "tests/mpi_runs.h"
#include "tests/test_support.h"
#include "worker/train/checkpoint.h"

namespace vtrain {
namespace {

using test_support::source_dir;

// Unbound ranks are one device: they share one profile, so the static
// split is even and does not depend on how the profiling went.
std::string mpirun(int ranks) { return test_support::mpirun(ranks, "--bind-to none"); }

// LeNet on synthetic data; with `auto_split`, profiled in place and split
// by rank 0 (the re-balancer's curves), the exchange left out of the model.
// The steps are profiled in 3 rounds: in one, a slow spell of the VM on one
// batch's runs could make the curves keep 24 + 24 however slow rank 1 got.
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
            " --set profile.step_rounds=3" +
            " --set balance.allreduce=none";
  }
  return args;
}

// Replaces every profiled step time in the perf DB at `path` by a clean
// line, 0.1 ms + 0.1 ms a sample (training's first window scales each
// rank's curve to what it measures, so only the shape counts). A slow spell
// of this shared 2-core VM while the batches 16, 24 and 32 were timed once
// left them one pooled time (balancer::make_monotone): on that flat
// curve, taking samples off rank 0 saves nothing, so a recovered rank got
// none back, as the curve said.
void make_step_times_linear(const std::string& path) {
  sqlite3* db = nullptr;
  const int opened = sqlite3_open(path.c_str(), &db);
  char* error = nullptr;
  const int rc = opened == SQLITE_OK ? sqlite3_exec(db,
                                                    "UPDATE step_measurements SET time_ms ="
                                                    " 0.1 + 0.1 * batch",
                                                    nullptr, nullptr, &error)
                                     : opened;
  const std::string message = error != nullptr ? error : sqlite3_errmsg(db);
  sqlite3_free(error);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << path << ": " << message;
}

std::vector<std::string> records(const std::string& path, const std::string& event) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\": \"" + event + "\"") != std::string::npos) out.push_back(line);
  }
  return out;
}

// The numbers of the JSON array `key` in `record`.
std::vector<double> real_array(const std::string& record, const std::string& key) {
  const size_t at = record.find("\"" + key + "\": [");
  if (at == std::string::npos) return {};
  std::vector<double> out;
  const char* p = record.c_str() + record.find('[', at) + 1;
  while (*p != ']') {
    char* end = nullptr;
    out.push_back(std::strtod(p, &end));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

// The integers of the JSON array `key` in `record` (batches: exact in a double).
std::vector<int64_t> int_array(const std::string& record, const std::string& key) {
  const std::vector<double> reals = real_array(record, key);
  return std::vector<int64_t>(reals.begin(), reals.end());
}

double real(const std::string& record, const std::string& key) {
  const size_t at = record.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::stod(record.substr(at + key.size() + 4));
}

int64_t number(const std::string& record, const std::string& key) {
  const size_t at = record.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::stoll(record.substr(at + key.size() + 4));
}

// LeNet's step at batch 48 is about 4 ms: moving samples off the rank
// slowed 2x saves 1.5-2 ms of it, at times under the default
// balance.rebalance.min_gain_ms of 2 (a full-suite run kept 24,24 at a 51%
// drift predicted 22.7%, 1.52 ms, faster). The 10% least gain still stands
// against noise.
TEST(RebalanceMpi, ASlowedRankGetsFewerSamplesWithinTwentyStepsAndWeightsStayExact) {
  constexpr int kSlowFrom = 25, kSteps = 60;
  test_support::TempDir one, two;
  std::string out;
  ASSERT_EQ(test_support::run_command(train_args(one, 48, kSteps, false), &out), 0) << out;
  // Every step's checkpoint kept: the weights are compared just after the
  // switch too. The re-balanced run gathers each next batch ahead and
  // copies it to the input staging during the step before (data.prefetch
  // on; auto would not for LeNet on the CPU): a copy pending across a
  // switch (a rebuilt network, a batch of another size) changes nothing.
  const std::string every_step = "--set checkpoint.every=1 --set checkpoint.keep=1000";
  ASSERT_EQ(test_support::run_command("VTRAIN_SLOW_RANK=1 VTRAIN_SLOW_AT_STEP=" +
                                          std::to_string(kSlowFrom) + " " + mpirun(2) +
                                          train_args(two, 48, kSteps, true,
                                                     every_step +
                                                         " --set data.prefetch=on"
                                                         " --set balance.rebalance.min_gain_ms=0.5"
                                                         " --set output.plan=" +
                                                         two.path("plan.yaml")),
                                      &out),
            0)
      << out;
  EXPECT_NE(out.find("rebalance: calibrated"), std::string::npos) << out;
  const std::vector<std::string> ends = records(two.path("metrics.jsonl"), "end");
  ASSERT_EQ(ends.size(), 1u) << out;
  EXPECT_GT(number(ends[0], "prefetched_batches"), kSteps / 2) << ends[0];
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

  // Exact across the switches: the weights of two ranks that ran the same
  // splits fixed, each segment resumed from the last one's checkpoint.
  test_support::TempDir fixed;
  std::vector<int64_t> split = before;
  int64_t from = 0;  // steps done
  for (size_t k = 0; k <= switches.size(); ++k) {
    const int64_t until = k < switches.size() ? number(switches[k], "step") - 1 : kSteps;
    const std::string args = every_step + " --set balance.split=manual --set balance.manual=[" +
                             balancer::join_batches(split) + "]" + (from > 0 ? " --resume" : "");
    ASSERT_EQ(test_support::run_command(
                  mpirun(2) + train_args(fixed, 48, static_cast<int>(until), false, args), &out),
              0)
        << out;
    if (k < switches.size()) split = int_array(switches[k], "split");
    from = until;
  }
  const std::vector<float> a = mpi_runs::final_parameters(one.path("ck")),
                           b = mpi_runs::final_parameters(two.path("ck")),
                           c = mpi_runs::final_parameters(fixed.path("ck"));
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(c.size(), b.size());
  // Exact across the switch: from the auto run's own checkpoint before the
  // switch, two steps of the new split fixed end where the auto run's two
  // steps did. (The whole runs differ by more: the auto split runs its
  // plan's algorithms, the fixed one direct, and that rounding, amplified
  // over 60 steps, is up to 1e-3.)
  const auto at_step = [](const test_support::TempDir& dir, int64_t step) {
    char name[32];
    std::snprintf(name, sizeof name, "ckpt-%010lld.vtc", static_cast<long long>(step));
    return dir.path("ck") + "/" + name;
  };
  test_support::TempDir across;
  std::filesystem::create_directories(across.path("ck"));
  std::filesystem::copy_file(at_step(two, at - 1), at_step(across, at - 1));
  ASSERT_EQ(test_support::run_command(
                mpirun(2) + train_args(across, 48, static_cast<int>(at + 1), false,
                                       "--set balance.split=manual --set balance.manual=[" +
                                           balancer::join_batches(after) + "] --resume"),
                &out),
            0)
      << out;
  const double just_after =
      test_support::compare(worker::load_checkpoint(at_step(across, at + 1)).parameters,
                            worker::load_checkpoint(at_step(two, at + 1)).parameters)
          .relative;
  const double exact = test_support::compare(c, b).relative;
  const double one_rank = test_support::compare(a, b).relative;
  std::printf("switched at step %lld (%s -> %s); two steps on from its checkpoint, fixed: "
              "relative %.3g; after %d steps vs the same splits fixed: %.3g, vs 1 rank: %.3g\n",
              static_cast<long long>(at), std::to_string(before[1]).c_str(),
              std::to_string(after[1]).c_str(), just_after, kSteps, exact, one_rank);
  std::string all;
  for (const std::string& r : switches) all += r + "\n";
  EXPECT_LE(just_after, 1e-6) << all;

  // After the last switch the ranks run the conv kernels planned for their
  // new batches (output.plan, rewritten at every switch, holds that plan),
  // not the old batch's calls cycled: from the checkpoint before it, a run
  // that follows the plan file ends bit for bit where the auto run did.
  const int64_t last = number(switches.back(), "step");
  const std::string plan = two.path("plan.yaml");
  std::vector<int64_t> planned;
  for (const balancer::RankPlan& r : balancer::load_plan(plan).ranks) planned.push_back(r.batch);
  EXPECT_EQ(planned, int_array(switches.back(), "split")) << all;
  const int64_t until = std::min<int64_t>(last + 1, kSteps);
  test_support::TempDir follow;
  std::filesystem::create_directories(follow.path("ck"));
  std::filesystem::copy_file(at_step(two, last - 1), at_step(follow, last - 1));
  ASSERT_EQ(test_support::run_command(
                mpirun(2) + train_args(follow, 48, static_cast<int>(until), false,
                                       "--plan " + plan + " --resume"),
                &out),
            0)
      << out;
  const std::vector<float> followed = worker::load_checkpoint(at_step(follow, until)).parameters,
                           ran = worker::load_checkpoint(at_step(two, until)).parameters;
  EXPECT_TRUE(followed == ran) << "relative " << test_support::compare(followed, ran).relative
                               << " after step " << until << "\n" << all;
  // After 60 steps, the same global batches as one rank's and as the fixed
  // splits'. Per-rank batches and kernels change the rounding, which this
  // LeNet amplifies when a ReLU or a max flips: a fixed split of 36 + 12
  // ends 1e-3 from one rank after 60 steps (2e-7 at step 10), 24 + 24 at
  // 3e-7; the auto run ends 8e-9 from the fixed splits where its plan
  // chose direct everywhere, 1e-3 where it did not. A wrong sample or a
  // lost gradient is orders of magnitude more.
  EXPECT_LE(exact, 1e-2) << all;
  EXPECT_LE(one_rank, 1e-2);
}

// Nothing is injected, but this is a shared 2-vCPU VM: one rank is at times
// 1.3-1.65x slower than the other for tens to hundreds of steps, bound to
// cores or not (four failures of "no switch at all" in two days, 3 of 3
// passes on a quiet hour), and re-balancing is then the right answer. So:
// every switch on a drift over the threshold, and, on an otherwise idle
// machine, at most two in 1,000 steps: a detector that re-planned on noise
// (no patience, no least gain) switches at every one of the dozens of drifts
// such a run logs. The count is a claim about the machine's steadiness (under
// ctest -j2, or with other builds running, rank speeds drift for real and
// 4 switches were seen): it is checked only with VTRAIN_IDLE_MACHINE=1, as the
// timing tests are; DriftDetector.OutliersAndNoiseNeverFire checks the
// patience on synthetic noise everywhere.
TEST(RebalanceMpi, AnUndisturbedRunOfAThousandStepsKeepsItsSplit) {
  test_support::TempDir dir;
  std::string out;
  ASSERT_EQ(test_support::run_command(
                mpirun(2) + train_args(dir, 16, 1000, true, "--set train.log_every=100"), &out),
            0)
      << out;
  EXPECT_NE(out.find("rebalance: calibrated"), std::string::npos) << out;
  const std::vector<std::string> switches = records(dir.path("metrics.jsonl"), "rebalance");
  const char* idle = std::getenv("VTRAIN_IDLE_MACHINE");
  if (idle != nullptr && std::string(idle) == "1") {
    EXPECT_LE(switches.size(), 2u) << out;
  } else {
    std::printf("%zu switches in 1,000 steps (at most 2 are checked with VTRAIN_IDLE_MACHINE=1)\n",
                switches.size());
  }
  for (const std::string& r : switches) {
    const size_t at = r.find("\"drift\": ");
    ASSERT_NE(at, std::string::npos) << r;
    EXPECT_GE(std::stod(r.substr(at + 9)), 0.25) << r;  // balance.rebalance.threshold
  }
  // Each step record: rank 0's wall time of the step, which holds its own
  // compute (the rest is the exchange, the wait for the others, the update).
  const std::vector<std::string> steps = records(dir.path("metrics.jsonl"), "step");
  EXPECT_EQ(steps.size(), 10u) << out;
  for (const std::string& s : steps) {
    const std::vector<double> compute = real_array(s, "compute_ms");
    ASSERT_EQ(compute.size(), 2u) << s;
    EXPECT_GT(compute[0], 0) << s;
    EXPECT_GE(real(s, "step_ms"), compute[0]) << s;
  }
  const std::vector<std::string> end = records(dir.path("metrics.jsonl"), "end");
  ASSERT_EQ(end.size(), 1u) << out;
  EXPECT_EQ(number(end.front(), "steps"), 1000);
  EXPECT_EQ(number(end.front(), "rebalances"), static_cast<int64_t>(switches.size()));
}

// A rank slowed 12x gives up all its samples; while it has none it times a
// probe every 5 steps, and when the slowdown ends (step 80) its probes
// speed up and rank 0 gives it samples back (batch 32: on LeNet's
// few-ms steps at 16 the giving back saved about balance.rebalance.
// min_gain_ms and was at times kept; at 32 it saves 2-3 ms of 6, and with
// a core busy elsewhere less than the default 2 ms, so 0.5 ms here: the
// 10% least gain still stands against noise). Epochs of 32 steps end in an
// evaluation, the one at step 64 while the rank is idle: it
// evaluates in chunks of 32, more than the 16 its network was built for.
TEST(RebalanceMpi, ARankLeftWithoutSamplesGetsThemBackWhenItRecovers) {
  constexpr int kSlowFrom = 20, kSlowUntil = 80, kSteps = 200;
  const std::string args =
      " --set balance.rebalance.probe_every=5 --set train.evaluate=true"
      " --set data.train_size=1024 --set data.test_size=128"
      " --set balance.rebalance.min_gain_ms=0.5";
  // The profile first, in a run of its own, then made clean.
  test_support::TempDir profiled;
  std::string out;
  ASSERT_EQ(test_support::run_command(mpirun(2) + train_args(profiled, 32, 1, true, args), &out),
            0)
      << out;
  make_step_times_linear(profiled.path("perf.db"));
  test_support::TempDir dir;
  std::filesystem::copy_file(profiled.path("perf.db"), dir.path("perf.db"));
  ASSERT_EQ(test_support::run_command(
                "VTRAIN_SLOW_RANK=1 VTRAIN_SLOW_FACTOR=12 VTRAIN_SLOW_AT_STEP=" +
                    std::to_string(kSlowFrom) + " VTRAIN_SLOW_UNTIL_STEP=" +
                    std::to_string(kSlowUntil) + " " + mpirun(2) +
                    train_args(dir, 32, kSteps, true, args),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("; 0 steps measured"), std::string::npos) << "not the linear steps\n" << out;
  const std::vector<std::string> switches = records(dir.path("metrics.jsonl"), "rebalance");
  const auto idle = std::find_if(switches.begin(), switches.end(), [](const std::string& r) {
    return int_array(r, "split") == std::vector<int64_t>{32, 0};
  });
  ASSERT_NE(idle, switches.end()) << "rank 1 never lost all its samples\n" << out;
  EXPECT_GT(number(*idle, "step"), kSlowFrom) << *idle;
  ASSERT_NE(idle + 1, switches.end()) << "rank 1 never got samples back\n" << out;
  const std::string& back = *(idle + 1);
  EXPECT_GT(int_array(back, "split").at(1), 0) << back;
  EXPECT_NE(back.find("rank 1's probes got"), std::string::npos) << back;
  // No probe before the slowdown ends says so; three after it do.
  EXPECT_GT(number(back, "step"), kSlowUntil) << back;
  EXPECT_LE(number(back, "step"), kSlowUntil + 60) << back;
  EXPECT_NE(out.find("rebalance: from step " + std::to_string(number(back, "step")) +
                     ", split 32,0 -> "),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace vtrain
