// CUDA backend: relu and the other activations, add / accumulate, scale, SGD,
// pooling and concat.
#include "worker/device/cuda/cuda_backend_impl.h"

#include <cstring>
#include <string>

#include "worker/device/cuda/kernel_bodies.h"

namespace vtrain::worker::cuda {

// ----------------------------------------------------------------- eltwise

// relu runs in our kernels (cuda_kernels.h): cuDNN's activation ran at a
// fifth of the memory's speed on NHWC half tensors. Elementwise over the
// storage, so every layout is served (relu(0) = 0 keeps padding zero).
void CudaBackend::relu_forward(const Tensor& x, const Tensor& y) {
  check_same_desc("relu_forward", {{"x", x.desc}, {"y", y.desc}});
  const DataType type = call_type("relu_forward", {x.desc});
  cuda::relu_forward(element(type), x.data, y.data, x.desc.storage_elements(), compute_.get());
}

// y stands in for x: y > 0 exactly where x > 0. dx may alias dy.
void CudaBackend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  check_same_desc("relu_backward", {{"y", y.desc}, {"dy", dy.desc}, {"dx", dx.desc}});
  const DataType type = call_type("relu_backward", {y.desc});
  cuda::relu_backward(element(type), y.data, dy.data, dx.data, y.desc.storage_elements(),
                      compute_.get());
}

// Our add_bias kernel with relu: the bias add cuDNN's convolution would be
// followed by (cudnnAddTensor, or add_bias in NHWC) and relu_forward, in
// one pass and bit for bit alike.
void CudaBackend::bias_relu_forward(const Tensor& x, const void* bias, const Tensor& y) {
  check_same_desc("bias_relu_forward", {{"x", x.desc}, {"y", y.desc}});
  require_cudnn_layout("bias_relu_forward", x.desc);
  const DataType type = call_type("bias_relu_forward", {x.desc});
  const Shape& s = x.shape();
  cuda::add_bias(element(type), x.data, y.data, bias, s.n, s.c, s.h * s.w, channels_last(x.desc),
                 true, compute_.get());
}

// relu_backward and the bias gradient of its dx, as conv_backward_filter's
// bias_gradient sums it, in one pass.
void CudaBackend::relu_backward_bias(const Tensor& y, const Tensor& dy, const Tensor& dx,
                                     float* dbias) {
  check_same_desc("relu_backward_bias", {{"y", y.desc}, {"dy", dy.desc}, {"dx", dx.desc}});
  require_cudnn_layout("relu_backward_bias", y.desc);
  const DataType type = call_type("relu_backward_bias", {y.desc});
  const Shape& s = y.shape();
  cuda::relu_backward_bias(element(type), y.data, dy.data, dx.data, s.n, s.c, s.h * s.w,
                           channels_last(y.desc), dbias, scratch(relu_scratch_bytes(y.desc)),
                           compute_.get());
}

namespace {

cuda::Activation activation_of(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kSilu: return cuda::Activation::kSilu;
    case ActivationKind::kGelu: return cuda::Activation::kGelu;
    case ActivationKind::kSigmoid: return cuda::Activation::kSigmoid;
    case ActivationKind::kRelu6: return cuda::Activation::kRelu6;
    case ActivationKind::kRelu: break;
  }
  throw BackendError(std::string("cuda backend: ") + activation_name(kind) +
                     " runs as relu_forward, not as an activation kernel of its own");
}

}  // namespace

// silu, gelu, sigmoid and relu6 in our kernels (kernel_bodies.h), in float
// and rounded once, elementwise over the storage as relu. Each maps 0 to 0
// but sigmoid, which would write 0.5 into a channel-blocked layout's
// padding channels: it is refused there.
void CudaBackend::activation_forward(ActivationKind kind, const Tensor& x, const Tensor& y) {
  const std::string op = std::string(activation_name(kind)) + "_forward";
  check_same_desc(op.c_str(), {{"x", x.desc}, {"y", y.desc}});
  const DataType type = call_type(op.c_str(), {x.desc});
  if (kind == ActivationKind::kSigmoid && x.desc.storage_elements() != x.shape().elements()) {
    throw BackendError("cuda backend: " + op + ": layout " + layout_name(x.desc.layout) +
                       " pads the channels of " + x.shape().str() +
                       ", which sigmoid(0) = 0.5 would fill; use nchw or nhwc");
  }
  cuda::activation_forward(activation_of(kind), element(type), x.data, y.data,
                           x.desc.storage_elements(), compute_.get());
}

