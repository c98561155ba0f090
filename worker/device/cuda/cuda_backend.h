// The CUDA backend: the whole public surface of
// worker/device/cuda, in std types only (no CUDA header leaks out of worker/device/cuda).
// Compiled only in CUDA builds (VTRAIN_HAVE_CUDA); worker/device/factory/backend_factory.cpp
// is the one caller outside worker/device/cuda.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "worker/device/backend.h"

namespace vtrain::worker::cuda {

// Convolution algorithm ids of this backend: cuDNN's own enum values (so the
// ids differ per ConvKind) plus 1000 times the compute configuration they
// run in. Names (stable, the perf DB keys on them):
//   Forward:        implicit_gemm, implicit_precomp_gemm, gemm, direct, fft,
//                   fft_tiling, winograd, winograd_nonfused
//   BackwardData:   algo_0, algo_1, fft, fft_tiling, winograd, winograd_nonfused
//   BackwardFilter: algo_0, algo_1, fft, algo_3, winograd, winograd_nonfused,
//                   fft_tiling
// each with the suffix of its configuration (backend.h), by the problem's
// element type:
//   f32   "<name>" (FMA math); under train.precision tf32 also
//         "<name>/tf32" (TF32 tensor cores)
//   f16   "<name>/pseudo_half" (cuDNN's PSEUDO_HALF_CONFIG: f32 compute) and
//         "<name>/true_half" (TRUE_HALF_CONFIG: f16 compute), both with
//         tensor-op math, as mu-cuDNN offers both
//   bf16  "<name>/pseudo_bf16" (PSEUDO_BFLOAT16_CONFIG: f32 compute, the
//         only one cuDNN has), tensor-op math
// conv_algorithms() lists those cuDNN supports for a problem, best first by
// cuDNN's heuristic (cudnnGetConvolution*Algorithm_v7) within each
// configuration.
//
// Numerics per element type (train.precision; backend.h's contract):
//   f32   float32 throughout; tensor-core math (TF32) is disabled in cuDNN
//         and cuBLAS so that results match the CPU backend to float
//         rounding, unless the backend is made for tf32.
//   f16, bf16 (fp16 needs compute capability 7.0, bf16 8.0;
//         precision_unavailable names the GPU otherwise): convolutions in
//         the configurations above; a half BackwardFilter has cuDNN write dw
//         in the half type into the workspace (conv_workspace counts it) and
//         adds it to the f32 dw with the caller's beta, and sums dbias from
//         the half dy in f32. Inner products are cublasGemmEx with f32
//         accumulation (half y and dx, f32 dw); batch norm is cuDNN's with
//         half x, y, dy, dx and f32 parameters and statistics; relu and
//         pooling are cuDNN's in the half type; add, accumulate, concat,
//         the synchronised batch-norm sums and softmax cross-entropy are
//         this backend's kernels, which compute in float (double for the
//         sums and the loss) and round once to the half type. The f16
//         and bf16 paths are compiled and linked but not yet run on a GPU.
//
// Layouts: activations are NCHW (kPlain) or NHWC (kNhwc), by
// BackendOptions::layout (LayoutRule: under auto, NHWC in bf16 / fp16,
// where tensor cores want it, NCHW in fp32 / tf32). cuDNN takes both; in
// NHWC a convolution's filters go to it as KRSC, reordered into the
// workspace from the KCRS weights (and its KRSC dw reordered back), and
// an input in the other layout is reordered there too; the inner products
// read an NHWC x of more than one pixel through an NCHW copy in the
// scratch; concat copies channel runs per sample (NCHW) or per pixel
// (NHWC). upload, download, convert, fill and the elementwise ops (relu,
// add, accumulate, scale) accept every Layout; the other ops throw
// BackendError naming the layout when given a blocked one. The NHWC paths
// are compiled and linked but not yet run on a GPU.
//
// Device selection: the GPU with index (local rank % visible GPUs), where the
// local rank comes from OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// MV2_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID (0 when none is set).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

// Whether a CUDA GPU is usable: the runtime finds a driver and at least one
// device. Never throws and never aborts, also without libcuda.so.
bool cuda_device_visible();
// Why none is: the runtime's error ("CUDA: ...": no driver, one too old
// for this runtime) or "0 devices"; nullopt when one is. Never throws.
std::optional<std::string> cuda_unavailable();
// How many CUDA GPUs the runtime sees (0 without a driver). Never throws.
int cuda_device_count();

}  // namespace vtrain::worker::cuda
