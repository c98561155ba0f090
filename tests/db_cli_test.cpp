// `vtrain db stats` and `vtrain db export` as users run them: they only
// read, as balance does, so an empty file stays empty, a WAL file stays
// WAL, and a crashed writer's journal stays for `vtrain profile` to roll
// back; and stats names each device as --devices takes it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "perfdb/internal/sql_shell.h"
#include "perfdb/perf_db.h"
#include "tests/perfdb_fixtures.h"
#include "tests/test_support.h"

namespace vtrain::perfdb {
namespace {

using test_support::RunResult;
using test_support::run_vtrain;
using test_support::TempDir;

// Both read-only commands on `db`.
std::vector<std::string> db_commands(const std::string& db) {
  return {"db stats --db " + db, "db export --table devices --db " + db};
}

TEST(DbCli, AnEmptyFileStaysEmpty) {
  TempDir dir;
  const std::string db = dir.path("empty.db");
  write_bytes(db, "");
  for (const std::string& command : db_commands(db)) {
    const RunResult r = run_vtrain(command);
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.output;
    EXPECT_CONTAINS(r.output, "the file holds no tables: not a perf DB yet");
    EXPECT_EQ(fs::file_size(db), 0u) << command << " initialised " << db;
  }
}

TEST(DbCli, AWalFileStaysWal) {
  TempDir dir;
  const std::string db = dir.path("wal.db");
  PerfDb(db).upsert_device(gpu());
  internal::SqlShell(db).exec("PRAGMA journal_mode = WAL");
  const std::string before = read_bytes(db);
  ASSERT_EQ(before.at(18), 2) << "not a WAL file";
  for (const std::string& command : db_commands(db)) {
    const RunResult r = run_vtrain(command);
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.output;
    EXPECT_CONTAINS(r.output, "NVIDIA H200");
    EXPECT_EQ(read_bytes(db), before) << command << " changed the file";
  }
}

TEST(DbCli, ACrashedWritersJournalStays) {
  TempDir dir;
  const std::string db = dir.path("crashed.db");
  PerfDb(db).upsert_device(gpu());
  leave_crashed_writers_journal(db);
  const std::string journal = read_bytes(db + "-journal");
  const std::string before = read_bytes(db);
  for (const std::string& command : db_commands(db)) {
    const RunResult r = run_vtrain(command);
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.output;
    EXPECT_CONTAINS(r.output, "left a hot journal, which only a read-write open (vtrain profile) "
                              "may roll back");
    ASSERT_TRUE(fs::exists(db + "-journal")) << command << " deleted the journal";
    EXPECT_EQ(read_bytes(db + "-journal"), journal) << command << " changed the journal";
    EXPECT_EQ(read_bytes(db), before) << command << " changed the file";
  }
}

// CPU devices that differ only in their thread count share a name; stats
// gives each the label --devices takes.
TEST(DbCli, StatsNamesDevicesOfOtherThreadCountsApart) {
  TempDir dir;
  const std::string db = dir.path("perf.db");
  {
    PerfDb writer(db);
    writer.upsert_device({"AMD EPYC", "cpu", 1 << 30, "oneDNN 3.0.0", 1, "node1"});
    writer.upsert_device({"AMD EPYC", "cpu", 1 << 30, "oneDNN 3.0.0", 2, "node1"});
    writer.upsert_device(gpu());
  }
  const RunResult r = run_vtrain("db stats --db " + db);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "device 1: 'AMD EPYC (1 thread)' (cpu,");
  EXPECT_CONTAINS(r.output, "device 2: 'AMD EPYC (2 threads)' (cpu,");
  EXPECT_CONTAINS(r.output, "device 3: 'NVIDIA H200' (cuda,");
}

TEST(DeviceLabel, ACpuLabelHoldsItsThreadCountAndReadsBack) {
  const Device one{"AMD EPYC (cpus 0,1)", "cpu", 1, "oneDNN", 1, "h"};
  Device two = one;
  two.threads = 2;
  EXPECT_EQ(device_label(one), (common::DeviceLabel{"AMD EPYC (cpus 0,1)", 1}));
  EXPECT_EQ(device_label(one).text(), "AMD EPYC (cpus 0,1) (1 thread)");
  EXPECT_EQ(device_label(two).text(), "AMD EPYC (cpus 0,1) (2 threads)");
  EXPECT_EQ(device_label(gpu()), (common::DeviceLabel{"NVIDIA H200", std::nullopt}));
  EXPECT_EQ(device_label(gpu()).text(), "NVIDIA H200");
  EXPECT_EQ(common::DeviceLabel::parse(device_label(two).text()), device_label(two));
  // Anything else is a name as it is.
  for (const std::string name : {"AMD EPYC (cpus 0,1)", "X (0 threads)", "X (2 thread)",
                                 "X (02 threads)", "X (1 threads)", "NVIDIA H200", "(2 threads)"}) {
    EXPECT_EQ(common::DeviceLabel::parse(name), (common::DeviceLabel{name, std::nullopt}));
  }
}

}  // namespace
}  // namespace vtrain::perfdb
