// The perf DB's files: damaged / foreign / newer files left untouched, empty
// ones initialised, read-only opens that never write, the version 1 -> 2
// upgrade, locking, and many processes writing one file at once.
#include "perfdb/perf_db.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "perfdb/internal/sql_shell.h"
#include "tests/perfdb_fixtures.h"
#include "tests/test_support.h"

namespace vtrain::perfdb {
namespace {

using internal::SqlShell;
using Rows = std::vector<std::vector<std::string>>;

using test_support::TempDir;

// ------------------------------------------------------------------ files that are not ours

// Opening `path` must fail with a message starting with `expected`, and leave
// every byte as it was (and no journal behind).
void expect_rejected_untouched(const std::string& path, const std::string& expected) {
  const std::string before = read_bytes(path);
  const std::string error = error_of([&] { PerfDb db(path); });
  EXPECT_TRUE(error.starts_with(expected)) << error;
  EXPECT_EQ(read_bytes(path), before) << "the file changed";
  EXPECT_FALSE(fs::exists(path + "-journal"));
}

TEST(PerfDbFiles, GarbageIsRejectedUntouched) {
  TempDir dir;
  const std::string path = dir.path("garbage.db");
  std::mt19937 random(7);
  std::string bytes(16384, '\0');
  for (char& b : bytes) b = static_cast<char>(random());
  write_bytes(path, bytes);
  expect_rejected_untouched(path, path + " is not a valid vtrain perf DB: ");

  write_bytes(path, "step,time\n1,2.5\n");  // a small text file
  expect_rejected_untouched(path, path + " is not a valid vtrain perf DB: ");
}

TEST(PerfDbFiles, TruncatedDatabaseIsRejectedUntouched) {
  TempDir dir;
  const std::string path = dir.path("cut.db");
  {
    PerfDb db(path);
    const DeviceId device = db.upsert_device(gpu());
    std::vector<KernelSample> samples;
    for (int c = 1; c <= 200; ++c) {
      for (int64_t mb = 1; mb <= 64; mb *= 2) {
        samples.push_back(sample(conv(KernelKind::kForward, c), "w", mb, 1));
      }
    }
    db.record_kernel_measurements(device, samples);
  }
  const auto size = fs::file_size(path);
  ASSERT_GT(size, 8 * 4096u) << "too small to cut in a way that matters";
  fs::resize_file(path, size / 2);
  expect_rejected_untouched(path, path + " is not a valid vtrain perf DB: ");
}

TEST(PerfDbFiles, SomeoneElsesSqliteFileIsRejectedUntouched) {
  TempDir dir;
  const std::string path = dir.path("theirs.db");
  SqlShell(path).exec("CREATE TABLE results (run TEXT, loss REAL); INSERT INTO results VALUES ('a', 0.5);");
  expect_rejected_untouched(path, path +
                                      " is not a valid vtrain perf DB: an SQLite database without a "
                                      "schema_version table (not created by vtrain)");
}

TEST(PerfDbFiles, NewerSchemaIsRejectedUntouched) {
  TempDir dir;
  const std::string path = dir.path("newer.db");
  { PerfDb db(path); }
  const std::string newer = std::to_string(kSchemaVersion + 1);
  SqlShell(path).exec("UPDATE schema_version SET version = " + newer);
  expect_rejected_untouched(path, "perf DB " + path + " has schema version " + newer +
                                      "; this vtrain knows up to " + std::to_string(kSchemaVersion));
}

TEST(PerfDbFiles, NewerSchemaWrittenWhileOpenIsAnError) {
  TempDir dir;
  const std::string path = dir.path("upgraded-under-us.db");
  PerfDb db(path);
  db.upsert_device(gpu());
  SqlShell(path).exec("UPDATE schema_version SET version = " + std::to_string(kSchemaVersion + 1));
  const std::string error = error_of([&] { db.upsert_device(cpu()); });
  EXPECT_EQ(error, "perf DB " + path + " has schema version " + std::to_string(kSchemaVersion + 1) +
                       "; this vtrain knows up to " + std::to_string(kSchemaVersion));
}

TEST(PerfDbFiles, EmptyFilesAreInitialised) {
  TempDir dir;
  const std::string empty = dir.path("empty.db");
  write_bytes(empty, "");
  PerfDb(empty).upsert_device(gpu());

  // An SQLite file that holds no tables at all has nothing to lose.
  const std::string no_tables = dir.path("no-tables.db");
  SqlShell(no_tables).exec("CREATE TABLE t (x); DROP TABLE t;");
  ASSERT_GT(fs::file_size(no_tables), 0u);
  PerfDb db(no_tables);
  db.upsert_device(gpu());
  EXPECT_EQ(db.stats().devices, 1);
}

TEST(PerfDbFiles, WriterThatDiedMidTransactionIsRolledBackOnOpen) {
  TempDir dir;
  const std::string path = dir.path("crashed.db");
  {
    PerfDb db(path);
    db.upsert_device(gpu());
  }
  leave_crashed_writers_journal(path);
  ASSERT_TRUE(fs::exists(path + "-journal"));

  PerfDb db(path);
  EXPECT_EQ(db.stats().devices, 1);
  EXPECT_FALSE(fs::exists(path + "-journal"));
  EXPECT_EQ(SqlShell(path).query("PRAGMA integrity_check"), (Rows{{"ok"}}));
}

TEST(PerfDbFiles, MissingDirectoryNamesTheFile) {
  TempDir dir;
  const std::string path = dir.path("no/such/dir/perf.db");
  const std::string error = error_of([&] { PerfDb db(path); });
  EXPECT_TRUE(error.starts_with("perf DB " + path + ": open: ")) << error;
}

TEST(PerfDbFiles, DirectoryIsNamedAsSuch) {
  TempDir dir;
  const std::string error = error_of([&] { PerfDb db(dir.path()); });
  EXPECT_EQ(error, "perf DB " + dir.path() + ": open: is a directory, expected a perf DB file");
}

// ------------------------------------------------------------------ read-only

constexpr PerfDbOptions kReadOnly{.mode = OpenMode::kReadOnly};

TEST(PerfDbReadOnly, ReadsAndNeverWrites) {
  TempDir dir;
  const std::string path = dir.path("perf.db");
  {
    PerfDb db(path);
    db.upsert_device(gpu());
    db.record_step_measurements(DeviceId{1}, std::vector{step(64, 30.0)});
  }
  const std::string before = read_bytes(path);
  PerfDb db(path, kReadOnly);
  ASSERT_EQ(db.devices().size(), 1u);
  EXPECT_EQ(db.step_measurements(DeviceId{1}, ModelKey{"resnet18/cifar10"}, "none").size(), 1u);
  EXPECT_EQ(error_of([&] { db.upsert_device(cpu()); }),
            "perf DB " + path + ": upsert device: the perf DB was opened read-only");
  EXPECT_EQ(read_bytes(path), before);
}

TEST(PerfDbReadOnly, MissingAndEmptyFilesAreErrorsAndStayAsTheyWere) {
  TempDir dir;
  const std::string missing = dir.path("missing.db");
  EXPECT_EQ(error_of([&] { PerfDb db(missing, kReadOnly); }),
            "perf DB " + missing + ": open (read-only): no such file");
  EXPECT_FALSE(fs::exists(missing)) << "a read-only open created the file";

  const std::string empty = dir.path("empty.db");
  write_bytes(empty, "");
  EXPECT_EQ(error_of([&] { PerfDb db(empty, kReadOnly); }),
            "perf DB " + empty + ": open (read-only): the file holds no tables: not a perf DB yet "
            "(fill it with vtrain profile)");
  EXPECT_EQ(fs::file_size(empty), 0u) << "a read-only open initialised the file";

  EXPECT_EQ(error_of([&] { PerfDb db(dir.path(), kReadOnly); }),
            "perf DB " + dir.path() + ": open: is a directory, expected a perf DB file");
}

TEST(PerfDbReadOnly, WalFileStaysWal) {
  TempDir dir;
  const std::string path = dir.path("wal.db");
  { PerfDb(path).upsert_device(gpu()); }
  SqlShell(path).exec("PRAGMA journal_mode = WAL");
  const std::string before = read_bytes(path);
  ASSERT_EQ(before[18], 2) << "not a WAL file";  // the header's write version
  {
    PerfDb db(path, kReadOnly);
    EXPECT_EQ(db.devices().size(), 1u);
  }
  EXPECT_EQ(read_bytes(path), before) << "a read-only open changed the file";
  EXPECT_EQ(SqlShell(path).query("PRAGMA journal_mode"), (Rows{{"wal"}}));
}

TEST(PerfDbReadOnly, OlderSchemaIsNotUpgraded) {
  TempDir dir;
  const std::string path = dir.path("v1.db");
  { PerfDb(path).upsert_device(gpu()); }
  SqlShell(path).exec("UPDATE schema_version SET version = 1");
  const std::string before = read_bytes(path);
  EXPECT_EQ(error_of([&] { PerfDb db(path, kReadOnly); }),
            "perf DB " + path + ": open (read-only): schema version 1 is older than this vtrain's " +
                std::to_string(kSchemaVersion) + ", "
            "and a read-only open does not upgrade it (a read-write open, e.g. vtrain profile, does)");
  EXPECT_EQ(read_bytes(path), before);
}

// ------------------------------------------------------------------ upgrade

// The layout vtrain wrote at schema version 1, verbatim: files in the field
// look like this (the kernel's layout as the profiler wrote it).
constexpr const char* kVersion1 = R"sql(
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version (version) VALUES (1);
CREATE TABLE devices (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, backend TEXT NOT NULL, memory_bytes INTEGER NOT NULL,
  library_version TEXT NOT NULL, threads INTEGER NOT NULL, host TEXT NOT NULL,
  UNIQUE (name, backend, library_version, threads, host));
CREATE TABLE kernels (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('Forward', 'BackwardData', 'BackwardFilter')),
  n INTEGER NOT NULL, c INTEGER NOT NULL, h INTEGER NOT NULL, w INTEGER NOT NULL,
  k INTEGER NOT NULL, r INTEGER NOT NULL, s INTEGER NOT NULL,
  pad_h INTEGER NOT NULL, pad_w INTEGER NOT NULL, stride_h INTEGER NOT NULL, stride_w INTEGER NOT NULL,
  dtype TEXT NOT NULL, layout TEXT NOT NULL,
  UNIQUE (kind, n, c, h, w, k, r, s, pad_h, pad_w, stride_h, stride_w, dtype, layout));
CREATE TABLE kernel_measurements (
  id INTEGER PRIMARY KEY, device_id INTEGER NOT NULL REFERENCES devices (id),
  kernel_id INTEGER NOT NULL REFERENCES kernels (id), algorithm TEXT NOT NULL,
  micro_batch INTEGER NOT NULL, time_ms REAL NOT NULL, workspace_bytes INTEGER NOT NULL,
  measured_at INTEGER NOT NULL,
  UNIQUE (device_id, kernel_id, algorithm, micro_batch));
CREATE TABLE step_measurements (
  id INTEGER PRIMARY KEY, device_id INTEGER NOT NULL REFERENCES devices (id),
  model TEXT NOT NULL, batch INTEGER NOT NULL, memory_policy TEXT NOT NULL,
  time_ms REAL NOT NULL, peak_device_bytes INTEGER NOT NULL, measured_at INTEGER NOT NULL,
  UNIQUE (device_id, model, batch, memory_policy));
INSERT INTO devices VALUES (5, 'Tesla K80', 'cuda', 12000000000, 'cuDNN 7.6.5', 1, 'old-node');
INSERT INTO kernels VALUES (3, 'Forward', 64, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 'f32', 'plain->plain');
INSERT INTO kernel_measurements VALUES (11, 5, 3, 'winograd', 32, 4.25, 1048576, 1600000000);
INSERT INTO step_measurements VALUES (21, 5, 'resnet18/cifar10', 64, 'none', 120.5, 9000000000, 1600000001);
)sql";

