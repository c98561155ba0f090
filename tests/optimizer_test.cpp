// The optimizers (worker/engine/optimizer.h) against references written in
// double from the formulas of PyTorch's torch.optim documentation, on a
// tiny problem: a separable quadratic loss over a parameter buffer of a
// conv's weights and bias and a batch norm's scale and shift, a few steps
// with a changing learning rate. Where torch is at hand, SGD with Nesterov
// momentum and AdamW are also run through torch.optim itself. Label
// smoothing's loss and gradient against a hand computation. On the CPU
// backend; backend_conformance_test compares every backend's kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/engine_runs.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"

namespace vtrain {
namespace {

using worker::OptimizerKind;
using worker::OptimizerSettings;
using worker::OptimizerState;
using worker::ParamKind;
using worker::ParamTensor;

// The buffer: 6 weights, 2 biases, 2 + 2 batch-norm values.
const std::vector<ParamTensor> kTensors = {{0, 6, ParamKind::kWeight},
                                           {6, 2, ParamKind::kBias},
                                           {8, 2, ParamKind::kBatchNorm},
                                           {10, 2, ParamKind::kBatchNorm}};
constexpr int kCount = 12;
constexpr int kSteps = 6;

// The loss sum_i a_i / 2 (w_i - t_i)^2: gradient a_i (w_i - t_i). Values
// a Python script can compute alike.
double initial(int i) { return 0.3 * (i + 1) * (i % 2 == 0 ? 1 : -1); }
double target(int i) { return 0.05 * i - 0.2; }
double curvature(int i) { return 0.5 + 0.25 * i; }
double lr_at(int step) { return 0.1 * (1.0 - 0.1 * step); }  // step 0-based

// ------------------------------------------------------- the references

struct Reference {
  OptimizerSettings s;
  std::vector<double> w, buf, m, v;
  int t = 0;

  explicit Reference(const OptimizerSettings& settings)
      : s(settings), w(kCount), buf(kCount, 0.0), m(kCount, 0.0), v(kCount, 0.0) {
    for (int i = 0; i < kCount; ++i) w[i] = initial(i);
  }

  bool decays(const ParamTensor& p) const {
    for (ParamKind k : s.no_decay)
      if (k == p.kind) return false;
    return true;
  }

  static double norm(const std::vector<double>& x, int64_t from, int64_t count) {
    double sum = 0;
    for (int64_t i = from; i < from + count; ++i) sum += x[i] * x[i];
    return std::sqrt(sum);
  }

  void step(double lr) {
    ++t;
    std::vector<double> g(kCount);
    for (int i = 0; i < kCount; ++i) g[i] = curvature(i) * (w[i] - target(i));
    // torch.nn.utils.clip_grad_norm_: g *= min(1, max_norm / (total_norm + 1e-6)).
    if (s.clip_norm > 0) {
      const double coef = s.clip_norm / (norm(g, 0, kCount) + 1e-6);
      if (coef < 1) {
        for (double& x : g) x *= coef;
      }
    }
    for (const ParamTensor& p : kTensors) {
      const double wd = decays(p) ? s.weight_decay : 0.0;
      double ratio = 1.0;
      if (s.kind == OptimizerKind::kLars && decays(p)) {
        // NVIDIA apex LARC (clip off): trust * |w| / (|g| + wd |w|), 1 where a norm is 0.
        const double wn = norm(w, p.offset, p.count), gn = norm(g, p.offset, p.count);
        if (wn > 0 && gn > 0) ratio = s.trust * wn / (gn + wd * wn);
      }
      for (int64_t i = p.offset; i < p.offset + p.count; ++i) {
        if (s.kind == OptimizerKind::kAdamW) {
          adamw(i, g[i], lr, wd);
        } else {
          sgd(i, ratio * (g[i] + wd * w[i]), lr);
        }
      }
    }
  }

  // torch.optim.SGD, dampening 0: b = mu b + d (b = d at the first
  // step); Nesterov: d + mu b, else b; w -= lr * that.
  void sgd(int64_t i, double d, double lr) {
    const double mu = s.momentum;
    if (mu != 0) {
      buf[i] = t == 1 ? d : mu * buf[i] + d;
      d = s.nesterov ? d + mu * buf[i] : buf[i];
    }
    w[i] -= lr * d;
  }

