// Graph validation, ordering, shape inference and signature.
#include "worker/engine/graph.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace vtrain::worker {
namespace {

// Error lists of known names stay readable even for the ~800-layer VGG-416.
constexpr size_t kMaxListedNames = 16;

// "layer 'fc1' (line 12)": the prefix of every per-layer error.
std::string where(const LayerSpec& spec) {
  std::string s = "layer '" + spec.name + "'";
  if (spec.source_line > 0) s += " (line " + std::to_string(spec.source_line) + ")";
  return s;
}

[[noreturn]] void fail(const LayerSpec& spec, const std::string& what) {
  throw GraphError(where(spec) + ": " + what, spec.name, what);
}

// Per-sample shapes read better without the batch: "3x224x224".
std::string chw(const Shape& s) {
  return std::to_string(s.c) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w);
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += ", ";
    s += "'" + names[i] + "'";
  }
  return s;
}

std::string known_names(const std::vector<LayerSpec>& layers) {
  std::string s;
  const size_t listed = std::min(layers.size(), kMaxListedNames);
  for (size_t i = 0; i < listed; ++i) {
    if (i > 0) s += ", ";
    s += layers[i].name;
  }
  if (layers.size() > listed) s += ", ... (" + std::to_string(layers.size() - listed) + " more)";
  return s;
}

// Inclusive bounds on the number of inputs a layer type takes.
std::pair<size_t, size_t> input_count_range(LayerType type) {
  switch (type) {
    case LayerType::kInput: return {0, 0};
    case LayerType::kAdd:
    case LayerType::kConcat: return {2, SIZE_MAX};
    default: return {1, 1};
  }
}

std::string expected_inputs(LayerType type) {
  const auto [lo, hi] = input_count_range(type);
  if (lo == hi) return "exactly " + std::to_string(lo);
  return "at least " + std::to_string(lo);
}

// Checks the parameters that do not depend on the input shape.
void check_parameters(const LayerSpec& spec) {
  const bool windowed =
      spec.type == LayerType::kConv || (spec.type == LayerType::kPool && !spec.global);
  if ((spec.type == LayerType::kConv || spec.type == LayerType::kFc) && spec.out <= 0) {
    fail(spec, "out must be positive, got " + std::to_string(spec.out));
  }
  if (!windowed) return;
  if (spec.kernel_h <= 0 || spec.kernel_w <= 0) {
    fail(spec, "kernel must be positive, got " + std::to_string(spec.kernel_h) + "x" +
                   std::to_string(spec.kernel_w));
  }
  if (spec.stride_h <= 0 || spec.stride_w <= 0) {
    fail(spec, "stride must be positive, got " + std::to_string(spec.stride_h) + "x" +
                   std::to_string(spec.stride_w));
  }
  if (spec.pad_h < 0 || spec.pad_w < 0) {
    fail(spec, "pad must not be negative, got " + std::to_string(spec.pad_h) + "x" +
                   std::to_string(spec.pad_w));
  }
  // A window made only of padding has no input to read (and cuDNN rejects it).
  if (spec.pad_h >= spec.kernel_h || spec.pad_w >= spec.kernel_w) {
    fail(spec, "pad " + std::to_string(spec.pad_h) + "x" + std::to_string(spec.pad_w) +
                   " must be smaller than the kernel " + std::to_string(spec.kernel_h) + "x" +
                   std::to_string(spec.kernel_w));
  }
}

// Output plane of a conv or pool window over `in`; throws when the window does
// not fit the padded input (which is exactly when the output would be empty).
Shape window_shape(const LayerSpec& spec, const Shape& in, int64_t channels) {
  if (spec.kernel_h > in.h + 2 * spec.pad_h || spec.kernel_w > in.w + 2 * spec.pad_w) {
    fail(spec, std::to_string(spec.kernel_h) + "x" + std::to_string(spec.kernel_w) +
                   " window (pad " + std::to_string(spec.pad_h) + "x" + std::to_string(spec.pad_w) +
                   ") is larger than its padded input " + chw(in) + " from '" + spec.inputs[0] +
                   "'");
  }
  return window_of(spec).output_shape({1, in.c, in.h, in.w}, channels);
}

