#include "worker/train/resume_position.h"

namespace vtrain::worker {

ResumePosition resume_position(const Checkpoint& ckpt) {
  return {ckpt.step,       ckpt.epoch,       ckpt.step_in_epoch,
          ckpt.world_size, ckpt.loss_scaler, ckpt.optimizer_updates};
}

void WireFormat<ResumePosition>::write(WireWriter& out, const ResumePosition& position) {
  out.number(position.step);
  out.number(position.epoch);
  out.number(position.step_in_epoch);
  out.number(position.world_size);
  out.flag(position.loss_scaler.has_value());
  if (position.loss_scaler) {
    out.real(position.loss_scaler->scale);
    out.number(position.loss_scaler->clean_steps);
    out.number(position.loss_scaler->skipped_steps);
  }
  out.number(position.optimizer_updates);
}

ResumePosition WireFormat<ResumePosition>::read(WireReader& in) {
  ResumePosition position;
  position.step = in.number<int64_t>("step");
  position.epoch = in.number<int64_t>("epoch");
  position.step_in_epoch = in.number<int64_t>("step_in_epoch");
  position.world_size = in.number<int64_t>("world_size");
  if (in.flag("loss_scaler")) {
    LossScalerState& s = position.loss_scaler.emplace();
    s.scale = in.real("loss_scaler.scale");
    s.clean_steps = in.number<int64_t>("loss_scaler.clean_steps");
    s.skipped_steps = in.number<int64_t>("loss_scaler.skipped_steps");
  }
  position.optimizer_updates = in.number<int64_t>("optimizer_updates");
  return position;
}

}  // namespace vtrain::worker
