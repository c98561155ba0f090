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
#include "worker/comm/device_infos.h"
#include "worker/comm/host_staged.h"
#include "worker/device/backend.h"
#ifdef VTRAIN_HAVE_CUDA
#include "worker/comm/nccl_communicator.h"
#endif

namespace vtrain::worker {

namespace {

// Why the job's gradients cannot go over NCCL ("" where they can): a rank
// forcing staging, a rank not on a GPU, or two ranks on one GPU. The same
// on every rank, from the same gathered facts.
std::string why_not_nccl(const std::vector<DeviceInfo>& devices,
                         const std::vector<double>& forced) {
  for (size_t r = 0; r < forced.size(); ++r) {
    if (forced[r] > 0) return "VTRAIN_STAGE_GRADIENTS=1 on rank " + std::to_string(r);
  }
  std::vector<std::string> keys;
  for (size_t r = 0; r < devices.size(); ++r) {
    if (devices[r].backend != "cuda") {
      return "rank " + std::to_string(r) + " is on the " + devices[r].backend;
    }
    keys.push_back(devices[r].device_key);
  }
  const std::string shared = shared_device(keys);
  return shared.empty() ? shared : shared + " (NCCL needs a GPU per rank)";
}

}  // namespace

std::unique_ptr<Communicator> make_gradient_communicator(Backend& backend,
                                                         const std::vector<DeviceInfo>& cluster,
                                                         std::string* note) {
  std::unique_ptr<Communicator> mpi = make_mpi_communicator();
  if (mpi->size() == 1) return mpi;
  // Every rank takes part in the same collectives, whatever its backend or
  // environment, and so reaches the same decision: NCCL only where every
  // rank is on a GPU of its own and none forces staging.
  const char* forced_env = std::getenv("VTRAIN_STAGE_GRADIENTS");
  const bool forced = forced_env != nullptr && std::string_view(forced_env) == "1";
  std::vector<double> forcing(static_cast<size_t>(mpi->size()), 0.0);
  forcing[static_cast<size_t>(mpi->rank())] = forced ? 1.0 : 0.0;
  mpi->allreduce_sum(forcing);
  const std::string why = why_not_nccl(cluster, forcing);
#ifdef VTRAIN_HAVE_CUDA
  if (why.empty()) {
    if (note) *note = "gradients: summed by NCCL, each rank on a GPU of its own";
    return cuda::make_nccl_communicator(backend);
  }
#endif
  if (why.empty()) {
    throw std::logic_error("make_gradient_communicator: NCCL chosen in a build without CUDA");
  }
  // MPI sums host memory: a GPU's buckets go through pinned host memory
  // (as every rank's where forced, the testing aid).
  if (backend.device_info().backend != "cuda" && !forced) return mpi;
  if (note) *note = "gradients: summed over MPI through pinned host memory: " + why;
  return make_host_staged_communicator(backend, std::move(mpi));
}

}  // namespace vtrain::worker
