// What `vtrain check` and `vtrain train` refuse before they start: configs
// that ask more of the machine than it has (threads, memory), datasets and
// models too big to allocate, models whose output is not the class scores,
// and graph errors, each named by file, line and key. Run the way users run
// vtrain, plus the checks themselves against a made-up machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <string>

#include "common/machine.h"
#include "configs/config.h"
#include "configs/config_limits.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

using test_support::TempDir;

using test_support::RunResult;
using test_support::run_vtrain;

// A small synthetic config with known lines: the model on line 1, data on
// lines 2-7 (shape 4, classes 5, train_size 6), `device:` on line 8 with
// `device_lines` from line 9, then train (line 10 with one device line).
std::string synthetic_config(const std::string& device_lines = "  threads: 1\n") {
  return "model: {preset: lenet}\n"
         "data:\n"
         "  kind: synthetic\n"
         "  shape: [1, 28, 28]\n"
         "  classes: 10\n"
         "  train_size: 256\n"
         "  test_size: 64\n"
         "device:\n" +
         device_lines + "train: {batch: 16, max_steps: 1, evaluate: false}\n";
}

// `text` with its first `from` replaced by `to`.
std::string with(std::string text, const std::string& from, const std::string& to) {
  return text.replace(text.find(from), from.size(), to);
}

// A layers model on 1x28x28 synthetic data: `layers` are the list items, one
// per line, starting on line 3.
std::string layers_config(const std::string& layers) {
  return "model:\n  layers:\n" + layers +
         "data: {kind: synthetic, shape: [1, 28, 28], classes: 10, train_size: 64, "
         "test_size: 16}\n"
         "train: {batch: 16, max_steps: 1, evaluate: false}\ndevice: {threads: 1}\n";
}

class CliValidation : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    const std::string path = dir_.path("run.yaml");
    std::ofstream(path) << text;
    return path;
  }
  // Both `check` and `train` refuse the config as a config error (exit 2)
  // with `message`, prefixed by the file and `line_and_key` ("5: data.classes").
  void expect_refused(const std::string& text, const std::string& line_and_key,
                      const std::string& message) {
    const std::string path = write(text);
    for (const char* command : {"check ", "train --progress off "}) {
      const RunResult r = run_vtrain(command + path);
      EXPECT_EQ(r.exit_code, 2) << command << r.output;
      EXPECT_CONTAINS(r.output, "config error: " + path + ":" + line_and_key + ": " + message);
    }
  }

  TempDir dir_;
};

// ------------------------------------------------------------- the machine

TEST_F(CliValidation, ThreadCountsFarBeyondTheHardwareAreRefused) {
  const int hardware = common::hardware_threads();
  const std::string cap = std::to_string(hardware * config::kMaxThreadsPerHardwareThread);
  for (const std::string threads : {"100000", "10000", "1000"}) {
    if (std::stoi(threads) <= std::stoi(cap)) continue;
    expect_refused(synthetic_config("  threads: " + threads + "\n"), "9: device.threads",
                   threads + " asked, this machine has " + std::to_string(hardware) +
                       " hardware thread" + (hardware == 1 ? "" : "s") + " (at most " + cap +
                       " allowed = 4x)");
  }
  const RunResult at_cap =
      run_vtrain("check " + write(synthetic_config()) + " --set device.threads=" + cap);
  EXPECT_EQ(at_cap.exit_code, 0) << at_cap.output;
}

TEST(ConfigLimits, ThreadsAndMemoryLimitAgainstAMadeUpMachine) {
  const config::Machine machine{.hardware_threads = 2, .memory_bytes = 1ull << 30};
  config::Config cfg = config::parse_config(synthetic_config(), "x.yaml",
                                            {"device.threads=9", "device.memory_limit=2GiB"});
  EXPECT_EQ(test_support::error_message<config::ConfigError>(
                [&] { config::check_machine(cfg, machine); }),
            "--set device.threads: 9 asked, this machine has 2 hardware threads (at most 8 "
            "allowed = 4x)");
  cfg.device.threads = 8;
  EXPECT_EQ(test_support::error_message<config::ConfigError>(
                [&] { config::check_machine(cfg, machine); }),
            "--set device.memory_limit: 2 GiB (2147483648 bytes) asked, this machine has 1 GiB "
            "of memory");
  cfg.device.memory_limit = 1ull << 30;
  EXPECT_NO_THROW(config::check_machine(cfg, machine));
  // A GPU's memory limit is its backend's to check.
  cfg.device.memory_limit = 2ull << 30;
  EXPECT_NO_THROW(config::check_machine(cfg, {2, 1ull << 30, false}));
}

