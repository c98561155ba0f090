// Activation layouts (device.layout): the rule every backend follows, NHWC
// storage as cuDNN and oneDNN lay it out, and networks that train to the
// same weights whichever layout their activations are kept in (batch norm,
// residual adds, concatenations, pooling and inner products over NHWC),
// with memory plans that still change no bit. The CPU backend runs every
// layout, so the engine's NHWC path is checked on every machine; the CUDA
// backend's NHWC ops run in the conformance suite's "cuda_nhwc" cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "memory/vdnn_plan.h"
#include "tests/backend_test_support.h"
#include "tests/engine_runs.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/profile/step_costs.h"

namespace vtrain {
namespace {

using common::Precision;
using worker::Layout;
using worker::LayoutChoice;
using worker::LayoutRule;
using test_support::relative_difference;

TEST(LayoutRule, AutoIsBlockedOnTheCpuAndChannelsLastForHalfOnAGpu) {
  const LayoutRule avx512{.native_block = 16};
  EXPECT_EQ(avx512(64), Layout::kBlocked16);
  EXPECT_EQ(avx512(12), Layout::kBlocked8);
  EXPECT_EQ(avx512(3), Layout::kPlain);
  const LayoutRule avx2{.native_block = 8};
  EXPECT_EQ(avx2(64), Layout::kBlocked8);
  EXPECT_EQ(avx2(4), Layout::kPlain);
  EXPECT_EQ(LayoutRule{}(64), Layout::kPlain);  // no vector block

  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    EXPECT_EQ((LayoutRule{.gpu = true, .precision = p}(64)), Layout::kNhwc);
    EXPECT_EQ((LayoutRule{.gpu = true, .precision = p}(8)), Layout::kNhwc);
    // Channels not in groups of 8 stay NCHW (tensor cores' NHWC kernels).
    EXPECT_EQ((LayoutRule{.gpu = true, .precision = p}(20)), Layout::kPlain);
    EXPECT_EQ((LayoutRule{.gpu = true, .precision = p}(3)), Layout::kPlain);
  }
  for (Precision p : {Precision::kFp32, Precision::kTf32}) {
    EXPECT_EQ((LayoutRule{.gpu = true, .precision = p}(64)), Layout::kPlain);
  }
}

TEST(LayoutRule, AForcedChoiceHoldsForEveryDeviceAndChannelCount) {
  for (bool gpu : {false, true}) {
    for (int64_t channels : {1, 3, 16, 64}) {
      EXPECT_EQ((LayoutRule{.choice = LayoutChoice::kNhwc, .gpu = gpu, .native_block = 16}(channels)),
                Layout::kNhwc);
      EXPECT_EQ((LayoutRule{.choice = LayoutChoice::kNchw,
                            .gpu = gpu,
                            .native_block = 16,
                            .precision = Precision::kBf16}(channels)),
                Layout::kPlain);
    }
  }
}

// What the offline planner assumes for a rank is what its backend does,
// for every choice and precision (the CUDA half only where one is built
// and visible).
TEST(LayoutRule, ThePlannersRuleIsTheBackendsOwn) {
  for (LayoutChoice choice : {LayoutChoice::kAuto, LayoutChoice::kNchw, LayoutChoice::kNhwc}) {
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      const common::ComputeSettings settings{.precision = p, .layout = choice};
      const LayoutRule rule = worker::layout_rule_for(worker::BackendKind::kCpu, settings);
      const auto cpu = worker::make_backend({.kind = worker::BackendKind::kCpu, .settings = settings});
      for (int64_t channels : {3, 8, 12, 16, 64}) {
        EXPECT_EQ(rule(channels), cpu->preferred_layout(channels))
            << worker::layout_name(rule(channels)) << " for " << channels << " channels";
      }
      if (worker::gpu_available()) {
        const auto gpu =
            worker::make_backend({.kind = worker::BackendKind::kCuda, .settings = settings});
        EXPECT_EQ(worker::layout_rule_for(worker::BackendKind::kCuda, settings)(64),
                  gpu->preferred_layout(64));
      }
    }
  }
  // auto names no one backend: the planner must know which a rank made.
  EXPECT_THROW(
      worker::layout_rule_for(worker::BackendKind::kAuto, {}),
      worker::BackendError);
}

// OpenMP's thread count belongs to the process: a CPU backend made for a
// moment with one thread (as planners make them) hands the count back when
// it goes, so the backend that trains keeps its threads.
TEST(CpuThreads, AShortLivedBackendLeavesTheThreadCountAsItFoundIt) {
  const int before =
      worker::make_backend({.kind = worker::BackendKind::kCpu})->device_info().threads;
  { const auto one = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1}); }
  EXPECT_EQ(worker::make_backend({.kind = worker::BackendKind::kCpu})->device_info().threads,
            before);
  // A backend of all threads made while one of threads 1 lives has them all
  // (it used to inherit the 1 OpenMP was left at).
  const auto one = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  EXPECT_EQ(worker::make_backend({.kind = worker::BackendKind::kCpu})->device_info().threads,
            before);
}

