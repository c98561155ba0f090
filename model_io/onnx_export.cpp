// ONNX out: one node per vtrain layer, built with the ONNX library's
// protobuf classes and checked by its checker before the file is written.
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <bit>
#include <cstdio>
#include <numbers>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/files.h"
#include "model_io/onnx.h"

namespace vtrain::model_io {
namespace {

using worker::Graph;
using worker::LayerSpec;
using worker::LayerType;

static_assert(std::endian::native == std::endian::little,
              "ONNX raw_data is little-endian: write it byte-swapped on this machine");

// Names of the tensors the exporter adds between layers, after the layer's.
constexpr const char* kFlattenSuffix = "/flatten";      // N x C x H x W -> N x CHW
constexpr const char* kUnflattenSuffix = "/unflatten";  // N x F -> N x F x 1 x 1
constexpr const char* kShapeSuffix = "/unflatten_shape";
constexpr const char* kPartialSumSuffix = "/sum";       // an add of 3+ inputs, pair by pair
constexpr const char* kSigmoidSuffix = "/sigmoid";      // silu: x * sigmoid(x)

// The metadata_props keys (docs/onnx.md).
constexpr const char* kMetaInputShape = "input_shape";  // "C,H,W"
constexpr const char* kMetaClasses = "classes";
constexpr const char* kMetaMean = "mean";               // per channel, "m0,m1,m2"
constexpr const char* kMetaStd = "std";
constexpr const char* kMetaPreprocessing = "preprocessing";
constexpr const char* kPreprocessingFormula =
    "x[c] = (pixel[c] / 255 - mean[c]) / std[c], float32 NCHW, H x W as input_shape";

// "0.5,0.25": a per-channel list for the metadata, each value exact.
std::string number_list(const std::vector<float>& values) {
  std::string s;
  for (float v : values) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", static_cast<double>(v));
    if (!s.empty()) s += ',';
    s += text;
  }
  return s;
}

void add_ints(onnx::NodeProto& node, const std::string& name, std::vector<int64_t> values) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

void add_int(onnx::NodeProto& node, const std::string& name, int64_t value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void add_float(onnx::NodeProto& node, const std::string& name, float value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(value);
}

// A float32 value of the graph's interface: N (free, "batch") x dims.
void describe_value(onnx::ValueInfoProto& value, const std::string& name,
                    const std::vector<int64_t>& dims) {
  value.set_name(name);
  onnx::TypeProto_Tensor* type = value.mutable_type()->mutable_tensor_type();
  type->set_elem_type(onnx::TensorProto::FLOAT);
  onnx::TensorShapeProto* shape = type->mutable_shape();
  shape->add_dim()->set_dim_param("batch");
  for (int64_t d : dims) shape->add_dim()->set_dim_value(d);
}

// Builds the ONNX graph layer by layer. Every layer's output is the tensor
// named after it; an fc's output is N x features (2-D), every other one
// N x C x H x W, so a 2-D tensor is reshaped where a 4-D one is read.
class GraphWriter {
 public:
  GraphWriter(const Graph& graph, const worker::FlatWeights& weights, onnx::GraphProto& out)
      : graph_(graph), out_(out), flat_(graph.size(), false) {
    for (worker::NamedTensor& t : worker::named_tensors(graph, weights)) {
      onnx::TensorProto* init = out_.add_initializer();
      init->set_name(t.name);
      init->set_data_type(onnx::TensorProto::FLOAT);
      for (int64_t d : t.shape) init->add_dims(d);
      init->set_raw_data(std::string(reinterpret_cast<const char*>(t.values.data()),
                                     t.values.size() * sizeof(float)));
    }
  }

  void write() {
    for (int i = 0; i < graph_.size(); ++i) write_layer(i);
    const int sink = graph_.sink_index();
    std::string logits = graph_.layer(sink).name;
    if (!flat_[sink]) logits = flatten(logits, logits + kFlattenSuffix);
    describe_value(*out_.add_output(), logits, {graph_.classes()});
  }

 private:
  onnx::NodeProto& node(const std::string& op, const std::string& name,
                        const std::vector<std::string>& inputs, const std::string& output) {
    onnx::NodeProto* n = out_.add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const std::string& in : inputs) n->add_input(in);
    n->add_output(output);
    return *n;
  }

  std::string flatten(const std::string& from, const std::string& to) {
    add_int(node("Flatten", to, {from}, to), "axis", 1);
    return to;
  }

  // Layer i's input k as an N x C x H x W tensor (a flat one reshaped
  // once, however many layers read it).
  std::string input_4d(int i, int k) {
    const int from = graph_.inputs(i)[k];
    const std::string& name = graph_.layer(from).name;
    if (!flat_[from]) return name;
    const std::string unflat = name + kUnflattenSuffix;
    if (shaped_.insert(from).second) {
      onnx::TensorProto* dims = out_.add_initializer();
      dims->set_name(name + kShapeSuffix);
      dims->set_data_type(onnx::TensorProto::INT64);
      dims->add_dims(4);
      for (int64_t d : {0, -1, 1, 1}) dims->add_int64_data(d);
      node("Reshape", unflat, {name, name + kShapeSuffix}, unflat);
    }
    return unflat;
  }

  // Layer i's inputs as they are, or all 4-D where they differ in rank.
  std::vector<std::string> join_inputs(int i) {
    bool all_flat = true;
    for (int from : graph_.inputs(i)) all_flat = all_flat && flat_[from];
    std::vector<std::string> names;
    for (size_t k = 0; k < graph_.inputs(i).size(); ++k) {
      names.push_back(all_flat ? graph_.layer(graph_.inputs(i)[k]).name
                               : input_4d(i, static_cast<int>(k)));
    }
    flat_[i] = all_flat;
    return names;
  }

  // Layer i's one input as it is (an elementwise layer's output keeps its
  // input's rank).
  std::string elementwise_input(int i) {
    const int from = graph_.inputs(i)[0];
    flat_[i] = flat_[from];
    return graph_.layer(from).name;
  }

  // A float scalar initializer called `name`; returns the name.
  std::string scalar(const std::string& name, float value) {
    onnx::TensorProto* t = out_.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_float_data(value);
    return name;
  }

  // GELU in its erf form as PyTorch writes it below opset 20 (ONNX's Gelu
  // op is opset 20), so that a reader that knows PyTorch's form knows ours:
  // y = x * (1 + erf(x / sqrt 2)) * 0.5.
  void write_gelu(const std::string& x, const std::string& y) {
    const std::string scaled = y + "/div", erf = y + "/erf", plus_one = y + "/add",
                      times_x = y + "/mul";
    node("Div", scaled, {x, scalar(y + "/sqrt2", static_cast<float>(std::numbers::sqrt2))},
         scaled);
    node("Erf", erf, {scaled}, erf);
    node("Add", plus_one, {erf, scalar(y + "/one", 1.0f)}, plus_one);
    node("Mul", times_x, {x, plus_one}, times_x);
    node("Mul", y, {times_x, scalar(y + "/half", 0.5f)}, y);
  }

  void window(onnx::NodeProto& n, const LayerSpec& l) {
    add_ints(n, "kernel_shape", {l.kernel_h, l.kernel_w});
    add_ints(n, "strides", {l.stride_h, l.stride_w});
    add_ints(n, "pads", {l.pad_h, l.pad_w, l.pad_h, l.pad_w});
  }

  void write_layer(int i) {
    const LayerSpec& l = graph_.layer(i);
    const std::string& y = l.name;
    switch (l.type) {
      case LayerType::kInput: {
        const worker::Shape& s = graph_.output_shape(i);
        describe_value(*out_.add_input(), y, {s.c, s.h, s.w});
        return;
      }
      case LayerType::kConv: {
        std::vector<std::string> in = {input_4d(i, 0), y + ".weight"};
        if (l.bias) in.push_back(y + ".bias");
        onnx::NodeProto& n = node("Conv", y, in, y);
        window(n, l);
        if (l.groups != 1) add_int(n, "group", l.groups);
        return;
      }
      case LayerType::kBatchNorm: {
        onnx::NodeProto& n = node("BatchNormalization", y,
                                  {input_4d(i, 0), y + ".weight", y + ".bias",
                                   y + ".running_mean", y + ".running_var"},
                                  y);
        add_float(n, "epsilon", l.bn_eps);
        add_float(n, "momentum", 1.0f - l.bn_momentum);  // ONNX keeps this much of the old value
        return;
      }
      case LayerType::kRelu:
        node("Relu", y, {elementwise_input(i)}, y);
        return;
      case LayerType::kPool: {
        const std::string x = input_4d(i, 0);
        const bool max = l.pool == worker::PoolKind::kMax;
        if (l.global) {
          node(max ? "GlobalMaxPool" : "GlobalAveragePool", y, {x}, y);
          return;
        }
        onnx::NodeProto& n = node(max ? "MaxPool" : "AveragePool", y, {x}, y);
        window(n, l);
        if (!max) add_int(n, "count_include_pad", 0);  // vtrain averages the input only
        return;
      }
      case LayerType::kFc: {
        const int from = graph_.inputs(i)[0];
        std::string x = graph_.layer(from).name;
        if (!flat_[from]) x = flatten(x, x + kFlattenSuffix);
        std::vector<std::string> in = {x, y + ".weight"};
        if (l.bias) in.push_back(y + ".bias");
        add_int(node("Gemm", y, in, y), "transB", 1);
        flat_[i] = true;
        return;
      }
      case LayerType::kAdd: {
        const std::vector<std::string> in = join_inputs(i);
        // ONNX's Add takes two: a join of more is a chain of partial sums.
        std::string sum = in[0];
        for (size_t k = 1; k < in.size(); ++k) {
          const std::string out =
              k + 1 == in.size() ? y : y + kPartialSumSuffix + std::to_string(k);
          node("Add", out, {sum, in[k]}, out);
          sum = out;
        }
        return;
      }
      case LayerType::kConcat:
        add_int(node("Concat", y, join_inputs(i), y), "axis", 1);
        return;
      case LayerType::kSilu: {
        const std::string x = elementwise_input(i);
        node("Sigmoid", y + kSigmoidSuffix, {x}, y + kSigmoidSuffix);
        node("Mul", y, {x, y + kSigmoidSuffix}, y);
        return;
      }
      case LayerType::kGelu:
        write_gelu(elementwise_input(i), y);
        return;
      case LayerType::kSigmoid:
        node("Sigmoid", y, {elementwise_input(i)}, y);
        return;
      case LayerType::kRelu6:
        node("Clip", y, {elementwise_input(i), scalar(y + "/min", 0.0f), scalar(y + "/max", 6.0f)},
             y);
        return;
      case LayerType::kMul:
        node("Mul", y, join_inputs(i), y);
        return;
      case LayerType::kDropout:
        // Without training_mode the inference form: the identity.
        node("Dropout", y, {elementwise_input(i), scalar(y + "/ratio", l.dropout_p)}, y);
        return;
    }
    throw std::logic_error("write_onnx: layer '" + y + "' of an unhandled type");
  }

  const Graph& graph_;
  onnx::GraphProto& out_;
  std::vector<bool> flat_;  // per layer: its output is N x features
  std::set<int> shaped_;    // layers whose 4-D reshape is written
};

}  // namespace

