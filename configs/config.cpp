// Config loading: YAML text -> validated plain structs. The only file that
// includes yaml-cpp.
//
// Reading is strict: every map is checked against the keys it may hold, every
// value against its type and range, and every error names where the value came
// from (FILE:LINE or --set) and its key path.
#include "configs/config.h"

#include <yaml-cpp/yaml.h>

#include "common/yaml_reader.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

namespace vtrain::config {
namespace {

using namespace common::yaml;

namespace fs = std::filesystem;

// ---- sections ---------------------------------------------------------------

// Per-sample channels of a data source (for mean/std lengths).
int64_t data_channels(const DataConfig& data) {
  if (data.kind == worker::DataKind::kIdx) return 1;      // IDX images are greyscale
  if (data.kind == worker::DataKind::kCifar10) return 3;  // RGB
  return data.shape.c;
}

DataConfig read_data(const Field& field) {
  const Section section(field);
  DataConfig data;
  if (Field kind = section["kind"]) data.kind = to_choice(kind, worker::kDataKindNames);
  const std::string kind_name = worker::data_kind_name(data.kind);

  Keys kind_keys;
  if (data.kind == worker::DataKind::kIdx) {
    kind_keys = {"train_images", "train_labels", "test_images", "test_labels"};
  } else if (data.kind == worker::DataKind::kCifar10) {
    kind_keys = {"train_files", "test_files"};
  } else {
    kind_keys = {"shape", "classes", "train_size", "test_size"};
  }
  Keys allowed = {"kind"};
  allowed.insert(allowed.end(), kind_keys.begin(), kind_keys.end());
  allowed.insert(allowed.end(), {"mean", "std"});
  section.allow(allowed, "for kind " + kind_name);

  if (data.kind == worker::DataKind::kIdx) {
    const std::string why =
        "kind idx needs train_images, train_labels, test_images and test_labels";
    data.train_images = to_path(section.required("train_images", why));
    data.train_labels = to_path(section.required("train_labels", why));
    data.test_images = to_path(section.required("test_images", why));
    data.test_labels = to_path(section.required("test_labels", why));
  } else if (data.kind == worker::DataKind::kCifar10) {
    const std::string why = "kind cifar10 needs train_files and test_files";
    data.train_files = to_paths(section.required("train_files", why));
    data.test_files = to_paths(section.required("test_files", why));
  } else {
    if (Field shape = section["shape"]) {
      const std::vector<Field> dims = shape.items("a list [C, H, W]");
      if (dims.size() != 3) {
        shape.fail("expected a list [C, H, W], got a list of " + std::to_string(dims.size()));
      }
      data.shape = worker::Shape{1, to_int(dims[0], at_least(1)), to_int(dims[1], at_least(1)),
                                 to_int(dims[2], at_least(1))};
    }
    if (Field classes = section["classes"]) data.classes = to_int(classes, at_least(2));
    if (Field size = section["train_size"]) data.train_size = to_int(size, at_least(1));
    if (Field size = section["test_size"]) data.test_size = to_int(size, at_least(1));
  }

  const Field mean = section["mean"];
  const Field stddev = section["std"];
  if (mean && !stddev) stddev.fail("missing (mean and std go together)");
  if (stddev && !mean) mean.fail("missing (mean and std go together)");
  if (mean) {
    data.mean = to_floats(mean, {});
    data.stddev = to_floats(stddev, above(0));
    const int64_t channels = data_channels(data);
    for (const Field* f : {&mean, &stddev}) {
      const size_t count = f->node().size();
      if (static_cast<int64_t>(count) != channels) {
        f->fail("expected " + std::to_string(channels) + " value" + (channels == 1 ? "" : "s") +
                " (one per channel), got " + std::to_string(count));
      }
    }
  }
  return data;
}

// Keys each layer type takes besides name, type and inputs.
Keys layer_keys(worker::LayerType type) {
  using worker::LayerType;
  switch (type) {
    case LayerType::kInput: return {};
    case LayerType::kConv: return {"out", "kernel", "stride", "pad", "bias"};
    case LayerType::kRelu: return {};
    case LayerType::kPool: return {"mode", "kernel", "stride", "pad", "global"};
    case LayerType::kFc: return {"out", "bias"};
    case LayerType::kBatchNorm: return {"eps", "momentum"};
    case LayerType::kAdd: return {};
    case LayerType::kConcat: return {};
  }
  return {};
}

// Every layer type, in the order messages list them.
constexpr worker::LayerType kLayerTypes[] = {
    worker::LayerType::kInput, worker::LayerType::kConv,   worker::LayerType::kRelu,
    worker::LayerType::kPool,  worker::LayerType::kFc,     worker::LayerType::kBatchNorm,
    worker::LayerType::kAdd,   worker::LayerType::kConcat,
};

worker::LayerType to_layer_type(const Field& field) {
  Keys known;
  for (worker::LayerType type : kLayerTypes) known.push_back(worker::layer_type_name(type));
  const std::string name = to_string(field, "a layer type (" + join(known) + ")");
  for (worker::LayerType type : kLayerTypes) {
    if (name == worker::layer_type_name(type)) return type;
  }
  field.fail("unknown layer type '" + name + "' (known: " + join(known) + ")");
}

// One layer of `model.layers`. Its explicit input fields are returned through
// `input_fields` so that names can be checked once every layer is known.
worker::LayerSpec read_layer(const Field& item, const std::string& previous,
                             std::vector<Field>& input_fields) {
  using worker::LayerType;
  if (!item.node().IsMap()) {
    item.fail("expected a map such as {name: conv1, type: conv, ...}, got " +
              describe_node(item.node()));
  }
  const Section section(item);
  worker::LayerSpec layer;
  layer.source_line = item.file_line();
  layer.type = to_layer_type(section.required("type", "every layer needs a type"));
  const std::string type_name = worker::layer_type_name(layer.type);

  Keys allowed = {"name", "type"};
  if (layer.type != LayerType::kInput) allowed.push_back("inputs");
  const Keys extra = layer_keys(layer.type);
  allowed.insert(allowed.end(), extra.begin(), extra.end());
  section.allow(allowed, "for a " + type_name + " layer");

  layer.name = to_string(section.required("name", "every layer needs a name"), "a layer name");

  if (layer.type != LayerType::kInput) {
    if (Field inputs = section["inputs"]) {
      // A single name may stand for a one-item list.
      if (inputs.node().IsScalar()) {
        layer.inputs.push_back(to_string(inputs, "a layer name"));
        input_fields.push_back(inputs);
      } else {
        for (const Field& input : inputs.items("a list of layer names")) {
          layer.inputs.push_back(to_string(input, "a layer name"));
          input_fields.push_back(input);
        }
      }
    } else if (!previous.empty()) {
      layer.inputs.push_back(previous);
    } else {
      inputs.fail("missing (the first layer has no previous layer to take as input)");
    }
  }

  if (layer.type == LayerType::kConv || layer.type == LayerType::kFc) {
    layer.out = to_int(section.required("out", "a " + type_name + " layer needs out"), at_least(1));
  }
  if (Field bias = section["bias"]) layer.bias = to_bool(bias);

  if (layer.type == LayerType::kPool) {
    if (Field mode = section["mode"]) {
      layer.pool = to_choice(mode, {"max", "avg"}) == "max" ? worker::PoolKind::kMax
                                                            : worker::PoolKind::kAverage;
    }
    if (Field global = section["global"]) layer.global = to_bool(global);
  }
  if (layer.type == LayerType::kConv || layer.type == LayerType::kPool) {
    if (layer.global) {
      // A global window is the whole input plane: nothing to size.
      for (const char* key : {"kernel", "stride", "pad"}) {
        if (Field field = section[key]) field.fail("not used with global: true");
      }
    } else {
      const Field kernel = section.required("kernel", "a " + type_name + " layer needs kernel");
      std::tie(layer.kernel_h, layer.kernel_w) = to_pair(kernel, at_least(1));
      // Pooling windows default to not overlapping (stride = kernel), the
      // usual choice; convolutions default to stride 1.
      if (layer.type == LayerType::kPool) {
        std::tie(layer.stride_h, layer.stride_w) = std::pair(layer.kernel_h, layer.kernel_w);
      }
      if (Field stride = section["stride"]) {
        std::tie(layer.stride_h, layer.stride_w) = to_pair(stride, at_least(1));
      }
      if (Field pad = section["pad"]) {
        std::tie(layer.pad_h, layer.pad_w) = to_pair(pad, at_least(0));
      }
    }
  }

  if (Field eps = section["eps"]) layer.bn_eps = static_cast<float>(to_number(eps, above(0)));
  if (Field momentum = section["momentum"]) {
    layer.bn_momentum = static_cast<float>(to_number(momentum, between(0, 1, true, false)));
  }
  return layer;
}

std::vector<worker::LayerSpec> read_layers(const Field& field) {
  std::vector<worker::LayerSpec> layers;
  std::vector<Field> input_fields;
  const std::vector<Field> items = field.items("a list of layers");
  if (items.empty()) field.fail("expected a list of layers, got an empty list");
  std::vector<std::string> names;
  for (size_t i = 0; i < items.size(); ++i) {
    layers.push_back(read_layer(items[i], layers.empty() ? "" : layers.back().name, input_fields));
    const std::string& name = layers.back().name;
    const auto first = std::find(names.begin(), names.end(), name);
    if (first != names.end()) {
      const Section section(items[i]);
      section["name"].fail("duplicate layer name '" + name + "' (first at " + field.path() + "[" +
                           std::to_string(first - names.begin()) + "])");
    }
    names.push_back(name);
  }
  for (const Field& input : input_fields) {
    const std::string name = input.node().Scalar();
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      input.fail("unknown layer '" + name + "' (layers: " + join(names) + ")");
    }
  }
  return layers;
}

ModelConfig read_model(const Field& field, const DataConfig& data) {
  const Section section(field);
  section.allow({"preset", "classes", "layers"});
  const Field preset = section["preset"];
  const Field layers = section["layers"];
  const Field classes = section["classes"];
  const Keys known = worker::preset_names();

  ModelConfig model;
  // Synthetic data says how many classes it has; the IDX and CIFAR-10
  // datasets we read have ten.
  const bool synthetic = data.kind == worker::DataKind::kSynthetic;
  model.classes = synthetic ? data.classes : 10;
  if (preset && layers) {
    // Blame a --set that caused the clash, else the section.
    const Field& culprit = layers.from_override()   ? layers
                           : preset.from_override() ? preset
                                                    : field;
    culprit.fail("give either preset or layers, not both");
  }
  if (!preset && !layers) {
    field.fail("missing preset or layers (known presets: " + join(known) + ")");
  }

  if (preset) {
    model.preset = to_string(preset, "a preset name");
    if (std::find(known.begin(), known.end(), model.preset) == known.end()) {
      preset.fail("unknown preset '" + model.preset + "' (known: " + join(known) + ")");
    }
    if (classes) {
      model.classes = to_int(classes, at_least(2));
      if (synthetic && model.classes != data.classes) {
        classes.fail(std::to_string(model.classes) + " classes, but data.classes is " +
                     std::to_string(data.classes));
      }
    }
  } else {
    if (classes) {
      classes.fail("only used with a preset (with layers, the last layer's out sets the classes)");
    }
    model.layers = read_layers(layers);
  }
  return model;
}

TrainConfig read_train(const Field& field) {
  const Section section(field);
  section.allow({"batch", "epochs", "max_steps", "seed", "log_every", "evaluate",
                 "allreduce_bucket"});
  TrainConfig train;
  if (Field f = section["batch"]) train.batch = to_int(f, at_least(1));
  if (Field f = section["epochs"]) train.epochs = to_int(f, at_least(1));
  if (Field f = section["max_steps"]) train.max_steps = to_int(f, at_least(0));
  if (Field f = section["seed"]) train.seed = to_uint64(f);
  if (Field f = section["log_every"]) train.log_every = to_int(f, at_least(1));
  if (Field f = section["evaluate"]) train.evaluate = to_bool(f);
  if (Field f = section["allreduce_bucket"]) {
    train.allreduce_bucket = to_size(f);
    if (train.allreduce_bucket == 0) f.fail("expected a size > 0");
  }
  return train;
}

BalanceConfig read_balance(const Field& field, const TrainConfig& train) {
  const Section section(field);
  section.allow({"split", "manual", "granularity", "candidates", "workspace", "workspace_limit",
                 "allreduce"});
  BalanceConfig balance;
  if (Field f = section["split"]) balance.split = to_choice(f, balancer::kSplitModeNames);
  if (Field f = section["granularity"]) balance.granularity = to_int(f, at_least(1));
  if (Field f = section["candidates"]) {
    balance.candidates = to_choice(f, balancer::kCandidateSizesNames);
  }
  if (Field f = section["workspace"]) {
    balance.workspace = to_choice(f, balancer::kWorkspacePolicyNames);
  }
  if (Field f = section["workspace_limit"]) balance.workspace_limit = to_size(f);
  if (Field f = section["allreduce"]) {
    balance.allreduce = to_choice(f, balancer::kAllreduceCostNames);
  }
  if (balance.workspace == balancer::WorkspacePolicy::kWd && balance.workspace_limit == 0) {
    section["workspace_limit"].fail("wd divides a total budget: expected a size > 0");
  }
  const Field manual = section["manual"];
  if (balance.split == balancer::SplitMode::kManual) {
    if (!manual) field.fail("missing manual (split: manual needs the per-rank batch sizes)");
    int64_t sum = 0;
    for (const Field& item : manual.items("a list of per-rank batch sizes")) {
      balance.manual.push_back(to_int(item, at_least(0)));
      sum += balance.manual.back();
    }
    if (sum != train.batch) {
      manual.fail("the per-rank batches sum to " + std::to_string(sum) + " but train.batch is " +
                  std::to_string(train.batch));
    }
  } else if (manual) {
    manual.fail("only used with split: manual");
  }
  return balance;
}

ProfileConfig read_profile(const Field& field) {
  const Section section(field);
  section.allow({"db", "batches", "micro_batches", "warmup", "repeats", "steps"});
  ProfileConfig profile;
  if (Field f = section["db"]) profile.db = to_path(f);
  if (Field f = section["batches"]) {
    for (const Field& item : f.items("a list of per-rank batch sizes")) {
      profile.batches.push_back(to_int(item, at_least(1)));
    }
  }
  if (Field f = section["micro_batches"]) {
    profile.micro_batches = to_choice(f, balancer::kMicroBatchPolicyNames);
  }
  if (Field f = section["warmup"]) profile.warmup = to_int(f, at_least(0));
  if (Field f = section["repeats"]) profile.repeats = to_int(f, at_least(1));
  if (Field f = section["steps"]) profile.steps = to_bool(f);
  return profile;
}

CheckpointConfig read_checkpoint(const Field& field) {
  const Section section(field);
  section.allow({"dir", "every", "keep", "resume"});
  CheckpointConfig ckpt;
  if (Field f = section["dir"]) ckpt.dir = to_path(f);
  if (Field f = section["every"]) ckpt.every = to_int(f, at_least(0));
  if (Field f = section["keep"]) ckpt.keep = to_int(f, at_least(1));
  if (Field f = section["resume"]) {
    ckpt.resume = to_choice(f, worker::kResumeSettingNames);
    if (ckpt.resume == worker::ResumeSetting::kAuto && ckpt.dir.empty()) f.fail("resume: auto needs checkpoint.dir");
  }
  return ckpt;
}

OptimizerConfig read_optimizer(const Field& field) {
  const Section section(field);
  section.allow(
      {"lr", "momentum", "weight_decay", "schedule", "step_epochs", "gamma", "warmup_steps"});
  OptimizerConfig opt;
  if (Field f = section["lr"]) opt.lr = to_number(f, above(0));
  if (Field f = section["momentum"]) opt.momentum = to_number(f, between(0, 1, false, true));
  if (Field f = section["weight_decay"]) opt.weight_decay = to_number(f, at_least(0));
  if (Field f = section["schedule"]) opt.schedule = to_choice(f, worker::kScheduleKindNames);
  if (Field f = section["step_epochs"]) opt.step_epochs = to_int(f, at_least(1));
  if (Field f = section["gamma"]) opt.gamma = to_number(f, between(0, 1, true, false));
  if (Field f = section["warmup_steps"]) opt.warmup_steps = to_int(f, at_least(0));
  return opt;
}

DeviceConfig read_device(const Field& field) {
  const Section section(field);
  section.allow({"backend", "threads", "memory_limit"});
  DeviceConfig device;
  if (Field f = section["backend"]) device.backend = to_choice(f, {"auto", "cpu", "cuda"});
  if (Field f = section["threads"]) {
    device.threads =
        static_cast<int>(to_int(f, between(0, std::numeric_limits<int>::max(), false, false)));
  }
  if (Field f = section["memory_limit"]) device.memory_limit = to_size(f);
  return device;
}

ConvConfig read_conv(const Field& field) {
  const Section section(field);
  section.allow({"algorithm"});
  ConvConfig conv;
  if (Field f = section["algorithm"]) {
    conv.algorithm = to_choice(f, {"auto", "direct", "winograd", "im2col_gemm"});
  }
  return conv;
}

MemoryConfig read_memory(const Field& field) {
  const Section section(field);
  section.allow({"policy", "planner"});
  MemoryConfig memory;
  if (Field f = section["policy"]) memory.policy = to_choice(f, memory::kPolicyNames);
  if (Field f = section["planner"]) memory.planner = to_choice(f, memory::kPlannerNames);
  return memory;
}

OutputConfig read_output(const Field& field) {
  const Section section(field);
  section.allow({"metrics", "progress", "plan"});
  OutputConfig output;
  if (Field f = section["plan"];
      f && !(f.node().IsNull() || (f.node().IsScalar() && f.node().Scalar().empty()))) {
    output.plan = to_path(f);
  }
  // An empty value (`--set output.metrics=`) turns metrics off.
  if (Field f = section["metrics"];
      f && !(f.node().IsNull() || (f.node().IsScalar() && f.node().Scalar().empty()))) {
    output.metrics = to_path(f);
  }
  if (Field f = section["progress"]) {
    output.progress = to_choice(f, worker::kProgressSettingNames);
  }
  return output;
}

// ---- overrides --------------------------------------------------------------

// Applies "a.b.c=value" to the tree, creating missing sections; "NAME[I]"
// steps into entry I of a list (the path error messages print, e.g.
// model.layers[1].out). The key path is checked later with the rest of the
// config, so an unknown key gets the same message (with --set as its
// origin).
void apply_override(YAML::Node& root, const std::string& arg,
                    std::vector<std::string>& overridden) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("--set " + arg + ": expected KEY.PATH=VALUE, e.g. train.batch=32");
  }
  const std::string key = arg.substr(0, eq);
  std::vector<std::string> parts;
  std::stringstream stream(key);
  for (std::string part; std::getline(stream, part, '.');) parts.push_back(part);
  if (key.back() == '.' ||
      std::any_of(parts.begin(), parts.end(), [](const auto& p) { return p.empty(); })) {
    throw ConfigError("--set " + key + ": empty name in key path");
  }
  // The steps of the path: map keys, and list indices (is_index).
  struct Step {
    std::string name;
    bool is_index = false;
  };
  std::vector<Step> steps;
  for (const std::string& part : parts) {
    size_t at = part.find('[');
    if (at == 0) throw ConfigError("--set " + key + ": '" + part + "' has no name before '['");
    steps.push_back({part.substr(0, at)});
    while (at != std::string::npos) {
      const size_t close = part.find(']', at);
      const std::string digits =
          close == std::string::npos ? "" : part.substr(at + 1, close - at - 1);
      if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }) ||
          digits.size() > 9 || (close + 1 < part.size() && part[close + 1] != '[')) {
        throw ConfigError("--set " + key + ": '" + part +
                          "' is not NAME or NAME[INDEX] (INDEX a number from 0)");
      }
      steps.push_back({digits, true});
      at = close + 1 < part.size() ? close + 1 : std::string::npos;
    }
  }
  YAML::Node value;
  try {
    value = YAML::Load(arg.substr(eq + 1));
  } catch (const YAML::Exception& error) {
    throw ConfigError("--set " + key + ": invalid YAML value: " + error.msg);
  }

  // yaml-cpp nodes are references and `operator=` writes through them, so
  // walking uses reset() to rebind the cursor instead.
  YAML::Node cursor;
  cursor.reset(root);
  std::string path;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string what = path.empty() ? "the config" : path;
    const bool last = i + 1 == steps.size();
    if (steps[i].is_index) {
      const size_t index = std::stoul(steps[i].name);
      if (!cursor.IsSequence()) throw ConfigError("--set " + key + ": " + what + " is not a list");
      if (index >= cursor.size()) {
        throw ConfigError("--set " + key + ": " + what + " has " + std::to_string(cursor.size()) +
                          " entries, so no [" + std::to_string(index) + "]");
      }
      path += "[" + std::to_string(index) + "]";  // as messages name it: [1], not [01]
      if (last) {
        cursor[index] = value;
        break;
      }
      YAML::Node next = cursor[index];
      cursor.reset(next);
      continue;
    }
    const std::string& name = steps[i].name;
    if (!cursor.IsMap() && !cursor.IsNull()) {
      throw ConfigError("--set " + key + ": " + what + " is not a map of keys");
    }
    path += (path.empty() ? "" : ".") + name;
    if (last) {
      cursor[name] = value;
      break;
    }
    YAML::Node next = cursor[name];
    if (!next.IsDefined()) {
      if (steps[i + 1].is_index) {
        throw ConfigError("--set " + key + ": " + path + " is not in the config, so it has no [" +
                          std::to_string(std::stoul(steps[i + 1].name)) + "]");
      }
      cursor[name] = YAML::Node(YAML::NodeType::Map);
      next.reset(cursor[name]);
      overridden.push_back(path);  // a section the file does not have
    }
    cursor.reset(next);
  }
  overridden.push_back(path);
}

