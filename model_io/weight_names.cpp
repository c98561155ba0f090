#include "model_io/weight_names.h"

#include <array>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string_view>

#include "worker/engine/parameter_layout.h"

namespace vtrain::model_io {
namespace {

using worker::LayerSpec;
using worker::LayerType;

// torchvision's VGG-16 (configuration D): convs per group. In its
// `features`, every conv is followed by a ReLU and every group by a max
// pool, so the modules number conv, relu, conv, relu, pool, ...
constexpr std::array<int, 5> kVgg16Groups = {2, 2, 3, 3, 3};

// vtrain's VGG-16 "conv<g>_<k>" as torchvision's "features.<i>". Counted
// from the configuration, not from vtrain's layers: at small inputs vtrain
// leaves out pools that do not fit, torchvision never does.
std::string vgg16_module(const std::string& layer) {
  static const std::map<std::string, std::string> kClassifier = {
      {"fc6", "classifier.0"}, {"fc7", "classifier.3"}, {"fc8", "classifier.6"}};
  if (const auto it = kClassifier.find(layer); it != kClassifier.end()) return it->second;
  int group = 0, k = 0;
  char rest = 0;
  if (std::sscanf(layer.c_str(), "conv%d_%d%c", &group, &k, &rest) == 2 && group >= 1 &&
      group <= static_cast<int>(kVgg16Groups.size()) && k >= 1 && k <= kVgg16Groups[group - 1]) {
    int index = 0;
    for (int g = 0; g < group - 1; ++g) index += 2 * kVgg16Groups[g] + 1;
    return "features." + std::to_string(index + 2 * (k - 1));
  }
  return "";
}

// torchvision's AlexNet: features 0 conv, 1 relu, 2 pool, 3 conv, 4 relu,
// 5 pool, 6 conv, 7 relu, 8 conv, 9 relu, 10 conv, 11 relu, 12 pool;
// classifier 0 dropout, 1 fc, 2 relu, 3 dropout, 4 fc, 5 relu, 6 fc.
std::string alexnet_module(const std::string& layer) {
  static const std::map<std::string, std::string> kModules = {
      {"conv1", "features.0"},   {"conv2", "features.3"},   {"conv3", "features.6"},
      {"conv4", "features.8"},   {"conv5", "features.10"},  {"fc6", "classifier.1"},
      {"fc7", "classifier.4"},   {"fc8", "classifier.6"}};
  const auto it = kModules.find(layer);
  return it == kModules.end() ? "" : it->second;
}

// vtrain's ResNet names are torchvision's but for the shortcut projection,
// which torchvision keeps in a Sequential (downsample.0, downsample.1).
std::string resnet_module(const std::string& layer) {
  for (const auto& [ours, theirs] : {std::pair<std::string_view, std::string_view>{
                                         ".downsample.conv", ".downsample.0"},
                                     {".downsample.bn", ".downsample.1"}}) {
    if (layer.ends_with(ours)) {
      return layer.substr(0, layer.size() - ours.size()) + std::string(theirs);
    }
  }
  return layer;
}

}  // namespace

int64_t ModelTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool torchvision_architecture(const std::string& preset) {
  for (const char* name : {"resnet18", "resnet50", "resnext50_32x4d", "vgg16", "alexnet",
                           "mobilenet_v2", "efficientnet_b0"}) {
    if (preset == name) return true;
  }
  return false;
}

std::string module_name(const std::string& layer, const std::string& preset) {
  std::string module = layer;
  if (preset == "vgg16") module = vgg16_module(layer);
  if (preset == "alexnet") module = alexnet_module(layer);
  if (preset == "resnet18" || preset == "resnet50" || preset == "resnext50_32x4d") {
    module = resnet_module(layer);
  }
  // mobilenet_v2's and efficientnet_b0's layers carry torchvision's module
  // names already (worker/engine/presets.cpp).
  if (module.empty()) {
    throw std::logic_error("model_io: preset " + preset + " has no torchvision module for layer " +
                           layer);
  }
  return module;
}

std::vector<ModelTensor> model_tensors(const worker::Graph& graph, const std::string& preset) {
  const bool torchvision = torchvision_architecture(preset);
  std::vector<ModelTensor> tensors;
  // worker::layer_tensors says where each tensor lies and its shape, under
  // vtrain's names; only the name another tool knows it by is added here.
  for (const worker::LayerTensor& lt : worker::layer_tensors(graph)) {
    const LayerSpec& spec = graph.layer(lt.layer);
    const std::string suffix = lt.name.substr(spec.name.size());  // ".weight", ".running_var"
    const std::string module = torchvision ? module_name(spec.name, preset) : spec.name;
    ModelTensor t;
    t.name = module + suffix;
    t.vtrain_name = lt.name;
    t.layer = lt.layer;
    t.kind = lt.buffer ? WeightKind::kBuffer : WeightKind::kParameter;
    t.offset = lt.offset;
    t.shape = lt.shape;
    tensors.push_back(std::move(t));
    // torchvision's batch norm also counts its batches (after running_var).
    if (torchvision && spec.type == LayerType::kBatchNorm && suffix == ".running_var") {
      tensors.push_back({module + ".num_batches_tracked", spec.name + ".num_batches_tracked",
                         lt.layer, WeightKind::kBatchCount, 0, {}});
    }
  }
  return tensors;
}

}  // namespace vtrain::model_io
