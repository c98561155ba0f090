// The perf DB's copy_bandwidth and layer_measurements tables (schema 3):
// round trips, upserts, writes that are all or nothing, and the upgrade of a
// version 2 file.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "perfdb/internal/sql_shell.h"
#include "perfdb/perf_db.h"
#include "tests/perfdb_fixtures.h"
#include "tests/test_support.h"

namespace vtrain::perfdb {
namespace {

using internal::SqlShell;
using Rows = std::vector<std::vector<std::string>>;
using test_support::TempDir;

CopyBandwidthMeasurement copy(CopyDirection direction, double bytes_per_second,
                              double compute_share = 0.25) {
  return {direction, 64 << 20, bytes_per_second, 0, compute_share};
}

std::vector<LayerMeasurement> lenet_layers(double scale = 1.0) {
  return {{kLossLayer, "loss", 0.05 * scale, 0, 0},
          {0, "data", 0, 0, 0},
          {1, "conv1", 1.5 * scale, 3.0 * scale, 0},
          {2, "relu1", 0.1 * scale, 0.2 * scale, 0}};
}

TEST(PerfDbMemoryCosts, CopyBandwidthRoundTripsAndIsReplaced) {
  PerfDb db(":memory:");
  const DeviceId g = db.upsert_device(gpu());
  EXPECT_EQ(db.find_copy_bandwidth(g, CopyDirection::kToHost), std::nullopt);
  db.record_copy_bandwidth(g, std::vector{copy(CopyDirection::kToHost, 12e9),
                                          copy(CopyDirection::kToDevice, 13e9)});
  const auto to_host = db.find_copy_bandwidth(g, CopyDirection::kToHost);
  ASSERT_TRUE(to_host.has_value());
  EXPECT_EQ(to_host->bytes_per_second, 12e9);
  EXPECT_EQ(to_host->bytes, uint64_t{64} << 20);
  EXPECT_GT(to_host->measured_at, 0);  // 0 means now
  EXPECT_EQ(to_host->compute_share, 0.25);
  EXPECT_EQ(db.find_copy_bandwidth(g, CopyDirection::kToDevice)->bytes_per_second, 13e9);

  // One row per device and direction: measuring again replaces it.
  db.record_copy_bandwidth(g, std::vector{copy(CopyDirection::kToHost, 11e9, 1.0)});
  EXPECT_EQ(db.find_copy_bandwidth(g, CopyDirection::kToHost)->bytes_per_second, 11e9);
  EXPECT_EQ(db.find_copy_bandwidth(g, CopyDirection::kToHost)->compute_share, 1.0);
  EXPECT_EQ(db.stats().copy_bandwidths, 2);
  // Another device has its own.
  EXPECT_EQ(db.find_copy_bandwidth(db.upsert_device(cpu()), CopyDirection::kToHost), std::nullopt);
}

TEST(PerfDbMemoryCosts, LayerMeasurementsRoundTripPerModelAndBatch) {
  PerfDb db(":memory:");
  const DeviceId g = db.upsert_device(gpu());
  db.record_layer_measurements(g, ModelKey{"lenet"}, 64, lenet_layers());
  db.record_layer_measurements(g, ModelKey{"lenet"}, 32, lenet_layers(0.5));
  const auto at64 = db.layer_measurements(g, ModelKey{"lenet"}, 64);
  ASSERT_EQ(at64.size(), 4u);  // ordered by layer_index, the loss first
  EXPECT_EQ(at64[0].layer_index, kLossLayer);
  EXPECT_EQ(at64[0].layer_name, "loss");
  EXPECT_EQ(at64[2].layer_name, "conv1");
  EXPECT_EQ(at64[2].forward_ms, 1.5);
  EXPECT_EQ(at64[2].backward_ms, 3.0);
  EXPECT_GT(at64[2].measured_at, 0);
  EXPECT_EQ(db.layer_measurements(g, ModelKey{"lenet"}, 32)[2].forward_ms, 0.75);
  EXPECT_TRUE(db.layer_measurements(g, ModelKey{"lenet"}, 16).empty());
  EXPECT_TRUE(db.layer_measurements(g, ModelKey{"vgg16"}, 64).empty());

  // Measuring again replaces rows on (device, model, batch, layer).
  std::vector<LayerMeasurement> again = lenet_layers(2.0);
  again[2].measured_at = 1700000000;
  db.record_layer_measurements(g, ModelKey{"lenet"}, 64, again);
  const auto replaced = db.layer_measurements(g, ModelKey{"lenet"}, 64);
  ASSERT_EQ(replaced.size(), 4u);
  EXPECT_EQ(replaced[2].forward_ms, 3.0);
  EXPECT_EQ(replaced[2].measured_at, 1700000000);
  const Stats stats = db.stats();
  EXPECT_EQ(stats.layer_measurements, 8);
  EXPECT_EQ(stats.per_device[0].layer_measurements, 8);
}

TEST(PerfDbMemoryCosts, AnInvalidRowRecordsNothing) {
  PerfDb db(":memory:");
  const DeviceId g = db.upsert_device(gpu());
  std::vector<LayerMeasurement> layers = lenet_layers();
  layers[3].backward_ms = -1;
  EXPECT_EQ(error_of([&] { db.record_layer_measurements(g, ModelKey{"lenet"}, 64, layers); }),
            "perf DB :memory:: record layer measurements: layer 3: backward_ms must be finite "
            "and >= 0, got -1.000000");
  layers = lenet_layers();
  layers[3].layer_index = 1;
  EXPECT_EQ(error_of([&] { db.record_layer_measurements(g, ModelKey{"lenet"}, 64, layers); }),
            "perf DB :memory:: record layer measurements: layer_index 1 is given twice");
  layers[3].layer_index = -3;
  EXPECT_EQ(error_of([&] { db.record_layer_measurements(g, ModelKey{"lenet"}, 64, layers); }),
            "perf DB :memory:: record layer measurements: layer 3: layer_index must be >= -2 "
            "(the time outside layer calls), got -3");
  EXPECT_EQ(error_of([&] { db.record_layer_measurements(g, ModelKey{"lenet"}, 0, lenet_layers()); }),
            "perf DB :memory:: record layer measurements: batch must be >= 1, got 0");
  EXPECT_EQ(error_of([&] { db.record_layer_measurements(DeviceId{99}, ModelKey{"lenet"}, 8, lenet_layers()); }),
            "perf DB :memory:: record layer measurements: unknown device id 99 (known ids: 1); "
            "register it with upsert_device first");
  EXPECT_EQ(error_of([&] {
              db.record_copy_bandwidth(g, std::vector{copy(CopyDirection::kToHost, 1e9),
                                                      copy(CopyDirection::kToDevice, 0)});
            }),
            "perf DB :memory:: record copy bandwidth: measurement 1: bytes_per_second must be "
            "finite and > 0, got 0.000000");
  EXPECT_EQ(error_of([&] {
              db.record_copy_bandwidth(g, std::vector{copy(CopyDirection::kToHost, 1e9),
                                                      copy(CopyDirection::kToHost, 2e9)});
            }),
            "perf DB :memory:: record copy bandwidth: direction to_host is given twice");
  EXPECT_EQ(error_of([&] {
              db.record_copy_bandwidth(g, std::vector{copy(CopyDirection::kToHost, 1e9, 1.5)});
            }),
            "perf DB :memory:: record copy bandwidth: measurement 0: compute_share must be in "
            "[0, 1], got 1.500000");
  CopyBandwidthMeasurement without = copy(CopyDirection::kToDevice, 1e9);
  without.compute_share.reset();
  EXPECT_EQ(error_of([&] { db.record_copy_bandwidth(g, std::vector{without}); }),
            "perf DB :memory:: record copy bandwidth: measurement 0: compute_share is required");
  const Stats stats = db.stats();
  EXPECT_EQ(stats.layer_measurements, 0);
  EXPECT_EQ(stats.copy_bandwidths, 0);
}

TEST(PerfDbMemoryCosts, ATransactionThatFailsHalfwayLeavesNoRow) {
  // A write that fails inside the transaction, after the rows before it
  // went in, rolls them back.
  TempDir dir;
  const std::string path = dir.path("atomic.db");
  PerfDb db(path);
  const DeviceId g = db.upsert_device(gpu());
  // A trigger makes the fourth row fail.
  SqlShell(path).exec(
      "CREATE TRIGGER no_relu BEFORE INSERT ON layer_measurements WHEN NEW.layer_name = 'relu1' "
      "BEGIN SELECT RAISE(ABORT, 'relu1 refused'); END;");
  EXPECT_NE(error_of([&] { db.record_layer_measurements(g, ModelKey{"lenet"}, 64, lenet_layers()); })
                .find("relu1 refused"),
            std::string::npos);
  EXPECT_EQ(SqlShell(path).query("SELECT count(*) FROM layer_measurements"), (Rows{{"0"}}));
}

// A file of `version` (2 or 3) holding one step row: a current one with
// what later versions added taken out again.
std::string older_file(const TempDir& dir, int version) {
  const std::string path = dir.path("v" + std::to_string(version) + ".db");
  {
    PerfDb db(path);
    db.record_step_measurements(db.upsert_device(gpu()), std::vector{step(64, 30.0)});
  }
  // Version 3 is version 4 without the step's activation columns (and 5
  // without the copies' compute share, 7 without input_rates); version 2
  // also lacks the two tables.
  SqlShell(path).exec(
      std::string(kVersion8KernelTables) + "DROP TABLE input_rates; " + std::string(version == 2 ? "DROP TABLE copy_bandwidth; DROP TABLE layer_measurements; "
                               : "ALTER TABLE copy_bandwidth DROP COLUMN compute_share; ") +
      "ALTER TABLE step_measurements DROP COLUMN kept_bytes; "
      "ALTER TABLE step_measurements DROP COLUMN offloaded_bytes; "
      "ALTER TABLE step_measurements DROP COLUMN recomputed_bytes; "
      "UPDATE schema_version SET version = " + std::to_string(version));
  return path;
}

TEST(PerfDbMemoryCosts, Version2FilesAreUpgradedKeepingTheirRows) {
  TempDir dir;
  const std::string path = older_file(dir, 2);
  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, kSchemaVersion);
  const DeviceId g = db.find_devices("NVIDIA H200").at(0).id;
  EXPECT_EQ(db.step_measurements(g, ModelKey{"resnet18/cifar10"}, "none").size(), 1u);
  db.record_layer_measurements(g, ModelKey{"lenet"}, 64, lenet_layers());
  db.record_copy_bandwidth(g, std::vector{copy(CopyDirection::kToDevice, 5e9)});
  EXPECT_EQ(db.layer_measurements(g, ModelKey{"lenet"}, 64).size(), 4u);
  SqlShell shell(path);
  EXPECT_EQ(shell.query("SELECT version FROM schema_version"),
            (Rows{{std::to_string(kSchemaVersion)}}));
  EXPECT_EQ(shell.query("PRAGMA foreign_key_check"), Rows{});
}

TEST(PerfDbMemoryCosts, AStepsActivationPlacementRoundTripsAndOldRowsHaveNone) {
  TempDir dir;
  const std::string path = older_file(dir, 3);
  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, kSchemaVersion);
  const DeviceId g = db.find_devices("NVIDIA H200").at(0).id;
  EXPECT_FALSE(db.step_measurements(g, ModelKey{"resnet18/cifar10"}, "none").at(0).activations);
  StepMeasurement planned = step(128, 70.0);
  planned.activations = common::ActivationBytes{100, 20, 3};
  db.record_step_measurements(g, std::vector{planned});
  const auto steps = db.step_measurements(g, ModelKey{"resnet18/cifar10"}, "none");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1].activations, (common::ActivationBytes{100, 20, 3}));
  planned.activations->kept = uint64_t{1} << 63;
  EXPECT_THROW(db.record_step_measurements(g, std::vector{planned}), PerfDbError);
}

