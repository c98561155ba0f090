#include "worker/engine/conv_kernel.h"

#include <algorithm>

#include "worker/engine/op_scratch.h"

namespace vtrain::worker {
void run_conv_call(Backend& backend, ConvKind kind, const ConvProblem& q, ConvAlgo algo,
                   const ConvOperands& o, int64_t first, float beta, void* workspace,
                   size_t workspace_bytes) {
  const int64_t m = q.x.shape.n;
  // This call's samples of a tensor the kind uses (the others are unset).
  const auto at = [&](const Tensor& t) { return t.data ? t.samples(first, m).data : nullptr; };
  // The bias epilogue where the layer keeps its bias (the fusion pass may
  // have left it to the relu after it: then both are null).
  const bool bias = kind == ConvKind::kBackwardFilter ? o.dbias != nullptr : o.bias != nullptr;
  backend.run(ConvDesc{kind, q, algo, beta, bias},
              ConvArgs{.x = at(o.x),
                       .w = o.w,
                       .bias = o.bias,
                       .y = at(o.y),
                       .dy = at(o.dy),
                       .dx = at(o.dx),
                       .dw = o.dw,
                       .dbias = o.dbias,
                       .workspace = workspace,
                       .workspace_bytes = workspace_bytes});
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
    const size_t need = backend.scratch_bytes(ConvDesc{kind, q, step.algo, call_beta}).scratch;
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
  return {x, y, conv.out, window_of(conv), conv.groups};
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
