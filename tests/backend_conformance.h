// The backend conformance suite's fixture (the ggml test-backend-ops idea):
// every case of an op runs on every backend kind, as a test of its own named
// "<backend>_<case>", and is checked against tests/reference_ops. A backend
// that is not built, or has no device here, skips its cases saying why.
//
// The suite is backend_conformance_test.cpp (convolutions, relu, pooling, op
// scratch) and backend_conformance_ops_test.cpp (the other ops), one binary,
// with the same cases (backend_conformance_cases.h) in each half type in
// backend_conformance_half*_test.cpp, named "<backend>_<type>_<case>".
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>

#include "common/precision.h"
#include "tests/backend_test_support.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"

namespace vtrain::backend_test {

// The suite's backend kinds: "cpu" and "cuda" with their own layout rule
// (device.layout auto), and "cpu_nhwc" / "cuda_nhwc" with activations
// channels last (device.layout nhwc).
inline constexpr const char* kNhwcKindSuffix = "_nhwc";
inline std::string base_kind(const std::string& kind) {
  return kind.ends_with(kNhwcKindSuffix) ? kind.substr(0, kind.size() - 5) : kind;
}
inline worker::BackendOptions suite_options(const std::string& kind) {
  return {.kind = worker::parse_backend_kind(base_kind(kind)),
          .settings = {.layout = kind.ends_with(kNhwcKindSuffix) ? worker::LayoutChoice::kNhwc
                                                                 : worker::LayoutChoice::kAuto}};
}

// Why the backend of `kind` cannot run here, or nothing when it can.
inline std::optional<std::string> why_unusable(const std::string& suite_kind) {
  const std::string kind = base_kind(suite_kind);
  if (kind == "cpu") return std::nullopt;
  if (const std::optional<std::string> why = worker::why_no_gpu()) {
    return "no CUDA GPU usable (" + *why + ")";
  }
  return std::nullopt;
}

// The backend of each kind that the cases share, created on first use:
// creating one per test would only add library start-up time. Cases that
// count device bytes make their own.
inline Backend& shared_backend(const std::string& kind) {
  static std::map<std::string, std::unique_ptr<Backend>> backends;
  std::unique_ptr<Backend>& backend = backends[kind];
  if (!backend) backend = worker::make_backend(suite_options(kind));
  return *backend;
}

// What each backend is held to where its arithmetic legitimately differs
// from the double reference (each value is what that backend's own tests
// required before the suite).
struct Tolerances {
  double conv_transform;       // FFT and Winograd convolutions (transforms in float)
  double conv_large_winograd;  // Winograd on filters larger than 3x3
  // Max pooling forward and non-overlapping max backward bit-exact; else
  // within pooling_forward / pooling_backward.
  bool exact_max_pooling;
  double pooling_forward, pooling_backward;
  double batch_norm_dx;
  // |loss_sum - reference| <= loss_relative * reference + loss_per_sample * n.
  double loss_relative, loss_per_sample;
  double dlogits;
  // Half convolutions write dw in the half type before it is added to the
  // f32 dw (cuDNN's dw is in the filter's type): one more rounding.
  bool half_dw_rounded;

