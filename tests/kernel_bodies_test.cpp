// The CUDA backend's memory-bound kernels run the bodies of
// kernel_bodies.h, one index of their grid-stride loop a call. Here every
// index of a launch runs on the host, in the index types and pack widths
// the kernels instantiate (float in packs of 1 and 4; a 16-bit integer type
// standing in for bf16 / f16 in packs of 1 and 8), and the results are
// compared with references written from the logical coordinates: reorder
// and fill between NCHW, nChw8c, nChw16c and NHWC (padding channels zeroed),
// the bias add, relu (NaN, signed zeros, infinities, bit for bit), silu,
// gelu, sigmoid and relu6 (against the references in double), the mul
// layer's products and per-(sample, channel) sums, and max
// pooling over tiling windows forward and backward (first maximum, ties,
// NaN). Plain C++: every build, GPU or not. What the device's conversions
// round is checked on a GPU (cuda_backend_test, backend_conformance_test).
#include "worker/device/cuda/kernel_bodies.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tests/reference_ops.h"

namespace vtrain::worker::cuda {
namespace {

// Exact conversions: the tests' values are small integers (and, in float,
// the special values), so any rounding would show.
struct HostConvert {
  template <typename T>
  static float to_float(T v) {
    return static_cast<float>(v);
  }
  template <typename T>
  static T from_float(float v) {
    return static_cast<T>(v);
  }
};

// Buffers aligned for 16-byte packs, as cudaMalloc's are.
template <typename T>
struct Aligned {
  explicit Aligned(size_t n, T value = T{}) : storage((n * sizeof(T) + 15) / 16 + 1) {
    for (size_t i = 0; i < n; ++i) data()[i] = value;
    size = n;
  }
  T* data() { return reinterpret_cast<T*>(storage.data()); }
  const T* data() const { return reinterpret_cast<const T*>(storage.data()); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  struct alignas(16) Chunk {
    unsigned char bytes[16];
  };
  std::vector<Chunk> storage;
  size_t size = 0;
};

// Where logical element (n, ch, s) of {n, c, hw} lies in storage with
// channel block `block` (1: NCHW; 8, 16: blocked, channels padded; c: NHWC),
// written out case by case.
int64_t storage_index(int64_t n, int64_t ch, int64_t s, int64_t c, int64_t hw, int64_t block) {
  if (block == 1) return (n * c + ch) * hw + s;
  if (block == c) return (n * hw + s) * c + ch;
  const int64_t padded = (c + block - 1) / block * block;
  return n * padded * hw + (ch / block) * hw * block + s * block + ch % block;
}

struct Dims {
  int64_t n, c, h, w;
  int64_t hw() const { return h * w; }
};

std::string describe(const Dims& d) {
  std::ostringstream out;
  out << "{" << d.n << ", " << d.c << ", " << d.h << ", " << d.w << "}";
  return out.str();
}

// ------------------------------------------------------ reorder and fill

template <typename I>
void check_reorder(const Dims& d) {
  const int64_t hw = d.hw();
  for (const int64_t from : {int64_t{1}, int64_t{8}, int64_t{16}, d.c}) {
    for (const int64_t to : {int64_t{1}, int64_t{8}, int64_t{16}, d.c}) {
      SCOPED_TRACE(describe(d) + " block " + std::to_string(from) + " -> " + std::to_string(to));
      auto storage = [&](int64_t block) { return d.n * ((d.c + block - 1) / block * block) * hw; };
      Aligned<float> src(static_cast<size_t>(storage(from)), -7.0f);  // -7: padding
      for (int64_t n = 0; n < d.n; ++n) {
        for (int64_t ch = 0; ch < d.c; ++ch) {
          for (int64_t s = 0; s < hw; ++s) {
            src[storage_index(n, ch, s, d.c, hw, from)] = static_cast<float>((n * d.c + ch) * hw + s);
          }
        }
      }
      const int64_t count = storage(to);
      Aligned<int16_t> dst(static_cast<size_t>(count), 99);
      for (I i = 0; i < static_cast<I>(count); ++i) {
        reorder_at<HostConvert>(i, src.data(), static_cast<I>(from), dst.data(),
                                static_cast<I>(d.c), static_cast<I>(hw), static_cast<I>(to));
      }
      std::vector<bool> logical(static_cast<size_t>(count), false);
      for (int64_t n = 0; n < d.n; ++n) {
        for (int64_t ch = 0; ch < d.c; ++ch) {
          for (int64_t s = 0; s < hw; ++s) {
            const int64_t at = storage_index(n, ch, s, d.c, hw, to);
            logical[static_cast<size_t>(at)] = true;
            ASSERT_EQ(dst[static_cast<size_t>(at)], (n * d.c + ch) * hw + s)
                << "n " << n << " channel " << ch << " position " << s;
          }
        }
      }
      for (int64_t at = 0; at < count; ++at) {
        if (!logical[static_cast<size_t>(at)]) {
          ASSERT_EQ(dst[static_cast<size_t>(at)], 0) << "padding at " << at;
        }
      }
      // fill: every logical element the value, padding 0.
      Aligned<float> filled(static_cast<size_t>(count), -1.0f);
      for (I i = 0; i < static_cast<I>(count); ++i) {
        fill_at(i, filled.data(), static_cast<I>(d.c), static_cast<I>(hw), static_cast<I>(to),
                2.5f, 0.0f);
      }
      for (int64_t at = 0; at < count; ++at) {
        ASSERT_EQ(filled[static_cast<size_t>(at)], logical[static_cast<size_t>(at)] ? 2.5f : 0.0f)
            << "fill at " << at;
      }
    }
  }
}

TEST(KernelBodies, ReorderAndFillBetweenEveryLayout) {
  for (const Dims& d : {Dims{1, 1, 1, 1}, Dims{2, 3, 2, 3}, Dims{2, 8, 3, 3}, Dims{1, 13, 5, 1},
                        Dims{3, 16, 2, 2}, Dims{2, 20, 3, 2}, Dims{1, 33, 1, 7}}) {
    check_reorder<uint32_t>(d);
    check_reorder<int64_t>(d);
  }
}

// -------------------------------------------------------------- bias add

// In place, and out of place with relu (a convolution's bias paired with
// the relu after it): odd channels' bias is negative, so relu has zeros to
// make.
template <typename T, int V, typename I>
void check_add_bias(const Dims& d, bool channels_last) {
  SCOPED_TRACE(describe(d) + (channels_last ? " NHWC" : " NCHW") + " V " + std::to_string(V));
  const int64_t hw = d.hw(), count = d.n * d.c * hw;
  ASSERT_EQ((channels_last ? d.c : hw) % V, 0) << "the kernels pack only such shapes";
  const auto bias_of = [](int64_t ch) { return ch % 2 == 0 ? 100 * (ch + 1) : -30; };
  Aligned<T> bias(static_cast<size_t>(d.c));
  for (int64_t ch = 0; ch < d.c; ++ch) bias[static_cast<size_t>(ch)] = static_cast<T>(bias_of(ch));
  for (const bool relu : {false, true}) {
    SCOPED_TRACE(relu ? "out of place, relu" : "in place");
    Aligned<T> x(static_cast<size_t>(count)), out(static_cast<size_t>(count), static_cast<T>(7));
    for (int64_t i = 0; i < count; ++i) x[static_cast<size_t>(i)] = static_cast<T>(i % 50);
    T* y = relu ? out.data() : x.data();
    for (I i = 0; i < static_cast<I>(count / V); ++i) {
      add_bias_at<HostConvert, T, V>(i, x.data(), y, bias.data(), static_cast<I>(d.c),
                                     static_cast<I>(hw), channels_last, relu);
    }
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t ch = 0; ch < d.c; ++ch) {
        for (int64_t s = 0; s < hw; ++s) {
          const int64_t at = storage_index(n, ch, s, d.c, hw, channels_last ? d.c : 1);
          const int64_t sum = at % 50 + bias_of(ch);
          ASSERT_EQ(static_cast<int64_t>(y[static_cast<size_t>(at)]),
                    relu ? std::max<int64_t>(sum, 0) : sum)
              << "n " << n << " channel " << ch << " position " << s;
          if (relu) {
            ASSERT_EQ(static_cast<int64_t>(x[static_cast<size_t>(at)]), at % 50) << "x written";
          }
        }
      }
    }
  }
}

TEST(KernelBodies, BiasAddReachesEveryElementsChannelInPacks) {
  for (const bool nhwc : {false, true}) {
    check_add_bias<float, 1, uint32_t>({2, 3, 5, 3}, nhwc);
    check_add_bias<float, 1, int64_t>({2, 3, 5, 3}, nhwc);
    check_add_bias<float, 4, uint32_t>({2, 8, 2, 2}, nhwc);
    check_add_bias<int16_t, 8, uint32_t>({3, 16, 4, 2}, nhwc);
    check_add_bias<int16_t, 8, int64_t>({3, 16, 4, 2}, nhwc);
  }
  check_add_bias<int16_t, 8, uint32_t>({2, 24, 1, 3}, true);   // c = 3 packs, hw odd
  check_add_bias<int16_t, 8, uint32_t>({2, 3, 4, 4}, false);   // c odd, hw = 2 packs
}

// ------------------------------------------------------------------ relu

TEST(KernelBodies, ReluPropagatesNaNAndZeroesTheRestBitForBit) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float denormal = std::numeric_limits<float>::denorm_min();
  const std::vector<float> values = {1.5f, -2.0f, 0.0f, -0.0f, nan, -nan, inf, -inf,
                                     denormal, -denormal, 3.0f, -1e-30f};
  auto check = [&](auto v_tag, auto i_tag) {
    constexpr int V = decltype(v_tag)::value;
    using I = decltype(i_tag);
    SCOPED_TRACE("V " + std::to_string(V));
    const size_t count = values.size();
    Aligned<float> x(count), y(count, 7.0f), dy(count), dx(count, 7.0f);
    for (size_t i = 0; i < count; ++i) {
      x[i] = values[i];
      dy[i] = static_cast<float>(i + 1);
    }
    for (I i = 0; i < static_cast<I>(count / V); ++i) {
      relu_forward_at<HostConvert, float, V>(i, x.data(), y.data());
    }
    for (I i = 0; i < static_cast<I>(count / V); ++i) {
      relu_backward_at<HostConvert, float, V>(i, y.data(), dy.data(), dx.data());
    }
    for (size_t i = 0; i < count; ++i) {
      const float want_y = std::isnan(values[i]) || values[i] > 0 ? values[i] : 0.0f;
      EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want_y))
          << "relu(" << values[i] << ")";
      const float want_dx = std::isnan(values[i]) || values[i] > 0 ? dy[i] : 0.0f;
      EXPECT_EQ(std::bit_cast<uint32_t>(dx[i]), std::bit_cast<uint32_t>(want_dx))
          << "relu'(" << values[i] << ")";
    }
  };
  check(std::integral_constant<int, 1>{}, uint32_t{});
  check(std::integral_constant<int, 4>{}, uint32_t{});
  check(std::integral_constant<int, 4>{}, int64_t{});
}

