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

// cuBLAS is column-major: a row-major {rows, cols} matrix is its transpose.
// So row-major y{n, out} = x{n, in} w{out, in}^T is, column-major,
// y^T(out x n) = W^T * X where W = w^T (in x out) and X = x^T (in x n).
void CudaBackend::inner_product_forward(const Tensor& x, const void* w, const void* bias,
                                        const Tensor& y) {
  check_fc_output("inner_product_forward", y);
  require_plain("inner_product_forward", x.desc);
  const std::string what = "inner_product_forward " + x.shape().str() + " -> " + y.shape().str();
  if (x.shape().n != y.shape().n) throw BackendError(what + ": batch sizes differ");
  const int n = to_int(x.shape().n, what), in = to_int(x.shape().per_sample(), what),
            out = to_int(y.shape().c, what);
  const float one = 1.0f, zero = 0.0f;
  VTRAIN_CUDA_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one,
                                static_cast<const float*>(w), in, f32(x), in, &zero, f32(y), out),
                    what);
  if (bias) {
    VTRAIN_CUDA_CHECK(cudnnAddTensor(cudnn_.get(), &one, tensor_desc(1, out, 1, 1), bias, &one,
                                     tensor_desc(y.shape()), f32(y)),
                      what + " bias");
  }
}

void CudaBackend::inner_product_backward_data(const Tensor& dy, const void* w, const Tensor& dx) {
  check_fc_output("inner_product_backward_data", dy);
  require_plain("inner_product_backward_data", dx.desc);
  const std::string what =
      "inner_product_backward_data " + dx.shape().str() + " <- " + dy.shape().str();
  if (dx.shape().n != dy.shape().n) throw BackendError(what + ": batch sizes differ");
  const int n = to_int(dx.shape().n, what), in = to_int(dx.shape().per_sample(), what),
            out = to_int(dy.shape().c, what);
  const float one = 1.0f, zero = 0.0f;
  // dx^T(in x n) = W^T(in x out) * dy^T(out x n)
  VTRAIN_CUDA_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one,
                                static_cast<const float*>(w), in, f32(dy), out, &zero, f32(dx), in),
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
  VTRAIN_CUDA_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, f32(x),
                                in, f32(dy), out, &beta, dw, in),
                    what);
  if (dbias) {
    VTRAIN_CUDA_CHECK(
        cudnnConvolutionBackwardBias(cudnn_.get(), &one, tensor_desc(dy.shape()), f32(dy), &beta,
                                     tensor_desc(1, out, 1, 1), dbias),
        what + " bias");
  }
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
  cuda::softmax_cross_entropy(f32(logits), labels, n, k, scale, dlogits ? f32(*dlogits) : nullptr,
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
