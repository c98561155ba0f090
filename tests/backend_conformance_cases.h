// The op cases of the backend conformance suite, shared by its f32 tests
// (backend_conformance_*_test.cpp) and its half-precision ones
// (backend_conformance_half*_test.cpp), with the batch-norm case's
// reference results. Names are letters, digits and underscores: they end
// the test names ("cpu_lenet1_n1", "cpu_bf16_lenet1_n1").
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/backend_test_support.h"
#include "tests/reference_ops.h"
#include "worker/device/backend.h"

namespace vtrain::backend_test {

using worker::PoolKind;
using worker::PoolDesc;

// ============================================================== convolution

inline const ConvCase kConvCases[] = {
    {"lenet1_n1", 1, 28, 28, 20, 5, 0, 1, 1},
    {"lenet1_n4", 1, 28, 28, 20, 5, 0, 1, 4},
    {"lenet1_k6_n4", 1, 28, 28, 6, 5, 0, 1, 4},
    {"lenet2_n1", 20, 12, 12, 50, 5, 0, 1, 1},
    {"lenet2_n4", 20, 12, 12, 50, 5, 0, 1, 4},
    {"c16k32_3x3_pad1_n1", 16, 14, 14, 32, 3, 1, 1, 1},
    {"c16k32_3x3_pad1_n4", 16, 14, 14, 32, 3, 1, 1, 4},
    {"c16k16_3x3_pad1_n3", 16, 10, 10, 16, 3, 1, 1, 3},
    {"c3k8_3x3_stride2_n1", 3, 15, 15, 8, 3, 1, 2, 1},
    {"c3k8_3x3_stride2_n4", 3, 15, 15, 8, 3, 1, 2, 4},
    {"c8k12_3x3_stride2_n2", 8, 11, 11, 12, 3, 1, 2, 2},
    {"c24k8_1x1_n2", 24, 7, 7, 8, 1, 0, 1, 2},
    {"c3k8_7x7_stride2_pad3_n2", 3, 20, 20, 8, 7, 3, 2, 2},
    // Grouped (ResNeXt's 3x3) and depthwise (MobileNet's 3x3, stride 1 and
    // 2, channels a multiple of the CPU's blocks and not), groups last.
    {"c16k32_3x3_pad1_g4_n2", 16, 9, 9, 32, 3, 1, 1, 2, 4},
    {"c12k6_1x1_g3_n2", 12, 5, 5, 6, 1, 0, 1, 2, 3},
    {"dw_c32_3x3_pad1_n2", 32, 10, 10, 32, 3, 1, 1, 2, 32},
    {"dw_c24_3x3_pad1_stride2_n3", 24, 11, 11, 24, 3, 1, 2, 3, 24},
    {"dw_c5_3x3_pad1_stride2_n2", 5, 9, 9, 5, 3, 1, 2, 2, 5},
    {"dw_c16k32_5x5_pad2_n1", 16, 8, 8, 32, 5, 2, 1, 1, 16},
};

// ================================================================ relu

struct ReluCase {
  const char* name;
  Shape shape;
};

// n1c9_1x1: an fc's output at batch 1, one value per channel to sum.
inline const ReluCase kReluCases[] = {{"n2c20_6x6", {2, 20, 6, 6}},
                                      {"n3c7_5x5", {3, 7, 5, 5}},
                                      {"n1c9_1x1", {1, 9, 1, 1}}};

// ============================================================== pooling

struct PoolCase {
  std::string name;
  PoolDesc params;
  Shape x;
  bool ties = false;  // x holds five values only, so most windows tie
};

// Max and average, 2x2 stride 2 and 3x3 stride 2 pad 1 (overlapping), on
// sizes that divide and that do not; and max 2x2 with ties (as after a
// ReLU), where the gradient goes to each window's first maximum.
inline std::vector<PoolCase> pool_cases() {
  const PoolDesc k2s2{.window = {2, 2, 2, 2, 0, 0}};
  const PoolDesc k3s2p1{.window = {3, 3, 2, 2, 1, 1}};
  std::vector<PoolCase> cases;
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
    for (PoolDesc p : {k2s2, k3s2p1}) {
      p.kind = kind;
      const std::string name = std::string(kind == PoolKind::kMax ? "max" : "avg") + "_k" +
                               std::to_string(p.window.kernel_h) + "s2p" + std::to_string(p.window.pad_h);
      for (const Shape& x : {Shape{2, 20, 12, 12}, Shape{2, 16, 13, 13}, Shape{2, 5, 9, 9}}) {
        cases.push_back({name + "_c" + std::to_string(x.c) + "_" + std::to_string(x.h) + "x" +
                             std::to_string(x.w),
                         p, x});
      }
    }
  }
  cases.push_back({"max_k2s2p0_ties_c20_12x12", k2s2, {2, 20, 12, 12}, true});
  return cases;
}

// ========================================================= inner product

struct InnerProductCase {
  const char* name;
  Shape x;
  int64_t out;
  unsigned seed;
};

// Flat inputs, and conv-shaped ones (flattened in NCHW order whatever their
// layout), into plain outputs.
inline const InnerProductCase kInnerProductCases[] = {
    {"flat_n8_100to10", {8, 100, 1, 1}, 10, 13},
    {"conv_shaped_n4_50x4x4to120", {4, 50, 4, 4}, 120, 14},
    {"conv_shaped_n5_4x3x3to7", {5, 4, 3, 3}, 7, 9},
    {"flat_n3_7to5", {3, 7, 1, 1}, 5, 15},
};

// =========================================================== batch norm