// ------------------------------------------------ the other activations

// Each activation's bodies in float against the references in double
// (tests/reference_ops.h), in packs of 1 and 4: within float's rounding of
// exp and erf. relu6's kinks (0 and 6) are left out of the derivative: a
// backend may pass dy at exactly 6 (ops.h).
TEST(KernelBodies, ActivationsMatchTheReferencesInDouble) {
  const std::vector<float> values = {-30.0f, -8.0f, -3.0f, -1.0f, -0.25f, -1e-3f, 0.0f, 1e-3f,
                                     0.1f,   0.5f,  1.0f,  2.5f,  5.5f,   6.0f,   6.5f, 30.0f};
  struct Case {
    Activation body;
    reference::Activation reference;
    const char* name;
  };
  const Case cases[] = {{Activation::kSilu, reference::Activation::kSilu, "silu"},
                        {Activation::kGelu, reference::Activation::kGelu, "gelu"},
                        {Activation::kSigmoid, reference::Activation::kSigmoid, "sigmoid"},
                        {Activation::kRelu6, reference::Activation::kRelu6, "relu6"}};
  auto check = [&](const Case& c, auto v_tag) {
    constexpr int V = decltype(v_tag)::value;
    SCOPED_TRACE(std::string(c.name) + ", V " + std::to_string(V));
    const size_t count = values.size();
    Aligned<float> x(count), y(count, 7.0f), dy(count), dx(count, 7.0f);
    for (size_t i = 0; i < count; ++i) {
      x[i] = values[i];
      dy[i] = 0.5f + 0.25f * static_cast<float>(i);
    }
    for (uint32_t i = 0; i < count / V; ++i) {
      activation_forward_at<HostConvert, float, V>(i, c.body, x.data(), y.data());
      activation_backward_at<HostConvert, float, V>(i, c.body, x.data(), dy.data(), dx.data());
    }
    for (size_t i = 0; i < count; ++i) {
      const double want_y = reference::activation(c.reference, values[i]);
      EXPECT_NEAR(y[i], want_y, 1e-6 * std::max(1.0, std::abs(want_y))) << "f(" << values[i] << ")";
      if (c.body == Activation::kRelu6 && (values[i] == 0.0f || values[i] == 6.0f)) continue;
      const double want_dx = dy[i] * reference::activation_derivative(c.reference, values[i]);
      EXPECT_NEAR(dx[i], want_dx, 1e-6 * std::max(1.0, std::abs(want_dx)))
          << "f'(" << values[i] << ")";
    }
  };
  for (const Case& c : cases) {
    check(c, std::integral_constant<int, 1>{});
    check(c, std::integral_constant<int, 4>{});
  }
}