// Version 4 refused a row for the time outside the layer calls; the
// upgrade rebuilds the table with its rows and ids and then takes one.
TEST(PerfDbMemoryCosts, Version4FilesKeepTheirLayerRowsAndTakeTheTimeOutsideTheCalls) {
  TempDir dir;
  const std::string path = dir.path("v4.db");
  {
    PerfDb db(path);
    db.record_layer_measurements(db.upsert_device(gpu()), ModelKey{"lenet"}, 64, lenet_layers());
  }
  SqlShell(path).exec(
      std::string(kVersion8KernelTables) + "CREATE TABLE old (id INTEGER PRIMARY KEY, device_id INTEGER NOT NULL REFERENCES "
      "devices (id), model TEXT NOT NULL, batch INTEGER NOT NULL, layer_index INTEGER NOT NULL "
      "CHECK (layer_index >= -1), layer_name TEXT NOT NULL, forward_ms REAL NOT NULL, "
      "backward_ms REAL NOT NULL, measured_at INTEGER NOT NULL, "
      "UNIQUE (device_id, model, batch, layer_index)); "
      "INSERT INTO old SELECT id, device_id, model, batch, layer_index, layer_name, forward_ms, "
      "backward_ms, measured_at FROM layer_measurements; DROP TABLE layer_measurements; "
      "ALTER TABLE old RENAME TO layer_measurements; "
      "ALTER TABLE copy_bandwidth DROP COLUMN compute_share; DROP TABLE input_rates; "
      "UPDATE schema_version SET version = 4");
  const Rows ids = SqlShell(path).query("SELECT id, layer_name FROM layer_measurements ORDER BY id");
  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, kSchemaVersion);
  const DeviceId g = db.find_devices("NVIDIA H200").at(0).id;
  EXPECT_EQ(db.layer_measurements(g, ModelKey{"lenet"}, 64).size(), 4u);
  db.record_layer_measurements(g, ModelKey{"lenet"}, 64,
                               std::vector<LayerMeasurement>{
                                   {kOutsideCallsLayer, "outside layer calls", 0.4, 0, 0}});
  EXPECT_EQ(db.layer_measurements(g, ModelKey{"lenet"}, 64).front().layer_index, kOutsideCallsLayer);
  SqlShell shell(path);
  EXPECT_EQ(shell.query("SELECT id, layer_name FROM layer_measurements WHERE layer_index >= -1 "
                        "ORDER BY id"),
            ids);
  EXPECT_EQ(shell.query("PRAGMA foreign_key_check"), Rows{});
}

