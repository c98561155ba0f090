// What `output.progress: auto` means: a live line only where the output is
// a terminal, which a rank under mpirun or SLURM cannot see for itself.
// Through scripts/mpirun.sh the way users run it, a log file gets plain
// lines with no carriage returns or escape codes.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "tests/test_support.h"
#include "worker/train/metrics.h"

namespace vtrain::worker {
namespace {

using Mode = Progress::Mode;
using test_support::TempDir;

// The environment auto_mode sees; a function pointer cannot capture, so the
// fake environment is a global the tests fill.
std::map<std::string, std::string> g_env;
const char* fake_getenv(const char* name) {
  const auto found = g_env.find(name);
  return found == g_env.end() ? nullptr : found->second.c_str();
}

Mode auto_mode_with(bool terminal, std::map<std::string, std::string> env) {
  g_env = std::move(env);
  return Progress::auto_mode(terminal, fake_getenv);
}

TEST(ProgressAuto, LiveOnlyOnATerminalOutsideALauncher) {
  EXPECT_EQ(auto_mode_with(true, {}), Mode::kLive);
  EXPECT_EQ(auto_mode_with(false, {}), Mode::kLines);
  EXPECT_EQ(auto_mode_with(false, {{"VTRAIN_PROGRESS", "live"}}), Mode::kLines);
}

TEST(ProgressAuto, UnderALauncherAPtyIsNotATerminal) {
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    EXPECT_EQ(auto_mode_with(true, {{variable, "1"}}), Mode::kLines) << variable;
    // The launcher says its own output is a terminal (scripts/mpirun.sh).
    EXPECT_EQ(auto_mode_with(true, {{variable, "1"}, {"VTRAIN_PROGRESS", "live"}}), Mode::kLive)
        << variable;
    EXPECT_EQ(auto_mode_with(false, {{variable, "1"}, {"VTRAIN_PROGRESS", "live"}}), Mode::kLines)
        << variable;
    EXPECT_EQ(auto_mode_with(true, {{variable, "1"}, {"VTRAIN_PROGRESS", "line"}}), Mode::kLines)
        << variable;
  }
}

TEST(ProgressAuto, MpirunIntoAFileWritesPlainLines) {
  if (test_support::run_command("command -v mpirun") != 0) GTEST_SKIP() << "no mpirun (openmpi-bin)";
  TempDir dir;
  const std::string log = dir.path("log");
  const std::string command =
      test_support::source_dir() + "/scripts/mpirun.sh -np 1 " + test_support::vtrain_binary() +
      " " + test_support::source_dir() + "/configs/synthetic-lenet.yaml --set data.train_size=64 " +
      "--set data.test_size=16 --set train.batch=16 --set train.epochs=1 --set train.log_every=1 " +
      "--set device.backend=cpu --set device.threads=1 --progress auto > " + log + " 2>&1";
  ASSERT_EQ(test_support::run_command(command), 0) << test_support::read_file(log);
  const std::string text = test_support::read_file(log);
  EXPECT_CONTAINS(text, "epoch 1/1 step 4/4");
  EXPECT_EQ(text.find('\033'), std::string::npos) << "escape codes in the log:\n" << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << "carriage returns in the log:\n" << text;
}

}  // namespace
}  // namespace vtrain::worker
