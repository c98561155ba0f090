// SGD with momentum and weight decay over a network's flat parameter
// buffer, and the learning-rate schedules.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/name_table.h"
#include "worker/device/backend.h"

namespace vtrain::worker {

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

class Sgd {
 public:
  // Device bytes of state per parameter: the velocity.
  static constexpr size_t kStateBytesPerParameter = sizeof(float);

  // Velocity lives in device memory of `backend`, zero-initialised.
  Sgd(Backend& backend, int64_t parameter_count, float momentum, float weight_decay);
  ~Sgd();
  Sgd(const Sgd&) = delete;
  Sgd& operator=(const Sgd&) = delete;

  // params -= lr * (momentum * v + grads * grad_scale + wd * params),
  // updating v (grad_scale: loss scaling's 1/S).
  void step(float* params, const float* grads, float lr, float grad_scale = 1.0f);

  float* velocity() const { return velocity_; }
  int64_t size() const { return count_; }
  std::vector<float> download_velocity() const;
  void upload_velocity(const std::vector<float>& values);

 private:
  Backend& backend_;
  int64_t count_;
  float momentum_;
  float weight_decay_;
  float* velocity_ = nullptr;
};

}  // namespace vtrain::worker
