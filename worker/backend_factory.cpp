// The one place that knows which backends are built.
#include <string>

#include "worker/backend.h"
#include "worker/cpu/cpu_backend.h"

namespace vtrain::worker {

bool gpu_available() {
  // The CUDA backend (worker/cuda/) is not built yet; see README "GPUs".
  return false;
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.kind == "cpu" || (options.kind == "auto" && !gpu_available())) {
    return cpu::make_cpu_backend(options);
  }
  if (options.kind == "cuda" || options.kind == "auto") {
    throw BackendError("backend 'cuda' is not available in this build (built backends: cpu)");
  }
  throw BackendError("unknown backend '" + options.kind + "' (known: auto, cpu, cuda)");
}

}  // namespace vtrain::worker