// ------------------------------------------------- data too big to allocate

TEST_F(CliValidation, DatasetsBiggerThanTheMemoryAreConfigErrors) {
  expect_refused(with(synthetic_config(), "classes: 10", "classes: 1000000000"),
                 "5: data.classes",
                 "the synthetic dataset needs 730 GiB (256 train + 64 test samples and 1000000000 "
                 "class prototypes, each 1x28x28 bytes), this machine has ");
  expect_refused(with(synthetic_config(), "[1, 28, 28]", "[1, 100000, 100000]"), "4: data.shape",
                 "the synthetic dataset needs 3 TiB (256 train + 64 test samples and 10 class "
                 "prototypes, each 1x100000x100000 bytes), this machine has ");
  expect_refused(with(synthetic_config(), "train_size: 256", "train_size: 1000000000000"),
                 "6: data.train_size", "the synthetic dataset needs 717 TiB");
}

TEST(ConfigLimits, DatasetBytesCountSamplesPrototypesAndLabels) {
  const config::Config cfg = config::parse_config(synthetic_config(), "x.yaml");
  // (256 + 64) samples and 10 prototypes of 784 bytes, 320 4-byte labels.
  EXPECT_NO_THROW(config::check_machine(cfg, {1, 260000, true}));
  EXPECT_EQ(test_support::error_message<config::ConfigError>(
                [&] { config::check_machine(cfg, {1, 259999, true}); }),
            "x.yaml:4: data.shape: the synthetic dataset needs 254 KiB (256 train + 64 test "
            "samples and 10 class prototypes, each 1x28x28 bytes), this machine has 254 KiB of "
            "memory");
}

// ------------------------------------------------- models training refuses

TEST_F(CliValidation, ALastLayerThatIsNotTheClassScoresIsRefused) {
  const std::string path = test_support::source_dir() + "/configs/custom-dag.yaml";
  // custom-dag.yaml without its last two layers ends at `pool`, 24x14x14.
  const std::string text = test_support::read_file(path);
  std::string cut = text.substr(0, text.find("    - {name: gap"));
  cut += text.substr(text.find("\ndata:") + 1);
  const int pool_line = 1 + static_cast<int>(std::count(cut.begin(), cut.begin() +
                                                        cut.find("{name: pool"), '\n'));
  expect_refused(cut, std::to_string(pool_line) + ": model.layers[13] (pool)",
                 "the last layer gives 24x14x14 per sample, but training needs one score per "
                 "class, 10x1x1 (data.classes: 10): end the model with an fc layer with out: 10");
}

TEST_F(CliValidation, BatchesAndChannelsBeyondWhatCanBeAddressedAreRefused) {
  expect_refused(with(synthetic_config(), "batch: 16", "batch: 1000000000000"), "10: train.batch",
                 "expected at most 2147483647 (a tensor dimension, 32-bit in cuDNN), got "
                 "1000000000000");
  expect_refused(layers_config("    - {name: data, type: input}\n"
                               "    - {name: conv, type: conv, out: 2147483648, kernel: 5}\n"
                               "    - {name: fc, type: fc, out: 10}\n"),
                 "4: model.layers[1].out",
                 "expected at most 2147483647 (a tensor dimension, 32-bit in cuDNN), got "
                 "2147483648");
}

TEST_F(CliValidation, BatchesTooBigForTheMemoryAreRefused) {
  const RunResult r = run_vtrain("check " + write(synthetic_config()) +
                                 " --set train.batch=2000000000");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "config error: --set train.batch: a batch of 2000000000 on one rank "
                            "needs at least 83.8 TiB (the output of layer 'conv1', 20x24x24 "
                            "floats per sample, with the parameters and their gradients), more "
                            "than the ");
}

