// CUDA backend: batch normalisation (cuDNN spatial mode; persistent for NHWC
// half tensors).
#include "worker/device/cuda/cuda_backend_impl.h"

#include <cstdio>

namespace vtrain::worker::cuda {

// -------------------------------------------------------------- batch norm

// cuDNN saves 1 / sqrt(var + eps) for backward; the contract (and the CPU
// backend) keeps the biased batch variance, so it is converted both ways.
// x, y, dy and dx are in the call's type; scale_shift, the statistics and
// their gradients are f32 (cuDNN's parameter descriptor for f16 and bf16
// data is float: cudnnDeriveBNTensorDescriptor's rule).
void CudaBackend::batch_norm_forward_training(const Tensor& x, const Tensor& y,
                                              const float* scale_shift, float* save_mean,
                                              float* save_var, float* running_mean,
                                              float* running_var, float momentum, float eps) {
  check_same_desc("batch_norm_forward_training",
                  {{"x", x.desc}, {"y", y.desc}});
  require_cudnn_layout("batch_norm_forward_training", x.desc);
  call_type("batch_norm_forward_training", {x.desc});
  const int64_t c = x.shape().c;
  const std::string what = "batch_norm_forward_training " + x.shape().str();
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t xd = tensor_desc(x.desc);
  // cuDNN's running update is running = (1 - factor) * running + factor *
  // batch with the unbiased variance: the contract's, with factor = momentum.
  const std::optional<size_t> work = bn_persistent_workspace(x.desc);
  char* base = scratch(bn_call_bytes(c, work));
  float* inv_std = reinterpret_cast<float*>(base);
  if (work) {
    VTRAIN_CUDA_CHECK(cudnnBatchNormalizationForwardTrainingEx(
                          cudnn_.get(), CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
                          CUDNN_BATCHNORM_OPS_BN, &one, &zero, xd, x.data, nullptr, nullptr, xd,
                          y.data, param_desc(c), scale_shift, scale_shift + c, momentum,
                          running_mean, running_var, eps, save_mean, inv_std, nullptr,
                          base + bn_workspace_offset(c), *work, nullptr, 0),
                      what);
  } else {
    VTRAIN_CUDA_CHECK(cudnnBatchNormalizationForwardTraining(
                          cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, x.data, xd,
                          y.data, param_desc(c), scale_shift, scale_shift + c, momentum,
                          running_mean, running_var, eps, save_mean, inv_std),
                      what);
  }
  inverse_std_to_variance(inv_std, save_var, c, eps, compute_.get());
}

void CudaBackend::batch_norm_forward_inference(const Tensor& x, const Tensor& y,
                                               const float* scale_shift, const float* running_mean,
                                               const float* running_var, float eps) {
  check_same_desc("batch_norm_forward_inference",
                  {{"x", x.desc}, {"y", y.desc}});
  require_cudnn_layout("batch_norm_forward_inference", x.desc);
  call_type("batch_norm_forward_inference", {x.desc});
  const int64_t c = x.shape().c;
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t xd = tensor_desc(x.desc);
  VTRAIN_CUDA_CHECK(
      cudnnBatchNormalizationForwardInference(
          cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, x.data, xd, y.data,
          param_desc(c), scale_shift, scale_shift + c, running_mean, running_var, eps),
      "batch_norm_forward_inference " + x.shape().str());
}

void CudaBackend::batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                      const float* save_mean, const float* save_var,
                                      const Tensor& dx, float* dscale_shift, float beta,
                                      float eps) {
  check_beta("batch_norm_backward", beta);
  check_same_desc("batch_norm_backward", {{"x", x.desc}, {"dy", dy.desc}, {"dx", dx.desc}});
  require_cudnn_layout("batch_norm_backward", x.desc);
  call_type("batch_norm_backward", {x.desc});
  const int64_t c = x.shape().c;
  const std::optional<size_t> work = bn_persistent_workspace(x.desc);
  char* base = scratch(bn_call_bytes(c, work));
  float* inv_std = reinterpret_cast<float*>(base);
  variance_to_inverse_std(save_var, inv_std, c, eps, compute_.get());
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t xd = tensor_desc(x.desc);
  if (work) {
    VTRAIN_CUDA_CHECK(cudnnBatchNormalizationBackwardEx(
                          cudnn_.get(), CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
                          CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one, &beta, xd, x.data, nullptr,
                          nullptr, xd, dy.data, nullptr, nullptr, xd, dx.data, param_desc(c),
                          scale_shift, scale_shift + c, dscale_shift, dscale_shift + c, eps,
                          save_mean, inv_std, nullptr, base + bn_workspace_offset(c), *work,
                          nullptr, 0),
                      "batch_norm_backward " + x.shape().str());
    return;
  }
  VTRAIN_CUDA_CHECK(cudnnBatchNormalizationBackward(
                        cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &beta, xd, x.data,
                        xd, dy.data, xd, dx.data, param_desc(c), scale_shift,
                        dscale_shift, dscale_shift + c, eps, save_mean, inv_std),
                    "batch_norm_backward " + x.shape().str());
}

