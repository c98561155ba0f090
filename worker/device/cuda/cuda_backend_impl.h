// Internal to the CUDA backend (worker/device/cuda/*.cpp): the CudaBackend
// class, RAII for the CUDA, cuDNN and cuBLAS handles, and the helpers its op
// files share. Each op family lives in its own file: cuda_backend.cpp
// (lifecycle, memory, streams, transfers), cuda_conv.cpp (descriptors and
// convolutions), cuda_eltwise_pool.cpp (relu, add, SGD, pooling, concat),
// cuda_mul.cpp (mul, mul_sum), cuda_inner_product.cpp (with the loss),
// cuda_batch_norm.cpp, cuda_dropout.cpp.
//
// All ops run on one compute stream (cuDNN's and cuBLAS's handles are bound
// to it); the memory stream carries copy_async only. Convolutions use the
// caller's workspace; the few ops that need temporary device memory (layout
// staging, batch-norm statistics, loss results) share one backend-owned
// scratch buffer that is counted as device memory, as in the CPU backend.
// cuDNN descriptors are created once per shape and element type and cached.
//
// Element types: every op takes f32, bf16 or f16 tensors, one type per call
// (call_type()); cuDNN descriptors carry the type (cudnn_type()), cuBLAS
// runs half GEMMs through cublasGemmEx with f32 accumulation, and the
// kernels of cuda_kernels.h are templated on it. See cuda_backend.h for
// what each op does per type.
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
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "worker/device/cuda/cuda_check.h"
#include "worker/device/cuda/cuda_device.h"
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/op_table.h"

