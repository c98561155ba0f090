// CUDA backend: relu, add / accumulate, scale, SGD, pooling and concat.
#include "worker/device/cuda/cuda_backend_impl.h"

namespace vtrain::worker::cuda {

// ----------------------------------------------------------------- eltwise

void CudaBackend::relu_forward(const Tensor& x, const Tensor& y) {
  check_same_desc("relu_forward", {{"x", x.desc}, {"y", y.desc}});
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t d = storage_desc(x.desc);  // relu(0) = 0 keeps padding zero
  VTRAIN_CUDA_CHECK(
      cudnnActivationForward(cudnn_.get(), relu_.get(), &one, d, f32(x), &zero, d, f32(y)),
      "relu_forward " + x.shape().str());
}

void CudaBackend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  check_same_desc("relu_backward",
                  {{"y", y.desc}, {"dy", dy.desc}, {"dx", dx.desc}});
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t d = storage_desc(y.desc);
  // y stands in for x: y > 0 exactly where x > 0. dx may alias dy (cuDNN
  // allows it with identical descriptors).
  VTRAIN_CUDA_CHECK(cudnnActivationBackward(cudnn_.get(), relu_.get(), &one, d, f32(y), d, f32(dy),
                                            d, f32(y), &zero, d, f32(dx)),
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
  cuda::add(pa, pb, f32(y), y.desc.storage_elements(), compute_.get());
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
  cuda::accumulate(in_layout(x, layout, staging), f32(y), beta, y.desc.storage_elements(),
                   compute_.get());
}

void CudaBackend::scale(float* x, int64_t count, float alpha) {
  cuda::scale(x, alpha, count, compute_.get());
}

void CudaBackend::sgd_update(float* w, const float* g, float* velocity, int64_t count,
                             const SgdStep& step) {
  cuda::sgd_update(w, g, velocity, count, step.lr, step.momentum, step.weight_decay,
                   step.grad_scale,
                   compute_.get());
}

// ----------------------------------------------------------------- pooling

void CudaBackend::pooling_forward(const PoolParams& p, const Tensor& x, const Tensor& y, void*) {
  require_plain("pooling_forward", x.desc);
  require_plain("pooling_forward", y.desc);
  const float one = 1.0f, zero = 0.0f;
  VTRAIN_CUDA_CHECK(cudnnPoolingForward(cudnn_.get(), pool_desc(p), &one, tensor_desc(x.shape()),
                                        f32(x), &zero, tensor_desc(y.shape()), f32(y)),
                    "pooling_forward " + x.shape().str() + " -> " + y.shape().str());
}

void CudaBackend::pooling_backward(const PoolParams& p, const Tensor& x, const Tensor& y,
                                   const Tensor& dy, const Tensor& dx, const void*) {
  for (const Tensor* t : {&x, &y, &dy, &dx}) require_plain("pooling_backward", t->desc);
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t xd = tensor_desc(x.shape()), yd = tensor_desc(y.shape());
  VTRAIN_CUDA_CHECK(cudnnPoolingBackward(cudnn_.get(), pool_desc(p), &one, yd, f32(y), yd, f32(dy),
                                         xd, f32(x), &zero, xd, f32(dx)),
                    "pooling_backward " + x.shape().str() + " <- " + y.shape().str());
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
    copy_rows(f32(x), part, f32(y) + offset * hw, ys.c * hw, ys.n, part, 0.0f, compute_.get());
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
  check_concat_slice(ys, channel_offset, xs);
  const int64_t hw = ys.h * ys.w;
  copy_rows(f32(dy) + channel_offset * hw, ys.c * hw, f32(dx), xs.c * hw, ys.n, xs.c * hw, beta,
            compute_.get());
}

}  // namespace vtrain::worker::cuda
