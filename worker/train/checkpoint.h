// Checkpoints: the model, optimizer state and data position, written so a
// crash never leaves a torn file, and validated on load.
//
// File format (version 3, little-endian): magic "VTRAINCK", u32 version,
// the fields of Checkpoint in order (strings and arrays length-prefixed with
// u64; loss_scaler as a u32 0 or 1, then if 1 the scale as the bits of an
// IEEE-754 double and the two counts as i64), then a CRC-32 (zlib) of every
// byte before it. Version 1 files, which lack epoch_sample and split, and
// version 1 and 2 files, which lack loss_scaler, are still read. Files are
// named ckpt-<step, 10 digits>.vtc inside the checkpoint directory.
//
// Elastic resume: a checkpoint holds nothing that depends on how many ranks
// wrote it (the model, the optimizer state and a global data position), so
// any number of ranks may continue from it, with the split solved for them.
// The global batch and the seed must stay: they define which samples every
// step trains on (check_checkpoint_resumable).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/name_table.h"
#include "worker/train/loss_scaler.h"

namespace vtrain::worker {

// checkpoint.resume in the config: kAuto continues from the newest
// checkpoint in the checkpoint folder, if any (as vtrain train --resume).
enum class ResumeSetting { kNever, kAuto };
inline constexpr auto kResumeSettingNames = std::to_array<common::Named<ResumeSetting>>(
    {{ResumeSetting::kNever, "never"}, {ResumeSetting::kAuto, "auto"}});

// A checkpoint file is missing, torn, corrupt or does not match the run.
// The message names the file and what is wrong.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Checkpoint {
  std::string model_signature;   // Graph::signature() of the model it belongs to
  int64_t step = 0;              // optimizer steps completed
  int64_t epoch = 0;             // epoch of the next step (0-based)
  int64_t step_in_epoch = 0;     // steps of that epoch already done
  uint64_t seed = 0;             // the run's seed: shuffles are a pure function of (seed, epoch)
  int64_t world_size = 1;        // ranks of the run that wrote it (said on resume if it differs)
  int64_t global_batch = 0;      // B of the run that wrote it
  // The global data position: the index into epoch `epoch`'s shuffled order
  // of the next sample to train (step_in_epoch * global_batch). Version 1
  // files get it computed on load.
  int64_t epoch_sample = 0;
  std::vector<int64_t> split;    // per-rank batches of the run that wrote it; empty from version 1
  std::vector<float> parameters;  // Network::download_parameters()
  std::vector<float> buffers;     // Network::download_buffers()
  std::vector<float> velocity;    // Sgd::download_velocity()
  // Dynamic loss scaling's state when the run that wrote it scaled its
  // loss; nullopt without loss scaling and from version 1 and 2 files. It
  // does not depend on the precision: any run with loss scaling continues it.
  std::optional<LossScalerState> loss_scaler;
};

// Writes `ckpt` as DIR/ckpt-<step>.vtc: a temporary file in DIR, fsync,
// rename over the final name, fsync of DIR. Creates DIR if missing. Then
// removes older checkpoints so that at most `keep` (>= 1) remain: the file
// just written always stays, with the highest-numbered others. Returns the
// path written. A failed write throws common::OutputError and leaves no
// partial ckpt-*.vtc behind (the temporary, .ckpt-*.vtc.tmp.*, is removed
// and ignored by readers); see common::OutputFile. A failure to remove an
// old checkpoint (CheckpointError) is thrown only once the new one is in
// place, and names the files left behind. Throws
// std::invalid_argument for keep < 1 or a step outside [0, 9999999999].
std::string save_checkpoint(const std::string& dir, const Checkpoint& ckpt, int keep);

// The newest complete checkpoint in DIR by step number, or nullopt if DIR
// is missing or holds none. Only names are considered; load_checkpoint
// validates the content. Throws CheckpointError if DIR exists but cannot be
// listed (rather than let a run restart from scratch over its checkpoints).
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Reads and validates a checkpoint: magic, version, lengths against the file
// size, CRC. Throws CheckpointError naming the file and the problem
// ("truncated", "CRC mismatch", "not a vtrain checkpoint", "version 9 is
// newer than this vtrain's 3").
Checkpoint load_checkpoint(const std::string& path);

// Throws CheckpointError naming `path` when `ckpt` does not belong to a
// model with `signature` and these parameter/buffer counts (the velocity must
// hold one value per parameter).
void check_checkpoint_matches(const Checkpoint& ckpt, const std::string& path,
                              const std::string& signature, int64_t parameters,
                              int64_t buffers);

// Throws CheckpointError naming `path` and the config field (train.batch,
// train.seed) when a run with this global batch and seed cannot continue
// `ckpt`: they fix which samples every step trains on, so a continuation
// with others would not be the run the checkpoint belongs to (and its data
// position, a global sample, need not fall on a step of another batch).
// The number of ranks and the split may differ.
void check_checkpoint_resumable(const Checkpoint& ckpt, const std::string& path, int64_t batch,
                                uint64_t seed);

// What changed between the run that wrote `ckpt` and a run that continues
// it with per-rank batches `split`, for the "resumed from" line: "" when
// the ranks and the split are the same, else e.g. "it was written by a run
// of 2 rank(s), this run has 3: batch 48 split 16,16,16 (was 24,24), from
// global sample 96 of epoch 1".
std::string resume_change(const Checkpoint& ckpt, const std::vector<int64_t>& split);

}  // namespace vtrain::worker
