// Network-level tests: finite-difference gradient checks through small
// graphs for every layer type (each check covers the layer's parameter
// gradient and, through the layers below it, every backward-data path), fork
// and join accumulation, every convolution algorithm, and determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <utility>

#include "memory/memory_error.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/kernel_timing.h"
#include "common/name_table.h"
#include "worker/engine/layers/layer_registry.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"
#include "tests/engine_runs.h"
#include "tests/test_support.h"

namespace vtrain::worker {
namespace {

LayerSpec L(const std::string& name, LayerType type, std::vector<std::string> inputs) {
  LayerSpec s;
  s.name = name;
  s.type = type;
  s.inputs = std::move(inputs);
  return s;
}
LayerSpec conv(const std::string& name, const std::string& in, int64_t out, int64_t k,
               int64_t pad = 0, int64_t stride = 1) {
  LayerSpec s = L(name, LayerType::kConv, {in});
  s.out = out;
  s.kernel_h = s.kernel_w = k;
  s.pad_h = s.pad_w = pad;
  s.stride_h = s.stride_w = stride;
  return s;
}
LayerSpec fc(const std::string& name, const std::string& in, int64_t out) {
  LayerSpec s = L(name, LayerType::kFc, {in});
  s.out = out;
  return s;
}
LayerSpec pool(const std::string& name, const std::string& in, PoolKind kind, int64_t k,
               int64_t stride, int64_t pad = 0) {
  LayerSpec s = L(name, LayerType::kPool, {in});
  s.pool = kind;
  s.kernel_h = s.kernel_w = k;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

NetworkOptions options(int64_t max_batch, const std::string& algorithm = "auto") {
  NetworkOptions o;
  o.max_batch = max_batch;
  o.conv_algorithm = algorithm;
  return o;
}

class NetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_backend({.kind = worker::BackendKind::kCpu, .threads = 2});
  }

  // Writes a deterministic random batch and labels into the network.
  void fill_batch(Network& net, int64_t n, uint32_t seed) { fill_batch(*backend_, net, n, seed); }
  static void fill_batch(Backend& backend, Network& net, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const Tensor in = net.input(n);
    std::vector<float> x(static_cast<size_t>(in.shape().elements()));
    for (float& v : x) v = dist(rng);
    backend.upload(x.data(), in);
    std::vector<int32_t> labels(static_cast<size_t>(n));
    for (auto& l : labels) l = static_cast<int32_t>(rng() % net.graph().classes());
    backend.upload_labels(labels.data(), net.labels(), n);
  }

  // Compares every parameter range's analytic gradient with central
  // differences on a sample of its entries. The algorithm is fixed (not
  // "auto", which picks by timing) so that the numerics do not change from
  // run to run; every algorithm has its own case below.
  //
  // In the CPU's own layouts (blocked where its vector width allows), then
  // with every activation channels last (device.layout nhwc).
  // With the fixture's fuse_relu_ (conv.fuse_relu) on every network.
  void check_gradients(const Graph& graph, const std::string& algorithm = "direct",
                       int64_t n = 3) {
    check_gradients_in(*backend_, graph, algorithm, n);
    const std::unique_ptr<Backend> nhwc = make_backend(
        {.kind = worker::BackendKind::kCpu, .threads = 2, .settings = {.layout = LayoutChoice::kNhwc}});
    SCOPED_TRACE("nhwc");
    check_gradients_in(*nhwc, graph, algorithm, n);
  }
  void check_gradients_in(Backend& backend, const Graph& graph, const std::string& algorithm,
                          int64_t n) {
    NetworkOptions o = options(n, algorithm);
    o.settings.fuse_relu = fuse_relu_;
    Network net(graph, backend, o);
    net.init_parameters(7);
    fill_batch(backend, net, n, 11);
    const float scale = 1.0f / static_cast<float>(n);
    net.train_step(n, scale);
    const std::vector<float> grads = [&] {
      std::vector<float> g(static_cast<size_t>(net.parameter_count()));
      backend.download(Tensor{{{net.parameter_count(), 1, 1, 1}}, net.gradients()}, g.data());
      return g;
    }();
    const std::vector<float> base = net.download_parameters();
    const std::vector<float> buffers = net.download_buffers();
    auto loss_at = [&](const std::vector<float>& params) {
      net.upload_parameters(params);
      net.upload_buffers(buffers);
      return net.train_step(n, scale).loss_sum * scale;
    };
    std::mt19937 pick(3);
    int checked = 0;
    for (const ParamRange& r : net.param_ranges()) {
      for (int t = 0; t < 12; ++t) {
        // The first the range's last entry: its bias, where the layer has one.
        const int64_t i = r.offset + (t == 0 ? r.count - 1 : static_cast<int64_t>(pick() % r.count));
        const double eps = eps_scale_ * std::max(1.0, std::fabs(static_cast<double>(base[i])));
        std::vector<float> p = base;
        p[i] = base[i] + static_cast<float>(eps);
        const double up = loss_at(p);
        p[i] = base[i] - static_cast<float>(eps);
        const double down = loss_at(p);
        const double numeric = (up - down) / (2 * eps);
        const double analytic = grads[i];
        EXPECT_NEAR(analytic, numeric, 2e-3 + 3e-2 * std::fabs(numeric))
            << "layer '" << graph.layer(r.layer).name << "' parameter " << (i - r.offset)
            << " (algorithm " << algorithm << ")";
        ++checked;
      }
    }
    EXPECT_GT(checked, 0);
  }

