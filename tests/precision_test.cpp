// train.precision in the engine: a bf16 network stores its activations in
// half the bytes (the memory model, the plans and the pool count them), its
// memory plans keep their numbers and their predicted peak, training in bf16
// follows fp32 closely without being fp32, and its fp32 master weights
// resume in fp32. Every test needs a backend that runs bf16 and skips,
// saying why, where the CPU has no native bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "memory/planner.h"
#include "memory/vdnn_plan.h"
#include "tests/engine_runs.h"
#include "tests/test_support.h"
#include "worker/data/data.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/profile/step_costs.h"
#include "worker/train/checkpoint.h"
#include "worker/train/trainer.h"

namespace vtrain {
namespace {

using common::Precision;
using memory::Policy;
using test_support::bitwise_equal;
using test_support::relative_difference;
using test_support::TrainRun;

worker::Graph graph_of(const std::string &preset, int64_t side) {
  const worker::Shape input{1, 3, side, side};
  return worker::Graph::build(worker::preset_layers(preset, {input, 10}), input);
}

class Bf16Test : public ::testing::Test {
protected:
  void SetUp() override {
    // One thread: the same floating-point path on every run.
    backend_ = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
    if (std::optional<std::string> why =
            backend_->precision_unavailable(Precision::kBf16)) {
      GTEST_SKIP() << *why;
    }
  }
  // Networks in bf16 unless `precision` says otherwise.
  static worker::NetworkOptions options(Precision precision = Precision::kBf16,
                                        Policy policy = Policy::kNone) {
    worker::NetworkOptions o;
    o.settings.precision = precision;
    o.max_batch = 4;
    o.conv_algorithm = "direct";
    o.memory_policy = policy;
    o.poison_freed = policy != Policy::kNone;
    return o;
  }
  std::unique_ptr<worker::Backend> backend_;
};

// Every activation takes half its fp32 bytes in the memory model (blocked
// layouts pad the same channels in both), and the parameters the conv and
// fc kernels read gain one half copy beside the fp32 master copy,
// gradients and buffers; batch norm's, read in f32, none.
TEST_F(Bf16Test, ActivationsTakeHalfTheBytesAndTheWeightsGainAHalfCopy) {
  const worker::Graph graph = graph_of("resnet18", 8);
  const worker::Network a(graph, *backend_, options(Precision::kFp32));
  const worker::Network b(graph, *backend_, options());
  const memory::MemoryModel &ma = a.memory_model();
  const memory::MemoryModel &mb = b.memory_model();
  ASSERT_EQ(ma.layers.size(), mb.layers.size());
  for (size_t i = 0; i < ma.layers.size(); ++i) {
    EXPECT_EQ(mb.layers[i].output_bytes * 2, ma.layers[i].output_bytes)
        << ma.layers[i].name;
  }
  auto bytes_of = [](const memory::MemoryModel &m,
                     const std::string &name) -> size_t {
    for (const auto &[what, bytes] : m.persistent) {
      if (what == name)
        return bytes;
    }
    return 0;
  };
  EXPECT_EQ(bytes_of(ma, "compute_params"), 0u);
  // Half the bytes of the conv and fc ranges, plus the padding that starts
  // each 128-byte aligned.
  const size_t ranges = b.param_ranges().size();
  size_t copied = 0, copied_ranges = 0, batch_norms = 0;
  for (size_t i = 0; i < ranges; ++i) {
    const worker::ParamRange &r = b.param_ranges()[i];
    if (graph.layer(r.layer).type == worker::LayerType::kBatchNorm) {
      EXPECT_EQ(b.compute_offset(i), -1) << graph.layer(r.layer).name;
      ++batch_norms;
      continue;
    }
    EXPECT_EQ(b.compute_offset(i) * 2 % worker::Network::kComputeAlignBytes, 0)
        << i;
    copied += static_cast<size_t>(r.count);
    ++copied_ranges;
  }
  EXPECT_GT(batch_norms, 0u);
  EXPECT_GE(bytes_of(mb, "compute_params"), copied * 2);
  EXPECT_LT(bytes_of(mb, "compute_params"),
            copied * 2 + copied_ranges * worker::Network::kComputeAlignBytes);
  EXPECT_EQ(bytes_of(mb, "params"), bytes_of(ma, "params"));
  EXPECT_EQ(bytes_of(mb, "grads"), bytes_of(ma, "grads"));
}

// As in fp32 (recompute_test): keeping, offloading or recomputing
// activations changes no number, and the simulated peak is the measured one.
TEST_F(Bf16Test, MemoryPlansKeepTheNumbersAndPredictThePeak) {
  const worker::Graph graph = graph_of("resnet18", 8);
  const TrainRun none = test_support::train_steps(*backend_, graph, options());
  const memory::MemoryModel model =
      worker::Network(graph, *backend_, options()).memory_model();
  const std::vector<bool> can = memory::plannable(model);
  std::vector<memory::TensorAction> actions(model.layers.size(),
                                            memory::TensorAction::kKeep);
  int k = 0;
  for (size_t l = 0; l < actions.size(); ++l) {
    if (!can[l])
      continue;
    actions[l] = ++k % 3 == 0 ? memory::TensorAction::kOffload
                 : k % 3 == 1 ? memory::TensorAction::kRecompute
                              : memory::TensorAction::kKeep;
  }
  worker::NetworkOptions o = options();
  o.memory_actions = actions;
  o.poison_freed = true;
  const TrainRun planned = test_support::train_steps(*backend_, graph, o);
  EXPECT_TRUE(bitwise_equal(none.params, planned.params));
  EXPECT_TRUE(bitwise_equal(none.buffers, planned.buffers));
  EXPECT_LT(planned.stats.step_peak, none.stats.step_peak);
  EXPECT_EQ(planned.stats.predicted_peak, planned.stats.step_peak);
  EXPECT_GT(planned.stats.offloaded_bytes, 0u);
}

// The same steps in bf16 end near fp32's weights (activations rounded to 8
// significant bits, fp32 master weights) but not on them: bf16 is real.
// vgg-small: without batch norm. Behind batch norm a conv's weight gradient
// is a sum that mostly cancels (batch norm's dx has zero mean and no
// component along x-hat per channel), which amplifies the rounding of its
// terms: ResNet-18 at 16x16, batch 4, differs from fp32 by 0.28 of the
// largest weight after one step here, and PyTorch's CPU autocast to bf16 by
// 0.58 on the same setup.
TEST_F(Bf16Test, StepsFollowFp32WithoutBeingFp32) {
  const worker::Graph graph = graph_of("vgg-small", 16);
  const TrainRun fp32 =
      test_support::train_steps(*backend_, graph, options(Precision::kFp32), 3);
  const TrainRun bf16 = test_support::train_steps(*backend_, graph, options(), 3);
  ASSERT_EQ(fp32.params.size(), bf16.params.size());
  const double d = relative_difference(fp32.params, bf16.params);
  EXPECT_GT(d, 0.0);
  EXPECT_LT(d, 2e-2);
}

worker::TrainerOptions trainer_options(const std::string &checkpoint_dir,
                                       int64_t epochs,
                                       Precision precision = Precision::kFp32) {
  worker::TrainerOptions o;
  o.settings.precision = precision;
  o.conv_algorithm = "direct";
  o.train.batch = 32;
  o.train.epochs = epochs;
  o.schedule.lr = 0.05;
  o.optimizer.momentum = 0.9f;
  o.train.evaluate = false;
  o.progress = worker::Progress::Mode::kOff;
  o.checkpoint.dir = checkpoint_dir;
  return o;
}

// LeNet learns in bf16 as in fp32, and its checkpoint (fp32 master weights)
// continues in fp32: the precision is not part of the model's signature.
TEST_F(Bf16Test, LeNetLearnsAndItsCheckpointResumesInFp32) {
  const worker::Shape input{1, 1, 16, 16};
  const worker::Dataset train = worker::make_synthetic(input, 4, 768, 3);
  const worker::Graph lenet =
      worker::Graph::build(worker::preset_layers("lenet", {input, 4}), input);
  test_support::TempDir dir;
  const worker::ChannelStats norm = worker::channel_stats(train);
  const worker::TrainResult half =
      worker::train(lenet, *backend_, train, {}, norm,
                    trainer_options(dir.path("ck"), 2, Precision::kBf16));
  const worker::TrainResult full =
      worker::train(lenet, *backend_, train, {}, norm, trainer_options("", 2));
  ASSERT_EQ(half.steps, 48);
  const auto mean = [](const std::vector<double> &v, size_t first) {
    double sum = 0;
    for (size_t i = first; i < first + 8; ++i)
      sum += v[i];
    return sum / 8;
  };
  const double first = mean(half.step_losses, 0),
               last = mean(half.step_losses, 40);
  EXPECT_LT(last, 0.5 * first)
      << "bf16 loss did not fall: first " << first << ", last " << last;
  EXPECT_NEAR(first, mean(full.step_losses, 0),
              0.05 * mean(full.step_losses, 0));

  worker::TrainerOptions resume = trainer_options(dir.path("ck"), 3);
  resume.checkpoint.resume = worker::ResumeSetting::kRequired;
  const worker::TrainResult resumed =
      worker::train(lenet, *backend_, train, {}, norm, resume);
  EXPECT_FALSE(resumed.resumed_from.empty());
  EXPECT_EQ(resumed.steps, 72);
}

// The perf DB keeps a model's precisions apart in a column of their own;
// the model's key is its signature whatever the precision.
TEST(Precision, ModelKeysKeepPrecisionsApartInTheirOwnColumn) {
  const worker::Graph graph = graph_of("lenet", 28);
  const common::ComputeSettings bf16{.precision = Precision::kBf16};
  const perfdb::ModelKey fp32_key = worker::model_key(graph, {});
  const perfdb::ModelKey bf16_key = worker::model_key(graph, bf16);
  EXPECT_EQ(fp32_key.signature, graph.signature());
  EXPECT_EQ(bf16_key.signature, graph.signature());
  EXPECT_NE(fp32_key, bf16_key);
  EXPECT_EQ(bf16_key.settings.precision, Precision::kBf16);
  EXPECT_EQ(bf16.activation_type(), common::DataType::kBF16);
}

// A backend that cannot run a precision refuses the network with its reason.
TEST(Precision, TheCpuRefusesFp16AndTf32NamingWhatItRuns) {
  auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  for (Precision p : {Precision::kFp16, Precision::kTf32}) {
    const worker::Graph graph = graph_of("lenet", 28);
    worker::NetworkOptions options;
    options.settings.precision = p;
    try {
      worker::Network net(graph, *backend, options);
      ADD_FAILURE() << common::precision_name(p) << " was accepted";
    } catch (const worker::BackendError &e) {
      EXPECT_NE(std::string(e.what()).find(common::precision_name(p)),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("fp32"), std::string::npos)
          << e.what();
    }
  }
}

} // namespace
} // namespace vtrain

