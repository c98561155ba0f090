// The one place that knows which backends are built: the CUDA backend
// (worker/device/cuda) only where VTRAIN_HAVE_CUDA is defined.
#include <string>
#include <string_view>

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

BackendKind parse_backend_kind(std::string_view name) {
  return common::parse_named<BackendError>(kBackendKindNames, name, "backend kind");
}

LayoutRule layout_rule_for(BackendKind kind, const common::ComputeSettings& settings) {
  switch (kind) {
    case BackendKind::kCpu:
      return cpu::layout_rule(settings);
    case BackendKind::kCuda:
      return {.choice = settings.layout, .gpu = true, .precision = settings.precision};
    case BackendKind::kAuto:
      break;
  }
  throw BackendError(
      "the layout rule of backend kind auto is unknown until a backend is made "
      "(cpu or cuda: a device's DeviceInfo::backend)");
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  const bool cpu =
      options.kind == BackendKind::kCpu || (options.kind == BackendKind::kAuto && !gpu_available());
  if (cpu) {
    std::unique_ptr<Backend> backend = cpu::make_cpu_backend(options);
    // A testing aid (half_emulation.h): half types the CPU lacks, emulated.
    return half_emulation_requested() ? emulate_half(std::move(backend)) : std::move(backend);
  }
#ifdef VTRAIN_HAVE_CUDA
  return cuda::make_cuda_backend(options);  // a clear error when no GPU is visible
#else
  throw BackendError("backend 'cuda' is not available in this build (built backends: cpu)");
#endif
}

}  // namespace vtrain::worker