struct BatchNormCase {
  const char* name;
  Shape shape;
  float x_lo;  // inputs uniform in [x_lo, 3): a mean away from 0
  unsigned seed;
};

inline const BatchNormCase kBatchNormCases[] = {{"n4c20_6x6", {4, 20, 6, 6}, -1.0f, 15},
                                                {"n4c6_5x5", {4, 6, 5, 5}, -2.0f, 10}};

// Host data and reference results of one batch-norm case in `type`
// (reference_ops.h): x, dy, y and dx rounded to it; scale_shift, the
// statistics and their gradients are always f32.
struct BatchNormData {
  explicit BatchNormData(const BatchNormCase& bc, DataType type = DataType::kF32)
      : s(bc.shape) {
    std::mt19937 rng(bc.seed);
    const int64_t c = s.c;
    x = rounded(type, random_vec(rng, s.elements(), bc.x_lo, 3.0f));
    gamma = random_vec(rng, c, 0.5f, 1.5f);
    beta = random_vec(rng, c);
    scale_shift = gamma;
    scale_shift.insert(scale_shift.end(), beta.begin(), beta.end());
    running_mean0 = random_vec(rng, c);
    running_var0 = random_vec(rng, c, 0.5f, 2.0f);
    dy = rounded(type, random_vec(rng, s.elements()));
    fwd = reference::batch_norm_forward_training(s, x, gamma, beta, eps);
    back = reference::batch_norm_backward(s, x, dy, gamma, fwd.mean, fwd.var, eps);
    fwd.y = rounded(type, fwd.y);
    back.dx = rounded(type, back.dx);
    // running = (1 - momentum) * running + momentum * batch, with the
    // unbiased batch variance.
    const double m = double(s.n * s.h * s.w);
    running_mean.resize(c);
    running_var.resize(c);
    for (int64_t i = 0; i < c; ++i) {
      running_mean[i] = float((1 - momentum) * double(running_mean0[i]) + momentum * fwd.mean[i]);
      running_var[i] =
          float((1 - momentum) * double(running_var0[i]) + momentum * fwd.var[i] * m / (m - 1));
    }
    dscale_shift = back.dgamma;
    dscale_shift.insert(dscale_shift.end(), back.dbeta.begin(), back.dbeta.end());
  }
  const float eps = 1e-5f;
  const float momentum = 0.1f;
  Shape s;
  Vec x, gamma, beta, scale_shift, running_mean0, running_var0, dy;
  reference::BatchNormForward fwd;
  reference::BatchNormBackward back;
  Vec running_mean, running_var, dscale_shift;  // expected after one training step
};

// Synchronised batch norm: a batch cut in two "ranks".
struct SyncCase {
  const char* name;
  Shape shape;  // the global batch; the first `first` samples are "rank 0"'s
  int64_t first;
  unsigned seed;
};

// 20 channels: blocked layouts pad them (to 24 or 32). 16: whole 16-byte
// packs of half (and float) channels, which the CUDA backend's NHWC sums
// take a pack a thread (channel_sum_grid.h).
inline const SyncCase kSyncCases[] = {{"n5c20_6x6_split2", {5, 20, 6, 6}, 2, 21},
                                      {"n4c6_5x5_split1", {4, 6, 5, 5}, 1, 22},
                                      {"n4c16_3x3_split1", {4, 16, 3, 3}, 1, 23}};

// ======================================================= add, accumulate

struct EltwiseCase {
  const char* name;
  Shape shape;
};

inline const EltwiseCase kEltwiseCases[] = {{"n2c20_5x5", {2, 20, 5, 5}},
                                            {"n2c9_4x4", {2, 9, 4, 4}}};

// ================================================================== mul

// a * b with b shaped like a, or broadcast (b {n, c, 1, 1}: squeeze-
// excitation's gate). 20 and 9 channels: blocked layouts pad them; 32: whole
// 16-byte packs of half and float channels in NHWC.
struct MulCase {
  const char* name;
  Shape a;
  bool broadcast;
  Shape b() const { return broadcast ? Shape{a.n, a.c, 1, 1} : a; }
};

inline const MulCase kMulCases[] = {{"same_n2c20_5x5", {2, 20, 5, 5}, false},
                                    {"broadcast_n2c20_5x5", {2, 20, 5, 5}, true},
                                    {"broadcast_n3c9_4x3", {3, 9, 4, 3}, true},
                                    {"broadcast_n2c32_8x8", {2, 32, 8, 8}, true}};

// =============================================================== concat

struct ConcatCase {
  const char* name;
  std::vector<int64_t> channels;
  int64_t h, w;
};

inline const ConcatCase kConcatCases[] = {{"c8_16_24_5x5", {8, 16, 24}, 5, 5},
                                          {"c3_5_5x5", {3, 5}, 5, 5},
                                          {"c3_8_5_4x5", {3, 8, 5}, 4, 5}};

// ================================================================= loss

struct SoftmaxCase {
  const char* name;
  int64_t n, classes;
  float scale;
  unsigned seed;
  float label_smoothing = 0.0f;
};

inline const SoftmaxCase kSoftmaxCases[] = {{"n16_c10", 16, 10, 1.0f / 16, 19},
                                            {"n37_c3", 37, 3, 1.0f / 64, 13},
                                            {"n37_c10", 37, 10, 1.0f / 64, 23},
                                            {"n37_c100", 37, 100, 1.0f / 64, 29},
                                            {"n37_c10_smoothed", 37, 10, 1.0f / 64, 31, 0.1f},
                                            {"n16_c100_smoothed", 16, 100, 1.0f / 16, 37, 0.3f}};

}  // namespace vtrain::backend_test
