// The `vtrain` executable: parses the command line, loads the config and
// data, builds the model, and runs the requested phase.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <filesystem>
#include <optional>
#include <tuple>
#include <utility>
#include <string>
#include <vector>

#include "common/machine.h"
#include "common/text.h"
#include "configs/config.h"
#include "configs/config_limits.h"
#include "configs/rank_precision.h"
#include "launcher/cli.h"
#include "launcher/data_command.h"
#include "launcher/db_command.h"
#include "launcher/evaluate_command.h"
#include "launcher/export_command.h"
#include "launcher/job_plan.h"
#include "launcher/part_options.h"
#include "launcher/stop_signals.h"
#include "worker/train/input_rate.h"
#include "memory/planner.h"
#include "model_io/initial_weights.h"
#include "worker/engine/parameter_layout.h"
#include "model_io/weights_export.h"
#include "perfdb/perf_db.h"
#include "worker/device/backend.h"
#include "worker/comm/communicator.h"
#include "worker/comm/device_infos.h"
#include "worker/comm/peer_probe.h"
#include "worker/data/data.h"
#include "worker/data/image_files.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/profile/planning.h"
#include "worker/profile/profiler.h"
#include "worker/train/failure_injection.h"
#include "worker/train/step_watch.h"
#include "worker/train/trainer.h"

