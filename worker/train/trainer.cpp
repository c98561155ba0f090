#include "worker/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "common/text.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/network.h"
#include "worker/train/batch_gatherer.h"
#include "worker/train/bucket_allreduce.h"
#include "worker/train/checkpoint.h"
#include "worker/train/gradient_buckets.h"
#include "worker/train/job_shape.h"

namespace vtrain::worker {
namespace {

using common::format;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The largest batch this rank's network runs: its share, or an evaluation chunk.
int64_t network_batch(const JobShape& job) { return std::max(job.my_batch, job.eval_chunk); }

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Each rank evaluates a contiguous share of the test set; the sums are added.
Evaluation evaluate(Network& net, const Dataset& data, const ChannelStats& norm, int64_t chunk,
                    Staging& stage, Communicator* comm) {
  const int rank = comm ? comm->rank() : 0, ranks = comm ? comm->size() : 1;
  const int64_t first = data.count * rank / ranks, last = data.count * (rank + 1) / ranks;
  std::vector<double> sums{0.0, 0.0};  // loss, correct
  for (int64_t at = first; at < last; at += chunk) {
    const int64_t n = std::min(chunk, last - at);
    stage.indices.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) stage.indices[i] = at + i;
    gather_staged(data, norm, stage);
    upload_staged(net, stage);
    const LossStats s = net.evaluate(n);
    sums[0] += s.loss_sum;
    sums[1] += static_cast<double>(s.correct);
  }
  if (comm) comm->allreduce_sum(sums);
  return {sums[0] / static_cast<double>(data.count), sums[1] / static_cast<double>(data.count)};
}

// train.loss_scaling's scaler, or nothing when it is off (auto: on under fp16).
std::optional<LossScaler> make_loss_scaler(const LossScalingSettings& s, common::Precision p) {
  const bool on = s.mode == LossScalingMode::kOn ||
                  (s.mode == LossScalingMode::kAuto && p == common::Precision::kFp16);
  if (!on) return std::nullopt;
  return LossScaler(s.initial, s.growth_interval);
}

// A rank with no samples still needs a network for the parameter buffers
// and for its share of the evaluation. A network built after the optimizer
// (a larger batch after a re-balance) finds its state in use already.
NetworkOptions network_options(const Graph& graph, const JobShape& job,
                               const TrainerOptions& options, bool optimizer_allocated = false) {
  NetworkOptions net;
  net.max_batch = network_batch(job);
  net.conv_algorithm = options.conv_algorithm;
  net.conv_executions = options.conv_executions;
  net.conv_workspace_bytes = options.conv_workspace_bytes;
  net.memory_policy = options.memory_policy;
  net.memory_planner = options.memory_planner;
  if (options.memory_costs_at) {
    if (auto costs = options.memory_costs_at(net.max_batch)) net.memory_costs = std::move(*costs);
  }
  // The optimizer's state and the allreduce's staging buffer come after the network.
  net.optimizer_bytes_per_parameter =
      optimizer_allocated
          ? 0
          : Sgd::kStateBytesPerParameter +
                staging_bytes_per_parameter(
                    wire_type(options.gradient_allreduce, graph.precision()), job.ranks);
  if (Communicator* comm = options.batch_norm_comm; comm != nullptr && job.ranks > 1) {
    net.sum_over_ranks = [comm](std::vector<double>& values) { comm->allreduce_sum(values); };
  }
  return net;
}

// A checkpoint's loss scale as words for the restore broadcast, exactly
// (the scale in hexadecimal floating point); "-" for none.
std::string loss_scale_words(const std::optional<LossScalerState>& s) {
  if (!s) return " -";
  return format(" %a %lld %lld", s->scale, static_cast<long long>(s->clean_steps),
                static_cast<long long>(s->skipped_steps));
}

std::optional<LossScalerState> read_loss_scale(std::istream& in) {
  std::string scale;
  in >> scale;
  if (scale == "-") return std::nullopt;
  LossScalerState s{.scale = std::strtod(scale.c_str(), nullptr)};
  in >> s.clean_steps >> s.skipped_steps;
  return s;
}

LrSchedule schedule_for(const JobShape& job, const TrainerOptions& options) {
  LrSchedule schedule = options.schedule;
  schedule.steps_per_epoch = job.steps_per_epoch;
  schedule.total_steps = job.total_steps;
  return schedule;
}

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
          const ChannelStats& norm, const TrainerOptions& options);
  TrainResult run();

 private:
  int64_t prepare_network();
  void print_setup();
  void install_bucket_hooks();
  void switch_split(const SplitSwitch& to);
  void fit_network_to_batch();
  void restore();
  void restore_loss_scale(const std::optional<LossScalerState>& saved, const std::string& path);
  bool epoch(int64_t epoch);
  StepTotals step(const std::vector<int64_t>& order, int64_t i);
  StepTotals compute(const std::vector<int64_t>& order, int64_t i);
  StepTotals contribute_zero_gradients();
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
  Communicator* const comm_;
  TrainObserver* const observer_;
  JobShape job_;  // its split changes when the job re-balances
  std::unique_ptr<Network> net_;
  std::unique_ptr<memory::ChromeTrace> trace_;  // before sgd_: prepare_network() sets it
  Sgd sgd_;
  const LrSchedule schedule_;
  Progress progress_;
  MetricsFile metrics_;
  BucketAllreduce allreduce_;  // the gradient buckets
  Staging eval_stage_;
  BatchGatherer gatherer_;
  Rebalancer rebalancer_;
  std::optional<LossScaler> scaler_;  // train.loss_scaling on
  TrainResult result_;
  Position at_;        // the next step
  Position resumed_;   // where this run began
  int64_t net_batch_ = network_batch(job_);  // the largest batch net_ was built for
  std::optional<TimingBatch> probe_batch_;   // what an idle rank's probes run on
  double train_seconds_ = 0;
  int64_t timed_images_ = 0;
};

