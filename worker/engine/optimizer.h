// The optimizers (SGD with momentum or Nesterov, AdamW, LARS) over a
// network's flat parameter buffer, the moving average of the weights, and
// the learning-rate schedules. docs/optimizers.md gives each update's
// formula as implemented here.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/name_table.h"
#include "worker/device/backend.h"

namespace vtrain::worker {

class Graph;
struct ParamRange;

// optimizer.schedule in the config.
enum class ScheduleKind {
  kNone,    // constant
  kStep,    // x gamma every step_epochs
  kCosine,  // cosine to 0 at total_steps
};
inline constexpr auto kScheduleKindNames = std::to_array<common::Named<ScheduleKind>>(
    {{ScheduleKind::kNone, "none"}, {ScheduleKind::kStep, "step"},
     {ScheduleKind::kCosine, "cosine"}});
inline const char* schedule_kind_name(ScheduleKind kind) {
  return common::name_of(kScheduleKindNames, kind);
}
// Throws std::invalid_argument listing the names for anything else.
ScheduleKind parse_schedule_kind(const std::string& name);

struct LrSchedule {
  double base_lr = 0.01;
  ScheduleKind kind = ScheduleKind::kNone;
  int64_t step_epochs = 1;
  double gamma = 0.1;
  int64_t warmup_steps = 0;   // linear ramp from base_lr / warmup_steps
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 1;    // cosine reaches 0 here

  // Learning rate for 0-based global step `step`.
  double at(int64_t step) const;
};

// optimizer.type in the config.
enum class OptimizerKind {
  kSgd,    // torch.optim.SGD (momentum, nesterov, coupled weight decay)
  kAdamW,  // torch.optim.AdamW (decoupled weight decay)
  kLars,   // SGD whose step per tensor is scaled by the LARS trust ratio
};
inline constexpr auto kOptimizerKindNames = std::to_array<common::Named<OptimizerKind>>(
    {{OptimizerKind::kSgd, "sgd"}, {OptimizerKind::kAdamW, "adamw"},
     {OptimizerKind::kLars, "lars"}});

// What a parameter tensor is, for optimizer.no_decay.
enum class ParamKind {
  kWeight,     // a conv's or fc's weights
  kBias,       // a conv's or fc's bias
  kBatchNorm,  // a batch norm's scale or shift
};
// The kinds optimizer.no_decay may name (weights always decay).
inline constexpr auto kNoDecayNames = std::to_array<common::Named<ParamKind>>(
    {{ParamKind::kBatchNorm, "batchnorm"}, {ParamKind::kBias, "bias"}});

// One tensor of the flat parameter buffer.
struct ParamTensor {
  int64_t offset = 0;  // floats into parameters() / gradients()
  int64_t count = 0;
  ParamKind kind = ParamKind::kWeight;
};

// The tensors of the network's parameter buffer, laid out by `ranges`
// (Network::param_ranges()) over `graph`'s layers: a conv's or fc's
// weights then its bias, a batch norm's scale then its shift.
std::vector<ParamTensor> parameter_tensors(const Graph& graph,
                                           std::span<const ParamRange> ranges);

// The optimizer section of a job, as the update uses it.
struct OptimizerSettings {
  OptimizerKind kind = OptimizerKind::kSgd;
  float momentum = 0.0f;      // sgd, lars
  bool nesterov = false;      // sgd, lars
  float weight_decay = 0.0f;  // sgd, lars: added to the gradient; adamw: decoupled
  float beta1 = 0.9f;         // adamw
  float beta2 = 0.999f;       // adamw
  float eps = 1e-8f;          // adamw
  float trust = 0.001f;       // lars: the trust coefficient
  // Tensors of these kinds get no weight decay (and under lars no trust ratio).
  std::vector<ParamKind> no_decay = {};
  // > 0: the gradient is scaled down to this global L2 norm when above it.
  double clip_norm = 0.0;
};

// An optimizer's state between steps, on the host (checkpoints).
struct OptimizerState {
  std::vector<float> first;   // sgd, lars: the velocity; adamw: the first moment m
  std::vector<float> second;  // adamw: the second moment v; else empty
  int64_t updates = 0;        // updates applied (adamw's bias corrections count them)
  friend bool operator==(const OptimizerState&, const OptimizerState&) = default;
};

class Optimizer {
 public:
  // Device bytes of state per parameter.
  static size_t state_bytes_per_parameter(OptimizerKind kind);