namespace vtrain::launcher {
namespace {

using config::Config;

// The version is written once, in CMakeLists.txt (project VERSION).
constexpr const char* kVersion = VTRAIN_VERSION;

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

// Image folders and shards: the sample lists (files skipped, if any, said once per rank).
Datasets open_image_files(const config::DataConfig& d) {
  if (d.kind == worker::DataKind::kShards) {
    return {worker::open_shards(d.train_shards, d.shape), worker::open_shards(d.test_shards, d.shape)};
  }
  int64_t skipped_train = 0, skipped_test = 0;
  Datasets data{worker::open_image_folder({d.train_dir, d.train_list, d.skip_unreadable}, d.shape, &skipped_train),
                worker::open_image_folder({d.test_dir, d.test_list, d.skip_unreadable}, d.shape, &skipped_test)};
  if (skipped_train + skipped_test > 0) {
    std::printf("data: skipped %lld training and %lld test files that are not JPEG or PNG\n",
                static_cast<long long>(skipped_train), static_cast<long long>(skipped_test));
  }
  return data;
}

Datasets load_stored_data(const Config& cfg) {
  const config::DataConfig& d = cfg.data;
  if (d.kind == worker::DataKind::kImageFolder || d.kind == worker::DataKind::kShards) {
    return open_image_files(d);
  }
  if (d.kind == worker::DataKind::kIdx) {
    return {worker::load_idx(d.train_images, d.train_labels),
            worker::load_idx(d.test_images, d.test_labels)};
  }
  if (d.kind == worker::DataKind::kCifar10) {
    return {worker::load_cifar10(d.train_files), worker::load_cifar10(d.test_files)};
  }
  // Synthetic: one draw split in two, so test samples are new samples of
  // the same classes.
  const worker::Dataset all =
      worker::make_synthetic(d.shape, d.classes, d.train_size + d.test_size, cfg.train.seed);
  return {take(all, 0, d.train_size), take(all, d.train_size, d.test_size)};
}

// The weights a run started afresh begins from, read and checked whole:
// model.init's file, else model.onnx's initializers (checked against the
// graph when the config was read); nothing when the config sets neither.
// An unknown model.init_skip layer is a config error.
std::function<worker::InitialWeights()> initial_weights(const Config& cfg,
                                                        const worker::Graph& graph) {
  if (cfg.model.init.empty() && !cfg.model.initial_weights.empty()) {
    worker::FlatWeights flat =
        worker::flatten_weights(graph, cfg.model.initial_weights, "model.onnx " + cfg.model.onnx);
    auto shared = std::make_shared<worker::FlatWeights>(std::move(flat));
    return [shared, &cfg] {
      return worker::InitialWeights{{{0, shared->parameters}}, {{0, shared->buffers}},
                                    "model.onnx: the initializers of " + cfg.model.onnx};
    };
  }
  if (cfg.model.init.empty()) return nullptr;
  std::vector<int> skip;
  try {
    skip = model_io::skipped_layers(graph, cfg.model.preset, cfg.model.init_skip);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(cfg.path + ": model.init_skip: " + e.what());
  }
  return [&cfg, &graph, skip] {
    return model_io::read_initial_weights(cfg.model.init, graph, cfg.model.preset, skip);
  };
}

// data.workers (this rank's entry of a per-rank list), or its default for
// this rank's device and the ranks sharing its host
// (worker::default_decode_workers). A list whose length is not the rank
// count is a config error.
int data_workers(const Config& cfg, const std::vector<worker::DeviceInfo>& cluster, int rank) {
  int64_t asked = cfg.data.workers;
  if (const std::vector<int64_t>& per_rank = cfg.data.workers_per_rank; !per_rank.empty()) {
    if (per_rank.size() != cluster.size()) {
      throw config::ConfigError(cfg.path + ": data.workers: has " + std::to_string(per_rank.size()) +
                                " per-rank values but the job has " + std::to_string(cluster.size()) +
                                " ranks");
    }
    asked = per_rank[static_cast<size_t>(rank)];
  }
  if (asked > 0) return static_cast<int>(asked);
  const worker::DeviceInfo& mine = cluster[static_cast<size_t>(rank)];
  const auto on_host = std::count_if(cluster.begin(), cluster.end(),
                                     [&](const worker::DeviceInfo& d) { return d.host == mine.host; });
  return worker::default_decode_workers(mine.backend == "cpu", common::hardware_threads(), mine.threads,
                                        static_cast<int>(on_host));
}

// The data with the config's transforms.
Datasets load_data(const Config& cfg) {
  Datasets data = load_stored_data(cfg);
  data.train.transform = cfg.data.train_transform;
  data.test.transform = cfg.data.test_transform;
  return data;
}

// This machine, for the config checks: its backend runs on the host unless
// it is (or `auto` finds) a GPU.
config::Machine this_machine(const Config& cfg) {
  const bool host = cfg.device.backend == worker::BackendKind::kCpu ||
                    (cfg.device.backend == worker::BackendKind::kAuto && !worker::gpu_available());
  return {common::hardware_threads(), common::usable_memory_bytes(), host};
}

// The largest batch one of `ranks` ranks trains on: the most of
// balance.manual, else the larger share of an even split.
int64_t largest_rank_batch(const Config& cfg, int ranks) {
  if (!cfg.balance.manual.empty()) {
    return *std::max_element(cfg.balance.manual.begin(), cfg.balance.manual.end());
  }
  return (cfg.train.batch + ranks - 1) / ranks;
}

// The model for the data, built and checked as config_limits.h describes
// (what check refuses, training would); every label of the data must be one
// of its classes (checked here, before any work, naming the label file).
// Synthetic labels are drawn below data.classes, so there a model with
// fewer classes is the model's fault, named as such before the labels.
worker::Graph build_graph(const Config& cfg, const Datasets& data, int ranks) {
  worker::Graph graph = config::build_model(cfg, data.train.sample);
  const auto check_output = [&] {
    config::check_model_output(cfg, graph, data.train.sample, data.train.classes);
  };
  if (cfg.data.kind == worker::DataKind::kSynthetic) check_output();
  worker::check_labels(data.train, graph.classes());
  worker::check_labels(data.test, graph.classes());
  check_output();
  config::check_model_fits(cfg, graph, this_machine(cfg), largest_rank_batch(cfg, ranks));
  return graph;
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
  if (!cli.db.empty()) overrides.push_back("profile.db=" + cli.db);
  Config cfg = config::load_config(cli.config, overrides);
  // Before the data is loaded: a dataset too big for the memory is refused
  // here, not by std::bad_alloc.
  config::check_machine(cfg, this_machine(cfg));
  return cfg;
}

// `cfg` with this rank's train.precision, decided on its device
// (configs/rank_precision.h) where it is not one precision for every rank
// (that one check_backend checks): a device asked for a precision it lacks
// is a config error naming it and what it offers.
Config for_rank(Config cfg, int rank, int ranks) {
  if (cfg.train.precision_choice.form == config::PrecisionChoice::Form::kOne) return cfg;
  const auto probe = worker::make_backend(backend_options(cfg));
  return config::with_rank_precision(cfg, config::rank_precision(cfg, rank, ranks, *probe));
}

// The network training would build on this device for the largest rank
// batch (the batch check counts), so that what training refuses for memory
// check refuses alike: a capacity no schedule fits throws the planner's
// OutOfMemoryError (the tensor, the device.memory_limit that fits). Under
// a vDNN policy the convolutions go untimed (whether memory fits is
// decided on their least workspaces, as in training) and the reservation
// is printed; under a per-tensor policy, the plan training would run, its
// costs from the perf DB when it holds them for this device and batch,
// else measured in place.
void print_memory_plan(const Config& cfg, const worker::Graph& graph, int ranks,
                       worker::Backend& backend) {
  const int64_t batch = largest_rank_batch(cfg, ranks);
  worker::NetworkOptions options = network_options(cfg, batch, ranks);
  options.prefetch_input = input_staging(cfg, graph, backend, batch);  // data.prefetch
  const bool per_tensor = memory::plans_per_tensor(cfg.memory.policy);
  options.time_convolutions = per_tensor;
  PlanningCosts costs = planning_costs(cfg, graph, backend, options);
  if (costs.costs) options.memory_costs = std::move(*costs.costs);
  const worker::Network network(graph, backend, options);
  const worker::MemoryStats stats = network.memory_stats();
  if (!per_tensor) {
    std::printf("memory: batch %lld (one of %d rank%s) on %s, capacity %s; memory.policy %s "
                "reserves %s\n",
                static_cast<long long>(batch), ranks, ranks == 1 ? "" : "s",
                backend.device_info().name.c_str(),
                common::format_bytes_fixed(stats.capacity).c_str(), stats.policy.c_str(),
                common::format_bytes_fixed(stats.reservation).c_str());
    return;
  }
  const memory::MemoryPlan* plan = network.memory_plan();
  if (plan == nullptr) {
    throw std::logic_error(std::string("memory.policy ") + memory::policy_name(cfg.memory.policy) +
                           ": the network made no per-tensor plan");
  }
  std::printf("memory: batch %lld (one of %d rank%s) on %s, capacity %s; costs %s\n%s",
              static_cast<long long>(batch), ranks, ranks == 1 ? "" : "s",
              backend.device_info().name.c_str(),
              common::format_bytes_fixed(stats.capacity).c_str(),
              costs.source.c_str(), memory::plan_report(network.memory_model(), *plan).c_str());
}

// `vtrain check --ranks N`, or as many ranks as balance.manual has
// entries, else 1; a --ranks other than balance.manual's count is a usage
// error.
int check_ranks(const CliArgs& cli, const Config& cfg) {
  const int manual = static_cast<int>(cfg.balance.manual.size());
  if (cli.ranks > 0 && manual > 0 && cli.ranks != manual &&
      cfg.balance.split == balancer::SplitMode::kManual) {
    throw UsageError("--ranks " + std::to_string(cli.ranks) + ": " + cfg.path +
                     " splits the batch over " + std::to_string(manual) +
                     " ranks (balance.manual)");
  }
  if (cli.ranks > 0) return cli.ranks;
  if (manual > 0) return manual;
  const config::PrecisionChoice& precision = cfg.train.precision_choice;
  if (precision.form == config::PrecisionChoice::Form::kPerRank) {
    return static_cast<int>(precision.per_rank.size());
  }
  return 1;
}

// `vtrain check`: this machine stands for every rank, so every entry of a
// per-rank train.precision must be one its device offers.
Config checked_precisions(Config cfg, int ranks) {
  if (cfg.train.precision_choice.form == config::PrecisionChoice::Form::kOne) return cfg;
  const auto probe = worker::make_backend(backend_options(cfg));
  return config::with_rank_precision(cfg, config::check_precisions(cfg, ranks, *probe));
}

int run_check(const CliArgs& cli) {
  const Config loaded = load(cli);
  const int ranks = check_ranks(cli, loaded);
  const Config cfg = checked_precisions(loaded, ranks);
  const Datasets data = load_data(cfg);
  const worker::Graph graph = build_graph(cfg, data, ranks);
  const auto init = initial_weights(cfg, graph);  // read once the rest is checked
  std::printf("config %s is valid\n", cfg.path.c_str());
  std::printf("data: %lld train, %lld test samples of %s, %lld classes\n",
              static_cast<long long>(data.train.count), static_cast<long long>(data.test.count),
              data.train.sample.str().c_str(), static_cast<long long>(data.train.classes));
  std::printf("model: %d layers, %lld parameters, %s\n", graph.size(),
              static_cast<long long>(graph.parameter_count()),
              common::precision_name(cfg.compute.precision));
  for (int i = 0; i < graph.size(); ++i) {
    const worker::LayerSpec& l = graph.layer(i);
    std::string inputs;
    for (int in : graph.inputs(i)) inputs += (inputs.empty() ? "" : ",") + graph.layer(in).name;
    std::printf("  %-16s %-9s %-18s <- %s\n", l.name.c_str(), worker::layer_type_name(l.type),
                graph.output_shape(i).str().c_str(), inputs.c_str());
  }
  const auto backend = worker::make_backend(backend_options(cfg));
  config::check_backend(cfg, graph, *backend, largest_rank_batch(cfg, ranks));
  const worker::DeviceInfo device = backend->device_info();
  std::printf("device: %s %s, %d thread%s, %s of memory, %s\n", device.backend.c_str(),
              device.name.c_str(), device.threads, device.threads == 1 ? "" : "s",
              common::format_bytes(device.memory_bytes).c_str(), device.library_version.c_str());
  std::vector<worker::Layout> used;  // the activations' layouts, in layer order
  for (const worker::TensorDesc& d :
       worker::activation_descs(graph, config::compute_settings(cfg), *backend, 1)) {
    if (std::find(used.begin(), used.end(), d.layout) == used.end()) used.push_back(d.layout);
  }
  std::string layouts;
  for (worker::Layout l : used) layouts += (layouts.empty() ? "" : ", ") + std::string(worker::layout_name(l));
  std::printf("activation layouts: %s (device.layout %s)\n", layouts.c_str(),
              common::name_of(worker::kLayoutChoiceNames, cfg.compute.layout));
  print_memory_plan(cfg, graph, ranks, *backend);
  if (init) std::printf("%s\n", init().note.c_str());
  std::printf("effective config:\n%s\n", config::to_yaml(cfg).c_str());
  return kExitOk;
}

// Rank 0 prints one line per rank: what each device is and the precision
// it computes in.
void print_cluster(const worker::Communicator& comm, const std::vector<worker::DeviceInfo>& all,
                   const std::vector<common::Precision>& precisions,
                   const std::vector<int64_t>& split) {
  if (comm.rank() != 0) return;
  std::printf("cluster: %d rank%s\n", comm.size(), comm.size() == 1 ? "" : "s");
  std::printf("  %-4s %-7s %-9s %-6s %-9s %-7s %-14s %-12s %s\n", "rank", "backend", "precision",
              "batch", "memory", "threads", "library", "host", "device");
  for (size_t r = 0; r < all.size(); ++r) {
    const worker::DeviceInfo& d = all[r];
    std::printf("  %-4zu %-7s %-9s %-6lld %-9s %-7d %-14s %-12s %s\n", r, d.backend.c_str(),
                common::precision_name(precisions[r]), static_cast<long long>(split[r]),
                (std::to_string(d.memory_bytes >> 20) + "MiB").c_str(), d.threads,
                d.library_version.c_str(), d.host.c_str(), d.name.c_str());
  }
}

// The bound on a step of a job of several ranks (train.step_timeout): a
// rank that waits longer says which ranks do not answer and ends the job.
struct WatchedSteps {
  std::unique_ptr<worker::PeerProbe> probe;  // outlives the watch
  std::unique_ptr<worker::StepWatch> watch;
};

WatchedSteps watch_steps(const Config& cfg, worker::Communicator& comm,
                         const std::vector<worker::DeviceInfo>& cluster) {
  WatchedSteps w;
  if (comm.size() == 1 || cfg.train.step_timeout <= 0) return w;
  w.probe = worker::make_mpi_peer_probe();  // collective
  worker::StepWatchOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.train.step_timeout * 1000));
  w.watch = std::make_unique<worker::StepWatch>(
      options, w.probe.get(),
      [&cluster](int r) {
        return common::format("rank %d (host %s)", r, cluster.at(r).host.c_str());
      },
      [&comm](const std::string& message) {
        std::fflush(stdout);
        std::fprintf(stderr, "[rank %d] error: %s\n", comm.rank(), message.c_str());
        std::fflush(stderr);
        comm.abort(kExitFailure);
      });
  return w;
}

