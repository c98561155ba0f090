#include "worker/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <memory>
#include <span>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "worker/train/checkpoint.h"
#include "common/host_stream.h"
#include "worker/engine/network.h"

namespace vtrain::worker {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

std::string mib(size_t bytes) { return format("%.1f MiB", static_cast<double>(bytes) / (1 << 20)); }

// Host staging for one batch, uploaded to the network's input.
struct Staging {
  std::vector<float> images;
  std::vector<int32_t> labels;
  std::vector<int64_t> indices;
};

// Gathers and normalises the samples of stage.indices into stage.
void gather_staged(const Dataset& data, const ChannelStats& norm, Staging& stage) {
  const auto n = static_cast<int64_t>(stage.indices.size());
  stage.images.resize(static_cast<size_t>(n * data.sample.per_sample()));
  stage.labels.resize(static_cast<size_t>(n));
  gather_batch(data, stage.indices, norm, stage.images.data(), stage.labels.data());
}

// Copies a gathered batch to the network's input and labels.
void upload_staged(Network& net, const Staging& stage) {
  const auto n = static_cast<int64_t>(stage.indices.size());
  net.backend().upload(stage.images.data(), net.input(n));
  net.backend().upload_labels(stage.labels.data(), net.labels(), n);
}

// Gathers the next training batch on a thread of its own while the current
// step computes, so that a step waits only for its upload. Worth it where
// gathering takes longer than handing work to a thread: batches of at least
// kMinPixels values (ImageNet-size inputs; not LeNet on 28x28), unless
// TrainerOptions::gather_ahead says otherwise.
class BatchGatherer {
 public:
  static constexpr int64_t kMinPixels = int64_t{1} << 20;

  BatchGatherer(const Dataset& data, const ChannelStats& norm, bool ahead)
      : data_(data), norm_(norm) {
    if (ahead) thread_.emplace();
  }

  // The batch of `indices`, gathered: the one gathered ahead when it is that
  // batch, else gathered now. Valid until the next take().
  const Staging& take(std::span<const int64_t> indices) {
    if (std::exchange(pending_, false)) {
      thread_->wait_all();  // rethrows a failed gather
      if (std::equal(indices.begin(), indices.end(), ahead_.indices.begin(),
                     ahead_.indices.end())) {
        std::swap(current_, ahead_);
        return current_;
      }
    }
    current_.indices.assign(indices.begin(), indices.end());
    gather_staged(data_, norm_, current_);
    return current_;
  }
  // Starts gathering `indices` for a later take() (no-op without a thread).
  void gather_ahead(std::span<const int64_t> indices) {
    if (!thread_) return;
    if (std::exchange(pending_, false)) thread_->wait_all();
    ahead_.indices.assign(indices.begin(), indices.end());
    thread_->enqueue([this] { gather_staged(data_, norm_, ahead_); });
    pending_ = true;
  }

 private:
  const Dataset& data_;
  const ChannelStats& norm_;
  Staging current_, ahead_;  // ahead_ belongs to the thread while pending_
  bool pending_ = false;
  // Last: destroyed first, finishing a gather in flight while ahead_ lives.
  std::optional<common::HostStream> thread_;
};

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

// Gradient buckets: consecutive parameter ranges in the order backward
// finishes them (reverse graph order), cut every `bucket_bytes`. Every rank
// derives the same buckets from the same graph, so the allreduce sequences
// match.
struct Bucket {
  int64_t offset = 0;  // floats into the gradient buffer
  int64_t count = 0;
};

struct BucketPlan {
  std::vector<Bucket> buckets;               // in launch order
  std::vector<int> launch_after;             // per param range index: bucket to launch, or -1
};

BucketPlan plan_buckets(const std::vector<ParamRange>& ranges, uint64_t bucket_bytes) {
  BucketPlan plan;
  plan.launch_after.assign(ranges.size(), -1);
  const int64_t limit = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / sizeof(float)));
  Bucket open;
  for (int i = static_cast<int>(ranges.size()) - 1; i >= 0; --i) {
    // Ranges are laid out in graph order, so walking backwards each one ends
    // where the open bucket begins.
    open.offset = ranges[i].offset;
    open.count += ranges[i].count;
    if (open.count >= limit || i == 0) {
      plan.launch_after[i] = static_cast<int>(plan.buckets.size());
      plan.buckets.push_back(open);
      open = Bucket{};
    }
  }
  return plan;
}

