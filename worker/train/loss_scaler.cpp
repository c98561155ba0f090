#include "worker/train/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace vtrain::worker {

namespace {

// The least and largest scales a float holds as a power of two that
// gradients in half precision can use.
constexpr double kLeast = 0x1p-24;
constexpr double kMost = 0x1p127;

}  // namespace

LossScalingPlan plan_loss_scaling(const LossScalingSettings& settings,
                                  std::span<const common::Precision> ranks, int rank) {
  const auto scales = [&](common::Precision p) {
    return settings.mode == common::AutoOnOff::kOn ||
           (settings.mode == common::AutoOnOff::kAuto && p == common::Precision::kFp16);
  };
  LossScalingPlan plan;
  plan.job = std::any_of(ranks.begin(), ranks.end(), scales);
  plan.here = scales(ranks[static_cast<size_t>(rank)]);
  plan.divide_after_exchange = plan.job && std::all_of(ranks.begin(), ranks.end(), scales);
  plan.unscale_before_exchange = plan.here && !plan.divide_after_exchange;
  return plan;
}

bool LossScaler::valid_initial(double initial) {
  int exponent = 0;
  return initial >= kLeast && initial <= kMost && std::frexp(initial, &exponent) == 0.5;
}

LossScaler::LossScaler(double initial, int64_t growth_interval)
    : scale_(initial), growth_interval_(growth_interval) {
  if (!valid_initial(initial)) {
    throw std::invalid_argument("loss scaling: the initial scale must be a power of two in "
                                "[2^-24, 2^127], got " + std::to_string(initial));
  }
  if (growth_interval < 1) {
    throw std::invalid_argument("loss scaling: growth_interval must be >= 1, got " +
                                std::to_string(growth_interval));
  }
}

void LossScaler::restore(const LossScalerState& state) {
  if (!valid_initial(state.scale) || state.clean_steps < 0 || state.skipped_steps < 0) {
    throw std::invalid_argument(
        "loss scaling: a saved state needs a power-of-two scale in [2^-24, 2^127] and counts "
        ">= 0, got scale " + std::to_string(state.scale) + ", " +
        std::to_string(state.clean_steps) + " clean and " + std::to_string(state.skipped_steps) +
        " skipped steps");
  }
  scale_ = state.scale;
  clean_ = state.clean_steps;
  skipped_ = state.skipped_steps;
}

bool LossScaler::after_step(bool gradients_finite) {
  if (!gradients_finite) {
    ++skipped_;
    clean_ = 0;
    scale_ = std::max(scale_ / 2, kLeast);
    return false;
  }
  if (++clean_ >= growth_interval_) {
    clean_ = 0;
    scale_ = std::min(scale_ * 2, kMost);
  }
  return true;
}

}  // namespace vtrain::worker
