// common/half_convert.h's bulk conversions against half.h's one-at-a-time
// ones, bit for bit (NaNs: NaN-ness), on both paths: every 16-bit pattern
// widened, and floats that round every way (ties to even, the subnormal
// range, overflow to infinity, NaNs, infinities) narrowed, in lengths that
// leave a scalar tail after the vector loop.
#include "common/half_convert.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace vtrain::common {
namespace {

const ConvertPath kPaths[] = {ConvertPath::kScalar, ConvertPath::kVector};

const char* name(ConvertPath p) { return p == ConvertPath::kScalar ? "scalar" : "vector"; }

// The floats that decide rounding: each half value, the midpoints to its
// neighbours and one ulp either side of them, for f16 and bf16 alike
// (bf16 midpoints are those of float's top 16 bits), plus random bits.
std::vector<float> probes() {
  std::vector<float> out;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f16 = to_float(F16{static_cast<uint16_t>(h)});
    const uint32_t b = h << 16;
    for (const uint32_t u : {std::bit_cast<uint32_t>(f16), b, b + 0x8000, b + 0x7fff, b + 0x8001}) {
      out.push_back(std::bit_cast<float>(u));
    }
    if (std::isfinite(f16)) {  // f16's midpoint to the next value up, and around it
      const float next = to_float(F16{static_cast<uint16_t>(h + 1)});
      if (std::isfinite(next) && (h & 0x7fff) != 0x7bff) {
        const float mid = f16 + (next - f16) / 2;  // exact in float
        out.push_back(mid);
        out.push_back(std::nextafter(mid, 0.0f));
        out.push_back(std::nextafter(mid, 2 * mid));
      }
    }
  }
  for (const float f : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, 5.96e-8f, 2.98e-8f,
                        2.99e-8f, 1e-40f, -0.0f, INFINITY, -INFINITY, NAN, -NAN}) {
    out.push_back(f);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) out.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  out.push_back(1.0f);  // an odd count: a tail after the vector loop
  return out;
}

template <typename Half>
void expect_narrowed(const std::vector<float>& in, const std::vector<Half>& got, ConvertPath p) {
  int reported = 0;
  for (size_t i = 0; i < in.size() && reported < 10; ++i) {
    Half want;
    if constexpr (std::is_same_v<Half, F16>) {
      want = to_f16(in[i]);
    } else {
      want = to_bf16(in[i]);
    }
    const bool ok = std::isnan(in[i]) ? std::isnan(to_float(got[i])) : got[i].bits == want.bits;
    if (!ok) {
      ++reported;
      ADD_FAILURE() << name(p) << ": " << std::hexfloat << in[i] << " (bits 0x" << std::hex
                    << std::bit_cast<uint32_t>(in[i]) << ") gave 0x" << got[i].bits
                    << ", expected 0x" << want.bits;
    }
  }
}

TEST(HalfConvert, NarrowsLikeTheScalarConversionsOnEveryPath) {
  const std::vector<float> in = probes();
  for (const ConvertPath p : kPaths) {
    std::vector<F16> f16(in.size());
    to_f16(in, f16.data(), p);
    expect_narrowed(in, f16, p);
    std::vector<Bf16> bf16(in.size());
    to_bf16(in, bf16.data(), p);
    expect_narrowed(in, bf16, p);
  }
}

TEST(HalfConvert, WidensEvery16BitPatternExactlyOnEveryPath) {
  std::vector<F16> f16(0x10001);
  std::vector<Bf16> bf16(0x10001);
  for (uint32_t h = 0; h < f16.size(); ++h) {
    f16[h].bits = bf16[h].bits = static_cast<uint16_t>(h);  // 0x10000 wraps: a tail of one
  }
  for (const ConvertPath p : kPaths) {
    std::vector<float> a(f16.size()), b(bf16.size());
    to_float(f16, a.data(), p);
    to_float(bf16, b.data(), p);
    for (size_t h = 0; h < f16.size(); ++h) {
      const float want_a = to_float(f16[h]), want_b = to_float(bf16[h]);
      if (std::isnan(want_a)) {
        EXPECT_TRUE(std::isnan(a[h])) << name(p) << " f16 0x" << std::hex << h;
      } else {
        EXPECT_EQ(std::bit_cast<uint32_t>(a[h]), std::bit_cast<uint32_t>(want_a))
            << name(p) << " f16 0x" << std::hex << h;
      }
      EXPECT_EQ(std::bit_cast<uint32_t>(b[h]), std::bit_cast<uint32_t>(want_b))
          << name(p) << " bf16 0x" << std::hex << h;
    }
  }
}

TEST(HalfConvert, EmptyAndShortSpansTouchOnlyTheirElements) {
  for (const ConvertPath p : kPaths) {
    for (size_t n = 0; n < 40; ++n) {
      std::vector<float> in(n, 1.5f);
      std::vector<F16> out(n + 1, F16{0x1234});
      to_f16(std::span<const float>(in), out.data(), p);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i].bits, 0x3e00) << name(p) << " n " << n;
      EXPECT_EQ(out[n].bits, 0x1234) << name(p) << " wrote past " << n;
      std::vector<Bf16> bout(n + 1, Bf16{0x1234});
      to_bf16(std::span<const float>(in), bout.data(), p);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(bout[i].bits, 0x3fc0) << name(p) << " n " << n;
      EXPECT_EQ(bout[n].bits, 0x1234) << name(p) << " wrote past " << n;
    }
  }
  SUCCEED() << "vector path on this CPU: " << vector_conversions();
}

}  // namespace
}  // namespace vtrain::common