// Signals, loss and accuracy of one step, summed over ranks in one call.
struct StepTotals {
  double loss_sum = 0;
  double correct = 0;
  bool stop = false;
};

}  // namespace

TrainResult train(const Graph& graph, Backend& backend, const Dataset& train_set,
                  const Dataset& test_set, const ChannelStats& norm,
                  const TrainerOptions& options) {
  Communicator* comm = options.comm;
  const int rank = comm ? comm->rank() : 0;
  const int ranks = comm ? comm->size() : 1;
  const bool leader = rank == 0;
  if (!(train_set.sample == graph.output_shape(graph.input_index()))) {
    throw std::invalid_argument("the model expects samples of " +
                                graph.output_shape(graph.input_index()).str() +
                                " but the data has " + train_set.sample.str());
  }
  if (train_set.classes > graph.classes()) {
    throw std::invalid_argument("the data has " + std::to_string(train_set.classes) +
                                " classes but the model has " + std::to_string(graph.classes()) +
                                " outputs");
  }
  const int64_t batch = options.batch;
  const std::vector<int64_t> split = options.split.empty() ? balancer::even_split(batch, ranks) : options.split;
  if (static_cast<int>(split.size()) != ranks) {
    throw std::invalid_argument("the batch split has " + std::to_string(split.size()) +
                                " entries but the job has " + std::to_string(ranks) + " ranks");
  }
  int64_t split_sum = 0, my_offset = 0;
  for (int r = 0; r < ranks; ++r) {
    if (split[r] < 0) throw std::invalid_argument("negative batch in the split");
    if (r < rank) my_offset += split[r];
    split_sum += split[r];
  }
  if (split_sum != batch) {
    throw std::invalid_argument("the batch split sums to " + std::to_string(split_sum) +
                                " but the batch is " + std::to_string(batch));
  }
  const int64_t my_batch = split[rank];
  const int64_t steps_per_epoch = train_set.count / batch;
  if (steps_per_epoch < 1) {
    throw std::invalid_argument("the training set has " + std::to_string(train_set.count) +
                                " samples, fewer than one batch of " + std::to_string(batch));
  }
  int64_t total_steps = steps_per_epoch * options.epochs;
  if (options.max_steps > 0) total_steps = std::min(total_steps, options.max_steps);

  // A rank with no samples still needs a network for the parameter buffers
  // and for its share of the evaluation.
  const int64_t eval_chunk = std::max<int64_t>(my_batch, std::min<int64_t>(batch, 64));
  NetworkOptions net_options;
  net_options.max_batch = std::max(my_batch, eval_chunk);
  net_options.conv_algorithm = options.conv_algorithm;
  net_options.conv_executions = options.conv_executions;
  net_options.conv_workspace_bytes = options.conv_workspace_bytes;
  net_options.memory_policy = options.memory_policy;
  net_options.memory_planner = options.memory_planner;
  net_options.optimizer_bytes_per_parameter = Sgd::kStateBytesPerParameter;
  Network net(graph, backend, net_options);
  std::unique_ptr<memory::ChromeTrace> trace;
  if (!options.trace_path.empty()) {
    trace = std::make_unique<memory::ChromeTrace>(
        rank, format("rank %d (%s)", rank, backend.device_info().backend.c_str()));
    net.set_trace(trace.get());
  }
  net.init_parameters(options.seed);
  Sgd sgd(backend, net.parameter_count(), options.momentum, options.weight_decay);
  // Peak device memory counts from here: what training holds, not the
  // buffers conv.algorithm auto timed its candidates in (freed by now).
  backend.reset_peak();
  LrSchedule schedule = options.schedule;
  schedule.steps_per_epoch = steps_per_epoch;
  schedule.total_steps = total_steps;

  Progress progress(leader ? options.progress : Progress::Mode::kOff);
  MetricsFile metrics = (leader && !options.metrics_path.empty()) ? MetricsFile(options.metrics_path)
                                                                  : MetricsFile();
  const std::string split_text = balancer::join_batches(split);
  progress.line(format("model: %d layers, %lld parameters; batch %lld (per rank: %s), %lld "
                       "steps/epoch; device memory %s in use (workspace %s)",
                       graph.size(), static_cast<long long>(net.parameter_count()),
                       static_cast<long long>(batch), split_text.c_str(),
                       static_cast<long long>(steps_per_epoch),
                       mib(backend.device_bytes_in_use()).c_str(),
                       mib(net.workspace_bytes()).c_str()));
  for (const std::string& line : net.algorithm_summary()) progress.line("  " + line);
  {
    const MemoryStats m = net.memory_stats();
    progress.line(format("memory: policy %s, planner %s; pool %s reserved of %s (%s persistent), "
                         "pinned host %s",
                         m.policy.c_str(), m.planner.c_str(), mib(m.reservation).c_str(),
                         mib(m.capacity).c_str(), mib(m.persistent_bytes).c_str(),
                         mib(m.host_reservation).c_str()));
  }

  TrainResult result;
  int64_t start_epoch = 0, start_in_epoch = 0, step = 0;
  if (options.resume && !options.checkpoint_dir.empty()) {
    // Rank 0 reads and checks the file; everyone gets the same state.
    std::string path, position;  // position: "step epoch step_in_epoch"
    std::vector<float> params, buffers, velocity;
    if (leader) {
      if (auto latest = latest_checkpoint(options.checkpoint_dir)) {
        path = *latest;
        Checkpoint ckpt = load_checkpoint(path);
        check_checkpoint_matches(ckpt, path, graph.signature(), net.parameter_count(),
                                 net.buffer_count());
        if (ckpt.global_batch != batch || ckpt.seed != options.seed) {
          throw CheckpointError(path + " was written by a run with batch " +
                                std::to_string(ckpt.global_batch) + " and seed " +
                                std::to_string(ckpt.seed) + "; this run has batch " +
                                std::to_string(batch) + " and seed " +
                                std::to_string(options.seed));
        }
        params = std::move(ckpt.parameters);
        buffers = std::move(ckpt.buffers);
        velocity = std::move(ckpt.velocity);
        position = std::to_string(ckpt.step) + " " + std::to_string(ckpt.epoch) + " " +
                   std::to_string(ckpt.step_in_epoch);
      }
    }
    if (comm) comm->broadcast(path, 0);
    if (!path.empty()) {
      if (comm) {
        comm->broadcast(params, 0);
        comm->broadcast(buffers, 0);
        comm->broadcast(velocity, 0);
        comm->broadcast(position, 0);
      }
      net.upload_parameters(params);
      net.upload_buffers(buffers);
      sgd.upload_velocity(velocity);
      std::istringstream(position) >> step >> start_epoch >> start_in_epoch;
      result.resumed_from = path;
      progress.line(format("resumed from %s (step %lld, epoch %lld)", path.c_str(),
                           static_cast<long long>(step), static_cast<long long>(start_epoch + 1)));
    }
  }

  auto write_checkpoint = [&](int64_t epoch, int64_t in_epoch) {
    if (options.checkpoint_dir.empty()) return;
    // Batch-norm running statistics follow each rank's own samples; the
    // checkpoint (like evaluation) uses rank 0's.
    if (!leader) return;
    Checkpoint ckpt;
    ckpt.model_signature = graph.signature();
    ckpt.step = step;
    ckpt.epoch = epoch;
    ckpt.step_in_epoch = in_epoch;
    ckpt.seed = options.seed;
    ckpt.world_size = ranks;
    ckpt.global_batch = batch;
    ckpt.parameters = net.download_parameters();
    ckpt.buffers = net.download_buffers();
    ckpt.velocity = sgd.download_velocity();
    result.last_checkpoint =
        save_checkpoint(options.checkpoint_dir, ckpt, options.checkpoint_keep);
    progress.line("checkpoint: wrote " + result.last_checkpoint);
  };

  const BucketPlan buckets = plan_buckets(net.param_ranges(), options.allreduce_bucket);
  // The injected failure in backward fires after a bucket launches; with no
  // bucket to launch (one rank, an idle rank) it fires at the step's start.
  const bool fail_in_backward = options.fail_in_backward && comm && ranks > 1 && my_batch > 0;
  if (comm && ranks > 1) {
    net.on_gradients_ready = [&](const ParamRange& r) {
      const auto& ranges = net.param_ranges();
      const size_t index = static_cast<size_t>(&r - ranges.data());
      if (const int b = buckets.launch_after[index]; b >= 0) {
        comm->allreduce_async(net.gradients() + buckets.buckets[b].offset, buckets.buckets[b].count);
        if (fail_in_backward && step == options.fail_at_step) {
          throw std::runtime_error("injected failure in backward at step " + std::to_string(step) +
                                   " (VTRAIN_FAIL_AT_STEP, VTRAIN_FAIL_IN=backward)");
        }
      }
    };
  }
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
  } drain{ranks > 1 ? comm : nullptr};

  Staging stage;  // evaluation
  BatchGatherer gatherer(train_set, norm,
                         options.gather_ahead < 0
                             ? my_batch * train_set.sample.per_sample() >= BatchGatherer::kMinPixels
                             : options.gather_ahead > 0);
  double train_seconds = 0;
  int64_t timed_images = 0;
  bool stop = false;
  const int64_t first_step = step;
  for (int64_t epoch = start_epoch; epoch < options.epochs && step < total_steps && !stop;
       ++epoch) {
    const std::vector<int64_t> order = epoch_permutation(options.seed, epoch, train_set.count);
    double epoch_loss = 0, epoch_correct = 0;
    int64_t epoch_seen = 0;
    const auto epoch_start = Clock::now();
    int64_t i = epoch == start_epoch ? start_in_epoch : 0;
    for (; i < steps_per_epoch && step < total_steps; ++i) {
      if (step == options.fail_at_step && !fail_in_backward) {
        throw std::runtime_error("injected failure at step " + std::to_string(step) +
                                 " (VTRAIN_FAIL_AT_STEP)");
      }
      const auto step_start = Clock::now();
      StepTotals totals;
      if (my_batch > 0) {
        auto slice = [&](int64_t at) {
          return std::span<const int64_t>(order).subspan(static_cast<size_t>(at * batch + my_offset),
                                                         static_cast<size_t>(my_batch));
        };
        upload_staged(net, gatherer.take(slice(i)));
        if (i + 1 < steps_per_epoch && step + 1 < total_steps) gatherer.gather_ahead(slice(i + 1));
        const LossStats s = net.train_step(my_batch, 1.0f / static_cast<float>(batch));
        totals.loss_sum = s.loss_sum;
        totals.correct = static_cast<double>(s.correct);
      } else {
        // No samples: contribute zero gradients to the same allreduces.
        backend.fill(Tensor{{{std::max<int64_t>(net.parameter_count(), 1), 1, 1, 1}},
                            net.gradients()},
                     0.0f);
        if (comm && ranks > 1) {
          for (const Bucket& b : buckets.buckets) {
            comm->allreduce_async(net.gradients() + b.offset, b.count);
          }
        }
      }
      if (comm) comm->wait();
      totals.stop = options.stop_signal && options.stop_signal->load() != 0;
      if (comm && ranks > 1) {
        std::vector<double> sums{totals.loss_sum, totals.correct, totals.stop ? 1.0 : 0.0};
        comm->allreduce_sum(sums);
        totals = {sums[0], sums[1], sums[2] > 0};
      }
      const double lr = schedule.at(step);
      sgd.step(net.parameters(), net.gradients(), static_cast<float>(lr));
      ++step;
      if (trace && step - first_step == options.trace_steps) net.set_trace(nullptr);
      const double elapsed = seconds_since(step_start);
      if (step > first_step + 1) {  // the first step also creates every primitive
        train_seconds += elapsed;
        timed_images += batch;
      }
      const double loss = totals.loss_sum / static_cast<double>(batch);
      const double accuracy = totals.correct / static_cast<double>(batch);
      result.step_losses.push_back(loss);
      epoch_loss += totals.loss_sum;
      epoch_correct += totals.correct;
      epoch_seen += batch;
      const double ips = train_seconds > 0 ? static_cast<double>(timed_images) / train_seconds : 0;
      const bool log_point = step % options.log_every == 0 || step == total_steps;
      progress.step(format("epoch %lld/%lld step %lld/%lld loss %.4f acc %.3f lr %.4g %.0f img/s",
                           static_cast<long long>(epoch + 1), static_cast<long long>(options.epochs),
                           static_cast<long long>(i + 1), static_cast<long long>(steps_per_epoch),
                           loss, accuracy, lr, ips),
                    log_point);
      if (log_point) {
        const MemoryStats memory = net.memory_stats();
        metrics.write(JsonRecord()
                          .add("event", "step")
                          .add("step", step)
                          .add("epoch", epoch + 1)
                          .add("loss", loss)
                          .add("accuracy", accuracy)
                          .add("lr", lr)
                          .add("images_per_second", ips)
                          .add("device_bytes", static_cast<int64_t>(backend.device_bytes_in_use()))
                          .add("memory_step_peak_bytes", static_cast<int64_t>(memory.step_peak))
                          .add("memory_step_average_bytes", memory.step_average));
      }
      if (totals.stop) {
        stop = true;
        write_checkpoint(i + 1 == steps_per_epoch ? epoch + 1 : epoch,
                         i + 1 == steps_per_epoch ? 0 : i + 1);
        result.stopped_by_signal = options.stop_signal ? options.stop_signal->load() : 0;
        if (result.stopped_by_signal == 0) result.stopped_by_signal = -1;  // another rank's
        ++i;
        break;
      }
      if (options.checkpoint_every > 0 && step % options.checkpoint_every == 0 &&
          step < total_steps) {
        write_checkpoint(i + 1 == steps_per_epoch ? epoch + 1 : epoch,
                         i + 1 == steps_per_epoch ? 0 : i + 1);
      }
    }
    if (stop) break;
    const double seen = static_cast<double>(std::max<int64_t>(epoch_seen, 1));
    JsonRecord record;
    record.add("event", "epoch")
        .add("epoch", epoch + 1)
        .add("step", step)
        .add("train_loss", epoch_loss / seen)
        .add("train_accuracy", epoch_correct / seen)
        .add("seconds", seconds_since(epoch_start));
    std::string summary = format("epoch %lld/%lld: train loss %.4f acc %.4f",
                                 static_cast<long long>(epoch + 1),
                                 static_cast<long long>(options.epochs), epoch_loss / seen,
                                 epoch_correct / seen);
    if (options.evaluate && test_set.count > 0) {
      // Batch-norm running statistics follow each rank's own samples:
      // evaluate every share with rank 0's, as checkpoints do.
      if (comm && ranks > 1 && net.buffer_count() > 0) {
        std::vector<float> buffers = net.download_buffers();
        comm->broadcast(buffers, 0);
        net.upload_buffers(buffers);
      }
      const Evaluation e = evaluate(net, test_set, norm, eval_chunk, stage, comm);
      result.test_accuracy = e.accuracy;
      result.test_loss = e.loss;
      record.add("test_loss", e.loss).add("test_accuracy", e.accuracy);
      summary += format(", test loss %.4f acc %.4f", e.loss, e.accuracy);
    }
    summary += format(" (%.1f s)", seconds_since(epoch_start));
    progress.line(summary);
    metrics.write(record);
  }
  if (!stop) write_checkpoint(step / steps_per_epoch, step % steps_per_epoch);

  result.steps = step;
  result.final_loss = result.step_losses.empty() ? 0 : result.step_losses.back();
  result.images_per_second =
      train_seconds > 0 ? static_cast<double>(timed_images) / train_seconds : 0;
  result.peak_device_bytes = backend.device_bytes_peak();
  result.memory = net.memory_stats();
  if (trace) {
    net.set_trace(nullptr);
    // One file, one process per rank: rank 0 gathers and writes it.
    std::vector<std::string> parts =
        comm && ranks > 1 ? comm->gather(trace->events_json(), 0)
                          : std::vector<std::string>{trace->events_json()};
    if (leader) {
      memory::write_trace_file(options.trace_path, memory::merge_chrome_traces(parts));
      progress.line("trace: " + options.trace_path);
    }
  }
  if (comm) {
    result.allreduce_seconds = comm->allreduce_seconds();
    result.allreduce_exposed_seconds = comm->wait_seconds();
  }
  if (result.stopped_by_signal != 0) {
    progress.line(format("stopped at step %lld by a signal; resume with --resume",
                         static_cast<long long>(step)));
    return result;  // no "end" record: the run is not finished
  }
  JsonRecord end;
  end.add("event", "end")
      .add("steps", result.steps)
      .add("final_loss", result.final_loss)
      .add("images_per_second", result.images_per_second)
      .add("peak_device_bytes", static_cast<int64_t>(result.peak_device_bytes))
      .add("memory_policy", result.memory.policy)
      .add("memory_step_peak_bytes", static_cast<int64_t>(result.memory.step_peak))
      .add("memory_step_average_bytes", result.memory.step_average)
      .add("ranks", static_cast<int64_t>(ranks))
      .add("allreduce_seconds", result.allreduce_seconds)
      .add("allreduce_exposed_seconds", result.allreduce_exposed_seconds);
  if (result.test_accuracy >= 0) {
    end.add("test_accuracy", result.test_accuracy).add("test_loss", result.test_loss);
  }
  metrics.write(end);
  std::string comm_text;
  if (ranks > 1 && result.allreduce_seconds > 0) {
    comm_text = format(", allreduce %.2f s of which %.0f%% hidden behind backward",
                       result.allreduce_seconds,
                       100.0 * std::max(0.0, 1.0 - result.allreduce_exposed_seconds /
                                                       result.allreduce_seconds));
  }
  progress.line(format("memory: last step peak %s, average %s, offloaded %s; pool reserved %s",
                       mib(result.memory.step_peak).c_str(),
                       mib(static_cast<size_t>(result.memory.step_average)).c_str(),
                       mib(result.memory.offloaded_bytes).c_str(),
                       mib(result.memory.reservation).c_str()));
  if (const memory::StaticPlanReport& sp = result.memory.static_plan; sp.active && sp.blocks > 0) {
    progress.line(format("memory: static plan of %d blocks spans %s above the persistent tensors: "
                         "%.3fx the lower bound %s%s; %d plan(s), %d re-plan(s), %.2f ms to solve",
                         sp.blocks, mib(sp.plan_peak).c_str(),
                         sp.lower_bound > 0 ? static_cast<double>(sp.plan_peak) / sp.lower_bound : 1.0,
                         mib(sp.lower_bound).c_str(),
                         sp.pool_span > 0 ? (" (best fit as requests came: " + mib(sp.pool_span) + ")").c_str() : "",
                         sp.plans, sp.replans, 1000.0 * sp.plan_seconds));
  }
  progress.line(format("done: %lld steps, %.0f img/s, peak device memory %s%s%s",
                       static_cast<long long>(result.steps), result.images_per_second,
                       mib(result.peak_device_bytes).c_str(),
                       result.test_accuracy >= 0
                           ? format(", test accuracy %.4f", result.test_accuracy).c_str()
                           : "",
                       comm_text.c_str()));
  return result;
}

}  // namespace vtrain::worker
