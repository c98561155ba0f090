// A run and its checkpoint folder, as users meet them through the vtrain
// executable: a second run started afresh in a folder that holds another
// run's checkpoints is refused and leaves them untouched; --resume needs a
// checkpoint, checkpoint.resume: auto starts afresh and says so; a resume
// with other settings is refused naming them; pruning keeps another run's
// files; a writer's leftover temporary is removed; a finished run resumed
// writes nothing; train.target_accuracy ends a run (and its resume) at the
// epoch that reaches it; --progress off still prints the log lines. LeNet on a
// little synthetic data, batch 8: each run takes a second or two.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/metrics_records.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using test_support::RunResult;
using test_support::TempDir;

// `vtrain train` of LeNet into checkpoint folder `dir` for `steps` steps
// at learning rate `lr`, a checkpoint every 5 steps, the newest 3 kept.
std::string train(const std::string& dir, int steps, const std::string& lr,
                  const std::string& extra = "") {
  return "train " + test_support::source_dir() + "/configs/synthetic-lenet.yaml" +
         " --set train.batch=8 --set data.train_size=256 --set data.test_size=16" +
         " --set train.evaluate=false --set conv.algorithm=direct --set device.threads=1" +
         " --set optimizer.momentum=0 --set optimizer.lr=" + lr +
         " --set train.max_steps=" + std::to_string(steps) +
         " --set checkpoint.dir=" + dir + " --set checkpoint.every=5 --set checkpoint.keep=3 " +
         extra;
}

// Every file in `dir` (hidden ones too) and its contents, but the lock
// file (each run that takes the folder writes its pid there).
std::map<std::string, std::string> contents_of(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename() == ".lock") continue;
    files[entry.path().filename()] = test_support::read_file(entry.path());
  }
  return files;
}

std::vector<std::string> checkpoint_names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& [name, text] : contents_of(dir)) {
    if (name.starts_with("ckpt-")) names.push_back(name);
  }
  return names;
}

const std::vector<std::string> kRunA = {"ckpt-0000000020.vtc", "ckpt-0000000025.vtc",
                                        "ckpt-0000000030.vtc"};

