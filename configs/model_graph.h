// The model a config describes, built for the data's sample shape, and
// how the config says to compute it (common::ComputeSettings): two
// values, the graph being the model alone. Errors
// are ConfigErrors naming FILE:LINE and the key (config.h: fail_at).
#pragma once

#include <string>

#include "common/compute_settings.h"
#include "configs/config.h"
#include "worker/engine/graph.h"

namespace vtrain::config {

// The model as training builds it for per-sample `input` (a preset expanded
// for it), checked: graph errors name "FILE:LINE: model.layers[i] (name)",
// or the preset and the key that set the input size (data.shape, data.kind).
worker::Graph build_model(const Config& config, const worker::Shape& input);

// How the config computes its model (Config::compute).
common::ComputeSettings compute_settings(const Config& config);

// Fails naming `layer` of the model built for `input` (empty: the model as
// a whole): "FILE:LINE: model.layers[i] (name): what", for a preset
// "FILE:LINE: model.preset: preset 'p' for input CxHxW (data.shape): layer
// 'name': what", for an ONNX file "FILE:LINE: model.onnx: ONNX_FILE: layer
// 'name': what".
[[noreturn]] void fail_model(const Config& config, const worker::Shape& input,
                             const std::string& layer, const std::string& what);

}  // namespace vtrain::config
