#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/comm/wire.h"
#include "worker/train/checkpoint.h"
#include "worker/train/resume_position.h"
#include "worker/train/trainer_internal.h"

namespace vtrain::worker::trainer_internal {

// Starts the run in its checkpoint folder as plan_run_start says: rank 0
// holds the folder, and either makes a new run id or reads and checks the
// checkpoint to continue; every rank gets the same state. The position is
// global (a step and a sample of the epoch's order), so the ranks and
// their split may differ from the run that wrote it.
void Trainer::restore() {
  if (options_.checkpoint.dir.empty()) return;
  std::string path;
  ResumePosition position;
  std::string change;  // rank 0: what differs from the run that wrote it
  std::vector<float> params, buffers;
  OptimizerState state;
  std::vector<float> average;
  if (leader()) {
    folder_ = std::make_unique<CheckpointFolder>(options_.checkpoint.dir);
    for (const std::string& note : folder_->notes()) progress_.line(note);
    const RunStart start = plan_run_start(options_.checkpoint.dir, options_.checkpoint.resume);
    path = start.resume_from;
    run_id_ = new_run_id();  // a resume keeps the checkpoint's, where it has one
    if (!start.note.empty()) progress_.line(start.note);
    if (!path.empty()) {
      Checkpoint ckpt = load_checkpoint(path);
      check_checkpoint_matches(ckpt, path, graph_.signature(), net_->parameter_count(),
                               net_->buffer_count());
      check_checkpoint_resumable(ckpt, path, job_.batch, options_.train.seed);
      check_checkpoint_settings(ckpt, path, context_.run_settings);
      check_optimizer_state(ckpt, path);
      if (ckpt.run_id.empty()) {
        progress_.line(format("checkpoint: %s was written by an older vtrain, which did not "
                              "record the run or its settings: only the model, train.batch and "
                              "train.seed were checked. This run's checkpoints carry run id %s; "
                              "the older files are left in place, not pruned",
                              path.c_str(), run_id_.c_str()));
      } else {
        run_id_ = ckpt.run_id;
      }
      params = std::move(ckpt.parameters);
      buffers = std::move(ckpt.buffers);
      state = {std::move(ckpt.velocity), std::move(ckpt.second_moment), ckpt.optimizer_updates};
      average = std::move(ckpt.weight_average);
      position = resume_position(ckpt);
      change = resume_change(ckpt, job_.split);
    }
  }
  if (comm_) comm_->broadcast(path, 0);
  if (path.empty()) return;
  if (comm_) {
    comm_->broadcast(params, 0);
    comm_->broadcast(buffers, 0);
    comm_->broadcast(state.first, 0);
    comm_->broadcast(state.second, 0);
    comm_->broadcast(average, 0);
    broadcast_message(*comm_, position, 0);
  }
  state.updates = position.optimizer_updates;
  net_->upload_parameters(params);
  net_->upload_buffers(buffers);
  optimizer_.upload_state(state);
  restore_weight_average(average, path);
  at_ = {position.step, position.epoch, position.step_in_epoch};
  result_.resumed_world_size = position.world_size;
  result_.resumed_from = path;
  progress_.line(format("resumed from %s (step %lld, epoch %lld)%s%s", path.c_str(),
                        static_cast<long long>(at_.step), static_cast<long long>(at_.epoch + 1),
                        change.empty() ? "" : "; ", change.c_str()));
  restore_loss_scale(position.loss_scaler, path);
}

namespace {

// Writes each range over `values` (ranges were checked against the model
// when the file was read; one outside is a bug).
void overwrite(std::vector<float>& values, const std::vector<WeightRange>& ranges) {
  for (const WeightRange& r : ranges) {
    if (r.offset < 0 || r.offset + static_cast<int64_t>(r.values.size()) >
                            static_cast<int64_t>(values.size())) {
      throw std::logic_error("initial weights: a range outside the model's " +
                             std::to_string(values.size()) + " values");
    }
    std::copy(r.values.begin(), r.values.end(), values.begin() + r.offset);
  }
}

}  // namespace

// model.init over the seeded initialisation (prepare_network), before the
// first step; the layers it leaves out keep their fresh values.
void Trainer::apply_initial_weights() {
  if (!context_.initial_weights) return;
  const InitialWeights init = context_.initial_weights();
  std::vector<float> params = net_->download_parameters();
  std::vector<float> buffers = net_->download_buffers();
  overwrite(params, init.parameters);
  overwrite(buffers, init.buffers);
  net_->upload_parameters(params);
  net_->upload_buffers(buffers);
  if (!init.note.empty()) progress_.line(init.note);
}

// The optimizer's state in `ckpt` must be this run's optimizer's: AdamW
// needs its second moment (a checkpoint of an SGD run, or of a vtrain
// before version 5, has none), the others have none.
void Trainer::check_optimizer_state(const Checkpoint& ckpt, const std::string& path) const {
  const bool needs = optimizer_.settings().kind == OptimizerKind::kAdamW;
  if (needs == !ckpt.second_moment.empty()) return;
  const char* type = common::name_of(kOptimizerKindNames, optimizer_.settings().kind);
  throw CheckpointError(
      needs ? path + " holds no AdamW second moment (written by a run with another "
                     "optimizer.type, or by a vtrain before checkpoint version 5); this run's "
                     "optimizer.type is adamw"
            : path + " holds an AdamW second moment; this run's optimizer.type is " + type);
}

// train.ema's average goes on from the checkpoint's; a checkpoint without
// one (a run without train.ema, an older vtrain's) starts it afresh from
// the restored weights.
void Trainer::restore_weight_average(const std::vector<float>& average, const std::string& path) {
  if (!ema_) return;
  if (average.empty()) {
    progress_.line(format("ema: %s holds no weight average; it starts from the restored weights",
                          path.c_str()));
    ema_ = std::make_unique<WeightAverage>(backend_, net_->parameters(), net_->parameter_count(),
                                           options_.train.ema);
    return;
  }
  ema_->upload(average);
}

// A resumed run whose checkpoint is at or past the step this run ends at
// has nothing to train: it says so and writes nothing, no checkpoint and
// no metrics (the run that got there wrote its figures; an "end" record of
// this one would hold zeros).
TrainResult Trainer::already_finished() {
  finish();
  progress_.line(format("already finished: %s is at step %lld, and this run ends at step %lld "
                        "(train.epochs %lld, train.max_steps %lld); nothing to train, nothing "
                        "written. Raise train.epochs or train.max_steps to train on",
                        result_.resumed_from.c_str(), static_cast<long long>(at_.step),
                        static_cast<long long>(job_.total_steps),
                        static_cast<long long>(options_.train.epochs),
                        static_cast<long long>(options_.train.max_steps)));
  return result_;
}

// Loss scaling goes on with the checkpoint's scale and counts, whatever the
// precision that wrote it. A checkpoint without them (an older vtrain's, or
// a run's without loss scaling) leaves the scale at its initial value; a
// run without loss scaling has no use for them.
void Trainer::restore_loss_scale(const std::optional<LossScalerState>& saved,
                                 const std::string& path) {
  if (!scaler_) {
    if (saved) {
      progress_.line(format("loss scaling: off in this run; the checkpoint's scale %g is not used",
                            saved->scale));
    }
    return;
  }
  if (!saved) {
    progress_.line(format("loss scaling: %s holds no loss scale (written by an older vtrain or "
                          "by a run without loss scaling); starting at "
                          "train.loss_scaling.initial %g",
                          path.c_str(), scaler_->scale()));
    return;
  }
  try {
    scaler_->restore(*saved);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(path + ": " + e.what());
  }
  progress_.line(format("loss scaling: continuing at scale %g (%lld clean step(s) since its last "
                        "change, %lld step(s) skipped so far)",
                        saved->scale, static_cast<long long>(saved->clean_steps),
                        static_cast<long long>(saved->skipped_steps)));
}

// With model.batch_norm: local, batch-norm running statistics follow each
// rank's own samples: evaluate every share with rank 0's, as checkpoints
// do. (Synchronised, every rank's are the same already.)
void Trainer::share_batch_norm_statistics() {
  if (!parallel() || net_->buffer_count() == 0) return;
  std::vector<float> buffers = net_->download_buffers();
  comm_->broadcast(buffers, 0);
  net_->upload_buffers(buffers);
}

void Trainer::checkpoint(const Position& at) {
  if (options_.checkpoint.dir.empty()) return;
  // Batch-norm running statistics: every rank's are the same when
  // synchronised, else each rank's follow its own samples; the checkpoint
  // (like evaluation) uses rank 0's.
  if (!leader()) return;
  Checkpoint ckpt;
  ckpt.model_signature = graph_.signature();
  ckpt.step = at.step;
  ckpt.epoch = at.epoch;
  ckpt.step_in_epoch = at.in_epoch;
  ckpt.seed = options_.train.seed;
  ckpt.world_size = job_.ranks;
  ckpt.global_batch = job_.batch;
  ckpt.epoch_sample = at.in_epoch * job_.batch;
  ckpt.split = job_.split;
  ckpt.parameters = net_->download_parameters();
  ckpt.buffers = net_->download_buffers();
  OptimizerState state = optimizer_.download_state();
  ckpt.velocity = std::move(state.first);
  ckpt.second_moment = std::move(state.second);
  ckpt.optimizer_updates = state.updates;
  if (ema_) ckpt.weight_average = ema_->download();
  if (scaler_) ckpt.loss_scaler = scaler_->state();
  ckpt.run_id = run_id_;
  ckpt.settings = context_.run_settings;
  result_.last_checkpoint =
      save_checkpoint(options_.checkpoint.dir, ckpt, options_.checkpoint.keep);
  progress_.line("checkpoint: wrote " + result_.last_checkpoint);
}

}  // namespace vtrain::worker::trainer_internal