std::string join_shapes(const LayerSpec& spec, const std::vector<Shape>& in) {
  std::string s;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i > 0) s += ", ";
    s += spec.inputs[i] + " " + chw(in[i]);
  }
  return s;
}

// Output shape of `spec` from its inputs' shapes. Normalises a global pool's
// window to the input plane so later code reads one kind of pool.
Shape infer_shape(LayerSpec& spec, const std::vector<Shape>& in, const Shape& data) {
  switch (spec.type) {
    case LayerType::kInput: return {1, data.c, data.h, data.w};
    case LayerType::kConv: return window_shape(spec, in[0], spec.out);
    case LayerType::kPool:
      if (spec.global) {
        spec.kernel_h = in[0].h;
        spec.kernel_w = in[0].w;
        spec.stride_h = spec.stride_w = 1;
        spec.pad_h = spec.pad_w = 0;
      }
      return window_shape(spec, in[0], in[0].c);
    case LayerType::kFc: return {1, spec.out, 1, 1};
    case LayerType::kRelu:
    case LayerType::kBatchNorm: return in[0];
    case LayerType::kAdd:
      for (const Shape& s : in) {
        if (s != in[0]) {
          fail(spec, "add needs identical input shapes, got " + join_shapes(spec, in));
        }
      }
      return in[0];
    case LayerType::kConcat: {
      Shape out{1, 0, in[0].h, in[0].w};
      for (const Shape& s : in) {
        if (s.h != out.h || s.w != out.w) {
          fail(spec, "concat needs equal spatial sizes, got " + join_shapes(spec, in));
        }
        out.c += s.c;
      }
      return out;
    }
  }
  fail(spec, "unhandled layer type");
}

// Walks back from a layer left over by Kahn's algorithm along inputs that were
// also left over: every such layer has one, so the walk must close a cycle.
std::string describe_cycle(const std::vector<LayerSpec>& layers,
                           const std::vector<std::vector<int>>& inputs,
                           const std::vector<bool>& ordered) {
  int start = 0;
  while (ordered[start]) ++start;
  std::vector<int> seen_at(layers.size(), -1);
  std::vector<int> path;
  int at = start;
  while (seen_at[at] < 0) {
    seen_at[at] = static_cast<int>(path.size());
    path.push_back(at);
    for (int p : inputs[at]) {
      if (!ordered[p]) {
        at = p;
        break;
      }
    }
  }
  // path runs against the data flow: reverse it, then start the cycle at its
  // earliest-listed layer so the message reads like the config.
  std::vector<int> cycle(path.rbegin(), path.rend() - seen_at[at]);
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::string s;
  for (int i : cycle) s += layers[i].name + " -> ";
  return s + layers[cycle.front()].name;
}

// Maps every name to its position in the given order; rejects empty and
// duplicate names.
std::unordered_map<std::string, int> index_names(const std::vector<LayerSpec>& layers) {
  std::unordered_map<std::string, int> index;
  for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
    const LayerSpec& spec = layers[i];
    if (spec.name.empty()) {
      throw GraphError("layer #" + std::to_string(i + 1) +
                       (spec.source_line > 0 ? " (line " + std::to_string(spec.source_line) + ")"
                                             : std::string()) +
                       " has no name");
    }
    const auto [it, inserted] = index.emplace(spec.name, i);
    if (!inserted) {
      const LayerSpec& first = layers[it->second];
      fail(spec, "duplicate name (first defined " +
                     (first.source_line > 0 ? "at line " + std::to_string(first.source_line)
                                            : "as layer #" + std::to_string(it->second + 1)) +
                     ")");
    }
  }
  return index;
}