int run_train(const CliArgs& cli, worker::Communicator& comm,
              const std::atomic<int>& stop_signal) {
  const Config cfg = for_rank(load(cli), comm.rank(), comm.size());
  if (cli.resume && cfg.checkpoint.dir.empty()) {
    throw UsageError("--resume: " + cfg.path + " sets no checkpoint.dir to resume from (set one "
                     "there or with --set checkpoint.dir=DIR)");
  }
  const Datasets data = load_data(cfg);
  const worker::Graph graph = build_graph(cfg, data, comm.size());
  const worker::ChannelStats norm = normalisation(cfg, data.train);
  std::vector<int64_t> split = balancer::even_split(cfg.train.batch, comm.size());
  if (cfg.balance.split == balancer::SplitMode::kManual) {
    if (static_cast<int>(cfg.balance.manual.size()) != comm.size()) {
      throw config::ConfigError(cfg.path + ": balance.manual: has " +
                                std::to_string(cfg.balance.manual.size()) +
                                " per-rank batches but the job has " +
                                std::to_string(comm.size()) + " ranks");
    }
    split = cfg.balance.manual;
  }
  auto backend = worker::make_backend(backend_options(cfg));
  config::check_backend(cfg, graph, *backend, largest_rank_batch(cfg, comm.size()));
  const std::vector<worker::DeviceInfo> cluster =
      worker::gather_device_infos(comm, backend->device_info());
  const std::vector<common::Precision> precisions =
      worker::gather_precisions(comm, cfg.compute.precision);
  // Gradients go over NCCL when several ranks train on GPUs, else over MPI.
  std::string comm_note;
  const auto gradient_comm = worker::make_gradient_communicator(*backend, cluster, &comm_note);
  // Synchronised batch norm's sums, on host memory, in forward and backward.
  const auto batch_norm_comm = cfg.model.batch_norm == worker::BatchNormMode::kSync &&
                                       comm.size() > 1
                                   ? worker::make_separate_mpi_communicator()
                                   : nullptr;

  if (comm.rank() == 0) {
    std::printf("vtrain %s: %s\n", kVersion, cfg.path.c_str());
    std::printf("data: %s, %lld train / %lld test samples of %s\n",
                worker::data_kind_name(cfg.data.kind),
                static_cast<long long>(data.train.count), static_cast<long long>(data.test.count),
                data.train.sample.str().c_str());
    if (!comm_note.empty()) std::printf("%s\n", comm_note.c_str());
  }
  std::fflush(stdout);
  SplitProblem solved_on;  // rank 0, auto split: for re-balancing
  // The input as training will make it (the decoding pool of data.workers
  // threads, the training transform); its rate (and a throttle's) goes
  // into the split.
  const int workers = data_workers(cfg, cluster, comm.rank());
  worker::GatherRateSource gather_rate(data.train, norm, workers, cfg.train.seed);
  const RankInput input{&gather_rate, input_key(cfg, data.train.sample),
                        worker::input_rate_limit_from_environment(comm.rank())};
  const std::optional<balancer::TrainingPlan> plan = job_plan(cli, cfg, graph, *backend, comm, *gradient_comm, cluster, precisions, split,
               &solved_on, input);
  if (plan) {
    split.clear();
    for (const balancer::RankPlan& r : plan->ranks) split.push_back(r.batch);
  }
  print_cluster(comm, cluster, precisions, split);
  std::fflush(stdout);

  worker::TrainerContext context{
      .comm = gradient_comm.get(),
      .split = split,
      .batch_norm_comm = batch_norm_comm.get(),
      .rank_precisions = precisions,
      .rebalance_profiles = std::move(solved_on.profiles),
      .rebalance_split_options = solved_on.options,
      .memory_costs_at = [&cfg, &graph, &backend,
                          rank = comm.rank()](const worker::NetworkOptions& net) {
        PlanningCosts costs = planning_costs(cfg, graph, *backend, net);
        if (rank == 0 && costs.costs) {
          std::printf("memory: planning batch %lld with costs %s\n",
                      static_cast<long long>(net.max_batch), costs.source.c_str());
        }
        return costs.costs;
      },
      .trace_path = cli.trace,
      .input_rate_limit = input.limit,
      .data_workers = workers,
      .run_settings = config::run_settings(cfg, data.train),
      .initial_weights = initial_weights(cfg, graph),
      .stop_signal = &stop_signal};
  if (plan) {
    const balancer::RankPlan& mine = plan->ranks[comm.rank()];
    context.conv_plan = {worker::conv_executions(mine), mine.workspace_bytes};
    // Only an auto split re-balances (every rank decides alike: the call is
    // collective).
    if (cfg.balance.split == balancer::SplitMode::kAuto) {
      context.replan_kernels = [&cfg, &graph, &backend, &comm,
                                &solved_on](const worker::SplitSwitch& to) {
        return replan_kernels(cfg, graph, *backend, comm, solved_on, to);
      };
    }
  }
  // A testing aid (VTRAIN_FAIL_* in the environment, see the header).
  std::optional<worker::FailureInjection> injected_failure =
      worker::FailureInjection::from_environment(comm.rank());
  std::optional<worker::SlowdownInjection> injected_slowdown =
      worker::SlowdownInjection::from_environment(comm.rank());
  worker::ObserverList observers;
  if (injected_failure) observers.add(&*injected_failure);
  if (injected_slowdown) observers.add(&*injected_slowdown);
  const WatchedSteps watch = watch_steps(cfg, comm, cluster);
  if (watch.watch) observers.add(watch.watch.get());
  if (!observers.empty()) context.observer = &observers;
  const worker::TrainResult result = worker::train(graph, *backend, data.train, data.test, norm,
                                                   trainer_options(cfg, cli.resume), context);
  if (result.stopped_by_signal != 0) {
    // Every rank decides alike: only rank 0 writes (and knows) the checkpoint.
    if (cfg.checkpoint.dir.empty()) {
      if (comm.rank() == 0) {
        std::printf("vtrain: stopped by a signal without a checkpoint (no checkpoint.dir set), "
                    "nothing to resume; exit code %d\n", kExitStoppedUnsaved);
      }
      return kExitStoppedUnsaved;
    }
    if (comm.rank() == 0) {
      std::printf("vtrain: stopped by a signal after checkpointing %s; exit code %d (requeue to "
                  "resume)\n",
                  result.last_checkpoint.c_str(), kExitStopped);
    }
    return kExitStopped;
  }
  return kExitOk;
}