  std::unique_ptr<Backend> backend_;
  common::AutoOnOff fuse_relu_ = common::AutoOnOff::kAuto;
  double eps_scale_ = 3e-4;  // finite-difference step relative to the parameter
};

TEST_F(NetworkTest, ConvFcGradients) {
  // Channels of 16+ make the CPU backend use its blocked layout inside.
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                                L("r1", LayerType::kRelu, {"c1"}), conv("c2", "r1", 20, 3, 0, 2),
                                fc("fc", "c2", 5)},
                               {1, 3, 9, 9});
  check_gradients(g);
}

// conv.fuse_relu: a convolution's bias goes to the relu after it only where
// that relu alone reads the convolution's output and there is a bias; auto
// pairs where the backend gains from it (not on the CPU, where oneDNN's
// convolution adds its bias for free).
TEST_F(NetworkTest, ConvBiasPairsWithTheReluThatAloneReadsIt) {
  LayerSpec c2 = conv("c2", "r1", 16, 3, 1);
  c2.bias = false;
  LayerSpec sum = L("sum", LayerType::kAdd, {"r3", "c3"});
  Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                          L("r1", LayerType::kRelu, {"c1"}), c2,
                          L("r2", LayerType::kRelu, {"c2"}), conv("c3", "r2", 16, 3, 1),
                          L("r3", LayerType::kRelu, {"c3"}), sum, fc("fc", "sum", 5)},
                         {1, 3, 8, 8});
  using enum common::AutoOnOff;
  for (const auto& [fuse, pairs] : {std::pair{kOn, 1}, std::pair{kAuto, 0}, std::pair{kOff, 0}}) {
    NetworkOptions o = options(4, "direct");
    o.settings.fuse_relu = fuse;
    const Network net(g, *backend_, o);
    EXPECT_EQ(net.bias_relu_pairs(), pairs) << common::name_of(common::kAutoOnOffNames, fuse);
    const std::vector<std::string> summary = net.algorithm_summary();
    const bool said = std::find(summary.begin(), summary.end(),
                                "r1: bias of c1 added here (conv.fuse_relu)") != summary.end();
    EXPECT_EQ(said, pairs > 0);
  }
}

// The paired relu's backward writes the convolution's bias gradient:
// against central differences (a bias entry of c1 and of c2 among those
// sampled), in the CPU's blocked layouts and channels last.
TEST_F(NetworkTest, PairedBiasAndReluGradients) {
  Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                          L("r1", LayerType::kRelu, {"c1"}), conv("c2", "r1", 20, 3, 0, 2),
                          L("r2", LayerType::kRelu, {"c2"}), fc("fc", "r2", 5)},
                         {1, 3, 9, 9});
  fuse_relu_ = common::AutoOnOff::kOn;
  check_gradients(g);
}

// mul: a squeeze-excitation block (the gate {n, c, 1, 1} broadcast over the
// block's input, which also feeds the pooling, so that input's gradient
// adds da to the gate path's) and a same-shaped product of a tensor and
// its sigmoid (da and db reach one tensor), against central differences of
// every parameter range behind them, in the CPU's blocked layouts and
// channels last.
TEST_F(NetworkTest, MulGradients) {
  LayerSpec gap = pool("gap", "r1", PoolKind::kAverage, 1, 1);
  gap.global = true;
  Graph g = Graph::build(
      {L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
       L("r1", LayerType::kRelu, {"c1"}), gap, conv("s1", "gap", 4, 1),
       L("sr", LayerType::kRelu, {"s1"}), conv("s2", "sr", 16, 1),
       L("gate", LayerType::kSigmoid, {"s2"}), L("se", LayerType::kMul, {"r1", "gate"}),
       conv("c2", "se", 12, 3, 0, 2), L("t", LayerType::kSigmoid, {"c2"}),
       L("sq", LayerType::kMul, {"c2", "t"}), fc("fc", "sq", 5)},
      {1, 3, 9, 9});
  check_gradients(g);
}

