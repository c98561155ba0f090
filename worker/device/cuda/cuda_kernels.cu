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
#include <cstdint>
#include <string>
#include <type_traits>

#include "worker/device/cuda/channel_sum_grid.h"
#include "worker/device/cuda/cuda_check.h"
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/dropout_body.h"
#include "worker/device/cuda/kernel_bodies.h"

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

// A grid-stride loop's first index and stride in the index type I. The
// memory-bound kernels (relu, the bias, tiled max pooling, reorder, fill)
// index in 32 bits where every index fits: a division by a runtime size,
// which their index arithmetic needs, costs several times more in 64. I is
// uint32_t or int64_t there (with_index picks it on the host); the others
// index in 64 bits.
template <typename I>
__device__ I first_index_as() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <typename I>
__device__ I index_stride_as() {
  return static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
}
__device__ int64_t first_index() { return first_index_as<int64_t>(); }
__device__ int64_t index_stride() { return index_stride_as<int64_t>(); }

// The kernels' element conversions, for kernel_bodies.h.
struct DeviceConvert {
  template <typename T>
  __device__ static float to_float(T v) {
    return cuda::to_float(v);
  }
  template <typename T>
  __device__ static T from_float(float v) {
    return cuda::from_float<T>(v);
  }
};

// Grid-stride loops over the bodies of kernel_bodies.h.
template <typename S, typename D, typename I>
__global__ void reorder_kernel(const S* src, I src_block, D* dst, I c, I hw, I dst_block,
                               I count) {
  for (I i = first_index_as<I>(); i < count; i += index_stride_as<I>()) {
    reorder_at<DeviceConvert>(i, src, src_block, dst, c, hw, dst_block);
  }
}

template <typename T, typename I>
__global__ void fill_kernel(T* dst, I c, I hw, I block, float value, I count) {
  const T v = from_float<T>(value), zero = from_float<T>(0.0f);
  for (I i = first_index_as<I>(); i < count; i += index_stride_as<I>()) {
    fill_at(i, dst, c, hw, block, v, zero);
  }
}

template <typename T, int V, typename I>
__global__ void add_bias_kernel(const T* x, T* y, const T* bias, I c, I hw, bool channels_last,
                                bool relu, I vectors) {
  for (I i = first_index_as<I>(); i < vectors; i += index_stride_as<I>()) {
    add_bias_at<DeviceConvert, T, V>(i, x, y, bias, c, hw, channels_last, relu);
  }
}

template <typename T, int V, typename I>
__global__ void relu_forward_kernel(const T* x, T* y, I vectors) {
  for (I i = first_index_as<I>(); i < vectors; i += index_stride_as<I>()) {
    relu_forward_at<DeviceConvert, T, V>(i, x, y);
  }
}

template <typename T, int V, typename I>
__global__ void relu_backward_kernel(const T* y, const T* dy, T* dx, I vectors) {
  for (I i = first_index_as<I>(); i < vectors; i += index_stride_as<I>()) {
    relu_backward_at<DeviceConvert, T, V>(i, y, dy, dx);
  }
}

template <typename T, int V, typename I>
__global__ void activation_forward_kernel(Activation a, const T* x, T* y, I vectors) {
  for (I i = first_index_as<I>(); i < vectors; i += index_stride_as<I>()) {
    activation_forward_at<DeviceConvert, T, V>(i, a, x, y);
  }
}

template <typename T, int V, typename I>
__global__ void activation_backward_kernel(Activation a, const T* x, const T* dy, T* dx,
                                           I vectors) {
  for (I i = first_index_as<I>(); i < vectors; i += index_stride_as<I>()) {
    activation_backward_at<DeviceConvert, T, V>(i, a, x, dy, dx);
  }
}

template <typename T, int V, typename I>
__global__ void mul_kernel(const T* a, const T* b, T* y, float beta, MulShape<I> shape,
                           I vectors) {
  for (I i = first_index_as<I>(); i < vectors; i += index_stride_as<I>()) {
    mul_at<DeviceConvert, T, V>(i, a, b, y, beta, shape);
  }
}

