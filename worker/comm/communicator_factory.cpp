// The one place that knows whether the NCCL communicator is built
// (VTRAIN_HAVE_CUDA): gradients on GPUs go through NCCL where every rank has
// a GPU of its own, else through pinned host memory over MPI.
#include <cstdlib>
#include <memory>
#include <stdexcept>
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
  // Every rank takes part in the same collectives, whatever its backend
  // or environment, and rank 0 decides for all: NCCL only where every rank
  // is on a GPU of its own and none forces staging.
  const DeviceInfo& device = backend.device_info();
  const char* forced_env = std::getenv("VTRAIN_STAGE_GRADIENTS");
  const bool forced = forced_env != nullptr && std::string_view(forced_env) == "1";
  std::string mine = device.backend;
  mine += forced ? "|staged|" : "||";
  mine += device.device_key;
  const std::vector<std::string> all = mpi->gather(mine, 0);
  std::string why;  // rank 0: why not NCCL ("" for NCCL)
  if (mpi->rank() == 0) {
    std::vector<std::string> keys;
    for (size_t r = 0; r < all.size(); ++r) {
      const size_t bar = all[r].find('|'), key = all[r].find('|', bar + 1);
      const std::string kind = all[r].substr(0, bar);
      if (why.empty() && all[r].compare(bar, key - bar + 1, "|staged|") == 0) {
        why = "VTRAIN_STAGE_GRADIENTS=1 on rank " + std::to_string(r);
      }
      if (why.empty() && kind != "cuda") why = "rank " + std::to_string(r) + " is on the " + kind;
      keys.push_back(all[r].substr(key + 1));
    }
    if (why.empty()) {
      const std::string shared = shared_device(keys);
      if (!shared.empty()) why = shared + " (NCCL needs a GPU per rank)";
    }
    if (why.empty()) why = "nccl";
  }
  mpi->broadcast(why, 0);
#ifdef VTRAIN_HAVE_CUDA
  if (why == "nccl") return cuda::make_nccl_communicator(backend);
#endif
  if (why == "nccl") {
    throw std::logic_error("make_gradient_communicator: NCCL chosen in a build without CUDA");
  }
  // MPI sums host memory: a GPU's buckets go through pinned host memory
  // (as every rank's where forced, the testing aid).
  if (device.backend != "cuda" && !forced) return mpi;
  if (note) *note = "gradients: summed over MPI through pinned host memory: " + why;
  return make_host_staged_communicator(backend, std::move(mpi));
}

}  // namespace vtrain::worker