// The two runs: A (lr 0.01, 30 steps) leaves 20, 25, 30; B (lr
// 0.002, 12 steps) started afresh in the same folder is refused before it
// writes anything, and B with --resume is refused naming optimizer.lr.
TEST(CheckpointRun, ASecondRunInTheFolderIsRefusedAndChangesNothing) {
  const TempDir tmp;
  const std::string dir = tmp.path("ck");
  const RunResult a = test_support::run_vtrain(train(dir, 30, "0.01"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(checkpoint_names(dir), kRunA);
  const std::map<std::string, std::string> before = contents_of(dir);

  const RunResult b = test_support::run_vtrain(train(dir, 12, "0.002"));
  EXPECT_EQ(b.exit_code, 1) << b.output;
  EXPECT_CONTAINS(b.output, "checkpoint.dir " + dir + " already holds checkpoints (the newest "
                            "ckpt-0000000030.vtc, step 30, of run ");
  EXPECT_CONTAINS(b.output, "Continue that run with --resume");
  EXPECT_CONTAINS(b.output, "give this run a new checkpoint.dir");
  EXPECT_EQ(b.output.find("step 1/"), std::string::npos) << "trained before refusing\n" << b.output;
  EXPECT_EQ(contents_of(dir), before);

  const RunResult resumed = test_support::run_vtrain(train(dir, 12, "0.002", "--resume"));
  EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
  EXPECT_CONTAINS(resumed.output, dir + "/ckpt-0000000030.vtc belongs to run ");
  EXPECT_CONTAINS(resumed.output, "which was configured with optimizer.lr 0.01 (this run: 0.002)");
  EXPECT_EQ(contents_of(dir), before);
}

TEST(CheckpointRun, ResumeWithNoCheckpointIsAnError) {
  const TempDir tmp;
  const std::string dir = tmp.path("empty");
  const RunResult r = test_support::run_vtrain(train(dir, 5, "0.01", "--resume"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "nothing to resume: checkpoint.dir " + dir + " holds no checkpoint");
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained from step 0\n" << r.output;
  EXPECT_TRUE(checkpoint_names(dir).empty());
}

// checkpoint.resume: auto (what vtrain.sbatch passes) starts afresh where
// there is nothing to resume, and says so; the next run resumes.
TEST(CheckpointRun, ResumeAutoStartsAfreshAndSaysSo) {
  const TempDir tmp;
  const std::string dir = tmp.path("ck");
  const RunResult first =
      test_support::run_vtrain(train(dir, 5, "0.01", "--set checkpoint.resume=auto"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_CONTAINS(first.output,
                  "checkpoint.resume auto: " + dir + " holds no checkpoint; starting afresh");
  const RunResult second =
      test_support::run_vtrain(train(dir, 10, "0.01", "--set checkpoint.resume=auto"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_CONTAINS(second.output, "resumed from " + dir + "/ckpt-0000000005.vtc (step 5, epoch 1)");
  EXPECT_EQ(second.output.find("starting afresh"), std::string::npos) << second.output;
}

// A folder holding a checkpoint of another run (copied in) cannot be
// resumed: which run to continue cannot be told.
TEST(CheckpointRun, AFolderOfTwoRunsIsNotResumed) {
  const TempDir tmp;
  const std::string dir = tmp.path("a"), other = tmp.path("b");
  ASSERT_EQ(test_support::run_vtrain(train(dir, 10, "0.01")).exit_code, 0);
  ASSERT_EQ(test_support::run_vtrain(train(other, 15, "0.01")).exit_code, 0);
  fs::copy_file(other + "/ckpt-0000000015.vtc", dir + "/ckpt-0000000015.vtc");
  const std::map<std::string, std::string> before = contents_of(dir);
  const RunResult r = test_support::run_vtrain(train(dir, 20, "0.01", "--resume"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "checkpoint.dir " + dir + " holds the checkpoints of 2 runs");
  EXPECT_EQ(contents_of(dir), before);
}

// Rewrites a checkpoint of format 5 as an older vtrain wrote it (format 3:
// no run id or settings, no optimizer state beyond the velocity), so that
// a test can hold a folder of an older run. False for a file that is not
// of format 5 or holds more than SGD's state.
bool make_format_three(const std::string& path) {
  std::string bytes = test_support::read_file(path);
  if (bytes.size() < 64 || bytes[8] != 5) return false;
  const auto u64_at = [&](size_t at) {
    uint64_t v = 0;
    for (int i = 0; i < 8 && at + i < bytes.size(); ++i) {
      v |= uint64_t{static_cast<uint8_t>(bytes[at + i])} << (8 * i);
    }
    return v;
  };
  // Format 5's tail, before the CRC: an SGD run without train.ema has no
  // second moment (count 0), its update count, no weight average (count 0).
  const size_t tail = bytes.size() - 4 - 24;
  if (u64_at(tail) != 0 || u64_at(tail + 16) != 0) return false;
  bytes.erase(tail, 24);
  uint64_t end = 12 + 8 + u64_at(12);  // after the run id
  const uint64_t settings = u64_at(end);
  end += 8;
  for (uint64_t i = 0; i < 2 * settings && end < bytes.size(); ++i) end += 8 + u64_at(end);
  if (end >= bytes.size()) return false;
  bytes.erase(12, end - 12);
  bytes[8] = 3;
  bytes.resize(bytes.size() - 4);  // the CRC
  const uLong crc = crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(crc >> (8 * i)));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return true;
}

// A run of an older vtrain (format 3 files, no run id) continues under this
// one; its files are not this run's to prune, this run's own are.
TEST(CheckpointRun, AnOlderVtrainsCheckpointResumesAndIsNotPruned) {
  const TempDir tmp;
  const std::string dir = tmp.path("ck");
  ASSERT_EQ(test_support::run_vtrain(train(dir, 10, "0.01")).exit_code, 0);
  for (const std::string& name : checkpoint_names(dir)) {
    ASSERT_TRUE(make_format_three(dir + "/" + name)) << name << " is not of format 5 (an SGD run's)";
  }
  const RunResult r = test_support::run_vtrain(train(dir, 30, "0.01", "--resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "resumed from " + dir + "/ckpt-0000000010.vtc (step 10, epoch 1)");
  EXPECT_CONTAINS(r.output, "was written by an older vtrain");
  EXPECT_EQ(checkpoint_names(dir),
            (std::vector<std::string>{"ckpt-0000000005.vtc", "ckpt-0000000010.vtc",
                                      "ckpt-0000000020.vtc", "ckpt-0000000025.vtc",
                                      "ckpt-0000000030.vtc"}));
}

// A writer killed mid-write (SIGKILL) leaves .ckpt-N.tmp.PID; the next run
// in the folder removes it, whether it resumes or, the folder holding no
// checkpoint, starts afresh.
TEST(CheckpointRun, ALeftoverTemporaryIsRemoved) {
  const TempDir tmp;
  const std::string dir = tmp.path("ck");
  const pid_t dead = test_support::spawn_shell("exit 0");
  ASSERT_GT(dead, 0);
  ASSERT_EQ(test_support::wait_exit(dead, std::chrono::seconds(30)), 0);
  const std::string leftover = ".ckpt-3.tmp." + std::to_string(dead);
  fs::create_directories(dir);
  std::ofstream(dir + "/" + leftover) << std::string(4096, 'x');
  RunResult r = test_support::run_vtrain(train(dir, 5, "0.01"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "checkpoint: removed " + dir + "/" + leftover);
  EXPECT_FALSE(fs::exists(dir + "/" + leftover));

  std::ofstream(dir + "/" + leftover) << std::string(4096, 'x');
  r = test_support::run_vtrain(train(dir, 10, "0.01", "--resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/" + leftover));
  EXPECT_EQ(checkpoint_names(dir),
            (std::vector<std::string>{"ckpt-0000000005.vtc", "ckpt-0000000010.vtc"}));
}

// While a run holds the folder (its lock, held here by the test), a second
// vtrain there is refused.
TEST(CheckpointRun, AFolderInUseIsRefused) {
  const TempDir tmp;
  const std::string dir = tmp.path("ck");
  fs::create_directories(dir);
  const int fd = ::open((dir + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const RunResult r = test_support::run_vtrain(train(dir, 5, "0.01"));
  ::close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "checkpoint.dir " + dir + " is in use by another vtrain run");
  EXPECT_TRUE(checkpoint_names(dir).empty());
}

// A run resumed at the step it ends at trains nothing and writes nothing:
// no "end" record of zeros, no checkpoint, its metrics file as it was.
TEST(CheckpointRun, AFinishedRunResumedWritesNothing) {
  const TempDir tmp;
  const std::string dir = tmp.path("ck"), metrics = tmp.path("m.jsonl");
  const RunResult first = test_support::run_vtrain(train(dir, 10, "0.01", "--metrics " + metrics));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string records = test_support::read_file(metrics);
  ASSERT_NE(records.find("\"event\": \"end\""), std::string::npos) << records;
  const std::map<std::string, std::string> before = contents_of(dir);

  const RunResult again =
      test_support::run_vtrain(train(dir, 10, "0.01", "--resume --metrics " + metrics));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_CONTAINS(again.output, "already finished: " + dir + "/ckpt-0000000010.vtc is at step 10, "
                                "and this run ends at step 10");
  EXPECT_EQ(test_support::read_file(metrics), records);
  EXPECT_EQ(contents_of(dir), before);
}

// train.target_accuracy: a run of 4 epochs without it gives the test
// accuracy after each; the same run with the best of them as its target
// ends after the first epoch that reached it, with its checkpoint there and
// the epoch in the end record; the epochs it ran agree with the full run's.
// A resume of it goes on and stops again at the next epoch that meets the
// target (or at the end).
TEST(CheckpointRun, ATargetAccuracyEndsTheRunAfterTheEpochThatReachesIt) {
  using test_support::metric_values;
  const TempDir tmp;
  const std::string args = "train " + test_support::source_dir() + "/configs/synthetic-lenet.yaml" +
                           " --set train.batch=8 --set data.train_size=64 --set data.test_size=64" +
                           " --set train.epochs=4 --set conv.algorithm=direct --set device.threads=1" +
                           " --set optimizer.lr=0.02 --progress line";
  const std::string full_metrics = tmp.path("full.jsonl");
  const RunResult full = test_support::run_vtrain(args + " --metrics " + full_metrics);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const std::vector<double> accuracy = metric_values(full_metrics, "epoch", "test_accuracy");
  ASSERT_EQ(accuracy.size(), 4u);
  const double target = *std::max_element(accuracy.begin(), accuracy.end());
  ASSERT_GT(target, 0.0);
  // The epochs a run has trained, counted from the first, when it goes on
  // after epoch `from`: up to the first that reaches the target, or all 4.
  const auto epochs_from = [&](size_t from) {
    size_t e = from;
    while (e < 3 && accuracy[e] < target) ++e;
    return std::min<size_t>(e + 1, 4);
  };

  char target_text[32];
  std::snprintf(target_text, sizeof target_text, "%.17g", target);  // exactly the double
  const std::string dir = tmp.path("ck"), metrics = tmp.path("m.jsonl");
  const std::string with_target = args + " --set train.target_accuracy=" + target_text +
                                  " --set checkpoint.dir=" + dir + " --metrics " + metrics;
  const size_t expected = epochs_from(0);
  ASSERT_LE(expected, 4u) << "the best accuracy is the target";
  const RunResult run = test_support::run_vtrain(with_target);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "reached train.target_accuracy");
  EXPECT_CONTAINS(run.output, "after epoch " + std::to_string(expected) + " of 4: training ends here");
  const std::vector<double> ran = metric_values(metrics, "epoch", "test_accuracy");
  ASSERT_EQ(ran.size(), expected) << test_support::read_file(metrics);
  for (size_t e = 0; e < ran.size(); ++e) EXPECT_EQ(ran[e], accuracy[e]) << "epoch " << e + 1;
  EXPECT_EQ(metric_values(metrics, "end", "target_epoch"), std::vector<double>{double(expected)});
  EXPECT_EQ(metric_values(metrics, "end", "steps"), std::vector<double>{8.0 * expected});
  char checkpoint[32];
  std::snprintf(checkpoint, sizeof checkpoint, "ckpt-%010zu.vtc", 8 * expected);
  EXPECT_TRUE(fs::exists(dir + "/" + checkpoint)) << run.output;

  // Resumed: the epochs after it, up to the next that meets the target.
  const RunResult resumed = test_support::run_vtrain(with_target + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<double> after = metric_values(metrics, "epoch", "test_accuracy");
  ASSERT_EQ(after.size(), epochs_from(expected)) << resumed.output;
  for (size_t e = 0; e < after.size(); ++e) EXPECT_EQ(after[e], accuracy[e]) << "epoch " << e + 1;
}

// --progress off leaves out the step lines only: "resumed from" and
// "checkpoint: wrote" are the run's log.
TEST(CheckpointRun, ProgressOffStillPrintsTheLogLines) {
  const TempDir tmp;
  const std::string dir = tmp.path("ck");
  RunResult r = test_support::run_vtrain(train(dir, 5, "0.01", "--progress off"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "checkpoint: wrote " + dir + "/ckpt-0000000005.vtc");
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
  r = test_support::run_vtrain(train(dir, 10, "0.01", "--progress off --resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "resumed from " + dir + "/ckpt-0000000005.vtc (step 5, epoch 1)");
  EXPECT_CONTAINS(r.output, "checkpoint: wrote " + dir + "/ckpt-0000000010.vtc");
}

// `path` (a version 5 checkpoint of an SGD run without train.ema) as the
// vtrain before version 5 wrote it: without the second moment, the update
// count and the weight average, and without the settings that came with
// them (an older vtrain had none of optimizer.type and the rest).
void make_version_four(const std::string& path) {
  const std::string file = test_support::read_file(path);
  size_t at = 12;  // magic, version
  const auto u64 = [&] {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(file[at + i])) << (8 * i);
    at += 8;
    return v;
  };
  const auto str = [&] {
    const uint64_t n = u64();
    at += n;
    return file.substr(at - n, n);
  };
  const auto put = [](std::string& out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(char(v >> (8 * i)));
  };
  std::string bytes = file.substr(0, 12);
  const std::string run_id = str();
  put(bytes, run_id.size());
  bytes += run_id;
  std::vector<std::pair<std::string, std::string>> kept;
  for (uint64_t i = 0, count = u64(); i < count; ++i) {
    std::string key = str(), value = str();
    const bool newer = key == "optimizer.type" || key == "optimizer.nesterov" ||
                       key == "optimizer.no_decay" || key == "optimizer.clip_norm" ||
                       key.starts_with("train.");
    if (!newer) kept.emplace_back(std::move(key), std::move(value));
  }
  put(bytes, kept.size());
  for (const auto& [key, value] : kept) {
    put(bytes, key.size());
    bytes += key;
    put(bytes, value.size());
    bytes += value;
  }
  bytes += file.substr(at);
  bytes.erase(bytes.size() - 4 - 24, 24);  // two empty arrays and an i64, before the CRC
  bytes[8] = 4;
  const uLong crc = crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size() - 4);
  for (int i = 0; i < 4; ++i) bytes[bytes.size() - 4 + i] = static_cast<char>(crc >> (8 * i));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A version 4 checkpoint holds an SGD run's state: resuming it under AdamW
// is refused (no second moment) and changes nothing; under train.ema the
// average starts from the restored weights, saying so.
TEST(CheckpointRun, AVersionFourCheckpointResumesWhereItsStateSuffices) {
  const TempDir tmp;
  const std::string dir = tmp.path("ck");
  ASSERT_EQ(test_support::run_vtrain(train(dir, 5, "0.01")).exit_code, 0);
  const std::string path = dir + "/ckpt-0000000005.vtc";
  make_version_four(path);
  const std::string before = test_support::read_file(path);
  // The settings of version 5 (optimizer.type among them) are compared only
  // where the checkpoint has them: this one predates them.
  const RunResult adamw = test_support::run_vtrain(
      train(dir, 8, "0.01", "--resume --set optimizer.type=adamw"));
  EXPECT_EQ(adamw.exit_code, 1) << adamw.output;
  EXPECT_NE(adamw.output.find(path + " holds no AdamW second moment"), std::string::npos)
      << adamw.output;
  EXPECT_EQ(test_support::read_file(path), before);
  const RunResult ema =
      test_support::run_vtrain(train(dir, 8, "0.01", "--resume --progress line --set train.ema=0.9"));
  EXPECT_EQ(ema.exit_code, 0) << ema.output;
  EXPECT_NE(ema.output.find("ema: " + path + " holds no weight average; it starts from the "
                            "restored weights"),
            std::string::npos)
      << ema.output;
}

}  // namespace
}  // namespace vtrain
