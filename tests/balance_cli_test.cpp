// `vtrain balance` as users run it: it plans from the perf DB without ever
// writing it (no file created for a missing --db, an empty file left empty,
// a WAL file left in WAL mode), and a bad --db or --devices is a clear error.
// Its --out writes through what is at the path as common::OutputFile does.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "perfdb/internal/sql_shell.h"
#include "perfdb/perf_db.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using test_support::read_file;
using test_support::TempDir;

struct BalanceRun {
  int exit_code = -1;
  std::string output;
};

BalanceRun balance(const std::string& args) {
  BalanceRun r;
  r.exit_code = test_support::run_command(test_support::vtrain_binary() + " balance " +
                                              test_support::source_dir() +
                                              "/configs/synthetic-lenet.yaml " + args,
                                          &r.output);
  return r;
}

TEST(BalanceCli, MissingDbIsNotCreated) {
  TempDir dir;
  const std::string db = dir.path("typo.db");
  const BalanceRun r = balance("--db " + db);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "perf DB " + db + ": open (read-only): no such file");
  EXPECT_FALSE(fs::exists(db)) << "balance created " << db;
}

TEST(BalanceCli, EmptyFileStaysEmpty) {
  TempDir dir;
  const std::string db = dir.path("empty.db");
  { std::ofstream touch(db); }
  const BalanceRun r = balance("--db " + db);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "the file holds no tables: not a perf DB yet");
  EXPECT_EQ(fs::file_size(db), 0u) << "balance initialised " << db;
}

TEST(BalanceCli, DirectoryIsNamedAsSuch) {
  TempDir dir;
  const BalanceRun r = balance("--db " + dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "perf DB " + dir.path() + ": open: is a directory, expected a perf DB file");
  EXPECT_EQ(r.output.find("disk I/O error"), std::string::npos) << r.output;
}

TEST(BalanceCli, WalFileIsLeftAsItWas) {
  TempDir dir;
  const std::string db = dir.path("wal.db");
  perfdb::PerfDb(db).upsert_device({"Some CPU", "cpu", 1 << 30, "oneDNN 3.0.0", 1, "node1"});
  perfdb::internal::SqlShell(db).exec("PRAGMA journal_mode = WAL");
  const std::string before = read_file(db);
  ASSERT_EQ(before.at(18), 2) << "not a WAL file";
  const BalanceRun r = balance("--db " + db);
  EXPECT_EQ(r.exit_code, 1) << r.output;  // nothing of this model was measured
  EXPECT_CONTAINS(r.output, "has no step measurements of this model");
  EXPECT_EQ(read_file(db), before) << "balance changed the file";
}

TEST(BalanceCli, EmptyDevicesIsAUsageError) {
  TempDir dir;
  const std::string db = dir.path("perf.db");
  perfdb::PerfDb(db).upsert_device({"Some CPU", "cpu", 1 << 30, "oneDNN 3.0.0", 1, "node1"});
  BalanceRun r = balance("--db " + db + " --devices ''");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--devices needs a value, got an empty one");
  r = balance("--db " + db + " --devices ' , '");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--devices names no device");
}

// Runs `balance --out PATH` with a perf DB that holds this machine's
// profile of the model, made once for the suite.
class BalanceOut : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    db_dir_ = std::make_unique<TempDir>();
    const test_support::RunResult r = test_support::run_vtrain(
        "profile " + test_support::source_dir() + "/configs/synthetic-lenet.yaml --db " + db() +
        " --set profile.repeats=1 --set profile.warmup=0");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { db_dir_.reset(); }
  static std::string db() { return db_dir_->path("perf.db"); }

  static BalanceRun balance_out(const std::string& path) {
    return balance("--db " + db() + " --out " + path);
  }

  static inline std::unique_ptr<TempDir> db_dir_;
  TempDir dir_;
};

// Replacing a device with a regular file (as root) would break what uses it.
TEST_F(BalanceOut, ADeviceStaysADevice) {
  const std::string null = test_support::make_char_device(dir_.path("null"), 3);
  if (null.empty()) GTEST_SKIP() << "mknod is not permitted here: " << std::strerror(errno);
  const BalanceRun r = balance_out(null);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "plan: wrote " + null);
  EXPECT_TRUE(test_support::is_char_device(null)) << null << " was replaced by a file";
}

// A full disk (a full device) is a runtime failure, exit 1, naming the reason.
TEST_F(BalanceOut, AFullDeviceIsARuntimeError) {
  const std::string full = test_support::make_char_device(dir_.path("full"), 7);
  if (full.empty()) GTEST_SKIP() << "mknod is not permitted here: " << std::strerror(errno);
  const BalanceRun r = balance_out(full);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "vtrain: error: cannot write plan " + full + ": " + std::strerror(ENOSPC));
  EXPECT_TRUE(test_support::is_char_device(full)) << full << " was replaced by a file";
}

TEST_F(BalanceOut, ASymlinkIsFollowed) {
  const std::string target = dir_.write("real/plan.yaml", "old").string();
  const std::string link = dir_.path("plan.yaml");
  fs::create_symlink("real/plan.yaml", link);
  const BalanceRun r = balance_out(link);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::is_symlink(link)) << link << " was replaced";
  EXPECT_TRUE(read_file(target).starts_with("# vtrain plan")) << read_file(target);
}

