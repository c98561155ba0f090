// Backend conformance of dropout (DropoutDesc, issue 43) on every backend
// kind of the suite (backend_conformance.h), in f32 and in each half type,
// plain and in the backend's preferred layout: forward and backward against
// reference::dropout_apply with the host's mask (worker/engine/dropout_mask.h,
// so the device draws the host's mask, element for element in logical
// order whatever the layout); the output written over the input; a batch
// cut in two calls (as two ranks' shares, first_sample apart) gives the
// whole batch's result; the backward equals the central difference of the
// forward under the same key (a fixed mask); p = 0 is the identity; p out
// of [0, 1) is refused naming the op.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/backend_conformance.h"
#include "tests/backend_test_support.h"
#include "tests/reference_ops.h"
#include "worker/device/backend.h"
#include "worker/engine/dropout_mask.h"

namespace vtrain::backend_test {
namespace {

using backend_test::PrintTo;  // names the cases in gtest's output
using worker::Direction;
using worker::DropoutArgs;
using worker::DropoutDesc;
using worker::DropoutKey;

struct DropoutCase {
  const char* name;
  Shape shape;
  float p;
  int64_t first_sample;  // the global batch index of the call's sample 0
  unsigned seed;
};

// 20 channels: the blocked layouts pad them (to 24 or 32), and the mask
// must leave the padding alone. n5c9_1x1: an fc's output. p 0.5 and the
// presets' 0.2 and a rare drop.
const DropoutCase kDropoutCases[] = {{"n3c20_5x5_p0_2", {3, 20, 5, 5}, 0.2f, 0, 3},
                                     {"n4c16_3x3_p0_5_from7", {4, 16, 3, 3}, 0.5f, 7, 4},
                                     {"n2c7_4x6_p0_5_from44", {2, 7, 4, 6}, 0.5f, 44, 5},
                                     {"n5c9_1x1_p0_05", {5, 9, 1, 1}, 0.05f, 13, 6}};

const DropoutKey kKey{42, 17, 3};

DropoutDesc dropout_desc(const DropoutCase& dc, Direction direction, const TensorDesc& x,
                         int64_t first_sample) {
  return {.direction = direction, .x = x, .p = dc.p, .key = kKey, .first_sample = first_sample};
}

// The host's mask of the case's samples.
std::vector<uint8_t> host_mask(const DropoutCase& dc, int64_t first_sample, int64_t samples) {
  const Shape& s = dc.shape;
  std::vector<uint8_t> keep(static_cast<size_t>(samples * s.c * s.h * s.w));
  worker::dropout_mask(kKey, dc.p, first_sample, samples, s.c * s.h * s.w, keep.data());
  return keep;
}

// One call on the device: forward x -> y or backward dy -> dx, in place
// when `in_place`; returns the output (plain floats).
Vec run_dropout(Backend& b, const DropoutDesc& d, const Vec& in, bool in_place = false) {
  const DeviceTensor input = to_device(b, in, d.x);
  const DeviceTensor separate = filled(b, d.x, kNaN);
  const Tensor& out = in_place ? input.tensor : separate.tensor;
  if (d.direction == Direction::kForward) {
    b.run(d, DropoutArgs{.x = input.tensor.data, .y = out.data});
  } else {
    b.run(d, DropoutArgs{.dy = input.tensor.data, .dx = out.data});
  }
  return from_device(b, out);
}

// Forward and backward against the reference in `type` (in f32: one
// rounding of x * scale, to float), written apart and in place.
void check_dropout(Backend& b, const DropoutCase& dc, DataType type, double rtol) {
  std::mt19937 rng(dc.seed);
  const Vec x = rounded(type, random_vec(rng, dc.shape.elements()));
  const std::vector<uint8_t> keep = host_mask(dc, dc.first_sample, dc.shape.n);
  const Vec expected = rounded(type, reference::dropout_apply(x, keep, dc.p));
  for (Layout layout : layouts_for(b, dc.shape.c)) {
    const TensorDesc d = desc(dc.shape, layout, type);
    for (Direction direction : {Direction::kForward, Direction::kBackward}) {
      const std::string what = std::string(layout_name(layout)) +
                                (direction == Direction::kForward ? " forward" : " backward");
      const DropoutDesc op = dropout_desc(dc, direction, d, dc.first_sample);
      const Vec y = run_dropout(b, op, x);
      expect_close(y, expected, rtol, what);
      expect_equal(run_dropout(b, op, x, true), y, what + " in place");
    }
  }
}

class DropoutConformance : public OnEveryBackend<DropoutCase> {};

TEST_P(DropoutConformance, ForwardAndBackwardApplyTheHostMask) {
  check_dropout(backend(), param(), DataType::kF32, 1e-6);
}

// Samples [0, k) at first_sample and [k, n) at first_sample + k, as two
// ranks would run them, give the whole call's outputs bit for bit.
TEST_P(DropoutConformance, TwoSharesOfTheBatchGiveTheWholeBatch) {
  Backend& b = backend();
  const DropoutCase& dc = param();
  const Shape& s = dc.shape;
  std::mt19937 rng(dc.seed);
  const Vec x = random_vec(rng, s.elements());
  const int64_t k = s.n / 2, per_sample = s.c * s.h * s.w;
  for (Layout layout : layouts_for(b, s.c)) {
    const Vec whole = run_dropout(
        b, dropout_desc(dc, Direction::kForward, desc(s, layout), dc.first_sample), x);
    const Vec head(x.begin(), x.begin() + k * per_sample), tail(x.begin() + k * per_sample, x.end());
    Vec pieced = run_dropout(
        b, dropout_desc(dc, Direction::kForward, desc({k, s.c, s.h, s.w}, layout), dc.first_sample),
        head);
    const Vec rest = run_dropout(
        b,
        dropout_desc(dc, Direction::kForward, desc({s.n - k, s.c, s.h, s.w}, layout),
                     dc.first_sample + k),
        tail);
    pieced.insert(pieced.end(), rest.begin(), rest.end());
    expect_equal(pieced, whole, layout_name(layout));
  }
}

// dx = dy * d(forward)/dx under one key: the central difference of the
// forward at x +- h, which the mask does not change.
TEST_P(DropoutConformance, BackwardIsTheCentralDifferenceOfTheForward) {
  Backend& b = backend();
  const DropoutCase& dc = param();
  std::mt19937 rng(dc.seed);
  const Vec x = random_vec(rng, dc.shape.elements());
  const Vec dy = random_vec(rng, dc.shape.elements());
  constexpr float kStep = 1.0f / 64;  // exact, as x +- kStep nearly is
  Vec up = x, down = x;
  for (float& v : up) v += kStep;
  for (float& v : down) v -= kStep;
  for (Layout layout : layouts_for(b, dc.shape.c)) {
    const TensorDesc d = desc(dc.shape, layout);
    const Vec f_up = run_dropout(b, dropout_desc(dc, Direction::kForward, d, dc.first_sample), up);
    const Vec f_down =
        run_dropout(b, dropout_desc(dc, Direction::kForward, d, dc.first_sample), down);
    const Vec dx = run_dropout(b, dropout_desc(dc, Direction::kBackward, d, dc.first_sample), dy);
    Vec numeric(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      numeric[i] = static_cast<float>(dy[i] * (double(f_up[i]) - f_down[i]) / (2.0 * kStep));
    }
    expect_close(dx, numeric, 1e-4, layout_name(layout));
  }
}

TEST_P(DropoutConformance, PZeroIsTheIdentity) {
  Backend& b = backend();
  const DropoutCase& dc = param();
  std::mt19937 rng(dc.seed);
  const Vec x = random_vec(rng, dc.shape.elements());
  DropoutDesc op = dropout_desc(dc, Direction::kForward, desc(dc.shape), dc.first_sample);
  op.p = 0.0f;
  expect_equal(run_dropout(b, op, x), x, "p 0");
}

TEST_P(DropoutConformance, PAtOneOrBelowZeroIsRefusedNamingTheOp) {
  Backend& b = backend();
  const DropoutCase& dc = param();
  const DeviceTensor t = filled(b, desc(dc.shape));
  for (float p : {1.0f, -0.1f}) {
    DropoutDesc op = dropout_desc(dc, Direction::kBackward, desc(dc.shape), 0);
    op.p = p;
    try {
      b.run(op, DropoutArgs{.dy = t.tensor.data, .dx = t.tensor.data});
      ADD_FAILURE() << "p " << p << " ran";
    } catch (const worker::BackendError& e) {
      EXPECT_CONTAINS(std::string(e.what()), "dropout backward: p must be in [0, 1), got ");
    }
  }
}

VTRAIN_ON_EVERY_BACKEND(DropoutConformance, kDropoutCases);

// In bf16 and f16: x in the type, the kept values x * scale rounded once
// to it (the reference rounds the double product; the backend the f32
// product: one ulp of the type apart at most).
class HalfDropoutConformance : public InHalfOnEveryBackend<DropoutCase> {};

TEST_P(HalfDropoutConformance, ForwardAndBackwardApplyTheHostMask) {
  check_dropout(backend(), param(), type(), sum_rtol());
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfDropoutConformance, kDropoutCases);

}  // namespace
}  // namespace vtrain::backend_test
