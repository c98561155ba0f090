// Backend conformance in half precision, part 1: the f32 suite's
// convolution, relu, pooling and inner-product cases in bf16 and f16 on
// every backend (tests/backend_conformance.h: "cpu_bf16_lenet1_n1"), against
// the reference ops in half (tests/reference_ops.h); the transfers between
// f32 and half; calls that mix types; and the CPU's refusal of bf16 where
// oneDNN finds no native bf16 (its own ctest entry).
//
// Half in, half out: activations, their gradients, weights and forward
// biases in the case's type; dw and dbias f32. Tolerances: exact where the
// op only selects or copies; half_sum_rtol (backend_conformance.h) for half
// outputs of sums; kSumRtol for f32 outputs of sums over half inputs (the
// reference saw the same rounded inputs, so only the f32 accumulation is
// left, as in the f32 suite). Convolutions add per algorithm what its
// arithmetic rounds beyond that (half_conv_rtol: FFT and Winograd
// transforms, a dw staged in half, TRUE_HALF's f16 sums).
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tests/backend_conformance.h"
#include "tests/backend_conformance_cases.h"
#include "tests/backend_conformance_checks.h"
#include "tests/backend_test_support.h"
#include "tests/reference_ops.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"

namespace vtrain::backend_test {
namespace {

using backend_test::PrintTo;  // names the cases in gtest's output

using worker::BackendError;

// ============================================================== convolution

class HalfConvConformance : public InHalfOnEveryBackend<ConvCase> {
 protected:
  // Every algorithm conv_algorithms() offers for the half problem, in every
  // layout pair, with beta 0 and 1, with bias: y and dx in the half type
  // (beta = 1 adds to the previous contents in that type), dw and dbias f32.
  void check_every_algorithm(ConvKind op) {
    Backend& b = backend();
    const ConvData d(conv_problem(param(), Layout::kPlain, Layout::kPlain, type()));
    for (const auto& [x_layout, y_layout] : conv_layouts(b, param())) {
      const ConvProblem p = conv_problem(param(), x_layout, y_layout, type());
      SCOPED_TRACE(p.str());
      check_half_conv_algorithms(b, op, p, d, tolerance(),
                                 [](const ConvAlgoInfo&) { return true; });
    }
  }
};

// One test for the three kinds (the f32 suite has one each): a test is a
// process under ctest, and the half cases are many.
TEST_P(HalfConvConformance, EveryKindEveryAlgorithmBothBetas) {
  for (ConvKind op : kConvKinds) check_every_algorithm(op);
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfConvConformance, kConvCases);

// ================================================================ relu

class HalfReluConformance : public InHalfOnEveryBackend<ReluCase> {};

TEST_P(HalfReluConformance, ForwardAndBackwardExact) {
  check_relu(backend(), param(), type());
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfReluConformance, kReluCases);

// ============================================================== pooling

class HalfPoolConformance : public InHalfOnEveryBackend<PoolCase> {};

TEST_P(HalfPoolConformance, ForwardAndBackward) {
  check_pooling(backend(), param(), type(), tolerance().exact_max_pooling, sum_rtol(), sum_rtol());
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfPoolConformance, pool_cases());

// ========================================================= inner product

class HalfInnerProductConformance : public InHalfOnEveryBackend<InnerProductCase> {};

TEST_P(HalfInnerProductConformance, ForwardAndBackward) {
  check_inner_product(backend(), param(), type(), sum_rtol());
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfInnerProductConformance, kInnerProductCases);

// ============================================================ transfers

struct TransferCase {
  const char* name;
  Shape shape;
};

// 20 channels: blocked layouts pad them.
const TransferCase kTransferCases[] = {{"n2c20_3x3", {2, 20, 3, 3}}, {"n3c5_2x2", {3, 5, 2, 2}}};

// Random values, then values that test the rounding: ties of both types,
// f16's overflow and subnormals, bf16's range beyond f16, -0.
Vec transfer_values(int64_t count) {
  std::mt19937 rng(31);
  Vec v = random_vec(rng, count, -4.0f, 4.0f);
  const Vec special{1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),
                    1.0f + std::ldexp(1.0f, -11), 2049.0f, 65519.0f, 65520.0f, -70000.0f,
                    std::ldexp(1.0f, -25), 3 * std::ldexp(1.0f, -26), 1.0e30f, -0.0f, 1.0f / 3};
  for (size_t i = 0; i < special.size() && i < v.size(); ++i) v[i * 3] = special[i];
  return v;
}

class HalfTransferConformance : public InHalfOnEveryBackend<TransferCase> {
 protected:
  // Every layout the backend may hold an activation in.
  std::vector<Layout> layouts() {
    std::vector<Layout> all = layouts_for(backend(), param().shape.c);
    if (all.back() != Layout::kBlocked8) all.push_back(Layout::kBlocked8);
    return all;
  }
};

// upload rounds to nearest even and download widens exactly, in every
// layout: a round trip equals round_to. fill rounds its value the same way.
TEST_P(HalfTransferConformance, UploadDownloadAndFillRoundToTheType) {
  Backend& b = backend();
  const Shape& s = param().shape;
  const Vec host = transfer_values(s.elements());
  for (Layout layout : layouts()) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor t = to_device(b, host, typed(s, layout));
    expect_equal(from_device(b, t.tensor), in_type(host), "upload then download");
    for (float value : {0.1f, -65520.0f, 1.0f + std::ldexp(1.0f, -8)}) {
      b.fill(t.tensor, value);
      expect_equal(from_device(b, t.tensor), in_type(Vec(host.size(), value)),
                   "fill " + std::to_string(value));
    }
  }
}

