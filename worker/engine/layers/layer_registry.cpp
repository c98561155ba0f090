#include "worker/engine/layers/layer_registry.h"

#include <array>
#include <stdexcept>
#include <string>

namespace vtrain::worker {
namespace {

struct LayerFactoryEntry {
  LayerType value;
  LayerFactory make;
};

// One factory per layer type, indexed by the type: a type left out, or
// listed out of order, fails the static_assert below.
constexpr std::array<LayerFactoryEntry, kLayerTypeCount> kLayerFactories = {{
    {LayerType::kInput, make_input_layer},
    {LayerType::kConv, make_conv_layer},
    {LayerType::kRelu, make_relu_layer},
    {LayerType::kPool, make_pool_layer},
    {LayerType::kFc, make_fc_layer},
    {LayerType::kBatchNorm, make_batch_norm_layer},
    {LayerType::kAdd, make_add_layer},
    {LayerType::kConcat, make_concat_layer},
    {LayerType::kSilu, make_activation_layer},
    {LayerType::kGelu, make_activation_layer},
    {LayerType::kSigmoid, make_activation_layer},
    {LayerType::kRelu6, make_activation_layer},
    {LayerType::kMul, make_mul_layer},
    {LayerType::kDropout, make_dropout_layer},
}};
static_assert(in_layer_type_order(kLayerFactories),
              "kLayerFactories needs one entry per LayerType, in enum order");

}  // namespace

LayerFactory layer_factory(LayerType type) {
  return kLayerFactories.at(static_cast<size_t>(type)).make;
}

std::unique_ptr<Layer> make_layer(const LayerSite& site) {
  return layer_factory(site.spec().type)(site);
}

}  // namespace vtrain::worker
