// End-to-end tests: training through the library, and the `vtrain`
// executable run the way users run it (exit codes, messages, metrics file).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "configs/config.h"
#include "balancer/plan.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/data/data.h"
#include "worker/engine/graph.h"
#include "worker/train/failure_injection.h"
#include "worker/train/trainer.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using test_support::source_dir;

using test_support::RunResult;
using test_support::run_vtrain;

class TempDir {
 public:
  std::string file(const std::string& name, const std::string& content = "") const {
    const std::string path = dir_.path(name);
    if (!content.empty()) std::ofstream(path) << content;
    return path;
  }

 private:
  test_support::TempDir dir_;
};

double mean(const std::vector<double>& v, size_t first, size_t count) {
  return std::accumulate(v.begin() + first, v.begin() + first + count, 0.0) / count;
}

TEST(Train, LossFallsOnSyntheticData) {
  const worker::Dataset all = worker::make_synthetic({1, 1, 16, 16}, 4, 768, 3);
  worker::Dataset train = all;
  const worker::Graph graph = worker::Graph::build(
      worker::preset_layers("lenet", {{1, 1, 16, 16}, 4}), {1, 1, 16, 16});
  // Fixed threads and algorithm: the same floating-point path on every run.
  auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 2});
  worker::TrainerOptions options;
  options.conv_algorithm = "direct";
  options.train.batch = 32;
  options.train.epochs = 2;
  options.schedule.lr = 0.05;
  options.optimizer.momentum = 0.9f;
  options.train.evaluate = false;
  options.progress = worker::Progress::Mode::kOff;
  const worker::TrainResult r =
      worker::train(graph, *backend, train, worker::Dataset{}, worker::channel_stats(train), options);
  ASSERT_EQ(r.steps, 48);
  const double first = mean(r.step_losses, 0, 8);
  const double last = mean(r.step_losses, r.step_losses.size() - 8, 8);
  EXPECT_LT(last, 0.5 * first) << "loss did not fall: first " << first << ", last " << last;
  EXPECT_GT(r.peak_device_bytes, 0u);
}

// Gathering the next batch on a thread while a step computes, and copying
// it to the device's input staging meanwhile (the memory stream's thread
// here, and a lazy one whose copies happen only when waited for), change
// nothing: the same losses, bit for bit, over epoch boundaries and a
// partial last epoch, as gathering and uploading each batch when its step
// starts.
TEST(Train, GatheringAndPrefetchingAheadGiveTheSameLosses) {
  const worker::Dataset train = worker::make_synthetic({1, 1, 16, 16}, 4, 200, 5);
  const worker::Dataset test = worker::make_synthetic({1, 1, 16, 16}, 4, 40, 6);
  const worker::Graph graph = worker::Graph::build(
      worker::preset_layers("lenet", {{1, 1, 16, 16}, 4}), {1, 1, 16, 16});
  auto eager = worker::make_backend({.kind = worker::BackendKind::kCpu});
  auto lazy = worker::make_backend({.kind = worker::BackendKind::kCpu, .lazy_memory_stream = true});
  for (bool evaluate : {false, true}) {
    SCOPED_TRACE(evaluate ? "evaluating after each epoch" : "no evaluation");
    std::vector<double> losses[4];
    int64_t prefetched[4] = {};
    double accuracy[4] = {};
    for (int ahead : {0, 1, 2, 3}) {
      worker::Backend& backend = ahead == 3 ? *lazy : *eager;
      worker::TrainerOptions options;
      options.train.batch = 24;  // 8 steps per epoch, 8 samples left over
      options.train.epochs = 3;
      options.train.max_steps = 20;
      options.schedule.lr = 0.05;
      options.train.evaluate = evaluate;
      options.conv_algorithm = "direct";
      options.progress = worker::Progress::Mode::kOff;
      using enum common::AutoOnOff;
      options.gather_ahead = ahead > 0 ? kOn : kOff;
      options.prefetch_input = ahead > 1 ? kOn : kOff;
      const worker::TrainResult r =
          worker::train(graph, backend, train, evaluate ? test : worker::Dataset{},
                        worker::channel_stats(train), options);
      losses[ahead] = r.step_losses;
      prefetched[ahead] = r.prefetched_batches;
      accuracy[ahead] = r.test_accuracy;
    }
    ASSERT_EQ(losses[0].size(), 20u);
    for (int ahead : {1, 2, 3}) {
      EXPECT_EQ(losses[0], losses[ahead]) << ahead;
      EXPECT_EQ(accuracy[0], accuracy[ahead]) << ahead;
    }
    // Every batch but the run's first gathered ahead, an epoch's first
    // during the epoch before's last step. The evaluation after an epoch
    // uploads its own batches, so the next epoch's first goes up again.
    EXPECT_EQ(prefetched[0], 0);
    EXPECT_EQ(prefetched[1], 0);
    EXPECT_EQ(prefetched[2], evaluate ? 17 : 19);
    EXPECT_EQ(prefetched[3], evaluate ? 17 : 19);
  }
}

