// ONNX out and in (model_io/onnx.h), as users run them: `vtrain export
// --format onnx` of every preset and of configs/custom-dag.yaml gives what
// ONNX Runtime computes as vtrain computes it; a file vtrain wrote comes
// back through model.onnx with identical outputs; torchvision's ResNets
// exported by PyTorch train; broken files are refused naming the file.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "configs/config.h"
#include "configs/config_limits.h"
#include "worker/engine/network.h"
#include "worker/engine/parameter_layout.h"
#include "worker/train/checkpoint.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

using test_support::run_command;
using test_support::run_vtrain;
using test_support::TempDir;

constexpr int64_t kBatch = 3;

// The committed torchvision-style model (tests/data/make_torchvision_onnx.py tiny).
std::string tiny_resnet() { return test_support::source_dir() + "/tests/data/tiny_resnet_32x32.onnx"; }

std::string synthetic_data(const worker::Shape& s) {
  return "data: {kind: synthetic, shape: [" + std::to_string(s.c) + ", " + std::to_string(s.h) +
         ", " + std::to_string(s.w) + "], classes: 10, train_size: 8, test_size: 4}\n"
         "train: {batch: 4, max_steps: 2, evaluate: false}\n"
         "device: {backend: cpu, threads: 2}\nconv: {algorithm: direct}\n";
}

// A config's network on the CPU, as training builds it, for kBatch samples.
struct Model {
  Model(const std::string& config, const std::vector<std::string>& overrides = {})
      : cfg(config::load_config(config, overrides)),
        graph(config::build_model(cfg, cfg.data.shape)),
        backend(worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 2})) {
    worker::NetworkOptions o;
    o.max_batch = kBatch;
    o.conv_algorithm = "direct";
    net = std::make_unique<worker::Network>(graph, *backend, o);
  }

  void set_weights(const worker::FlatWeights& w) {
    net->upload_parameters(w.parameters);
    net->upload_buffers(w.buffers);
  }

  // Inference-mode logits (kBatch x classes) on `batch`.
  std::vector<float> logits(const std::vector<float>& batch) {
    const std::vector<int32_t> labels(kBatch, 0);
    net->upload_input(batch.data(), kBatch);
    backend->upload_labels(labels.data(), net->labels(), kBatch);
    std::vector<float> out(static_cast<size_t>(kBatch * graph.classes()));
    net->evaluate(kBatch, out.data());
    return out;
  }

  config::Config cfg;
  worker::Graph graph;
  std::unique_ptr<worker::Backend> backend;
  std::unique_ptr<worker::Network> net;
};

// kBatch samples of `s`, the same every time.
std::vector<float> fixed_batch(const worker::Shape& s, int seed) {
  std::vector<float> v(static_cast<size_t>(kBatch * s.per_sample()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i) + seed);
  return v;
}

// Weights that are not the initial ones anywhere: the seeded
// initialisation moved a little, and batch-norm running statistics from
// two training-mode forward passes (every value then matters).
void make_trained_weights(Model& m) {
  m.net->init_parameters(7);
  std::vector<float> p = m.net->download_parameters();
  for (size_t i = 0; i < p.size(); ++i) p[i] += 0.05f * std::sin(static_cast<float>(i));
  m.net->upload_parameters(p);
  const std::vector<int32_t> labels(kBatch, 1);
  for (int step = 0; step < 2; ++step) {
    const std::vector<float> batch = fixed_batch(m.cfg.data.shape, 100 + step);
    m.net->upload_input(batch.data(), kBatch);
    m.backend->upload_labels(labels.data(), m.net->labels(), kBatch);
    m.net->train_step(kBatch, 1.0f / kBatch);
  }
}

std::string save(Model& m, const std::string& dir) {
  worker::Checkpoint c;
  c.model_signature = m.graph.signature();
  c.global_batch = 4;
  c.parameters = m.net->download_parameters();
  c.buffers = m.net->download_buffers();
  c.velocity.assign(c.parameters.size(), 0.0f);
  return worker::save_checkpoint(dir, c, 1);
}