// NaN passes through every activation's forward; dx may alias dy.
TEST(KernelBodies, ActivationsPropagateNaNAndMayWriteOverDy) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Activation a :
       {Activation::kSilu, Activation::kGelu, Activation::kSigmoid, Activation::kRelu6}) {
    Aligned<float> x(4, nan), y(4, 0.0f);
    activation_forward_at<HostConvert, float, 4>(uint32_t{0}, a, x.data(), y.data());
    for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(y[i])) << static_cast<int>(a);
    Aligned<float> at(4, 1.0f), g(4, 2.0f);
    activation_backward_at<HostConvert, float, 4>(uint32_t{0}, a, at.data(), g.data(), g.data());
    const float want = static_cast<float>(2.0 * reference::activation_derivative(
                                                    static_cast<reference::Activation>(a), 1.0));
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(g[i], want, 1e-6f) << static_cast<int>(a);
  }
}

// -------------------------------------------------------------- products

// Padded storage elements of {n, c, hw} with channel block `block`.
int64_t storage_of(const Dims& d, int64_t block) {
  return d.n * ((d.c + block - 1) / block * block) * d.hw();
}

// a's and b's logical elements: small integers, exact in float and int16.
float a_at(int64_t n, int64_t ch, int64_t s) { return static_cast<float>((n + 2 * ch + s) % 7 - 3); }
float b_at(int64_t n, int64_t ch, int64_t s) { return static_cast<float>((3 * n + ch + 2 * s) % 5 - 2); }

