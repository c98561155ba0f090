// Which ranks of a job still answer, asked while a step is stuck: a rank
// whose host died or whose link is cut answers nothing, and a collective
// waiting on it never says which rank it waits for.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

namespace vtrain::worker {

class PeerProbe {
 public:
  virtual ~PeerProbe() = default;
  // Answers the pings of other ranks that have arrived. Cheap; a rank's
  // watch calls it every tick, so that a stuck rank still answers.
  virtual void answer() = 0;
  // Pings every other rank and waits up to `window` for each to answer,
  // answering meanwhile; the ranks that did not, in rank order.
  virtual std::vector<int> silent_ranks(std::chrono::milliseconds window) = 0;
};

// Over MPI, on a communicator of its own (a duplicate of the world), used
// from a thread of its own beside the training's collectives. Collective
// over the world. nullptr with one rank, or where the MPI library lacks
// MPI_THREAD_MULTIPLE. Destroy it before MPI is finalised.
std::unique_ptr<PeerProbe> make_mpi_peer_probe();

}  // namespace vtrain::worker
