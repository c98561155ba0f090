// The config loader: good configs and their fields, parse_size, to_yaml,
// and the shipped examples (bad configs: config_errors_test.cpp).
#include "configs/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "configs/config_limits.h"
#include "tests/config_test_support.h"
#include "tests/test_support.h"
#include "worker/engine/graph.h"

namespace vtrain::config {
namespace {

using worker::LayerType;

// ---- good configs -----------------------------------------------------------

TEST(ConfigTest, MinimalConfigTakesDefaults) {
  const Config c = parse(kMinimal);
  EXPECT_EQ(c.path, "t.yaml");
  EXPECT_EQ(c.model.preset, "lenet");
  EXPECT_TRUE(c.model.layers.empty());
  EXPECT_EQ(c.model.classes, 10);
  EXPECT_EQ(c.model.batch_norm, worker::BatchNormMode::kSync);
  EXPECT_EQ(c.compute.precision, common::Precision::kFp32);
  EXPECT_EQ(c.data.kind, worker::DataKind::kSynthetic);
  EXPECT_EQ(c.data.shape, (worker::Shape{1, 1, 28, 28}));
  EXPECT_EQ(c.data.classes, 10);
  EXPECT_EQ(c.data.train_size, 1024);
  EXPECT_EQ(c.data.test_size, 256);
  EXPECT_TRUE(c.data.mean.empty());
  EXPECT_TRUE(c.data.stddev.empty());
  EXPECT_EQ(c.data.prefetch, common::AutoOnOff::kAuto);
  EXPECT_EQ(c.train.batch, 64);
  EXPECT_EQ(c.train.epochs, 1);
  EXPECT_EQ(c.train.max_steps, 0);
  EXPECT_EQ(c.train.seed, 1u);
  EXPECT_EQ(c.train.log_every, 50);
  EXPECT_EQ(c.train.step_timeout, 600);
  EXPECT_TRUE(c.train.evaluate);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  EXPECT_DOUBLE_EQ(c.optimizer.momentum, 0.0);
  EXPECT_EQ(c.optimizer.schedule, worker::ScheduleKind::kNone);
  EXPECT_EQ(c.device.backend, worker::BackendKind::kAuto);
  EXPECT_EQ(c.compute.layout, worker::LayoutChoice::kAuto);
  EXPECT_EQ(c.device.threads, 0);
  EXPECT_EQ(c.device.memory_limit, 0u);
  EXPECT_EQ(c.conv.algorithm, "auto");
  EXPECT_TRUE(c.conv.cudnn_graph);
  EXPECT_EQ(c.conv.graph_engines, 10);
  EXPECT_EQ(c.output.metrics, "");
  EXPECT_EQ(c.output.progress, worker::ProgressSetting::kAuto);
}

TEST(ConfigTest, EveryKeyIsRead) {
  const Config c = parse(R"(
model:
  preset: vgg-small
  classes: 5
data:
  kind: synthetic
  shape: [3, 32, 16]
  classes: 5
  train_size: 100
  test_size: 20
  mean: [0.5, 0.25, 0]
  std: [1, 2, 0.5]
  prefetch: off
train: {batch: 32, epochs: 3, max_steps: 7, seed: 18446744073709551615,
        log_every: 5, evaluate: false}
optimizer:
  lr: 1e-3
  momentum: 0.5
  weight_decay: 5e-4
  schedule: step
  step_epochs: 2
  gamma: 0.5
  warmup_steps: 10
device: {backend: cpu, threads: 4, memory_limit: 1.5GB, layout: nhwc}
conv: {algorithm: winograd, cudnn_graph: false, graph_engines: 16, fuse_relu: off}
output: {metrics: /tmp/m.jsonl, progress: line}
)");
  EXPECT_EQ(c.model.preset, "vgg-small");
  EXPECT_EQ(c.model.classes, 5);
  EXPECT_EQ(c.data.shape, (worker::Shape{1, 3, 32, 16}));
  EXPECT_EQ(c.data.classes, 5);
  EXPECT_EQ(c.data.train_size, 100);
  EXPECT_EQ(c.data.test_size, 20);
  EXPECT_EQ(c.data.mean, (std::vector<float>{0.5f, 0.25f, 0.0f}));
  EXPECT_EQ(c.data.stddev, (std::vector<float>{1.0f, 2.0f, 0.5f}));
  EXPECT_EQ(c.data.prefetch, common::AutoOnOff::kOff);
  EXPECT_EQ(c.train.batch, 32);
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_EQ(c.train.max_steps, 7);
  EXPECT_EQ(c.train.seed, 18446744073709551615u);
  EXPECT_EQ(c.train.log_every, 5);
  EXPECT_FALSE(c.train.evaluate);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.momentum, 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 5e-4);
  EXPECT_EQ(c.optimizer.schedule, worker::ScheduleKind::kStep);
  EXPECT_EQ(c.optimizer.step_epochs, 2);
  EXPECT_DOUBLE_EQ(c.optimizer.gamma, 0.5);
  EXPECT_EQ(c.optimizer.warmup_steps, 10);
  EXPECT_EQ(c.device.backend, worker::BackendKind::kCpu);
  EXPECT_EQ(c.device.threads, 4);
  EXPECT_EQ(c.device.memory_limit, 1'500'000'000u);
  EXPECT_EQ(c.compute.layout, worker::LayoutChoice::kNhwc);
  EXPECT_EQ(c.conv.algorithm, "winograd");
  EXPECT_FALSE(c.conv.cudnn_graph);
  EXPECT_EQ(c.conv.graph_engines, 16);
  EXPECT_EQ(c.compute.fuse_relu, common::AutoOnOff::kOff);
  // The settings that change how a step computes, beside the model (whose
  // signature they leave alone).
  const common::ComputeSettings settings = compute_settings(c);
  EXPECT_EQ(settings.precision, c.compute.precision);
  EXPECT_EQ(settings.layout, common::LayoutChoice::kNhwc);
  EXPECT_EQ(settings.fuse_relu, common::AutoOnOff::kOff);
  EXPECT_EQ(c.output.metrics, "/tmp/m.jsonl");
  EXPECT_EQ(c.output.progress, worker::ProgressSetting::kLine);
}

TEST(ConfigTest, PresetClassesFollowSyntheticData) {
  const Config c = parse(std::string(kMinimal) + "  classes: 4\n");
  EXPECT_EQ(c.model.classes, 4);
}

TEST(ConfigTest, EmptySectionMeansDefaults) {
  const Config c = parse(std::string(kMinimal) + "train:\noutput:\n");
  EXPECT_EQ(c.train.batch, 64);
}

TEST(ConfigTest, MemoryLimitTakesUnitsOrBytes) {
  EXPECT_EQ(parse(std::string(kMinimal) + "device: {memory_limit: 64MiB}\n").device.memory_limit,
            64u << 20);
  EXPECT_EQ(parse(std::string(kMinimal) + "device: {memory_limit: 4096}\n").device.memory_limit,
            4096u);
  EXPECT_EQ(parse(std::string(kMinimal) + "device: {memory_limit: 2k}\n").device.memory_limit,
            2000u);
}

// Every run setting the config holds under a plain key (common::kSettings)
// is read from that key by its row, dumped under it and read back, for
// each of its values; a value it lacks is refused listing its choices.
TEST(ConfigTest, EveryRunSettingIsReadAndDumpedUnderItsKey) {
  for (const common::Setting& setting : common::kSettings) {
    if (!setting.plain_config_key) continue;
    const std::string key = setting.config_key;
    const size_t dot = key.find('.');
    for (const std::string& value : setting.choices()) {
      SCOPED_TRACE(key + " " + value);
      const Config c = parse(std::string(kMinimal) + key.substr(0, dot) + ": {" +
                             key.substr(dot + 1) + ": " + value + "}\n");
      EXPECT_EQ(setting.text(c.compute), value);
      const Config again = parse(to_yaml(c));
      EXPECT_EQ(again.compute, c.compute);
    }
    EXPECT_EQ(error_of(std::string(kMinimal) + key.substr(0, dot) + ": {" + key.substr(dot + 1) +
                       ": sideways}\n"),
              "t.yaml:5: " + key + ": unknown value 'sideways' (allowed: " +
                  common::join(setting.choices()) + ")");
  }
}

TEST(ConfigTest, MemoryPolicyNamesTheVdnnSchedulesAndThePerTensorPlanners) {
  for (const char* name :
       {"none", "all", "conv", "dyn", "auto", "memonger", "superneurons", "tflms"}) {
    const Config c = parse(std::string(kMinimal) + "memory: {policy: " + name + "}\n");
    EXPECT_STREQ(memory::policy_name(c.memory.policy), name);
    EXPECT_EQ(parse(to_yaml(c)).memory.policy, c.memory.policy) << name;
  }
  EXPECT_EQ(error_of(std::string(kMinimal) + "memory: {policy: checkmate}\n"),
            "t.yaml:5: memory.policy: unknown value 'checkmate' (allowed: none, all, conv, dyn, "
            "auto, memonger, superneurons, tflms)");
}

TEST(ConfigTest, ExplicitLayers) {
  const Config c = parse(R"(model:
  layers:
    - {name: data, type: input}
    - {name: conv1, type: conv, out: 8, kernel: [3, 5], stride: 2, pad: [1, 2], bias: false}
    - {name: bn1, type: batchnorm, eps: 1e-3, momentum: 0.2}
    - name: r1
      type: relu
    - {name: pool1, type: pool, mode: avg, kernel: 2}
    - {name: side, type: conv, out: 8, kernel: 1, inputs: [r1]}
    - {name: sum, type: add, inputs: [pool1, side]}
    - {name: cat, type: concat, inputs: [sum, pool1]}
    - {name: gap, type: pool, mode: max, global: true}
    - {name: fc, type: fc, out: 10, inputs: gap}
data:
  kind: synthetic
)");
  EXPECT_TRUE(c.model.preset.empty());
  const auto& layers = c.model.layers;
  ASSERT_EQ(layers.size(), 10u);

  EXPECT_EQ(layers[0].name, "data");
  EXPECT_EQ(layers[0].type, LayerType::kInput);
  EXPECT_TRUE(layers[0].inputs.empty());
  EXPECT_EQ(layers[0].source_line, 3);

  const auto& conv = layers[1];
  EXPECT_EQ(conv.type, LayerType::kConv);
  EXPECT_EQ(conv.inputs, (std::vector<std::string>{"data"}));  // the previous layer
  EXPECT_EQ(conv.out, 8);
  EXPECT_EQ(conv.kernel_h, 3);
  EXPECT_EQ(conv.kernel_w, 5);
  EXPECT_EQ(conv.stride_h, 2);
  EXPECT_EQ(conv.stride_w, 2);
  EXPECT_EQ(conv.pad_h, 1);
  EXPECT_EQ(conv.pad_w, 2);
  EXPECT_FALSE(conv.bias);
  EXPECT_EQ(conv.source_line, 4);

  EXPECT_EQ(layers[2].type, LayerType::kBatchNorm);
  EXPECT_FLOAT_EQ(layers[2].bn_eps, 1e-3f);
  EXPECT_FLOAT_EQ(layers[2].bn_momentum, 0.2f);

  EXPECT_EQ(layers[3].type, LayerType::kRelu);
  EXPECT_EQ(layers[3].source_line, 6);  // block-style item: its first line

  const auto& pool = layers[4];
  EXPECT_EQ(pool.pool, worker::PoolKind::kAverage);
  EXPECT_EQ(pool.kernel_h, 2);
  EXPECT_EQ(pool.stride_h, 2);  // pooling stride defaults to the kernel
  EXPECT_EQ(pool.stride_w, 2);
  EXPECT_EQ(pool.pad_h, 0);

  EXPECT_EQ(layers[5].inputs, (std::vector<std::string>{"r1"}));
  EXPECT_EQ(layers[5].stride_h, 1);  // convolution stride defaults to 1
  EXPECT_TRUE(layers[5].bias);
  EXPECT_EQ(layers[6].type, LayerType::kAdd);
  EXPECT_EQ(layers[6].inputs, (std::vector<std::string>{"pool1", "side"}));
  EXPECT_EQ(layers[7].type, LayerType::kConcat);
  EXPECT_EQ(layers[7].inputs, (std::vector<std::string>{"sum", "pool1"}));
  EXPECT_TRUE(layers[8].global);
  EXPECT_EQ(layers[8].pool, worker::PoolKind::kMax);
  EXPECT_EQ(layers[9].type, LayerType::kFc);
  EXPECT_EQ(layers[9].inputs, (std::vector<std::string>{"gap"}));  // a single name
  EXPECT_EQ(layers[9].out, 10);
}

TEST(ConfigTest, LayersOfIssue43) {
  const Config c = parse(R"(model:
  layers:
    - {name: data, type: input}
    - {name: c, type: conv, out: 8, kernel: 3, pad: 1}
    - {name: dw, type: conv, out: 8, kernel: 3, pad: 1, groups: 8, bias: false}
    - {name: s, type: silu}
    - {name: g, type: gelu}
    - {name: r6, type: relu6}
    - {name: gap, type: pool, mode: avg, global: true}
    - {name: gate, type: sigmoid}
    - {name: se, type: mul, inputs: [r6, gate]}
    - {name: drop, type: dropout, p: 0.25}
    - {name: d2, type: dropout}
    - {name: fc, type: fc, out: 10}
data:
  kind: synthetic
)");
  const auto& layers = c.model.layers;
  ASSERT_EQ(layers.size(), 12u);
  EXPECT_EQ(layers[1].groups, 1);
  EXPECT_EQ(layers[2].groups, 8);
  EXPECT_EQ(layers[3].type, LayerType::kSilu);
  EXPECT_EQ(layers[4].type, LayerType::kGelu);
  EXPECT_EQ(layers[5].type, LayerType::kRelu6);
  EXPECT_EQ(layers[7].type, LayerType::kSigmoid);
  EXPECT_EQ(layers[8].type, LayerType::kMul);
  EXPECT_EQ(layers[8].inputs, (std::vector<std::string>{"r6", "gate"}));
  EXPECT_EQ(layers[9].type, LayerType::kDropout);
  EXPECT_FLOAT_EQ(layers[9].dropout_p, 0.25f);
  EXPECT_FLOAT_EQ(layers[10].dropout_p, 0.5f);  // PyTorch's default
  // And back through the dump.
  const Config b = parse(to_yaml(c));
  ASSERT_EQ(b.model.layers.size(), layers.size());
  EXPECT_EQ(b.model.layers[2].groups, 8);
  EXPECT_FLOAT_EQ(b.model.layers[9].dropout_p, 0.25f);
  EXPECT_EQ(b.model.layers[8].type, LayerType::kMul);
}

TEST(ConfigTest, RelativePathsResolveAgainstTheConfigFolder) {
  const TempDir dir;
  const fs::path file = dir.write("sub/run.yaml", R"(model: {preset: lenet}
data:
  kind: idx
  train_images: train-images.gz
  train_labels: ../labels/train.gz
  test_images: ./t10k-images.gz
  test_labels: /abs/t10k-labels.gz
output: {metrics: out/metrics.jsonl}
)");
  const Config c = load_config(file.string());
  const fs::path sub = fs::path(dir.path()) / "sub";
  EXPECT_EQ(c.path, file.string());
  EXPECT_EQ(c.data.train_images, (sub / "train-images.gz").string());
  EXPECT_EQ(c.data.train_labels, (fs::path(dir.path()) / "labels/train.gz").string());
  EXPECT_EQ(c.data.test_images, (sub / "t10k-images.gz").string());
  EXPECT_EQ(c.data.test_labels, "/abs/t10k-labels.gz");
  EXPECT_EQ(c.output.metrics, (sub / "out/metrics.jsonl").string());
}

TEST(ConfigTest, Cifar10FilesResolveAgainstTheConfigFolder) {
  const TempDir dir;
  const fs::path file = dir.write("c.yaml", R"(model: {preset: resnet18}
data:
  kind: cifar10
  train_files: [a.bin, b.bin]
  test_files: [t.bin]
  mean: [0.1, 0.2, 0.3]
  std: [1, 1, 1]
)");
  const Config c = load_config(file.string());
  EXPECT_EQ(c.data.train_files, (std::vector<std::string>{(fs::path(dir.path()) / "a.bin").string(),
                                                          (fs::path(dir.path()) / "b.bin").string()}));
  EXPECT_EQ(c.data.test_files, (std::vector<std::string>{(fs::path(dir.path()) / "t.bin").string()}));
  EXPECT_EQ(c.model.classes, 10);
}

TEST(ConfigTest, ParsedTextResolvesAgainstTheCurrentDirectory) {
  const Config c = parse(std::string(kMinimal) + "output: {metrics: m.jsonl}\n");
  EXPECT_EQ(c.output.metrics, (fs::current_path() / "m.jsonl").string());
}

TEST(ConfigTest, OverridesApplyBeforeValidation) {
  const TempDir dir;
  const fs::path file = dir.write("run.yaml", std::string(kMinimal) + "train: {batch: 0}\n");
  const Config c =
      load_config(file.string(), {
                                     "train.batch=32",  // fixes the invalid 0
                                     "data.mean=[0.5]",
                                     "data.std=[0.25]",
                                     "optimizer={lr: 0.1, schedule: cosine}",  // a whole section
                                     "device.threads=4",  // creates the section
                                     "device.threads=2",  // the last one wins
                                     "output.metrics=m.jsonl",
                                 });
  EXPECT_EQ(c.train.batch, 32);
  EXPECT_EQ(c.data.mean, (std::vector<float>{0.5f}));
  EXPECT_EQ(c.data.stddev, (std::vector<float>{0.25f}));
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.1);
  EXPECT_EQ(c.optimizer.schedule, worker::ScheduleKind::kCosine);
  EXPECT_EQ(c.device.threads, 2);
  // Paths typed on the command line are relative to where the user is.
  EXPECT_EQ(c.output.metrics, (fs::current_path() / "m.jsonl").string());
}

TEST(ConfigTest, EmptyMetricsOverrideTurnsMetricsOff) {
  const Config c =
      parse(std::string(kMinimal) + "output: {metrics: m.jsonl}\n", {"output.metrics="});
  EXPECT_EQ(c.output.metrics, "");
}

// NAME[I] steps into a list, as error messages name its entries; a value
// set there is validated like the file's and errors name --set.
TEST(ConfigTest, OverridesReachIntoLists) {
  const std::string layers =
      "model:\n  layers:\n    - {name: d, type: input}\n    - {name: f, type: fc, out: 3}\n"
      "data: {kind: synthetic}\n";
  Config c = parse(layers, {"model.layers[1].out=7", "balance.split=manual",
                            "balance.manual=[8, 8]", "balance.manual[1]=56"});
  ASSERT_EQ(c.model.layers.size(), 2u);
  EXPECT_EQ(c.model.layers[1].out, 7);
  EXPECT_EQ(c.balance.manual, (std::vector<int64_t>{8, 56}));  // sums to train.batch 64
  EXPECT_EQ(error_of(layers, {"model.layers[1].out=-1"}),
            "--set model.layers[1].out: expected an integer >= 1, got -1");
  EXPECT_EQ(error_of(layers, {"model.layers[2].out=7"}),
            "--set model.layers[2].out: model.layers has 2 entries, so no [2]");
  EXPECT_EQ(error_of(layers, {"model[0]=7"}), "--set model[0]: model is not a list");
  // Errors about a value set at [01] name the entry as messages do, [1].
  EXPECT_EQ(error_of(layers, {"model.layers[01].out=0"}),
            "--set model.layers[1].out: expected an integer >= 1, got 0");
  // A preset model has no layers list to step into.
  EXPECT_EQ(error_of(kMinimal, {"model.layers[2].out=64"}),
            "--set model.layers[2].out: model.layers is not in the config, so it has no [2]");
  EXPECT_EQ(error_of(layers, {"model.layers[x].out=7"}),
            "--set model.layers[x].out: 'layers[x]' is not NAME or NAME[INDEX] (INDEX a number "
            "from 0)");
  EXPECT_EQ(error_of(layers, {"model.layers[1]x=7"}),
            "--set model.layers[1]x: 'layers[1]x' is not NAME or NAME[INDEX] (INDEX a number "
            "from 0)");
}

TEST(ConfigTest, OverriddenLayersHaveNoSourceLine) {
  const Config c = parse("model: {preset: lenet}\ndata: {kind: synthetic}\n",
                         {"model={layers: [{name: d, type: input}, {name: f, type: fc, out: 3}]}"});
  ASSERT_EQ(c.model.layers.size(), 2u);
  EXPECT_EQ(c.model.layers[1].source_line, 0);
  EXPECT_EQ(c.model.layers[1].inputs, (std::vector<std::string>{"d"}));
}

TEST(ConfigTest, ToYamlReadsBackToTheSameConfig) {
  const Config a = parse(R"(model:
  batch_norm: local
  layers:
    - {name: data, type: input}
    - {name: conv1, type: conv, out: 8, kernel: [3, 5], stride: [1, 2], pad: 1, bias: false}
    - {name: bn, type: batchnorm, eps: 1e-5, momentum: 0.1}
    - {name: pool, type: pool, mode: avg, kernel: 2}
    - {name: gap, type: pool, global: true}
    - {name: fc, type: fc, out: 10}
data: {kind: synthetic, shape: [3, 8, 8], mean: [0.1, 0.2, 0.3], std: [1, 2, 3], prefetch: on,
       workers: [1, 4]}
train: {batch: 16, seed: 7, evaluate: false, precision: bf16, gradient_allreduce: half,
        loss_scaling: {mode: on, initial: 256, growth_interval: 50}}
optimizer: {lr: 0.05, momentum: 0.9, weight_decay: 5e-4, schedule: cosine}
device: {backend: cpu, memory_limit: 64MiB, layout: nhwc}
conv: {cudnn_graph: false}
balance: {rebalance: {threshold: 0.4, window: 9, patience: 3, min_gain: 0.2, min_gain_ms: 1,
                      probe_every: 7}}
profile: {step_rounds: 3}
output: {metrics: /tmp/x.jsonl, progress: off}
)");
  const std::string text = to_yaml(a);
  const Config b = parse(text);
  SCOPED_TRACE(text);
  EXPECT_EQ(to_yaml(b), text);
  EXPECT_EQ(b.compute.layout, worker::LayoutChoice::kNhwc);
  EXPECT_FALSE(b.conv.cudnn_graph);
  ASSERT_EQ(b.model.layers.size(), a.model.layers.size());
  for (size_t i = 0; i < a.model.layers.size(); ++i) {
    const auto& x = a.model.layers[i];
    const auto& y = b.model.layers[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.type, y.type);
    EXPECT_EQ(x.inputs, y.inputs);
    EXPECT_EQ(x.out, y.out);
    EXPECT_EQ(x.bias, y.bias);
    EXPECT_EQ(std::tie(x.kernel_h, x.kernel_w, x.stride_h, x.stride_w, x.pad_h, x.pad_w),
              std::tie(y.kernel_h, y.kernel_w, y.stride_h, y.stride_w, y.pad_h, y.pad_w));
    EXPECT_EQ(x.pool, y.pool);
    EXPECT_EQ(x.global, y.global);
    EXPECT_EQ(x.bn_eps, y.bn_eps);
    EXPECT_EQ(x.bn_momentum, y.bn_momentum);
  }
  EXPECT_EQ(b.model.batch_norm, worker::BatchNormMode::kLocal);
  const worker::RebalanceSettings& r = b.balance.rebalance;
  EXPECT_EQ(std::tie(r.threshold, r.window, r.patience, r.min_gain, r.min_gain_ms, r.probe_every),
            std::make_tuple(0.4, int64_t{9}, int64_t{3}, 0.2, 1.0, int64_t{7}));
  EXPECT_EQ(b.profile.step_rounds, 3);
  EXPECT_EQ(b.data.shape, a.data.shape);
  EXPECT_EQ(b.data.mean, a.data.mean);
  EXPECT_EQ(b.data.stddev, a.data.stddev);
  EXPECT_EQ(b.data.prefetch, common::AutoOnOff::kOn);
  EXPECT_EQ(b.data.workers_per_rank, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(b.train.seed, 7u);
  EXPECT_FALSE(b.train.evaluate);
  EXPECT_EQ(b.compute.precision, common::Precision::kBf16);
  EXPECT_EQ(b.train.loss_scaling.mode, common::AutoOnOff::kOn);
  EXPECT_EQ(b.train.loss_scaling.initial, 256);
  EXPECT_EQ(b.train.loss_scaling.growth_interval, 50);
  EXPECT_EQ(b.train.gradient_allreduce, worker::GradientAllreduce::kHalf);
  EXPECT_EQ(b.optimizer.lr, a.optimizer.lr);
  EXPECT_EQ(b.optimizer.weight_decay, a.optimizer.weight_decay);
  EXPECT_EQ(b.device.memory_limit, 64u << 20);
  EXPECT_EQ(b.output.metrics, "/tmp/x.jsonl");
  EXPECT_EQ(b.output.progress, worker::ProgressSetting::kOff);
  EXPECT_NE(text.find("lr: 0.05\n"), std::string::npos) << "numbers print in their shortest form";
}

// ---- parse_size ---------------------------------------------------------------

TEST(ParseSizeTest, AcceptsBytesAndUnits) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("12B"), 12u);
  EXPECT_EQ(parse_size("2k"), 2000u);
  EXPECT_EQ(parse_size("2K"), 2000u);
  EXPECT_EQ(parse_size("2kB"), 2000u);
  EXPECT_EQ(parse_size("2KiB"), 2048u);
  EXPECT_EQ(parse_size("64MiB"), 64u << 20);
  EXPECT_EQ(parse_size("64mib"), 64u << 20);
  EXPECT_EQ(parse_size("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(parse_size("1.5GiB"), 3u << 29);
  EXPECT_EQ(parse_size(" 1 GiB "), 1u << 30);
  EXPECT_EQ(parse_size("2TB"), 2'000'000'000'000u);
  EXPECT_EQ(parse_size("0.5KiB"), 512u);
  EXPECT_EQ(parse_size("1.000k"), 1000u);
  EXPECT_EQ(parse_size("18446744073709551615"), 18446744073709551615u);
  EXPECT_EQ(parse_size("16777215TiB"), 16777215ull << 40);
}

TEST(ParseSizeTest, RejectsNegativesGarbageAndOverflow) {
  const auto message = [](const std::string& text) -> std::string {
    try {
      parse_size(text);
    } catch (const ConfigError& error) {
      return error.what();
    }
    return "no error for '" + text + "'";
  };
  EXPECT_EQ(message("-1"), "invalid size '-1': sizes cannot be negative");
  EXPECT_EQ(message("-1MiB"), "invalid size '-1MiB': sizes cannot be negative");
  EXPECT_EQ(message(""),
            "invalid size '': expected a number of bytes with an optional unit, e.g. 64MiB, 1.5GB "
            "or 4096");
  EXPECT_EQ(message("abc"),
            "invalid size 'abc': expected a number of bytes with an optional unit, e.g. 64MiB, "
            "1.5GB or 4096");
  EXPECT_EQ(message("MiB"),
            "invalid size 'MiB': expected a number of bytes with an optional unit, e.g. 64MiB, "
            "1.5GB or 4096");
  EXPECT_EQ(message("12XB").rfind("invalid size '12XB': unknown unit 'XB' (known: B, k, kB", 0),
            0u);
  EXPECT_EQ(message("1.2.3k").rfind("invalid size '1.2.3k': unknown unit '.3k'", 0), 0u);
  EXPECT_EQ(message("1.k"), "invalid size '1.k': expected digits after the decimal point");
  EXPECT_EQ(message("1.5"), "invalid size '1.5': not a whole number of bytes");
  EXPECT_EQ(message("0.0001k"), "invalid size '0.0001k': not a whole number of bytes");
  EXPECT_EQ(message("18446744073709551616"),
            "invalid size '18446744073709551616': too large (the limit is 2^64 - 1 bytes)");
  EXPECT_EQ(message("16777216TiB"),
            "invalid size '16777216TiB': too large (the limit is 2^64 - 1 bytes)");
  EXPECT_EQ(message("99999999999999999999999"),
            "invalid size '99999999999999999999999': too large (the limit is 2^64 - 1 bytes)");
}

// ---- the shipped examples -------------------------------------------------------

// Per-sample input shape of a config's data, for building its graph.
worker::Shape input_shape(const DataConfig& data) {
  if (data.kind == worker::DataKind::kCifar10) return {1, 3, 32, 32};
  if (data.kind == worker::DataKind::kIdx) return {1, 1, 28, 28};  // (Fashion-)MNIST
  return data.shape;
}

TEST(ExampleConfigsTest, EveryExampleParsesAndBuildsItsGraph) {
  const fs::path dir = source_dir() / "configs";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    ++count;
    Config config;
    ASSERT_NO_THROW(config = load_config(entry.path().string()));
    std::vector<worker::LayerSpec> layers = config.model.layers;
    if (!config.model.preset.empty()) {
      layers = worker::preset_layers(config.model.preset,
                                     {input_shape(config.data), config.model.classes});
    }
    EXPECT_NO_THROW(worker::Graph::build(layers, input_shape(config.data)));
  }
  EXPECT_GE(count, 5);
}

TEST(ExampleConfigsTest, ExamplesSayWhatTheyPromise) {
  const fs::path dir = source_dir() / "configs";
  const Config lenet = load_config((dir / "fmnist-lenet.yaml").string());
  EXPECT_EQ(lenet.model.preset, "lenet");
  EXPECT_EQ(lenet.data.kind, worker::DataKind::kIdx);
  EXPECT_EQ(lenet.data.train_images,
            "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  EXPECT_EQ(lenet.train.batch, 64);
  EXPECT_EQ(lenet.train.epochs, 10);
  EXPECT_DOUBLE_EQ(lenet.optimizer.lr, 0.05);
  EXPECT_DOUBLE_EQ(lenet.optimizer.momentum, 0.9);
  EXPECT_EQ(lenet.output.metrics, "");

  const Config resnet = load_config((dir / "cifar10-resnet18.yaml").string());
  EXPECT_EQ(resnet.data.train_files.size(), 5u);
  EXPECT_EQ(resnet.data.test_files.front(),
            (fs::absolute(dir).parent_path() / "data/cifar-10-batches-bin/test_batch.bin")
                .lexically_normal()
                .string());
  EXPECT_EQ(resnet.optimizer.schedule, worker::ScheduleKind::kCosine);
  EXPECT_DOUBLE_EQ(resnet.optimizer.weight_decay, 5e-4);

  const Config custom = load_config((dir / "custom-dag.yaml").string());
  EXPECT_TRUE(custom.model.preset.empty());
  EXPECT_FALSE(custom.model.layers.empty());
}

}  // namespace
}  // namespace vtrain::config

