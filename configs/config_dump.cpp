// Config loading, the dump: the effective configuration as YAML that reads
// back to the same Config (sizes in exact binary units, numbers shortest).
#include <string>
#include <utility>
#include <vector>

#include "configs/internal/config_parts.h"

namespace vtrain::config {
namespace {

using namespace common::yaml;
using internal::SectionSetting;
using internal::settings_in;


// Sizes in the largest binary unit that divides them exactly, so the dump
// reads back to the same number.
std::string format_size(uint64_t bytes) {
  static const std::pair<const char*, int> kUnits[] = {
      {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}};
  if (bytes == 0) return "0";
  for (const auto& [unit, shift] : kUnits) {
    if (bytes % (uint64_t{1} << shift) == 0) return std::to_string(bytes >> shift) + unit;
  }
  return std::to_string(bytes);
}

void emit_pair(YAML::Emitter& out, int64_t h, int64_t w) {
  if (h == w) {
    out << h;
  } else {
    out << YAML::Flow << YAML::BeginSeq << h << w << YAML::EndSeq;
  }
}

void emit_layer(YAML::Emitter& out, const worker::LayerSpec& layer) {
  using worker::LayerType;
  out << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << layer.name;
  out << YAML::Key << "type" << YAML::Value << worker::layer_type_name(layer.type);
  if (layer.type != LayerType::kInput) {
    out << YAML::Key << "inputs" << YAML::Value << YAML::Flow << layer.inputs;
  }
  if (layer.type == LayerType::kConv || layer.type == LayerType::kFc) {
    out << YAML::Key << "out" << YAML::Value << layer.out;
  }
  if (layer.type == LayerType::kPool) {
    out << YAML::Key << "mode" << YAML::Value
        << (layer.pool == worker::PoolKind::kMax ? "max" : "avg");
    if (layer.global) out << YAML::Key << "global" << YAML::Value << true;
  }
  if ((layer.type == LayerType::kConv || layer.type == LayerType::kPool) && !layer.global) {
    out << YAML::Key << "kernel" << YAML::Value;
    emit_pair(out, layer.kernel_h, layer.kernel_w);
    out << YAML::Key << "stride" << YAML::Value;
    emit_pair(out, layer.stride_h, layer.stride_w);
    out << YAML::Key << "pad" << YAML::Value;
    emit_pair(out, layer.pad_h, layer.pad_w);
  }
  if (layer.type == LayerType::kConv || layer.type == LayerType::kFc) {
    out << YAML::Key << "bias" << YAML::Value << layer.bias;
  }
  if (layer.type == LayerType::kConv) out << YAML::Key << "groups" << YAML::Value << layer.groups;
  if (layer.type == LayerType::kDropout) {
    out << YAML::Key << "p" << YAML::Value << format_number(layer.dropout_p);
  }
  if (layer.type == LayerType::kBatchNorm) {
    out << YAML::Key << "eps" << YAML::Value << format_number(layer.bn_eps);
    out << YAML::Key << "momentum" << YAML::Value << format_number(layer.bn_momentum);
  }
  out << YAML::EndMap;
}

void emit_floats(YAML::Emitter& out, const std::vector<float>& values) {
  out << YAML::Flow << YAML::BeginSeq;
  for (float v : values) out << format_number(v);
  out << YAML::EndSeq;
}

// model.
void emit_model(YAML::Emitter& out, const Config& config) {
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (!config.model.preset.empty()) {
    out << YAML::Key << "preset" << YAML::Value << config.model.preset;
    out << YAML::Key << "classes" << YAML::Value << config.model.classes;
  } else if (!config.model.onnx.empty()) {
    out << YAML::Key << "onnx" << YAML::Value << config.model.onnx;
  } else {
    out << YAML::Key << "layers" << YAML::Value << YAML::BeginSeq;
    for (const auto& layer : config.model.layers) emit_layer(out, layer);
    out << YAML::EndSeq;
  }
  out << YAML::Key << "batch_norm" << YAML::Value
      << common::name_of(worker::kBatchNormModeNames, config.model.batch_norm);
  if (!config.model.init.empty()) {
    out << YAML::Key << "init" << YAML::Value << config.model.init;
    out << YAML::Key << "init_skip" << YAML::Value << YAML::Flow << config.model.init_skip;
  }
  out << YAML::EndMap;
}

// data.
void emit_data(YAML::Emitter& out, const Config& config) {
  const DataConfig& data = config.data;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "kind" << YAML::Value << worker::data_kind_name(data.kind);
  if (data.kind == worker::DataKind::kIdx) {
    out << YAML::Key << "train_images" << YAML::Value << data.train_images;
    out << YAML::Key << "train_labels" << YAML::Value << data.train_labels;
    out << YAML::Key << "test_images" << YAML::Value << data.test_images;
    out << YAML::Key << "test_labels" << YAML::Value << data.test_labels;
  } else if (data.kind == worker::DataKind::kCifar10) {
    out << YAML::Key << "train_files" << YAML::Value << data.train_files;
    out << YAML::Key << "test_files" << YAML::Value << data.test_files;
  } else if (data.kind == worker::DataKind::kImageFolder) {
    for (auto [key, value] : {std::pair{"train_dir", &data.train_dir}, std::pair{"test_dir", &data.test_dir},
                              std::pair{"train_list", &data.train_list}, std::pair{"test_list", &data.test_list}}) {
      if (!value->empty()) out << YAML::Key << key << YAML::Value << *value;
    }
    out << YAML::Key << "skip_unreadable" << YAML::Value << data.skip_unreadable;
  } else if (data.kind == worker::DataKind::kShards) {
    out << YAML::Key << "train_shards" << YAML::Value << data.train_shards;
    out << YAML::Key << "test_shards" << YAML::Value << data.test_shards;
  }
  if (data.kind != worker::DataKind::kIdx && data.kind != worker::DataKind::kCifar10) {
    out << YAML::Key << "shape" << YAML::Value << YAML::Flow << YAML::BeginSeq << data.shape.c
        << data.shape.h << data.shape.w << YAML::EndSeq;
  }
  if (data.kind == worker::DataKind::kSynthetic) {
    out << YAML::Key << "classes" << YAML::Value << data.classes;
    out << YAML::Key << "train_size" << YAML::Value << data.train_size;
    out << YAML::Key << "test_size" << YAML::Value << data.test_size;
  }
  if (!data.mean.empty()) {
    out << YAML::Key << "mean" << YAML::Value;
    emit_floats(out, data.mean);
    out << YAML::Key << "std" << YAML::Value;
    emit_floats(out, data.stddev);
  }
  out << YAML::Key << "prefetch" << YAML::Value
      << common::name_of(common::kAutoOnOffNames, data.prefetch);
  for (auto [key, t] : {std::pair{"train_transform", &data.train_transform},
                        std::pair{"test_transform", &data.test_transform}}) {
    out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "crop" << YAML::Value << common::name_of(worker::kCropKindNames, t->crop);
    out << YAML::Key << "flip" << YAML::Value << t->flip;
    out << YAML::Key << "scale" << YAML::Value << YAML::BeginSeq << t->scale_min << t->scale_max << YAML::EndSeq;
    out << YAML::Key << "ratio" << YAML::Value << YAML::BeginSeq << t->ratio_min << t->ratio_max << YAML::EndSeq;
    out << YAML::Key << "pad" << YAML::Value << t->pad;
    out << YAML::Key << "resize" << YAML::Value << t->resize;
    out << YAML::EndMap;
  }
  out << YAML::Key << "workers" << YAML::Value;
  if (data.workers_per_rank.empty()) {
    out << data.workers;
  } else {
    out << YAML::Flow << data.workers_per_rank;
  }
  out << YAML::Key << "prefetch_batches" << YAML::Value << data.prefetch_batches;
  out << YAML::EndMap;
}

// train.precision in the form it was written.
void emit_precision_choice(YAML::Emitter& out, const PrecisionChoice& choice) {
  out << YAML::Key << "precision" << YAML::Value;
  switch (choice.form) {
    case PrecisionChoice::Form::kOne: out << common::precision_name(choice.one); return;
    case PrecisionChoice::Form::kAuto: out << "auto"; return;
    case PrecisionChoice::Form::kPerRank:
      out << YAML::Flow << YAML::BeginSeq;
      for (common::Precision p : choice.per_rank) out << common::precision_name(p);
      out << YAML::EndSeq;
      return;
    case PrecisionChoice::Form::kByDevice:
      out << YAML::BeginMap;
      for (const auto& [device, p] : choice.by_device) {
        out << YAML::Key << device << YAML::Value << common::precision_name(p);
      }
      out << YAML::EndMap;
      return;
  }
}

// train and optimizer.
void emit_training(YAML::Emitter& out, const Config& config) {
  const TrainConfig& train = config.train;
  out << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "batch" << YAML::Value << train.batch;
  out << YAML::Key << "epochs" << YAML::Value << train.epochs;
  out << YAML::Key << "max_steps" << YAML::Value << train.max_steps;
  out << YAML::Key << "seed" << YAML::Value << train.seed;
  out << YAML::Key << "log_every" << YAML::Value << train.log_every;
  out << YAML::Key << "evaluate" << YAML::Value << train.evaluate;
  out << YAML::Key << "step_timeout" << YAML::Value << train.step_timeout;
  out << YAML::Key << "label_smoothing" << YAML::Value << format_number(train.label_smoothing);
  out << YAML::Key << "ema" << YAML::Value << format_number(train.ema);
  out << YAML::Key << "target_accuracy" << YAML::Value << format_number(train.target_accuracy);
  out << YAML::Key << "allreduce_bucket" << YAML::Value << format_size(train.allreduce_bucket);
  emit_precision_choice(out, train.precision_choice);
  out << YAML::Key << "precisions" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (common::Precision p : train.precisions) out << common::precision_name(p);
  out << YAML::EndSeq;
  out << YAML::Key << "gradient_allreduce" << YAML::Value
      << common::name_of(worker::kGradientAllreduceNames, train.gradient_allreduce);
  const worker::LossScalingSettings& l = train.loss_scaling;
  out << YAML::Key << "loss_scaling" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "mode" << YAML::Value << common::name_of(common::kAutoOnOffNames, l.mode);
  out << YAML::Key << "initial" << YAML::Value << l.initial;
  out << YAML::Key << "growth_interval" << YAML::Value << l.growth_interval;
  out << YAML::EndMap;
  out << YAML::EndMap;

  const OptimizerConfig& opt = config.optimizer;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value << common::name_of(worker::kOptimizerKindNames, opt.type);
  out << YAML::Key << "lr" << YAML::Value << format_number(opt.lr);
  out << YAML::Key << "weight_decay" << YAML::Value << format_number(opt.weight_decay);
  // Only the keys the type reads: the others are refused under it.
  if (opt.type != worker::OptimizerKind::kAdamW) {
    out << YAML::Key << "momentum" << YAML::Value << format_number(opt.momentum);
    out << YAML::Key << "nesterov" << YAML::Value << opt.nesterov;
  } else {
    out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
        << format_number(opt.beta1) << format_number(opt.beta2) << YAML::EndSeq;
    out << YAML::Key << "eps" << YAML::Value << format_number(opt.eps);
  }
  if (opt.type == worker::OptimizerKind::kLars) {
    out << YAML::Key << "trust" << YAML::Value << format_number(opt.trust);
  }
  out << YAML::Key << "no_decay" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const worker::ParamKind kind : opt.no_decay) {
    out << common::name_of(worker::kNoDecayNames, kind);
  }
  out << YAML::EndSeq;
  out << YAML::Key << "clip_norm" << YAML::Value << format_number(opt.clip_norm);
  out << YAML::Key << "schedule" << YAML::Value << worker::schedule_kind_name(opt.schedule);
  out << YAML::Key << "step_epochs" << YAML::Value << opt.step_epochs;
  out << YAML::Key << "gamma" << YAML::Value << format_number(opt.gamma);
  out << YAML::Key << "warmup_steps" << YAML::Value << opt.warmup_steps;
  out << YAML::EndMap;
}

// The run settings `section` holds (settings_in), each by its row.
void emit_settings(YAML::Emitter& out, const std::string& section, const Config& config) {
  for (const SectionSetting& s : settings_in(section)) {
    out << YAML::Key << s.key << YAML::Value << std::string(s.setting->text(config.compute));
  }
}

// device, conv, memory and output.
void emit_device(YAML::Emitter& out, const Config& config) {
  out << YAML::Key << "device" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "backend" << YAML::Value
      << common::name_of(worker::kBackendKindNames, config.device.backend);
  out << YAML::Key << "threads" << YAML::Value << config.device.threads;
  out << YAML::Key << "memory_limit" << YAML::Value << format_size(config.device.memory_limit);
  emit_settings(out, "device", config);
  out << YAML::EndMap;

  out << YAML::Key << "conv" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "algorithm" << YAML::Value << config.conv.algorithm;
  out << YAML::Key << "cudnn_graph" << YAML::Value << config.conv.cudnn_graph;
  out << YAML::Key << "graph_engines" << YAML::Value << config.conv.graph_engines;
  emit_settings(out, "conv", config);
  out << YAML::EndMap;

  out << YAML::Key << "memory" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "policy" << YAML::Value << memory::policy_name(config.memory.policy);
  out << YAML::Key << "planner" << YAML::Value << memory::planner_name(config.memory.planner);
  out << YAML::EndMap;

  out << YAML::Key << "output" << YAML::Value << YAML::BeginMap;
  if (!config.output.metrics.empty()) {
    out << YAML::Key << "metrics" << YAML::Value << config.output.metrics;
  }
  out << YAML::Key << "progress" << YAML::Value
      << worker::progress_setting_name(config.output.progress);
  if (!config.output.plan.empty()) out << YAML::Key << "plan" << YAML::Value << config.output.plan;
  out << YAML::EndMap;
}

// balance, checkpoint and profile.
void emit_planning(YAML::Emitter& out, const Config& config) {
  out << YAML::Key << "balance" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "split" << YAML::Value
      << common::name_of(balancer::kSplitModeNames, config.balance.split);
  out << YAML::Key << "granularity" << YAML::Value << config.balance.granularity;
  out << YAML::Key << "candidates" << YAML::Value
      << common::name_of(balancer::kCandidateSizesNames, config.balance.candidates);
  out << YAML::Key << "workspace" << YAML::Value
      << balancer::workspace_policy_name(config.balance.workspace);
  out << YAML::Key << "workspace_limit" << YAML::Value << config.balance.workspace_limit;
  out << YAML::Key << "allreduce" << YAML::Value
      << common::name_of(balancer::kAllreduceCostNames, config.balance.allreduce);
  out << YAML::Key << "input_aware" << YAML::Value << config.balance.input_aware;
  if (!config.balance.manual.empty()) {
    out << YAML::Key << "manual" << YAML::Value << YAML::Flow << config.balance.manual;
  }
  const worker::RebalanceSettings& r = config.balance.rebalance;
  out << YAML::Key << "rebalance" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "enabled" << YAML::Value << r.enabled;
  out << YAML::Key << "threshold" << YAML::Value << r.threshold;
  out << YAML::Key << "window" << YAML::Value << r.window;
  out << YAML::Key << "patience" << YAML::Value << r.patience;
  out << YAML::Key << "min_gain" << YAML::Value << r.min_gain;
  out << YAML::Key << "min_gain_ms" << YAML::Value << r.min_gain_ms;
  out << YAML::Key << "probe_every" << YAML::Value << r.probe_every;
  out << YAML::EndMap;
  out << YAML::EndMap;

  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  if (!config.checkpoint.dir.empty()) {
    out << YAML::Key << "dir" << YAML::Value << config.checkpoint.dir;
  }
  out << YAML::Key << "every" << YAML::Value << config.checkpoint.every;
  out << YAML::Key << "keep" << YAML::Value << config.checkpoint.keep;
  out << YAML::Key << "resume" << YAML::Value
      << common::name_of(worker::kResumeSettingNames, config.checkpoint.resume);
  out << YAML::EndMap;

  const ProfileConfig& profile = config.profile;
  out << YAML::Key << "profile" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "db" << YAML::Value << profile.db;
  if (!profile.batches.empty()) {
    out << YAML::Key << "batches" << YAML::Value << YAML::Flow << profile.batches;
  }
  out << YAML::Key << "micro_batches" << YAML::Value
      << balancer::micro_batch_policy_name(profile.micro_batches);
  out << YAML::Key << "warmup" << YAML::Value << profile.warmup;
  out << YAML::Key << "repeats" << YAML::Value << profile.repeats;
  out << YAML::Key << "step_rounds" << YAML::Value << profile.step_rounds;
  out << YAML::Key << "steps" << YAML::Value << profile.steps;
  out << YAML::EndMap;
}

}  // namespace

std::string to_yaml(const Config& config) {
  YAML::Emitter out;
  if (!config.path.empty()) {
    out << YAML::Comment("effective configuration of " + config.path) << YAML::Newline;
  }
  out << YAML::BeginMap;

  emit_model(out, config);
  emit_data(out, config);
  emit_training(out, config);
  emit_device(out, config);
  emit_planning(out, config);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}
}  // namespace vtrain::config