std::optional<size_t> CudaBackend::bn_persistent_workspace(const TensorDesc& x) {
  if (x.layout != Layout::kNhwc || x.dtype == DataType::kF32) return std::nullopt;
  const Shape& s = x.shape;
  const auto key = std::make_tuple(s.n, s.c, s.h, s.w, x.dtype);
  if (auto it = bn_persistent_.find(key); it != bn_persistent_.end()) return it->second;
  const std::string what = "persistent batch norm of " + s.str() + " " + dtype_name(x.dtype);
  const cudnnTensorDescriptor_t xd = tensor_desc(x);
  const cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  const cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
  size_t reserve = 0, forward = 0, backward = 0;
  VTRAIN_CUDA_CHECK(
      cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cudnn_.get(), mode, ops, nullptr, xd,
                                                           &reserve),
      what);
  std::optional<size_t> work;
  if (reserve == 0) {
    VTRAIN_CUDA_CHECK(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
                          cudnn_.get(), mode, ops, xd, nullptr, xd, param_desc(s.c), nullptr,
                          &forward),
                      what);
    VTRAIN_CUDA_CHECK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
                          cudnn_.get(), mode, ops, xd, nullptr, xd, nullptr, xd, param_desc(s.c),
                          nullptr, &backward),
                      what);
    work = align_up(std::max(forward, backward));
  } else if (!bn_reserve_said_) {
    bn_reserve_said_ = true;
    std::fprintf(stderr,
                 "cuda backend: cuDNN's persistent batch norm asks for %zu bytes of reserve "
                 "space for %s; NHWC batch norm runs cuDNN's spatial kernels (slower)\n",
                 reserve, what.c_str());
  }
  return bn_persistent_.emplace(key, work).first->second;
}

// ------------------------------------------------ synchronised batch norm

std::vector<double> CudaBackend::read_bn_sums(const double* device, int64_t channels,
                                              const std::string& what) {
  const size_t bytes = bn_sums_bytes(channels);
  char* host = pinned_staging(bytes);
  VTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, compute_.get()), what);
  sync_compute(what);
  const auto* values = reinterpret_cast<const double*>(host);
  return std::vector<double>(values, values + 2 * channels);
}

std::vector<double> CudaBackend::batch_norm_sums(const Tensor& x) {
  require_cudnn_layout("batch_norm_sums", x.desc);
  const DataType type = call_type("batch_norm_sums", {x.desc});
  const Shape& s = x.shape();
  char* base = scratch(bn_sums_call_bytes(x.desc));
  auto* sums = reinterpret_cast<double*>(base);
  cuda::batch_norm_sums(element(type), x.data, s.n, s.c, s.h * s.w, channels_last(x.desc), sums,
                        base + align_up(bn_sums_bytes(s.c)), compute_.get());
  return read_bn_sums(sums, s.c, "batch_norm_sums " + s.str());
}

std::vector<double> CudaBackend::batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                                          const float* mean, const float* var,
                                                          float eps) {
  check_same_desc("batch_norm_backward_sums", {{"x", x.desc}, {"dy", dy.desc}});
  require_cudnn_layout("batch_norm_backward_sums", x.desc);
  const DataType type = call_type("batch_norm_backward_sums", {x.desc});
  const Shape& s = x.shape();
  char* base = scratch(bn_sums_call_bytes(x.desc));
  auto* sums = reinterpret_cast<double*>(base);
  cuda::batch_norm_backward_sums(element(type), x.data, dy.data, mean, var, eps, s.n, s.c,
                                 s.h * s.w, channels_last(x.desc), sums,
                                 base + align_up(bn_sums_bytes(s.c)), compute_.get());
  return read_bn_sums(sums, s.c, "batch_norm_backward_sums " + s.str());
}

void CudaBackend::batch_norm_backward_data(const Tensor& x, const Tensor& dy,
                                           const float* scale_shift, const float* mean,
                                           const float* var, const float* dy_means,
                                           const Tensor& dx, float eps) {
  check_same_desc("batch_norm_backward_data", {{"x", x.desc}, {"dy", dy.desc}, {"dx", dx.desc}});
  require_cudnn_layout("batch_norm_backward_data", x.desc);
  const DataType type = call_type("batch_norm_backward_data", {x.desc});
  const Shape& s = x.shape();
  cuda::batch_norm_backward_data(element(type), x.data, dy.data, scale_shift, mean, var, dy_means,
                                 eps, s.n, s.c, s.h * s.w, channels_last(x.desc), dx.data,
                                 compute_.get());
}

}  // namespace vtrain::worker::cuda
