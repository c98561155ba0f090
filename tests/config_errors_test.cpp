// The config loader: every class of bad config with its exact message.
#include "configs/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tests/config_test_support.h"
#include "tests/test_support.h"
#include "worker/engine/graph.h"

namespace vtrain::config {
namespace {

using worker::LayerType;

// ---- bad configs: each message names the place, the key and what was expected

TEST(ConfigErrorTest, UnknownTopLevelKey) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "trian:\n  batch: 3\n"),
            "t.yaml:5: trian: unknown key (allowed: model, data, train, optimizer, device, conv, "
            "output, balance, checkpoint, profile, memory)");
}

TEST(ConfigErrorTest, UnknownNestedKey) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  batch: 3\n  bach: 3\n"),
            "t.yaml:7: train.bach: unknown key (allowed: batch, epochs, max_steps, seed, "
            "log_every, evaluate, allreduce_bucket, precision, precisions, loss_scaling, "
            "gradient_allreduce, step_timeout, label_smoothing, ema, target_accuracy)");
}

TEST(ConfigErrorTest, KeyOfAnotherDataKind) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "  train_images: x.gz\n"),
            "t.yaml:5: data.train_images: unknown key for kind synthetic "
            "(allowed: kind, shape, classes, train_size, test_size, mean, std, prefetch, train_transform, "
            "test_transform, workers, prefetch_batches)");
}

TEST(ConfigErrorTest, KeyOfAnotherLayerType) {
  EXPECT_EQ(error_of("model:\n  layers:\n    - {name: d, type: input}\n    - {name: r, type: relu, "
                     "kernel: 3}\n"
                     "data: {kind: synthetic}\n"),
            "t.yaml:4: model.layers[1].kernel: unknown key for a relu layer (allowed: name, type, "
            "inputs)");
}

TEST(ConfigErrorTest, WrongTypes) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  epochs: abc\n"),
            "t.yaml:6: train.epochs: expected an integer >= 1, got 'abc'");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  epochs: 1.5\n"),
            "t.yaml:6: train.epochs: expected an integer >= 1, got '1.5'");
  EXPECT_EQ(error_of(std::string(kMinimal) + "optimizer:\n  lr: fast\n"),
            "t.yaml:6: optimizer.lr: expected a number > 0, got 'fast'");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  evaluate: maybe\n"),
            "t.yaml:6: train.evaluate: expected true or false, got 'maybe'");
  EXPECT_EQ(error_of(std::string(kMinimal) + "conv: {cudnn_graph: 1.5}\n"),
            "t.yaml:5: conv.cudnn_graph: expected true or false, got '1.5'");
  EXPECT_EQ(error_of(std::string(kMinimal) + "conv: {graph_engines: 0}\n"),
            "t.yaml:5: conv.graph_engines: expected an integer in [1, 64], got 0");
  // Any backend's algorithm name passes here (the network refuses one no
  // convolution offers); what cannot be a name does not.
  for (const char* bad : {"Winograd", "direct/", "a/b/c", "im2col gemm"}) {
    EXPECT_EQ(error_of(std::string(kMinimal) + "conv: {algorithm: '" + bad + "'}\n"),
              std::string("t.yaml:5: conv.algorithm: expected auto or a convolution algorithm's "
                          "name (cpu: direct, winograd, im2col_gemm; cuda: cuDNN's, such as "
                          "implicit_gemm or algo_1; either with a variant such as /tf32), got '") +
                  bad + "'");
  }
  EXPECT_EQ(error_of(std::string(kMinimal) + "train: [1, 2]\n"),
            "t.yaml:5: train: expected a map of keys, got a list");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  batch:\n"),
            "t.yaml:6: train.batch: expected an integer >= 1, got nothing");
}

TEST(ConfigErrorTest, NegativeBatch) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  batch: -3\n"),
            "t.yaml:6: train.batch: expected an integer >= 1, got -3");
}

