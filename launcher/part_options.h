// The one place each part's options are built from the config: a knob the
// config reads reaches its part here, and nowhere else. What only exists at
// run time (the communicator, the split, a plan, signals) the caller adds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "balancer/batch_split.h"
#include "configs/config.h"
#include "worker/device/backend.h"
#include "worker/engine/network.h"
#include "worker/profile/planning.h"
#include "worker/profile/profiler.h"
#include "worker/train/trainer.h"

namespace vtrain::launcher {

// device.*
worker::BackendOptions backend_options(const config::Config& cfg);

// train.*, optimizer.*, conv.algorithm, memory.*, output.metrics/progress,
// checkpoint.*, balance.rebalance and data.prefetch(_batches); with
// `resume_required` (vtrain train --resume) checkpoint.resume is required.
// What only exists at run time goes into a worker::TrainerContext.
worker::TrainerOptions trainer_options(const config::Config& cfg, bool resume_required = false);

// The precisions the ranks of a `ranks`-rank job are planned in where they
// are not known yet (`vtrain check`, a rank's memory room): a per-rank
// train.precision of that length as written, else every rank in this
// one's (cfg.compute.precision, resolved).
std::vector<common::Precision> planned_precisions(const config::Config& cfg, int ranks);

// The network one rank of `ranks` trains with a batch of up to `max_batch`
// samples (worker::training_network_options on trainer_options, the ranks
// in planned_precisions): what `vtrain check` plans with.
worker::NetworkOptions network_options(const config::Config& cfg, int64_t max_batch,
                                       int ranks = 1);

// Under a per-tensor memory.policy, the simulator's costs of `graph` for a
// network on `net` (at its max_batch) on `backend`'s device: from
// profile.db when it exists and holds them all (vtrain profile and
// balance.split: auto record them: the calls of the step the profiler
// timed, else each layer alone), else measured in place as a step meets
// them (worker::measure_costs_in_place: a network on `net` runs a few
// steps; each layer alone where its plan offloads). nullopt under the
// other policies. `source` says which, for the log ("profiled in perf.db",
// "measured in place in 3 steps", "measured in place, each layer alone"
// with why). The file is only read. Throws what the network throws.
struct PlanningCosts {
  std::optional<memory::StepCosts> costs;
  std::string source;
};
PlanningCosts planning_costs(const config::Config& cfg, const worker::Graph& graph,
                             worker::Backend& backend, const worker::NetworkOptions& net);

// Whether training's network for a rank batch on `backend` holds the input
// staging (data.prefetch, as worker::batch_staging decides).
bool input_staging(const config::Config& cfg, const worker::Graph& graph,
                   const worker::Backend& backend, int64_t rank_batch);

// profile.* and memory.policy, and input_staging on `backend` (cfg, graph
// and backend must outlive the options); batches is profile.batches (the
// caller chooses when it is empty).
worker::ProfileOptions profile_options(const config::Config& cfg, const worker::Graph& graph,
                                       const worker::Backend& backend);

// balance.granularity and balance.candidates.
balancer::BatchSplitOptions split_options(const config::Config& cfg);
// How the split prices a device's step: balance.workspace(_limit), memory.policy.
worker::StepPricing step_pricing(const config::Config& cfg);
// The dataset's part of a rank's input rate key in the perf DB (data.kind,
// which training set: its file, folder, list or shard patterns; the
// samples' [C, H, W] `sample`).
perfdb::InputKey input_key(const config::Config& cfg, const worker::Shape& sample);

}  // namespace vtrain::launcher
