// The one place that knows which backends are built: the CUDA backend
// (worker/device/cuda) only where VTRAIN_HAVE_CUDA is defined.
#include <string>

#include "worker/device/backend.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/device/test_only/half_emulation.h"
#ifdef VTRAIN_HAVE_CUDA
#include "worker/device/cuda/cuda_backend.h"
#endif

namespace vtrain::worker {

bool gpu_available() { return !why_no_gpu(); }

std::optional<std::string> why_no_gpu() {
#ifdef VTRAIN_HAVE_CUDA
  return cuda::cuda_unavailable();
#else
  return "the CUDA backend is not built (VTRAIN_HAVE_CUDA is off: no CUDA toolkit, or "
         "VTRAIN_CUDA=OFF)";
#endif
}

LayoutRule layout_rule_for(const std::string& kind, LayoutChoice choice,
                           common::Precision precision) {
  if (kind == "cpu") return cpu::layout_rule(choice, precision);
  if (kind == "cuda") return {.choice = choice, .gpu = true, .precision = precision};
  throw BackendError("unknown backend kind '" + kind + "' (known: cpu, cuda)");
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.kind == "cpu" || (options.kind == "auto" && !gpu_available())) {
    std::unique_ptr<Backend> cpu = cpu::make_cpu_backend(options);
    // A testing aid (half_emulation.h): half types the CPU lacks, emulated.
    return half_emulation_requested() ? emulate_half(std::move(cpu)) : std::move(cpu);
  }
  if (options.kind == "cuda" || options.kind == "auto") {
#ifdef VTRAIN_HAVE_CUDA
    return cuda::make_cuda_backend(options);  // a clear error when no GPU is visible
#else
    throw BackendError("backend 'cuda' is not available in this build (built backends: cpu)");
#endif
  }
  throw BackendError("unknown backend '" + options.kind + "' (known: auto, cpu, cuda)");
}

}  // namespace vtrain::worker
