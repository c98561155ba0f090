// Op checks the f32 and the half-precision conformance suites share: one
// body per op, run in an element type (reference_ops.h: the reference in
// that type), with the tolerances the calling suite derives for its type.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/backend_conformance.h"
#include "tests/backend_conformance_cases.h"
#include "tests/backend_test_support.h"
#include "tests/reference_ops.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"

namespace vtrain::backend_test {

// One kind of a half convolution p with every algorithm b offers that
// `wanted` keeps, beta 0 and 1, against the reference in half: y and dx
// in p's type (beta 1 adds to the previous contents in that type), dw and
// dbias f32, each within half_conv_rtol. Returns how many algorithms ran.
template <typename Wanted>
int check_half_conv_algorithms(Backend& b, ConvKind op, const ConvProblem& p, const ConvData& d,
                               const Tolerances& t, Wanted wanted) {
  const std::vector<Vec> reference = d.reference_of(op);
  const DataType out_type = op != ConvKind::kBackwardFilter ? p.x.dtype : DataType::kF32;
  std::mt19937 rng(5);
  std::vector<Vec> previous;
  for (const Vec& r : reference) previous.push_back(rounded(out_type, random_vec(rng, r.size())));
  int ran = 0;
  for (const bool accumulate : {false, true}) {
    const float beta = accumulate ? 1.0f : 0.0f;
    const std::vector<ConvAlgoInfo> algos = conv_algorithms(b, op, p, accumulate);
    EXPECT_FALSE(algos.empty()) << conv_kind_name(op) << " lists no algorithm for " << p.str();
    for (const ConvAlgoInfo& info : algos) {
      if (!wanted(info)) continue;
      const std::string what = std::string(conv_kind_name(op)) + "/" + info.name +
                               " beta=" + std::to_string(int(beta));
      EXPECT_EQ(info.workspace_bytes, conv_workspace(b, op, info.algo, p, accumulate)) << what;
      const double rtol = half_conv_rtol(t, info.name, p, op);
      const std::vector<Vec> got = run_conv(b, op, info, p, d, beta, previous);
      for (size_t i = 0; i < reference.size(); ++i) {
        const Vec expected =
            accumulate ? rounded(out_type, plus(reference[i], previous[i])) : reference[i];
        expect_close(got[i], expected, rtol, what + " output " + std::to_string(i));
      }
      ran += accumulate ? 0 : 1;
    }
  }
  return ran;
}

// A convolution's bias paired with the relu after it, in every layout b
// prefers: forward exact (one rounding of the sum, then relu selects); dx
// exact and the bias gradient, the sum of dx, within a float sum's
// rounding of the double reference.
inline void check_bias_relu(Backend& b, const ReluCase& rc, DataType type) {
  const Shape shape = rc.shape;
  std::mt19937 rng(12);
  const Vec x = rounded(type, random_vec(rng, shape.elements()));
  const Vec bias = rounded(type, random_vec(rng, shape.c));
  const Vec dy = rounded(type, random_vec(rng, shape.elements()));
  const Vec y_ref = reference::bias_relu_forward(type, shape, x, bias);
  const Vec dx_ref = reference::relu_backward(y_ref, dy);
  const Vec dbias_ref = reference::channel_sums(shape, dx_ref);
  const DeviceBuffer bias_t = to_device(b, bias, type);
  for (Layout layout : layouts_for(b, shape.c)) {
    SCOPED_TRACE(std::string("bias paired, ") + layout_name(layout));
    const DeviceTensor xt = to_device(b, x, desc(shape, layout, type));
    DeviceTensor yt(b, desc(shape, layout, type));
    b.fill(yt.tensor, kNaN);
    bias_relu_forward(b, xt.tensor, bias_t.get(), yt.tensor);
    expect_equal(from_device(b, yt.tensor), y_ref, "bias relu y");
    for (const bool alias : {false, true}) {
      const DeviceTensor dyt = to_device(b, dy, desc(shape, layout, type));
      DeviceTensor dxt(b, desc(shape, layout, type));
      b.fill(dxt.tensor, kNaN);
      const Tensor& dx = alias ? dyt.tensor : dxt.tensor;
      DeviceBuffer dbias(b, shape.c * sizeof(float));
      b.fill(flat(dbias.floats(), shape.c), kNaN);
      relu_backward_bias(b, yt.tensor, dyt.tensor, dx, dbias.floats());
      const std::string what = alias ? " (dx aliasing dy)" : "";
      expect_equal(from_device(b, dx), dx_ref, "bias relu dx" + what);
      expect_close(from_device(b, dbias.floats(), shape.c), dbias_ref, 1e-5, "dbias" + what);
    }
  }
}

// relu forward and backward in every layout b prefers, dx aliasing dy too:
// exact (relu selects); then check_bias_relu.
inline void check_relu(Backend& b, const ReluCase& rc, DataType type) {
  const Shape shape = rc.shape;
  std::mt19937 rng(11);
  const Vec x = rounded(type, random_vec(rng, shape.elements()));
  const Vec dy = rounded(type, random_vec(rng, shape.elements()));
  const Vec y_ref = reference::relu_forward(x);
  const Vec dx_ref = reference::relu_backward(y_ref, dy);
  for (Layout layout : layouts_for(b, shape.c)) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor xt = to_device(b, x, desc(shape, layout, type));
    DeviceTensor yt(b, desc(shape, layout, type));
    b.fill(yt.tensor, kNaN);
    relu_forward(b, xt.tensor, yt.tensor);
    expect_equal(from_device(b, yt.tensor), y_ref, "relu y");
    const DeviceTensor dyt = to_device(b, dy, desc(shape, layout, type));
    DeviceTensor dxt(b, desc(shape, layout, type));
    b.fill(dxt.tensor, kNaN);
    relu_backward(b, yt.tensor, dyt.tensor, dxt.tensor);
    expect_equal(from_device(b, dxt.tensor), dx_ref, "relu dx");
    relu_backward(b, yt.tensor, dyt.tensor, dyt.tensor);
    expect_equal(from_device(b, dyt.tensor), dx_ref, "relu dx aliasing dy");
  }
  check_bias_relu(b, rc, type);
}

