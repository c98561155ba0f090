// The costs the timed memory simulator takes, measured in place
// (worker/engine/layer_timing.h): per-layer forward and backward times, the
// loss, the memory stream's bandwidth; how backward calls write gradients
// (beta, scratch) as a training step does; what a too-small device says.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "memory/memory_error.h"
#include "tests/engine_support.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/layers/layer.h"
#include "worker/engine/network.h"

namespace vtrain::worker {
namespace {

using test_support::layer_spec;

constexpr KernelTimingOptions kQuick{0, 1, TimingStatistic::kMedian};

// Every layer type, a fork (r1 feeds c2 and the add) and two joins.
Graph every_type() {
  LayerSpec p1 = layer_spec("p1", LayerType::kPool, {"cat"}, 0, 2);
  p1.stride_h = p1.stride_w = 2;
  p1.pad_h = p1.pad_w = 0;
  return Graph::build({layer_spec("data", LayerType::kInput, {}),
                       layer_spec("c1", LayerType::kConv, {"data"}, 8, 3),
                       layer_spec("bn1", LayerType::kBatchNorm, {"c1"}),
                       layer_spec("r1", LayerType::kRelu, {"bn1"}),
                       layer_spec("c2", LayerType::kConv, {"r1"}, 8, 3),
                       layer_spec("sum", LayerType::kAdd, {"c2", "r1"}),
                       layer_spec("cat", LayerType::kConcat, {"sum", "r1"}), p1,
                       layer_spec("fc", LayerType::kFc, {"p1"}, 5)},
                      {1, 3, 8, 8});
}

TEST(LayerTiming, OneEntryPerLayerEachPositiveButTheData) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = every_type();
  const size_t before = backend->device_bytes_in_use();
  const CopyBandwidth bandwidth{1e9, 2e9, 4096};
  const memory::StepCosts costs =
      measure_graph_step_costs(graph, {}, *backend, 4, bandwidth, "auto", kQuick);
  test_support::expect_every_layer_timed(graph, costs);
  EXPECT_EQ(costs.to_host_bytes_per_second, 1e9);
  EXPECT_EQ(costs.to_device_bytes_per_second, 2e9);
  // Every buffer went back (the ops' own scratch, which only grows, aside).
  EXPECT_EQ(backend->device_bytes_in_use(), before + backend->scratch_reserved());
}

TEST(LayerTiming, AConvolutionTakesLongerThanTheReluOfItsOutput) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = Graph::build(
      {layer_spec("data", LayerType::kInput, {}),
       layer_spec("conv", LayerType::kConv, {"data"}, 64, 3),
       layer_spec("relu", LayerType::kRelu, {"conv"}),
       layer_spec("fc", LayerType::kFc, {"relu"}, 10)},
      {64, 32, 32});
  // 64 x 64 x 9 multiply-adds per output element against one comparison.
  const memory::StepCosts costs =
      measure_graph_step_costs(graph, {}, *backend, 4, {}, "auto", {1, 3, TimingStatistic::kMedian});
  EXPECT_GT(costs.forward_seconds[1], costs.forward_seconds[2]);
  EXPECT_GT(costs.backward_seconds[1], costs.backward_seconds[2]);
}