// An input rate of a LeNet-shaped IDX dataset measured on `host`.
InputRateMeasurement lenet_input_rate(const std::string& host, int workers, double images_per_second) {
  InputRateMeasurement m;
  m.key = {host, workers, "idx", "data/train-images-idx3-ubyte", 1, 28, 28, "normalise"};
  m.images_per_second = images_per_second;
  m.host_cores = 8;
  m.batch = 64;
  return m;
}

// A file as version 6 wrote it: the current layout less input_rates (the
// one change of version 7), with rows in the older tables.
TEST(PerfDbUpgrade, Version6GetsAnEmptyInputRatesTableAndKeepsItsRows) {
  TempDir dir;
  const std::string path = dir.path("v6.db");
  {
    PerfDb db(path);
    const DeviceId id = db.upsert_device(gpu("old-node"));
    db.record_step_measurements(id, std::vector{step(64, 120.5)});
  }
  SqlShell(path).exec(std::string(kVersion8KernelTables) +
                      "DROP TABLE input_rates; UPDATE schema_version SET version = 6;");
  ASSERT_TRUE(SqlShell(path).query("SELECT name FROM sqlite_master WHERE name = 'input_rates'").empty());

  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, kSchemaVersion);
  EXPECT_EQ(db.stats().input_rates, 0);
  const auto devices = db.find_devices(gpu().name);
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(db.step_measurements(devices[0].id, step(64, 0).model, "none").at(0).time_ms, 120.5);

  // The new table takes rows, one per key: other workers are another row,
  // the same key is replaced.
  db.record_input_rate(lenet_input_rate("old-node", 1, 900));
  db.record_input_rate(lenet_input_rate("old-node", 4, 3400));
  db.record_input_rate(lenet_input_rate("old-node", 1, 950));
  const auto one = db.find_input_rate(lenet_input_rate("old-node", 1, 0).key);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->images_per_second, 950);
  EXPECT_EQ(one->host_cores, 8);
  EXPECT_EQ(one->key, lenet_input_rate("old-node", 1, 0).key);
  EXPECT_EQ(db.input_rates("old-node").size(), 2u);
  EXPECT_TRUE(db.input_rates("other-node").empty());
  InputKey other_transform = lenet_input_rate("old-node", 1, 0).key;
  other_transform.transform = "random_resized_crop(224)";
  EXPECT_EQ(db.find_input_rate(other_transform), std::nullopt);

  SqlShell shell(path);
  EXPECT_EQ(shell.query("SELECT workers, images_per_second FROM input_rates ORDER BY workers"),
            (Rows{{"1", "950.0"}, {"4", "3400.0"}}));
  EXPECT_EQ(shell.query("PRAGMA integrity_check"), (Rows{{"ok"}}));
}

