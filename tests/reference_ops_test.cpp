// Tests of the reference ops themselves: the oracle must be right before it
// can judge a backend. Each backward is checked against central differences
// of its forward, and each forward against small answers computed by hand.
#include "tests/reference_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace vtrain::reference {
namespace {

using worker::PoolKind;
using worker::SgdStep;
using worker::TensorDesc;

Vec random_vec(std::mt19937& rng, int64_t count, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

// Uniform values in [-1, 1] kept at least `margin` away from zero, so that a
// finite-difference step never crosses the relu kink.
Vec random_away_from_zero(std::mt19937& rng, int64_t count, float margin) {
  Vec v = random_vec(rng, count, margin, 1.0f);
  std::bernoulli_distribution negative(0.5);
  for (float& x : v)
    if (negative(rng)) x = -x;
  return v;
}

// Distinct values spaced `gap` apart in random order, so that a step smaller
// than gap / 2 never changes which element a max-pooling window selects.
Vec random_distinct(std::mt19937& rng, int64_t count, float gap) {
  Vec v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = gap * static_cast<float>(i - count / 2);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// The scalar every gradient check differentiates: L = sum(y * r), in double.
double weighted_sum(const Vec& y, const Vec& r) {
  EXPECT_EQ(y.size(), r.size());
  double sum = 0.0;
  for (size_t i = 0; i < y.size(); ++i) sum += double(y[i]) * r[i];
  return sum;
}

// Compares `analytic` = dL/d(input) with central differences of `loss`. The
// step is measured after rounding to float, so the quotient uses the step the
// forward actually saw. Tolerance: rtol relative to the element, plus rtol
// relative to the largest gradient element (absorbs the float rounding of the
// forward outputs, which is amplified by 1 / step).
void expect_gradient(const std::string& what, const std::function<double(const Vec&)>& loss,
                     const Vec& input, const Vec& analytic, float step, double rtol) {
  ASSERT_EQ(input.size(), analytic.size()) << what;
  double largest = 0.0;
  for (float g : analytic) largest = std::max(largest, double(std::fabs(g)));
  const double atol = rtol * std::max(largest, 1e-3);
  Vec probe = input;
  int failures = 0;
  for (size_t i = 0; i < probe.size() && failures < 5; ++i) {
    const float original = probe[i];
    probe[i] = original + step;
    const double up_at = probe[i];
    const double up = loss(probe);
    probe[i] = original - step;
    const double down_at = probe[i];
    const double down = loss(probe);
    probe[i] = original;
    const double numeric = (up - down) / (up_at - down_at);
    const double tolerance = rtol * std::fabs(analytic[i]) + atol;
    if (std::fabs(numeric - analytic[i]) > tolerance) {
      ++failures;
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric
                    << ", tolerance " << tolerance;
    }
  }
}

void expect_vec_near(const Vec& actual, const std::vector<double>& expected, double tol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], tol) << "element " << i;
}

ConvProblem make_conv(Shape x, int64_t k, int64_t r, int64_t s, int64_t pad_h, int64_t pad_w,
                      int64_t stride_h, int64_t stride_w) {
  ConvProblem p{.x = TensorDesc{.shape = x},
                .y = {},
                .k = k,
                .window = {r, s, stride_h, stride_w, pad_h, pad_w}};
  p.y.shape = p.output_shape();
  return p;
}

// --------------------------------------------------- known small answers

TEST(ReferenceConv, OneChannel3x3WithPaddingSumsTheCross) {
  const ConvProblem p = make_conv({1, 1, 3, 3}, 1, 3, 3, 1, 1, 1, 1);
  const Vec x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const Vec cross = {0, 1, 0, 1, 1, 1, 0, 1, 0};
  expect_vec_near(conv_forward(p, x, cross, {}), {7, 11, 11, 17, 25, 23, 19, 29, 23}, 0);
  // A bias is added once per output element.
  expect_vec_near(conv_forward(p, x, cross, {0.5f}),
                  {7.5, 11.5, 11.5, 17.5, 25.5, 23.5, 19.5, 29.5, 23.5}, 0);
}

TEST(ReferenceConv, IsCrossCorrelationNotFlipped) {
  // Only the top-left tap is set: output (i, j) reads input (i - 1, j - 1).
  const ConvProblem p = make_conv({1, 1, 3, 3}, 1, 3, 3, 1, 1, 1, 1);
  const Vec x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const Vec corner = {1, 0, 0, 0, 0, 0, 0, 0, 0};
  expect_vec_near(conv_forward(p, x, corner, {}), {0, 0, 0, 0, 1, 2, 0, 4, 5}, 0);
}

TEST(ReferenceConv, StrideTwoSumsDisjointBlocks) {
  const ConvProblem p = make_conv({1, 1, 4, 4}, 1, 2, 2, 0, 0, 2, 2);
  Vec x(16);
  std::iota(x.begin(), x.end(), 0.0f);
  expect_vec_near(conv_forward(p, x, {1, 1, 1, 1}, {}), {10, 18, 42, 50}, 0);
}

TEST(ReferenceConv, MultiChannelSumsOverInputChannelsPerOutputChannel) {
  // Two input channels of 1x1, two 1x1 filters: a 2x2 matrix product.
  const ConvProblem p = make_conv({1, 2, 1, 1}, 2, 1, 1, 0, 0, 1, 1);
  // w[k][c]: k = 0 -> (1, 2), k = 1 -> (3, 4).
  expect_vec_near(conv_forward(p, {10, 100}, {1, 2, 3, 4}, {0, 1}), {210, 431}, 0);
}

TEST(ReferenceConv, BackwardDataScattersTheFilter) {
  const ConvProblem p = make_conv({1, 1, 3, 3}, 1, 2, 2, 0, 0, 1, 1);
  const Vec w = {1, 2, 3, 4};
  expect_vec_near(conv_backward_data(p, {1, 0, 0, 0}, w), {1, 2, 0, 3, 4, 0, 0, 0, 0}, 0);
  expect_vec_near(conv_backward_data(p, {1, 1, 1, 1}, w), {1, 3, 2, 4, 10, 6, 3, 7, 4}, 0);
}

TEST(ReferenceConv, BackwardFilterCorrelatesInputWithGradient) {
  const ConvProblem p = make_conv({1, 1, 3, 3}, 1, 2, 2, 0, 0, 1, 1);
  const Vec x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  Vec dbias;
  expect_vec_near(conv_backward_filter(p, x, {1, 1, 1, 1}, &dbias), {12, 16, 24, 28}, 0);
  expect_vec_near(dbias, {4}, 0);
}

TEST(ReferenceConv, RejectsWrongSizes) {
  const ConvProblem p = make_conv({1, 1, 3, 3}, 1, 2, 2, 0, 0, 1, 1);
  EXPECT_THROW(conv_forward(p, Vec(8), Vec(4), {}), std::invalid_argument);
  EXPECT_THROW(conv_forward(p, Vec(9), Vec(3), {}), std::invalid_argument);
  EXPECT_THROW(conv_forward(p, Vec(9), Vec(4), Vec(2)), std::invalid_argument);
}

TEST(ReferenceRelu, ClampsNegativesAndMasksGradient) {
  expect_vec_near(relu_forward({-2, -0.5, 0, 0.5, 3}), {0, 0, 0, 0.5, 3}, 0);
  expect_vec_near(relu_backward({0, 0, 0.5, 3}, {1, 2, 3, 4}), {0, 0, 3, 4}, 0);
}

TEST(ReferencePooling, MaxAndAverageWithPaddingExcluded) {
  const Shape xs{1, 1, 3, 3};
  const Vec x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  PoolDesc p{.kind = PoolKind::kAverage, .window = {3, 3, 2, 2, 1, 1}};
  // Every window holds four in-bounds elements: divide by 4, not 9.
  expect_vec_near(pooling_forward(p, xs, x), {3, 4, 6, 7}, 1e-6);
  expect_vec_near(pooling_backward(p, xs, x, {4, 4, 4, 4}), {1, 2, 1, 2, 4, 2, 1, 2, 1}, 1e-6);
  p.kind = PoolKind::kMax;
  expect_vec_near(pooling_forward(p, xs, x), {5, 6, 8, 9}, 0);
  expect_vec_near(pooling_backward(p, xs, x, {1, 2, 3, 4}), {0, 0, 0, 0, 1, 2, 0, 3, 4}, 0);
}

TEST(ReferencePooling, MaxTiesPickTheFirstInRowMajorOrder) {
  const PoolDesc p;  // max, 2x2, stride 2
  const Shape xs{1, 1, 2, 2};
  expect_vec_near(pooling_backward(p, xs, {7, 7, 7, 7}, {1}), {1, 0, 0, 0}, 0);
  expect_vec_near(pooling_backward(p, xs, {1, 3, 3, 2}, {1}), {0, 1, 0, 0}, 0);
}

TEST(ReferencePooling, OddInputDropsTheLastRowAndColumn) {
  const PoolDesc p;  // 2x2 stride 2 over 3x3 gives 1x1
  const Shape xs{1, 1, 3, 3};
  const Vec x = {1, 2, 30, 4, 5, 60, 70, 80, 90};
  expect_vec_near(pooling_forward(p, xs, x), {5}, 0);
  expect_vec_near(pooling_backward(p, xs, x, {1}), {0, 0, 0, 0, 1, 0, 0, 0, 0}, 0);
}

TEST(ReferenceInnerProduct, KnownAnswers) {
  const Shape xs{1, 2, 1, 1};
  const Vec w = {1, 1, 2, -1};  // {out = 2, in = 2}
  expect_vec_near(inner_product_forward(xs, {1, 2}, 2, w, {0.5f, 0}), {3.5, 0}, 0);
  expect_vec_near(inner_product_backward_data(xs, 2, {1, 10}, w), {21, -9}, 0);
  Vec dbias;
  expect_vec_near(inner_product_backward_weights(xs, 2, {1, 2}, {1, 10}, &dbias), {1, 2, 10, 20},
                  0);
  expect_vec_near(dbias, {1, 10}, 0);
}

TEST(ReferenceInnerProduct, FlattensSpatialInputInNchwOrder) {
  // x is {n = 1, c = 2, h = 1, w = 2}: the flat input is c-major.
  const Shape xs{1, 2, 1, 2};
  expect_vec_near(inner_product_forward(xs, {1, 2, 3, 4}, 1, {1, 10, 100, 1000}, {}), {4321}, 0);
}

TEST(ReferenceBatchNorm, NormalisesWithBiasedVariance) {
  const Shape s{2, 1, 1, 2};
  const BatchNormForward bn = batch_norm_forward_training(s, {1, 3, 5, 7}, {2}, {1}, 0.0f);
  expect_vec_near(bn.mean, {4}, 0);
  expect_vec_near(bn.var, {5}, 1e-6);  // (9 + 1 + 1 + 9) / 4, not / 3
  const double inv = 1.0 / std::sqrt(5.0);
  expect_vec_near(bn.y, {1 - 6 * inv, 1 - 2 * inv, 1 + 2 * inv, 1 + 6 * inv}, 1e-6);
  // Inference with the same statistics computes the same y.
  expect_vec_near(batch_norm_forward_inference(s, {1, 3, 5, 7}, {2}, {1}, bn.mean, bn.var, 0.0f),
                  {1 - 6 * inv, 1 - 2 * inv, 1 + 2 * inv, 1 + 6 * inv}, 1e-6);
}

TEST(ReferenceBatchNorm, StatisticsArePerChannel) {
  // n = 2, c = 2, 1x1: channel 0 holds {1, 3}, channel 1 holds {10, 30}.
  const BatchNormForward bn =
      batch_norm_forward_training({2, 2, 1, 1}, {1, 10, 3, 30}, {1, 1}, {0, 0}, 0.0f);
  expect_vec_near(bn.mean, {2, 20}, 0);
  expect_vec_near(bn.var, {1, 100}, 1e-5);
  expect_vec_near(bn.y, {-1, -1, 1, 1}, 1e-6);
}

TEST(ReferenceBatchNorm, ConstantGradientOnlyReachesBeta) {
  // dy = 1 everywhere: the normalised output has zero mean, so dx = 0 and
  // dgamma = sum(xhat) = 0.
  const Shape s{2, 1, 1, 2};
  const Vec x = {1, 3, 5, 7};
  const BatchNormForward bn = batch_norm_forward_training(s, x, {2}, {1}, 1e-5f);
  const BatchNormBackward back =
      batch_norm_backward(s, x, {1, 1, 1, 1}, {2}, bn.mean, bn.var, 1e-5f);
  expect_vec_near(back.dx, {0, 0, 0, 0}, 1e-6);
  expect_vec_near(back.dgamma, {0}, 1e-6);
  expect_vec_near(back.dbeta, {4}, 0);
}

TEST(ReferenceAdd, AddsElementwise) {
  expect_vec_near(add({1, 2, 3}, {10, 20, 30}), {11, 22, 33}, 0);
  EXPECT_THROW(add({1, 2}, {1}), std::invalid_argument);
}

TEST(ReferenceConcat, InterleavesChannelsPerSample) {
  const std::vector<Shape> shapes = {{2, 1, 1, 1}, {2, 2, 1, 1}};
  const Vec y = concat(shapes, {{1, 2}, {10, 11, 20, 21}});
  expect_vec_near(y, {1, 10, 11, 2, 20, 21}, 0);
  const std::vector<Vec> dxs = concat_backward(shapes, y);
  ASSERT_EQ(dxs.size(), 2u);
  expect_vec_near(dxs[0], {1, 2}, 0);
  expect_vec_near(dxs[1], {10, 11, 20, 21}, 0);
  EXPECT_THROW(concat({{2, 1, 1, 1}, {2, 1, 2, 1}}, {{1, 2}, {1, 2, 3, 4}}), std::invalid_argument);
}

TEST(ReferenceSoftmaxXent, KnownAnswers) {
  // Equal logits: loss log 2 each; the tie resolves to class 0.
  SoftmaxXent out = softmax_cross_entropy(2, 2, {0, 0, 0, 0}, {0, 1}, 1.0f);
  EXPECT_NEAR(out.loss_sum, 2 * std::log(2.0), 1e-12);
  EXPECT_EQ(out.correct, 1);
  expect_vec_near(out.dlogits, {-0.5, 0.5, 0.5, -0.5}, 1e-7);
  // The scale multiplies the gradient only.
  out = softmax_cross_entropy(1, 2, {0, 0}, {1}, 0.25f);
  EXPECT_NEAR(out.loss_sum, std::log(2.0), 1e-12);
  expect_vec_near(out.dlogits, {0.125, -0.125}, 1e-7);
}

TEST(ReferenceSoftmaxXent, LargeLogitsStayFinite) {
  const SoftmaxXent out = softmax_cross_entropy(1, 3, {1000, 0, -1000}, {1}, 1.0f);
  EXPECT_NEAR(out.loss_sum, 1000.0, 1e-9);
  EXPECT_EQ(out.correct, 0);
  expect_vec_near(out.dlogits, {1, -1, 0}, 1e-7);
  EXPECT_THROW(softmax_cross_entropy(1, 3, {0, 0, 0}, {3}, 1.0f), std::invalid_argument);
}

TEST(ReferenceSgd, TwoStepsWithMomentumAndWeightDecay) {
  Vec w = {1.0f};
  Vec v = {0.0f};
  const SgdStep step{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.1f};
  sgd_update(w, {0.5f}, v, step);
  EXPECT_NEAR(v[0], 0.6, 1e-6);   // 0 + 0.5 + 0.1 * 1
  EXPECT_NEAR(w[0], 0.94, 1e-6);  // 1 - 0.1 * 0.6
  sgd_update(w, {0.5f}, v, step);
  EXPECT_NEAR(v[0], 1.134, 1e-6);   // 0.9 * 0.6 + 0.5 + 0.1 * 0.94
  EXPECT_NEAR(w[0], 0.8266, 1e-6);  // 0.94 - 0.1 * 1.134
}

// ------------------------------------------------ finite-difference checks

// Convolutions with and without padding and stride, square and not.
std::vector<ConvProblem> gradient_conv_problems() {
  return {
      make_conv({2, 3, 5, 5}, 4, 3, 3, 1, 1, 1, 1),
      make_conv({1, 2, 6, 5}, 3, 3, 2, 0, 1, 2, 1),
      make_conv({2, 2, 7, 7}, 2, 3, 3, 1, 1, 2, 2),
      make_conv({1, 1, 6, 6}, 2, 5, 5, 2, 2, 1, 1),
  };
}

TEST(ReferenceGradient, ConvData) {
  std::mt19937 rng(1);
  for (const ConvProblem& p : gradient_conv_problems()) {
    SCOPED_TRACE(p.str());
    const Vec x = random_vec(rng, p.x.shape.elements());
    const Vec w = random_vec(rng, p.weight_shape().elements());
    const Vec r = random_vec(rng, p.y.shape.elements());
    expect_gradient(
        "dx", [&](const Vec& xv) { return weighted_sum(conv_forward(p, xv, w, {}), r); }, x,
        conv_backward_data(p, r, w), 1e-2f, 1e-3);
  }
}

TEST(ReferenceGradient, ConvFilterAndBias) {
  std::mt19937 rng(2);
  for (const ConvProblem& p : gradient_conv_problems()) {
    SCOPED_TRACE(p.str());
    const Vec x = random_vec(rng, p.x.shape.elements());
    const Vec w = random_vec(rng, p.weight_shape().elements());
    const Vec b = random_vec(rng, p.k);
    const Vec r = random_vec(rng, p.y.shape.elements());
    Vec dbias;
    const Vec dw = conv_backward_filter(p, x, r, &dbias);
    expect_gradient(
        "dw", [&](const Vec& wv) { return weighted_sum(conv_forward(p, x, wv, b), r); }, w, dw,
        1e-2f, 1e-3);
    expect_gradient(
        "dbias", [&](const Vec& bv) { return weighted_sum(conv_forward(p, x, w, bv), r); }, b,
        dbias, 1e-2f, 1e-3);
  }
}

TEST(ReferenceGradient, Relu) {
  std::mt19937 rng(3);
  const Vec x = random_away_from_zero(rng, 64, 0.05f);
  const Vec r = random_vec(rng, 64);
  expect_gradient(
      "dx", [&](const Vec& xv) { return weighted_sum(relu_forward(xv), r); }, x,
      relu_backward(relu_forward(x), r), 1e-2f, 1e-3);
}

TEST(ReferenceGradient, Pooling) {
  std::mt19937 rng(4);
  const PoolDesc k2s2{.kind = PoolKind::kMax, .window = {2, 2, 2, 2, 0, 0}};
  const PoolDesc k3s2p1{.kind = PoolKind::kMax, .window = {3, 3, 2, 2, 1, 1}};
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
    for (PoolDesc p : {k2s2, k3s2p1}) {
      p.kind = kind;
      for (const Shape xs : {Shape{2, 2, 4, 4}, Shape{1, 3, 5, 5}, Shape{1, 2, 6, 7}}) {
        SCOPED_TRACE(std::string(kind == PoolKind::kMax ? "max " : "avg ") + "k" +
                     std::to_string(p.window.kernel_h) + " x " + xs.str());
        const Vec x = random_distinct(rng, xs.elements(), 0.05f);
        const Shape ys = p.window.output_shape(xs, xs.c);
        const Vec r = random_vec(rng, ys.elements());
        expect_gradient(
            "dx", [&](const Vec& xv) { return weighted_sum(pooling_forward(p, xs, xv), r); }, x,
            pooling_backward(p, xs, x, r), 1e-2f, 1e-3);
      }
    }
  }
}

