// Dynamic loss scaling (train.loss_scaling), the fp16 recipe of mixed
// precision training (Micikevicius et al.; PyTorch's GradScaler): the loss
// is multiplied by a scale S so that small gradients survive half
// precision, the gradients are divided by S before the update, and a step
// whose gradients overflowed is skipped and S halved; after
// `growth_interval` clean steps in a row S doubles. S stays a power of two,
// so scaling and unscaling are exact wherever nothing overflows or
// underflows. A pure function of the overflow flags it is fed; the trainer
// feeds it the flag of the allreduced gradients, which every rank sees
// alike, so every rank skips and rescales alike.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "common/name_table.h"
#include "common/precision.h"

namespace vtrain::worker {

// train.loss_scaling in the config.
struct LossScalingSettings {
  // auto: on where a rank computes in fp16 (the only type whose range
  // needs it), off otherwise.
  common::AutoOnOff mode = common::AutoOnOff::kAuto;
  double initial = 65536;          // the first scale (2^16); a power of two
  int64_t growth_interval = 2000;  // clean steps in a row before the scale doubles
};

// Where loss scaling applies in a job whose ranks may compute in different
// precisions (train.precision per rank). One scale for the job: every rank
// keeps the scaler when any rank scales, so that the ranks agree on every
// skip (they all see the same allreduced gradients) and on the scale.
struct LossScalingPlan {
  bool job = false;   // some rank scales its loss: every rank keeps a scaler
  bool here = false;  // this rank multiplies its loss by the scale
  // Every rank scales: the gradients are exchanged scaled and divided by
  // the scale at the update (exact for a power of two). Otherwise a
  // scaling rank divides its own gradients by the scale before the
  // exchange (unscale_before_exchange), so the sum adds like with like,
  // and the update takes the sum as it is.
  bool divide_after_exchange = false;
  bool unscale_before_exchange = false;
};
// For rank `rank` of a job whose ranks compute in `ranks` (in rank
// order): mode on scales on every rank, auto on the fp16 ranks, off on none.
LossScalingPlan plan_loss_scaling(const LossScalingSettings& settings,
                                  std::span<const common::Precision> ranks, int rank);

// A scaler's state, as a checkpoint keeps it, so that a resumed run goes on
// with the scale it had.
struct LossScalerState {
  double scale = 0;           // the scale of the next step
  int64_t clean_steps = 0;    // finite steps since the last overflow or growth
  int64_t skipped_steps = 0;  // overflowed steps so far
  bool operator==(const LossScalerState&) const = default;
};

class LossScaler {
 public:
  // Whether `initial` can start a scaler: a power of two in [2^-24, 2^127].
  static bool valid_initial(double initial);
  // Throws std::invalid_argument unless `initial` is a power of two in
  // [2^-24, 2^127] and growth_interval >= 1.
  LossScaler(double initial, int64_t growth_interval);

  double scale() const { return scale_; }
  // After a step's backward: whether its gradients are all finite. True:
  // apply the update (divided by scale() as it was for the step). False:
  // skip it. Either way the scale is then adjusted for the next step.
  bool after_step(bool gradients_finite);
  int64_t skipped_steps() const { return skipped_; }  // after_step(false) calls

  LossScalerState state() const { return {scale_, clean_, skipped_}; }
  // Continues from `state` (a checkpoint's; the growth interval stays this
  // scaler's). Throws std::invalid_argument unless its scale could start a
  // scaler and its counts are >= 0.
  void restore(const LossScalerState& state);

 private:
  double scale_;
  int64_t growth_interval_;
  int64_t clean_ = 0;  // finite steps since the last overflow or growth
  int64_t skipped_ = 0;
};

}  // namespace vtrain::worker