Trainer::Trainer(const Graph& graph, Backend& backend, const Dataset& train_set,
                 const Dataset& test_set, const ChannelStats& norm, const TrainerOptions& options)
    : graph_(graph),
      backend_(backend),
      train_set_(train_set),
      test_set_(test_set),
      norm_(norm),
      options_(options),
      comm_(options.comm),
      observer_(options.observer),
      job_(job_shape(graph, train_set, options)),
      net_(std::make_unique<Network>(graph, backend, network_options(graph, job_, options))),
      sgd_(backend, prepare_network(), options.momentum, options.weight_decay),
      schedule_(schedule_for(job_, options)),
      progress_(leader() ? options.progress : Progress::Mode::kOff),
      metrics_(leader() && !options.metrics_path.empty() ? MetricsFile(options.metrics_path)
                                                         : MetricsFile()),
      allreduce_(backend, options.comm,
                 plan_buckets(net_->param_ranges(), options.allreduce_bucket),
                 wire_type(options.gradient_allreduce, graph.precision())),
      gatherer_(train_set, norm,
                options.gather_ahead < 0
                    ? job_.my_batch * train_set.sample.per_sample() >= BatchGatherer::kMinPixels
                    : options.gather_ahead > 0),
      rebalancer_(options.rebalance, job_.rank, job_.ranks, job_.batch),
      scaler_(make_loss_scaler(options.loss_scaling, graph.precision())) {
  // Peak device memory counts from here: what training holds, not the
  // buffers conv.algorithm auto timed its candidates in (freed by now).
  backend_.reset_peak();
  print_setup();
  install_bucket_hooks();
}