// data.prefetch decided: gathering ahead from 2^20 values a rank's batch
// (auto), the device copy only with it and, under auto, not on the CPU.
TEST(Train, BatchStagingFollowsTheOptionsAndTheBatch) {
  auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu});
  const int64_t sample = 3 * 224 * 224;  // 2^20 values in 7 such samples
  using enum common::AutoOnOff;
  auto staging = [&](common::AutoOnOff gather, common::AutoOnOff prefetch,
                     int64_t batch) {
    worker::TrainerOptions o;
    o.gather_ahead = gather;
    o.prefetch_input = prefetch;
    const worker::BatchStaging s = worker::batch_staging(o, batch, sample, *backend);
    return std::make_pair(s.gather_ahead, s.prefetch_input);
  };
  EXPECT_EQ(staging(kAuto, kAuto, 6), std::make_pair(false, false));
  EXPECT_EQ(staging(kAuto, kAuto, 7), std::make_pair(true, false));  // no copy to make on the CPU
  EXPECT_EQ(staging(kAuto, kOn, 7), std::make_pair(true, true));
  // Nothing gathered ahead to copy:
  EXPECT_EQ(staging(kAuto, kOn, 6), std::make_pair(false, false));
  EXPECT_EQ(staging(kOn, kOn, 1), std::make_pair(true, true));
  EXPECT_EQ(staging(kOn, kOff, 64), std::make_pair(true, false));
  EXPECT_EQ(staging(kOff, kOn, 64), std::make_pair(false, false));
}

// LeNet on 16x16 synthetic data, one process, quiet: the small run the
// observer and divergence tests share.
struct SmallRun {
  worker::Dataset train = worker::make_synthetic({1, 1, 16, 16}, 4, 256, 7);
  worker::Graph graph = worker::Graph::build(worker::preset_layers("lenet", {{1, 1, 16, 16}, 4}),
                                             {1, 1, 16, 16});
  std::unique_ptr<worker::Backend> backend =
      worker::make_backend({.kind = worker::BackendKind::kCpu});
  worker::TrainerOptions options;
  worker::TrainerContext context;

  SmallRun() {
    options.train.batch = 32;
    options.train.max_steps = 6;
    options.schedule.lr = 0.05;
    options.train.evaluate = false;
    options.conv_algorithm = "direct";
    options.progress = worker::Progress::Mode::kOff;
  }
  worker::TrainResult run() {
    return worker::train(graph, *backend, train, worker::Dataset{}, worker::channel_stats(train),
                         options, context);
  }
};

// Records the hooks the trainer calls.
class RecordingObserver : public worker::TrainObserver {
 public:
  void on_step_start(const worker::StepEvent& e) override {
    steps.push_back(e.step);
    overlapped += e.allreduce_in_backward;
  }
  void on_bucket_launched(const worker::StepEvent&) override { ++buckets; }
  std::vector<int64_t> steps;
  int overlapped = 0;
  int buckets = 0;
};