// The optimizers' and the recipe's keys: bad values name the key and the
// range; a key the chosen optimizer.type does not read is refused.
TEST(ConfigErrorTest, OptimizerAndRecipeKeys) {
  const std::string m = kMinimal;
  EXPECT_EQ(error_of(m + "optimizer: {type: adam}\n"),
            "t.yaml:5: optimizer.type: unknown value 'adam' (allowed: sgd, adamw, lars)");
  EXPECT_EQ(error_of(m + "optimizer: {type: adamw, betas: [0.9, 1]}\n"),
            "t.yaml:5: optimizer.betas[1]: expected a number in [0, 1), got 1");
  EXPECT_EQ(error_of(m + "optimizer: {type: adamw, betas: [-0.1, 0.9]}\n"),
            "t.yaml:5: optimizer.betas[0]: expected a number in [0, 1), got -0.1");
  EXPECT_EQ(error_of(m + "optimizer: {type: adamw, betas: [0.9]}\n"),
            "t.yaml:5: optimizer.betas: expected a list [beta1, beta2] of numbers in [0, 1), got "
            "a list of 1");
  EXPECT_EQ(error_of(m + "optimizer: {type: adamw, eps: 0}\n"),
            "t.yaml:5: optimizer.eps: expected a number > 0, got 0");
  EXPECT_EQ(error_of(m + "optimizer: {type: lars, trust: -1}\n"),
            "t.yaml:5: optimizer.trust: expected a number > 0, got -1");
  EXPECT_EQ(error_of(m + "optimizer: {no_decay: [batchnorm, weights]}\n"),
            "t.yaml:5: optimizer.no_decay[1]: unknown value 'weights' (allowed: batchnorm, bias)");
  EXPECT_EQ(error_of(m + "optimizer: {no_decay: [bias, bias]}\n"),
            "t.yaml:5: optimizer.no_decay[1]: 'bias' listed twice");
  EXPECT_EQ(error_of(m + "optimizer: {clip_norm: -1}\n"),
            "t.yaml:5: optimizer.clip_norm: expected a number >= 0, got -1");
  EXPECT_EQ(error_of(m + "optimizer: {nesterov: true}\n"),
            "t.yaml:5: optimizer.nesterov: true needs optimizer.momentum > 0");
  EXPECT_EQ(error_of(m + "optimizer: {betas: [0.9, 0.99]}\n"),
            "t.yaml:5: optimizer.betas: only used with optimizer.type adamw (this config's type "
            "is sgd)");
  EXPECT_EQ(error_of(m + "optimizer: {type: adamw, momentum: 0.9}\n"),
            "t.yaml:5: optimizer.momentum: only used with optimizer.type sgd or lars (this "
            "config's type is adamw)");
  EXPECT_EQ(error_of(m + "optimizer: {type: sgd, trust: 0.01}\n"),
            "t.yaml:5: optimizer.trust: only used with optimizer.type lars (this config's type "
            "is sgd)");
  EXPECT_EQ(error_of(m + "train: {label_smoothing: 1}\n"),
            "t.yaml:5: train.label_smoothing: expected a number in [0, 1), got 1");
  EXPECT_EQ(error_of(m + "train: {label_smoothing: -0.1}\n"),
            "t.yaml:5: train.label_smoothing: expected a number in [0, 1), got -0.1");
  EXPECT_EQ(error_of(m + "train: {ema: 1}\n"),
            "t.yaml:5: train.ema: expected a number in [0, 1), got 1");
  EXPECT_EQ(error_of(m + "train: {target_accuracy: 1.5}\n"),
            "t.yaml:5: train.target_accuracy: expected a number in [0, 1], got 1.5");
  EXPECT_EQ(error_of(m + "train: {evaluate: false, target_accuracy: 0.9}\n"),
            "t.yaml:5: train.target_accuracy: needs train.evaluate: true (the target is the test "
            "accuracy after an epoch)");
  EXPECT_EQ(error_of(m, {"optimizer.type=lars", "optimizer.trust=0"}),
            "--set optimizer.trust: expected a number > 0, got 0");
}

