// CUDA backend on cuDNN and cuBLAS. See cuda_backend.h.
//
// All ops run on one compute stream (cuDNN's and cuBLAS's handles are bound
// to it); the memory stream carries copy_async only. Convolutions use the
// caller's workspace; the few ops that need temporary device memory (layout
// staging, batch-norm statistics, loss results) share one backend-owned
// scratch buffer that is counted as device memory, as in the CPU backend.
// cuDNN descriptors are created once per shape and cached.
#include "worker/device/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "worker/device/cuda/cuda_check.h"
#include "worker/device/cuda/cuda_device.h"
#include "worker/device/cuda/cuda_kernels.h"

namespace vtrain::worker::cuda {

// ------------------------------------------------------------------ errors

std::string error_message(const char* library, const char* error, int code, const char* expr,
                          const char* file, int line, const std::string& context) {
  return context + ": " + expr + " failed at " + file + ":" + std::to_string(line) + ": " +
         library + " error " + std::to_string(code) + " (" + (error ? error : "unknown") + ")";
}

void throw_error(cudaError_t status, const char* expr, const char* file, int line,
                 const std::string& context) {
  cudaGetLastError();  // clear a non-sticky error so later calls do not report it again
  throw BackendError("cuda backend: " + error_message("CUDA", cudaGetErrorString(status),
                                                      static_cast<int>(status), expr, file, line,
                                                      context));
}

void throw_error(cudnnStatus_t status, const char* expr, const char* file, int line,
                 const std::string& context) {
  throw BackendError("cuda backend: " + error_message("cuDNN", cudnnGetErrorString(status),
                                                      static_cast<int>(status), expr, file, line,
                                                      context));
}

void throw_error(cublasStatus_t status, const char* expr, const char* file, int line,
                 const std::string& context) {
  throw BackendError("cuda backend: " + error_message("cuBLAS", cublasGetStatusString(status),
                                                      static_cast<int>(status), expr, file, line,
                                                      context));
}

namespace {

// -------------------------------------------------------- RAII for handles

template <typename Handle, auto Destroy>
struct Destroyer {
  void operator()(Handle handle) const noexcept { Destroy(handle); }
};
// Owns a C handle of pointer type `Handle`; Destroy(handle) releases it.
template <typename Handle, auto Destroy>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>, Destroyer<Handle, Destroy>>;

using TensorDescriptor = Owned<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDescriptor = Owned<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvDescriptor = Owned<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;
using PoolDescriptor = Owned<cudnnPoolingDescriptor_t, cudnnDestroyPoolingDescriptor>;
using ActivationDescriptor = Owned<cudnnActivationDescriptor_t, cudnnDestroyActivationDescriptor>;
using CudnnHandle = Owned<cudnnHandle_t, cudnnDestroy>;
using CublasHandle = Owned<cublasHandle_t, cublasDestroy>;
using Stream = Owned<cudaStream_t, cudaStreamDestroy>;
using CudaEvent = std::shared_ptr<std::remove_pointer_t<cudaEvent_t>>;

constexpr size_t kAlign = 256;  // what cudaMalloc guarantees, more than the contract's 64
// Device memory left to cuDNN's and cuBLAS's own allocations and to the
// backend's scratch when no device.memory_limit is given.
constexpr size_t kLibraryHeadroom = size_t{512} << 20;

size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

int to_int(int64_t value, const std::string& what) {
  if (value < 0 || value > INT_MAX) {
    throw BackendError("cuda backend: " + what + " = " + std::to_string(value) +
                       " does not fit cuDNN's / cuBLAS's int");
  }
  return static_cast<int>(value);
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// Local rank from the usual launcher variables, 0 when none is set.
int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                           "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(name)) {
      char* end = nullptr;
      const long rank = std::strtol(value, &end, 10);
      if (end != value && *end == '\0' && rank >= 0 && rank <= INT_MAX) {
        return static_cast<int>(rank);
      }
    }
  }
  return 0;
}

void check_beta(const char* op, float beta) {
  if (beta != 0.0f && beta != 1.0f) {
    throw BackendError(std::string("cuda backend: ") + op + ": beta must be 0 or 1, got " +
                       std::to_string(beta));
  }
}

// The ops built on cuDNN descriptors take plain NCHW (see cuda_backend.h).
void require_plain(const char* op, const TensorDesc& d) {
  if (d.layout != Layout::kPlain) {
    throw BackendError(std::string("cuda backend: ") + op + ": tensor " + d.shape.str() +
                       " is in layout " + layout_name(d.layout) +
                       "; this backend takes activations in its preferred layout, plain NCHW");
  }
}

BlockedShape blocked(const TensorDesc& d) {
  return {d.shape.n, d.shape.c, d.shape.h, d.shape.w, channel_block(d.layout)};
}

const char* conv_algo_name(ConvKind kind, int algo) {
  static constexpr const char* kForward[] = {
      "implicit_gemm", "implicit_precomp_gemm", "gemm", "direct", "fft", "fft_tiling",
      "winograd",      "winograd_nonfused"};
  static constexpr const char* kBackwardData[] = {"algo_0",     "algo_1",   "fft",
                                                  "fft_tiling", "winograd", "winograd_nonfused"};
  static constexpr const char* kBackwardFilter[] = {
      "algo_0", "algo_1", "fft", "algo_3", "winograd", "winograd_nonfused", "fft_tiling"};
  switch (kind) {
    case ConvKind::kForward:
      if (algo >= 0 && algo < static_cast<int>(std::size(kForward))) return kForward[algo];
      break;
    case ConvKind::kBackwardData:
      if (algo >= 0 && algo < static_cast<int>(std::size(kBackwardData)))
        return kBackwardData[algo];
      break;
    case ConvKind::kBackwardFilter:
      if (algo >= 0 && algo < static_cast<int>(std::size(kBackwardFilter))) {
        return kBackwardFilter[algo];
      }
      break;
  }
  return nullptr;
}

std::string known_algorithms(ConvKind kind) {
  std::string known;
  for (int a = 0; const char* name = conv_algo_name(kind, a); ++a) {
    known += (known.empty() ? "" : ", ") + std::to_string(a) + " " + name;
  }
  return known;
}

