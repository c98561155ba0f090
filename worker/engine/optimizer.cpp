#include "worker/engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "worker/engine/graph.h"
#include "worker/engine/layers/layer.h"
#include "worker/engine/network.h"
#include "worker/device/op_calls.h"

namespace vtrain::worker {

ScheduleKind parse_schedule_kind(const std::string& name) {
  return common::parse_named<std::invalid_argument>(kScheduleKindNames, name,
                                                    "learning-rate schedule");
}

double LrSchedule::at(int64_t step) const {
  double lr = base_lr;
  if (kind == ScheduleKind::kStep) {
    const int64_t epoch = step / std::max<int64_t>(steps_per_epoch, 1);
    lr *= std::pow(gamma, static_cast<double>(epoch / std::max<int64_t>(step_epochs, 1)));
  } else if (kind == ScheduleKind::kCosine) {
    const double t = std::clamp(static_cast<double>(step) /
                                    static_cast<double>(std::max<int64_t>(total_steps, 1)),
                                0.0, 1.0);
    lr *= 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
  if (warmup_steps > 0 && step < warmup_steps) {
    lr *= static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  return lr;
}

std::vector<ParamTensor> parameter_tensors(const Graph& graph,
                                           std::span<const ParamRange> ranges) {
  std::vector<ParamTensor> tensors;
  for (const ParamRange& r : ranges) {
    const LayerSpec& spec = graph.layer(r.layer);
    if (spec.type == LayerType::kBatchNorm) {
      tensors.push_back({r.offset, r.count / 2, ParamKind::kBatchNorm});              // scale
      tensors.push_back({r.offset + r.count / 2, r.count / 2, ParamKind::kBatchNorm});  // shift
      continue;
    }
    // conv and fc: the weights, then the bias (one value per output).
    const int64_t bias = spec.bias ? spec.out : 0;
    tensors.push_back({r.offset, r.count - bias, ParamKind::kWeight});
    if (bias > 0) tensors.push_back({r.offset + r.count - bias, bias, ParamKind::kBias});
  }
  return tensors;
}

size_t Optimizer::state_bytes_per_parameter(OptimizerKind kind) {
  return (kind == OptimizerKind::kAdamW ? 2 : 1) * sizeof(float);
}

Optimizer::Optimizer(Backend& backend, std::vector<ParamTensor> tensors,
                     const OptimizerSettings& settings)
    : backend_(backend), settings_(settings) {
  for (const ParamTensor& t : tensors) {
    if (t.offset != count_ || t.count < 0) {
      throw std::invalid_argument("Optimizer: parameter tensors must cover the buffer in order (a "
                                  "tensor at offset " + std::to_string(t.offset) + ", expected " +
                                  std::to_string(count_) + ")");
    }
    count_ += t.count;
  }
  groups_ = make_groups(tensors);
  group_offsets_.push_back(0);
  for (const Group& g : groups_) group_offsets_.push_back(g.offset + g.count);
  if (settings_.clip_norm > 0 || settings_.kind == OptimizerKind::kLars) {
    // The norms' reduction needs this once per step: reserved now, not mid-run.
    backend_.reserve_scratch(backend_.scratch_bytes(SumSquaresDesc{groups_.size()}).scratch);
  }
  first_ = allocate_state();
  if (settings_.kind == OptimizerKind::kAdamW) second_ = allocate_state();
}

Optimizer::Optimizer(Backend& backend, int64_t parameter_count, const OptimizerSettings& settings)
    : Optimizer(backend, {{0, parameter_count, ParamKind::kWeight}}, settings) {}

Optimizer::~Optimizer() {
  backend_.free_device(first_);
  if (second_) backend_.free_device(second_);
}

float* Optimizer::allocate_state() {
  auto* state = static_cast<float*>(backend_.allocate_device(vector_desc(count_).bytes()));
  backend_.fill(Tensor{vector_desc(count_), state}, 0.0f);
  return state;
}

// SGD and AdamW merge neighbours that decay alike into one call; LARS
// keeps every decaying tensor apart (each has its own trust ratio).
std::vector<Optimizer::Group> Optimizer::make_groups(const std::vector<ParamTensor>& tensors) const {
  std::vector<Group> groups;
  for (const ParamTensor& t : tensors) {
    if (t.count == 0) continue;
    const bool decays = std::find(settings_.no_decay.begin(), settings_.no_decay.end(), t.kind) ==
                        settings_.no_decay.end();
    const bool apart = settings_.kind == OptimizerKind::kLars && decays;
    if (!groups.empty() && !apart && groups.back().decays == decays) {
      groups.back().count += t.count;
    } else {
      groups.push_back({t.offset, t.count, decays});
    }
  }
  return groups;
}

// torch.nn.utils.clip_grad_norm_'s rule on the unscaled gradients: scaled
// by clip_norm / (norm + 1e-6) when that is below 1. Returns the scale the
// update multiplies the stored gradients by.
float Optimizer::clipped_scale(const float* grads, float grad_scale) {
  last_norm_ = 0.0;
  if (settings_.clip_norm <= 0) return grad_scale;
  const std::vector<double> sums =
      sum_squares(backend_, grads, std::vector<int64_t>{0, count_});
  last_norm_ = std::sqrt(sums[0]) * grad_scale;
  const double coef = settings_.clip_norm / (last_norm_ + 1e-6);
  return coef < 1.0 ? static_cast<float>(grad_scale * coef) : grad_scale;
}

void Optimizer::step(float* params, const float* grads, float lr, float grad_scale) {
  if (count_ == 0) return;
  ++updates_;
  const float scale = clipped_scale(grads, grad_scale);
  if (settings_.kind == OptimizerKind::kLars) {
    lars_step(params, grads, lr, scale);
    return;
  }
  for (const Group& g : groups_) {
    const float wd = g.decays ? settings_.weight_decay : 0.0f;
    float* w = params + g.offset;
    const float* d = grads + g.offset;
    if (settings_.kind == OptimizerKind::kAdamW) {
      backend_.run(AdamWDesc{g.count,
                             {.lr = lr, .beta1 = settings_.beta1, .beta2 = settings_.beta2,
                              .eps = settings_.eps, .weight_decay = wd, .grad_scale = scale,
                              .step = updates_}},
                   AdamWArgs{w, d, first_ + g.offset, second_ + g.offset});
    } else {
      backend_.run(SgdDesc{g.count,
                           {.lr = lr, .momentum = settings_.momentum, .weight_decay = wd,
                            .grad_scale = scale, .nesterov = settings_.nesterov}},
                   SgdArgs{w, d, first_ + g.offset});
    }
  }
}

// LARS as NVIDIA apex's LARC (clip off) applies it before torch.optim.SGD:
// per decaying tensor, ratio = trust * |w| / (|g| + weight_decay * |w|)
// (1 where either norm is 0), and SGD with momentum then steps on
// ratio * (g + weight_decay * w). Tensors in no_decay take plain SGD.
void Optimizer::lars_step(float* params, const float* grads, float lr, float grad_scale) {
  const std::vector<double> w2 = sum_squares(backend_, params, group_offsets_);
  const std::vector<double> g2 = sum_squares(backend_, grads, group_offsets_);
  for (size_t i = 0; i < groups_.size(); ++i) {
    const Group& g = groups_[i];
    double ratio = 1.0;
    const double w_norm = std::sqrt(w2[i]);
    const double g_norm = std::sqrt(g2[i]) * grad_scale;
    if (g.decays && w_norm > 0 && g_norm > 0) {
      ratio = settings_.trust * w_norm / (g_norm + settings_.weight_decay * w_norm);
    }
    const float wd = g.decays ? settings_.weight_decay : 0.0f;
    backend_.run(SgdDesc{g.count,
                         {.lr = lr, .momentum = settings_.momentum,
                          .weight_decay = static_cast<float>(wd * ratio),
                          .grad_scale = static_cast<float>(grad_scale * ratio),
                          .nesterov = settings_.nesterov}},
                 SgdArgs{params + g.offset, grads + g.offset, first_ + g.offset});
  }
}

namespace {

// upload_floats (layers/layer.h) of exactly `count` values.
void upload_exactly(Backend& backend, const std::vector<float>& host, float* device,
                    int64_t count, const char* what) {
  if (static_cast<int64_t>(host.size()) != count) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(host.size()) +
                                " values for " + std::to_string(count));
  }
  upload_floats(backend, host, device);
}

}  // namespace

OptimizerState Optimizer::download_state() const {
  OptimizerState state;
  state.first = download_floats(backend_, first_, count_);
  if (second_) state.second = download_floats(backend_, second_, count_);
  state.updates = updates_;
  return state;
}

void Optimizer::upload_state(const OptimizerState& state) {
  upload_exactly(backend_, state.first, first_, count_, "optimizer state (velocity or m)");
  if (second_) upload_exactly(backend_, state.second, second_, count_, "optimizer state (v)");
  else if (!state.second.empty()) {
    throw std::invalid_argument("optimizer state: a second moment for an optimizer without one");
  }
  updates_ = state.updates;
}

WeightAverage::WeightAverage(Backend& backend, const float* params, int64_t count, float decay)
    : backend_(backend), count_(count), decay_(decay) {
  average_ = static_cast<float*>(backend.allocate_device(vector_desc(count_).bytes()));
  backend.fill(Tensor{vector_desc(count_), average_}, 0.0f);
  // 0 + 1 * (params - 0): an exact copy.
  update(params, 0.0f);
}

WeightAverage::~WeightAverage() { backend_.free_device(average_); }

std::vector<float> WeightAverage::download() const {
  return download_floats(backend_, average_, count_);
}

void WeightAverage::upload(const std::vector<float>& values) {
  upload_exactly(backend_, values, average_, count_, "weight average");
}

}  // namespace vtrain::worker