// Concatenation: all plain; all in their preferred layouts; plain inputs
// into a preferred output. Each input takes its share of the gradient with
// beta 0 (over NaN) and with beta 1 (onto previous contents). Exact.
inline void check_concat(Backend& b, const ConcatCase& cc, DataType type) {
  std::mt19937 rng(18);
  std::vector<Shape> shapes;
  std::vector<Vec> xs;
  int64_t total = 0;
  for (int64_t c : cc.channels) {
    shapes.push_back({2, c, cc.h, cc.w});
    xs.push_back(rounded(type, random_vec(rng, shapes.back().elements())));
    total += c;
  }
  const Shape ys{2, total, cc.h, cc.w};
  const Vec dy = rounded(type, random_vec(rng, ys.elements()));
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
      inputs.push_back(to_device(b, xs[i], desc(shapes[i], input_layout(shapes[i].c), type)));
      views.push_back(inputs.back().tensor);
    }
    DeviceTensor yt(b, desc(ys, y_layout, type));
    b.fill(yt.tensor, kNaN);
    concat_forward(b, views, yt.tensor);
    expect_equal(from_device(b, yt.tensor), reference::concat(shapes, xs), "concat y");

    const DeviceTensor dyt = to_device(b, dy, desc(ys, y_layout, type));
    int64_t offset = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      for (float beta : {0.0f, 1.0f}) {
        const Vec previous = rounded(type, random_vec(rng, shapes[i].elements()));
        const DeviceTensor dx =
            to_device(b, previous, desc(shapes[i], input_layout(shapes[i].c), type));
        if (beta == 0.0f) b.fill(dx.tensor, kNaN);
        concat_backward(b, dyt.tensor, offset, dx.tensor, beta);
        expect_equal(from_device(b, dx.tensor),
                     beta == 1.0f ? rounded(type, reference::add(dxs_ref[i], previous))
                                  : dxs_ref[i],
                     "concat dx" + std::to_string(i) + " beta=" + std::to_string(int(beta)));
      }
      offset += shapes[i].c;
    }
  }
}

