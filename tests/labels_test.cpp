// Labels outside the model's classes: found when the data is loaded, named
// by file and index, through the library and through `vtrain` as users run
// it (before any training step).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/files.h"
#include "tests/data_files.h"
#include "tests/test_support.h"
#include "worker/data/data.h"

namespace vtrain::worker {
namespace {

using test_support::Bytes;
using test_support::idx_images;
using test_support::idx_labels;
using test_support::put_cifar_record;
using test_support::TempDir;

std::string write(const TempDir& dir, const std::string& name, const Bytes& bytes) {
  const std::string path = dir.path(name);
  common::write_file_whole(path, std::string(bytes.begin(), bytes.end()), "test data");
  return path;
}

std::string data_error(const std::function<void()>& check) {
  return test_support::error_message<DataError>(check);
}

TEST(CheckLabels, NamesTheFileTheIndexAndTheRange) {
  TempDir dir;
  const std::string images = write(dir, "images", idx_images(4, 2, 2));
  const std::string labels = write(dir, "labels", idx_labels({1, 9, 200, 201}));
  const Dataset data = load_idx(images, labels);
  EXPECT_EQ(data.classes, 202);
  EXPECT_EQ(data_error([&] { check_labels(data, 10); }),
            labels + ": label index 2: label 200 is outside [0, 10), the model's 10 classes");
  check_labels(data, 202);  // every label fits 202 classes
}

TEST(CheckLabels, CountsTheIndexWithinEachCifarFile) {
  TempDir dir;
  Bytes first, second;
  put_cifar_record(first, 3, 0);
  put_cifar_record(second, 1, 0);
  put_cifar_record(second, 7, 0);
  const std::string a = write(dir, "data_batch_1.bin", first);
  const std::string b = write(dir, "data_batch_2.bin", second);
  const Dataset data = load_cifar10({a, b});
  // A model with 5 classes: the 7 is record 1 of the second file.
  EXPECT_EQ(data_error([&] { check_labels(data, 5); }),
            b + ": label index 1: label 7 is outside [0, 5), the model's 5 classes");
  check_labels(data, 10);
}

TEST(CheckLabels, SyntheticDataNamesTheSample) {
  const Dataset data = make_synthetic({1, 1, 4, 4}, 6, 12, 1);
  EXPECT_EQ(data_error([&] { check_labels(data, 4); }),
            "sample 4: label 4 is outside [0, 4), the model's 4 classes");
  check_labels(data, 6);
}

// An IDX config of 8 images of 28x28 for LeNet (10 classes) whose train or
// test labels hold one 200.
class LabelsCli : public ::testing::Test {
 protected:
  std::string config(bool bad_train, bool bad_test) {
    const std::vector<uint8_t> good = {0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<uint8_t> bad = good;
    bad[5] = 200;
    write(dir_, "images", idx_images(8, 28, 28));
    train_labels_ = write(dir_, "train-labels", idx_labels(bad_train ? bad : good));
    test_labels_ = write(dir_, "test-labels", idx_labels(bad_test ? bad : good));
    const std::string text =
        "model: {preset: lenet}\n"
        "data: {kind: idx, train_images: images, train_labels: train-labels, "
        "test_images: images, test_labels: test-labels}\n"
        "train: {batch: 4, epochs: 1}\n"
        "device: {backend: cpu, threads: 1}\n";
    const std::string path = dir_.path("labels.yaml");
    common::write_file_whole(path, text, "config");
    return path;
  }

  int run(const std::string& args, std::string* output) {
    return test_support::run_command(test_support::vtrain_binary() + " " + args, output);
  }

  TempDir dir_;
  std::string train_labels_, test_labels_;
};

TEST_F(LabelsCli, BadTrainLabelNamesTheFile) {
  std::string output;
  EXPECT_EQ(run("train " + config(true, false) + " --progress line", &output), 1) << output;
  EXPECT_CONTAINS(output, train_labels_ + ": label index 5: label 200 is outside [0, 10)");
  EXPECT_EQ(output.find("classes but the model has"), std::string::npos) << output;
}

TEST_F(LabelsCli, BadTestLabelFailsBeforeTraining) {
  std::string output;
  EXPECT_EQ(run("train " + config(false, true) + " --progress line", &output), 1) << output;
  EXPECT_CONTAINS(output, test_labels_ + ": label index 5: label 200 is outside [0, 10)");
  EXPECT_EQ(output.find("step"), std::string::npos) << "trained before failing:\n" << output;
  EXPECT_EQ(output.find("softmax_cross_entropy"), std::string::npos) << output;
}

TEST_F(LabelsCli, CheckFindsItToo) {
  std::string output;
  EXPECT_EQ(run("check " + config(false, true), &output), 1) << output;
  EXPECT_CONTAINS(output, test_labels_ + ": label index 5");
}

}  // namespace
}  // namespace vtrain::worker
