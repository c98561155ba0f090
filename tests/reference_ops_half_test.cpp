// The half-precision side of the oracle: common/half.h's host conversions
// against values worked out by hand (they decide what "the op in half"
// means for every half-precision backend test), and reference::rounded.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/half.h"
#include "tests/reference_ops.h"

namespace vtrain::reference {
namespace {

using common::Bf16;
using common::DataType;
using common::F16;
using common::round_to;
using common::to_bf16;
using common::to_f16;
using common::to_float;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

float pow2(int e) { return std::ldexp(1.0f, e); }

// ------------------------------------------------------------------ bf16

// bf16 keeps 8 significant bits: the neighbours of 1 are 1 - 2^-8 and
// 1 + 2^-7, so 1 + 2^-8 is a tie.
TEST(HalfBf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_bf16(1.0f + pow2(-8)).bits, 0x3f80) << "tie: down to the even 1";
  EXPECT_EQ(to_bf16(1.0f + 3 * pow2(-8)).bits, 0x3f82) << "tie: up to the even 1 + 2^-6";
  EXPECT_EQ(to_float(to_bf16(1.0f + 3 * pow2(-8))), 1.0f + pow2(-6));
  EXPECT_EQ(to_bf16(1.0f + pow2(-8) + pow2(-20)).bits, 0x3f81) << "just above the tie";
  EXPECT_EQ(to_bf16(1.0f + pow2(-8) - pow2(-20)).bits, 0x3f80) << "just below the tie";
  EXPECT_EQ(to_bf16(-1.0f - 3 * pow2(-8)).bits, 0xbf82) << "the sign does not change the rounding";
  EXPECT_EQ(to_bf16(-0.0f).bits, 0x8000);
}

TEST(HalfBf16, KeepsFloatsRangeAndNaN) {
  EXPECT_TRUE(std::isnan(to_float(to_bf16(kNaN))));
  // A NaN whose payload lies only in the 16 bits that are dropped must not
  // become infinity.
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(to_float(to_bf16(kInf)), kInf);
  EXPECT_EQ(to_float(to_bf16(-kInf)), -kInf);
  // The largest bf16, 0x7f7f = (2 - 2^-7) * 2^127, and float-sized values
  // that fp16 could not hold.
  EXPECT_EQ(to_float(Bf16{0x7f7f}), (2.0f - pow2(-7)) * pow2(127));
  EXPECT_EQ(to_bf16((2.0f - pow2(-7)) * pow2(127)).bits, 0x7f7f);
  EXPECT_EQ(to_float(to_bf16(3.0e38f)), 3.00405527e38f);
  EXPECT_EQ(to_float(to_bf16(1.0e30f)), 1.00025555e30f);
  EXPECT_EQ(to_float(to_bf16(pow2(-126))), pow2(-126)) << "float's smallest normal";
  // Above the largest bf16 by half an ulp or more: infinity.
  EXPECT_EQ(to_float(to_bf16(std::numeric_limits<float>::max())), kInf);
}

TEST(HalfBf16, EveryPatternButNaNRoundTripsExactly) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const Bf16 h{static_cast<uint16_t>(bits)};
    if (std::isnan(to_float(h))) continue;
    ASSERT_EQ(to_bf16(to_float(h)).bits, bits) << "bf16 0x" << std::hex << bits;
  }
}

// ------------------------------------------------------------------- f16

TEST(HalfF16, LargestFiniteAndOverflow) {
  EXPECT_EQ(to_f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(to_float(F16{0x7bff}), 65504.0f);
  // The next value would be 65536: 65520 is the tie, which goes to the even
  // (infinite) side; anything below it comes back to 65504.
  EXPECT_EQ(to_f16(65519.996f).bits, 0x7bff);
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00);
  EXPECT_EQ(to_float(to_f16(65520.0f)), kInf);
  EXPECT_EQ(to_f16(-65520.0f).bits, 0xfc00);
  EXPECT_EQ(to_f16(1.0e6f).bits, 0x7c00);
  EXPECT_EQ(to_float(to_f16(kInf)), kInf);
  EXPECT_TRUE(std::isnan(to_float(to_f16(kNaN))));
}