void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = test_support::read_file(path);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// ONNX Runtime's output of `model` on `batch`; *metadata gets the
// metadata_props as KEY=VALUE lines.
std::vector<float> onnx_runtime(const TempDir& dir, const std::string& model,
                                const std::vector<float>& batch, std::string* metadata) {
  write_floats(dir.path("batch.f32"), batch);
  const std::string command = test_support::test_python() + " " + test_support::source_dir() +
                              "/tests/onnx_run.py " + model + " " + dir.path("batch.f32") + " " +
                              std::to_string(kBatch) + " " + dir.path("out.f32");
  std::string output;
  EXPECT_EQ(run_command(command, &output), 0) << output;
  if (metadata) *metadata = output;
  return read_floats(dir.path("out.f32"));
}

// Every value within 1e-4 of the logits' largest magnitude in its sample.
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const size_t per = want.size() / kBatch;
  for (size_t s = 0; s < static_cast<size_t>(kBatch); ++s) {
    float scale = 0;
    for (size_t k = 0; k < per; ++k) scale = std::max(scale, std::abs(want[s * per + k]));
    for (size_t k = 0; k < per; ++k) {
      const size_t i = s * per + k;
      ASSERT_LE(std::abs(got[i] - want[i]), 1e-4f * scale)
          << what << ": sample " << s << " logit " << k << ": " << got[i] << " vs " << want[i];
    }
  }
}

// Exports the config's model with trained weights, runs it in ONNX Runtime
// and brings it back through model.onnx: both must give vtrain's logits.
void check_export_and_import(const std::string& config, const std::vector<std::string>& overrides) {
  const std::string missing = test_support::test_python_missing("onnxruntime, onnx");
  if (!missing.empty()) GTEST_SKIP() << missing;
  TempDir dir;
  Model m(config, overrides);
  make_trained_weights(m);
  save(m, dir.path("ckpt"));
  std::string sets;
  for (const std::string& o : overrides) sets += " --set " + o;
  const std::string file = dir.path("model.onnx");
  const test_support::RunResult r = run_vtrain("export " + config + sets + " --checkpoint " +
                                               dir.path("ckpt") + " --format onnx --out " + file);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const worker::Shape& shape = m.cfg.data.shape;
  const std::vector<float> batch = fixed_batch(shape, 1);
  const std::vector<float> ours = m.logits(batch);
  ASSERT_EQ(ours.size(), static_cast<size_t>(kBatch * m.graph.classes()));
  std::string metadata;
  expect_close(onnx_runtime(dir, file, batch, &metadata), ours, "ONNX Runtime vs vtrain");
  EXPECT_CONTAINS(metadata, "input_shape=" + std::to_string(shape.c) + "," +
                                std::to_string(shape.h) + "," + std::to_string(shape.w));
  EXPECT_CONTAINS(metadata, "classes=" + std::to_string(m.graph.classes()));
  EXPECT_CONTAINS(metadata, "mean=");
  EXPECT_CONTAINS(metadata, "std=");

  // Round trip: the file as the model, its initializers as the weights.
  const std::string back = dir.write("back.yaml", "model: {onnx: " + file + "}\n" +
                                                      synthetic_data(shape)).string();
  Model imported(back);
  EXPECT_EQ(imported.graph.parameter_count(), m.graph.parameter_count());
  imported.set_weights(worker::flatten_weights(imported.graph, imported.cfg.model.initial_weights,
                                               "model.onnx"));
  EXPECT_EQ(imported.logits(batch), ours) << "export -> model.onnx -> the same outputs";
}

class PresetExport : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetExport, OnnxRuntimeAgreesAndImportRoundTrips) {
  TempDir dir;
  const std::string config = dir.write("preset.yaml", "model: {preset: " + GetParam() + "}\n" +
                                                          synthetic_data({1, 3, 32, 32})).string();
  check_export_and_import(config, {});
}

