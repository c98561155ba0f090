// The presets that are torchvision's architectures give torchvision's
// logits both ways, in eval mode on a fixed batch of two, within 1e-4 of
// the largest logit: torchvision's own model loads `vtrain export --format
// safetensors` with load_state_dict(strict=True) and computes vtrain's
// logits; and torchvision's state_dict saved with save_file, vtrain's
// model.init (read_initial_weights), makes vtrain compute torchvision's.
// Both models are freshly initialised, their batch norms given random
// scales and shifts and running statistics near the batch's own (see
// randomise_scales_and_shifts), and the logits are required to depend on
// the input. Sizes: resnets and resnext at 64x64, the least input at which
// vtrain keeps torchvision's stem (7x7/2 conv and max pool); VGG-16 and
// AlexNet at 224x224, where their feature maps are the 7x7 and 6x6 that
// torchvision's adaptive average pools leave as they are; MobileNetV2 and
// EfficientNet-B0 at 64x64 and at 32x32, where vtrain's stem conv runs at
// stride 1 and torchvision's is set to it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model_io/initial_weights.h"
#include "model_io/weight_names.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/train/checkpoint.h"

namespace vtrain {
namespace {

using test_support::TempDir;

constexpr int64_t kClasses = 1000;
constexpr int64_t kBatch = 2;

struct Case {
  const char* preset;
  int64_t size;  // input height and width
};

// gtest's name of a case (its bytes, a pointer among them, otherwise).
void PrintTo(const Case& c, std::ostream* os) { *os << c.preset << " at " << c.size; }

// Batch norms that a comparison of logits sees through, in two steps.
// randomise_scales_and_shifts: random scales and shifts (a fresh batch
// norm is the identity, which would hide a swapped gamma and beta).
// perturb_statistics: running statistics that are those of the batch
// (`buffers` holds them on entry: batch_statistics) off by a random
// fraction, so that a swapped mean and variance, or batch statistics used
// in eval mode, show too. Statistics far from the batch's (0 and 1 under
// activations that shrink block after block, as MobileNetV2's and
// EfficientNet's do at initialisation) leave logits that hardly depend on
// the input: the comparison would see little more than the classifier.
// torchvision's side does the same (kTorchScript's "save").
template <typename Change>
void each_batch_norm_tensor(const worker::Graph& graph, const std::string& preset,
                            model_io::WeightKind kind, Change change) {
  for (const model_io::ModelTensor& t : model_io::model_tensors(graph, preset)) {
    if (graph.layer(t.layer).type == worker::LayerType::kBatchNorm && t.kind == kind) change(t);
  }
}

void randomise_scales_and_shifts(const worker::Graph& graph, const std::string& preset,
                                 std::vector<float>& params) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f), shift(-0.2f, 0.2f);
  each_batch_norm_tensor(graph, preset, model_io::WeightKind::kParameter,
                         [&](const model_io::ModelTensor& t) {
                           const bool weight = t.vtrain_name.ends_with(".weight");
                           for (int64_t i = 0; i < t.elements(); ++i) {
                             params[t.offset + i] = weight ? scale(rng) : shift(rng);
                           }
                         });
}

void perturb_statistics(const worker::Graph& graph, const std::string& preset,
                        std::vector<float>& buffers) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> factor(0.8f, 1.2f), deviations(-0.1f, 0.1f);
  each_batch_norm_tensor(graph, preset, model_io::WeightKind::kBuffer,
                         [&](const model_io::ModelTensor& t) {
                           // The mean moves by up to a tenth of the batch's standard deviation:
                           // vtrain keeps the variance right after the mean.
                           const bool mean = t.vtrain_name.ends_with(".running_mean");
                           for (int64_t i = 0; i < t.elements(); ++i) {
                             float& v = buffers[t.offset + i];
                             v = mean ? v + deviations(rng) *
                                                std::sqrt(buffers[t.offset + t.elements() + i])
                                      : v * factor(rng);
                           }
                         });
}

