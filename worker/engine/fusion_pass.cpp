#include "worker/engine/fusion_pass.h"

namespace vtrain::worker {

std::vector<FusedPair> fuse_conv_bias_relu(const Graph& graph, const std::vector<TensorDesc>& descs,
                                           const Backend& backend, const ComputeSettings& settings) {
  const common::AutoOnOff setting = settings.fuse_relu;
  std::vector<FusedPair> pairs;
  if (setting == common::AutoOnOff::kOff) return pairs;
  for (int i = 0; i < graph.size(); ++i) {
    if (graph.layer(i).type != LayerType::kRelu) continue;
    const int in = graph.inputs(i)[0];
    const LayerSpec& conv = graph.layer(in);
    if (conv.type != LayerType::kConv || !conv.bias || graph.consumer_count(in) != 1) continue;
    const ActivationDesc fused{.x = descs[in], .y = descs[i], .bias = true};
    if (backend.supports(fused)) continue;
    if (setting == common::AutoOnOff::kAuto && !backend.prefers(fused)) continue;
    pairs.push_back({in, i});
  }
  return pairs;
}

}  // namespace vtrain::worker
