// vtrain evaluate and predict as users run them: LeNet trained for 20 steps
// on a little synthetic data with checkpoints, then scored on 1, 2 and 3
// ranks (the same JSON), its confusion matrix, predict against evaluate,
// training's own top-5 against evaluate's, and bad inputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "tests/metrics_records.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_support::RunResult;
using test_support::TempDir;

constexpr int kTestSamples = 70;  // not a multiple of the batch: the last batch is short
constexpr int kClasses = 10;

// The config and data of every command here: 160 training samples of
// batch 8 (one epoch of 20 steps), one thread, direct convolutions (what
// evaluate runs where conv.algorithm names none is the least-workspace
// one; naming it makes training's evaluation run the same).
std::string config_args() {
  return test_support::source_dir() + "/configs/synthetic-lenet.yaml" +
         " --set train.batch=8 --set data.train_size=160 --set data.test_size=" +
         std::to_string(kTestSamples) +
         " --set train.epochs=1 --set device.threads=1 --set conv.algorithm=direct";
}

// The last line of `output` that is a JSON object (mpirun may add lines).
json last_json(const std::string& output) {
  std::istringstream in(output);
  std::string object;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("{")) object = line;
  }
  if (object.empty()) {
    ADD_FAILURE() << "no JSON object in:\n" << output;
    return json::object();
  }
  return json::parse(object);
}

class EvaluateCli : public ::testing::Test {
 protected:
  // One training run for the whole suite: checkpoints at steps 10 and 20,
  // and its metrics.
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    const RunResult r = test_support::run_vtrain(
        "train " + config_args() + " --set checkpoint.dir=" + checkpoints() +
        " --set checkpoint.every=10 --progress off --metrics " + metrics());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static std::string checkpoints() { return tmp_->path("ck"); }
  static std::string metrics() { return tmp_->path("metrics.jsonl"); }

  // `vtrain evaluate` of the checkpoint folder, on `ranks` ranks through
  // mpirun (0: without mpirun), with `extra` arguments.
  static RunResult evaluate(const std::string& extra, int ranks = 0) {
    const std::string args =
        "evaluate " + config_args() + " --checkpoint " + checkpoints() + " " + extra;
    if (ranks == 0) return test_support::run_vtrain(args);
    RunResult r;
    r.exit_code = test_support::run_command(
        test_support::mpirun(ranks) + test_support::vtrain_binary() + " " + args, &r.output);
    return r;
  }
  static RunResult predict(const std::string& inputs_and_flags) {
    return test_support::run_vtrain("predict " + config_args() + " --checkpoint " +
                                    checkpoints() + " " + inputs_and_flags);
  }

  static TempDir* tmp_;
};
TempDir* EvaluateCli::tmp_ = nullptr;

TEST_F(EvaluateCli, OneTwoAndThreeRanksGiveTheSameFigures) {
  std::vector<std::string> outputs;
  for (int ranks = 1; ranks <= 3; ++ranks) {
    const RunResult r = evaluate("--json --batch 16", ranks);
    ASSERT_EQ(r.exit_code, 0) << ranks << " ranks:\n" << r.output;
    outputs.push_back(last_json(r.output).dump());
  }
  EXPECT_EQ(outputs[1], outputs[0]) << "2 ranks against 1";
  EXPECT_EQ(outputs[2], outputs[0]) << "3 ranks against 1";
  const json e = json::parse(outputs[0]);
  EXPECT_EQ(e["samples"], kTestSamples);
  EXPECT_EQ(e["classes"], kClasses);
  EXPECT_EQ(e["step"], 20);
  EXPECT_EQ(e["checkpoint"], checkpoints() + "/ckpt-0000000020.vtc");
  int64_t samples = 0, correct = 0;
  for (const json& c : e["per_class"]) {
    samples += c["samples"].get<int64_t>();
    correct += c["correct"].get<int64_t>();
  }
  EXPECT_EQ(samples, kTestSamples);
  EXPECT_EQ(correct, e["correct"].get<int64_t>());
  EXPECT_GE(e["top5_correct"].get<int64_t>(), e["correct"].get<int64_t>());
  // JSON numbers carry 9 significant digits.
  EXPECT_NEAR(e["accuracy"].get<double>(), e["correct"].get<double>() / kTestSamples, 1e-8);
}