namespace vtrain::config {
namespace {

TEST(ConfigSections, BalanceAndCheckpoint) {
  const std::string base =
      "model:\n  preset: lenet\ndata:\n  kind: synthetic\ntrain:\n  batch: 64\n";
  Config c = parse_config(base + "balance:\n  split: manual\n  manual: [24, 40]\n"
                                 "checkpoint:\n  dir: ck\n  every: 10\n  keep: 2\n  resume: auto\n",
                          "t.yaml");
  EXPECT_EQ(c.balance.split, balancer::SplitMode::kManual);
  EXPECT_EQ(c.balance.manual, (std::vector<int64_t>{24, 40}));
  EXPECT_EQ(c.checkpoint.every, 10);
  EXPECT_EQ(c.checkpoint.keep, 2);
  EXPECT_EQ(c.checkpoint.resume, worker::ResumeSetting::kAuto);
  EXPECT_FALSE(c.checkpoint.dir.empty());
  c = parse_config(base, "t.yaml", {"train.allreduce_bucket=1MiB"});
  EXPECT_EQ(c.train.allreduce_bucket, 1u << 20);
  c = parse_config(base, "t.yaml", {"train.precision=fp16"});
  EXPECT_EQ(c.compute.precision, common::Precision::kFp16);
  // A precision per rank: auto, a list, a map by device name, each read
  // back from the dump as written; the rank's own is resolved later.
  using Form = config::PrecisionChoice::Form;
  for (const auto& [value, form] :
       std::vector<std::pair<std::string, Form>>{{"auto", Form::kAuto},
                                                 {"[fp32, bf16, fp16]", Form::kPerRank},
                                                 {"{\"Tesla V100-SXM2-16GB\": fp16, \"AMD EPYC\": fp32}",
                                                  Form::kByDevice}}) {
    SCOPED_TRACE(value);
    c = parse_config(base, "t.yaml",
                     {"train.precision=" + value, "train.precisions=[fp16, fp32]"});
    EXPECT_EQ(c.train.precision_choice.form, form);
    EXPECT_EQ(c.train.precisions,
              (std::vector<common::Precision>{common::Precision::kFp16, common::Precision::kFp32}));
    const config::Config again = parse_config(config::to_yaml(c), "dump.yaml");
    EXPECT_EQ(again.train.precision_choice.form, form);
    EXPECT_EQ(again.train.precision_choice.per_rank, c.train.precision_choice.per_rank);
    EXPECT_EQ(again.train.precision_choice.by_device, c.train.precision_choice.by_device);
    EXPECT_EQ(again.train.precisions, c.train.precisions);
  }
}

// What a checkpoint records of a run: the model, data and optimizer keys
// and what the training set holds; not how, where or how long it trains.
TEST(RunSettings, AreTheModelDataAndOptimizerKeys) {
  const std::string base = "model:\n  preset: lenet\ndata:\n  kind: synthetic\noptimizer:\n  lr: 0.05\n";
  worker::Dataset train;
  train.sample = {1, 1, 28, 28};
  train.classes = 10;
  train.count = 2048;
  const auto settings = [&](const std::vector<std::string>& overrides) {
    return run_settings(parse_config(base, "t.yaml", overrides), train);
  };
  const std::vector<worker::RunSetting> plain = settings({});
  const auto value = [&](const std::string& key) -> std::string {
    for (const worker::RunSetting& s : plain) {
      if (s.key == key) return s.value;
    }
    return "(none)";
  };
  EXPECT_EQ(value("optimizer.lr"), "0.05");
  EXPECT_EQ(value("model.preset"), "lenet");
  EXPECT_EQ(value("data.shape"), "[1, 28, 28]");
  EXPECT_EQ(value("training set"), "2048 samples of 1x1x28x28, 10 classes");
  for (const char* key : {"data.prefetch", "data.test_size", "train.epochs", "train.batch"}) {
    EXPECT_EQ(value(key), "(none)") << key;
  }
  EXPECT_EQ(settings({"train.epochs=9", "train.max_steps=5", "device.threads=1",
                      "checkpoint.dir=x", "train.precision=bf16", "balance.split=auto",
                      "data.prefetch=off", "data.test_size=7"}),
            plain);
  EXPECT_NE(settings({"optimizer.lr=0.01"}), plain);
  EXPECT_NE(settings({"optimizer.momentum=0.9"}), plain);
  EXPECT_NE(settings({"data.train_size=100"}), plain);
}

std::string error_text(const std::string& text) {
  try {
    parse_config(text, "t.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigSections, BalanceAndCheckpointErrors) {
  const std::string base =
      "model:\n  preset: lenet\ndata:\n  kind: synthetic\ntrain:\n  batch: 64\n";
  EXPECT_EQ(error_text(base + "balance:\n  split: manual\n  manual: [24, 30]\n"),
            "t.yaml:9: balance.manual: the per-rank batches sum to 54 but train.batch is 64");
  EXPECT_EQ(error_text(base + "balance:\n  split: manual\n"),
            "t.yaml:7: balance: missing manual (split: manual needs the per-rank batch sizes)");
  EXPECT_EQ(error_text(base + "balance:\n  split: fast\n"),
            "t.yaml:8: balance.split: unknown value 'fast' (allowed: even, manual, auto)");
  EXPECT_EQ(error_text(base + "checkpoint:\n  resume: auto\n"),
            "t.yaml:8: checkpoint.resume: resume: auto needs checkpoint.dir");
  EXPECT_EQ(error_text(base + "checkpoint:\n  resume: required\n"),
            "t.yaml:8: checkpoint.resume: resume: required needs checkpoint.dir");
  EXPECT_EQ(error_text(base + "checkpoint:\n  dir: ck\n  resume: always\n"),
            "t.yaml:9: checkpoint.resume: unknown value 'always' (allowed: never, auto, required)");
  EXPECT_EQ(error_text(base + "checkpoint:\n  keep: 0\n"),
            "t.yaml:8: checkpoint.keep: expected an integer >= 1, got 0");
}

// Every name table the loader takes its choices from: names are distinct
// and each reads back to its value, so name_of never answers "?".
template <class E, size_t N>
void expect_table_round_trips(const std::array<common::Named<E>, N>& table) {
  std::set<std::string> seen;
  for (const common::Named<E>& entry : table) {
    EXPECT_TRUE(seen.insert(entry.name).second) << "duplicate name " << entry.name;
    EXPECT_EQ(common::find_named(table, common::name_of(table, entry.value)), entry.value)
        << entry.name;
  }
}

TEST(ConfigTest, NameTablesRoundTrip) {
  expect_table_round_trips(memory::kPolicyNames);
  expect_table_round_trips(memory::kPlannerNames);
  expect_table_round_trips(balancer::kWorkspacePolicyNames);
  expect_table_round_trips(balancer::kMicroBatchPolicyNames);
  expect_table_round_trips(balancer::kSplitModeNames);
  expect_table_round_trips(balancer::kCandidateSizesNames);
  expect_table_round_trips(balancer::kAllreduceCostNames);
  expect_table_round_trips(worker::kDataKindNames);
  expect_table_round_trips(worker::kProgressSettingNames);
  expect_table_round_trips(worker::kResumeSettingNames);
  expect_table_round_trips(worker::kScheduleKindNames);
  expect_table_round_trips(worker::kLayoutChoiceNames);
  expect_table_round_trips(worker::kBackendKindNames);
  expect_table_round_trips(common::kAutoOnOffNames);
  EXPECT_STREQ(common::name_of(memory::kPolicyNames, static_cast<memory::Policy>(99)), "?");
}

}  // namespace
}  // namespace vtrain::config