// cuDNN descriptors of one convolution problem.
struct ConvDescriptors {
  TensorDescriptor x, y, bias;
  FilterDescriptor w;
  ConvDescriptor conv;
};

}  // namespace

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  DeviceInfo device_info() const override { return info_; }
  DeviceStreams streams() const { return {device_, compute_.get()}; }

  void* allocate_device(size_t bytes) override;
  void free_device(void* ptr) override;
  size_t device_bytes_in_use() const override {
    std::lock_guard lock(alloc_mutex_);
    return in_use_;
  }
  size_t device_bytes_peak() const override {
    std::lock_guard lock(alloc_mutex_);
    return peak_;
  }
  void reset_peak() override {
    std::lock_guard lock(alloc_mutex_);
    peak_ = in_use_;
  }
  void* allocate_pinned(size_t bytes) override;
  void free_pinned(void* ptr) override;
  Layout preferred_layout(int64_t) const override { return Layout::kPlain; }

  Event record_event(StreamKind stream) override;
  void wait_event(StreamKind stream, const Event& event) override;
  void synchronize(const Event& event) override;
  void synchronize(StreamKind stream) override;
  void copy_async(void* dst, const void* src, size_t bytes, StreamKind stream) override;

  void upload(const float* host, const Tensor& dst) override;
  void download(const Tensor& src, float* host) override;
  void convert(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;
  void upload_labels(const int32_t* host, int32_t* device, int64_t count) override;

  std::vector<ConvAlgoInfo> conv_algorithms(ConvKind kind, const ConvProblem& p,
                                            bool accumulate) override;
  std::string conv_algorithm_name(ConvKind kind, ConvAlgo algo) const override;
  size_t conv_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                        bool accumulate) override;
  void conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const float* w,
                    const float* bias, const Tensor& y, float beta, void* workspace,
                    size_t workspace_bytes) override;
  void conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy, const float* w,
                          const Tensor& dx, float beta, void* workspace,
                          size_t workspace_bytes) override;
  void conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const Tensor& dy,
                            float* dw, float* dbias, float beta, void* workspace,
                            size_t workspace_bytes) override;

  void relu_forward(const Tensor& x, const Tensor& y) override;
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override;
  size_t pooling_state_bytes(const PoolParams&, const TensorDesc&, const TensorDesc&) override {
    return 0;  // cuDNN's pooling backward recomputes the maxima from x and y
  }
  void pooling_forward(const PoolParams& p, const Tensor& x, const Tensor& y, void* state) override;
  void pooling_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& dx, const void* state) override;
  void inner_product_forward(const Tensor& x, const float* w, const float* bias,
                             const Tensor& y) override;
  void inner_product_backward_data(const Tensor& dy, const float* w, const Tensor& dx) override;
  void inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw, float* dbias,
                                      float beta) override;
  void batch_norm_forward_training(const Tensor& x, const Tensor& y, const float* scale_shift,
                                   float* save_mean, float* save_var, float* running_mean,
                                   float* running_var, float momentum, float eps) override;
  void batch_norm_forward_inference(const Tensor& x, const Tensor& y, const float* scale_shift,
                                    const float* running_mean, const float* running_var,
                                    float eps) override;
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                           const float* save_mean, const float* save_var, const Tensor& dx,
                           float* dscale_shift, float beta, float eps) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void accumulate(const Tensor& x, const Tensor& y, float beta) override;
  void concat_forward(std::span<const Tensor> xs, const Tensor& y) override;
  void concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx,
                       float beta) override;
  LossStats softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float scale,
                                  const Tensor* dlogits) override;
  void sgd_update(float* w, const float* g, float* velocity, int64_t count,
                  const SgdStep& step) override;
  void scale(float* x, int64_t count, float alpha) override;

  // cuDNN's activation, pooling and the cuBLAS inner products need no
  // scratch; concat copies in place.
  size_t relu_scratch_bytes(const TensorDesc&) override { return 0; }
  size_t pooling_scratch_bytes(const PoolParams&, const TensorDesc&, const TensorDesc&) override {
    return 0;
  }
  size_t inner_product_scratch_bytes(const TensorDesc&, int64_t, bool) override { return 0; }
  size_t batch_norm_scratch_bytes(const TensorDesc& x, float) override {
    return bn_inverse_std_bytes(x.shape.c);
  }
  size_t add_scratch_bytes(const TensorDesc& a, const TensorDesc& b,
                           const TensorDesc& y) override {
    return add_staging_bytes(a, b, y);
  }
  size_t concat_scratch_bytes(std::span<const TensorDesc>, const TensorDesc&) override {
    return 0;
  }
  size_t softmax_scratch_bytes(const TensorDesc& logits) override {
    return softmax_result_bytes(logits.shape.n);
  }
  void reserve_scratch(size_t bytes) override { scratch(bytes); }
  size_t scratch_bytes() const override { return scratch_bytes_; }

 private:
  // Batch norm keeps cuDNN's 1 / sqrt(var + eps) per channel in scratch.
  static size_t bn_inverse_std_bytes(int64_t channels) {
    return static_cast<size_t>(channels) * sizeof(float);
  }
  // add() converts inputs whose layout differs from y's into two staged
  // copies (accumulate(x, y) one copy: within add_staging_bytes(y, x, y)).
  static size_t add_staging_bytes(const TensorDesc& a, const TensorDesc& b, const TensorDesc& y) {
    const bool staged = a.layout != y.layout || b.layout != y.layout;
    return staged ? 2 * align_up(y.bytes()) : 0;
  }
  // Softmax's per-row losses (double), hits and the bad-label flag (int32).
  static size_t softmax_result_bytes(int64_t n) {
    return static_cast<size_t>(n) * sizeof(double) + static_cast<size_t>(n + 2) * sizeof(int32_t);
  }

  // Events recorded on one stream, oldest first, that may not have passed yet.
  struct EventQueue {
    std::deque<std::pair<uint64_t, CudaEvent>> pending;
    uint64_t next_ticket = 1;
  };

  // Makes this backend's GPU current on the calling thread: the entry points
  // a helper thread may use (memory, copies, events) call it first.
  void use_device() const { VTRAIN_CUDA_CHECK(cudaSetDevice(device_), "selecting the device"); }
  cudaStream_t stream(StreamKind kind) const {
    return kind == StreamKind::kCompute ? compute_.get() : memory_.get();
  }
  void sync_compute(const std::string& context);
  // Drops the events of `queue` that have passed. Requires event_mutex_.
  void retire_passed(EventQueue& queue);
  // The event behind `event`, or null when it has passed already.
  CudaEvent find_event(const Event& event);

  // Backend-owned device memory for one op's temporaries; valid until the
  // next call that asks for scratch (work is stream-ordered, so the previous
  // op's temporaries are dead by the time the next op runs).
  char* scratch(size_t bytes);
  // Host-side pinned staging for small results read back by the host.
  char* pinned_staging(size_t bytes);

  cudnnTensorDescriptor_t tensor_desc(int64_t n, int64_t c, int64_t h, int64_t w);
  cudnnTensorDescriptor_t tensor_desc(const Shape& s) { return tensor_desc(s.n, s.c, s.h, s.w); }
  // A descriptor covering a tensor's whole storage, padding included, for
  // elementwise ops that do not care about the layout.
  cudnnTensorDescriptor_t storage_desc(const TensorDesc& d) {
    return tensor_desc(d.storage_elements(), 1, 1, 1);
  }
  const ConvDescriptors& conv_descriptors(const ConvProblem& p);
  cudnnPoolingDescriptor_t pool_desc(const PoolParams& p);
  void check_conv(const char* op, const ConvProblem& p, const Tensor& x, const Tensor& y,
                  ConvKind kind, ConvAlgo algo, size_t workspace_bytes);
  // A tensor's contents in `layout`: itself, or a reordered copy at `staging`.
  const float* in_layout(const Tensor& t, Layout layout, float* staging);

  DeviceInfo info_;
  int device_ = 0;
  size_t capacity_ = 0;
  Stream compute_;
  Stream memory_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;
  ActivationDescriptor relu_;

  mutable std::mutex alloc_mutex_;
  std::unordered_map<void*, size_t> allocations_;
  size_t in_use_ = 0;
  size_t peak_ = 0;

  std::mutex event_mutex_;
  EventQueue events_[2];  // by StreamKind

  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  char* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;

  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, TensorDescriptor> tensor_descs_;
  std::unordered_map<std::string, ConvDescriptors> conv_descs_;
  std::unordered_map<std::string, PoolDescriptor> pool_descs_;
  std::unordered_map<std::string, size_t> conv_workspaces_;
};