// A row per label, a column per top-1 class: rows sum to the label's
// samples, everything to the test set, the diagonal to the correct ones.
TEST_F(EvaluateCli, ConfusionRowsSumToTheTestSet) {
  const std::string csv = tmp_->path("confusion.csv");
  const RunResult r = evaluate("--json --confusion " + csv);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json e = last_json(r.output);
  std::istringstream in(test_support::read_file(csv));
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "label,0,1,2,3,4,5,6,7,8,9");
  int64_t total = 0, diagonal = 0;
  for (int label = 0; label < kClasses; ++label) {
    ASSERT_TRUE(std::getline(in, line)) << "row " << label;
    std::istringstream cells(line);
    std::string cell;
    std::getline(cells, cell, ',');
    EXPECT_EQ(cell, std::to_string(label));
    int64_t row = 0;
    for (int c = 0; std::getline(cells, cell, ','); ++c) {
      row += std::stoll(cell);
      if (c == label) diagonal += std::stoll(cell);
    }
    EXPECT_EQ(row, e["per_class"][label]["samples"].get<int64_t>()) << "row " << label;
    total += row;
  }
  EXPECT_FALSE(std::getline(in, line)) << "a row too many: " << line;
  EXPECT_EQ(total, kTestSamples);
  EXPECT_EQ(diagonal, e["correct"].get<int64_t>());
}

