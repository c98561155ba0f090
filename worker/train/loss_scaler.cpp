#include "worker/train/loss_scaler.h"

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