TEST(Train, ObserverSeesEveryStepStart) {
  SmallRun run;
  RecordingObserver observer;
  run.context.observer = &observer;
  EXPECT_EQ(run.run().steps, 6);
  EXPECT_EQ(observer.steps, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // One process launches no allreduce in backward.
  EXPECT_EQ(observer.overlapped, 0);
  EXPECT_EQ(observer.buckets, 0);
}

TEST(Train, InjectedFailureThrowsAtItsStep) {
  for (auto where : {worker::FailureInjection::Where::kStepStart,
                     worker::FailureInjection::Where::kBackward}) {
    SmallRun run;
    worker::FailureInjection failure(3, where);
    // Steps 0..2 run; the failure comes at the start of step 3 (in backward
    // too: one process launches no allreduce to fail after).
    run.context.observer = &failure;
    try {
      run.run();
      ADD_FAILURE() << "no injected failure";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "injected failure at step 3 (VTRAIN_FAIL_AT_STEP)");
    }
  }
}

TEST(Train, FailureInjectionReadsTheEnvironment) {
  struct Env {
    Env(const char* at, const char* rank, const char* in) {
      set("VTRAIN_FAIL_AT_STEP", at);
      set("VTRAIN_FAIL_RANK", rank);
      set("VTRAIN_FAIL_IN", in);
    }
    ~Env() {
      for (const char* name : {"VTRAIN_FAIL_AT_STEP", "VTRAIN_FAIL_RANK", "VTRAIN_FAIL_IN"}) {
        unsetenv(name);
      }
    }
    static void set(const char* name, const char* value) {
      value ? setenv(name, value, 1) : unsetenv(name);
    }
  };
  using worker::FailureInjection;
  {
    Env env(nullptr, nullptr, nullptr);
    EXPECT_FALSE(FailureInjection::from_environment(0).has_value());
  }
  {
    Env env("5", "1", "backward");
    EXPECT_FALSE(FailureInjection::from_environment(0).has_value());
    std::optional<FailureInjection> f = FailureInjection::from_environment(1);
    ASSERT_TRUE(f.has_value());
    f->on_step_start({5, true});  // in backward where allreduces overlap it
    EXPECT_THROW(f->on_bucket_launched({5, true}), std::runtime_error);
    EXPECT_THROW(f->on_step_start({5, false}), std::runtime_error);
    f->on_bucket_launched({4, true});
  }
  {
    Env env("x5", nullptr, nullptr);
    try {
      FailureInjection::from_environment(0);
      ADD_FAILURE() << "a malformed step was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_STREQ(e.what(), "VTRAIN_FAIL_AT_STEP: expected an integer >= 0, got 'x5'");
    }
  }
  {
    Env env("2", nullptr, "forward");
    EXPECT_THROW(FailureInjection::from_environment(0), std::invalid_argument);
  }
}

// A learning rate far too large drives the loss to nan or infinity: the run
// stops at that step, naming it and the last finite loss, instead of
// finishing with garbage weights.
TEST(Train, NonFiniteLossStopsTheRunNamingTheStep) {
  SmallRun run;
  run.options.schedule.lr = 1e308;
  RecordingObserver observer;
  run.context.observer = &observer;
  try {
    run.run();
    ADD_FAILURE() << "a diverged run finished";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    ASSERT_FALSE(observer.steps.empty());
    const int64_t bad = observer.steps.back() + 1;  // 1-based, as logged
    ASSERT_GE(bad, 2) << what;  // the first step starts from finite weights
    EXPECT_EQ(what.rfind("training diverged: the loss of step " + std::to_string(bad) +
                             " (epoch 1) is ",
                         0),
              0u)
        << what;
    EXPECT_NE(what.find("; the last finite loss was "), std::string::npos) << what;
    EXPECT_NE(what.find(", at step " + std::to_string(bad - 1) + " (a smaller optimizer.lr"),
              std::string::npos)
        << what;
  }
}

