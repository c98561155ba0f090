// Backend conformance in half precision, part 2: the f32 suite's batch
// norm (training, inference, backward, and the synchronised ops), add and
// accumulate, concat and softmax cross-entropy cases in bf16 and f16 on every
// backend, against the reference ops in half (tests/reference_ops.h).
//
// Activations and their gradients in the case's type; batch norm's
// scale_shift, statistics and sums, and the loss always f32. Tolerances as
// in backend_conformance_half_test.cpp: exact for add, accumulate and
// concat (a sum of two half values is exact in f32, so rounding it once
// gives the reference's result), half_sum_rtol for half outputs of sums,
// kSumRtol (and the f32 suite's loss tolerance) for f32 outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
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


// =========================================================== batch norm

class HalfBatchNormConformance : public InHalfOnEveryBackend<BatchNormCase> {};

TEST_P(HalfBatchNormConformance, TrainingInferenceAndBackward) {
  check_batch_norm(backend(), param(), type(), sum_rtol(), sum_rtol() + tolerance().batch_norm_dx);
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfBatchNormConformance, kBatchNormCases);

// ============================================== synchronised batch norm

class HalfSyncBatchNormConformance : public InHalfOnEveryBackend<SyncCase> {};

// Two "ranks" of a half batch: their summed sums give the whole batch's
// statistics and gradient sums (f32, from the half inputs), and their halves
// of dx (in half) the whole batch's dx.
TEST_P(HalfSyncBatchNormConformance, RanksSumsGiveTheWholeBatchStatisticsAndGradient) {
  Backend& b = backend();
  const BatchNormData d({param().name, param().shape, -1.0f, param().seed}, type());
  const Shape& s = d.s;
  const int64_t c = s.c, n = s.n, first = param().first;
  const double m = double(s.n * s.h * s.w);
  const DeviceBuffer ss = to_device(b, d.scale_shift);
  for (Layout layout : layouts_for(b, c)) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor xt = to_device(b, d.x, typed(s, layout));
    const DeviceTensor dyt = to_device(b, d.dy, typed(s, layout));
    const Tensor x0 = xt.tensor.samples(0, first), x1 = xt.tensor.samples(first, n - first);
    const Tensor dy0 = dyt.tensor.samples(0, first), dy1 = dyt.tensor.samples(first, n - first);
    const std::vector<double> sums = add_up(batch_norm_sums(b, x0), batch_norm_sums(b, x1));
    Vec mean(c), var(c);
    for (int64_t i = 0; i < c; ++i) {
      mean[i] = float(sums[i] / m);
      var[i] = float(sums[c + i] / m - sums[i] / m * (sums[i] / m));
    }
    expect_close(mean, d.fwd.mean, kSumRtol, "mean from both ranks' sums");
    expect_close(var, d.fwd.var, kSumRtol, "variance from both ranks' sums of squares");

    const DeviceBuffer mean_d = to_device(b, mean), var_d = to_device(b, var);
    const std::vector<double> dsums =
        add_up(batch_norm_backward_sums(b, x0, dy0, mean_d.floats(), var_d.floats(), d.eps),
               batch_norm_backward_sums(b, x1, dy1, mean_d.floats(), var_d.floats(), d.eps));
    Vec dbeta(c), dgamma(c), dy_means(2 * c);
    for (int64_t i = 0; i < c; ++i) {
      dbeta[i] = float(dsums[i]);
      dgamma[i] = float(dsums[c + i]);
    }
    for (int64_t i = 0; i < 2 * c; ++i) dy_means[i] = float(dsums[i] / m);
    expect_close(dbeta, d.back.dbeta, kSumRtol, "sum of dy (d beta)");
    expect_close(dgamma, d.back.dgamma, kSumRtol, "sum of dy * xhat (d gamma)");

    const DeviceBuffer means_d = to_device(b, dy_means);
    DeviceTensor dxt(b, typed(s, layout));
    b.fill(dxt.tensor, kNaN);
    for (const auto& [xr, dyr, at] : {std::tuple{x0, dy0, int64_t{0}}, {x1, dy1, first}}) {
      batch_norm_backward_data(b, xr, dyr, ss.floats(), mean_d.floats(), var_d.floats(),
                                 means_d.floats(), dxt.tensor.samples(at, xr.shape().n), d.eps);
    }
    expect_close(from_device(b, dxt.tensor), d.back.dx, sum_rtol(), "dx of both ranks' halves");
  }
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfSyncBatchNormConformance, kSyncCases);

