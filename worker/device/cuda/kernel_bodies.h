// What one thread of the CUDA backend's memory-bound kernels does for one
// index of its grid-stride loop: reorder and fill between channel-blocked
// layouts, the bias add, relu and the other activations, and max pooling
// over windows that tile the input. Plain C++, compiled by nvcc into the
// kernels (cuda_kernels.cu) and by the host compiler for the tests
// (kernel_bodies_test), which run every index of a launch on the host and
// compare with the reference: the index arithmetic, the 16-byte packs and
// NaN's propagation are checked on machines without a GPU. The kernels' speed is for bench_cuda_ops.
//
// Element types: T is the stored type; C converts (C::to_float(T) -> float,
// C::template from_float<T>(float) -> T): in the kernels the device's
// conversions (round to nearest even), in the tests exact ones. I is the
// index type (uint32_t where every index fits, else int64_t: a division by
// a runtime size costs several times more in 64 bits on a GPU).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define VTRAIN_KERNEL_BODY __device__ __forceinline__
#define VTRAIN_UNROLL _Pragma("unroll")
#else
#define VTRAIN_KERNEL_BODY inline
#define VTRAIN_UNROLL
#endif

namespace vtrain::worker::cuda {

// V adjacent elements of T, loaded and stored as one access: 16 bytes
// (V = 16 / sizeof(T)) where the pointers and sizes allow, else V = 1.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T, int V>
VTRAIN_KERNEL_BODY Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <typename T, int V>
VTRAIN_KERNEL_BODY void store_pack(T* p, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}

VTRAIN_KERNEL_BODY bool is_nan(float f) {
#if defined(__CUDA_ARCH__)
  return isnan(f);
#else
  return std::isnan(f);
#endif
}

// ------------------------------------------------- channel-blocked layouts

template <typename I>
VTRAIN_KERNEL_BODY I padded_channels(I c, I block) {
  return (c + block - 1) / block * block;
}

// Storage index i of a {n, c, hw} tensor with channel block `block` (1:
// NCHW; 8, 16: nChw8c, nChw16c with zero-padded channels; c: NHWC) -> its
// sample, channel and spatial position.
template <typename I>
struct Position {
  I n, c, s;
};
template <typename I>
VTRAIN_KERNEL_BODY Position<I> position_of(I i, I c, I hw, I block) {
  const I per_sample = padded_channels(c, block) * hw;
  const I r = i % per_sample;
  const I in_block = r % (hw * block);
  return {i / per_sample, (r / (hw * block)) * block + in_block % block, in_block / block};
}
template <typename I>
VTRAIN_KERNEL_BODY I offset_of(const Position<I>& p, I c, I hw, I block) {
  return p.n * padded_channels(c, block) * hw + (p.c / block) * hw * block + p.s * block +
         p.c % block;
}

// dst's storage element i (block dst_block) from src (block src_block);
// a padding channel of dst becomes 0.
template <typename C, typename S, typename D, typename I>
VTRAIN_KERNEL_BODY void reorder_at(I i, const S* src, I src_block, D* dst, I c, I hw,
                                   I dst_block) {
  const Position<I> p = position_of(i, c, hw, dst_block);
  dst[i] = C::template from_float<D>(p.c < c ? C::to_float(src[offset_of(p, c, hw, src_block)])
                                             : 0.0f);
}

template <typename T, typename I>
VTRAIN_KERNEL_BODY void fill_at(I i, T* dst, I c, I hw, I block, T value, T zero) {
  dst[i] = position_of(i, c, hw, block).c < c ? value : zero;
}

// ------------------------------------------------------ bias add and relu

// y = x + bias for the V elements from i * V: V channels of a pixel (NHWC,
// c a multiple of V) or V pixels of a channel (NCHW, hw a multiple of V),
// rounded once; then, with `relu`, relu (as relu_forward_at) of that. y may
// alias x. The bias is read an element at a time.
template <typename C, typename T, int V, typename I>
VTRAIN_KERNEL_BODY void add_bias_at(I i, const T* x, T* y, const T* bias, I c, I hw,
                                    bool channels_last, bool relu) {
  const I first = i * V;
  const T zero = C::template from_float<T>(0.0f);
  Pack<T, V> p = load_pack<T, V>(x + first);
  if (channels_last) {
    const I ch = first % c;
VTRAIN_UNROLL
    for (int l = 0; l < V; ++l) {
      p.v[l] = C::template from_float<T>(C::to_float(p.v[l]) + C::to_float(bias[ch + l]));
    }
  } else {
    const float b = C::to_float(bias[first / hw % c]);
VTRAIN_UNROLL
    for (int l = 0; l < V; ++l) p.v[l] = C::template from_float<T>(C::to_float(p.v[l]) + b);
  }
  if (relu) {
VTRAIN_UNROLL
    for (int l = 0; l < V; ++l) {
      if (C::to_float(p.v[l]) <= 0.0f) p.v[l] = zero;
    }
  }
  store_pack<T, V>(y + first, p);
}

// relu over the V elements from i * V. NaN propagates (as oneDNN's relu and
// cuDNN's with CUDNN_PROPAGATE_NAN): a NaN made in forward by a half
// overflow must reach the loss and the overflow check. -0 goes to +0.
template <typename C, typename T, int V, typename I>
VTRAIN_KERNEL_BODY void relu_forward_at(I i, const T* x, T* y) {
  const T zero = C::template from_float<T>(0.0f);
  Pack<T, V> p = load_pack<T, V>(x + i * V);
VTRAIN_UNROLL
  for (int l = 0; l < V; ++l) {
    if (C::to_float(p.v[l]) <= 0.0f) p.v[l] = zero;
  }
  store_pack<T, V>(y + i * V, p);
}

// Backward reads y: y > 0 exactly where x > 0 (and y is NaN where x is).
template <typename C, typename T, int V, typename I>
VTRAIN_KERNEL_BODY void relu_backward_at(I i, const T* y, const T* dy, T* dx) {
  const T zero = C::template from_float<T>(0.0f);
  const Pack<T, V> a = load_pack<T, V>(y + i * V);
  Pack<T, V> g = load_pack<T, V>(dy + i * V);
VTRAIN_UNROLL
  for (int l = 0; l < V; ++l) {
    if (C::to_float(a.v[l]) <= 0.0f) g.v[l] = zero;
  }
  store_pack<T, V>(dx + i * V, g);
}

// ------------------------------------------------ the other activations

// silu, gelu (the erf form), sigmoid and relu6 (ActivationKind but relu,
// which has its bodies above): the value and the derivative at x, in float.
// Backward reads x: dx = dy * f'(x). relu6's derivative is 1 strictly inside
// (0, 6), as PyTorch's hardtanh; NaN passes through the forward of each.
enum class Activation : int { kSilu, kGelu, kSigmoid, kRelu6 };

VTRAIN_KERNEL_BODY float body_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
VTRAIN_KERNEL_BODY float body_erf(float x) {
#if defined(__CUDA_ARCH__)
  return erff(x);
#else
  return std::erf(x);
#endif
}
VTRAIN_KERNEL_BODY float sigmoid_of(float x) { return 1.0f / (1.0f + body_exp(-x)); }

VTRAIN_KERNEL_BODY float activation_value(Activation a, float x) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  switch (a) {
    case Activation::kSilu: return x * sigmoid_of(x);
    case Activation::kGelu: return 0.5f * x * (1.0f + body_erf(x * kInvSqrt2));
    case Activation::kSigmoid: return sigmoid_of(x);
    case Activation::kRelu6: return is_nan(x) ? x : (x <= 0.0f ? 0.0f : (x < 6.0f ? x : 6.0f));
  }
  return x;
}