  // cuDNN's nonfused F(2x2, 5x5) Winograd on the H100: up to 2.4e-3 of the
  // output's scale off the double reference.
  double conv(const std::string& algorithm, const ConvProblem& p) const {
    const bool winograd = algorithm.find("winograd") != std::string::npos;
    if (winograd && std::max(p.window.kernel_h, p.window.kernel_w) > 3) return conv_large_winograd;
    if (winograd || algorithm.find("fft") != std::string::npos) return conv_transform;
    return kSumRtol;
  }
};

inline const Tolerances& tolerances(const std::string& suite_kind) {
  const std::string kind = base_kind(suite_kind);
  static const Tolerances cpu{.conv_transform = kSumRtol,
                              .conv_large_winograd = kSumRtol,
                              .exact_max_pooling = true,
                              .pooling_forward = 1e-6,
                              .pooling_backward = 1e-6,
                              .batch_norm_dx = kSumRtol,
                              .loss_relative = 1e-5,
                              .loss_per_sample = 0.0,
                              .dlogits = 1e-5,
                              .half_dw_rounded = false};
  static const Tolerances cuda{.conv_transform = 1e-3,
                               .conv_large_winograd = 5e-3,
                               .exact_max_pooling = false,
                               .pooling_forward = 1e-6,
                               .pooling_backward = 1e-5,
                               .batch_norm_dx = 1e-3,
                               .loss_relative = 0.0,
                               .loss_per_sample = 1e-9,
                               .dlogits = 1e-6,
                               .half_dw_rounded = true};
  return kind == "cpu" ? cpu : cuda;
}

// Cases of one op, each on every backend kind. Case is a struct with a
// `const char* name` made of letters, digits and underscores.
template <typename Case>
class OnEveryBackend : public ::testing::TestWithParam<std::tuple<std::string, Case>> {
 protected:
  void SetUp() override {
    if (const std::optional<std::string> why = why_unusable(kind())) {
      VTRAIN_SKIP_WITHOUT_GPU("backend " + kind() + ": " + *why);
    }
  }
  const std::string& kind() const { return std::get<0>(this->GetParam()); }
  const Case& param() const { return std::get<1>(this->GetParam()); }
  Backend& backend() const { return shared_backend(kind()); }
  const Tolerances& tolerance() const { return tolerances(kind()); }
};

// "cpu_lenet1_n1"
struct BackendCaseName {
  template <typename Param>
  std::string operator()(const ::testing::TestParamInfo<Param>& info) const {
    return std::get<0>(info.param) + "_" + std::get<1>(info.param).name;
  }
};

// Every backend kind the suite knows, built here or not: an unbuilt one shows
// as skipped cases rather than vanishing from the report.
#define VTRAIN_SUITE_BACKEND_KINDS                                                        \
  ::testing::Values(std::string("cpu"), std::string("cpu_nhwc"), std::string("cuda"), \
                    std::string("cuda_nhwc"))
#define VTRAIN_ON_EVERY_BACKEND(fixture, cases)                                                 \
  INSTANTIATE_TEST_SUITE_P(                                                                     \
      Backends, fixture,                                                                        \
      ::testing::Combine(VTRAIN_SUITE_BACKEND_KINDS, ::testing::ValuesIn(cases)),              \
      ::vtrain::backend_test::BackendCaseName())

// ========================================================== half precision

inline constexpr DataType kHalfTypes[] = {DataType::kBF16, DataType::kF16};

// The training precision that stores tensors in half type `type`.
inline common::Precision half_precision(DataType type) {
  return type == DataType::kBF16 ? common::Precision::kBf16 : common::Precision::kFp16;
}

// Unit roundoff u of a half type (half its ulp at 1): bf16 keeps 8
// significant bits (u = 2^-8, about 3.9e-3), f16 11 (u = 2^-11, about 4.9e-4).
inline double unit_roundoff(DataType type) {
  return type == DataType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// Half outputs of sums (convolution, inner product, average pooling,
// overlapping max-pooling gradients, batch norm's y and dx, dlogits) against
// the reference in half (reference_ops.h: the same rounded inputs, the
// double result rounded once). The backend accumulates the same inputs in
// f32 (off the double sum by far less than kSumRtol of the output's scale)
// and rounds once, so the two roundings land at most one ulp apart: 2u of
// the element. expect_close allows rtol * (|element| + max |element|), at
// least 2 rtol of the element, so rtol = u covers one rounding; a call with
// beta = 1 rounds twice (its result, then the sum with the previous
// contents: the reference adds to its rounded result and rounds again), so
// 2u, plus kSumRtol for the f32 arithmetic before the rounding.
inline double half_sum_rtol(DataType type) { return 2 * unit_roundoff(type) + kSumRtol; }

// A half convolution with `algorithm` against the reference in half:
// half outputs (y, dx) within half_sum_rtol, its f32 part widened to
// t.conv() for FFT and Winograd; the f32 dw within t.conv(), plus one
// rounding where the backend stages dw in the half type. An algorithm that
// sums in f16 ("/true_half", cuDNN's TRUE_HALF) rounds at every step of
// its K-term sums (K = c r s, k r s, or n p q for dw): their error grows
// like sqrt(K) u of the output's scale, allowed twice.
inline double half_conv_rtol(const Tolerances& t, const std::string& algorithm,
                             const ConvProblem& p, ConvKind kind) {
  const DataType type = p.x.dtype;
  const double u = unit_roundoff(type);
  double rtol = t.conv(algorithm, p);
  if (kind != ConvKind::kBackwardFilter) {
    rtol += 2 * u;
  } else if (t.half_dw_rounded) {
    rtol += u;
  }
  // cuDNN's BackwardData algo_0 (its non-deterministic one) adds partial
  // sums into a half dx in dx's type, up to one per filter tap: seen on an
  // H100 (cuDNN 9.19) 1.03-1.13x over the bound above on one element of
  // LeNet's 5x5 convolutions, PSEUDO_HALF and PSEUDO_BF16 alike.
  if (kind == ConvKind::kBackwardData && algorithm.starts_with("algo_0/")) {
    rtol += 2 * std::sqrt(static_cast<double>(p.window.kernel_h * p.window.kernel_w)) * u;
  }
  if (algorithm.ends_with(worker::kTrueHalfAlgorithmSuffix)) {
    const Shape& y = p.y.shape;
    const int64_t terms = kind == ConvKind::kForward        ? p.x.shape.c * p.window.kernel_h * p.window.kernel_w
                          : kind == ConvKind::kBackwardData ? p.k * p.window.kernel_h * p.window.kernel_w
                                                            : y.n * y.h * y.w;
    rtol += 2 * std::sqrt(static_cast<double>(terms)) * u;
  }
  return rtol;
}

// Cases of one op in each half type on every backend kind. A case skips,
// saying why, where the backend is unusable here or cannot run the type's
// precision (Backend::precision_unavailable, in the backend's words).
template <typename Case>
class InHalfOnEveryBackend
    : public ::testing::TestWithParam<std::tuple<std::string, DataType, Case>> {
 protected:
  void SetUp() override {
    if (const std::optional<std::string> why = why_unusable(kind())) {
      VTRAIN_SKIP_WITHOUT_GPU("backend " + kind() + ": " + *why);
    }
    if (const std::optional<std::string> why =
            backend().precision_unavailable(half_precision(type()))) {
      GTEST_SKIP() << "backend " << kind() << " in " << dtype_name(type()) << ": " << *why;
    }
  }
  const std::string& kind() const { return std::get<0>(this->GetParam()); }
  DataType type() const { return std::get<1>(this->GetParam()); }
  const Case& param() const { return std::get<2>(this->GetParam()); }
  Backend& backend() const { return shared_backend(kind()); }
  const Tolerances& tolerance() const { return tolerances(kind()); }
  double sum_rtol() const { return half_sum_rtol(type()); }
  // v rounded to this case's type.
  Vec in_type(Vec v) const { return rounded(type(), std::move(v)); }
  // A tensor descriptor in this case's type.
  TensorDesc typed(Shape shape, Layout layout = Layout::kPlain) const {
    return desc(shape, layout, type());
  }
};

}  // namespace vtrain::backend_test

namespace vtrain::common {
// Names a case's type in gtest's output ("bf16"), found by argument lookup.
inline void PrintTo(DataType type, std::ostream* os) { *os << dtype_name(type); }
}  // namespace vtrain::common

namespace vtrain::backend_test {

// "cpu_bf16_lenet1_n1"
struct HalfCaseName {
  template <typename Param>
  std::string operator()(const ::testing::TestParamInfo<Param>& info) const {
    return std::get<0>(info.param) + "_" + dtype_name(std::get<1>(info.param)) + "_" +
           std::get<2>(info.param).name;
  }
};

#define VTRAIN_IN_HALF_ON_EVERY_BACKEND(fixture, cases)                                         \
  INSTANTIATE_TEST_SUITE_P(                                                                     \
      HalfBackends, fixture,                                                                    \
      ::testing::Combine(VTRAIN_SUITE_BACKEND_KINDS,                                            \
                         ::testing::ValuesIn(::vtrain::backend_test::kHalfTypes),               \
                         ::testing::ValuesIn(cases)),                                           \
      ::vtrain::backend_test::HalfCaseName())

}  // namespace vtrain::backend_test
