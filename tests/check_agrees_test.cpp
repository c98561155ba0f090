// `vtrain check` refuses what training refuses, with the same error, and
// passes what training runs: the backend's refusals (a precision it cannot
// train in, a named convolution algorithm no layer offers) and a model
// whose classes are fewer than the data's are config errors naming the
// file, line and key (exit 2) in both; a memory limit no schedule fits is
// the same out-of-memory error (exit 1) in both, naming the least
// device.memory_limit that fits, and that limit trains. Run as users run it.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "common/machine.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

using test_support::RunResult;
using test_support::run_vtrain;
using test_support::TempDir;

// LeNet on synthetic data, one step; `train_extra` is added to the train
// map (line 3), `extra` lines are appended (line 5 on).

std::string lenet_config(const std::string& extra = "", const std::string& train_extra = "") {
  return "model: {preset: lenet}\n"
         "data: {kind: synthetic, shape: [1, 28, 28], classes: 10, train_size: 64, test_size: 16}\n"
         "train: {batch: 16, max_steps: 1, evaluate: false" + train_extra + "}\n"
         "device: {backend: cpu, threads: 1}\n" +
         extra;
}

// A layers model (the list items from line 3 on) on 1x12x12 synthetic data.
std::string layers_config(const std::string& layers) {
  return "model:\n  layers:\n" + layers +
         "data: {kind: synthetic, shape: [1, 12, 12], classes: 10, train_size: 64, "
         "test_size: 16}\n"
         "train: {batch: 16, max_steps: 2, evaluate: false}\n"
         "device: {backend: cpu, threads: 1}\n";
}

// The bytes of "... it fits a device.memory_limit of 39.9 MiB = 41876800
// bytes" in an out-of-memory error; 0 when it names none.
uint64_t least_limit(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m,
                         std::regex(R"(it fits a device\.memory_limit of [0-9.]+ [KMG]?i?B = )"
                                    R"((\d+) bytes)"))) {
    return 0;
  }
  return std::stoull(m[1]);
}

class CheckAgrees : public ::testing::Test {
 protected:
  std::string write(const std::string& text) { return dir_.write("run.yaml", text).string(); }
  // `vtrain check` and `vtrain train` of `config` with `args`, with
  // `env` (NAME=VALUE words) in the environment.
  static RunResult run(const std::string& command, const std::string& config,
                       const std::string& args, const std::string& env) {
    RunResult r;
    r.exit_code = test_support::run_command(env + (env.empty() ? "" : " ") +
                                                test_support::vtrain_binary() + " " + command +
                                                " " + config + " " + args,
                                            &r.output);
    return r;
  }
  static RunResult check(const std::string& config, const std::string& args = "",
                         const std::string& env = "") {
    return run("check", config, args, env);
  }
  static RunResult train(const std::string& config, const std::string& args = "",
                         const std::string& env = "") {
    return run("train", config, args, env);
  }
  // Both refuse with a config error (exit 2) containing `error`.
  static void expect_config_error(const std::string& config, const std::string& args,
                                  const std::string& error, const std::string& env = "") {
    for (const RunResult& r : {check(config, args, env), train(config, args, env)}) {
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_CONTAINS(r.output, "vtrain: config error: " + error);
    }
  }

  TempDir dir_;
};

TEST_F(CheckAgrees, ANamedAlgorithmNoConvolutionOffersIsAConfigError) {
  const std::string config = write(lenet_config("conv: {algorithm: bogus}\n"));
  expect_config_error(config, "",
                      config + ":5: conv.algorithm: conv.algorithm 'bogus': no convolution of "
                               "the model offers an algorithm of that name on the cpu backend");
  // LeNet's 5x5 convolutions offer no winograd, whatever the CPU.
  const std::string plain = write(lenet_config());
  expect_config_error(plain, "--set conv.algorithm=winograd",
                      "--set conv.algorithm: conv.algorithm 'winograd': no convolution");
  for (const char* algorithm : {"direct", "im2col_gemm"}) {
    const RunResult r = check(plain, std::string("--set conv.algorithm=") + algorithm);
    EXPECT_EQ(r.exit_code, 0) << algorithm << ": " << r.output;
  }
}