// dx = dy * f'(x); dx may alias dy.
void CudaBackend::activation_backward(ActivationKind kind, const Tensor& x, const Tensor& dy,
                                      const Tensor& dx) {
  const std::string op = std::string(activation_name(kind)) + "_backward";
  check_same_desc(op.c_str(), {{"x", x.desc}, {"dy", dy.desc}, {"dx", dx.desc}});
  const DataType type = call_type(op.c_str(), {x.desc});
  cuda::activation_backward(activation_of(kind), element(type), x.data, dy.data, dx.data,
                            x.desc.storage_elements(), compute_.get());
}

// add and accumulate sum in float and round once to the tensors' type.
void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  if (!(a.shape() == b.shape()) || !(a.shape() == y.shape())) {
    throw BackendError("add: shapes differ: " + a.shape().str() + ", " + b.shape().str() + " -> " +
                       y.shape().str());
  }
  const DataType type = call_type("add", {a.desc, b.desc, y.desc});
  const Layout layout = y.desc.layout;
  const size_t bytes = y.bytes();
  const size_t staging_bytes = add_staging_bytes(a.desc, b.desc, y.desc);
  char* staging = staging_bytes > 0 ? scratch(staging_bytes) : nullptr;
  const void* pa = in_layout(a, layout, staging);
  const void* pb = in_layout(b, layout, staging ? staging + align_up(bytes) : nullptr);
  cuda::add(element(type), pa, pb, y.data, y.desc.storage_elements(), compute_.get());
}

void CudaBackend::accumulate(const Tensor& x, const Tensor& y, float beta) {
  check_beta("accumulate", beta);
  if (!(x.shape() == y.shape())) {
    throw BackendError("accumulate: shapes differ: " + x.shape().str() + " vs " + y.shape().str());
  }
  const DataType type = call_type("accumulate", {x.desc, y.desc});  // beta 0 would convert silently
  if (beta == 0.0f) {
    convert(x, y);
    return;
  }
  const Layout layout = y.desc.layout;
  void* staging = x.desc.layout != layout ? scratch(y.bytes()) : nullptr;
  cuda::accumulate(element(type), in_layout(x, layout, staging), element(type), y.data, beta,
                   y.desc.storage_elements(), compute_.get());
}

void CudaBackend::scale(float* x, int64_t count, float alpha) {
  cuda::scale(x, alpha, count, compute_.get());
}

void CudaBackend::sgd_update(float* w, const float* g, float* velocity, int64_t count,
                             const SgdStep& step) {
  cuda::sgd_update(w, g, velocity, count, step.lr, step.momentum, step.weight_decay,
                   step.grad_scale, step.nesterov, compute_.get());
}

void CudaBackend::adamw_update(float* w, const float* g, float* m, float* v, int64_t count,
                               const AdamWStep& step) {
  const AdamWFactors f = adamw_factors(step);
  cuda::adamw_update(w, g, m, v, count, step.beta1, step.beta2, step.eps, step.grad_scale,
                     f.decay, f.step_size, f.sqrt_correction2, compute_.get());
}

void CudaBackend::moving_average(float* average, const float* x, int64_t count, float decay) {
  cuda::moving_average(average, x, count, decay, compute_.get());
}

// The segment offsets, then the partial sums, in the ops' scratch.
size_t CudaBackend::sum_squares_scratch_bytes(size_t segments) {
  if (segments == 0) return 0;
  return (segments + 1) * sizeof(int64_t) +
         segments * static_cast<size_t>(cuda::kSumSquaresBlocks) * sizeof(double);
}

