// Config checks against the machine and the model (see config_limits.h).
// Sizes are computed in double: the dimensions a config may give (each up to
// 2^31 - 1) multiply beyond int64, and a bound needs no exact count.
#include "configs/config_limits.h"
#include "configs/internal/config_parts.h"
#include "configs/rank_precision.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "worker/engine/network.h"

namespace vtrain::config {
namespace {

using internal::chw;
using internal::input_key;

constexpr double kFloatBytes = sizeof(float);

// Bytes as text; sizes past what uint64 holds (only a config can ask for
// those) read as "more than 16 EiB".
std::string bytes_text(double bytes) {
  constexpr double kMax = static_cast<double>(std::numeric_limits<uint64_t>::max());
  if (bytes >= kMax) return "more than 16 EiB";
  return common::format_bytes(static_cast<uint64_t>(bytes));
}

double per_sample(const worker::Shape& s) {
  return static_cast<double>(s.c) * static_cast<double>(s.h) * static_cast<double>(s.w);
}

void check_threads(const Config& config, const Machine& machine) {
  const int64_t allowed =
      static_cast<int64_t>(machine.hardware_threads) * kMaxThreadsPerHardwareThread;
  if (config.device.threads > allowed) {
    fail_at(config, "device.threads",
            std::to_string(config.device.threads) + " asked, this machine has " +
                std::to_string(machine.hardware_threads) + " hardware thread" +
                (machine.hardware_threads == 1 ? "" : "s") + " (at most " +
                std::to_string(allowed) + " allowed = " +
                std::to_string(kMaxThreadsPerHardwareThread) + "x)");
  }
}

// The growth of `value` over its default: the data key most to blame for
// a dataset that does not fit.
double growth(double value, double default_value) { return value / default_value; }

void check_dataset(const Config& config, const Machine& machine) {
  const DataConfig& data = config.data;
  if (data.kind != worker::DataKind::kSynthetic || machine.memory_bytes == 0) return;
  const DataConfig defaults;
  const double sample = per_sample(data.shape);
  const double samples = static_cast<double>(data.train_size) + static_cast<double>(data.test_size);
  const double classes = static_cast<double>(data.classes);
  // Pixels of every sample and of one prototype per class, a label per sample.
  const double bytes = sample * (samples + classes) + sizeof(int32_t) * samples;
  if (bytes <= static_cast<double>(machine.memory_bytes)) return;
  const std::pair<double, const char*> blame[] = {
      {growth(sample, per_sample(defaults.shape)), "data.shape"},
      {growth(static_cast<double>(data.train_size), defaults.train_size), "data.train_size"},
      {growth(static_cast<double>(data.test_size), defaults.test_size), "data.test_size"},
      {growth(classes, static_cast<double>(defaults.classes)), "data.classes"},
  };
  // By growth alone, ties to the first: pairs would compare the names'
  // addresses next, which the linker orders (an ASan build blamed
  // data.classes where the release build blamed data.shape).
  const auto* key = std::max_element(std::begin(blame), std::end(blame),
                                     [](const auto& a, const auto& b) { return a.first < b.first; });
  fail_at(config, key->second,
          "the synthetic dataset needs " + bytes_text(bytes) + " (" +
              std::to_string(data.train_size) + " train + " + std::to_string(data.test_size) +
              " test samples and " + std::to_string(data.classes) +
              " class prototypes, each " + chw(data.shape) + " bytes), this machine has " +
              common::format_bytes(machine.memory_bytes) + " of memory");
}


}  // namespace

// More classes than the data has train as never-seen ones, as the trainer
// allows.
void check_model_output(const Config& config, const worker::Graph& graph,
                        const worker::Shape& input, int64_t classes) {
  const worker::Shape& out = graph.output_shape(graph.sink_index());
  if (out.h == 1 && out.w == 1 && out.c >= classes) return;
  const std::string source = config.data.kind == worker::DataKind::kSynthetic
                                 ? "data.classes: " + std::to_string(classes)
                                 : "the " + std::to_string(classes) + " classes of the " +
                                       worker::data_kind_name(config.data.kind) + " data";
  fail_model(config, input, graph.layer(graph.sink_index()).name,
             "the last layer gives " + chw(out) + " per sample, but training needs one score per "
             "class, " + std::to_string(classes) + "x1x1 (" + source + "): end the model with "
             "an fc layer with out: " + std::to_string(classes));
}

namespace {

// Parameters of layer i, as Graph::parameter_count counts them.
double layer_parameters(const worker::Graph& graph, int i) {
  const worker::LayerSpec& spec = graph.layer(i);
  const worker::Shape& in = graph.inputs(i).empty() ? graph.output_shape(i)
                                                     : graph.output_shape(graph.inputs(i)[0]);
  const double out = static_cast<double>(spec.out);
  const double bias = spec.bias ? out : 0;
  switch (spec.type) {
    case worker::LayerType::kConv:
      return out * static_cast<double>(in.c / spec.groups) * static_cast<double>(spec.kernel_h) *
                 static_cast<double>(spec.kernel_w) + bias;
    case worker::LayerType::kFc: return out * per_sample(in) + bias;
    case worker::LayerType::kBatchNorm: return 2.0 * static_cast<double>(in.c);
    default: return 0;
  }
}

}  // namespace

void check_machine(const Config& config, const Machine& machine) {
  check_threads(config, machine);
  if (machine.device_is_host && machine.memory_bytes > 0 &&
      config.device.memory_limit > machine.memory_bytes) {
    fail_at(config, "device.memory_limit",
            common::format_bytes(config.device.memory_limit) + " (" +
                std::to_string(config.device.memory_limit) +
                " bytes) asked, this machine has " + common::format_bytes(machine.memory_bytes) +
                " of memory");
  }
  check_dataset(config, machine);
}

void check_model_fits(const Config& config, const worker::Graph& graph, const Machine& machine,
                      int64_t rank_batch) {
  // A smaller device.memory_limit is the network's to refuse when it
  // reserves its pool (naming the allocation that does not fit): with vDNN
  // what a step needs depends on the memory policy.
  if (!machine.device_is_host || machine.memory_bytes == 0) return;
  const double memory = static_cast<double>(machine.memory_bytes);
  const std::string memory_source = "this machine's memory";
  double parameters = 0, largest_layer = 0, largest_output = 0;
  int largest_layer_at = 0, largest_output_at = 0;
  for (int i = 0; i < graph.size(); ++i) {
    const double p = layer_parameters(graph, i);
    parameters += p;
    if (p > largest_layer) std::tie(largest_layer, largest_layer_at) = std::pair(p, i);
    const double o = per_sample(graph.output_shape(i));
    if (o > largest_output) std::tie(largest_output, largest_output_at) = std::pair(o, i);
  }
  // Parameters and their gradients live on the device for the whole run,
  // with a half copy of the parameters under a half precision; activations
  // take the precision's element size.
  const common::Precision precision = config.compute.precision;
  const auto activation_bytes =
      static_cast<double>(common::element_bytes(common::storage_type(precision)));
  const double parameter_bytes =
      (2 * kFloatBytes + (common::is_half(precision) ? activation_bytes : 0)) * parameters;
  if (parameter_bytes > memory) {
    const worker::LayerSpec& layer = graph.layer(largest_layer_at);
    fail_model(config, graph.output_shape(0), layer.name,
               "the model's parameters and their gradients need " + bytes_text(parameter_bytes) +
                   " (this layer alone has " + bytes_text(kFloatBytes * largest_layer) +
                   " of weights), more than the " + bytes_text(memory) + " of " + memory_source);
  }
  const double batch_bytes =
      activation_bytes * largest_output * static_cast<double>(rank_batch) + parameter_bytes;
  if (batch_bytes > memory) {
    fail_at(config, "train.batch",
            "a batch of " + std::to_string(rank_batch) + " on one rank needs at least " +
                bytes_text(batch_bytes) + " (the output of layer '" +
                graph.layer(largest_output_at).name + "', " +
                chw(graph.output_shape(largest_output_at)) +
                " floats per sample, with the parameters and their gradients), more than the " +
                bytes_text(memory) + " of " + memory_source);
  }
}

void check_backend(const Config& config, const worker::Graph& graph, worker::Backend& backend,
                   int64_t rank_batch) {
  const common::ComputeSettings settings = compute_settings(config);
  if (const auto why = backend.precision_unavailable(settings.precision)) {
    fail_at(config, "train.precision", *why + "; " + offers_text(backend));
  }
  if (const auto why = worker::conv_algorithm_refusal(graph, settings, backend,
                                                      config.conv.algorithm, rank_batch)) {
    fail_at(config, "conv.algorithm", *why);
  }
}

}  // namespace vtrain::config
