#include "worker/engine/layers/layer_registry.h"

#include <stdexcept>

namespace vtrain::worker {

void LayerRegistry::add(const std::string& type, LayerFactory factory) {
  if (!factories_.emplace(type, factory).second) {
    throw std::logic_error("layer registry: type '" + type + "' registered twice");
  }
}

std::unique_ptr<Layer> LayerRegistry::make(const LayerSite& site) const {
  const LayerSpec& spec = site.spec();
  const std::string type = layer_type_name(spec.type);
  auto it = factories_.find(type);
  if (it == factories_.end()) {
    std::string known;
    for (const std::string& t : types()) known += (known.empty() ? "" : ", ") + t;
    const std::string line =
        spec.source_line > 0 ? " (line " + std::to_string(spec.source_line) + ")" : "";
    throw GraphError("layer '" + spec.name + "'" + line + ": unknown layer type '" + type +
                     "' (known types: " + known + ")");
  }
  return it->second(site);
}

std::vector<std::string> LayerRegistry::types() const {
  std::vector<std::string> out;
  for (const auto& [type, factory] : factories_) out.push_back(type);
  return out;
}

namespace {

LayerRegistry engine_layers() {
  LayerRegistry r;
  r.add(layer_type_name(LayerType::kInput), make_input_layer);
  r.add(layer_type_name(LayerType::kConv), make_conv_layer);
  r.add(layer_type_name(LayerType::kRelu), make_relu_layer);
  r.add(layer_type_name(LayerType::kPool), make_pool_layer);
  r.add(layer_type_name(LayerType::kFc), make_fc_layer);
  r.add(layer_type_name(LayerType::kBatchNorm), make_batch_norm_layer);
  r.add(layer_type_name(LayerType::kAdd), make_add_layer);
  r.add(layer_type_name(LayerType::kConcat), make_concat_layer);
  return r;
}

}  // namespace

const LayerRegistry& layer_registry() {
  static const LayerRegistry registry = engine_layers();
  return registry;
}

}  // namespace vtrain::worker