namespace vtrain {
namespace {

// ------------------------------------------------------------ loss scaling

TEST(LossScaler, HalvesOnOverflowDoublesAfterCleanStepsAndStaysInRange) {
  worker::LossScaler s(1024, 3);
  EXPECT_TRUE(s.after_step(true));
  EXPECT_TRUE(s.after_step(true));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.after_step(true)); // the third clean step in a row
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_FALSE(s.after_step(false));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.after_step(true));
  EXPECT_TRUE(s.after_step(true));
  EXPECT_FALSE(s.after_step(false)); // an overflow restarts the count
  EXPECT_TRUE(s.after_step(true));
  EXPECT_TRUE(s.after_step(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.skipped_steps(), 2);

  worker::LossScaler top(0x1p127, 1);
  EXPECT_TRUE(top.after_step(true));
  EXPECT_EQ(top.scale(), 0x1p127);
  worker::LossScaler bottom(0x1p-24, 5);
  EXPECT_FALSE(bottom.after_step(false));
  EXPECT_EQ(bottom.scale(), 0x1p-24);
  EXPECT_THROW(worker::LossScaler(1000, 1), std::invalid_argument);
  EXPECT_THROW(worker::LossScaler(1024, 0), std::invalid_argument);
  EXPECT_THROW(worker::LossScaler(0x1p128, 1), std::invalid_argument);
}

struct ScaledRun {
  std::vector<float> params;
  worker::TrainResult result;
};

// LeNet on 16x16 synthetic data, fp32 (loss scaling is precision-agnostic
// arithmetic, so this runs on every machine); `pixel_scale` multiplies the
// inputs (large inputs make the scaled gradients overflow).
ScaledRun lenet_run(const worker::LossScalingSettings &scaling,
                    int64_t max_steps, float pixel_scale = 1) {
  const worker::Shape input{1, 1, 16, 16};
  const worker::Dataset train = worker::make_synthetic(input, 4, 256, 3);
  const worker::Graph graph =
      worker::Graph::build(worker::preset_layers("lenet", {input, 4}), input);
  auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  worker::ChannelStats norm = worker::channel_stats(train);
  for (float &s : norm.stddev)
    s /= pixel_scale;
  test_support::TempDir dir;
  worker::TrainerOptions o = trainer_options(dir.path("ck"), 1);
  o.train.max_steps = max_steps;
  o.train.loss_scaling = scaling;
  ScaledRun run;
  run.result = worker::train(graph, *backend, train, {}, norm, o);
  run.params =
      worker::load_checkpoint(*worker::latest_checkpoint(dir.path("ck")))
          .parameters;
  return run;
}

// Scales are powers of two: where nothing overflows, scaling the loss and
// unscaling the gradients change no bit of the weights.
TEST(LossScaling, PowerOfTwoScalesChangeNoBitOfTheWeights) {
  const ScaledRun off = lenet_run({.mode = common::AutoOnOff::kOff}, 8);
  const ScaledRun on = lenet_run(
      {.mode = common::AutoOnOff::kOn, .initial = 1024, .growth_interval = 3},
      8);
  EXPECT_TRUE(bitwise_equal(off.params, on.params));
  EXPECT_EQ(on.result.skipped_steps, 0);
  EXPECT_EQ(on.result.loss_scale, 1024 * 4); // doubled after steps 3 and 6
  EXPECT_EQ(off.result.loss_scale, 0);
  // auto is off in fp32.
  const ScaledRun automatic = lenet_run({}, 8);
  EXPECT_EQ(automatic.result.loss_scale, 0);
}

// Inputs 1000x larger and the largest scale: the first steps' gradients
// overflow, their updates are skipped (the weights stay the initial ones)
// and the scale halves each time.
TEST(LossScaling, OverflowedStepsAreSkippedAndTheScaleHalves) {
  const worker::Shape input{1, 1, 16, 16};
  const worker::Graph graph =
      worker::Graph::build(worker::preset_layers("lenet", {input, 4}), input);
  auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  worker::NetworkOptions net_options;
  net_options.max_batch = 1;
  net_options.conv_algorithm = "direct";
  worker::Network net(graph, *backend, net_options);
  net.init_parameters(trainer_options("", 1).train.seed); // as train() initialises
  const std::vector<float> initial = net.download_parameters();
  const ScaledRun scaled = lenet_run({.mode = common::AutoOnOff::kOn,
                                      .initial = 0x1p127,
                                      .growth_interval = 100},
                                     3, 1000);
  EXPECT_EQ(scaled.result.skipped_steps, 3);
  EXPECT_EQ(scaled.result.loss_scale, 0x1p124);
  EXPECT_TRUE(bitwise_equal(initial, scaled.params));
}

} // namespace
} // namespace vtrain

