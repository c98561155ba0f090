// vtrain's exactness guarantees with augmentation on (ctest label mpi),
// through mpirun as users run it: an image folder trained with random-
// resized crops and flips, and in-memory data with CIFAR's random crop and
// flip, give the same weights on one rank and on an uneven 7/0/41 split;
// a resumed run repeats the uninterrupted one bitwise; a checkpoint of N
// ranks continues on M as an uninterrupted M-rank run does. Each holds
// because a sample's random choices depend only on (seed, epoch, index).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/mpi_runs.h"
#include "tests/test_support.h"
#include "worker/data/data.h"
#include "worker/data/image_decoder.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;

using mpi_runs::run;
using mpi_runs::TempDir;

// As tests/configs/smooth-lenet.yaml (see there why: no max pool or ReLU
// whose near-ties rounding could flip), on an image folder.
constexpr const char* kSmoothLeNet = R"(model:
  layers:
    - {name: data, type: input}
    - {name: conv1, type: conv, out: 20, kernel: 5}
    - {name: pool1, type: pool, mode: avg, kernel: 2}
    - {name: conv2, type: conv, out: 50, kernel: 5}
    - {name: pool2, type: pool, mode: avg, kernel: 2}
    - {name: fc1, type: fc, out: 500}
    - {name: fc2, type: fc, out: 10}
train: {batch: 48, epochs: 3, seed: 1}
optimizer: {lr: 0.05, momentum: 0.9, weight_decay: 5.0e-4}
)";

// The same tolerance as the split and elastic tests (relative to the
// weights' scale): other rank counts add the gradients' parts in another order.
constexpr double kTolerance = 1e-5;

// 480 training and 48 test images of 28x28 grey PNG in 10 class folders
// (synthetic prototypes plus noise), of varied sizes so that the crops
// resample, and the config that trains them with random-resized crops and
// flips.
class ImageFolderRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    write_split("train", 480, 0);
    write_split("test", 48, 480);
    std::ofstream(config_) << kSmoothLeNet << "data:\n  kind: imagefolder\n  train_dir: " << dir_ / "train"
                           << "\n  test_dir: " << dir_ / "test"
                           << "\n  shape: [1, 28, 28]\n  mean: [0.5]\n  std: [0.25]\n"
                              "  train_transform: {crop: random_resized, flip: true}\n";
  }

  // `steps` steps of this config with checkpoints in `ckpt_dir`.
  std::string args(const std::string& ckpt_dir, int steps, const std::string& extra = "") const {
    return test_support::vtrain_binary() + " " + config_ +
           " --progress off --set train.max_steps=" + std::to_string(steps) +
           " --set train.evaluate=false --set conv.algorithm=direct" +
           " --set device.threads=1 --set data.workers=2 --set checkpoint.dir=" + ckpt_dir + " " + extra;
  }

  TempDir dir_;

 private:
  void write_split(const std::string& split, int count, int first) {
    const worker::Dataset all = worker::make_synthetic({1, 1, 28, 28}, 10, first + count, 5);
    for (int i = first; i < first + count; ++i) {
      // 28x28 upscaled to 28..44 px a side by repeating rows and columns.
      const int w = 28 + (i * 7) % 17, h = 28 + (i * 5) % 17;
      std::vector<uint8_t> pixels(static_cast<size_t>(w * h));
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) pixels[y * w + x] = all.pixels[i * 784 + (y * 28 / h) * 28 + x * 28 / w];
      }
      char name[64];
      std::snprintf(name, sizeof name, "%s/c%d/%05d.png", split.c_str(), all.labels[i], i);
      const fs::path path = dir_ / name;
      fs::create_directories(path.parent_path());
      const std::vector<uint8_t> png = worker::encode_png(worker::interleaved(pixels.data(), w, h, 1));
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
    }
  }

  const std::string config_ = dir_ / "images.yaml";
};

// One rank against an uneven split with an idle rank, over two epochs.
TEST_F(ImageFolderRuns, AnUnevenSplitTrainsAsOneRank) {
  std::string out;
  ASSERT_EQ(run(args(dir_ / "one", 20), &out), 0) << out;
  ASSERT_EQ(run(mpi_runs::mpirun(3) +
                    args(dir_ / "three", 20, "--set balance.split=manual --set balance.manual=[7,0,41]"),
                &out),
            0)
      << out;
  const std::vector<float> one = mpi_runs::final_parameters(dir_ / "one");
  const std::vector<float> three = mpi_runs::final_parameters(dir_ / "three");
  ASSERT_FALSE(one.empty());
  const mpi_runs::Difference d = mpi_runs::compare(one, three);
  std::printf("image folder, augmented, 20 steps: 7/0/41 vs 1 rank max abs %.3g (relative %.3g)\n", d.max_abs,
              d.relative);
  EXPECT_LE(d.relative, kTolerance);
}