// mul in element type `type` (BinaryKind kMul and kMulSum), with a (and y,
// dy, da) in each layout of `layouts` and b (and db) in each: forward
// y = a * b and the backward's calls, da = dy * b and db = dy * a, summed
// over H and W where b is broadcast, each over a NaN-filled output (beta 0)
// and added to its previous contents (beta 1); and y written over a.
// Against the reference in `type` within `rtol`.
inline void check_mul(Backend& bk, const MulCase& mc, DataType type, double rtol,
                      const std::vector<Layout>& layouts) {
  using worker::BinaryKind;
  const Shape& s = mc.a;
  const Shape bs = mc.b();
  std::mt19937 rng(43);
  const auto input = [&](const Shape& shape) {
    return rounded(type, random_vec(rng, shape.elements()));
  };
  const Vec a = input(s), b = input(bs), dy = input(s), y0 = input(s), db0 = input(bs);
  const Vec y = reference::mul_forward(s, bs, a, b);
  const reference::MulBackward g = reference::mul_backward(s, bs, a, b, dy);
  // out = x0 * x1 (kind) + beta * previous, each tensor in its layout.
  const auto run = [&](BinaryKind kind, const Vec& x0, Layout l0, const Vec& x1, const Shape& s1,
                       Layout l1, const Shape& out_shape, Layout lout, const Vec* previous) {
    const DeviceTensor t0 = to_device(bk, x0, desc(s, l0, type));
    const DeviceTensor t1 = to_device(bk, x1, desc(s1, l1, type));
    DeviceTensor out(bk, desc(out_shape, lout, type));
    if (previous) {
      bk.upload(previous->data(), out.tensor);
    } else {
      bk.fill(out.tensor, kNaN);
    }
    bk.run(worker::BinaryDesc{kind, t0.tensor.desc, t1.tensor.desc, out.tensor.desc,
                              previous ? 1.0f : 0.0f},
           worker::BinaryArgs{t0.tensor.data, t1.tensor.data, out.tensor.data});
    return from_device(bk, out.tensor);
  };
  const BinaryKind db_kind = mc.broadcast ? BinaryKind::kMulSum : BinaryKind::kMul;
  for (Layout la : layouts) {
    for (Layout lb : layouts) {
      SCOPED_TRACE(std::string("a in ") + layout_name(la) + ", b in " + layout_name(lb));
      for (const Vec* before : {static_cast<const Vec*>(nullptr), &y0}) {
        const std::string beta = before ? " beta=1" : " beta=0";
        const Vec* db_before = before ? &db0 : nullptr;
        const auto expected = [&](const Vec& exact, const Vec* previous) {
          return rounded(type, previous ? plus(exact, *previous) : exact);
        };
        expect_close(run(BinaryKind::kMul, a, la, b, bs, lb, s, la, before), expected(y, before),
                     rtol, "y = a * b" + beta);
        expect_close(run(BinaryKind::kMul, dy, la, b, bs, lb, s, la, before),
                     expected(g.da, before), rtol, "da = dy * b" + beta);
        expect_close(run(db_kind, dy, la, a, s, la, bs, lb, db_before), expected(g.db, db_before),
                     rtol, std::string("db by ") + worker::binary_name(db_kind) + beta);
      }
    }
    const DeviceTensor at = to_device(bk, a, desc(s, la, type));
    const DeviceTensor bt = to_device(bk, b, desc(bs, la, type));
    mul(bk, at.tensor, bt.tensor, at.tensor);
    expect_close(from_device(bk, at.tensor), rounded(type, y), rtol, "y written over a");
  }
}