  // State in device memory of `backend`, zero-initialised, for parameters
  // made of `tensors` (covering [0, count) in order, without gaps).
  Optimizer(Backend& backend, std::vector<ParamTensor> tensors, const OptimizerSettings& settings);
  // Parameters that are all weights (no kinds to tell apart).
  Optimizer(Backend& backend, int64_t parameter_count, const OptimizerSettings& settings);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of params from grads, which were computed scaled by
  // 1 / grad_scale (loss scaling) and are the same on every rank (after
  // the allreduce): so are the norms taken from them, and the update.
  // Clipping (clip_norm) applies to the unscaled gradients.
  void step(float* params, const float* grads, float lr, float grad_scale = 1.0f);

  // The global L2 norm of the unscaled gradients at the last step(), when
  // clip_norm or LARS took it; 0 otherwise.
  double last_gradient_norm() const { return last_norm_; }

  int64_t size() const { return count_; }
  const OptimizerSettings& settings() const { return settings_; }
  OptimizerState download_state() const;
  // Throws std::invalid_argument naming the array whose size does not fit.
  void upload_state(const OptimizerState& state);

 private:
  // Tensors updated by one call: a run of neighbours treated alike, or
  // (LARS) one tensor with its own trust ratio.
  struct Group {
    int64_t offset = 0;
    int64_t count = 0;
    bool decays = true;  // weight decay, and under LARS the trust ratio
  };
  std::vector<Group> make_groups(const std::vector<ParamTensor>& tensors) const;
  float clipped_scale(const float* grads, float grad_scale);
  void lars_step(float* params, const float* grads, float lr, float grad_scale);
  float* allocate_state();

  Backend& backend_;
  OptimizerSettings settings_;
  int64_t count_ = 0;
  std::vector<Group> groups_;
  std::vector<int64_t> group_offsets_;  // groups_' bounds, for sum_squares
  float* first_ = nullptr;
  float* second_ = nullptr;
  int64_t updates_ = 0;
  double last_norm_ = 0.0;
};

// SGD with momentum and weight decay over parameters all treated alike:
// the optimizer of the tools that need no other (the profiler's step, the
// DQN planner's network, benchmarks and tests).
class Sgd : public Optimizer {
 public:
  static constexpr size_t kStateBytesPerParameter = sizeof(float);
  Sgd(Backend& backend, int64_t parameter_count, float momentum, float weight_decay)
      : Optimizer(backend, parameter_count,
                  {.momentum = momentum, .weight_decay = weight_decay}) {}
};

// An exponential moving average of the parameters (train.ema), in device
// memory: after each update, average += (1 - decay) * (params - average).
// It starts as a copy of the parameters.
class WeightAverage {
 public:
  static constexpr size_t kStateBytesPerParameter = sizeof(float);

  WeightAverage(Backend& backend, const float* params, int64_t count, float decay);
  ~WeightAverage();
  WeightAverage(const WeightAverage&) = delete;
  WeightAverage& operator=(const WeightAverage&) = delete;

  void update(const float* params) { update(params, decay_); }
  const float* values() const { return average_; }
  int64_t size() const { return count_; }
  std::vector<float> download() const;
  // Throws std::invalid_argument when the size does not fit.
  void upload(const std::vector<float>& values);

 private:
  void update(const float* params, float decay) {
    backend_.run(MovingAverageDesc{count_, decay}, MovingAverageArgs{average_, params});
  }

  Backend& backend_;
  int64_t count_;
  float decay_;
  float* average_ = nullptr;
};

}  // namespace vtrain::worker
