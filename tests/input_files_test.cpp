// The text inputs a user names, run as users run vtrain: configs and plans
// are read with a size limit (a device or a FIFO ends at once, with an
// error naming the file and the limit), hold one YAML document, a NUL in a
// value is shown rather than cutting the message short, and option values
// that are empty or padded with blanks are refused alike. Plus the config
// limits and path rules these came with (profile.step_rounds,
// checkpoint.dir).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "configs/config.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using test_support::RunResult;
using test_support::TempDir;

// vtrain with `args` under a 60 s timeout and a 2 GiB address space, so
// that a reader without a limit fails the test (exit 124, or out of
// memory) instead of filling the machine.
RunResult bounded(const std::string& args) {
  RunResult r;
  r.exit_code = test_support::run_command(
      "ulimit -v 2097152; timeout 60 " + test_support::vtrain_binary() + " " + args, &r.output);
  return r;
}

std::string lenet() { return test_support::source_dir() + "/configs/synthetic-lenet.yaml"; }

// ------------------------------------------------------------ size limits

TEST(InputFiles, ConfigsFromDevicesAreRefusedAtOnce) {
  for (const std::string device : {"/dev/zero", "/dev/urandom"}) {
    const RunResult r = bounded("check " + device);
    EXPECT_EQ(r.exit_code, 2) << device << ": " << r.output;
    EXPECT_CONTAINS(r.output, "config error: cannot read config " + device +
                                  ": larger than 4 MiB, the most a config may be");
  }
}

TEST(InputFiles, ConfigLargerThanTheLimitIsRefusedBeforeReading) {
  TempDir dir;
  const std::string big = dir.path("big.yaml");
  fs::resize_file(dir.write("big.yaml", "# padding\n"), (uint64_t{4} << 20) + 1);
  const RunResult r = bounded("check " + big);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "cannot read config " + big + ": larger than 4 MiB");
}

TEST(InputFiles, AFifoWithoutAWriterEndsAtOnce) {
  TempDir dir;
  const std::string fifo = dir.path("config.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const RunResult r = bounded("check " + fifo);
  EXPECT_EQ(r.exit_code, 2) << r.output;  // an empty config; 124 = it waited for a writer
  EXPECT_CONTAINS(r.output, "config error: " + fifo + ": data: missing");
}

TEST(InputFiles, PlansFromDevicesAreRefusedAtOnce) {
  const RunResult r = bounded("train " + lenet() + " --progress off --plan /dev/zero");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output,
                  "cannot read plan /dev/zero: larger than 64 MiB, the most a plan may be");
}

// ------------------------------------------------------ one YAML document

TEST(InputFiles, ASecondYamlDocumentInAConfigIsRefused) {
  TempDir dir;
  const std::string text = test_support::read_file(lenet());
  const std::string two = dir.write("two.yaml", text + "---\ntrain: {batch: 8}\n").string();
  const int second = static_cast<int>(std::count(text.begin(), text.end(), '\n')) + 2;
  const RunResult r = bounded("check " + two);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "config error: " + two + ":" + std::to_string(second) +
                                ": a second YAML document (after '---'); a config is one "
                                "document");
  // A '---' with nothing after it drops nothing.
  const std::string trailing = dir.write("trailing.yaml", text + "---\n").string();
  const RunResult ok = bounded("check " + trailing + " --set data.train_size=64");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

TEST(InputFiles, ASecondYamlDocumentInAPlanIsRefused) {
  TempDir dir;
  const std::string plan = dir.write("plan.yaml", "vtrain_plan: 1\n---\nmodel: x\n").string();
  const RunResult r = bounded("train " + lenet() + " --progress off --plan " + plan);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, plan + ":3: a second YAML document (after '---'); a plan is one "
                                   "document");
}

// ------------------------------------------------------------------ NUL

