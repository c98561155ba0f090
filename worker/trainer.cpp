#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "worker/network.h"

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

void load_batch(Network& net, const Dataset& data, const ChannelStats& norm, Staging& stage,
                int64_t n) {
  const int64_t per_sample = data.sample.per_sample();
  stage.images.resize(static_cast<size_t>(n * per_sample));
  stage.labels.resize(static_cast<size_t>(n));
  gather_batch(data, std::span<const int64_t>(stage.indices.data(), static_cast<size_t>(n)), norm,
               stage.images.data(), stage.labels.data());
  net.backend().upload(stage.images.data(), net.input(n));
  net.backend().upload_labels(stage.labels.data(), net.labels(), n);
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

Evaluation evaluate(Network& net, const Dataset& data, const ChannelStats& norm, int64_t batch,
                    Staging& stage) {
  double loss = 0;
  int64_t correct = 0;
  for (int64_t first = 0; first < data.count; first += batch) {
    const int64_t n = std::min(batch, data.count - first);
    stage.indices.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) stage.indices[i] = first + i;
    load_batch(net, data, norm, stage, n);
    const LossStats s = net.evaluate(n);
    loss += s.loss_sum;
    correct += s.correct;
  }
  return {loss / static_cast<double>(data.count),
          static_cast<double>(correct) / static_cast<double>(data.count)};
}

}  // namespace