// step_measurements and layer_measurements as version 7 wrote them: the
// settings a model was computed with as "@" suffixes of `model`.
constexpr const char* kVersion7ModelTables = R"sql(
DROP TABLE step_measurements;
DROP TABLE layer_measurements;
CREATE TABLE step_measurements (
  id INTEGER PRIMARY KEY, device_id INTEGER NOT NULL REFERENCES devices (id),
  model TEXT NOT NULL, batch INTEGER NOT NULL, memory_policy TEXT NOT NULL,
  workspace_plan TEXT NOT NULL, time_ms REAL NOT NULL, peak_device_bytes INTEGER NOT NULL,
  measured_at INTEGER NOT NULL, kept_bytes INTEGER, offloaded_bytes INTEGER,
  recomputed_bytes INTEGER,
  UNIQUE (device_id, model, batch, memory_policy, workspace_plan));
CREATE TABLE layer_measurements (
  id INTEGER PRIMARY KEY, device_id INTEGER NOT NULL REFERENCES devices (id),
  model TEXT NOT NULL, batch INTEGER NOT NULL,
  layer_index INTEGER NOT NULL CHECK (layer_index >= -2), layer_name TEXT NOT NULL,
  forward_ms REAL NOT NULL, backward_ms REAL NOT NULL, measured_at INTEGER NOT NULL,
  UNIQUE (device_id, model, batch, layer_index));