// A tensor of `value_at`'s elements in channel block `block`, padding 99
// (which no body may read into a result).
template <typename T, typename F>
Aligned<T> tensor_of(const Dims& d, int64_t block, F value_at) {
  Aligned<T> t(static_cast<size_t>(storage_of(d, block)), static_cast<T>(99));
  for (int64_t n = 0; n < d.n; ++n) {
    for (int64_t ch = 0; ch < d.c; ++ch) {
      for (int64_t s = 0; s < d.hw(); ++s) {
        t[static_cast<size_t>(storage_index(n, ch, s, d.c, d.hw(), block))] =
            static_cast<T>(value_at(n, ch, s));
      }
    }
  }
  return t;
}

// mul_at over every pack of y {n, c, hw} in `block`, b shaped like a
// (b_block 0) or {n, c, 1, 1} in b_block; beta 0 over 5s and beta 1 onto
// them: each logical element a * b (+ 5), each padding element 0.
template <typename T, int V, typename I>
void check_mul_at(const Dims& d, int64_t block, int64_t b_block) {
  SCOPED_TRACE(describe(d) + " block " + std::to_string(block) + " b_block " +
               std::to_string(b_block) + " V " + std::to_string(V));
  ASSERT_EQ((block == 1 ? d.hw() : block) % V, 0) << "the kernels pack only such shapes";
  const Dims bd = b_block == 0 ? d : Dims{d.n, d.c, 1, 1};
  const Aligned<T> a = tensor_of<T>(d, block, a_at);
  const Aligned<T> b = tensor_of<T>(bd, b_block == 0 ? block : b_block, b_at);
  const MulShape<I> shape{static_cast<I>(d.c), static_cast<I>(d.hw()), static_cast<I>(block),
                          static_cast<I>(b_block)};
  for (const float beta : {0.0f, 1.0f}) {
    Aligned<T> y(static_cast<size_t>(storage_of(d, block)), static_cast<T>(5));
    for (I i = 0; i < static_cast<I>(y.size / V); ++i) {
      mul_at<HostConvert, T, V>(i, a.data(), b.data(), y.data(), beta, shape);
    }
    std::vector<bool> logical(y.size, false);
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t ch = 0; ch < d.c; ++ch) {
        for (int64_t s = 0; s < d.hw(); ++s) {
          const auto at = static_cast<size_t>(storage_index(n, ch, s, d.c, d.hw(), block));
          logical[at] = true;
          const float factor = b_block == 0 ? b_at(n, ch, s) : b_at(n, ch, 0);
          ASSERT_EQ(static_cast<float>(y[at]), a_at(n, ch, s) * factor + 5 * beta)
              << "n " << n << " channel " << ch << " position " << s << " beta " << beta;
        }
      }
    }
    for (size_t at = 0; at < y.size; ++at) {
      if (!logical[at]) {
        ASSERT_EQ(static_cast<float>(y[at]), 0.0f) << "padding at " << at;
      }
    }
  }
}