VTRAIN_KERNEL_BODY float activation_derivative(Activation a, float x) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  constexpr float kInvSqrt2Pi = 0.39894228040143268f;
  switch (a) {
    case Activation::kSilu: {
      const float s = sigmoid_of(x);
      return s * (1.0f + x * (1.0f - s));
    }
    case Activation::kGelu:
      return 0.5f * (1.0f + body_erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * body_exp(-0.5f * x * x);
    case Activation::kSigmoid: {
      const float s = sigmoid_of(x);
      return s * (1.0f - s);
    }
    case Activation::kRelu6: return x > 0.0f && x < 6.0f ? 1.0f : 0.0f;
  }
  return 1.0f;
}

// y = f(x) over V elements; y may alias x.
template <typename C, typename T, int V, typename I>
VTRAIN_KERNEL_BODY void activation_forward_at(I i, Activation a, const T* x, T* y) {
  Pack<T, V> p = load_pack<T, V>(x + i * V);
VTRAIN_UNROLL
  for (int l = 0; l < V; ++l) {
    p.v[l] = C::template from_float<T>(activation_value(a, C::to_float(p.v[l])));
  }
  store_pack<T, V>(y + i * V, p);
}

// dx = dy * f'(x) over V elements; dx may alias dy.
template <typename C, typename T, int V, typename I>
VTRAIN_KERNEL_BODY void activation_backward_at(I i, Activation a, const T* x, const T* dy, T* dx) {
  const Pack<T, V> in = load_pack<T, V>(x + i * V);
  Pack<T, V> g = load_pack<T, V>(dy + i * V);
VTRAIN_UNROLL
  for (int l = 0; l < V; ++l) {
    g.v[l] = C::template from_float<T>(C::to_float(g.v[l]) *
                                       activation_derivative(a, C::to_float(in.v[l])));
  }
  store_pack<T, V>(dx + i * V, g);
}

