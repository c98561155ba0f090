// The perf DB: round trips, idempotent upserts, lookups and misses, many
// processes writing one file at once, damaged / foreign / newer files left
// untouched, the version 1 -> 2 upgrade, export and stats.
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
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "perfdb/internal/sql_shell.h"
#include "tests/test_support.h"

namespace vtrain::perfdb {
namespace {

namespace fs = std::filesystem;
using internal::SqlShell;
using Rows = std::vector<std::vector<std::string>>;

using test_support::TempDir;

// A fresh folder under `base`, removed afterwards (test_support's TempDir is
// always under the system temp folder; the many-process test picks its own).
class ScratchDir {
 public:
  explicit ScratchDir(const fs::path& base) {
    std::string pattern = (base / "vtrain_perfdb_test.XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed in " + base.string());
    path_ = pattern;
  }
  ~ScratchDir() { fs::remove_all(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The message of the PerfDbError that `action` throws (a test failure if none).
std::string error_of(const std::function<void()>& action) {
  return test_support::error_message<PerfDbError>(action);
}

Device gpu(const std::string& host = "node1") {
  return Device{"NVIDIA H200", "cuda", 150'000'000'000, "cuDNN 9.1.0", 1, host};
}

Device cpu() { return Device{"Intel Xeon 8480", "cpu", 64'000'000'000, "oneDNN 3.0.0", 16, "node2"}; }

KernelSignature conv(KernelKind kind = KernelKind::kForward, int64_t c = 64) {
  KernelSignature k;
  k.kind = kind;
  k.n = 64;
  k.c = c;
  k.h = k.w = 56;
  k.k = 64;
  k.r = k.s = 3;
  k.pad_h = k.pad_w = 1;
  return k;
}

KernelSample sample(const KernelSignature& kernel, const std::string& algorithm, int64_t micro_batch,
                    double time_ms, uint64_t workspace = 0) {
  KernelMeasurement m;
  m.algorithm = algorithm;
  m.micro_batch = micro_batch;
  m.time_ms = time_ms;
  m.time_iqr_ms = time_ms / 10;
  m.workspace_bytes = workspace;
  return {kernel, m};
}

StepMeasurement step(int64_t batch, double time_ms, const std::string& plan = "") {
  StepMeasurement s;
  s.model = "resnet18/cifar10";
  s.batch = batch;
  s.memory_policy = "none";
  s.workspace_plan = plan;
  s.time_ms = time_ms;
  s.peak_device_bytes = static_cast<uint64_t>(batch) * 1'000'000;
  return s;
}

// Writes a little of everything and checks it reads back.
void write_and_read_back(PerfDb& db) {
  const DeviceId device = db.upsert_device(gpu());
  const std::vector<KernelSample> samples = {
      sample(conv(), "winograd", 64, 2.5, 1 << 20), sample(conv(), "winograd", 32, 1.3, 1 << 19),
      sample(conv(), "direct", 64, 4.0), sample(conv(KernelKind::kBackwardData), "direct", 64, 5.0)};
  db.record_kernel_measurements(device, samples);
  db.record_step_measurements(device, std::vector{step(64, 30.0), step(32, 16.0)});

  const auto found = db.find_kernel_measurement(device, conv(), "winograd", 32);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->algorithm, "winograd");
  EXPECT_EQ(found->micro_batch, 32);
  EXPECT_EQ(found->time_ms, 1.3);
  ASSERT_TRUE(found->time_iqr_ms.has_value());
  EXPECT_EQ(*found->time_iqr_ms, 1.3 / 10);
  EXPECT_EQ(found->workspace_bytes, uint64_t{1} << 19);
  // measured_at 0 means "now".
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  EXPECT_NEAR(static_cast<double>(found->measured_at), static_cast<double>(now), 60);

  const auto forward = db.kernel_measurements(device, conv());
  ASSERT_EQ(forward.size(), 3u);  // ordered by (algorithm, micro_batch)
  EXPECT_EQ(forward[0].algorithm, "direct");
  EXPECT_EQ(forward[1].algorithm, "winograd");
  EXPECT_EQ(forward[1].micro_batch, 32);
  EXPECT_EQ(forward[2].micro_batch, 64);
  EXPECT_EQ(db.kernel_measurements(device, conv(KernelKind::kBackwardData)).size(), 1u);

  const auto steps = db.step_measurements(device, "resnet18/cifar10", "none");
  ASSERT_EQ(steps.size(), 2u);  // ordered by batch
  EXPECT_EQ(steps[0].batch, 32);
  EXPECT_EQ(steps[0].time_ms, 16.0);
  EXPECT_EQ(steps[1].peak_device_bytes, 64'000'000u);

  const auto devices = db.devices();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].id, device);
  EXPECT_EQ(devices[0].device.name, "NVIDIA H200");
  EXPECT_EQ(devices[0].device.memory_bytes, 150'000'000'000u);
  EXPECT_EQ(devices[0].device.library_version, "cuDNN 9.1.0");
  EXPECT_EQ(devices[0].device.host, "node1");
}

// ------------------------------------------------------------------ basics

TEST(PerfDb, RoundTripInMemory) {
  PerfDb db(":memory:");
  write_and_read_back(db);
}

TEST(PerfDb, RoundTripThroughAFile) {
  TempDir dir;
  const std::string path = dir.path("perf.db");
  {
    PerfDb db(path);
    write_and_read_back(db);
  }
  PerfDb again(path);
  const auto devices = again.find_devices("NVIDIA H200");
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(again.kernel_measurements(devices[0].id, conv()).size(), 3u);
  EXPECT_EQ(again.step_measurements(devices[0].id, "resnet18/cifar10", "none").size(), 2u);
  // Rollback journal, never WAL; no journal left behind.
  EXPECT_EQ(SqlShell(path).query("PRAGMA journal_mode"), (Rows{{"delete"}}));
  EXPECT_FALSE(fs::exists(path + "-journal"));
  EXPECT_FALSE(fs::exists(path + "-wal"));
}

TEST(PerfDb, UpsertsAreIdempotent) {
  PerfDb db(":memory:");
  Device device = gpu();
  const DeviceId id = db.upsert_device(device);
  device.memory_bytes = 140'000'000'000;
  EXPECT_EQ(db.upsert_device(device), id);
  ASSERT_EQ(db.devices().size(), 1u);
  EXPECT_EQ(db.devices()[0].device.memory_bytes, 140'000'000'000u);
  // Another host is another device.
  EXPECT_NE(db.upsert_device(gpu("node9")), id);

  db.record_kernel_measurements(id, std::vector{sample(conv(), "winograd", 64, 2.5)});
  KernelSample again = sample(conv(), "winograd", 64, 2.0, 4096);
  again.measurement.measured_at = 1'700'000'000;
  db.record_kernel_measurements(id, std::vector{again});
  const auto all = db.kernel_measurements(id, conv());
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].time_ms, 2.0);
  EXPECT_EQ(all[0].workspace_bytes, 4096u);
  EXPECT_EQ(all[0].measured_at, 1'700'000'000);

  db.record_step_measurements(id, std::vector{step(64, 30.0)});
  db.record_step_measurements(id, std::vector{step(64, 28.0)});
  const auto steps = db.step_measurements(id, "resnet18/cifar10", "none");
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].time_ms, 28.0);
  // The workspace plan is part of a step's key.
  db.record_step_measurements(id, std::vector{step(64, 25.0, "ws=64MiB")});
  EXPECT_EQ(db.step_measurements(id, "resnet18/cifar10", "none").size(), 2u);

  const Stats stats = db.stats();
  EXPECT_EQ(stats.devices, 2);
  EXPECT_EQ(stats.kernels, 1);
  EXPECT_EQ(stats.kernel_measurements, 1);
  EXPECT_EQ(stats.step_measurements, 2);
}

TEST(PerfDb, MissesAreEmptyNotErrors) {
  PerfDb db(":memory:");
  const DeviceId device = db.upsert_device(gpu());
  db.record_kernel_measurements(device, std::vector{sample(conv(), "winograd", 64, 2.5)});

  EXPECT_TRUE(db.find_kernel_measurement(device, conv(), "winograd", 64).has_value());
  EXPECT_FALSE(db.find_kernel_measurement(device, conv(), "winograd", 32).has_value());
  EXPECT_FALSE(db.find_kernel_measurement(device, conv(), "fft", 64).has_value());
  EXPECT_FALSE(db.find_kernel_measurement(device, conv(KernelKind::kBackwardFilter), "winograd", 64));
  EXPECT_FALSE(db.find_kernel_measurement(device, conv(KernelKind::kForward, 3), "winograd", 64));
  EXPECT_FALSE(db.find_kernel_measurement(DeviceId{999}, conv(), "winograd", 64));
  EXPECT_TRUE(db.kernel_measurements(DeviceId{999}, conv()).empty());
  EXPECT_TRUE(db.step_measurements(device, "resnet18/cifar10", "none").empty());
  EXPECT_TRUE(db.find_devices("Tesla K80").empty());
}

TEST(PerfDb, FindsDevicesByName) {
  PerfDb db(":memory:");
  const DeviceId a = db.upsert_device(gpu("node1"));
  db.upsert_device(cpu());
  const DeviceId b = db.upsert_device(gpu("node2"));
  const auto found = db.find_devices("NVIDIA H200");
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].id, a);
  EXPECT_EQ(found[1].id, b);
  EXPECT_EQ(found[1].device.host, "node2");
}

TEST(PerfDb, RejectsBadInputAndRecordsNothing) {
  PerfDb db(":memory:");
  const DeviceId device = db.upsert_device(gpu());

  std::string error = error_of([&] {
    db.record_kernel_measurements(device, std::vector{sample(conv(), "winograd", 32, 1.0),
                                                      sample(conv(), "winograd", 128, 1.0)});
  });
  EXPECT_EQ(error,
            "perf DB :memory:: record kernel measurements: sample 1: micro_batch must be in 1..64 (the "
            "kernel's n), got 128");
  error = error_of([&] { db.record_kernel_measurements(device, std::vector{sample(conv(), "w", 8, NAN)}); });
  EXPECT_CONTAINS(error, "time_ms must be finite");

  error = error_of(
      [&] { db.record_kernel_measurements(DeviceId{42}, std::vector{sample(conv(), "w", 8, 1)}); });
  EXPECT_EQ(error,
            "perf DB :memory:: record kernel measurements: unknown device id 42 (known ids: " +
                std::to_string(device.value) + "); register it with upsert_device first");
  error = error_of([&] { db.record_step_measurements(DeviceId{42}, std::vector{step(8, 1.0)}); });
  EXPECT_CONTAINS(error, "unknown device id 42");

  const Stats stats = db.stats();
  EXPECT_EQ(stats.kernels, 0);
  EXPECT_EQ(stats.kernel_measurements, 0);
  EXPECT_EQ(stats.step_measurements, 0);
}

TEST(PerfDb, StatsCountRowsPerTableAndDevice) {
  PerfDb db(":memory:");
  const DeviceId g = db.upsert_device(gpu());
  const DeviceId c = db.upsert_device(cpu());
  std::vector<KernelSample> samples;
  for (int64_t mb : {1, 2, 4, 8}) samples.push_back(sample(conv(), "winograd", mb, 1.0 * mb));
  samples.push_back(sample(conv(KernelKind::kBackwardFilter), "direct", 64, 9.0));
  db.record_kernel_measurements(g, samples);
  db.record_kernel_measurements(c, std::vector{sample(conv(), "direct", 64, 40.0)});
  db.record_step_measurements(c, std::vector{step(16, 100.0), step(32, 190.0), step(64, 370.0)});

  const Stats stats = db.stats();
  EXPECT_EQ(stats.schema_version, kSchemaVersion);
  EXPECT_EQ(stats.devices, 2);
  EXPECT_EQ(stats.kernels, 2);
  EXPECT_EQ(stats.kernel_measurements, 6);
  EXPECT_EQ(stats.step_measurements, 3);
  ASSERT_EQ(stats.per_device.size(), 2u);
  EXPECT_EQ(stats.per_device[0].device.id, g);
  EXPECT_EQ(stats.per_device[0].kernel_measurements, 5);
  EXPECT_EQ(stats.per_device[0].step_measurements, 0);
  EXPECT_EQ(stats.per_device[1].device.id, c);
  EXPECT_EQ(stats.per_device[1].device.device.threads, 16);
  EXPECT_EQ(stats.per_device[1].kernel_measurements, 1);
  EXPECT_EQ(stats.per_device[1].step_measurements, 3);
}

// ------------------------------------------------------------------ export

// RFC 4180: records of fields; quoted fields may hold commas, quotes, newlines.
Rows parse_csv(const std::string& text) {
  Rows rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, was_quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quoted) {
      if (ch != '"') {
        field += ch;
      } else if (i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (ch == '"') {
      if (!field.empty() || was_quoted) throw std::runtime_error("CSV: stray quote");
      quoted = was_quoted = true;
    } else if (ch == ',' || ch == '\n') {
      row.push_back(field);
      field.clear();
      was_quoted = false;
      if (ch == '\n') rows.push_back(std::move(row)), row.clear();
    } else {
      if (was_quoted) throw std::runtime_error("CSV: text after a closing quote");
      field += ch;
    }
  }
  if (quoted || !field.empty() || !row.empty()) throw std::runtime_error("CSV: unterminated last record");
  return rows;
}

// One flat JSON object of strings, numbers and nulls (what export writes);
// values as text, nullopt for null. Throws on anything else.
std::map<std::string, std::optional<std::string>> parse_json_object(const std::string& line) {
  size_t at = 0;
  auto fail = [&](const char* what) {
    throw std::runtime_error(std::string("JSON: ") + what + " in " + line);
  };
  auto expect = [&](char ch) {
    if (at >= line.size() || line[at] != ch) fail("unexpected character");
    ++at;
  };
  auto string = [&] {
    expect('"');
    std::string out;
    while (at < line.size() && line[at] != '"') {
      char ch = line[at++];
      if (static_cast<unsigned char>(ch) < 0x20) fail("raw control character");
      if (ch == '\\') {
        if (at >= line.size()) fail("dangling escape");
        const char e = line[at++];
        if (e == 'n') ch = '\n';
        else if (e == 't') ch = '\t';
        else if (e == 'r') ch = '\r';
        else if (e == '"' || e == '\\' || e == '/') ch = e;
        else if (e == 'u' && at + 4 <= line.size()) {
          const unsigned code = std::stoul(line.substr(at, 4), nullptr, 16);
          if (code > 0x7f) fail("non-ASCII \\u escape");
          ch = static_cast<char>(code);
          at += 4;
        } else {
          fail("bad escape");
        }
      }
      out += ch;
    }
    expect('"');
    return out;
  };
  std::map<std::string, std::optional<std::string>> object;
  expect('{');
  while (true) {
    const std::string key = string();
    expect(':');
    if (line.compare(at, 4, "null") == 0) {
      object[key] = std::nullopt;
      at += 4;
    } else if (line[at] == '"') {
      object[key] = string();
    } else {
      const char* begin = line.c_str() + at;
      char* end = nullptr;
      std::strtod(begin, &end);
      if (end == begin) fail("bad number");
      const auto length = static_cast<size_t>(end - begin);
      object[key] = line.substr(at, length);
      at += length;
    }
    if (at < line.size() && line[at] == ',') {
      ++at;
      continue;
    }
    expect('}');
    break;
  }
  if (at != line.size()) fail("trailing text");
  return object;
}

TEST(PerfDbExport, CsvParsesBackWithAwkwardText) {
  PerfDb db(":memory:");
  Device odd = gpu("rack 3, \"node\"\nseven");
  odd.name = "Tesla \"K80\", rev 2";
  db.upsert_device(gpu());
  const DeviceId id = db.upsert_device(odd);
  db.record_kernel_measurements(id, std::vector{sample(conv(), "winograd", 16, 0.1 + 0.2)});

  std::ostringstream out;
  db.export_table(Table::kDevices, ExportFormat::kCsv, out);
  const auto rows = parse_csv(out.str());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"id", "name", "backend", "memory_bytes", "library_version",
                                               "threads", "host"}));
  EXPECT_EQ(rows[2][0], std::to_string(id.value));
  EXPECT_EQ(rows[2][1], odd.name);
  EXPECT_EQ(rows[2][6], odd.host);

  std::ostringstream measurements;
  db.export_table(Table::kKernelMeasurements, ExportFormat::kCsv, measurements);
  const auto m = parse_csv(measurements.str());
  ASSERT_EQ(m.size(), 2u);
  ASSERT_EQ(m[0].size(), m[1].size());
  for (size_t i = 0; i < m[0].size(); ++i) {
    if (m[0][i] == "time_ms") {
      EXPECT_EQ(std::strtod(m[1][i].c_str(), nullptr), 0.1 + 0.2);  // exact round trip
    }
  }
}

