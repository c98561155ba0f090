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
  std::string variants;
  for (const ConvVariantInfo& v : kConvVariants) {
    if (v.variant == ConvVariant::kFma) continue;
    variants += std::string(variants.empty() ? "" : ", ") + "id + " +
                std::to_string(static_cast<int>(v.variant) * kVariantStride) + " <name>" +
                v.suffix + " (" + dtype_name(v.tensors) + ")";
  }
  return known + "; variants: " + variants;
}

// The stable name of a ConvAlgo id, variants included; nullopt for an
// unknown id.
std::optional<std::string> algo_name(ConvKind kind, ConvAlgo algo) {
  const ConvVariantInfo* variant = conv_variant(algo);
  if (variant == nullptr) return std::nullopt;
  const char* base = conv_algo_name(kind, algo % kVariantStride);
  if (base == nullptr) return std::nullopt;
  return std::string(base) + variant->suffix;
}

// Whether cuDNN's heuristic entry of math type `math` belongs to `variant`:
// its v7 heuristics may list an algorithm once per math type, each entry
// with its own mathType, whatever the descriptor says. The FMA variant
// leaves out tensor-op entries, the TF32 one FMA entries; the half
// variants take both (CUDNN_TENSOR_OP_MATH permits tensor cores, it does
// not require them, so an algorithm cuDNN has only in FMA kernels still
// runs).
bool math_fits(cudnnMathType_t math, ConvVariant variant) {
  const bool tensor_op =
      math == CUDNN_TENSOR_OP_MATH || math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  switch (variant) {
    case ConvVariant::kFma: return !tensor_op;
    case ConvVariant::kTf32: return math != CUDNN_FMA_MATH;
    case ConvVariant::kPseudoHalf:
    case ConvVariant::kTrueHalf:
    case ConvVariant::kPseudoBf16: return true;
  }
  return false;
}

// cuDNN's heuristic entries that succeed and fit the variant, in its order.
template <typename Perf>
void keep_ranked(const std::vector<Perf>& perf, int returned, ConvVariant variant,
                 std::vector<int>& ranked) {
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || !math_fits(perf[i].mathType, variant)) continue;
    const int algo = static_cast<int>(perf[i].algo);
    if (std::find(ranked.begin(), ranked.end(), algo) == ranked.end()) ranked.push_back(algo);
  }
}

}  // namespace

// -------------------------------------------------------------- descriptors

cudnnTensorDescriptor_t CudaBackend::tensor_desc(int64_t n, int64_t c, int64_t h, int64_t w,
                                                 DataType type, Layout layout) {
  auto key = std::make_tuple(n, c, h, w, type, layout);
  auto it = tensor_descs_.find(key);
  if (it != tensor_descs_.end()) return it->second.get();
  const std::string what = "tensor " + Shape{n, c, h, w}.str() + " " + dtype_name(type) + " " +
                           layout_name(layout);
  require_cudnn_layout("tensor descriptor", {{n, c, h, w}, layout, type});
  cudnnTensorDescriptor_t raw = nullptr;
  VTRAIN_CUDA_CHECK(cudnnCreateTensorDescriptor(&raw), what);
  TensorDescriptor desc(raw);
  VTRAIN_CUDA_CHECK(cudnnSetTensor4dDescriptor(raw, cudnn_format(layout), cudnn_type(type),
                                               to_int(n, what + " n"), to_int(c, what + " c"),
                                               to_int(h, what + " h"), to_int(w, what + " w")),
                    what);
  return tensor_descs_.emplace(key, std::move(desc)).first->second.get();
}