UPDATE schema_version SET version = 7;
)sql";

// A version 7 file whose model keys carry "@" suffixes, holding `rows`
// (INSERT statements) on device 1.
std::string version7_file(TempDir& dir, const std::string& rows) {
  const std::string path = dir.path("v7.db");
  {
    PerfDb db(path);
    EXPECT_EQ(db.upsert_device(gpu("old-node")), DeviceId{1});
  }
  SqlShell(path).exec(std::string(kVersion8KernelTables) + kVersion7ModelTables + rows);
  return path;
}

TEST(PerfDbUpgrade, Version7SuffixedModelKeysBecomeTypedColumns) {
  TempDir dir;
  const std::string path = version7_file(dir, R"sql(
INSERT INTO step_measurements VALUES
  (31, 1, 'abc@bf16@nhwc@fuse_relu=on', 64, 'none', 'auto+update', 50.5, 7000, 1600000001,
   10, 0, 0),
  (32, 1, 'abc', 64, 'none', 'auto+update', 80.25, 9000, 1600000002, NULL, NULL, NULL),
  (33, 1, 'abc@fuse_relu=off', 64, 'none', 'auto+update', 81.0, 9100, 1600000003,
   NULL, NULL, NULL);
INSERT INTO layer_measurements VALUES
  (41, 1, 'abc@fp16', 32, 1, 'conv1', 1.5, 3.0, 1600000004),
  (42, 1, 'abc@nchw', 32, 1, 'conv1', 2.5, 4.0, 1600000005);
)sql");

  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, kSchemaVersion);
  using common::AutoOnOff;
  using common::LayoutChoice;
  using common::Precision;
  const ModelKey bf16_nhwc_fused{"abc", {Precision::kBf16, LayoutChoice::kNhwc, AutoOnOff::kOn}};
  const auto fused = db.step_measurements(DeviceId{1}, bf16_nhwc_fused, "none");
  ASSERT_EQ(fused.size(), 1u);
  EXPECT_EQ(fused[0].model, bf16_nhwc_fused);
  EXPECT_EQ(fused[0].time_ms, 50.5);
  EXPECT_EQ(fused[0].measured_at, 1600000001);
  ASSERT_TRUE(fused[0].activations.has_value());
  EXPECT_EQ(fused[0].activations->kept, 10u);
  const auto plain = db.step_measurements(DeviceId{1}, ModelKey{"abc"}, "none");
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].time_ms, 80.25);
  EXPECT_EQ(db.step_measurements(DeviceId{1}, ModelKey{"abc", {.fuse_relu = AutoOnOff::kOff}},
                                 "none")
                .at(0)
                .time_ms,
            81.0);
  EXPECT_EQ(db.layer_measurements(DeviceId{1}, ModelKey{"abc", {.precision = Precision::kFp16}}, 32)
                .at(0)
                .forward_ms,
            1.5);
  EXPECT_EQ(db.layer_measurements(DeviceId{1}, ModelKey{"abc", {.layout = LayoutChoice::kNchw}}, 32)
                .at(0)
                .forward_ms,
            2.5);
  EXPECT_TRUE(db.layer_measurements(DeviceId{1}, ModelKey{"abc"}, 32).empty());

  // The same rows and ids, the settings in columns of their own.
  SqlShell shell(path);
  EXPECT_EQ(shell.query("SELECT id, model, precision, layout, fuse_relu, time_ms "
                        "FROM step_measurements ORDER BY id"),
            (Rows{{"31", "abc", "bf16", "nhwc", "on", "50.5"},
                  {"32", "abc", "fp32", "auto", "auto", "80.25"},
                  {"33", "abc", "fp32", "auto", "off", "81.0"}}));
  EXPECT_EQ(shell.query("SELECT id, model, precision, layout, fuse_relu "
                        "FROM layer_measurements ORDER BY id"),
            (Rows{{"41", "abc", "fp16", "auto", "auto"}, {"42", "abc", "fp32", "nchw", "auto"}}));
  EXPECT_EQ(shell.query("PRAGMA integrity_check"), (Rows{{"ok"}}));
  EXPECT_TRUE(shell.query("PRAGMA foreign_key_check").empty());
}

