// The names and shapes of a model's weights, as files outside vtrain hold
// them: each parameter and batch-norm running statistic of a graph as a
// named tensor, with where it lies in the flat arrays a checkpoint and a
// network keep (worker::Checkpoint::parameters and ::buffers).
//
// Naming: the presets that are torchvision's architectures (resnet18,
// resnet50, resnext50_32x4d, vgg16, alexnet, mobilenet_v2,
// efficientnet_b0) get the keys of torchvision's state_dict
// ("conv1.weight", "layer2.0.downsample.0.weight", "features.0.bias",
// "classifier.6.weight", "bn1.running_mean", "bn1.num_batches_tracked");
// every other model gets vtrain's layer names with the same suffixes
// ("<layer>.weight", "<layer>.bias", "<layer>.running_mean",
// "<layer>.running_var"). Layouts are torch's, which are vtrain's: conv
// weights [out, in / groups, kh, kw] (OIHW), fc weights [out, in] with `in` the
// input's C x H x W flattened in that order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/engine/graph.h"

namespace vtrain::model_io {

enum class WeightKind {
  kParameter,   // learned: in Checkpoint::parameters
  kBuffer,      // batch norm's running mean or variance: in Checkpoint::buffers
  kBatchCount,  // torchvision's num_batches_tracked (I64, shape []): vtrain keeps none
};

struct ModelTensor {
  std::string name;         // the name vtrain writes: torchvision's key or vtrain's
  std::string vtrain_name;  // "<layer>.<suffix>", whatever the naming
  int layer = 0;            // graph index
  WeightKind kind = WeightKind::kParameter;
  int64_t offset = 0;       // floats into the parameters or buffers (not for kBatchCount)
  std::vector<int64_t> shape;
  int64_t elements() const;
};

// Whether `preset` is one of torchvision's architectures, whose weights get
// torchvision's names.
bool torchvision_architecture(const std::string& preset);

// The name of the module that holds layer `layer`'s weights in torchvision's
// model of `preset` ("layer1.0.downsample.0", "features.28", "classifier.6"),
// or `layer` itself for other presets and custom models.
std::string module_name(const std::string& layer, const std::string& preset);

// Every weight tensor of `graph` in graph order, each layer's parameters
// before its buffers. `preset` is the config's model.preset (empty for
// model.layers). Their parameter and buffer elements add up to the
// graph's parameter count and to a network's buffer count.
std::vector<ModelTensor> model_tensors(const worker::Graph& graph, const std::string& preset);

}  // namespace vtrain::model_io
