// What rank 0 tells every rank of the checkpoint a run resumes from, beside
// the model and optimizer state (broadcast as float arrays): where the step
// loop goes on, how many ranks wrote it, and the loss scale. A typed
// message (worker/comm/wire.h).
#pragma once

#include <cstdint>
#include <optional>

#include "worker/comm/wire.h"
#include "worker/train/checkpoint.h"
#include "worker/train/loss_scaler.h"

namespace vtrain::worker {

struct ResumePosition {
  int64_t step = 0;           // optimizer steps completed
  int64_t epoch = 0;          // epoch of the next step (0-based)
  int64_t step_in_epoch = 0;  // steps of that epoch already done
  int64_t world_size = 0;     // ranks of the run that wrote it
  std::optional<LossScalerState> loss_scaler;  // nullopt: the checkpoint holds none
  int64_t optimizer_updates = 0;  // Checkpoint::optimizer_updates
};

ResumePosition resume_position(const Checkpoint& ckpt);

// The counts, then a flag for the loss scale and, when set, its scale
// (exactly) and counts; then the optimizer's update count.
template <>
struct WireFormat<ResumePosition> {
  static constexpr const char* kName = "resume position";
  static void write(WireWriter& out, const ResumePosition& position);
  static ResumePosition read(WireReader& in);
};

}  // namespace vtrain::worker
