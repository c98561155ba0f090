// Micro-batched convolutions under a workspace limit (mu-cuDNN, Oyama et al.,
// Sec. III-A to III-C). A convolution kernel that runs on a mini-batch of n
// images may instead run as several calls on micro-batches whose sizes sum to
// n, each with its own algorithm; a faster algorithm that needs more
// workspace than the limit allows at n images may fit at n/4. A
// *configuration* is such a list of (algorithm, micro-batch) calls.
//
// Two policies:
//   WR (workspace reuse): each kernel has its own workspace of at most a
//      given size; every kernel independently gets its fastest configuration
//      within it (plan_workspace_reuse).
//   WD (workspace division): all kernels share one buffer of a given total
//      size, divided into one segment per kernel; a 0-1 ILP picks one
//      configuration per kernel from its Pareto front to minimise the total
//      time (plan_workspace_division).
//
// The caller supplies measurements: for every micro-batch size of its policy
// (micro_batch_sizes) and every algorithm, the time and workspace of one call.
// The models only combine those numbers; they never measure.
//
// Times are in ms; a configuration's time is the sum of its calls' times, and
// its workspace is the largest of its calls' workspaces, because the calls
// run one after another in the same workspace.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "balancer/balancer_error.h"
#include "common/name_table.h"

namespace vtrain::balancer {

// Which micro-batch sizes a kernel may be split into (the paper's policies).
enum class MicroBatchPolicy {
  kAll,         // 1, 2, ..., n: always finds the best split; n measurements
  kPowerOfTwo,  // 1, 2, 4, ... up to n, plus n itself when n is not a power of two
  kUndivided,   // n only: the configuration plain cuDNN would use
};

// mu-cuDNN's names (profile.micro_batches in the config).
inline constexpr auto kMicroBatchPolicyNames = std::to_array<common::Named<MicroBatchPolicy>>(
    {{MicroBatchPolicy::kAll, "all"},
     {MicroBatchPolicy::kPowerOfTwo, "powerOfTwo"},
     {MicroBatchPolicy::kUndivided, "undivided"}});
inline const char* micro_batch_policy_name(MicroBatchPolicy policy) {
  return common::name_of(kMicroBatchPolicyNames, policy);
}
// Throws BalancerError listing the names for anything else.
MicroBatchPolicy parse_micro_batch_policy(const std::string& name);

// How a rank's convolution kernels get their workspace (balance.workspace in
// the config, workspace_policy in a plan, vtrain balance --policy).
enum class WorkspacePolicy {
  kUndivided,  // each kernel undivided, the fastest algorithm within the limit
  kWr,         // workspace reuse: the limit per kernel, micro-batched
  kWd,         // workspace division: the limit is the rank's total, micro-batched
};
inline constexpr auto kWorkspacePolicyNames = std::to_array<common::Named<WorkspacePolicy>>(
    {{WorkspacePolicy::kUndivided, "undivided"},
     {WorkspacePolicy::kWr, "wr"},
     {WorkspacePolicy::kWd, "wd"}});
inline const char* workspace_policy_name(WorkspacePolicy policy) {
  return common::name_of(kWorkspacePolicyNames, policy);
}
// Throws BalancerError listing the names for anything else.
WorkspacePolicy parse_workspace_policy(const std::string& name);

// The sizes a policy allows for a mini-batch of `batch` images, ascending.
// Throws BalancerError when batch < 1.
std::vector<int64_t> micro_batch_sizes(MicroBatchPolicy policy, int64_t batch);

// One measured call: an algorithm at a micro-batch size.
struct AlgorithmOption {
  std::string algorithm;         // the backend's stable algorithm name
  int64_t micro_batch = 1;       // images per call, 1..batch
  double time_ms = 0;            // time of one call, finite and >= 0
  uint64_t workspace_bytes = 0;  // workspace that call needs
};

// One convolution kernel (a layer's Forward, BackwardData or BackwardFilter)
// with everything measured for it.
struct ConvKernel {
  std::string name;                     // for messages, e.g. "conv2/BackwardFilter"
  int64_t batch = 1;                    // images the kernel processes per step
  std::vector<AlgorithmOption> options; // at most one per (algorithm, micro_batch)
};

// One call of a configuration.
struct MicroBatch {
  std::string algorithm;
  int64_t size = 1;  // images in this call

