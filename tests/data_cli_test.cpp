// `vtrain data pack | bench` and image-data configs, run as a user runs the
// binary (ctest label cpu): shards packed from an image folder train as the
// folder does, broken images and bad transform keys end the run with the
// documented exit codes and a message naming the file or key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "worker/data/data.h"
#include "worker/data/image_decoder.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using test_support::run_vtrain;

// 2 classes x 8 RGB JPEGs of 40x30 in train/ and test/, and configs for
// the folder and for shards packed from it.
class DataCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const worker::Dataset source = worker::make_synthetic({1, 3, 30, 40}, 2, 16, 3);
    std::vector<uint8_t> hwc(30 * 40 * 3);
    for (const char* split : {"train", "test"}) {
      for (int64_t i = 0; i < source.count; ++i) {
        for (int64_t c = 0; c < 3; ++c) {
          for (int64_t j = 0; j < 1200; ++j) hwc[j * 3 + c] = source.pixels[(i * 3 + c) * 1200 + j];
        }
        const fs::path path = fs::path(dir_.path(split)) / ("c" + std::to_string(source.labels[i])) /
                              (std::to_string(i) + ".jpg");
        fs::create_directories(path.parent_path());
        write(path, worker::encode_jpeg(worker::interleaved(hwc.data(), 40, 30, 3), 90));
      }
    }
    std::ofstream(folder_) << "model: {preset: lenet, classes: 2}\ndata:\n  kind: imagefolder\n  train_dir: "
                           << dir_.path("train") << "\n  test_dir: " << dir_.path("test") << "\n" << kCommon;
  }

  static void write(const fs::path& path, const std::vector<uint8_t>& bytes) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }

  static constexpr const char* kCommon =
      "  shape: [3, 28, 28]\n  train_transform: {crop: random_resized, flip: true}\n"
      "train: {batch: 8, epochs: 2, seed: 3}\ndevice: {threads: 1}\n";
  test_support::TempDir dir_;
  const std::string folder_ = dir_.path("folder.yaml");
};

TEST_F(DataCli, PackedShardsTrainAsTheFolderDoes) {
  const auto packed = run_vtrain("data pack " + folder_ + " --out " + dir_.path("s") + " --shard-samples 5");
  ASSERT_EQ(packed.exit_code, 0) << packed.output;
  EXPECT_NE(packed.output.find("data pack: 16 samples into 4 shard(s)"), std::string::npos) << packed.output;
  EXPECT_TRUE(fs::exists(dir_.path("s-000003.tar.idx")));
  const auto test_packed = run_vtrain("data pack " + folder_ + " --split test --out " + dir_.path("t"));
  ASSERT_EQ(test_packed.exit_code, 0) << test_packed.output;
  const std::string shards = dir_.path("shards.yaml");
  std::ofstream(shards) << "model: {preset: lenet, classes: 2}\ndata:\n  kind: shards\n  train_shards: "
                        << dir_.path("s-{000000..000003}.tar") << "\n  test_shards: " << dir_.path("t-000000.tar")
                        << "\n"
                        << kCommon;
  const std::string metrics = " --progress off --set conv.algorithm=direct --metrics ";
  const auto a = run_vtrain(folder_ + metrics + dir_.path("a.jsonl"));
  const auto b = run_vtrain(shards + metrics + dir_.path("b.jsonl"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // The same samples in the same order (the folder's sorted walk is the
  // packing order), the same transforms: the same losses.
  auto field = [](const std::string& path, const std::string& name) {
    std::ifstream in(path);
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = all.find("\"" + name + "\": ", all.find("\"event\": \"end\""));
    return at == std::string::npos ? std::string("missing") : all.substr(at, all.find(',', at) - at);
  };
  for (const char* name : {"final_loss", "test_accuracy", "test_loss"}) {
    EXPECT_EQ(field(dir_.path("a.jsonl"), name), field(dir_.path("b.jsonl"), name));
  }
  EXPECT_NE(a.output.find("input-bound"), std::string::npos) << a.output;
}

TEST_F(DataCli, BenchPrintsImagesPerSecond) {
  const auto r = run_vtrain("data bench " + folder_ + " --workers 2 --batch 4 --batches 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data bench: 12 images (3 batches of 4) of 1x3x28x28, transform random_resized"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("2 worker(s):"), std::string::npos) << r.output;
}

TEST_F(DataCli, ABrokenImageEndsTheRunNamingIt) {
  const fs::path victim = fs::path(dir_.path("train")) / "c1" / "1.jpg";
  std::vector<uint8_t> bytes(200, 0x55);
  bytes[0] = 0xFF, bytes[1] = 0xD8, bytes[2] = 0xFF;
  write(victim, bytes);
  const auto r = run_vtrain(folder_ + " --progress off");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(victim.string() + ": corrupt JPEG"), std::string::npos) << r.output;
}

// predict reads an image file through the evaluation transform, as the
// test set's own sample: test:0 is test/c0/0.jpg (the folder's sorted walk).
TEST_F(DataCli, PredictOnAnImageFileEqualsItsTestSample) {
  const std::string ckpt = dir_.path("ckpt");
  const auto trained = run_vtrain(folder_ + " --progress off --set train.epochs=1 --set checkpoint.dir=" + ckpt);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string image = (fs::path(dir_.path("test")) / "c0" / "0.jpg").string();
  const auto r = run_vtrain("predict " + folder_ + " --checkpoint " + ckpt + " --json --top 2 test:0 " + image);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // {"input": "test:0", "label": 0, "top": [...]}, {"input": IMAGE, "top": [...]}: no label for a file.
  const size_t first = r.output.find("\"top\": ["), second = r.output.find("\"top\": [", first + 1);
  ASSERT_NE(second, std::string::npos) << r.output;
  const std::string a = r.output.substr(first, r.output.find(']', first) - first);
  const std::string b = r.output.substr(second, r.output.find(']', second) - second);
  EXPECT_EQ(a, b) << r.output;
  EXPECT_NE(r.output.find("{\"input\": \"" + image + "\", \"top\""), std::string::npos) << r.output;

  const std::string text = dir_.path("notes.txt");
  std::ofstream(text) << "not an image";
  const auto bad = run_vtrain("predict " + folder_ + " --checkpoint " + ckpt + " " + text);
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find(text), std::string::npos) << bad.output;
  const auto missing = run_vtrain("predict " + folder_ + " --checkpoint " + ckpt + " " + dir_.path("no.jpg"));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("or the path of a JPEG or PNG file"), std::string::npos) << missing.output;
}