// Input indices of every layer (given order), after checking input counts,
// input names, the shape-independent parameters and that there is exactly one
// input layer.
std::vector<std::vector<int>> resolve_inputs(const std::vector<LayerSpec>& layers,
                                             const std::unordered_map<std::string, int>& index) {
  std::vector<std::vector<int>> inputs(layers.size());
  std::vector<std::string> input_layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& spec = layers[i];
    const auto [lo, hi] = input_count_range(spec.type);
    if (spec.inputs.size() < lo || spec.inputs.size() > hi) {
      fail(spec, std::string(layer_type_name(spec.type)) + " takes " + expected_inputs(spec.type) +
                     " input(s), got " + std::to_string(spec.inputs.size()));
    }
    for (const std::string& name : spec.inputs) {
      const auto it = index.find(name);
      if (it == index.end()) {
        fail(spec, "input '" + name + "' is not a layer (known: " + known_names(layers) + ")");
      }
      // A join reading one tensor twice is almost surely a typo in the config.
      if (std::find(inputs[i].begin(), inputs[i].end(), it->second) != inputs[i].end()) {
        fail(spec, "input '" + name + "' is listed twice");
      }
      inputs[i].push_back(it->second);
    }
    check_parameters(spec);
    if (spec.type == LayerType::kInput) input_layers.push_back(spec.name);
  }
  if (input_layers.empty()) {
    throw GraphError("graph has no input layer (type input, no inputs)");
  }
  if (input_layers.size() > 1) {
    throw GraphError("graph has " + std::to_string(input_layers.size()) + " input layers (" +
                     quoted_list(input_layers) + "); exactly one is required");
  }
  return inputs;
}

// Kahn's algorithm; the ready layer earliest in the given order goes first, so
// an already ordered list comes out unchanged. Every layer but the input has
// an input, so the input is the only layer ready at the start and comes first.
std::vector<int> topological_order(const std::vector<LayerSpec>& layers,
                                   const std::vector<std::vector<int>>& inputs,
                                   const std::vector<std::vector<int>>& readers) {
  const int n = static_cast<int>(layers.size());
  std::vector<int> pending(n);
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n; ++i) {
    pending[i] = static_cast<int>(inputs[i].size());
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<int> order;
  std::vector<bool> ordered(n, false);
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    ordered[i] = true;
    for (int r : readers[i]) {
      if (--pending[r] == 0) ready.push(r);
    }
  }
  if (static_cast<int>(order.size()) != n) {
    const std::string cycle = describe_cycle(layers, inputs, ordered);
    const std::string message = "graph has a cycle: " + cycle;
    throw GraphError(message, cycle.substr(0, cycle.find(" -> ")), message);
  }
  return order;
}

// With one source and no cycle every layer is reachable from the input, so a
// layer that cannot reach the logits is itself a sink: one sink means every
// layer contributes to the logits, which then come last in any order.
void check_single_sink(const std::vector<LayerSpec>& layers, const std::vector<int>& order,
                       const std::vector<std::vector<int>>& readers) {
  std::vector<std::string> sinks;
  for (int i : order) {
    if (readers[i].empty()) sinks.push_back(layers[i].name);
  }
  if (sinks.size() != 1) {
    throw GraphError("graph has " + std::to_string(sinks.size()) + " sinks (" + quoted_list(sinks) +
                     "): exactly one layer, the logits, may have no consumers; the others "
                     "compute outputs nobody uses");
  }
  if (layers.size() == 1) {
    throw GraphError("graph has only the input layer '" + layers[0].name + "'");
  }
}