const ConvDescriptors& CudaBackend::conv_descriptors(const ConvProblem& p, Layout layout) {
  // Checked before the cache: the key (p.str()) names x's type only, and a
  // y of another type must not find x's descriptors.
  const DataType type = call_type("convolution", {p.x, p.y});
  if (std::string error = p.geometry_error(); !error.empty()) throw BackendError(error);
  const std::string key = p.str() + " in " + layout_name(layout);
  auto it = conv_descs_.find(key);
  if (it != conv_descs_.end()) return it->second;
  require_cudnn_layout("convolution input", p.x);
  require_cudnn_layout("convolution output", p.y);
  const std::string what = "convolution " + key;
  const cudnnTensorFormat_t format = cudnn_format(layout);
  ConvDescriptors d;
  auto make_tensor = [&](const Shape& s) {
    cudnnTensorDescriptor_t raw = nullptr;
    VTRAIN_CUDA_CHECK(cudnnCreateTensorDescriptor(&raw), what);
    TensorDescriptor desc(raw);
    VTRAIN_CUDA_CHECK(
        cudnnSetTensor4dDescriptor(raw, format, cudnn_type(type), to_int(s.n, what),
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
  VTRAIN_CUDA_CHECK(cudnnSetFilter4dDescriptor(raw_filter, cudnn_type(type), format,
                                               to_int(ws.n, what), to_int(ws.c, what),
                                               to_int(ws.h, what), to_int(ws.w, what)),
                    what);
  // One descriptor per compute type: f32 (the FMA, TF32 and pseudo-half
  // variants) and, for f16 tensors, f16 (true half).
  auto make_conv = [&](cudnnDataType_t compute) {
    cudnnConvolutionDescriptor_t raw_conv = nullptr;
    VTRAIN_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&raw_conv), what);
    ConvDescriptor conv(raw_conv);
    VTRAIN_CUDA_CHECK(
        cudnnSetConvolution2dDescriptor(
            raw_conv, to_int(p.window.pad_h, what), to_int(p.window.pad_w, what),
            to_int(p.window.stride_h, what), to_int(p.window.stride_w, what), 1, 1,
            CUDNN_CROSS_CORRELATION, compute),
        what);
    // Grouped: the filter descriptor above holds c / groups input channels.
    VTRAIN_CUDA_CHECK(cudnnSetConvolutionGroupCount(raw_conv, to_int(p.groups, what)), what);
    return conv;
  };
  d.conv = make_conv(CUDNN_DATA_FLOAT);
  if (type == DataType::kF16) d.conv_true_half = make_conv(CUDNN_DATA_HALF);
  // The math type is set per call (conv_call) from the algorithm's variant.
  return conv_descs_.emplace(key, std::move(d)).first->second;
}

cudnnPoolingDescriptor_t CudaBackend::pool_desc(const PoolDesc& p) {
  const Window& win = p.window;
  const std::string key = std::to_string(static_cast<int>(p.kind)) + "/" +
                          std::to_string(win.kernel_h) + "x" + std::to_string(win.kernel_w) + "/" +
                          std::to_string(win.stride_h) + "x" + std::to_string(win.stride_w) + "/" +
                          std::to_string(win.pad_h) + "x" + std::to_string(win.pad_w);
  auto it = pool_descs_.find(key);
  if (it != pool_descs_.end()) return it->second.get();
  const std::string what = "pooling " + key;
  cudnnPoolingDescriptor_t raw = nullptr;
  VTRAIN_CUDA_CHECK(cudnnCreatePoolingDescriptor(&raw), what);
  PoolDescriptor desc(raw);
  // Deterministic max pooling: backward does not depend on thread timing.
  // NaNs propagate, as in relu and the tiled max pooling (cuda_kernels.h).
  const cudnnPoolingMode_t mode = p.kind == PoolKind::kMax
                                      ? CUDNN_POOLING_MAX_DETERMINISTIC
                                      : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  VTRAIN_CUDA_CHECK(
      cudnnSetPooling2dDescriptor(raw, mode, CUDNN_PROPAGATE_NAN, to_int(win.kernel_h, what),
                                  to_int(win.kernel_w, what), to_int(win.pad_h, what),
                                  to_int(win.pad_w, what), to_int(win.stride_h, what),
                                  to_int(win.stride_w, what)),
      what);
  return pool_descs_.emplace(key, std::move(desc)).first->second.get();
}

// ------------------------------------------------------------- convolution

std::string CudaBackend::conv_algorithm_name(ConvKind kind, ConvAlgo algo) const {
  if (const GraphEngine* e = graph_engine(kind, algo)) return e->name;
  if (std::optional<std::string> name = algo_name(kind, algo)) return *name;
  throw BackendError("cuda backend: unknown " + std::string(conv_kind_name(kind)) +
                     " convolution algorithm id " + std::to_string(algo) +
                     " (known: " + known_algorithms(kind) + ")");
}

ConvCall CudaBackend::conv_call(const ConvDescriptors& d, const ConvProblem& p, ConvKind kind,
                                ConvAlgo algo) {
  const std::string name = conv_algorithm_name(kind, algo);  // throws for unknown ids
  const ConvVariantInfo& v = *conv_variant(algo);
  if (v.tensors != p.x.dtype) {
    throw BackendError("cuda backend: " + std::string(conv_kind_name(kind)) + " algorithm " + name +
                       " runs " + dtype_name(v.tensors) + " tensors, not " +
                       dtype_name(p.x.dtype) + " ones (" + p.str() + ")");
  }
  if (v.variant == ConvVariant::kTf32 && !tf32_) {
    throw BackendError("cuda backend: " + name +
                       " is a TF32 tensor-core algorithm; this backend was made for "
                       "train.precision fp32, which keeps FMA math");
  }
  const cudnnConvolutionDescriptor_t conv =
      v.compute == CUDNN_DATA_HALF ? d.conv_true_half.get() : d.conv.get();
  VTRAIN_CUDA_CHECK(cudnnSetConvolutionMathType(conv, v.math), "convolution math type of " + name);
  return {algo % kVariantStride, conv};
}

std::vector<int> CudaBackend::ranked_algorithms(ConvKind kind, const ConvDescriptors& d,
                                                cudnnConvolutionDescriptor_t conv,
                                                const ConvVariantInfo& variant,
                                                const std::string& what) {
  std::vector<int> ranked;
  int max_count = 0, returned = 0;
  switch (kind) {
    case ConvKind::kForward: {
      VTRAIN_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(cudnn_.get(), &max_count),
                        what);
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(max_count));
      VTRAIN_CUDA_CHECK(
          cudnnGetConvolutionForwardAlgorithm_v7(cudnn_.get(), d.x.get(), d.w.get(), conv,
                                                 d.y.get(), max_count, &returned, perf.data()),
          what);
      keep_ranked(perf, returned, variant.variant, ranked);
      break;
    }
    case ConvKind::kBackwardData: {
      VTRAIN_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnn_.get(), &max_count),
                        what);
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(max_count));
      VTRAIN_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                            cudnn_.get(), d.w.get(), d.y.get(), conv, d.x.get(), max_count,
                            &returned, perf.data()),
                        what);
      keep_ranked(perf, returned, variant.variant, ranked);
      break;
    }
    case ConvKind::kBackwardFilter: {
      VTRAIN_CUDA_CHECK(
          cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnn_.get(), &max_count), what);
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(max_count));
      VTRAIN_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                            cudnn_.get(), d.x.get(), d.y.get(), conv, d.w.get(), max_count,
                            &returned, perf.data()),
                        what);
      keep_ranked(perf, returned, variant.variant, ranked);
      break;
    }
  }
  return ranked;
}