namespace vtrain::worker::cuda {

// cuDNN's name for a tensor's element type.
inline cudnnDataType_t cudnn_type(DataType type) {
  switch (type) {
    case DataType::kF32: return CUDNN_DATA_FLOAT;
    case DataType::kBF16: return CUDNN_DATA_BFLOAT16;
    case DataType::kF16: return CUDNN_DATA_HALF;
  }
  return CUDNN_DATA_FLOAT;
}

// The kernels' (cuda_kernels.h) name for it.
inline Element element(DataType type) {
  switch (type) {
    case DataType::kF32: return Element::kF32;
    case DataType::kBF16: return Element::kBF16;
    case DataType::kF16: return Element::kF16;
  }
  return Element::kF32;
}

// cuBLAS's (CUDA's) name for it.
inline cudaDataType_t cublas_type(DataType type) {
  switch (type) {
    case DataType::kF32: return CUDA_R_32F;
    case DataType::kBF16: return CUDA_R_16BF;
    case DataType::kF16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// Pointer arithmetic in elements of `type`.
inline void* element_at(void* base, int64_t index, DataType type) {
  return static_cast<char*>(base) + index * static_cast<int64_t>(element_bytes(type));
}

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

// The ops built on cuDNN descriptors take NCHW or NHWC (see cuda_backend.h).
inline void require_cudnn_layout(const char* op, const TensorDesc& d) {
  if (d.layout != Layout::kPlain && d.layout != Layout::kNhwc) {
    throw BackendError(std::string("cuda backend: ") + op + ": tensor " + d.shape.str() +
                       " is in layout " + layout_name(d.layout) +
                       "; this backend takes activations in NCHW (plain) or NHWC");
  }
}

inline bool channels_last(const TensorDesc& d) { return d.layout == Layout::kNhwc; }

// cuDNN's format of a tensor (require_cudnn_layout first) and of the
// filters of a convolution whose activations are in `layout` (NHWC
// activations take KRSC filters, as cuDNN's tensor-core kernels want).
inline cudnnTensorFormat_t cudnn_format(Layout layout) {
  return layout == Layout::kNhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
}

inline BlockedShape blocked(const TensorDesc& d) {
  return {d.shape.n, d.shape.c, d.shape.h, d.shape.w, channel_block(d)};
}

// ------------------------------------------------- convolution variants

// A ConvAlgo id is cuDNN's algorithm number + kVariantStride * the variant
// it runs in: the tensors' element type, the convolution descriptor's
// compute type and its math type (mu-cuDNN's configurations, each offered
// as algorithms of their own so that the profiler times them and WR / WD
// choose among all), named with backend.h's suffixes:
enum class ConvVariant : int {
  kFma = 0,         // f32 tensors and compute, FMA math: "<name>"
  kTf32 = 1,        // f32 tensors on TF32 tensor cores: "<name>/tf32" (tf32 backends only)
  kPseudoHalf = 2,  // f16 tensors, f32 compute (PSEUDO_HALF_CONFIG): "<name>/pseudo_half"
  kTrueHalf = 3,    // f16 tensors, f16 compute (TRUE_HALF_CONFIG): "<name>/true_half"
  kPseudoBf16 = 4,  // bf16 tensors, f32 compute (PSEUDO_BFLOAT16_CONFIG): "<name>/pseudo_bf16"
};
constexpr ConvAlgo kVariantStride = 1000;

struct ConvVariantInfo {
  ConvVariant variant;
  DataType tensors;           // the element type of x, w, y (and dx, dy, dw in cuDNN)
  const char* suffix;         // appended to cuDNN's algorithm name
  cudnnDataType_t compute;    // the convolution descriptor's compute type
  cudnnMathType_t math;       // cudnnSetConvolutionMathType
};

// Every variant, in the order conv_algorithms() lists them for a type.
inline constexpr ConvVariantInfo kConvVariants[] = {
    {ConvVariant::kFma, DataType::kF32, "", CUDNN_DATA_FLOAT, CUDNN_FMA_MATH},
    {ConvVariant::kTf32, DataType::kF32, kTf32AlgorithmSuffix.data(), CUDNN_DATA_FLOAT,
     CUDNN_DEFAULT_MATH},
    {ConvVariant::kPseudoHalf, DataType::kF16, kPseudoHalfAlgorithmSuffix.data(),
     CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH},
    {ConvVariant::kTrueHalf, DataType::kF16, kTrueHalfAlgorithmSuffix.data(), CUDNN_DATA_HALF,
     CUDNN_TENSOR_OP_MATH},
    {ConvVariant::kPseudoBf16, DataType::kBF16, kPseudoBf16AlgorithmSuffix.data(),
     CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH},
};

// The variant of a ConvAlgo id, or null for an id of no variant.
inline const ConvVariantInfo* conv_variant(ConvAlgo algo) {
  if (algo < 0) return nullptr;
  for (const ConvVariantInfo& v : kConvVariants) {
    if (algo / kVariantStride == static_cast<ConvAlgo>(v.variant)) return &v;
  }
  return nullptr;
}

// ------------------------------------- cuDNN graph-API convolution engines
//
// Under BackendOptions::cudnn_graph, half convolutions (the three half
// variants above) are also offered as the engine configurations that the
// heuristics of cuDNN's graph API (mode A) rank first for the problem
// (BackendOptions::graph_engines of them per variant that finalize), each
// an algorithm of its own: named "eng<global index>[_k<knob>=<value>...]"
// and the variant's suffix (cudnn-frontend's tag), id kGraphAlgoBase + its
// place in the backend's registry (ids are per process; names are what
// the perf DB and plans keep). The legacy API's algorithm enums reach
// fewer kernels than the graph API's engines: vtrain's bf16 ResNet-50 and
// VGG-16 at 224x224 trailed PyTorch AMP, which uses the graph API, 2-2.6x
// on an H100. Engines that compile at run time are left out (their first
// plan takes seconds, per problem), and for the f32-compute variants those
// whose reductions round to half.
constexpr ConvAlgo kGraphAlgoBase = 1'000'000;

// cuDNN backend descriptors (cudnnBackendDescriptor_t is a void*).
struct BackendDescriptorDeleter {
  void operator()(void* d) const { cudnnBackendDestroyDescriptor(d); }
};
using BackendDescriptor = std::unique_ptr<void, BackendDescriptorDeleter>;

struct GraphEngine {
  ConvKind kind = ConvKind::kForward;
  const ConvVariantInfo* variant = nullptr;
  int64_t global_index = 0;
  std::vector<std::pair<int64_t, int64_t>> knobs;  // (cudnnBackendKnobType_t, value)
  std::string name;
};

// One engine configuration finalized for one problem, layout and beta,
// with every descriptor it was made of (kept alive with it, as
// cudnn-frontend keeps them).
struct GraphPlan {
  std::deque<BackendDescriptor> parts;  // tensors, convolution, operation, graph, engine, ...
  BackendDescriptor plan;  // null where cuDNN refused it: `refused` says why
  size_t workspace = 0;
  int64_t alignment = 16;  // the bytes every tensor's address must be a multiple of
  std::string refused;
};

// The layout a convolution call runs in: its output's (forward: y;
// backward data: dx; backward filter: dy, which is y's). An input in
// another layout is reordered into it first.
inline Layout conv_layout(ConvKind kind, const ConvProblem& p) {
  return kind == ConvKind::kBackwardData ? p.x.layout : p.y.layout;
}

// What a convolution call's workspace holds before cuDNN's part, in this
// order (each part 256-byte aligned):
//  - dw: backward filter, where cuDNN cannot write the contract's f32 KCRS
//    dw itself: half tensors (cuDNN writes dw in the filter's type) or NHWC
//    (KRSC filters); cuDNN's dw, added to the caller's with its beta;
//  - dw_f32: backward filter in NHWC: that dw reordered to KCRS in f32;
//  - filter: forward and backward data in NHWC: w reordered to KRSC;
//  - input: the input in another layout than the call's (x, or dy for
//    backward data), reordered;
//  - bias_partials: backward filter with a dw staging: the bias gradient's
//    partial sums (cuda::bias_gradient; cuDNN's bias gradient serves the
//    f32 NCHW calls).
struct ConvStaging {
  size_t dw = 0, dw_f32 = 0, filter = 0, input = 0, bias_partials = 0;
  size_t dw_f32_offset() const { return dw; }
  size_t filter_offset() const { return dw + dw_f32; }
  size_t input_offset() const { return dw + dw_f32 + filter; }
  size_t bias_partials_offset() const { return dw + dw_f32 + filter + input; }
  size_t total() const { return dw + dw_f32 + filter + input + bias_partials; }
};
inline ConvStaging conv_staging(ConvKind kind, const ConvProblem& p) {
  const Layout layout = conv_layout(kind, p);
  const DataType type = p.x.dtype;
  const size_t weights = static_cast<size_t>(p.weight_shape().elements());
  const bool nhwc = layout == Layout::kNhwc;
  ConvStaging s;
  if (kind == ConvKind::kBackwardFilter) {
    if (type != DataType::kF32 || nhwc) {
      s.dw = align_up(weights * element_bytes(type));
      const Shape& y = p.y.shape;
      s.bias_partials = align_up(static_cast<size_t>(
          bias_gradient_partial_bytes(y.n, y.c, y.h * y.w, channels_last(p.y))));
    }
    if (nhwc) s.dw_f32 = align_up(weights * sizeof(float));
  } else if (nhwc) {
    s.filter = align_up(weights * element_bytes(type));
  }
  const TensorDesc& input = kind == ConvKind::kBackwardData ? p.y : p.x;
  if (input.layout != layout) s.input = align_up(TensorDesc{input.shape, layout, type}.bytes());
  return s;
}

// cuDNN descriptors of one convolution problem, in its element type.
struct ConvDescriptors {
  TensorDescriptor x, y, bias;  // bias {1, k, 1, 1} (the forward bias, in the tensors' type)
  FilterDescriptor w;           // w (KCRS, or KRSC for NHWC activations) and a staged dw
  ConvDescriptor conv;          // compute type f32 (every variant but kTrueHalf)
  ConvDescriptor conv_true_half;  // compute type f16: f16 problems only
};

// A convolution call's cuDNN arguments for one ConvAlgo id.
struct ConvCall {
  int algo = 0;                                // cuDNN's algorithm number
  cudnnConvolutionDescriptor_t conv = nullptr;  // with the variant's compute and math type
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  DeviceInfo device_info() const override { return info_; }
  std::optional<std::string> precision_unavailable(common::Precision precision) const override;
  DeviceStreams streams() const { return {device_, compute_.get()}; }

  void* allocate_device(size_t bytes) override;
  void free_device(void* ptr) override;
  size_t allocation_bytes(size_t bytes) const override {
    return align_up(std::max<size_t>(bytes, 1));
  }
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
  Layout preferred_layout(int64_t channels) const override { return layout_rule_(channels); }

  Event record_event(StreamKind stream) override;
  void wait_event(StreamKind stream, const Event& event) override;
  void synchronize(const Event& event) override;
  void synchronize(StreamKind stream) override;
  void begin_compute_span() override;
  double end_compute_span_ms() override;
  void copy_async(void* dst, const void* src, size_t bytes, StreamKind stream) override;

  void upload(const float* host, const Tensor& dst) override;
  void download(const Tensor& src, float* host) override;
  // Whether `host` is page-locked memory CUDA knows (allocate_pinned's).
  static bool is_pinned(const void* host);
  void convert(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;
  void upload_labels(const int32_t* host, int32_t* device, int64_t count) override;

  // The op surface (backend.h): descriptors to the kernels below (op_table.h).
  std::optional<std::string> supports(const OpDesc& op) const override {
    return dtype_unsupported(*this, op);
  }
  // A convolution's bias is a pass over the activations each way here (as
  // the relu after it is): the bias-paired relu saves one. No other fused
  // form is preferred.
  bool prefers(const OpDesc& op) const override {
    const auto* activation = std::get_if<ActivationDesc>(&op);
    return activation && activation->bias;
  }
  OpBytes scratch_bytes(const OpDesc& op) override { return op_bytes(*this, op); }
  void run(const OpDesc& op, const OpArgs& args) override;
  std::vector<ConvAlgoInfo> conv_algorithms(const ConvDesc& op) override;
  std::string conv_algorithm_name(ConvKind kind, ConvAlgo algo) const override;

  // The kernels, one per descriptor kind (op_table.h names them).
  size_t conv_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p, bool accumulate);
  void conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const void* w,
                    const void* bias, const Tensor& y, float beta, void* workspace,
                    size_t workspace_bytes);
  void conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy, const void* w,
                          const Tensor& dx, float beta, void* workspace, size_t workspace_bytes);
  void conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const Tensor& dy,
                            float* dw, float* dbias, float beta, void* workspace,
                            size_t workspace_bytes);

