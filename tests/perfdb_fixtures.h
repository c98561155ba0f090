// Records and files shared by the perf DB's tests (perfdb_test.cpp,
// perfdb_files_test.cpp, db_cli_test.cpp).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "perfdb/internal/sql_shell.h"
#include "perfdb/perf_db.h"
#include "tests/test_support.h"

namespace vtrain::perfdb {

namespace fs = std::filesystem;


inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The message of the PerfDbError that `action` throws (a test failure if none).
inline std::string error_of(const std::function<void()>& action) {
  return test_support::error_message<PerfDbError>(action);
}

// A child starts a big transaction with a tiny page cache, so SQLite
// spills uncommitted pages into `path` (a perf DB), and dies without
// committing: the file then needs its journal (a "hot" journal) to be read
// correctly, as after a node crashed mid-write.
inline void leave_crashed_writers_journal(const std::string& path) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      internal::SqlShell shell(path);
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
}

// Turns the kernel tables of a current file back into version 8's (the
// last with one `layout` column, "<x>-><y>"), rows and ids kept: for the
// tests that make an older file from a current one. Version 8's tables
// are version 1's kernels and version 2's kernel_measurements.
constexpr const char* kVersion8KernelTables = R"sql(
CREATE TABLE kernels_v8 (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('Forward', 'BackwardData', 'BackwardFilter')),
  n INTEGER NOT NULL, c INTEGER NOT NULL, h INTEGER NOT NULL, w INTEGER NOT NULL,
  k INTEGER NOT NULL, r INTEGER NOT NULL, s INTEGER NOT NULL,
  pad_h INTEGER NOT NULL, pad_w INTEGER NOT NULL, stride_h INTEGER NOT NULL, stride_w INTEGER NOT NULL,
  dtype TEXT NOT NULL, layout TEXT NOT NULL,
  UNIQUE (kind, n, c, h, w, k, r, s, pad_h, pad_w, stride_h, stride_w, dtype, layout));
INSERT INTO kernels_v8 SELECT id, kind, n, c, h, w, k, r, s, pad_h, pad_w, stride_h, stride_w, dtype,
  input_layout || '->' || output_layout FROM kernels;
CREATE TABLE kernel_measurements_v8 (
  id INTEGER PRIMARY KEY, device_id INTEGER NOT NULL REFERENCES devices (id),
  kernel_id INTEGER NOT NULL REFERENCES kernels_v8 (id), algorithm TEXT NOT NULL,
  micro_batch INTEGER NOT NULL, time_ms REAL NOT NULL, workspace_bytes INTEGER NOT NULL,
  measured_at INTEGER NOT NULL, time_iqr_ms REAL,
  UNIQUE (device_id, kernel_id, algorithm, micro_batch));
INSERT INTO kernel_measurements_v8 SELECT * FROM kernel_measurements;
DROP TABLE kernel_measurements;
DROP TABLE kernels;
ALTER TABLE kernels_v8 RENAME TO kernels;
ALTER TABLE kernel_measurements_v8 RENAME TO kernel_measurements;
)sql";

inline Device gpu(const std::string& host = "node1") {
  return Device{"NVIDIA H200", "cuda", 150'000'000'000, "cuDNN 9.1.0", 1, host};
}

inline Device cpu() { return Device{"Intel Xeon 8480", "cpu", 64'000'000'000, "oneDNN 3.0.0", 16, "node2"}; }

inline KernelSignature conv(KernelKind kind = KernelKind::kForward, int64_t c = 64) {
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

inline KernelSample sample(const KernelSignature& kernel, const std::string& algorithm, int64_t micro_batch,
                    double time_ms, uint64_t workspace = 0) {
  KernelMeasurement m;
  m.algorithm = algorithm;
  m.micro_batch = micro_batch;
  m.time_ms = time_ms;
  m.time_iqr_ms = time_ms / 10;
  m.workspace_bytes = workspace;
  return {kernel, m};
}

inline StepMeasurement step(int64_t batch, double time_ms, const std::string& plan = "") {
  StepMeasurement s;
  s.model = ModelKey{"resnet18/cifar10"};
  s.batch = batch;
  s.memory_policy = "none";
  s.workspace_plan = plan;
  s.time_ms = time_ms;
  s.peak_device_bytes = static_cast<uint64_t>(batch) * 1'000'000;
  return s;
}

// Writes a little of everything and checks it reads back.
inline void write_and_read_back(PerfDb& db) {
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

  const auto steps = db.step_measurements(device, ModelKey{"resnet18/cifar10"}, "none");
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

}  // namespace vtrain::perfdb