// NHWC is one channel block of every channel: no padding, and channel c of
// pixel (h, w) of sample n at ((n * H + h) * W + w) * C + c.
TEST(NhwcLayout, StoresChannelsLastWithoutPadding) {
  const worker::Shape s{2, 5, 3, 4};
  const worker::TensorDesc d{s, Layout::kNhwc};
  EXPECT_EQ(worker::channel_block(d), 5);
  EXPECT_EQ(d.storage_elements(), s.elements());
  EXPECT_STREQ(worker::layout_name(Layout::kNhwc), "nhwc");

  const std::unique_ptr<worker::Backend> cpu =
      worker::make_backend({.kind = worker::BackendKind::kCpu});
  std::vector<float> x(static_cast<size_t>(s.elements()));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  backend_test::DeviceTensor t(*cpu, d);
  cpu->upload(x.data(), t.tensor);
  std::vector<float> raw(x.size());
  std::memcpy(raw.data(), t.tensor.data, t.tensor.bytes());  // CPU device memory is host memory
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t c = 0; c < s.c; ++c) {
      for (int64_t h = 0; h < s.h; ++h) {
        for (int64_t w = 0; w < s.w; ++w) {
          const int64_t nchw = ((n * s.c + c) * s.h + h) * s.w + w;
          const int64_t nhwc = ((n * s.h + h) * s.w + w) * s.c + c;
          ASSERT_EQ(raw[nhwc], x[nchw]) << n << "," << c << "," << h << "," << w;
        }
      }
    }
  }
  // A sample's slice is contiguous, as the engine's micro-batches need.
  const worker::Tensor second = t.tensor.samples(1, 1);
  EXPECT_EQ(static_cast<float*>(second.data)[0], x[static_cast<size_t>(s.per_sample())]);
}

std::unique_ptr<worker::Backend> cpu_in(LayoutChoice layout) {
  // One thread: the same floating-point path on every run.
  return worker::make_backend(
      {.kind = worker::BackendKind::kCpu, .threads = 1, .settings = {.layout = layout}});
}

// oneDNN's primitive cache ignores the strides of size-1 dimensions, so an
// NHWC tensor of one pixel (the inner product's input after global
// pooling) and an NCHW one looked alike to it: once an NCHW network had
// run, an NHWC network could be handed the NCHW inner product, weights
// expected in another format than it had staged them in. This sequence
// crashed in the last NHWC run (exit 139), and elsewhere ResNet-18 ended
// 9e-4 off. (Its two-step runs at batch 4 are too ill-conditioned to
// compare closely: see EveryLayoutTrainsTheSameWeights.)
TEST(NhwcLayout, NhwcNetworksRunAfterNchwOnesInOneProcess) {
  const worker::Graph graph = test_support::preset_graph("resnet18", 16);
  worker::NetworkOptions o;
  o.max_batch = 4;
  o.conv_algorithm = "direct";
  const auto nchw = cpu_in(LayoutChoice::kNchw);
  const auto nhwc = cpu_in(LayoutChoice::kNhwc);
  test_support::train_steps(*nchw, graph, o, 1);
  test_support::train_steps(*nhwc, graph, o, 1);
  test_support::train_steps(*nchw, graph, o, 2);
  const test_support::TrainRun b = test_support::train_steps(*nhwc, graph, o, 2);
  EXPECT_TRUE(std::all_of(b.params.begin(), b.params.end(), [](float v) { return std::isfinite(v); }));
}

worker::NetworkOptions options(memory::Policy policy = memory::Policy::kNone) {
  worker::NetworkOptions o;
  o.max_batch = 8;
  o.conv_algorithm = "direct";
  o.memory_policy = policy;
  o.poison_freed = policy != memory::Policy::kNone;
  return o;
}

class LayoutTraining : public ::testing::TestWithParam<const char*> {};

