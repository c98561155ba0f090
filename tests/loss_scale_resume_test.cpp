// Dynamic loss scaling across a checkpoint: a resumed run continues with the
// scale and the counts the checkpoint was written with, and so trains the
// same weights as a run that never stopped; a checkpoint without a loss
// scale (an older vtrain's) starts at train.loss_scaling.initial and says
// so. LeNet in fp32 (loss scaling is precision-agnostic arithmetic, so this
// runs on every machine) on inputs scaled up so that the largest scales
// overflow: the scale goes up and down during the run.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/engine_runs.h"
#include "tests/test_support.h"
#include "worker/data/data.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/train/checkpoint.h"
#include "worker/train/trainer.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using test_support::bitwise_equal;
using test_support::TempDir;

constexpr int64_t kSteps = 16;          // 2 epochs of 8
constexpr int64_t kCheckpointStep = 7;  // where the broken run stops
constexpr double kInitial = 0x1p120;

struct Job {
  worker::Shape input{1, 1, 16, 16};
  worker::Dataset train = worker::make_synthetic(input, 4, 256, 3);
  worker::Graph graph = worker::Graph::build(worker::preset_layers("lenet", {input, 4}), input);
  worker::ChannelStats norm = scaled_stats(train);
  std::unique_ptr<worker::Backend> backend =
      worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});

  // Inputs 1000x larger: the scaled gradients overflow at the largest scales.
  static worker::ChannelStats scaled_stats(const worker::Dataset& data) {
    worker::ChannelStats norm = worker::channel_stats(data);
    for (float& s : norm.stddev) s /= 1000;
    return norm;
  }

  worker::TrainerOptions options(const std::string& dir, int64_t max_steps) const {
    worker::TrainerOptions o;
    o.conv_algorithm = "direct";
    o.train.batch = 32;
    o.train.epochs = 2;
    o.train.max_steps = max_steps;
    o.schedule.lr = 0.01;
    o.optimizer.momentum = 0.9f;
    o.train.evaluate = false;
    o.progress = worker::Progress::Mode::kLines;
    o.checkpoint.dir = dir;
    o.checkpoint.every = kCheckpointStep;
    o.checkpoint.keep = 10;
    o.train.loss_scaling = {.mode = common::AutoOnOff::kOn, .initial = kInitial,
                      .growth_interval = 2};
    return o;
  }

  worker::TrainerOptions resuming(const std::string& dir, int64_t max_steps) const {
    worker::TrainerOptions o = options(dir, max_steps);
    o.checkpoint.resume = worker::ResumeSetting::kRequired;
    return o;
  }

  // Trains with `o`, capturing what rank 0 prints.
  worker::TrainResult run(const worker::TrainerOptions& o, std::string* printed = nullptr) {
    testing::internal::CaptureStdout();
    worker::TrainResult r = worker::train(graph, *backend, train, {}, norm, o);
    const std::string out = testing::internal::GetCapturedStdout();
    if (printed) *printed = out;
    return r;
  }
};

std::string checkpoint_at(const std::string& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%010lld.vtc", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

// A new folder holding `c` as its only checkpoint, to resume from.
std::string folder_with(const TempDir& tmp, const std::string& name, const worker::Checkpoint& c) {
  const std::string dir = tmp.path(name);
  worker::save_checkpoint(dir, c, 1);
  return dir;
}

TEST(LossScaleResume, ContinuesWithTheScaleItHadAndTrainsTheSameWeights) {
  Job job;
  const TempDir tmp;
  const worker::TrainResult unbroken = job.run(job.options(tmp.path("unbroken"), 0));
  const worker::TrainResult until = job.run(job.options(tmp.path("until"), kCheckpointStep));
  // The scale moved both ways before the checkpoint and after it, so a
  // resume that lost it would skip other steps.
  ASSERT_GT(until.skipped_steps, 0);
  ASSERT_GT(unbroken.skipped_steps, until.skipped_steps);
  ASSERT_NE(until.loss_scale, kInitial);

  const worker::Checkpoint saved =
      worker::load_checkpoint(checkpoint_at(tmp.path("unbroken"), kCheckpointStep));
  ASSERT_TRUE(saved.loss_scaler.has_value());
  EXPECT_EQ(saved.loss_scaler->scale, until.loss_scale);
  EXPECT_EQ(saved.loss_scaler->skipped_steps, until.skipped_steps);

  // Resumed with nothing left to run: the scaler is the checkpoint's.
  std::string printed;
  const worker::TrainResult at_checkpoint =
      job.run(job.resuming(folder_with(tmp, "zero", saved), kCheckpointStep), &printed);
  EXPECT_EQ(at_checkpoint.loss_scale, until.loss_scale);
  EXPECT_EQ(at_checkpoint.skipped_steps, until.skipped_steps);
  EXPECT_NE(printed.find("loss scaling: continuing at scale"), std::string::npos) << printed;

  const worker::TrainResult resumed = job.run(job.resuming(folder_with(tmp, "resumed", saved), 0));
  EXPECT_EQ(resumed.steps, kSteps);
  EXPECT_EQ(resumed.loss_scale, unbroken.loss_scale);
  EXPECT_EQ(resumed.skipped_steps, unbroken.skipped_steps);
  EXPECT_TRUE(bitwise_equal(
      worker::load_checkpoint(checkpoint_at(tmp.path("unbroken"), kSteps)).parameters,
      worker::load_checkpoint(resumed.last_checkpoint).parameters));
}

// A checkpoint without a loss scale (a version 2 file, or a run without
// loss scaling) starts the scaler at train.loss_scaling.initial, saying so;
// a run without loss scaling resumes a checkpoint with one and says it is
// not used.
TEST(LossScaleResume, WithoutASavedScaleTheScalerStartsAtInitial) {
  Job job;
  const TempDir tmp;
  job.run(job.options(tmp.path("first"), kCheckpointStep));
  worker::Checkpoint saved =
      worker::load_checkpoint(checkpoint_at(tmp.path("first"), kCheckpointStep));
  ASSERT_TRUE(saved.loss_scaler.has_value());
  ASSERT_NE(saved.loss_scaler->scale, kInitial);

  worker::TrainerOptions off = job.resuming(folder_with(tmp, "off", saved), kCheckpointStep);
  off.train.loss_scaling.mode = common::AutoOnOff::kOff;
  std::string printed;
  EXPECT_EQ(job.run(off, &printed).loss_scale, 0);
  EXPECT_NE(printed.find("loss scaling: off in this run; the checkpoint's scale"),
            std::string::npos)
      << printed;

  saved.loss_scaler.reset();
  const worker::TrainResult fresh =
      job.run(job.resuming(folder_with(tmp, "old", saved), kCheckpointStep), &printed);
  EXPECT_EQ(fresh.loss_scale, kInitial);
  EXPECT_EQ(fresh.skipped_steps, 0);
  EXPECT_NE(printed.find("holds no loss scale (written by an older vtrain or by a run without "
                         "loss scaling); starting at train.loss_scaling.initial"),
            std::string::npos)
      << printed;
}

}  // namespace
}  // namespace vtrain