void write_onnx(const std::string& path, const worker::Graph& graph,
                const worker::FlatWeights& weights, const Preprocessing& preprocessing) {
  onnx::ModelProto model;
  model.set_ir_version(onnx::IR_VERSION);
  model.set_producer_name("vtrain");
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
  onnx::GraphProto* g = model.mutable_graph();
  g->set_name("vtrain");
  GraphWriter(graph, weights, *g).write();

  const worker::Shape& in = graph.output_shape(graph.input_index());
  const auto meta = [&](const std::string& key, const std::string& value) {
    onnx::StringStringEntryProto* p = model.add_metadata_props();
    p->set_key(key);
    p->set_value(value);
  };
  meta(kMetaInputShape, std::to_string(in.c) + "," + std::to_string(in.h) + "," +
                            std::to_string(in.w));
  meta(kMetaClasses, std::to_string(graph.classes()));
  meta(kMetaMean, number_list(preprocessing.mean));
  meta(kMetaStd, number_list(preprocessing.stddev));
  meta(kMetaPreprocessing, kPreprocessingFormula);

  try {
    onnx::checker::check_model(model);
  } catch (const onnx::checker::ValidationError& e) {
    throw std::logic_error("write_onnx: the ONNX checker refuses the model built for " + path +
                           ": " + e.what());
  }
  std::string bytes;
  if (!model.SerializeToString(&bytes)) {
    throw std::logic_error("write_onnx: the model for " + path + " does not serialise");
  }
  common::OutputFile file(path, "ONNX model");
  file.write(bytes);
  file.commit();
}

}  // namespace vtrain::model_io
