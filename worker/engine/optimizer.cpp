#include "worker/engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

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

Sgd::Sgd(Backend& backend, int64_t parameter_count, float momentum, float weight_decay)
    : backend_(backend), count_(parameter_count), momentum_(momentum), weight_decay_(weight_decay) {
  velocity_ = static_cast<float*>(backend.allocate_device(vector_desc(count_).bytes()));
  backend.fill(Tensor{vector_desc(count_), velocity_}, 0.0f);
}

Sgd::~Sgd() { backend_.free_device(velocity_); }

void Sgd::step(float* params, const float* grads, float lr, float grad_scale) {
  backend_.sgd_update(params, grads, velocity_, count_,
                      {lr, momentum_, weight_decay_, grad_scale});
}

std::vector<float> Sgd::download_velocity() const {
  std::vector<float> host(static_cast<size_t>(count_));
  if (count_ > 0) backend_.download(Tensor{vector_desc(count_), velocity_}, host.data());
  return host;
}

void Sgd::upload_velocity(const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != count_) {
    throw std::invalid_argument("upload_velocity: " + std::to_string(values.size()) +
                                " values for " + std::to_string(count_));
  }
  if (count_ > 0) backend_.upload(values.data(), Tensor{vector_desc(count_), velocity_});
}

}  // namespace vtrain::worker