TEST(KernelBodies, MulReachesEveryElementsFactorInEveryLayout) {
  const Dims d{2, 20, 3, 2};
  for (const int64_t block : {int64_t{1}, int64_t{8}, int64_t{16}, d.c}) {
    for (const int64_t b_block : {int64_t{0}, int64_t{1}, int64_t{8}, d.c}) {
      check_mul_at<float, 1, uint32_t>(d, block, b_block);
      check_mul_at<float, 1, int64_t>(d, block, b_block);
    }
  }
  for (const int64_t b_block : {int64_t{0}, int64_t{16}}) {
    check_mul_at<float, 4, uint32_t>({2, 6, 2, 4}, 1, b_block);    // 2 packs of pixels
    check_mul_at<float, 4, uint32_t>({2, 8, 3, 1}, 8, b_block);    // NHWC, 2 packs of channels
    check_mul_at<float, 4, uint32_t>({2, 12, 3, 3}, 8, b_block);   // nChw8c, 12 padded to 16
    check_mul_at<int16_t, 8, uint32_t>({3, 20, 2, 2}, 16, b_block);
    check_mul_at<int16_t, 8, int64_t>({3, 16, 4, 2}, 16, b_block);  // NHWC
    check_mul_at<int16_t, 8, uint32_t>({2, 3, 4, 2}, 1, b_block);
  }
}