TEST(ConfigErrorTest, OutOfRangeNumbers) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "optimizer: {momentum: 1}\n"),
            "t.yaml:5: optimizer.momentum: expected a number in [0, 1), got 1");
  EXPECT_EQ(error_of(std::string(kMinimal) + "optimizer: {gamma: 0}\n"),
            "t.yaml:5: optimizer.gamma: expected a number in (0, 1], got 0");
  EXPECT_EQ(error_of(std::string(kMinimal) + "optimizer: {weight_decay: -1e-4}\n"),
            "t.yaml:5: optimizer.weight_decay: expected a number >= 0, got -1e-4");
  EXPECT_EQ(error_of(std::string(kMinimal) + "device: {threads: -1}\n"),
            "t.yaml:5: device.threads: expected an integer in [0, 2147483647], got -1");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train: {log_every: 0}\n"),
            "t.yaml:5: train.log_every: expected an integer >= 1, got 0");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train: {step_timeout: -5}\n"),
            "t.yaml:5: train.step_timeout: expected a number >= 0, got -5");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train: {max_steps: 99999999999999999999}\n"),
            "t.yaml:5: train.max_steps: expected an integer >= 0, got 99999999999999999999 (out of "
            "range)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train: {seed: -1}\n"),
            "t.yaml:5: train.seed: expected an integer >= 0, got -1");
  EXPECT_EQ(error_of(std::string(kMinimal) + "balance: {rebalance: {probe_every: -5}}\n"),
            "t.yaml:5: balance.rebalance.probe_every: expected an integer >= 0, got -5");
  EXPECT_EQ(error_of(std::string(kMinimal) + "profile: {step_rounds: 0}\n"),
            "t.yaml:5: profile.step_rounds: expected an integer in [1, 100], got 0");
  EXPECT_EQ(error_of(std::string(kMinimal) + "  workers: [1, 2000]\n"),
            "t.yaml:5: data.workers[1]: expected an integer in [0, 1024], got 2000");
  EXPECT_EQ(error_of(std::string(kMinimal) + "  workers: []\n"),
            "t.yaml:5: data.workers: expected a worker count per rank, got an empty list");
}

TEST(ConfigErrorTest, BadEnumValue) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "optimizer:\n  schedule: linear\n"),
            "t.yaml:6: optimizer.schedule: unknown value 'linear' (allowed: none, step, cosine)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "device: {backend: tpu}\n"),
            "t.yaml:5: device.backend: unknown value 'tpu' (allowed: auto, cpu, cuda)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "device: {layout: nchw16c}\n"),
            "t.yaml:5: device.layout: unknown value 'nchw16c' (allowed: auto, nchw, nhwc)");
  EXPECT_EQ(error_of("model:\n  preset: lenet\n  batch_norm: global\ndata: {kind: synthetic}\n"),
            "t.yaml:3: model.batch_norm: unknown value 'global' (allowed: sync, local)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  precision: half\n"),
            "t.yaml:6: train.precision: unknown value 'half' (allowed: fp32, tf32, bf16, fp16, "
            "auto); or a list of one per rank, or a map from device names");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  precision: [fp32, half]\n"),
            "t.yaml:6: train.precision[1]: unknown value 'half' (allowed: fp32, tf32, bf16, fp16)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  precision: []\n"),
            "t.yaml:6: train.precision: expected a precision per rank, got an empty list");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  precisions: [bf16, fp32, bf16]\n"),
            "t.yaml:6: train.precisions[2]: 'bf16' is listed twice");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  precisions: fp32\n"),
            "t.yaml:6: train.precisions: expected a list of precisions in order of preference, "
            "got 'fp32'");
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  gradient_allreduce: bf16\n"),
            "t.yaml:6: train.gradient_allreduce: unknown value 'bf16' (allowed: fp32, half)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "  prefetch: yes\n"),
            "t.yaml:5: data.prefetch: unknown value 'yes' (allowed: auto, on, off)");
  // half is the precision's half type: fp32 and tf32 have none.
  for (const char* precision : {"fp32", "tf32"}) {
    EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  precision: " + precision +
                       "\n  gradient_allreduce: half\n"),
              std::string("t.yaml:7: train.gradient_allreduce: expected fp32 under "
                          "train.precision ") +
                  precision + " (half is the half type of train.precision bf16 or fp16)");
  }
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  loss_scaling: {initial: 1000}\n"),
            "t.yaml:6: train.loss_scaling.initial: expected a power of two in [2^-24, 2^127] "
            "(scaling by one is exact)");
}