TEST_F(CheckAgrees, APrecisionTheCpuBackendCannotTrainInIsAConfigError) {
  for (const std::string precision : {"fp16", "tf32"}) {
    SCOPED_TRACE(precision);
    const std::string config = write(lenet_config("", ", precision: " + precision));
    expect_config_error(config, "",
                        config + ":3: train.precision: train.precision " + precision);
  }
  // bf16 needs native bf16 instructions: never with oneDNN held to AVX2;
  // on the CPU as it is, check and training agree either way.
  const std::string plain = write(lenet_config());
  expect_config_error(plain, "--set train.precision=bf16",
                      "--set train.precision: train.precision bf16 needs native bf16",
                      "DNNL_MAX_CPU_ISA=AVX2");
  const RunResult checked = check(plain, "--set train.precision=bf16");
  const RunResult trained = train(plain, "--set train.precision=bf16");
  EXPECT_EQ(checked.exit_code, trained.exit_code) << checked.output << "\n" << trained.output;
  if (checked.exit_code != 0) {
    EXPECT_EQ(checked.exit_code, 2) << checked.output;
    EXPECT_CONTAINS(checked.output, "--set train.precision: train.precision bf16 needs native");
  }
}

// A precision per rank: check and training refuse an entry of a per-rank
// list or of the map by device name that the device lacks, naming the
// entry, the device and what it offers; check plans as many ranks as the
// list has and checks each entry (this machine stands for every rank).
TEST_F(CheckAgrees, APerRankPrecisionTheDeviceLacksNamesTheDeviceAndWhatItOffers) {
  const std::string one = write(lenet_config("", ", precision: [fp16]"));
  expect_config_error(one, "",
                      one + ":3: train.precision[0]: train.precision fp16 runs on the CUDA "
                            "backend only");
  EXPECT_CONTAINS(check(one).output, " (cpu) offers fp32");
  const std::string two = write(lenet_config("", ", precision: [fp32, fp16]"));
  const RunResult checked = check(two);
  EXPECT_EQ(checked.exit_code, 2) << checked.output;
  EXPECT_CONTAINS(checked.output, two + ":3: train.precision[1]: train.precision fp16 runs on");
  EXPECT_CONTAINS(checked.output, " (cpu) offers fp32");
  // The map: a device named (this CPU, any model name) with a precision it lacks.
  const std::string cpu = common::cpu_model_name();
  const RunResult named = check(one, "--set 'train.precision={\"" + cpu + "\": tf32}'");
  EXPECT_EQ(named.exit_code, 2) << named.output;
  EXPECT_CONTAINS(named.output, "--set train.precision." + cpu +
                                    ": train.precision tf32 is a GPU tensor-core mode");
  // Offered where the half types are emulated for tests, and auto's pick.
  EXPECT_EQ(check(two, "", "VTRAIN_EMULATE_HALF=1").exit_code, 0);
  EXPECT_EQ(check(one, "--set train.precision=auto").exit_code, 0);
}

// The {n, classes, 1, 1} scores of a global pool keep its input's layout
// (blocked on an AVX2 or AVX-512 CPU, NHWC under device.layout nhwc): the
// loss reads them in any, so the model trains in every layout.
TEST_F(CheckAgrees, AModelEndingInAGlobalPoolTrainsInEveryLayout) {
  const std::string config = write(layers_config(
      "    - {name: data, type: input}\n"
      "    - {name: conv1, type: conv, out: 16, kernel: 3, pad: 1}\n"
      "    - {name: relu1, type: relu}\n"
      "    - {name: conv2, type: conv, out: 10, kernel: 3, pad: 1}\n"
      "    - {name: gap, type: pool, mode: avg, global: true}\n"));
  for (const char* layout : {"auto", "nchw", "nhwc"}) {
    SCOPED_TRACE(layout);
    const std::string args = std::string("--set device.layout=") + layout;
    const RunResult checked = check(config, args);
    EXPECT_EQ(checked.exit_code, 0) << checked.output;
    const RunResult trained = train(config, args);
    EXPECT_EQ(trained.exit_code, 0) << trained.output;
    EXPECT_CONTAINS(trained.output, "done: 2 steps");
  }
}