// mul_sum_partial split over `step` lanes, the lanes' sums added, then
// mul_sum_store, for every (n, channel) of y {n, c, 1, 1} in y_block: the
// sum of a * b over the pixels (+ 5 with beta 1); y's padding 0.
template <typename I>
void check_mul_sum(const Dims& d, int64_t block, int64_t y_block, int64_t step) {
  SCOPED_TRACE(describe(d) + " block " + std::to_string(block) + " y_block " +
               std::to_string(y_block) + " step " + std::to_string(step));
  const Aligned<float> a = tensor_of<float>(d, block, a_at);
  const Aligned<float> b = tensor_of<float>(d, block, b_at);
  const Dims yd{d.n, d.c, 1, 1};
  const MulShape<I> shape{static_cast<I>(d.c), static_cast<I>(d.hw()), static_cast<I>(block),
                          static_cast<I>(y_block)};
  const int64_t channels = (d.c + y_block - 1) / y_block * y_block;
  for (const float beta : {0.0f, 1.0f}) {
    Aligned<float> y(static_cast<size_t>(storage_of(yd, y_block)), 5.0f);
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t ch = 0; ch < channels; ++ch) {
        float sum = 0.0f;
        for (int64_t lane = 0; lane < step && ch < d.c; ++lane) {
          sum += mul_sum_partial<HostConvert>(a.data(), b.data(), static_cast<I>(n),
                                              static_cast<I>(ch), static_cast<I>(lane),
                                              static_cast<I>(step), shape);
        }
        mul_sum_store<HostConvert>(y.data(), static_cast<I>(n), static_cast<I>(ch), sum, beta,
                                   shape);
      }
    }
    std::vector<bool> logical(y.size, false);
    for (int64_t n = 0; n < d.n; ++n) {
      for (int64_t ch = 0; ch < d.c; ++ch) {
        float want = 5 * beta;
        for (int64_t s = 0; s < d.hw(); ++s) want += a_at(n, ch, s) * b_at(n, ch, s);
        const auto at = static_cast<size_t>(storage_index(n, ch, 0, d.c, 1, y_block));
        logical[at] = true;
        ASSERT_EQ(y[at], want) << "n " << n << " channel " << ch << " beta " << beta;
      }
    }
    for (size_t at = 0; at < y.size; ++at) {
      if (!logical[at]) {
        ASSERT_EQ(y[at], 0.0f) << "padding at " << at;
      }
    }
  }
}

TEST(KernelBodies, MulSumAddsEachSampleAndChannelsPixels) {
  for (const Dims& d : {Dims{2, 20, 3, 2}, Dims{3, 9, 5, 5}, Dims{1, 16, 1, 1}}) {
    for (const int64_t block : {int64_t{1}, int64_t{8}, int64_t{16}, d.c}) {
      for (const int64_t y_block : {int64_t{1}, int64_t{8}, d.c}) {
        for (const int64_t step : {int64_t{1}, int64_t{4}, int64_t{32}}) {
          check_mul_sum<uint32_t>(d, block, y_block, step);
        }
        check_mul_sum<int64_t>(d, block, y_block, 3);
      }
    }
  }
}

// ------------------------------------------------------ tiled max pooling

// The reference: each logical window row by row, its first maximum, a NaN
// beating every number (the first NaN).
template <typename T>
struct PoolReference {
  std::vector<float> y;          // logical {n, c, oh, ow}
  std::vector<int64_t> argmax;   // storage index in x of each output's pick
};

template <typename T>
PoolReference<T> pool_reference(const Aligned<T>& x, const Dims& d, int kh, int kw,
                                 int64_t block) {
  const int64_t oh = d.h / kh, ow = d.w / kw;
  PoolReference<T> r;
  for (int64_t n = 0; n < d.n; ++n) {
    for (int64_t ch = 0; ch < d.c; ++ch) {
      for (int64_t oy = 0; oy < oh; ++oy) {
        for (int64_t ox = 0; ox < ow; ++ox) {
          int64_t best = -1;
          float best_value = 0;
          for (int r = 0; r < kh; ++r) {
            for (int q = 0; q < kw; ++q) {
              const int64_t at =
                  storage_index(n, ch, (oy * kh + r) * d.w + ox * kw + q, d.c, d.hw(), block);
              const float v = static_cast<float>(x[static_cast<size_t>(at)]);
              const bool better = best < 0 || (std::isnan(v) && !std::isnan(best_value)) ||
                                  (!std::isnan(best_value) && v > best_value);
              if (better) {
                best = at;
                best_value = v;
              }
            }
          }
          r.y.push_back(best_value);
          r.argmax.push_back(best);
        }
      }
    }
  }
  return r;
}

