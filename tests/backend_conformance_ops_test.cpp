// Backend conformance, part 2: inner product, batch norm, add and
// accumulate, concat, softmax cross-entropy, SGD and scale on every backend
// (tests/backend_conformance.h), against tests/reference_ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
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
  Backend& b = backend();
  const BatchNormData d(param());
  const Shape& s = d.s;
  const int64_t c = s.c;
  const DeviceBuffer ss = to_device(b, d.scale_shift);
  for (Layout layout : layouts_for(b, c)) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor xt = to_device(b, d.x, desc(s, layout));
    DeviceTensor yt(b, desc(s, layout));
    DeviceBuffer save_mean(b, c * sizeof(float));
    DeviceBuffer save_var(b, c * sizeof(float));
    const DeviceBuffer running_mean = to_device(b, d.running_mean0);
    const DeviceBuffer running_var = to_device(b, d.running_var0);
    b.fill(yt.tensor, kNaN);
    b.batch_norm_forward_training(xt.tensor, yt.tensor, ss.floats(), save_mean.floats(),
                                  save_var.floats(), running_mean.floats(), running_var.floats(),
                                  d.momentum, d.eps);
    expect_close(from_device(b, yt.tensor), d.fwd.y, kSumRtol, "bn training y");
    expect_close(from_device(b, save_mean.floats(), c), d.fwd.mean, kSumRtol, "bn saved mean");
    expect_close(from_device(b, save_var.floats(), c), d.fwd.var, kSumRtol,
                 "bn saved (biased) variance");
    expect_close(from_device(b, running_mean.floats(), c), d.running_mean, kSumRtol,
                 "bn running mean");
    expect_close(from_device(b, running_var.floats(), c), d.running_var, kSumRtol,
                 "bn running variance (unbiased batch variance)");

    // Inference with the initial running statistics, then the updated ones.
    const DeviceBuffer rm0 = to_device(b, d.running_mean0);
    const DeviceBuffer rv0 = to_device(b, d.running_var0);
    DeviceTensor inf(b, desc(s, layout));
    b.fill(inf.tensor, kNaN);
    b.batch_norm_forward_inference(xt.tensor, inf.tensor, ss.floats(), rm0.floats(), rv0.floats(),
                                   d.eps);
    expect_close(from_device(b, inf.tensor),
                 reference::batch_norm_forward_inference(s, d.x, d.gamma, d.beta, d.running_mean0,
                                                         d.running_var0, d.eps),
                 kSumRtol, "bn inference y");
    b.fill(inf.tensor, kNaN);
    b.batch_norm_forward_inference(xt.tensor, inf.tensor, ss.floats(), running_mean.floats(),
                                   running_var.floats(), d.eps);
    expect_close(from_device(b, inf.tensor),
                 reference::batch_norm_forward_inference(s, d.x, d.gamma, d.beta, d.running_mean,
                                                         d.running_var, d.eps),
                 kSumRtol, "bn inference y with the updated running statistics");

    // beta applies to d(scale_shift) only: dx is overwritten both times.
    const DeviceTensor dyt = to_device(b, d.dy, desc(s, layout));
    DeviceTensor dxt(b, desc(s, layout));
    DeviceBuffer dss(b, 2 * c * sizeof(float));
    b.fill(flat(dss.floats(), 2 * c), kNaN);
    for (float beta : {0.0f, 1.0f}) {
      const std::string what = " beta=" + std::to_string(int(beta));
      b.fill(dxt.tensor, kNaN);
      b.batch_norm_backward(xt.tensor, dyt.tensor, ss.floats(), save_mean.floats(),
                            save_var.floats(), dxt.tensor, dss.floats(), beta, d.eps);
      expect_close(from_device(b, dxt.tensor), d.back.dx, tolerance().batch_norm_dx,
                   "bn dx" + what);
      expect_close(from_device(b, dss.floats(), 2 * c),
                   beta == 0.0f ? d.dscale_shift : plus(d.dscale_shift, d.dscale_shift), kSumRtol,
                   "bn d(scale_shift)" + what);
    }
  }
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
        b.add(at.tensor, ct.tensor, yt.tensor);
        expect_equal(from_device(b, yt.tensor), sum, "a + c");
      }
    }
    SCOPED_TRACE(layout_name(la));
    const DeviceTensor at = to_device(b, a, desc(s, la));
    const DeviceTensor ct = to_device(b, c, desc(s, la));
    b.add(at.tensor, ct.tensor, at.tensor);
    expect_equal(from_device(b, at.tensor), sum, "a += c (y aliases a)");
    b.add(at.tensor, ct.tensor, ct.tensor);
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
      b.accumulate(xt.tensor, yt.tensor, 0.0f);
      expect_equal(from_device(b, yt.tensor), x, "beta=0");
      b.upload(y0.data(), yt.tensor);
      b.accumulate(xt.tensor, yt.tensor, 1.0f);
      expect_equal(from_device(b, yt.tensor), reference::add(x, y0), "beta=1");
    }
  }
}