TEST_F(CliValidation, ModelsWithMoreParametersThanTheMemoryAreRefused) {
  expect_refused(layers_config("    - {name: data, type: input}\n"
                               "    - {name: conv, type: conv, out: 2000000000, kernel: 5}\n"
                               "    - {name: gap, type: pool, mode: avg, global: true}\n"
                               "    - {name: fc, type: fc, out: 10}\n"),
                 "4: model.layers[1] (conv)",
                 "the model's parameters and their gradients need 536 GiB (this layer alone has "
                 "194 GiB of weights), more than the ");
}

TEST_F(CliValidation, AMemoryLimitAboveTheMachineNamesBoth) {
  const std::string memory = common::format_bytes(common::usable_memory_bytes());
  expect_refused(synthetic_config("  threads: 1\n  memory_limit: 18446744073709551615\n"),
                 "10: device.memory_limit",
                 "16 EiB (18446744073709551615 bytes) asked, this machine has " + memory +
                     " of memory");
}

// ---------------------------------------- graph errors name file and line

TEST_F(CliValidation, GraphErrorsNameTheFileLineAndLayer) {
  const std::string data = "    - {name: data, type: input}\n";
  expect_refused(layers_config(data + "    - {name: a, type: add, inputs: [data, b]}\n"
                                      "    - {name: b, type: relu, inputs: [a]}\n"
                                      "    - {name: fc, type: fc, out: 10}\n"),
                 "4: model.layers[1] (a)", "graph has a cycle: a -> b -> a");
  expect_refused(layers_config(data + "    - {name: r, type: relu}\n"
                                      "    - {name: j, type: add, inputs: [r, r]}\n"
                                      "    - {name: fc, type: fc, out: 10}\n"),
                 "5: model.layers[2] (j)", "input 'r' is listed twice");
  expect_refused(layers_config(data + "    - {name: c, type: conv, out: 4, kernel: 3}\n"
                                      "    - {name: j, type: add, inputs: [c, data]}\n"
                                      "    - {name: fc, type: fc, out: 10}\n"),
                 "5: model.layers[2] (j)",
                 "add needs identical input shapes, got c 4x26x26, data 1x28x28");
  expect_refused(layers_config(data + "    - {name: c, type: conv, out: 4, kernel: 29}\n"
                                      "    - {name: fc, type: fc, out: 10}\n"),
                 "4: model.layers[1] (c)",
                 "29x29 window (pad 0x0) is larger than its padded input 1x28x28 from 'data'");
}

// The "final_loss" of a metrics file's end record, as written.
std::string final_loss(const std::string& metrics) {
  const std::string text = test_support::read_file(metrics);
  const size_t at = text.find("\"final_loss\": ");
  if (at == std::string::npos) return "no final_loss in " + metrics;
  return text.substr(at + 14, text.find_first_of(",}", at) - at - 14);
}

