// Kernels of the CUDA backend. See cuda_kernels.h.
//
// Every elementwise kernel is a grid-stride loop over 64-bit indices, so one
// launch shape (kThreads x at most kMaxBlocks) serves any size. Kernels that
// touch tensors are templates over the element type (float, __nv_bfloat16,
// __half); with_type() picks the instance for an Element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "worker/device/cuda/cuda_check.h"
#include "worker/device/cuda/cuda_kernels.h"

namespace vtrain::worker::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;
constexpr int kWarp = 32;

unsigned blocks_for(int64_t count) {
  return static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
}

// f(T{}) with T the CUDA element type of `type`.
template <typename F>
void with_type(Element type, F&& f) {
  switch (type) {
    case Element::kF32: f(float{}); return;
    case Element::kBF16: f(__nv_bfloat16{}); return;
    case Element::kF16: f(__half{}); return;
  }
}

// Elements to float and back; from_float rounds to nearest even (and
// overflows to infinity) as the Backend contract's conversions do.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ int64_t index_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__device__ int64_t padded_channels(int64_t c, int64_t block) {
  return (c + block - 1) / block * block;
}

// Storage index i of a tensor with channel block `block` -> its sample,
// channel and spatial position.
struct Position {
  int64_t n, c, s;
};
__device__ Position position_of(int64_t i, int64_t c, int64_t hw, int64_t block) {
  const int64_t per_sample = padded_channels(c, block) * hw;
  const int64_t r = i % per_sample;
  const int64_t in_block = r % (hw * block);
  return {i / per_sample, (r / (hw * block)) * block + in_block % block, in_block / block};
}
__device__ int64_t offset_of(const Position& p, int64_t c, int64_t hw, int64_t block) {
  return p.n * padded_channels(c, block) * hw + (p.c / block) * hw * block + p.s * block +
         p.c % block;
}

template <typename S, typename D>
__global__ void reorder_kernel(const S* src, int64_t src_block, D* dst, int64_t c, int64_t hw,
                               int64_t dst_block, int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const Position p = position_of(i, c, hw, dst_block);
    dst[i] = from_float<D>(p.c < c ? to_float(src[offset_of(p, c, hw, src_block)]) : 0.0f);
  }
}

template <typename T>
__global__ void fill_kernel(T* dst, int64_t c, int64_t hw, int64_t block, float value,
                            int64_t count) {
  const T v = from_float<T>(value), zero = from_float<T>(0.0f);
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    dst[i] = position_of(i, c, hw, block).c < c ? v : zero;
  }
}

template <typename T>
__global__ void add_bias_kernel(T* y, const T* bias, int64_t c, int64_t hw, bool channels_last,
                                int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const int64_t ch = channels_last ? i % c : i / hw % c;
    y[i] = from_float<T>(to_float(y[i]) + to_float(bias[ch]));
  }
}

template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    y[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
  }
}

template <typename X, typename Y>
__global__ void accumulate_kernel(const X* x, Y* y, float beta, int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const float v = to_float(x[i]);
    y[i] = from_float<Y>(beta == 0.0f ? v : v + beta * to_float(y[i]));
  }
}

__global__ void scale_kernel(float* x, float alpha, int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) x[i] *= alpha;
}

__global__ void flag_non_finite_kernel(const float* x, int64_t count, int32_t* flag) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    if (!isfinite(x[i])) *flag = 1;  // every writer writes 1: the race is benign
  }
}

template <typename T>
__global__ void copy_rows_kernel(const T* src, int64_t src_pitch, T* dst, int64_t dst_pitch,
                                 int64_t row_length, float beta, int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const int64_t row = i / row_length, col = i % row_length;
    const float v = to_float(src[row * src_pitch + col]);
    T& out = dst[row * dst_pitch + col];
    out = beta == 0.0f ? from_float<T>(v) : from_float<T>(v + beta * to_float(out));
  }
}