TEST(ConfigErrorTest, BadSizeString) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "device:\n  memory_limit: 64XB\n"),
            "t.yaml:6: device.memory_limit: invalid size '64XB': unknown unit 'XB' (known: B, k, "
            "kB, M, MB, G, GB, "
            "T, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024))");
}

TEST(ConfigErrorTest, MissingIdxFileKey) {
  EXPECT_EQ(error_of("model:\n  preset: lenet\ndata:\n  kind: idx\n  train_images: a.gz\n  "
                     "train_labels: b.gz\n"
                     "  test_images: c.gz\n"),
            "t.yaml:3: data.test_labels: missing "
            "(kind idx needs train_images, train_labels, test_images and test_labels)");
}

TEST(ConfigErrorTest, MissingSection) {
  EXPECT_EQ(error_of("model: {preset: lenet}\n"),
            "t.yaml: data: missing (every config needs model and data sections)");
  EXPECT_EQ(error_of(""), "t.yaml: data: missing (every config needs model and data sections)");
  EXPECT_EQ(error_of("just text\n"), "t.yaml: expected a map of keys, got 'just text'");
}

TEST(ConfigErrorTest, DuplicateKey) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "train:\n  batch: 3\n  batch: 4\n"),
            "t.yaml:7: train.batch: duplicate key (first at line 6)");
}

TEST(ConfigErrorTest, MeanAndStdGoTogether) {
  EXPECT_EQ(error_of(std::string(kMinimal) + "  mean: [0.5]\n"),
            "t.yaml:3: data.std: missing (mean and std go together)");
  EXPECT_EQ(
      error_of(std::string(kMinimal) + "  shape: [3, 8, 8]\n  mean: [0.5]\n  std: [1, 1, 1]\n"),
      "t.yaml:6: data.mean: expected 3 values (one per channel), got 1");
  EXPECT_EQ(error_of(std::string(kMinimal) + "  mean: [0.5]\n  std: [0]\n"),
            "t.yaml:6: data.std[0]: expected a number > 0, got 0");
}

TEST(ConfigErrorTest, PresetAndLayersBothGiven) {
  EXPECT_EQ(error_of("model:\n  preset: lenet\n  layers:\n    - {name: data, type: input}\ndata: "
                     "{kind: synthetic}\n"),
            "t.yaml:1: model: give one of preset, layers and onnx, not several");
}

TEST(ConfigErrorTest, LayersSetOverAPreset) {
  EXPECT_EQ(error_of(kMinimal, {"model.layers=[{name: d, type: input}]"}),
            "--set model.layers: give one of preset, layers and onnx, not several");
}

TEST(ConfigErrorTest, OnnxSetOverAPreset) {
  EXPECT_EQ(error_of(kMinimal, {"model.onnx=m.onnx"}),
            "--set model.onnx: give one of preset, layers and onnx, not several");
}

TEST(ConfigErrorTest, NeitherPresetNorLayers) {
  EXPECT_EQ(error_of("model: {}\ndata: {kind: synthetic}\n"),
            "t.yaml:1: model: missing preset, layers or onnx (known presets: " +
                join(worker::preset_names()) + ")");
}