std::vector<double> CudaBackend::sum_squares(const float* x, std::span<const int64_t> offsets) {
  const size_t segments = offsets.empty() ? 0 : offsets.size() - 1;
  std::vector<double> sums(segments, 0.0);
  if (segments == 0) return sums;
  const std::string what = "sum_squares over " + std::to_string(segments) + " segment(s)";
  const size_t offset_bytes = offsets.size() * sizeof(int64_t);
  const size_t partial_bytes = sum_squares_scratch_bytes(segments) - offset_bytes;
  char* device = scratch(offset_bytes + partial_bytes);
  char* host = pinned_staging(offset_bytes + partial_bytes);
  std::memcpy(host, offsets.data(), offset_bytes);
  VTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(device, host, offset_bytes, cudaMemcpyHostToDevice, compute_.get()), what);
  auto* partials = reinterpret_cast<double*>(device + offset_bytes);
  cuda::sum_squares(x, reinterpret_cast<const int64_t*>(device),
                    static_cast<int64_t>(segments), partials, compute_.get());
  VTRAIN_CUDA_CHECK(cudaMemcpyAsync(host + offset_bytes, partials, partial_bytes,
                                    cudaMemcpyDeviceToHost, compute_.get()),
                    what);
  sync_compute(what);
  const auto* host_partials = reinterpret_cast<const double*>(host + offset_bytes);
  for (size_t s = 0; s < segments; ++s) {
    for (int64_t b = 0; b < cuda::kSumSquaresBlocks; ++b) {
      sums[s] += host_partials[s * cuda::kSumSquaresBlocks + static_cast<size_t>(b)];
    }
  }
  return sums;
}

// ----------------------------------------------------------------- pooling

// cuDNN pools NCHW and NHWC alike; x and y (and dy, dx) in one layout. Max
// pooling over windows that tile x (VGG's 2x2, stride 2) runs in our own
// kernels, which read each input once: cuDNN's NHWC backward took 6.2 ms
// for VGG-16's pool1 at batch 64 on an H100, its forward 0.49 ms on an H200
// (257 MB moved: about a ninth of the memory's speed).
static void require_one_layout(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    require_cudnn_layout(op, t->desc);
    if (t->desc.layout != (*tensors.begin())->desc.layout) {
      throw BackendError(std::string("cuda backend: ") + op + ": tensors in " +
                         layout_name((*tensors.begin())->desc.layout) + " and " +
                         layout_name(t->desc.layout) + "; this op takes one layout");
    }
  }
}

// Whether p's windows tile x exactly, and y is the shape they make.
static bool tiled_max_pool(const PoolDesc& p, const Shape& x, const Shape& y) {
  const Window& win = p.window;
  return p.kind == PoolKind::kMax && win.kernel_h == win.stride_h &&
         win.kernel_w == win.stride_w && win.pad_h == 0 && win.pad_w == 0 &&
         x.h % win.kernel_h == 0 && x.w % win.kernel_w == 0 && y.n == x.n && y.c == x.c &&
         y.h == x.h / win.kernel_h && y.w == x.w / win.kernel_w;
}