// He's gain on every conv and fc weight of a net without batch norms
// (vgg16, alexnet): vtrain's initialisation, torch's default (bounds
// 1/sqrt(fan_in)), shrinks the signal's variance about sixfold a layer, so
// that VGG-16's logits would hardly depend on the input; sqrt(6) makes the
// bounds sqrt(6 / fan_in), which keeps it under ReLU. Batch norms keep it
// where there are some (perturb_statistics); there the gain would only
// grow EfficientNet's logits, and the rounding errors of both sides with
// them.
void keep_signal(const worker::Graph& graph, const std::string& preset,
                 std::vector<float>& params) {
  const std::vector<model_io::ModelTensor> tensors = model_io::model_tensors(graph, preset);
  for (const model_io::ModelTensor& t : tensors) {
    if (graph.layer(t.layer).type == worker::LayerType::kBatchNorm) return;
  }
  for (const model_io::ModelTensor& t : tensors) {
    const worker::LayerType type = graph.layer(t.layer).type;
    if ((type != worker::LayerType::kConv && type != worker::LayerType::kFc) ||
        !t.vtrain_name.ends_with(".weight")) {
      continue;
    }
    for (int64_t i = 0; i < t.elements(); ++i) params[t.offset + i] *= std::sqrt(6.0f);
  }
}

void write_floats(const std::string& path, const std::vector<float>& values) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(values.data()),
             static_cast<std::streamsize>(values.size() * sizeof(float)));
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<float> values(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(values.data()),
          static_cast<std::streamsize>(values.size() * sizeof(float)));
  return values;
}

// torchvision's side, in two modes. "load": the model loads `weights`
// (strict) and writes its logits on the batch. "save": a fresh model, its
// batch norms randomised as randomise_scales_and_shifts and
// perturb_statistics do (on its own batch statistics), saves its
// state_dict to `weights` as a user would (safetensors.torch.save_file) and
// writes its logits. Below 64x64 vtrain runs mobilenet_v2's and
// efficientnet_b0's 3x3 stem conv at stride 1 (worker/engine/presets.cpp):
// the same weights, so torchvision's conv is given that stride too.
constexpr const char* kTorchScript = R"(
import sys, numpy, torch, torchvision
from safetensors.torch import load_file, save_file
mode, preset, weights, size, batch, inputs, out = sys.argv[1:8]
size, batch = int(size), int(batch)
torch.set_num_threads(2)
torch.manual_seed(5)
model = getattr(torchvision.models, preset)()
if size < 64 and preset in ("mobilenet_v2", "efficientnet_b0"):
    model.features[0][0].stride = (1, 1)
if mode == "load":
    model.load_state_dict(load_file(weights), strict=True)
x = torch.from_numpy(numpy.fromfile(inputs, dtype=numpy.float32)).reshape(batch, 3, size, size)
if mode == "save":
    model.eval()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for m in norms:
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.2, 0.2)
            m.momentum = 1.0
            m.train()
        model(x)
        for m in norms:
            std = m.running_var.sqrt()
            m.running_mean.add_(torch.empty_like(std).uniform_(-0.1, 0.1) * std)
            m.running_var.mul_(torch.empty_like(std).uniform_(0.8, 1.2))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
model.eval()
with torch.no_grad():
    model(x).numpy().astype(numpy.float32).tofile(out)
)";

// The preset at the case's input size on the CPU backend, for a batch of
// kBatch, with its parameters initialised (seed 3); its batch norms'
// running-statistics momentum `bn_momentum` where that is given.
struct VtrainModel {
  explicit VtrainModel(const Case& c, std::optional<float> bn_momentum = std::nullopt)
      : input{1, 3, c.size, c.size},
        graph(worker::Graph::build(layers(c, input, bn_momentum), input)),
        backend(worker::make_backend(cpu_backend())),
        net(graph, *backend, network_options()) {
    net.init_parameters(3);
  }

  static std::vector<worker::LayerSpec> layers(const Case& c, const worker::Shape& input,
                                               std::optional<float> bn_momentum) {
    std::vector<worker::LayerSpec> specs = worker::preset_layers(c.preset, {input, kClasses});
    for (worker::LayerSpec& spec : specs) {
      if (bn_momentum && spec.type == worker::LayerType::kBatchNorm) {
        spec.bn_momentum = *bn_momentum;
      }
    }
    return specs;
  }
  static worker::BackendOptions cpu_backend() {
    worker::BackendOptions options;
    options.kind = worker::BackendKind::kCpu;
    return options;
  }
  static worker::NetworkOptions network_options() {
    worker::NetworkOptions options;
    options.max_batch = kBatch;
    options.conv_algorithm = "direct";
    return options;
  }

  // A fixed batch of kBatch normal samples.
  std::vector<float> batch() const {
    std::vector<float> x(static_cast<size_t>(kBatch * input.per_sample()));
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    for (float& v : x) v = normal(rng);
    return x;
  }

  void upload_batch(const std::vector<float>& x) {
    net.upload_input(x.data(), kBatch);
    const std::vector<int32_t> labels(kBatch, 0);
    backend->upload_labels(labels.data(), net.labels(), kBatch);
  }

