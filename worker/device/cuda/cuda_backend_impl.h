// Internal to the CUDA backend (worker/device/cuda/*.cpp): the CudaBackend
// class, RAII for the CUDA, cuDNN and cuBLAS handles, and the helpers its op
// files share. Each op family lives in its own file: cuda_backend.cpp
// (lifecycle, memory, streams, transfers), cuda_conv.cpp (descriptors and
// convolutions), cuda_eltwise_pool.cpp (relu, add, SGD, pooling, concat),
// cuda_inner_product.cpp (with the loss), cuda_batch_norm.cpp.
//
// All ops run on one compute stream (cuDNN's and cuBLAS's handles are bound
// to it); the memory stream carries copy_async only. Convolutions use the
// caller's workspace; the few ops that need temporary device memory (layout
// staging, batch-norm statistics, loss results) share one backend-owned
// scratch buffer that is counted as device memory, as in the CPU backend.
// cuDNN descriptors are created once per shape and cached.
#pragma once

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

// A tensor's elements as floats: this backend runs f32 tensors only so far
// (precision_unavailable refuses the half precisions; tf32 keeps f32
// tensors), and throws naming the tensor for any other.
inline float* f32(const Tensor& t) { return t.f32("cuda backend (f32 only)"); }

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

inline size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

inline int to_int(int64_t value, const std::string& what) {
  if (value < 0 || value > INT_MAX) {
    throw BackendError("cuda backend: " + what + " = " + std::to_string(value) +
                       " does not fit cuDNN's / cuBLAS's int");
  }
  return static_cast<int>(value);
}

// check_beta and check_same_desc (backend.h) for this backend.
inline void check_beta(const char* op, float beta) { worker::check_beta("cuda backend", op, beta); }
inline void check_same_desc(const char* op,
                            std::initializer_list<std::pair<const char*, TensorDesc>> tensors) {
  worker::check_same_desc("cuda backend", op, tensors);
}

// The ops built on cuDNN descriptors take plain NCHW (see cuda_backend.h).
inline void require_plain(const char* op, const TensorDesc& d) {
  if (d.layout != Layout::kPlain) {
    throw BackendError(std::string("cuda backend: ") + op + ": tensor " + d.shape.str() +
                       " is in layout " + layout_name(d.layout) +
                       "; this backend takes activations in its preferred layout, plain NCHW");
  }
}

inline BlockedShape blocked(const TensorDesc& d) {
  return {d.shape.n, d.shape.c, d.shape.h, d.shape.w, channel_block(d.layout)};
}

// ConvAlgo ids from here on name TF32 tensor-core variants of cuDNN's
// algorithms (cuDNN's number + kTf32Variant, named with
// kTf32AlgorithmSuffix), offered under train.precision tf32 only.
constexpr ConvAlgo kTf32Variant = 1000;

// cuDNN descriptors of one convolution problem.
struct ConvDescriptors {
  TensorDescriptor x, y, bias;
  FilterDescriptor w;
  ConvDescriptor conv;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  DeviceInfo device_info() const override { return info_; }
  std::optional<std::string> precision_unavailable(common::Precision precision) const override {
    if (precision == common::Precision::kFp32) return std::nullopt;
    if (precision == common::Precision::kTf32) {
      if (compute_capability_ >= 80) return std::nullopt;
      return "train.precision tf32 needs TF32 tensor cores (compute capability 8.0, Ampere, or "
             "newer); " + info_.name + " is sm_" + std::to_string(compute_capability_);
    }
    return std::string("train.precision ") + common::precision_name(precision) +
           " is not implemented in the CUDA backend yet (it trains in fp32 or tf32)";
  }
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
  void begin_compute_span() override;
  double end_compute_span_ms() override;
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
  void conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const void* w,
                    const void* bias, const Tensor& y, float beta, void* workspace,
                    size_t workspace_bytes) override;
  void conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy, const void* w,
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
  void inner_product_forward(const Tensor& x, const void* w, const void* bias,
                             const Tensor& y) override;
  void inner_product_backward_data(const Tensor& dy, const void* w, const Tensor& dx) override;
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
  std::vector<double> batch_norm_sums(const Tensor& x) override;
  std::vector<double> batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                               const float* mean, const float* var,
                                               float eps) override;
  void batch_norm_backward_data(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                const float* mean, const float* var, const float* dy_means,
                                const Tensor& dx, float eps) override;
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
  bool all_finite(const float* x, int64_t count) override;

  // cuDNN's activation, pooling and the cuBLAS inner products need no
  // scratch; concat copies in place.
  size_t relu_scratch_bytes(const TensorDesc&) override { return 0; }
  size_t pooling_scratch_bytes(const PoolParams&, const TensorDesc&, const TensorDesc&) override {
    return 0;
  }
  size_t inner_product_scratch_bytes(const TensorDesc&, int64_t, bool) override { return 0; }
  size_t batch_norm_scratch_bytes(const TensorDesc& x, float) override {
    return std::max(bn_inverse_std_bytes(x.shape.c), bn_sums_bytes(x.shape.c));
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
  // The synchronised ops' per-channel sums (two doubles per channel).
  static size_t bn_sums_bytes(int64_t channels) {
    return 2 * static_cast<size_t>(channels) * sizeof(double);
  }
  // Reads back the 2C sums a kernel wrote to `device` (synchronises).
  std::vector<double> read_bn_sums(const double* device, int64_t channels,
                                   const std::string& what);
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
  // `d`'s math for the algorithm `algo` (ConvAlgo ids from kTf32Variant on
  // are TF32 tensor-core variants: CUDNN_DEFAULT_MATH; the others
  // CUDNN_FMA_MATH); returns cuDNN's own algorithm number. Throws for a
  // TF32 variant when the backend was not made for tf32.
  int set_conv_math(const ConvDescriptors& d, ConvKind kind, ConvAlgo algo);
  // The algorithms cuDNN's heuristic ranks first-to-last for `d` in the
  // descriptor's current math (TF32 or FMA, as `tf32` says), those with a
  // failure status or another math left out.
  std::vector<int> ranked_algorithms(ConvKind kind, const ConvDescriptors& d, bool tf32,
                                     const std::string& what);
  cudnnPoolingDescriptor_t pool_desc(const PoolParams& p);
  void check_conv(const char* op, const ConvProblem& p, const Tensor& x, const Tensor& y,
                  ConvKind kind, ConvAlgo algo, size_t workspace_bytes);
  // A tensor's contents in `layout`: itself, or a reordered copy at `staging`.
  const float* in_layout(const Tensor& t, Layout layout, float* staging);

  DeviceInfo info_;
  int device_ = 0;
  int compute_capability_ = 0;  // major * 10 + minor
  bool tf32_ = false;           // BackendOptions::precision is tf32
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
  CudaEvent span_start_, span_end_;  // timing events of the compute span, made on first use
  bool span_open_ = false;

  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  char* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;

  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, TensorDescriptor> tensor_descs_;
  std::unordered_map<std::string, ConvDescriptors> conv_descs_;
  std::unordered_map<std::string, PoolDescriptor> pool_descs_;
  std::unordered_map<std::string, size_t> conv_workspaces_;
};

}  // namespace vtrain::worker::cuda
