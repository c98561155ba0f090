// vDNN's dynamic policy (Rhu et al., Sec. III-C): choose what to offload and
// which algorithm every convolution kernel uses so that training fits the
// device and runs as fast as it can. The paper runs a training pass per
// candidate and watches for failure; here each pass is a simulation of the
// schedule (simulator.h), so choosing costs no failed runs:
//  1. vDNN_all with memory-optimal algorithms: if even this does not fit,
//     the network cannot be trained (OutOfMemoryError with the failing tensor);
//  2. no offloading (layer-wise release only), fastest algorithms;
//  3. vDNN_conv, then vDNN_all, with the fastest algorithms;
//  4. greedy: vDNN_conv, then vDNN_all, starting from the fastest algorithms
//     and, wherever a convolution's workspace does not fit, downgrading that
//     kernel to its fastest algorithm with a smaller workspace until it fits
//     or no smaller one is left;
//  5. otherwise pass 1's configuration.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "memory/simulator.h"
#include "memory/vdnn_plan.h"
#include "worker/device/backend.h"

namespace vtrain::memory {

// One convolution kernel (a conv layer's forward, backward-data or
// backward-filter call) and the algorithms it may use.
struct KernelChoices {
  int layer = 0;                    // node index in the MemoryModel
  worker::ConvKind kind = worker::ConvKind::kForward;
  struct Option {
    std::string name;               // the algorithm
    size_t workspace = 0;           // bytes a call needs
    double seconds = 0;             // measured (or estimated) time of a call
  };
  std::vector<Option> options;      // at least one
};

// Per kernel the index of its fastest option (ties: smaller workspace) and of
// its memory-optimal one (smallest workspace; ties: faster).
std::vector<int> fastest_choice(const std::vector<KernelChoices>& kernels);
std::vector<int> memory_optimal_choice(const std::vector<KernelChoices>& kernels);

// Sets the conv nodes' forward and backward workspace from `choice` (the
// backward one is the larger of backward-data and backward-filter, which run
// one after the other in the same call).
void apply_choice(MemoryModel& model, const std::vector<KernelChoices>& kernels,
                  const std::vector<int>& choice);

struct DynamicDecision {
  Offload offload = Offload::kAll;
  std::vector<int> choice;        // per kernel: the option index
  std::string pass;               // which pass chose it, e.g. "2: no offload, fastest"
  Simulation simulation;          // of the chosen configuration
};

// Throws OutOfMemoryError when pass 1 does not fit `capacity`.
DynamicDecision choose_dynamic(const MemoryModel& model, const std::vector<KernelChoices>& kernels,
                               size_t capacity, Planner planner);

}  // namespace vtrain::memory