TrainResult train(const Graph& graph, Backend& backend, const Dataset& train_set,
                  const Dataset& test_set, const ChannelStats& norm,
                  const TrainerOptions& options) {
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
  const int64_t steps_per_epoch = train_set.count / batch;
  if (steps_per_epoch < 1) {
    throw std::invalid_argument("the training set has " + std::to_string(train_set.count) +
                                " samples, fewer than one batch of " + std::to_string(batch));
  }
  int64_t total_steps = steps_per_epoch * options.epochs;
  if (options.max_steps > 0) total_steps = std::min(total_steps, options.max_steps);

  Network net(graph, backend, {.max_batch = batch, .conv_algorithm = options.conv_algorithm});
  net.init_parameters(options.seed);
  Sgd sgd(backend, net.parameter_count(), options.momentum, options.weight_decay);
  LrSchedule schedule = options.schedule;
  schedule.steps_per_epoch = steps_per_epoch;
  schedule.total_steps = total_steps;

  Progress progress(options.progress);
  MetricsFile metrics = options.metrics_path.empty() ? MetricsFile() : MetricsFile(options.metrics_path);
  progress.line(format("model: %d layers, %lld parameters; batch %lld, %lld steps/epoch; "
                       "device memory %s in use (workspace %s)",
                       graph.size(), static_cast<long long>(net.parameter_count()),
                       static_cast<long long>(batch), static_cast<long long>(steps_per_epoch),
                       mib(backend.device_bytes_in_use()).c_str(),
                       mib(net.workspace_bytes()).c_str()));

  for (const std::string& line : net.algorithm_summary()) progress.line("  " + line);

  TrainResult result;
  Staging stage;
  double train_seconds = 0;
  int64_t timed_images = 0;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < options.epochs && step < total_steps; ++epoch) {
    const std::vector<int64_t> order = epoch_permutation(options.seed, epoch, train_set.count);
    double epoch_loss = 0;
    int64_t epoch_correct = 0, epoch_seen = 0;
    const auto epoch_start = Clock::now();
    for (int64_t i = 0; i < steps_per_epoch && step < total_steps; ++i, ++step) {
      const auto step_start = Clock::now();
      stage.indices.assign(order.begin() + i * batch, order.begin() + (i + 1) * batch);
      load_batch(net, train_set, norm, stage, batch);
      const LossStats s = net.train_step(batch, 1.0f / static_cast<float>(batch));
      const double lr = schedule.at(step);
      sgd.step(net.parameters(), net.gradients(), static_cast<float>(lr));
      const double elapsed = seconds_since(step_start);
      if (step > 0) {  // the first step also creates every primitive
        train_seconds += elapsed;
        timed_images += batch;
      }
      const double loss = s.loss_sum / static_cast<double>(batch);
      result.step_losses.push_back(loss);
      epoch_loss += s.loss_sum;
      epoch_correct += s.correct;
      epoch_seen += batch;
      const double ips = train_seconds > 0 ? static_cast<double>(timed_images) / train_seconds : 0;
      const bool log_point = (step + 1) % options.log_every == 0 || step + 1 == total_steps;
      progress.step(format("epoch %lld/%lld step %lld/%lld loss %.4f acc %.3f lr %.4g %.0f img/s",
                           static_cast<long long>(epoch + 1), static_cast<long long>(options.epochs),
                           static_cast<long long>(i + 1), static_cast<long long>(steps_per_epoch),
                           loss, static_cast<double>(s.correct) / static_cast<double>(batch), lr,
                           ips),
                    log_point);
      if (log_point) {
        metrics.write(JsonRecord()
                          .add("event", "step")
                          .add("step", step + 1)
                          .add("epoch", epoch + 1)
                          .add("loss", loss)
                          .add("accuracy", static_cast<double>(s.correct) / batch)
                          .add("lr", lr)
                          .add("images_per_second", ips)
                          .add("device_bytes", static_cast<int64_t>(backend.device_bytes_in_use())));
      }
    }
    JsonRecord record;
    record.add("event", "epoch")
        .add("epoch", epoch + 1)
        .add("step", step)
        .add("train_loss", epoch_loss / static_cast<double>(std::max<int64_t>(epoch_seen, 1)))
        .add("train_accuracy",
             static_cast<double>(epoch_correct) / static_cast<double>(std::max<int64_t>(epoch_seen, 1)))
        .add("seconds", seconds_since(epoch_start));
    std::string summary = format("epoch %lld/%lld: train loss %.4f acc %.4f",
                                 static_cast<long long>(epoch + 1),
                                 static_cast<long long>(options.epochs),
                                 epoch_loss / static_cast<double>(std::max<int64_t>(epoch_seen, 1)),
                                 static_cast<double>(epoch_correct) /
                                     static_cast<double>(std::max<int64_t>(epoch_seen, 1)));
    if (options.evaluate && test_set.count > 0) {
      const Evaluation e = evaluate(net, test_set, norm, batch, stage);
      result.test_accuracy = e.accuracy;
      result.test_loss = e.loss;
      record.add("test_loss", e.loss).add("test_accuracy", e.accuracy);
      summary += format(", test loss %.4f acc %.4f", e.loss, e.accuracy);
    }
    summary += format(" (%.1f s)", seconds_since(epoch_start));
    progress.line(summary);
    metrics.write(record);
  }

  result.steps = step;
  result.final_loss = result.step_losses.empty() ? 0 : result.step_losses.back();
  result.images_per_second =
      train_seconds > 0 ? static_cast<double>(timed_images) / train_seconds : 0;
  result.peak_device_bytes = backend.device_bytes_peak();
  JsonRecord end;
  end.add("event", "end")
      .add("steps", result.steps)
      .add("final_loss", result.final_loss)
      .add("images_per_second", result.images_per_second)
      .add("peak_device_bytes", static_cast<int64_t>(result.peak_device_bytes));
  if (result.test_accuracy >= 0) {
    end.add("test_accuracy", result.test_accuracy).add("test_loss", result.test_loss);
  }
  metrics.write(end);
  progress.line(format("done: %lld steps, %.0f img/s, peak device memory %s%s",
                       static_cast<long long>(result.steps), result.images_per_second,
                       mib(result.peak_device_bytes).c_str(),
                       result.test_accuracy >= 0
                           ? format(", test accuracy %.4f", result.test_accuracy).c_str()
                           : ""));
  return result;
}

}  // namespace vtrain::worker
