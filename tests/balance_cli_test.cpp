// `vtrain balance` as users run it: it plans from the perf DB without ever
// writing it (no file created for a missing --db, an empty file left empty,
// a WAL file left in WAL mode), and a bad --db or --devices is a clear error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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
  for (const std::string devices : {"''", "' , '"}) {
    const BalanceRun r = balance("--db " + db + " --devices " + devices);
    EXPECT_EQ(r.exit_code, 2) << devices << ": " << r.output;
    EXPECT_CONTAINS(r.output, "--devices names no device");
  }
}

}  // namespace
}  // namespace vtrain