// kMulSum over NCHW (block 1): a warp per (n, ch) plane, its lanes along the
// plane's contiguous pixels, then a butterfly in a fixed order. Channels up
// to `channels` (y's padded count) so that y's padding is written.
constexpr int kMulSumWarps = kThreads / kWarp;
template <typename T>
__global__ void mul_sum_plane_kernel(const T* a, const T* b, T* y, float beta,
                                     MulShape<int64_t> s, int64_t channels, int64_t planes) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  for (int64_t plane = first_index() / kWarp; plane < planes; plane += index_stride() / kWarp) {
    const int64_t n = plane / channels, ch = plane % channels;
    float sum = ch < s.c ? mul_sum_partial<DeviceConvert>(a, b, n, ch, int64_t{lane},
                                                          int64_t{kWarp}, s)
                         : 0.0f;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) mul_sum_store<DeviceConvert>(y, n, ch, sum, beta, s);
  }
}

// kMulSum over channel-blocked and NHWC tensors: block (n, group of 32
// channels), its threads 32 channel lanes (adjacent in storage) times 8
// pixel lanes; the pixel lanes' sums are added in lane order.
constexpr int kMulSumPixelLanes = kThreads / kWarp;
template <typename T>
__global__ void mul_sum_tile_kernel(const T* a, const T* b, T* y, float beta,
                                    MulShape<int64_t> s, int64_t groups) {
  __shared__ float sums[kMulSumPixelLanes][kWarp];
  const int lane_c = static_cast<int>(threadIdx.x % kWarp);
  const int lane_p = static_cast<int>(threadIdx.x / kWarp);
  const int64_t n = blockIdx.x / groups;
  const int64_t ch = blockIdx.x % groups * kWarp + lane_c;
  sums[lane_p][lane_c] = ch < s.c ? mul_sum_partial<DeviceConvert>(a, b, n, ch, int64_t{lane_p},
                                                                   int64_t{kMulSumPixelLanes}, s)
                                  : 0.0f;
  __syncthreads();
  if (lane_p != 0 || ch >= (s.c + s.other_block - 1) / s.other_block * s.other_block) return;
  float sum = 0.0f;
  for (int p = 0; p < kMulSumPixelLanes; ++p) sum += sums[p][lane_c];
  mul_sum_store<DeviceConvert>(y, n, ch, sum, beta, s);
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
                                    int64_t classes, float scale, float smoothing, T* dlogits,
                                    double* loss, int32_t* correct, int32_t* bad_label) {
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
  // The target: 1 - smoothing on the label, smoothing / classes on every class.
  const double spread = static_cast<double>(smoothing) / static_cast<double>(classes);
  const double on_label = 1.0 - static_cast<double>(smoothing);
  double logits_sum = 0.0;
  if (smoothing != 0.0f) {
    for (int64_t j = lane; j < classes; j += kWarp) {
      logits_sum += static_cast<double>(to_float(z[j])) - zmax;
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      logits_sum += __shfl_xor_sync(0xffffffffu, logits_sum, offset);
    }
  }
  if (lane == 0) {
    double l = on_label * (log_denom - (static_cast<double>(to_float(z[label])) - zmax));
    if (smoothing != 0.0f) l += spread * (static_cast<double>(classes) * log_denom - logits_sum);
    loss[row] = l;
    correct[row] = best_j == label ? 1 : 0;
  }
  if (d) {
    for (int64_t j = lane; j < classes; j += kWarp) {
      const double p = exp(static_cast<double>(to_float(z[j])) - zmax - log_denom);
      const double q = (j == label ? on_label : 0.0) + spread;
      d[j] = from_float<T>(static_cast<float>((p - q) * scale));
    }
  }
}

__global__ void sgd_kernel(float* w, const float* g, float* v, int64_t count, float lr,
                           float momentum, float weight_decay, float grad_scale, bool nesterov) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const float d = g[i] * grad_scale + weight_decay * w[i];
    const float vi = momentum * v[i] + d;
    v[i] = vi;
    w[i] -= lr * (nesterov ? d + momentum * vi : vi);
  }
}

__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, int64_t count,
                             float beta1, float beta2, float eps, float grad_scale, float decay,
                             float step_size, float sqrt_correction2) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const float d = g[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * d;
    const float vi = beta2 * v[i] + (1.0f - beta2) * d * d;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * decay - step_size * (mi / (sqrtf(vi) / sqrt_correction2 + eps));
  }
}

__global__ void moving_average_kernel(float* average, const float* x, int64_t count,
                                      float rate) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    average[i] += rate * (x[i] - average[i]);
  }
}

