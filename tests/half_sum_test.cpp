// The reduction the MPI communicator runs on gradient buckets in half
// precision (train.gradient_allreduce: half; worker/comm/half_sum.h), as a
// plain function against a float reference: one pair is the sum rounded
// once; a chain over many ranks' values stays within the bound of one
// rounding per addition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/half.h"
#include "worker/comm/half_sum.h"

namespace vtrain::worker {
namespace {

using common::DataType;

// One rank's bucket: `count` normal values of magnitude up to `range`, both
// signs, in `type`.
std::vector<uint16_t> random_half(DataType type, int64_t count, float range, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> value(-range, range);
  std::vector<uint16_t> out(static_cast<size_t>(count));
  for (uint16_t& h : out) {
    const float f = value(gen);
    h = type == DataType::kBF16 ? common::to_bf16(f).bits : common::to_f16(f).bits;
  }
  return out;
}

double as_double(DataType type, uint16_t h) {
  return type == DataType::kBF16 ? common::to_float(common::Bf16{h})
                                 : common::to_float(common::F16{h});
}

// The unit roundoff of the type: half the distance from 1 to the next value.
double unit_roundoff(DataType type) { return type == DataType::kBF16 ? 0x1p-8 : 0x1p-11; }

class HalfSum : public ::testing::TestWithParam<DataType> {};

// Two ranks: each element is the exact sum of the pair rounded once, so
// within one unit roundoff of it (relative), and the rounding is the type's
// own (round_to).
TEST_P(HalfSum, APairIsItsSumRoundedOnce) {
  const DataType type = GetParam();
  const int64_t n = 4096;
  const std::vector<uint16_t> a = random_half(type, n, 100, 1);
  std::vector<uint16_t> b = random_half(type, n, 100, 2);
  const std::vector<uint16_t> b0 = b;
  add_half_elements(a.data(), b.data(), n, type);
  int64_t inexact = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double exact = as_double(type, a[i]) + as_double(type, b0[i]);
    const double got = as_double(type, b[i]);
    EXPECT_EQ(got, common::round_to(type, static_cast<float>(exact))) << "element " << i;
    EXPECT_LE(std::fabs(got - exact), unit_roundoff(type) * std::fabs(exact)) << "element " << i;
    inexact += got != exact;
  }
  EXPECT_GT(inexact, n / 4);  // the sums need rounding: the test sees it
}

// 64 ranks' buckets reduced as MPI chains them (each partial sum in half,
// every addition in float and rounded once): within (R - 1) unit roundoffs
// of the sum of magnitudes of the float reference: the bound of recursive
// summation with one rounding per addition.
TEST_P(HalfSum, ManyRanksStayWithinOneRoundingPerAddition) {
  const DataType type = GetParam();
  const int ranks = 64;
  const int64_t n = 1024;
  std::vector<uint16_t> sum = random_half(type, n, 8, 100);
  std::vector<double> reference(static_cast<size_t>(n)), magnitude(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    reference[i] = as_double(type, sum[i]);
    magnitude[i] = std::fabs(reference[i]);
  }
  for (int r = 1; r < ranks; ++r) {
    const std::vector<uint16_t> in = random_half(type, n, 8, 100 + static_cast<uint32_t>(r));
    for (int64_t i = 0; i < n; ++i) {
      reference[i] += as_double(type, in[i]);
      magnitude[i] += std::fabs(as_double(type, in[i]));
    }
    add_half_elements(in.data(), sum.data(), n, type);
  }
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double error = std::fabs(as_double(type, sum[i]) - reference[i]);
    EXPECT_LE(error, (ranks - 1) * unit_roundoff(type) * magnitude[i]) << "element " << i;
    worst = std::max(worst, error / magnitude[i]);
  }
  EXPECT_GT(worst, 0.0);
}

TEST_P(HalfSum, InfinityAndNanSurvive) {
  const DataType type = GetParam();
  const float inf = INFINITY;
  const auto h = [&](float f) {
    return type == DataType::kBF16 ? common::to_bf16(f).bits : common::to_f16(f).bits;
  };
  const std::vector<uint16_t> a = {h(inf), h(NAN), h(1)};
  std::vector<uint16_t> b = {h(1), h(1), h(-inf)};
  add_half_elements(a.data(), b.data(), 3, type);
  EXPECT_TRUE(std::isinf(as_double(type, b[0])));
  EXPECT_TRUE(std::isnan(as_double(type, b[1])));
  EXPECT_EQ(as_double(type, b[2]), -INFINITY);
}

INSTANTIATE_TEST_SUITE_P(Types, HalfSum, ::testing::Values(DataType::kBF16, DataType::kF16),
                         [](const auto& info) { return common::dtype_name(info.param); });

TEST(HalfSumArguments, F32IsRefused) {
  float a = 1, b = 2;
  EXPECT_THROW(add_half_elements(&a, &b, 1, DataType::kF32), std::invalid_argument);
}

}  // namespace
}  // namespace vtrain::worker
