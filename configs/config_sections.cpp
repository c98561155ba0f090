// Config loading, the sections: every map is checked against the keys it
// may hold, every value against its type and range (see config.cpp).
#include <algorithm>
#include <limits>
#include <regex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "configs/internal/config_parts.h"
#include "model_io/onnx.h"

namespace vtrain::config::internal {
namespace {

using namespace common::yaml;

// Batch sizes, channel and feature counts, classes, image sizes and windows
// become tensor dimensions, which cuDNN takes as 32-bit ints.
constexpr int64_t kMaxDimension = std::numeric_limits<int32_t>::max();

void check_dimension(const Field& field, int64_t value) {
  if (value > kMaxDimension) {
    field.fail("expected at most " + std::to_string(kMaxDimension) +
               " (a tensor dimension, 32-bit in cuDNN), got " + std::to_string(value));
  }
}

// An integer >= lo that can be a tensor dimension.
int64_t to_dimension(const Field& field, int64_t lo) {
  const int64_t value = to_int(field, at_least(static_cast<double>(lo)));
  check_dimension(field, value);
  return value;
}

// kernel / stride / pad (to_pair) within a tensor dimension.
std::pair<int64_t, int64_t> to_dimension_pair(const Field& field, int64_t lo) {
  const auto pair = to_pair(field, at_least(static_cast<double>(lo)));
  check_dimension(field, std::max(pair.first, pair.second));
  return pair;
}

// Per-sample channels of a data source (for mean/std lengths).
int64_t data_channels(const DataConfig& data) {
  if (data.kind == worker::DataKind::kIdx) return 1;      // IDX images are greyscale
  if (data.kind == worker::DataKind::kCifar10) return 3;  // RGB
  return data.shape.c;
}

bool image_files(const DataConfig& data) {
  return data.kind == worker::DataKind::kImageFolder || data.kind == worker::DataKind::kShards;
}

// [lo, hi] with lo <= hi, each within `bounds`.
std::pair<double, double> to_range(const Field& field, const Bounds& bounds) {
  const std::vector<Field> items = field.items("a list [lo, hi]");
  if (items.size() != 2) field.fail("expected a list [lo, hi], got a list of " + std::to_string(items.size()));
  const double lo = to_number(items[0], bounds), hi = to_number(items[1], bounds);
  if (hi < lo) field.fail("expected lo <= hi, got [" + format_number(lo) + ", " + format_number(hi) + "]");
  return {lo, hi};
}

// data.train_transform / data.test_transform: {crop, flip, scale, ratio, pad, resize}.
worker::TransformOptions read_transform(const Field& field, worker::CropKind default_crop) {
  worker::TransformOptions t;
  t.crop = default_crop;
  if (!field) return t;
  const Section section(field);
  section.allow({"crop", "flip", "scale", "ratio", "pad", "resize"});
  if (Field f = section["crop"]) t.crop = to_choice(f, worker::kCropKindNames);
  if (Field f = section["flip"]) t.flip = to_bool(f);
  if (Field f = section["scale"]) std::tie(t.scale_min, t.scale_max) = to_range(f, between(0, 1, true, false));
  if (Field f = section["ratio"]) std::tie(t.ratio_min, t.ratio_max) = to_range(f, above(0));
  if (Field f = section["pad"]) t.pad = to_int(f, between(0, 4096, false, false));
  if (Field f = section["resize"]) t.resize = to_int(f, between(0, 1 << 30, false, false));  // 0: auto
  return t;
}

// data.shape: [C, H, W].
worker::Shape to_shape(const Field& shape) {
  const std::vector<Field> dims = shape.items("a list [C, H, W]");
  if (dims.size() != 3) {
    shape.fail("expected a list [C, H, W], got a list of " + std::to_string(dims.size()));
  }
  return worker::Shape{1, to_dimension(dims[0], 1), to_dimension(dims[1], 1), to_dimension(dims[2], 1)};
}

// imagefolder: a folder or a list per split (a list's paths are relative to
// the folder when both are given).
void read_image_folders(const Section& section, DataConfig& data) {
  for (auto [dir_key, list_key, dir, list] :
       {std::tuple{"train_dir", "train_list", &data.train_dir, &data.train_list},
        std::tuple{"test_dir", "test_list", &data.test_dir, &data.test_list}}) {
    const Field dir_field = section[dir_key];
    const Field list_field = section[list_key];
    if (!dir_field && !list_field) {
      dir_field.fail(std::string("missing (kind imagefolder needs ") + dir_key + " or " + list_key + ")");
    }
    if (dir_field) *dir = to_path(dir_field);
    if (list_field) *list = to_path(list_field);
  }
  if (Field f = section["skip_unreadable"]) data.skip_unreadable = to_bool(f);
}

// A list of shard patterns, or one.
std::vector<std::string> to_patterns(const Field& field) {
  if (field.node().IsScalar()) return {to_path(field)};
  return to_paths(field);
}

// data.workers: one count for every rank, or a list of one per rank.
void read_workers(const Field& field, DataConfig& data) {
  const auto range = between(0, 1024, false, false);
  if (!field.node().IsSequence()) {
    data.workers = to_int(field, range);
    return;
  }
  for (const Field& item : field.items("a list of worker counts, one per rank")) {
    data.workers_per_rank.push_back(to_int(item, range));
  }
  if (data.workers_per_rank.empty()) field.fail("expected a worker count per rank, got an empty list");
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
  } else if (data.kind == worker::DataKind::kImageFolder) {
    kind_keys = {"train_dir", "test_dir", "train_list", "test_list", "skip_unreadable", "shape"};
  } else if (data.kind == worker::DataKind::kShards) {
    kind_keys = {"train_shards", "test_shards", "shape"};
  } else {
    kind_keys = {"shape", "classes", "train_size", "test_size"};
  }
  Keys allowed = {"kind"};
  allowed.insert(allowed.end(), kind_keys.begin(), kind_keys.end());
  allowed.insert(allowed.end(), {"mean", "std", "prefetch", "train_transform", "test_transform", "workers",
                                 "prefetch_batches"});
  section.allow(allowed, "for kind " + kind_name);
  // Before the kind's required keys, so that a transform's own errors show
  // whatever else is missing.
  const worker::CropKind crop = image_files(data) ? worker::CropKind::kCenter : worker::CropKind::kNone;
  data.train_transform = read_transform(section["train_transform"], crop);
  data.test_transform = read_transform(section["test_transform"], crop);
  if (Field f = section["workers"]) read_workers(f, data);
  if (Field f = section["prefetch_batches"]) data.prefetch_batches = to_int(f, between(1, 64, false, false));

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
  } else if (data.kind == worker::DataKind::kImageFolder) {
    read_image_folders(section, data);
  } else if (data.kind == worker::DataKind::kShards) {
    const std::string why = "kind shards needs train_shards and test_shards";
    data.train_shards = to_patterns(section.required("train_shards", why));
    data.test_shards = to_patterns(section.required("test_shards", why));
  }
  if (image_files(data)) {
    data.shape = {1, 3, 224, 224};
    if (Field shape = section["shape"]) data.shape = to_shape(shape);
  } else if (data.kind == worker::DataKind::kSynthetic) {
    if (Field shape = section["shape"]) data.shape = to_shape(shape);
    if (Field classes = section["classes"]) data.classes = to_dimension(classes, 2);
    if (Field size = section["train_size"]) data.train_size = to_int(size, at_least(1));
    if (Field size = section["test_size"]) data.test_size = to_int(size, at_least(1));
  }