int run_profile(const CliArgs& cli, worker::Communicator& comm) {
  const Config cfg = for_rank(load(cli), comm.rank(), comm.size());
  const Datasets data = load_data(cfg);
  const worker::Graph graph = build_graph(cfg, data, comm.size());
  auto backend = worker::make_backend(backend_options(cfg));
  config::check_backend(cfg, graph, *backend, largest_rank_batch(cfg, comm.size()));
  const worker::DeviceInfo info = backend->device_info();
  const std::vector<worker::DeviceInfo> cluster = worker::gather_device_infos(comm, info);
  print_cluster(comm, cluster, worker::gather_precisions(comm, cfg.compute.precision),
                balancer::even_split(cfg.train.batch, comm.size()));

  worker::ProfileOptions options = profile_options(cfg, graph, *backend);
  if (options.batches.empty()) {
    options.batches = {(cfg.train.batch + comm.size() - 1) / comm.size()};
  }
  const ProfileGroup group = profile_group(comm, cluster);
  options.peers = group.peers;
  const std::string share =
      options.peers.together
          ? "together, " + std::to_string(options.peers.index + 1) + " of " +
                std::to_string(options.peers.count)
          : "share " + std::to_string(options.peers.index + 1) + "/" +
                std::to_string(options.peers.count);

  perfdb::PerfDb db(cfg.profile.db);
  const perfdb::DeviceId device = db.upsert_device(worker::perfdb_device(info));
  const worker::ProfileReport r = worker::profile(graph, *backend, db, device, options);
  // The input's rate too, for a split that prices it (balance.input_aware).
  const worker::ChannelStats norm = normalisation(cfg, data.train);
  worker::GatherRateSource gather_rate(data.train, norm, data_workers(cfg, cluster, comm.rank()),
                                       cfg.train.seed);
  const double input_rate =
      stored_input_rate_in_turn(db, info, {&gather_rate, input_key(cfg, data.train.sample), std::nullopt},
                                options.batches.front(), cluster, comm)
          .images_per_second;
  char line[512];
  std::snprintf(line, sizeof line,
                "rank %d (%s, %s): %lld kernel items measured, %lld cached; %lld steps "
                "measured%s, %lld cached; layer times at %lld batches measured, %lld cached; copy "
                "bandwidth %s; input %.0f images/s; %.1f s",
                comm.rank(), info.name.c_str(), share.c_str(),
                static_cast<long long>(r.kernel_measured), static_cast<long long>(r.kernel_cached),
                static_cast<long long>(r.step_measured), worker::copied_ahead_note(r).c_str(),
                static_cast<long long>(r.step_cached),
                static_cast<long long>(r.layer_costs_measured),
                static_cast<long long>(r.layer_costs_cached),
                r.copy_measured > 0  ? "measured"
                : r.copy_cached > 0 ? "cached"
                                    : "another share's",
                input_rate, r.seconds);
  std::string text = line;
  if (!r.algorithms_refused.empty()) {
    text += "; " + std::to_string(r.algorithms_refused.size()) +
            " algorithm(s) refused to run and are left out: " +
            common::join(r.algorithms_refused, "; ");
  }
  if (!r.step_infeasible.empty()) {
    text += "; no step under memory.policy ";
    text += memory::policy_name(options.memory_policy);
    text += " fits batch " + balancer::join_batches(r.step_infeasible, ' ');
  }
  const std::vector<std::string> lines = comm.gather(text, 0);
  comm.barrier();
  if (comm.rank() == 0) {
    std::printf("profile: %s, micro-batches %s, batches", cfg.profile.db.c_str(),
                balancer::micro_batch_policy_name(cfg.profile.micro_batches));
    for (int64_t b : options.batches) std::printf(" %lld", static_cast<long long>(b));
    std::printf("\n");
    for (const std::string& l : lines) std::printf("  %s\n", l.c_str());
  }
  return kExitOk;
}