// Synthetic labels run up to data.classes: a classifier with fewer outputs
// is the model's error, named by its layer and data.classes.
TEST_F(CheckAgrees, AClassifierWithFewerOutputsThanClassesIsAConfigError) {
  const std::string config = write(layers_config(
      "    - {name: data, type: input}\n"
      "    - {name: conv1, type: conv, out: 4, kernel: 3}\n"
      "    - {name: fc, type: fc, out: 3}\n"));
  expect_config_error(config, "",
                      config + ":5: model.layers[2] (fc): the last layer gives 3x1x1 per sample, "
                               "but training needs one score per class, 10x1x1 (data.classes: "
                               "10)");
}

// A model no schedule fits under device.memory_limit: check refuses it as
// training does (conv.algorithm auto times nothing first), naming the
// tensor that does not fit and the least limit that would.
TEST_F(CheckAgrees, AModelTooBigForTheMemoryLimitIsRefusedByBoth) {
  const std::string config = write(
      "model:\n  layers:\n"
      "    - {name: data, type: input}\n"
      "    - {name: conv1, type: conv, out: 512, kernel: 5}\n"
      "    - {name: fc, type: fc, out: 10}\n"
      "data: {kind: synthetic, shape: [1, 28, 28], classes: 10, train_size: 64, test_size: 16}\n"
      "train: {batch: 16, max_steps: 1, evaluate: false}\n"
      "device: {backend: cpu, threads: 1, memory_limit: 40MiB}\n");
  const RunResult checked = check(config);
  const RunResult trained = train(config);
  for (const RunResult& r : {checked, trained}) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_CONTAINS(r.output, "vtrain: error: memory.policy none: out of memory allocating '");
    EXPECT_GT(least_limit(r.output), uint64_t{40} << 20) << r.output;
  }
  EXPECT_EQ(least_limit(checked.output), least_limit(trained.output));
}

// The least device.memory_limit an out-of-memory error names trains, and
// one byte less is refused with the same error, by check and by training
// alike, under conv.algorithm auto too (its timings choose algorithms,
// never whether memory fits). The model's 11498 parameters take 45992
// bytes, no whole number of the CPU device's 64-byte units.
TEST_F(CheckAgrees, TheLeastMemoryLimitAnErrorNamesTrainsAndNoLessDoes) {
  const std::string config = write(layers_config(
      "    - {name: data, type: input}\n"
      "    - {name: conv1, type: conv, out: 8, kernel: 3, pad: 1}\n"
      "    - {name: relu1, type: relu}\n"
      "    - {name: pool1, type: pool, mode: max, kernel: 2}\n"
      "    - {name: conv2, type: conv, out: 16, kernel: 3, pad: 1}\n"
      "    - {name: relu2, type: relu}\n"
      "    - {name: fc, type: fc, out: 10}\n"));
  for (const char* policy : {"auto", "none"}) {
    SCOPED_TRACE(policy);
    const std::string args = std::string("--set memory.policy=") + policy;
    const RunResult tiny = train(config, args + " --set device.memory_limit=100000");
    ASSERT_EQ(tiny.exit_code, 1) << tiny.output;
    const uint64_t least = least_limit(tiny.output);
    ASSERT_GT(least, uint64_t{100000}) << tiny.output;
    for (const char* algorithm : {"direct", "auto"}) {
      SCOPED_TRACE(algorithm);
      const std::string at = args + " --set conv.algorithm=" + algorithm +
                             " --set device.memory_limit=" + std::to_string(least);
      const RunResult trained = train(config, at);
      EXPECT_EQ(trained.exit_code, 0) << trained.output;
      EXPECT_CONTAINS(trained.output, "done: 2 steps");
      const RunResult checked = check(config, at);
      EXPECT_EQ(checked.exit_code, 0) << checked.output;
      const std::string below = args + " --set conv.algorithm=" + algorithm +
                                " --set device.memory_limit=" + std::to_string(least - 1);
      for (const RunResult& r : {train(config, below), check(config, below)}) {
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_CONTAINS(r.output, std::string("vtrain: error: memory.policy ") + policy);
        EXPECT_EQ(least_limit(r.output), least) << r.output;
        EXPECT_EQ(r.output.find("cpu device out of memory"), std::string::npos) << r.output;
      }
    }
  }
}

}  // namespace
}  // namespace vtrain