  if (Field f = section["prefetch"]) data.prefetch = to_choice(f, common::kAutoOnOffNames);
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
    case LayerType::kConv: return {"out", "kernel", "stride", "pad", "bias", "groups"};
    case LayerType::kRelu: return {};
    case LayerType::kPool: return {"mode", "kernel", "stride", "pad", "global"};
    case LayerType::kFc: return {"out", "bias"};
    case LayerType::kBatchNorm: return {"eps", "momentum"};
    case LayerType::kAdd: return {};
    case LayerType::kConcat: return {};
    case LayerType::kSilu:
    case LayerType::kGelu:
    case LayerType::kSigmoid:
    case LayerType::kRelu6:
    case LayerType::kMul: return {};
    case LayerType::kDropout: return {"p"};
  }
  return {};
}

worker::LayerType to_layer_type(const Field& field) {
  const Keys known = common::names_of(worker::kLayerTypeNames);
  const std::string name = to_string(field, "a layer type (" + join(known) + ")");
  if (auto type = common::find_named(worker::kLayerTypeNames, name)) return *type;
  field.fail("unknown layer type '" + name + "' (known: " + join(known) + ")");
}

// kernel, stride and pad of a conv or pool layer.
void read_window(const Section& section, const std::string& type_name, worker::LayerSpec& layer) {
  if (layer.global) {
    // A global window is the whole input plane: nothing to size.
    for (const char* key : {"kernel", "stride", "pad"}) {
      if (Field field = section[key]) field.fail("not used with global: true");
    }
    return;
  }
  const Field kernel = section.required("kernel", "a " + type_name + " layer needs kernel");
  std::tie(layer.kernel_h, layer.kernel_w) = to_dimension_pair(kernel, 1);
  // Pooling windows default to not overlapping (stride = kernel), the
  // usual choice; convolutions default to stride 1.
  if (layer.type == worker::LayerType::kPool) {
    std::tie(layer.stride_h, layer.stride_w) = std::pair(layer.kernel_h, layer.kernel_w);
  }
  if (Field stride = section["stride"]) {
    std::tie(layer.stride_h, layer.stride_w) = to_dimension_pair(stride, 1);
  }
  if (Field pad = section["pad"]) {
    std::tie(layer.pad_h, layer.pad_w) = to_dimension_pair(pad, 0);
  }
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
    layer.out = to_dimension(section.required("out", "a " + type_name + " layer needs out"), 1);
  }
  if (Field bias = section["bias"]) layer.bias = to_bool(bias);
  // Whether groups divides the channels needs the input's shape: Graph::build checks it.
  if (Field groups = section["groups"]) layer.groups = to_dimension(groups, 1);
  if (Field p = section["p"]) {
    layer.dropout_p = static_cast<float>(to_number(p, between(0, 1, false, true)));
  }

  if (layer.type == LayerType::kPool) {
    if (Field mode = section["mode"]) {
      layer.pool = to_choice(mode, {"max", "avg"}) == "max" ? worker::PoolKind::kMax
                                                            : worker::PoolKind::kAverage;
    }
    if (Field global = section["global"]) layer.global = to_bool(global);
  }
  if (layer.type == LayerType::kConv || layer.type == LayerType::kPool) {
    read_window(section, type_name, layer);
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

// model.onnx: the layers and initial weights of an ONNX file, read whole
// (model_io/onnx.h) or refused naming the file and the node.
void read_onnx_model(const Field& field, ModelConfig& model) {
  model.onnx = to_path(field);
  try {
    model_io::OnnxModel read = model_io::read_onnx(model.onnx);
    model.layers = std::move(read.layers);
    model.onnx_input = read.input;
    model.initial_weights = std::move(read.weights);
  } catch (const model_io::OnnxError& e) {
    field.fail(e.what());
  }
}

ModelConfig read_model(const Field& field, const DataConfig& data) {
  const Section section(field);
  section.allow({"preset", "classes", "layers", "onnx", "batch_norm", "init", "init_skip"});
  const Field preset = section["preset"];
  const Field layers = section["layers"];
  const Field onnx = section["onnx"];
  const Field classes = section["classes"];
  const Keys known = worker::preset_names();

  ModelConfig model;
  // Synthetic data says how many classes it has; the IDX and CIFAR-10
  // datasets we read have ten.
  const bool synthetic = data.kind == worker::DataKind::kSynthetic;
  model.classes = synthetic ? data.classes : 10;
  if (int(bool(preset)) + int(bool(layers)) + int(bool(onnx)) > 1) {
    // Blame a --set that caused the clash, else the section.
    const Field& culprit = layers.from_override()   ? layers
                           : preset.from_override() ? preset
                           : onnx.from_override()   ? onnx
                                                    : field;
    culprit.fail("give one of preset, layers and onnx, not several");
  }
  if (!preset && !layers && !onnx) {
    field.fail("missing preset, layers or onnx (known presets: " + join(known) + ")");
  }

  if (preset) {
    model.preset = to_string(preset, "a preset name");
    if (std::find(known.begin(), known.end(), model.preset) == known.end()) {
      preset.fail("unknown preset '" + model.preset + "' (known: " + join(known) + ")");
    }
    if (classes) {
      model.classes = to_dimension(classes, 2);
      if (synthetic && model.classes != data.classes) {
        classes.fail(std::to_string(model.classes) + " classes, but data.classes is " +
                     std::to_string(data.classes));
      }
    }
  } else {
    if (classes) {
      classes.fail("only used with a preset (with layers or onnx, the last layer's out sets the "
                   "classes)");
    }
    if (layers) {
      model.layers = read_layers(layers);
    } else {
      read_onnx_model(onnx, model);
    }
  }
  if (Field f = section["batch_norm"]) model.batch_norm = to_choice(f, worker::kBatchNormModeNames);
  if (Field f = section["init"]) model.init = to_path(f);
  if (Field f = section["init_skip"]) {
    if (model.init.empty()) f.fail("only used with model.init (the layers it leaves out)");
    for (const Field& item : f.items("a list of layer names")) {
      model.init_skip.push_back(to_string(item, "a layer name"));
    }
  }
  return model;
}

worker::LossScalingSettings read_loss_scaling(const Field& field) {
  const Section section(field);
  section.allow({"mode", "initial", "growth_interval"});
  worker::LossScalingSettings l;
  if (Field f = section["mode"]) l.mode = to_choice(f, common::kAutoOnOffNames);
  if (Field f = section["initial"]) {
    l.initial = to_number(f, above(0));
    if (!worker::LossScaler::valid_initial(l.initial)) {
      f.fail("expected a power of two in [2^-24, 2^127] (scaling by one is exact)");
    }
  }
  if (Field f = section["growth_interval"]) l.growth_interval = to_int(f, at_least(1));
  return l;
}

// train.precision: a precision name, auto, a list (one per rank) or a map
// from device names to precisions.
PrecisionChoice read_precision_choice(const Field& field) {
  PrecisionChoice choice;
  const YAML::Node& node = field.node();
  if (node.IsScalar() && node.Scalar() == "auto") {
    choice.form = PrecisionChoice::Form::kAuto;
  } else if (node.IsSequence()) {
    choice.form = PrecisionChoice::Form::kPerRank;
    for (const Field& item : field.items("a list of precisions, one per rank")) {
      choice.per_rank.push_back(to_choice(item, common::kPrecisionNames));
    }
    if (choice.per_rank.empty()) field.fail("expected a precision per rank, got an empty list");
  } else if (node.IsMap()) {
    choice.form = PrecisionChoice::Form::kByDevice;
    const Section devices(field);  // refuses duplicate names
    for (const auto& entry : node) {
      const std::string name = entry.first.Scalar();
      choice.by_device.emplace_back(name, to_choice(devices[name], common::kPrecisionNames));
    }
  } else {
    const std::string name = to_string(field, "a precision, auto, a list or a map");
    const auto one = common::find_named(common::kPrecisionNames, name);
    if (!one) {
      field.fail("unknown value '" + name + "' (allowed: " +
                 join(names_of(common::kPrecisionNames)) +
                 ", auto); or a list of one per rank, or a map from device names");
    }
    choice.one = *one;
  }
  return choice;
}

// train.precisions: auto's candidates, in order of preference.
std::vector<common::Precision> read_precisions(const Field& field) {
  std::vector<common::Precision> out;
  for (const Field& item : field.items("a list of precisions in order of preference")) {
    const common::Precision p = to_choice(item, common::kPrecisionNames);
    if (std::find(out.begin(), out.end(), p) != out.end()) {
      item.fail(std::string("'") + common::precision_name(p) + "' is listed twice");
    }
    out.push_back(p);
  }
  if (out.empty()) field.fail("expected at least one precision, got an empty list");
  return out;
}

TrainConfig read_train(const Field& field) {
  const Section section(field);
  section.allow({"batch", "epochs", "max_steps", "seed", "log_every", "evaluate",
                 "allreduce_bucket", "precision", "precisions", "loss_scaling", "gradient_allreduce",
                 "step_timeout", "label_smoothing", "ema", "target_accuracy"});
  TrainConfig train;
  if (Field f = section["batch"]) train.batch = to_dimension(f, 1);
  if (Field f = section["epochs"]) train.epochs = to_int(f, at_least(1));
  if (Field f = section["max_steps"]) train.max_steps = to_int(f, at_least(0));
  if (Field f = section["seed"]) train.seed = to_uint64(f);
  if (Field f = section["log_every"]) train.log_every = to_int(f, at_least(1));
  if (Field f = section["evaluate"]) train.evaluate = to_bool(f);
  if (Field f = section["step_timeout"]) train.step_timeout = to_number(f, at_least(0));
  if (Field f = section["label_smoothing"]) {
    train.label_smoothing = to_number(f, between(0, 1, false, true));
  }
  if (Field f = section["ema"]) train.ema = to_number(f, between(0, 1, false, true));
  if (Field f = section["target_accuracy"]) {
    train.target_accuracy = to_number(f, between(0, 1, false, false));
    if (train.target_accuracy > 0 && !train.evaluate) {
      f.fail("needs train.evaluate: true (the target is the test accuracy after an epoch)");
    }
  }
  if (Field f = section["precision"]) train.precision_choice = read_precision_choice(f);
  if (Field f = section["precisions"]) train.precisions = read_precisions(f);
  if (Field f = section["loss_scaling"]) train.loss_scaling = read_loss_scaling(f);
  if (Field f = section["gradient_allreduce"]) {
    train.gradient_allreduce = to_choice(f, worker::kGradientAllreduceNames);
    // Under a precision per rank, half is taken where every rank shares
    // one half type (worker::wire_type).
    if (train.gradient_allreduce == worker::GradientAllreduce::kHalf &&
        train.precision_choice.form == PrecisionChoice::Form::kOne &&
        !common::is_half(train.precision_choice.one)) {
      const std::string p = common::precision_name(train.precision_choice.one);
      f.fail("expected fp32 under train.precision " + p + " (half is the half type of " +
             "train.precision bf16 or fp16)");
    }
  }
  if (Field f = section["allreduce_bucket"]) {
    train.allreduce_bucket = to_size(f);
    if (train.allreduce_bucket == 0) f.fail("expected a size > 0");
  }
  return train;
}

worker::RebalanceSettings read_rebalance(const Field& field) {
  const Section section(field);
  section.allow({"enabled", "threshold", "window", "patience", "min_gain", "min_gain_ms",
                 "probe_every"});
  worker::RebalanceSettings r;
  if (Field f = section["enabled"]) r.enabled = to_bool(f);
  if (Field f = section["threshold"]) r.threshold = to_number(f, above(0));
  if (Field f = section["window"]) r.window = to_int(f, at_least(1));
  if (Field f = section["patience"]) r.patience = to_int(f, at_least(1));
  if (Field f = section["min_gain"]) r.min_gain = to_number(f, at_least(0));
  if (Field f = section["min_gain_ms"]) r.min_gain_ms = to_number(f, at_least(0));
  if (Field f = section["probe_every"]) r.probe_every = to_int(f, at_least(0));
  return r;
}

BalanceConfig read_balance(const Field& field, const TrainConfig& train) {
  const Section section(field);
  section.allow({"split", "manual", "granularity", "candidates", "workspace", "workspace_limit",
                 "allreduce", "input_aware", "rebalance"});
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
  if (Field f = section["input_aware"]) balance.input_aware = to_bool(f);
  if (Field f = section["rebalance"]) balance.rebalance = read_rebalance(f);
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
  section.allow({"db", "batches", "micro_batches", "warmup", "repeats", "steps", "step_rounds"});
  ProfileConfig profile;
  if (Field f = section["db"]) profile.db = to_path(f);
  if (Field f = section["batches"]) {
    for (const Field& item : f.items("a list of per-rank batch sizes")) {
      profile.batches.push_back(to_dimension(item, 1));
    }
  }
  if (Field f = section["micro_batches"]) {
    profile.micro_batches = to_choice(f, balancer::kMicroBatchPolicyNames);
  }
  // The profiler counts runs in an int.
  constexpr double kMaxRuns = std::numeric_limits<int>::max();
  if (Field f = section["warmup"]) profile.warmup = to_int(f, between(0, kMaxRuns, false, false));
  if (Field f = section["repeats"]) profile.repeats = to_int(f, between(1, kMaxRuns, false, false));
  if (Field f = section["step_rounds"]) {
    profile.step_rounds = to_int(f, between(1, kMaxStepRounds, false, false));
  }
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
    if (ckpt.resume != worker::ResumeSetting::kNever && ckpt.dir.empty()) {
      f.fail(std::string("resume: ") + common::name_of(worker::kResumeSettingNames, ckpt.resume) +
             " needs checkpoint.dir");
    }
  }
  return ckpt;
}