// Block (x, y) sums the squares of its grid-stride share of segment y into
// partials[y * gridDim.x + x], through a fixed tree in shared memory: the
// same order on every launch.
__global__ void sum_squares_kernel(const float* x, const int64_t* offsets, double* partials) {
  __shared__ double sums[kThreads];
  const int64_t begin = offsets[blockIdx.y], end = offsets[blockIdx.y + 1];
  double sum = 0.0;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    sum += static_cast<double>(x[i]) * x[i];
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.y * gridDim.x + blockIdx.x] = sums[0];
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

// ------------------------------------------ per-channel sums (two passes)

// Pass one (channel_sum_grid.h): block (group, chunk) sums its share of
// each of its channels into partial[(k * chunks + chunk) * c + channel] for
// each of the kSums quantities; each thread in Acc, V channels at a time
// (the grid's vec), then the block's threads in a fixed tree. Term:
// term.template run<N>(at, ch, acc) loads the N packs of V elements at
// at[0..N) (channels ch..ch + V) and adds their quantities to acc[k][l].
template <int kSums, typename Acc, int V, typename Term>
__global__ void channel_partials_kernel(ChannelSumGrid g, Term term, Acc* partials) {
  __shared__ Acc shared[kSums][V][kChannelSumThreads];
  Acc acc[kSums][V];
#pragma unroll
  for (int k = 0; k < kSums; ++k) {
#pragma unroll
    for (int l = 0; l < V; ++l) acc[k][l] = Acc(0);
  }
  g.for_each_run(blockIdx.y, blockIdx.x, static_cast<int>(threadIdx.x),
                 [&](const int64_t (&at)[kChannelSumUnroll], int count, int64_t ch) {
                   if (count == kChannelSumUnroll) {
                     term.template run<kChannelSumUnroll>(at, ch, acc);
                   } else {
                     for (int u = 0; u < count; ++u) term.template run<1>(at + u, ch, acc);
                   }
                 });
#pragma unroll
  for (int k = 0; k < kSums; ++k) {
#pragma unroll
    for (int l = 0; l < V; ++l) shared[k][l][threadIdx.x] = acc[k][l];
  }
  __syncthreads();
  // Thread t holds channel lane t % lanes_c: t and t + half * lanes_c hold one channel.
  for (int half = g.lanes_p / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half * g.lanes_c) {
#pragma unroll
      for (int k = 0; k < kSums; ++k) {
#pragma unroll
        for (int l = 0; l < V; ++l) {
          shared[k][l][threadIdx.x] += shared[k][l][threadIdx.x + half * g.lanes_c];
        }
      }
    }
    __syncthreads();
  }
  if (static_cast<int>(threadIdx.x) < g.lanes_c) {
    const int64_t ch = (static_cast<int64_t>(blockIdx.x) * g.lanes_c + threadIdx.x) * V;
    if (ch < g.c) {
#pragma unroll
      for (int k = 0; k < kSums; ++k) {
#pragma unroll
        for (int l = 0; l < V; ++l) {
          partials[(k * g.chunks + blockIdx.y) * g.c + ch + l] = shared[k][l][threadIdx.x];
        }
      }
    }
  }
}

// Pass two: one thread per channel adds its chunks' partials in chunk order,
// in double whatever Acc is, and hands the totals to finish(channel,
// totals). In float, up to 1024 additions into a total far larger than
// each partial drift by more than the single rounding of a sum: f32 NHWC
// dy of {16, 40, 56, 56} in [0.5, 1) summed over 512 chunks came out 0.04
// off a total of 37,630 in a host replay of these passes.
template <int kSums, typename Acc, typename Finish>
__global__ void channel_totals_kernel(const Acc* partials, int64_t chunks, int64_t c,
                                      Finish finish) {
  for (int64_t ch = first_index(); ch < c; ch += index_stride()) {
    double total[kSums];
#pragma unroll
    for (int k = 0; k < kSums; ++k) {
      double sum = 0.0;
      for (int64_t b = 0; b < chunks; ++b) sum += partials[(k * chunks + b) * c + ch];
      total[k] = sum;
    }
    finish(ch, total);
  }
}

// The terms of the sums, V channels of a pixel at a time (V = 1 but in
// packed NHWC). Each loads its N packs (load_packs) before it uses any.
template <typename T, int V, int N>
__device__ __forceinline__ void load_packs(const T* base, const int64_t* at, Pack<T, V> (&out)[N]) {
#pragma unroll
  for (int u = 0; u < N; ++u) out[u] = load_pack<T, V>(base + at[u]);
}

