// The one place that knows whether the NCCL communicator is built
// (VTRAIN_HAVE_CUDA): gradients on a CUDA device go through NCCL.
#include <memory>

#include "worker/comm/communicator.h"
#include "worker/device/backend.h"
#ifdef VTRAIN_HAVE_CUDA
#include "worker/comm/nccl_communicator.h"
#endif

namespace vtrain::worker {

std::unique_ptr<Communicator> make_gradient_communicator(Backend& backend) {
  std::unique_ptr<Communicator> mpi = make_mpi_communicator();
#ifdef VTRAIN_HAVE_CUDA
  if (mpi->size() > 1 && backend.device_info().backend == "cuda") {
    return cuda::make_nccl_communicator(backend);
  }
#endif
  return mpi;
}

}  // namespace vtrain::worker
