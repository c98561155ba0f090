#include "worker/engine/conv_kernel.h"

#include <algorithm>

namespace vtrain::worker {
void run_conv_call(Backend& backend, ConvKind kind, const ConvProblem& q, ConvAlgo algo,
                   const ConvOperands& o, int64_t first, float beta, void* workspace,
                   size_t workspace_bytes) {
  const int64_t m = q.x.shape.n;
  switch (kind) {
    case ConvKind::kForward:
      backend.conv_forward(algo, q, o.x.samples(first, m), o.w, o.bias, o.y.samples(first, m),
                           beta, workspace, workspace_bytes);
      break;
    case ConvKind::kBackwardData:
      backend.conv_backward_data(algo, q, o.dy.samples(first, m), o.w, o.dx.samples(first, m),
                                 beta, workspace, workspace_bytes);
      break;
    case ConvKind::kBackwardFilter:
      backend.conv_backward_filter(algo, q, o.x.samples(first, m), o.dy.samples(first, m), o.dw,
                                   o.dbias, beta, workspace, workspace_bytes);
      break;
  }
}

void run_conv_kernel(Backend& backend, ConvKind kind, const ConvProblem& p,
                     std::span<const ConvStep> steps, const ConvOperands& o, float beta,
                     void* workspace, size_t workspace_bytes) {
  if (steps.empty()) throw BackendError(std::string(conv_kind_name(kind)) + ": no calls");
  const int64_t n = p.x.shape.n;
  int64_t first = 0;
  for (size_t call = 0; first < n; ++call) {
    const ConvStep& step = steps[call % steps.size()];
    if (step.size < 1) {
      throw BackendError(std::string(conv_kind_name(kind)) + ": a call of " +
                         std::to_string(step.size) + " images");
    }
    const int64_t m = std::min(step.size, n - first);
    const ConvProblem q = p.with_batch(m);
    const float call_beta = sums_over_micro_batches(kind) && first > 0 ? 1.0f : beta;
    const size_t need = backend.conv_workspace(kind, step.algo, q, call_beta != 0.0f);
    if (need > workspace_bytes) {
      throw BackendError(std::string(conv_kind_name(kind)) + " " + q.str() + " with " +
                         backend.conv_algorithm_name(kind, step.algo) + " needs " +
                         std::to_string(need) + " bytes of workspace, its segment has " +
                         std::to_string(workspace_bytes));
    }
    run_conv_call(backend, kind, q, step.algo, o, first, call_beta, workspace, workspace_bytes);
    first += m;
  }
}

ConvProblem conv_problem(const LayerSpec& conv, const TensorDesc& x, const TensorDesc& y) {
  ConvProblem p;
  p.x = x;
  p.y = y;
  p.k = conv.out;
  p.r = conv.kernel_h;
  p.s = conv.kernel_w;
  p.pad_h = conv.pad_h;
  p.pad_w = conv.pad_w;
  p.stride_h = conv.stride_h;
  p.stride_w = conv.stride_w;
  return p;
}

std::vector<ConvKind> conv_kernels_of(const Graph& graph, int layer) {
  if (graph.inputs(layer)[0] == graph.input_index()) {
    return {ConvKind::kForward, ConvKind::kBackwardFilter};
  }
  return {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter};
}

std::vector<ConvKernelSite> conv_kernel_sites(const Graph& graph,
                                              const std::vector<TensorDesc>& descs) {
  std::vector<ConvKernelSite> sites;
  for (int i = 0; i < graph.size(); ++i) {
    const LayerSpec& l = graph.layer(i);
    if (l.type != LayerType::kConv) continue;
    const ConvProblem p = conv_problem(l, descs[graph.inputs(i)[0]], descs[i]);
    for (ConvKind kind : conv_kernels_of(graph, i)) sites.push_back({i, kind, p});
  }
  return sites;
}

}  // namespace vtrain::worker
