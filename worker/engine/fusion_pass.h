// Fusion as an attribute of the ops, decided by a pass over the graph: which
// neighbouring layers run as one descriptor (a convolution's bias added by
// the activation after it: ActivationDesc::bias, the convolution's
// ConvDesc::bias cleared). The layers only carry out what the pass decides.
//
// The conv-bias-ReLU pairing is the first such rule. The fused batch norm +
// add + ReLU of a later issue goes here too, as another rule of this pass
// (its result another kind of FusedPair) and an attribute of its
// descriptor.
#pragma once

#include <vector>

#include "common/compute_settings.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"

namespace vtrain::worker {

// One fusion: the layer `into` runs the part of layer `from` (conv-bias-ReLU:
// the relu adds the convolution's bias and writes its gradient).
struct FusedPair {
  int from = 0;  // the convolution's index in the graph
  int into = 0;  // the relu's
  friend bool operator==(const FusedPair&, const FusedPair&) = default;
};

// The conv-bias-ReLU pairs of `graph` whose activations are `descs`
// (activation_descs()), under settings.fuse_relu (conv.fuse_relu): off pairs none;
// on pairs every relu whose input is a convolution with a bias that no
// other layer reads, where the backend supports the bias-paired relu; auto
// pairs those where the backend also prefers it (Backend::prefers: it saves
// a pass over the activations each way).
std::vector<FusedPair> fuse_conv_bias_relu(const Graph& graph, const std::vector<TensorDesc>& descs,
                                           const Backend& backend, const ComputeSettings& settings);

}  // namespace vtrain::worker