// One warp per row.
template <typename T>
__global__ void softmax_xent_kernel(const T* logits, const int32_t* labels, int64_t n,
                                    int64_t classes, float scale, T* dlogits, double* loss,
                                    int32_t* correct, int32_t* bad_label) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (row >= n) return;
  const T* z = logits + row * classes;
  T* d = dlogits ? dlogits + row * classes : nullptr;
  const int32_t label = labels[row];
  if (label < 0 || label >= classes) {
    if (lane == 0) {
      bad_label[0] = 1;
      bad_label[1] = label;
      loss[row] = 0.0;
      correct[row] = 0;
    }
    if (d) {
      for (int64_t j = lane; j < classes; j += kWarp) d[j] = from_float<T>(0.0f);
    }
    return;
  }
  // Arg-max, first maximum on ties (as the CPU backend): each lane keeps its
  // first maximum, the reduction prefers the smaller index on equal values.
  float best = -INFINITY;
  int64_t best_j = INT64_MAX;
  for (int64_t j = lane; j < classes; j += kWarp) {
    const float zj = to_float(z[j]);
    if (best_j == INT64_MAX || zj > best) {
      best = zj;
      best_j = j;
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int64_t other_j = __shfl_xor_sync(0xffffffffu, best_j, offset);
    if (other_j != INT64_MAX &&
        (best_j == INT64_MAX || other > best || (other == best && other_j < best_j))) {
      best = other;
      best_j = other_j;
    }
  }
  const double zmax = best;
  double denom = 0.0;
  for (int64_t j = lane; j < classes; j += kWarp) {
    denom += exp(static_cast<double>(to_float(z[j])) - zmax);
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    denom += __shfl_xor_sync(0xffffffffu, denom, offset);
  }
  const double log_denom = log(denom);
  if (lane == 0) {
    loss[row] = log_denom - (static_cast<double>(to_float(z[label])) - zmax);
    correct[row] = best_j == label ? 1 : 0;
  }
  if (d) {
    for (int64_t j = lane; j < classes; j += kWarp) {
      const double p = exp(static_cast<double>(to_float(z[j])) - zmax - log_denom);
      d[j] = from_float<T>(static_cast<float>((p - (j == label ? 1.0 : 0.0)) * scale));
    }
  }
}

__global__ void sgd_kernel(float* w, const float* g, float* v, int64_t count, float lr,
                           float momentum, float weight_decay, float grad_scale) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const float vi = momentum * v[i] + g[i] * grad_scale + weight_decay * w[i];
    v[i] = vi;
    w[i] -= lr * vi;
  }
}

__global__ void inverse_std_to_variance_kernel(const float* inv_std, float* var, int64_t count,
                                               float eps) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const double s = inv_std[i];
    var[i] = static_cast<float>(1.0 / (s * s) - eps);
  }
}

__global__ void variance_to_inverse_std_kernel(const float* var, float* inv_std, int64_t count,
                                               float eps) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    inv_std[i] = static_cast<float>(1.0 / sqrt(static_cast<double>(var[i]) + eps));
  }
}

void check_launch(const char* kernel) {
  VTRAIN_CUDA_CHECK(cudaGetLastError(), std::string("launch of ") + kernel);
}

// Where element `pixel_index` (sample * hw + pixel) of channel ch is stored
// in a tensor of c channels and hw pixels: NCHW, or NHWC (channels_last).
__device__ int64_t channel_element(int64_t pixel_index, int64_t ch, int64_t c, int64_t hw,
                                   bool channels_last) {
  return channels_last ? pixel_index * c + ch
                       : (pixel_index / hw * c + ch) * hw + pixel_index % hw;
}

// One block per channel: each thread sums a strided share of the channel's
// n * hw elements in double, then the block adds the threads' sums in
// shared memory (a fixed tree, so the result does not vary between runs).
// with_dy: the backward sums (dy and dy * xhat), else x and x^2.
template <bool with_dy, typename T>
__global__ void batch_norm_sums_kernel(const T* x, const T* dy, const float* mean,
                                       const float* var, float eps, int64_t n, int64_t c,
                                       int64_t hw, bool channels_last, double* sums) {
  __shared__ double first[kThreads], second[kThreads];
  const int64_t ch = blockIdx.x;
  const float m = with_dy ? mean[ch] : 0.0f;
  const float inv_std = with_dy ? 1.0f / sqrtf(var[ch] + eps) : 1.0f;
  double a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x) {
    const int64_t at = channel_element(i, ch, c, hw, channels_last);
    const float xi = to_float(x[at]);
    if (with_dy) {
      const float dyi = to_float(dy[at]);
      a += dyi;
      b += static_cast<double>(dyi) * ((xi - m) * inv_std);
    } else {
      a += xi;
      b += static_cast<double>(xi) * xi;
    }
  }
  first[threadIdx.x] = a;
  second[threadIdx.x] = b;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      first[threadIdx.x] += first[threadIdx.x + half];
      second[threadIdx.x] += second[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    sums[ch] = first[0];
    sums[c + ch] = second[0];
  }
}

template <typename T>
__global__ void batch_norm_backward_data_kernel(const T* x, const T* dy, const float* gamma,
                                                const float* mean, const float* var,
                                                const float* dy_means, float eps, int64_t c,
                                                int64_t hw, bool channels_last, T* dx,
                                                int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const int64_t ch = channels_last ? i % c : i / hw % c;
    const float inv_std = 1.0f / sqrtf(var[ch] + eps);
    const float xhat = (to_float(x[i]) - mean[ch]) * inv_std;
    dx[i] = from_float<T>(gamma[ch] * inv_std *
                          (to_float(dy[i]) - dy_means[ch] - xhat * dy_means[c + ch]));
  }
}

