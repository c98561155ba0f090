// CUDA backend: cuDNN descriptors and convolutions.
#include "worker/device/cuda/cuda_backend_impl.h"

namespace vtrain::worker::cuda {

namespace {

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
  return known + "; under tf32 each also as id + " + std::to_string(kTf32Variant) + ", <name>/tf32";
}

// The stable name of a ConvAlgo id, TF32 variants included; nullopt for
// an unknown id.
std::optional<std::string> algo_name(ConvKind kind, ConvAlgo algo) {
  const bool tf32 = algo >= kTf32Variant;
  const char* base = conv_algo_name(kind, tf32 ? algo - kTf32Variant : algo);
  if (base == nullptr) return std::nullopt;
  return std::string(base) + (tf32 ? std::string(kTf32AlgorithmSuffix) : "");
}

// cuDNN's heuristic entries that succeed, in its order, for one math: its
// v7 heuristics may list an algorithm once per math type, each entry with
// its own mathType, whatever the descriptor says. The FMA pass leaves out
// tensor-op entries, the TF32 pass FMA ones.
template <typename Perf>
void keep_ranked(const std::vector<Perf>& perf, int returned, bool tf32, std::vector<int>& ranked) {
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    const bool fma = perf[i].mathType == CUDNN_FMA_MATH;
    const bool tensor_op = perf[i].mathType == CUDNN_TENSOR_OP_MATH ||
                           perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (tf32 ? fma : tensor_op) continue;
    ranked.push_back(static_cast<int>(perf[i].algo));
  }
}

}  // namespace

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
  // FMA math (float32 results comparable with the CPU) until a call asks
  // for a TF32 variant (set_conv_math).
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
  if (std::optional<std::string> name = algo_name(kind, algo)) return *name;
  throw BackendError("cuda backend: unknown " + std::string(conv_kind_name(kind)) +
                     " convolution algorithm id " + std::to_string(algo) +
                     " (known: " + known_algorithms(kind) + ")");
}

int CudaBackend::set_conv_math(const ConvDescriptors& d, ConvKind kind, ConvAlgo algo) {
  const bool tf32 = algo >= kTf32Variant;
  if (tf32 && !tf32_) {
    throw BackendError("cuda backend: " + conv_algorithm_name(kind, algo) +
                       " is a TF32 tensor-core algorithm; this backend was made for "
                       "train.precision fp32, which keeps FMA math");
  }
  VTRAIN_CUDA_CHECK(
      cudnnSetConvolutionMathType(d.conv.get(), tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
      "convolution math type");
  return tf32 ? algo - kTf32Variant : algo;
}

std::vector<int> CudaBackend::ranked_algorithms(ConvKind kind, const ConvDescriptors& d,
                                                bool tf32, const std::string& what) {
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
      keep_ranked(perf, returned, tf32, ranked);
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
      keep_ranked(perf, returned, tf32, ranked);
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
      keep_ranked(perf, returned, tf32, ranked);
      break;
    }
  }
  return ranked;
}