  // torch.optim.AdamW (amsgrad off): w *= 1 - lr wd; m, v; then
  // w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
  void adamw(int64_t i, double g, double lr, double wd) {
    w[i] *= 1 - lr * wd;
    m[i] = s.beta1 * m[i] + (1 - s.beta1) * g;
    v[i] = s.beta2 * v[i] + (1 - s.beta2) * g * g;
    const double c1 = 1 - std::pow(double(s.beta1), t), c2 = 1 - std::pow(double(s.beta2), t);
    w[i] -= lr / c1 * m[i] / (std::sqrt(v[i]) / std::sqrt(c2) + s.eps);
  }
};

// ------------------------------------------------------ the optimizer run

class OptimizerRun {
 public:
  explicit OptimizerRun(const OptimizerSettings& s, float loss_scale = 1.0f)
      : backend_(worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1})),
        loss_scale_(loss_scale),
        params_(backend_->allocate_device(kCount * sizeof(float))),
        grads_(backend_->allocate_device(kCount * sizeof(float))),
        optimizer_(std::make_unique<worker::Optimizer>(*backend_, kTensors, s)) {
    std::vector<float> w(kCount);
    for (int i = 0; i < kCount; ++i) w[i] = static_cast<float>(initial(i));
    set(params_, w);
  }
  ~OptimizerRun() {
    optimizer_.reset();
    backend_->free_device(grads_);
    backend_->free_device(params_);
  }

  // The gradient of the current weights, scaled as loss scaling would.
  void step(int step) {
    const std::vector<float> w = weights();
    std::vector<float> g(kCount);
    for (int i = 0; i < kCount; ++i) {
      g[i] = static_cast<float>(curvature(i) * (w[i] - target(i))) * loss_scale_;
    }
    set(grads_, g);
    optimizer_->step(floats(params_), floats(grads_), static_cast<float>(lr_at(step)),
                     1.0f / loss_scale_);
  }
  std::vector<float> weights() const { return get(params_); }
  worker::Optimizer& optimizer() { return *optimizer_; }
  void set_weights(const std::vector<float>& w) { set(params_, w); }

 private:
  static float* floats(void* p) { return static_cast<float*>(p); }
  void set(void* device, const std::vector<float>& host) {
    backend_->upload(host.data(), worker::Tensor{worker::vector_desc(kCount), device});
  }
  std::vector<float> get(void* device) const {
    std::vector<float> host(kCount);
    backend_->download(worker::Tensor{worker::vector_desc(kCount), device}, host.data());
    return host;
  }

  std::unique_ptr<worker::Backend> backend_;
  float loss_scale_;
  void* params_;
  void* grads_;
  std::unique_ptr<worker::Optimizer> optimizer_;
};

// float against double over a few steps: within 1e-5 of the weights' scale.
void expect_follows_reference(const OptimizerSettings& s, float loss_scale = 1.0f) {
  OptimizerRun run(s, loss_scale);
  Reference ref(s);
  for (int step = 0; step < kSteps; ++step) {
    run.step(step);
    ref.step(lr_at(step));
  }
  const std::vector<float> got = run.weights();
  double moved = 0;
  for (int i = 0; i < kCount; ++i) {
    EXPECT_NEAR(got[i], ref.w[i], 1e-5 * (1 + std::abs(ref.w[i]))) << "parameter " << i;
    moved = std::max(moved, std::abs(ref.w[i] - initial(i)));
  }
  EXPECT_GT(moved, 1e-3) << "the steps must move the weights for the comparison to mean anything";
}

const OptimizerSettings kSgdMomentum{.momentum = 0.9f, .weight_decay = 0.01f};
const OptimizerSettings kNesterov{.momentum = 0.9f, .nesterov = true, .weight_decay = 0.01f};
const OptimizerSettings kAdamW{.kind = OptimizerKind::kAdamW, .weight_decay = 0.1f,
                               .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f};
