// Grouped and depthwise convolutions as users run them: the built vtrain
// trains a depthwise-separable model (its loss falls), and the presets built
// from grouped convolutions are no longer refused for them. (Their kernels
// against the reference: the conformance suite's grouped and depthwise
// cases; their gradients: network_test's GroupedAndDepthwiseConvGradients.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "tests/mpi_runs.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

using test_support::RunResult;
using test_support::run_vtrain;

// MobileNet's block: a depthwise 3x3 (groups = channels, no bias, batch
// norm, relu6), stride 1 and then stride 2, each followed by a pointwise
// 1x1, on a 3-channel synthetic 16x16 task of 4 classes.
const char* const kDepthwiseSeparable =
    "model:\n"
    "  layers:\n"
    "    - {name: data, type: input}\n"
    "    - {name: stem, type: conv, out: 16, kernel: 3, pad: 1}\n"
    "    - {name: r0, type: relu}\n"
    "    - {name: dw1, type: conv, out: 16, kernel: 3, pad: 1, groups: 16, bias: false}\n"
    "    - {name: bn1, type: batchnorm}\n"
    "    - {name: a1, type: relu6}\n"
    "    - {name: pw1, type: conv, out: 24, kernel: 1}\n"
    "    - {name: r1, type: relu}\n"
    "    - {name: dw2, type: conv, out: 24, kernel: 3, pad: 1, stride: 2, groups: 24, "
    "bias: false}\n"
    "    - {name: bn2, type: batchnorm}\n"
    "    - {name: a2, type: relu6}\n"
    "    - {name: pw2, type: conv, out: 32, kernel: 1}\n"
    "    - {name: gap, type: pool, mode: avg, global: true}\n"
    "    - {name: fc, type: fc, out: 4}\n"
    "data: {kind: synthetic, shape: [3, 16, 16], classes: 4, train_size: 1280, test_size: 64}\n"
    "train: {batch: 32, max_steps: 40, evaluate: false, log_every: 1}\n"
    "optimizer: {lr: 0.05, momentum: 0.9}\n"
    "device: {threads: 1}\n";

double mean_of(const std::vector<std::string>& losses, size_t first, size_t count) {
  double sum = 0;
  for (size_t i = first; i < first + count; ++i) sum += std::strtod(losses[i].c_str(), nullptr);
  return sum / static_cast<double>(count);
}

// Its loss over the last 8 of 40 steps is well below the first 8's, with
// every algorithm that runs grouped convolutions on the CPU.
TEST(GroupedConvRun, ADepthwiseSeparableModelTrainsAndItsLossFalls) {
  const test_support::TempDir dir;
  const std::string config = dir.path("dw.yaml");
  std::ofstream(config) << kDepthwiseSeparable;
  for (const std::string algorithm : {"direct", "im2col_gemm"}) {
    SCOPED_TRACE(algorithm);
    const std::string metrics = dir.path(algorithm + ".jsonl");
    const RunResult r = run_vtrain("train --progress off " + config + " --metrics " + metrics +
                                   " --set conv.algorithm=" + algorithm);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::string> losses = mpi_runs::logged_losses(metrics);
    ASSERT_EQ(losses.size(), 40u) << r.output;
    const double first = mean_of(losses, 0, 8), last = mean_of(losses, 32, 8);
    EXPECT_LT(last, 0.6 * first) << "loss did not fall: first " << first << ", last " << last;
  }
}

// The presets of issue 43 at 32x32 train a step as users run them:
// ResNeXt-50 32x4d (grouped 3x3s), MobileNetV2 (depthwise, relu6, dropout)
// and EfficientNet-B0 (depthwise, silu, squeeze-excitation's sigmoid and
// mul, dropout).
TEST(GroupedConvRun, PresetsOfGroupedConvolutionsTrain) {
  const test_support::TempDir dir;
  for (const std::string preset : {"resnext50_32x4d", "mobilenet_v2", "efficientnet_b0"}) {
    const std::string path = dir.path(preset + ".yaml");
    std::ofstream(path) << "model: {preset: " << preset << "}\n"
                        << "data: {kind: synthetic, shape: [3, 32, 32], classes: 10, "
                           "train_size: 8, test_size: 4}\n"
                           "train: {batch: 2, max_steps: 1, evaluate: false}\n"
                           "conv: {algorithm: direct}\n"
                           "device: {threads: 1}\n";
    const RunResult r = run_vtrain("train --progress off " + path);
    EXPECT_EQ(r.exit_code, 0) << preset << ":\n" << r.output;
  }
}

}  // namespace
}  // namespace vtrain
