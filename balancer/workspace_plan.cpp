// WR and the Pareto fronts: one dynamic programme over the micro-batch sizes,
// run at one workspace level (WR) or at every level the kernel's options
// define (the front).

#include "balancer/workspace_plan.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "common/text.h"

namespace vtrain::balancer {
namespace {

using common::format_bytes;
using common::format_list;

constexpr double kUnreachable = std::numeric_limits<double>::infinity();

// The kernel's options grouped by micro-batch size, validated.
struct PreparedKernel {
  const ConvKernel* kernel = nullptr;
  std::vector<int64_t> sizes;          // distinct micro-batch sizes, ascending
  std::vector<int> size_of_option;     // per option: its index in `sizes`
};

PreparedKernel prepare(const ConvKernel& kernel) {
  const std::string where = "kernel " + kernel.name + ": ";
  if (kernel.batch < 1) throw BalancerError(where + "batch " + std::to_string(kernel.batch) + " is not positive");
  std::set<std::pair<std::string_view, int64_t>> seen;
  std::set<int64_t> sizes;
  for (const AlgorithmOption& option : kernel.options) {
    auto fail = [&](const std::string& problem) {
      throw BalancerError(where + "option " + option.algorithm + " at micro-batch " +
                          std::to_string(option.micro_batch) + ": " + problem);
    };
    if (option.micro_batch < 1 || option.micro_batch > kernel.batch) {
      fail("micro-batch is outside 1.." + std::to_string(kernel.batch));
    }
    if (!std::isfinite(option.time_ms) || option.time_ms < 0) {
      fail("time " + std::to_string(option.time_ms) + " ms is not a finite non-negative number");
    }
    if (!seen.emplace(option.algorithm, option.micro_batch).second) fail("measured twice");
    sizes.insert(option.micro_batch);
  }
  PreparedKernel prepared;
  prepared.kernel = &kernel;
  prepared.sizes.assign(sizes.begin(), sizes.end());
  for (const AlgorithmOption& option : kernel.options) {
    const auto it = std::lower_bound(prepared.sizes.begin(), prepared.sizes.end(), option.micro_batch);
    prepared.size_of_option.push_back(static_cast<int>(it - prepared.sizes.begin()));
  }
  return prepared;
}

// The DP at one workspace level. `fastest[s]` is the option used for a call
// of size sizes[s] (the fastest that fits the level), or -1 when none fits.
// Per b in 0..batch: the best (time, workspace) of a configuration covering
// b images, compared lexicographically, and the option of one of its calls.
struct LevelTable {
  std::vector<double> time;
  std::vector<uint64_t> workspace;
  std::vector<int> first_call;  // option index; -1 for b = 0 and unreachable b
};

void solve_level(const PreparedKernel& prepared, const std::vector<int>& fastest, LevelTable& table) {
  const ConvKernel& kernel = *prepared.kernel;
  const auto n = static_cast<size_t>(kernel.batch);
  table.time.assign(n + 1, kUnreachable);
  table.workspace.assign(n + 1, 0);
  table.first_call.assign(n + 1, -1);
  table.time[0] = 0;
  for (size_t b = 1; b <= n; ++b) {
    double best_time = kUnreachable;
    uint64_t best_workspace = 0;
    int best_option = -1;
    // Largest sizes first with strict improvement: ties keep the larger
    // call, leaning towards fewer calls.
    for (size_t s = prepared.sizes.size(); s-- > 0;) {
      const auto m = static_cast<size_t>(prepared.sizes[s]);
      const int o = fastest[s];
      if (m > b || o < 0 || table.time[b - m] == kUnreachable) continue;
      const AlgorithmOption& call = kernel.options[o];
      const double time = call.time_ms + table.time[b - m];
      const uint64_t workspace = std::max(call.workspace_bytes, table.workspace[b - m]);
      if (time < best_time || (time == best_time && workspace < best_workspace)) {
        best_time = time;
        best_workspace = workspace;
        best_option = o;
      }
    }
    table.time[b] = best_time;
    table.workspace[b] = best_workspace;
    table.first_call[b] = best_option;
  }
}

KernelConfig reconstruct(const PreparedKernel& prepared, const LevelTable& table) {
  const ConvKernel& kernel = *prepared.kernel;
  std::vector<int> calls;
  for (int64_t b = kernel.batch; b > 0;) {
    const int o = table.first_call[b];
    calls.push_back(o);
    b -= kernel.options[o].micro_batch;
  }
  std::sort(calls.begin(), calls.end(), [&](int a, int b) {
    const int64_t size_a = kernel.options[a].micro_batch, size_b = kernel.options[b].micro_batch;
    return size_a != size_b ? size_a > size_b : a < b;
  });
  KernelConfig config;
  config.time_ms = table.time[kernel.batch];
  config.workspace_bytes = table.workspace[kernel.batch];
  for (int o : calls) config.micro_batches.push_back({kernel.options[o].algorithm, kernel.options[o].micro_batch});
  return config;
}

// Why no configuration exists within `limit`, in the user's terms.
[[noreturn]] void throw_uncovered(const PreparedKernel& prepared, uint64_t limit) {
  const ConvKernel& kernel = *prepared.kernel;
  std::string message = "kernel " + kernel.name + ": no configuration covers its batch of " +
                        std::to_string(kernel.batch) + " images";
  const bool limited = limit != kNoWorkspaceLimit;
  if (limited) message += " within a workspace of " + format_bytes(limit);
  std::set<int64_t> fitting;
  uint64_t smallest = kNoWorkspaceLimit;
  for (const AlgorithmOption& option : kernel.options) {
    smallest = std::min(smallest, option.workspace_bytes);
    if (option.workspace_bytes <= limit) fitting.insert(option.micro_batch);
  }
  if (kernel.options.empty()) {
    message += ": it has no measured options";
  } else if (fitting.empty()) {
    message += ": every option needs more (the smallest needs " + format_bytes(smallest) + ")";
  } else {
    const std::vector<int64_t> sizes(fitting.begin(), fitting.end());
    message += std::string(": the micro-batch sizes with an option") + (limited ? " that fits" : "") +
               " (" + format_list(sizes) + ") do not add up to " + std::to_string(kernel.batch);
  }
  throw InfeasibleError(message);
}

// fastest[s] updated with the options whose workspace is exactly `level`;
// returns whether any entry changed.
bool admit_level(const PreparedKernel& prepared, uint64_t level, std::vector<int>& fastest) {
  const ConvKernel& kernel = *prepared.kernel;
  bool changed = false;
  for (size_t o = 0; o < kernel.options.size(); ++o) {
    const AlgorithmOption& option = kernel.options[o];
    if (option.workspace_bytes != level) continue;
    int& current = fastest[prepared.size_of_option[o]];
    // Admitted in ascending workspace, so on equal time the incumbent needs
    // no more workspace and stays.
    if (current < 0 || option.time_ms < kernel.options[current].time_ms) {
      current = static_cast<int>(o);
      changed = true;
    }
  }
  return changed;
}

}  // namespace

MicroBatchPolicy parse_micro_batch_policy(const std::string& name) {
  return common::parse_named<BalancerError>(kMicroBatchPolicyNames, name, "micro-batch policy");
}

WorkspacePolicy parse_workspace_policy(const std::string& name) {
  return common::parse_named<BalancerError>(kWorkspacePolicyNames, name, "workspace policy");
}

std::vector<int64_t> micro_batch_sizes(MicroBatchPolicy policy, int64_t batch) {
  if (batch < 1) throw BalancerError("micro-batch sizes: batch " + std::to_string(batch) + " is not positive");
  std::vector<int64_t> sizes;
  switch (policy) {
    case MicroBatchPolicy::kAll:
      for (int64_t m = 1; m <= batch; ++m) sizes.push_back(m);
      break;
    case MicroBatchPolicy::kPowerOfTwo:
      for (int64_t m = 1; m <= batch; m *= 2) sizes.push_back(m);
      if (sizes.back() != batch) sizes.push_back(batch);
      break;
    case MicroBatchPolicy::kUndivided:
      sizes.push_back(batch);
      break;
  }
  return sizes;
}

KernelConfig plan_workspace_reuse(const ConvKernel& kernel, uint64_t workspace_limit) {
  const PreparedKernel prepared = prepare(kernel);
  std::vector<int> fastest(prepared.sizes.size(), -1);
  for (size_t o = 0; o < kernel.options.size(); ++o) {
    const AlgorithmOption& option = kernel.options[o];
    if (option.workspace_bytes > workspace_limit) continue;
    int& current = fastest[prepared.size_of_option[o]];
    if (current < 0 || option.time_ms < kernel.options[current].time_ms ||
        (option.time_ms == kernel.options[current].time_ms &&
         option.workspace_bytes < kernel.options[current].workspace_bytes)) {
      current = static_cast<int>(o);
    }
  }
  LevelTable table;
  solve_level(prepared, fastest, table);
  if (table.time[kernel.batch] == kUnreachable) throw_uncovered(prepared, workspace_limit);
  return reconstruct(prepared, table);
}

std::vector<KernelConfig> pareto_front(const ConvKernel& kernel, uint64_t workspace_limit) {
  const PreparedKernel prepared = prepare(kernel);
  // front(b) of the set DP, pruned, is a staircase: its points are, for each
  // workspace level w among the options' workspaces, the fastest
  // configuration whose calls all need <= w. So the DP runs once per level
  // with the options admitted so far; a level whose best time does not
  // improve on the previous one is dominated and dropped. A new point always
  // needs exactly its level: with less it would have been found one level
  // lower at the same time.
  std::set<uint64_t> levels;
  for (const AlgorithmOption& option : kernel.options) {
    if (option.workspace_bytes <= workspace_limit) levels.insert(option.workspace_bytes);
  }
  std::vector<KernelConfig> front;
  std::vector<int> fastest(prepared.sizes.size(), -1);
  LevelTable table;
  for (uint64_t level : levels) {
    if (!admit_level(prepared, level, fastest)) continue;
    solve_level(prepared, fastest, table);
    const double time = table.time[kernel.batch];
    if (time == kUnreachable || (!front.empty() && time >= front.back().time_ms)) continue;
    front.push_back(reconstruct(prepared, table));
  }
  if (front.empty()) throw_uncovered(prepared, workspace_limit);
  return front;
}

std::string describe_calls(const std::vector<MicroBatch>& calls) {
  std::string out;
  for (size_t i = 0; i < calls.size();) {
    size_t j = i;
    while (j < calls.size() && calls[j] == calls[i]) ++j;
    out += (out.empty() ? "" : " + ") + calls[i].algorithm + " x" + std::to_string(calls[i].size);
    if (j - i > 1) out += " (" + std::to_string(j - i) + " calls)";
    i = j;
  }
  return out;
}

}  // namespace vtrain::balancer