// A key that only some optimizer types read: set to other than its default
// under another type it would silently do nothing, so it is refused (its
// default, such as momentum 0, which --set can still give, is not).
void check_used_by(const Field& f, bool changed, worker::OptimizerKind type,
                   std::initializer_list<worker::OptimizerKind> users) {
  if (!f || !changed || std::find(users.begin(), users.end(), type) != users.end()) return;
  std::string names;
  for (const worker::OptimizerKind k : users) {
    names += (names.empty() ? "" : " or ") + std::string(common::name_of(worker::kOptimizerKindNames, k));
  }
  f.fail("only used with optimizer.type " + names + " (this config's type is " +
         common::name_of(worker::kOptimizerKindNames, type) + ")");
}

// optimizer.betas: [beta1, beta2], each in [0, 1).
void read_betas(const Field& f, OptimizerConfig& opt) {
  const std::string expected = "expected a list [beta1, beta2] of numbers in [0, 1), got ";
  if (!f.node().IsSequence()) f.fail(expected + describe_node(f.node()));
  if (f.node().size() != 2) f.fail(expected + "a list of " + std::to_string(f.node().size()));
  const std::vector<Field> items = f.items("[beta1, beta2]");
  opt.beta1 = to_number(items[0], between(0, 1, false, true));
  opt.beta2 = to_number(items[1], between(0, 1, false, true));
}

