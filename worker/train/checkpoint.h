// Checkpoints: the model, optimizer state and data position, written so a
// crash never leaves a torn file, and validated on load; and the rules by
// which a run starts in, continues from and prunes its checkpoint folder.
//
// File format (version 5, little-endian): magic "VTRAINCK", u32 version,
// the run's identity (run_id, then the settings as a u64 count of key and
// value strings), then the other fields of Checkpoint in order (strings and
// arrays length-prefixed with u64; loss_scaler as a u32 0 or 1, then if 1
// the scale as the bits of an IEEE-754 double and the two counts as i64;
// then second_moment, optimizer_updates as i64 and weight_average),
// then a CRC-32 (zlib) of every byte before it. The identity comes first so
// that pruning and the start of a run can tell whose a file is from its
// first bytes. Version 1 files, which lack epoch_sample and split, version
// 1 and 2 files, which lack loss_scaler, version 1 to 3 files, which
// lack the identity (they belong to an unknown run), and version 1 to 4
// files, which lack the second moment, the update count and the weight
// average (an SGD run's, without train.ema), are still read. Files
// are named ckpt-<step, 10 digits>.vtc inside the checkpoint directory.
//
// Runs and folders: a run started afresh makes a run id; every checkpoint
// it writes carries it, and a resume keeps it, so one run's checkpoints are
// known as its own whatever stopped and resumed it. A fresh start is
// refused in a folder that holds any checkpoint (of another run, or of an
// earlier run with the same config: nothing is overwritten or pruned, and
// a later --resume cannot pick up a stranger's file); pruning removes only
// the run's own files. The settings are the config values that define
// what the run trains (TrainerContext::run_settings); a resume with other
// values is refused naming them.
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

// checkpoint.resume in the config. kNever: start afresh (refused where the
// checkpoint folder holds checkpoints); kAuto: continue from the newest
// checkpoint in the folder, or start afresh, saying so, when it holds none
// (what a job that is requeued wants from its first run on); kRequired:
// continue from the newest, an error when there is none (vtrain train
// --resume).
enum class ResumeSetting { kNever, kAuto, kRequired };
inline constexpr auto kResumeSettingNames = std::to_array<common::Named<ResumeSetting>>(
    {{ResumeSetting::kNever, "never"},
     {ResumeSetting::kAuto, "auto"},
     {ResumeSetting::kRequired, "required"}});

// checkpoint.* in the config (config::CheckpointConfig is this struct).
struct CheckpointSettings {
  std::string dir;        // where checkpoints go; empty = none
  int64_t every = 0;      // steps between checkpoints; 0 = only at the end and on a signal
  int64_t keep = 3;       // of this run's own checkpoints, the newest kept
  ResumeSetting resume = ResumeSetting::kNever;
};

// One config value that defines a run ("optimizer.lr", "0.05"), as text.
struct RunSetting {
  std::string key;
  std::string value;
  friend bool operator==(const RunSetting&, const RunSetting&) = default;
};

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
  // Optimizer::download_state(): first = velocity, second = second_moment,
  // updates = optimizer_updates.
  std::vector<float> velocity;       // sgd, lars: the velocity; adamw: the first moment m
  std::vector<float> second_moment;  // adamw: v; empty otherwise and from version 1 to 4 files
  int64_t optimizer_updates = 0;     // updates applied (version 1 to 4 files: step)
  // train.ema's moving average of the parameters; empty without one and
  // from version 1 to 4 files.
  std::vector<float> weight_average;
  // Dynamic loss scaling's state when the run that wrote it scaled its
  // loss; nullopt without loss scaling and from version 1 and 2 files. It
  // does not depend on the precision: any run with loss scaling continues it.
  std::optional<LossScalerState> loss_scaler;
  // The run it belongs to (new_run_id() at the run's fresh start, kept by
  // its resumes); empty from version 1 to 3 files: an unknown run.
  std::string run_id;
  // The run's defining config values (TrainerContext::run_settings); empty
  // from version 1 to 3 files.
  std::vector<RunSetting> settings;
};

// A new run id: 16 hex digits from the system's random source.
std::string new_run_id();