TEST(Cli, HelpAndVersion) {
  RunResult r = run_vtrain("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("vtrain train CONFIG"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Exit codes"), std::string::npos);
  r = run_vtrain("train --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--metrics FILE"), std::string::npos) << r.output;
  r = run_vtrain("check --help");
  EXPECT_EQ(r.exit_code, 0);
  r = run_vtrain("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("vtrain "), std::string::npos);
}

TEST(Cli, UsageErrorsExitWithTwo) {
  RunResult r = run_vtrain("");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_vtrain("train");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("needs a CONFIG"), std::string::npos) << r.output;
  r = run_vtrain("train x.yaml --frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown option '--frobnicate'"), std::string::npos) << r.output;
  r = run_vtrain("train x.yaml --set novalue");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("key.path=value"), std::string::npos) << r.output;
}

// A stop without a checkpoint.dir has nothing to resume: exit 4, not the
// 3 that tells SLURM scripts to requeue; and --resume needs a directory.
TEST(Cli, SignalWithoutCheckpointDirExitsWithFour) {
  TempDir dir;
  const std::string config = source_dir() + "/configs/synthetic-lenet.yaml";
  RunResult r = run_vtrain("train " + config + " --resume");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--resume: " + config + " sets no checkpoint.dir"), std::string::npos)
      << r.output;

  const std::string log = dir.file("log.txt");
  const std::string command = "exec " + test_support::vtrain_binary() + " train " + config +
                              " --set train.epochs=100000 --set train.evaluate=false"
                              " --set train.log_every=1 --progress line > " + log + " 2>&1";
  const pid_t pid = test_support::spawn_shell(command);
  ASSERT_GT(pid, 0);
  // Bounded wait for training to be under way: its first step line.
  test_support::wait_until(
      [&] { return test_support::read_file(log).find(" step 1/") != std::string::npos; },
      std::chrono::seconds(60));
  kill(pid, SIGTERM);
  const std::optional<int> code = test_support::wait_exit(pid, std::chrono::seconds(60));
  const std::string text = test_support::read_file(log);
  ASSERT_TRUE(code.has_value()) << "vtrain did not stop within 60 s of SIGTERM\n" << text;
  ASSERT_NE(*code, -1) << text;
  EXPECT_EQ(*code, 4) << text;
  EXPECT_NE(text.find("stopped by a signal without a checkpoint (no checkpoint.dir set)"),
            std::string::npos)
      << text;
}

TEST(Cli, ConfigErrorNamesFileLineAndKey) {
  TempDir dir;
  const std::string cfg = dir.file("bad.yaml",
                                   "model:\n  preset: lenet\ndata:\n  kind: synthetic\ntrain:\n"
                                   "  batch: -3\n");
  const RunResult r = run_vtrain(cfg);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(cfg + ":6: train.batch"), std::string::npos) << r.output;
}

TEST(Cli, MissingDataFileIsARuntimeErrorNamingIt) {
  TempDir dir;
  const std::string cfg = dir.file(
      "missing.yaml",
      "model: {preset: lenet}\ndata:\n  kind: idx\n  train_images: nope-images.gz\n"
      "  train_labels: nope-labels.gz\n  test_images: nope-images.gz\n"
      "  test_labels: nope-labels.gz\n");
  const RunResult r = run_vtrain(cfg);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("nope-images.gz"), std::string::npos) << r.output;
}