// One block per channel, as batch_norm_sums_kernel, in float.
template <typename T>
__global__ void bias_gradient_kernel(const T* dy, int64_t n, int64_t c, int64_t hw,
                                     bool channels_last, float beta, float* dbias) {
  __shared__ float partial[kThreads];
  const int64_t ch = blockIdx.x;
  float a = 0.0f;
  for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x) {
    a += to_float(dy[channel_element(i, ch, c, hw, channels_last)]);
  }
  partial[threadIdx.x] = a;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) dbias[ch] = beta == 0.0f ? partial[0] : partial[0] + beta * dbias[ch];
}

// One thread per output position: finds the first maximum of its window (row
// by row) and writes dy there and 0 to the window's other elements. The
// windows tile x, so every element of dx is written once.
template <typename T>
__global__ void max_pool_backward_tiled_kernel(const T* x, const T* dy, T* dx, int64_t c,
                                               int64_t h, int64_t w, int64_t oh, int64_t ow,
                                               int kh, int kw, bool channels_last,
                                               int64_t count) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    int64_t ch, ox, oy, n;
    if (channels_last) {
      ch = i % c;
      ox = i / c % ow;
      oy = i / (c * ow) % oh;
      n = i / (c * ow * oh);
    } else {
      ox = i % ow;
      oy = i / ow % oh;
      ch = i / (ow * oh) % c;
      n = i / (ow * oh * c);
    }
    // Element (row, col) of x for this channel: offset + row * row_step + col * col_step.
    const int64_t col_step = channels_last ? c : 1, row_step = w * col_step;
    const int64_t origin = channels_last ? ((n * h + oy * kh) * w + ox * kw) * c + ch
                                         : ((n * c + ch) * h + oy * kh) * w + ox * kw;
    int best_at = 0;
    float best = to_float(x[origin]);
    for (int r = 0; r < kh; ++r) {
      for (int q = 0; q < kw; ++q) {
        const float v = to_float(x[origin + r * row_step + q * col_step]);
        if (v > best) {
          best = v;
          best_at = r * kw + q;
        }
      }
    }
    const T g = dy[i], zero = from_float<T>(0.0f);
    for (int r = 0; r < kh; ++r) {
      for (int q = 0; q < kw; ++q) {
        dx[origin + r * row_step + q * col_step] = r * kw + q == best_at ? g : zero;
      }
    }
  }
}

}  // namespace

void reorder(Element src_type, const void* src, int64_t src_block, Element dst_type, void* dst,
             const BlockedShape& dst_shape, cudaStream_t stream) {
  const int64_t count = dst_shape.storage_elements();
  if (count == 0) return;
  with_type(src_type, [&](auto s) {
    with_type(dst_type, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      reorder_kernel<S, D><<<blocks_for(count), kThreads, 0, stream>>>(
          static_cast<const S*>(src), src_block, static_cast<D*>(dst), dst_shape.c,
          dst_shape.h * dst_shape.w, dst_shape.block, count);
    });
  });
  check_launch("reorder_kernel");
}

void fill(Element type, void* dst, const BlockedShape& shape, float value, cudaStream_t stream) {
  const int64_t count = shape.storage_elements();
  if (count == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    fill_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<T*>(dst), shape.c, shape.h * shape.w, shape.block, value, count);
  });
  check_launch("fill_kernel");
}

void add(Element type, const void* a, const void* b, void* y, int64_t count,
         cudaStream_t stream) {
  if (count == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    add_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), count);
  });
  check_launch("add_kernel");
}

void add_bias(Element type, void* y, const void* bias, int64_t n, int64_t c, int64_t hw,
              bool channels_last, cudaStream_t stream) {
  const int64_t count = n * c * hw;
  if (count == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    add_bias_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(bias), c, hw, channels_last, count);
  });
  check_launch("add_bias_kernel");
}

void accumulate(Element x_type, const void* x, Element y_type, void* y, float beta,
                int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  with_type(x_type, [&](auto xt) {
    with_type(y_type, [&](auto yt) {
      using X = decltype(xt);
      using Y = decltype(yt);
      accumulate_kernel<X, Y><<<blocks_for(count), kThreads, 0, stream>>>(
          static_cast<const X*>(x), static_cast<Y*>(y), beta, count);
    });
  });
  check_launch("accumulate_kernel");
}

void scale(float* x, float alpha, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  scale_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, alpha, count);
  check_launch("scale_kernel");
}