// ----------------------------------------------------------------- lifecycle

CudaBackend::CudaBackend(const BackendOptions& options) {
  int count = 0;
  VTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count), "counting CUDA devices");
  if (count < 1) throw BackendError("cuda backend: no CUDA device is visible");
  device_ = local_rank() % count;
  const std::string where = "device " + std::to_string(device_);
  VTRAIN_CUDA_CHECK(cudaSetDevice(device_), where);
  cudaDeviceProp prop{};
  VTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_), where);
  const size_t version = cudnnGetVersion();
  info_.backend = "cuda";
  info_.name = prop.name;
  info_.threads = 1;
  info_.library_version = "cuDNN " + std::to_string(version / 10000) + "." +
                          std::to_string(version / 100 % 100) + "." + std::to_string(version % 100);
  info_.host = host_name();

  cudaStream_t raw_stream = nullptr;
  VTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking), where);
  compute_.reset(raw_stream);
  VTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking), where);
  memory_.reset(raw_stream);

  cudnnHandle_t raw_cudnn = nullptr;
  VTRAIN_CUDA_CHECK(cudnnCreate(&raw_cudnn), where);
  cudnn_.reset(raw_cudnn);
  VTRAIN_CUDA_CHECK(cudnnSetStream(cudnn_.get(), compute_.get()), where);
  cublasHandle_t raw_cublas = nullptr;
  VTRAIN_CUDA_CHECK(cublasCreate(&raw_cublas), where);
  cublas_.reset(raw_cublas);
  VTRAIN_CUDA_CHECK(cublasSetStream(cublas_.get(), compute_.get()), where);
  // Plain float32 (no TF32 tensor cores): results comparable with the CPU.
  VTRAIN_CUDA_CHECK(cublasSetMathMode(cublas_.get(), CUBLAS_DEFAULT_MATH), where);

  cudnnActivationDescriptor_t raw_act = nullptr;
  VTRAIN_CUDA_CHECK(cudnnCreateActivationDescriptor(&raw_act), where);
  relu_.reset(raw_act);
  VTRAIN_CUDA_CHECK(cudnnSetActivationDescriptor(relu_.get(), CUDNN_ACTIVATION_RELU,
                                                 CUDNN_NOT_PROPAGATE_NAN, 0.0),
                    where);

  // What this backend may allocate: device.memory_limit, else what is free
  // now that the context and the cuDNN and cuBLAS handles exist, less
  // kLibraryHeadroom for what the libraries and this backend's own scratch
  // allocate outside the count later (a pool sized to the last byte of
  // totalGlobalMem would fail in cudaMalloc).
  size_t free_bytes = 0, total_bytes = 0;
  VTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), where);
  capacity_ = options.memory_limit > 0
                  ? options.memory_limit
                  : (free_bytes > kLibraryHeadroom ? free_bytes - kLibraryHeadroom : 0);
  info_.memory_bytes = capacity_;
}

CudaBackend::~CudaBackend() {
  // Errors here have been reported by the op that caused them.
  cudaStreamSynchronize(memory_.get());
  cudaStreamSynchronize(compute_.get());
  for (auto& [ptr, bytes] : allocations_) cudaFree(ptr);
  if (pinned_) cudaFreeHost(pinned_);
}

void CudaBackend::sync_compute(const std::string& context) {
  VTRAIN_CUDA_CHECK(cudaStreamSynchronize(compute_.get()), context);
}

// -------------------------------------------------------------------- memory

void* CudaBackend::allocate_device(size_t bytes) {
  use_device();
  std::lock_guard lock(alloc_mutex_);
  const size_t rounded = align_up(std::max<size_t>(bytes, 1));
  if (in_use_ + rounded > capacity_) {
    throw BackendError("cuda device out of memory: requested " + std::to_string(bytes) +
                       " bytes with " + std::to_string(in_use_) + " in use of a capacity of " +
                       std::to_string(capacity_) + " (device.memory_limit)");
  }
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, rounded);
  if (status != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw BackendError("cuda device: cudaMalloc of " + std::to_string(bytes) + " bytes failed (" +
                       cudaGetErrorString(status) + ") with " + std::to_string(in_use_) +
                       " bytes in use by this backend, " + std::to_string(free_bytes) + " of " +
                       std::to_string(total_bytes) + " free on the device");
  }
  allocations_[ptr] = rounded;
  in_use_ += rounded;
  peak_ = std::max(peak_, in_use_);
  return ptr;
}

void CudaBackend::free_device(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(alloc_mutex_);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) throw BackendError("cuda device: free of an unknown pointer");
  VTRAIN_CUDA_CHECK(cudaFree(ptr), "free_device of " + std::to_string(it->second) + " bytes");
  in_use_ -= it->second;
  allocations_.erase(it);
}

void* CudaBackend::allocate_pinned(size_t bytes) {
  use_device();
  void* ptr = nullptr;
  VTRAIN_CUDA_CHECK(cudaHostAlloc(&ptr, std::max<size_t>(bytes, 1), cudaHostAllocDefault),
                    "allocate_pinned of " + std::to_string(bytes) + " bytes");
  return ptr;
}

void CudaBackend::free_pinned(void* ptr) {
  if (ptr) VTRAIN_CUDA_CHECK(cudaFreeHost(ptr), "free_pinned");
}

char* CudaBackend::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_) {
      sync_compute("growing the scratch buffer");  // queued ops may still use the old one
      free_device(scratch_);
    }
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    scratch_ = static_cast<char*>(allocate_device(bytes));
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

char* CudaBackend::pinned_staging(size_t bytes) {
  if (bytes > pinned_bytes_) {
    if (pinned_) {
      sync_compute("growing the pinned staging buffer");
      VTRAIN_CUDA_CHECK(cudaFreeHost(pinned_), "pinned staging");
    }
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    VTRAIN_CUDA_CHECK(
        cudaHostAlloc(reinterpret_cast<void**>(&pinned_), bytes, cudaHostAllocDefault),
        "pinned staging of " + std::to_string(bytes) + " bytes");
    pinned_bytes_ = bytes;
  }
  return pinned_;
}

