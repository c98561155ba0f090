// The perf DB's records: round trips, idempotent upserts, lookups and
// misses, stats and export. Files (damaged, foreign, newer, read-only opens),
// the upgrade, locking and many writing processes are in
// perfdb_files_test.cpp.
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
#include "tests/perfdb_fixtures.h"
#include "tests/test_support.h"

namespace vtrain::perfdb {
namespace {

using internal::SqlShell;
using Rows = std::vector<std::vector<std::string>>;

using test_support::TempDir;

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
  EXPECT_EQ(again.step_measurements(devices[0].id, ModelKey{"resnet18/cifar10"}, "none").size(), 2u);
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
  // Found by its identity, whatever memory it is given now.
  device.memory_bytes = 1;
  EXPECT_EQ(db.find_device(device), id);
  EXPECT_EQ(db.find_device(gpu("node7")), std::nullopt);

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
  const auto steps = db.step_measurements(id, ModelKey{"resnet18/cifar10"}, "none");
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].time_ms, 28.0);
  // The workspace plan is part of a step's key.
  db.record_step_measurements(id, std::vector{step(64, 25.0, "ws=64MiB")});
  EXPECT_EQ(db.step_measurements(id, ModelKey{"resnet18/cifar10"}, "none").size(), 2u);

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
  EXPECT_TRUE(db.step_measurements(device, ModelKey{"resnet18/cifar10"}, "none").empty());
  EXPECT_TRUE(db.find_devices("Tesla K80").empty());
}

// Groups are part of a kernel's key: a depthwise and a dense convolution
// on one input keep their own rows and times; groups < 1 is refused.
TEST(PerfDb, KernelsThatDifferOnlyInGroupsKeepTheirOwnTimes) {
  PerfDb db(":memory:");
  const DeviceId device = db.upsert_device(gpu());
  KernelSignature depthwise = conv();
  depthwise.groups = 64;
  db.record_kernel_measurements(device, std::vector{sample(conv(), "implicit_gemm", 64, 2.5),
                                                    sample(depthwise, "implicit_gemm", 64, 0.5)});
  EXPECT_EQ(db.stats().kernels, 2);
  EXPECT_EQ(db.find_kernel_measurement(device, conv(), "implicit_gemm", 64)->time_ms, 2.5);
  EXPECT_EQ(db.find_kernel_measurement(device, depthwise, "implicit_gemm", 64)->time_ms, 0.5);
  std::ostringstream csv;
  db.export_table(Table::kKernels, ExportFormat::kCsv, csv);
  EXPECT_CONTAINS(csv.str(), ",groups,");

  depthwise.groups = 0;
  EXPECT_CONTAINS(error_of([&] {
                    db.record_kernel_measurements(device, std::vector{sample(depthwise, "w", 8, 1)});
                  }),
                  "sample 0: kernel.groups must be >= 1, got 0");
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
  // The capacity a policy planned for is a column of its own, never a
  // suffix of the policy's name.
  StepMeasurement suffixed = step(8, 1.0);
  suffixed.memory_policy = "auto@123456";
  error = error_of([&] { db.record_step_measurements(device, std::vector{suffixed}); });
  EXPECT_CONTAINS(error, "step 0: memory_policy must be the policy's name alone (the capacity goes "
                         "in policy_capacity_bytes), got 'auto@123456'");

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
  for (Table t : kTables) {
    EXPECT_EQ(table_from_name(table_name(t)), t);
  }
  EXPECT_EQ(table_from_name("sqlite_master"), std::nullopt);
}

}  // namespace
}  // namespace vtrain::perfdb