// Training with the pairs against without, on the same seeds: the same
// weights to float rounding (the bias sums run in another order). Also
// under a per-tensor memory policy that times its layers alone in place
// before the network binds them (the pairs come after).
TEST_F(NetworkTest, PairedBiasTrainsLikeTheConvolutionsOwn) {
  Graph g = test_support::preset_graph("vgg-small", 32);
  for (const memory::Policy policy : {memory::Policy::kNone, memory::Policy::kAuto}) {
    SCOPED_TRACE(memory::policy_name(policy));
    std::vector<float> params[2];
    using enum common::AutoOnOff;
    for (const common::AutoOnOff fuse : {kOff, kOn}) {
      NetworkOptions o = options(8, "direct");
      o.settings.fuse_relu = fuse;
      o.memory_policy = policy;
      EXPECT_EQ(Network(g, *backend_, o).bias_relu_pairs() > 0, fuse == kOn);
      params[fuse == kOn] = test_support::train_steps(*backend_, g, o, 4).params;
    }
    ASSERT_FALSE(params[0].empty());
    EXPECT_LT(test_support::relative_difference(params[0], params[1]), 1e-5);
  }
}

// conv.algorithm names an algorithm the network's convolutions must offer
// for at least one kind (cuDNN's algo_1 is a backward algorithm only):
// another backend's name, or a typo, is refused with what the CPU offers,
// not run quietly as the backend's first algorithm.
TEST_F(NetworkTest, ANamedAlgorithmNoConvolutionOffersIsRefused) {
  const Graph g = test_support::preset_graph("lenet", 28);
  const std::string message = test_support::error_message<BackendError>(
      [&] { Network(g, *backend_, options(2, "algo_1")); });
  EXPECT_NE(message.find("conv.algorithm 'algo_1': no convolution of the model offers an "
                         "algorithm of that name on the cpu backend (its convolutions offer: "
                         "direct, "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("im2col_gemm"), std::string::npos) << message;
  EXPECT_NO_THROW(Network(g, *backend_, options(2, "im2col_gemm")));
}

TEST_F(NetworkTest, EveryConvolutionAlgorithmGivesTheSameGradients) {
  // 3x3 stride 1 with 16 channels: eligible for winograd on AVX-512.
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c0", "data", 16, 3, 1),
                                conv("c1", "c0", 16, 3, 1), fc("fc", "c1", 4)},
                               {1, 2, 8, 8});
  for (const std::string algo : {"direct", "winograd", "im2col_gemm"}) {
    SCOPED_TRACE(algo);
    // oneDNN's winograd needs AVX-512: elsewhere the refusal says so, and
    // there is nothing to check (direct and im2col_gemm run everywhere).
    if (algo == "winograd") {
      if (const auto refused = conv_algorithm_refusal(g, {}, *backend_, algo, 3)) {
        std::printf("winograd not checked on this CPU: %s\n", refused->c_str());
        continue;
      }
    }
    check_gradients(g, algo);
  }
}

// Grouped (4 groups) and depthwise convolutions (stride 1 with a bias,
// stride 2 without, as MobileNet's), a pointwise 1x1 after them, with every
// algorithm that offers them (oneDNN's direct, im2col_gemm's per-group
// GEMMs; oneDNN's winograd has no groups).
TEST_F(NetworkTest, GroupedAndDepthwiseConvGradients) {
  LayerSpec grouped = conv("g", "c0", 16, 3, 1);
  grouped.groups = 4;
  LayerSpec dw1 = conv("dw1", "r0", 16, 3, 1);
  dw1.groups = 16;
  LayerSpec dw2 = conv("dw2", "dw1", 16, 3, 1, 2);
  dw2.groups = 16;
  dw2.bias = false;
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c0", "data", 8, 3, 1),
                                grouped, L("r0", LayerType::kRelu, {"g"}), dw1, dw2,
                                conv("pw", "dw2", 8, 1), fc("fc", "pw", 4)},
                               {1, 3, 9, 9});
  for (const std::string algo : {"direct", "im2col_gemm"}) {
    SCOPED_TRACE(algo);
    check_gradients(g, algo);
  }
}

// The network holds a grouped convolution's true parameter count
// (k * c / groups * r * s + k), the graph's, and its memory model's
// parameter and gradient tensors are that many floats.
TEST_F(NetworkTest, GroupedConvParametersAreCountedAtTheirTrueSize) {
  LayerSpec dw = conv("dw", "c0", 32, 3, 1);
  dw.groups = 32;
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c0", "data", 32, 1),
                                dw, fc("fc", "dw", 4)},
                               {1, 3, 8, 8});
  const Network net(g, *backend_, options(2, "direct"));
  const int64_t expected = (32 * 3 + 32) + (32 * 1 * 3 * 3 + 32) + (32 * 8 * 8 * 4 + 4);
  EXPECT_EQ(g.parameter_count(), expected);
  EXPECT_EQ(net.parameter_count(), expected);
  for (const memory::PersistentTensor& t : net.memory_model().persistent) {
    if (t.name == "params" || t.name == "grads") {
      EXPECT_EQ(t.bytes, static_cast<size_t>(expected) * sizeof(float)) << t.name;
    }
  }
}

