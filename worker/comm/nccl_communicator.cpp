// NCCL implementation of Communicator for the CUDA backend (CUDA builds
// only; with worker/device/cuda, the only place that includes CUDA or NCCL headers).
//
// Gradient allreduces run on a stream of their own. Each one is ordered after
// the work queued on the backend's compute stream when it is issued (an event
// recorded there, waited on by the NCCL stream), so the bucket's gradients are
// complete while the layers below keep computing; the host never waits until
// wait(). Host-side collectives go through an MPI communicator, which also
// carries the NCCL unique id from rank 0 to the others.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "worker/comm/host_collectives.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/device/cuda/cuda_backend.h"
#include "worker/device/cuda/cuda_check.h"
#include "worker/device/cuda/cuda_device.h"

namespace vtrain::worker::cuda {

inline bool failed(ncclResult_t status) { return status != ncclSuccess; }

[[noreturn]] void throw_error(ncclResult_t status, const char* expr, const char* file, int line,
                              const std::string& context) {
  throw BackendError("nccl communicator: " + error_message("NCCL", ncclGetErrorString(status),
                                                           static_cast<int>(status), expr, file,
                                                           line, context));
}

namespace {

using CudaEvent = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, decltype(&cudaEventDestroy)>;

CudaEvent make_event(unsigned flags, const std::string& context) {
  cudaEvent_t raw = nullptr;
  VTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&raw, flags), context);
  return CudaEvent(raw, cudaEventDestroy);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// NCCL's element type for ours. Its bf16 and f16 sums round to the type,
// but in an order and with partial sums that depend on the algorithm NCCL
// picks (ring and tree round each pairwise sum, as half_sum.h does; NVLS
// reduces in the switch): not bit for bit MPI's.
ncclDataType_t nccl_type(common::DataType type) {
  switch (type) {
    case common::DataType::kF32: return ncclFloat;
    case common::DataType::kBF16: return ncclBfloat16;
    case common::DataType::kF16: return ncclFloat16;
  }
  return ncclFloat;
}

class NcclCommunicator final : public HostCollectivesOf {
 public:
  explicit NcclCommunicator(Backend& backend)
      : HostCollectivesOf(make_mpi_communicator()), streams_(device_streams(backend)) {
    rank_ = host_->rank();
    size_ = host_->size();
    const std::string where =
        "rank " + std::to_string(rank_) + " on device " + std::to_string(streams_.device);
    VTRAIN_CUDA_CHECK(cudaSetDevice(streams_.device), where);
    ncclUniqueId id{};
    std::string id_bytes;
    if (rank_ == 0) {
      VTRAIN_CUDA_CHECK(ncclGetUniqueId(&id), where);
      id_bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
    }
    host_->broadcast(id_bytes, 0);
    if (id_bytes.size() != sizeof id) {
      throw BackendError("nccl communicator: " + where + ": received a unique id of " +
                         std::to_string(id_bytes.size()) + " bytes, expected " +
                         std::to_string(sizeof id));
    }
    std::memcpy(&id, id_bytes.data(), sizeof id);
    cudaStream_t stream = nullptr;
    VTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), where);
    stream_.reset(stream);
    ready_ = make_event(cudaEventDisableTiming, where);
    // Last: the destructor, which releases the communicator, runs only when
    // construction finished.
    VTRAIN_CUDA_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), where);
  }

  ~NcclCommunicator() override {
    // Unwinding after an error: other ranks may be stuck in a collective, so
    // abort the communicator (local) instead of finalising it (collective).
    if (std::uncaught_exceptions() > 0) {
      ncclCommAbort(comm_);
    } else {
      cudaStreamSynchronize(stream_.get());
      ncclCommDestroy(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_async(void* data, int64_t count, common::DataType type) override {
    if (count == 0) return;  // (one rank runs NCCL too: vtrain uses MPI there, tests do not)
    const std::string what =
        "allreduce of " + std::to_string(count) + " " + common::dtype_name(type) + " elements";
    // Start after the gradients queued so far on the compute stream.
    VTRAIN_CUDA_CHECK(cudaEventRecord(ready_.get(), streams_.compute), what);
    VTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), ready_.get(), 0), what);
    if (pending_ == timings_.size()) {
      timings_.push_back({make_event(cudaEventDefault, what), make_event(cudaEventDefault, what)});
    }
    const Timing& t = timings_[pending_];
    VTRAIN_CUDA_CHECK(cudaEventRecord(t.begin.get(), stream_.get()), what);
    VTRAIN_CUDA_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(type),
                                    ncclSum, comm_, stream_.get()),
                      what);
    VTRAIN_CUDA_CHECK(cudaEventRecord(t.end.get(), stream_.get()), what);
    ++pending_;
  }

  void wait() override {
    if (pending_ == 0) return;
    const auto start = std::chrono::steady_clock::now();
    // Polled, not cudaStreamSynchronize: an NCCL kernel whose peer is gone
    // never ends, and its error only shows in the communicator's async
    // error; the throw then aborts the communicator (the destructor).
    cudaError_t status = cudaErrorNotReady;
    while ((status = cudaStreamQuery(stream_.get())) == cudaErrorNotReady) {
      check_async_error();
      std::this_thread::yield();
    }
    wait_seconds_ += seconds_since(start);
    check_async_error();
    VTRAIN_CUDA_CHECK(status, "waiting for the allreduces");
    for (size_t i = 0; i < pending_; ++i) {
      float ms = 0;
      VTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, timings_[i].begin.get(), timings_[i].end.get()),
                        "allreduce timing");
      allreduce_seconds_ += ms / 1000.0;
    }
    pending_ = 0;
  }
  double allreduce_seconds() const override { return allreduce_seconds_; }
  double wait_seconds() const override { return wait_seconds_; }

  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);  // no rank stays blocked in a kernel waiting for this one
    host_->abort(code);
    std::_Exit(code);  // abort() does not return; be certain
  }

 private:
  // Throws the communicator's asynchronous error (a failed or aborted
  // allreduce, a peer gone), if any.
  void check_async_error() {
    ncclResult_t async_error = ncclSuccess;
    VTRAIN_CUDA_CHECK(ncclCommGetAsyncError(comm_, &async_error), "wait");
    VTRAIN_CUDA_CHECK(async_error, "an allreduce");
  }

  // Marks around one allreduce on the NCCL stream, for allreduce_seconds().
  struct Timing {
    CudaEvent begin;
    CudaEvent end;
  };

  DeviceStreams streams_;
  int rank_ = 0;
  int size_ = 1;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, decltype(&cudaStreamDestroy)> stream_{
      nullptr, cudaStreamDestroy};              // the NCCL stream
  CudaEvent ready_{nullptr, cudaEventDestroy};  // the compute-stream point an allreduce waits for
  std::vector<Timing> timings_;  // reused every step; the first pending_ are in flight
  size_t pending_ = 0;
  double allreduce_seconds_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Backend& cuda_backend) {
  return std::make_unique<NcclCommunicator>(cuda_backend);
}

}  // namespace vtrain::worker::cuda
