// The run configuration: YAML parsed into plain structs and validated up
// front. Only the loader in configs/ (config*.cpp) knows YAML.
//
// Errors throw ConfigError with "FILE:LINE: KEY: what was expected" (for a
// --set override: "--set KEY: ..."). Unknown keys are errors.
//
// A knob with a fixed set of choices is held as the enum of the part that
// acts on it; the loader and the dump take its names from that part's name
// table (e.g. memory::kPolicyNames), so the list is written once.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "balancer/batch_split.h"
#include "balancer/workspace_plan.h"
#include "common/compute_settings.h"
#include "common/input_error.h"
#include "common/text.h"
#include "memory/device_pool.h"
#include "memory/vdnn_plan.h"
#include "worker/data/data.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/parameter_layout.h"
#include "worker/train/checkpoint.h"
#include "worker/train/metrics.h"
#include "worker/train/rebalancer.h"
#include "worker/train/trainer.h"

namespace vtrain::config {

using ConfigError = common::InputError;

struct ModelConfig {
  std::string preset;                          // a preset name, or empty when `layers` is given
  // Explicit layers (`model.layers`, or those of model.onnx). Empty with a
  // preset: its layers depend on the data shape, known only once the data
  // is opened, so the trainer expands it with
  // worker::preset_layers(preset, {shape, classes}).
  std::vector<worker::LayerSpec> layers;
  // model.onnx: the ONNX file `layers` were read from (model_io/onnx.h);
  // empty otherwise. The per-sample input it declares (the data's must be
  // the same), and its initializers: the weights training starts from.
  std::string onnx;
  worker::Shape onnx_input;
  std::vector<worker::NamedTensor> initial_weights;
  int64_t classes = 10;                        // model.classes (presets); default data.classes or 10
  // model.batch_norm: sync (statistics of the global batch when several
  // ranks train) or local (each rank's own samples)
  worker::BatchNormMode batch_norm = worker::BatchNormMode::kSync;
  // model.init: a safetensors file of starting weights (docs/weights.md);
  // empty: the seeded initialisation. model.init_skip: layers it leaves
  // freshly initialised (vtrain layer names, or torchvision module names).
  std::string init;
  std::vector<std::string> init_skip;
};

struct DataConfig {
  worker::DataKind kind = worker::DataKind::kIdx;
  // idx
  std::string train_images, train_labels, test_images, test_labels;
  // cifar10: the five data_batch_N.bin files and test_batch.bin
  std::vector<std::string> train_files;
  std::vector<std::string> test_files;
  // imagefolder: <dir>/<class>/<image>, or list files of "path label" lines
  std::string train_dir, test_dir, train_list, test_list;
  bool skip_unreadable = false;  // skip files that are not JPEG or PNG (counted) instead of failing
  // shards: WebDataset tar files, brace patterns allowed
  std::vector<std::string> train_shards, test_shards;
  // synthetic; for imagefolder and shards the network's input images are transformed to
  worker::Shape shape{1, 1, 28, 28};           // data.shape: [C, H, W]
  int64_t classes = 10;
  int64_t train_size = 1024;
  int64_t test_size = 256;
  // Standardisation; empty = the training set's per-channel statistics.
  std::vector<float> mean, stddev;
  // Gather the next batch on a thread while a step runs and copy it to the
  // device meanwhile: auto (gather where a rank's batch holds 2^20 values
  // or more, copy where the device is a GPU), on (both, always), off.
  common::AutoOnOff prefetch = common::AutoOnOff::kAuto;
  // Per-sample transforms (worker/data/transform.h); image files default to
  // a centre crop, in-memory data to none.
  worker::TransformOptions train_transform, test_transform;
  // Decoding threads per rank; 0 = auto (worker/data/decode_pool.h).
  int64_t workers = 0;
  // data.workers written as a list: entry r is rank r's (0 = auto); the
  // job must have as many ranks. Empty: `workers` for every rank.
  std::vector<int64_t> workers_per_rank;
  // Batches decoded ahead of the step that needs them.
  int64_t prefetch_batches = 2;
};

// train.precision in the config: one precision (`bf16`), `auto` (per
// rank, the first of train.precisions its device offers), a list of one
// per rank (`[fp32, bf16]`) or a map from device names to precisions
// (devices it does not name choose as auto does).
struct PrecisionChoice {
  enum class Form { kOne, kAuto, kPerRank, kByDevice };
  Form form = Form::kOne;
  common::Precision one = common::Precision::kFp32;                  // kOne
  std::vector<common::Precision> per_rank;                           // kPerRank
  std::vector<std::pair<std::string, common::Precision>> by_device;  // kByDevice, in file order
};

// train.*: what the training loop reads (worker::TrainSettings: batch,
// epochs, max_steps, seed, log_every, evaluate, allreduce_bucket,
// loss_scaling, gradient_allreduce, label_smoothing, ema), and what the
// launcher decides with before it.
struct TrainConfig : worker::TrainSettings {
  // train.precision as written: one precision for every rank, auto, one
  // per rank, or one per device name (configs/rank_precision.h).
  PrecisionChoice precision_choice;
  // train.precisions: what auto may choose, in order of preference.
  std::vector<common::Precision> precisions = {common::Precision::kBf16, common::Precision::kFp16,
                                               common::Precision::kFp32};
  // Seconds a rank of a job of several waits for a step (from one step's
  // start to the next's) before it takes a rank or host for lost, names the
  // ranks that do not answer and ends the job (worker/train/step_watch.h);
  // 0: wait for ever.
  double step_timeout = 600;
};

struct BalanceConfig {
  balancer::SplitMode split = balancer::SplitMode::kEven;
  std::vector<int64_t> manual; // split: manual — per-rank batch sizes, summing to train.batch
  int64_t granularity = 1;     // auto: every per-rank batch is a multiple of this
  balancer::CandidateSizes candidates = balancer::CandidateSizes::kInterpolated;  // auto
  balancer::WorkspacePolicy workspace = balancer::WorkspacePolicy::kUndivided;  // conv workspaces
  uint64_t workspace_limit = 64ull << 20;   // wr: per kernel; wd: per rank in total (bytes)
  balancer::AllreduceCost allreduce = balancer::AllreduceCost::kMeasure;  // auto
  bool input_aware = true;     // auto: price each rank's input (its measured images/s) in the split
  // auto: online re-balancing (balance.rebalance: enabled, threshold,
  // window, patience, min_gain, min_gain_ms; see worker/train/rebalancer.h). Even and
  // manual splits are the user's and stay.
  worker::RebalanceSettings rebalance;
};

struct ProfileConfig {
  std::string db;                   // perf DB file (SQLite); empty = perf.db beside the config
  std::vector<int64_t> batches;     // per-rank batch sizes to profile; empty = train.batch / ranks
  balancer::MicroBatchPolicy micro_batches = balancer::MicroBatchPolicy::kUndivided;
  int64_t warmup = 1;               // untimed runs before the timed ones
  int64_t repeats = 5;              // timed runs; the median is recorded
  bool steps = true;                // also time whole steps (upload, fwd, bwd, update)
  int64_t step_rounds = 1;          // rounds over the batches' steps; the median round is kept
};

// The most profile.step_rounds: every round runs a whole step of every
// profiled batch (100 rounds of five 1-second steps take over 8 minutes),
// while the median's noise shrinks only as 1/sqrt(rounds) (at 100 rounds
// to about an eighth of one round's spread); a larger count is a slip.
inline constexpr int64_t kMaxStepRounds = 100;

// checkpoint.*: dir, every, keep, resume (never | auto | required), as
// the trainer reads them.
using CheckpointConfig = worker::CheckpointSettings;

// optimizer.*: the schedule (worker::ScheduleSettings: lr, schedule,
// step_epochs, gamma, warmup_steps) and the optimizer.
struct OptimizerConfig : worker::ScheduleSettings {
  worker::OptimizerKind type = worker::OptimizerKind::kSgd;  // sgd | adamw | lars
  double momentum = 0.0;          // sgd, lars
  bool nesterov = false;          // sgd, lars: Nesterov momentum (needs momentum > 0)
  double weight_decay = 0.0;      // sgd, lars: L2 in the gradient; adamw: decoupled
  double beta1 = 0.9;             // adamw: optimizer.betas [beta1, beta2]
  double beta2 = 0.999;
  double eps = 1e-8;              // adamw
  double trust = 0.001;           // lars: the trust coefficient
  std::vector<worker::ParamKind> no_decay;  // batchnorm, bias: no weight decay (nor LARS ratio)
  double clip_norm = 0.0;         // > 0: clip the global gradient L2 norm to this; 0 = off
};

struct DeviceConfig {
  worker::BackendKind backend = worker::BackendKind::kAuto;  // auto, cpu or cuda
  int threads = 0;                // CPU threads; 0 = all cores
  uint64_t memory_limit = 0;      // bytes; 0 = the device's memory
};

struct ConvConfig {
  std::string algorithm = "auto";  // "auto" or a backend algorithm name (cpu: direct, winograd, im2col_gemm)
  bool cudnn_graph = true;         // CUDA, half precision: also cuDNN's graph-API engines
  int graph_engines = worker::kDefaultGraphEngines;  // ... the heuristic's first this many per configuration
};

struct MemoryConfig {
  memory::Policy policy = memory::Policy::kNone;     // none, vDNN's all / conv / dyn
                                                     // (memory/vdnn_plan.h), or a per-tensor
                                                     // planner: auto, memonger, superneurons,
                                                     // tflms (memory/planner.h)
  memory::Planner planner = memory::Planner::kPool;  // best fit as requests come, or a DSA plan
};

struct OutputConfig {
  std::string metrics;            // JSON-lines metrics file; empty = none
  worker::ProgressSetting progress = worker::ProgressSetting::kAuto;
  std::string plan;               // write the plan a run solved for here; empty = don't
};

// Where a key of the config came from, for errors found after loading.
struct KeyOrigin {
  std::string key;                // key path, e.g. "device.threads", "model.layers[2]"
  int line = 0;                   // line in the file; 0 for a value from --set
};

struct Config {
  std::string path;               // the file it came from
  std::vector<KeyOrigin> origins; // every key path in the file or set by --set
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimizerConfig optimizer;
  DeviceConfig device;
  ConvConfig conv;
  OutputConfig output;
  BalanceConfig balance;
  CheckpointConfig checkpoint;
  ProfileConfig profile;
  MemoryConfig memory;
  // How the model is computed: the run settings (common::kSettings), each
  // read from and dumped to its config key by its row. Its precision is
  // this rank's (fp32, tf32, bf16 or fp16: the type activations, their
  // gradients and the weights the kernels read are stored in; master
  // weights, gradients and the optimizer stay fp32): the loader sets it for
  // one train.precision; for the other forms the launcher resolves it on
  // each rank's device (resolve_rank_precision).
  common::ComputeSettings compute;
};

// The most a config file may hold: a config with thousands of explicit
// layers is well under 1 MiB; a path to a device or a wrong file is refused
// before it fills memory (common/text_file.h).
inline constexpr uint64_t kMaxConfigBytes = uint64_t{4} << 20;

// Loads and validates `path`, applying `overrides` ("key.path=value", the
// value parsed as YAML) before validation. Relative paths in the file are
// resolved against the config file's folder, those given with --set against
// the working directory. The file holds one YAML document of at most
// kMaxConfigBytes. Throws ConfigError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The same from YAML text (`origin` stands for the file name in messages).
Config parse_config(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});