// cuDNN's heuristic ranking in FMA math, best first; under tf32 then the
// same in TF32 math, as the algorithms' /tf32 variants (mu-cuDNN's idea of
// offering each compute type as an algorithm of its own: the profiler
// times them and WR / WD choose among all).
std::vector<ConvAlgoInfo> CudaBackend::conv_algorithms(ConvKind kind, const ConvProblem& p,
                                                       bool accumulate) {
  const ConvDescriptors& d = conv_descriptors(p);
  const std::string what = std::string(conv_kind_name(kind)) + " algorithms for " + p.str();
  std::vector<ConvAlgoInfo> algos;
  for (const ConvAlgo variant : {0, kTf32Variant}) {
    if (variant == kTf32Variant && !tf32_) break;
    set_conv_math(d, kind, variant);
    for (const int ranked : ranked_algorithms(kind, d, variant == kTf32Variant, what)) {
      const ConvAlgo algo = ranked + variant;
      const bool seen = std::any_of(algos.begin(), algos.end(),
                                    [&](const ConvAlgoInfo& a) { return a.algo == algo; });
      const std::optional<std::string> name = algo_name(kind, algo);
      if (seen || !name) continue;
      try {
        algos.push_back({algo, *name, conv_workspace(kind, algo, p, accumulate)});
      } catch (const BackendError&) {
        // The heuristic listed it, but cuDNN has no workspace size for it here.
      }
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
  const int base = set_conv_math(d, kind, algo);
  size_t bytes = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  switch (kind) {
    case ConvKind::kForward:
      status = cudnnGetConvolutionForwardWorkspaceSize(
          cudnn_.get(), d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
          static_cast<cudnnConvolutionFwdAlgo_t>(base), &bytes);
      break;
    case ConvKind::kBackwardData:
      status = cudnnGetConvolutionBackwardDataWorkspaceSize(
          cudnn_.get(), d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(base), &bytes);
      break;
    case ConvKind::kBackwardFilter:
      status = cudnnGetConvolutionBackwardFilterWorkspaceSize(
          cudnn_.get(), d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(base), &bytes);
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

void CudaBackend::conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const void* w,
                               const void* bias, const Tensor& y, float beta, void* workspace,
                               size_t workspace_bytes) {
  check_beta("conv_forward", beta);
  const ConvDescriptors& d = conv_descriptors(p);
  check_conv("conv_forward", p, x, y, ConvKind::kForward, algo, workspace_bytes);
  const int base = set_conv_math(d, ConvKind::kForward, algo);
  const std::string what = "conv_forward " + p.str();
  const float one = 1.0f;
  VTRAIN_CUDA_CHECK(
      cudnnConvolutionForward(cudnn_.get(), &one, d.x.get(), f32(x), d.w.get(), w, d.conv.get(),
                              static_cast<cudnnConvolutionFwdAlgo_t>(base), workspace,
                              workspace_bytes, &beta, d.y.get(), f32(y)),
      what);
  if (bias) {
    VTRAIN_CUDA_CHECK(
        cudnnAddTensor(cudnn_.get(), &one, d.bias.get(), bias, &one, d.y.get(), f32(y)),
        what + " bias");
  }
}

void CudaBackend::conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy,
                                     const void* w, const Tensor& dx, float beta, void* workspace,
                                     size_t workspace_bytes) {
  check_beta("conv_backward_data", beta);
  const ConvDescriptors& d = conv_descriptors(p);
  check_conv("conv_backward_data", p, dx, dy, ConvKind::kBackwardData, algo, workspace_bytes);
  const int base = set_conv_math(d, ConvKind::kBackwardData, algo);
  const float one = 1.0f;
  VTRAIN_CUDA_CHECK(
      cudnnConvolutionBackwardData(cudnn_.get(), &one, d.w.get(), w, d.y.get(), f32(dy),
                                   d.conv.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(base),
                                   workspace, workspace_bytes, &beta, d.x.get(), f32(dx)),
      "conv_backward_data " + p.str());
}

void CudaBackend::conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                                       const Tensor& dy, float* dw, float* dbias, float beta,
                                       void* workspace, size_t workspace_bytes) {
  check_beta("conv_backward_filter", beta);
  const ConvDescriptors& d = conv_descriptors(p);
  check_conv("conv_backward_filter", p, x, dy, ConvKind::kBackwardFilter, algo, workspace_bytes);
  const int base = set_conv_math(d, ConvKind::kBackwardFilter, algo);
  const std::string what = "conv_backward_filter " + p.str();
  const float one = 1.0f;
  VTRAIN_CUDA_CHECK(cudnnConvolutionBackwardFilter(
                        cudnn_.get(), &one, d.x.get(), f32(x), d.y.get(), f32(dy), d.conv.get(),
                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(base), workspace,
                        workspace_bytes, &beta, d.w.get(), dw),
                    what);
  if (dbias) {
    VTRAIN_CUDA_CHECK(cudnnConvolutionBackwardBias(cudnn_.get(), &one, d.y.get(), f32(dy), &beta,
                                                   d.bias.get(), dbias),
                      what + " bias");
  }
}

}  // namespace vtrain::worker::cuda