// silu, gelu, sigmoid and relu6 run: a model of each trains, its loss
// finite; under memonger, which recomputes cheap layers instead of keeping
// their outputs, to the same loss as under none (their backward reads what
// describe_backward says; conv.algorithm fixed: auto picks by timing, and
// two algorithms round differently).
TEST_F(CliValidation, TheNewActivationsTrain) {
  const std::string path =
      write(layers_config("    - {name: data, type: input}\n"
                          "    - {name: c1, type: conv, out: 8, kernel: 3, pad: 1}\n"
                          "    - {name: a1, type: silu}\n"
                          "    - {name: c2, type: conv, out: 16, kernel: 3, stride: 2}\n"
                          "    - {name: a2, type: gelu}\n"
                          "    - {name: a3, type: relu6}\n"
                          "    - {name: gap, type: pool, mode: avg, global: true}\n"
                          "    - {name: a4, type: sigmoid}\n"
                          "    - {name: fc, type: fc, out: 10}\n"));
  std::string losses[2];
  for (int recompute = 0; recompute < 2; ++recompute) {
    const std::string metrics = dir_.path("m" + std::to_string(recompute) + ".jsonl");
    const RunResult r = run_vtrain("train --progress off " + path + " --metrics " + metrics +
                                   " --set train.max_steps=3 --set conv.algorithm=direct"
                                   " --set memory.policy=" + (recompute ? "memonger" : "none"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("nan"), std::string::npos) << r.output;
    losses[recompute] = final_loss(metrics);
  }
  EXPECT_EQ(losses[0], losses[1]);
}

// The "train loss" of each epoch's summary line ("epoch 2/4: train loss
// 2.1032 acc ..."), in order.
std::vector<double> epoch_losses(const std::string& output) {
  std::vector<double> losses;
  const std::regex line(R"(epoch \d+/\d+: train loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    losses.push_back(std::stod((*it)[1].str()));
  }
  return losses;
}

// mul trains: a squeeze-excitation block (global average pooling, 1x1
// conv, relu, 1x1 conv, sigmoid, and the gate times the block's input) on
// synthetic data, its training loss going down over four epochs; and under
// memonger, which recomputes cheap layers (mul among them) instead of
// keeping their outputs, to the same loss as under none (conv.algorithm
// fixed: auto picks by timing, and two algorithms round differently).
TEST_F(CliValidation, ASqueezeExcitationBlockTrains) {
  const std::string path =
      write(layers_config("    - {name: data, type: input}\n"
                          "    - {name: c1, type: conv, out: 16, kernel: 3, stride: 2}\n"
                          "    - {name: r1, type: relu}\n"
                          "    - {name: gap, type: pool, mode: avg, global: true}\n"
                          "    - {name: s1, type: conv, out: 4, kernel: 1}\n"
                          "    - {name: sr, type: relu}\n"
                          "    - {name: s2, type: conv, out: 16, kernel: 1}\n"
                          "    - {name: gate, type: sigmoid}\n"
                          "    - {name: se, type: mul, inputs: [r1, gate]}\n"
                          "    - {name: fc, type: fc, out: 10}\n"));
  std::string losses[2];
  for (int recompute = 0; recompute < 2; ++recompute) {
    const std::string metrics = dir_.path("m" + std::to_string(recompute) + ".jsonl");
    const RunResult r = run_vtrain("train --progress off " + path + " --metrics " + metrics +
                                   " --set train.max_steps=0 --set train.epochs=4 --set "
                                   "conv.algorithm=direct --set memory.policy=" +
                                   (recompute ? "memonger" : "none"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> epochs = epoch_losses(r.output);
    ASSERT_EQ(epochs.size(), 4u) << r.output;
    EXPECT_LT(epochs.back(), 0.8 * epochs.front()) << r.output;
    losses[recompute] = final_loss(metrics);
  }
  EXPECT_EQ(losses[0], losses[1]);
}

TEST_F(CliValidation, GroupsAndMulShapesAreCheckedAgainstTheInputs) {
  const std::string data = "    - {name: data, type: input}\n";
  expect_refused(layers_config(data + "    - {name: c, type: conv, out: 4, kernel: 3, groups: 2}\n"
                                      "    - {name: fc, type: fc, out: 10}\n"),
                 "4: model.layers[1] (c)",
                 "groups 2 must divide the input channels, got 1x28x28 from 'data'");
  expect_refused(layers_config(data + "    - {name: c, type: conv, out: 6, kernel: 3, groups: 4}\n"
                                      "    - {name: fc, type: fc, out: 10}\n"),
                 "4: model.layers[1] (c)", "groups must be positive and divide out 6, got 4");
  expect_refused(layers_config(data + "    - {name: c, type: conv, out: 4, kernel: 3}\n"
                                      "    - {name: m, type: mul, inputs: [c, data]}\n"
                                      "    - {name: fc, type: fc, out: 10}\n"),
                 "5: model.layers[2] (m)",
                 "mul needs its second input shaped like the first or 4x1x1 (one value per "
                 "channel), got c 4x26x26, data 1x28x28");
}

TEST_F(CliValidation, PresetErrorsNameThePresetAndTheInputKey) {
  const std::string tiny = with(synthetic_config(), "[1, 28, 28]", "[1, 2, 2]");
  expect_refused(tiny, "1: model.preset",
                 "preset 'lenet' for input 1x2x2 (data.shape): layer 'conv1': 5x5 window (pad "
                 "0x0) is larger than its padded input 1x2x2 from 'data'");
}

}  // namespace
}  // namespace vtrain