TEST(LayerTiming, CopyBandwidthIsPositiveEachWayAndFitsTheDevice) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const CopyBandwidth b = measure_copy_bandwidth(*backend, size_t{1} << 20, 3);
  EXPECT_GT(b.to_host_bytes_per_second, 0);
  EXPECT_GT(b.to_device_bytes_per_second, 0);
  EXPECT_EQ(b.bytes, size_t{1} << 20);
  EXPECT_GE(b.compute_share, 0);
  EXPECT_LE(b.compute_share, 1);
  // Nothing is kept but the backend's own scratch (the product's weights
  // in the primitive's format).
  EXPECT_EQ(backend->device_bytes_in_use(), backend->scratch_reserved());
  EXPECT_LE(backend->scratch_reserved(), size_t{128} << 10);

  // Under a 64 KiB device the copies shrink to what is free beside the
  // compute share's product (in at most half of it).
  auto small =
      make_backend({.kind = worker::BackendKind::kCpu, .threads = 1, .memory_limit = 64 << 10});
  const size_t copied = measure_copy_bandwidth(*small, size_t{1} << 20, 1).bytes;
  EXPECT_GE(copied, size_t{16} << 10);
  EXPECT_LT(copied, size_t{64} << 10);
  EXPECT_EQ(small->device_bytes_in_use(), small->scratch_reserved());
  auto tiny = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1, .memory_limit = 1024});
  // What the smallest product needs depends on the ISA's weight format.
  const std::string message = test_support::error_message<memory::OutOfMemoryError>(
      [&] { measure_copy_bandwidth(*tiny, size_t{1} << 20, 1); });
  EXPECT_TRUE(message.starts_with("measuring the copy bandwidth needs ")) << message;
  EXPECT_TRUE(message.ends_with(" KiB of device memory and the device has 1.0 KiB free "
                                "(device.memory_limit or its memory)"))
      << message;
  EXPECT_THROW(measure_copy_bandwidth(*backend, 0, 1), std::invalid_argument);
  EXPECT_THROW(measure_copy_bandwidth(*backend, 4096, 0), std::invalid_argument);

  // Step costs carry the copies' three figures, and give them back.
  const CopyBandwidth made{.to_host_bytes_per_second = 1e9,
                           .to_device_bytes_per_second = 2e9,
                           .bytes = 4096,
                           .compute_share = 0.37};
  const memory::StepCosts costs = with_copies({}, made);
  EXPECT_EQ(costs.to_host_bytes_per_second, 1e9);
  EXPECT_EQ(costs.to_device_bytes_per_second, 2e9);
  EXPECT_EQ(costs.copy_compute_share, 0.37);
  const CopyBandwidth back = copies_of(costs);
  EXPECT_EQ(back.to_host_bytes_per_second, 1e9);
  EXPECT_EQ(back.to_device_bytes_per_second, 2e9);
  EXPECT_EQ(back.compute_share, 0.37);
}

TEST(LayerTiming, ATooSmallDeviceNamesTheLayerAlikeEveryTimeAndKeepsNothing) {
  const Graph graph = every_type();
  auto failure = [&] {
    // Room for a layer's tensors at batch 1, not at batch 64. Which layer
    // runs out first depends on the CPU: oneDNN blocks channels by 16 on
    // AVX-512 (c1's 3 input channels take 16) and by 8 on AVX2 (bn1 first).
    auto backend =
        make_backend({.kind = worker::BackendKind::kCpu, .threads = 1, .memory_limit = 256 << 10});
    const std::string message = test_support::error_message<memory::OutOfMemoryError>(
        [&] { measure_graph_step_costs(graph, {}, *backend, 64, {}, "direct", kQuick); });
    EXPECT_EQ(backend->device_bytes_in_use(), backend->scratch_reserved());
    return message;
  };
  const std::string first = failure();
  EXPECT_EQ(first, failure());
  std::smatch named;
  ASSERT_TRUE(std::regex_search(first, named,
                                std::regex("measuring the step costs: layer '([^']+)' at batch 64 needs ")))
      << first;
  const std::vector<LayerSpec>& layers = graph.layers();
  EXPECT_TRUE(std::any_of(layers.begin() + 1, layers.end(),
                          [&](const LayerSpec& l) { return l.name == named[1].str(); }))
      << first;
  EXPECT_CONTAINS(first, " free (device.memory_limit or its memory): cpu device out of memory");
}