// Attaches the trace and initialises the parameters before the optimizer
// allocates its state; returns the parameter count for it.
int64_t Trainer::prepare_network() {
  if (!options_.trace_path.empty()) {
    trace_ = std::make_unique<memory::ChromeTrace>(
        job_.rank, format("rank %d (%s)", job_.rank, backend_.device_info().backend.c_str()));
    net_->set_trace(trace_.get());
  }
  net_->init_parameters(options_.seed);
  return net_->parameter_count();
}

void Trainer::print_setup() {
  const std::string split_text = balancer::join_batches(job_.split);
  progress_.line(format("model: %d layers, %lld parameters, %s; batch %lld (per rank: %s), %lld "
                        "steps/epoch; device memory %s in use (workspace %s)",
                        graph_.size(), static_cast<long long>(net_->parameter_count()),
                        common::precision_name(graph_.precision()),
                        static_cast<long long>(job_.batch), split_text.c_str(),
                        static_cast<long long>(job_.steps_per_epoch),
                        common::format_mib(backend_.device_bytes_in_use()).c_str(),
                        common::format_mib(net_->workspace_bytes()).c_str()));
  for (const std::string& line : net_->algorithm_summary()) progress_.line("  " + line);
  if (parallel() && options_.batch_norm_comm != nullptr && net_->buffer_count() > 0) {
    progress_.line(format("batch norm: synchronised, statistics of the global batch of %lld "
                          "over %d ranks",
                          static_cast<long long>(job_.batch), job_.ranks));
  }
  const MemoryStats m = net_->memory_stats();
  progress_.line(format("memory: policy %s, planner %s; pool %s reserved of %s (%s persistent), "
                        "pinned host %s",
                        m.policy.c_str(), m.planner.c_str(), common::format_mib(m.reservation).c_str(),
                        common::format_mib(m.capacity).c_str(), common::format_mib(m.persistent_bytes).c_str(),
                        common::format_mib(m.host_reservation).c_str()));
}

// Launches each gradient bucket's allreduce as soon as backward has
// finished its last layer, so communication overlaps the rest of backward.
void Trainer::install_bucket_hooks() {
  if (!parallel()) return;
  net_->on_gradients_ready = [this](const ParamRange& r) {
    const size_t index = static_cast<size_t>(&r - net_->param_ranges().data());
    const int b = allreduce_.plan().launch_after[index];
    if (b < 0) return;
    allreduce_.launch(b, net_->gradients());
    if (observer_) observer_->on_bucket_launched(step_event());
  };
}