// cuDNN's heuristic ranking per variant of the problem's element type,
// best first within each: f32 in FMA math, then (under tf32) in TF32 math;
// f16 in PSEUDO_HALF then TRUE_HALF; bf16 in PSEUDO_BFLOAT16.
std::vector<ConvAlgoInfo> CudaBackend::conv_algorithms(const ConvDesc& op) {
  const ConvKind kind = op.kind;
  const ConvProblem& p = op.problem;
  const bool accumulate = op.beta != 0.0f;
  const ConvDescriptors& d = conv_descriptors(p, conv_layout(kind, p));
  const std::string what = std::string(conv_kind_name(kind)) + " algorithms for " + p.str();
  std::vector<ConvAlgoInfo> algos;
  for (const ConvVariantInfo& variant : kConvVariants) {
    if (variant.tensors != p.x.dtype || (variant.variant == ConvVariant::kTf32 && !tf32_)) continue;
    const ConvAlgo first = static_cast<ConvAlgo>(variant.variant) * kVariantStride;
    const ConvCall call = conv_call(d, p, kind, first);
    for (const int ranked : ranked_algorithms(kind, d, call.conv, variant, what)) {
      const ConvAlgo algo = first + ranked;
      const std::optional<std::string> name = algo_name(kind, algo);
      if (!name) continue;
      try {
        algos.push_back({algo, *name, conv_workspace(kind, algo, p, accumulate)});
      } catch (const BackendError&) {
        // The heuristic listed it, but cuDNN has no workspace size for it here.
      }
    }
  }
  for (ConvAlgoInfo& a : graph_algorithms(kind, p)) algos.push_back(std::move(a));
  return algos;
}

