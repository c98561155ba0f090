// Where each layer's weights lie in a network's flat parameter and buffer
// arrays (Network::download_parameters / download_buffers, a checkpoint's
// parameters and buffers), under names and shapes another tool reads:
//
//   layer   tensor                  shape               array
//   conv    NAME.weight, NAME.bias  [out, in, kh, kw], [out]   parameters
//   fc      NAME.weight, NAME.bias  [out, in_features], [out]  parameters
//   batchnorm NAME.weight (scale), NAME.bias (shift)  [c]      parameters
//   batchnorm NAME.running_mean, NAME.running_var     [c]      buffers
//
// (PyTorch's names for the same tensors; NAME is the vtrain layer's name.)
// An fc's in_features is its input's C x H x W, flattened in that order.
// The order is the network's: layers in graph order, each layer's tensors
// as listed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/engine/graph.h"

namespace vtrain::worker {

struct LayerTensor {
  int layer = 0;               // graph index
  std::string name;            // "conv1.weight"
  std::vector<int64_t> shape;  // see the table above
  bool buffer = false;         // in the buffers (running statistics), else the parameters
  int64_t offset = 0;          // in floats, into its array
  int64_t count = 0;           // product of shape
};

// Every weight tensor of `graph`, in the arrays' order.
std::vector<LayerTensor> layer_tensors(const Graph& graph);

// The floats of `graph`'s buffers (its batch norms' running statistics):
// what a network's or a checkpoint's buffers hold.
int64_t buffer_count(const Graph& graph);

// A weight tensor by name, as a file holds it.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, product of shape
};

// A network's weights as its flat arrays.
struct FlatWeights {
  std::vector<float> parameters;  // Network::parameter_count() floats
  std::vector<float> buffers;     // Network::buffer_count() floats
};

// The flat arrays of `graph` from `tensors`: every tensor of
// layer_tensors(graph) must be given once with its shape. Throws GraphError
// naming each tensor the model has and `tensors` lack, each one given that
// the model has no use for, and each shape that differs (both shapes);
// `source` names where the tensors came from ("model.onnx FILE").
FlatWeights flatten_weights(const Graph& graph, const std::vector<NamedTensor>& tensors,
                            const std::string& source);

// The reverse: every tensor of layer_tensors(graph) with its values out of
// `weights` (whose sizes must be the graph's, else std::invalid_argument).
std::vector<NamedTensor> named_tensors(const Graph& graph, const FlatWeights& weights);

// A shape as "[64, 3, 3, 3]" ("[]" for a scalar).
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace vtrain::worker