// ------------------------------------------------------- streams and copies

void CudaBackend::retire_passed(EventQueue& queue) {
  while (!queue.pending.empty()) {
    const cudaError_t status = cudaEventQuery(queue.pending.front().second.get());
    if (status == cudaErrorNotReady) return;
    VTRAIN_CUDA_CHECK(status, "querying an event");
    queue.pending.pop_front();
  }
}

Event CudaBackend::record_event(StreamKind kind) {
  use_device();
  std::lock_guard lock(event_mutex_);
  EventQueue& queue = events_[static_cast<int>(kind)];
  retire_passed(queue);
  cudaEvent_t raw = nullptr;
  VTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming), "record_event");
  CudaEvent event(raw, cudaEventDestroy);
  VTRAIN_CUDA_CHECK(cudaEventRecord(event.get(), stream(kind)), "record_event");
  queue.pending.emplace_back(queue.next_ticket, std::move(event));
  return {kind, queue.next_ticket++};
}

CudaEvent CudaBackend::find_event(const Event& event) {
  std::lock_guard lock(event_mutex_);
  EventQueue& queue = events_[static_cast<int>(event.stream)];
  if (event.ticket >= queue.next_ticket) {
    throw BackendError("cuda backend: event " + std::to_string(event.ticket) +
                       " was never recorded on the " +
                       (event.stream == StreamKind::kCompute ? "compute" : "memory") + " stream");
  }
  // Tickets below the oldest pending one have passed (ticket 0 is the
  // default Event, which has always passed).
  for (const auto& [ticket, e] : queue.pending) {
    if (ticket == event.ticket) return e;
  }
  return nullptr;
}

void CudaBackend::wait_event(StreamKind kind, const Event& event) {
  use_device();
  if (const CudaEvent e = find_event(event)) {
    VTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream(kind), e.get(), 0), "wait_event");
  }
}

void CudaBackend::synchronize(const Event& event) {
  if (const CudaEvent e = find_event(event)) {
    VTRAIN_CUDA_CHECK(cudaEventSynchronize(e.get()), "synchronize(event)");
  }
}

void CudaBackend::synchronize(StreamKind kind) {
  VTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream(kind)),
                    kind == StreamKind::kCompute ? "synchronize(compute)" : "synchronize(memory)");
  std::lock_guard lock(event_mutex_);
  retire_passed(events_[static_cast<int>(kind)]);
}

void CudaBackend::copy_async(void* dst, const void* src, size_t bytes, StreamKind kind) {
  if (bytes == 0) return;
  use_device();
  VTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream(kind)),
                    "copy_async of " + std::to_string(bytes) + " bytes");
}

void CudaBackend::upload(const float* host, const Tensor& dst) {
  const size_t plain_bytes = static_cast<size_t>(dst.shape().elements()) * sizeof(float);
  const std::string context = "upload " + dst.shape().str();
  if (dst.desc.layout == Layout::kPlain) {
    VTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(dst.data, host, plain_bytes, cudaMemcpyHostToDevice, compute_.get()),
        context);
  } else {
    float* staging = reinterpret_cast<float*>(scratch(plain_bytes));
    VTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(staging, host, plain_bytes, cudaMemcpyHostToDevice, compute_.get()),
        context);
    reorder(staging, 1, dst.data, blocked(dst.desc), compute_.get());
  }
  sync_compute(context);  // the caller may reuse `host` on return
}

void CudaBackend::download(const Tensor& src, float* host) {
  const size_t plain_bytes = static_cast<size_t>(src.shape().elements()) * sizeof(float);
  const std::string context = "download " + src.shape().str();
  const float* from = src.data;
  if (src.desc.layout != Layout::kPlain) {
    float* staging = reinterpret_cast<float*>(scratch(plain_bytes));
    reorder(src.data, channel_block(src.desc.layout), staging,
            {src.shape().n, src.shape().c, src.shape().h, src.shape().w, 1}, compute_.get());
    from = staging;
  }
  VTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(host, from, plain_bytes, cudaMemcpyDeviceToHost, compute_.get()), context);
  sync_compute(context);
}

void CudaBackend::convert(const Tensor& src, const Tensor& dst) {
  if (!(src.shape() == dst.shape())) {
    throw BackendError("convert: shapes differ: " + src.shape().str() + " vs " + dst.shape().str());
  }
  if (src.desc.layout == dst.desc.layout) {
    if (src.data != dst.data) {
      VTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice,
                                        compute_.get()),
                        "convert " + src.shape().str());
    }
    return;
  }
  if (src.data == dst.data) {
    throw BackendError("convert: cannot change the layout of " + src.shape().str() + " in place");
  }
  reorder(src.data, channel_block(src.desc.layout), dst.data, blocked(dst.desc), compute_.get());
}

void CudaBackend::fill(const Tensor& dst, float value) {
  cuda::fill(dst.data, blocked(dst.desc), value, compute_.get());
}

void CudaBackend::upload_labels(const int32_t* host, int32_t* device, int64_t count) {
  if (count <= 0) return;
  VTRAIN_CUDA_CHECK(cudaMemcpyAsync(device, host, static_cast<size_t>(count) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, compute_.get()),
                    "upload_labels");
  sync_compute("upload_labels");
}

const float* CudaBackend::in_layout(const Tensor& t, Layout layout, float* staging) {
  if (t.desc.layout == layout) return t.data;
  reorder(t.data, channel_block(t.desc.layout), staging, blocked({t.shape(), layout}),
          compute_.get());
  return staging;
}

// -------------------------------------------------------------- descriptors

cudnnTensorDescriptor_t CudaBackend::tensor_desc(int64_t n, int64_t c, int64_t h, int64_t w) {
  auto key = std::make_tuple(n, c, h, w);
  auto it = tensor_descs_.find(key);
  if (it != tensor_descs_.end()) return it->second.get();
  const std::string what = "tensor " + Shape{n, c, h, w}.str();
  cudnnTensorDescriptor_t raw = nullptr;
  VTRAIN_CUDA_CHECK(cudnnCreateTensorDescriptor(&raw), what);
  TensorDescriptor desc(raw);
  VTRAIN_CUDA_CHECK(cudnnSetTensor4dDescriptor(raw, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                               to_int(n, what + " n"), to_int(c, what + " c"),
                                               to_int(h, what + " h"), to_int(w, what + " w")),
                    what);
  return tensor_descs_.emplace(key, std::move(desc)).first->second.get();
}