// The deepened VGGs (vgg116..416) are vgg16 with more of the same layers,
// and hundreds of millions of weights: they are left to the slow test below.
INSTANTIATE_TEST_SUITE_P(Presets, PresetExport,
                         ::testing::Values("lenet", "vgg-small", "alexnet", "overfeat",
                                           "googlenet", "vgg16", "resnet18", "resnet50"));

TEST(OnnxExport, CustomDagOnnxRuntimeAgreesAndImportRoundTrips) {
  check_export_and_import(test_support::source_dir() + "/configs/custom-dag.yaml",
                          {"data.train_size=8", "data.test_size=4", "device.backend=cpu",
                           "conv.algorithm=direct"});
}

// --- model.onnx: a model PyTorch exported

// The config of a run on `onnx` for `steps` steps, checkpoints in DIR/ckpt.
std::string onnx_run_config(const TempDir& dir, const std::string& onnx, int steps,
                            const std::string& lr = "0.05") {
  return dir.write("run.yaml", "model: {onnx: " + onnx + "}\n"
                               "data: {kind: synthetic, shape: [3, 32, 32], classes: 10, "
                               "train_size: 16, test_size: 4}\n"
                               "train: {batch: 4, max_steps: " + std::to_string(steps) +
                               ", evaluate: false}\n"
                               "optimizer: {lr: " + lr + "}\n"
                               "device: {backend: cpu, threads: 2}\nconv: {algorithm: direct}\n"
                               "checkpoint: {dir: " + dir.path("ckpt") + "}\n")
      .string();
}