// A training step (a batch of 7) and an evaluation from the same weights
// and data in NCHW, the CPU's blocked layouts and NHWC end on the same
// weights and batch-norm statistics within float rounding: the kernels
// differ, so their sums are ordered differently (measured 2e-8 to 1.3e-7
// of the largest weight, with oneDNN at AVX-512 and capped at AVX2). NHWC
// activations take their plain bytes.
//
// One step at this batch, because ResNet-18 at 16x16 is ill-conditioned
// elsewhere: multiplying every weight by 1 +- 1 ulp in one layout moves
// its weights after two steps (batch 8) by 4e-3 of the largest, and after
// one step of 8 by 5e-4, while here it moves them by 2.4e-7. Layouts
// differ by that much too where it is that sensitive, so only a
// well-conditioned step tells a wrong kernel from rounding.
TEST_P(LayoutTraining, EveryLayoutTrainsTheSameWeights) {
  const worker::Graph graph = test_support::preset_graph(GetParam(), 16);
  const auto nchw = cpu_in(LayoutChoice::kNchw);
  const auto nhwc = cpu_in(LayoutChoice::kNhwc);
  const auto blocked = cpu_in(LayoutChoice::kAuto);
  const test_support::TrainRun a = test_support::train_steps(*nchw, graph, options(), 1);
  const test_support::TrainRun b = test_support::train_steps(*nhwc, graph, options(), 1);
  const test_support::TrainRun c = test_support::train_steps(*blocked, graph, options(), 1);
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_LT(relative_difference(a.params, b.params), 1e-5);
  EXPECT_LT(relative_difference(a.params, c.params), 1e-5);
  if (!a.buffers.empty()) {
    EXPECT_LT(relative_difference(a.buffers, b.buffers), 1e-5);
    EXPECT_LT(relative_difference(a.buffers, c.buffers), 1e-5);
  }

  const worker::Network plain_net(graph, *nchw, options());
  const worker::Network nhwc_net(graph, *nhwc, options());
  const memory::MemoryModel& pm = plain_net.memory_model();
  const memory::MemoryModel& nm = nhwc_net.memory_model();
  ASSERT_EQ(pm.layers.size(), nm.layers.size());
  for (size_t i = 0; i < pm.layers.size(); ++i) {
    EXPECT_EQ(nm.layers[i].output_bytes, pm.layers[i].output_bytes) << pm.layers[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, LayoutTraining,
                         ::testing::Values("vgg-small", "resnet18", "googlenet"));

// Offloading and recomputing NHWC activations change no bit (freed memory
// poisoned), and the simulated peak is the measured one, as in NCHW.
TEST(LayoutTraining, NhwcMemoryPlansKeepTheNumbersAndPredictThePeak) {
  const worker::Graph graph = test_support::preset_graph("resnet18", 16);
  const auto nhwc = cpu_in(LayoutChoice::kNhwc);
  const test_support::TrainRun none = test_support::train_steps(*nhwc, graph, options());
  const memory::MemoryModel model = worker::Network(graph, *nhwc, options()).memory_model();
  const std::vector<bool> can = memory::plannable(model);
  std::vector<memory::TensorAction> actions(model.layers.size(), memory::TensorAction::kKeep);
  int k = 0;
  for (size_t l = 0; l < actions.size(); ++l) {
    if (!can[l]) continue;
    actions[l] = ++k % 2 == 0 ? memory::TensorAction::kOffload : memory::TensorAction::kRecompute;
  }
  worker::NetworkOptions o = options();
  o.memory_actions = actions;
  o.poison_freed = true;
  const test_support::TrainRun planned = test_support::train_steps(*nhwc, graph, o);
  EXPECT_TRUE(test_support::bitwise_equal(none.params, planned.params));
  EXPECT_TRUE(test_support::bitwise_equal(none.buffers, planned.buffers));
  EXPECT_LT(planned.stats.step_peak, none.stats.step_peak);
  EXPECT_EQ(planned.stats.predicted_peak, planned.stats.step_peak);
}

// A job's timings are keyed by the layout it forces: NHWC steps are not
// the blocked layouts' steps. The model's signature stays; the perf DB's
// layout column tells them apart.
TEST(LayoutTraining, ModelKeysKeepForcedLayoutsApart) {
  const worker::Graph graph = test_support::preset_graph("lenet", 28);
  const perfdb::ModelKey plain = worker::model_key(graph, {});
  const perfdb::ModelKey nhwc = worker::model_key(graph, {.layout = LayoutChoice::kNhwc});
  const perfdb::ModelKey nchw = worker::model_key(graph, {.layout = LayoutChoice::kNchw});
  EXPECT_EQ(plain.signature, graph.signature());
  EXPECT_EQ(nhwc.signature, graph.signature());
  EXPECT_NE(plain, nhwc);
  EXPECT_NE(nhwc, nchw);
  EXPECT_EQ(perfdb::describe_model(nhwc),
            graph.signature() + " (precision fp32, layout nhwc, fuse_relu auto)");
}

// Where a convolution's bias is added (conv.fuse_relu) moves time between
// layers and changes a step's: each setting keys its own timings.
TEST(LayoutTraining, ModelKeysKeepForcedBiasPairingsApart) {
  const worker::Graph graph = test_support::preset_graph("vgg-small", 32);
  const perfdb::ModelKey on = worker::model_key(graph, {.fuse_relu = common::AutoOnOff::kOn});
  EXPECT_NE(on, worker::model_key(graph, {}));
  EXPECT_NE(on, worker::model_key(graph, {.fuse_relu = common::AutoOnOff::kOff}));
  EXPECT_EQ(on.settings.fuse_relu, common::AutoOnOff::kOn);
}

}  // namespace
}  // namespace vtrain