Config parse(const std::string& text, const std::string& file, const fs::path& file_dir,
             const std::vector<std::string>& overrides) {
  Source source{file, file_dir, {}};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    throw ConfigError(file + ":" + std::to_string(error.mark.line + 1) + ":" +
                      std::to_string(error.mark.column + 1) + ": YAML syntax error: " + error.msg);
  }
  for (const auto& arg : overrides) apply_override(root, arg, source.overridden);

  const Section top(Field(source, root, true, "", 0));
  top.allow({"model", "data", "train", "optimizer", "device", "conv", "output", "balance",
             "checkpoint", "profile", "memory"});
  Config config;
  config.path = file;
  const std::string why = "every config needs model and data sections";
  config.data = read_data(top.required("data", why));
  config.model = read_model(top.required("model", why), config.data);
  if (Field f = top["train"]) config.train = read_train(f);
  if (Field f = top["optimizer"]) config.optimizer = read_optimizer(f);
  if (Field f = top["device"]) config.device = read_device(f);
  if (Field f = top["conv"]) config.conv = read_conv(f);
  if (Field f = top["output"]) config.output = read_output(f);
  if (Field f = top["balance"]) config.balance = read_balance(f, config.train);
  if (Field f = top["checkpoint"]) config.checkpoint = read_checkpoint(f);
  if (Field f = top["profile"]) config.profile = read_profile(f);
  if (Field f = top["memory"]) config.memory = read_memory(f);
  if (config.profile.db.empty()) {
    config.profile.db = (file_dir / "perf.db").lexically_normal().string();
  }
  return config;
}

