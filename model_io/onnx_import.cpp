// ONNX in: the nodes of an ONNX graph as vtrain layers, its initializers as
// their weights; the whole result is checked before it is handed out.
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/input_error.h"
#include "common/text.h"
#include "common/text_file.h"
#include "model_io/onnx.h"

namespace vtrain::model_io {
namespace {

using worker::LayerSpec;
using worker::LayerType;

static_assert(std::endian::native == std::endian::little,
              "ONNX raw_data is little-endian: read it byte-swapped on this machine");

// The op types read_onnx turns into layers, or into nothing (aliases of
// their input, constants), in the order errors list them.
const std::vector<std::string>& supported_ops() {
  static const std::vector<std::string> ops = {
      "Conv",    "BatchNormalization", "Relu",     "MaxPool", "AveragePool", "GlobalAveragePool",
      "GlobalMaxPool", "Flatten",      "Reshape",  "Gemm",    "Add",         "Concat",
      "Identity", "Dropout",           "Constant"};
  return ops;
}

// Attributes each op may carry; others are refused rather than ignored
// (one vtrain would not honour changes the numbers).
const std::map<std::string, std::set<std::string>>& allowed_attributes() {
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"Conv", {"kernel_shape", "strides", "pads", "dilations", "group", "auto_pad"}},
      {"BatchNormalization", {"epsilon", "momentum", "training_mode", "spatial", "is_test"}},
      {"MaxPool",
       {"kernel_shape", "strides", "pads", "dilations", "ceil_mode", "storage_order", "auto_pad"}},
      {"AveragePool", {"kernel_shape", "strides", "pads", "ceil_mode", "count_include_pad",
                       "auto_pad"}},
      {"Gemm", {"alpha", "beta", "transA", "transB"}},
      {"Concat", {"axis"}},
      {"Flatten", {"axis"}},
      {"Reshape", {"allowzero"}},
      {"Dropout", {"seed", "ratio", "is_test"}},
      {"Constant", {"value"}},
  };
  return allowed;
}

// Reads one ONNX graph into layers and weights; every error names the file
// and, where one is at fault, the node.
class GraphReader {
 public:
  GraphReader(std::string path, const onnx::GraphProto& graph)
      : path_(std::move(path)), graph_(graph) {}

