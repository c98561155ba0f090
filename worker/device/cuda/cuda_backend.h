// The CUDA backend: the whole public surface of
// worker/device/cuda, in std types only (no CUDA header leaks out of worker/device/cuda).
// Compiled only in CUDA builds (VTRAIN_HAVE_CUDA); worker/device/factory/backend_factory.cpp
// is the one caller outside worker/device/cuda.
#pragma once

#include <memory>

#include "worker/device/backend.h"

namespace vtrain::worker::cuda {

// Convolution algorithm ids of this backend: cuDNN's own enum values, so the
// ids differ per ConvKind. Names (stable, the perf DB keys on them):
//   Forward:        implicit_gemm, implicit_precomp_gemm, gemm, direct, fft,
//                   fft_tiling, winograd, winograd_nonfused
//   BackwardData:   algo_0, algo_1, fft, fft_tiling, winograd, winograd_nonfused
//   BackwardFilter: algo_0, algo_1, fft, algo_3, winograd, winograd_nonfused,
//                   fft_tiling
// conv_algorithms() lists those cuDNN supports for a problem, best first by
// cuDNN's heuristic (cudnnGetConvolution*Algorithm_v7).
//
// Numerics: float32 throughout; tensor-core math (TF32) is disabled in cuDNN
// and cuBLAS so that results match the CPU backend to float rounding.
//
// Layouts: preferred_layout() is always kPlain (NCHW), and the network hands
// this backend only that layout (Network's activation_descs). upload,
// download, convert, fill and the elementwise ops (relu, add, accumulate,
// scale) accept every Layout; the other ops throw BackendError naming the
// layout when given a blocked one.
//
// Device selection: the GPU with index (local rank % visible GPUs), where the
// local rank comes from OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// MV2_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID (0 when none is set).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

// Whether a CUDA GPU is usable: the runtime finds a driver and at least one
// device. Never throws and never aborts, also without libcuda.so.
bool cuda_device_visible();
// How many CUDA GPUs the runtime sees (0 without a driver). Never throws.
int cuda_device_count();

}  // namespace vtrain::worker::cuda