// Loads the N packs of V elements at base + at[u] (load_packs), then calls
// f(l, value) for each element, pack by pack, l its channel in the pack.
template <int N, int V, typename T, typename F>
__device__ __forceinline__ void for_each_loaded(const T* base, const int64_t* at, F&& f) {
  Pack<T, V> p[N];
  load_packs(base, at, p);
#pragma unroll
  for (int u = 0; u < N; ++u) {
#pragma unroll
    for (int l = 0; l < V; ++l) f(l, to_float(p[u].v[l]));
  }
}

template <typename T, int V>
struct SumTerm {  // the bias gradient: sum of dy, in float
  const T* dy;
  template <int N>
  __device__ void run(const int64_t* at, int64_t, float (&acc)[1][V]) const {
    for_each_loaded<N, V>(dy, at, [&](int l, float v) { acc[0][l] += v; });
  }
};

// relu backward, dx = y <= 0 ? 0 : dy (as relu_backward_at), written, and
// the bias gradient: the sum of dx, in float (as SumTerm over that dx).
// dx may alias dy: each element is read before it is written, and no
// thread reads another's.
template <typename T, int V>
struct ReluBackwardTerm {
  const T* y;
  const T* dy;
  T* dx;
  template <int N>
  __device__ void run(const int64_t* at, int64_t, float (&acc)[1][V]) const {
    Pack<T, V> a[N], g[N];
    load_packs(y, at, a);
    load_packs(dy, at, g);
#pragma unroll
    for (int u = 0; u < N; ++u) {
#pragma unroll
      for (int l = 0; l < V; ++l) {
        if (to_float(a[u].v[l]) <= 0.0f) g[u].v[l] = from_float<T>(0.0f);
        acc[0][l] += to_float(g[u].v[l]);
      }
      store_pack<T, V>(dx + at[u], g[u]);
    }
  }
};

struct BiasFinish {  // dbias = sum (+ beta * dbias), rounded to float once
  float* dbias;
  float beta;
  __device__ void operator()(int64_t ch, const double (&total)[1]) const {
    dbias[ch] = static_cast<float>(beta == 0.0f ? total[0] : total[0] + double{beta} * dbias[ch]);
  }
};

template <typename T, int V>
struct MomentsTerm {  // sum of x and of x^2, in double
  const T* x;
  template <int N>
  __device__ void run(const int64_t* at, int64_t, double (&acc)[2][V]) const {
    for_each_loaded<N, V>(x, at, [&](int l, float v) {
      acc[0][l] += v;
      acc[1][l] += static_cast<double>(v) * v;
    });
  }
};

template <typename T, int V>
struct GradientMomentsTerm {  // sum of dy and of dy * xhat, in double
  const T* x;
  const T* dy;
  const float* mean;
  const float* var;
  float eps;
  template <int N>
  __device__ void run(const int64_t* at, int64_t ch, double (&acc)[2][V]) const {
    Pack<T, V> xs[N], dys[N];
    load_packs(x, at, xs);
    load_packs(dy, at, dys);
#pragma unroll
    for (int l = 0; l < V; ++l) {
      const float m = mean[ch + l], inv_std = 1.0f / sqrtf(var[ch + l] + eps);
#pragma unroll
      for (int u = 0; u < N; ++u) {
        const float dyi = to_float(dys[u].v[l]);
        acc[0][l] += dyi;
        acc[1][l] += static_cast<double>(dyi) * ((to_float(xs[u].v[l]) - m) * inv_std);
      }
    }
  }
};

struct SumsFinish {  // sums[ch], sums[c + ch]
  double* sums;
  int64_t c;
  __device__ void operator()(int64_t ch, const double (&total)[2]) const {
    sums[ch] = total[0];
    sums[c + ch] = total[1];
  }
};

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

// --------------------------------------------------- tiled max pooling

template <bool kBackward, typename T, int V, typename I>
__global__ void max_pool_tiled_kernel(const T* x, const T* dy, T* out, TiledPool<I> pool,
                                      I count) {
  for (I i = first_index_as<I>(); i < count; i += index_stride_as<I>()) {
    max_pool_tiled_at<kBackward, DeviceConvert, T, V>(i, x, dy, out, pool);
  }
}