const OptimizerSettings kLars{.kind = OptimizerKind::kLars, .momentum = 0.9f,
                              .weight_decay = 0.01f, .trust = 0.02f};

TEST(Optimizer, SgdWithMomentumFollowsTorchSgd) { expect_follows_reference(kSgdMomentum); }

TEST(Optimizer, NesterovFollowsTorchSgdWithNesterov) { expect_follows_reference(kNesterov); }

TEST(Optimizer, AdamWFollowsTorchAdamW) { expect_follows_reference(kAdamW); }

TEST(Optimizer, LarsFollowsApexLarcBeforeSgd) { expect_follows_reference(kLars); }

TEST(Optimizer, NoDecayExemptsBatchNormAndBiasFromDecayAndTrust) {
  for (OptimizerSettings s : {kNesterov, kAdamW, kLars}) {
    s.no_decay = {ParamKind::kBatchNorm, ParamKind::kBias};
    SCOPED_TRACE(common::name_of(worker::kOptimizerKindNames, s.kind));
    expect_follows_reference(s);
    // It changes the update of those tensors: the test would catch a no-op.
    OptimizerSettings all = s;
    all.no_decay.clear();
    OptimizerRun with(s), without(all);
    with.step(0);
    without.step(0);
    EXPECT_EQ(with.weights()[0], without.weights()[0]) << "a weight decays either way";
    EXPECT_NE(with.weights()[6], without.weights()[6]) << "a bias";
    EXPECT_NE(with.weights()[9], without.weights()[9]) << "a batch-norm scale";
  }
}

TEST(Optimizer, ClipNormScalesTheUnscaledGradientDown) {
  for (OptimizerSettings s : {kNesterov, kAdamW, kLars}) {
    s.clip_norm = 0.5;  // below the gradient's norm (about 2 at the start)
    SCOPED_TRACE(common::name_of(worker::kOptimizerKindNames, s.kind));
    expect_follows_reference(s);
    // Under loss scaling: clipped after unscaling, the same update.
    expect_follows_reference(s, 1024.0f);
    OptimizerRun run(s);
    run.step(0);
    EXPECT_GT(run.optimizer().last_gradient_norm(), s.clip_norm);
  }
}

TEST(Optimizer, LossScalingUnscalesTheGradientForEveryOptimizer) {
  for (const OptimizerSettings& s : {kSgdMomentum, kAdamW, kLars}) {
    SCOPED_TRACE(common::name_of(worker::kOptimizerKindNames, s.kind));
    expect_follows_reference(s, 1024.0f);
  }
}

// The state a checkpoint keeps continues the run bit for bit.
TEST(Optimizer, StateRoundTripContinuesBitwise) {
  for (OptimizerSettings s : {kNesterov, kAdamW, kLars}) {
    s.clip_norm = 1.0;
    SCOPED_TRACE(common::name_of(worker::kOptimizerKindNames, s.kind));
    OptimizerRun whole(s), first(s);
    for (int step = 0; step < kSteps; ++step) whole.step(step);
    for (int step = 0; step < 3; ++step) first.step(step);
    const OptimizerState state = first.optimizer().download_state();
    EXPECT_EQ(state.updates, 3);
    EXPECT_EQ(state.second.empty(), s.kind != OptimizerKind::kAdamW);
    OptimizerRun second(s);
    second.set_weights(first.weights());
    second.optimizer().upload_state(state);
    for (int step = 3; step < kSteps; ++step) second.step(step);
    EXPECT_TRUE(test_support::bitwise_equal(second.weights(), whole.weights()));
  }
}

TEST(Optimizer, StateOfAnotherSizeIsRefused) {
  OptimizerRun run(kAdamW);
  OptimizerState state = run.optimizer().download_state();
  state.second.pop_back();
  EXPECT_THROW(run.optimizer().upload_state(state), std::invalid_argument);
  OptimizerRun sgd(kSgdMomentum);
  EXPECT_THROW(sgd.optimizer().upload_state(run.optimizer().download_state()),
               std::invalid_argument);
}