// Continues from the newest checkpoint: rank 0 reads and checks the file;
// every rank gets the same state. The position is global (a step and a
// sample of the epoch's order), so the ranks and their split may differ
// from the run that wrote it.
void Trainer::restore() {
  if (!options_.resume || options_.checkpoint_dir.empty()) return;
  std::string path, position;  // position: "step epoch step_in_epoch world_size"
  std::string change;          // rank 0: what differs from the run that wrote it
  std::vector<float> params, buffers, velocity;
  if (leader()) {
    if (auto latest = latest_checkpoint(options_.checkpoint_dir)) {
      path = *latest;
      Checkpoint ckpt = load_checkpoint(path);
      check_checkpoint_matches(ckpt, path, graph_.signature(), net_->parameter_count(),
                               net_->buffer_count());
      check_checkpoint_resumable(ckpt, path, job_.batch, options_.seed);
      params = std::move(ckpt.parameters);
      buffers = std::move(ckpt.buffers);
      velocity = std::move(ckpt.velocity);
      position = std::to_string(ckpt.step) + " " + std::to_string(ckpt.epoch) + " " +
                 std::to_string(ckpt.step_in_epoch) + " " +
                 std::to_string(ckpt.world_size) + loss_scale_words(ckpt.loss_scaler);
      change = resume_change(ckpt, job_.split);
    }
  }
  if (comm_) comm_->broadcast(path, 0);
  if (path.empty()) return;
  if (comm_) {
    comm_->broadcast(params, 0);
    comm_->broadcast(buffers, 0);
    comm_->broadcast(velocity, 0);
    comm_->broadcast(position, 0);
  }
  net_->upload_parameters(params);
  net_->upload_buffers(buffers);
  sgd_.upload_velocity(velocity);
  std::istringstream words(position);
  words >> at_.step >> at_.epoch >> at_.in_epoch >> result_.resumed_world_size;
  result_.resumed_from = path;
  progress_.line(format("resumed from %s (step %lld, epoch %lld)%s%s", path.c_str(),
                        static_cast<long long>(at_.step), static_cast<long long>(at_.epoch + 1),
                        change.empty() ? "" : "; ", change.c_str()));
  restore_loss_scale(read_loss_scale(words), path);
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

TrainResult Trainer::run() {
  restore();
  resumed_ = at_;
  DrainOnUnwind drain{parallel() ? comm_ : nullptr};
  bool stopped = false;
  for (int64_t e = at_.epoch; e < options_.epochs && at_.step < job_.total_steps; ++e) {
    if (!epoch(e)) {
      stopped = true;
      break;
    }
  }
  if (!stopped) {
    checkpoint({at_.step, at_.step / job_.steps_per_epoch, at_.step % job_.steps_per_epoch});
  }
  finish();
  if (result_.stopped_by_signal != 0) {
    progress_.line(format("stopped at step %lld by a signal; resume with --resume",
                          static_cast<long long>(at_.step)));
    return result_;  // no "end" record: the run is not finished
  }
  write_end_record();
  print_summary();
  return result_;
}

// Runs the steps of `epoch` left to run; false when a stop signal ended
// the run (after a checkpoint).
bool Trainer::epoch(int64_t epoch) {
  const std::vector<int64_t> order = epoch_permutation(options_.seed, epoch, train_set_.count);
  EpochTotals totals;
  const auto start = Clock::now();
  for (int64_t i = epoch == resumed_.epoch ? resumed_.in_epoch : 0;
       i < job_.steps_per_epoch && at_.step < job_.total_steps; ++i) {
    const StepTotals s = step(order, i);
    at_.in_epoch = i + 1;
    if (at_.in_epoch == job_.steps_per_epoch) at_ = {at_.step, epoch + 1, 0};
    totals.loss_sum += s.loss_sum;
    totals.correct += s.correct;
    totals.seen += job_.batch;
    log_step(epoch, i, s);
    if (s.stop) {
      checkpoint(at_);
      result_.stopped_by_signal = options_.stop_signal ? options_.stop_signal->load() : 0;
      if (result_.stopped_by_signal == 0) result_.stopped_by_signal = -1;  // another rank's
      return false;
    }
    if (options_.checkpoint_every > 0 && at_.step % options_.checkpoint_every == 0 &&
        at_.step < job_.total_steps) {
      checkpoint(at_);
    }
  }
  end_epoch(epoch, totals, start);
  return true;
}

// Step i of an epoch whose samples come in `order`: this rank's gradients,
// their allreduce, the global loss and stop signal, the update.
StepTotals Trainer::step(const std::vector<int64_t>& order, int64_t i) {
  if (observer_) observer_->on_step_start(step_event());
  const double probe_ms =
      parallel() && job_.my_batch == 0 && rebalancer_.probes_at(at_.step) ? probe() : 0.0;
  const auto start = Clock::now();
  // Only the re-balancer reads the compute time, and only with several
  // ranks: one rank spares the span's sync (on a GPU, a host wait).
  if (parallel()) backend_.begin_compute_span();
  StepTotals totals = job_.my_batch > 0 ? compute(order, i) : contribute_zero_gradients();
  if (observer_) observer_->on_compute_done(step_event(), seconds_since(start));
  const double compute_ms = parallel() ? backend_.end_compute_span_ms() : 0.0;
  allreduce_.complete(net_->gradients());
  totals.stop = options_.stop_signal && options_.stop_signal->load() != 0;
  std::optional<SplitSwitch> to;
  if (parallel()) {
    std::vector<double> sums{totals.loss_sum, totals.correct, totals.stop ? 1.0 : 0.0};
    rebalancer_.contribute(compute_ms, probe_ms, sums);
    comm_->allreduce_sum(sums);
    totals = {sums[0], sums[1], sums[2] > 0};
    to = rebalancer_.after_step(std::span<const double>(sums).subspan(3), job_.split, at_.step);
  }
  check_finite(totals.loss_sum / static_cast<double>(job_.batch));
  totals.lr = schedule_.at(at_.step);
  if (const std::optional<float> grad_scale = gradient_scale()) {
    sgd_.step(net_->parameters(), net_->gradients(), static_cast<float>(totals.lr), *grad_scale);
  }
  ++at_.step;
  const int64_t run_steps = at_.step - resumed_.step;
  if (trace_ && run_steps == options_.trace_steps) net_->set_trace(nullptr);
  if (run_steps > 1) {  // the first step also creates every primitive
    train_seconds_ += seconds_since(start);
    timed_images_ += job_.batch;
  }
  if (to) switch_split(*to);
  if (const std::string note = rebalancer_.take_note(); !note.empty()) progress_.line(note);
  return totals;
}

// Every rank takes its new share from the next step on; the global batch,
// its samples and the loss scale 1/B stay, so the gradient stays the
// full-batch one.
void Trainer::switch_split(const SplitSwitch& to) {
  progress_.line(describe_switch(to, at_.step + 1));
  metrics_.write(switch_record(to, at_.step + 1));
  job_ = with_split(job_, to.split);
  ++result_.rebalances;
  fit_network_to_batch();
}

// A share larger than the network was built for needs a new network: the
// parameters and buffers move over through the host (the optimizer's
// state lives apart), the old one is freed first so that the device holds
// one at a time. A smaller share runs on the network as it is.
void Trainer::fit_network_to_batch() {
  if (network_batch(job_) <= net_batch_) return;
  const std::vector<float> params = net_->download_parameters();
  const std::vector<float> buffers = net_->download_buffers();
  net_.reset();
  net_ = std::make_unique<Network>(graph_, backend_, network_options(graph_, job_, options_, true));
  net_->upload_parameters(params);
  net_->upload_buffers(buffers);
  if (trace_ && at_.step - resumed_.step < options_.trace_steps) net_->set_trace(trace_.get());
  install_bucket_hooks();
  net_batch_ = network_batch(job_);
  progress_.line(format("rebalance: rebuilt the network for batch %lld",
                        static_cast<long long>(net_batch_)));
}

// Forward and backward on this rank's slice of the batch (the gradient
// allreduces start from backward's hooks).
StepTotals Trainer::compute(const std::vector<int64_t>& order, int64_t i) {
  auto slice = [&](int64_t at) {
    return std::span<const int64_t>(order).subspan(
        static_cast<size_t>(at * job_.batch + job_.my_offset), static_cast<size_t>(job_.my_batch));
  };
  upload_staged(*net_, gatherer_.take(slice(i)));
  if (i + 1 < job_.steps_per_epoch && at_.step + 1 < job_.total_steps) {
    gatherer_.gather_ahead(slice(i + 1));
  }
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  const LossStats s =
      net_->train_step(job_.my_batch, static_cast<float>(scale / static_cast<double>(job_.batch)));
  return {s.loss_sum, static_cast<double>(s.correct)};
}

// No samples: take part in synchronised batch norm's collectives, and
// contribute zero gradients to the same allreduces.
StepTotals Trainer::contribute_zero_gradients() {
  net_->train_without_samples();
  backend_.fill(Tensor{vector_desc(net_->parameter_count()), net_->gradients()}, 0.0f);
  if (parallel()) {
    allreduce_.launch_all(net_->gradients());
  }
  return {};
}

// A rank without samples times a forward pass in inference mode on a fixed
// batch (the same every time: no collective, no running statistics
// changed), so that rank 0 sees when its device speeds up again
// (rebalancer.h). Returns its milliseconds on the device.
double Trainer::probe() {
  const int64_t n = std::min(net_batch_, std::max<int64_t>(1, job_.batch / job_.ranks));
  const auto upload = [&] {
    backend_.upload(probe_batch_->images.data(), net_->input(n));
    backend_.upload_labels(probe_batch_->labels.data(), net_->labels(), n);
  };
  if (!probe_batch_ || static_cast<int64_t>(probe_batch_->labels.size()) != n) {
    probe_batch_ = timing_batch(graph_, n);
    upload();
    net_->evaluate(n);  // untimed: the first pass at a batch also creates its primitives
  }
  const auto start = Clock::now();
  backend_.begin_compute_span();
  upload();
  net_->evaluate(n);
  if (observer_) observer_->on_probe_done(step_event(), seconds_since(start));
  return backend_.end_compute_span_ms();
}

// What the update multiplies the (allreduced, so on every rank the same)
// gradients by: 1 without loss scaling, else 1 / the scale they were
// computed at; nothing when they overflowed and the update is skipped. The
// scaler then adjusts the scale.
std::optional<float> Trainer::gradient_scale() {
  if (!scaler_) return 1.0f;
  const double scale = scaler_->scale();
  const bool finite = backend_.all_finite(net_->gradients(), net_->parameter_count());
  if (!scaler_->after_step(finite)) {
    progress_.line(format("loss scaling: the gradients of step %lld overflowed at scale %g; "
                          "update skipped, scale now %g",
                          static_cast<long long>(at_.step + 1), scale, scaler_->scale()));
    return std::nullopt;
  }
  return static_cast<float>(1.0 / scale);
}

// A diverged run stops before the update that would spread the non-finite
// values into the parameters. Every rank sees the same (allreduced) loss,
// so every rank stops here alike.
void Trainer::check_finite(double loss) const {
  if (std::isfinite(loss)) return;
  std::string last = "no step of this run had a finite loss";
  if (!result_.step_losses.empty()) {
    last = format("the last finite loss was %.6g, at step %lld", result_.step_losses.back(),
                  static_cast<long long>(at_.step));
  }
  throw std::runtime_error(format("training diverged: the loss of step %lld (epoch %lld) is %s; "
                                  "%s (a smaller optimizer.lr may help)",
                                  static_cast<long long>(at_.step + 1),
                                  static_cast<long long>(at_.epoch + 1),
                                  std::isnan(loss) ? "nan" : "infinite", last.c_str()));
}

void Trainer::log_step(int64_t epoch, int64_t i, const StepTotals& totals) {
  const double loss = totals.loss_sum / static_cast<double>(job_.batch);
  const double accuracy = totals.correct / static_cast<double>(job_.batch);
  result_.step_losses.push_back(loss);
  const double ips =
      train_seconds_ > 0 ? static_cast<double>(timed_images_) / train_seconds_ : 0;
  const int64_t step = at_.step;
  const bool log_point = step % options_.log_every == 0 || step == job_.total_steps;
  progress_.step(format("epoch %lld/%lld step %lld/%lld loss %.4f acc %.3f lr %.4g %.0f img/s",
                        static_cast<long long>(epoch + 1), static_cast<long long>(options_.epochs),
                        static_cast<long long>(i + 1),
                        static_cast<long long>(job_.steps_per_epoch), loss, accuracy, totals.lr,
                        ips),
                 log_point);
  if (!log_point) return;
  const MemoryStats memory = net_->memory_stats();
  metrics_.write(JsonRecord()
                     .add("event", "step")
                     .add("step", step)
                     .add("epoch", epoch + 1)
                     .add("loss", loss)
                     .add("accuracy", accuracy)
                     .add("lr", totals.lr)
                     .add("images_per_second", ips)
                     .add("device_bytes", static_cast<int64_t>(backend_.device_bytes_in_use()))
                     .add("memory_step_peak_bytes", static_cast<int64_t>(memory.step_peak))
                     .add("memory_step_average_bytes", memory.step_average)
                     .add("compute_ms", rebalancer_.compute_ms())
                     .add("split", std::span<const int64_t>(job_.split)));
}

// The epoch's summary line and record, with a test-set evaluation if asked.
void Trainer::end_epoch(int64_t epoch, const EpochTotals& totals, Clock::time_point start) {
  const double seen = static_cast<double>(std::max<int64_t>(totals.seen, 1));
  JsonRecord record;
  record.add("event", "epoch")
      .add("epoch", epoch + 1)
      .add("step", at_.step)
      .add("train_loss", totals.loss_sum / seen)
      .add("train_accuracy", totals.correct / seen)
      .add("seconds", seconds_since(start));
  std::string summary = format("epoch %lld/%lld: train loss %.4f acc %.4f",
                               static_cast<long long>(epoch + 1),
                               static_cast<long long>(options_.epochs), totals.loss_sum / seen,
                               totals.correct / seen);
  if (options_.evaluate && test_set_.count > 0) {
    share_batch_norm_statistics();
    const Evaluation e = evaluate(*net_, test_set_, norm_, job_.eval_chunk, eval_stage_, comm_);
    result_.test_accuracy = e.accuracy;
    result_.test_loss = e.loss;
    record.add("test_loss", e.loss).add("test_accuracy", e.accuracy);
    summary += format(", test loss %.4f acc %.4f", e.loss, e.accuracy);
  }
  summary += format(" (%.1f s)", seconds_since(start));
  progress_.line(summary);
  metrics_.write(record);
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
  if (options_.checkpoint_dir.empty()) return;
  // Batch-norm running statistics: every rank's are the same when
  // synchronised, else each rank's follow its own samples; the checkpoint
  // (like evaluation) uses rank 0's.
  if (!leader()) return;
  Checkpoint ckpt;
  ckpt.model_signature = graph_.signature();
  ckpt.step = at.step;
  ckpt.epoch = at.epoch;
  ckpt.step_in_epoch = at.in_epoch;
  ckpt.seed = options_.seed;
  ckpt.world_size = job_.ranks;
  ckpt.global_batch = job_.batch;
  ckpt.epoch_sample = at.in_epoch * job_.batch;
  ckpt.split = job_.split;
  ckpt.parameters = net_->download_parameters();
  ckpt.buffers = net_->download_buffers();
  ckpt.velocity = sgd_.download_velocity();
  if (scaler_) ckpt.loss_scaler = scaler_->state();
  result_.last_checkpoint = save_checkpoint(options_.checkpoint_dir, ckpt, options_.checkpoint_keep);
  progress_.line("checkpoint: wrote " + result_.last_checkpoint);
}

// The result's totals, and the trace: one file, one process per rank,
// gathered and written by rank 0.
void Trainer::finish() {
  result_.steps = at_.step;
  result_.final_loss = result_.step_losses.empty() ? 0 : result_.step_losses.back();
  result_.images_per_second =
      train_seconds_ > 0 ? static_cast<double>(timed_images_) / train_seconds_ : 0;
  result_.peak_device_bytes = backend_.device_bytes_peak();
  result_.memory = net_->memory_stats();
  result_.final_split = job_.split;
  result_.loss_scale = scaler_ ? scaler_->scale() : 0.0;
  result_.skipped_steps = scaler_ ? scaler_->skipped_steps() : 0;
  if (trace_) {
    net_->set_trace(nullptr);
    std::vector<std::string> parts = parallel()
                                         ? comm_->gather(trace_->events_json(), 0)
                                         : std::vector<std::string>{trace_->events_json()};
    if (leader()) {
      memory::write_trace_file(options_.trace_path, memory::merge_chrome_traces(parts));
      progress_.line("trace: " + options_.trace_path);
    }
  }
  if (comm_) {
    result_.allreduce_seconds = comm_->allreduce_seconds();
    result_.allreduce_exposed_seconds = comm_->wait_seconds();
  }
}

void Trainer::write_end_record() {
  const TrainResult& r = result_;
  JsonRecord end;
  end.add("event", "end")
      .add("steps", r.steps)
      .add("final_loss", r.final_loss)
      .add("images_per_second", r.images_per_second)
      .add("peak_device_bytes", static_cast<int64_t>(r.peak_device_bytes))
      .add("precision", common::precision_name(graph_.precision()))
      .add("memory_policy", r.memory.policy)
      .add("memory_step_peak_bytes", static_cast<int64_t>(r.memory.step_peak))
      .add("memory_step_average_bytes", r.memory.step_average)
      .add("ranks", static_cast<int64_t>(job_.ranks))
      .add("allreduce_seconds", r.allreduce_seconds)
      .add("allreduce_exposed_seconds", r.allreduce_exposed_seconds)
      .add("allreduce_type", common::dtype_name(allreduce_.wire()))
      .add("rebalances", r.rebalances)
      .add("skipped_steps", r.skipped_steps)
      .add("loss_scale", r.loss_scale);
  if (r.test_accuracy >= 0) end.add("test_accuracy", r.test_accuracy).add("test_loss", r.test_loss);
  metrics_.write(end);
}

void Trainer::print_summary() {
  const TrainResult& r = result_;
  std::string comm_text;
  if (job_.ranks > 1 && r.allreduce_seconds > 0) {
    comm_text = format(", allreduce %.2f s of which %.0f%% hidden behind backward",
                       r.allreduce_seconds,
                       100.0 * std::max(0.0, 1.0 - r.allreduce_exposed_seconds /
                                                       r.allreduce_seconds));
  }
  progress_.line(format("memory: last step peak %s, average %s, offloaded %s; pool reserved %s",
                        common::format_mib(r.memory.step_peak).c_str(),
                        common::format_mib(static_cast<size_t>(r.memory.step_average)).c_str(),
                        common::format_mib(r.memory.offloaded_bytes).c_str(), common::format_mib(r.memory.reservation).c_str()));
  if (const memory::StaticPlanReport& sp = r.memory.static_plan; sp.active && sp.blocks > 0) {
    progress_.line(format(
        "memory: static plan of %d blocks spans %s above the persistent tensors: "
        "%.3fx the lower bound %s%s; %d plan(s), %d re-plan(s), %.2f ms to solve",
        sp.blocks, common::format_mib(sp.plan_peak).c_str(),
        sp.lower_bound > 0 ? static_cast<double>(sp.plan_peak) / sp.lower_bound : 1.0,
        common::format_mib(sp.lower_bound).c_str(),
        sp.pool_span > 0 ? (" (best fit as requests came: " + common::format_mib(sp.pool_span) + ")").c_str()
                         : "",
        sp.plans, sp.replans, 1000.0 * sp.plan_seconds));
  }
  progress_.line(format("done: %lld steps, %.0f img/s, peak device memory %s%s%s",
                        static_cast<long long>(r.steps), r.images_per_second,
                        common::format_mib(r.peak_device_bytes).c_str(),
                        r.test_accuracy >= 0 ? format(", test accuracy %.4f", r.test_accuracy).c_str()
                                             : "",
                        comm_text.c_str()));
}

}  // namespace

TrainResult train(const Graph& graph, Backend& backend, const Dataset& train_set,
                  const Dataset& test_set, const ChannelStats& norm,
                  const TrainerOptions& options) {
  return Trainer(graph, backend, train_set, test_set, norm, options).run();
}

}  // namespace vtrain::worker