// Version 7 recorded the capacity a policy planned for as a suffix of
// memory_policy ("auto@<bytes>"); it becomes a column of its own, part of
// the key: the same policy planned for another capacity is another row.
TEST(PerfDbUpgrade, Version7PolicyCapacitySuffixesBecomeATypedColumn) {
  TempDir dir;
  const std::string path = version7_file(dir, R"sql(
INSERT INTO step_measurements VALUES
  (51, 1, 'abc', 64, 'auto@123456', 'auto+update', 60.5, 7000, 1600000001, 10, 20, 0),
  (52, 1, 'abc', 64, 'auto@654321', 'auto+update', 55.0, 7100, 1600000002, 10, 0, 0),
  (53, 1, 'abc@bf16', 64, 'dyn@123456', 'auto+update', 40.0, 6000, 1600000003, NULL, NULL, NULL),
  (54, 1, 'abc', 64, 'none', 'auto+update', 50.0, 9000, 1600000004, NULL, NULL, NULL);
)sql");

  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, kSchemaVersion);
  const auto small = db.step_measurements(DeviceId{1}, ModelKey{"abc"}, "auto", 123456);
  ASSERT_EQ(small.size(), 1u);
  EXPECT_EQ(small[0].memory_policy, "auto");
  EXPECT_EQ(small[0].policy_capacity_bytes, 123456u);
  EXPECT_EQ(small[0].time_ms, 60.5);
  ASSERT_TRUE(small[0].activations.has_value());
  EXPECT_EQ(small[0].activations->offloaded, 20u);
  EXPECT_EQ(db.step_measurements(DeviceId{1}, ModelKey{"abc"}, "auto", 654321).at(0).time_ms, 55.0);
  EXPECT_TRUE(db.step_measurements(DeviceId{1}, ModelKey{"abc"}, "auto").empty());
  const ModelKey bf16{"abc", {.precision = common::Precision::kBf16}};
  EXPECT_EQ(db.step_measurements(DeviceId{1}, bf16, "dyn", 123456).at(0).time_ms, 40.0);
  EXPECT_EQ(db.step_measurements(DeviceId{1}, ModelKey{"abc"}, "none").at(0).time_ms, 50.0);

  // A new row under the same policy and capacity replaces the migrated one.
  StepMeasurement again = small[0];
  again.time_ms = 61.0;
  db.record_step_measurements(DeviceId{1}, std::span(&again, 1));

  SqlShell shell(path);
  EXPECT_EQ(shell.query("SELECT id, model, precision, memory_policy, policy_capacity_bytes, time_ms "
                        "FROM step_measurements ORDER BY id"),
            (Rows{{"51", "abc", "fp32", "auto", "123456", "61.0"},
                  {"52", "abc", "fp32", "auto", "654321", "55.0"},
                  {"53", "abc", "bf16", "dyn", "123456", "40.0"},
                  {"54", "abc", "fp32", "none", "0", "50.0"}}));
  EXPECT_EQ(shell.query("PRAGMA integrity_check"), (Rows{{"ok"}}));
}

TEST(PerfDbUpgrade, Version7PolicyWithACapacityThatIsNoByteCountIsRefusedUntouched) {
  TempDir dir;
  const std::string path = version7_file(dir, R"sql(
INSERT INTO step_measurements VALUES
  (61, 1, 'abc', 64, 'auto@12GiB', 'auto+update', 60.5, 7000, 1, NULL, NULL, NULL);
)sql");
  expect_rejected_untouched(path, path + " is not a valid vtrain perf DB: step_measurements row 61: "
                                         "memory_policy 'auto@12GiB': expected "
                                         "<policy>@<capacity bytes>, a positive integer");
}

TEST(PerfDbUpgrade, Version7KeyWithASuffixVtrainNeverWroteIsRefusedUntouched) {
  TempDir dir;
  const std::string path = version7_file(dir, R"sql(
INSERT INTO layer_measurements VALUES (41, 1, 'abc@fp64', 32, 1, 'conv1', 1.5, 3.0, 1);
)sql");
  expect_rejected_untouched(path, path + " is not a valid vtrain perf DB: layer_measurements "
                                         "row 41: model 'abc@fp64': unknown suffix '@fp64'");
}