TEST(Optimizer, StateBytesPerParameterCountTheMoments) {
  EXPECT_EQ(worker::Optimizer::state_bytes_per_parameter(OptimizerKind::kSgd), 4u);
  EXPECT_EQ(worker::Optimizer::state_bytes_per_parameter(OptimizerKind::kLars), 4u);
  EXPECT_EQ(worker::Optimizer::state_bytes_per_parameter(OptimizerKind::kAdamW), 8u);
}

TEST(Optimizer, ParameterTensorsSplitWeightsBiasAndBatchNorm) {
  using worker::LayerSpec;
  using worker::LayerType;
  const auto layer = [](const char* name, LayerType type, std::vector<std::string> inputs) {
    LayerSpec s;
    s.name = name;
    s.type = type;
    s.inputs = std::move(inputs);
    return s;
  };
  std::vector<LayerSpec> layers = {layer("data", LayerType::kInput, {}),
                                   layer("c", LayerType::kConv, {"data"}),
                                   layer("bn", LayerType::kBatchNorm, {"c"}),
                                   layer("fc", LayerType::kFc, {"bn"})};
  layers[1].out = 2;
  layers[1].kernel_h = layers[1].kernel_w = 3;
  layers[3].out = 3;
  layers[3].bias = false;
  const worker::Graph graph = worker::Graph::build(layers, {1, 1, 4, 4});
  // conv 2x1x3x3 + 2, batch norm 2 + 2, fc 3x(2x2x2).
  const std::vector<worker::ParamRange> ranges = {{1, 0, 20}, {2, 20, 4}, {3, 24, 24}};
  const std::vector<ParamTensor> tensors = worker::parameter_tensors(graph, ranges);
  ASSERT_EQ(tensors.size(), 5u);
  const ParamTensor want[] = {{0, 18, ParamKind::kWeight},
                              {18, 2, ParamKind::kBias},
                              {20, 2, ParamKind::kBatchNorm},
                              {22, 2, ParamKind::kBatchNorm},
                              {24, 24, ParamKind::kWeight}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(tensors[i].offset, want[i].offset) << i;
    EXPECT_EQ(tensors[i].count, want[i].count) << i;
    EXPECT_EQ(tensors[i].kind, want[i].kind) << i;
  }
}

TEST(WeightAverage, StartsAtTheWeightsAndFollowsThem) {
  auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  std::vector<float> w = {1.0f, -2.0f, 0.5f};
  void* params = backend->allocate_device(3 * sizeof(float));
  const worker::Tensor t{worker::vector_desc(3), params};
  backend->upload(w.data(), t);
  {
    worker::WeightAverage average(*backend, static_cast<float*>(params), 3, 0.75f);
    EXPECT_EQ(average.download(), w);
    const std::vector<float> next = {3.0f, 2.0f, 0.5f};
    backend->upload(next.data(), t);
    average.update(static_cast<float*>(params));
    // 0.75 * old + 0.25 * new.
    EXPECT_EQ(average.download(), (std::vector<float>{1.5f, -1.0f, 0.5f}));
    average.upload({4.0f, 5.0f, 6.0f});
    EXPECT_EQ(average.download(), (std::vector<float>{4.0f, 5.0f, 6.0f}));
    EXPECT_THROW(average.upload({1.0f}), std::invalid_argument);
  }
  backend->free_device(params);
}

// ---------------------------------------------------- label smoothing