template <typename T, int V, typename I>
void check_tiled_pool(const Dims& d, int kh, int kw, bool channels_last, uint32_t seed) {
  SCOPED_TRACE(describe(d) + " window " + std::to_string(kh) + "x" + std::to_string(kw) +
               (channels_last ? " NHWC" : " NCHW") + " V " + std::to_string(V));
  ASSERT_EQ(d.h % kh, 0);
  ASSERT_EQ(d.w % kw, 0);
  const int64_t oh = d.h / kh, ow = d.w / kw, block = channels_last ? d.c : 1;
  const int64_t count = d.n * d.c * d.hw(), outputs = d.n * d.c * oh * ow;
  // Few distinct values, half of them 0 (as after a relu): windows tie often.
  std::mt19937 rng(seed);
  Aligned<T> x(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t v = static_cast<int64_t>(rng() % 8) - 4;
    x[static_cast<size_t>(i)] = static_cast<T>(v < 0 ? 0 : v);
  }
  if constexpr (std::is_floating_point_v<T>) {
    for (int k = 0; k < 3; ++k) {  // NaNs, the window's first element or not
      x[static_cast<size_t>(rng() % count)] = std::numeric_limits<T>::quiet_NaN();
    }
  }
  const PoolReference<T> ref = pool_reference(x, d, kh, kw, block);
  const TiledPool<I> pool{static_cast<I>(d.c), static_cast<I>(d.h), static_cast<I>(d.w),
                          static_cast<I>(oh), static_cast<I>(ow), kh, kw, channels_last};
  // Forward: outputs in x's layout.
  Aligned<T> y(static_cast<size_t>(outputs), static_cast<T>(-9));
  for (I i = 0; i < static_cast<I>(outputs / V); ++i) {
    max_pool_tiled_at<false, HostConvert, T, V>(i, x.data(), nullptr, y.data(), pool);
  }
  // Backward: dy[output] = its logical index + 1; dx = 0 but at each pick.
  Aligned<T> dy(static_cast<size_t>(outputs)), dx(static_cast<size_t>(count), static_cast<T>(-9));
  std::vector<T> want_dx(static_cast<size_t>(count), static_cast<T>(0));
  int64_t o = 0;
  for (int64_t n = 0; n < d.n; ++n) {
    for (int64_t ch = 0; ch < d.c; ++ch) {
      for (int64_t s = 0; s < oh * ow; ++s, ++o) {
        const int64_t at = storage_index(n, ch, s, d.c, oh * ow, block);
        const float want = ref.y[static_cast<size_t>(o)];
        const float got = static_cast<float>(y[static_cast<size_t>(at)]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got)) << "output " << o;
        } else {
          ASSERT_EQ(got, want) << "output " << o;
        }
        dy[static_cast<size_t>(at)] = static_cast<T>(o % 100 + 1);
        want_dx[static_cast<size_t>(ref.argmax[static_cast<size_t>(o)])] = static_cast<T>(o % 100 + 1);
      }
    }
  }
  for (I i = 0; i < static_cast<I>(outputs / V); ++i) {
    max_pool_tiled_at<true, HostConvert, T, V>(i, x.data(), dy.data(), dx.data(), pool);
  }
  for (int64_t at = 0; at < count; ++at) {  // -9 left: an element no window wrote
    ASSERT_EQ(dx[static_cast<size_t>(at)], want_dx[static_cast<size_t>(at)]) << "dx at " << at;
  }
}

TEST(KernelBodies, TiledMaxPoolingPicksTheFirstMaximumOrNaNForwardAndBackward) {
  uint32_t seed = 1;
  for (const auto& [kh, kw] : {std::pair{2, 2}, std::pair{3, 3}, std::pair{2, 3}}) {
    const Dims d{2, 5, 6 * kh / 2, 4 * kw / 2};
    for (const bool nhwc : {false, true}) {
      check_tiled_pool<float, 1, uint32_t>(d, kh, kw, nhwc, ++seed);
      check_tiled_pool<float, 1, int64_t>(d, kh, kw, nhwc, ++seed);
    }
    const Dims packed{2, 16, 2 * kh, 3 * kw};
    check_tiled_pool<float, 4, uint32_t>(packed, kh, kw, true, ++seed);
    check_tiled_pool<float, 4, int64_t>(packed, kh, kw, true, ++seed);
    check_tiled_pool<int16_t, 8, uint32_t>(packed, kh, kw, true, ++seed);
    check_tiled_pool<int16_t, 1, uint32_t>(packed, kh, kw, false, ++seed);
  }
}

}  // namespace
}  // namespace vtrain::worker::cuda