// Batch norm training (y, saved and running statistics), inference with the
// initial and the updated running statistics, and backward with beta 0 and
// 1 (beta applies to d(scale_shift) only), in every layout b prefers: y
// within y_rtol, dx within dx_rtol, the f32 statistics and d(scale_shift)
// within kSumRtol.
inline void check_batch_norm(Backend& b, const BatchNormCase& bc, DataType type, double y_rtol,
                             double dx_rtol) {
  const BatchNormData d(bc, type);
  const Shape& s = d.s;
  const int64_t c = s.c;
  const DeviceBuffer ss = to_device(b, d.scale_shift);
  for (Layout layout : layouts_for(b, c)) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor xt = to_device(b, d.x, desc(s, layout, type));
    DeviceTensor yt(b, desc(s, layout, type));
    DeviceBuffer save_mean(b, c * sizeof(float));
    DeviceBuffer save_var(b, c * sizeof(float));
    const DeviceBuffer running_mean = to_device(b, d.running_mean0);
    const DeviceBuffer running_var = to_device(b, d.running_var0);
    b.fill(yt.tensor, kNaN);
    batch_norm_forward_training(b, xt.tensor, yt.tensor, ss.floats(), save_mean.floats(),
                                  save_var.floats(), running_mean.floats(), running_var.floats(),
                                  d.momentum, d.eps);
    expect_close(from_device(b, yt.tensor), d.fwd.y, y_rtol, "bn training y");
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
    DeviceTensor inf(b, desc(s, layout, type));
    b.fill(inf.tensor, kNaN);
    batch_norm_forward_inference(b, xt.tensor, inf.tensor, ss.floats(), rm0.floats(), rv0.floats(),
                                   d.eps);
    expect_close(from_device(b, inf.tensor),
                 rounded(type, reference::batch_norm_forward_inference(
                                   s, d.x, d.gamma, d.beta, d.running_mean0, d.running_var0,
                                   d.eps)),
                 y_rtol, "bn inference y");
    b.fill(inf.tensor, kNaN);
    batch_norm_forward_inference(b, xt.tensor, inf.tensor, ss.floats(), running_mean.floats(),
                                   running_var.floats(), d.eps);
    expect_close(from_device(b, inf.tensor),
                 rounded(type, reference::batch_norm_forward_inference(
                                   s, d.x, d.gamma, d.beta, d.running_mean, d.running_var, d.eps)),
                 y_rtol, "bn inference y with the updated running statistics");

    // beta applies to d(scale_shift) only: dx is overwritten both times.
    const DeviceTensor dyt = to_device(b, d.dy, desc(s, layout, type));
    DeviceTensor dxt(b, desc(s, layout, type));
    DeviceBuffer dss(b, 2 * c * sizeof(float));
    b.fill(flat(dss.floats(), 2 * c), kNaN);
    for (float beta : {0.0f, 1.0f}) {
      const std::string what = " beta=" + std::to_string(int(beta));
      b.fill(dxt.tensor, kNaN);
      batch_norm_backward(b, xt.tensor, dyt.tensor, ss.floats(), save_mean.floats(),
                            save_var.floats(), dxt.tensor, dss.floats(), beta, d.eps);
      expect_close(from_device(b, dxt.tensor), d.back.dx, dx_rtol,
                   "bn dx" + what);
      expect_close(from_device(b, dss.floats(), 2 * c),
                   beta == 0.0f ? d.dscale_shift : plus(d.dscale_shift, d.dscale_shift), kSumRtol,
                   "bn d(scale_shift)" + what);
    }
  }
}