const ConvDescriptors& CudaBackend::conv_descriptors(const ConvProblem& p) {
  const std::string key = p.str();
  auto it = conv_descs_.find(key);
  if (it != conv_descs_.end()) return it->second;
  require_plain("convolution input", p.x);
  require_plain("convolution output", p.y);
  if (!(p.y.shape == p.output_shape())) {
    throw BackendError("convolution " + p.str() + ": output shape should be " +
                       p.output_shape().str());
  }
  const std::string what = "convolution " + key;
  ConvDescriptors d;
  auto make_tensor = [&](const Shape& s) {
    cudnnTensorDescriptor_t raw = nullptr;
    VTRAIN_CUDA_CHECK(cudnnCreateTensorDescriptor(&raw), what);
    TensorDescriptor desc(raw);
    VTRAIN_CUDA_CHECK(
        cudnnSetTensor4dDescriptor(raw, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, to_int(s.n, what),
                                   to_int(s.c, what), to_int(s.h, what), to_int(s.w, what)),
        what);
    return desc;
  };
  d.x = make_tensor(p.x.shape);
  d.y = make_tensor(p.y.shape);
  d.bias = make_tensor({1, p.k, 1, 1});
  const Shape ws = p.weight_shape();
  cudnnFilterDescriptor_t raw_filter = nullptr;
  VTRAIN_CUDA_CHECK(cudnnCreateFilterDescriptor(&raw_filter), what);
  d.w.reset(raw_filter);
  VTRAIN_CUDA_CHECK(cudnnSetFilter4dDescriptor(raw_filter, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                               to_int(ws.n, what), to_int(ws.c, what),
                                               to_int(ws.h, what), to_int(ws.w, what)),
                    what);
  cudnnConvolutionDescriptor_t raw_conv = nullptr;
  VTRAIN_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&raw_conv), what);
  d.conv.reset(raw_conv);
  VTRAIN_CUDA_CHECK(
      cudnnSetConvolution2dDescriptor(raw_conv, to_int(p.pad_h, what), to_int(p.pad_w, what),
                                      to_int(p.stride_h, what), to_int(p.stride_w, what), 1, 1,
                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
      what);
  // No TF32 tensor-core math: float32 results comparable with the CPU.
  VTRAIN_CUDA_CHECK(cudnnSetConvolutionMathType(raw_conv, CUDNN_FMA_MATH), what);
  return conv_descs_.emplace(key, std::move(d)).first->second;
}

cudnnPoolingDescriptor_t CudaBackend::pool_desc(const PoolParams& p) {
  const std::string key = std::to_string(static_cast<int>(p.kind)) + "/" + std::to_string(p.kh) +
                          "x" + std::to_string(p.kw) + "/" + std::to_string(p.stride_h) + "x" +
                          std::to_string(p.stride_w) + "/" + std::to_string(p.pad_h) + "x" +
                          std::to_string(p.pad_w);
  auto it = pool_descs_.find(key);
  if (it != pool_descs_.end()) return it->second.get();
  const std::string what = "pooling " + key;
  cudnnPoolingDescriptor_t raw = nullptr;
  VTRAIN_CUDA_CHECK(cudnnCreatePoolingDescriptor(&raw), what);
  PoolDescriptor desc(raw);
  // Deterministic max pooling: backward does not depend on thread timing.
  const cudnnPoolingMode_t mode = p.kind == PoolKind::kMax
                                      ? CUDNN_POOLING_MAX_DETERMINISTIC
                                      : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  VTRAIN_CUDA_CHECK(
      cudnnSetPooling2dDescriptor(raw, mode, CUDNN_NOT_PROPAGATE_NAN, to_int(p.kh, what),
                                  to_int(p.kw, what), to_int(p.pad_h, what), to_int(p.pad_w, what),
                                  to_int(p.stride_h, what), to_int(p.stride_w, what)),
      what);
  return pool_descs_.emplace(key, std::move(desc)).first->second.get();
}

// ------------------------------------------------------------- convolution

std::string CudaBackend::conv_algorithm_name(ConvKind kind, ConvAlgo algo) const {
  if (const char* name = conv_algo_name(kind, algo)) return name;
  throw BackendError("cuda backend: unknown " + std::string(conv_kind_name(kind)) +
                     " convolution algorithm id " + std::to_string(algo) +
                     " (known: " + known_algorithms(kind) + ")");
}

std::vector<ConvAlgoInfo> CudaBackend::conv_algorithms(ConvKind kind, const ConvProblem& p,
                                                       bool accumulate) {
  const ConvDescriptors& d = conv_descriptors(p);
  const std::string what = std::string(conv_kind_name(kind)) + " algorithms for " + p.str();
  // cuDNN's heuristic ranking, best first; entries with a failure status are
  // not supported for this problem.
  std::vector<int> ranked;
  int max_count = 0, returned = 0;
  switch (kind) {
    case ConvKind::kForward: {
      VTRAIN_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(cudnn_.get(), &max_count),
                        what);
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(max_count));
      VTRAIN_CUDA_CHECK(
          cudnnGetConvolutionForwardAlgorithm_v7(cudnn_.get(), d.x.get(), d.w.get(), d.conv.get(),
                                                 d.y.get(), max_count, &returned, perf.data()),
          what);
      for (int i = 0; i < returned; ++i) {
        if (perf[i].status == CUDNN_STATUS_SUCCESS) ranked.push_back(perf[i].algo);
      }
      break;
    }
    case ConvKind::kBackwardData: {
      VTRAIN_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnn_.get(), &max_count),
                        what);
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(max_count));
      VTRAIN_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                            cudnn_.get(), d.w.get(), d.y.get(), d.conv.get(), d.x.get(), max_count,
                            &returned, perf.data()),
                        what);
      for (int i = 0; i < returned; ++i) {
        if (perf[i].status == CUDNN_STATUS_SUCCESS) ranked.push_back(perf[i].algo);
      }
      break;
    }
    case ConvKind::kBackwardFilter: {
      VTRAIN_CUDA_CHECK(
          cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnn_.get(), &max_count), what);
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(max_count));
      VTRAIN_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                            cudnn_.get(), d.x.get(), d.y.get(), d.conv.get(), d.w.get(), max_count,
                            &returned, perf.data()),
                        what);
      for (int i = 0; i < returned; ++i) {
        if (perf[i].status == CUDNN_STATUS_SUCCESS) ranked.push_back(perf[i].algo);
      }
      break;
    }
  }
  std::vector<ConvAlgoInfo> algos;
  for (int algo : ranked) {
    const bool seen = std::any_of(algos.begin(), algos.end(),
                                  [&](const ConvAlgoInfo& a) { return a.algo == algo; });
    if (seen || !conv_algo_name(kind, algo)) continue;
    try {
      algos.push_back(
          {algo, conv_algo_name(kind, algo), conv_workspace(kind, algo, p, accumulate)});
    } catch (const BackendError&) {
      // The heuristic listed it, but cuDNN has no workspace size for it here.
    }
  }
  return algos;
}