size_t CudaBackend::cudnn_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p) {
  const std::string name = conv_algorithm_name(kind, algo);  // throws for unknown ids
  const std::string key =
      std::to_string(static_cast<int>(kind)) + "/" + std::to_string(algo) + "/" + p.str();
  auto it = conv_workspaces_.find(key);
  if (it != conv_workspaces_.end()) return it->second;
  const ConvDescriptors& d = conv_descriptors(p, conv_layout(kind, p));
  const ConvCall call = conv_call(d, p, kind, algo);
  size_t bytes = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  switch (kind) {
    case ConvKind::kForward:
      status = cudnnGetConvolutionForwardWorkspaceSize(
          cudnn_.get(), d.x.get(), d.w.get(), call.conv, d.y.get(),
          static_cast<cudnnConvolutionFwdAlgo_t>(call.algo), &bytes);
      break;
    case ConvKind::kBackwardData:
      status = cudnnGetConvolutionBackwardDataWorkspaceSize(
          cudnn_.get(), d.w.get(), d.y.get(), call.conv, d.x.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(call.algo), &bytes);
      break;
    case ConvKind::kBackwardFilter:
      status = cudnnGetConvolutionBackwardFilterWorkspaceSize(
          cudnn_.get(), d.x.get(), d.y.get(), call.conv, d.w.get(),
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(call.algo), &bytes);
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

// cuDNN's workspace, after the staging (ConvStaging). Beta needs no extra
// space: cuDNN scales natively, and a staged dw is added to the f32 dw
// with the caller's beta by a kernel.
size_t CudaBackend::conv_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                                   bool /*accumulate*/) {
  return conv_staging(kind, p).total() + (graph_engine(kind, algo)
                                              ? graph_workspace(kind, algo, p)
                                              : cudnn_workspace(kind, algo, p));
}

void CudaBackend::check_conv(const char* op, const ConvProblem& p, const Tensor& x, const Tensor& y,
                             ConvKind kind, ConvAlgo algo, size_t workspace_bytes) {
  if (!(x.desc == p.x) || !(y.desc == p.y)) {
    throw BackendError(std::string("cuda backend: ") + op + ": tensors " + x.shape().str() + " " +
                       dtype_name(x.desc.dtype) + " and " + y.shape().str() + " " +
                       dtype_name(y.desc.dtype) + " do not match the problem " + p.str());
  }
  const size_t need = conv_workspace(kind, algo, p, false);
  if (workspace_bytes < need) {
    throw BackendError(std::string("cuda backend: ") + op + " " + p.str() + " with " +
                       conv_algorithm_name(kind, algo) + " needs " + std::to_string(need) +
                       " workspace bytes, got " + std::to_string(workspace_bytes));
  }
}

// Scaling factors are floats for f32, f16 and bf16 tensors alike (cuDNN
// takes doubles for double tensors only); y is read only where beta is 1.
// In NHWC the filters go to cuDNN as KRSC, reordered into the workspace;
// an input in the other layout is reordered there too (ConvStaging).
void CudaBackend::conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const void* w,
                               const void* bias, const Tensor& y, float beta, void* workspace,
                               size_t workspace_bytes) {
  check_beta("conv_forward", beta);
  const Layout layout = conv_layout(ConvKind::kForward, p);
  const ConvDescriptors& d = conv_descriptors(p, layout);
  check_conv("conv_forward", p, x, y, ConvKind::kForward, algo, workspace_bytes);
  const ConvStaging staging = conv_staging(ConvKind::kForward, p);
  char* ws = static_cast<char*>(workspace);
  const void* x_in = in_layout(x, layout, ws + staging.input_offset());
  const void* w_in = filters_in_layout(p, w, layout, ws + staging.filter_offset());
  const std::string what = "conv_forward " + p.str();
  const float one = 1.0f;
  if (graph_engine(ConvKind::kForward, algo)) {
    graph_execute(ConvKind::kForward, algo, p, beta, x_in, w_in, y.data, ws + staging.total(),
                  workspace_bytes - staging.total());
  } else {
    const ConvCall call = conv_call(d, p, ConvKind::kForward, algo);
    VTRAIN_CUDA_CHECK(
        cudnnConvolutionForward(cudnn_.get(), &one, d.x.get(), x_in, d.w.get(), w_in, call.conv,
                                static_cast<cudnnConvolutionFwdAlgo_t>(call.algo),
                                ws + staging.total(), workspace_bytes - staging.total(), &beta,
                                d.y.get(), y.data),
        what);
  }
  if (!bias) return;
  // The bias is in the tensors' type (backend.h); a half y rounds twice,
  // after the convolution and after the bias. cudnnAddTensor is slow on
  // NHWC tensors: there a kernel of ours adds it.
  if (layout == Layout::kNhwc) {
    const Shape& ys = p.y.shape;
    add_bias(element(p.y.dtype), y.data, y.data, bias, ys.n, ys.c, ys.h * ys.w, true, false,
             compute_.get());
    return;
  }
  VTRAIN_CUDA_CHECK(
      cudnnAddTensor(cudnn_.get(), &one, d.bias.get(), bias, &one, d.y.get(), y.data),
      what + " bias");
}

