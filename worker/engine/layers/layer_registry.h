// The layer registry: layer type name -> factory, filled by explicit calls
// (no static self-registration: it breaks static linking). The network asks
// it for one operator per graph node.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/conv_kernel.h"
#include "worker/engine/layers/layer.h"

namespace vtrain::worker {

// What a factory gets to build the operator of graph node `index`.
struct LayerSite {
  const Graph& graph;
  int index;
  Backend& backend;
  const TensorDesc* x;  // its first input's activation at max batch; null for the data
  const TensorDesc& y;  // its output's, at max batch
  // conv layers: conv.algorithm ("auto" or a name), and the plan's
  // execution of this layer (null: no plan)
  const std::string& conv_algorithm;
  const ConvLayerExecution* conv_execution;

  const LayerSpec& spec() const { return graph.layer(index); }
};

using LayerFactory = std::unique_ptr<Layer> (*)(const LayerSite&);

class LayerRegistry {
 public:
  // Registers `factory` for `type` (layer_type_name()); throws
  // std::logic_error when the type has one already.
  void add(const std::string& type, LayerFactory factory);
  // The operator of site's layer. Throws GraphError naming the layer, its
  // type and the known types when no factory is registered for it.
  std::unique_ptr<Layer> make(const LayerSite& site) const;
  // Registered type names, sorted.
  std::vector<std::string> types() const;

 private:
  std::map<std::string, LayerFactory> factories_;
};

// The registry of every layer type the engine runs.
const LayerRegistry& layer_registry();

// The factories, one per layer type (each in its layer's file).
std::unique_ptr<Layer> make_input_layer(const LayerSite& site);
std::unique_ptr<Layer> make_conv_layer(const LayerSite& site);
std::unique_ptr<Layer> make_relu_layer(const LayerSite& site);
std::unique_ptr<Layer> make_pool_layer(const LayerSite& site);
std::unique_ptr<Layer> make_fc_layer(const LayerSite& site);
std::unique_ptr<Layer> make_batch_norm_layer(const LayerSite& site);
std::unique_ptr<Layer> make_add_layer(const LayerSite& site);
std::unique_ptr<Layer> make_concat_layer(const LayerSite& site);

}  // namespace vtrain::worker