  friend bool operator==(const MicroBatch&, const MicroBatch&) = default;
};

struct KernelConfig {
  // The calls, largest micro-batch first (ties in the order of the kernel's
  // options); their sizes sum to the kernel's batch. The order does not
  // change the time or the workspace.
  std::vector<MicroBatch> micro_batches;
  double time_ms = 0;            // sum of the calls' times
  uint64_t workspace_bytes = 0;  // largest of the calls' workspaces
};

// "winograd x32 (2 calls) + direct x8": a configuration's calls for people,
// runs of equal calls grouped.
std::string describe_calls(const std::vector<MicroBatch>& calls);

inline constexpr uint64_t kNoWorkspaceLimit = std::numeric_limits<uint64_t>::max();

// WR: the fastest configuration of `kernel` whose calls each need at most
// `workspace_limit` bytes, by the paper's dynamic programme
//   T(b) = min over allowed micro-batch sizes m <= b of T_mu(m) + T(b - m),
//   T(0) = 0,
// where T_mu(m) is the fastest option at size m that fits the limit. This is
// the paper's T(b) = min(T_mu(b), min_b' T(b') + T(b - b')) with the split
// restricted to the measured sizes: both range over all multisets of those
// sizes summing to b. Among equally fast configurations one with the
// smallest workspace is returned (further ties are broken deterministically).
// Throws InfeasibleError when no configuration covers the batch within the
// limit, BalancerError on invalid input (micro_batch outside 1..batch,
// negative or non-finite time, the same (algorithm, micro_batch) twice).
KernelConfig plan_workspace_reuse(const ConvKernel& kernel,
                                  uint64_t workspace_limit = kNoWorkspaceLimit);

// The Pareto front of `kernel`'s configurations in (time x workspace), over
// configurations whose calls each need at most `workspace_limit` bytes:
// every configuration that no other configuration matches or beats in both
// time and workspace while being strictly better in one, one configuration
// per distinct point. Sorted by workspace ascending, hence by time strictly
// descending: front.front() needs the least workspace, front.back() is the
// fastest (the WR answer without a limit).
//
// Computed as the paper's set DP front(b) = prune(options at b combined with
// front(b - m)); pruning commutes with combining (a dominated rest stays
// dominated after adding a call), so the front is exact, not an
// approximation. Throws like plan_workspace_reuse.
std::vector<KernelConfig> pareto_front(const ConvKernel& kernel,
                                       uint64_t workspace_limit = kNoWorkspaceLimit);

// How the WD ILP is solved. Both are exact and return an optimal division
// (they may differ among equally fast ones).
enum class WorkspaceDivisionSolver {
  // The default: the ILP as a multiple-choice knapsack: LP relaxation,
  // reduced-cost fixing, then a dynamic programme over partial selections
  // cut by a Lagrangian bound. Milliseconds on ResNet-152-sized instances.
  kKnapsack,
  // The paper's ILP handed to GLPK as it stands, one binary per front point.
  // A reference: with measured (all distinct) times GLPK's branch and bound
  // can run for minutes on a ResNet-152-sized instance; set a time_limit.
  kGlpk,
};

struct WorkspaceDivisionOptions {
  WorkspaceDivisionSolver solver = WorkspaceDivisionSolver::kKnapsack;
  // kGlpk only: wall-clock limit of the solve; 0 = none. See SolveOptions.
  std::chrono::milliseconds time_limit{0};
};

struct WorkspaceDivision {
  std::vector<KernelConfig> configs;  // per kernel, in input order
  // Per kernel, its segment's byte offset in one buffer of
  // total_workspace_bytes: the kernels' workspaces laid out back to back in
  // input order (prefix sums, no alignment padding; a caller that needs
  // aligned segments rounds each measured workspace up before planning).
  std::vector<uint64_t> offsets;
  double total_time_ms = 0;            // sum of the chosen configurations' times
  uint64_t total_workspace_bytes = 0;  // sum of their workspaces, <= the budget
};

// WD: one configuration per kernel, from its Pareto front, minimising the
// total time subject to the total workspace <= budget_bytes (the paper's
// 0-1 ILP, Eqs. 1-4). Throws InfeasibleError when even every kernel's
// least-workspace configuration together exceeds the budget (the message
// gives that minimum), and like plan_workspace_reuse on invalid kernels.
WorkspaceDivision plan_workspace_division(std::span<const ConvKernel> kernels,
                                          uint64_t budget_bytes,
                                          const WorkspaceDivisionOptions& options = {});

// The same from precomputed fronts (one per kernel, each as pareto_front
// returns it), for callers that solve for several budgets. `names` gives each
// kernel's name for messages; it may be empty (kernels are then numbered).
// Throws BalancerError when a front is empty or not sorted as pareto_front
// sorts it.
WorkspaceDivision plan_workspace_division(std::span<const std::vector<KernelConfig>> fronts,
                                          std::span<const std::string> names,
                                          uint64_t budget_bytes,
                                          const WorkspaceDivisionOptions& options = {});

}  // namespace vtrain::balancer
