// model.init and model.init_skip: a model's starting weights from a
// safetensors file (vtrain's export, or torchvision's state_dict saved with
// safetensors.torch.save_file), read and checked whole before any of it
// reaches a network.
#pragma once

#include <string>
#include <vector>

#include "worker/engine/graph.h"
#include "worker/train/trainer.h"

namespace vtrain::model_io {

// The graph indices of the layers `names` name (model.init_skip): a vtrain
// layer name, or for a torchvision architecture also torchvision's module
// name ("classifier.6" for vgg16's fc8). Throws std::invalid_argument
// naming an unknown name, or a layer without weights, and listing the
// layers that have weights.
std::vector<int> skipped_layers(const worker::Graph& graph, const std::string& preset,
                                const std::vector<std::string>& names);

// Reads `path` and matches its tensors to `graph`'s (model_io/weight_names.h;
// a file may use torchvision's names where the preset has them, or
// vtrain's), leaving out every tensor of the layers in `skip` (graph
// indices, from skipped_layers) whether the file has them or not. Throws
// WeightsError naming the file when it is malformed
// (SafetensorsFile::read), or, all in one message: every tensor whose
// shape differs (naming the tensor and both shapes) or whose dtype is not
// F32 (I64 or another integer type for num_batches_tracked, which is
// checked and not used); every tensor of the file the model lacks and
// every tensor of the model the file lacks; a tensor given under both
// namings. Nothing is returned unless everything matches.
worker::InitialWeights read_initial_weights(const std::string& path, const worker::Graph& graph,
                                            const std::string& preset,
                                            const std::vector<int>& skip);

}  // namespace vtrain::model_io