TEST_F(ImageFolderRuns, AResumedRunRepeatsTheUninterruptedOneBitwise) {
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const std::string tag = std::to_string(ranks);
    std::string out;
    const std::string log = " --set train.log_every=1 --metrics ";
    ASSERT_EQ(
        run(mpi_runs::launch(ranks) + args(dir_ / ("full" + tag), 24, log + dir_ / ("full" + tag + ".jsonl")),
            &out),
        0)
        << out;
    ASSERT_EQ(
        run(mpi_runs::launch(ranks) + args(dir_ / ("part" + tag), 13, log + dir_ / ("a" + tag + ".jsonl")),
            &out),
        0)
        << out;
    ASSERT_EQ(run(mpi_runs::launch(ranks) +
                      args(dir_ / ("part" + tag), 24, "--resume" + log + dir_ / ("b" + tag + ".jsonl")),
                  &out),
              0)
        << out;
    std::vector<std::string> pieced = mpi_runs::logged_losses(dir_ / ("a" + tag + ".jsonl"));
    for (const std::string& l : mpi_runs::logged_losses(dir_ / ("b" + tag + ".jsonl"))) pieced.push_back(l);
    EXPECT_EQ(pieced, mpi_runs::logged_losses(dir_ / ("full" + tag + ".jsonl")));
    EXPECT_EQ(mpi_runs::final_parameters(dir_ / ("part" + tag)),
              mpi_runs::final_parameters(dir_ / ("full" + tag)));
  }
}

// 2 ranks stop mid-epoch; 1 and 3 ranks continue into the next epoch.
TEST_F(ImageFolderRuns, ACheckpointOfTwoRanksContinuesOnOneAndThree) {
  std::string out;
  ASSERT_EQ(run(mpi_runs::mpirun(2) + args(dir_ / "first", 7), &out), 0) << out;
  for (int m : {1, 3}) {
    SCOPED_TRACE(std::to_string(m) + " ranks");
    const std::string full = dir_ / ("full" + std::to_string(m));
    ASSERT_EQ(run(mpi_runs::launch(m) + args(full, 16), &out), 0) << out;
    const std::string ckpt = dir_ / ("to" + std::to_string(m));
    fs::copy(dir_ / "first", ckpt, fs::copy_options::recursive);
    ASSERT_EQ(run(mpi_runs::launch(m) + args(ckpt, 16, "--resume"), &out), 0) << out;
    const mpi_runs::Difference d =
        mpi_runs::compare(mpi_runs::final_parameters(full), mpi_runs::final_parameters(ckpt));
    std::printf("2 -> %d ranks: vs uninterrupted max abs %.3g (relative %.3g)\n", m, d.max_abs, d.relative);
    EXPECT_LE(d.relative, kTolerance);
  }
}

// In-memory data with CIFAR's recipe (random crop with padding + flip).
TEST(InMemoryAugmentation, AnUnevenSplitTrainsAsOneRank) {
  TempDir dir;
  std::string out;
  const std::string augment =
      "--set optimizer.momentum=0.9 --set \"data.train_transform={crop: random, pad: 4, flip: true}\"";
  const std::string& model = mpi_runs::kSmoothLeNetConfig;
  ASSERT_EQ(run(mpi_runs::train_args(dir / "one", 20, augment, model), &out), 0) << out;
  ASSERT_EQ(run(mpi_runs::mpirun(3) +
                    mpi_runs::train_args(
                        dir / "three", 20,
                        augment + " --set balance.split=manual --set balance.manual=[7,0,41]", model),
                &out),
            0)
      << out;
  const std::vector<float> one = mpi_runs::final_parameters(dir / "one");
  ASSERT_FALSE(one.empty());
  const mpi_runs::Difference d = mpi_runs::compare(one, mpi_runs::final_parameters(dir / "three"));
  std::printf("synthetic, random crop + flip, 20 steps: 7/0/41 vs 1 rank max abs %.3g (relative %.3g)\n",
              d.max_abs, d.relative);
  EXPECT_LE(d.relative, kTolerance);
}

}  // namespace
}  // namespace vtrain