TEST_F(NetworkTest, PoolingGradients) {
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
    SCOPED_TRACE(kind == PoolKind::kMax ? "max" : "average");
    const Graph g = Graph::build(
        {L("data", LayerType::kInput, {}), conv("c1", "data", 8, 3, 1),
         pool("p1", "c1", kind, 3, 2, 1), conv("c2", "p1", 16, 3, 1), pool("p2", "c2", kind, 2, 2),
         fc("fc", "p2", 5)},
        {1, 2, 9, 9});
    check_gradients(g);
  }
}

TEST_F(NetworkTest, GlobalPoolingGradients) {
  LayerSpec gp = L("gap", LayerType::kPool, {"c1"});
  gp.pool = PoolKind::kAverage;
  gp.global = true;
  const Graph g = Graph::build(
      {L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1), gp, fc("fc", "gap", 4)},
      {1, 3, 6, 6});
  check_gradients(g);
}

// A model may end in a global pool: its {n, classes, 1, 1} logits keep the
// pool's input layout (blocked, padded where the classes are not a whole
// number of blocks, or NHWC), which the loss reads as the plain scores.
TEST_F(NetworkTest, LogitsOfAGlobalPoolInTheirInputsLayoutTrain) {
  for (int64_t classes : {10, 16}) {
    SCOPED_TRACE(std::to_string(classes) + " classes");
    LayerSpec gp = L("gap", LayerType::kPool, {"c2"});
    gp.pool = PoolKind::kAverage;
    gp.global = true;
    const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                                  conv("c2", "c1", classes, 3, 1), gp},
                                 {1, 2, 6, 6});
    check_gradients(g);
  }
}

// What the trainer allocates after the network (the optimizer's state) is
// left free as the backend serves it, rounded up: the least device that
// holds the network's pool and the state holds both, and one byte less is
// refused by the network's plan, naming what does not fit, never by the
// optimizer's allocation after it.
TEST_F(NetworkTest, TheAllocationsAfterTheNetworkAreCountedAsTheBackendServesThem) {
  const Graph g = Graph::build(
      {L("data", LayerType::kInput, {}), conv("c1", "data", 3, 3, 1), fc("fc", "c1", 5)},
      {1, 1, 7, 7});
  NetworkOptions o = options(4, "direct");
  o.allocations_after_network = {Sgd::kStateBytesPerParameter};
  size_t least = 0;  // the device bytes the network and the optimizer's state take
  int64_t parameters = 0;
  {
    Network net(g, *backend_, o);
    parameters = net.parameter_count();
    least = backend_->device_bytes_in_use() +
            backend_->allocation_bytes(static_cast<size_t>(parameters) * sizeof(float));
  }
  // The case the rounding matters for: a state that is no whole number of
  // the backend's 64-byte units.
  ASSERT_NE(parameters * sizeof(float) % 64, 0u) << parameters;
  {
    const auto exact =
        make_backend({.kind = worker::BackendKind::kCpu, .threads = 2, .memory_limit = least});
    Network net(g, *exact, o);
    EXPECT_NO_THROW(Sgd(*exact, net.parameter_count(), 0.9f, 0.0f));
  }
  const auto less =
      make_backend({.kind = worker::BackendKind::kCpu, .threads = 2, .memory_limit = least - 1});
  const std::string message =
      test_support::error_message<memory::OutOfMemoryError>([&] { Network(g, *less, o); });
  EXPECT_NE(message.find("it fits a device.memory_limit of "), std::string::npos) << message;
  EXPECT_NE(message.find(" = " + std::to_string(least) + " bytes"), std::string::npos) << message;
}

// Whether memory fits is decided before conv.algorithm auto times anything:
// a model no schedule fits is refused as under a named algorithm, with the
// same error, without allocating the tensors its timing would take.
TEST_F(NetworkTest, AutoRefusesAModelTooBigBeforeTimingItsConvolutions) {
  const Graph g = Graph::build(
      {L("data", LayerType::kInput, {}), conv("c1", "data", 512, 5), fc("fc", "c1", 4)},
      {1, 1, 28, 28});
  // Room for the timing's tensors of c1 (input, output, input gradient,
  // weights), not for a step, which keeps its output and output gradient
  // beside the fc's input gradient.
  const auto device =
      make_backend({.kind = worker::BackendKind::kCpu, .threads = 2, .memory_limit = 40 << 20});
  const auto refusal = [&](const std::string& algorithm) {
    return test_support::error_message<memory::OutOfMemoryError>(
        [&] { Network(g, *device, options(16, algorithm)); });
  };
  const std::string direct = refusal("direct");
  EXPECT_NE(direct.find("memory.policy none: out of memory allocating '"), std::string::npos)
      << direct;
  device->reset_peak();
  EXPECT_EQ(refusal("auto"), direct);
  // c1's output alone, which the timing would have taken.
  const size_t output = size_t{16} * 512 * 24 * 24 * sizeof(float);
  EXPECT_LT(device->device_bytes_peak(), output);
}

