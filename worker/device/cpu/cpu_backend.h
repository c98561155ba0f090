// The CPU backend: every Backend op on oneDNN primitives (plus an im2col +
// oneDNN sgemm convolution), device memory = host memory behind a byte
// counter with a capacity, memory stream = a background thread.
#pragma once

#include <memory>

#include "worker/device/backend.h"

namespace vtrain::worker::cpu {

// Convolution algorithm ids of this backend (names: "direct", "winograd",
// "im2col_gemm"). Winograd is listed only for problems oneDNN supports it for
// on this CPU (3x3, stride 1, AVX-512).
enum CpuConvAlgo : ConvAlgo { kDirect = 0, kWinograd = 1, kIm2colGemm = 2 };

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

// The layout rule of this machine's CPU backend under `choice` and
// `precision`: blocked by the vector width oneDNN uses here (native_block
// 16 on AVX-512, 8 on AVX2, else 1).
LayoutRule layout_rule(LayoutChoice choice, common::Precision precision);

}  // namespace vtrain::worker::cpu
