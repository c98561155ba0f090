// Backend conformance of synchronised batch norm's ops on every backend and
// layout: the per-channel sums against the reference statistics, and a batch
// cut in two "ranks" whose summed sums give the whole batch's statistics and
// whose halves of dx, from the global backward sums, are the whole batch's dx.
#include <gtest/gtest.h>

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

class SyncBatchNormConformance : public OnEveryBackend<SyncCase> {};

TEST_P(SyncBatchNormConformance, RanksSumsGiveTheWholeBatchStatisticsAndGradient) {
  Backend& b = backend();
  const SyncCase& sc = param();
  const Shape s = sc.shape;
  const int64_t c = s.c, n = s.n;
  const double m = double(s.n * s.h * s.w);
  const float eps = 1e-5f;
  std::mt19937 rng(sc.seed);
  const Vec x = random_vec(rng, s.elements(), -1.0f, 3.0f);  // a mean away from 0
  const Vec gamma = random_vec(rng, c, 0.5f, 1.5f);
  const Vec beta = random_vec(rng, c);
  Vec scale_shift = gamma;
  scale_shift.insert(scale_shift.end(), beta.begin(), beta.end());
  const Vec dy = random_vec(rng, s.elements());
  const auto fwd = reference::batch_norm_forward_training(s, x, gamma, beta, eps);
  const auto back = reference::batch_norm_backward(s, x, dy, gamma, fwd.mean, fwd.var, eps);
  const DeviceBuffer ss = to_device(b, scale_shift);
  for (Layout layout : layouts_for(b, c)) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor xt = to_device(b, x, desc(s, layout));
    const DeviceTensor dyt = to_device(b, dy, desc(s, layout));
    const Tensor x0 = xt.tensor.samples(0, sc.first), x1 = xt.tensor.samples(sc.first, n - sc.first);
    const Tensor dy0 = dyt.tensor.samples(0, sc.first);
    const Tensor dy1 = dyt.tensor.samples(sc.first, n - sc.first);

    const std::vector<double> sums = add_up(batch_norm_sums(b, x0), batch_norm_sums(b, x1));
    Vec mean(c), var(c);
    for (int64_t i = 0; i < c; ++i) {
      mean[i] = float(sums[i] / m);
      var[i] = float(sums[c + i] / m - sums[i] / m * (sums[i] / m));
    }
    expect_close(mean, fwd.mean, kSumRtol, "mean from both ranks' sums");
    expect_close(var, fwd.var, kSumRtol, "variance from both ranks' sums of squares");

    const DeviceBuffer mean_d = to_device(b, mean), var_d = to_device(b, var);
    const std::vector<double> dsums =
        add_up(batch_norm_backward_sums(b, x0, dy0, mean_d.floats(), var_d.floats(), eps),
               batch_norm_backward_sums(b, x1, dy1, mean_d.floats(), var_d.floats(), eps));
    Vec dbeta(c), dgamma(c), dy_means(2 * c);
    for (int64_t i = 0; i < c; ++i) {
      dbeta[i] = float(dsums[i]);
      dgamma[i] = float(dsums[c + i]);
    }
    for (int64_t i = 0; i < 2 * c; ++i) dy_means[i] = float(dsums[i] / m);
    expect_close(dbeta, back.dbeta, kSumRtol, "sum of dy (d beta)");
    expect_close(dgamma, back.dgamma, kSumRtol, "sum of dy * xhat (d gamma)");

    const DeviceBuffer means_d = to_device(b, dy_means);
    DeviceTensor dxt(b, desc(s, layout));
    b.fill(dxt.tensor, kNaN);
    for (const auto& [xr, dyr, first] : {std::tuple{x0, dy0, int64_t{0}}, {x1, dy1, sc.first}}) {
      const Tensor dxr = dxt.tensor.samples(first, xr.shape().n);
      batch_norm_backward_data(b, xr, dyr, ss.floats(), mean_d.floats(), var_d.floats(),
                                 means_d.floats(), dxr, eps);
    }
    expect_close(from_device(b, dxt.tensor), back.dx, tolerance().batch_norm_dx,
                 "dx of both ranks' halves");
  }
}

VTRAIN_ON_EVERY_BACKEND(SyncBatchNormConformance, kSyncCases);

}  // namespace
}  // namespace vtrain::backend_test
