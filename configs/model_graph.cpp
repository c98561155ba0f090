// The model a config describes and how it says to compute it (see
// model_graph.h).
#include "configs/model_graph.h"

#include <string>
#include <utility>
#include <vector>

#include "configs/internal/config_parts.h"

namespace vtrain::config {
namespace internal {

std::string chw(const worker::Shape& s) {
  return std::to_string(s.c) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w);
}

std::string input_key(const Config& config) {
  return config.data.kind == worker::DataKind::kSynthetic ? "data.shape" : "data.kind";
}

}  // namespace internal

namespace {

using internal::chw;
using internal::input_key;

// Where a layer of the model came from: "model.layers[i]" for an explicit
// layer, "model.preset" for a preset's.
std::string layer_key(const Config& config, const std::string& name) {
  for (size_t i = 0; i < config.model.layers.size(); ++i) {
    if (config.model.layers[i].name == name) return "model.layers[" + std::to_string(i) + "]";
  }
  return "model.preset";
}

}  // namespace

void fail_model(const Config& config, const worker::Shape& input,
                             const std::string& layer, const std::string& what) {
  if (!config.model.preset.empty()) {
    fail_at(config, "model.preset",
            "preset '" + config.model.preset + "' for input " + chw(input) + " (" +
                input_key(config) + ")" + (layer.empty() ? "" : ": layer '" + layer + "'") +
                ": " + what);
  }
  if (!config.model.onnx.empty()) {
    fail_at(config, "model.onnx",
            config.model.onnx + (layer.empty() ? "" : ": layer '" + layer + "'") + ": " + what);
  }
  const std::string key = layer.empty() ? "model.layers" : layer_key(config, layer);
  const std::string where = where_at(config, key);
  throw ConfigError(where + (layer.empty() ? "" : " (" + layer + ")") + ": " + what);
}

worker::Graph build_model(const Config& config, const worker::Shape& input) {
  try {
    std::vector<worker::LayerSpec> layers = config.model.layers;
    if (!config.model.preset.empty()) {
      layers = worker::preset_layers(config.model.preset, {input, config.model.classes});
    }
    const worker::Shape& declared = config.model.onnx_input;
    if (!config.model.onnx.empty() &&
        (declared.c != input.c || declared.h != input.h || declared.w != input.w)) {
      fail_at(config, "model.onnx",
              config.model.onnx + " takes inputs of " + chw(declared) + ", but the data's "
              "samples are " + chw(input) + " (" + input_key(config) + ")");
    }
    return worker::Graph::build(std::move(layers), input);
  } catch (const worker::GraphError& error) {
    fail_model(config, input, error.layer(), error.detail());
  }
}

common::ComputeSettings compute_settings(const Config& config) { return config.compute; }

}  // namespace vtrain::config