TEST_F(BalanceOut, ADirectoryIsARuntimeErrorNamingIt) {
  const std::string adir = dir_.path("adir");
  fs::create_directories(adir);
  const BalanceRun r = balance_out(adir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "vtrain: error: cannot write plan " + adir +
                                ": it is a directory, expected a file name");
  EXPECT_EQ(r.output.find("config error"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Success"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(adir + ".tmp"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_.path()), fs::directory_iterator()), 1)
      << "a temporary was left in " << dir_.path();
  EXPECT_TRUE(fs::is_empty(adir));

  const BalanceRun fronts = balance("--db " + db() + " --fronts " + adir);
  EXPECT_EQ(fronts.exit_code, 1) << fronts.output;
  EXPECT_CONTAINS(fronts.output, "vtrain: error: cannot write Pareto fronts " + adir +
                                     ": it is a directory, expected a file name");
}

// `vtrain profile` of the synthetic LeNet into `db` at per-rank `batches`
// ("[8]"), once each, with `flags`; `env` ("NAME=VALUE ") before it.
void profile_lenet(const std::string& db, const std::string& batches, const std::string& flags,
                   const std::string& env = "") {
  std::string out;
  ASSERT_EQ(test_support::run_command(env + test_support::vtrain_binary() + " profile " +
                                          test_support::source_dir() +
                                          "/configs/synthetic-lenet.yaml --db " + db +
                                          " --set profile.batches=" + batches +
                                          " --set profile.repeats=1 --set profile.warmup=0 " + flags,
                                      &out),
            0)
      << out;
}

// CPU devices that differ only in device.threads share a name: --devices
// takes each by its label (the name with the thread count, as `vtrain db
// stats` prints it), refuses the bare name as ambiguous, and the plan names
// each rank's device apart. A name one device has alone still works.
TEST(BalanceCli, DevicesOfOtherThreadCountsAreToldApart) {
  TempDir dir;
  const std::string db = dir.path("perf.db");
  for (const char* threads : {"1", "2"}) {
    profile_lenet(db, "[8]", std::string("--set device.threads=") + threads);
  }
  const std::string name =
      perfdb::PerfDb(db, {.mode = perfdb::OpenMode::kReadOnly}).devices().at(0).device.name;
  const std::string one = name + " (1 thread)", two = name + " (2 threads)";

  BalanceRun r = balance("--db " + db + " --batch 16 --devices '" + name + "," + name + "'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--devices: '" + name + "' is ambiguous in " + db +
                                ": devices of other thread counts share that name (candidates: '" +
                                one + "', '" + two + "')");

  const std::string plan = dir.path("plan.yaml");
  r = balance("--db " + db + " --batch 16 --devices '" + one + "," + two + "' --out " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(plan);
  EXPECT_CONTAINS(text, "- device: \"" + name + "\"\n    threads: 1\n");
  EXPECT_CONTAINS(text, "- device: \"" + name + "\"\n    threads: 2\n");

  r = balance("--db " + db + " --devices 'Some CPU'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--devices: no device named 'Some CPU' in " + db + " (known: '" + one +
                                "', '" + two + "')");
}

// --devices NAME@PRECISION: each device priced and planned at its own
// precision's profile (profiled here with the test-only half emulation,
// VTRAIN_EMULATE_HALF), the plan naming it per rank; a device without a
// profile at the precision asked is refused naming it; an unknown
// precision is a usage error.
TEST(BalanceCli, EachDeviceAtItsOwnPrecision) {
  TempDir dir;
  const std::string db = dir.path("perf.db");
  for (const char* precision : {"fp32", "bf16"}) {
    profile_lenet(db, "[8,16]",
                  std::string("--set device.threads=1 --set train.precision=") + precision,
                  "VTRAIN_EMULATE_HALF=1 ");
  }
  const std::string name =
      perfdb::PerfDb(db, {.mode = perfdb::OpenMode::kReadOnly}).devices().at(0).device.name;
  const std::string plan = dir.path("plan.yaml");
  BalanceRun r = balance("--db " + db + " --batch 24 --devices '" + name + "@fp32, " + name +
                         "@bf16' --out " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "rank 0 (" + name + " (1 thread), fp32): batch");
  EXPECT_CONTAINS(r.output, "rank 1 (" + name + " (1 thread), bf16): batch");
  const std::string text = read_file(plan);
  EXPECT_CONTAINS(text, "precision: fp32");
  EXPECT_CONTAINS(text, "precision: bf16");

  r = balance("--db " + db + " --batch 24 --devices '" + name + "@fp16'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "has no step measurements of this model in fp16");
  r = balance("--db " + db + " --devices '" + name + "@fp8'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "unknown precision 'fp8' after '@' (known: fp32, tf32, bf16, fp16)");
}

// How the model is computed travels as typed values end to end: `vtrain
// profile` under a forced layout and bias pairing records them in the perf
// DB's own columns (`db export` shows them), `vtrain balance` with the same
// settings finds those rows and writes them as the plan's fields, and a
// config that computes otherwise finds no steps of its own.
TEST(BalanceCli, ComputeSettingsAreColumnsInTheDbAndFieldsInThePlan) {
  TempDir dir;
  const std::string db = dir.path("perf.db");
  const std::string forced = "--set device.layout=nchw --set conv.fuse_relu=on";
  profile_lenet(db, "[8]", "--set device.threads=1 " + forced);
  std::string csv;
  ASSERT_EQ(test_support::run_command(test_support::vtrain_binary() + " db export --db " + db +
                                          " --table step_measurements",
                                      &csv),
            0)
      << csv;
  EXPECT_CONTAINS(csv, "id,device_id,model,precision,layout,fuse_relu,batch,");
  EXPECT_CONTAINS(csv, ",fp32,nchw,on,8,");
  EXPECT_EQ(csv.find('@'), std::string::npos) << csv;

  const std::string plan = dir.path("plan.yaml");
  BalanceRun r = balance("--db " + db + " --batch 8 --set device.threads=1 " + forced +
                         " --out " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(plan);
  EXPECT_CONTAINS(text, "precision: fp32\nlayout: nchw\nfuse_relu: on\n");

  r = balance("--db " + db + " --batch 8 --set device.threads=1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "has no step measurements of this model");
}

TEST(BalanceCli, ANameOfOneDeviceAloneNeedsNoThreadCount) {
  TempDir dir;
  const std::string db = dir.path("perf.db");
  perfdb::PerfDb(db).upsert_device({"Some CPU", "cpu", 1 << 30, "oneDNN 3.0.0", 4, "node1"});
  for (const std::string devices : {"'Some CPU'", "'Some CPU (4 threads)'"}) {
    const BalanceRun r = balance("--db " + db + " --devices " + devices);
    EXPECT_EQ(r.exit_code, 1) << devices << ": " << r.output;  // found, but never profiled
    EXPECT_CONTAINS(r.output, "device Some CPU (4 threads) has no step measurements");
  }
}

}  // namespace
}  // namespace vtrain

namespace vtrain {
namespace {

// "what if this node's input were slower, or had more workers": a
// --devices entry's [input=IMAGES_PER_S] or [workers=N] prices its input;
// a slow one gets fewer samples and its input binds; a bad attribute is a
// usage error naming the entry.
TEST(BalanceCli, ADevicesInputRateOrWorkersArePriced) {
  TempDir dir;
  const std::string db = dir.path("perf.db");
  std::string out;
  ASSERT_EQ(test_support::run_command(test_support::vtrain_binary() + " profile " + test_support::source_dir() +
                                          "/configs/synthetic-lenet.yaml --db " + db +
                                          " --set profile.batches=[8,16,24] --set profile.repeats=1"
                                          " --set profile.warmup=0",
                                      &out),
            0)
      << out;
  const std::string label =
      perfdb::device_label(perfdb::PerfDb(db, {.mode = perfdb::OpenMode::kReadOnly}).devices().at(0).device)
          .text();
  const std::string plan = dir.path("plan.yaml");
  BalanceRun r = balance("--db " + db + " --batch 32 --devices '" + label + "," + label +
                         "[input=20]' --out " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(plan);
  EXPECT_CONTAINS(text, "input_rate: 20");
  EXPECT_CONTAINS(text, "binds: input");
  EXPECT_CONTAINS(r.output, "input: 20 images/s");
  EXPECT_CONTAINS(r.output, "input binds");
  EXPECT_CONTAINS(r.output, "plan: split 24+8 of 32");

  // workers=N scales the rate `vtrain profile` measured (1 worker) on this host.
  r = balance("--db " + db + " --batch 32 --devices '" + label + "[workers=1]," + label + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "compute binds");

  // A rate measured through another transform is not this input's: with
  // only that one in the DB there is nothing to scale.
  const std::string other = dir.path("other.db");
  ASSERT_EQ(test_support::run_command(test_support::vtrain_binary() + " profile " + test_support::source_dir() +
                                          "/configs/synthetic-lenet.yaml --db " + other +
                                          " --set profile.batches=[8,16,24] --set profile.repeats=1"
                                          " --set profile.warmup=0 --set data.workers=2"
                                          " --set 'data.train_transform={crop: random, pad: 4}'",
                                      &out),
            0)
      << out;
  r = balance("--db " + other + " --batch 32 --devices '" + label + "[workers=1]," + label + "'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "has no input rate of this dataset (synthetic, transform normalise)");

  r = balance("--db " + db + " --batch 32 --devices '" + label + "[cores=8]," + label + "'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--devices: entry '" + label +
                                "[cores=8]': unknown attribute 'cores' (known: input=IMAGES_PER_S, workers=N)");
  r = balance("--db " + db + " --batch 32 --devices '" + label + "[input=-3]," + label + "'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "input= expects a number of images/s > 0, got '-3'");
  r = balance("--db " + db + " --batch 32 --devices '" + label + "[workers=0]," + label + "'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "workers= expects an integer >= 1, got '0'");
}

}  // namespace
}  // namespace vtrain