// ------------------------------------------------------------- products

// The mul layer's tensors (BinaryKind kMul, kMulSum): {n, c, hw} with
// channel block `block` (1: NCHW; 8, 16: blocked, channels padded; c:
// NHWC), and the channel block of b (kMul: 0 where b is shaped like a,
// else b is {n, c, 1, 1}) or of y (kMulSum's {n, c, 1, 1}).
template <typename I>
struct MulShape {
  I c, hw, block, other_block;
};

// kMul over the V elements from i * V of y: V pixels of a channel (block
// 1, hw a multiple of V) or V channels of a pixel (block a multiple of V).
// y = a * b + beta * y (beta 0 never reads y; y may alias a), in float,
// rounded once; y's padding channels become 0. a is in y's layout; so is b
// where other_block is 0, else b is one factor per sample and channel in
// its own block, read an element at a time.
template <typename C, typename T, int V, typename I>
VTRAIN_KERNEL_BODY void mul_at(I i, const T* a, const T* b, T* y, float beta, MulShape<I> s) {
  const I first = i * V;
  const Pack<T, V> pa = load_pack<T, V>(a + first);
  const Pack<T, V> pb = s.other_block == 0 ? load_pack<T, V>(b + first) : pa;
  const Pack<T, V> py = beta != 0.0f ? load_pack<T, V>(y + first) : pa;
  const Position<I> p = position_of(first, s.c, s.hw, s.block);
  Pack<T, V> out;
VTRAIN_UNROLL
  for (int l = 0; l < V; ++l) {
    const I ch = s.block == 1 ? p.c : p.c + static_cast<I>(l);
    float v = 0.0f;
    if (ch < s.c) {
      const float factor =
          s.other_block == 0
              ? C::to_float(pb.v[l])
              : C::to_float(b[offset_of(Position<I>{p.n, ch, I(0)}, s.c, I(1), s.other_block)]);
      v = C::to_float(pa.v[l]) * factor;
      if (beta != 0.0f) v += beta * C::to_float(py.v[l]);
    }
    out.v[l] = C::template from_float<T>(v);
  }
  store_pack<T, V>(y + first, out);
}

// kMulSum's terms for sample n, channel ch (< c): the sum of a * b over the
// positions first, first + step, ... below hw, in float, in that order.
template <typename C, typename T, typename I>
VTRAIN_KERNEL_BODY float mul_sum_partial(const T* a, const T* b, I n, I ch, I first, I step,
                                         MulShape<I> s) {
  const I base = offset_of(Position<I>{n, ch, I(0)}, s.c, s.hw, s.block);
  float sum = 0.0f;
  for (I at = first; at < s.hw; at += step) {
    const I k = base + at * s.block;
    sum += C::to_float(a[k]) * C::to_float(b[k]);
  }
  return sum;
}