  // The inference forward's logits on `x`.
  std::vector<float> logits(const std::vector<float>& x) {
    upload_batch(x);
    std::vector<float> out(static_cast<size_t>(kBatch * kClasses));
    net.evaluate(kBatch, out.data());
    return out;
  }

  worker::Shape input;
  worker::Graph graph;
  std::unique_ptr<worker::Backend> backend;
  worker::Network net;
};

// The mean and variance of its input that each batch norm of `c` computes
// in a training forward of `x` with `params` (the running statistics of a
// copy whose batch norms keep the last batch's: momentum 1).
std::vector<float> batch_statistics(const Case& c, const std::vector<float>& params,
                                    const std::vector<float>& x) {
  VtrainModel copy(c, 1.0f);
  copy.net.upload_parameters(params);
  copy.upload_batch(x);
  copy.net.train_step(kBatch, 1.0f);
  return copy.net.download_buffers();
}

// Runs kTorchScript in `mode` on `x` (written to DIR/x.bin); torchvision's
// logits.
std::vector<float> torchvision_logits(const TempDir& dir, const std::string& mode, const Case& c,
                                      const std::string& weights, const std::vector<float>& x) {
  write_floats(dir.path("x.bin"), x);
  const std::string script = dir.write("tv.py", kTorchScript).string();
  std::string output;
  const int rc = test_support::run_command(
      test_support::test_python() + " " + script + " " + mode + " " + c.preset + " " + weights +
          " " + std::to_string(c.size) + " " + std::to_string(kBatch) + " " + dir.path("x.bin") +
          " " + dir.path("y.bin"),
      &output);
  EXPECT_EQ(rc, 0) << output;
  return rc == 0 ? read_floats(dir.path("y.bin")) : std::vector<float>{};
}

// Every logit within 1e-4 of the batch's largest (in magnitude).
void expect_same_logits(const std::vector<float>& ours, const std::vector<float>& theirs) {
  ASSERT_EQ(theirs.size(), ours.size());
  float largest = 0, worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    largest = std::max(largest, std::fabs(theirs[i]));
    worst = std::max(worst, std::fabs(ours[i] - theirs[i]));
  }
  ASSERT_GT(largest, 0);
  // How far the first sample's logits are from the second's: the logits
  // must depend on the input for the comparison to test the whole net.
  float spread = 0;
  for (size_t i = 0; i < static_cast<size_t>(kClasses); ++i) {
    spread = std::max(spread, std::fabs(theirs[i] - theirs[i + kClasses]));
  }
  std::printf("largest logit %g, largest difference %g, samples 0 and 1 differ by up to %g\n",
              largest, worst, spread);
  EXPECT_GT(spread, 1e-2f * largest) << "the logits hardly depend on the input";
  EXPECT_LE(worst, 1e-4f * largest) << "largest logit " << largest << ", largest difference "
                                    << worst;
}

std::string missing_python() {
  return test_support::test_python_missing("torch, torchvision, safetensors");
}

class TorchvisionWeights : public ::testing::TestWithParam<Case> {};

TEST_P(TorchvisionWeights, TorchvisionLoadsTheExportAndGivesVtrainsLogits) {
  if (const std::string missing = missing_python(); !missing.empty()) GTEST_SKIP() << missing;
  const Case c = GetParam();
  const TempDir dir;
  VtrainModel m(c);
  ASSERT_TRUE(model_io::torchvision_architecture(c.preset));
  const std::vector<float> x = m.batch();
  std::vector<float> params = m.net.download_parameters();
  keep_signal(m.graph, c.preset, params);
  randomise_scales_and_shifts(m.graph, c.preset, params);
  std::vector<float> buffers = batch_statistics(c, params, x);
  perturb_statistics(m.graph, c.preset, buffers);
  m.net.upload_parameters(params);
  m.net.upload_buffers(buffers);
  const std::vector<float> ours = m.logits(x);

  // The checkpoint a run of it would write, exported as a user would.
  worker::Checkpoint ckpt;
  ckpt.model_signature = m.graph.signature();
  ckpt.global_batch = kBatch;
  ckpt.parameters = params;
  ckpt.buffers = buffers;
  ckpt.velocity.assign(params.size(), 0.0f);
  const std::string ckpt_dir = dir.path("ckpt");
  worker::save_checkpoint(ckpt_dir, ckpt, 1);
  const std::string config = dir.write("m.yaml", "model: {preset: " + std::string(c.preset) +
                                                     "}\ndata: {kind: synthetic, shape: [3, " +
                                                     std::to_string(c.size) + ", " +
                                                     std::to_string(c.size) +
                                                     "], classes: 1000, train_size: 2, "
                                                     "test_size: 2}\n")
                                 .string();
  const std::string weights = dir.path("m.safetensors");
  const test_support::RunResult exported = test_support::run_vtrain(
      "export " + config + " --checkpoint " + ckpt_dir + " --format safetensors --out " + weights);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("torchvision names"), std::string::npos) << exported.output;

  expect_same_logits(ours, torchvision_logits(dir, "load", c, weights, x));
}