TEST_F(NetworkTest, BatchNormGradients) {
  LayerSpec bn = L("bn", LayerType::kBatchNorm, {"c1"});
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                                bn, L("r", LayerType::kRelu, {"bn"}), fc("fc", "r", 4)},
                               {1, 2, 6, 6});
  check_gradients(g, "direct", 4);
}

TEST_F(NetworkTest, ResidualAddAccumulatesForkGradients) {
  // c1 feeds both c2 and the add: its gradient is the sum of two paths.
  const Graph g = Graph::build(
      {L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
       L("r1", LayerType::kRelu, {"c1"}), conv("c2", "r1", 16, 3, 1),
       L("sum", LayerType::kAdd, {"c2", "r1"}), fc("fc", "sum", 4)},
      {1, 2, 6, 6});
  check_gradients(g);
}

TEST_F(NetworkTest, ConcatGradientsIncludingUnalignedChannels) {
  // Branch widths 8, 16 and 5: slices that are and are not block-aligned,
  // and a tensor (r0) consumed by both a conv and the concat.
  const Graph g = Graph::build(
      {L("data", LayerType::kInput, {}), conv("c0", "data", 8, 3, 1),
       L("r0", LayerType::kRelu, {"c0"}), conv("a", "r0", 16, 1), conv("b", "r0", 5, 3, 1),
       L("cat", LayerType::kConcat, {"r0", "a", "b"}), fc("fc", "cat", 4)},
      {1, 3, 6, 6});
  check_gradients(g);
}

TEST_F(NetworkTest, SameSeedGivesBitwiseIdenticalTraining) {
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                                L("r1", LayerType::kRelu, {"c1"}),
                                pool("p", "r1", PoolKind::kMax, 2, 2), fc("fc", "p", 10)},
                               {1, 1, 12, 12});
  auto run = [&] {
    // A fixed algorithm: `auto` chooses by timing, which may differ between runs.
    Network net(g, *backend_, options(8, "direct"));
    net.init_parameters(5);
    Sgd sgd(*backend_, net.parameter_count(), 0.9f, 1e-4f);
    for (int step = 0; step < 5; ++step) {
      fill_batch(net, 8, 100 + step);
      net.train_step(8, 1.0f / 8);
      sgd.step(net.parameters(), net.gradients(), 0.05f);
    }
    return net.download_parameters();
  };
  EXPECT_EQ(run(), run());
}

TEST_F(NetworkTest, SmallerBatchUsesLeadingSamples) {
  const Graph g = Graph::build(
      {L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1), fc("fc", "c1", 3)},
      {1, 1, 5, 5});
  Network net(g, *backend_, options(6));
  net.init_parameters(1);
  fill_batch(net, 6, 9);
  const double loss4 = net.evaluate(4).loss_sum;
  const double loss6 = net.evaluate(6).loss_sum;
  EXPECT_LT(loss4, loss6);  // a sum over fewer positive per-sample losses
  EXPECT_GT(loss4, 0.0);
}

// The input prefetch on the CPU, the memory stream a thread of its own
// (test_support::check_input_prefetch; CudaBackendTest runs it on a GPU),
// also lazy: its copies happen only when waited for, so an upload that
// converted the staging without waiting for the prefetch's copy would
// convert the batch before.
TEST_F(NetworkTest, PrefetchedInputIsTheBatchUploaded) {
  for (const bool lazy : {false, true}) {
    const std::unique_ptr<Backend> b =
        make_backend({.kind = worker::BackendKind::kCpu, .threads = 2, .lazy_memory_stream = lazy});
    for (const common::Precision precision : {common::Precision::kFp32, common::Precision::kBf16}) {
      SCOPED_TRACE(std::string(common::precision_name(precision)) + (lazy ? ", lazy" : ""));
      if (b->precision_unavailable(precision)) continue;  // bf16 without the ISA
      test_support::check_input_prefetch(*b, precision);
    }
  }
}

TEST_F(NetworkTest, GradientHookSeesEveryParameterRangeOnce) {
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                                L("bn", LayerType::kBatchNorm, {"c1"}), fc("fc", "bn", 3)},
                               {1, 1, 5, 5});
  Network net(g, *backend_, options(2));
  net.init_parameters(1);
  fill_batch(net, 2, 1);
  std::vector<int> seen;
  net.on_gradients_ready = [&](const ParamRange& r) { seen.push_back(r.layer); };
  net.train_step(2, 0.5f);
  // Reverse graph order: fc, bn, c1.
  EXPECT_EQ(seen, (std::vector<int>{g.find("fc"), g.find("bn"), g.find("c1")}));
}

// ------------------------------------------------- micro-batched convolutions

// Every kind of one convolution, run as the given calls, on fixed inputs.
struct ConvResults {
  std::vector<float> y, dx, dx_accumulated, dw;
};

