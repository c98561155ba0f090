// The training loop: epochs of seeded shuffles, SGD steps, evaluation,
// progress and metrics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "balancer/batch_split.h"
#include "common/name_table.h"
#include "worker/device/backend.h"
#include "worker/comm/communicator.h"
#include "worker/data/data.h"
#include "worker/data/decode_pool.h"
#include "worker/engine/graph.h"
#include "worker/train/bucket_allreduce.h"
#include "worker/train/checkpoint.h"
#include "worker/train/loss_scaler.h"
#include "worker/train/metrics.h"
#include "worker/train/rebalancer.h"
#include "worker/train/train_observer.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"

namespace vtrain::worker {

// model.batch_norm in the config: kSync normalises with the statistics of
// the whole global batch whatever the split (the same as kLocal on one
// rank); kLocal with each rank's own samples (PyTorch DDP without
// SyncBatchNorm).
enum class BatchNormMode { kSync, kLocal };
inline constexpr auto kBatchNormModeNames = std::to_array<common::Named<BatchNormMode>>(
    {{BatchNormMode::kSync, "sync"}, {BatchNormMode::kLocal, "local"}});

// One rank's conv kernels as a plan configures them (NetworkOptions'
// conv_executions and conv_workspace_bytes); empty = conv_algorithm,
// undivided.
struct ConvPlan {
  std::vector<ConvLayerExecution> executions;
  uint64_t workspace_bytes = 0;
  friend bool operator==(const ConvPlan&, const ConvPlan&) = default;
};

// Values that replace parts of a fresh initialisation (model.init): ranges
// of the network's flat parameter and buffer arrays (Network::parameters,
// ::buffers), each already checked against the model it is for.
struct WeightRange {
  int64_t offset = 0;          // floats into the array
  std::vector<float> values;
};
struct InitialWeights {
  std::vector<WeightRange> parameters;
  std::vector<WeightRange> buffers;
  std::string note;  // said when they are applied ("model.init: 62 tensors from FILE ...")
};

// train.* in the config, the part the training loop reads (config::TrainConfig
// adds what the launcher decides with: the precision forms, the step
// timeout). One struct for both: the config loader fills it, the trainer
// reads it as it is.
struct TrainSettings {
  int64_t batch = 64;          // global mini-batch B (all ranks together)
  int64_t epochs = 1;
  int64_t max_steps = 0;       // stop after this many steps in total; 0 = no limit
  uint64_t seed = 1;           // initialisation and shuffling
  int64_t log_every = 50;      // steps between progress lines and metric records
  bool evaluate = true;        // test accuracy after every epoch
  uint64_t allreduce_bucket = 4 << 20;  // gradient bytes per allreduce (several ranks)
  // Dynamic loss scaling (loss_scaler.h): mode auto | on | off (auto: on
  // under fp16), initial scale, growth_interval.
  LossScalingSettings loss_scaling;
  // fp32 | half: the type gradient buckets are allreduced in; half is the
  // precision's half type, summed in f32 (bucket_allreduce.h: wire_type),
  // and needs precision bf16 or fp16.
  GradientAllreduce gradient_allreduce = GradientAllreduce::kFp32;
  // Label smoothing s in [0, 1): the loss's target is (1 - s) * onehot + s / classes.
  double label_smoothing = 0.0;
  // Decay of an exponential moving average of the weights, evaluated beside
  // them and kept in checkpoints; 0 = none.
  double ema = 0.0;
  // Training ends after the first epoch whose test accuracy (the weights',
  // evaluated over every rank's share) is at least this; 0 = every epoch.
  // Needs `evaluate` and a test set.
  double target_accuracy = 0.0;
};

// What the config says about training, section by section: each member is
// filled from its section as it is (launcher/part_options.h:
// trainer_options), never patched afterwards. What only exists at run time
// travels in TrainerContext.
struct TrainerOptions {
  TrainSettings train;           // train.*
  OptimizerSettings optimizer;   // optimizer.* but the schedule
  ScheduleSettings schedule;     // optimizer.lr, schedule, step_epochs, gamma, warmup_steps
  // How this rank computes the graph, its own precision included: the run
  // settings (common::kSettings, config::compute_settings).
  ComputeSettings settings;
  std::string conv_algorithm = "auto";  // conv.algorithm: "auto" or a backend's algorithm name
  // Memory (memory.policy and memory.planner in the config; see network.h).
  memory::Policy memory_policy = memory::Policy::kNone;
  memory::Planner memory_planner = memory::Planner::kPool;
  // output.metrics: JSON lines; empty = none (written by rank 0). A run
  // started afresh creates or truncates it, a resumed run appends to it.
  std::string metrics_path;
  // output.progress: rank 0 reports so, other ranks stay silent.
  Progress::Mode progress = Progress::Mode::kLines;
  // checkpoint.* (rank 0 writes; every rank resumes from the same file).
  // Rank 0 holds checkpoint.dir for the run (CheckpointFolder) and starts
  // in it as plan_run_start says for its resume (checkpoint.h).
  CheckpointSettings checkpoint;
  // balance.rebalance: online re-balancing of the split (rebalancer.h);
  // enabled only under an auto split. Without profiles (TrainerContext) on
  // rank 0 the split stays, but every rank's compute time per step is
  // still shared and recorded in the metrics' step records.
  RebalanceSettings rebalance;
  // data.prefetch, for the gathering: gather the next batch on a thread
  // while a step computes; auto: where the batch holds at least 2^20
  // values (where it pays).
  common::AutoOnOff gather_ahead = common::AutoOnOff::kAuto;
  // data.prefetch, for the copy: copy the batch gathered ahead to the
  // device while the step before it finishes (Network::prefetch_input);
  // auto: on a device with memory of its own (a GPU). Only batches
  // gathered ahead.
  common::AutoOnOff prefetch_input = common::AutoOnOff::kAuto;
  int prefetch_batches = 1;  // data.prefetch_batches: batches gathered ahead at most
};

// What one rank's training needs beside its settings that only exists at
// run time: the job's communicators, what the launcher decided at start
// (the split, the plan, every rank's precision), callbacks into the
// launcher, observers. Pointers are not owned and must outlive train().
struct TrainerContext {
  // Data parallelism. Each global batch of B samples is cut into contiguous
  // per-rank slices of split[r] samples (sum = B); each rank's loss is its
  // sum over samples divided by B, so the allreduce SUM of gradients is the
  // full-batch gradient whatever the split. A rank with 0 samples only takes
  // part in the allreduce.
  Communicator* comm = nullptr;  // null: a single process
  std::vector<int64_t> split;    // per-rank batch sizes; empty = balancer::even_split(B, ranks)
  // model.batch_norm: sync with several ranks: batch norm normalises with
  // the global batch's statistics, added up over this communicator (over
  // the same ranks as comm, but a communicator of its own: its collectives
  // run in forward and backward while comm's allreduces are in flight).
  // Null: each rank normalises its own samples (local).
  Communicator* batch_norm_comm = nullptr;
  // Every rank's train.precision, in rank order, where ranks differ (a
  // precision per rank); empty: every rank computes in settings.precision. Each
  // rank's graph is built in its own; this decides the exchange's type and
  // where the loss is scaled (loss_scaler.h: plan_loss_scaling).
  std::vector<common::Precision> rank_precisions;
  // This rank's convolution kernels from the plan solved at start.
  ConvPlan conv_plan;
  // After a re-balance, this rank's conv kernels at its new batch.
  // Collective: every rank calls it at the same step boundary, with the
  // switch (whose rank-0-only fields are set on rank 0). nullopt: keep the
  // kernels it has (their calls then run at the sizes planned for the old
  // batch, cycled). Null: no re-planning.
  std::function<std::optional<ConvPlan>(const SplitSwitch& to)> replan_kernels;
  // Rank 0: the step-time curves the split was solved on and the solve's
  // options (RebalanceOptions); empty: nothing to re-solve with.
  std::vector<balancer::DeviceProfile> rebalance_profiles;
  balancer::BatchSplitOptions rebalance_split_options;
  // Under a per-tensor policy, the simulator's costs for a network on
  // these options (the perf DB's profile of this device at its max_batch,
  // or measured in place in steps); null or nullopt: the network measures
  // them in place, each layer alone.
  std::function<std::optional<memory::StepCosts>(const NetworkOptions& net)> memory_costs_at;
  // Chrome trace (vtrain train --trace FILE): compute and memory-stream
  // events of the first trace_steps steps of every rank, one process per
  // rank, written by rank 0 at the end. Empty = none.
  std::string trace_path;
  int64_t trace_steps = 20;
  // Limits this rank's input to this many images/s (InputThrottle,
  // input_rate.h: VTRAIN_INPUT_RATE_LIMIT); nullopt = as fast as it comes.
  std::optional<double> input_rate_limit;
  // Decoding threads for training data that needs more than a copy (image
  // files, transforms; data.workers decided for this rank's host): 0 =
  // none, the gathering thread decodes alone.
  int data_workers = 0;
  // The config values that define what this run trains, stored in its
  // checkpoints; a resume from a checkpoint with other values is refused
  // naming them (check_checkpoint_settings). The launcher fills it
  // (config::run_settings); empty: nothing compared beyond the model,
  // the batch and the seed.
  std::vector<RunSetting> run_settings;
  // model.init: called on every rank when the run starts afresh (after
  // the checkpoint folder said so, before the first step), its values
  // written over init_parameters(seed). A resumed run continues its
  // checkpoint's weights and never calls it (the file may be gone by
  // then). It throws when the file does not fit; nothing is written then.
  // Null: none.
  std::function<InitialWeights()> initial_weights;
  // Non-zero (a signal number) asks every rank to stop at the next step
  // boundary, after a checkpoint.
  const std::atomic<int>* stop_signal = nullptr;
  // Hooks called on this rank at fixed points of every step (the tests'
  // failure injection, failure_injection.h); null = none.
  TrainObserver* observer = nullptr;
};

// How a rank stages its batches (TrainerOptions::gather_ahead and
// prefetch_input decided) for a batch of `rank_batch` samples of
// `sample_values` values each on `backend`.
struct BatchStaging {
  bool gather_ahead = false;
  bool prefetch_input = false;  // NetworkOptions::prefetch_input
};
// Image files (`decodes`) are always worth gathering ahead under auto.
BatchStaging batch_staging(const TrainerOptions& options, int64_t rank_batch,
                           int64_t sample_values, const Backend& backend, bool decodes = false);

// The device allocations training makes beside the network, each in bytes
// per parameter (NetworkOptions::allocations_after_network): the state of
// an `optimizer` (Optimizer::state_bytes_per_parameter), the weight
// average with `ema`, and, where it has one, the gradient allreduce's
// staging over the job's ranks, computing in `ranks` (every rank's
// precision; staging_bytes_per_parameter). Throws what wire_type throws.
std::vector<size_t> training_allocations_per_parameter(OptimizerKind optimizer, bool ema,
                                                       GradientAllreduce allreduce,
                                                       std::span<const common::Precision> ranks);

// The network one rank of a job trains with a batch of up to `max_batch`
// samples: conv.algorithm, memory.policy and memory.planner from
// `options`, and room left for what training allocates beside it
// (training_allocations_per_parameter, with every rank's `precisions`).
// The one builder of a training network's options: the trainer adds the
// plan's kernels, the input staging, the batch-norm sums and the memory
// costs; vtrain check plans with it as it is. Throws what wire_type throws.
NetworkOptions training_network_options(const TrainerOptions& options, int64_t max_batch,
                                        std::span<const common::Precision> precisions);

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;              // mean loss of the last step
  double test_accuracy = -1;          // last evaluation, -1 if none ran
  double test_top5_accuracy = -1;     // its top-5 accuracy (evaluate.h), -1 if none ran
  double test_loss = -1;
  double ema_test_accuracy = -1;      // the same with train.ema's average; -1 if none
  double ema_test_loss = -1;
  int64_t target_epoch = 0;           // the epoch (from 1) that reached train.target_accuracy, or 0
  double images_per_second = 0;       // training steps only (evaluation excluded)
  size_t peak_device_bytes = 0;
  MemoryStats memory;                 // the network's memory part after the last step
  std::vector<double> step_losses;    // global mean loss of every step run
  int stopped_by_signal = 0;          // the signal that stopped the run early, or 0
  std::string resumed_from;           // checkpoint the run continued from, if any
  int64_t resumed_world_size = 0;     // ranks of the run that wrote resumed_from; 0 if none
  std::string last_checkpoint;        // newest checkpoint written, if any
  double allreduce_seconds = 0;       // time the communication side spent in allreduces
  double allreduce_exposed_seconds = 0;  // time the step waited for them
  int64_t rebalances = 0;             // switches of split by online re-balancing
  int64_t skipped_steps = 0;          // steps loss scaling skipped for overflowed gradients
  int64_t prefetched_batches = 0;     // steps whose batch was copied during the step before
  double loss_scale = 0;              // loss scaling's scale after the last step; 0 if off
  std::vector<int64_t> final_split;   // the split of the last step
  double input_wait_seconds = 0;      // this rank's steps waited for their batches (timed steps)
  bool input_bound = false;           // the input wait was over kInputBoundRunShare of the step time
  InputRate input_rate;               // this rank's decoding pool, if it has one
};

// The share of the training time spent waiting for input above which the
// end summary calls a run input-bound (the re-balancer counts a rank's
// wait from a lower share, rebalancer.h's kInputBoundShare).
inline constexpr double kInputBoundRunShare = 0.1;

// Trains `graph` on `backend`, as this rank's part of the job when
// context.comm is set. `test` may have count 0 (then no evaluation). Throws
// on any failure; the metrics file then has no "end" record. A step whose
// loss (the global mean, the same on every rank) is not finite is a failure:
// std::runtime_error naming the step and the last finite loss, thrown before
// that step updates the parameters.
TrainResult train(const Graph& graph, Backend& backend, const Dataset& train_set,
                  const Dataset& test_set, const ChannelStats& norm, const TrainerOptions& options,
                  const TrainerContext& context = {});

}  // namespace vtrain::worker