uint64_t fnv1a(std::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

const char* layer_type_name(LayerType type) { return common::name_of(kLayerTypeNames, type); }

LayerType parse_layer_type(const std::string& name) {
  return common::parse_named<GraphError>(kLayerTypeNames, name, "layer type");
}

Graph Graph::build(std::vector<LayerSpec> layers, const Shape& input,
                   common::Precision precision) {
  if (input.c <= 0 || input.h <= 0 || input.w <= 0) {
    throw GraphError("graph input shape must be positive, got " + chw(input));
  }
  const int n = static_cast<int>(layers.size());
  const std::vector<std::vector<int>> inputs = resolve_inputs(layers, index_names(layers));
  std::vector<std::vector<int>> readers(n);
  for (int i = 0; i < n; ++i) {
    for (int p : inputs[i]) readers[p].push_back(i);
  }
  const std::vector<int> order = topological_order(layers, inputs, readers);
  check_single_sink(layers, order, readers);

  Graph g;
  g.precision_ = precision;
  std::vector<int> position(n);
  for (int k = 0; k < n; ++k) position[order[k]] = k;
  g.layers_.reserve(n);
  g.inputs_.resize(n);
  g.consumers_.resize(n);
  g.shapes_.reserve(n);
  for (int k = 0; k < n; ++k) {
    const int i = order[k];
    g.layers_.push_back(std::move(layers[i]));
    std::vector<Shape> in;
    for (int p : inputs[i]) {
      g.inputs_[k].push_back(position[p]);
      // Appended in increasing k, so every consumer list comes out ascending.
      g.consumers_[position[p]].push_back(k);
      in.push_back(g.shapes_[position[p]]);
    }
    g.shapes_.push_back(infer_shape(g.layers_[k], in, input));
  }
  return g;
}

int Graph::find(const std::string& name) const {
  for (int i = 0; i < size(); ++i) {
    if (layers_[i].name == name) return i;
  }
  return -1;
}

int64_t Graph::parameter_count() const {
  int64_t total = 0;
  for (int i = 0; i < size(); ++i) {
    const LayerSpec& spec = layers_[i];
    // Only layers with one input carry parameters.
    const Shape& in = inputs_[i].empty() ? shapes_[i] : shapes_[inputs_[i][0]];
    const int64_t bias = spec.bias ? spec.out : 0;
    switch (spec.type) {
      case LayerType::kConv: total += spec.out * in.c * spec.kernel_h * spec.kernel_w + bias; break;
      case LayerType::kFc: total += spec.out * in.per_sample() + bias; break;
      case LayerType::kBatchNorm: total += 2 * in.c; break;
      default: break;
    }
  }
  return total;
}

std::string Graph::signature() const {
  // Canonical text of everything that defines the computation: types,
  // connectivity, parameters and shapes. Names and config lines are left out:
  // renaming a layer or reformatting a config keeps the architecture.
  std::string text;
  for (int i = 0; i < size(); ++i) {
    const LayerSpec& s = layers_[i];
    text += layer_type_name(s.type);
    text += '(';
    for (int p : inputs_[i]) text += std::to_string(p) + ',';
    text += ')';
    if (s.type == LayerType::kConv || s.type == LayerType::kPool) {
      text += " k" + std::to_string(s.kernel_h) + 'x' + std::to_string(s.kernel_w) + " s" +
              std::to_string(s.stride_h) + 'x' + std::to_string(s.stride_w) + " p" +
              std::to_string(s.pad_h) + 'x' + std::to_string(s.pad_w);
    }
    if (s.type == LayerType::kPool) {
      text += s.pool == PoolKind::kMax ? " max" : " avg";
      if (s.global) text += " global";
    }
    if (s.type == LayerType::kConv || s.type == LayerType::kFc) {
      text += " o" + std::to_string(s.out) + (s.bias ? " b" : " nb");
    }
    if (s.type == LayerType::kBatchNorm) {
      // Bit patterns, so that every change of eps or momentum shows.
      text += " e" + std::to_string(std::bit_cast<uint32_t>(s.bn_eps)) + " m" +
              std::to_string(std::bit_cast<uint32_t>(s.bn_momentum));
    }
    text += " -> " + chw(shapes_[i]) + ';';
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(text)));
  return hex;
}

std::string Graph::profile_key() const {
  // One append at a time: "@" + name trips a GCC 12 -Wrestrict false positive.
  std::string key = signature();
  if (precision_ != common::Precision::kFp32) {
    key += '@';
    key += common::precision_name(precision_);
  }
  if (layout_choice_ != LayoutChoice::kAuto) {
    key += '@';
    key += common::name_of(kLayoutChoiceNames, layout_choice_);
  }
  if (fuse_relu_ != common::AutoOnOff::kAuto) {
    key += "@fuse_relu=";
    key += common::name_of(common::kAutoOnOffNames, fuse_relu_);
  }
  return key;
}

}  // namespace vtrain::worker