TEST(Cli, TrainsSyntheticAndWritesMetrics) {
  TempDir dir;
  const std::string metrics = dir.file("m.jsonl");
  const RunResult r = run_vtrain(source_dir() + "/configs/synthetic-lenet.yaml --set train.epochs=1 "
                                 "--progress line --metrics " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test loss"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  std::string line, last;
  int steps = 0, epochs = 0;
  while (std::getline(in, line)) {
    steps += line.find("\"event\": \"step\"") != std::string::npos;
    epochs += line.find("\"event\": \"epoch\"") != std::string::npos;
    last = line;
  }
  EXPECT_GT(steps, 0);
  EXPECT_EQ(epochs, 1);
  ASSERT_NE(last.find("\"event\": \"end\""), std::string::npos) << last;
  for (const char* key : {"\"test_accuracy\": ", "\"images_per_second\": ", "\"peak_device_bytes\": "}) {
    const size_t at = last.find(key);
    ASSERT_NE(at, std::string::npos) << key << " missing in " << last;
    const double value = std::atof(last.c_str() + at + std::strlen(key));
    EXPECT_GT(value, 0.0) << key;
    if (std::string(key).find("accuracy") != std::string::npos) {
      EXPECT_LE(value, 1.0);
    }
  }
}

// The same the way users meet it: exit 1 with the error, and no "end"
// record with a null final loss in the metrics file.
TEST(Cli, DivergedRunExitsWithOneNamingTheStep) {
  TempDir dir;
  const std::string metrics = dir.file("m.jsonl");
  const RunResult r = run_vtrain(source_dir() + "/configs/synthetic-lenet.yaml --progress off "
                                 "--set optimizer.lr=1e308 --set train.max_steps=10 "
                                 "--set train.log_every=1 --metrics " + metrics);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("vtrain: error: training diverged: the loss of step "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("the last finite loss was "), std::string::npos) << r.output;
  const std::string text = test_support::read_file(metrics);
  EXPECT_NE(text.find("\"event\": \"step\""), std::string::npos) << text;
  EXPECT_EQ(text.find("\"event\": \"end\""), std::string::npos) << text;
  EXPECT_EQ(text.find("null"), std::string::npos) << text;
}

// A metrics file that cannot be written is a runtime failure naming the
// file and the reason (writing to /dev/full is safe: nothing replaces it).
TEST(Cli, MetricsWriteErrorNamesTheReason) {
  const RunResult r = run_vtrain(source_dir() + "/configs/synthetic-lenet.yaml --progress off "
                                 "--set train.max_steps=2 --metrics /dev/full");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, std::string("vtrain: error: cannot write metrics file /dev/full: ") +
                                std::strerror(ENOSPC));
}

// A trace that cannot be written (past the file size limit, as on a full
// disk) fails the run naming it and the reason, and leaves no file, empty
// or partial, and no temporary. The trace of 16 steps is ~25 KiB; MPI's
// singleton start writes no file that large when PMIx keeps its data in
// memory (gds=hash) and no shared-memory transport is opened (btl=self).
TEST(Cli, FailedTraceLeavesNoFile) {
  test_support::TempDir dir;
  const std::string trace = dir.path("trace.json");
  RunResult r;
  {
    const test_support::FileSizeLimit limit(8 * 1024);  // inherited by vtrain
    r.exit_code = test_support::run_command(
        "env PMIX_MCA_gds=hash OMPI_MCA_btl=self " + test_support::vtrain_binary() + " " +
            source_dir() + "/configs/synthetic-lenet.yaml --progress off --set train.max_steps=16 "
            "--set train.batch=16 --set train.evaluate=false --trace " + trace,
        &r.output);
  }
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "vtrain: error: cannot write trace " + trace + ": " + std::strerror(EFBIG));
  EXPECT_TRUE(fs::is_empty(dir.path())) << trace << " or a temporary was left";
}