// 16-byte packs where every address a kernel touches is a multiple of 16
// bytes: its pointers, and `unit` elements (the run a pack must not cross).
bool packs_fit(Element type, int64_t unit, std::initializer_list<const void*> pointers) {
  const int64_t bytes = type == Element::kF32 ? 4 : 2;
  if (unit * bytes % 16 != 0) return false;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// f(I{}): I uint32_t where every index is below `elements` < 2^31, else
// int64_t.
template <typename F>
void with_index(int64_t elements, F&& f) {
  if (elements < (int64_t{1} << 31)) {
    f(uint32_t{});
  } else {
    f(int64_t{});
  }
}

// launch(T{}, I{}, count) over the storage elements of `shape` (padding
// included) in `type`, the index type I picked by with_index; then the
// launch checked under `kernel`'s name.
template <typename Launch>
void launch_per_storage_element(Element type, const BlockedShape& shape, const char* kernel,
                                Launch&& launch) {
  const int64_t count = shape.storage_elements();
  if (count == 0) return;
  with_type(type, [&](auto t) {
    with_index(count, [&](auto index) { launch(t, index, count); });
  });
  check_launch(kernel);
}

// f(std::integral_constant<int, V>{}): V = 16 / sizeof(T), the elements of
// a 16-byte pack, where `packed` (else 1).
template <typename T, typename F>
void with_width(bool packed, F&& f) {
  if (packed) {
    f(std::integral_constant<int, static_cast<int>(16 / sizeof(T))>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

// f(T{}, std::integral_constant<int, V>{}, I{}): T the element type of
// `type`, V as with_width, and I uint32_t where every index is below
// `elements` < 2^31 (else int64_t).
template <typename F>
void with_shape(Element type, bool packed, int64_t elements, F&& f) {
  with_type(type, [&](auto t) {
    with_width<decltype(t)>(packed,
                            [&](auto v) { with_index(elements, [&](auto i) { f(t, v, i); }); });
  });
}

// Launches the two passes of a per-channel reduction of {n, c, hw} of T
// (`type`; term<T, V>{args...}), V channels a thread where the tensor is
// channels last and its channels and `pointers` fit 16-byte packs
// (packs_fit), else 1.
template <int kSums, typename Acc, template <typename, int> class Term, typename T,
          typename Finish, typename... Args>
void channel_sums(Element type, int64_t n, int64_t c, int64_t hw, bool channels_last,
                  Finish finish, void* partials, cudaStream_t stream, const char* what,
                  std::initializer_list<const void*> pointers, Args... args) {
  const bool packed = (channels_last || hw == 1) && packs_fit(type, c, pointers);
  auto* acc = static_cast<Acc*>(partials);
  int64_t chunks = 0;
  with_width<T>(packed, [&](auto v) {
    constexpr int V = decltype(v)::value;
    const ChannelSumGrid g = channel_sum_grid(n, c, hw, channels_last, V);
    chunks = g.chunks;
    // Groups on x (up to 2^31 - 1), chunks on y (at most kChannelSumTargetBlocks).
    const dim3 grid(static_cast<unsigned>(g.groups), static_cast<unsigned>(g.chunks));
    channel_partials_kernel<kSums, Acc, V, Term<T, V>>
        <<<grid, kChannelSumThreads, 0, stream>>>(g, Term<T, V>{args...}, acc);
  });
  check_launch(what);
  channel_totals_kernel<kSums, Acc, Finish><<<blocks_for(c), kThreads, 0, stream>>>(
      acc, chunks, c, finish);
  check_launch(what);
}

}  // namespace

void reorder(Element src_type, const void* src, int64_t src_block, Element dst_type, void* dst,
             const BlockedShape& dst_shape, cudaStream_t stream) {
  const int64_t count = dst_shape.storage_elements();
  if (count == 0) return;
  BlockedShape src_shape = dst_shape;
  src_shape.block = src_block;
  with_type(src_type, [&](auto s) {
    with_type(dst_type, [&](auto d) {
      with_index(std::max(count, src_shape.storage_elements()), [&](auto index) {
        using S = decltype(s);
        using D = decltype(d);
        using I = decltype(index);
        reorder_kernel<S, D, I><<<blocks_for(count), kThreads, 0, stream>>>(
            static_cast<const S*>(src), static_cast<I>(src_block), static_cast<D*>(dst),
            static_cast<I>(dst_shape.c), static_cast<I>(dst_shape.h * dst_shape.w),
            static_cast<I>(dst_shape.block), static_cast<I>(count));
      });
    });
  });
  check_launch("reorder_kernel");
}

void fill(Element type, void* dst, const BlockedShape& shape, float value, cudaStream_t stream) {
  launch_per_storage_element(type, shape, "fill_kernel", [&](auto t, auto index, int64_t count) {
    using T = decltype(t);
    using I = decltype(index);
    fill_kernel<T, I><<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<I>(shape.c), static_cast<I>(shape.h * shape.w),
        static_cast<I>(shape.block), value, static_cast<I>(count));
  });
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

void add_bias(Element type, const void* x, void* y, const void* bias, int64_t n, int64_t c,
              int64_t hw, bool channels_last, bool relu, cudaStream_t stream) {
  const int64_t count = n * c * hw;
  if (count == 0) return;
  // The bias is read an element at a time: only x's and y's accesses are packed.
  const bool packed = packs_fit(type, channels_last ? c : hw, {x, y});
  with_shape(type, packed, count, [&](auto t, auto v, auto index) {
    using T = decltype(t);
    using I = decltype(index);
    constexpr int V = decltype(v)::value;
    const int64_t vectors = count / V;
    add_bias_kernel<T, V, I><<<blocks_for(vectors), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), static_cast<const T*>(bias),
        static_cast<I>(c), static_cast<I>(hw), channels_last, relu, static_cast<I>(vectors));
  });
  check_launch("add_bias_kernel");
}

namespace {

// An elementwise kernel over `count` elements of `type`, in 16-byte packs
// where every pointer allows (packs_fit), else one at a time:
// launch(T{}, V, I{}, vectors) starts it over `vectors` packs; then the
// launch named `name` is checked.
// `unit`: the run a pack must not cross where that is not the whole count.
template <typename F>
void launch_elementwise(Element type, int64_t count, std::initializer_list<const void*> pointers,
                        const char* name, F&& launch, int64_t unit = 0) {
  if (count == 0) return;
  const bool packed = packs_fit(type, unit > 0 ? unit : count, pointers);
  with_shape(type, packed, count, [&](auto t, auto v, auto index) {
    launch(t, v, index, count / decltype(v)::value);
  });
  check_launch(name);
}

}  // namespace

void relu_forward(Element type, const void* x, void* y, int64_t count, cudaStream_t stream) {
  launch_elementwise(type, count, {x, y}, "relu_forward_kernel",
                     [&](auto t, auto v, auto index, int64_t vectors) {
    using T = decltype(t);
    using I = decltype(index);
    relu_forward_kernel<T, decltype(v)::value, I><<<blocks_for(vectors), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), static_cast<I>(vectors));
  });
}