TEST(HalfF16, SubnormalsRoundTiesToEven) {
  EXPECT_EQ(to_f16(pow2(-14)).bits, 0x0400) << "smallest normal";
  EXPECT_EQ(to_f16(pow2(-24)).bits, 0x0001) << "smallest subnormal";
  EXPECT_EQ(to_float(F16{0x0001}), pow2(-24));
  EXPECT_EQ(to_f16(pow2(-25)).bits, 0x0000) << "tie between 0 and 2^-24: the even 0";
  EXPECT_EQ(to_f16(3 * pow2(-26)).bits, 0x0001) << "0.75 * 2^-24 rounds up";
  EXPECT_EQ(to_f16(3 * pow2(-25)).bits, 0x0002) << "1.5 * 2^-24: tie to the even 2";
  EXPECT_EQ(to_f16(-pow2(-24)).bits, 0x8001);
  EXPECT_EQ(to_float(F16{0x03ff}), 1023 * pow2(-24)) << "largest subnormal";
}

TEST(HalfF16, NormalValuesAndTies) {
  EXPECT_EQ(to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(to_f16(1.0f / 3.0f).bits, 0x3555);
  EXPECT_EQ(to_float(to_f16(1.0f / 3.0f)), 0.333251953125f);
  EXPECT_EQ(to_f16(-2.5f).bits, 0xc100);
  EXPECT_EQ(to_float(F16{0xc100}), -2.5f);
  // 11 significant bits: between 2048 and 4096 the spacing is 2.
  EXPECT_EQ(to_float(to_f16(2049.0f)), 2048.0f) << "tie to the even 2048";
  EXPECT_EQ(to_float(to_f16(2051.0f)), 2052.0f) << "tie to the even 2052";
  EXPECT_EQ(to_float(to_f16(1.0f + pow2(-11))), 1.0f) << "tie to the even 1";
  EXPECT_EQ(to_float(to_f16(1.0f + 3 * pow2(-11))), 1.0f + pow2(-9));
  EXPECT_EQ(to_f16(-0.0f).bits, 0x8000);
}

TEST(HalfF16, EveryPatternButNaNRoundTripsExactly) {
  int checked = 0;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const F16 h{static_cast<uint16_t>(bits)};
    const bool nan = ((bits >> 10) & 0x1f) == 0x1f && (bits & 0x3ff) != 0;
    ASSERT_EQ(std::isnan(to_float(h)), nan) << "f16 0x" << std::hex << bits;
    if (nan) continue;
    ASSERT_EQ(to_f16(to_float(h)).bits, bits) << "f16 0x" << std::hex << bits;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 1023);
}

// ------------------------------------------------------- reference::rounded

TEST(ReferenceRounded, RoundsEachElementToTheType) {
  const Vec v{1.0f + pow2(-8), 1.0f + 3 * pow2(-8), 1.0f / 3.0f, 70000.0f, -pow2(-25)};
  EXPECT_EQ(rounded(DataType::kF32, v), v);
  const Vec bf16 = rounded(DataType::kBF16, v);
  const Vec f16 = rounded(DataType::kF16, v);
  ASSERT_EQ(bf16.size(), v.size());
  ASSERT_EQ(f16.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(bf16[i], round_to(DataType::kBF16, v[i])) << i;
    EXPECT_EQ(f16[i], round_to(DataType::kF16, v[i])) << i;
  }
  EXPECT_EQ(bf16[0], 1.0f);
  EXPECT_EQ(f16[3], kInf);
  EXPECT_EQ(bf16[3], 70144.0f);
}

// An op in half: inputs rounded, the reference run, the output rounded.
// b = 2^-8 + 2^-17 is 2^-8 in bf16, so 1 + b in bf16 is the tie 1 + 2^-8,
// which rounds to 1, where rounding only the float sum gives 1 + 2^-7.
TEST(ReferenceRounded, AnOpInHalfRoundsItsInputsAndItsOutput) {
  const Vec a{1.0f};
  const Vec b{pow2(-8) + pow2(-17)};
  EXPECT_EQ(rounded(DataType::kBF16, add(a, b))[0], 1.0f + pow2(-7));
  const Vec b_bf16 = rounded(DataType::kBF16, b);
  EXPECT_EQ(b_bf16[0], pow2(-8));
  EXPECT_EQ(rounded(DataType::kBF16, add(rounded(DataType::kBF16, a), b_bf16))[0], 1.0f);
}

}  // namespace
}  // namespace vtrain::reference