// ======================================================= add, accumulate

class HalfAddConformance : public InHalfOnEveryBackend<EltwiseCase> {};

// Every pair of layouts the f32 suite takes (plain, preferred, nChw8c),
// with y aliasing a; accumulate with beta 0 (a copy) and 1. Exact.
TEST_P(HalfAddConformance, AddAndAccumulateExactAfterRounding) {
  Backend& b = backend();
  const Shape& s = param().shape;
  std::mt19937 rng(16);
  const Vec a = in_type(random_vec(rng, s.elements()));
  const Vec c = in_type(random_vec(rng, s.elements()));
  const Vec sum = in_type(reference::add(a, c));
  std::vector<Layout> layouts = layouts_for(b, s.c);
  if (layouts.back() != Layout::kBlocked8) layouts.push_back(Layout::kBlocked8);
  for (Layout la : layouts) {
    for (Layout ly : layouts) {
      SCOPED_TRACE(std::string(layout_name(la)) + " with " + layout_name(ly));
      const DeviceTensor at = to_device(b, a, typed(s, la));
      const DeviceTensor ct = to_device(b, c, typed(s, ly));
      DeviceTensor yt(b, typed(s, ly));
      b.fill(yt.tensor, kNaN);
      add(b, at.tensor, ct.tensor, yt.tensor);
      expect_equal(from_device(b, yt.tensor), sum, "a + c");
      b.fill(yt.tensor, kNaN);
      accumulate(b, at.tensor, yt.tensor, 0.0f);
      expect_equal(from_device(b, yt.tensor), a, "accumulate beta=0");
      accumulate(b, at.tensor, ct.tensor, 1.0f);
      expect_equal(from_device(b, ct.tensor), sum, "accumulate beta=1");
    }
    const DeviceTensor at = to_device(b, a, typed(s, la));
    const DeviceTensor ct = to_device(b, c, typed(s, la));
    add(b, at.tensor, ct.tensor, at.tensor);
    expect_equal(from_device(b, at.tensor), sum, "a += c (y aliases a)");
  }
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfAddConformance, kEltwiseCases);

// ================================================================== mul

class HalfMulConformance : public InHalfOnEveryBackend<MulCase> {};

// Each product rounded once; the broadcast gradient summed in f32, then
// rounded; beta 1 rounds the sum with the previous contents once more.
TEST_P(HalfMulConformance, ForwardAndBackwardEveryLayoutBothBetas) {
  check_mul(backend(), param(), type(), sum_rtol(), layouts_for(backend(), param().a.c));
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfMulConformance, kMulCases);

// =============================================================== concat

class HalfConcatConformance : public InHalfOnEveryBackend<ConcatCase> {};

TEST_P(HalfConcatConformance, ForwardAndBackwardEachInputBothBetas) {
  check_concat(backend(), param(), type());
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfConcatConformance, kConcatCases);

// ================================================================= loss

class HalfSoftmaxConformance : public InHalfOnEveryBackend<SoftmaxCase> {};

// The loss statistics in f32 from the rounded logits, held as in the f32 suite.
TEST_P(HalfSoftmaxConformance, LossStatsAndGradient) {
  check_softmax_cross_entropy(backend(), param(), type(), tolerance(),
                              sum_rtol() + tolerance().dlogits);
}

VTRAIN_IN_HALF_ON_EVERY_BACKEND(HalfSoftmaxConformance, kSoftmaxCases);

}  // namespace
}  // namespace vtrain::backend_test
