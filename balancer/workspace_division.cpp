// WD: one configuration per kernel from its Pareto front, least total time,
// total workspace within the budget (paper Sec. III-C, Eqs. 1-4).

#include "balancer/workspace_plan.h"

#include <cmath>

#include "balancer/internal/choice_knapsack.h"
#include "common/text.h"
#include "balancer/lp_model.h"

namespace vtrain::balancer {
namespace {

using common::format_bytes;

// Workspace coefficients in MiB for GLPK: a power-of-two scale is exact in
// floating point and keeps the row's numbers near the objective's.
constexpr double kBytesPerUnit = 1024.0 * 1024.0;

std::string kernel_label(std::span<const std::string> names, size_t k) {
  if (k < names.size()) return names[k];
  std::string label = "#";
  label += std::to_string(k);
  return label;
}

void check_fronts(std::span<const std::vector<KernelConfig>> fronts, std::span<const std::string> names) {
  if (!names.empty() && names.size() != fronts.size()) {
    throw BalancerError("workspace division: " + std::to_string(names.size()) + " names for " +
                        std::to_string(fronts.size()) + " kernels");
  }
  for (size_t k = 0; k < fronts.size(); ++k) {
    const std::vector<KernelConfig>& front = fronts[k];
    if (front.empty()) {
      throw BalancerError("workspace division: kernel " + kernel_label(names, k) + " has an empty front");
    }
    for (size_t c = 0; c < front.size(); ++c) {
      if (!std::isfinite(front[c].time_ms) || front[c].time_ms < 0 ||
          (c > 0 && (front[c].workspace_bytes <= front[c - 1].workspace_bytes ||
                     front[c].time_ms >= front[c - 1].time_ms))) {
        throw BalancerError("workspace division: kernel " + kernel_label(names, k) +
                            ": the front is not sorted by workspace ascending with time strictly descending");
      }
    }
  }
}

WorkspaceDivision assemble(std::span<const std::vector<KernelConfig>> fronts, const std::vector<size_t>& choice) {
  WorkspaceDivision division;
  for (size_t k = 0; k < fronts.size(); ++k) {
    const KernelConfig& config = fronts[k][choice[k]];
    division.offsets.push_back(division.total_workspace_bytes);
    division.total_workspace_bytes += config.workspace_bytes;
    division.total_time_ms += config.time_ms;
    division.configs.push_back(config);
  }
  return division;
}

// The paper's ILP as GLPK solves it: a binary per front point, one row per
// kernel fixing its choice, one budget row.
std::vector<size_t> solve_with_glpk(std::span<const std::vector<KernelConfig>> fronts,
                                    std::span<const std::string> names, uint64_t budget_bytes,
                                    const WorkspaceDivisionOptions& options) {
  LpModel model("workspace division");
  std::vector<Term> budget_row;
  for (size_t k = 0; k < fronts.size(); ++k) {
    std::vector<Term> one_config;
    for (const KernelConfig& config : fronts[k]) {
      const int column = model.add_binary(config.time_ms);
      one_config.push_back({column, 1.0});
      budget_row.push_back({column, static_cast<double>(config.workspace_bytes) / kBytesPerUnit});
    }
    model.add_row("one_config_" + kernel_label(names, k), RowSense::kEqual, 1.0, one_config);
  }
  model.add_row("workspace_budget", RowSense::kLessEqual, static_cast<double>(budget_bytes) / kBytesPerUnit,
                budget_row);
  const std::string infeasible =
      "workspace budget " + format_bytes(budget_bytes) + " cannot hold the kernels' workspaces";
  // GLPK accepts a row activity within its feasibility tolerance of the
  // bound, so a division may exceed the budget by a few bytes. Such a
  // division is cut off (the same set of choices may not recur) and the
  // model solved again, which keeps the answer exact in bytes.
  for (;;) {
    const MipSolution solution = model.solve(infeasible, SolveOptions{options.time_limit});
    std::vector<size_t> choice(fronts.size());
    std::vector<Term> chosen;
    uint64_t total = 0;
    int column = 0;
    for (size_t k = 0; k < fronts.size(); ++k) {
      for (size_t c = 0; c < fronts[k].size(); ++c, ++column) {
        if (solution.values[column] > 0.5) {
          choice[k] = c;
          total += fronts[k][c].workspace_bytes;
          chosen.push_back({column, 1.0});
        }
      }
    }
    if (total <= budget_bytes) return choice;
    model.add_row("cut_over_budget", RowSense::kLessEqual, static_cast<double>(chosen.size()) - 1, chosen);
  }
}

}  // namespace

WorkspaceDivision plan_workspace_division(std::span<const ConvKernel> kernels, uint64_t budget_bytes,
                                          const WorkspaceDivisionOptions& options) {
  std::vector<std::vector<KernelConfig>> fronts;
  std::vector<std::string> names;
  fronts.reserve(kernels.size());
  for (const ConvKernel& kernel : kernels) {
    // No single call may need more than the whole budget, so nothing above
    // it is worth keeping on a front.
    fronts.push_back(pareto_front(kernel, budget_bytes));
    names.push_back(kernel.name);
  }
  return plan_workspace_division(fronts, names, budget_bytes, options);
}

WorkspaceDivision plan_workspace_division(std::span<const std::vector<KernelConfig>> fronts,
                                          std::span<const std::string> names, uint64_t budget_bytes,
                                          const WorkspaceDivisionOptions& options) {
  check_fronts(fronts, names);
  if (fronts.empty()) return {};

  uint64_t least_total = 0;
  size_t hungriest = 0;  // the kernel whose least workspace is largest
  for (size_t k = 0; k < fronts.size(); ++k) {
    const uint64_t least = fronts[k].front().workspace_bytes;
    least_total = least > kNoWorkspaceLimit - least_total ? kNoWorkspaceLimit : least_total + least;
    if (least > fronts[hungriest].front().workspace_bytes) hungriest = k;
  }
  if (least_total > budget_bytes) {
    throw InfeasibleError("workspace budget " + format_bytes(budget_bytes) + " is below the least the " +
                          std::to_string(fronts.size()) + " kernels can run in: " + format_bytes(least_total) +
                          " (each kernel's smallest-workspace configuration; the largest of those is kernel " +
                          kernel_label(names, hungriest) + " with " +
                          format_bytes(fronts[hungriest].front().workspace_bytes) + ")");
  }

  if (options.solver == WorkspaceDivisionSolver::kGlpk) {
    return assemble(fronts, solve_with_glpk(fronts, names, budget_bytes, options));
  }
  std::vector<std::vector<internal::KnapsackItem>> groups;
  groups.reserve(fronts.size());
  for (const std::vector<KernelConfig>& front : fronts) {
    std::vector<internal::KnapsackItem>& items = groups.emplace_back();
    for (const KernelConfig& config : front) items.push_back({config.time_ms, config.workspace_bytes});
  }
  const std::optional<std::vector<size_t>> choice = internal::solve_choice_knapsack(groups, budget_bytes);
  if (!choice) throw BalancerError("workspace division: no selection found within a feasible budget");
  return assemble(fronts, *choice);
}

}  // namespace vtrain::balancer
