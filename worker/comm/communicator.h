// Collective communication between the ranks of a job.
//
// Gradient allreduces are asynchronous and ordered: allreduce_async() queues
// a sum over all ranks in place, every rank must queue the same sequence of
// (count, type) calls, and wait() blocks until all queued ones are done. The MPI
// implementation runs them on a communication thread so they overlap the
// rest of backward; the NCCL implementation (CUDA builds) will run them on
// its own stream. The small synchronous collectives must not be called while
// allreduces are pending (call wait() first).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/precision.h"

namespace vtrain::worker {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sum over ranks, in place, of `count` elements of `type` in device
  // memory. f32 sums in f32. The 16-bit types (a gradient bucket in the
  // job's half type, train.gradient_allreduce: half) round the sums to the
  // type: on MPI each pair of partial sums is added in f32 and rounded once
  // (half_sum.h); NCCL's order and partial sums depend on the algorithm it
  // picks, so the two agree to rounding, not bit for bit.
  virtual void allreduce_async(void* data, int64_t count, common::DataType type) = 0;
  void allreduce_async(float* data, int64_t count) {
    allreduce_async(data, count, common::DataType::kF32);
  }
  // Blocks until every queued allreduce has finished; rethrows its error.
  virtual void wait() = 0;
  // Seconds the allreduces took on the communication side, and seconds
  // wait() blocked the caller, since construction.
  virtual double allreduce_seconds() const = 0;
  virtual double wait_seconds() const = 0;

  // Synchronous collectives on host memory.
  virtual void allreduce_sum(std::vector<double>& values) = 0;
  virtual void broadcast(std::vector<float>& values, int root) = 0;   // resized on receivers
  virtual void broadcast(std::string& text, int root) = 0;
  virtual std::vector<std::string> gather(const std::string& text, int root) = 0;  // empty off root
  virtual void barrier() = 0;
  // A barrier that runs `work` (when not null) again and again until every
  // rank has arrived: CPU processes profiling together keep loading their
  // shared cores while the slower ones finish measuring. Ranks may pass
  // work or not, each its own. Matches only barrier_while on the other
  // ranks, not barrier(). MPI overrides it (the communicators over an MPI
  // one forward it); elsewhere `work` does not run and this is barrier().
  virtual void barrier_while(const std::function<void()>& work) {
    (void)work;
    barrier();
  }

  // Ends every rank of the job with `code` (no rank is left waiting).
  [[noreturn]] virtual void abort(int code) = 0;
};

// Initialises MPI for the process (thread level "multiple" where the library
// offers it, else at least "serialized": one thread at a time calls MPI on a
// communicator, which each communicator guarantees) and finalises it on
// destruction. Works without mpirun (a singleton world of size 1).
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  int rank_ = 0;
  int size_ = 1;
};

// A communicator over MPI_COMM_WORLD for host-addressable device memory
// (the CPU backend). Requires a live MpiRuntime.
std::unique_ptr<Communicator> make_mpi_communicator();
// The same over an MPI communicator of its own (a duplicate of the world),
// so that its collectives may run on one thread while another
// communicator's run on another (synchronised batch norm in backward beside
// the gradient allreduces). Collective. Throws when the MPI library lacks
// MPI_THREAD_MULTIPLE.
std::unique_ptr<Communicator> make_separate_mpi_communicator();
// The ranks of the world that pass the same `color` (>= 0), as a
// communicator of their own, in world rank order. Collective over the
// world: every rank calls it.
std::unique_ptr<Communicator> make_mpi_subcommunicator(int color);

class Backend;
struct DeviceInfo;

// The communicator for gradients in `backend`'s device memory: NCCL (see
// worker/device/cuda/cuda_backend.h) when the job has several ranks and
// every one is on a GPU of its own (DeviceInfo::device_key); else MPI, a
// GPU's buckets going through pinned host memory (worker/comm/host_staged.h;
// two ranks sharing a GPU, or a rank on the CPU). `note` (when given)
// then says which of the GPU paths it is, and why not NCCL. A testing aid:
// VTRAIN_STAGE_GRADIENTS=1 on any rank stages every rank's gradients
// through host memory, also on the CPU.
// `cluster` is every rank's device (gather_device_infos). Collective
// (every rank takes part in the same allreduce); requires a live
// MpiRuntime. Defined with the backend factory, the one place that knows
// what is built.
std::unique_ptr<Communicator> make_gradient_communicator(Backend& backend,
                                                         const std::vector<DeviceInfo>& cluster,
                                                         std::string* note = nullptr);

// Aborts the MPI job if MPI is running with more than one rank; returns
// otherwise (for error paths that run before a communicator exists).
void abort_job_if_parallel(int code);

}  // namespace vtrain::worker