TEST(ReferenceGradient, InnerProduct) {
  std::mt19937 rng(5);
  const int64_t out = 5;
  for (const Shape xs : {Shape{3, 7, 1, 1}, Shape{2, 3, 2, 2}}) {
    SCOPED_TRACE(xs.str());
    const Vec x = random_vec(rng, xs.elements());
    const Vec w = random_vec(rng, out * xs.per_sample());
    const Vec b = random_vec(rng, out);
    const Vec r = random_vec(rng, xs.n * out);
    const auto loss = [&](const Vec& xv, const Vec& wv, const Vec& bv) {
      return weighted_sum(inner_product_forward(xs, xv, out, wv, bv), r);
    };
    expect_gradient(
        "dx", [&](const Vec& xv) { return loss(xv, w, b); }, x,
        inner_product_backward_data(xs, out, r, w), 1e-2f, 1e-3);
    Vec dbias;
    const Vec dw = inner_product_backward_weights(xs, out, x, r, &dbias);
    expect_gradient(
        "dw", [&](const Vec& wv) { return loss(x, wv, b); }, w, dw, 1e-2f, 1e-3);
    expect_gradient(
        "dbias", [&](const Vec& bv) { return loss(x, w, bv); }, b, dbias, 1e-2f, 1e-3);
  }
}

