// The layer registry: one factory per LayerType, in a table indexed by the
// type and checked complete at compile time (no static self-registration:
// it breaks static linking). The network asks it for one operator per
// graph node. Layer type names live in kLayerTypeNames (graph.h).
#pragma once

#include <memory>
#include <string>

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

// The factory of `type`'s layers.
LayerFactory layer_factory(LayerType type);
// The operator of site's layer, from its type's factory.
std::unique_ptr<Layer> make_layer(const LayerSite& site);

// The ActivationKind of relu, silu, gelu, sigmoid and relu6 layers; throws
// std::logic_error for other types.
ActivationKind activation_kind(LayerType type);

// The factories, one per layer type, each in its layer's file.
std::unique_ptr<Layer> make_input_layer(const LayerSite& site);
std::unique_ptr<Layer> make_conv_layer(const LayerSite& site);
std::unique_ptr<Layer> make_relu_layer(const LayerSite& site);
std::unique_ptr<Layer> make_activation_layer(const LayerSite& site);  // silu, gelu, sigmoid, relu6
std::unique_ptr<Layer> make_mul_layer(const LayerSite& site);
std::unique_ptr<Layer> make_pool_layer(const LayerSite& site);
std::unique_ptr<Layer> make_fc_layer(const LayerSite& site);
std::unique_ptr<Layer> make_batch_norm_layer(const LayerSite& site);
std::unique_ptr<Layer> make_add_layer(const LayerSite& site);
std::unique_ptr<Layer> make_concat_layer(const LayerSite& site);
std::unique_ptr<Layer> make_dropout_layer(const LayerSite& site);

}  // namespace vtrain::worker