class MicroBatchTest : public NetworkTest {
 protected:
  // 7 images of 16x9x9 -> 16 channels, 3x3, pad 1: every CPU algorithm applies.
  ConvProblem problem() {
    const Layout layout = backend_->preferred_layout(16);
    ConvProblem p;
    p.x = {{7, 16, 9, 9}, layout};
    p.y = {{7, 16, 9, 9}, layout};
    p.k = 16;
    p.window.kernel_h = p.window.kernel_w = 3;
    p.window.pad_h = p.window.pad_w = 1;
    return p;
  }
  float* device_floats(const std::vector<float>& host, const TensorDesc& desc) {
    float* d = static_cast<float*>(backend_->allocate_device(desc.bytes()));
    owned_.push_back(d);
    if (!host.empty()) backend_->upload(host.data(), Tensor{desc, d});
    return d;
  }
  std::vector<float> random(int64_t count, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v) x = dist(rng);
    return v;
  }
  std::vector<float> download(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.shape().elements()));
    backend_->download(t, v.data());
    return v;
  }
  ConvResults run(const std::vector<ConvStep> (&steps)[3]) {
    const ConvProblem p = problem();
    const TensorDesc bdesc{{p.k + p.weight_shape().elements(), 1, 1, 1}, Layout::kPlain};
    ConvOperands o;
    o.x = {p.x, device_floats(random(p.x.shape.elements(), 1), p.x)};
    o.y = {p.y, device_floats({}, p.y)};
    o.dy = {p.y, device_floats(random(p.y.shape.elements(), 2), p.y)};
    o.dx = {p.x, device_floats({}, p.x)};
    float* w = device_floats(random(bdesc.shape.elements(), 3), bdesc);
    o.w = w;
    o.bias = w + p.weight_shape().elements();
    float* dw = device_floats(random(bdesc.shape.elements(), 4), bdesc);
    o.dw = dw;
    o.dbias = dw + p.weight_shape().elements();
    size_t ws = 0;
    for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
      for (const ConvStep& s : steps[static_cast<int>(kind)]) {
        for (bool accumulate : {false, true}) {
          const worker::ConvDesc op{kind, p.with_batch(s.size), s.algo, accumulate ? 1.0f : 0.0f};
          ws = std::max(ws, backend_->scratch_bytes(op).scratch);
        }
      }
    }
    void* workspace = ws ? backend_->allocate_device(ws) : nullptr;
    if (workspace) owned_.push_back(static_cast<float*>(workspace));
    ConvResults r;
    run_conv_kernel(*backend_, ConvKind::kForward, p, steps[0], o, 0.0f, workspace, ws);
    r.y = download(o.y);
    run_conv_kernel(*backend_, ConvKind::kBackwardData, p, steps[1], o, 0.0f, workspace, ws);
    r.dx = download(o.dx);
    run_conv_kernel(*backend_, ConvKind::kBackwardData, p, steps[1], o, 1.0f, workspace, ws);
    r.dx_accumulated = download(o.dx);
    // dW starts random: beta 0 must overwrite it on the first call only.
    run_conv_kernel(*backend_, ConvKind::kBackwardFilter, p, steps[2], o, 0.0f, workspace, ws);
    r.dw = download(Tensor{bdesc, dw});
    return r;
  }
  void TearDown() override {
    for (float* p : owned_) backend_->free_device(p);
  }
  std::vector<float*> owned_;
};

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (1.0 + std::abs(double(b[i]))));
  }
  EXPECT_LT(worst, 1e-4) << what;
}

TEST_F(MicroBatchTest, EveryKindAndAlgorithmMicroBatchedEqualsUndivided) {
  const ConvProblem p = problem();
  int compared = 0;
  for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    const auto algos = conv_algorithms(*backend_, kind, p, kind == ConvKind::kBackwardData);
    ASSERT_GE(algos.size(), 2u) << conv_kind_name(kind);
    for (const ConvAlgoInfo& a : algos) {
      // The reference runs every kind undivided with the same algorithm;
      // the other kinds keep the first algorithm in both runs.
      std::vector<ConvStep> whole[3], split[3];
      for (int k = 0; k < 3; ++k) {
        const ConvAlgo algo = k == static_cast<int>(kind) ? a.algo : 0;
        whole[k] = {{algo, 7}};
        split[k] = {{algo, 3}, {algo, 2}, {algo, 2}};
      }
      const ConvResults ref = run(whole), got = run(split);
      const std::string what = std::string(conv_kind_name(kind)) + " " + a.name;
      expect_close(got.y, ref.y, (what + " y").c_str());
      expect_close(got.dx, ref.dx, (what + " dx").c_str());
      expect_close(got.dx_accumulated, ref.dx_accumulated, (what + " dx, beta 1").c_str());
      expect_close(got.dw, ref.dw, (what + " dW and dbias").c_str());
      ++compared;
    }
  }
  EXPECT_GE(compared, 6);
}