void CudaBackend::conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy,
                                     const void* w, const Tensor& dx, float beta, void* workspace,
                                     size_t workspace_bytes) {
  check_beta("conv_backward_data", beta);
  const Layout layout = conv_layout(ConvKind::kBackwardData, p);
  const ConvDescriptors& d = conv_descriptors(p, layout);
  check_conv("conv_backward_data", p, dx, dy, ConvKind::kBackwardData, algo, workspace_bytes);
  const ConvStaging staging = conv_staging(ConvKind::kBackwardData, p);
  char* ws = static_cast<char*>(workspace);
  const void* dy_in = in_layout(dy, layout, ws + staging.input_offset());
  const void* w_in = filters_in_layout(p, w, layout, ws + staging.filter_offset());
  if (graph_engine(ConvKind::kBackwardData, algo)) {
    graph_execute(ConvKind::kBackwardData, algo, p, beta, dy_in, w_in, dx.data,
                  ws + staging.total(), workspace_bytes - staging.total());
    return;
  }
  const ConvCall call = conv_call(d, p, ConvKind::kBackwardData, algo);
  const float one = 1.0f;
  VTRAIN_CUDA_CHECK(
      cudnnConvolutionBackwardData(cudnn_.get(), &one, d.w.get(), w_in, d.y.get(), dy_in,
                                   call.conv,
                                   static_cast<cudnnConvolutionBwdDataAlgo_t>(call.algo),
                                   ws + staging.total(), workspace_bytes - staging.total(), &beta,
                                   d.x.get(), dx.data),
      "conv_backward_data " + p.str());
}