size_t CudaBackend::conv_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                                   bool /*accumulate: beta is native in cuDNN, no extra space*/) {
  const std::string name = conv_algorithm_name(kind, algo);  // throws for unknown ids
  const std::string key =
      std::to_string(static_cast<int>(kind)) + "/" + std::to_string(algo) + "/" + p.str();
  auto it = conv_workspaces_.find(key);
  if (it != conv_workspaces_.end()) return it->second;
  const ConvDescriptors& d = conv_descriptors(p);
  size_t bytes = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  switch (kind) {
    case ConvKind::kForward:
      status = cudnnGetConvolutionForwardWorkspaceSize(
          cudnn_.get(), d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
          static_cast<cudnnConvolutionFwdAlgo_t>(algo), &bytes);
      break;
    case ConvKind::kBackwardData:
      status = cudnnGetConvolutionBackwardDataWorkspaceSize(
          cudnn_.get(), d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &bytes);
      break;
    case ConvKind::kBackwardFilter:
      status = cudnnGetConvolutionBackwardFilterWorkspaceSize(
          cudnn_.get(), d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &bytes);
      break;
  }
  if (status != CUDNN_STATUS_SUCCESS) {
    throw BackendError("cuda backend: " + std::string(conv_kind_name(kind)) + " algorithm " + name +
                       " is not available for " + p.str() + ": cuDNN " +
                       cudnnGetErrorString(status));
  }
  conv_workspaces_.emplace(key, bytes);
  return bytes;
}

void CudaBackend::check_conv(const char* op, const ConvProblem& p, const Tensor& x, const Tensor& y,
                             ConvKind kind, ConvAlgo algo, size_t workspace_bytes) {
  if (!(x.desc == p.x) || !(y.desc == p.y)) {
    throw BackendError(std::string("cuda backend: ") + op + ": tensors " + x.shape().str() +
                       " and " + y.shape().str() + " do not match the problem " + p.str());
  }
  const size_t need = conv_workspace(kind, algo, p, false);
  if (workspace_bytes < need) {
    throw BackendError(std::string("cuda backend: ") + op + " " + p.str() + " with " +
                       conv_algorithm_name(kind, algo) + " needs " + std::to_string(need) +
                       " workspace bytes, got " + std::to_string(workspace_bytes));
  }
}

void CudaBackend::conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const float* w,
                               const float* bias, const Tensor& y, float beta, void* workspace,
                               size_t workspace_bytes) {
  check_beta("conv_forward", beta);
  const ConvDescriptors& d = conv_descriptors(p);
  check_conv("conv_forward", p, x, y, ConvKind::kForward, algo, workspace_bytes);
  const std::string what = "conv_forward " + p.str();
  const float one = 1.0f;
  VTRAIN_CUDA_CHECK(
      cudnnConvolutionForward(cudnn_.get(), &one, d.x.get(), x.data, d.w.get(), w, d.conv.get(),
                              static_cast<cudnnConvolutionFwdAlgo_t>(algo), workspace,
                              workspace_bytes, &beta, d.y.get(), y.data),
      what);
  if (bias) {
    VTRAIN_CUDA_CHECK(
        cudnnAddTensor(cudnn_.get(), &one, d.bias.get(), bias, &one, d.y.get(), y.data),
        what + " bias");
  }
}

void CudaBackend::conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy,
                                     const float* w, const Tensor& dx, float beta, void* workspace,
                                     size_t workspace_bytes) {
  check_beta("conv_backward_data", beta);
  const ConvDescriptors& d = conv_descriptors(p);
  check_conv("conv_backward_data", p, dx, dy, ConvKind::kBackwardData, algo, workspace_bytes);
  const float one = 1.0f;
  VTRAIN_CUDA_CHECK(
      cudnnConvolutionBackwardData(cudnn_.get(), &one, d.w.get(), w, d.y.get(), dy.data,
                                   d.conv.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(algo),
                                   workspace, workspace_bytes, &beta, d.x.get(), dx.data),
      "conv_backward_data " + p.str());
}

void CudaBackend::conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                                       const Tensor& dy, float* dw, float* dbias, float beta,
                                       void* workspace, size_t workspace_bytes) {
  check_beta("conv_backward_filter", beta);
  const ConvDescriptors& d = conv_descriptors(p);
  check_conv("conv_backward_filter", p, x, dy, ConvKind::kBackwardFilter, algo, workspace_bytes);
  const std::string what = "conv_backward_filter " + p.str();
  const float one = 1.0f;
  VTRAIN_CUDA_CHECK(cudnnConvolutionBackwardFilter(
                        cudnn_.get(), &one, d.x.get(), x.data, d.y.get(), dy.data, d.conv.get(),
                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), workspace,
                        workspace_bytes, &beta, d.w.get(), dw),
                    what);
  if (dbias) {
    VTRAIN_CUDA_CHECK(cudnnConvolutionBackwardBias(cudnn_.get(), &one, d.y.get(), dy.data, &beta,
                                                   d.bias.get(), dbias),
                      what + " bias");
  }
}

// ----------------------------------------------------------------- eltwise

void CudaBackend::relu_forward(const Tensor& x, const Tensor& y) {
  if (!(x.desc == y.desc)) throw BackendError("relu_forward: x and y descriptors differ");
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t d = storage_desc(x.desc);  // relu(0) = 0 keeps padding zero
  VTRAIN_CUDA_CHECK(
      cudnnActivationForward(cudnn_.get(), relu_.get(), &one, d, x.data, &zero, d, y.data),
      "relu_forward " + x.shape().str());
}

void CudaBackend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  if (!(y.desc == dy.desc) || !(dy.desc == dx.desc)) {
    throw BackendError("relu_backward: y, dy and dx descriptors must match");
  }
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t d = storage_desc(y.desc);
  // y stands in for x: y > 0 exactly where x > 0. dx may alias dy (cuDNN
  // allows it with identical descriptors).
  VTRAIN_CUDA_CHECK(cudnnActivationBackward(cudnn_.get(), relu_.get(), &one, d, y.data, d, dy.data,
                                            d, y.data, &zero, d, dx.data),
                    "relu_backward " + y.shape().str());
}

void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  if (!(a.shape() == b.shape()) || !(a.shape() == y.shape())) {
    throw BackendError("add: shapes differ: " + a.shape().str() + ", " + b.shape().str() + " -> " +
                       y.shape().str());
  }
  const Layout layout = y.desc.layout;
  const size_t bytes = y.bytes();
  const size_t staging_bytes = add_staging_bytes(a.desc, b.desc, y.desc);
  float* staging = staging_bytes > 0 ? reinterpret_cast<float*>(scratch(staging_bytes)) : nullptr;
  const float* pa = in_layout(a, layout, staging);
  const float* pb =
      in_layout(b, layout, staging ? staging + align_up(bytes) / sizeof(float) : nullptr);
  cuda::add(pa, pb, y.data, y.desc.storage_elements(), compute_.get());
}