OptimizerConfig read_optimizer(const Field& field) {
  using worker::OptimizerKind;
  const Section section(field);
  section.allow({"type", "lr", "momentum", "nesterov", "weight_decay", "betas", "eps", "trust",
                 "no_decay", "clip_norm", "schedule", "step_epochs", "gamma", "warmup_steps"});
  OptimizerConfig opt;
  if (Field f = section["type"]) opt.type = to_choice(f, worker::kOptimizerKindNames);
  if (Field f = section["lr"]) opt.lr = to_number(f, above(0));
  if (Field f = section["momentum"]) opt.momentum = to_number(f, between(0, 1, false, true));
  if (Field f = section["nesterov"]) {
    opt.nesterov = to_bool(f);
    if (opt.nesterov && opt.momentum == 0) f.fail("true needs optimizer.momentum > 0");
  }
  if (Field f = section["weight_decay"]) opt.weight_decay = to_number(f, at_least(0));
  if (Field f = section["betas"]) read_betas(f, opt);
  if (Field f = section["eps"]) opt.eps = to_number(f, above(0));
  if (Field f = section["trust"]) opt.trust = to_number(f, above(0));
  if (Field f = section["no_decay"]) {
    for (const Field& item : f.items("a list of parameter kinds (batchnorm, bias)")) {
      const worker::ParamKind kind = to_choice(item, worker::kNoDecayNames);
      if (std::find(opt.no_decay.begin(), opt.no_decay.end(), kind) != opt.no_decay.end()) {
        item.fail("'" + std::string(common::name_of(worker::kNoDecayNames, kind)) +
                  "' listed twice");
      }
      opt.no_decay.push_back(kind);
    }
  }
  if (Field f = section["clip_norm"]) opt.clip_norm = to_number(f, at_least(0));
  const OptimizerConfig defaults;
  const auto sgd_or_lars = {OptimizerKind::kSgd, OptimizerKind::kLars};
  check_used_by(section["momentum"], opt.momentum != defaults.momentum, opt.type, sgd_or_lars);
  check_used_by(section["nesterov"], opt.nesterov, opt.type, sgd_or_lars);
  check_used_by(section["betas"],
                opt.beta1 != defaults.beta1 || opt.beta2 != defaults.beta2, opt.type,
                {OptimizerKind::kAdamW});
  check_used_by(section["eps"], opt.eps != defaults.eps, opt.type, {OptimizerKind::kAdamW});
  check_used_by(section["trust"], opt.trust != defaults.trust, opt.type, {OptimizerKind::kLars});
  if (Field f = section["schedule"]) opt.schedule = to_choice(f, worker::kScheduleKindNames);
  if (Field f = section["step_epochs"]) opt.step_epochs = to_int(f, at_least(1));
  if (Field f = section["gamma"]) opt.gamma = to_number(f, between(0, 1, true, false));
  if (Field f = section["warmup_steps"]) opt.warmup_steps = to_int(f, at_least(0));
  return opt;
}