// A version 8 file: kernels keyed on one layout text "<x>-><y>", holding
// `rows` (INSERT statements) on device 1.
std::string version8_file(TempDir& dir, const std::string& rows) {
  const std::string path = dir.path("v8.db");
  {
    PerfDb db(path);
    EXPECT_EQ(db.upsert_device(gpu("old-node")), DeviceId{1});
  }
  SqlShell(path).exec(std::string(kVersion8KernelTables) + "UPDATE schema_version SET version = 8;" +
                      rows);
  return path;
}

// Two kernels as the profiler wrote them up to version 8, measured.
constexpr const char* kVersion8Kernels = R"sql(
INSERT INTO kernels VALUES (3, 'Forward', 64, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 'bf16', 'nhwc->nhwc');
INSERT INTO kernels VALUES
  (4, 'BackwardData', 64, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 'f32', 'plain->nChw16c');
INSERT INTO kernel_measurements VALUES (11, 1, 3, 'implicit_gemm', 32, 4.25, 1048576, 1600000000, 0.5);
INSERT INTO kernel_measurements VALUES (12, 1, 4, 'direct', 64, 7.5, 0, 1600000000, NULL);
)sql";

// What an upgraded kVersion8Kernels holds: each kernel found by its two
// layouts, none by the others, the rows and ids as they were.
void expect_version8_kernels_split(const std::string& path) {
  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, kSchemaVersion);
  KernelSignature nhwc = conv();
  nhwc.dtype = "bf16";
  nhwc.input_layout = nhwc.output_layout = "nhwc";
  const auto fast = db.find_kernel_measurement(DeviceId{1}, nhwc, "implicit_gemm", 32);
  ASSERT_TRUE(fast.has_value());
  EXPECT_EQ(fast->time_ms, 4.25);
  EXPECT_EQ(fast->time_iqr_ms, 0.5);
  EXPECT_EQ(fast->workspace_bytes, 1048576u);
  KernelSignature mixed = conv(KernelKind::kBackwardData);
  mixed.output_layout = "nChw16c";
  ASSERT_EQ(db.kernel_measurements(DeviceId{1}, mixed).size(), 1u);
  EXPECT_EQ(db.kernel_measurements(DeviceId{1}, mixed)[0].time_iqr_ms, std::nullopt);
  EXPECT_TRUE(db.kernel_measurements(DeviceId{1}, conv(KernelKind::kBackwardData)).empty());
  // Every kernel before version 9 was a dense convolution (groups 1).
  KernelSignature depthwise = nhwc;
  depthwise.groups = 64;
  EXPECT_TRUE(db.kernel_measurements(DeviceId{1}, depthwise).empty());
  // New measurements land on the same kernel rows.
  db.record_kernel_measurements(DeviceId{1}, std::vector{sample(nhwc, "implicit_gemm", 64, 8.0)});
  EXPECT_EQ(db.kernel_measurements(DeviceId{1}, nhwc).size(), 2u);

  SqlShell shell(path);
  EXPECT_EQ(shell.query("SELECT id, groups, dtype, input_layout, output_layout FROM kernels ORDER BY id"),
            (Rows{{"3", "1", "bf16", "nhwc", "nhwc"}, {"4", "1", "f32", "plain", "nChw16c"}}));
  EXPECT_EQ(shell.query("SELECT id, kernel_id, algorithm FROM kernel_measurements WHERE id < 13 "
                        "ORDER BY id"),
            (Rows{{"11", "3", "implicit_gemm"}, {"12", "4", "direct"}}));
  EXPECT_TRUE(shell.query("SELECT name FROM sqlite_master WHERE name LIKE '%_v9'").empty());
  EXPECT_EQ(shell.query("PRAGMA integrity_check"), (Rows{{"ok"}}));
  EXPECT_TRUE(shell.query("PRAGMA foreign_key_check").empty());
}

TEST(PerfDbUpgrade, Version8KernelLayoutsBecomeAColumnEach) {
  TempDir dir;
  expect_version8_kernels_split(version8_file(dir, kVersion8Kernels));
}

// 7 -> 8 -> 9 in one open: the model keys and the kernel layouts both split.
TEST(PerfDbUpgrade, Version7FileIsUpgradedThroughVersion8) {
  TempDir dir;
  const std::string path = version7_file(dir, std::string(kVersion8Kernels) + R"sql(
INSERT INTO step_measurements VALUES
  (51, 1, 'abc@bf16', 64, 'none', 'auto+update', 40.0, 7000, 1, NULL, NULL, NULL);
)sql");
  expect_version8_kernels_split(path);
  EXPECT_EQ(SqlShell(path).query("SELECT model, precision FROM step_measurements"),
            (Rows{{"abc", "bf16"}}));
}

TEST(PerfDbUpgrade, Version8KernelLayoutVtrainNeverWroteIsRefusedUntouched) {
  // A layout text without the arrow (the API's default before version 9,
  // never the profiler's), and a side that is no layout's name (nchw is
  // device.layout's choice, not a layout).
  for (const std::string layout : {"NCHW", "plain->nchw"}) {
    SCOPED_TRACE(layout);
    TempDir dir;
    const std::string path = version8_file(
        dir, "INSERT INTO kernels VALUES (3, 'Forward', 64, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 'f32', '" +
                 layout + "');");
    expect_rejected_untouched(path, path + " is not a valid vtrain perf DB: kernels row 3: layout '" +
                                        layout + "': expected <input layout>-><output layout>, each "
                                        "one of plain, nChw8c, nChw16c, nhwc");
  }
}