void CudaBackend::accumulate(const Tensor& x, const Tensor& y, float beta) {
  check_beta("accumulate", beta);
  if (!(x.shape() == y.shape())) {
    throw BackendError("accumulate: shapes differ: " + x.shape().str() + " vs " + y.shape().str());
  }
  if (beta == 0.0f) {
    convert(x, y);
    return;
  }
  const Layout layout = y.desc.layout;
  float* staging = x.desc.layout != layout ? reinterpret_cast<float*>(scratch(y.bytes())) : nullptr;
  cuda::accumulate(in_layout(x, layout, staging), y.data, beta, y.desc.storage_elements(),
                   compute_.get());
}

void CudaBackend::scale(float* x, int64_t count, float alpha) {
  cuda::scale(x, alpha, count, compute_.get());
}

void CudaBackend::sgd_update(float* w, const float* g, float* velocity, int64_t count,
                             const SgdStep& step) {
  cuda::sgd_update(w, g, velocity, count, step.lr, step.momentum, step.weight_decay,
                   compute_.get());
}

// ----------------------------------------------------------------- pooling

void CudaBackend::pooling_forward(const PoolParams& p, const Tensor& x, const Tensor& y, void*) {
  require_plain("pooling_forward", x.desc);
  require_plain("pooling_forward", y.desc);
  const float one = 1.0f, zero = 0.0f;
  VTRAIN_CUDA_CHECK(cudnnPoolingForward(cudnn_.get(), pool_desc(p), &one, tensor_desc(x.shape()),
                                        x.data, &zero, tensor_desc(y.shape()), y.data),
                    "pooling_forward " + x.shape().str() + " -> " + y.shape().str());
}

void CudaBackend::pooling_backward(const PoolParams& p, const Tensor& x, const Tensor& y,
                                   const Tensor& dy, const Tensor& dx, const void*) {
  for (const Tensor* t : {&x, &y, &dy, &dx}) require_plain("pooling_backward", t->desc);
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t xd = tensor_desc(x.shape()), yd = tensor_desc(y.shape());
  VTRAIN_CUDA_CHECK(cudnnPoolingBackward(cudnn_.get(), pool_desc(p), &one, yd, y.data, yd, dy.data,
                                         xd, x.data, &zero, xd, dx.data),
                    "pooling_backward " + x.shape().str() + " <- " + y.shape().str());
}

// ----------------------------------------------------------- inner product

namespace {

void check_fc_output(const char* op, const Tensor& y) {
  if (y.desc.layout != Layout::kPlain || y.shape().h != 1 || y.shape().w != 1) {
    throw BackendError(std::string("cuda backend: ") + op +
                       ": the output must be plain {n, out, 1, 1}, got " + y.shape().str() + " " +
                       layout_name(y.desc.layout));
  }
}

}  // namespace

// cuBLAS is column-major: a row-major {rows, cols} matrix is its transpose.
// So row-major y{n, out} = x{n, in} w{out, in}^T is, column-major,
// y^T(out x n) = W^T * X where W = w^T (in x out) and X = x^T (in x n).
void CudaBackend::inner_product_forward(const Tensor& x, const float* w, const float* bias,
                                        const Tensor& y) {
  check_fc_output("inner_product_forward", y);
  require_plain("inner_product_forward", x.desc);
  const std::string what = "inner_product_forward " + x.shape().str() + " -> " + y.shape().str();
  if (x.shape().n != y.shape().n) throw BackendError(what + ": batch sizes differ");
  const int n = to_int(x.shape().n, what), in = to_int(x.shape().per_sample(), what),
            out = to_int(y.shape().c, what);
  const float one = 1.0f, zero = 0.0f;
  VTRAIN_CUDA_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, in,
                                x.data, in, &zero, y.data, out),
                    what);
  if (bias) {
    VTRAIN_CUDA_CHECK(cudnnAddTensor(cudnn_.get(), &one, tensor_desc(1, out, 1, 1), bias, &one,
                                     tensor_desc(y.shape()), y.data),
                      what + " bias");
  }
}

void CudaBackend::inner_product_backward_data(const Tensor& dy, const float* w, const Tensor& dx) {
  check_fc_output("inner_product_backward_data", dy);
  require_plain("inner_product_backward_data", dx.desc);
  const std::string what =
      "inner_product_backward_data " + dx.shape().str() + " <- " + dy.shape().str();
  if (dx.shape().n != dy.shape().n) throw BackendError(what + ": batch sizes differ");
  const int n = to_int(dx.shape().n, what), in = to_int(dx.shape().per_sample(), what),
            out = to_int(dy.shape().c, what);
  const float one = 1.0f, zero = 0.0f;
  // dx^T(in x n) = W^T(in x out) * dy^T(out x n)
  VTRAIN_CUDA_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, w, in,
                                dy.data, out, &zero, dx.data, in),
                    what);
}

void CudaBackend::inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw,
                                                 float* dbias, float beta) {
  check_fc_output("inner_product_backward_weights", dy);
  require_plain("inner_product_backward_weights", x.desc);
  check_beta("inner_product_backward_weights", beta);
  const std::string what =
      "inner_product_backward_weights " + x.shape().str() + " / " + dy.shape().str();
  if (x.shape().n != dy.shape().n) throw BackendError(what + ": batch sizes differ");
  const int n = to_int(x.shape().n, what), in = to_int(x.shape().per_sample(), what),
            out = to_int(dy.shape().c, what);
  const float one = 1.0f;
  // dW^T(in x out) = x^T(in x n) * dy(n x out)
  VTRAIN_CUDA_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x.data,
                                in, dy.data, out, &beta, dw, in),
                    what);
  if (dbias) {
    VTRAIN_CUDA_CHECK(
        cudnnConvolutionBackwardBias(cudnn_.get(), &one, tensor_desc(dy.shape()), dy.data, &beta,
                                     tensor_desc(1, out, 1, 1), dbias),
        what + " bias");
  }
}

// -------------------------------------------------------------- batch norm

// cuDNN saves 1 / sqrt(var + eps) for backward; the contract (and the CPU
// backend) keeps the biased batch variance, so it is converted both ways.
void CudaBackend::batch_norm_forward_training(const Tensor& x, const Tensor& y,
                                              const float* scale_shift, float* save_mean,
                                              float* save_var, float* running_mean,
                                              float* running_var, float momentum, float eps) {
  if (!(x.desc == y.desc)) throw BackendError("batch_norm_forward_training: x and y differ");
  require_plain("batch_norm_forward_training", x.desc);
  const int64_t c = x.shape().c;
  const std::string what = "batch_norm_forward_training " + x.shape().str();
  float* inv_std = reinterpret_cast<float*>(scratch(bn_inverse_std_bytes(c)));
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t xd = tensor_desc(x.shape());
  // cuDNN's running update is running = (1 - factor) * running + factor *
  // batch with the unbiased variance: the contract's, with factor = momentum.
  VTRAIN_CUDA_CHECK(cudnnBatchNormalizationForwardTraining(
                        cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, x.data, xd, y.data,
                        tensor_desc(1, c, 1, 1), scale_shift, scale_shift + c, momentum,
                        running_mean, running_var, eps, save_mean, inv_std),
                    what);
  inverse_std_to_variance(inv_std, save_var, c, eps, compute_.get());
}