using common::parse_size;  // "64MiB" -> bytes (common/text.h)

// "FILE:LINE: KEY", "--set KEY" or "FILE: KEY" (see fail_at).
std::string where_at(const Config& config, const std::string& key);

// Throws ConfigError "FILE:LINE: KEY: message" for a key read from the file,
// "--set KEY: message" for one from --set, "FILE: KEY: message" for a key
// left at its default: how checks made after loading (config_limits.h, the
// launcher) name the value they refuse.
[[noreturn]] void fail_at(const Config& config, const std::string& key, const std::string& message);

// A readable YAML dump of the effective configuration (for logs).
std::string to_yaml(const Config& config);

// The values that define what a run trains, for its checkpoints
// (worker::TrainerContext::run_settings): every key of model.*, data.* and
// optimizer.* as the dump writes it ("optimizer.lr" = "0.05"), except
// data.prefetch and the data's file paths and test set, and a "training
// set" entry for what `train` holds ("60000 samples of 1x28x28, 10
// classes"). Left out, and so free to change on a resume: how and where
// the run trains (ranks, split, device.*, conv.*, memory.*, balance.*,
// train.precision, train.loss_scaling, train.gradient_allreduce), how long
// (train.epochs, train.max_steps: a run may be extended), and what it
// reports (output.*, train.log_every, train.evaluate, checkpoint.*).
std::vector<worker::RunSetting> run_settings(const Config& config, const worker::Dataset& train);

}  // namespace vtrain::config