TEST(PerfDb, InvalidInputRatesAreRefusedNamingTheField) {
  PerfDb db(":memory:");
  InputRateMeasurement bad = lenet_input_rate("node1", 0, 900);
  EXPECT_NE(error_of([&] { db.record_input_rate(bad); }).find("workers must be >= 1, got 0"),
            std::string::npos);
  bad = lenet_input_rate("node1", 1, 0);
  EXPECT_NE(error_of([&] { db.record_input_rate(bad); }).find("images_per_second must be finite and > 0"),
            std::string::npos);
  EXPECT_EQ(db.stats().input_rates, 0);
}

TEST(PerfDbUpgrade, Version1IsUpgradedAndKeepsItsRows) {
  TempDir dir;
  const std::string path = dir.path("v1.db");
  SqlShell(path).exec(kVersion1);

  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, kSchemaVersion);
  const auto devices = db.find_devices("Tesla K80");
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].id, DeviceId{5});
  EXPECT_EQ(devices[0].device.host, "old-node");

  const auto old = db.find_kernel_measurement(DeviceId{5}, conv(), "winograd", 32);
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->time_ms, 4.25);
  EXPECT_EQ(old->time_iqr_ms, std::nullopt);  // not measured before version 2
  EXPECT_EQ(old->workspace_bytes, 1048576u);
  EXPECT_EQ(old->measured_at, 1600000000);

  auto steps = db.step_measurements(DeviceId{5}, ModelKey{"resnet18/cifar10"}, "none");
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].workspace_plan, "");
  EXPECT_EQ(steps[0].time_ms, 120.5);
  EXPECT_EQ(steps[0].peak_device_bytes, 9000000000u);
  EXPECT_EQ(steps[0].measured_at, 1600000001);

  // Version 2 writes work on the upgraded file: a plan is a new key.
  db.record_step_measurements(DeviceId{5}, std::vector{step(64, 100.0, "ws=64MiB")});
  EXPECT_EQ(db.step_measurements(DeviceId{5}, ModelKey{"resnet18/cifar10"}, "none").size(), 2u);
  db.record_kernel_measurements(DeviceId{5}, std::vector{sample(conv(), "winograd", 32, 4.0)});
  EXPECT_EQ(db.find_kernel_measurement(DeviceId{5}, conv(), "winograd", 32)->time_iqr_ms, 0.4);

  SqlShell shell(path);
  EXPECT_EQ(shell.query("SELECT version FROM schema_version"), (Rows{{std::to_string(kSchemaVersion)}}));
  EXPECT_TRUE(shell.query("SELECT name FROM sqlite_master WHERE name = 'step_measurements_v1'").empty());
  EXPECT_EQ(shell.query("SELECT id FROM step_measurements WHERE workspace_plan = ''"),
            (Rows{{"21"}}));
  EXPECT_EQ(shell.query("PRAGMA integrity_check"), (Rows{{"ok"}}));
  EXPECT_TRUE(shell.query("PRAGMA foreign_key_check").empty());
}

// ------------------------------------------------------------------ locking

TEST(PerfDbLocking, RetriesUntilAnotherWriterLetsGo) {
  TempDir dir;
  const std::string path = dir.path("held.db");
  PerfDbOptions options;
  // Shorter than the hold: the retry loop around transactions must cover it.
  options.busy_timeout = std::chrono::milliseconds(20);
  options.max_attempts = 100;
  options.backoff_initial = std::chrono::milliseconds(1);
  options.backoff_max = std::chrono::milliseconds(20);
  PerfDb db(path, options);
  const DeviceId device = db.upsert_device(gpu());

  SqlShell holder(path);
  holder.exec("BEGIN IMMEDIATE");
  // Set just before the holder commits: a write that succeeds must find it
  // set, since it cannot get the lock any earlier.
  std::atomic<bool> letting_go{false};
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // outlasts many retries
    letting_go = true;
    holder.exec("COMMIT");
  });
  std::string error;  // caught here so that `release` is always joined
  bool waited_for_holder = false;
  try {
    db.record_kernel_measurements(device, std::vector{sample(conv(), "w", 1, 1.0)});
    waited_for_holder = letting_go;
  } catch (const PerfDbError& e) {
    error = e.what();
  }
  release.join();
  EXPECT_EQ(error, "");
  EXPECT_TRUE(waited_for_holder);
  EXPECT_EQ(db.stats().kernel_measurements, 1);
}