void CudaBackend::pooling_forward(const PoolDesc& p, const Tensor& x, const Tensor& y, void*) {
  require_one_layout("pooling_forward", {&x, &y});
  const DataType type = call_type("pooling_forward", {x.desc, y.desc});
  const Shape& s = x.shape();
  if (tiled_max_pool(p, s, y.shape())) {
    cuda::max_pool_forward_tiled(element(type), x.data, y.data, s.n, s.c, s.h, s.w,
                                 p.window.kernel_h, p.window.kernel_w, channels_last(x.desc),
                                 compute_.get());
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  VTRAIN_CUDA_CHECK(cudnnPoolingForward(cudnn_.get(), pool_desc(p), &one, tensor_desc(x.desc),
                                        x.data, &zero, tensor_desc(y.desc), y.data),
                    "pooling_forward " + x.shape().str() + " -> " + y.shape().str());
}

void CudaBackend::pooling_backward(const PoolDesc& p, const Tensor& x, const Tensor& y,
                                   const Tensor& dy, const Tensor& dx, const void*) {
  require_one_layout("pooling_backward", {&x, &y, &dy, &dx});
  const DataType type = call_type("pooling_backward", {x.desc, y.desc, dy.desc, dx.desc});
  const Shape& s = x.shape();
  if (tiled_max_pool(p, s, dy.shape())) {
    cuda::max_pool_backward_tiled(element(type), x.data, dy.data, dx.data, s.n, s.c, s.h, s.w,
                                  p.window.kernel_h, p.window.kernel_w, channels_last(x.desc),
                                  compute_.get());
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  const cudnnTensorDescriptor_t xd = tensor_desc(x.desc), yd = tensor_desc(y.desc);
  VTRAIN_CUDA_CHECK(cudnnPoolingBackward(cudnn_.get(), pool_desc(p), &one, yd, y.data, yd, dy.data,
                                         xd, x.data, &zero, xd, dx.data),
                    "pooling_backward " + x.shape().str() + " <- " + y.shape().str());
}

// ------------------------------------------------------------ concat, loss

// Channels [src_offset, src_offset + channels) of every pixel of src (src_c
// channels) into channels [dst_offset, ...) of dst (dst_c channels), both
// in `layout` (NCHW: a run of channels * hw per sample; NHWC: a run of
// `channels` per pixel), + beta * dst.
void CudaBackend::copy_channels(DataType type, const void* src, int64_t src_c, int64_t src_offset,
                                void* dst, int64_t dst_c, int64_t dst_offset, int64_t channels,
                                int64_t n, int64_t hw, Layout layout, float beta) {
  if (layout == Layout::kNhwc) {
    copy_rows(element(type), worker::element_at(src, src_offset, type), src_c,
              element_at(dst, dst_offset, type), dst_c, n * hw, channels, beta, compute_.get());
  } else {
    copy_rows(element(type), worker::element_at(src, src_offset * hw, type), src_c * hw,
              element_at(dst, dst_offset * hw, type), dst_c * hw, n, channels * hw, beta,
              compute_.get());
  }
}

// Inputs in y's layout are copied into their channels of y; others are
// reordered into it first, one at a time, in the scratch.
void CudaBackend::concat_forward(std::span<const Tensor> xs, const Tensor& y) {
  require_cudnn_layout("concat_forward", y.desc);
  const Shape ys = y.shape();
  int64_t channels = 0;
  for (const Tensor& x : xs) {
    require_cudnn_layout("concat_forward", x.desc);
    call_type("concat_forward", {x.desc, y.desc});
    if (x.shape().n != ys.n || x.shape().h != ys.h || x.shape().w != ys.w) {
      throw BackendError("concat: input " + x.shape().str() + " does not fit output " + ys.str());
    }
    channels += x.shape().c;
  }
  if (channels != ys.c) {
    throw BackendError("concat: inputs have " + std::to_string(channels) + " channels, output " +
                       std::to_string(ys.c));
  }
  std::vector<TensorDesc> descs;
  for (const Tensor& x : xs) descs.push_back(x.desc);
  char* staging = nullptr;
  if (const size_t bytes = concat_scratch_bytes(descs, y.desc); bytes > 0) staging = scratch(bytes);
  const DataType type = y.desc.dtype;
  int64_t offset = 0;
  for (const Tensor& x : xs) {
    const int64_t c = x.shape().c;
    copy_channels(type, in_layout(x, y.desc.layout, staging), c, 0, y.data, ys.c, offset, c, ys.n,
                  ys.h * ys.w, y.desc.layout, 0.0f);
    offset += c;
  }
}

// dx in dy's layout takes its channels straight; in another layout they go
// through the scratch in dy's layout (and, with beta, a second copy in dx's).
void CudaBackend::concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx,
                                  float beta) {
  check_beta("concat_backward", beta);
  require_cudnn_layout("concat_backward", dy.desc);
  require_cudnn_layout("concat_backward", dx.desc);
  const DataType type = call_type("concat_backward", {dy.desc, dx.desc});
  const Shape ys = dy.shape();
  const Shape xs = dx.shape();
  check_concat_slice(ys, channel_offset, xs);
  const int64_t hw = ys.h * ys.w;
  if (dx.desc.layout == dy.desc.layout) {
    copy_channels(type, dy.data, ys.c, channel_offset, dx.data, xs.c, 0, xs.c, ys.n, hw,
                  dy.desc.layout, beta);
    return;
  }
  const size_t part = align_up(dx.bytes());
  char* staging = scratch(2 * part);
  const Tensor slice{{xs, dy.desc.layout, type}, staging};
  copy_channels(type, dy.data, ys.c, channel_offset, slice.data, xs.c, 0, xs.c, ys.n, hw,
                dy.desc.layout, 0.0f);
  if (beta == 0.0f) {
    convert(slice, dx);
    return;
  }
  cuda::accumulate(element(type), in_layout(slice, dx.desc.layout, staging + part), element(type),
                   dx.data, beta, dx.desc.storage_elements(), compute_.get());
}

}  // namespace vtrain::worker::cuda
