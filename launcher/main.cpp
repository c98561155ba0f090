// The `vtrain` executable: parses the command line, loads the config and
// data, builds the model, and runs the requested phase.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "configs/config.h"
#include "launcher/cli.h"
#include "worker/backend.h"
#include "worker/data.h"
#include "worker/graph.h"
#include "worker/trainer.h"

namespace vtrain::launcher {
namespace {

using config::Config;

constexpr const char* kVersion = "0.1.0";

struct Datasets {
  worker::Dataset train;
  worker::Dataset test;
};

worker::Dataset take(const worker::Dataset& all, int64_t first, int64_t count) {
  worker::Dataset part;
  part.sample = all.sample;
  part.classes = all.classes;
  part.count = count;
  const int64_t per = all.sample.per_sample();
  part.pixels.assign(all.pixels.begin() + first * per, all.pixels.begin() + (first + count) * per);
  part.labels.assign(all.labels.begin() + first, all.labels.begin() + first + count);
  return part;
}

Datasets load_data(const Config& cfg) {
  const config::DataConfig& d = cfg.data;
  if (d.kind == "idx") {
    return {worker::load_idx(d.train_images, d.train_labels),
            worker::load_idx(d.test_images, d.test_labels)};
  }
  if (d.kind == "cifar10") {
    return {worker::load_cifar10(d.train_files), worker::load_cifar10(d.test_files)};
  }
  // Synthetic: one draw split in two, so test samples are new samples of
  // the same classes.
  const worker::Dataset all =
      worker::make_synthetic(d.shape, d.classes, d.train_size + d.test_size, cfg.train.seed);
  return {take(all, 0, d.train_size), take(all, d.train_size, d.test_size)};
}

worker::Graph build_graph(const Config& cfg, const worker::Shape& sample) {
  std::vector<worker::LayerSpec> layers = cfg.model.layers;
  if (!cfg.model.preset.empty()) {
    layers = worker::preset_layers(cfg.model.preset, {sample, cfg.model.classes});
  }
  return worker::Graph::build(std::move(layers), sample);
}

worker::ChannelStats normalisation(const Config& cfg, const worker::Dataset& train) {
  if (cfg.data.mean.empty()) return worker::channel_stats(train);
  if (static_cast<int64_t>(cfg.data.mean.size()) != train.sample.c) {
    throw config::ConfigError(cfg.path + ": data.mean: has " + std::to_string(cfg.data.mean.size()) +
                              " values but the data has " + std::to_string(train.sample.c) +
                              " channels");
  }
  return {cfg.data.mean, cfg.data.stddev};
}

Config load(const CliArgs& cli) {
  std::vector<std::string> overrides = cli.overrides;
  if (!cli.metrics.empty()) overrides.push_back("output.metrics=" + cli.metrics);
  if (!cli.progress.empty()) overrides.push_back("output.progress=" + cli.progress);
  return config::load_config(cli.config, overrides);
}

worker::BackendOptions backend_options(const Config& cfg) {
  return {.kind = cfg.device.backend,
          .threads = cfg.device.threads,
          .memory_limit = static_cast<size_t>(cfg.device.memory_limit)};
}

void print_device(const worker::DeviceInfo& info) {
  std::printf("device: %s backend, %s, %d thread%s, %s, memory %.1f GiB, host %s\n",
              info.backend.c_str(), info.name.c_str(), info.threads, info.threads == 1 ? "" : "s",
              info.library_version.c_str(),
              static_cast<double>(info.memory_bytes) / (1ull << 30), info.host.c_str());
}

int run_check(const CliArgs& cli) {
  const Config cfg = load(cli);
  const Datasets data = load_data(cfg);
  const worker::Graph graph = build_graph(cfg, data.train.sample);
  std::printf("config %s is valid\n", cfg.path.c_str());
  std::printf("data: %lld train, %lld test samples of %s, %lld classes\n",
              static_cast<long long>(data.train.count), static_cast<long long>(data.test.count),
              data.train.sample.str().c_str(), static_cast<long long>(data.train.classes));
  std::printf("model: %d layers, %lld parameters\n", graph.size(),
              static_cast<long long>(graph.parameter_count()));
  for (int i = 0; i < graph.size(); ++i) {
    const worker::LayerSpec& l = graph.layer(i);
    std::string inputs;
    for (int in : graph.inputs(i)) inputs += (inputs.empty() ? "" : ",") + graph.layer(in).name;
    std::printf("  %-16s %-9s %-18s <- %s\n", l.name.c_str(), worker::layer_type_name(l.type),
                graph.output_shape(i).str().c_str(), inputs.c_str());
  }
  std::printf("effective config:\n%s\n", config::to_yaml(cfg).c_str());
  return kExitOk;
}

int run_train(const CliArgs& cli) {
  const Config cfg = load(cli);
  const Datasets data = load_data(cfg);
  const worker::Graph graph = build_graph(cfg, data.train.sample);
  const worker::ChannelStats norm = normalisation(cfg, data.train);
  auto backend = worker::make_backend(backend_options(cfg));

  std::printf("vtrain %s: %s\n", kVersion, cfg.path.c_str());
  print_device(backend->device_info());
  std::printf("data: %s, %lld train / %lld test samples of %s\n", cfg.data.kind.c_str(),
              static_cast<long long>(data.train.count), static_cast<long long>(data.test.count),
              data.train.sample.str().c_str());

  worker::TrainerOptions options;
  options.batch = cfg.train.batch;
  options.epochs = cfg.train.epochs;
  options.max_steps = cfg.train.max_steps;
  options.seed = cfg.train.seed;
  options.log_every = cfg.train.log_every;
  options.evaluate = cfg.train.evaluate;
  options.schedule.base_lr = cfg.optimizer.lr;
  options.schedule.kind = cfg.optimizer.schedule;
  options.schedule.step_epochs = cfg.optimizer.step_epochs;
  options.schedule.gamma = cfg.optimizer.gamma;
  options.schedule.warmup_steps = cfg.optimizer.warmup_steps;
  options.momentum = static_cast<float>(cfg.optimizer.momentum);
  options.weight_decay = static_cast<float>(cfg.optimizer.weight_decay);
  options.conv_algorithm = cfg.conv.algorithm;
  options.metrics_path = cfg.output.metrics;
  options.progress = worker::Progress::parse_mode(cfg.output.progress);
  worker::train(graph, *backend, data.train, data.test, norm, options);
  return kExitOk;
}

int run(const std::vector<std::string>& args) {
  try {
    const CliArgs cli = parse_cli(args);
    if (cli.command == "help") {
      std::fputs(help_text(cli.help_topic).c_str(), stdout);
      return kExitOk;
    }
    if (cli.command == "version") {
      std::printf("vtrain %s\n", kVersion);
      return kExitOk;
    }
    if (cli.command == "check") return run_check(cli);
    return run_train(cli);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "vtrain: usage error: %s\n(run `vtrain --help` for usage)\n", e.what());
    return kExitUsage;
  } catch (const config::ConfigError& e) {
    std::fprintf(stderr, "vtrain: config error: %s\n", e.what());
    return kExitUsage;
  } catch (const worker::GraphError& e) {
    std::fprintf(stderr, "vtrain: model error: %s\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "vtrain: error: %s\n", e.what());
    return kExitFailure;
  }
}

}  // namespace
}  // namespace vtrain::launcher

int main(int argc, char** argv) {
  return vtrain::launcher::run(std::vector<std::string>(argv + 1, argv + argc));
}
