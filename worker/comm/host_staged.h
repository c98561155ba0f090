// Gradient sums through pinned host memory, for ranks whose devices cannot
// sum over NCCL: two ranks on one GPU (NCCL needs a GPU per rank and
// refuses to start), as when one GPU is split between processes with
// different device.memory_limit.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/device/backend.h"

namespace vtrain::worker {

// Sums gradients in `backend`'s device memory with `host` (MPI): each
// allreduce_async copies its bucket to pinned host memory on the compute
// stream, waits for the copy (so for the kernels that made the bucket),
// and queues the sum on `host`; wait() waits for the sums and copies each
// back (on the compute stream, waiting for the copies). Pinned buffers are
// kept per bucket and reused step after step. The host's waits for the
// compute stream count in wait_seconds(): the bucket's exchange cannot
// start before its kernels end, so backward does not run ahead of it.
// Everything else goes to `host`. `backend` must outlive the communicator.
std::unique_ptr<Communicator> make_host_staged_communicator(Backend& backend,
                                                            std::unique_ptr<Communicator> host);

// The first two ranks whose `keys` (one per rank: DeviceInfo::device_key,
// e.g. "GPU-8f1e...") are equal, as "ranks 0 and 2 share <key>"; "" when
// every key is its own. Empty keys never match (a device without one).
std::string shared_device(const std::vector<std::string>& keys);

}  // namespace vtrain::worker