TEST(ReferenceGradient, BatchNorm) {
  std::mt19937 rng(6);
  const float eps = 1e-5f;
  for (const Shape s : {Shape{4, 3, 1, 1}, Shape{2, 2, 3, 3}}) {
    SCOPED_TRACE(s.str());
    // Inputs offset from zero mean with a spread near 1, like real activations.
    const Vec x = random_vec(rng, s.elements(), -1.0f, 2.0f);
    const Vec gamma = random_vec(rng, s.c, 0.5f, 1.5f);
    const Vec beta = random_vec(rng, s.c);
    const Vec r = random_vec(rng, s.elements());
    const auto loss = [&](const Vec& xv, const Vec& g, const Vec& b) {
      return weighted_sum(batch_norm_forward_training(s, xv, g, b, eps).y, r);
    };
    const BatchNormForward fwd = batch_norm_forward_training(s, x, gamma, beta, eps);
    const BatchNormBackward back = batch_norm_backward(s, x, r, gamma, fwd.mean, fwd.var, eps);
    // The normalisation is not linear: a smaller step keeps the truncation
    // error of the central difference below the tolerance.
    expect_gradient(
        "dx", [&](const Vec& xv) { return loss(xv, gamma, beta); }, x, back.dx, 3e-3f, 1e-2);
    expect_gradient(
        "dgamma", [&](const Vec& g) { return loss(x, g, beta); }, gamma, back.dgamma, 1e-2f, 1e-3);
    expect_gradient(
        "dbeta", [&](const Vec& b) { return loss(x, gamma, b); }, beta, back.dbeta, 1e-2f, 1e-3);
  }
}