TEST(OnnxImport, TorchvisionStyleModelStartsFromItsInitializers) {
  TempDir dir;
  // An lr far below a float's resolution at the weights: the checkpoint
  // after one step holds the weights training started from.
  const test_support::RunResult r =
      run_vtrain(onnx_run_config(dir, tiny_resnet(), 1, "1e-30") + " --progress off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const config::Config cfg = config::load_config(dir.path("run.yaml"));
  const worker::Graph graph = config::build_model(cfg, cfg.data.shape);
  const worker::FlatWeights file = worker::flatten_weights(graph, cfg.model.initial_weights, "file");
  const worker::Checkpoint ckpt =
      worker::load_checkpoint(worker::checkpoint_at(dir.path("ckpt")));
  EXPECT_EQ(ckpt.parameters, file.parameters);
}

TEST(OnnxImport, TorchvisionStyleModelMatchesOnnxRuntime) {
  const std::string missing = test_support::test_python_missing("onnxruntime, onnx");
  if (!missing.empty()) GTEST_SKIP() << missing;
  TempDir dir;
  Model m(onnx_run_config(dir, tiny_resnet(), 1));
  m.set_weights(worker::flatten_weights(m.graph, m.cfg.model.initial_weights, "file"));
  const std::vector<float> batch = fixed_batch(m.cfg.data.shape, 2);
  expect_close(m.logits(batch), onnx_runtime(dir, tiny_resnet(), batch, nullptr),
               "vtrain on the imported model vs ONNX Runtime");
}

TEST(OnnxImport, TorchvisionResnet18Trains) {
  const std::string missing = test_support::test_python_missing("torch, torchvision");
  if (!missing.empty()) GTEST_SKIP() << missing;
  TempDir dir;
  const std::string file = dir.path("resnet18.onnx");
  std::string output;
  ASSERT_EQ(run_command(test_support::test_python() + " " + test_support::source_dir() +
                            "/tests/data/make_torchvision_onnx.py resnet18 " + file,
                        &output),
            0)
      << output;
  const test_support::RunResult r =
      run_vtrain(onnx_run_config(dir, file, 3) + " --progress line --set train.log_every=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "done: 3 steps");
  EXPECT_EQ(r.output.find("nan"), std::string::npos) << r.output;
}

// --- bad files: a config error naming the file (and the node), before
// anything starts.

void expect_refused(const TempDir& dir, const std::string& onnx, const std::vector<std::string>& parts) {
  const test_support::RunResult r = run_vtrain(onnx_run_config(dir, onnx, 1));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "config error");
  EXPECT_CONTAINS(r.output, "model.onnx");
  EXPECT_CONTAINS(r.output, onnx);
  for (const std::string& part : parts) EXPECT_CONTAINS(r.output, part);
  EXPECT_FALSE(std::filesystem::exists(dir.path("ckpt"))) << "the run started";
}

TEST(OnnxImport, UnsupportedOpIsRefusedNamingTheOpAndNode) {
  TempDir dir;
  onnx::ModelProto model;
  ASSERT_TRUE(model.ParseFromString(test_support::read_file(tiny_resnet())));
  onnx::NodeProto* relu = nullptr;
  for (onnx::NodeProto& n : *model.mutable_graph()->mutable_node()) {
    if (n.op_type() == "Relu" && !relu) relu = &n;
  }
  ASSERT_NE(relu, nullptr);
  relu->set_op_type("Sigmoid");
  const std::string name = relu->name();
  std::string bytes;
  ASSERT_TRUE(model.SerializeToString(&bytes));
  const std::string file = dir.path("sigmoid.onnx");
  std::ofstream(file, std::ios::binary) << bytes;
  expect_refused(dir, file, {"node '" + name + "'", "op type 'Sigmoid' is not supported",
                             "supported: Conv"});
}

TEST(OnnxImport, TruncatedFileIsRefused) {
  TempDir dir;
  const std::string bytes = test_support::read_file(tiny_resnet());
  const std::string file = dir.path("half.onnx");
  std::ofstream(file, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expect_refused(dir, file, {"not an ONNX model"});
}

TEST(OnnxImport, OtherKindOfFileIsRefused) {
  TempDir dir;
  // A config and a vtrain checkpoint in the place of the model.
  const std::string yaml = dir.write("model.yaml", "model: {preset: lenet}\n").string();
  expect_refused(dir, yaml, {"not an ONNX model"});
  Model m(onnx_run_config(dir, tiny_resnet(), 1));
  m.net->init_parameters(1);
  const std::string ckpt = save(m, dir.path("other"));
  expect_refused(dir, ckpt, {"not an ONNX model"});
  expect_refused(dir, dir.path("absent.onnx"), {"cannot open"});
}

TEST(OnnxImport, InputOfAnotherShapeIsRefused) {
  TempDir dir;
  const test_support::RunResult r =
      run_vtrain(onnx_run_config(dir, tiny_resnet(), 1) + " --set data.shape=[1,28,28]");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "takes inputs of 3x32x32, but the data's samples are 1x28x28");
}

// --- export's own errors

TEST(OnnxExport, RefusesWhatItCannotWriteAndLeavesTheOutputAlone) {
  TempDir dir;
  const std::string config = onnx_run_config(dir, tiny_resnet(), 1);
  const std::string out = dir.write("out.onnx", "old").string();
  const std::string base = "export " + config + " --out " + out;

  test_support::RunResult r = run_vtrain(base + " --checkpoint " + dir.path() + " --format pickle");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--format must be one of onnx, safetensors, got 'pickle'");
  r = run_vtrain("export " + config + " --checkpoint " + dir.path() + " --format onnx");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "export needs --out FILE");
  r = run_vtrain(base + " --checkpoint " + dir.path("nothing") + " --format onnx");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "checkpoint " + dir.path("nothing") + " does not exist");
  r = run_vtrain(base + " --checkpoint " + dir.path() + " --format onnx");  // a folder without any
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "holds no checkpoint");

  // A checkpoint of another model.
  TempDir other;
  Model lenet(other.write("lenet.yaml", "model: {preset: lenet}\n" +
                                            synthetic_data({1, 1, 28, 28})).string());
  lenet.net->init_parameters(1);
  const std::string ckpt = save(lenet, other.path("ckpt"));
  r = run_vtrain(base + " --checkpoint " + ckpt + " --format onnx");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, ckpt);
  EXPECT_EQ(test_support::read_file(out), "old");
}

}  // namespace
}  // namespace vtrain
