// The test-only half emulation (worker/device/test_only/half_emulation.h):
// it offers bf16 and fp16 on any CPU, names its device so, and computes an
// op on half tensors exactly as the CPU backend's f32 op on the widened
// inputs, rounded once.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "common/half.h"
#include "worker/device/backend.h"
#include "worker/device/op_calls.h"
#include "worker/device/test_only/half_emulation.h"

namespace vtrain::worker {
namespace {

using common::DataType;

// Device memory for one tensor, freed with the fixture's backend.
struct Buffer {
  Backend& backend;
  Tensor tensor;
  Buffer(Backend& b, TensorDesc desc) : backend(b), tensor{desc, b.allocate_device(desc.bytes())} {}
  ~Buffer() { backend.free_device(tensor.data); }
};

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

TEST(HalfEmulation, OffersBothHalfTypesAndSaysSoInTheDeviceName) {
  const auto emulated =
      emulate_half(make_backend({.kind = worker::BackendKind::kCpu, .threads = 1}));
  EXPECT_FALSE(emulated->precision_unavailable(common::Precision::kBf16));
  EXPECT_FALSE(emulated->precision_unavailable(common::Precision::kFp16));
  EXPECT_TRUE(emulated->precision_unavailable(common::Precision::kTf32));
  EXPECT_TRUE(emulated->device_info().name.ends_with(kHalfEmulationSuffix));
}

// An inner product in each half type: the emulation's output is the f32
// op's on the rounded inputs and weights, rounded once, bit for bit.
TEST(HalfEmulation, AnOpIsTheF32OpOnTheRoundedInputsRoundedOnce) {
  const auto emulated =
      emulate_half(make_backend({.kind = worker::BackendKind::kCpu, .threads = 1}));
  const auto plain = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Shape in{4, 3, 5, 5}, out{4, 7, 1, 1};
  const std::vector<float> x = random_floats(in.elements(), 1);
  const std::vector<float> w = random_floats(7 * in.per_sample(), 2);
  const std::vector<float> b = random_floats(7, 3);
  for (DataType type : {DataType::kBF16, DataType::kF16}) {
    SCOPED_TRACE(common::dtype_name(type));
    // Expected: the plain backend's f32 op on the rounded values, rounded.
    auto rounded = [&](std::vector<float> v) {
      for (float& f : v) f = common::round_to(type, f);
      return v;
    };
    Buffer fx(*plain, {in, Layout::kPlain, DataType::kF32});
    Buffer fy(*plain, {out, Layout::kPlain, DataType::kF32});
    plain->upload(rounded(x).data(), fx.tensor);
    const std::vector<float> rw = rounded(w), rb = rounded(b);
    inner_product_forward(*plain, fx.tensor, rw.data(), rb.data(), fy.tensor);
    std::vector<float> expected(static_cast<size_t>(out.elements()));
    plain->download(fy.tensor, expected.data());
    expected = rounded(expected);

    Buffer hx(*emulated, {in, Layout::kPlain, type}), hy(*emulated, {out, Layout::kPlain, type});
    Buffer hw(*emulated, {{7, in.c, in.h, in.w}, Layout::kPlain, type});
    Buffer hb(*emulated, vector_desc(7, type));
    emulated->upload(x.data(), hx.tensor);
    emulated->upload(w.data(), hw.tensor);
    emulated->upload(b.data(), hb.tensor);
    inner_product_forward(*emulated, hx.tensor, hw.tensor.data, hb.tensor.data, hy.tensor);
    std::vector<float> got(static_cast<size_t>(out.elements()));
    emulated->download(hy.tensor, got.data());
    EXPECT_EQ(got, expected);
  }
}

// A depthwise convolution (groups = channels, stride 2, with a bias) in
// each half type: the emulation passes the groups on, its output is the f32
// op's on the rounded inputs, rounded once, bit for bit.
TEST(HalfEmulation, ADepthwiseConvolutionIsTheF32OneRoundedOnce) {
  const auto emulated =
      emulate_half(make_backend({.kind = worker::BackendKind::kCpu, .threads = 1}));
  const auto plain = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  auto problem = [](DataType type) {
    ConvProblem p{.x = {{2, 8, 7, 7}, Layout::kPlain, type}, .k = 8,
                  .window = {3, 3, 2, 2, 1, 1}, .groups = 8};
    p.y = {p.output_shape(), Layout::kPlain, type};
    return p;
  };
  const ConvProblem f32 = problem(DataType::kF32);
  const std::vector<float> x = random_floats(f32.x.shape.elements(), 4);
  const std::vector<float> w = random_floats(f32.weight_shape().elements(), 5);
  const std::vector<float> b = random_floats(8, 6);
  // y of p on `backend` from x, w and b as `backend` stores p's type.
  auto forward = [&](Backend& backend, const ConvProblem& p, const std::vector<float>& xs,
                     const std::vector<float>& ws, const std::vector<float>& bs) {
    Buffer bx(backend, p.x), by(backend, p.y);
    Buffer bw(backend, {p.weight_shape(), Layout::kPlain, p.x.dtype});
    Buffer bb(backend, vector_desc(8, p.x.dtype));
    backend.upload(xs.data(), bx.tensor);
    backend.upload(ws.data(), bw.tensor);
    backend.upload(bs.data(), bb.tensor);
    const ConvAlgoInfo algo = conv_algorithms(backend, ConvKind::kForward, p, false).front();
    Buffer workspace(backend, {{static_cast<int64_t>(algo.workspace_bytes) + 1, 1, 1, 1},
                               Layout::kPlain, DataType::kBF16});
    conv_forward(backend, algo.algo, p, bx.tensor, bw.tensor.data, bb.tensor.data, by.tensor,
                 0.0f, workspace.tensor.data, algo.workspace_bytes);
    std::vector<float> y(static_cast<size_t>(p.y.shape.elements()));
    backend.download(by.tensor, y.data());
    return y;
  };
  for (DataType type : {DataType::kBF16, DataType::kF16}) {
    SCOPED_TRACE(common::dtype_name(type));
    auto rounded = [&](std::vector<float> v) {
      for (float& f : v) f = common::round_to(type, f);
      return v;
    };
    const std::vector<float> expected =
        rounded(forward(*plain, f32, rounded(x), rounded(w), rounded(b)));
    EXPECT_EQ(forward(*emulated, problem(type), x, w, b), expected);
  }
}

}  // namespace
}  // namespace vtrain::worker