void relu_backward(Element type, const void* y, const void* dy, void* dx, int64_t count,
                   cudaStream_t stream) {
  launch_elementwise(type, count, {y, dy, dx}, "relu_backward_kernel",
                     [&](auto t, auto v, auto index, int64_t vectors) {
    using T = decltype(t);
    using I = decltype(index);
    relu_backward_kernel<T, decltype(v)::value, I><<<blocks_for(vectors), kThreads, 0, stream>>>(
        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx),
        static_cast<I>(vectors));
  });
}

void activation_forward(Activation a, Element type, const void* x, void* y, int64_t count,
                        cudaStream_t stream) {
  launch_elementwise(type, count, {x, y}, "activation_forward_kernel",
                     [&](auto t, auto v, auto index, int64_t vectors) {
    using T = decltype(t);
    using I = decltype(index);
    activation_forward_kernel<T, decltype(v)::value, I>
        <<<blocks_for(vectors), kThreads, 0, stream>>>(a, static_cast<const T*>(x),
                                                       static_cast<T*>(y), static_cast<I>(vectors));
  });
}

void activation_backward(Activation a, Element type, const void* x, const void* dy, void* dx,
                         int64_t count, cudaStream_t stream) {
  launch_elementwise(type, count, {x, dy, dx}, "activation_backward_kernel",
                     [&](auto t, auto v, auto index, int64_t vectors) {
    using T = decltype(t);
    using I = decltype(index);
    activation_backward_kernel<T, decltype(v)::value, I>
        <<<blocks_for(vectors), kThreads, 0, stream>>>(
            a, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx),
            static_cast<I>(vectors));
  });
}

void mul(Element type, const void* a, const void* b, int64_t b_block, void* y, float beta,
         const BlockedShape& shape, cudaStream_t stream) {
  const int64_t hw = shape.h * shape.w;
  const int64_t unit = shape.block == 1 ? hw : shape.block;  // a pack's run: pixels or channels
  // A broadcast b is read an element at a time: its alignment does not matter.
  launch_elementwise(type, shape.storage_elements(), {a, y, b_block == 0 ? b : a}, "mul_kernel",
                     [&](auto t, auto v, auto index, int64_t vectors) {
    using T = decltype(t);
    using I = decltype(index);
    const MulShape<I> s{static_cast<I>(shape.c), static_cast<I>(hw), static_cast<I>(shape.block),
                        static_cast<I>(b_block)};
    mul_kernel<T, decltype(v)::value, I><<<blocks_for(vectors), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), beta, s,
        static_cast<I>(vectors));
  }, unit);
}