// Version 5's copy bandwidths have no compute share: kept, read without
// one (a profile measures them again), and replaced with one.
TEST(PerfDbMemoryCosts, Version5CopyBandwidthsAreKeptWithoutAComputeShare) {
  TempDir dir;
  const std::string path = dir.path("v5.db");
  {
    PerfDb db(path);
    db.record_copy_bandwidth(db.upsert_device(gpu()), std::vector{copy(CopyDirection::kToHost, 9e9)});
  }
  SqlShell(path).exec(
      std::string(kVersion8KernelTables) +
      "ALTER TABLE copy_bandwidth DROP COLUMN compute_share; DROP TABLE input_rates; "
      "UPDATE schema_version SET version = 5");
  PerfDb db(path);
  EXPECT_EQ(db.stats().schema_version, kSchemaVersion);
  const DeviceId g = db.find_devices("NVIDIA H200").at(0).id;
  const auto old = db.find_copy_bandwidth(g, CopyDirection::kToHost);
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->bytes_per_second, 9e9);
  EXPECT_EQ(old->compute_share, std::nullopt);
  db.record_copy_bandwidth(g, std::vector{copy(CopyDirection::kToHost, 8e9, 0.75)});
  EXPECT_EQ(db.find_copy_bandwidth(g, CopyDirection::kToHost)->compute_share, 0.75);
  EXPECT_EQ(db.stats().copy_bandwidths, 1);
}