TEST(PerfDbExport, JsonLinesParseBack) {
  PerfDb db(":memory:");
  Device odd = gpu("tab\there");
  odd.name = "quote \" backslash \\ bell \a";
  const DeviceId id = db.upsert_device(odd);
  std::vector<KernelSample> samples = {sample(conv(), "winograd", 16, 0.1 + 0.2),
                                       sample(conv(), "direct", 16, 7.0)};
  samples[1].measurement.time_iqr_ms.reset();
  db.record_kernel_measurements(id, samples);
  db.record_step_measurements(id, std::vector{step(64, 30.5, "ws=64MiB")});

  std::ostringstream devices;
  db.export_table(Table::kDevices, ExportFormat::kJsonLines, devices);
  const auto device = parse_json_object(devices.str().substr(0, devices.str().size() - 1));
  EXPECT_EQ(device.at("name"), odd.name);
  EXPECT_EQ(device.at("host"), odd.host);
  EXPECT_EQ(device.at("memory_bytes"), "150000000000");

  std::ostringstream measurements;
  db.export_table(Table::kKernelMeasurements, ExportFormat::kJsonLines, measurements);
  std::istringstream lines(measurements.str());
  std::vector<std::map<std::string, std::optional<std::string>>> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(parse_json_object(line));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("algorithm"), "winograd");
  EXPECT_EQ(std::strtod(rows[0].at("time_ms")->c_str(), nullptr), 0.1 + 0.2);
  EXPECT_EQ(rows[1].at("time_iqr_ms"), std::nullopt);
  EXPECT_EQ(rows[1].at("micro_batch"), "16");

  std::ostringstream kernels, steps;
  db.export_table(Table::kKernels, ExportFormat::kJsonLines, kernels);
  EXPECT_EQ(parse_json_object(kernels.str().substr(0, kernels.str().size() - 1)).at("kind"), "Forward");
  db.export_table(Table::kStepMeasurements, ExportFormat::kJsonLines, steps);
  EXPECT_EQ(parse_json_object(steps.str().substr(0, steps.str().size() - 1)).at("workspace_plan"),
            "ws=64MiB");
}

