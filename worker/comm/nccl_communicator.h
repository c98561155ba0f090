// The NCCL communicator (CUDA builds only: compiled into vtrain_nccl where
// cmake/VtrainCuda.cmake found the toolkit and NCCL).
#pragma once

#include <memory>

#include "worker/comm/communicator.h"
#include "worker/device/backend.h"

namespace vtrain::worker::cuda {

// Gradient allreduces with NCCL on device memory of `cuda_backend` (which
// must come from make_cuda_backend and outlive the communicator), on a
// stream of its own that starts each allreduce after the work already queued
// on the backend's compute stream, so backward keeps running meanwhile. The
// small host-side collectives go through an MPI communicator over the same
// ranks. Requires a live MpiRuntime; collective: every rank must call it.
std::unique_ptr<Communicator> make_nccl_communicator(Backend& cuda_backend);

}  // namespace vtrain::worker::cuda