TEST(PerfDbMemoryCosts, TheNewTablesExport) {
  PerfDb db(":memory:");
  const DeviceId g = db.upsert_device(gpu());
  db.record_layer_measurements(g, ModelKey{"lenet"}, 64, lenet_layers());
  db.record_copy_bandwidth(g, std::vector{copy(CopyDirection::kToHost, 12e9)});
  std::ostringstream layers, bandwidth;
  db.export_table(Table::kLayerMeasurements, ExportFormat::kCsv, layers);
  EXPECT_TRUE(layers.str().starts_with("id,device_id,model,precision,layout,fuse_relu,batch,"
                                       "layer_index,layer_name,forward_ms,backward_ms,"
                                       "measured_at\n"))
      << layers.str();
  EXPECT_NE(layers.str().find(",lenet,fp32,auto,auto,64,1,conv1,1.5,3,"), std::string::npos) << layers.str();
  db.export_table(Table::kCopyBandwidth, ExportFormat::kCsv, bandwidth);
  EXPECT_NE(bandwidth.str().find(",to_host,67108864,1.2e+10,"), std::string::npos)
      << bandwidth.str();
  EXPECT_EQ(table_from_name("layer_measurements"), Table::kLayerMeasurements);
  EXPECT_EQ(table_from_name("copy_bandwidth"), Table::kCopyBandwidth);
}

}  // namespace
}  // namespace vtrain::perfdb
