// model.init and model.init_skip as users meet them through the vtrain
// executable: a run started from an exported file trains exactly as a run
// resumed from a checkpoint holding those weights (with init_skip, those
// of the skipped layers freshly initialised); a resumed run never applies
// model.init again; a file that does not fit is refused listing every
// mismatch, nothing trained; and fine-tuning a model trained on one
// synthetic dataset beats training from scratch on another.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "configs/config.h"
#include "configs/config_limits.h"
#include "model_io/weight_names.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/network.h"
#include "worker/train/checkpoint.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using test_support::RunResult;
using test_support::TempDir;

std::string dag_config() { return test_support::source_dir() + "/configs/custom-dag.yaml"; }
std::string lenet_config() { return test_support::source_dir() + "/configs/synthetic-lenet.yaml"; }

// The custom DAG (convs, batch norms, an fc) on a little synthetic data,
// batch 16, plain SGD: a few steps take a second.
std::string dag_run(const std::string& extra) {
  return "train " + dag_config() +
         " --set train.batch=16 --set data.train_size=64 --set data.test_size=16"
         " --set train.evaluate=false --set conv.algorithm=direct --set device.threads=1"
         " --set optimizer.momentum=0.9 --progress off " +
         extra;
}

std::string export_to(const std::string& config, const std::string& checkpoint,
                      const std::string& out, const std::string& extra = "") {
  const RunResult r = test_support::run_vtrain("export " + config + " --checkpoint " + checkpoint +
                                               " --format safetensors --out " + out + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

worker::Checkpoint newest(const std::string& dir) {
  const std::optional<std::string> path = worker::latest_checkpoint(dir);
  if (!path) throw std::runtime_error("no checkpoint in " + dir);
  return worker::load_checkpoint(*path);
}

// A step-0 checkpoint of `weights`' model for a run of `batch` and `seed`:
// what a run resumed from it starts with is exactly those weights.
void write_start(const std::string& dir, const worker::Checkpoint& weights, int64_t batch,
                 uint64_t seed) {
  worker::Checkpoint start;
  start.model_signature = weights.model_signature;
  start.seed = seed;
  start.global_batch = batch;
  start.split = {batch};
  start.parameters = weights.parameters;
  start.buffers = weights.buffers;
  start.velocity.assign(weights.parameters.size(), 0.0f);
  worker::save_checkpoint(dir, start, 1);
}

void expect_same_weights(const worker::Checkpoint& a, const worker::Checkpoint& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_TRUE(a.parameters == b.parameters) << "parameters differ";
  EXPECT_TRUE(a.buffers == b.buffers) << "buffers differ";
  EXPECT_TRUE(a.velocity == b.velocity) << "velocity differs";
}

// C: 3 steps of seed 5, resumed from a step-0 checkpoint of `start`'s
// weights in `tmp`/c, must end with what run B (in `tmp`/b) ended with.
void expect_resumed_run_equals_b(const TempDir& tmp, const worker::Checkpoint& start) {
  write_start(tmp.path("c"), start, 16, 5);
  const RunResult c = test_support::run_vtrain(
      dag_run("--set train.seed=5 --set train.max_steps=3 --resume --set checkpoint.dir=" +
              tmp.path("c")));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  expect_same_weights(newest(tmp.path("b")), newest(tmp.path("c")));
}

// A: 8 steps of the DAG into `dir`/a, exported to `dir`/a.safetensors.
std::string trained_dag(const TempDir& tmp) {
  const RunResult a = test_support::run_vtrain(
      dag_run("--set train.max_steps=8 --set checkpoint.dir=" + tmp.path("a")));
  EXPECT_EQ(a.exit_code, 0) << a.output;
  const std::string file = tmp.path("a.safetensors");
  EXPECT_CONTAINS(export_to(dag_config(), tmp.path("a"), file), "vtrain names");
  return file;
}

TEST(WeightsInit, ARunFromAnExportTrainsAsOneResumedFromItsWeights) {
  const TempDir tmp;
  const std::string file = trained_dag(tmp);
  const worker::Checkpoint a = newest(tmp.path("a"));
  // B: from model.init, seed 5 (its own fresh initialisation is replaced).
  const RunResult b = test_support::run_vtrain(
      dag_run("--set train.seed=5 --set train.max_steps=3 --set model.init=" + file +
              " --set checkpoint.dir=" + tmp.path("b")));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_CONTAINS(b.output, "model.init: 19 tensors from " + file);
  // C: resumed from a step-0 checkpoint of A's weights.
  expect_resumed_run_equals_b(tmp, a);
}

TEST(WeightsInit, SkippedLayersKeepTheirFreshInitialisation) {
  const TempDir tmp;
  const std::string file = trained_dag(tmp);
  const worker::Checkpoint a = newest(tmp.path("a"));
  const RunResult b = test_support::run_vtrain(
      dag_run("--set train.seed=5 --set train.max_steps=3 --set model.init=" + file +
              " --set 'model.init_skip=[fc, bn1]' --set checkpoint.dir=" + tmp.path("b")));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_CONTAINS(b.output, "model.init: 13 tensors from " + file +
                                "; freshly initialised: fc, bn1");

  // What B must have started from: A's weights but fc's and bn1's, which
  // are those of seed 5's initialisation.
  const config::Config cfg = config::load_config(dag_config(), {});
  const worker::Graph graph = config::build_model(cfg, {1, 1, 28, 28});
  worker::BackendOptions backend_options;
  backend_options.kind = worker::BackendKind::kCpu;
  const auto backend = worker::make_backend(backend_options);
  worker::NetworkOptions options;
  options.max_batch = 1;
  options.conv_algorithm = "direct";
  worker::Network fresh(graph, *backend, options);
  fresh.init_parameters(5);
  worker::Checkpoint start = a;
  const std::vector<float> params = fresh.download_parameters();
  const std::vector<float> buffers = fresh.download_buffers();
  int skipped = 0;
  for (const model_io::ModelTensor& t : model_io::model_tensors(graph, "")) {
    const std::string& layer = graph.layer(t.layer).name;
    if (layer != "fc" && layer != "bn1") continue;
    ++skipped;
    const std::vector<float>& from = t.kind == model_io::WeightKind::kParameter ? params : buffers;
    std::vector<float>& to =
        t.kind == model_io::WeightKind::kParameter ? start.parameters : start.buffers;
    std::copy(from.begin() + t.offset, from.begin() + t.offset + t.elements(),
              to.begin() + t.offset);
  }
  ASSERT_EQ(skipped, 6);  // fc weight and bias, bn1's four
  expect_resumed_run_equals_b(tmp, start);
}

// A requeued or elastic run continues its checkpoint: model.init is not
// read again (here it no longer exists), and the run goes on exactly as
// a resume without it.
TEST(WeightsInit, AResumedRunNeverReappliesModelInit) {
  const TempDir tmp;
  const std::string file = trained_dag(tmp);
  const std::string init = " --set model.init=" + file + " --set 'model.init_skip=[fc]'";
  const RunResult first = test_support::run_vtrain(
      dag_run("--set train.max_steps=2 --set checkpoint.dir=" + tmp.path("b") + init));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  fs::copy(tmp.path("b"), tmp.path("c"));
  fs::remove(file);
  const RunResult with_init = test_support::run_vtrain(
      dag_run("--set train.max_steps=4 --resume --set checkpoint.dir=" + tmp.path("b") + init));
  ASSERT_EQ(with_init.exit_code, 0) << with_init.output;
  EXPECT_EQ(with_init.output.find("model.init:"), std::string::npos) << with_init.output;
  const RunResult without = test_support::run_vtrain(
      dag_run("--set train.max_steps=4 --resume --set checkpoint.dir=" + tmp.path("c")));
  ASSERT_EQ(without.exit_code, 0) << without.output;
  expect_same_weights(newest(tmp.path("b")), newest(tmp.path("c")));
}

// LeNet on synthetic data with `classes` classes, 1 epoch.
std::string lenet_run(int classes, int train_size, int batch, const std::string& lr,
                      const std::string& extra) {
  return "train " + lenet_config() + " --set data.classes=" + std::to_string(classes) +
         " --set data.train_size=" + std::to_string(train_size) +
         " --set train.batch=" + std::to_string(batch) + " --set optimizer.lr=" + lr +
         " --set train.epochs=1 --set conv.algorithm=direct --progress off " + extra;
}

TEST(WeightsInit, AFileThatDoesNotFitIsRefusedListingEveryMismatchAndNothingTrains) {
  const TempDir tmp;
  const RunResult a = test_support::run_vtrain(lenet_run(
      10, 128, 64, "0.05", "--set data.test_size=16 --set checkpoint.dir=" + tmp.path("a")));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string file = tmp.path("lenet.safetensors");
  export_to(lenet_config(), tmp.path("a"), file);

  // Another class count: both shapes of both classifier tensors.
  const RunResult classes = test_support::run_vtrain(lenet_run(
      5, 128, 64, "0.05", "--set model.init=" + file + " --set checkpoint.dir=" + tmp.path("b")));
  EXPECT_EQ(classes.exit_code, 1) << classes.output;
  EXPECT_CONTAINS(classes.output, file + " does not fit the model (8 tensors); nothing was loaded");
  EXPECT_CONTAINS(classes.output,
                  "tensor 'fc4.weight': the file has shape [10, 500], the model [5, 500] (layer fc4)");
  EXPECT_CONTAINS(classes.output,
                  "tensor 'fc4.bias': the file has shape [10], the model [5] (layer fc4)");
  EXPECT_FALSE(worker::latest_checkpoint(tmp.path("b"))) << "a refused run wrote a checkpoint";

  // Another model: what the file has that the model lacks, and the reverse,
  // in one error.
  const RunResult other = test_support::run_vtrain(
      dag_run("--set train.max_steps=1 --set model.init=" + file));
  EXPECT_EQ(other.exit_code, 1) << other.output;
  EXPECT_CONTAINS(other.output, "in the file but not in the model (7): conv1.bias, conv2.weight,");
  EXPECT_CONTAINS(other.output, "in the model but not in the file (18): bn1.weight, bn1.bias,");
  EXPECT_CONTAINS(other.output, "tensor 'conv1.weight': the file has shape [20, 1, 5, 5], the "
                                "model [16, 1, 3, 3] (layer conv1)");
  EXPECT_CONTAINS(other.output, "branch1.weight, branch1.bias, fc.weight, fc.bias\n");
}

TEST(WeightsInit, BadFilesAndSettingsAreRefusedBeforeTraining) {
  const TempDir tmp;
  const std::string truncated = tmp.write("t.safetensors", std::string("\x10\0\0\0", 4)).string();
  const RunResult cut = test_support::run_vtrain(
      lenet_run(10, 64, 64, "0.05", "--set model.init=" + truncated));
  EXPECT_EQ(cut.exit_code, 1) << cut.output;
  EXPECT_CONTAINS(cut.output, truncated + ": truncated: 4 bytes");
  const RunResult missing = test_support::run_vtrain(
      lenet_run(10, 64, 64, "0.05", "--set model.init=" + tmp.path("absent.safetensors")));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_CONTAINS(missing.output, "cannot read " + tmp.path("absent.safetensors"));

  const RunResult unknown = test_support::run_vtrain(
      "check " + lenet_config() + " --set model.init=" + truncated + " --set 'model.init_skip=[fc9]'");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_CONTAINS(unknown.output, "model.init_skip: unknown layer 'fc9' (layers with weights: "
                                  "conv1, conv2, fc3, fc4)");
  const RunResult weightless = test_support::run_vtrain(
      "check " + lenet_config() + " --set model.init=" + truncated + " --set 'model.init_skip=[pool1]'");
  EXPECT_EQ(weightless.exit_code, 2) << weightless.output;
  EXPECT_CONTAINS(weightless.output, "layer 'pool1' has no weights to skip");
  const RunResult alone =
      test_support::run_vtrain("check " + lenet_config() + " --set 'model.init_skip=[fc4]'");
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_CONTAINS(alone.output, "model.init_skip: only used with model.init");
}

// torchvision's names go both ways: resnet18's export (torchvision names)
// starts a resnet18 of another class count, its classifier skipped by
// torchvision's module name as well as by vtrain's.
TEST(WeightsInit, TorchvisionNamedFilesStartAModelForAnotherClassCount) {
  const TempDir tmp;
  const std::string config =
      tmp.write("r.yaml",
                "model: {preset: resnet18}\n"
                "data: {kind: synthetic, shape: [3, 32, 32], classes: 10, train_size: 2, "
                "test_size: 2}\n"
                "train: {batch: 2, max_steps: 1, evaluate: false}\n"
                "conv: {algorithm: direct}\n")
          .string();
  const RunResult a = test_support::run_vtrain("train " + config + " --progress off --set "
                                               "checkpoint.dir=" + tmp.path("a"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string file = tmp.path("r.safetensors");
  EXPECT_CONTAINS(export_to(config, tmp.path("a"), file), "122 tensors");
  const std::string other = " --set data.classes=7 --set model.init=" + file;
  const RunResult fits = test_support::run_vtrain("check " + config + other +
                                                  " --set 'model.init_skip=[fc]'");
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_CONTAINS(fits.output, "model.init: 100 tensors from " + file + "; freshly initialised: fc");
  const RunResult refused = test_support::run_vtrain("check " + config + other);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_CONTAINS(refused.output, "tensor 'fc.weight': the file has shape [10, 512], the model "
                                  "[7, 512] (layer fc)");
}

double test_accuracy(const std::string& output) {
  std::smatch m;
  const std::regex pattern("test accuracy ([0-9.]+)");
  if (!std::regex_search(output, m, pattern)) return -1;
  return std::stod(m[1]);
}

// The fine-tuning test. A: LeNet trained for an epoch on synthetic
// data of 10 classes. B: 6 classes of the same seed, so of 6 of A's kinds
// of image, but new samples and a new classifier: 60 training samples, one
// epoch of 6 steps at a small learning rate. From A's weights (fc4, the
// classifier, skipped) B reaches a far higher test accuracy than from
// scratch (seeds 1, 2, 3: 1.00 / 1.00 / 1.00 against 0.64 / 0.55 / 0.57 when
// this was written); the test asks for a margin of 0.2.
TEST(WeightsInit, FineTuningFromAnotherDatasetBeatsTrainingFromScratch) {
  const TempDir tmp;
  const RunResult a = test_support::run_vtrain(
      lenet_run(10, 2048, 64, "0.05", "--set checkpoint.dir=" + tmp.path("a")));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string file = tmp.path("a.safetensors");
  export_to(lenet_config(), tmp.path("a"), file);
  const std::string b = "--set data.test_size=300 --set optimizer.momentum=0.9";
  const RunResult scratch = test_support::run_vtrain(lenet_run(6, 60, 10, "0.01", b));
  ASSERT_EQ(scratch.exit_code, 0) << scratch.output;
  const RunResult tuned = test_support::run_vtrain(lenet_run(
      6, 60, 10, "0.01", b + " --set model.init=" + file + " --set 'model.init_skip=[fc4]'"));
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  const double from_scratch = test_accuracy(scratch.output);
  const double fine_tuned = test_accuracy(tuned.output);
  std::printf("test accuracy after one epoch on B: from scratch %.4f, fine-tuned from A %.4f\n",
              from_scratch, fine_tuned);
  ASSERT_GE(from_scratch, 0) << scratch.output;
  EXPECT_GE(fine_tuned, from_scratch + 0.2) << "scratch:\n" << scratch.output << "\ntuned:\n"
                                            << tuned.output;
}

}  // namespace
}  // namespace vtrain