// evaluate and predict: the config, data and model as training makes them.
TrainedModelSetup trained_model_setup(const CliArgs& cli, int ranks) {
  Config cfg = load(cli);
  Datasets data = load_data(cfg);
  worker::Graph graph = build_graph(cfg, data, ranks);
  worker::ChannelStats norm = normalisation(cfg, data.train);
  return {std::move(cfg), std::move(data.train), std::move(data.test), std::move(graph),
          std::move(norm)};
}

// Prints an error the way every rank of a job does, then ends the job: with
// several ranks one failing rank aborts them all, so none is left waiting.
int fail(const char* kind, const char* what, int code, int rank, int ranks) {
  std::fflush(stdout);
  if (ranks > 1) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", rank, kind, what);
    std::fflush(stderr);
    worker::abort_job_if_parallel(code);
  } else {
    std::fprintf(stderr, "vtrain: %s: %s\n", kind, what);
  }
  return code;
}

int run(int argc, char** argv) {
  CliArgs cli;
  try {
    cli = parse_cli(std::vector<std::string>(argv + 1, argv + argc));
    if (cli.command == "help") {
      std::fputs(help_text(cli.help_topic).c_str(), stdout);
      return kExitOk;
    }
    if (cli.command == "version") {
      std::printf("vtrain %s\n", kVersion);
      return kExitOk;
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "vtrain: usage error: %s\n(run `vtrain --help` for usage)\n", e.what());
    return kExitUsage;
  }

  int rank = 0, ranks = 1;
  std::optional<worker::MpiRuntime> mpi;
  // Before MPI and every other library start their threads (see the class).
  std::optional<StopSignalWatcher> stop_signals;
  if (cli.command == "train") stop_signals.emplace();
  if (cli.command == "train" || cli.command == "profile" || cli.command == "evaluate") {
    try {
      mpi.emplace(&argc, &argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vtrain: error: %s\n", e.what());
      return kExitFailure;
    }
    rank = mpi->rank();
    ranks = mpi->size();
  }
  try {
    if (cli.command == "check") return run_check(cli);
    if (cli.command == "db") return run_db(cli);
    if (cli.command == "export") {
      const Config cfg = load(cli);
      const Datasets data = load_data(cfg);
      return run_export(cli, build_graph(cfg, data, 1), normalisation(cfg, data.train),
                        cfg.model.preset);
    }
    if (cli.command == "data") {
      const Config cfg = load(cli);
      const Datasets data = load_data(cfg);
      // The pipeline alone: every core unless told otherwise.
      const int workers = cli.workers > 0             ? cli.workers
                          : cfg.data.workers > 0      ? static_cast<int>(cfg.data.workers)
                                                      : common::hardware_threads();
      return run_data(cli, cli.split == "test" ? data.test : data.train,
                      cli.batch > 0 ? cli.batch : cfg.train.batch, workers);
    }
    if (cli.command == "balance") {
      const Config cfg = load(cli);
      const Datasets data = load_data(cfg);
      return run_balance(cli, cfg, build_graph(cfg, data, 1), worker::input_transform(data.train));
    }
    if (cli.command == "predict") return run_predict(cli, trained_model_setup(cli, 1));
    auto comm = worker::make_mpi_communicator();
    if (cli.command == "profile") return run_profile(cli, *comm);
    if (cli.command == "evaluate") {
      return run_evaluate(cli, trained_model_setup(cli, comm->size()), *comm);
    }
    return run_train(cli, *comm, stop_signals->received());
  } catch (const UsageError& e) {
    return fail("usage error", e.what(), kExitUsage, rank, ranks);
  } catch (const config::ConfigError& e) {
    return fail("config error", e.what(), kExitUsage, rank, ranks);
  } catch (const worker::GraphError& e) {
    return fail("model error", e.what(), kExitUsage, rank, ranks);
  } catch (const std::exception& e) {
    return fail("error", e.what(), kExitFailure, rank, ranks);
  }
}

}  // namespace
}  // namespace vtrain::launcher

int main(int argc, char** argv) { return vtrain::launcher::run(argc, argv); }
