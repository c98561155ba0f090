// From the perf DB to a plan: reads what the profiler measured for each
// device, hands the numbers to the balancer (batch split, WR / WD), and
// writes the answer as a TrainingPlan (configs/plan.h). Used by `vtrain
// train` (rank 0, at start) and `vtrain balance` (offline, any devices the
// DB knows). Nothing here measures or touches a device.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "balancer/batch_split.h"
#include "balancer/plan.h"
#include "memory/vdnn_plan.h"
#include "perfdb/perf_db.h"
#include "worker/comm/wire.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"

namespace vtrain::worker {

// One device of the job (a rank) or of a what-if question.
struct PlanDevice {
  common::DeviceLabel label;                  // for messages and the plan (its name and a
                                              // CPU's threads, perfdb::device_label)
  perfdb::DeviceId id;                        // its rows in the perf DB
  uint64_t memory_bytes = 0;                  // capacity a batch must fit in
  std::function<Layout(int64_t)> layout;      // its backend's preferred_layout (layout_rule_for)
  double input_rate = 0;                      // images/s its input delivers; 0 = not priced
                                              // (balancer::DeviceProfile::input_rate)
  balancer::HostShare host_share;             // the cores it shares (host -1: none)
  // The precision it computes in (train.precision per rank); nullopt: the
  // job's (ComputeSettings::precision). Its kernels, layers and steps are
  // looked up in that one.
  std::optional<common::Precision> precision;
};

struct WorkspaceRequest {
  balancer::WorkspacePolicy policy = balancer::WorkspacePolicy::kUndivided;
  uint64_t limit = 0;                // bytes; 0 = no limit (not allowed for wd)
  bool graph_engines = false;        // conv.cudnn_graph: measured graph engines may be planned
};

// How a device's step at a batch is priced: the step it will run, under
// its memory plan and its workspace plan.
struct StepPricing {
  WorkspaceRequest workspace;                            // balance.workspace(_limit)
  memory::Policy memory_policy = memory::Policy::kNone;  // memory.policy
};

// Every function below plans `graph` computed under `settings` (each
// device in its own precision where PlanDevice::precision says).
//
// What the batch split solves over: per device, its step time and peak
// memory at each batch the perf DB holds a step measurement of, priced as
// `pricing` says. The steps were measured under pricing.memory_policy at
// the device's capacity (so under a per-tensor policy such as auto a batch
// above what fits without offload is there with its plan's time: see
// profiler.h's step_policy_capacity) with the fastest undivided conv kernels;
// a workspace request that changes the kernels replaces their time by the
// workspace plan's (plan_workspaces) at that batch, and leaves out a batch
// whose kernels the budget cannot hold. Throws std::runtime_error naming
// the device when it has no steps (profile it first) or lacks the kernel
// measurements the workspace plan needs.
std::vector<balancer::DeviceProfile> device_profiles(const Graph& graph,
                                                     const ComputeSettings& settings,
                                                     perfdb::PerfDb& db,
                                                     const std::vector<PlanDevice>& devices,
                                                     const StepPricing& pricing);

// The batch split over device_profiles(). Throws balancer::InfeasibleError
// / BalancerError and what device_profiles throws.
balancer::BatchSplit plan_split(const Graph& graph, const ComputeSettings& settings,
                                perfdb::PerfDb& db,
                                const std::vector<PlanDevice>& devices, int64_t global_batch,
                                const balancer::BatchSplitOptions& options,
                                const StepPricing& pricing = {});

// The whole plan for a given split: per device with a batch, every conv
// kernel's configuration under the workspace request, from its kernel
// measurements at that batch (every micro-batch size the DB has), and where
// its memory plan keeps the activations (from its step measured at that
// batch, if any). The predicted times are the split's, what it was chosen
// on. Throws std::runtime_error naming the device, layer and kind when
// measurements are missing, and balancer::InfeasibleError when the
// workspace cannot hold the kernels. `split` may come from plan_split or be
// fixed (its time_ms/step_time_ms may be empty: then a rank's prediction is
// its conv kernels' time alone).
// One configuration on a kernel's Pareto front (time x workspace) at its
// rank's batch, for plots (`vtrain balance --fronts`).
struct FrontPoint {
  int rank = 0;
  std::string kernel;           // "conv2/Forward"
  uint64_t workspace_bytes = 0;
  double time_ms = 0;
  std::string calls;            // balancer::describe_calls: "direct x4 (8 calls)"
  bool chosen = false;          // the plan's configuration for the kernel
};

// With `fronts`, also every kernel's Pareto front over the options the
// workspace policy may use (wr: calls within the limit).
balancer::TrainingPlan plan_workspaces(const Graph& graph, const ComputeSettings& settings,
                                     perfdb::PerfDb& db,
                                     const std::vector<PlanDevice>& devices,
                                     const balancer::BatchSplit& split,
                                     const StepPricing& pricing,
                                     std::vector<FrontPoint>* fronts = nullptr);

// Why `plan` does not fit this model and job, or nullopt when it does.
std::optional<std::string> plan_mismatch(const balancer::TrainingPlan& plan, const Graph& graph,
                                         const ComputeSettings& settings, int ranks,
                                         int64_t global_batch,
                                         memory::Policy memory_policy = memory::Policy::kNone);

// Why rank `rank`, computing in `precision`, cannot follow `plan` (it
// names another precision for the rank), or nullopt.
std::optional<std::string> plan_precision_mismatch(const balancer::TrainingPlan& plan, int rank,
                                                   common::Precision precision);

// Why rank `rank`, running on `device` (its device_label), cannot follow
// `plan` (its batch and kernel choices were timed on the device the plan
// names), or nullopt. The cores a CPU device is pinned to do not count, nor
// does a plan that names no device; a CPU's thread count counts where the
// plan names one (plans written before labels held the count do not).
std::optional<std::string> plan_device_mismatch(const balancer::TrainingPlan& plan, int rank,
                                                const common::DeviceLabel& device);

// One rank's part of a plan, for NetworkOptions / TrainerContext::conv_plan.
std::vector<ConvLayerExecution> conv_executions(const balancer::RankPlan& rank);

// What the ranks of a training job tell each other while planning it
// (launcher/job_plan.cpp), as typed messages (worker/comm/wire.h): each
// rank's perf DB device row goes to rank 0, and the split rank 0 solved
// to every rank.
template <>
struct WireFormat<perfdb::DeviceId> {
  static constexpr const char* kName = "perf DB device id";
  static void write(WireWriter& out, const perfdb::DeviceId& id);
  static perfdb::DeviceId read(WireReader& in);
};

// What a rank needs of the split: every rank's batch (balancer::BatchSplit::batch).
struct SplitShares {
  std::vector<int64_t> batch;  // per rank, in rank order; 0 = does not train
};
template <>
struct WireFormat<SplitShares> {
  static constexpr const char* kName = "batch split";
  static void write(WireWriter& out, const SplitShares& split);
  static SplitShares read(WireReader& in);
};

// A readable summary: the split with predicted times, the speedup over the
// even split, and per rank the kernels that run divided or use workspace.
std::string describe_plan(const balancer::TrainingPlan& plan);

}  // namespace vtrain::worker
