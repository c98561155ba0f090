// ONNX out and in: a vtrain model graph with its weights written as an
// ONNX model (opset 17), and an ONNX model of the ops vtrain has read back
// as a graph with its initializers as weights. The ONNX library (its
// protobuf classes and checker) stays behind this header; docs/onnx.md
// describes both directions, the ops and the metadata.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/engine/graph.h"
#include "worker/engine/parameter_layout.h"

namespace vtrain::model_io {

// The opset the exporter writes and the importer reads (up to).
inline constexpr int64_t kOnnxOpset = 17;

// An ONNX file cannot be read as a model of the supported ops: truncated,
// another kind of file, an op or attribute vtrain has no layer for. The
// message names the file, and the node (its op type and name) where one is
// at fault. Bad input, which the user can fix.
class OnnxError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a user of the exported model must do to an image before the model
// sees it, as vtrain's evaluation does; written to the model's
// metadata_props (docs/onnx.md).
struct Preprocessing {
  std::vector<float> mean;    // per channel, of pixel / 255
  std::vector<float> stddev;  // per channel
};

// Writes `graph` with `weights` (its flat parameters and buffers) to
// `path` as an ONNX model: a node per layer (Conv, BatchNormalization in
// its inference form, Relu, Sigmoid, Clip for relu6, MaxPool, AveragePool,
// GlobalAveragePool, GlobalMaxPool, Flatten + Gemm, Add, Concat, Mul,
// Dropout in its inference form) or the few PyTorch writes for it below
// opset 20 (silu: Sigmoid + Mul; gelu: Div, Erf, Add, Mul, Mul), named
// after the layer;
// the input (the input layer's name) N x C x H x W with N free, the output
// (the last layer's name) N x classes. The model passes
// onnx::checker::check_model before a byte is written; the file is
// written whole or not at all (common::OutputFile). Throws
// std::invalid_argument when `weights` do not fit `graph`, and
// common::OutputError when the file cannot be written.
void write_onnx(const std::string& path, const worker::Graph& graph,
                const worker::FlatWeights& weights, const Preprocessing& preprocessing);

// A model read from an ONNX file.
struct OnnxModel {
  std::vector<worker::LayerSpec> layers;  // input first; the last is the logits
  worker::Shape input;                     // per-sample C x H x W the file declares (n = 1)
  std::vector<worker::NamedTensor> weights;  // by vtrain tensor name (parameter_layout.h)
};

// Reads `path` (at most kMaxOnnxBytes): the graph's nodes become layers
// (Identity and a flattening Reshape or Flatten disappear into their
// neighbours; PyTorch's forms of SiLU and GELU become one layer each), its
// initializers the weights. The result is checked
// whole before it is returned: the layers build a Graph for the declared
// input, and the weights fit it (flatten_weights). Throws OnnxError naming
// the file (and the node) for anything else: nothing is returned half read.
OnnxModel read_onnx(const std::string& path);

// The largest ONNX file read_onnx takes: protobuf's own limit for one
// message.
inline constexpr uint64_t kMaxOnnxBytes = (uint64_t{1} << 31) - 1;

}  // namespace vtrain::model_io