void flag_non_finite(const float* x, int64_t count, int32_t* flag, cudaStream_t stream) {
  if (count == 0) return;
  flag_non_finite_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, count, flag);
  check_launch("flag_non_finite_kernel");
}

void copy_rows(Element type, const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch,
               int64_t rows, int64_t row_length, float beta, cudaStream_t stream) {
  const int64_t count = rows * row_length;
  if (count == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    copy_rows_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<const T*>(src), src_pitch, static_cast<T*>(dst), dst_pitch, row_length, beta,
        count);
  });
  check_launch("copy_rows_kernel");
}

void softmax_cross_entropy(Element type, const void* logits, const int32_t* labels, int64_t n,
                           int64_t classes, float scale, void* dlogits, double* loss,
                           int32_t* correct, int32_t* bad_label, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kRowsPerBlock = kThreads / kWarp;
  const auto blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  with_type(type, [&](auto t) {
    using T = decltype(t);
    softmax_xent_kernel<T><<<blocks, kThreads, 0, stream>>>(
        static_cast<const T*>(logits), labels, n, classes, scale, static_cast<T*>(dlogits), loss,
        correct, bad_label);
  });
  check_launch("softmax_xent_kernel");
}

void sgd_update(float* w, const float* g, float* v, int64_t count, float lr, float momentum,
                float weight_decay, float grad_scale, cudaStream_t stream) {
  if (count == 0) return;
  sgd_kernel<<<blocks_for(count), kThreads, 0, stream>>>(w, g, v, count, lr, momentum,
                                                         weight_decay, grad_scale);
  check_launch("sgd_kernel");
}

void inverse_std_to_variance(const float* inv_std, float* var, int64_t count, float eps,
                             cudaStream_t stream) {
  if (count == 0) return;
  inverse_std_to_variance_kernel<<<blocks_for(count), kThreads, 0, stream>>>(inv_std, var, count,
                                                                             eps);
  check_launch("inverse_std_to_variance_kernel");
}

void variance_to_inverse_std(const float* var, float* inv_std, int64_t count, float eps,
                             cudaStream_t stream) {
  if (count == 0) return;
  variance_to_inverse_std_kernel<<<blocks_for(count), kThreads, 0, stream>>>(var, inv_std, count,
                                                                             eps);
  check_launch("variance_to_inverse_std_kernel");
}

void batch_norm_sums(Element type, const void* x, int64_t n, int64_t c, int64_t hw,
                     bool channels_last, double* sums, cudaStream_t stream) {
  if (c == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    batch_norm_sums_kernel<false, T><<<static_cast<unsigned>(c), kThreads, 0, stream>>>(
        static_cast<const T*>(x), nullptr, nullptr, nullptr, 0.0f, n, c, hw, channels_last, sums);
  });
  check_launch("batch_norm_sums_kernel");
}

void batch_norm_backward_sums(Element type, const void* x, const void* dy, const float* mean,
                              const float* var, float eps, int64_t n, int64_t c, int64_t hw,
                              bool channels_last, double* sums, cudaStream_t stream) {
  if (c == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    batch_norm_sums_kernel<true, T><<<static_cast<unsigned>(c), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), mean, var, eps, n, c, hw,
        channels_last, sums);
  });
  check_launch("batch_norm_sums_kernel");
}

void batch_norm_backward_data(Element type, const void* x, const void* dy, const float* gamma,
                              const float* mean, const float* var, const float* dy_means,
                              float eps, int64_t n, int64_t c, int64_t hw, bool channels_last,
                              void* dx, cudaStream_t stream) {
  const int64_t count = n * c * hw;
  if (count == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    batch_norm_backward_data_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), gamma, mean, var, dy_means, eps, c,
        hw, channels_last, static_cast<T*>(dx), count);
  });
  check_launch("batch_norm_backward_data_kernel");
}

void bias_gradient(Element type, const void* dy, int64_t n, int64_t c, int64_t hw,
                   bool channels_last, float* dbias, float beta, cudaStream_t stream) {
  if (c == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    bias_gradient_kernel<T><<<static_cast<unsigned>(c), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), n, c, hw, channels_last, beta, dbias);
  });
  check_launch("bias_gradient_kernel");
}

void max_pool_backward_tiled(Element type, const void* x, const void* dy, void* dx, int64_t n,
                             int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                             bool channels_last, cudaStream_t stream) {
  const int64_t oh = h / kh, ow = w / kw;
  const int64_t count = n * c * oh * ow;
  if (count == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    max_pool_backward_tiled_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), c, h, w, oh, ow,
        static_cast<int>(kh), static_cast<int>(kw), channels_last, count);
  });
  check_launch("max_pool_backward_tiled_kernel");
}

}  // namespace vtrain::worker::cuda