// convert between f32 and the half type, and between layouts within each:
// f32 -> half rounds as upload does, half -> f32 and half -> half are exact.
TEST_P(HalfTransferConformance, ConvertBetweenTypesAndLayoutsIsExactAfterRounding) {
  Backend& b = backend();
  const Shape& s = param().shape;
  const Vec host = transfer_values(s.elements());
  const Vec expected = in_type(host);
  for (Layout from : layouts()) {
    const DeviceTensor f32 = to_device(b, host, desc(s, from));
    const DeviceTensor half = to_device(b, host, typed(s, from));
    for (Layout to : layouts()) {
      SCOPED_TRACE(std::string(layout_name(from)) + " -> " + layout_name(to));
      DeviceTensor half_out(b, typed(s, to));
      DeviceTensor f32_out(b, desc(s, to));
      b.convert(f32.tensor, half_out.tensor);
      expect_equal(from_device(b, half_out.tensor), expected, "f32 -> half");
      b.fill(half_out.tensor, kNaN);
      b.convert(half.tensor, half_out.tensor);
      expect_equal(from_device(b, half_out.tensor), expected, "half -> half");
      b.convert(half.tensor, f32_out.tensor);
      expect_equal(from_device(b, f32_out.tensor), expected, "half -> f32");
    }
  }
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfTransferConformance, kTransferCases);

// ========================================================= mixed types

// One call, one element type (backend.h): an f32 tensor beside a half one
// is refused, naming both types.
TEST_P(HalfTransferConformance, CallsMixingTypesNameBoth) {
  Backend& b = backend();
  const Shape& s = param().shape;
  const DeviceTensor f32 = filled(b, desc(s));
  const DeviceTensor half = filled(b, typed(s));
  const std::string type_name = dtype_name(type());
  const auto expect_refused = [&](const char* op, const std::function<void()>& call) {
    const std::string message = test_support::error_message<BackendError>(call);
    EXPECT_CONTAINS(message, "f32") << op;
    EXPECT_CONTAINS(message, type_name) << op;
  };
  expect_refused("add", [&] { add(b, f32.tensor, half.tensor, half.tensor); });
  for (float beta : {0.0f, 1.0f}) {
    expect_refused("accumulate", [&] { accumulate(b, half.tensor, f32.tensor, beta); });
  }
  const PoolDesc pool;
  const Shape pooled{s.n, s.c, s.h / 2, s.w / 2};
  const DeviceTensor y = filled(b, typed(pooled));
  DeviceBuffer state(b, pooling_state_bytes(b, pool, f32.tensor.desc, desc(pooled)));
  expect_refused("pooling_forward",
                 [&] { pooling_forward(b, pool, f32.tensor, y.tensor, state.get()); });
}

// =================================================== the CPU's ISA check

// oneDNN reads DNNL_MAX_CPU_ISA once per process, so this runs as a ctest
// entry of its own with DNNL_MAX_CPU_ISA=AVX2 (tests/CMakeLists.txt); in
// the suite's ordinary run it skips.
TEST(HalfPrecisionAvailability, CpuRefusesBf16NamingTheIsaWhenOneDnnIsCappedAtAvx2) {
  const char* cap = std::getenv("DNNL_MAX_CPU_ISA");
  if (cap == nullptr || std::string(cap) != "AVX2") {
    GTEST_SKIP() << "needs DNNL_MAX_CPU_ISA=AVX2 in the environment before oneDNN starts; ctest "
                    "runs it so as HalfConformance.CpuBf16RefusedWithOneDnnCappedAtAvx2";
  }
  const std::unique_ptr<Backend> cpu = worker::make_backend({.kind = worker::BackendKind::kCpu});
  const std::optional<std::string> why = cpu->precision_unavailable(common::Precision::kBf16);
  ASSERT_TRUE(why.has_value()) << "bf16 accepted with oneDNN capped at AVX2";
  EXPECT_CONTAINS(*why, "AVX2");
  EXPECT_CONTAINS(*why, "AVX-512 BF16 or AMX");
  EXPECT_EQ(cpu->precision_unavailable(common::Precision::kFp32), std::nullopt);
}

}  // namespace
}  // namespace vtrain::backend_test
