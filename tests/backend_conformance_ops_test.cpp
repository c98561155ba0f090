// Backend conformance, part 2: inner product, batch norm, add and
// accumulate, concat, softmax cross-entropy, SGD and scale on every backend
// (tests/backend_conformance.h), against tests/reference_ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/backend_conformance.h"
#include "tests/backend_conformance_cases.h"
#include "tests/backend_conformance_checks.h"
#include "tests/backend_test_support.h"
#include "tests/reference_ops.h"
#include "worker/device/backend.h"

namespace vtrain::backend_test {
namespace {

using backend_test::PrintTo;  // names the cases in gtest's output

using worker::AdamWStep;
using worker::SgdStep;

// ========================================================= inner product

class InnerProductConformance : public OnEveryBackend<InnerProductCase> {};

TEST_P(InnerProductConformance, ForwardAndBackward) {
  check_inner_product(backend(), param(), DataType::kF32, kSumRtol);
}

VTRAIN_ON_EVERY_BACKEND(InnerProductConformance, kInnerProductCases);

// =========================================================== batch norm

class BatchNormConformance : public OnEveryBackend<BatchNormCase> {};

TEST_P(BatchNormConformance, TrainingInferenceAndBackward) {
  check_batch_norm(backend(), param(), DataType::kF32, kSumRtol, tolerance().batch_norm_dx);
}

VTRAIN_ON_EVERY_BACKEND(BatchNormConformance, kBatchNormCases);

// ======================================================= add, accumulate

// Plain, the preferred layout and nChw8c: add and accumulate take any.
std::vector<Layout> any_layouts(Backend& b, int64_t channels) {
  std::vector<Layout> layouts = layouts_for(b, channels);
  if (std::find(layouts.begin(), layouts.end(), Layout::kBlocked8) == layouts.end())
    layouts.push_back(Layout::kBlocked8);
  return layouts;
}

class AddConformance : public OnEveryBackend<EltwiseCase> {};

TEST_P(AddConformance, AnyLayoutsAndAliased) {
  Backend& b = backend();
  const Shape& s = param().shape;
  std::mt19937 rng(16);
  const Vec a = random_vec(rng, s.elements());
  const Vec c = random_vec(rng, s.elements());
  const Vec sum = reference::add(a, c);
  const std::vector<Layout> layouts = any_layouts(b, s.c);
  for (Layout la : layouts) {
    for (Layout lc : layouts) {
      for (Layout ly : layouts) {
        SCOPED_TRACE(std::string(layout_name(la)) + " + " + layout_name(lc) + " -> " +
                     layout_name(ly));
        const DeviceTensor at = to_device(b, a, desc(s, la));
        const DeviceTensor ct = to_device(b, c, desc(s, lc));
        DeviceTensor yt(b, desc(s, ly));
        b.fill(yt.tensor, kNaN);
        add(b, at.tensor, ct.tensor, yt.tensor);
        expect_equal(from_device(b, yt.tensor), sum, "a + c");
      }
    }
    SCOPED_TRACE(layout_name(la));
    const DeviceTensor at = to_device(b, a, desc(s, la));
    const DeviceTensor ct = to_device(b, c, desc(s, la));
    add(b, at.tensor, ct.tensor, at.tensor);
    expect_equal(from_device(b, at.tensor), sum, "a += c (y aliases a)");
    add(b, at.tensor, ct.tensor, ct.tensor);
    expect_equal(from_device(b, ct.tensor), reference::add(sum, c), "c = a + c (y aliases c)");
  }
}

TEST_P(AddConformance, AccumulateOverwritesOrAdds) {
  Backend& b = backend();
  const Shape& s = param().shape;
  std::mt19937 rng(17);
  const Vec x = random_vec(rng, s.elements());
  const Vec y0 = random_vec(rng, s.elements());
  const std::vector<Layout> layouts = any_layouts(b, s.c);
  for (Layout lx : layouts) {
    for (Layout ly : layouts) {
      SCOPED_TRACE(std::string(layout_name(lx)) + " into " + layout_name(ly));
      const DeviceTensor xt = to_device(b, x, desc(s, lx));
      DeviceTensor yt(b, desc(s, ly));
      b.fill(yt.tensor, kNaN);
      accumulate(b, xt.tensor, yt.tensor, 0.0f);
      expect_equal(from_device(b, yt.tensor), x, "beta=0");
      b.upload(y0.data(), yt.tensor);
      accumulate(b, xt.tensor, yt.tensor, 1.0f);
      expect_equal(from_device(b, yt.tensor), reference::add(x, y0), "beta=1");
    }
  }
}

VTRAIN_ON_EVERY_BACKEND(AddConformance, kEltwiseCases);

// ================================================================== mul

class MulConformance : public OnEveryBackend<MulCase> {};

// Plain, the preferred layout and nChw8c, for a and for b each.
TEST_P(MulConformance, ForwardAndBackwardEveryLayoutBothBetas) {
  check_mul(backend(), param(), DataType::kF32, kSumRtol, any_layouts(backend(), param().a.c));
}

VTRAIN_ON_EVERY_BACKEND(MulConformance, kMulCases);

// =============================================================== concat

class ConcatConformance : public OnEveryBackend<ConcatCase> {};

TEST_P(ConcatConformance, ForwardAndBackwardEachInputBothBetas) {
  check_concat(backend(), param(), DataType::kF32);
}

VTRAIN_ON_EVERY_BACKEND(ConcatConformance, kConcatCases);

// ================================================================= loss

class SoftmaxConformance : public OnEveryBackend<SoftmaxCase> {};

TEST_P(SoftmaxConformance, LossStatsAndGradient) {
  check_softmax_cross_entropy(backend(), param(), DataType::kF32, tolerance(), tolerance().dlogits);
}

VTRAIN_ON_EVERY_BACKEND(SoftmaxConformance, kSoftmaxCases);

// ======================================================= SGD and scale

struct SgdCase {
  const char* name;
  int64_t count;
  int steps;
  bool zero_velocity;  // else a random initial velocity
  SgdStep step;
};

const SgdCase kSgdCases[] = {
    {"n1000_two_steps_from_rest", 1000, 2, true, {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f}},
    {"n100003_random_velocity", 100003, 1, false, {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f}},
    {"n1000_unscaling_gradients", 1000, 2, false,
     {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f, .grad_scale = 0x1p-10f}},
    {"n100003_nesterov", 100003, 3, false,
     {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true}},
};

class SgdConformance : public OnEveryBackend<SgdCase> {};

TEST_P(SgdConformance, MomentumAndWeightDecayStepsMatchTheReference) {
  Backend& b = backend();
  const SgdCase& sc = param();
  std::mt19937 rng(20);
  Vec w = random_vec(rng, sc.count);
  Vec v = sc.zero_velocity ? Vec(size_t(sc.count), 0.0f) : random_vec(rng, sc.count);
  const DeviceBuffer wd = to_device(b, w);
  const DeviceBuffer vd = to_device(b, v);
  for (int i = 1; i <= sc.steps; ++i) {
    const Vec g = random_vec(rng, sc.count);
    const DeviceBuffer gd = to_device(b, g);
    sgd_update(b, wd.floats(), gd.floats(), vd.floats(), sc.count, sc.step);
    reference::sgd_update(w, g, v, sc.step);
    expect_close(from_device(b, vd.floats(), sc.count), v, 1e-6,
                 "velocity after step " + std::to_string(i));
    expect_close(from_device(b, wd.floats(), sc.count), w, 1e-6,
                 "weights after step " + std::to_string(i));
  }
}

VTRAIN_ON_EVERY_BACKEND(SgdConformance, kSgdCases);

struct AdamWCase {
  const char* name;
  int64_t count;
  int steps;
  AdamWStep step;  // its .step is the first step's count
};

const AdamWCase kAdamWCases[] = {
    {"n1000_three_steps_from_rest", 1000, 3, {.lr = 1e-3f, .weight_decay = 0.01f}},
    {"n100003_late_steps_unscaling", 100003, 2,
     {.lr = 3e-4f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.05f,
      .grad_scale = 0x1p-10f, .step = 41}},
};

class AdamWConformance : public OnEveryBackend<AdamWCase> {};

TEST_P(AdamWConformance, StepsMatchTheReference) {
  Backend& b = backend();
  const AdamWCase& ac = param();
  std::mt19937 rng(21);
  Vec w = random_vec(rng, ac.count);
  // From rest at step 1; a later step starts from moments of a run.
  Vec m = ac.step.step == 1 ? Vec(size_t(ac.count), 0.0f) : random_vec(rng, ac.count);
  Vec v(size_t(ac.count), 0.0f);
  if (ac.step.step > 1) {
    for (float& x : v) x = 1e-3f * float(rng() % 1000) / 1000.0f;
  }
  const DeviceBuffer wd = to_device(b, w), md = to_device(b, m), vd = to_device(b, v);
  AdamWStep step = ac.step;
  for (int i = 1; i <= ac.steps; ++i, ++step.step) {
    const Vec g = random_vec(rng, ac.count);
    const DeviceBuffer gd = to_device(b, g);
    adamw_update(b, wd.floats(), gd.floats(), md.floats(), vd.floats(), ac.count, step);
    reference::adamw_update(w, g, m, v, step);
    const std::string after = " after step " + std::to_string(step.step);
    expect_close(from_device(b, md.floats(), ac.count), m, 1e-6, "m" + after);
    expect_close(from_device(b, vd.floats(), ac.count), v, 1e-6, "v" + after);
    expect_close(from_device(b, wd.floats(), ac.count), w, 1e-6, "weights" + after);
  }
}

VTRAIN_ON_EVERY_BACKEND(AdamWConformance, kAdamWCases);

struct ReductionCase {
  const char* name;
  std::vector<int64_t> offsets;  // segments of one buffer
};

const ReductionCase kReductionCases[] = {
    {"one_segment_n100003", {0, 100003}},
    {"segments_with_an_empty_one", {0, 7, 7, 5000, 70001}},
};

class OptimizerReductionConformance : public OnEveryBackend<ReductionCase> {};

// Sums of squares (gradient clipping, LARS): close to the double
// reference, and the same bits on every call.
TEST_P(OptimizerReductionConformance, SumSquaresMatchesTheReferenceBitForBitAcrossCalls) {
  Backend& b = backend();
  const ReductionCase& rc = param();
  std::mt19937 rng(22);
  const Vec x = random_vec(rng, rc.offsets.back());
  const DeviceBuffer xd = to_device(b, x);
  b.reserve_scratch(b.scratch_bytes(worker::SumSquaresDesc{rc.offsets.size() - 1}).scratch);
  const std::vector<double> got = sum_squares(b, xd.floats(), rc.offsets);
  const std::vector<double> want = reference::sum_squares(x, rc.offsets);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12 * (1 + want[i])) << i;
  EXPECT_EQ(sum_squares(b, xd.floats(), rc.offsets), got);
}

TEST_P(OptimizerReductionConformance, MovingAverageMatchesTheReference) {
  Backend& b = backend();
  std::mt19937 rng(23);
  const int64_t count = param().offsets.back();
  Vec average = random_vec(rng, count);
  const Vec x = random_vec(rng, count);
  const DeviceBuffer ad = to_device(b, average), xd = to_device(b, x);
  moving_average(b, ad.floats(), xd.floats(), count, 0.999f);
  reference::moving_average(average, x, 0.999f);
  expect_close(from_device(b, ad.floats(), count), average, 1e-6, "average");
}

VTRAIN_ON_EVERY_BACKEND(OptimizerReductionConformance, kReductionCases);

struct ScaleCase {
  const char* name;
  int64_t count;
  float alpha;
};

const ScaleCase kScaleCases[] = {{"n257_by_quarter", 257, 0.25f}, {"n288_by_half", 288, 0.5f}};

class ScaleConformance : public OnEveryBackend<ScaleCase> {};

TEST_P(ScaleConformance, MultipliesInPlaceExactly) {
  Backend& b = backend();
  std::mt19937 rng(21);
  const Vec x = random_vec(rng, param().count);
  const DeviceBuffer xd = to_device(b, x);
  scale(b, xd.floats(), param().count, param().alpha);
  Vec expected = x;
  for (float& e : expected) e *= param().alpha;
  expect_equal(from_device(b, xd.floats(), param().count), expected,
               "x * " + std::to_string(param().alpha));
}

VTRAIN_ON_EVERY_BACKEND(ScaleConformance, kScaleCases);

struct AllFiniteCase {
  const char* name;
  int64_t count;
};

const AllFiniteCase kAllFiniteCases[] = {{"n1", 1}, {"n257", 257}, {"n100003", 100003}};

class AllFiniteConformance : public OnEveryBackend<AllFiniteCase> {};

// Loss scaling's overflow check: one NaN or infinity anywhere (first,
// middle or last element) is found; the largest finite floats are not one.
TEST_P(AllFiniteConformance, FindsOneNonFiniteAnywhere) {
  Backend& b = backend();
  const int64_t n = param().count;
  std::mt19937 rng(22);
  Vec x = random_vec(rng, n);
  x[0] = std::numeric_limits<float>::max();
  x[static_cast<size_t>(n - 1)] = -std::numeric_limits<float>::max();
  EXPECT_TRUE(all_finite(b, to_device(b, x).floats(), n));
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (const int64_t at : {int64_t{0}, n / 2, n - 1}) {
    for (const float v : bad) {
      Vec y = x;
      y[static_cast<size_t>(at)] = v;
      EXPECT_FALSE(all_finite(b, to_device(b, y).floats(), n)) << v << " at " << at;
    }
  }
}

VTRAIN_ON_EVERY_BACKEND(AllFiniteConformance, kAllFiniteCases);

}  // namespace
}  // namespace vtrain::backend_test
