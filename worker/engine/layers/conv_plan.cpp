#include "worker/engine/layers/conv_plan.h"

#include <algorithm>

#include "balancer/workspace_plan.h"

namespace vtrain::worker {
namespace {

// The backend's id of `call`'s algorithm at the call's batch.
ConvAlgo resolve_call(Backend& backend, const std::string& where, ConvKind kind,
                      const ConvProblem& problem, const ConvCall& call) {
  if (call.size < 1 || call.size > problem.x.shape.n) {
    throw BackendError(where + ": a call of " + std::to_string(call.size) +
                       " images (expected 1.." + std::to_string(problem.x.shape.n) + ")");
  }
  const ConvProblem q = problem.with_batch(call.size);
  const auto offered = conv_algorithms(backend, kind, q, adds_to_shared_input_gradient(kind));
  auto it = std::find_if(offered.begin(), offered.end(),
                         [&](const ConvAlgoInfo& a) { return a.name == call.algorithm; });
  if (it == offered.end()) {
    std::string names;
    for (const ConvAlgoInfo& a : offered) names += (names.empty() ? "" : ", ") + a.name;
    throw BackendError(where + ": algorithm '" + call.algorithm + "' is not offered for " +
                       q.str() + " (offered: " + names + ")");
  }
  return it->algo;
}

}  // namespace

ConvPlan::ConvPlan(Backend& backend, const std::string& layer, const ConvProblem& problem,
                   const std::vector<ConvKind>& runs, const ConvLayerExecution& execution) {
  for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    const int k = static_cast<int>(kind);
    const ConvKernelExecution& e = execution.kernels[k];
    const std::string where = "layer '" + layer + "' " + conv_kind_name(kind);
    // Where the input is the data backward-data never runs: the plan may omit it.
    const bool run = std::find(runs.begin(), runs.end(), kind) != runs.end();
    if (!run && e.calls.empty()) continue;
    if (e.calls.empty()) throw BackendError(where + ": the plan gives no calls");
    int64_t total = 0;
    for (const ConvCall& call : e.calls) {
      steps_[k].push_back({resolve_call(backend, where, kind, problem, call), call.size});
      total += call.size;
    }
    if (total < 1) throw BackendError(where + ": the plan's calls cover no images");
    segment_[k] = {e.workspace_offset, e.workspace_bytes};
  }
}

std::string ConvPlan::describe(Backend& backend, ConvKind kind) const {
  std::vector<balancer::MicroBatch> calls;
  for (const ConvStep& step : steps(kind)) {
    calls.push_back({backend.conv_algorithm_name(kind, step.algo), step.size});
  }
  if (calls.empty()) return "-";
  std::string text = "[";  // appended: "[" + ... trips a GCC 12 -Wrestrict false positive
  text += balancer::describe_calls(calls);
  text += ']';
  return text;
}

}  // namespace vtrain::worker