TEST_F(MicroBatchTest, MixedAlgorithmsAndRepeatedCallsCoverTheBatch) {
  const ConvProblem p = problem();
  std::vector<ConvStep> whole[3], mixed[3];
  for (int k = 0; k < 3; ++k) {
    const auto algos = conv_algorithms(*backend_, static_cast<ConvKind>(k), p, k == 1);
    whole[k] = {{algos[0].algo, 7}};
    // 2 + 2 + 2 + 1: the pattern repeats and the last call is cut.
    mixed[k] = {{algos.back().algo, 2}, {algos[0].algo, 2}};
  }
  const ConvResults ref = run(whole), got = run(mixed);
  expect_close(got.y, ref.y, "y");
  expect_close(got.dx, ref.dx, "dx");
  expect_close(got.dw, ref.dw, "dW");
}

TEST_F(MicroBatchTest, TooSmallAWorkspaceIsAClearError) {
  const ConvProblem p = problem();
  for (const ConvAlgoInfo& a : conv_algorithms(*backend_, ConvKind::kBackwardFilter, p, false)) {
    if (a.workspace_bytes == 0) continue;
    const std::vector<ConvStep> steps{{a.algo, 7}};
    ConvOperands o;
    const std::string msg = [&] {
      try {
        run_conv_kernel(*backend_, ConvKind::kBackwardFilter, p, steps, o, 0.0f, nullptr, 0);
      } catch (const BackendError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    }();
    EXPECT_NE(msg.find("needs " + std::to_string(a.workspace_bytes) + " bytes"),
              std::string::npos)
        << msg;
    return;
  }
  GTEST_SKIP() << "no CPU algorithm needs a workspace for this problem";
}

// A network run from a plan (micro-batches, each kernel in its own segment)
// trains like the undivided network.
TEST_F(NetworkTest, PlannedMicroBatchesTrainLikeUndivided) {
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                                L("r1", LayerType::kRelu, {"c1"}), conv("c2", "r1", 16, 3, 1),
                                pool("p", "c2", PoolKind::kMax, 2, 2), fc("fc", "p", 10)},
                               {1, 3, 8, 8});
  auto train = [&](const NetworkOptions& o) {
    Network net(g, *backend_, o);
    net.init_parameters(5);
    Sgd sgd(*backend_, net.parameter_count(), 0.9f, 0.0f);
    for (int step = 0; step < 3; ++step) {
      fill_batch(net, 6, 200 + step);
      net.train_step(6, 1.0f / 6);
      sgd.step(net.parameters(), net.gradients(), 0.05f);
    }
    return net.download_parameters();
  };
  NetworkOptions planned = options(6, "direct");
  uint64_t offset = 0;
  for (const char* layer : {"c1", "c2"}) {
    ConvLayerExecution e;
    e.layer = layer;
    for (auto& k : e.kernels) {
      k.calls = {{"direct", 4}, {"im2col_gemm", 2}};
      k.workspace_offset = offset;
      k.workspace_bytes = 1 << 20;
      offset += k.workspace_bytes;
    }
    planned.conv_executions.push_back(e);
  }
  planned.conv_workspace_bytes = offset;
  const std::vector<float> ref = train(options(6, "direct")), got = train(planned);
  expect_close(got, ref, "parameters after 3 steps");
  Network net(g, *backend_, planned);
  EXPECT_NE(net.algorithm_summary()[0].find("Forward=[direct x4 + im2col_gemm x2]"),
            std::string::npos)
      << net.algorithm_summary()[0];
}

TEST_F(NetworkTest, PlanThatDoesNotMatchTheModelIsAClearError) {
  const Graph g = Graph::build(
      {L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1), fc("fc", "c1", 3)},
      {1, 1, 5, 5});
  auto error = [&](const NetworkOptions& o) {
    try {
      Network net(g, *backend_, o);
    } catch (const BackendError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  NetworkOptions o = options(4, "direct");
  ConvLayerExecution e;
  e.layer = "c1";
  for (auto& k : e.kernels) k = {{{"direct", 4}}, 0, 1 << 16};
  o.conv_workspace_bytes = 1 << 16;
  o.conv_executions = {e};
  EXPECT_EQ(error(o), "no error");
  o.conv_executions[0].layer = "fc";
  EXPECT_NE(error(o).find("'fc', which is not a conv layer"), std::string::npos) << error(o);
  o.conv_executions[0] = e;
  o.conv_executions[0].kernels[2].calls[0].algorithm = "fft";
  EXPECT_NE(error(o).find("algorithm 'fft' is not offered"), std::string::npos) << error(o);
  o.conv_executions[0] = e;
  o.conv_executions[0].kernels[1].workspace_offset = 1;
  EXPECT_NE(error(o).find("lies outside the plan's workspace"), std::string::npos) << error(o);
  o.conv_executions[0] = e;
  o.conv_executions[0].kernels[0].calls[0].size = 9;
  EXPECT_NE(error(o).find("a call of 9 images"), std::string::npos) << error(o);
}

TEST_F(NetworkTest, LrSchedules) {
  LrSchedule s{{.lr = 0.1, .schedule = ScheduleKind::kStep, .step_epochs = 2, .gamma = 0.5},
               /*steps_per_epoch=*/10,
               /*total_steps=*/100};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(19), 0.1);
  EXPECT_DOUBLE_EQ(s.at(20), 0.05);
  EXPECT_DOUBLE_EQ(s.at(45), 0.025);
  s.schedule = ScheduleKind::kCosine;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_NEAR(s.at(50), 0.05, 1e-12);
  EXPECT_NEAR(s.at(100), 0.0, 1e-12);
  s.schedule = ScheduleKind::kNone;
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(s.at(0), 0.025);
  EXPECT_DOUBLE_EQ(s.at(3), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 0.1);
  EXPECT_EQ(parse_schedule_kind("cosine"), ScheduleKind::kCosine);
  EXPECT_THROW(parse_schedule_kind("linear"), std::invalid_argument);
}

