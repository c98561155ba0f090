// Plans: what the balancer decided for one job, as a versioned,
// human-readable YAML file. Produced at the start of training (rank 0 solves
// and broadcasts the text) or offline by `vtrain balance --out`, and given
// back with `vtrain train --plan FILE`.
//
//   vtrain_plan: 3
//   model: "<the model's signature, Graph::signature()>"
//   precision: fp32                 # how it is computed: a field per setting
//   layout: auto                    #   (common::kSettings), rank 0's; each
//   ...                             #   optional, the config's default when absent
//   global_batch: 96
//   memory_policy: none
//   workspace_policy: wd            # undivided | wr | wd
//   workspace_limit: 67108864       # wr: per kernel; wd: per rank in total
//   predicted_step_ms: 41.2
//   split_ms: 43.0                  # optional: the split's time from measured steps
//   even_split_ms: 55.0             # optional: the even split's, the same way
//   ranks:
//     - device: "Intel(R) Xeon(R) ..."   # the device's name (common::DeviceLabel)
//       threads: 8                  # a CPU's: the threads it computes with
//       precision: bf16             # optional: the rank's own (a precision per rank)
//       batch: 64
//       predicted_ms: 41.2
//       input_rate: 400             # optional: images/s its input delivers (priced in the split)
//       binds: input                # optional: compute | input | cores, what sets its predicted step
//       workspace_bytes: 1048576    # the rank's workspace buffer
//       kernels:
//         - {layer: conv1, kind: Forward, workspace_offset: 0, workspace_bytes: 4096,
//            time_ms: 1.5, calls: [[direct, 32], [winograd, 32]]}
//
// Reading checks types, ranges and internal consistency (calls sum to the
// rank's batch, segments lie inside the rank's workspace, batches sum to
// global_batch) and names file:line and key path on error; whether the plan
// fits a model and a cluster is for the caller (plan_mismatch()). Version 1
// plans, whose `model:` held the settings as "@" suffixes
// ("<signature>@bf16@nhwc"), read as the same fields; versions 1 and 2,
// whose `device:` held a CPU's thread count as " (8 threads)" after the
// name, read as `device:` and `threads:` (common::DeviceLabel::parse).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "balancer/batch_split.h"
#include "balancer/workspace_plan.h"
#include "common/activation_bytes.h"
#include "common/compute_settings.h"
#include "common/conv_kind.h"
#include "common/device_label.h"
#include "common/input_error.h"

namespace vtrain::balancer {

// A malformed plan file (file:line and key path in the message).
using PlanError = common::InputError;

inline constexpr int kPlanVersion = 3;

struct PlannedKernel {
  std::string layer;                        // conv layer name
  common::ConvKind kind = common::ConvKind::kForward;
  std::vector<MicroBatch> calls;  // in order; sizes sum to the rank's batch
  uint64_t workspace_offset = 0;            // segment in the rank's workspace buffer
  uint64_t workspace_bytes = 0;
  double time_ms = 0;                       // predicted time of the calls together
};

struct RankPlan {
  common::DeviceLabel device;           // the device it was planned on (for people and checks);
                                        // name "" = none named
  // train.precision the rank computes in, where ranks differ; nullopt:
  // the plan's settings.precision (plans of one precision, and those
  // written before a precision per rank)
  std::optional<common::Precision> precision;
  int64_t batch = 0;                    // per-rank batch; 0 = the rank does not train
  double predicted_ms = 0;              // predicted step time (0 when idle): what the split
                                        // was chosen on, its exposed allreduce included
  std::optional<double> input_rate;     // images/s its input delivers, where the split
                                        // priced it (DeviceProfile::input_rate)
  std::optional<Binding> binds;         // what sets predicted_ms: its compute, its input or its host's cores
  uint64_t workspace_bytes = 0;         // the rank's workspace buffer
  std::optional<common::ActivationBytes> activations;  // its memory plan, when measured at
                                                       // its batch
  std::vector<PlannedKernel> kernels;   // every conv layer x kind (none when idle)
};

struct TrainingPlan {
  int version = kPlanVersion;
  std::string model;                    // the model's signature (Graph::signature())
  common::ComputeSettings settings;     // how it is computed, in rank 0's precision
  int64_t global_batch = 0;
  std::string memory_policy = "none";
  WorkspacePolicy workspace_policy = WorkspacePolicy::kUndivided;
  uint64_t workspace_limit = 0;
  double predicted_step_ms = 0;          // with the workspace plan's kernel times
  std::optional<double> split_ms;        // the split's step time from measured steps
  std::optional<double> even_split_ms;   // the even split's, measured the same way
  std::optional<double> ideal_step_ms;   // the ideal bound (BatchSplit::ideal_step_time_ms)
  std::vector<RankPlan> ranks;
};

// The most a plan file may hold: a plan is about 150 bytes per convolution
// kernel and rank, so 64 MiB takes 400 ranks of VGG-416 (1,200 kernels
// each); a path to a device or a wrong file is refused before it fills
// memory (common/text_file.h).
inline constexpr uint64_t kMaxPlanBytes = uint64_t{64} << 20;

std::string plan_to_yaml(const TrainingPlan& plan);
// Throws PlanError naming `origin`, the line and the key path. The text is
// one YAML document.
TrainingPlan parse_plan(const std::string& yaml_text, const std::string& origin);
// A plan file of at most kMaxPlanBytes; throws PlanError.
TrainingPlan load_plan(const std::string& path);
// Writes as common::OutputFile does (a temporary file renamed over a file,
// a device written in place): a failed write leaves no partial plan behind.
// Throws common::OutputError.
void save_plan(const TrainingPlan& plan, const std::string& path);

}  // namespace vtrain::balancer