TEST(Cli, CheckPrintsTheModel) {
  const RunResult r = run_vtrain("check " + source_dir() + "/configs/custom-dag.yaml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("parameters"), std::string::npos) << r.output;
}

// The offline balancer the way users run it: profile into a DB, plan with
// `vtrain balance --out`, train with `--plan`; plans that do not fit are
// config errors naming the file.
TEST(Train, BalanceWritesAPlanThatTrainingFollows) {
  TempDir dir;
  const std::string db = dir.file("perf.db"), plan = dir.file("plan.yaml");
  const std::string config = source_dir() + "/configs/synthetic-lenet.yaml";
  const std::string sets =
      " --progress off --set train.batch=16 --set train.max_steps=3 --set train.evaluate=false"
      " --set device.threads=1 --set profile.db=" + db +
      " --set profile.batches=[8,16] --set profile.micro_batches=powerOfTwo"
      " --set profile.repeats=1 --set profile.warmup=0";
  RunResult r = run_vtrain("profile " + config + sets);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string fronts = dir.file("fronts.csv");
  r = run_vtrain("balance " + config + " --db " + db + " --policy wr --workspace 1MiB --out " +
                 plan + " --fronts " + fronts + sets);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("plan: split 16 of 16, workspace wr 1.0 MiB"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("conv2        BackwardFilter"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(plan));
  // Every kernel's front, the plan's choice marked once per kernel (LeNet:
  // conv1 Forward and BackwardFilter, conv2 all three kinds).
  std::ifstream csv(fronts);
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "rank,device,kernel,workspace_bytes,time_ms,calls,chosen");
  std::set<std::string> kernels, chosen;
  while (std::getline(csv, line)) {
    const size_t at = line.find("\",") + 2;  // after the quoted device name
    const std::string kernel = line.substr(at, line.find(',', at) - at);
    kernels.insert(kernel);
    if (line.back() == '1') {
      EXPECT_TRUE(chosen.insert(kernel).second) << line;
    }
  }
  EXPECT_EQ(kernels.size(), 5u);
  EXPECT_EQ(chosen, kernels);
  // An allreduce time given offline joins the predicted step. Plans keep 6
  // significant digits, so each of the two values read back is off by up
  // to half a unit in its sixth digit.
  const std::string plan2 = dir.file("plan2.yaml");
  r = run_vtrain("balance " + config + " --db " + db + " --policy wr --workspace 1MiB "
                 "--allreduce-ms 7.5 --out " + plan2 + sets);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double with_allreduce = balancer::load_plan(plan2).predicted_step_ms;
  EXPECT_NEAR(with_allreduce, balancer::load_plan(plan).predicted_step_ms + 7.5,
              1e-5 * with_allreduce);

  // What if a second such device joined? Offline every rank gets a batch
  // that was profiled (8 + 16), not the even 12 + 12 that interpolation
  // would offer and that has no kernel timings.
  const common::DeviceLabel label = balancer::load_plan(plan).ranks.at(0).device;
  const std::string device = label.text();  // the DB's device, as --devices names it
  const std::string plan3 = dir.file("plan3.yaml");
  r = run_vtrain("balance " + config + " --db " + db + " --devices '" + device + "," + device +
                 "' --batch 24 --out " + plan3 + sets);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const balancer::TrainingPlan what_if = balancer::load_plan(plan3);
  ASSERT_EQ(what_if.ranks.size(), 2u);
  EXPECT_EQ((std::set<int64_t>{what_if.ranks[0].batch, what_if.ranks[1].batch}),
            (std::set<int64_t>{8, 16}));

  r = run_vtrain("train " + config + " --plan " + plan + sets + " --progress line");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("conv2: Forward=["), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 3 steps"), std::string::npos) << r.output;

  // A plan made for other devices is refused before training starts.
  std::string text = test_support::read_file(plan);
  text.replace(text.find(label.name), label.name.size(), "Tesla K20Xm");
  r = run_vtrain("train " + config + " --plan " + dir.file("k20.yaml", text) + sets);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::string k20 = common::DeviceLabel{"Tesla K20Xm", label.threads}.text();
  EXPECT_NE(r.output.find("k20.yaml: rank 0 was planned for device '" + k20 + "', but it runs on '" +
                          device + "'"),
            std::string::npos)
      << r.output;

  r = run_vtrain("train " + config + " --plan " + plan + sets + " --set train.batch=32");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(plan + ": the plan's global_batch is 16, the config's train.batch is 32"),
            std::string::npos)
      << r.output;
  r = run_vtrain("train " + config + " --plan " + dir.file("bad.yaml", "vtrain_plan: 1\n") + sets);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bad.yaml: model: missing"), std::string::npos) << r.output;

  r = run_vtrain("balance " + config + " --db " + db + " --devices K20Xm" + sets);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--devices: no device named 'K20Xm'"), std::string::npos) << r.output;
  r = run_vtrain("balance " + config + " --db " + db + " --batch 64" + sets);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("batch 64 does not fit"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace vtrain
