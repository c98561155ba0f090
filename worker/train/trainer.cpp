#include "worker/train/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <utility>

#include "worker/train/gradient_buckets.h"
#include "worker/train/trainer_internal.h"
#include "worker/device/op_calls.h"

namespace vtrain::worker::trainer_internal {
namespace {

// train.loss_scaling's scaler, or nothing when no rank scales its loss.
std::optional<LossScaler> make_loss_scaler(const LossScalingSettings& s,
                                           const LossScalingPlan& plan) {
  if (!plan.job) return std::nullopt;
  return LossScaler(s.initial, s.growth_interval);
}

// TrainerContext::rank_precisions, or this rank's on every rank.
std::vector<common::Precision> rank_precisions(const TrainerOptions& options, const TrainerContext& context,
                                               int ranks) {
  if (context.rank_precisions.empty()) {
    return std::vector<common::Precision>(static_cast<size_t>(ranks), options.settings.precision);
  }
  if (static_cast<int>(context.rank_precisions.size()) != ranks) {
    throw std::invalid_argument("rank_precisions: " +
                                std::to_string(context.rank_precisions.size()) +
                                " precisions for " + std::to_string(ranks) + " ranks");
  }
  return context.rank_precisions;
}

// A rank with no samples still needs a network for the parameter buffers
// and for its share of the evaluation. A network built after the optimizer
// (a larger batch after a re-balance) finds its state in use already.
NetworkOptions network_options(const JobShape& job, std::span<const common::Precision> precisions,
                               const TrainerOptions& options, const TrainerContext& context,
                               const ConvPlan& kernels, bool prefetch_input,
                               bool optimizer_allocated = false) {
  NetworkOptions net = training_network_options(options, network_batch(job), precisions);
  net.prefetch_input = prefetch_input;
  net.conv_executions = kernels.executions;
  net.conv_workspace_bytes = kernels.workspace_bytes;
  if (optimizer_allocated) net.allocations_after_network.clear();
  if (Communicator* comm = context.batch_norm_comm; comm != nullptr && job.ranks > 1) {
    net.sum_over_ranks = [comm](std::vector<double>& values) { comm->allreduce_sum(values); };
  }
  // Last: costs measured in place are measured on a network like this one.
  if (context.memory_costs_at) {
    if (auto costs = context.memory_costs_at(net)) net.memory_costs = std::move(*costs);
  }
  return net;
}

LrSchedule schedule_for(const JobShape& job, const TrainerOptions& options) {
  return {options.schedule, job.steps_per_epoch, job.total_steps};
}

}  // namespace

Trainer::Trainer(const Graph& graph, Backend& backend, const Dataset& train_set,
                 const Dataset& test_set, const ChannelStats& norm, const TrainerOptions& options,
                 const TrainerContext& context)
    : graph_(graph),
      backend_(backend),
      train_set_(train_set),
      test_set_(test_set),
      norm_(norm),
      options_(options),
      context_(context),
      comm_(context.comm),
      observer_(context.observer),
      job_(job_shape(graph, train_set, options, context)),
      precisions_(rank_precisions(options, context, job_.ranks)),
      scaling_(plan_loss_scaling(options.train.loss_scaling, precisions_, job_.rank)),
      staging_(batch_staging(options, job_.my_batch, train_set.sample.per_sample(), backend,
                             train_set.files != nullptr)),
      conv_plan_(context.conv_plan),
      net_(std::make_unique<Network>(
          graph, backend,
          network_options(job_, precisions_, options, context, conv_plan_,
                          staging_.prefetch_input))),
      optimizer_(backend, prepare_network(), options.optimizer),
      ema_(options.train.ema > 0
               ? std::make_unique<WeightAverage>(backend, net_->parameters(),
                                                 net_->parameter_count(), options.train.ema)
               : nullptr),
      schedule_(schedule_for(job_, options)),
      progress_(leader() ? options.progress : Progress::Mode::kSilent),
      allreduce_(backend, context.comm,
                 plan_buckets(net_->param_ranges(), options.train.allreduce_bucket),
                 wire_type(options.train.gradient_allreduce, precisions_)),
      pool_(context.data_workers > 0 && transforms_samples(train_set)
                ? std::make_unique<DecodePool>(context.data_workers)
                : nullptr),
      gatherer_(train_set, norm, staging_.gather_ahead, &pinned_,
                {options.train.seed, options.prefetch_batches, pool_.get()}),
      rebalancer_({options.rebalance, context.rebalance_profiles, context.rebalance_split_options},
                  job_.rank, job_.ranks, job_.batch),
      throttle_(context.input_rate_limit ? std::optional<InputThrottle>(*context.input_rate_limit)
                                         : std::nullopt),
      scaler_(make_loss_scaler(options.train.loss_scaling, scaling_)) {
  if (options.train.target_accuracy > 0 && test_set.count == 0) {
    throw std::invalid_argument(
        "train.target_accuracy: the data has no test set to measure the accuracy on");
  }
  // Peak device memory counts from here: what training holds, not the
  // buffers conv.algorithm auto timed its candidates in (freed by now).
  backend_.reset_peak();
  print_setup();
  install_bucket_hooks();
}

// The batch gathered ahead may be copying to the device: wait before the
// gatherer frees it. The whole memory stream, not only the prefetch the
// network knows of: a copy issued by a prefetch_input that then threw
// (recording its event) would otherwise still read the batch.
Trainer::~Trainer() {
  try {
    if (net_) net_->drop_prefetch();
    backend_.synchronize(StreamKind::kMemory);
  } catch (...) {  // a device error: nothing is left to protect
  }
}

// Attaches the trace and initialises the parameters before the optimizer
// allocates its state; returns the parameter tensors for it.
std::vector<ParamTensor> Trainer::prepare_network() {
  if (!context_.trace_path.empty()) {
    trace_ = std::make_unique<memory::ChromeTrace>(
        job_.rank, format("rank %d (%s)", job_.rank, backend_.device_info().backend.c_str()));
    net_->set_trace(trace_.get());
  }
  net_->init_parameters(options_.train.seed);
  return parameter_tensors(graph_, net_->param_ranges());
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

TrainResult Trainer::run() {
  restore();
  // A resume continues the checkpoint's weights, which model.init's
  // only ever started.
  if (result_.resumed_from.empty()) apply_initial_weights();
  resumed_ = at_;
  if (!result_.resumed_from.empty() && at_.step >= job_.total_steps) return already_finished();
  // Once it is known whether the run resumed: a resumed run's records
  // follow the ones it wrote before.
  if (leader() && !options_.metrics_path.empty()) {
    metrics_ = MetricsFile(options_.metrics_path, !result_.resumed_from.empty());
  }
  DrainOnUnwind drain{parallel() ? comm_ : nullptr};
  bool stopped = false;
  for (int64_t e = at_.epoch; e < options_.train.epochs && at_.step < job_.total_steps; ++e) {
    if (!epoch(e)) {
      stopped = true;
      break;
    }
    if (reached_target(e)) break;
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

// Whether `epoch`'s evaluation reached train.target_accuracy: the same on
// every rank (the evaluation's counts are summed over all of them).
bool Trainer::reached_target(int64_t epoch) {
  const double target = options_.train.target_accuracy;
  if (target <= 0 || result_.test_accuracy < target) return false;
  result_.target_epoch = epoch + 1;
  progress_.line(format("test accuracy %.4f reached train.target_accuracy %g after epoch %lld of "
                        "%lld: training ends here",
                        result_.test_accuracy, target, static_cast<long long>(epoch + 1),
                        static_cast<long long>(options_.train.epochs)));
  return true;
}

// Runs the steps of `epoch` left to run; false when a stop signal ended
// the run (after a checkpoint).
bool Trainer::epoch(int64_t epoch) {
  std::erase_if(orders_, [&](const auto& o) { return o.first < epoch; });
  const std::vector<int64_t>& order = order_of(epoch);
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
      result_.stopped_by_signal = context_.stop_signal ? context_.stop_signal->load() : 0;
      if (result_.stopped_by_signal == 0) result_.stopped_by_signal = -1;  // another rank's
      return false;
    }
    if (options_.checkpoint.every > 0 && at_.step % options_.checkpoint.every == 0 &&
        at_.step < job_.total_steps) {
      checkpoint(at_);
    }
  }
  end_epoch(epoch, totals, start);
  return true;
}

// Computed once: an epoch's last step asks for the next epoch's, to gather
// its first batch ahead.
const std::vector<int64_t>& Trainer::order_of(int64_t epoch) {
  auto [it, inserted] = orders_.try_emplace(epoch);
  if (inserted) it->second = epoch_permutation(options_.train.seed, epoch, train_set_.count);
  return it->second;
}

// Step i of an epoch whose samples come in `order`: this rank's gradients,
// their allreduce, the global loss and stop signal, the update.
StepTotals Trainer::step(const std::vector<int64_t>& order, int64_t i) {
  if (observer_) observer_->on_step_start(step_event());
  input_wait_ = 0;
  // A rank without samples has no compute time to report; now and then it
  // times a probe instead (its own span: spans do not nest).
  const bool probing = parallel() && job_.my_batch == 0 && rebalancer_.probes_at(at_.step);
  double probe_ms = 0;
  const auto start = Clock::now();
  // The wait for this step's input: a throttled rank's here, and inside
  // compute() the wait for the batch the gatherer decodes ahead.
  const double throttle_ms = throttle_ && job_.my_batch > 0 ? throttle_->wait(job_.my_batch) : 0.0;
  // Only the re-balancer reads the compute time, and only with several
  // ranks: one rank spares the span's sync (on a GPU, a host wait).
  if (parallel() && !probing) backend_.begin_compute_span();
  StepTotals totals = job_.my_batch > 0 ? compute(order, i)
                                        : contribute_zero_gradients(probing ? &probe_ms : nullptr);
  if (observer_) observer_->on_compute_done(step_event(), seconds_since(start));
  // The gatherer's wait ran inside the compute span: the re-balancer gets
  // it as input time, not as compute time.
  const double gather_wait_ms = 1e3 * input_wait_;
  const double compute_ms =
      parallel() && !probing ? std::max(0.0, backend_.end_compute_span_ms() - gather_wait_ms) : 0.0;
  const double input_wait_ms = throttle_ms + gather_wait_ms;
  input_wait_ = input_wait_ms / 1e3;
  allreduce_.complete(net_->gradients());
  totals.stop = context_.stop_signal && context_.stop_signal->load() != 0;
  std::optional<SplitSwitch> to;
  if (parallel()) {
    std::vector<double> sums{totals.loss_sum, totals.correct, totals.stop ? 1.0 : 0.0};
    rebalancer_.contribute(compute_ms, probe_ms, sums, input_wait_ms);
    comm_->allreduce_sum(sums);
    totals = {sums[0], sums[1], sums[2] > 0};
    to = rebalancer_.after_step(std::span<const double>(sums).subspan(3), job_.split, at_.step);
  }
  check_finite(totals.loss_sum / static_cast<double>(job_.batch));
  totals.lr = schedule_.at(at_.step);
  if (const std::optional<float> grad_scale = gradient_scale()) {
    optimizer_.step(net_->parameters(), net_->gradients(), static_cast<float>(totals.lr),
                    *grad_scale);
  }
  if (ema_) ema_->update(net_->parameters());
  totals.seconds = seconds_since(start);
  ++at_.step;
  const int64_t run_steps = at_.step - resumed_.step;
  if (trace_ && run_steps == context_.trace_steps) net_->set_trace(nullptr);
  if (run_steps > 1) {  // the first step also creates every primitive
    train_seconds_ += totals.seconds;
    result_.input_wait_seconds += input_wait_;
    timed_images_ += job_.batch;
  }
  if (to) switch_split(*to);
  if (const std::string note = rebalancer_.take_note(); !note.empty()) progress_.line(note);
  return totals;
}

// Every rank takes its new share from the next step on; the global batch,
// its samples and the loss scale 1/B stay, so the gradient stays the
// full-batch one. With re-planning, a rank with samples runs the conv
// kernels planned for its new batch: it frees its network first (the
// kernels may need measuring there, in the device's memory) and builds it
// again on them. Otherwise (no re-planning, or no samples: the network
// serves the collectives, the probes and evaluation) the network stays
// unless the new share, or evaluation's chunk, outgrows it.
void Trainer::switch_split(const SplitSwitch& to) {
  progress_.line(describe_switch(to, at_.step + 1));
  metrics_.write(switch_record(to, at_.step + 1));
  job_ = with_split(job_, to.split);
  ++result_.rebalances;
  const bool replans = static_cast<bool>(context_.replan_kernels);
  std::optional<NetworkState> state;
  if (replans && job_.my_batch > 0) state = release_network();
  std::optional<ConvPlan> kernels;
  if (replans) kernels = context_.replan_kernels(to);  // collective: every rank calls it
  if (state) {
    if (kernels) conv_plan_ = std::move(*kernels);
    rebuild_network(*state, kernels ? " on the conv kernels planned for it" : "");
  } else if (network_batch(job_) > net_batch_) {
    rebuild_network(release_network(), "");
  }
}

// The network's parameters and buffers on the host (the optimizer's state
// lives apart); the network itself is freed.
Trainer::NetworkState Trainer::release_network() {
  NetworkState state{net_->download_parameters(), net_->download_buffers()};
  net_.reset();
  return state;
}

// A network for this rank's batch on conv_plan_'s kernels, holding `state`.
void Trainer::rebuild_network(const NetworkState& state, const char* how) {
  net_.reset();  // the device holds one network at a time
  net_ = std::make_unique<Network>(
      graph_, backend_,
      network_options(job_, precisions_, options_, context_, conv_plan_, staging_.prefetch_input,
                      true));
  net_->upload_parameters(state.parameters);
  net_->upload_buffers(state.buffers);
  if (trace_ && at_.step - resumed_.step < context_.trace_steps) net_->set_trace(trace_.get());
  install_bucket_hooks();
  net_batch_ = network_batch(job_);
  progress_.line(format("rebalance: rebuilt the network for batch %lld%s",
                        static_cast<long long>(net_batch_), how));
}

// Forward and backward on this rank's slice of the batch (the gradient
// allreduces start from backward's hooks).
// The step after the last of an epoch is the next epoch's first: its
// batch is gathered ahead too.
StepTotals Trainer::compute(const std::vector<int64_t>& order, int64_t i) {
  auto slice = [&](const std::vector<int64_t>& samples, int64_t at) {
    return std::span<const int64_t>(samples).subspan(
        static_cast<size_t>(at * job_.batch + job_.my_offset), static_cast<size_t>(job_.my_batch));
  };
  result_.prefetched_batches +=
      upload_staged(*net_, gatherer_.take({slice(order, i), at_.epoch})) ? 1 : 0;
  input_wait_ = gatherer_.last_wait_seconds();
  // The batches of the steps that follow, into the next epochs as needed.
  std::array<BatchRef, 64> next;
  size_t ahead = 0;
  for (int64_t k = 1; k <= options_.prefetch_batches && at_.step + k < job_.total_steps; ++k, ++ahead) {
    const int64_t epoch = at_.epoch + (i + k) / job_.steps_per_epoch;
    next[ahead] = {slice(order_of(epoch), (i + k) % job_.steps_per_epoch), epoch};
  }
  gatherer_.gather_ahead(std::span<const BatchRef>(next.data(), ahead));
  const double scale = scaler_ && scaling_.here ? scaler_->scale() : 1.0;
  // Among ranks that do not scale, this one's gradients go out unscaled.
  allreduce_.set_prescale(scaling_.unscale_before_exchange ? static_cast<float>(1.0 / scale) : 1.0f);
  // Dropout's masks: this step, and where this rank's slice of its batch begins.
  net_->set_step_context({options_.train.seed, at_.step, job_.my_offset});
  const LossStats s =
      net_->train_step(job_.my_batch, static_cast<float>(scale / static_cast<double>(job_.batch)),
                       options_.train.label_smoothing);
  // Backward is issued; on a GPU it runs while the next batch copies.
  if (staging_.prefetch_input) {
    if (const Staging* next = gatherer_.finish_ahead()) {
      net_->prefetch_input(next->images.data(), static_cast<int64_t>(next->indices.size()));
    }
  }
  return {s.loss_sum, static_cast<double>(s.correct)};
}

// No samples: take part in synchronised batch norm's collectives, and
// contribute zero gradients to the same allreduces.
// With `probe_ms`, the probe runs once the rank has joined the step's
// batch-norm collectives, so the others never wait for it there; they
// finish their backward meanwhile.
StepTotals Trainer::contribute_zero_gradients(double* probe_ms) {
  net_->train_without_samples();
  if (probe_ms != nullptr) *probe_ms = probe();
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
// gradients by: 1 without loss scaling or where the scaling ranks unscaled
// theirs before the exchange, else 1 / the scale they were computed at;
// nothing when they overflowed (on any rank: the sum is then not finite
// on every rank) and the update is skipped. The scaler then adjusts the
// scale.
std::optional<float> Trainer::gradient_scale() {
  if (!scaler_) return 1.0f;
  const double scale = scaler_->scale();
  const bool finite = all_finite(backend_, net_->gradients(), net_->parameter_count());
  if (!scaler_->after_step(finite)) {
    progress_.line(format("loss scaling: the gradients of step %lld overflowed at scale %g; "
                          "update skipped, scale now %g",
                          static_cast<long long>(at_.step + 1), scale, scaler_->scale()));
    return std::nullopt;
  }
  return scaling_.divide_after_exchange ? static_cast<float>(1.0 / scale) : 1.0f;
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

}  // namespace vtrain::worker::trainer_internal

namespace vtrain::worker {

// Gathering ahead pays where a rank's batch holds enough values for a
// thread; the device copy where the device's memory is not the host's (on
// the CPU it would only add a copy).
BatchStaging batch_staging(const TrainerOptions& options, int64_t rank_batch,
                           int64_t sample_values, const Backend& backend, bool decodes) {
  BatchStaging s;
  s.gather_ahead = options.gather_ahead == common::AutoOnOff::kAuto
                       ? decodes || rank_batch * sample_values >= BatchGatherer::kMinPixels
                       : options.gather_ahead == common::AutoOnOff::kOn;
  s.prefetch_input = s.gather_ahead && options.prefetch_input != common::AutoOnOff::kOff &&
                     (options.prefetch_input == common::AutoOnOff::kOn ||
                      backend.device_info().backend != "cpu");
  return s;
}

std::vector<size_t> training_allocations_per_parameter(OptimizerKind optimizer, bool ema,
                                                       GradientAllreduce allreduce,
                                                       std::span<const common::Precision> ranks) {
  std::vector<size_t> allocations = {Optimizer::state_bytes_per_parameter(optimizer)};
  if (ema) allocations.push_back(WeightAverage::kStateBytesPerParameter);
  if (const size_t staging = staging_bytes_per_parameter(wire_type(allreduce, ranks),
                                                         static_cast<int>(ranks.size()))) {
    allocations.push_back(staging);
  }
  return allocations;
}

NetworkOptions training_network_options(const TrainerOptions& options, int64_t max_batch,
                                        std::span<const common::Precision> precisions) {
  NetworkOptions net;
  net.settings = options.settings;
  net.max_batch = max_batch;
  net.conv_algorithm = options.conv_algorithm;
  net.memory_policy = options.memory_policy;
  net.memory_planner = options.memory_planner;
  // The optimizer's state and the allreduce's staging buffer come after the network.
  net.allocations_after_network = training_allocations_per_parameter(
      options.optimizer.kind, options.train.ema > 0, options.train.gradient_allreduce, precisions);
  return net;
}

TrainResult train(const Graph& graph, Backend& backend, const Dataset& train_set,
                  const Dataset& test_set, const ChannelStats& norm, const TrainerOptions& options,
                  const TrainerContext& context) {
  return trainer_internal::Trainer(graph, backend, train_set, test_set, norm, options, context)
      .run();
}

}  // namespace vtrain::worker
