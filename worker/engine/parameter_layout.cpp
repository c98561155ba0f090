// Weight tensors of a graph: names, shapes and places in the flat arrays.
#include "worker/engine/parameter_layout.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

namespace vtrain::worker {
namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

// Appends one tensor of `layer` at the end of its array.
void add(std::vector<LayerTensor>& out, int64_t& end, int layer, const std::string& name,
         std::vector<int64_t> shape, bool buffer) {
  const int64_t count = product(shape);
  out.push_back({layer, name, std::move(shape), buffer, end, count});
  end += count;
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<LayerTensor> layer_tensors(const Graph& graph) {
  std::vector<LayerTensor> out;
  int64_t params = 0, buffers = 0;
  for (int i = 0; i < graph.size(); ++i) {
    const LayerSpec& spec = graph.layer(i);
    if (graph.inputs(i).empty()) continue;
    const Shape& in = graph.output_shape(graph.inputs(i)[0]);
    const std::string& n = spec.name;
    switch (spec.type) {
      case LayerType::kConv:
        add(out, params, i, n + ".weight", {spec.out, in.c / spec.groups, spec.kernel_h, spec.kernel_w}, false);
        if (spec.bias) add(out, params, i, n + ".bias", {spec.out}, false);
        break;
      case LayerType::kFc:
        add(out, params, i, n + ".weight", {spec.out, in.per_sample()}, false);
        if (spec.bias) add(out, params, i, n + ".bias", {spec.out}, false);
        break;
      case LayerType::kBatchNorm:
        add(out, params, i, n + ".weight", {in.c}, false);
        add(out, params, i, n + ".bias", {in.c}, false);
        add(out, buffers, i, n + ".running_mean", {in.c}, true);
        add(out, buffers, i, n + ".running_var", {in.c}, true);
        break;
      default: break;
    }
  }
  return out;
}

int64_t buffer_count(const Graph& graph) {
  int64_t n = 0;
  for (const LayerTensor& t : layer_tensors(graph)) n += t.buffer ? t.count : 0;
  return n;
}

FlatWeights flatten_weights(const Graph& graph, const std::vector<NamedTensor>& tensors,
                            const std::string& source) {
  std::map<std::string, const NamedTensor*> given;
  std::vector<std::string> problems;
  for (const NamedTensor& t : tensors) {
    if (!given.emplace(t.name, &t).second) problems.push_back("'" + t.name + "' is given twice");
    if (static_cast<int64_t>(t.values.size()) != product(t.shape)) {
      problems.push_back("'" + t.name + "' holds " + std::to_string(t.values.size()) +
                         " values for shape " + shape_text(t.shape));
    }
  }
  FlatWeights flat;
  const std::vector<LayerTensor> wanted = layer_tensors(graph);
  for (const LayerTensor& w : wanted) {
    std::vector<float>& array = w.buffer ? flat.buffers : flat.parameters;
    array.resize(static_cast<size_t>(w.offset + w.count));
    const auto it = given.find(w.name);
    if (it == given.end()) {
      problems.push_back("the model's '" + w.name + "' " + shape_text(w.shape) + " is missing");
      continue;
    }
    const NamedTensor& t = *it->second;
    given.erase(it);
    if (t.shape != w.shape) {
      problems.push_back("'" + w.name + "' is " + shape_text(t.shape) + ", the model's is " +
                         shape_text(w.shape));
      continue;
    }
    if (static_cast<int64_t>(t.values.size()) != w.count) continue;  // said above
    std::copy(t.values.begin(), t.values.end(), array.begin() + w.offset);
  }
  for (const auto& [name, t] : given) {
    problems.push_back("'" + name + "' " + shape_text(t->shape) + " is not a tensor of the model");
  }
  if (!problems.empty()) {
    std::string message = source + ": the weights do not fit the model: ";
    for (size_t i = 0; i < problems.size(); ++i) message += (i > 0 ? "; " : "") + problems[i];
    throw GraphError(message);
  }
  return flat;
}

std::vector<NamedTensor> named_tensors(const Graph& graph, const FlatWeights& weights) {
  const std::vector<LayerTensor> layout = layer_tensors(graph);
  int64_t params = 0, buffers = 0;
  for (const LayerTensor& t : layout) (t.buffer ? buffers : params) += t.count;
  if (static_cast<int64_t>(weights.parameters.size()) != params ||
      static_cast<int64_t>(weights.buffers.size()) != buffers) {
    throw std::invalid_argument("named_tensors: " + std::to_string(weights.parameters.size()) +
                                " parameters and " + std::to_string(weights.buffers.size()) +
                                " buffers given, the model has " + std::to_string(params) +
                                " and " + std::to_string(buffers));
  }
  std::vector<NamedTensor> out;
  for (const LayerTensor& t : layout) {
    const std::vector<float>& array = t.buffer ? weights.buffers : weights.parameters;
    out.push_back({t.name, t.shape,
                   std::vector<float>(array.begin() + t.offset,
                                      array.begin() + t.offset + t.count)});
  }
  return out;
}

}  // namespace vtrain::worker
