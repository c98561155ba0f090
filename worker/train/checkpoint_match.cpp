// Whether a checkpoint belongs to this run, and what differs when it is
// continued on another number of ranks (checkpoint.h).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "balancer/batch_split.h"
#include "worker/train/checkpoint.h"

namespace vtrain::worker {
namespace {

std::string count_mismatch(const std::string& path, const char* what, size_t stored,
                           int64_t expected) {
  return path + " holds " + std::to_string(stored) + " " + what + " values, this model has " +
         std::to_string(expected);
}

}  // namespace

void check_checkpoint_matches(const Checkpoint& ckpt, const std::string& path,
                              const std::string& signature, int64_t parameters,
                              int64_t buffers) {
  if (ckpt.model_signature != signature) {
    throw CheckpointError(path + " was written for another model (signature " +
                          ckpt.model_signature + ", this model " + signature + ")");
  }
  if (static_cast<int64_t>(ckpt.parameters.size()) != parameters) {
    throw CheckpointError(count_mismatch(path, "parameter", ckpt.parameters.size(), parameters));
  }
  if (static_cast<int64_t>(ckpt.buffers.size()) != buffers) {
    throw CheckpointError(count_mismatch(path, "buffer", ckpt.buffers.size(), buffers));
  }
  // Every optimizer keeps one velocity (or first moment) value per parameter.
  if (static_cast<int64_t>(ckpt.velocity.size()) != parameters) {
    throw CheckpointError(count_mismatch(path, "velocity", ckpt.velocity.size(), parameters));
  }
  // AdamW's second moment and train.ema's average: one per parameter or none.
  for (const auto& [values, what] : {std::pair{&ckpt.second_moment, "second moment"},
                                     std::pair{&ckpt.weight_average, "weight average"}}) {
    if (!values->empty() && static_cast<int64_t>(values->size()) != parameters) {
      throw CheckpointError(count_mismatch(path, what, values->size(), parameters));
    }
  }
}

void check_checkpoint_resumable(const Checkpoint& ckpt, const std::string& path, int64_t batch,
                                uint64_t seed) {
  const std::string position = "; it stopped before global sample " +
                               std::to_string(ckpt.epoch_sample) + " of epoch " +
                               std::to_string(ckpt.epoch + 1);
  if (ckpt.global_batch != batch) {
    throw CheckpointError(
        path + " was written with train.batch " + std::to_string(ckpt.global_batch) +
        ", this run has train.batch " + std::to_string(batch) + position +
        ". A run may resume on other ranks and devices (the split is solved again), but with "
        "the global batch it began with: set train.batch=" +
        std::to_string(ckpt.global_batch) + ", or start afresh in another checkpoint.dir");
  }
  if (ckpt.seed != seed) {
    throw CheckpointError(path + " was written with train.seed " + std::to_string(ckpt.seed) +
                          ", this run has train.seed " + std::to_string(seed) + position +
                          ". The seed fixes every epoch's sample order: set train.seed=" +
                          std::to_string(ckpt.seed) + ", or start afresh in another "
                          "checkpoint.dir");
  }
  if (ckpt.epoch_sample != ckpt.step_in_epoch * ckpt.global_batch) {
    throw CheckpointError(path + ": inconsistent data position: global sample " +
                          std::to_string(ckpt.epoch_sample) + " is not the start of step " +
                          std::to_string(ckpt.step_in_epoch + 1) + " of batch " +
                          std::to_string(ckpt.global_batch));
  }
}

void check_checkpoint_settings(const Checkpoint& ckpt, const std::string& path,
                               const std::vector<RunSetting>& settings) {
  // Long values (a model's layer list) are named, not quoted.
  constexpr size_t kQuoted = 48;
  std::string differences;
  for (const RunSetting& mine : settings) {
    const auto theirs = std::find_if(ckpt.settings.begin(), ckpt.settings.end(),
                                     [&](const RunSetting& s) { return s.key == mine.key; });
    if (theirs == ckpt.settings.end() || theirs->value == mine.value) continue;
    differences += (differences.empty() ? "" : ", ") + mine.key;
    if (theirs->value.size() <= kQuoted && mine.value.size() <= kQuoted) {
      differences += " " + theirs->value + " (this run: " + mine.value + ")";
    }
  }
  if (differences.empty()) return;
  throw CheckpointError(path + " belongs to run " + ckpt.run_id + ", which was configured with " +
                        differences + ". A run continues with the settings it began with: set "
                        "them back to resume it, or start this run afresh in another "
                        "checkpoint.dir");
}

std::string resume_change(const Checkpoint& ckpt, const std::vector<int64_t>& split) {
  const auto ranks = static_cast<int64_t>(split.size());
  if (ckpt.world_size == ranks && (ckpt.split.empty() || ckpt.split == split)) return "";
  const std::string was = ckpt.split.empty() ? "" : " (was " + balancer::join_batches(ckpt.split) + ")";
  return "it was written by a run of " + std::to_string(ckpt.world_size) +
         " rank(s), this run has " + std::to_string(ranks) + ": batch " +
         std::to_string(ckpt.global_batch) + " split " + balancer::join_batches(split) + was +
         ", from global sample " + std::to_string(ckpt.epoch_sample) + " of epoch " +
         std::to_string(ckpt.epoch + 1);
}

}  // namespace vtrain::worker
