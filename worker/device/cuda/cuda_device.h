// What the NCCL communicator needs from a CUDA backend: its device and its
// compute stream. Internal to worker/device/cuda and worker/nccl_communicator.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "worker/device/backend.h"

namespace vtrain::worker::cuda {

struct DeviceStreams {
  int device = 0;                  // CUDA device ordinal the backend runs on
  cudaStream_t compute = nullptr;  // the backend's compute stream
};

// Throws BackendError when `backend` did not come from make_cuda_backend().
DeviceStreams device_streams(Backend& backend);

}  // namespace vtrain::worker::cuda