void CudaBackend::batch_norm_forward_inference(const Tensor& x, const Tensor& y,
                                               const float* scale_shift, const float* running_mean,
                                               const float* running_var, float eps) {
  if (!(x.desc == y.desc)) throw BackendError("batch_norm_forward_inference: x and y differ");
  require_plain("batch_norm_forward_inference", x.desc);
  const int64_t c = x.shape().c;
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t xd = tensor_desc(x.shape());
  VTRAIN_CUDA_CHECK(
      cudnnBatchNormalizationForwardInference(
          cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, x.data, xd, y.data,
          tensor_desc(1, c, 1, 1), scale_shift, scale_shift + c, running_mean, running_var, eps),
      "batch_norm_forward_inference " + x.shape().str());
}

void CudaBackend::batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                      const float* save_mean, const float* save_var,
                                      const Tensor& dx, float* dscale_shift, float beta,
                                      float eps) {
  check_beta("batch_norm_backward", beta);
  if (!(x.desc == dy.desc) || !(x.desc == dx.desc)) {
    throw BackendError("batch_norm_backward: x, dy and dx descriptors must match");
  }
  require_plain("batch_norm_backward", x.desc);
  const int64_t c = x.shape().c;
  float* inv_std = reinterpret_cast<float*>(scratch(bn_inverse_std_bytes(c)));
  variance_to_inverse_std(save_var, inv_std, c, eps, compute_.get());
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t xd = tensor_desc(x.shape());
  VTRAIN_CUDA_CHECK(cudnnBatchNormalizationBackward(
                        cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &beta, xd, x.data,
                        xd, dy.data, xd, dx.data, tensor_desc(1, c, 1, 1), scale_shift,
                        dscale_shift, dscale_shift + c, eps, save_mean, inv_std),
                    "batch_norm_backward " + x.shape().str());
}

// ------------------------------------------------------------ concat, loss

void CudaBackend::concat_forward(std::span<const Tensor> xs, const Tensor& y) {
  require_plain("concat_forward", y.desc);
  const Shape ys = y.shape();
  int64_t channels = 0;
  for (const Tensor& x : xs) {
    require_plain("concat_forward", x.desc);
    if (x.shape().n != ys.n || x.shape().h != ys.h || x.shape().w != ys.w) {
      throw BackendError("concat: input " + x.shape().str() + " does not fit output " + ys.str());
    }
    channels += x.shape().c;
  }
  if (channels != ys.c) {
    throw BackendError("concat: inputs have " + std::to_string(channels) + " channels, output " +
                       std::to_string(ys.c));
  }
  const int64_t hw = ys.h * ys.w;
  int64_t offset = 0;
  for (const Tensor& x : xs) {
    const int64_t part = x.shape().c * hw;
    copy_rows(x.data, part, y.data + offset * hw, ys.c * hw, ys.n, part, 0.0f, compute_.get());
    offset += x.shape().c;
  }
}

void CudaBackend::concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx,
                                  float beta) {
  check_beta("concat_backward", beta);
  require_plain("concat_backward", dy.desc);
  require_plain("concat_backward", dx.desc);
  const Shape ys = dy.shape();
  const Shape xs = dx.shape();
  if (xs.n != ys.n || xs.h != ys.h || xs.w != ys.w || channel_offset < 0 ||
      channel_offset + xs.c > ys.c) {
    throw BackendError("concat_backward: slice " + xs.str() + " at channel " +
                       std::to_string(channel_offset) + " does not fit " + ys.str());
  }
  const int64_t hw = ys.h * ys.w;
  copy_rows(dy.data + channel_offset * hw, ys.c * hw, dx.data, xs.c * hw, ys.n, xs.c * hw, beta,
            compute_.get());
}

LossStats CudaBackend::softmax_cross_entropy(const Tensor& logits, const int32_t* labels,
                                             float scale, const Tensor* dlogits) {
  if (logits.desc.layout != Layout::kPlain || (dlogits && dlogits->desc.layout != Layout::kPlain)) {
    throw BackendError("softmax_cross_entropy: logits must be plain {n, classes, 1, 1}");
  }
  const int64_t n = logits.shape().n;
  const int64_t k = logits.shape().per_sample();
  if (dlogits && !(dlogits->shape() == logits.shape())) {
    throw BackendError("softmax_cross_entropy: dlogits " + dlogits->shape().str() +
                       " does not match logits " + logits.shape().str());
  }
  if (n == 0) return {};
  // Per-row results (loss, correct) and the bad-label flag, read back at once.
  const size_t loss_bytes = static_cast<size_t>(n) * sizeof(double);
  const size_t result_bytes = softmax_result_bytes(n);
  char* device = scratch(result_bytes);
  auto* loss = reinterpret_cast<double*>(device);
  auto* correct = reinterpret_cast<int32_t*>(device + loss_bytes);
  int32_t* bad = correct + n;
  const std::string what = "softmax_cross_entropy " + logits.shape().str();
  VTRAIN_CUDA_CHECK(cudaMemsetAsync(bad, 0, 2 * sizeof(int32_t), compute_.get()), what);
  cuda::softmax_cross_entropy(logits.data, labels, n, k, scale, dlogits ? dlogits->data : nullptr,
                              loss, correct, bad, compute_.get());
  char* host = pinned_staging(result_bytes);
  VTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(host, device, result_bytes, cudaMemcpyDeviceToHost, compute_.get()), what);
  sync_compute(what);
  const auto* host_loss = reinterpret_cast<const double*>(host);
  const auto* host_correct = reinterpret_cast<const int32_t*>(host + loss_bytes);
  if (host_correct[n] != 0) {
    throw BackendError("softmax_cross_entropy: label " + std::to_string(host_correct[n + 1]) +
                       " outside [0, " + std::to_string(k) + ")");
  }
  LossStats stats;
  for (int64_t i = 0; i < n; ++i) {  // in row order, as the CPU backend sums
    stats.loss_sum += host_loss[i];
    stats.correct += host_correct[i];
  }
  return stats;
}

// ------------------------------------------------------------------ access

DeviceStreams device_streams(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) {
    throw BackendError("the NCCL communicator needs the cuda backend, got '" +
                       backend.device_info().backend + "'");
  }
  return cuda->streams();
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count < 1) {
    cudaGetLastError();
    const std::string reason =
        status != cudaSuccess ? std::string("CUDA: ") + cudaGetErrorString(status) : "0 devices";
    throw BackendError("backend 'cuda': no CUDA GPU is visible (" + reason +
                       "); use device.backend cpu or auto (known: auto, cpu, cuda)");
  }
  return std::make_unique<CudaBackend>(options);
}

int cuda_device_count() {
  int count = 0;
  // Without libcuda.so the runtime reports cudaErrorInsufficientDriver here.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

bool cuda_device_visible() { return cuda_device_count() > 0; }

}  // namespace vtrain::worker::cuda