void mul_sum(Element type, const void* a, const void* b, void* y, int64_t y_block, float beta,
             const BlockedShape& shape, cudaStream_t stream) {
  const MulShape<int64_t> s{shape.c, shape.h * shape.w, shape.block, y_block};
  const int64_t channels = (shape.c + y_block - 1) / y_block * y_block;  // y's, padding included
  if (shape.n * channels == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    const auto* pa = static_cast<const T*>(a);
    const auto* pb = static_cast<const T*>(b);
    auto* py = static_cast<T*>(y);
    if (shape.block == 1) {
      const int64_t planes = shape.n * channels;
      mul_sum_plane_kernel<T><<<blocks_for(planes * kWarp), kThreads, 0, stream>>>(
          pa, pb, py, beta, s, channels, planes);
    } else {
      const int64_t groups = (channels + kWarp - 1) / kWarp;
      mul_sum_tile_kernel<T><<<static_cast<unsigned>(shape.n * groups), kThreads, 0, stream>>>(
          pa, pb, py, beta, s, groups);
    }
  });
  check_launch("mul_sum_kernel");
}

namespace {

template <typename T, typename I>
__global__ void dropout_kernel(const T* in, T* out, I c, I hw, I block, DropoutCall call,
                               I count) {
  for (I i = first_index_as<I>(); i < count; i += index_stride_as<I>()) {
    dropout_at<DeviceConvert>(i, in, out, c, hw, block, call);
  }
}

}  // namespace

void dropout(Element type, const void* in, void* out, const BlockedShape& shape,
             const DropoutCall& call, cudaStream_t stream) {
  launch_per_storage_element(type, shape, "dropout_kernel", [&](auto t, auto index, int64_t count) {
    using T = decltype(t);
    using I = decltype(index);
    dropout_kernel<T, I><<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<const T*>(in), static_cast<T*>(out), static_cast<I>(shape.c),
        static_cast<I>(shape.h * shape.w), static_cast<I>(shape.block), call,
        static_cast<I>(count));
  });
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
                           int64_t classes, float scale, float smoothing, void* dlogits,
                           double* loss, int32_t* correct, int32_t* bad_label,
                           cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kRowsPerBlock = kThreads / kWarp;
  const auto blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  with_type(type, [&](auto t) {
    using T = decltype(t);
    softmax_xent_kernel<T><<<blocks, kThreads, 0, stream>>>(
        static_cast<const T*>(logits), labels, n, classes, scale, smoothing,
        static_cast<T*>(dlogits), loss, correct, bad_label);
  });
  check_launch("softmax_xent_kernel");
}

void sgd_update(float* w, const float* g, float* v, int64_t count, float lr, float momentum,
                float weight_decay, float grad_scale, bool nesterov, cudaStream_t stream) {
  if (count == 0) return;
  sgd_kernel<<<blocks_for(count), kThreads, 0, stream>>>(w, g, v, count, lr, momentum,
                                                         weight_decay, grad_scale, nesterov);
  check_launch("sgd_kernel");
}

void adamw_update(float* w, const float* g, float* m, float* v, int64_t count, float beta1,
                  float beta2, float eps, float grad_scale, float decay, float step_size,
                  float sqrt_correction2, cudaStream_t stream) {
  if (count == 0) return;
  adamw_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
      w, g, m, v, count, beta1, beta2, eps, grad_scale, decay, step_size, sqrt_correction2);
  check_launch("adamw_kernel");
}

void moving_average(float* average, const float* x, int64_t count, float decay,
                    cudaStream_t stream) {
  if (count == 0) return;
  moving_average_kernel<<<blocks_for(count), kThreads, 0, stream>>>(average, x, count,
                                                                    1.0f - decay);
  check_launch("moving_average_kernel");
}

