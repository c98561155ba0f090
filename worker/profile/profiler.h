// The profiler: measures what the balancer needs and the perf DB does not
// have yet for this device (mu-cuDNN Sec. III-E): every convolution kernel of
// a model (layer x Forward/BackwardData/BackwardFilter) with every available
// algorithm at every micro-batch size of a policy, and one whole training
// step per candidate per-rank batch size.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "balancer/workspace_plan.h"
#include "memory/vdnn_plan.h"
#include "perfdb/perf_db.h"
#include "worker/device/backend.h"
#include "worker/comm/communicator.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/profile/profile_peers.h"
#include "worker/profile/step_costs.h"

namespace vtrain::worker {

// Micro-batch policies are the balancer's (mu-cuDNN's all / powerOfTwo /
// undivided): the profiler measures exactly the sizes the balancer combines.
using balancer::MicroBatchPolicy;

struct ProfileOptions {
  ComputeSettings settings;          // how the graph is computed: measured and recorded so
                                     // (the backend's layout must be settings.layout)
  std::vector<int64_t> batches{64};  // candidate per-rank batch sizes
  MicroBatchPolicy micro_batches = MicroBatchPolicy::kUndivided;
  int warmup = 1;                    // untimed runs before the timed ones
  int repeats = 5;                   // timed runs; the median is recorded
  bool steps = true;                 // also time a whole step (upload, fwd, bwd, update) per batch
  int step_rounds = 1;               // rounds over the batches, each timing every batch's step
                                     // in turn; a batch's recorded step is its rounds' median
                                     // (a slow spell of a shared machine then falls on every
                                     // batch's runs alike, not on all of one's)
  bool layer_costs = true;           // also each layer's forward and backward per batch and the
                                     // device's copy bandwidth (step_costs.h), what the
                                     // swap / recompute planners cost a step with: timed
                                     // alone, then (with steps, where the step offloads
                                     // nothing) as the step made them
  memory::Policy memory_policy = memory::Policy::kNone;  // memory.policy the steps run (and
                                                        // are recorded) under
  // Whether a step's network at a batch holds the input staging training's
  // would (NetworkOptions::prefetch_input: data.prefetch, decided as the
  // trainer decides), so that the recorded peak is what training holds;
  // its steps then copy the batch ahead as training's do, so that the
  // recorded time is too. Null: never.
  std::function<bool(int64_t batch)> input_staging;
  // The processes on this host that profile the same device, and how they
  // share the work (profile_peers.h); alone by default.
  ProfilePeers peers;
};

struct ProfileReport {
  int64_t kernel_measured = 0;  // (kernel, micro-batch) items measured now
  int64_t kernel_cached = 0;    // items the DB already held for this device
  int64_t step_measured = 0;
  int64_t step_copied_ahead = 0;  // of those, steps timed with the batch copied ahead
                                  // (ProfileOptions::input_staging), every run but the first
  int64_t step_cached = 0;
  std::vector<int64_t> step_infeasible;  // batches no step fits (under the policy), largest last
  // Algorithms the backend offered that refused to run, each "<kind>
  // <name> (<error>) at <problem>": left out of the perf DB.
  std::vector<std::string> algorithms_refused;
  int64_t layer_costs_measured = 0;  // batches whose layers were measured now
  int64_t layer_costs_cached = 0;    // batches whose layers the DB already held
  int64_t copy_measured = 0;         // 1 when the copy bandwidth was measured now
  int64_t copy_cached = 0;           // 1 when the DB already held it
  double seconds = 0;
};

// " (N with the batch copied ahead)" where the report's steps were timed
// so (ProfileReport::step_copied_ahead), else "": for the profile lines.
std::string copied_ahead_note(const ProfileReport& report);

// The perf DB's description of a backend's device.
perfdb::Device perfdb_device(const DeviceInfo& info);

// The device as plans and `vtrain balance --devices` name it
// (perfdb::device_label: a CPU's with its thread count).
common::DeviceLabel device_label(const DeviceInfo& info);

// The kernel signature of a convolution problem (n = the layer's batch).
perfdb::KernelSignature kernel_signature(ConvKind kind, const ConvProblem& problem);

// The workspace_plan under which the profiler records whole steps: every
// conv kernel's fastest undivided algorithm, the step timed with the batch's
// upload (copied ahead where training's is: ProfileOptions::input_staging)
// and the update. Rows under other plans (older "auto" rows timed
// forward and backward only) are neither used nor taken as cached.
inline constexpr const char* kProfiledStepPlan = "auto+update";

// The policy_capacity_bytes a step is recorded under: for a policy whose
// plan depends on the capacity (memory::plans_for_capacity) the device
// capacity it planned for (two processes of one device with different
// device.memory_limit run different steps), 0 for the others.
uint64_t step_policy_capacity(memory::Policy memory_policy, uint64_t capacity_bytes);

// The profiler's step measurements of `model` (model_key()) under `memory_policy` on
// `device` of `capacity_bytes` (those under kProfiledStepPlan), ordered by
// batch.
std::vector<perfdb::StepMeasurement> profiled_steps(perfdb::PerfDb& db, perfdb::DeviceId device,
                                                    const perfdb::ModelKey& model,
                                                    memory::Policy memory_policy,
                                                    uint64_t capacity_bytes);

// Measures what `db` lacks for `device` and records it, one transaction per
// work item. Every measurement runs on `backend` with freshly allocated
// buffers; nothing of a training run is touched. Three phases, in this
// order: the conv kernels, the layer costs (options.layer_costs), the
// steps (options.steps); options.peers says which items this process
// measures and where it waits for the others (profile_peers.h).
ProfileReport profile(const Graph& graph, Backend& backend, perfdb::PerfDb& db,
                      perfdb::DeviceId device, const ProfileOptions& options);

// Median time of one allreduce of `count` floats of `backend`'s memory over
// `comm` (what a step's gradient exchange costs when nothing hides it), in
// ms, after options.warmup untimed runs, of options.repeats. Collective:
// every rank calls it.
double measure_allreduce_ms(Backend& backend, Communicator& comm, int64_t count,
                            const ProfileOptions& options);

}  // namespace vtrain::worker