// One sample, logits (1, 2, 0), label 0, smoothing 0.3: the target is
// (0.7 + 0.1, 0.1, 0.1). By hand: log-sum-exp = log(e + e^2 + 1) =
// 2.4076059644; log softmax = (-1.4076059644, -0.4076059644,
// -2.4076059644); loss = 0.8 * 1.4076059644 + 0.1 * 0.4076059644 + 0.1 *
// 2.4076059644 = 1.4076059644; softmax = (0.2447284711, 0.6652409558,
// 0.0900305732); gradient = softmax - target = (-0.5552715289,
// 0.5652409558, -0.0099694268), times the loss scale.
TEST(LabelSmoothing, LossAndGradientMatchAHandComputation) {
  auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const std::vector<float> logits = {1.0f, 2.0f, 0.0f};
  const worker::TensorDesc desc{{1, 3, 1, 1}, worker::Layout::kPlain, worker::DataType::kF32};
  void* z = backend->allocate_device(desc.bytes());
  void* dz = backend->allocate_device(desc.bytes());
  auto* labels = static_cast<int32_t*>(backend->allocate_device(sizeof(int32_t)));
  const int32_t label = 0;
  backend->upload_labels(&label, labels, 1);
  backend->upload(logits.data(), {desc, z});
  const worker::Tensor dlogits{desc, dz};
  const worker::LossStats s = softmax_cross_entropy(*backend, {desc, z}, labels, 0.5f, &dlogits, 0.3f);
  EXPECT_NEAR(s.loss_sum, 1.4076059644, 1e-9);
  std::vector<float> d(3);
  backend->download(dlogits, d.data());
  const double want[] = {-0.5552715289, 0.5652409558, -0.0099694268};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(d[j], 0.5 * want[j], 1e-7) << j;
  // Smoothing 0 is the plain cross-entropy: 2.4076059644 - 1.
  EXPECT_NEAR(softmax_cross_entropy(*backend, {desc, z}, labels, 1.0f, nullptr).loss_sum,
              1.4076059644, 1e-9);
  backend->free_device(labels);
  backend->free_device(dz);
  backend->free_device(z);
}

// ------------------------------------------------- torch itself, if here

// torch.optim.SGD(nesterov=True) and torch.optim.AdamW on the same
// problem in float64; prints the final weights, one per line.
std::string torch_script(const std::string& optimizer) {
  std::ostringstream py;
  py << "import torch\n"
        "n = "
     << kCount
     << "\n"
        "w = torch.tensor([0.3 * (i + 1) * (1 if i % 2 == 0 else -1) for i in range(n)], "
        "dtype=torch.float64, requires_grad=True)\n"
        "t = torch.tensor([0.05 * i - 0.2 for i in range(n)], dtype=torch.float64)\n"
        "a = torch.tensor([0.5 + 0.25 * i for i in range(n)], dtype=torch.float64)\n"
        "opt = "
     << optimizer
     << "\n"
        "for step in range("
     << kSteps
     << "):\n"
        "    for g in opt.param_groups: g['lr'] = 0.1 * (1.0 - 0.1 * step)\n"
        "    opt.zero_grad()\n"
        "    (0.5 * a * (w - t) ** 2).sum().backward()\n"
        "    opt.step()\n"
        "print('\\n'.join(repr(x) for x in w.tolist()))\n";
  return py.str();
}

void expect_matches_torch(const OptimizerSettings& s, const std::string& optimizer) {
  if (const std::string missing = test_support::test_python_missing("torch"); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  test_support::TempDir dir;
  const std::string script = dir.path("opt.py");
  std::ofstream(script) << torch_script(optimizer);
  std::string out;
  ASSERT_EQ(test_support::run_command(test_support::test_python() + " " + script, &out), 0)
      << out;
  std::istringstream lines(out);
  OptimizerRun run(s);
  for (int step = 0; step < kSteps; ++step) run.step(step);
  const std::vector<float> got = run.weights();
  for (int i = 0; i < kCount; ++i) {
    double want = 0;
    ASSERT_TRUE(lines >> want) << out;
    EXPECT_NEAR(got[i], want, 1e-5 * (1 + std::abs(want))) << "parameter " << i;
  }
}

TEST(OptimizerTorch, NesterovMatchesTorchOptimSgd) {
  expect_matches_torch(kNesterov,
                       "torch.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True, "
                       "weight_decay=0.01)");
}

TEST(OptimizerTorch, AdamWMatchesTorchOptimAdamW) {
  expect_matches_torch(kAdamW,
                       "torch.optim.AdamW([w], lr=0.1, betas=(0.8, 0.95), eps=1e-6, "
                       "weight_decay=0.1)");
}

}  // namespace
}  // namespace vtrain