VTRAIN_ON_EVERY_BACKEND(AddConformance, kEltwiseCases);

// =============================================================== concat

class ConcatConformance : public OnEveryBackend<ConcatCase> {};

// All plain; all in their preferred layouts; plain inputs into a preferred
// output. Each input takes its share of the gradient with beta 0 (over NaN)
// and with beta 1 (onto previous contents). Exact.
TEST_P(ConcatConformance, ForwardAndBackwardEachInputBothBetas) {
  Backend& b = backend();
  std::mt19937 rng(18);
  std::vector<Shape> shapes;
  std::vector<Vec> xs;
  int64_t total = 0;
  for (int64_t c : param().channels) {
    shapes.push_back({2, c, param().h, param().w});
    xs.push_back(random_vec(rng, shapes.back().elements()));
    total += c;
  }
  const Shape ys{2, total, param().h, param().w};
  const Vec y_ref = reference::concat(shapes, xs);
  const Vec dy = random_vec(rng, ys.elements());
  const std::vector<Vec> dxs_ref = reference::concat_backward(shapes, dy);
  for (int mode = 0; mode < 3; ++mode) {
    const auto input_layout = [&](int64_t c) {
      return mode == 1 ? b.preferred_layout(c) : Layout::kPlain;
    };
    const Layout y_layout = mode == 0 ? Layout::kPlain : b.preferred_layout(total);
    SCOPED_TRACE("mode " + std::to_string(mode) + ": y " + layout_name(y_layout));
    std::vector<DeviceTensor> inputs;
    std::vector<Tensor> views;
    for (size_t i = 0; i < shapes.size(); ++i) {
      inputs.push_back(to_device(b, xs[i], desc(shapes[i], input_layout(shapes[i].c))));
      views.push_back(inputs.back().tensor);
    }
    DeviceTensor yt(b, desc(ys, y_layout));
    b.fill(yt.tensor, kNaN);
    b.concat_forward(views, yt.tensor);
    expect_equal(from_device(b, yt.tensor), y_ref, "concat y");

    const DeviceTensor dyt = to_device(b, dy, desc(ys, y_layout));
    int64_t offset = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      for (float beta : {0.0f, 1.0f}) {
        const Vec previous = random_vec(rng, shapes[i].elements());
        const DeviceTensor dx = to_device(b, previous, desc(shapes[i], input_layout(shapes[i].c)));
        if (beta == 0.0f) b.fill(dx.tensor, kNaN);
        b.concat_backward(dyt.tensor, offset, dx.tensor, beta);
        expect_equal(from_device(b, dx.tensor),
                     beta == 1.0f ? reference::add(dxs_ref[i], previous) : dxs_ref[i],
                     "concat dx" + std::to_string(i) + " beta=" + std::to_string(int(beta)));
      }
      offset += shapes[i].c;
    }
  }
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
    b.sgd_update(wd.floats(), gd.floats(), vd.floats(), sc.count, sc.step);
    reference::sgd_update(w, g, v, sc.step);
    expect_close(from_device(b, vd.floats(), sc.count), v, 1e-6,
                 "velocity after step " + std::to_string(i));
    expect_close(from_device(b, wd.floats(), sc.count), w, 1e-6,
                 "weights after step " + std::to_string(i));
  }
}

VTRAIN_ON_EVERY_BACKEND(SgdConformance, kSgdCases);

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
  b.scale(xd.floats(), param().count, param().alpha);
  Vec expected = x;
  for (float& e : expected) e *= param().alpha;
  expect_equal(from_device(b, xd.floats(), param().count), expected,
               "x * " + std::to_string(param().alpha));
}

VTRAIN_ON_EVERY_BACKEND(ScaleConformance, kScaleCases);

}  // namespace
}  // namespace vtrain::backend_test