// The other way: torchvision's state_dict, saved with save_file, is the
// model.init of vtrain's preset (read_initial_weights, as the launcher
// reads it), and vtrain's logits are torchvision's.
TEST_P(TorchvisionWeights, VtrainStartsFromTorchvisionsStateDictAndGivesItsLogits) {
  if (const std::string missing = missing_python(); !missing.empty()) GTEST_SKIP() << missing;
  const Case c = GetParam();
  const TempDir dir;
  VtrainModel m(c);
  const std::vector<float> x = m.batch();
  const std::string weights = dir.path("tv.safetensors");
  const std::vector<float> theirs = torchvision_logits(dir, "save", c, weights, x);
  ASSERT_FALSE(theirs.empty());

  const worker::InitialWeights init =
      model_io::read_initial_weights(weights, m.graph, c.preset, {});
  std::vector<float> params = m.net.download_parameters();
  std::vector<float> buffers = m.net.download_buffers();
  for (const worker::WeightRange& r : init.parameters) {
    std::copy(r.values.begin(), r.values.end(), params.begin() + r.offset);
  }
  for (const worker::WeightRange& r : init.buffers) {
    std::copy(r.values.begin(), r.values.end(), buffers.begin() + r.offset);
  }
  m.net.upload_parameters(params);
  m.net.upload_buffers(buffers);
  expect_same_logits(m.logits(x), theirs);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.preset) + "_" + std::to_string(info.param.size);
}

// Two binaries of this file: the quick cases (label cpu: the small inputs)
// and the ones that take long on two cores (label slow).
#if VTRAIN_TORCHVISION_SLOW
INSTANTIATE_TEST_SUITE_P(Presets, TorchvisionWeights,
                         ::testing::Values(Case{"resnet50", 64}, Case{"alexnet", 224},
                                           Case{"vgg16", 224}, Case{"resnext50_32x4d", 64},
                                           Case{"mobilenet_v2", 64}, Case{"efficientnet_b0", 64}),
                         case_name);
#else
INSTANTIATE_TEST_SUITE_P(Presets, TorchvisionWeights,
                         ::testing::Values(Case{"resnet18", 64}, Case{"mobilenet_v2", 32},
                                           Case{"efficientnet_b0", 32}),
                         case_name);

// "name [d0, d1, ...]" per tensor, sorted.
std::vector<std::string> sorted_lines(std::vector<std::string> lines) {
  std::sort(lines.begin(), lines.end());
  return lines;
}

// The names and shapes at 224x224, where the comparisons above do not run
// (a forward there takes long on two cores): torchvision's state_dict.
TEST(TorchvisionNames, MobileNetEfficientNetAndResNeXtNameEveryStateDictTensor) {
  const std::string missing = test_support::test_python_missing("torch, torchvision");
  if (!missing.empty()) GTEST_SKIP() << missing;
  for (const char* preset : {"mobilenet_v2", "efficientnet_b0", "resnext50_32x4d"}) {
    SCOPED_TRACE(preset);
    ASSERT_TRUE(model_io::torchvision_architecture(preset));
    const worker::Shape input{1, 3, 224, 224};
    const worker::Graph graph =
        worker::Graph::build(worker::preset_layers(preset, {input, kClasses}), input);
    std::vector<std::string> ours;
    for (const model_io::ModelTensor& t : model_io::model_tensors(graph, preset)) {
      std::string dims;
      for (int64_t d : t.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
      ours.push_back(t.name + " [" + dims + "]");
    }
    const std::string script = "import torchvision\nm = torchvision.models." + std::string(preset) +
                               "()\nfor k, v in m.state_dict().items():\n  print(k, list(v.shape))\n";
    std::string output;
    ASSERT_EQ(test_support::run_command(test_support::test_python() + " -c '" + script + "'",
                                        &output),
              0)
        << output;
    std::vector<std::string> theirs;
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);) theirs.push_back(line);
    EXPECT_EQ(sorted_lines(ours), sorted_lines(theirs));
  }
}
#endif

}  // namespace
}  // namespace vtrain