namespace vtrain {
namespace {

using common::Precision;

// A precision per rank: only the ranks in fp16 scale their loss under
// auto; with every rank scaling the sum is divided at the update, with
// some the scaling ranks unscale before the exchange; every rank keeps
// the scaler where any scales (one scale, one skip decision).
TEST(LossScaling,
     ThePlanPerRankScalesWhereFp16ComputesAndUnscalesBeforeAMixedExchange) {
  const worker::LossScalingSettings automatic;
  const std::vector<Precision> mixed = {Precision::kFp32, Precision::kBf16,
                                        Precision::kFp16};
  for (int r = 0; r < 3; ++r) {
    const worker::LossScalingPlan p =
        worker::plan_loss_scaling(automatic, mixed, r);
    EXPECT_TRUE(p.job) << r;
    EXPECT_EQ(p.here, r == 2) << r;
    EXPECT_FALSE(p.divide_after_exchange) << r;
    EXPECT_EQ(p.unscale_before_exchange, r == 2) << r;
  }
  const std::vector<Precision> all_fp16(2, Precision::kFp16);
  const worker::LossScalingPlan uniform =
      worker::plan_loss_scaling(automatic, all_fp16, 1);
  EXPECT_TRUE(uniform.here && uniform.divide_after_exchange);
  EXPECT_FALSE(uniform.unscale_before_exchange);
  const std::vector<Precision> no_fp16 = {Precision::kFp32, Precision::kBf16};
  EXPECT_FALSE(worker::plan_loss_scaling(automatic, no_fp16, 0).job);
  worker::LossScalingSettings on;
  on.mode = common::AutoOnOff::kOn;
  const worker::LossScalingPlan forced =
      worker::plan_loss_scaling(on, no_fp16, 0);
  EXPECT_TRUE(forced.here && forced.divide_after_exchange);
}

// Half gradients travel only where every rank shares one half type.
TEST(GradientAllreduce, HalfTravelsOnlyWhereEveryRankSharesOneHalfType) {
  using worker::GradientAllreduce;
  using worker::wire_type;
  const std::vector<Precision> bf16(3, Precision::kBf16);
  const std::vector<Precision> mixed = {Precision::kBf16, Precision::kFp16};
  const std::vector<Precision> with_fp32 = {Precision::kBf16, Precision::kFp32};
  const std::vector<Precision> fp32(2, Precision::kFp32);
  EXPECT_EQ(wire_type(GradientAllreduce::kHalf, bf16), common::DataType::kBF16);
  EXPECT_EQ(wire_type(GradientAllreduce::kHalf, mixed), common::DataType::kF32);
  EXPECT_EQ(wire_type(GradientAllreduce::kHalf, with_fp32),
            common::DataType::kF32);
  EXPECT_EQ(wire_type(GradientAllreduce::kFp32, bf16), common::DataType::kF32);
  EXPECT_THROW(wire_type(GradientAllreduce::kHalf, fp32),
               std::invalid_argument);
  // No staging buffer is planned where the exchange falls back to f32.
  EXPECT_EQ(
      worker::training_allocations_per_parameter(
          worker::OptimizerKind::kSgd, false, GradientAllreduce::kHalf, mixed)
          .size(),
      1u);
  EXPECT_EQ(
      worker::training_allocations_per_parameter(
          worker::OptimizerKind::kSgd, false, GradientAllreduce::kHalf, bf16)
          .size(),
      2u);
}

} // namespace
} // namespace vtrain