TEST(ConfigErrorTest, UnknownPresetListsKnownOnes) {
  const std::string message = error_of("model:\n  preset: lenet5\ndata:\n  kind: synthetic\n");
  EXPECT_EQ(message, "t.yaml:2: model.preset: unknown preset 'lenet5' (known: " +
                         join(worker::preset_names()) + ")");
  for (const char* name : {"lenet", "vgg-small", "resnet18"}) {
    EXPECT_NE(message.find(name), std::string::npos) << name;
  }
}

TEST(ConfigErrorTest, PresetClassesDisagreeWithData) {
  EXPECT_EQ(error_of("model:\n  preset: lenet\n  classes: 5\ndata:\n  kind: synthetic\n"),
            "t.yaml:3: model.classes: 5 classes, but data.classes is 10");
}

TEST(ConfigErrorTest, DuplicateLayerName) {
  EXPECT_EQ(
      error_of(R"(model:
  layers:
    - {name: data, type: input}
    - {name: conv1, type: conv, out: 4, kernel: 3}
    - {name: conv1, type: relu}
data: {kind: synthetic}
)"),
      "t.yaml:5: model.layers[2].name: duplicate layer name 'conv1' (first at model.layers[1])");
}

TEST(ConfigErrorTest, UnknownLayerTypeListsKnownOnes) {
  EXPECT_EQ(error_of("model:\n  layers:\n    - {name: data, type: input}\n    - {name: fc1, type: "
                     "dense, out: 10}\n"
                     "data: {kind: synthetic}\n"),
            "t.yaml:4: model.layers[1].type: unknown layer type 'dense' "
            "(known: input, conv, relu, pool, fc, batchnorm, add, concat, silu, gelu, sigmoid, "
            "relu6, mul, dropout)");
}

TEST(ConfigErrorTest, BadKernelListLength) {
  EXPECT_EQ(
      error_of("model:\n  layers:\n    - {name: data, type: input}\n"
               "    - {name: c, type: conv, out: 4, kernel: [3, 3, 3]}\ndata: {kind: synthetic}\n"),
      "t.yaml:4: model.layers[1].kernel: expected an integer >= 1 or a list [h, w], got a list of "
      "3");
}

TEST(ConfigErrorTest, LayerProblems) {
  const std::string data = "data: {kind: synthetic}\n";
  EXPECT_EQ(error_of("model:\n  layers:\n    - {name: data, type: input}\n    - {name: c, type: "
                     "conv, kernel: 3}\n" +
                     data),
            "t.yaml:4: model.layers[1].out: missing (a conv layer needs out)");
  EXPECT_EQ(error_of("model:\n  layers:\n    - {name: data, type: input}\n    - {name: a, type: "
                     "add, inputs: [data, x]}\n" +
                     data),
            "t.yaml:4: model.layers[1].inputs[1]: unknown layer 'x' (layers: data, a)");
  EXPECT_EQ(error_of("model:\n  layers:\n    - {name: r, type: relu}\n" + data),
            "t.yaml:3: model.layers[0].inputs: missing (the first layer has no previous layer to "
            "take as input)");
  EXPECT_EQ(error_of("model:\n  layers:\n    - {name: data, type: input}\n"
                     "    - {name: p, type: pool, global: true, kernel: 2}\n" +
                     data),
            "t.yaml:4: model.layers[1].kernel: not used with global: true");
  EXPECT_EQ(error_of("model:\n  layers:\n    - {type: input}\n" + data),
            "t.yaml:3: model.layers[0].name: missing (every layer needs a name)");
  EXPECT_EQ(error_of("model:\n  layers:\n    - data\n" + data),
            "t.yaml:3: model.layers[0]: expected a map such as {name: conv1, type: conv, ...}, got "
            "'data'");
  EXPECT_EQ(error_of("model:\n  layers:\n    - {name: data, type: input}\n"
                     "    - {name: d, type: dropout, p: 1}\n" + data),
            "t.yaml:4: model.layers[1].p: expected a number in [0, 1), got 1");
  EXPECT_EQ(error_of("model:\n  layers:\n    - {name: data, type: input}\n"
                     "    - {name: c, type: conv, out: 4, kernel: 3, groups: 0}\n" + data),
            "t.yaml:4: model.layers[1].groups: expected an integer >= 1, got 0");
  EXPECT_EQ(error_of("model:\n  layers:\n    - {name: data, type: input}\n"
                     "    - {name: r, type: relu6, p: 0.5}\n" + data),
            "t.yaml:4: model.layers[1].p: unknown key for a relu6 layer (allowed: name, type, "
            "inputs)");
  EXPECT_EQ(error_of("model:\n  layers: []\n" + data),
            "t.yaml:2: model.layers: expected a list of layers, got an empty list");
}