// The registry is a table indexed by LayerType: every type has a name and a
// factory, and that factory builds a layer of its own type, which reaches
// the conv- or relu-specific interface exactly when it is one.
TEST_F(NetworkTest, EveryLayerTypeHasANameAndARegistryEntry) {
  LayerSpec bn = L("bn", LayerType::kBatchNorm, {"c1"});
  const Graph g = Graph::build(
      {L("data", LayerType::kInput, {}), conv("c1", "data", 8, 3, 1), bn,
       L("r1", LayerType::kRelu, {"bn"}), pool("p1", "r1", PoolKind::kMax, 2, 2),
       conv("c2", "p1", 8, 1), L("sum", LayerType::kAdd, {"c2", "p1"}),
       L("cat", LayerType::kConcat, {"sum", "p1"}), L("silu", LayerType::kSilu, {"cat"}),
       L("gelu", LayerType::kGelu, {"silu"}), L("sigmoid", LayerType::kSigmoid, {"gelu"}),
       L("relu6", LayerType::kRelu6, {"sigmoid"}), L("mul", LayerType::kMul, {"relu6", "cat"}),
       L("dropout", LayerType::kDropout, {"mul"}), fc("fc", "dropout", 3)},
      {1, 2, 6, 6});
  const std::vector<TensorDesc> descs = activation_descs(g, {}, *backend_, 2);
  const std::string algorithm = "direct";
  std::vector<bool> built(kLayerTypeCount, false);
  for (int i = 0; i < g.size(); ++i) {
    const std::vector<int>& in = g.inputs(i);
    const LayerSite site{g, i, *backend_, in.empty() ? nullptr : &descs[in[0]], descs[i],
                         algorithm, nullptr};
    const LayerType type = g.layer(i).type;
    const std::unique_ptr<Layer> layer = make_layer(site);
    ASSERT_NE(layer, nullptr) << g.layer(i).name;
    EXPECT_EQ(layer->spec().type, type);
    EXPECT_EQ(layer->as_conv() != nullptr, type == LayerType::kConv) << g.layer(i).name;
    EXPECT_EQ(std::as_const(*layer).as_conv() != nullptr, type == LayerType::kConv);
    EXPECT_EQ(layer->as_relu() != nullptr, type == LayerType::kRelu) << g.layer(i).name;
    built[static_cast<size_t>(type)] = true;
  }
  for (size_t i = 0; i < kLayerTypeCount; ++i) {
    const LayerType type = static_cast<LayerType>(i);
    EXPECT_EQ(kLayerTypeNames[i].value, type);
    EXPECT_STRNE(layer_type_name(type), "?") << "LayerType " << i << " has no name";
    EXPECT_EQ(parse_layer_type(layer_type_name(type)), type);
    EXPECT_NE(layer_factory(type), nullptr) << layer_type_name(type);
    EXPECT_TRUE(built[i]) << "the graph above has no " << layer_type_name(type) << " layer";
  }
}

TEST_F(NetworkTest, KernelTimingRunsTheWarmupThenTheRepeats) {
  int runs = 0;
  auto count = [&] { ++runs; };
  const KernelTime median = time_kernel(*backend_, {2, 5, TimingStatistic::kMedian}, count);
  EXPECT_EQ(runs, 7);
  EXPECT_GE(median.seconds, 0.0);
  EXPECT_GE(median.iqr_seconds, 0.0);
  runs = 0;
  const KernelTime fastest = time_kernel(*backend_, {0, 4, TimingStatistic::kMin}, count);
  EXPECT_EQ(runs, 4) << "no warm-up asked for";
  EXPECT_GE(fastest.seconds, 0.0);
  runs = 0;
  time_kernel(*backend_, {1, 0, TimingStatistic::kMin}, count);
  EXPECT_EQ(runs, 2) << "at least one timed run";
}

}  // namespace
}  // namespace vtrain::worker