// predict on every test sample: probabilities that sum to 1, in order; its
// top-1 classes give evaluate's correct count, top-5 count and confusion.
TEST_F(EvaluateCli, PredictAgreesWithEvaluate) {
  const std::string csv = tmp_->path("confusion-for-predict.csv");
  const RunResult er = evaluate("--json --confusion " + csv);
  ASSERT_EQ(er.exit_code, 0) << er.output;
  const json e = last_json(er.output);
  std::string inputs;
  for (int i = 0; i < kTestSamples; ++i) inputs += " test:" + std::to_string(i);
  const RunResult pr = predict("--json --top 10" + inputs);
  ASSERT_EQ(pr.exit_code, 0) << pr.output;
  const json p = last_json(pr.output);
  ASSERT_EQ(p["predictions"].size(), static_cast<size_t>(kTestSamples));
  std::vector<std::vector<int64_t>> confusion(kClasses, std::vector<int64_t>(kClasses, 0));
  int64_t correct = 0, top5 = 0;
  for (int i = 0; i < kTestSamples; ++i) {
    const json& one = p["predictions"][i];
    EXPECT_EQ(one["input"], "test:" + std::to_string(i));
    const json& top = one["top"];
    ASSERT_EQ(top.size(), static_cast<size_t>(kClasses));
    double sum = 0, previous = 2;
    for (const json& t : top) {
      const double probability = t["probability"].get<double>();
      EXPECT_LE(probability, previous) << "input " << i << ": not in order";
      previous = probability;
      sum += probability;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "input " << i;
    const int64_t label = one["label"].get<int64_t>();
    const int64_t first = top[0]["class"].get<int64_t>();
    ++confusion[label][first];
    correct += first == label;
    for (int k = 0; k < 5; ++k) top5 += top[k]["class"].get<int64_t>() == label;
  }
  EXPECT_EQ(correct, e["correct"].get<int64_t>());
  EXPECT_EQ(top5, e["top5_correct"].get<int64_t>());
  std::ostringstream expected;
  expected << "label,0,1,2,3,4,5,6,7,8,9\n";
  for (int label = 0; label < kClasses; ++label) {
    expected << label;
    for (int64_t n : confusion[label]) expected << "," << n;
    expected << "\n";
  }
  EXPECT_EQ(test_support::read_file(csv), expected.str());
}

TEST_F(EvaluateCli, PredictPrintsTheTopClassesOfEachInput) {
  const RunResult r = predict("test:3 train:5 --top 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "checkpoint: " + checkpoints() + "/ckpt-0000000020.vtc (step 20)");
  EXPECT_CONTAINS(r.output, "test:3: label ");
  EXPECT_CONTAINS(r.output, "train:5: label ");
  const json p = last_json(predict("test:3 --json").output);
  EXPECT_EQ(p["predictions"][0]["top"].size(), 5u) << "--top defaults to 5";
}

// The trainer's evaluation after the epoch is the same evaluation: its
// metrics carry top-5, and the figures match evaluate's of the checkpoint
// it wrote at the same step.
TEST_F(EvaluateCli, TrainingReportsTheSameTopOneAndTopFive) {
  const std::vector<json> epochs = test_support::metric_records(metrics(), "epoch");
  const std::vector<json> ends = test_support::metric_records(metrics(), "end");
  const json epoch = epochs.empty() ? json::object() : epochs.back();
  const json end = ends.empty() ? json::object() : ends.back();
  ASSERT_TRUE(epoch.contains("test_top5_accuracy")) << epoch.dump();
  ASSERT_TRUE(end.contains("test_top5_accuracy")) << end.dump();
  const RunResult r = evaluate("--json --batch 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json e = last_json(r.output);
  EXPECT_EQ(epoch["test_accuracy"].get<double>(), e["accuracy"].get<double>());
  EXPECT_EQ(epoch["test_top5_accuracy"].get<double>(), e["top5_accuracy"].get<double>());
  EXPECT_EQ(end["test_top5_accuracy"].get<double>(), e["top5_accuracy"].get<double>());
  EXPECT_NEAR(epoch["test_loss"].get<double>(), e["loss"].get<double>(),
              1e-6 * e["loss"].get<double>());
}

TEST_F(EvaluateCli, AFolderMeansItsNewestCheckpointAndAFileItself) {
  const std::string older = checkpoints() + "/ckpt-0000000010.vtc";
  const RunResult r = test_support::run_vtrain("evaluate " + config_args() + " --json " +
                                               "--checkpoint " + older);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(last_json(r.output)["step"], 10);
  EXPECT_EQ(last_json(r.output)["checkpoint"], older);
  const RunResult text = evaluate("");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_CONTAINS(text.output, "ckpt-0000000020.vtc (step 20)");
  EXPECT_CONTAINS(text.output, "top-5 ");
}

// Each bad input: its exit code and what the message must name.
struct BadCase {
  std::string args;
  int exit_code;
  std::vector<std::string> message;
};

TEST_F(EvaluateCli, BadInputsAreClearErrors) {
  const TempDir tmp;
  const std::string empty = tmp.path("empty");
  fs::create_directories(empty);
  const std::string truncated = tmp.path("ckpt-0000000020.vtc");
  {
    const std::string whole = test_support::read_file(checkpoints() + "/ckpt-0000000020.vtc");
    std::ofstream(truncated) << whole.substr(0, whole.size() / 2);
  }
  const std::string cfg = config_args();
  const std::string ck = " --checkpoint " + checkpoints();
  const std::vector<BadCase> cases = {
      {"evaluate " + cfg + " --checkpoint " + tmp.path("none"), 1,
       {tmp.path("none"), "does not exist"}},
      {"evaluate " + cfg + " --checkpoint " + empty, 1, {empty, "holds no checkpoint"}},
      {"evaluate " + cfg + " --checkpoint " + truncated, 1, {truncated, "truncated"}},
      // Another model: the smooth LeNet's average pools.
      {"evaluate " + test_support::source_dir() + "/tests/configs/smooth-lenet.yaml" + ck, 1,
       {"written for another model"}},
      {"evaluate " + cfg, 2, {"evaluate needs --checkpoint PATH"}},
      {"evaluate " + cfg + ck + " --bogus", 2, {"unknown option '--bogus' for 'evaluate'"}},
      {"evaluate " + cfg + ck + " --top 3", 2, {"unknown option '--top' for 'evaluate'"}},
      {"evaluate " + cfg + ck + " --confusion " + tmp.path(), 1,
       {"cannot write confusion matrix " + tmp.path()}},
      {"predict " + cfg + ck + " test:" + std::to_string(kTestSamples), 2,
       {"'test:70'", "from 0 to 69", "the test data has 70 samples"}},
      {"predict " + cfg + ck + " test:-1", 2, {"'test:-1'", "whole number"}},
      {"predict " + cfg + ck + " picture.png", 2,
       {"'picture.png'", "test:INDEX or train:INDEX"}},
      {"predict " + cfg + ck, 2, {"predict needs at least one INPUT"}},
      {"predict " + cfg + ck + " test:1 --top 0", 2, {"--top expects a positive integer"}},
      {"predict " + cfg + ck + " test:1 --confusion x.csv", 2,
       {"unknown option '--confusion' for 'predict'"}},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.args);
    const RunResult r = test_support::run_vtrain(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.output;
    for (const std::string& part : c.message) EXPECT_CONTAINS(r.output, part);
  }
  EXPECT_TRUE(fs::is_directory(tmp.path())) << "--confusion at a folder leaves it";
}

// Under mpirun, rank 0's checkpoint error ends every rank.
TEST_F(EvaluateCli, AMissingCheckpointEndsEveryRank) {
  RunResult r;
  r.exit_code = test_support::run_command(
      test_support::mpirun(2) + test_support::vtrain_binary() + " evaluate " + config_args() +
          " --checkpoint " + tmp_->path("none"),
      &r.output);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "does not exist");
}

}  // namespace
}  // namespace vtrain
