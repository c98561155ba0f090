// The workspace plans against brute force on small random instances (WR and
// the Pareto fronts over every configuration, WD over every combination of
// front points), the GLPK and knapsack solvers against each other, and the
// messages users see when a plan is impossible. The batch split is in
// balancer_test.cpp.
//
// Times in random instances are multiples of 1/8 ms, so sums are exact in
// floating point whatever the order of addition and results can be compared
// for equality.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "balancer/internal/choice_knapsack.h"
#include "balancer/workspace_plan.h"
#include "tests/balancer_random.h"
#include "tests/test_support.h"

namespace vtrain::balancer {

// Readable gtest output for configurations.
void PrintTo(const MicroBatch& call, std::ostream* os) { *os << call.algorithm << " x" << call.size; }

namespace {

using test::eighths;
using test::kMiB;
using test::uniform;
using test_support::error_message;

// ========================================================= WR and the fronts

ConvKernel random_kernel(std::mt19937& rng, int64_t batch, int algorithms) {
  ConvKernel kernel{"k", batch, {}};
  std::set<int64_t> sizes = {batch};
  const int extra_sizes = uniform(rng, 0, 4);
  for (int i = 0; i < extra_sizes; ++i) sizes.insert(uniform(rng, 1, static_cast<int>(batch)));
  for (int a = 0; a < algorithms; ++a) {
    const std::string name = "algo" + std::to_string(a);
    const double per_image = eighths(rng, 1, 6);
    const uint64_t workspace_per_image = uniform(rng, 0, 3) == 0 ? 0 : uniform(rng, 1, 50);
    for (int64_t m : sizes) {
      if (uniform(rng, 0, 5) == 0) continue;  // not every algorithm supports every size
      kernel.options.push_back({name, m, eighths(rng, 0, 4) + per_image * double(m),
                                workspace_per_image * uint64_t(m) + uniform(rng, 0, 20)});
    }
  }
  if (kernel.options.empty()) kernel.options.push_back({"fallback", batch, 100, 0});
  return kernel;
}

struct Configuration {
  double time = 0;
  uint64_t workspace = 0;
};

// Every configuration of `kernel` (one per multiset of options summing to
// the batch) whose calls fit `limit`.
std::vector<Configuration> all_configurations(const ConvKernel& kernel, uint64_t limit) {
  std::vector<Configuration> out;
  std::function<void(int64_t, size_t, Configuration)> visit = [&](int64_t left, size_t first, Configuration c) {
    if (left == 0) {
      out.push_back(c);
      return;
    }
    for (size_t o = first; o < kernel.options.size(); ++o) {
      const AlgorithmOption& option = kernel.options[o];
      if (option.micro_batch > left || option.workspace_bytes > limit) continue;
      visit(left - option.micro_batch, o,
            {c.time + option.time_ms, std::max(c.workspace, option.workspace_bytes)});
    }
  };
  visit(kernel.batch, 0, {});
  return out;
}

std::vector<Configuration> non_dominated(std::vector<Configuration> points) {
  std::sort(points.begin(), points.end(), [](const Configuration& a, const Configuration& b) {
    return a.workspace != b.workspace ? a.workspace < b.workspace : a.time < b.time;
  });
  std::vector<Configuration> front;
  for (const Configuration& p : points) {
    if (front.empty() || p.time < front.back().time) front.push_back(p);
  }
  return front;
}

// The configuration is what it claims: options of the kernel within the
// limit, sizes adding up to the batch, the time and workspace they give.
void expect_consistent(const ConvKernel& kernel, const KernelConfig& config, uint64_t limit) {
  int64_t images = 0;
  double time = 0;
  uint64_t workspace = 0;
  for (const MicroBatch& call : config.micro_batches) {
    const auto it = std::find_if(kernel.options.begin(), kernel.options.end(), [&](const AlgorithmOption& o) {
      return o.algorithm == call.algorithm && o.micro_batch == call.size;
    });
    ASSERT_NE(it, kernel.options.end()) << call.algorithm << " at " << call.size << " was not measured";
    EXPECT_LE(it->workspace_bytes, limit);
    images += call.size;
    time += it->time_ms;
    workspace = std::max(workspace, it->workspace_bytes);
  }
  EXPECT_EQ(images, kernel.batch);
  EXPECT_EQ(config.time_ms, time);
  EXPECT_EQ(config.workspace_bytes, workspace);
  for (size_t i = 1; i < config.micro_batches.size(); ++i) {
    EXPECT_GE(config.micro_batches[i - 1].size, config.micro_batches[i].size) << "largest call first";
  }
}

TEST(WorkspaceReuse, MatchesBruteForce) {
  int infeasible = 0;
  for (uint32_t seed = 0; seed < 400; ++seed) {
    std::mt19937 rng(seed);
    const ConvKernel kernel = random_kernel(rng, uniform(rng, 1, 8), uniform(rng, 2, 3));
    const uint64_t limit = uniform(rng, 0, 3) == 0 ? kNoWorkspaceLimit : uniform(rng, 0, 300);
    const std::vector<Configuration> all = all_configurations(kernel, limit);
    SCOPED_TRACE("seed " + std::to_string(seed));
    if (all.empty()) {
      error_message<InfeasibleError>([&] { plan_workspace_reuse(kernel, limit); });
      ++infeasible;
      continue;
    }
    // The fastest, and among the fastest the least workspace.
    Configuration best = all.front();
    for (const Configuration& c : all) {
      if (c.time < best.time || (c.time == best.time && c.workspace < best.workspace)) best = c;
    }
    const KernelConfig config = plan_workspace_reuse(kernel, limit);
    EXPECT_EQ(config.time_ms, best.time);
    EXPECT_EQ(config.workspace_bytes, best.workspace);
    expect_consistent(kernel, config, limit);
  }
  EXPECT_GT(infeasible, 10);
}

TEST(WorkspaceReuse, SplitsTheBatchWhenThatIsFaster) {
  // A fast algorithm that fits the 100-byte limit only at 2 images.
  const ConvKernel kernel{"conv1/Forward", 8,
                          {{"gemm", 8, 40, 0}, {"fft", 8, 7, 400}, {"fft", 4, 4, 200}, {"fft", 2, 2, 100}}};
  const KernelConfig config = plan_workspace_reuse(kernel, 100);
  EXPECT_EQ(config.micro_batches, (std::vector<MicroBatch>{{"fft", 2}, {"fft", 2}, {"fft", 2}, {"fft", 2}}));
  EXPECT_EQ(config.time_ms, 8);
  EXPECT_EQ(config.workspace_bytes, 100u);
  // Unlimited, one call at 8 is fastest; at 200 bytes, 4 + 4 ties 2 x 4 on
  // time and needs more workspace, so 2 x 4 it stays.
  EXPECT_EQ(plan_workspace_reuse(kernel, 200).micro_batches,
            (std::vector<MicroBatch>{{"fft", 2}, {"fft", 2}, {"fft", 2}, {"fft", 2}}));
  EXPECT_EQ(plan_workspace_reuse(kernel).micro_batches, (std::vector<MicroBatch>{{"fft", 8}}));
  EXPECT_EQ(plan_workspace_reuse(kernel, 0).micro_batches, (std::vector<MicroBatch>{{"gemm", 8}}));
}

TEST(WorkspaceReuse, ImpossibleLimitsAreExplained) {
  const ConvKernel kernel{"conv2/BackwardData", 6, {{"fft", 6, 1, 4096}, {"fft", 4, 1, 1024}}};
  EXPECT_CONTAINS(error_message<InfeasibleError>([&] { plan_workspace_reuse(kernel, 100); }),
                  "kernel conv2/BackwardData: no configuration covers its batch of 6 images within a workspace of "
                  "100 B: every option needs more (the smallest needs 1 KiB)");
  EXPECT_CONTAINS(error_message<InfeasibleError>([&] { plan_workspace_reuse(kernel, 2048); }),
                  "the micro-batch sizes with an option that fits (4) do not add up to 6");
  EXPECT_CONTAINS(error_message<BalancerError>([&] {
                    plan_workspace_reuse(ConvKernel{"k", 4, {{"a", 5, 1, 0}}});
                  }),
                  "micro-batch is outside 1..4");
  EXPECT_CONTAINS(error_message<BalancerError>([&] {
                    plan_workspace_reuse(ConvKernel{"k", 4, {{"a", 4, 1, 0}, {"a", 4, 2, 0}}});
                  }),
                  "measured twice");
}

TEST(MicroBatchSizes, FollowThePolicies) {
  EXPECT_EQ(micro_batch_sizes(MicroBatchPolicy::kAll, 4), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(micro_batch_sizes(MicroBatchPolicy::kPowerOfTwo, 8), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(micro_batch_sizes(MicroBatchPolicy::kPowerOfTwo, 12), (std::vector<int64_t>{1, 2, 4, 8, 12}));
  EXPECT_EQ(micro_batch_sizes(MicroBatchPolicy::kUndivided, 12), (std::vector<int64_t>{12}));
  EXPECT_CONTAINS(error_message<BalancerError>([] { micro_batch_sizes(MicroBatchPolicy::kAll, 0); }),
                  "not positive");
}

TEST(ParetoFront, EqualsTheNonDominatedConfigurations) {
  for (uint32_t seed = 0; seed < 400; ++seed) {
    std::mt19937 rng(seed + 5000);
    const ConvKernel kernel = random_kernel(rng, uniform(rng, 1, 8), uniform(rng, 2, 3));
    const uint64_t limit = uniform(rng, 0, 2) == 0 ? uniform(rng, 50, 300) : kNoWorkspaceLimit;
    const std::vector<Configuration> expected = non_dominated(all_configurations(kernel, limit));
    SCOPED_TRACE("seed " + std::to_string(seed));
    if (expected.empty()) {
      error_message<InfeasibleError>([&] { pareto_front(kernel, limit); });
      continue;
    }
    const std::vector<KernelConfig> front = pareto_front(kernel, limit);
    ASSERT_EQ(front.size(), expected.size());
    for (size_t i = 0; i < front.size(); ++i) {
      EXPECT_EQ(front[i].time_ms, expected[i].time);
      EXPECT_EQ(front[i].workspace_bytes, expected[i].workspace);
      expect_consistent(kernel, front[i], limit);
      if (i > 0) {  // sorted, workspace up and time strictly down
        EXPECT_GT(front[i].workspace_bytes, front[i - 1].workspace_bytes);
        EXPECT_LT(front[i].time_ms, front[i - 1].time_ms);
      }
    }
    // The fastest point is WR's answer.
    EXPECT_EQ(front.back().time_ms, plan_workspace_reuse(kernel, limit).time_ms);
  }
}

// ============================================================== WD

struct Combination {
  double time;
  uint64_t workspace;
};

// The fastest combination of one front point per kernel within the budget.
std::optional<Combination> brute_force_division(const std::vector<std::vector<KernelConfig>>& fronts,
                                                uint64_t budget) {
  std::optional<Combination> best;
  std::function<void(size_t, double, uint64_t)> visit = [&](size_t k, double time, uint64_t workspace) {
    if (workspace > budget) return;
    if (k == fronts.size()) {
      if (!best || time < best->time) best = Combination{time, workspace};
      return;
    }
    for (const KernelConfig& c : fronts[k]) visit(k + 1, time + c.time_ms, workspace + c.workspace_bytes);
  };
  visit(0, 0.0, 0);
  return best;
}

void expect_valid_division(const WorkspaceDivision& division, const std::vector<std::vector<KernelConfig>>& fronts,
                           uint64_t budget) {
  ASSERT_EQ(division.configs.size(), fronts.size());
  ASSERT_EQ(division.offsets.size(), fronts.size());
  double time = 0;
  uint64_t offset = 0;
  for (size_t k = 0; k < fronts.size(); ++k) {
    const KernelConfig& chosen = division.configs[k];
    EXPECT_TRUE(std::any_of(fronts[k].begin(), fronts[k].end(), [&](const KernelConfig& c) {
      return c.time_ms == chosen.time_ms && c.workspace_bytes == chosen.workspace_bytes &&
             c.micro_batches == chosen.micro_batches;
    })) << "kernel " << k << ": not a front point";
    EXPECT_EQ(division.offsets[k], offset);  // laid out back to back
    offset += chosen.workspace_bytes;
    time += chosen.time_ms;
  }
  EXPECT_EQ(division.total_workspace_bytes, offset);
  EXPECT_LE(division.total_workspace_bytes, budget);
  EXPECT_DOUBLE_EQ(division.total_time_ms, time);
}

void check_division_against_brute_force(WorkspaceDivisionSolver solver, uint32_t first_seed, int seeds) {
  int solved = 0, infeasible = 0;
  for (uint32_t seed = first_seed; seed < first_seed + seeds; ++seed) {
    std::mt19937 rng(seed);
    std::vector<ConvKernel> kernels;
    const int count = uniform(rng, 1, 4);
    for (int k = 0; k < count; ++k) {
      kernels.push_back(random_kernel(rng, uniform(rng, 1, 8), uniform(rng, 2, 3)));
      kernels.back().name = "kernel";
      kernels.back().name += std::to_string(k);
      // A slow undivided algorithm, so that every kernel has a configuration.
      kernels.back().options.push_back({"direct", kernels.back().batch, 1000, uint64_t(uniform(rng, 0, 100))});
    }
    std::vector<std::vector<KernelConfig>> fronts;
    uint64_t least = 0, fastest = 0;
    for (const ConvKernel& kernel : kernels) {
      fronts.push_back(pareto_front(kernel));
      least += fronts.back().front().workspace_bytes;
      fastest += fronts.back().back().workspace_bytes;
    }
    // Mostly between the least and the fastest total, sometimes outside.
    const uint64_t budget = uniform(rng, 0, 9) == 0 ? least / 2 : least + uniform(rng, 0, 110) * (fastest - least) / 100;
    SCOPED_TRACE("seed " + std::to_string(seed) + ", budget " + std::to_string(budget));
    WorkspaceDivisionOptions options;
    options.solver = solver;
    const std::optional<Combination> best = brute_force_division(fronts, budget);
    if (!best) {
      error_message<InfeasibleError>([&] { plan_workspace_division(kernels, budget, options); });
      ++infeasible;
      continue;
    }
    const WorkspaceDivision division = plan_workspace_division(kernels, budget, options);
    EXPECT_EQ(division.total_time_ms, best->time);
    // The fronts limited to the budget are the unlimited fronts cut at it.
    std::vector<std::vector<KernelConfig>> limited;
    for (const ConvKernel& kernel : kernels) limited.push_back(pareto_front(kernel, budget));
    expect_valid_division(division, limited, budget);
    ++solved;
  }
  EXPECT_GT(solved, seeds / 2);
  EXPECT_GT(infeasible, 0);
}

TEST(WorkspaceDivision, MatchesBruteForce) {
  check_division_against_brute_force(WorkspaceDivisionSolver::kKnapsack, 1, 500);
}

TEST(WorkspaceDivision, GlpkMatchesBruteForce) {
  check_division_against_brute_force(WorkspaceDivisionSolver::kGlpk, 1, 250);
}

// Random Pareto fronts of `points` points each (dyadic times, distinct
// workspaces), as the knapsack and the ILP see them.
std::vector<std::vector<KernelConfig>> random_fronts(std::mt19937& rng, int kernels, int max_points) {
  std::vector<std::vector<KernelConfig>> fronts;
  for (int k = 0; k < kernels; ++k) {
    std::vector<KernelConfig>& front = fronts.emplace_back();
    double time = eighths(rng, 20, 200);
    uint64_t workspace = uniform(rng, 0, 1) ? 0 : uniform(rng, 1, 100);
    const int points = uniform(rng, 1, max_points);
    for (int p = 0; p < points; ++p) {
      front.push_back({{{"a", 1}}, time, workspace});
      time -= eighths(rng, 1, 16);
      workspace += uniform(rng, 1, 200);
      if (time <= 0) break;
    }
  }
  return fronts;
}

TEST(WorkspaceDivision, KnapsackMatchesBruteForceOnWiderFronts) {
  for (uint32_t seed = 0; seed < 300; ++seed) {
    std::mt19937 rng(seed + 9000);
    const auto fronts = random_fronts(rng, uniform(rng, 1, 5), 6);
    uint64_t least = 0, fastest = 0;
    for (const auto& front : fronts) {
      least += front.front().workspace_bytes;
      fastest += front.back().workspace_bytes;
    }
    const uint64_t budget = least + uniform(rng, 0, 100) * (fastest - least) / 100;
    const std::optional<Combination> best = brute_force_division(fronts, budget);
    ASSERT_TRUE(best.has_value());
    const WorkspaceDivision division = plan_workspace_division(fronts, {}, budget);
    EXPECT_EQ(division.total_time_ms, best->time) << "seed " << seed;
    expect_valid_division(division, fronts, budget);
  }
}

TEST(WorkspaceDivision, KnapsackAgreesWithGlpkOnLargerInstances) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(seed + 7000);
    const auto fronts = random_fronts(rng, uniform(rng, 10, 40), 8);
    uint64_t least = 0, fastest = 0;
    for (const auto& front : fronts) {
      least += front.front().workspace_bytes;
      fastest += front.back().workspace_bytes;
    }
    const uint64_t budget = least + uniform(rng, 5, 95) * (fastest - least) / 100;
    WorkspaceDivisionOptions glpk;
    glpk.solver = WorkspaceDivisionSolver::kGlpk;
    const WorkspaceDivision reference = plan_workspace_division(fronts, {}, budget, glpk);
    const WorkspaceDivision division = plan_workspace_division(fronts, {}, budget);
    // GLPK proves optimality up to its tolerances, the knapsack exactly.
    EXPECT_LE(division.total_time_ms, reference.total_time_ms + 1e-9) << "seed " << seed;
    EXPECT_NEAR(division.total_time_ms, reference.total_time_ms, 1e-6 * reference.total_time_ms) << "seed " << seed;
    expect_valid_division(division, fronts, budget);
  }
}

TEST(WorkspaceDivision, TightAndLooseBudgets) {
  const ConvKernel a{"a", 4, {{"slow", 4, 40, 0}, {"fast", 4, 10, 300}, {"fast", 2, 6, 150}}};
  const ConvKernel b{"b", 4, {{"slow", 4, 30, 10}, {"fast", 4, 12, 200}}};
  const std::vector<ConvKernel> kernels = {a, b};
  // Everything fits: each kernel at its fastest.
  WorkspaceDivision loose = plan_workspace_division(kernels, 10000);
  EXPECT_EQ(loose.total_time_ms, 22);
  EXPECT_EQ(loose.offsets, (std::vector<uint64_t>{0, 300}));
  EXPECT_EQ(loose.total_workspace_bytes, 500u);
  // 360 bytes: a splits into two calls (150) and b runs fast (200).
  WorkspaceDivision tight = plan_workspace_division(kernels, 360);
  EXPECT_EQ(tight.configs[0].micro_batches, (std::vector<MicroBatch>{{"fast", 2}, {"fast", 2}}));
  EXPECT_EQ(tight.total_time_ms, 24);
  EXPECT_EQ(tight.offsets, (std::vector<uint64_t>{0, 150}));
  // Exactly the least: both slow.
  EXPECT_EQ(plan_workspace_division(kernels, 10).total_time_ms, 70);
  // The same fronts, unlimited: at 160 bytes a's two calls fill exactly
  // what b's least leaves.
  std::vector<std::vector<KernelConfig>> fronts = {pareto_front(a), pareto_front(b)};
  EXPECT_EQ(plan_workspace_division(fronts, {}, 160).total_time_ms, 42);
}

TEST(WorkspaceDivision, BudgetBelowTheLeastIsExplained) {
  const std::vector<ConvKernel> kernels = {{"conv1/Forward", 2, {{"gemm", 2, 1, 3 * kMiB}}},
                                           {"conv2/Forward", 2, {{"gemm", 2, 1, 5 * kMiB}, {"fft", 1, 1, 4 * kMiB}}}};
  const std::string message = error_message<InfeasibleError>([&] { plan_workspace_division(kernels, 6 * kMiB); });
  EXPECT_CONTAINS(message, "workspace budget 6 MiB is below the least the 2 kernels can run in: 7 MiB");
  EXPECT_CONTAINS(message, "the largest of those is kernel conv2/Forward with 4 MiB");
}

TEST(WorkspaceDivision, RejectsMalformedFronts) {
  std::vector<std::vector<KernelConfig>> fronts = {{{{}, 5, 10}, {{}, 6, 20}}};
  EXPECT_CONTAINS(error_message<BalancerError>([&] { plan_workspace_division(fronts, {}, 100); }),
                  "the front is not sorted");
  fronts = {{}};
  EXPECT_CONTAINS(error_message<BalancerError>([&] { plan_workspace_division(fronts, {}, 100); }), "empty front");
  const std::vector<std::string> names = {"x", "y"};
  fronts = {{{{}, 5, 10}}};
  EXPECT_CONTAINS(error_message<BalancerError>([&] { plan_workspace_division(fronts, names, 100); }),
                  "2 names for 1 kernels");
}

TEST(ChoiceKnapsack, MatchesBruteForceIncludingInfeasible) {
  // Up to 8 groups of 5 items: enough open groups after fixing for the
  // bounded DP and the deepening targets to matter.
  for (uint32_t seed = 0; seed < 400; ++seed) {
    std::mt19937 rng(seed + 12000);
    const auto fronts = random_fronts(rng, uniform(rng, 1, 8), 5);
    std::vector<std::vector<internal::KnapsackItem>> groups;
    uint64_t least = 0;
    for (const auto& front : fronts) {
      auto& items = groups.emplace_back();
      for (const KernelConfig& c : front) items.push_back({c.time_ms, c.workspace_bytes});
      least += front.front().workspace_bytes;
    }
    const auto capacity = static_cast<uint64_t>(std::max<int64_t>(0, int64_t(least) + uniform(rng, -100, 800)));
    const std::optional<Combination> best = brute_force_division(fronts, capacity);
    const auto choice = internal::solve_choice_knapsack(groups, capacity);
    ASSERT_EQ(choice.has_value(), best.has_value()) << "seed " << seed;
    if (!choice) continue;
    double time = 0;
    uint64_t weight = 0;
    for (size_t k = 0; k < groups.size(); ++k) {
      time += groups[k][(*choice)[k]].time;
      weight += groups[k][(*choice)[k]].weight;
    }
    EXPECT_EQ(time, best->time) << "seed " << seed;
    EXPECT_LE(weight, capacity);
  }
}

}  // namespace
}  // namespace vtrain::balancer
