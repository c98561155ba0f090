// Network-level tests: finite-difference gradient checks through small
// graphs for every layer type (each check covers the layer's parameter
// gradient and, through the layers below it, every backward-data path), fork
// and join accumulation, every convolution algorithm, and determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "worker/backend.h"
#include "worker/graph.h"
#include "worker/network.h"
#include "worker/optimizer.h"

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

class NetworkTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = make_backend({.kind = "cpu", .threads = 2}); }

  // Writes a deterministic random batch and labels into the network.
  void fill_batch(Network& net, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const Tensor in = net.input(n);
    std::vector<float> x(static_cast<size_t>(in.shape().elements()));
    for (float& v : x) v = dist(rng);
    backend_->upload(x.data(), in);
    std::vector<int32_t> labels(static_cast<size_t>(n));
    for (auto& l : labels) l = static_cast<int32_t>(rng() % net.graph().classes());
    backend_->upload_labels(labels.data(), net.labels(), n);
  }

  // Compares every parameter range's analytic gradient with central
  // differences on a sample of its entries.
  void check_gradients(const Graph& graph, const std::string& algorithm = "auto",
                       int64_t n = 3) {
    Network net(graph, *backend_, {.max_batch = n, .conv_algorithm = algorithm});
    net.init_parameters(7);
    fill_batch(net, n, 11);
    const float scale = 1.0f / static_cast<float>(n);
    net.train_step(n, scale);
    const std::vector<float> grads = [&] {
      std::vector<float> g(static_cast<size_t>(net.parameter_count()));
      backend_->download(Tensor{{{net.parameter_count(), 1, 1, 1}}, net.gradients()}, g.data());
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
        const int64_t i = r.offset + static_cast<int64_t>(pick() % r.count);
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

TEST_F(NetworkTest, EveryConvolutionAlgorithmGivesTheSameGradients) {
  // 3x3 stride 1 with 16 channels: eligible for winograd on AVX-512.
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c0", "data", 16, 3, 1),
                                conv("c1", "c0", 16, 3, 1), fc("fc", "c1", 4)},
                               {1, 2, 8, 8});
  for (const std::string algo : {"direct", "winograd", "im2col_gemm"}) {
    SCOPED_TRACE(algo);
    check_gradients(g, algo);
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

TEST_F(NetworkTest, BatchNormGradients) {
  LayerSpec bn = L("bn", LayerType::kBatchNorm, {"c1"});
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                                bn, L("r", LayerType::kRelu, {"bn"}), fc("fc", "r", 4)},
                               {1, 2, 6, 6});
  check_gradients(g, "auto", 4);
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
    Network net(g, *backend_, {.max_batch = 8, .conv_algorithm = "direct"});
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
  Network net(g, *backend_, {.max_batch = 6});
  net.init_parameters(1);
  fill_batch(net, 6, 9);
  const double loss4 = net.evaluate(4).loss_sum;
  const double loss6 = net.evaluate(6).loss_sum;
  EXPECT_LT(loss4, loss6);  // a sum over fewer positive per-sample losses
  EXPECT_GT(loss4, 0.0);
}

TEST_F(NetworkTest, GradientHookSeesEveryParameterRangeOnce) {
  const Graph g = Graph::build({L("data", LayerType::kInput, {}), conv("c1", "data", 16, 3, 1),
                                L("bn", LayerType::kBatchNorm, {"c1"}), fc("fc", "bn", 3)},
                               {1, 1, 5, 5});
  Network net(g, *backend_, {.max_batch = 2});
  net.init_parameters(1);
  fill_batch(net, 2, 1);
  std::vector<int> seen;
  net.on_gradients_ready = [&](const ParamRange& r) { seen.push_back(r.layer); };
  net.train_step(2, 0.5f);
  // Reverse graph order: fc, bn, c1.
  EXPECT_EQ(seen, (std::vector<int>{g.find("fc"), g.find("bn"), g.find("c1")}));
}

TEST_F(NetworkTest, LrSchedules) {
  LrSchedule s{.base_lr = 0.1, .kind = "step", .step_epochs = 2, .gamma = 0.5,
               .steps_per_epoch = 10, .total_steps = 100};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(19), 0.1);
  EXPECT_DOUBLE_EQ(s.at(20), 0.05);
  EXPECT_DOUBLE_EQ(s.at(45), 0.025);
  s.kind = "cosine";
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_NEAR(s.at(50), 0.05, 1e-12);
  EXPECT_NEAR(s.at(100), 0.0, 1e-12);
  s.kind = "none";
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(s.at(0), 0.025);
  EXPECT_DOUBLE_EQ(s.at(3), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 0.1);
  s.kind = "linear";
  EXPECT_THROW(s.at(0), std::invalid_argument);
}

}  // namespace
}  // namespace vtrain::worker
