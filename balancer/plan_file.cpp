// The plan file format (balancer/plan.h): YAML text <-> TrainingPlan, read
// strictly with the shared YAML reader so that errors name file, line and key.
#include "balancer/plan.h"
#include "common/precision.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <limits>

#include "common/files.h"
#include "common/text_file.h"
#include "common/yaml_reader.h"

namespace vtrain::balancer {
namespace {

using namespace common::yaml;

MicroBatch read_call(const Field& field) {
  const std::vector<Field> parts = field.items("a call [algorithm, images]");
  if (parts.size() != 2) {
    field.fail("expected a call [algorithm, images], got a list of " +
               std::to_string(parts.size()));
  }
  return {to_string(parts[0], "an algorithm name"), to_int(parts[1], at_least(1))};
}

// The oldest plan format this code reads: version 1 held the settings as
// suffixes of `model` (common::parse_suffixed_model_key).
constexpr int kFirstReadVersion = 1;
// The last one whose `device:` held a CPU's thread count as text after the
// name ("X (8 threads)", common::DeviceLabel::text).
constexpr int kLastDeviceTextVersion = 2;

// `model` and how it is computed: fields of their own since version 2.
void read_model(const Section& top, int format, TrainingPlan& plan) {
  const Field model = top.required("model", "the model signature the plan was made for");
  if (format == 1) {
    try {
      common::SuffixedModelKey key = common::parse_suffixed_model_key(to_string(model));
      plan.model = std::move(key.signature);
      plan.settings = key.settings;
    } catch (const std::invalid_argument& e) {
      model.fail(e.what());
    }
    return;
  }
  plan.model = to_string(model);
  for (const common::Setting& setting : common::kSettings) {
    if (Field f = top[setting.name]) {
      try {
        common::set_setting(plan.settings, setting, to_string(f));
      } catch (const std::invalid_argument& e) {
        f.fail(e.what());
      }
    }
  }
}

// The top-level keys: a field per setting (common::kSettings) beside these.
Keys top_keys() {
  Keys keys = {"vtrain_plan", "model", "global_batch", "memory_policy", "workspace_policy",
               "workspace_limit", "predicted_step_ms", "split_ms", "even_split_ms",
               "ideal_step_ms", "ranks"};
  for (const common::Setting& setting : common::kSettings) keys.push_back(setting.name);
  return keys;
}

PlannedKernel read_planned_kernel(const Field& field, const RankPlan& rank) {
  const Section section(field);
  section.allow({"layer", "kind", "calls", "workspace_offset", "workspace_bytes", "time_ms"});
  PlannedKernel k;
  k.layer = to_string(section.required("layer", "the conv layer's name"));
  k.kind = to_choice(section.required("kind", "Forward, BackwardData or BackwardFilter"),
                     common::kConvKindNames);
  const Field calls = section.required("calls", "the kernel's [algorithm, images] calls");
  int64_t total = 0;
  for (const Field& c : calls.items("a list of [algorithm, images] calls")) {
    k.calls.push_back(read_call(c));
    total += k.calls.back().size;
  }
  if (total != rank.batch) {
    calls.fail("the calls cover " + std::to_string(total) + " images, the rank's batch is " +
               std::to_string(rank.batch));
  }
  if (Field f = section["workspace_offset"]) k.workspace_offset = to_uint64(f);
  if (Field f = section["workspace_bytes"]) k.workspace_bytes = to_uint64(f);
  if (k.workspace_offset + k.workspace_bytes > rank.workspace_bytes) {
    field.fail("workspace segment [" + std::to_string(k.workspace_offset) + ", " +
               std::to_string(k.workspace_offset + k.workspace_bytes) +
               ") lies outside the rank's workspace of " + std::to_string(rank.workspace_bytes) +
               " bytes");
  }
  if (Field f = section["time_ms"]) k.time_ms = to_number(f, at_least(0));
  return k;
}

// A rank's `device:` and, since version 3, `threads:`.
common::DeviceLabel read_device(const Section& section, int format) {
  common::DeviceLabel device;
  if (Field f = section["device"]) {
    device = format <= kLastDeviceTextVersion ? common::DeviceLabel::parse(to_string(f))
                                              : common::DeviceLabel{to_string(f), std::nullopt};
  }
  if (Field f = section["threads"]) {
    if (format <= kLastDeviceTextVersion) {
      f.fail("plan format " + std::to_string(format) +
             " has no threads (it is part of device:); threads came with format 3");
    }
    device.threads = static_cast<int>(
        to_int(f, between(1, std::numeric_limits<int>::max(), false, false)));
  }
  return device;
}

RankPlan read_rank_plan(const Field& field, int format) {
  const Section section(field);
  section.allow({"device", "threads", "precision", "batch", "predicted_ms", "input_rate", "binds",
                 "workspace_bytes", "activations", "kernels"});
  RankPlan r;
  r.device = read_device(section, format);
  if (Field f = section["precision"]) r.precision = to_choice(f, common::kPrecisionNames);
  r.batch = to_int(section.required("batch", "the rank's per-step batch"), at_least(0));
  if (Field f = section["predicted_ms"]) r.predicted_ms = to_number(f, at_least(0));
  if (Field f = section["input_rate"]) r.input_rate = to_number(f, above(0));
  if (Field f = section["binds"]) r.binds = to_choice(f, kBindingNames);
  if (Field f = section["workspace_bytes"]) r.workspace_bytes = to_uint64(f);
  if (Field f = section["activations"]) {
    const Section bytes(f);
    bytes.allow({"kept", "offloaded", "recomputed"});
    common::ActivationBytes a;
    a.kept = to_uint64(bytes.required("kept", "bytes of activations kept in device memory"));
    a.offloaded = to_uint64(bytes.required("offloaded", "bytes of activations offloaded"));
    a.recomputed = to_uint64(bytes.required("recomputed", "bytes of activations recomputed"));
    r.activations = a;
  }
  if (Field f = section["kernels"]) {
    for (const Field& k : f.items("a list of kernels")) {
      r.kernels.push_back(read_planned_kernel(k, r));
      for (size_t j = 0; j + 1 < r.kernels.size(); ++j) {
        if (r.kernels[j].layer == r.kernels.back().layer &&
            r.kernels[j].kind == r.kernels.back().kind) {
          k.fail("a second entry for " + r.kernels[j].layer + " " +
                 common::conv_kind_name(r.kernels[j].kind));
        }
      }
    }
  }
  if (r.batch == 0 && !r.kernels.empty()) {
    section["kernels"].fail("a rank with batch 0 runs no kernels");
  }
  return r;
}

}  // namespace

TrainingPlan parse_plan(const std::string& yaml_text, const std::string& origin) {
  Source source{origin, fs::path(origin).parent_path(), {}};
  const YAML::Node root = load_document(yaml_text, origin, "plan");
  const Section top(Field(source, root, true, "", 0));
  top.allow(top_keys());
  TrainingPlan plan;
  const Field version = top.required("vtrain_plan", "the plan format version; is this a plan?");
  // Read into the current form: plan.version stays kPlanVersion.
  const int format = static_cast<int>(to_int(version, at_least(1)));
  if (format < kFirstReadVersion || format > kPlanVersion) {
    version.fail("plan format version " + std::to_string(format) + " is not supported " +
                 "(this vtrain reads versions " + std::to_string(kFirstReadVersion) + " to " +
                 std::to_string(kPlanVersion) + ")");
  }
  read_model(top, format, plan);
  const Field global = top.required("global_batch", "the job's global batch");
  plan.global_batch = to_int(global, at_least(1));
  if (Field f = top["memory_policy"]) plan.memory_policy = to_string(f);
  if (Field f = top["workspace_policy"]) {
    plan.workspace_policy = to_choice(f, kWorkspacePolicyNames);
  }
  if (Field f = top["workspace_limit"]) plan.workspace_limit = to_uint64(f);
  if (Field f = top["predicted_step_ms"]) plan.predicted_step_ms = to_number(f, at_least(0));
  if (Field f = top["split_ms"]) plan.split_ms = to_number(f, at_least(0));
  if (Field f = top["even_split_ms"]) plan.even_split_ms = to_number(f, at_least(0));
  if (Field f = top["ideal_step_ms"]) plan.ideal_step_ms = to_number(f, at_least(0));
  const Field ranks = top.required("ranks", "one entry per rank");
  int64_t total = 0;
  for (const Field& r : ranks.items("a list of ranks")) {
    plan.ranks.push_back(read_rank_plan(r, format));
    total += plan.ranks.back().batch;
  }
  if (plan.ranks.empty()) ranks.fail("expected at least one rank, got an empty list");
  if (total != plan.global_batch) {
    ranks.fail("the ranks' batches sum to " + std::to_string(total) + ", global_batch is " +
               std::to_string(plan.global_batch));
  }
  return plan;
}

TrainingPlan load_plan(const std::string& path) {
  return parse_plan(common::read_text_file(path, "plan", kMaxPlanBytes), path);
}

std::string plan_to_yaml(const TrainingPlan& plan) {
  YAML::Emitter out;
  out.SetDoublePrecision(6);
  out << YAML::BeginMap;
  out << YAML::Key << "vtrain_plan" << YAML::Value << plan.version;
  out << YAML::Key << "model" << YAML::Value << YAML::DoubleQuoted << plan.model;
  for (const common::Setting& setting : common::kSettings) {
    out << YAML::Key << setting.name << YAML::Value << std::string(setting.text(plan.settings));
  }
  out << YAML::Key << "global_batch" << YAML::Value << plan.global_batch;
  out << YAML::Key << "memory_policy" << YAML::Value << plan.memory_policy;
  out << YAML::Key << "workspace_policy" << YAML::Value << workspace_policy_name(plan.workspace_policy);
  out << YAML::Key << "workspace_limit" << YAML::Value << plan.workspace_limit;
  out << YAML::Key << "predicted_step_ms" << YAML::Value << plan.predicted_step_ms;
  if (plan.split_ms) out << YAML::Key << "split_ms" << YAML::Value << *plan.split_ms;
  if (plan.even_split_ms) out << YAML::Key << "even_split_ms" << YAML::Value << *plan.even_split_ms;
  if (plan.ideal_step_ms) out << YAML::Key << "ideal_step_ms" << YAML::Value << *plan.ideal_step_ms;
  out << YAML::Key << "ranks" << YAML::Value << YAML::BeginSeq;
  for (const RankPlan& r : plan.ranks) {
    out << YAML::BeginMap;
    out << YAML::Key << "device" << YAML::Value << YAML::DoubleQuoted << r.device.name;
    if (r.device.threads) out << YAML::Key << "threads" << YAML::Value << *r.device.threads;
    if (r.precision) {
      out << YAML::Key << "precision" << YAML::Value << common::precision_name(*r.precision);
    }
    out << YAML::Key << "batch" << YAML::Value << r.batch;
    out << YAML::Key << "predicted_ms" << YAML::Value << r.predicted_ms;
    if (r.input_rate) out << YAML::Key << "input_rate" << YAML::Value << *r.input_rate;
    if (r.binds) out << YAML::Key << "binds" << YAML::Value << common::name_of(kBindingNames, *r.binds);
    out << YAML::Key << "workspace_bytes" << YAML::Value << r.workspace_bytes;
    if (const auto& a = r.activations) {
      out << YAML::Key << "activations" << YAML::Value << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "kept" << YAML::Value << a->kept;
      out << YAML::Key << "offloaded" << YAML::Value << a->offloaded;
      out << YAML::Key << "recomputed" << YAML::Value << a->recomputed;
      out << YAML::EndMap;
    }
    out << YAML::Key << "kernels" << YAML::Value << YAML::BeginSeq;
    for (const PlannedKernel& k : r.kernels) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "layer" << YAML::Value << k.layer;
      out << YAML::Key << "kind" << YAML::Value << common::conv_kind_name(k.kind);
      out << YAML::Key << "workspace_offset" << YAML::Value << k.workspace_offset;
      out << YAML::Key << "workspace_bytes" << YAML::Value << k.workspace_bytes;
      out << YAML::Key << "time_ms" << YAML::Value << k.time_ms;
      out << YAML::Key << "calls" << YAML::Value << YAML::BeginSeq;
      for (const MicroBatch& c : k.calls) {
        out << YAML::Flow << YAML::BeginSeq << c.algorithm << c.size << YAML::EndSeq;
      }
      out << YAML::EndSeq << YAML::EndMap;
    }
    out << YAML::EndSeq << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  return "# vtrain plan: see balancer/plan.h for the format\n" + std::string(out.c_str()) + "\n";
}

void save_plan(const TrainingPlan& plan, const std::string& path) {
  common::write_file_whole(path, plan_to_yaml(plan), "plan");
}

}  // namespace vtrain::balancer