TEST(ConfigErrorTest, SetWithUnknownKey) {
  EXPECT_EQ(error_of(kMinimal, {"train.bogus=1"}),
            "--set train.bogus: unknown key (allowed: batch, epochs, max_steps, seed, log_every, "
            "evaluate, allreduce_bucket, precision, precisions, loss_scaling, gradient_allreduce, "
            "step_timeout, label_smoothing, ema, target_accuracy)");
  EXPECT_EQ(
      error_of(kMinimal, {"bogus.x=1"}),
      "--set bogus: unknown key (allowed: model, data, train, optimizer, device, conv, output, "
      "balance, checkpoint, profile, memory)");
}

TEST(ConfigErrorTest, SetValueIsValidatedLikeTheFile) {
  EXPECT_EQ(error_of(kMinimal, {"train.batch=-3"}),
            "--set train.batch: expected an integer >= 1, got -3");
  EXPECT_EQ(error_of(kMinimal, {"optimizer={lr: 0}"}),
            "--set optimizer.lr: expected a number > 0, got 0");
}

TEST(ConfigErrorTest, MalformedSet) {
  EXPECT_EQ(error_of(kMinimal, {"train.batch"}),
            "--set train.batch: expected KEY.PATH=VALUE, e.g. train.batch=32");
  EXPECT_EQ(error_of(kMinimal, {"train..batch=3"}), "--set train..batch: empty name in key path");
  EXPECT_EQ(error_of(kMinimal, {"model.preset.x=3"}),
            "--set model.preset.x: model.preset is not a map of keys");
  EXPECT_EQ(error_of(kMinimal, {"data.mean=[0.5"}),
            "--set data.mean: invalid YAML value: end of sequence flow not found");
}

TEST(ConfigErrorTest, YamlSyntaxError) {
  EXPECT_EQ(error_of("model:\n  preset: [lenet\ndata:\n  kind: idx\n"),
            "t.yaml:3:5: YAML syntax error: end of sequence flow not found");
}

TEST(ConfigErrorTest, YamlSyntaxErrorInAFileNamesTheFile) {
  const TempDir dir;
  const fs::path file = dir.write("bad.yaml", "model:\n  preset: lenet\n data: 1\n");
  try {
    load_config(file.string());
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()),
              file.string() + ":3:2: YAML syntax error: end of map not found");
  }
}

TEST(ConfigErrorTest, MissingFile) {
  try {
    load_config("/nonexistent/vtrain.yaml");
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()),
              "cannot open config /nonexistent/vtrain.yaml: No such file or directory");
  }
}

TEST(ConfigErrorTest, ErrorsInAFileNameTheFileAndLine) {
  const TempDir dir;
  const fs::path file = dir.write("x.yaml", std::string(kMinimal) + "\n\ntrain:\n  batch: -3\n");
  try {
    load_config(file.string());
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()),
              file.string() + ":8: train.batch: expected an integer >= 1, got -3");
  }
}

}  // namespace
}  // namespace vtrain::config
