#include "worker/engine/op_scratch.h"

#include <algorithm>

#include "worker/device/op_calls.h"
#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {

namespace {

size_t layer_scratch_bytes(const Graph& graph, int i, const std::vector<TensorDesc>& out,
                           Backend& backend) {
  const LayerSpec& spec = graph.layer(i);
  const std::vector<int>& in = graph.inputs(i);
  const TensorDesc& y = out[i];
  const auto scratch = [&](const OpDesc& op) { return backend.scratch_bytes(op).scratch; };
  const auto add = [&](const TensorDesc& a, const TensorDesc& b, const TensorDesc& sum) {
    return scratch(BinaryDesc{BinaryKind::kAdd, a, b, sum});
  };
  switch (spec.type) {
    case LayerType::kInput:
    case LayerType::kConv:  // convolutions run in the planned workspace
      return 0;
    // Each family's scratch query covers its every kind (bias-paired relu,
    // backward, training and inference, either beta).
    case LayerType::kRelu:
    case LayerType::kSilu:
    case LayerType::kGelu:
    case LayerType::kSigmoid:
    case LayerType::kRelu6: return scratch(ActivationDesc{.kind = activation_kind(spec.type), .x = out[in[0]], .y = y});
    case LayerType::kPool:
      return scratch(PoolDesc{spec.pool, Direction::kForward, out[in[0]], y, window_of(spec)});
    case LayerType::kFc:
      return scratch(InnerProductDesc{InnerProductKind::kForward, out[in[0]], y, spec.bias});
    case LayerType::kBatchNorm:
      return scratch(BatchNormDesc{.x = y, .eps = spec.bn_eps});
    case LayerType::kAdd: {
      // add(in0, in1, y), then add(y, in_k, y); backward accumulates dy.
      size_t bytes = add(out[in[0]], out[in[1]], y);
      for (size_t k = 2; k < in.size(); ++k) bytes = std::max(bytes, add(y, out[in[k]], y));
      for (int k : in) bytes = std::max(bytes, add(out[k], y, out[k]));
      return bytes;
    }
    case LayerType::kConcat: {
      std::vector<TensorDesc> xs;
      for (int k : in) xs.push_back(out[k]);
      return scratch(ConcatDesc{.xs = xs, .y = y});
    }
    case LayerType::kMul: {
      // y = a * b; backward da = dy * b, and db = dy * a (summed over H and W
      // where b is broadcast).
      const TensorDesc& a = out[in[0]];
      const TensorDesc& b = out[in[1]];
      return std::max({scratch(BinaryDesc{BinaryKind::kMul, a, b, y}),
                       scratch(BinaryDesc{BinaryKind::kMul, y, b, a}),
                       scratch(mul_factor_gradient_desc(y, a, b))});
    }
    case LayerType::kDropout:
      return scratch(DropoutDesc{.x = y, .p = spec.dropout_p});
  }
  return 0;
}

}  // namespace

size_t op_scratch_bytes(const Graph& graph, const std::vector<TensorDesc>& out, Backend& backend) {
  size_t bytes = 0;
  for (int i = 0; i < graph.size(); ++i) {
    bytes = std::max(bytes, layer_scratch_bytes(graph, i, out, backend));
    // A gradient with several consumers: the later ones are added in.
    if (graph.consumer_count(i) > 1) {
      bytes = std::max(bytes, backend.scratch_bytes(BinaryDesc{BinaryKind::kAdd, out[i], out[i],
                                                               out[i]}).scratch);
    }
  }
  if (graph.size() > 0) bytes = std::max(bytes, backend.scratch_bytes(SoftmaxCrossEntropyDesc{out.back()}).scratch);
  return bytes;
}

}  // namespace vtrain::worker
