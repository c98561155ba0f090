// Status checks for CUDA runtime, cuDNN and cuBLAS calls (internal to
// worker/device/cuda and worker/nccl_communicator.cpp, which adds NCCL's overloads).
//
//   VTRAIN_CUDA_CHECK(cudaMemcpyAsync(...), "upload " + shape.str());
//
// throws BackendError("cuda backend: upload 2x3x4x4: cudaMemcpyAsync(...)
// failed at worker/device/cuda/cuda_conv.cpp:123: CUDA: invalid argument"). The
// context expression is evaluated only on failure.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

namespace vtrain::worker::cuda {

inline bool failed(cudaError_t status) { return status != cudaSuccess; }
inline bool failed(cudnnStatus_t status) { return status != CUDNN_STATUS_SUCCESS; }
inline bool failed(cublasStatus_t status) { return status != CUBLAS_STATUS_SUCCESS; }

// Throw BackendError with the expression, file:line, the library's error
// string and the caller's context.
[[noreturn]] void throw_error(cudaError_t status, const char* expr, const char* file, int line,
                              const std::string& context);
[[noreturn]] void throw_error(cudnnStatus_t status, const char* expr, const char* file, int line,
                              const std::string& context);
[[noreturn]] void throw_error(cublasStatus_t status, const char* expr, const char* file, int line,
                              const std::string& context);

// "<context>: <expr> failed at <file>:<line>: <library> error <code> (<error>)",
// the message every overload builds (after a prefix naming the component).
std::string error_message(const char* library, const char* error, int code, const char* expr,
                          const char* file, int line, const std::string& context);

}  // namespace vtrain::worker::cuda

#define VTRAIN_CUDA_CHECK(expr, context)                                                         \
  do {                                                                                           \
    const auto vtrain_status_ = (expr);                                                          \
    if (::vtrain::worker::cuda::failed(vtrain_status_)) {                                        \
      ::vtrain::worker::cuda::throw_error(vtrain_status_, #expr, __FILE__, __LINE__, (context)); \
    }                                                                                            \
  } while (0)