  void relu_forward(const Tensor& x, const Tensor& y);
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);
  void bias_relu_forward(const Tensor& x, const void* bias, const Tensor& y);
  void relu_backward_bias(const Tensor& y, const Tensor& dy, const Tensor& dx, float* dbias);
  // silu, gelu, sigmoid, relu6 (our elementwise kernels; backward reads x).
  void activation_forward(ActivationKind kind, const Tensor& x, const Tensor& y);
  void activation_backward(ActivationKind kind, const Tensor& x, const Tensor& dy,
                           const Tensor& dx);
  size_t activation_scratch_bytes(ActivationKind, const TensorDesc&) { return 0; }
  size_t pooling_state_bytes(const PoolDesc&, const TensorDesc&, const TensorDesc&) {
    return 0;  // cuDNN's pooling backward recomputes the maxima from x and y
  }
  void pooling_forward(const PoolDesc& p, const Tensor& x, const Tensor& y, void* state);
  void pooling_backward(const PoolDesc& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& dx, const void* state);
  void inner_product_forward(const Tensor& x, const void* w, const void* bias, const Tensor& y);
  void inner_product_backward_data(const Tensor& dy, const void* w, const Tensor& dx);
  void inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw, float* dbias,
                                      float beta);
  void batch_norm_forward_training(const Tensor& x, const Tensor& y, const float* scale_shift,
                                   float* save_mean, float* save_var, float* running_mean,
                                   float* running_var, float momentum, float eps);
  void batch_norm_forward_inference(const Tensor& x, const Tensor& y, const float* scale_shift,
                                    const float* running_mean, const float* running_var, float eps);
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                           const float* save_mean, const float* save_var, const Tensor& dx,
                           float* dscale_shift, float beta, float eps);
  std::vector<double> batch_norm_sums(const Tensor& x);
  std::vector<double> batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                               const float* mean, const float* var, float eps);
  void batch_norm_backward_data(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                const float* mean, const float* var, const float* dy_means,
                                const Tensor& dx, float eps);
  void add(const Tensor& a, const Tensor& b, const Tensor& y);
  void accumulate(const Tensor& x, const Tensor& y, float beta);
  // kMul and kMulSum in our kernels (cuda_mul.cpp).
  void mul(const Tensor& a, const Tensor& b, const Tensor& y, float beta);
  void mul_sum(const Tensor& a, const Tensor& b, const Tensor& y, float beta);
  static size_t mul_scratch_bytes(BinaryKind kind, const TensorDesc& a, const TensorDesc& b,
                                  const TensorDesc& y);
  void concat_forward(std::span<const Tensor> xs, const Tensor& y);
  void concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx, float beta);
  LossStats softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float scale,
                                  const Tensor* dlogits, float label_smoothing = 0.0f);
  void sgd_update(float* w, const float* g, float* velocity, int64_t count, const SgdStep& step);
  void adamw_update(float* w, const float* g, float* m, float* v, int64_t count,
                    const AdamWStep& step);
  void moving_average(float* average, const float* x, int64_t count, float decay);
  std::vector<double> sum_squares(const float* x, std::span<const int64_t> offsets);
  void scale(float* x, int64_t count, float alpha);
  bool all_finite(const float* x, int64_t count);
  // cuda_dropout.cpp: forward x -> y or backward dy -> dx (op_table.h).
  void dropout(const DropoutDesc& d, const Tensor& in, const Tensor& out);

  // relu needs none; relu_backward_bias the partial sums of its bias
  // gradient. cuDNN's pooling needs none.
  size_t relu_scratch_bytes(const TensorDesc& x) {
    const Shape& s = x.shape;
    return static_cast<size_t>(bias_gradient_partial_bytes(s.n, s.c, s.h * s.w, channels_last(x)));
  }
  size_t pooling_scratch_bytes(const PoolDesc&, const TensorDesc&, const TensorDesc&) {
    return 0;
  }
  size_t inner_product_scratch_bytes(const TensorDesc& x, int64_t out, bool bias);
  size_t batch_norm_scratch_bytes(const TensorDesc& x, float) {
    return std::max(bn_call_bytes(x.shape.c, bn_persistent_workspace(x)), bn_sums_call_bytes(x));
  }
  size_t add_scratch_bytes(const TensorDesc& a, const TensorDesc& b, const TensorDesc& y) {
    return add_staging_bytes(a, b, y);
  }
  // An input in another layout than y is reordered in the scratch (forward);
  // its gradient goes through two copies (backward, concat_backward).
  size_t concat_scratch_bytes(std::span<const TensorDesc> xs, const TensorDesc& y) {
    size_t bytes = 0;
    for (const TensorDesc& x : xs) {
      if (x.layout != y.layout) bytes = std::max(bytes, 2 * align_up(x.bytes()));
    }
    return bytes;
  }
  size_t softmax_scratch_bytes(const TensorDesc& logits) {
    return softmax_result_bytes(logits.shape.n);
  }
  size_t sum_squares_scratch_bytes(size_t segments);
  void reserve_scratch(size_t bytes) override { scratch(bytes); }
  size_t scratch_reserved() const override { return scratch_bytes_; }

 private:
  // Batch norm keeps cuDNN's 1 / sqrt(var + eps) per channel in scratch.
  static size_t bn_inverse_std_bytes(int64_t channels) {
    return static_cast<size_t>(channels) * sizeof(float);
  }
  // Batch norm of NHWC half tensors runs cuDNN's persistent kernels (the
  // *Ex calls, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, as PyTorch does for
  // channels-last): the spatial mode's NHWC kernels took 26 ms of ResNet-18's
  // 35 ms bf16 step (batch 128) on an H100, against 2.2 ms in NCHW. The
  // bytes of workspace they take after the inverse std in the scratch, or
  // nullopt where the spatial mode runs: other layouts and types, and a
  // cuDNN that asks for reserve space (kept from forward to backward, which
  // the backend interface has no place for; said once on stderr).
  std::optional<size_t> bn_persistent_workspace(const TensorDesc& x);
  // Where that workspace starts in the scratch, and the scratch a batch-norm
  // call takes: the inverse std, and the persistent kernels' workspace.
  static size_t bn_workspace_offset(int64_t channels) {
    return align_up(bn_inverse_std_bytes(channels));
  }
  static size_t bn_call_bytes(int64_t channels, std::optional<size_t> workspace) {
    return workspace ? bn_workspace_offset(channels) + *workspace
                     : bn_inverse_std_bytes(channels);
  }
  // The synchronised ops' per-channel sums (two doubles per channel), and
  // the scratch their calls take: the sums, then the kernels' partial sums.
  static size_t bn_sums_bytes(int64_t channels) {
    return 2 * static_cast<size_t>(channels) * sizeof(double);
  }
  static size_t bn_sums_call_bytes(const TensorDesc& x) {
    const Shape& s = x.shape;
    return align_up(bn_sums_bytes(s.c)) +
           static_cast<size_t>(
               batch_norm_sum_partial_bytes(s.n, s.c, s.h * s.w, channels_last(x)));
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

  // The element type of a call's tensors: throws BackendError naming the
  // op where they differ (check_same_dtype) or where this GPU cannot run a
  // half type (precision_unavailable's reason).
  DataType call_type(const char* op, std::initializer_list<TensorDesc> tensors) const;

  cudnnTensorDescriptor_t tensor_desc(int64_t n, int64_t c, int64_t h, int64_t w, DataType type,
                                      Layout layout = Layout::kPlain);
  cudnnTensorDescriptor_t tensor_desc(const Shape& s, DataType type,
                                      Layout layout = Layout::kPlain) {
    return tensor_desc(s.n, s.c, s.h, s.w, type, layout);
  }
  // NCHW or NHWC (require_cudnn_layout).
  cudnnTensorDescriptor_t tensor_desc(const TensorDesc& d) {
    return tensor_desc(d.shape, d.dtype, d.layout);
  }
  // Batch norm's scale, shift, statistics and their gradients {1, c, 1, 1}:
  // f32 whatever the data's type (cudnnDeriveBNTensorDescriptor's rule for
  // f32, f16 and bf16 data).
  cudnnTensorDescriptor_t param_desc(int64_t c) { return tensor_desc(1, c, 1, 1, DataType::kF32); }
  // p's descriptors with both activations in `layout` and the filters in
  // its filter format (cudnn_format).
  const ConvDescriptors& conv_descriptors(const ConvProblem& p, Layout layout);
  // The descriptor and cuDNN algorithm number for the ConvAlgo id `algo`,
  // with the descriptor's math type set to the variant's. Throws for an id
  // whose variant is not for p's element type, and for a TF32 variant when
  // the backend was not made for tf32.
  ConvCall conv_call(const ConvDescriptors& d, const ConvProblem& p, ConvKind kind,
                     ConvAlgo algo);
  // The algorithms cuDNN's heuristic ranks first-to-last for `conv` (set to
  // `variant`'s math), those with a failure status or a math type the
  // variant excludes left out.
  std::vector<int> ranked_algorithms(ConvKind kind, const ConvDescriptors& d,
                                     cudnnConvolutionDescriptor_t conv,
                                     const ConvVariantInfo& variant, const std::string& what);
  // What cuDNN's call needs (cached); conv_workspace() adds conv_staging's.
  size_t cudnn_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p);
  // cuda_conv_graph.cpp: the graph API's engine configurations for p in
  // the half variants of p's type (BackendOptions::cudnn_graph), as
  // algorithms; a failure of the graph API leaves them out, never the
  // legacy ones.
  std::vector<ConvAlgoInfo> graph_algorithms(ConvKind kind, const ConvProblem& p);
  // The registry entry of a graph id of `kind`, or null.
  const GraphEngine* graph_engine(ConvKind kind, ConvAlgo algo) const;
  // The finalized plan of a graph id for p (cached per beta); throws
  // BackendError naming the engine and problem where cuDNN refuses it.
  const GraphPlan& graph_plan(ConvKind kind, ConvAlgo algo, const ConvProblem& p, float beta);
  // Workspace a graph id needs for p: the larger of its beta 0 and 1 plans.
  size_t graph_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p);
  // Runs a graph id: forward (a = x, b = w, out = y), backward data (a =
  // dy, b = w, out = dx) or backward filter (a = x, b = dy, out = dw), the
  // operands already in the call's layout and cuDNN's filter format.
  void graph_execute(ConvKind kind, ConvAlgo algo, const ConvProblem& p, float beta,
                     const void* a, const void* b, void* out, void* workspace,
                     size_t workspace_bytes);
  cudnnPoolingDescriptor_t pool_desc(const PoolDesc& p);
  void check_conv(const char* op, const ConvProblem& p, const Tensor& x, const Tensor& y,
                  ConvKind kind, ConvAlgo algo, size_t workspace_bytes);
  // A convolution's filters w (KCRS) as cuDNN takes them with activations
  // in `layout`: w itself, or for NHWC a KRSC copy at `staging`.
  const void* filters_in_layout(const ConvProblem& p, const void* w, Layout layout,
                                void* staging);
  // An inner product's x as the NCHW rows its GEMMs read (ip_staged).
  const void* ip_input(const Tensor& x);
  // Copies a channel range between two tensors in one layout (concat).
  void copy_channels(DataType type, const void* src, int64_t src_c, int64_t src_offset, void* dst,
                     int64_t dst_c, int64_t dst_offset, int64_t channels, int64_t n, int64_t hw,
                     Layout layout, float beta);
  // A tensor's contents in `layout`: itself, or a reordered copy at `staging`.
  const void* in_layout(const Tensor& t, Layout layout, void* staging);
  // C = A * B + beta * C (cuBLAS's column-major terms): cublasSgemm for f32
  // (in the handle's math: FMA, or TF32 under tf32), else cublasGemmEx with
  // A and B of ab_type, C of c_type and f32 accumulation.
  void gemm(const std::string& what, cublasOperation_t trans_a, cublasOperation_t trans_b, int m,
            int n, int k, DataType ab_type, const void* a, int lda, const void* b, int ldb,
            float beta, DataType c_type, void* c, int ldc);

  DeviceInfo info_;
  int device_ = 0;
  int compute_capability_ = 0;  // major * 10 + minor
  bool tf32_ = false;           // BackendOptions::precision is tf32
  bool cudnn_graph_ = false;    // BackendOptions::cudnn_graph
  int graph_engines_per_variant_ = kDefaultGraphEngines;  // BackendOptions::graph_engines
  LayoutRule layout_rule_;      // BackendOptions::layout, for a GPU
  size_t capacity_ = 0;
  Stream compute_;
  Stream memory_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;

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

  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, DataType, Layout>, TensorDescriptor>
      tensor_descs_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, DataType>, std::optional<size_t>>
      bn_persistent_;  // bn_persistent_workspace's answers
  bool bn_reserve_said_ = false;
  std::unordered_map<std::string, ConvDescriptors> conv_descs_;
  std::unordered_map<std::string, PoolDescriptor> pool_descs_;
  std::unordered_map<std::string, size_t> conv_workspaces_;
  std::vector<GraphEngine> graph_engines_;  // graph id - kGraphAlgoBase -> engine configuration
  std::unordered_map<std::string, GraphPlan> graph_plans_;  // by kind, id, problem, beta
};

}  // namespace vtrain::worker::cuda
