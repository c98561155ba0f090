// A plan's execution of one conv layer (balancer WR / WD), resolved against
// the backend: per kernel its calls as algorithm ids with sizes, and its
// segment of the plan's workspace buffer.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "worker/engine/conv_kernel.h"

namespace vtrain::worker {

class ConvPlan {
 public:
  // Resolves `execution`'s algorithm names for `problem` (at the layer's
  // max batch) and checks its calls. A kind the layer does not run (see
  // `runs`) may be omitted. Throws BackendError naming the layer and kernel:
  // no calls, a call size outside 1..max batch, an algorithm the backend
  // does not offer for the call's size (listing those it does).
  ConvPlan(Backend& backend, const std::string& layer, const ConvProblem& problem,
           const std::vector<ConvKind>& runs, const ConvLayerExecution& execution);

  // The kind's calls (empty for a kind the layer does not run).
  const std::vector<ConvStep>& steps(ConvKind kind) const {
    return steps_[static_cast<int>(kind)];
  }
  // The kind's workspace segment: (offset into the plan's buffer, bytes).
  std::pair<uint64_t, uint64_t> segment(ConvKind kind) const {
    return segment_[static_cast<int>(kind)];
  }
  // "[2xdirect 5xgemm]"-style description of the kind's calls, "-" for none.
  std::string describe(Backend& backend, ConvKind kind) const;

 private:
  std::array<std::vector<ConvStep>, 3> steps_;
  std::array<std::pair<uint64_t, uint64_t>, 3> segment_{};
};

}  // namespace vtrain::worker