// Sums of both "ranks" of a synchronised batch norm, element by element.
inline std::vector<double> add_up(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

// Pooling forward and backward in every layout b prefers. Max forward
// selects an input and non-overlapping max backward routes one gradient per
// input: both exact where `exact_max`. Averages and overlapping windows sum:
// within forward_rtol / backward_rtol.
inline void check_pooling(Backend& b, const PoolCase& pc, DataType type, bool exact_max,
                          double forward_rtol, double backward_rtol) {
  const PoolDesc& p = pc.params;
  const Shape& xs = pc.x;
  std::mt19937 rng(12);
  const Shape ys = p.window.output_shape(xs, xs.c);
  Vec x = rounded(type, random_vec(rng, xs.elements()));
  if (pc.ties) {
    for (float& v : x) v = std::round(v * 2.0f) / 2.0f;
  }
  const Vec dy = rounded(type, random_vec(rng, ys.elements()));
  const Vec y_ref = rounded(type, reference::pooling_forward(p, xs, x));
  const Vec dx_ref = rounded(type, reference::pooling_backward(p, xs, x, dy));
  const bool exact_forward = p.kind == PoolKind::kMax && exact_max;
  const bool exact_backward = exact_forward && p.window.kernel_h <= p.window.stride_h;
  for (Layout layout : layouts_for(b, xs.c)) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor xt = to_device(b, x, desc(xs, layout, type));
    DeviceTensor yt(b, desc(ys, layout, type));
    DeviceBuffer state(b, pooling_state_bytes(b, p, xt.tensor.desc, yt.tensor.desc));
    b.fill(yt.tensor, kNaN);
    pooling_forward(b, p, xt.tensor, yt.tensor, state.get());
    if (exact_forward) {
      expect_equal(from_device(b, yt.tensor), y_ref, "pool y");
    } else {
      expect_close(from_device(b, yt.tensor), y_ref, forward_rtol, "pool y");
    }
    const DeviceTensor dyt = to_device(b, dy, desc(ys, layout, type));
    DeviceTensor dxt(b, desc(xs, layout, type));
    b.fill(dxt.tensor, kNaN);
    pooling_backward(b, p, xt.tensor, yt.tensor, dyt.tensor, dxt.tensor, state.get());
    if (exact_backward) {
      expect_equal(from_device(b, dxt.tensor), dx_ref, "pool dx");
    } else {
      expect_close(from_device(b, dxt.tensor), dx_ref, backward_rtol, "pool dx");
    }
  }
}

// Forward (with and without bias) and backward data, weights and bias in
// `type`, y and dx within `rtol`; backward weights into f32 dw and dbias
// (kSumRtol) with beta 0 and then 1 (adding the same gradients again); in
// every input layout.
inline void check_inner_product(Backend& b, const InnerProductCase& ic, DataType type,
                                double rtol) {
  const Shape& xs = ic.x;
  const int64_t out = ic.out;
  std::mt19937 rng(ic.seed);
  const Shape ys{xs.n, out, 1, 1};
  const int64_t weights = out * xs.per_sample();
  const Vec x = rounded(type, random_vec(rng, xs.elements()));
  const Vec w = rounded(type, random_vec(rng, weights));
  const Vec bias = rounded(type, random_vec(rng, out));
  const Vec dy = rounded(type, random_vec(rng, ys.elements()));
  const Vec y_ref = rounded(type, reference::inner_product_forward(xs, x, out, w, bias));
  const Vec y_no_bias_ref = rounded(type, reference::inner_product_forward(xs, x, out, w, {}));
  const Vec dx_ref = rounded(type, reference::inner_product_backward_data(xs, out, dy, w));
  Vec db_ref;
  const Vec dw_ref = reference::inner_product_backward_weights(xs, out, x, dy, &db_ref);
  const DeviceBuffer wd = to_device(b, w, type);
  const DeviceBuffer bd = to_device(b, bias, type);
  for (Layout layout : layouts_for(b, xs.c)) {
    SCOPED_TRACE("x=" + xs.str() + " " + layout_name(layout));
    const DeviceTensor xt = to_device(b, x, desc(xs, layout, type));
    DeviceTensor yt(b, desc(ys, Layout::kPlain, type));
    b.fill(yt.tensor, kNaN);
    inner_product_forward(b, xt.tensor, wd.get(), bd.get(), yt.tensor);
    expect_close(from_device(b, yt.tensor), y_ref, rtol, "fc y");
    b.fill(yt.tensor, kNaN);
    inner_product_forward(b, xt.tensor, wd.get(), nullptr, yt.tensor);
    expect_close(from_device(b, yt.tensor), y_no_bias_ref, rtol, "fc y without bias");

    const DeviceTensor dyt = to_device(b, dy, desc(ys, Layout::kPlain, type));
    DeviceTensor dxt(b, desc(xs, layout, type));
    b.fill(dxt.tensor, kNaN);
    inner_product_backward_data(b, dyt.tensor, wd.get(), dxt.tensor);
    expect_close(from_device(b, dxt.tensor), dx_ref, rtol, "fc dx");

    DeviceBuffer dw(b, weights * sizeof(float));
    DeviceBuffer db(b, out * sizeof(float));
    b.fill(flat(dw.floats(), weights), kNaN);
    b.fill(flat(db.floats(), out), kNaN);
    inner_product_backward_weights(b, xt.tensor, dyt.tensor, dw.floats(), db.floats(), 0.0f);
    expect_close(from_device(b, dw.floats(), weights), dw_ref, kSumRtol, "fc dw");
    expect_close(from_device(b, db.floats(), out), db_ref, kSumRtol, "fc dbias");
    inner_product_backward_weights(b, xt.tensor, dyt.tensor, dw.floats(), db.floats(), 1.0f);
    expect_close(from_device(b, dw.floats(), weights), plus(dw_ref, dw_ref), kSumRtol,
                 "fc dw beta=1");
    expect_close(from_device(b, db.floats(), out), plus(db_ref, db_ref), kSumRtol,
                 "fc dbias beta=1");
  }
}