TEST(PerfDbExport, TableNamesRoundTrip) {
  for (Table t : {Table::kDevices, Table::kKernels, Table::kKernelMeasurements, Table::kStepMeasurements}) {
    EXPECT_EQ(table_from_name(table_name(t)), t);
  }
  EXPECT_EQ(table_from_name("sqlite_master"), std::nullopt);
}

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
  SqlShell(path).exec("UPDATE schema_version SET version = 7");
  expect_rejected_untouched(path, "perf DB " + path + " has schema version 7; this vtrain knows up to 2");
}

TEST(PerfDbFiles, NewerSchemaWrittenWhileOpenIsAnError) {
  TempDir dir;
  const std::string path = dir.path("upgraded-under-us.db");
  PerfDb db(path);
  db.upsert_device(gpu());
  SqlShell(path).exec("UPDATE schema_version SET version = 3");
  const std::string error = error_of([&] { db.upsert_device(cpu()); });
  EXPECT_EQ(error, "perf DB " + path + " has schema version 3; this vtrain knows up to 2");
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
  // A child starts a big transaction with a tiny page cache, so SQLite
  // spills uncommitted pages into the file, and dies without committing:
  // the file now needs its journal (a "hot" journal) to be read correctly.
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      SqlShell shell(path);
      shell.exec(
          "PRAGMA cache_size = 10; BEGIN IMMEDIATE;"
          "WITH RECURSIVE i(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM i WHERE x < 2000) "
          "INSERT INTO devices (name, backend, memory_bytes, library_version, threads, host) "
          "SELECT 'spill' || x, 'cpu', 1, printf('%.500c', 'v'), 1, 'h' FROM i;");
      _exit(0);  // no COMMIT, no close: as if the node had crashed
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      _exit(1);
    }
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
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