// `vtrain profile` stores the rank's input rate; `db export --table
// input_rates` shows its rows, one per line after the CSV header.
std::vector<std::string> input_rate_rows(const std::string& db) {
  const auto r = run_vtrain("db export --table input_rates --db " + db);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> rows;
  std::istringstream lines(r.output);
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    if (!line.empty()) rows.push_back(line);
  }
  return rows;
}

// Two image folders are two datasets: each gets its own measured rate.
TEST_F(DataCli, TwoImageFoldersGetTwoInputRates) {
  const std::string db = dir_.path("perf.db");
  const std::string profile = " --progress off --set conv.algorithm=direct --set data.workers=1 --db " + db;
  ASSERT_EQ(run_vtrain("profile " + folder_ + profile).exit_code, 0);
  const auto other = run_vtrain("profile " + folder_ + profile + " --set data.train_dir=" + dir_.path("test"));
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const std::vector<std::string> rows = input_rate_rows(db);
  ASSERT_EQ(rows.size(), 2u) << ::testing::PrintToString(rows);
  EXPECT_NE(rows[0].find(dir_.path("train")), std::string::npos) << rows[0];
  EXPECT_NE(rows[1].find(dir_.path("test")), std::string::npos) << rows[1];
}

// The rate is the decoding pool's at data.workers threads through the
// training transform: another worker count is measured again, and each
// row names the transform.
TEST_F(DataCli, TheInputRateIsTheDecodingPoolsAtItsWorkers) {
  const std::string db = dir_.path("perf.db");
  const std::string profile = "profile " + folder_ + " --progress off --set conv.algorithm=direct --db " + db;
  ASSERT_EQ(run_vtrain(profile + " --set data.workers=1").exit_code, 0);
  ASSERT_EQ(run_vtrain(profile + " --set data.workers=3").exit_code, 0);
  const std::vector<std::string> rows = input_rate_rows(db);
  ASSERT_EQ(rows.size(), 2u) << ::testing::PrintToString(rows);
  // id,host,workers,...: the third column.
  auto workers = [](const std::string& row) {
    const size_t at = row.find(',', row.find(',') + 1) + 1;
    return row.substr(at, row.find(',', at) - at);
  };
  EXPECT_EQ(workers(rows[0]), "1") << rows[0];
  EXPECT_EQ(workers(rows[1]), "3") << rows[1];
  for (const std::string& row : rows) {
    EXPECT_NE(row.find("random_resized (scale 0.08-1, ratio 0.75-1.333) + flip + normalise"), std::string::npos)
        << row;
  }
}

TEST_F(DataCli, UsageAndConfigErrorsSayWhatIsExpected) {
  auto expect = [&](const std::string& args, int code, const std::string& text) {
    const auto r = run_vtrain(args);
    EXPECT_EQ(r.exit_code, code) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(text), std::string::npos) << args << "\n" << r.output;
  };
  expect("data pack " + folder_, 2, "data pack needs --out PREFIX");
  expect("data unpack " + folder_, 2, "data needs an action: pack or bench");
  expect("data bench " + folder_ + " --split val", 2, "--split must be train or test, got 'val'");
  expect("data bench " + folder_ + " --max-side 3", 2, "unknown option '--max-side' for 'data'");
  expect("check " + folder_ + " --set data.train_transform.crop=zoom", 2,
         "data.train_transform.crop: unknown value 'zoom'");
  expect("check " + folder_ + " --set data.train_transform.scale=[0.5,0.1]", 2,
         "data.train_transform.scale: expected lo <= hi, got [0.5, 0.1]");
  fs::create_directories(dir_.path("empty"));
  expect("check " + folder_ + " --set data.train_dir=" + dir_.path("empty"), 1, "has no class folders");
}

}  // namespace
}  // namespace vtrain