  OnnxModel read() {
    for (const onnx::TensorProto& t : graph_.initializer()) constants_[t.name()] = &t;
    read_input();
    for (const onnx::NodeProto& n : graph_.node()) read_node(n);
    if (graph_.output_size() != 1) {
      fail("the graph has " + std::to_string(graph_.output_size()) +
           " outputs; vtrain trains a model with one (the logits)");
    }
    const std::string& output = graph_.output(0).name();
    const auto sink = layer_of_.find(output);
    if (sink == layer_of_.end() || sink->second == model_.layers.front().name) {
      fail("the graph's output '" + output + "' is not computed by any layer");
    }
    return std::move(model_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw OnnxError(path_ + ": " + what); }
  [[noreturn]] void fail(const onnx::NodeProto& n, const std::string& what) const {
    fail("node '" + n.name() + "' (" + n.op_type() + "): " + what);
  }

  // The one graph input that is not an initializer: N x C x H x W floats.
  void read_input() {
    const onnx::ValueInfoProto* data = nullptr;
    for (const onnx::ValueInfoProto& v : graph_.input()) {
      if (constants_.contains(v.name())) continue;  // initializers listed as inputs (IR < 4)
      if (data) fail("the graph has several inputs ('" + data->name() + "', '" + v.name() +
                     "'); vtrain feeds one (the images)");
      data = &v;
    }
    if (!data) fail("the graph has no input");
    const onnx::TypeProto_Tensor& type = data->type().tensor_type();
    if (type.elem_type() != onnx::TensorProto::FLOAT) {
      fail("input '" + data->name() + "' is not float32");
    }
    std::vector<int64_t> dims;
    for (const onnx::TensorShapeProto_Dimension& d : type.shape().dim()) {
      dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
    }
    if (dims.size() != 4 || dims[1] <= 0 || dims[2] <= 0 || dims[3] <= 0) {
      fail("input '" + data->name() + "' must be N x C x H x W with C, H and W fixed, got " +
           worker::shape_text(dims));
    }
    model_.input = {1, dims[1], dims[2], dims[3]};
    add_layer(data->name(), LayerType::kInput, {}, data->name());
  }

  // A new layer named after its node (or its output where the node has no
  // name, or one that is taken), producing tensor `output`.
  LayerSpec& add_layer(const std::string& node_name, LayerType type,
                       std::vector<std::string> inputs, const std::string& output) {
    std::string name = node_name.empty() || names_.contains(node_name) ? output : node_name;
    if (!names_.insert(name).second) fail("two layers would be called '" + name + "'");
    LayerSpec& spec = model_.layers.emplace_back();
    spec.name = name;
    spec.type = type;
    spec.inputs = std::move(inputs);
    layer_of_[output] = name;
    return spec;
  }

  // The layer that computes tensor `input` of node n.
  std::string layer_input(const onnx::NodeProto& n, int k) {
    if (k >= n.input_size() || n.input(k).empty()) fail(n, "input " + std::to_string(k) + " is missing");
    const auto it = layer_of_.find(n.input(k));
    if (it != layer_of_.end()) return it->second;
    if (constants_.contains(n.input(k))) {
      fail(n, "input '" + n.input(k) + "' is a constant; vtrain has no layer for an op on constants");
    }
    fail(n, "input '" + n.input(k) + "' is not computed before this node");
  }

  const onnx::TensorProto& constant(const onnx::NodeProto& n, int k) {
    if (k >= n.input_size() || n.input(k).empty()) fail(n, "input " + std::to_string(k) + " is missing");
    const auto it = constants_.find(n.input(k));
    if (it == constants_.end()) {
      fail(n, "input '" + n.input(k) + "' must be an initializer (vtrain reads weights from them)");
    }
    return *it->second;
  }

  static int64_t product(const std::vector<int64_t>& dims) {
    int64_t count = 1;
    for (int64_t d : dims) count *= d;
    return count;
  }

  static std::vector<int64_t> dims_of(const onnx::TensorProto& t) {
    std::vector<int64_t> dims;
    dims.reserve(static_cast<size_t>(t.dims_size()));
    for (int64_t d : t.dims()) dims.push_back(d);
    return dims;
  }

  void check_stored_inline(const onnx::NodeProto& n, const onnx::TensorProto& t) {
    if (t.data_location() == onnx::TensorProto::EXTERNAL) {
      fail(n, "initializer '" + t.name() + "' lies in an external file; vtrain reads weights "
              "stored in the model (save it without external data)");
    }
  }

  std::vector<float> floats(const onnx::NodeProto& n, const onnx::TensorProto& t) {
    check_stored_inline(n, t);
    if (t.data_type() != onnx::TensorProto::FLOAT) {
      fail(n, "initializer '" + t.name() + "' is not float32 (data type " +
              std::to_string(t.data_type()) + ")");
    }
    const auto count = static_cast<size_t>(product(dims_of(t)));
    std::vector<float> values(count);
    if (t.has_raw_data()) {
      if (t.raw_data().size() != count * sizeof(float)) {
        fail(n, "initializer '" + t.name() + "' holds " + std::to_string(t.raw_data().size()) +
                " bytes for shape " + worker::shape_text(dims_of(t)));
      }
      std::memcpy(values.data(), t.raw_data().data(), t.raw_data().size());
    } else {
      if (static_cast<size_t>(t.float_data_size()) != count) {
        fail(n, "initializer '" + t.name() + "' holds " + std::to_string(t.float_data_size()) +
                " values for shape " + worker::shape_text(dims_of(t)));
      }
      std::copy(t.float_data().begin(), t.float_data().end(), values.begin());
    }
    return values;
  }

  std::vector<int64_t> int64s(const onnx::NodeProto& n, const onnx::TensorProto& t) {
    check_stored_inline(n, t);
    if (t.data_type() != onnx::TensorProto::INT64) {
      fail(n, "'" + t.name() + "' is not an int64 tensor");
    }
    const auto count = static_cast<size_t>(product(dims_of(t)));
    std::vector<int64_t> values(count);
    if (t.has_raw_data()) {
      if (t.raw_data().size() != count * sizeof(int64_t)) fail(n, "'" + t.name() + "' is torn");
      std::memcpy(values.data(), t.raw_data().data(), t.raw_data().size());
    } else {
      if (static_cast<size_t>(t.int64_data_size()) != count) fail(n, "'" + t.name() + "' is torn");
      std::copy(t.int64_data().begin(), t.int64_data().end(), values.begin());
    }
    return values;
  }

  void add_weight(const std::string& name, std::vector<int64_t> shape, std::vector<float> values) {
    model_.weights.push_back({name, std::move(shape), std::move(values)});
  }

  // --- attributes
  const onnx::AttributeProto* attribute(const onnx::NodeProto& n, const std::string& name) {
    for (const onnx::AttributeProto& a : n.attribute()) {
      if (a.name() == name) return &a;
    }
    return nullptr;
  }
  int64_t int_attribute(const onnx::NodeProto& n, const std::string& name, int64_t fallback) {
    const onnx::AttributeProto* a = attribute(n, name);
    return a ? a->i() : fallback;
  }
  float float_attribute(const onnx::NodeProto& n, const std::string& name, float fallback) {
    const onnx::AttributeProto* a = attribute(n, name);
    return a ? a->f() : fallback;
  }
  std::vector<int64_t> ints_attribute(const onnx::NodeProto& n, const std::string& name,
                                      std::vector<int64_t> fallback) {
    const onnx::AttributeProto* a = attribute(n, name);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : fallback;
  }

  void check_attributes(const onnx::NodeProto& n) {
    const auto allowed = allowed_attributes().find(n.op_type());
    for (const onnx::AttributeProto& a : n.attribute()) {
      if (allowed == allowed_attributes().end() || !allowed->second.contains(a.name())) {
        fail(n, "attribute '" + a.name() + "' is not supported");
      }
    }
  }

  void require(const onnx::NodeProto& n, bool ok, const std::string& what) {
    if (!ok) fail(n, what);
  }

  // kernel_shape, strides, pads of a 2-D conv or pool into `spec`.
  void read_window(const onnx::NodeProto& n, LayerSpec& spec, std::vector<int64_t> kernel) {
    const std::string auto_pad =
        attribute(n, "auto_pad") ? attribute(n, "auto_pad")->s() : std::string("NOTSET");
    require(n, auto_pad == "NOTSET" || auto_pad == "VALID",
            "auto_pad " + auto_pad + " is not supported (give explicit pads)");
    kernel = ints_attribute(n, "kernel_shape", kernel);
    const std::vector<int64_t> strides = ints_attribute(n, "strides", {1, 1});
    const std::vector<int64_t> pads = ints_attribute(n, "pads", {0, 0, 0, 0});
    const std::vector<int64_t> dilations = ints_attribute(n, "dilations", {1, 1});
    require(n, kernel.size() == 2 && strides.size() == 2 && pads.size() == 4,
            "vtrain has 2-D windows only (kernel_shape " + worker::shape_text(kernel) + ")");
    require(n, dilations == std::vector<int64_t>{1, 1},
            "dilations " + worker::shape_text(dilations) + " are not supported");
    require(n, pads[0] == pads[2] && pads[1] == pads[3],
            "pads " + worker::shape_text(pads) + " differ at the two sides; vtrain pads alike");
    require(n, int_attribute(n, "ceil_mode", 0) == 0, "ceil_mode 1 is not supported");
    spec.kernel_h = kernel[0];
    spec.kernel_w = kernel[1];
    spec.stride_h = strides[0];
    spec.stride_w = strides[1];
    spec.pad_h = pads[0];
    spec.pad_w = pads[1];
  }

  void require_outputs(const onnx::NodeProto& n, int count) {
    int used = 0;
    for (const std::string& o : n.output()) used += o.empty() ? 0 : 1;
    require(n, n.output_size() >= 1 && used == count && !n.output(0).empty(),
            "vtrain reads " + std::to_string(count) + " output(s) of it, the node has " +
                std::to_string(used));
  }

  void read_node(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    if (!n.domain().empty() && n.domain() != "ai.onnx") {
      fail(n, "op domain '" + n.domain() + "' is not supported (only the standard ONNX ops)");
    }
    if (std::find(supported_ops().begin(), supported_ops().end(), op) == supported_ops().end()) {
      fail(n, "op type '" + op + "' is not supported (supported: " +
                  common::join(supported_ops(), ", ") + ")");
    }
    check_attributes(n);
    if (op == "Constant") {
      require_outputs(n, 1);
      const onnx::AttributeProto* value = attribute(n, "value");
      require(n, value && value->has_t(), "only a tensor 'value' is supported");
      constants_[n.output(0)] = &value->t();
      return;
    }
    if (op == "Dropout") {
      require(n, n.output_size() == 1 || n.output(1).empty() || !used_later(n.output(1)),
              "its mask output is used");
      alias(n);
      return;
    }
    require_outputs(n, 1);
    if (op == "Identity" || op == "Flatten" || op == "Reshape") return read_alias(n);
    if (op == "Conv") return read_conv(n);
    if (op == "BatchNormalization") return read_batch_norm(n);
    if (op == "Gemm") return read_gemm(n);
    if (op == "Relu") {
      add_layer(n.name(), LayerType::kRelu, {layer_input(n, 0)}, n.output(0));
      return;
    }
    if (op == "Add" || op == "Concat") return read_join(n);
    read_pool(n);
  }

  bool used_later(const std::string& tensor) const {
    for (const onnx::NodeProto& n : graph_.node()) {
      for (const std::string& in : n.input()) {
        if (in == tensor) return true;
      }
    }
    for (const onnx::ValueInfoProto& o : graph_.output()) {
      if (o.name() == tensor) return true;
    }
    return false;
  }

  // The node's output is its input under another name.
  void alias(const onnx::NodeProto& n) { layer_of_[n.output(0)] = layer_input(n, 0); }

  // Identity; Flatten at axis 1; a Reshape to N x F or N x F x 1 x 1: in
  // vtrain an fc flattens its input itself, and a layer's output of F
  // values is already F x 1 x 1, so none of them is a layer.
  void read_alias(const onnx::NodeProto& n) {
    if (n.op_type() == "Flatten") {
      require(n, int_attribute(n, "axis", 1) == 1, "only axis 1 (flatten all but the batch)");
    } else if (n.op_type() == "Reshape") {
      const std::vector<int64_t> shape = int64s(n, constant(n, 1));
      const bool to_flat = shape.size() == 2 && shape[1] != 0;
      const bool to_column = shape.size() == 4 && shape[1] != 0 && shape[2] == 1 && shape[3] == 1;
      require(n, to_flat || to_column,
              "only a Reshape that flattens (to N x F or N x F x 1 x 1) is supported, not to " +
                  worker::shape_text(shape));
    }
    alias(n);
  }

  void read_conv(const onnx::NodeProto& n) {
    require(n, int_attribute(n, "group", 1) == 1,
            "group " + std::to_string(int_attribute(n, "group", 1)) +
                " (a grouped convolution) is not supported");
    const std::string x = layer_input(n, 0);
    const onnx::TensorProto& w = constant(n, 1);
    const std::vector<int64_t> wdims = dims_of(w);
    require(n, wdims.size() == 4, "weight '" + w.name() + "' is " + worker::shape_text(wdims) +
                                      ", not out x in x kh x kw");
    LayerSpec& spec = add_layer(n.name(), LayerType::kConv, {x}, n.output(0));
    spec.out = wdims[0];
    spec.bias = n.input_size() > 2 && !n.input(2).empty();
    read_window(n, spec, {wdims[2], wdims[3]});
    require(n, spec.kernel_h == wdims[2] && spec.kernel_w == wdims[3],
            "kernel_shape differs from the weight's " + worker::shape_text(wdims));
    const std::string name = spec.name;
    add_weight(name + ".weight", wdims, floats(n, w));
    if (spec.bias) {
      const onnx::TensorProto& b = constant(n, 2);
      add_weight(name + ".bias", dims_of(b), floats(n, b));
    }
  }

  void read_batch_norm(const onnx::NodeProto& n) {
    require(n, int_attribute(n, "training_mode", 0) == 0, "training_mode 1 is not supported");
    require(n, int_attribute(n, "spatial", 1) == 1, "spatial 0 is not supported");
    LayerSpec& spec = add_layer(n.name(), LayerType::kBatchNorm, {layer_input(n, 0)}, n.output(0));
    spec.bn_eps = float_attribute(n, "epsilon", 1e-5f);
    // ONNX's momentum is the share of the old running value kept.
    spec.bn_momentum = 1.0f - float_attribute(n, "momentum", 0.9f);
    const std::string name = spec.name;
    const char* roles[] = {".weight", ".bias", ".running_mean", ".running_var"};
    for (int k = 0; k < 4; ++k) {
      const onnx::TensorProto& t = constant(n, k + 1);
      add_weight(name + roles[k], dims_of(t), floats(n, t));
    }
  }

  // Gemm: Y = A B' + C (transB 1, torch's Linear) or A B + C.
  void read_gemm(const onnx::NodeProto& n) {
    require(n, int_attribute(n, "transA", 0) == 0, "transA 1 is not supported");
    require(n, float_attribute(n, "alpha", 1.0f) == 1.0f && float_attribute(n, "beta", 1.0f) == 1.0f,
            "alpha and beta other than 1 are not supported");
    const std::string x = layer_input(n, 0);
    const onnx::TensorProto& w = constant(n, 1);
    std::vector<int64_t> wdims = dims_of(w);
    require(n, wdims.size() == 2, "weight '" + w.name() + "' is " + worker::shape_text(wdims) +
                                      ", not 2-D");
    std::vector<float> values = floats(n, w);
    if (int_attribute(n, "transB", 0) == 0) {  // K x N: stored transposed, N x K
      std::vector<float> t(values.size());
      for (int64_t k = 0; k < wdims[0]; ++k) {
        for (int64_t j = 0; j < wdims[1]; ++j) t[j * wdims[0] + k] = values[k * wdims[1] + j];
      }
      values = std::move(t);
      std::swap(wdims[0], wdims[1]);
    }
    LayerSpec& spec = add_layer(n.name(), LayerType::kFc, {x}, n.output(0));
    spec.out = wdims[0];
    spec.bias = n.input_size() > 2 && !n.input(2).empty();
    const std::string name = spec.name;
    add_weight(name + ".weight", wdims, std::move(values));
    if (spec.bias) {
      const onnx::TensorProto& b = constant(n, 2);
      const std::vector<int64_t> bdims = dims_of(b);
      // A bias of N or 1 x N adds alike; other broadcasts have no fc equivalent.
      require(n, product(bdims) == spec.out && bdims.back() == spec.out,
              "bias '" + b.name() + "' is " + worker::shape_text(bdims) + ", not [" +
                  std::to_string(spec.out) + "]");
      add_weight(name + ".bias", {spec.out}, floats(n, b));
    }
  }

  void read_join(const onnx::NodeProto& n) {
    if (n.op_type() == "Concat") {
      require(n, int_attribute(n, "axis", 0) == 1, "only axis 1 (channels) is supported");
    }
    require(n, n.input_size() >= 2, "needs two inputs or more");
    std::vector<std::string> inputs;
    for (int k = 0; k < n.input_size(); ++k) inputs.push_back(layer_input(n, k));
    add_layer(n.name(), n.op_type() == "Add" ? LayerType::kAdd : LayerType::kConcat,
              std::move(inputs), n.output(0));
  }

  void read_pool(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    LayerSpec& spec = add_layer(n.name(), LayerType::kPool, {layer_input(n, 0)}, n.output(0));
    spec.pool = op == "MaxPool" || op == "GlobalMaxPool" ? worker::PoolKind::kMax
                                                         : worker::PoolKind::kAverage;
    if (op.starts_with("Global")) {
      spec.global = true;
      return;
    }
    read_window(n, spec, {});
    require(n, int_attribute(n, "storage_order", 0) == 0, "storage_order 1 is not supported");
    // vtrain averages over the input values a window covers, never the padding.
    require(n, int_attribute(n, "count_include_pad", 0) == 0 || (spec.pad_h == 0 && spec.pad_w == 0),
            "count_include_pad 1 with padding is not supported (vtrain's average leaves the "
            "padding out)");
  }

  std::string path_;
  const onnx::GraphProto& graph_;
  OnnxModel model_;
  std::map<std::string, const onnx::TensorProto*> constants_;  // initializers and Constant outputs
  std::map<std::string, std::string> layer_of_;  // tensor -> the layer that computes it
  std::set<std::string> names_;                  // layer names taken
};

onnx::ModelProto parse_model(const std::string& path) {
  std::string bytes;
  try {
    bytes = common::read_text_file(path, "ONNX model", kMaxOnnxBytes);
  } catch (const common::InputError& e) {
    throw OnnxError(e.what());
  }
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes)) {
    throw OnnxError(path + ": not an ONNX model (protobuf cannot parse it: truncated, or another "
                           "kind of file)");
  }
  if (!model.has_graph() || model.graph().node_size() == 0 || model.ir_version() == 0) {
    throw OnnxError(path + ": not an ONNX model (it holds no graph or no IR version)");
  }
  try {
    onnx::checker::check_model(model);
  } catch (const onnx::checker::ValidationError& e) {
    throw OnnxError(path + ": the ONNX checker refuses it: " + e.what());
  }
  return model;
}

}  // namespace

OnnxModel read_onnx(const std::string& path) {
  const onnx::ModelProto proto = parse_model(path);
  OnnxModel model = GraphReader(path, proto.graph()).read();
  // Whole or not at all: the layers must make a graph, and the weights fit it.
  try {
    const worker::Graph graph = worker::Graph::build(model.layers, model.input);
    worker::flatten_weights(graph, model.weights, "its initializers");
  } catch (const worker::GraphError& e) {
    throw OnnxError(path + ": " + e.what());
  }
  return model;
}

}  // namespace vtrain::model_io
