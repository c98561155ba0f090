// `vtrain export`: a trained model (the config's graph, a checkpoint's
// weights) written for other tools.
#pragma once

#include "launcher/cli.h"
#include "worker/data/data.h"
#include "worker/engine/graph.h"

namespace vtrain::launcher {

// Writes `graph` with the weights of cli.checkpoint (a file, or a folder's
// newest) to cli.out in cli.format; `norm` is the evaluation's
// standardisation, which an ONNX file records; `preset` (model.preset, or
// empty) decides whether safetensors get torchvision's names. Throws CheckpointError for a
// checkpoint that is missing, torn or of another model, OutputError when
// the file cannot be written. Returns the exit code.
int run_export(const CliArgs& cli, const worker::Graph& graph, const worker::ChannelStats& norm,
               const std::string& preset);

}  // namespace vtrain::launcher
