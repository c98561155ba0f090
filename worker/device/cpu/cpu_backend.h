// The CPU backend: every Backend op on oneDNN primitives (plus an im2col +
// oneDNN sgemm convolution), device memory = host memory behind a byte
// counter with a capacity, memory stream = a background thread.
#pragma once

#include <memory>

#include "worker/device/backend.h"

namespace vtrain::worker::cpu {

// Convolution algorithm ids of this backend (names: "direct", "winograd",
// "im2col_gemm"). Winograd is listed only for problems oneDNN supports it for
// on this CPU (3x3, stride 1, AVX-512, f32).
//
// bf16 problems also get mu-cuDNN's precision substitution (PSEUDO_HALF:
// compute in a wider type than the tensors are stored in): oneDNN's f32
// direct and winograd convolutions, the bf16 inputs converted to f32 in
// the workspace and the output rounded back to bf16 once
// ("direct/pseudo_bf16", "winograd/pseudo_bf16", the suffix the CUDA
// backend gives its f32-compute bf16 configurations). Where the CPU has
// AVX-512 BF16 but no AMX, oneDNN's bf16 kernels can trail its f32
// winograd by more than the conversions cost; conv.algorithm auto and the
// profiler time them all and keep the fastest.
enum CpuConvAlgo : ConvAlgo {
  kDirect = 0,
  kWinograd = 1,
  kIm2colGemm = 2,
  kDirectPseudoBf16 = 3,
  kWinogradPseudoBf16 = 4,
};

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

// The layout rule of this machine's CPU backend under `choice` and
// `precision`: blocked by the vector width oneDNN uses here (native_block
// 16 on AVX-512, 8 on AVX2, else 1).
LayoutRule layout_rule(const common::ComputeSettings& settings);

}  // namespace vtrain::worker::cpu
