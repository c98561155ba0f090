#include "launcher/part_options.h"

#include <filesystem>

#include "common/text.h"
#include "configs/model_graph.h"
#include "perfdb/perf_db.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/optimizer.h"
#include "worker/profile/step_costs.h"

namespace vtrain::launcher {

worker::BackendOptions backend_options(const config::Config& cfg) {
  return {.kind = cfg.device.backend,
          .threads = cfg.device.threads,
          .memory_limit = static_cast<size_t>(cfg.device.memory_limit),
          .settings = config::compute_settings(cfg),
          .cudnn_graph = cfg.conv.cudnn_graph,
          .graph_engines = cfg.conv.graph_engines};
}

worker::TrainerOptions trainer_options(const config::Config& cfg, bool resume_required) {
  const config::OptimizerConfig& opt = cfg.optimizer;
  worker::TrainerOptions o{
      .train = cfg.train,
      .optimizer = {.kind = opt.type,
                    .momentum = static_cast<float>(opt.momentum),
                    .nesterov = opt.nesterov,
                    .weight_decay = static_cast<float>(opt.weight_decay),
                    .beta1 = static_cast<float>(opt.beta1),
                    .beta2 = static_cast<float>(opt.beta2),
                    .eps = static_cast<float>(opt.eps),
                    .trust = static_cast<float>(opt.trust),
                    .no_decay = opt.no_decay,
                    .clip_norm = opt.clip_norm},
      .schedule = opt,
      .settings = config::compute_settings(cfg),
      .conv_algorithm = cfg.conv.algorithm,
      .memory_policy = cfg.memory.policy,
      .memory_planner = cfg.memory.planner,
      .metrics_path = cfg.output.metrics,
      .progress = worker::Progress::mode_for(cfg.output.progress),
      .checkpoint = cfg.checkpoint,
      .rebalance = cfg.balance.rebalance,
      .gather_ahead = cfg.data.prefetch,
      .prefetch_input = cfg.data.prefetch,
      .prefetch_batches = static_cast<int>(cfg.data.prefetch_batches)};
  if (resume_required) o.checkpoint.resume = worker::ResumeSetting::kRequired;
  // Only an auto split re-balances (rank 0 has curves to re-solve on); the
  // other ranks must know too, or idle ones would probe for nothing.
  o.rebalance.enabled = o.rebalance.enabled && cfg.balance.split == balancer::SplitMode::kAuto;
  return o;
}

std::vector<common::Precision> planned_precisions(const config::Config& cfg, int ranks) {
  const config::PrecisionChoice& choice = cfg.train.precision_choice;
  if (choice.form == config::PrecisionChoice::Form::kPerRank &&
      static_cast<int>(choice.per_rank.size()) == ranks) {
    return choice.per_rank;
  }
  return std::vector<common::Precision>(static_cast<size_t>(ranks), cfg.compute.precision);
}

worker::NetworkOptions network_options(const config::Config& cfg, int64_t max_batch, int ranks) {
  return worker::training_network_options(trainer_options(cfg), max_batch,
                                          planned_precisions(cfg, ranks));
}

PlanningCosts planning_costs(const config::Config& cfg, const worker::Graph& graph,
                             worker::Backend& backend, const worker::NetworkOptions& net) {
  if (!memory::plans_per_tensor(cfg.memory.policy)) return {};
  std::string why_not;  // the perf DB's error, if reading it failed
  if (!cfg.profile.db.empty() && std::filesystem::is_regular_file(cfg.profile.db)) {
    try {
      perfdb::PerfDb db(cfg.profile.db, {.mode = perfdb::OpenMode::kReadOnly});
      if (const auto device = db.find_device(worker::perfdb_device(backend.device_info()))) {
        if (auto costs =
                worker::profiled_step_costs(db, *device, graph, net.settings, net.max_batch)
                    .costs) {
          return {std::move(costs), "profiled in " + cfg.profile.db};
        }
      }
    } catch (const perfdb::PerfDbError& e) {
      why_not = std::string(" (") + e.what() + ")";
    }
  }
  constexpr int kSteps = 3;
  const worker::InPlaceCosts measured = worker::measure_costs_in_place(graph, backend, net, kSteps);
  return {measured.costs,
          (measured.in_steps ? "measured in place in " + std::to_string(kSteps) + " steps"
                             : std::string("measured in place, each layer alone (the plan "
                                           "offloads, and copies slow the calls they overlap)")) +
              why_not};
}

bool input_staging(const config::Config& cfg, const worker::Graph& graph,
                   const worker::Backend& backend, int64_t rank_batch) {
  const int64_t sample_values = graph.output_shape(graph.input_index()).per_sample();
  const bool decodes =
      cfg.data.kind == worker::DataKind::kImageFolder || cfg.data.kind == worker::DataKind::kShards;
  return worker::batch_staging(trainer_options(cfg), rank_batch, sample_values, backend, decodes)
      .prefetch_input;
}

worker::ProfileOptions profile_options(const config::Config& cfg, const worker::Graph& graph,
                                       const worker::Backend& backend) {
  worker::ProfileOptions o;
  o.settings = config::compute_settings(cfg);
  o.input_staging = [&cfg = std::as_const(cfg), &graph, &backend](int64_t batch) {
    return input_staging(cfg, graph, backend, batch);
  };
  o.batches = cfg.profile.batches;
  o.micro_batches = cfg.profile.micro_batches;
  o.warmup = static_cast<int>(cfg.profile.warmup);
  o.repeats = static_cast<int>(cfg.profile.repeats);
  o.step_rounds = static_cast<int>(cfg.profile.step_rounds);
  o.steps = cfg.profile.steps;
  o.memory_policy = cfg.memory.policy;
  return o;
}

balancer::BatchSplitOptions split_options(const config::Config& cfg) {
  balancer::BatchSplitOptions o;
  o.granularity = cfg.balance.granularity;
  o.candidates = cfg.balance.candidates;
  o.input_aware = cfg.balance.input_aware;
  return o;
}

namespace {

// An image folder's training set as the config names it: its folder, its
// list file, or both ("LIST in DIR": a list's paths are relative to the
// folder).
std::string image_folder_identity(const config::DataConfig& data) {
  if (data.train_list.empty()) return data.train_dir;
  if (data.train_dir.empty()) return data.train_list;
  return data.train_list + " in " + data.train_dir;
}

}  // namespace

perfdb::InputKey input_key(const config::Config& cfg, const worker::Shape& sample) {
  perfdb::InputKey key;
  key.dataset_kind = worker::data_kind_name(cfg.data.kind);
  switch (cfg.data.kind) {
    case worker::DataKind::kIdx: key.dataset = cfg.data.train_images; break;
    case worker::DataKind::kCifar10:
      key.dataset = cfg.data.train_files.empty() ? "" : cfg.data.train_files.front();
      break;
    case worker::DataKind::kSynthetic: break;  // generated: its shape tells it apart
    case worker::DataKind::kImageFolder: key.dataset = image_folder_identity(cfg.data); break;
    case worker::DataKind::kShards: key.dataset = common::join(cfg.data.train_shards, ","); break;
  }
  key.channels = sample.c;
  key.height = sample.h;
  key.width = sample.w;
  return key;
}

worker::StepPricing step_pricing(const config::Config& cfg) {
  return {{cfg.balance.workspace, cfg.balance.workspace_limit, cfg.conv.cudnn_graph},
          cfg.memory.policy};
}

}  // namespace vtrain::launcher