// Writes `ckpt` as DIR/ckpt-<step>.vtc: a temporary file in DIR, fsync,
// rename over the final name, fsync of DIR. Creates DIR if missing. Then
// removes older checkpoints of the same run (ckpt.run_id) so that at most
// `keep` (>= 1) of its own remain: the file just written always stays, with
// the highest-numbered others. Files of another run id, or whose run id
// cannot be read, are never removed. Returns the path written. A failed
// write throws common::OutputError and leaves no partial ckpt-*.vtc behind
// (the temporary, .ckpt-*.vtc.tmp.*, is removed and ignored by readers); see
// common::OutputFile. A failure to remove an old checkpoint (CheckpointError)
// is thrown only once the new one is in place, and names the files left
// behind. Throws
// std::invalid_argument for keep < 1 or a step outside [0, 9999999999].
std::string save_checkpoint(const std::string& dir, const Checkpoint& ckpt, int keep);

// The newest complete checkpoint in DIR by step number, or nullopt if DIR
// is missing or holds none. Only names are considered; load_checkpoint
// validates the content. Throws CheckpointError if DIR exists but cannot be
// listed (rather than let a run restart from scratch over its checkpoints).
std::optional<std::string> latest_checkpoint(const std::string& dir);

// The checkpoint a command is pointed at (vtrain evaluate and predict
// --checkpoint PATH): PATH when it is a file, the newest complete
// checkpoint in it (latest_checkpoint) when it is a folder. Throws
// CheckpointError naming PATH when nothing is there or the folder holds no
// checkpoint.
std::string checkpoint_at(const std::string& path);

// Reads and validates a checkpoint: magic, version, lengths against the file
// size, CRC. Throws CheckpointError naming the file and the problem
// ("truncated", "CRC mismatch", "not a vtrain checkpoint", "version 9 is
// newer than this vtrain's 5").
Checkpoint load_checkpoint(const std::string& path);

// Rank 0's hold on a run's checkpoint folder, from the run's start to its
// end. It creates DIR and locks DIR/.lock (flock, exclusive: the kernel
// drops it however the process ends), so that no second vtrain starts,
// resumes or writes checkpoints there meanwhile; then it removes the
// temporaries (.ckpt-<step>.tmp.<pid>) that a killed writer left behind:
// under the lock no writer can be alive. Where the file system cannot lock
// (ENOLCK and the like) it goes on unlocked and removes only the
// temporaries whose pid is not a live process of this machine. Throws
// CheckpointError naming DIR when another process holds the lock or DIR
// cannot be created.
class CheckpointFolder {
 public:
  explicit CheckpointFolder(const std::string& dir);
  ~CheckpointFolder();
  CheckpointFolder(const CheckpointFolder&) = delete;
  CheckpointFolder& operator=(const CheckpointFolder&) = delete;

  // What taking the folder did that the user should hear of (temporaries
  // removed, no lock); empty when nothing.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  int lock_fd_ = -1;
  std::vector<std::string> notes_;
};

// How a run starts in its checkpoint folder DIR (decided by rank 0 while it
// holds the folder).
struct RunStart {
  std::string resume_from;  // the checkpoint to continue; empty: start afresh
  std::string note;         // said when starting afresh under kAuto; else empty
};

// kNever: afresh; refused (CheckpointError naming DIR and the newest
// checkpoint's step and run, and telling to resume or to use another
// folder) when DIR holds any checkpoint. kAuto: the newest checkpoint, or
// afresh with a note when DIR holds none. kRequired: the newest checkpoint;
// none is a CheckpointError naming DIR. A resume is refused when DIR holds
// checkpoints of more than one run id, naming them (files without a run
// id, from before version 4, are not counted: a run that an upgraded
// vtrain resumed from one of them writes files of its own id beside them).
RunStart plan_run_start(const std::string& dir, ResumeSetting mode);

// Throws CheckpointError naming `path` when `ckpt` does not belong to a
// model with `signature` and these parameter/buffer counts (the velocity must
// hold one value per parameter, the second moment and the weight average
// one each or none).
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

// Throws CheckpointError naming `path`, every key whose value differs
// between `ckpt`'s settings and `settings`, and both values, when the run
// that wrote it was configured otherwise. Keys that only one side has
// (another vtrain's list) are not compared; neither is anything from a
// file without settings (version 1 to 3).
void check_checkpoint_settings(const Checkpoint& ckpt, const std::string& path,
                               const std::vector<RunSetting>& settings);

// What changed between the run that wrote `ckpt` and a run that continues
// it with per-rank batches `split`, for the "resumed from" line: "" when
// the ranks and the split are the same, else e.g. "it was written by a run
// of 2 rank(s), this run has 3: batch 48 split 16,16,16 (was 24,24), from
// global sample 96 of epoch 1".
std::string resume_change(const Checkpoint& ckpt, const std::vector<int64_t>& split);

}  // namespace vtrain::worker