// f32 NCHW: cuDNN writes dw and dbias with the caller's beta. Otherwise
// cuDNN's dw is in the filter's type (half tensors) or format (KRSC for
// NHWC), so it computes into the staging at the workspace's start with
// beta 0 (never reading it); in NHWC a reorder takes that to KCRS f32; and
// accumulate() adds it to the f32 dw with the caller's beta (beta 0 never
// reads dw): micro-batches after the first pass beta 1 and sum in f32.
// dbias is then summed from dy straight into f32 (bias_gradient, its
// partial sums in the staging), not rounded to half first as cuDNN's bias
// gradient would.
void CudaBackend::conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                                       const Tensor& dy, float* dw, float* dbias, float beta,
                                       void* workspace, size_t workspace_bytes) {
  check_beta("conv_backward_filter", beta);
  const Layout layout = conv_layout(ConvKind::kBackwardFilter, p);
  const ConvDescriptors& d = conv_descriptors(p, layout);
  check_conv("conv_backward_filter", p, x, dy, ConvKind::kBackwardFilter, algo, workspace_bytes);
  const bool graph = graph_engine(ConvKind::kBackwardFilter, algo) != nullptr;
  const ConvCall call = graph ? ConvCall{} : conv_call(d, p, ConvKind::kBackwardFilter, algo);
  const ConvStaging staging = conv_staging(ConvKind::kBackwardFilter, p);
  char* ws = static_cast<char*>(workspace);
  const void* x_in = in_layout(x, layout, ws + staging.input_offset());
  void* cudnn_ws = ws + staging.total();
  const size_t cudnn_bytes = workspace_bytes - staging.total();
  const std::string what = "conv_backward_filter " + p.str();
  const DataType type = p.x.dtype;
  const float one = 1.0f, zero = 0.0f;
  if (staging.dw == 0) {
    VTRAIN_CUDA_CHECK(cudnnConvolutionBackwardFilter(
                          cudnn_.get(), &one, d.x.get(), x_in, d.y.get(), dy.data, call.conv,
                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(call.algo), cudnn_ws,
                          cudnn_bytes, &beta, d.w.get(), dw),
                      what);
    if (dbias) {
      VTRAIN_CUDA_CHECK(cudnnConvolutionBackwardBias(cudnn_.get(), &one, d.y.get(), dy.data, &beta,
                                                     d.bias.get(), dbias),
                        what + " bias");
    }
    return;
  }
  void* staged_dw = ws;
  if (graph) {
    graph_execute(ConvKind::kBackwardFilter, algo, p, 0.0f, x_in, dy.data, staged_dw, cudnn_ws,
                  cudnn_bytes);
  } else {
    VTRAIN_CUDA_CHECK(cudnnConvolutionBackwardFilter(
                          cudnn_.get(), &one, d.x.get(), x_in, d.y.get(), dy.data, call.conv,
                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(call.algo), cudnn_ws,
                          cudnn_bytes, &zero, d.w.get(), staged_dw),
                      what);
  }
  const Shape wshape = p.weight_shape();
  Element dw_type = element(type);
  if (layout == Layout::kNhwc) {
    // KRSC is the NHWC layout of a {k, c, r, s} tensor.
    void* kcrs = ws + staging.dw_f32_offset();
    reorder(element(type), staged_dw, wshape.c, Element::kF32, kcrs,
            {wshape.n, wshape.c, wshape.h, wshape.w, 1}, compute_.get());
    staged_dw = kcrs;
    dw_type = Element::kF32;
  }
  cuda::accumulate(dw_type, staged_dw, Element::kF32, dw, beta, wshape.elements(), compute_.get());
  if (dbias) {
    const Shape& ys = p.y.shape;
    cuda::bias_gradient(element(type), dy.data, ys.n, ys.c, ys.h * ys.w, channels_last(p.y),
                        dbias, beta, ws + staging.bias_partials_offset(), compute_.get());
  }
}

const void* CudaBackend::filters_in_layout(const ConvProblem& p, const void* w, Layout layout,
                                           void* staging) {
  if (layout != Layout::kNhwc) return w;
  const Shape ws = p.weight_shape();
  const Element type = element(p.x.dtype);
  reorder(type, w, 1, type, staging, {ws.n, ws.c, ws.h, ws.w, ws.c}, compute_.get());
  return staging;
}

}  // namespace vtrain::worker::cuda