// A layer that records how its backward's input gradients are written.
class RecordingLayer final : public Layer {
 public:
  RecordingLayer(const LayerSpec& spec, bool can_add) : Layer(spec), can_add_(can_add) {}
  int64_t param_count() const override { return 4; }
  size_t state_bytes() const override { return 64; }
  void bind_state(void* state) override { state_ = state; }
  void forward(LayerCall&, bool training) override {
    saw_storage = params() != nullptr && grads() != nullptr && state_ != nullptr;
    trained = training;
  }
  void backward(LayerCall& call) override {
    writes.clear();
    scratch = call.scratch_like(call.in[0]).data;
    for (int k = 0; k < static_cast<int>(call.in.size()); ++k) {
      needs_grad.push_back(call.needs_grad(k));
      call.emit_grad(k, can_add_, [&](const Tensor& dx, float beta) {
        writes.push_back({dx.data, beta});
      });
    }
  }
  bool bound() const { return params() != nullptr || state_ != nullptr; }

  std::vector<std::pair<const void*, float>> writes;  // of the last backward
  std::vector<bool> needs_grad;
  const void* scratch = nullptr;
  bool saw_storage = false, trained = false;

 private:
  bool can_add_;
  void* state_ = nullptr;
};

TEST(LayerTiming, BackwardWritesGradientsAsATrainingStepDoes) {
  // c1 feeds a and b; b's backward runs first and writes c1's gradient, so
  // a adds to it: with beta 1 where it can, else beside it in scratch.
  const Graph graph = Graph::build(
      {layer_spec("data", LayerType::kInput, {}),
       layer_spec("c1", LayerType::kConv, {"data"}, 2, 1),
       layer_spec("a", LayerType::kRelu, {"c1"}), layer_spec("b", LayerType::kRelu, {"c1"}),
       layer_spec("sum", LayerType::kAdd, {"a", "b"}),
       layer_spec("fc", LayerType::kFc, {"sum"}, 3)},
      {1, 4, 4});
  for (const bool a_can_add : {false, true}) {
    auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
    std::vector<std::unique_ptr<Layer>> layers;
    std::vector<RecordingLayer*> rec;
    for (int i = 0; i < graph.size(); ++i) {
      layers.push_back(std::make_unique<RecordingLayer>(graph.layer(i), i != 2 || a_can_add));
      rec.push_back(static_cast<RecordingLayer*>(layers.back().get()));
    }
    measure_step_costs(graph, layers, activation_descs(graph, {}, *backend, 2), *backend, 2, {},
                       kQuick);
    // c1's input is the data: no gradient is written.
    EXPECT_EQ(rec[1]->needs_grad, std::vector<bool>{false});
    EXPECT_TRUE(rec[1]->writes.empty());
    // b, the later consumer, writes first: beta 0, into the gradient.
    ASSERT_EQ(rec[3]->writes.size(), 1u);
    EXPECT_EQ(rec[3]->writes[0].second, 0.0f);
    EXPECT_NE(rec[3]->writes[0].first, rec[3]->scratch);
    ASSERT_EQ(rec[2]->writes.size(), 1u);
    EXPECT_EQ(rec[2]->writes[0].second, a_can_add ? 1.0f : 0.0f);
    EXPECT_EQ(rec[2]->writes[0].first == rec[2]->scratch, !a_can_add);
    EXPECT_NE(rec[2]->scratch, nullptr);
    // The add writes each of its inputs' gradients once, beta 0.
    ASSERT_EQ(rec[4]->writes.size(), 2u);
    EXPECT_EQ(rec[4]->writes[1].second, 0.0f);
    for (int i = 1; i < graph.size(); ++i) {
      EXPECT_TRUE(rec[i]->saw_storage && rec[i]->trained) << graph.layer(i).name;
      EXPECT_FALSE(rec[i]->bound()) << graph.layer(i).name << " is still bound";
    }
    EXPECT_EQ(backend->device_bytes_in_use(), backend->scratch_reserved());
  }
}

TEST(LayerTiming, MismatchedInputsAreRefused) {
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = every_type();
  std::vector<std::unique_ptr<Layer>> none;
  EXPECT_THROW(measure_step_costs(graph, none, activation_descs(graph, {}, *backend, 1), *backend, 1,
                                  {}, kQuick),
               std::invalid_argument);
}

}  // namespace
}  // namespace vtrain::worker