TEST(ReferenceGradient, Concat) {
  std::mt19937 rng(7);
  const std::vector<Shape> shapes = {{2, 3, 2, 2}, {2, 5, 2, 2}, {2, 1, 2, 2}};
  std::vector<Vec> xs;
  for (const Shape& s : shapes) xs.push_back(random_vec(rng, s.elements()));
  const Vec r = random_vec(rng, 2 * 9 * 2 * 2);
  const std::vector<Vec> dxs = concat_backward(shapes, r);
  ASSERT_EQ(dxs.size(), shapes.size());
  for (size_t t = 0; t < shapes.size(); ++t) {
    expect_gradient(
        "dx" + std::to_string(t),
        [&](const Vec& xv) {
          std::vector<Vec> inputs = xs;
          inputs[t] = xv;
          return weighted_sum(concat(shapes, inputs), r);
        },
        xs[t], dxs[t], 1e-2f, 1e-3);
  }
}

TEST(ReferenceGradient, SoftmaxCrossEntropy) {
  std::mt19937 rng(8);
  const int64_t n = 4;
  const int64_t classes = 6;
  const float scale = 1.0f / n;
  const Vec logits = random_vec(rng, n * classes, -3.0f, 3.0f);
  const std::vector<int32_t> labels = {0, 5, 2, 2};
  const SoftmaxXent out = softmax_cross_entropy(n, classes, logits, labels, scale);
  expect_gradient(
      "dlogits",
      [&](const Vec& z) {
        return scale * softmax_cross_entropy(n, classes, z, labels, 1).loss_sum;
      },
      logits, out.dlogits, 1e-2f, 1e-3);
}