// ------------------------------------------------------------------ upgrade

// The layout vtrain wrote at schema version 1, verbatim: files in the field
// look like this.
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
INSERT INTO kernels VALUES (3, 'Forward', 64, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 'f32', 'NCHW');
INSERT INTO kernel_measurements VALUES (11, 5, 3, 'winograd', 32, 4.25, 1048576, 1600000000);
INSERT INTO step_measurements VALUES (21, 5, 'resnet18/cifar10', 64, 'none', 120.5, 9000000000, 1600000001);
)sql";

TEST(PerfDbUpgrade, Version1IsUpgradedAndKeepsItsRows) {
  TempDir dir;
  const std::string path = dir.path("v1.db");
  SqlShell(path).exec(kVersion1);

  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, 2);
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

  auto steps = db.step_measurements(DeviceId{5}, "resnet18/cifar10", "none");
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].workspace_plan, "");
  EXPECT_EQ(steps[0].time_ms, 120.5);
  EXPECT_EQ(steps[0].peak_device_bytes, 9000000000u);
  EXPECT_EQ(steps[0].measured_at, 1600000001);

  // Version 2 writes work on the upgraded file: a plan is a new key.
  db.record_step_measurements(DeviceId{5}, std::vector{step(64, 100.0, "ws=64MiB")});
  EXPECT_EQ(db.step_measurements(DeviceId{5}, "resnet18/cifar10", "none").size(), 2u);
  db.record_kernel_measurements(DeviceId{5}, std::vector{sample(conv(), "winograd", 32, 4.0)});
  EXPECT_EQ(db.find_kernel_measurement(DeviceId{5}, conv(), "winograd", 32)->time_iqr_ms, 0.4);

  SqlShell shell(path);
  EXPECT_EQ(shell.query("SELECT version FROM schema_version"), (Rows{{"2"}}));
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
  ScratchDir dir(shared_test_base());
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
