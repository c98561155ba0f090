// CUDA backend: inner product (cuBLAS) and softmax cross-entropy.
#include "worker/device/cuda/cuda_backend_impl.h"

namespace vtrain::worker::cuda {

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

// The GEMMs read x (and write dx) as NCHW rows of c * h * w, the weights'
// order: an NHWC x of more than one pixel goes through an NCHW copy in the
// scratch (one pixel is stored as NCHW already).
static bool ip_staged(const TensorDesc& x) {
  return x.layout == Layout::kNhwc && x.shape.h * x.shape.w > 1;
}

// The staged x, then (half dy with a bias) the bias gradient's partial sums.
static size_t ip_staging_bytes(const TensorDesc& x) {
  return ip_staged(x) ? align_up(TensorDesc{x.shape, Layout::kPlain, x.dtype}.bytes()) : 0;
}
static size_t ip_bias_partial_bytes(const TensorDesc& x, int64_t out) {
  return align_up(static_cast<size_t>(bias_gradient_partial_bytes(x.shape.n, out, 1, true)));
}

size_t CudaBackend::inner_product_scratch_bytes(const TensorDesc& x, int64_t out, bool bias) {
  const bool half_bias = bias && x.dtype != DataType::kF32;
  return ip_staging_bytes(x) + (half_bias ? ip_bias_partial_bytes(x, out) : 0);
}

const void* CudaBackend::ip_input(const Tensor& x) {
  require_cudnn_layout("inner product input", x.desc);
  if (!ip_staged(x.desc)) return x.data;
  return in_layout(x, Layout::kPlain, scratch(ip_staging_bytes(x.desc)));
}

void CudaBackend::gemm(const std::string& what, cublasOperation_t trans_a,
                       cublasOperation_t trans_b, int m, int n, int k, DataType ab_type,
                       const void* a, int lda, const void* b, int ldb, float beta,
                       DataType c_type, void* c, int ldc) {
  const float one = 1.0f;
  if (ab_type == DataType::kF32 && c_type == DataType::kF32) {
    VTRAIN_CUDA_CHECK(cublasSgemm(cublas_.get(), trans_a, trans_b, m, n, k, &one,
                                  static_cast<const float*>(a), lda, static_cast<const float*>(b),
                                  ldb, &beta, static_cast<float*>(c), ldc),
                      what);
    return;
  }
  // CUBLAS_COMPUTE_32F takes 16F or 16BF A and B with C of their type or
  // 32F, and float alpha and beta.
  VTRAIN_CUDA_CHECK(cublasGemmEx(cublas_.get(), trans_a, trans_b, m, n, k, &one, a,
                                 cublas_type(ab_type), lda, b, cublas_type(ab_type), ldb, &beta, c,
                                 cublas_type(c_type), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    what);
}

// cuBLAS is column-major: a row-major {rows, cols} matrix is its transpose.
// So row-major y{n, out} = x{n, in} w{out, in}^T is, column-major,
// y^T(out x n) = W^T * X where W = w^T (in x out) and X = x^T (in x n).
// x, w, the bias, y, dy and dx are in the call's type; dw and dbias f32.
void CudaBackend::inner_product_forward(const Tensor& x, const void* w, const void* bias,
                                        const Tensor& y) {
  check_fc_output("inner_product_forward", y);
  const void* x_rows = ip_input(x);
  const DataType type = call_type("inner_product_forward", {x.desc, y.desc});
  const std::string what = "inner_product_forward " + x.shape().str() + " -> " + y.shape().str();
  if (x.shape().n != y.shape().n) throw BackendError(what + ": batch sizes differ");
  const int n = to_int(x.shape().n, what), in = to_int(x.shape().per_sample(), what),
            out = to_int(y.shape().c, what);
  gemm(what, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, type, w, in, x_rows, in, 0.0f, type, y.data,
       out);
  if (bias) {
    const float one = 1.0f;
    VTRAIN_CUDA_CHECK(cudnnAddTensor(cudnn_.get(), &one, tensor_desc(1, out, 1, 1, type), bias,
                                     &one, tensor_desc(y.desc), y.data),
                      what + " bias");
  }
}

void CudaBackend::inner_product_backward_data(const Tensor& dy, const void* w, const Tensor& dx) {
  check_fc_output("inner_product_backward_data", dy);
  require_cudnn_layout("inner_product_backward_data", dx.desc);
  const DataType type = call_type("inner_product_backward_data", {dy.desc, dx.desc});
  const std::string what =
      "inner_product_backward_data " + dx.shape().str() + " <- " + dy.shape().str();
  if (dx.shape().n != dy.shape().n) throw BackendError(what + ": batch sizes differ");
  const int n = to_int(dx.shape().n, what), in = to_int(dx.shape().per_sample(), what),
            out = to_int(dy.shape().c, what);
  // dx^T(in x n) = W^T(in x out) * dy^T(out x n), NCHW rows (ip_staged).
  const Tensor rows = ip_staged(dx.desc)
                          ? Tensor{{dx.shape(), Layout::kPlain, type},
                                   scratch(ip_staging_bytes(dx.desc))}
                          : dx;
  gemm(what, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, type, w, in, dy.data, out, 0.0f, type,
       rows.data, in);
  if (rows.data != dx.data) convert(rows, dx);
}

void CudaBackend::inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw,
                                                 float* dbias, float beta) {
  check_fc_output("inner_product_backward_weights", dy);
  const void* x_rows = ip_input(x);
  check_beta("inner_product_backward_weights", beta);
  const DataType type = call_type("inner_product_backward_weights", {x.desc, dy.desc});
  const std::string what =
      "inner_product_backward_weights " + x.shape().str() + " / " + dy.shape().str();
  if (x.shape().n != dy.shape().n) throw BackendError(what + ": batch sizes differ");
  const int n = to_int(x.shape().n, what), in = to_int(x.shape().per_sample(), what),
            out = to_int(dy.shape().c, what);
  // dW^T(in x out) = x^T(in x n) * dy(n x out), into f32 whatever x's type.
  gemm(what, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, type, x_rows, in, dy.data, out, beta,
       DataType::kF32, dw, in);
  if (!dbias) return;
  if (type == DataType::kF32) {
    const float one = 1.0f;
    VTRAIN_CUDA_CHECK(
        cudnnConvolutionBackwardBias(cudnn_.get(), &one, tensor_desc(dy.desc), dy.data, &beta,
                                     tensor_desc(1, out, 1, 1, DataType::kF32), dbias),
        what + " bias");
  } else {
    // Summed from the half dy in float (as conv_backward_filter's dbias),
    // its partial sums after the staged x in the scratch.
    char* partials = scratch(inner_product_scratch_bytes(x.desc, out, true)) +
                     ip_staging_bytes(x.desc);
    cuda::bias_gradient(element(type), dy.data, dy.shape().n, out, 1, true, dbias, beta, partials,
                        compute_.get());
  }
}

LossStats CudaBackend::softmax_cross_entropy(const Tensor& logits, const int32_t* labels,
                                             float scale, const Tensor* dlogits,
                                             float label_smoothing) {
  // Stored as plain is enough: the logits of a global pool keep its
  // input's layout, NHWC, which at one pixel is the plain layout's storage.
  if (!stored_as_plain(logits.desc) || (dlogits && !stored_as_plain(dlogits->desc))) {
    throw BackendError("softmax_cross_entropy: logits must be stored as plain {n, classes, 1, 1}");
  }
  const int64_t n = logits.shape().n;
  const int64_t k = logits.shape().per_sample();
  if (dlogits && !(dlogits->shape() == logits.shape())) {
    throw BackendError("softmax_cross_entropy: dlogits " + dlogits->shape().str() +
                       " does not match logits " + logits.shape().str());
  }
  const DataType type = dlogits ? call_type("softmax_cross_entropy", {logits.desc, dlogits->desc})
                                : call_type("softmax_cross_entropy", {logits.desc});
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
  cuda::softmax_cross_entropy(element(type), logits.data, labels, n, k, scale, label_smoothing,
                              dlogits ? dlogits->data : nullptr, loss, correct, bad,
                              compute_.get());
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

// The flag lives in the ops' scratch, which every network reserves beyond
// 4 bytes (softmax_scratch_bytes alone is more).
bool CudaBackend::all_finite(const float* x, int64_t count) {
  const std::string what = "all_finite over " + std::to_string(count) + " floats";
  auto* flag = reinterpret_cast<int32_t*>(scratch(sizeof(int32_t)));
  VTRAIN_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int32_t), compute_.get()), what);
  cuda::flag_non_finite(x, count, flag, compute_.get());
  char* host = pinned_staging(sizeof(int32_t));
  VTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(host, flag, sizeof(int32_t), cudaMemcpyDeviceToHost, compute_.get()), what);
  sync_compute(what);
  return *reinterpret_cast<const int32_t*>(host) == 0;
}

}  // namespace vtrain::worker::cuda
