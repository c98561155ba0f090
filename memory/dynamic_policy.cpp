#include "memory/dynamic_policy.h"

#include <algorithm>

#include "memory/memory_error.h"

namespace vtrain::memory {

namespace {

// Per kernel the index of the option that `better(a, b)` ranks first.
template <typename Better>
std::vector<int> choose_each(const std::vector<KernelChoices>& kernels, Better better) {
  std::vector<int> choice;
  for (const KernelChoices& k : kernels) {
    int best = 0;
    for (int o = 1; o < static_cast<int>(k.options.size()); ++o) {
      if (better(k.options[o], k.options[best])) best = o;
    }
    choice.push_back(best);
  }
  return choice;
}

}  // namespace

std::vector<int> fastest_choice(const std::vector<KernelChoices>& kernels) {
  return choose_each(kernels, [](const KernelChoices::Option& a, const KernelChoices::Option& b) {
    return a.seconds < b.seconds || (a.seconds == b.seconds && a.workspace < b.workspace);
  });
}

std::vector<int> memory_optimal_choice(const std::vector<KernelChoices>& kernels) {
  return choose_each(kernels, [](const KernelChoices::Option& a, const KernelChoices::Option& b) {
    return a.workspace < b.workspace || (a.workspace == b.workspace && a.seconds < b.seconds);
  });
}

void apply_choice(MemoryModel& model, const std::vector<KernelChoices>& kernels,
                  const std::vector<int>& choice) {
  for (const KernelChoices& k : kernels) {
    model.layers.at(k.layer).forward_workspace = 0;
    model.layers.at(k.layer).backward_workspace = 0;
  }
  for (size_t i = 0; i < kernels.size(); ++i) {
    const KernelChoices& k = kernels[i];
    if (k.options.empty()) {
      throw MemoryError("dynamic policy: kernel of layer '" + model.layers[k.layer].name +
                        "' has no algorithm to choose from");
    }
    const size_t ws = k.options.at(choice.at(i)).workspace;
    LayerNode& l = model.layers[k.layer];
    if (k.kind == worker::ConvKind::kForward) {
      l.forward_workspace = std::max(l.forward_workspace, ws);
    } else {
      l.backward_workspace = std::max(l.backward_workspace, ws);
    }
  }
}

namespace {

Simulation try_config(const MemoryModel& base, const std::vector<KernelChoices>& kernels,
                      const std::vector<int>& choice, Offload offload, size_t capacity,
                      Planner planner) {
  MemoryModel model = base;
  apply_choice(model, kernels, choice);
  return simulate(model, layer_wise_schedule(model, offload), capacity, planner);
}

// The fastest option of kernel k with a smaller workspace than its current
// one; false when there is none.
bool downgrade(const KernelChoices& k, int& current) {
  int best = -1;
  for (int o = 0; o < static_cast<int>(k.options.size()); ++o) {
    if (k.options[o].workspace >= k.options[current].workspace) continue;
    if (best < 0 || k.options[o].seconds < k.options[best].seconds) best = o;
  }
  if (best < 0) return false;
  current = best;
  return true;
}

}  // namespace

DynamicDecision choose_dynamic(const MemoryModel& model, const std::vector<KernelChoices>& kernels,
                               size_t capacity, Planner planner) {
  DynamicDecision d;
  const std::vector<int> fastest = fastest_choice(kernels);
  const std::vector<int> lean = memory_optimal_choice(kernels);
  auto take = [&](const std::string& pass, Offload offload, const std::vector<int>& choice,
                  Simulation sim) {
    d.pass = pass;
    d.offload = offload;
    d.choice = choice;
    d.simulation = std::move(sim);
    return std::move(d);
  };

  Simulation first = try_config(model, kernels, lean, Offload::kAll, capacity, planner);
  if (!first.fits) {
    throw OutOfMemoryError("memory.policy dyn: the network cannot be trained even with vDNN_all "
                           "and memory-optimal algorithms: " + first.failure);
  }
  Simulation fast = try_config(model, kernels, fastest, Offload::kNone, capacity, planner);
  if (fast.fits) {
    return take("2: no offload, fastest algorithms", Offload::kNone, fastest, std::move(fast));
  }
  const Offload offloads[] = {Offload::kConv, Offload::kAll};
  Simulation with_fastest[2];  // pass 3's, where pass 4 starts
  for (int o = 0; o < 2; ++o) {
    const std::string pass =
        std::string("3: vDNN_") + offload_name(offloads[o]) + ", fastest algorithms";
    with_fastest[o] = try_config(model, kernels, fastest, offloads[o], capacity, planner);
    if (with_fastest[o].fits) return take(pass, offloads[o], fastest, std::move(with_fastest[o]));
  }
  for (int o = 0; o < 2; ++o) {
    const Offload offload = offloads[o];
    const std::string pass = std::string("4: vDNN_") + offload_name(offload) + ", greedy downgrade";
    std::vector<int> choice = fastest;
    Simulation a = std::move(with_fastest[o]);
    while (true) {
      if (a.fits) {
        return take(pass, offload, choice, std::move(a));
      }
      // Downgrade the kernel whose workspace did not fit, if it was one.
      const TensorId& t = a.failed_tensor;
      bool changed = false;
      if (t.kind == TensorKind::kWorkspace || t.kind == TensorKind::kBackwardWorkspace) {
        const bool backward = t.kind == TensorKind::kBackwardWorkspace;
        // The candidate kernels of that call, largest current workspace first.
        std::vector<int> candidates;
        for (int k = 0; k < static_cast<int>(kernels.size()); ++k) {
          const bool kernel_backward = kernels[k].kind != worker::ConvKind::kForward;
          if (kernels[k].layer == t.layer && kernel_backward == backward) candidates.push_back(k);
        }
        std::sort(candidates.begin(), candidates.end(), [&](int x, int y) {
          return kernels[x].options[choice[x]].workspace > kernels[y].options[choice[y]].workspace;
        });
        for (int k : candidates) {
          if (downgrade(kernels[k], choice[k])) {
            changed = true;
            break;
          }
        }
      }
      if (!changed) {
        break;
      }
      a = try_config(model, kernels, choice, offload, capacity, planner);
    }
  }
  return take("5: vDNN_all, memory-optimal algorithms", Offload::kAll, lean, std::move(first));
}

}  // namespace vtrain::memory