TEST(PerfDbLocking, GivesUpWithAClearErrorAndStaysUsable) {
  TempDir dir;
  const std::string path = dir.path("stuck.db");
  PerfDbOptions options;
  options.busy_timeout = std::chrono::milliseconds(10);
  options.max_attempts = 3;
  options.backoff_initial = std::chrono::milliseconds(1);
  options.backoff_max = std::chrono::milliseconds(2);
  PerfDb db(path, options);
  const DeviceId device = db.upsert_device(gpu());

  SqlShell holder(path);
  holder.exec("BEGIN IMMEDIATE");
  const std::string error = error_of([&] { db.record_step_measurements(device, std::vector{step(8, 1.0)}); });
  EXPECT_EQ(error.substr(0, error.find('(')),
            "perf DB " + path + ": record step measurements: the file stayed locked through 3 attempts ")
      << error;
  holder.exec("COMMIT");
  db.record_step_measurements(device, std::vector{step(8, 1.0)});
  EXPECT_EQ(db.stats().step_measurements, 1);
}

// Where the many-process test puts its file: $VTRAIN_PERFDB_TEST_DIR (point
// it at an NFS mount to check that mount), else tmpfs, else the temp folder.
// Locking is the same on tmpfs; only the fsyncs are free, which keeps 4000
// commits to a second instead of tens of seconds of disk time.
fs::path shared_test_base() {
  if (const char* dir = std::getenv("VTRAIN_PERFDB_TEST_DIR"); dir != nullptr && *dir != '\0') return dir;
  std::error_code ignored;
  if (fs::is_directory("/dev/shm", ignored) && access("/dev/shm", W_OK) == 0) return "/dev/shm";
  return fs::temp_directory_path();
}

// Eight processes open one new file at the same moment and each writes 500
// distinct measurements, one transaction each. Every row must arrive, once.
constexpr int kWriters = 8;
constexpr int kWritesEach = 500;
constexpr int kSharedKernels = 50;

// The body of one child process; returns its exit code.
int write_as_child(const std::string& path, int child) {
  try {
    PerfDb db(path);
    const DeviceId device = db.upsert_device(gpu("shared-node"));
    for (int i = 0; i < kWritesEach; ++i) {
      // All children share the kernels (racing to insert each one); the
      // algorithm name keeps every measurement distinct.
      const KernelSignature kernel = conv(KernelKind::kForward, 1 + i % kSharedKernels);
      const std::string algorithm = "child" + std::to_string(child);
      db.record_kernel_measurements(device,
                                    std::vector{sample(kernel, algorithm, 1 + i / kSharedKernels, 0.5 + i)});
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "writer %d: %s\n", child, e.what());
    return 1;
  }
}

TEST(PerfDbConcurrency, EightProcessesWriteOneFileWithoutLosingARow) {
  TempDir dir(shared_test_base());
  const std::string path = dir.path("shared.db");
  // Children block reading this pipe until the parent closes its end.
  int barrier[2];
  ASSERT_EQ(pipe(barrier), 0);
  std::fflush(nullptr);  // nothing buffered may be written twice
  std::vector<pid_t> children;
  for (int child = 0; child < kWriters; ++child) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(barrier[1]);
      char byte;
      ssize_t got;
      do got = read(barrier[0], &byte, 1);
      while (got < 0 && errno == EINTR);
      _exit(write_as_child(path, child));
    }
    if (pid < 0) break;
    children.push_back(pid);
  }
  close(barrier[0]);
  const auto start = std::chrono::steady_clock::now();
  close(barrier[1]);  // go

  std::vector<std::string> failures;
  for (size_t i = 0; i < children.size(); ++i) {
    int status = 0;
    if (waitpid(children[i], &status, 0) != children[i]) {
      failures.push_back("waitpid failed for writer " + std::to_string(i));
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failures.push_back("writer " + std::to_string(i) + " failed (status " + std::to_string(status) + ")");
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(children.size(), static_cast<size_t>(kWriters)) << "fork failed";
  std::string failed;
  for (const std::string& f : failures) failed += f + "\n";
  EXPECT_EQ(failed, "");
  std::printf("[          ] %d processes x %d transactions in %s: %.2f s (%.0f commits/s)\n", kWriters,
              kWritesEach, path.c_str(), seconds, kWriters * kWritesEach / seconds);
  RecordProperty("seconds", std::to_string(seconds));

  PerfDb db(path);
  const Stats stats = db.stats();
  EXPECT_EQ(stats.devices, 1);
  EXPECT_EQ(stats.kernels, kSharedKernels);
  EXPECT_EQ(stats.kernel_measurements, kWriters * kWritesEach);
  const DeviceId device = db.devices().at(0).id;
  for (int c = 1; c <= kSharedKernels; ++c) {
    EXPECT_EQ(db.kernel_measurements(device, conv(KernelKind::kForward, c)).size(),
              static_cast<size_t>(kWriters * kWritesEach / kSharedKernels));
  }
  SqlShell shell(path);
  EXPECT_EQ(shell.query("PRAGMA integrity_check"), (Rows{{"ok"}}));
  EXPECT_FALSE(fs::exists(path + "-journal"));
}

}  // namespace
}  // namespace vtrain::perfdb