// ---- dump -------------------------------------------------------------------

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

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ignored;
  if (fs::is_directory(path, ignored)) {
    throw ConfigError("cannot open config " + path + ": is a directory");
  }
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot open config " + path + ": " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError("cannot read config " + path + ": " + std::strerror(errno));
  return parse(text.str(), path, fs::absolute(path).parent_path(), overrides);
}

Config parse_config(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  return parse(yaml_text, origin, fs::current_path(), overrides);
}


std::string to_yaml(const Config& config) {
  YAML::Emitter out;
  if (!config.path.empty()) {
    out << YAML::Comment("effective configuration of " + config.path) << YAML::Newline;
  }
  out << YAML::BeginMap;

  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (!config.model.preset.empty()) {
    out << YAML::Key << "preset" << YAML::Value << config.model.preset;
    out << YAML::Key << "classes" << YAML::Value << config.model.classes;
  } else {
    out << YAML::Key << "layers" << YAML::Value << YAML::BeginSeq;
    for (const auto& layer : config.model.layers) emit_layer(out, layer);
    out << YAML::EndSeq;
  }
  out << YAML::EndMap;

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
  } else {
    out << YAML::Key << "shape" << YAML::Value << YAML::Flow << YAML::BeginSeq << data.shape.c
        << data.shape.h << data.shape.w << YAML::EndSeq;
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
  out << YAML::EndMap;

  const TrainConfig& train = config.train;
  out << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "batch" << YAML::Value << train.batch;
  out << YAML::Key << "epochs" << YAML::Value << train.epochs;
  out << YAML::Key << "max_steps" << YAML::Value << train.max_steps;
  out << YAML::Key << "seed" << YAML::Value << train.seed;
  out << YAML::Key << "log_every" << YAML::Value << train.log_every;
  out << YAML::Key << "evaluate" << YAML::Value << train.evaluate;
  out << YAML::Key << "allreduce_bucket" << YAML::Value << format_size(train.allreduce_bucket);
  out << YAML::EndMap;

  const OptimizerConfig& opt = config.optimizer;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "lr" << YAML::Value << format_number(opt.lr);
  out << YAML::Key << "momentum" << YAML::Value << format_number(opt.momentum);
  out << YAML::Key << "weight_decay" << YAML::Value << format_number(opt.weight_decay);
  out << YAML::Key << "schedule" << YAML::Value << worker::schedule_kind_name(opt.schedule);
  out << YAML::Key << "step_epochs" << YAML::Value << opt.step_epochs;
  out << YAML::Key << "gamma" << YAML::Value << format_number(opt.gamma);
  out << YAML::Key << "warmup_steps" << YAML::Value << opt.warmup_steps;
  out << YAML::EndMap;

  out << YAML::Key << "device" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "backend" << YAML::Value << config.device.backend;
  out << YAML::Key << "threads" << YAML::Value << config.device.threads;
  out << YAML::Key << "memory_limit" << YAML::Value << format_size(config.device.memory_limit);
  out << YAML::EndMap;

  out << YAML::Key << "conv" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "algorithm" << YAML::Value << config.conv.algorithm;
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
  if (!config.balance.manual.empty()) {
    out << YAML::Key << "manual" << YAML::Value << YAML::Flow << config.balance.manual;
  }
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
  out << YAML::Key << "steps" << YAML::Value << profile.steps;
  out << YAML::EndMap;

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace vtrain::config
