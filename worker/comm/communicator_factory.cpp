// The one place that knows whether the NCCL communicator is built
// (VTRAIN_HAVE_CUDA): gradients on a CUDA device go through NCCL.
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/host_staged.h"
#include "worker/device/backend.h"
#ifdef VTRAIN_HAVE_CUDA
#include "worker/comm/nccl_communicator.h"
#endif

namespace vtrain::worker {

std::unique_ptr<Communicator> make_gradient_communicator(Backend& backend, std::string* note) {
  std::unique_ptr<Communicator> mpi = make_mpi_communicator();
  if (mpi->size() == 1) return mpi;
  const char* forced = std::getenv("VTRAIN_STAGE_GRADIENTS");
  std::string why = forced != nullptr && std::string_view(forced) == "1"
                        ? "VTRAIN_STAGE_GRADIENTS=1"
                        : "";
#ifdef VTRAIN_HAVE_CUDA
  if (why.empty() && backend.device_info().backend == "cuda") {
    // Rank 0 decides for all: every rank must make the same communicator.
    const DeviceInfo& device = backend.device_info();
    const std::vector<std::string> keys = mpi->gather(
        device.device_key.empty() ? std::string() : device.host + "/" + device.device_key, 0);
    std::string shared = mpi->rank() == 0 ? shared_device(keys) : std::string();
    mpi->broadcast(shared, 0);
    if (shared.empty()) return cuda::make_nccl_communicator(backend);
    why = shared + " (NCCL needs a GPU per rank)";
  }
#endif
  if (why.empty()) return mpi;
  if (note) *note = "gradients: summed over MPI through pinned host memory: " + why;
  return make_host_staged_communicator(backend, std::move(mpi));
}

}  // namespace vtrain::worker
