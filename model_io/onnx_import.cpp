// ONNX in: the nodes of an ONNX graph as vtrain layers, its initializers as
// their weights; the whole result is checked before it is handed out.
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
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
// their input, constants), in the order errors list them. Div and Erf are
// read only as part of GELU's erf form (read_gelu).
const std::vector<std::string>& supported_ops() {
  static const std::vector<std::string> ops = {
      "Conv",       "BatchNormalization", "Relu",        "Clip",          "Sigmoid",
      "Mul",        "Div",                "Erf",         "MaxPool",       "AveragePool",
      "GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "Flatten",     "Reshape",
      "Gemm",       "Add",                "Concat",      "Identity",      "Dropout",
      "Constant"};
  return ops;
}

// GELU's erf form as PyTorch exports nn.GELU() below opset 20:
// Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5).
constexpr const char* kGeluForm = "x * (1 + erf(x / sqrt(2))) * 0.5";

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
      {"Clip", {"min", "max"}},  // attributes below opset 11, inputs from it on
      {"ReduceMean", {"axes", "keepdims"}},
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
    index_tensors();
    read_input();
    for (const onnx::NodeProto& n : graph_.node()) {
      if (!part_of_pattern_.contains(&n)) read_node(n);
    }
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

  // Who reads each tensor, the constants, and the shapes shape inference
  // found (parse_model ran it), for the patterns that span nodes: a
  // pattern's constants may come after its first node (read_node checks
  // each Constant node in its turn).
  void index_tensors() {
    for (const onnx::NodeProto& n : graph_.node()) {
      for (const std::string& in : n.input()) {
        if (!in.empty()) readers_[in].push_back(&n);
      }
      const onnx::AttributeProto* value = attribute(n, "value");
      if (n.op_type() == "Constant" && n.output_size() == 1 && value && value->has_t()) {
        constants_[n.output(0)] = &value->t();
      }
    }
    for (const onnx::ValueInfoProto& o : graph_.output()) graph_outputs_.insert(o.name());
    for (const onnx::ValueInfoProto& v : graph_.value_info()) {
      const onnx::TypeProto_Tensor& type = v.type().tensor_type();
      if (type.has_shape()) shapes_[v.name()] = dims_of(type.shape());
    }
  }

  // The one node that reads `tensor`, when exactly one does and the tensor
  // is not also a graph output: a pattern may then swallow the tensor.
  const onnx::NodeProto* sole_reader(const std::string& tensor) const {
    const auto it = readers_.find(tensor);
    if (it == readers_.end() || it->second.size() != 1 || graph_outputs_.contains(tensor)) {
      return nullptr;
    }
    return it->second.front();
  }

  // Node n's inputs but `known` (n reading two tensors, one of them
  // `known`): the other, or nullopt.
  static std::optional<std::string> other_input(const onnx::NodeProto& n,
                                                const std::string& known) {
    if (n.input_size() != 2) return std::nullopt;
    if (n.input(0) == known) return n.input(1);
    if (n.input(1) == known) return n.input(0);
    return std::nullopt;
  }

  // The value of a float constant holding one value, or nullopt.
  std::optional<float> scalar(const std::string& tensor) const {
    const auto it = constants_.find(tensor);
    if (it == constants_.end()) return std::nullopt;
    const onnx::TensorProto& t = *it->second;
    if (t.data_type() != onnx::TensorProto::FLOAT || product(dims_of(t)) != 1 ||
        t.data_location() == onnx::TensorProto::EXTERNAL) {
      return std::nullopt;
    }
    if (t.has_raw_data()) {
      if (t.raw_data().size() != sizeof(float)) return std::nullopt;
      float v;
      std::memcpy(&v, t.raw_data().data(), sizeof v);
      return v;
    }
    if (t.float_data_size() != 1) return std::nullopt;
    return t.float_data(0);
  }

  bool is_scalar(const std::string& tensor, double value) const {
    const std::optional<float> v = scalar(tensor);
    return v && std::abs(static_cast<double>(*v) - value) <= 1e-6 * std::abs(value);
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
    const std::vector<int64_t> dims = dims_of(type.shape());
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

  // A value's shape, -1 for a dimension without a fixed value.
  static std::vector<int64_t> dims_of(const onnx::TensorShapeProto& shape) {
    std::vector<int64_t> dims;
    for (const onnx::TensorShapeProto_Dimension& d : shape.dim()) {
      dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
    }
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
    if (op == "Dropout") return read_dropout(n);
    require_outputs(n, 1);
    if (op == "Identity" || op == "Flatten" || op == "Reshape") return read_alias(n);
    if (op == "Conv") return read_conv(n);
    if (op == "BatchNormalization") return read_batch_norm(n);
    if (op == "Gemm") return read_gemm(n);
    if (op == "Relu") {
      add_layer(n.name(), LayerType::kRelu, {layer_input(n, 0)}, n.output(0));
      return;
    }
    if (op == "Clip") return read_clip(n);
    if (op == "Sigmoid") return read_sigmoid(n);
    if (op == "Mul") return read_mul(n);
    if (op == "Div") return read_gelu(n);
    if (op == "Erf") {
      fail(n, std::string("an Erf is read only as part of GELU's erf form, ") + kGeluForm);
    }
    if (op == "Add" || op == "Concat") return read_join(n);
    if (op == "ReduceMean") return read_reduce_mean(n);
    read_pool(n);
  }

  // Sigmoid(x), or SiLU when its one reader is Mul(x, Sigmoid(x)) (as
  // PyTorch exports nn.SiLU below opset 24, in either order): the silu
  // layer is then named after the Mul, whose output it is.
  void read_sigmoid(const onnx::NodeProto& n) {
    const std::string x = layer_input(n, 0);
    const onnx::NodeProto* mul = sole_reader(n.output(0));
    if (mul && mul->op_type() == "Mul" && other_input(*mul, n.output(0)) == n.input(0) &&
        mul->output_size() == 1) {
      add_layer(mul->name(), LayerType::kSilu, {x}, mul->output(0));
      part_of_pattern_.insert(mul);
      return;
    }
    add_layer(n.name(), LayerType::kSigmoid, {x}, n.output(0));
  }

  // GELU's erf form, from its first node Div(x, sqrt 2); the layer is
  // named after the last Mul, whose output it is.
  void read_gelu(const onnx::NodeProto& div) {
    const std::vector<const onnx::NodeProto*> parts = gelu_nodes(div);
    if (parts.empty()) {
      fail(div, std::string("a Div is read only as part of GELU's erf form, ") + kGeluForm +
                    " (as PyTorch exports nn.GELU())");
    }
    for (const onnx::NodeProto* part : parts) {
      require_outputs(*part, 1);
      part_of_pattern_.insert(part);
    }
    add_layer(parts.back()->name(), LayerType::kGelu, {layer_input(div, 0)},
              parts.back()->output(0));
  }

  // The Erf, Add, Mul, Mul that follow `div` in GELU's erf form, each the
  // one reader of the tensor before it (operands in either order); empty
  // where the nodes are anything else.
  std::vector<const onnx::NodeProto*> gelu_nodes(const onnx::NodeProto& div) const {
    if (div.input_size() != 2 || !is_scalar(div.input(1), std::numbers::sqrt2)) return {};
    const std::string& x = div.input(0);
    // The one reader of `tensor` if it is a `op` whose other input passes `other`.
    const auto next = [&](const std::string& tensor, const char* op, const auto& other) {
      const onnx::NodeProto* n = sole_reader(tensor);
      if (!n || n->op_type() != op) return static_cast<const onnx::NodeProto*>(nullptr);
      if (op == std::string("Erf")) return n;
      const std::optional<std::string> o = other_input(*n, tensor);
      return o && other(*o) ? n : nullptr;
    };
    const auto any = [](const std::string&) { return true; };
    const onnx::NodeProto* erf = next(div.output(0), "Erf", any);
    if (!erf) return {};
    const onnx::NodeProto* add =
        next(erf->output(0), "Add", [&](const std::string& t) { return is_scalar(t, 1.0); });
    if (!add) return {};
    const onnx::NodeProto* times_x =
        next(add->output(0), "Mul", [&](const std::string& t) { return t == x; });
    if (!times_x) return {};
    const onnx::NodeProto* half =
        next(times_x->output(0), "Mul", [&](const std::string& t) { return is_scalar(t, 0.5); });
    if (!half) return {};
    return {erf, add, times_x, half};
  }

  // Clip(x, 0, 6) is relu6 (PyTorch's nn.ReLU6), Clip(x, 0) relu; the
  // bounds are inputs from opset 11 on, attributes before.
  void read_clip(const onnx::NodeProto& n) {
    const auto bound = [&](int k, const char* name, float unbounded) {
      if (n.input_size() > k && !n.input(k).empty()) {
        const std::optional<float> v = scalar(n.input(k));
        require(n, v.has_value(), std::string("its ") + name + " must be a float constant");
        return *v;
      }
      return float_attribute(n, name, unbounded);
    };
    constexpr float kInf = std::numeric_limits<float>::infinity();
    const float lo = bound(1, "min", -kInf);
    const float hi = bound(2, "max", kInf);
    LayerType type;
    if (lo == 0.0f && hi == 6.0f) {
      type = LayerType::kRelu6;
    } else if (lo == 0.0f && hi == kInf) {
      type = LayerType::kRelu;
    } else {
      fail(n, common::format(
                  "only Clip to [0, 6] (ReLU6) or [0, inf) (ReLU) is supported, got [%g, %g]",
                  static_cast<double>(lo), static_cast<double>(hi)));
    }
    add_layer(n.name(), type, {layer_input(n, 0)}, n.output(0));
  }

  // Mul of two layers' outputs: vtrain's mul takes the one broadcast over
  // H and W (squeeze-excitation's N x C x 1 x 1 gate) second, where
  // torchvision writes `scale * input`.
  void read_mul(const onnx::NodeProto& n) {
    require(n, n.input_size() == 2, "needs two inputs");
    std::string a = layer_input(n, 0);
    std::string b = layer_input(n, 1);
    if (per_channel(n.input(0)) && !per_channel(n.input(1))) std::swap(a, b);
    add_layer(n.name(), LayerType::kMul, {a, b}, n.output(0));
  }

  // Whether shape inference found `tensor` N x C x 1 x 1.
  bool per_channel(const std::string& tensor) const {
    const auto it = shapes_.find(tensor);
    return it != shapes_.end() && it->second.size() == 4 && it->second[2] == 1 &&
           it->second[3] == 1;
  }

  // ReduceMean over H and W (timm's squeeze-excitation, x.mean((2, 3))):
  // a global average pool.
  void read_reduce_mean(const onnx::NodeProto& n) {
    std::vector<int64_t> axes = ints_attribute(n, "axes", {});
    for (int64_t& a : axes) a = a < 0 ? a + 4 : a;
    std::sort(axes.begin(), axes.end());
    require(n, axes == std::vector<int64_t>{2, 3},
            "only a mean over H and W (axes [2, 3]) is supported, got axes " +
                worker::shape_text(ints_attribute(n, "axes", {})));
    LayerSpec& spec = add_layer(n.name(), LayerType::kPool, {layer_input(n, 0)}, n.output(0));
    spec.pool = worker::PoolKind::kAverage;
    spec.global = true;
  }

  // Dropout(x, ratio, training_mode) or, below opset 12, its ratio
  // attribute: a dropout layer of p = ratio. vtrain drops in training and
  // passes through in evaluation whatever training_mode says.
  void read_dropout(const onnx::NodeProto& n) {
    require(n, n.output_size() == 1 || n.output(1).empty() || !used_later(n.output(1)),
            "its mask output is used");
    float p = float_attribute(n, "ratio", 0.5f);
    if (n.input_size() > 1 && !n.input(1).empty()) {
      const std::optional<float> ratio = scalar(n.input(1));
      require(n, ratio.has_value(), "its ratio must be a float constant");
      p = *ratio;
    }
    require(n, n.input_size() < 3 || n.input(2).empty() || constants_.contains(n.input(2)),
            "its training_mode must be a constant");
    LayerSpec& spec = add_layer(n.name(), LayerType::kDropout, {layer_input(n, 0)}, n.output(0));
    spec.dropout_p = p;
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
    if (n.op_type() == "Identity" && constants_.contains(n.input(0))) {
      // PyTorch's exporter shares equal initializers this way.
      constants_[n.output(0)] = constants_.at(n.input(0));
      return;
    }
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
    const int64_t groups = int_attribute(n, "group", 1);
    require(n, groups >= 1, "group " + std::to_string(groups) + " must be positive");
    const std::string x = layer_input(n, 0);
    const onnx::TensorProto& w = constant(n, 1);
    const std::vector<int64_t> wdims = dims_of(w);
    require(n, wdims.size() == 4, "weight '" + w.name() + "' is " + worker::shape_text(wdims) +
                                      ", not out x in x kh x kw");
    LayerSpec& spec = add_layer(n.name(), LayerType::kConv, {x}, n.output(0));
    spec.out = wdims[0];
    spec.groups = groups;  // Graph::build checks that it divides both channel counts
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

  // ONNX's momentum is the share of the old running value kept, vtrain's
  // (PyTorch's) the share of the new. A float near 1 holds that complement
  // to about 6e-8 only (0.9f is 1 - 0.100000024), so it is rounded to 7
  // decimals: a momentum of up to 7 decimals (0.1, 0.01, 0.003) comes back
  // as the float it was, and with it the graph's signature.
  static float momentum_from_onnx(float onnx_momentum) {
    const double complement = 1.0 - static_cast<double>(onnx_momentum);
    return static_cast<float>(std::round(complement * 1e7) / 1e7);
  }

  void read_batch_norm(const onnx::NodeProto& n) {
    require(n, int_attribute(n, "training_mode", 0) == 0, "training_mode 1 is not supported");
    require(n, int_attribute(n, "spatial", 1) == 1, "spatial 0 is not supported");
    LayerSpec& spec = add_layer(n.name(), LayerType::kBatchNorm, {layer_input(n, 0)}, n.output(0));
    spec.bn_eps = float_attribute(n, "epsilon", 1e-5f);
    spec.bn_momentum = momentum_from_onnx(float_attribute(n, "momentum", 0.9f));
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
  std::map<std::string, std::vector<const onnx::NodeProto*>> readers_;  // tensor -> its readers
  std::set<std::string> graph_outputs_;
  std::map<std::string, std::vector<int64_t>> shapes_;  // inferred; -1 for a free dimension
  std::set<const onnx::NodeProto*> part_of_pattern_;    // read with an earlier node (SiLU, GELU)
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
  // The shapes of the tensors between nodes (value_info), where the file
  // lacks them: they tell which factor of a Mul is broadcast. Node-level
  // failures leave shapes out rather than throw (error_mode 0).
  try {
    onnx::shape_inference::InferShapes(model);
  } catch (const std::exception& e) {
    throw OnnxError(path + ": ONNX shape inference refuses it: " + e.what());
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