void sum_squares(const float* x, const int64_t* offsets, int64_t segments, double* partials,
                 cudaStream_t stream) {
  if (segments == 0) return;
  const dim3 grid(kSumSquaresBlocks, static_cast<unsigned>(segments));
  sum_squares_kernel<<<grid, kThreads, 0, stream>>>(x, offsets, partials);
  check_launch("sum_squares_kernel");
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

int64_t batch_norm_sum_partial_bytes(int64_t n, int64_t c, int64_t hw, bool channels_last) {
  return channel_sum_partial_bytes(n, c, hw, channels_last, 2, sizeof(double));
}

void batch_norm_sums(Element type, const void* x, int64_t n, int64_t c, int64_t hw,
                     bool channels_last, double* sums, void* partials, cudaStream_t stream) {
  if (c == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    channel_sums<2, double, MomentsTerm, T>(type, n, c, hw, channels_last, SumsFinish{sums, c},
                                            partials, stream, "batch_norm_sums", {x},
                                            static_cast<const T*>(x));
  });
}

void batch_norm_backward_sums(Element type, const void* x, const void* dy, const float* mean,
                              const float* var, float eps, int64_t n, int64_t c, int64_t hw,
                              bool channels_last, double* sums, void* partials,
                              cudaStream_t stream) {
  if (c == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    channel_sums<2, double, GradientMomentsTerm, T>(
        type, n, c, hw, channels_last, SumsFinish{sums, c}, partials, stream,
        "batch_norm_backward_sums", {x, dy}, static_cast<const T*>(x),
        static_cast<const T*>(dy), mean, var, eps);
  });
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

int64_t bias_gradient_partial_bytes(int64_t n, int64_t c, int64_t hw, bool channels_last) {
  return channel_sum_partial_bytes(n, c, hw, channels_last, 1, sizeof(float));
}

void bias_gradient(Element type, const void* dy, int64_t n, int64_t c, int64_t hw,
                   bool channels_last, float* dbias, float beta, void* partials,
                   cudaStream_t stream) {
  if (c == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    channel_sums<1, float, SumTerm, T>(type, n, c, hw, channels_last, BiasFinish{dbias, beta},
                                       partials, stream, "bias_gradient", {dy},
                                       static_cast<const T*>(dy));
  });
}

void relu_backward_bias(Element type, const void* y, const void* dy, void* dx, int64_t n,
                        int64_t c, int64_t hw, bool channels_last, float* dbias, void* partials,
                        cudaStream_t stream) {
  if (c == 0) return;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    channel_sums<1, float, ReluBackwardTerm, T>(
        type, n, c, hw, channels_last, BiasFinish{dbias, 0.0f}, partials, stream,
        "relu_backward_bias", {y, dy, dx}, static_cast<const T*>(y), static_cast<const T*>(dy),
        static_cast<T*>(dx));
  });
}

namespace {

// Packs of V channels in NHWC where c is a multiple of V; one channel a
// thread otherwise.
template <bool kBackward>
void max_pool_tiled(Element type, const void* x, const void* dy, void* out, int64_t n, int64_t c,
                    int64_t h, int64_t w, int64_t kh, int64_t kw, bool channels_last,
                    cudaStream_t stream, const char* what) {
  const int64_t oh = h / kh, ow = w / kw;
  const int64_t outputs = n * c * oh * ow;
  if (outputs == 0) return;
  const bool packed = channels_last && packs_fit(type, c, {x, dy, out});
  with_shape(type, packed, n * c * h * w, [&](auto t, auto v, auto index) {
    using T = decltype(t);
    using I = decltype(index);
    constexpr int V = decltype(v)::value;
    const int64_t count = outputs / V;
    max_pool_tiled_kernel<kBackward, T, V, I><<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(out),
        TiledPool<I>{static_cast<I>(c), static_cast<I>(h), static_cast<I>(w), static_cast<I>(oh),
                     static_cast<I>(ow), static_cast<int>(kh), static_cast<int>(kw),
                     channels_last},
        static_cast<I>(count));
  });
  check_launch(what);
}

}  // namespace

void max_pool_forward_tiled(Element type, const void* x, void* y, int64_t n, int64_t c, int64_t h,
                            int64_t w, int64_t kh, int64_t kw, bool channels_last,
                            cudaStream_t stream) {
  max_pool_tiled<false>(type, x, nullptr, y, n, c, h, w, kh, kw, channels_last, stream,
                        "max_pool_forward_tiled");
}

void max_pool_backward_tiled(Element type, const void* x, const void* dy, void* dx, int64_t n,
                             int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                             bool channels_last, cudaStream_t stream) {
  max_pool_tiled<true>(type, x, dy, dx, n, c, h, w, kh, kw, channels_last, stream,
                       "max_pool_backward_tiled");
}

}  // namespace vtrain::worker::cuda
