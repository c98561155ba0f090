// Internal to worker/train/trainer*.cpp: the Trainer behind train()
// (trainer.h) and what its files share. trainer.cpp: setting up and the
// step loop (steps, re-balancing switches, an idle rank's probes);
// trainer_checkpoint.cpp: resuming and writing checkpoints;
// trainer_report.cpp: progress lines, metrics records, the evaluation and
// the end of the run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/text.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/network.h"
#include "worker/train/batch_gatherer.h"
#include "worker/train/bucket_allreduce.h"
#include "worker/train/input_rate.h"
#include "worker/train/job_shape.h"
#include "worker/train/trainer.h"

namespace vtrain::worker::trainer_internal {

using common::format;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The largest batch this rank's network runs: its share, or an evaluation chunk.
inline int64_t network_batch(const JobShape& job) { return std::max(job.my_batch, job.eval_chunk); }

// The position of the next step: what a checkpoint stores of the loop.
struct Position {
  int64_t step = 0;      // steps completed
  int64_t epoch = 0;     // epoch of the next step (0-based)
  int64_t in_epoch = 0;  // steps of that epoch already done
};

// Signals, loss and accuracy of one step, summed over ranks in one call.
struct StepTotals {
  double loss_sum = 0;
  double correct = 0;
  bool stop = false;
  double lr = 0;  // the learning rate the step applied
  double seconds = 0;  // this rank's wall time from the step's start to after its update
};

struct EpochTotals {
  double loss_sum = 0;
  double correct = 0;
  int64_t seen = 0;
};

// A step that throws with gradient allreduces in flight (a rank failing
// in backward) must not free the buffers they read while unwinding: wait
// for them first. Every rank launches the same buckets in the same order,
// so the ones in flight here complete; the job is then ended by the
// caller's abort. (On NCCL the wait is what freeing device memory would
// do anyway: cudaFree waits for the kernels in flight.)
struct DrainOnUnwind {
  Communicator* comm;
  int uncaught = std::uncaught_exceptions();
  ~DrainOnUnwind() {
    if (comm == nullptr || std::uncaught_exceptions() == uncaught) return;
    try {
      comm->wait();
    } catch (...) {  // the error being unwound is the one to report
    }
  }
};

// One rank's training run, phase by phase: the constructor sets up (checks
// the job, builds the network and optimizer, prints the setup), run()
// restores from a checkpoint, runs the epochs (steps, evaluation,
// checkpoints) and reports. Used once.
class Trainer {
 public:
  Trainer(const Graph& graph, Backend& backend, const Dataset& train_set, const Dataset& test_set,
          const ChannelStats& norm, const TrainerOptions& options, const TrainerContext& context);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  TrainResult run();

 private:
  std::vector<ParamTensor> prepare_network();
  void print_setup();
  void print_precisions();
  void install_bucket_hooks();
  void switch_split(const SplitSwitch& to);
  struct NetworkState {
    std::vector<float> parameters, buffers;
  };
  NetworkState release_network();
  void rebuild_network(const NetworkState& state, const char* how);
  void restore();
  void apply_initial_weights();
  TrainResult already_finished();
  void restore_loss_scale(const std::optional<LossScalerState>& saved, const std::string& path);
  void check_optimizer_state(const Checkpoint& ckpt, const std::string& path) const;
  void restore_weight_average(const std::vector<float>& average, const std::string& path);
  bool epoch(int64_t epoch);
  bool reached_target(int64_t epoch);
  const std::vector<int64_t>& order_of(int64_t epoch);  // epoch_permutation's
  StepTotals step(const std::vector<int64_t>& order, int64_t i);
  StepTotals compute(const std::vector<int64_t>& order, int64_t i);
  StepTotals contribute_zero_gradients(double* probe_ms = nullptr);
  double probe();
  void check_finite(double loss) const;
  std::optional<float> gradient_scale();
  void log_step(int64_t epoch, int64_t i, const StepTotals& totals);
  void end_epoch(int64_t epoch, const EpochTotals& totals, Clock::time_point start);
  void share_batch_norm_statistics();
  void checkpoint(const Position& at);
  void finish();
  void write_end_record();
  void print_summary();

  bool leader() const { return job_.rank == 0; }
  bool parallel() const { return comm_ != nullptr && job_.ranks > 1; }
  StepEvent step_event() const { return {at_.step, parallel() && job_.my_batch > 0}; }

  const Graph& graph_;
  Backend& backend_;
  const Dataset& train_set_;
  const Dataset& test_set_;
  const ChannelStats& norm_;
  const TrainerOptions& options_;
  const TrainerContext& context_;
  Communicator* const comm_;
  TrainObserver* const observer_;
  JobShape job_;  // its split changes when the job re-balances
  // Every rank's precision, in rank order (TrainerContext::rank_precisions),
  // and where loss scaling applies among them.
  const std::vector<common::Precision> precisions_;
  const LossScalingPlan scaling_;
  const BatchStaging staging_;  // TrainerOptions::gather_ahead and prefetch_input decided
  ConvPlan conv_plan_;  // the conv kernels net_ runs
  std::unique_ptr<Network> net_;
  std::unique_ptr<memory::ChromeTrace> trace_;  // before optimizer_: prepare_network() sets it
  Optimizer optimizer_;
  std::unique_ptr<WeightAverage> ema_;  // train.ema; null without
  const LrSchedule schedule_;
  Progress progress_;
  MetricsFile metrics_;  // opened by run(): truncated afresh, appended to on a resume
  BucketAllreduce allreduce_;  // the gradient buckets
  PinnedMemory pinned_{backend_};  // before the staging it holds
  Staging eval_stage_{&pinned_};
  // TrainerContext::data_workers; before the gatherer that uses it
  std::unique_ptr<DecodePool> pool_;
  BatchGatherer gatherer_;
  Rebalancer rebalancer_;
  std::optional<InputThrottle> throttle_;  // TrainerContext::input_rate_limit
  std::optional<LossScaler> scaler_;  // scaling_.job: some rank scales its loss
  TrainResult result_;
  // Rank 0 with a checkpoint_dir: its hold on the folder, and the run id
  // its checkpoints carry (made afresh, or the resumed checkpoint's).
  std::unique_ptr<CheckpointFolder> folder_;
  std::string run_id_;
  Position at_;        // the next step
  Position resumed_;   // where this run began
  std::map<int64_t, std::vector<int64_t>> orders_;  // order_of's: this epoch's and the next's
  int64_t net_batch_ = network_batch(job_);  // the largest batch net_ was built for
  std::optional<TimingBatch> probe_batch_;   // what an idle rank's probes run on
  double train_seconds_ = 0;
  int64_t timed_images_ = 0;
  double input_wait_ = 0;  // seconds this step waited for its batch
};

}  // namespace vtrain::worker::trainer_internal