// kMulSum's result for (n, ch) from the sum of its terms: y = sum + beta * y
// (beta 0 never reads y), rounded once; 0 for a padding channel of y
// (ch >= c).
template <typename C, typename T, typename I>
VTRAIN_KERNEL_BODY void mul_sum_store(T* y, I n, I ch, float sum, float beta, MulShape<I> s) {
  T& out = y[offset_of(Position<I>{n, ch, I(0)}, s.c, I(1), s.other_block)];
  float v = 0.0f;
  if (ch < s.c) v = beta != 0.0f ? sum + beta * C::to_float(out) : sum;
  out = C::template from_float<T>(v);
}

// ----------------------------------------------------- tiled max pooling

// A max pooling whose kh x kw windows tile x ({n, c, h, w}, h = oh * kh,
// w = ow * kw): stride = window, no padding.
template <typename I>
struct TiledPool {
  I c, h, w, oh, ow;
  int kh, kw;
  bool channels_last;
};

// Output i of V adjacent channels (V > 1 in NHWC only, c a multiple of V;
// outputs are stored in x's layout, so output i's first element is i * V):
// finds each channel's first maximum in its window, row by row (a NaN beats
// every number, so it propagates as in cuDNN with CUDNN_PROPAGATE_NAN), and
// writes it to out = y (forward) or writes dy there and 0 to the window's
// other elements of out = dx (backward). The windows tile x, so every
// element of dx is written once; both directions select alike.
template <bool kBackward, typename C, typename T, int V, typename I>
VTRAIN_KERNEL_BODY void max_pool_tiled_at(I i, const T* x, const T* dy, T* out,
                                          TiledPool<I> pool) {
  const I c = pool.c;
  I ch, ox, oy, n;
  if (pool.channels_last) {
    const I groups = c / V;
    ch = i % groups * V;
    I rest = i / groups;
    ox = rest % pool.ow;
    rest /= pool.ow;
    oy = rest % pool.oh;
    n = rest / pool.oh;
  } else {
    ox = i % pool.ow;
    I rest = i / pool.ow;
    oy = rest % pool.oh;
    rest /= pool.oh;
    ch = rest % c;
    n = rest / c;
  }
  const int kh = pool.kh, kw = pool.kw;
  // Element (row, col) of x for these channels: origin + row * row_step + col * col_step.
  const I col_step = pool.channels_last ? c : 1, row_step = pool.w * col_step;
  const I origin = pool.channels_last
                       ? ((n * pool.h + oy * kh) * pool.w + ox * kw) * c + ch
                       : ((n * c + ch) * pool.h + oy * kh) * pool.w + ox * kw;
  Pack<T, V> best = load_pack<T, V>(x + origin);
  float best_value[V];
  int best_at[V];
VTRAIN_UNROLL
  for (int l = 0; l < V; ++l) {
    best_value[l] = C::to_float(best.v[l]);
    best_at[l] = 0;
  }
  for (int r = 0; r < kh; ++r) {
    for (int q = 0; q < kw; ++q) {
      if (r == 0 && q == 0) continue;
      const Pack<T, V> v = load_pack<T, V>(x + origin + r * row_step + q * col_step);
VTRAIN_UNROLL
      for (int l = 0; l < V; ++l) {
        const float f = C::to_float(v.v[l]);
        if (f > best_value[l] || (is_nan(f) && !is_nan(best_value[l]))) {
          best_value[l] = f;
          best.v[l] = v.v[l];
          best_at[l] = r * kw + q;
        }
      }
    }
  }
  if constexpr (!kBackward) {
    store_pack<T, V>(out + i * V, best);
  } else {
    const Pack<T, V> g = load_pack<T, V>(dy + i * V);
    const T zero = C::template from_float<T>(0.0f);
    for (int r = 0; r < kh; ++r) {
      for (int q = 0; q < kw; ++q) {
        Pack<T, V> o;
VTRAIN_UNROLL
        for (int l = 0; l < V; ++l) o.v[l] = r * kw + q == best_at[l] ? g.v[l] : zero;
        store_pack<T, V>(out + origin + r * row_step + q * col_step, o);
      }
    }
  }
}

}  // namespace vtrain::worker::cuda