// `keys` and the keys of the run settings `section` holds (settings_in).
Keys with_settings(const std::string& section, Keys keys) {
  for (const SectionSetting& s : settings_in(section)) keys.push_back(s.key);
  return keys;
}

// Every run setting under a plain key, each read by its row; the sections
// that hold them allow their keys (with_settings).
void read_settings(const Section& top, Config& config) {
  for (const common::Setting& setting : common::kSettings) {
    if (!setting.plain_config_key) continue;
    const std::string key = setting.config_key;
    const size_t dot = key.find('.');
    const Field section = top[key.substr(0, dot)];
    if (!section) continue;
    if (Field f = Section(section)[key.substr(dot + 1)]) {
      setting.parse(config.compute, to_choice(f, setting.choices()));
    }
  }
}

DeviceConfig read_device(const Field& field) {
  const Section section(field);
  section.allow(with_settings("device", {"backend", "threads", "memory_limit"}));
  DeviceConfig device;
  if (Field f = section["backend"]) device.backend = to_choice(f, worker::kBackendKindNames);
  if (Field f = section["threads"]) {
    device.threads =
        static_cast<int>(to_int(f, between(0, std::numeric_limits<int>::max(), false, false)));
  }
  if (Field f = section["memory_limit"]) device.memory_limit = to_size(f);
  return device;
}