// YAML's "\0" is a NUL byte; messages quoting it show it as \0, and a path
// holding one (which the system would open only up to the NUL) is refused.
TEST(InputFiles, ANulIsShownAndRefusedInAPath) {
  TempDir dir;
  const std::string config = dir.write("nul.yaml",
                                       "model: {preset: lenet}\n"
                                       "data:\n"
                                       "  kind: idx\n"
                                       "  train_images: \"images\\0.gz\"\n"
                                       "  train_labels: labels\n"
                                       "  test_images: images\n"
                                       "  test_labels: labels\n")
                                 .string();
  RunResult r = bounded("check " + config);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, config + ":4: data.train_images: expected a file path, got "
                                     "'images\\0.gz', which holds a NUL byte (\\0)");
  r = bounded("check " + lenet() + " --set 'model.preset=\"lenet\\0x\"'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--set model.preset: unknown preset 'lenet\\0x' (known: ");
}

// ---------------------------------------------------------- option values

TEST(InputFiles, EmptyOptionValuesAreUsageErrors) {
  for (const std::string& args : std::vector<std::string>{
           "check " + lenet() + " --metrics ''", "check " + lenet() + " --progress ''",
        "train " + lenet() + " --plan ''", "train " + lenet() + " --trace ''",
        "balance " + lenet() + " --db perf.db --out ''", "db stats --db ''"}) {
    const RunResult r = bounded(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_CONTAINS(r.output, "needs a value, got an empty one");
  }
}

// A number option takes a number and nothing else: blanks before it are
// refused as blanks after it are.
TEST(InputFiles, NumbersPaddedWithBlanksAreRefusedOnEitherSide) {
  struct Case {
    std::string args, message;
  };
  const std::string balance = "balance " + lenet() + " --db perf.db ";
  for (const Case& c : std::vector<Case>{
           {"check " + lenet() + " --ranks ' 3'", "--ranks must be a whole number"},
           {"check " + lenet() + " --ranks '3 '", "--ranks must be a whole number"},
           {balance + "--batch ' 8'", "--batch expects a positive integer"},
           {balance + "--batch '8 '", "--batch expects a positive integer"},
           {balance + "--allreduce-ms ' 1'", "--allreduce-ms must be a number"},
           {balance + "--allreduce-ms '1 '", "--allreduce-ms must be a number"}}) {
    const RunResult r = bounded(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.output;
    EXPECT_CONTAINS(r.output, c.message);
  }
}

// ----------------------------------------------------------- config rules

TEST(InputFiles, StepRoundsHaveAnUpperLimit) {
  const std::string base = "model: {preset: lenet}\ndata: {kind: synthetic}\n";
  EXPECT_EQ(config::parse_config(base + "profile: {step_rounds: 100}\n", "t.yaml")
                .profile.step_rounds,
            100);
  const std::string error = test_support::error_message<config::ConfigError>(
      [&] { config::parse_config(base + "profile: {step_rounds: 101}\n", "t.yaml"); });
  EXPECT_EQ(error, "t.yaml:3: profile.step_rounds: expected an integer in [1, 100], got 101");
  // Counts the profiler holds in an int.
  const std::string repeats = test_support::error_message<config::ConfigError>(
      [&] { config::parse_config(base + "profile: {repeats: 4294967297}\n", "t.yaml"); });
  EXPECT_CONTAINS(repeats, "profile.repeats: expected an integer in [1, 2147483647]");
}

// A relative checkpoint.dir in the file is the config folder's; one given
// with --set is the working directory's, as for every path on the command
// line.
TEST(InputFiles, CheckpointDirFromTheFileIsTheConfigsFolderAndFromSetTheWorkingDirectorys) {
  TempDir dir;
  const std::string config =
      dir.write("sub/run.yaml", "model: {preset: lenet}\ndata: {kind: synthetic}\n"
                                "checkpoint: {dir: ck}\n")
          .string();
  EXPECT_EQ(config::load_config(config).checkpoint.dir, dir.path("sub/ck"));
  EXPECT_EQ(config::load_config(config, {"checkpoint.dir=ck"}).checkpoint.dir,
            (fs::current_path() / "ck").string());
}

}  // namespace
}  // namespace vtrain
