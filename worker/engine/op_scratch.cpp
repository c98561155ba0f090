#include "worker/engine/op_scratch.h"

#include <algorithm>

#include "worker/engine/layers/layer_registry.h"

namespace vtrain::worker {

PoolParams pool_params(const LayerSpec& pool) {
  // Graph::build already gave global pools their whole-plane window.
  PoolParams p;
  p.kind = pool.pool;
  p.kh = pool.kernel_h;
  p.kw = pool.kernel_w;
  p.stride_h = pool.stride_h;
  p.stride_w = pool.stride_w;
  p.pad_h = pool.pad_h;
  p.pad_w = pool.pad_w;
  return p;
}

namespace {

size_t layer_scratch_bytes(const Graph& graph, int i, const std::vector<TensorDesc>& out,
                           Backend& backend) {
  const LayerSpec& spec = graph.layer(i);
  const std::vector<int>& in = graph.inputs(i);
  const TensorDesc& y = out[i];
  switch (spec.type) {
    case LayerType::kInput:
    case LayerType::kConv:  // convolutions run in the planned workspace
      return 0;
    case LayerType::kRelu: return backend.relu_scratch_bytes(y);
    case LayerType::kPool: return backend.pooling_scratch_bytes(pool_params(spec), out[in[0]], y);
    case LayerType::kFc: return backend.inner_product_scratch_bytes(out[in[0]], spec.out, spec.bias);
    case LayerType::kBatchNorm: return backend.batch_norm_scratch_bytes(y, spec.bn_eps);
    case LayerType::kAdd: {
      // add(in0, in1, y), then add(y, in_k, y); backward accumulates dy.
      size_t bytes = backend.add_scratch_bytes(out[in[0]], out[in[1]], y);
      for (size_t k = 2; k < in.size(); ++k) {
        bytes = std::max(bytes, backend.add_scratch_bytes(y, out[in[k]], y));
      }
      for (int k : in) bytes = std::max(bytes, backend.add_scratch_bytes(out[k], y, out[k]));
      return bytes;
    }
    case LayerType::kConcat: {
      std::vector<TensorDesc> xs;
      for (int k : in) xs.push_back(out[k]);
      return backend.concat_scratch_bytes(xs, y);
    }
    case LayerType::kSilu:
    case LayerType::kGelu:
    case LayerType::kSigmoid:
    case LayerType::kRelu6:
    case LayerType::kMul:
    case LayerType::kDropout:
      require_kernels(spec);  // throws: no backend runs them yet
      return 0;
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
      bytes = std::max(bytes, backend.add_scratch_bytes(out[i], out[i], out[i]));
    }
  }
  if (graph.size() > 0) bytes = std::max(bytes, backend.softmax_scratch_bytes(out.back()));
  return bytes;
}

}  // namespace vtrain::worker
