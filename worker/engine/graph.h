// The network graph: named layers with named inputs (a DAG with fork and
// join), validated, topologically ordered, with per-layer output shapes and
// the consumer count of every tensor.
//
// Every layer produces exactly one tensor, named after the layer. The graph
// has one `input` layer (the data) and exactly one sink, the logits, which the
// trainer feeds to softmax cross-entropy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/name_table.h"
#include "worker/device/backend.h"
#include "worker/device/tensor.h"

namespace vtrain::worker {

class GraphError : public std::runtime_error {
 public:
  explicit GraphError(const std::string& message) : std::runtime_error(message), detail_(message) {}
  // An error about one layer: `message` names it (and its line), `detail`
  // is the message without that prefix, for callers that name the layer
  // their own way (the config check: "FILE:LINE: model.layers[i] (name): ").
  GraphError(const std::string& message, std::string layer, std::string detail)
      : std::runtime_error(message), layer_(std::move(layer)), detail_(std::move(detail)) {}

  // The layer the error is about; empty for errors about the whole graph.
  const std::string& layer() const { return layer_; }
  const std::string& detail() const { return detail_; }

 private:
  std::string layer_;
  std::string detail_;
};

enum class LayerType {
  kInput,      // the data; no inputs
  kConv,       // convolution (+ bias)
  kRelu,
  kPool,       // max or average pooling (global: window = input size)
  kFc,         // inner product (+ bias), flattens C x H x W
  kBatchNorm,  // per-channel, learnable scale and shift
  kAdd,        // elementwise sum of two or more inputs (ResNet joins)
  kConcat,     // channel concatenation of two or more inputs (GoogLeNet joins)
};

// Every layer type with its name in a config, in enum order (entry i is
// LayerType i, which tables indexed by LayerType such as the layer
// registry rely on) and in the order messages list them.
inline constexpr auto kLayerTypeNames = std::to_array<common::Named<LayerType>>({
    {LayerType::kInput, "input"},
    {LayerType::kConv, "conv"},
    {LayerType::kRelu, "relu"},
    {LayerType::kPool, "pool"},
    {LayerType::kFc, "fc"},
    {LayerType::kBatchNorm, "batchnorm"},
    {LayerType::kAdd, "add"},
    {LayerType::kConcat, "concat"},
});
inline constexpr size_t kLayerTypeCount = kLayerTypeNames.size();

// Whether `table`'s entry i is about LayerType i, for every i.
template <class Entry, size_t N>
constexpr bool in_layer_type_order(const std::array<Entry, N>& table) {
  for (size_t i = 0; i < N; ++i) {
    if (table[i].value != static_cast<LayerType>(i)) return false;
  }
  return true;
}
static_assert(in_layer_type_order(kLayerTypeNames));

// "input", "conv", "relu", "pool", "fc", "batchnorm", "add", "concat".
const char* layer_type_name(LayerType type);
// Throws GraphError listing the known names.
LayerType parse_layer_type(const std::string& name);

struct LayerSpec {
  std::string name;                 // unique; also the name of its output tensor
  LayerType type = LayerType::kInput;
  std::vector<std::string> inputs;  // producer layer names, in order
  int source_line = 0;              // line in the config file, 0 if from a preset

  // conv / fc
  int64_t out = 0;                  // output channels (conv) or features (fc)
  bool bias = true;
  // conv / pool window
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  // pool
  PoolKind pool = PoolKind::kMax;
  bool global = false;              // window covers the whole input plane (Graph::build
                                    // then sets kernel = input h x w, stride 1, pad 0)
  // batchnorm
  float bn_eps = 1e-5f;
  float bn_momentum = 0.1f;
};

// A conv or pool layer's window as the device's descriptors take it.
inline Window window_of(const LayerSpec& layer) {
  return {layer.kernel_h, layer.kernel_w, layer.stride_h, layer.stride_w, layer.pad_h, layer.pad_w};
}

class Graph {
 public:
  // Validates and orders `layers`. `input` is the per-sample data shape (n
  // ignored). Errors name the layer (and its config line when known): unknown
  // or duplicate names, missing inputs, wrong input counts, cycles, shape
  // mismatches at joins, windows larger than their input, no or several sinks.
  //
  // `precision` (train.precision) is part of the computation: activations
  // and their gradients are stored in its type (activation_type()), and the
  // perf DB keeps its timings apart (profile_key()).
  static Graph build(std::vector<LayerSpec> layers, const Shape& input,
                     common::Precision precision = common::Precision::kFp32);