ConvConfig read_conv(const Field& field) {
  const Section section(field);
  section.allow(with_settings("conv", {"algorithm", "cudnn_graph", "graph_engines"}));
  ConvConfig conv;
  if (Field f = section["algorithm"]) {
    // Any backend's name: the network refuses one that no convolution of
    // the model offers on the backend it runs on.
    const std::string what =
        "auto or a convolution algorithm's name (cpu: direct, winograd, im2col_gemm; cuda: "
        "cuDNN's, such as implicit_gemm or algo_1; either with a variant such as /tf32)";
    conv.algorithm = to_string(f, what);
    static const std::regex kName("[a-z0-9_]+(/[a-z0-9_]+)?");
    if (!std::regex_match(conv.algorithm, kName)) {
      f.fail("expected " + what + ", got '" + conv.algorithm + "'");
    }
  }
  if (Field f = section["cudnn_graph"]) conv.cudnn_graph = to_bool(f);
  if (Field f = section["graph_engines"]) {
    conv.graph_engines = static_cast<int>(to_int(f, between(1, 64, false, false)));
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

}  // namespace

Config read_sections(const Field& root) {
  const Section top(root);
  top.allow({"model", "data", "train", "optimizer", "device", "conv", "output", "balance",
             "checkpoint", "profile", "memory"});
  Config config;
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
  if (config.train.precision_choice.form == PrecisionChoice::Form::kOne) {
    config.compute.precision = config.train.precision_choice.one;
  }
  read_settings(top, config);
  return config;
}

std::vector<SectionSetting> settings_in(const std::string& section) {
  std::vector<SectionSetting> found;
  for (const common::Setting& setting : common::kSettings) {
    const std::string_view key = setting.config_key;
    if (setting.plain_config_key && key.starts_with(section + ".")) {
      found.push_back({std::string(key.substr(section.size() + 1)), &setting});
    }
  }
  return found;
}

}  // namespace vtrain::config::internal