TEST(ReferenceSoftmaxXent, CountsArgMaxHits) {
  std::mt19937 rng(9);
  const int64_t n = 16;
  const int64_t classes = 10;
  const Vec logits = random_vec(rng, n * classes);
  std::vector<int32_t> labels(n);
  int64_t expected_correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto row = logits.begin() + i * classes;
    const int32_t arg_max = static_cast<int32_t>(std::max_element(row, row + classes) - row);
    // Half the samples are labelled with their arg-max, half with another class.
    labels[i] = i % 2 == 0 ? arg_max : (arg_max + 1) % classes;
    if (i % 2 == 0) ++expected_correct;
  }
  EXPECT_EQ(softmax_cross_entropy(n, classes, logits, labels, 1.0f).correct, expected_correct);
}

// ------------------------------------------------ the layers of issue 43

constexpr Activation kActivations[] = {Activation::kSilu, Activation::kGelu, Activation::kSigmoid,
                                       Activation::kRelu6};

TEST(ReferenceActivation, KnownValues) {
  // sigmoid(1) = 0.7310585786300049, Phi(1) = 0.8413447460685429.
  EXPECT_DOUBLE_EQ(activation(Activation::kSigmoid, 0.0), 0.5);
  EXPECT_NEAR(activation(Activation::kSigmoid, 1.0), 0.7310585786300049, 1e-15);
  EXPECT_NEAR(activation(Activation::kSilu, 1.0), 0.7310585786300049, 1e-15);
  EXPECT_NEAR(activation(Activation::kSilu, -1.0), -0.2689414213699951, 1e-15);
  EXPECT_NEAR(activation(Activation::kGelu, 1.0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(activation(Activation::kGelu, -1.0), -0.15865525393145707, 1e-15);
  // The tanh approximation gives 0.8411919906082768 at 1: the erf form differs.
  EXPECT_GT(std::fabs(activation(Activation::kGelu, 1.0) - 0.8411919906082768), 1e-4);
  EXPECT_EQ(activation(Activation::kRelu6, -2.0), 0.0);
  EXPECT_EQ(activation(Activation::kRelu6, 3.5), 3.5);
  EXPECT_EQ(activation(Activation::kRelu6, 7.0), 6.0);
}

TEST(ReferenceActivation, DerivativesMatchCentralDifferencesInDouble) {
  for (Activation f : kActivations) {
    // Away from relu6's kinks at 0 and 6.
    for (double x : {-4.3, -1.7, -0.4, 0.3, 1.1, 2.9, 5.2, 7.5}) {
      const double h = 1e-5;
      const double numeric = (activation(f, x + h) - activation(f, x - h)) / (2 * h);
      EXPECT_NEAR(activation_derivative(f, x), numeric, 1e-8)
          << "activation " << static_cast<int>(f) << " at " << x;
    }
  }
  EXPECT_EQ(activation_derivative(Activation::kRelu6, 0.0), 0.0);
  EXPECT_EQ(activation_derivative(Activation::kRelu6, 6.0), 0.0);
}

TEST(ReferenceGradient, Activations) {
  std::mt19937 rng(11);
  for (Activation f : kActivations) {
    SCOPED_TRACE(static_cast<int>(f));
    // Spread over relu6's range, away from its kinks.
    Vec x = random_away_from_zero(rng, 64, 0.05f);
    for (float& v : x) v = v * 3.0f + (v > 0 ? 2.0f : 0.0f);
    for (float& v : x) ASSERT_GT(std::fabs(v - 6.0f), 0.05f);
    const Vec r = random_vec(rng, 64);
    expect_gradient(
        "dx", [&](const Vec& xv) { return weighted_sum(activation_forward(f, xv), r); }, x,
        activation_backward(f, x, r), 1e-2f, 1e-3);
  }
}

TEST(ReferenceMul, BroadcastsAPerChannelFactorOverTheMap) {
  const Shape a_shape{1, 2, 1, 3};
  const Vec a = {1, 2, 3, 4, 5, 6};
  expect_vec_near(mul_forward(a_shape, {1, 2, 1, 1}, a, {10, -1}), {10, 20, 30, -4, -5, -6}, 0);
  expect_vec_near(mul_forward(a_shape, a_shape, a, a), {1, 4, 9, 16, 25, 36}, 0);
  // The broadcast factor's gradient sums dy * a over the map.
  const MulBackward g = mul_backward(a_shape, {1, 2, 1, 1}, a, {10, -1}, {1, 1, 1, 1, 0, 2});
  expect_vec_near(g.da, {10, 10, 10, -1, 0, -2}, 0);
  expect_vec_near(g.db, {6, 16}, 0);
  EXPECT_THROW(mul_forward(a_shape, {1, 1, 1, 3}, a, {1, 2, 3}), std::invalid_argument);
}

TEST(ReferenceGradient, MulBothInputsPlainAndBroadcast) {
  std::mt19937 rng(12);
  const Shape a_shape{2, 3, 4, 5};
  for (const Shape& b_shape : {a_shape, Shape{2, 3, 1, 1}}) {
    SCOPED_TRACE(b_shape.str());
    const Vec a = random_vec(rng, a_shape.elements());
    const Vec b = random_vec(rng, b_shape.elements());
    const Vec r = random_vec(rng, a_shape.elements());
    const MulBackward g = mul_backward(a_shape, b_shape, a, b, r);
    expect_gradient(
        "da", [&](const Vec& av) { return weighted_sum(mul_forward(a_shape, b_shape, av, b), r); },
        a, g.da, 1e-2f, 1e-3);
    expect_gradient(
        "db", [&](const Vec& bv) { return weighted_sum(mul_forward(a_shape, b_shape, a, bv), r); },
        b, g.db, 1e-2f, 1e-3);
  }
}

TEST(ReferenceGroupedConv, DepthwiseFiltersEachChannelAlone) {
  // Two channels, one 1x2 filter each: out[c] = w[c][0] x[c][j] + w[c][1] x[c][j + 1].
  const ConvProblem p = make_conv({1, 2, 1, 3}, 2, 1, 2, 0, 0, 1, 1);
  const Vec x = {1, 2, 3, 10, 20, 30};
  expect_vec_near(grouped_conv_forward(p, 2, x, {1, 1, 2, -1}, {0.5f, 0}), {3.5, 5.5, 0, 10}, 0);
}

TEST(ReferenceGroupedConv, OneGroupIsThePlainConvolution) {
  std::mt19937 rng(13);
  const ConvProblem p = make_conv({2, 4, 5, 5}, 6, 3, 3, 1, 1, 2, 2);
  const Vec x = random_vec(rng, p.x.shape.elements());
  const Vec w = random_vec(rng, p.weight_shape().elements());
  const Vec b = random_vec(rng, p.k);
  EXPECT_EQ(grouped_conv_forward(p, 1, x, w, b), conv_forward(p, x, w, b));
}

TEST(ReferenceGroupedConv, EqualsAPlainConvolutionWithBlockDiagonalWeights) {
  // Two groups of 4 -> 3 channels: the dense 8 -> 6 filter with zeros off
  // the diagonal blocks computes the same.
  std::mt19937 rng(14);
  const int64_t groups = 2;
  const ConvProblem p = make_conv({2, 4, 5, 4}, 6, 3, 2, 1, 0, 1, 1);
  const Vec x = random_vec(rng, p.x.shape.elements());
  const int64_t cg = p.x.shape.c / groups, kg = p.k / groups;
  const int64_t taps = p.window.kernel_h * p.window.kernel_w;
  const Vec w = random_vec(rng, p.k * cg * taps);
  Vec dense(static_cast<size_t>(p.weight_shape().elements()), 0.0f);
  for (int64_t k = 0; k < p.k; ++k) {
    const int64_t g = k / kg;
    for (int64_t c = 0; c < cg; ++c) {
      for (int64_t t = 0; t < taps; ++t) {
        dense[(k * p.x.shape.c + g * cg + c) * taps + t] = w[(k * cg + c) * taps + t];
      }
    }
  }
  const Vec grouped = grouped_conv_forward(p, groups, x, w, {});
  const Vec plain = conv_forward(p, x, dense, {});
  ASSERT_EQ(grouped.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(grouped[i], plain[i], 1e-6) << i;
}

TEST(ReferenceGradient, GroupedConvDataFilterAndBias) {
  std::mt19937 rng(15);
  struct Case {
    ConvProblem p;
    int64_t groups;
  };
  for (const Case& c : {Case{make_conv({2, 4, 5, 5}, 6, 3, 3, 1, 1, 1, 1), 2},
                        Case{make_conv({1, 6, 6, 5}, 6, 3, 3, 1, 1, 2, 2), 6},    // depthwise
                        Case{make_conv({2, 3, 5, 5}, 6, 5, 5, 2, 2, 1, 1), 3}}) {  // multiplier 2
    const ConvProblem& p = c.p;
    SCOPED_TRACE(p.str() + " groups " + std::to_string(c.groups));
    const Vec x = random_vec(rng, p.x.shape.elements());
    const Vec w = random_vec(
        rng, p.k * (p.x.shape.c / c.groups) * p.window.kernel_h * p.window.kernel_w);
    const Vec b = random_vec(rng, p.k);
    const Vec r = random_vec(rng, p.y.shape.elements());
    auto loss = [&](const Vec& xv, const Vec& wv, const Vec& bv) {
      return weighted_sum(grouped_conv_forward(p, c.groups, xv, wv, bv), r);
    };
    Vec dbias;
    const Vec dw = grouped_conv_backward_filter(p, c.groups, x, r, &dbias);
    expect_gradient("dx", [&](const Vec& v) { return loss(v, w, b); }, x,
                    grouped_conv_backward_data(p, c.groups, r, w), 1e-2f, 1e-3);
    expect_gradient("dw", [&](const Vec& v) { return loss(x, v, b); }, w, dw, 1e-2f, 1e-3);
    expect_gradient("dbias", [&](const Vec& v) { return loss(x, w, v); }, b, dbias, 1e-2f, 1e-3);
  }
}

TEST(ReferenceDropout, ScalesKeptElementsAndZeroesTheRest) {
  expect_vec_near(dropout_apply({1, 2, 3, 4}, {1, 0, 1, 1}, 0.2f), {1.25, 0, 3.75, 5}, 1e-6);
  EXPECT_THROW(dropout_apply({1, 2}, {1}, 0.5f), std::invalid_argument);
}

}  // namespace
}  // namespace vtrain::reference