  // Layers in a topological order (input first; stable w.r.t. the given order),
  // with a global pool's window filled in.
  const std::vector<LayerSpec>& layers() const { return layers_; }
  int size() const { return static_cast<int>(layers_.size()); }
  const LayerSpec& layer(int i) const { return layers_[i]; }
  // Indices (into layers()) of layer i's inputs, in the spec's order.
  const std::vector<int>& inputs(int i) const { return inputs_[i]; }
  // Indices of the layers that read layer i's output, ascending.
  const std::vector<int>& consumers(int i) const { return consumers_[i]; }
  int consumer_count(int i) const { return static_cast<int>(consumers_[i].size()); }
  // Per-sample output shape of layer i (n = 1).
  const Shape& output_shape(int i) const { return shapes_[i]; }
  int find(const std::string& name) const;  // -1 if absent
  int input_index() const { return 0; }
  int sink_index() const { return size() - 1; }  // the logits
  int64_t classes() const { return shapes_.back().per_sample(); }
  // Parameter count (weights + biases + batch-norm scale/shift).
  int64_t parameter_count() const;
  // Short signature of the architecture (layer types, shapes): equal graphs
  // give equal strings. Checkpoints key on it (fp32 master weights resume in
  // any precision).
  std::string signature() const;
  common::Precision precision() const { return precision_; }
  // The same model computed in `precision` (a rank of a job whose ranks
  // differ in precision, as the planner prices it).
  Graph with_precision(common::Precision precision) const {
    Graph g = *this;
    g.precision_ = precision;
    return g;
  }
  DataType activation_type() const { return common::storage_type(precision_); }
  // The activation layout the job asks for (device.layout): its timings are
  // not those of another layout.
  void set_layout_choice(LayoutChoice choice) { layout_choice_ = choice; }
  LayoutChoice layout_choice() const { return layout_choice_; }
  // conv.fuse_relu: whether a convolution with a bias whose only reader is a
  // relu leaves the bias to it, which adds it in forward and sums its
  // gradient in backward (Network pairs them): auto where the backend gains
  // from it (Backend::prefers; worker/engine/fusion_pass.h). It moves time from one layer
  // to another and changes a step's, so it is part of profile_key().
  void set_fuse_relu(common::AutoOnOff setting) { fuse_relu_ = setting; }
  common::AutoOnOff fuse_relu() const { return fuse_relu_; }
  // What the perf DB keys a model's layer and step timings on, and a plan's
  // `model:`: the signature, with "@<precision>" unless fp32, "@<layout>"
  // unless auto and "@fuse_relu=<on|off>" unless auto (auto's keys
  // predate these settings: each device's rows are what auto does there).
  std::string profile_key() const;

 private:
  std::vector<LayerSpec> layers_;
  std::vector<std::vector<int>> inputs_;
  std::vector<std::vector<int>> consumers_;
  std::vector<Shape> shapes_;
  common::Precision precision_ = common::Precision::kFp32;
  LayoutChoice layout_choice_ = LayoutChoice::kAuto;
  common::AutoOnOff fuse_relu_ = common::AutoOnOff::kAuto;
};

// Presets: "lenet", "vgg-small", "alexnet", "overfeat", "googlenet", "vgg16",
// "vgg116", "vgg216", "vgg316", "vgg416", "resnet18", "resnet50".
struct PresetOptions {
  Shape input{1, 1, 28, 28};  // per-sample shape (n ignored)
  int64_t classes = 10;
};
// Throws GraphError listing the known presets for an unknown name.
std::vector<LayerSpec> preset_layers(const std::string& name, const PresetOptions& options);
std::vector<std::string> preset_names();

}  // namespace vtrain::worker