// Loss statistics (f32, within t's loss tolerance) and dlogits in `type`
// (within dlogits_rtol); the statistics alone without dlogits; and a label
// out of range named in the error.
inline void check_softmax_cross_entropy(Backend& b, const SoftmaxCase& sc, DataType type,
                                        const Tolerances& t, double dlogits_rtol) {
  const int64_t n = sc.n, classes = sc.classes;
  std::mt19937 rng(sc.seed);
  const Vec logits = rounded(type, random_vec(rng, n * classes, -4.0f, 4.0f));
  // Every third sample is labelled with its arg-max so that correct is neither 0 nor n.
  std::vector<int32_t> labels(n);
  std::uniform_int_distribution<int32_t> any_class(0, int32_t(classes - 1));
  for (int64_t i = 0; i < n; ++i) {
    const auto row = logits.begin() + i * classes;
    labels[i] = i % 3 == 0 ? int32_t(std::max_element(row, row + classes) - row) : any_class(rng);
  }
  const reference::SoftmaxXent ref =
      reference::softmax_cross_entropy(n, classes, logits, labels, sc.scale, sc.label_smoothing);
  ASSERT_GT(ref.correct, 0);
  ASSERT_LT(ref.correct, n);
  const double loss_tol = t.loss_relative * ref.loss_sum + t.loss_per_sample * n;

  DeviceBuffer device_labels(b, n * sizeof(int32_t));
  auto* labels_ptr = static_cast<int32_t*>(device_labels.get());
  b.upload_labels(labels.data(), labels_ptr, n);
  const DeviceTensor lt = to_device(b, logits, desc({n, classes, 1, 1}, Layout::kPlain, type));
  DeviceTensor dlt(b, desc({n, classes, 1, 1}, Layout::kPlain, type));
  b.fill(dlt.tensor, kNaN);
  const worker::LossStats stats =
      softmax_cross_entropy(b, lt.tensor, labels_ptr, sc.scale, &dlt.tensor, sc.label_smoothing);
  EXPECT_NEAR(stats.loss_sum, ref.loss_sum, loss_tol);
  EXPECT_EQ(stats.correct, ref.correct);
  expect_close(from_device(b, dlt.tensor), rounded(type, ref.dlogits), dlogits_rtol, "dlogits");
  const worker::LossStats again =
      softmax_cross_entropy(b, lt.tensor, labels_ptr, sc.scale, nullptr, sc.label_smoothing);
  EXPECT_EQ(again.loss_sum, stats.loss_sum) << "without dlogits";
  EXPECT_EQ(again.correct, ref.correct) << "without dlogits";

  labels[n / 2] = int32_t(classes);
  b.upload_labels(labels.data(), labels_ptr, n);
  EXPECT_CONTAINS(test_support::error_message<worker::BackendError>(
                      [&] { softmax_cross_entropy(b, lt.tensor, labels_ptr, sc.scale, nullptr); }),
                  "label " + std::to_string(classes) + " outside [0, " + std::to_string(classes) +
                      ")");
}

}  // namespace vtrain::backend_test
