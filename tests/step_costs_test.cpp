// The simulator's costs through the perf DB (worker/profile/step_costs.h):
// the profiler records a device's copy bandwidth once and a model's layers
// per batch, hits its cache the second time, and profiled_step_costs()
// assembles memory::StepCosts or says which rows are missing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "perfdb/internal/sql_shell.h"
#include "perfdb/perf_db.h"
#include "tests/engine_support.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/profile/profiler.h"
#include "worker/profile/step_costs.h"

namespace vtrain::worker {
namespace {

Graph small_graph() {
  return Graph::build(preset_layers("lenet", {{1, 1, 16, 16}, 4}), {1, 1, 16, 16});
}

ProfileOptions layers_only(std::vector<int64_t> batches) {
  ProfileOptions o;
  o.batches = std::move(batches);
  o.warmup = 0;
  o.repeats = 1;
  o.steps = false;
  return o;
}

class StepCostsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ =
      make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  perfdb::PerfDb db_{":memory:"};
  perfdb::DeviceId device_ = db_.upsert_device(perfdb_device(backend_->device_info()));
  Graph graph_ = small_graph();
};

TEST_F(StepCostsTest, TheProfilerRecordsBandwidthOnceAndLayersPerBatch) {
  const ProfileReport first = profile(graph_, *backend_, db_, device_, layers_only({4, 6}));
  EXPECT_EQ(first.copy_measured, 1);
  EXPECT_EQ(first.layer_costs_measured, 2);
  EXPECT_EQ(first.layer_costs_cached, 0);
  const perfdb::Stats stats = db_.stats();
  EXPECT_EQ(stats.copy_bandwidths, 2);  // each way
  EXPECT_EQ(stats.layer_measurements, 2 * (graph_.size() + 1));

  const ProfileReport second = profile(graph_, *backend_, db_, device_, layers_only({4, 6, 8}));
  EXPECT_EQ(second.copy_measured, 0);
  EXPECT_EQ(second.copy_cached, 1);
  EXPECT_EQ(second.layer_costs_measured, 1);  // only the new batch
  EXPECT_EQ(second.layer_costs_cached, 2);

  ProfileOptions without = layers_only({16});
  without.layer_costs = false;
  const ProfileReport none = profile(graph_, *backend_, db_, device_, without);
  EXPECT_EQ(none.layer_costs_measured + none.copy_measured, 0);
  EXPECT_FALSE(profiled_step_costs(db_, device_, graph_, {}, 16).costs.has_value());
}

TEST_F(StepCostsTest, ProfiledCostsHaveOneEntryPerLayer) {
  profile(graph_, *backend_, db_, device_, layers_only({4}));
  const StepCostsLookup lookup = profiled_step_costs(db_, device_, graph_, {}, 4);
  ASSERT_TRUE(lookup.costs.has_value()) << lookup.missing;
  EXPECT_EQ(lookup.missing, "");
  const memory::StepCosts& c = *lookup.costs;
  test_support::expect_every_layer_timed(graph_, c);
  EXPECT_GT(c.to_host_bytes_per_second, 0);
  EXPECT_GT(c.to_device_bytes_per_second, 0);
  // The rows hold what was measured, in ms, named after the layers.
  const auto rows = db_.layer_measurements(device_, model_key(graph_, {}), 4);
  ASSERT_EQ(rows.size(), static_cast<size_t>(graph_.size() + 1));
  EXPECT_EQ(rows[0].layer_name, "loss");
  EXPECT_EQ(rows[2].layer_name, graph_.layer(1).name);
  EXPECT_DOUBLE_EQ(rows[2].forward_ms * 1e-3, c.forward_seconds[1]);
}

TEST_F(StepCostsTest, WhatIsMissingIsNamed) {
  EXPECT_EQ(profiled_step_costs(db_, device_, graph_, {}, 8).missing,
            "the copy bandwidth to_host and to_device; layer times of data, conv1, pool1, "
            "conv2, pool2, ... (9 in all) at batch 8");
  const perfdb::CopyBandwidthMeasurement to_device{perfdb::CopyDirection::kToDevice, 4096, 1e9, 0,
                                                   0.5};
  db_.record_copy_bandwidth(device_, std::span(&to_device, 1));
  // Every layer but the last two, and no loss.
  memory::StepCosts some;
  some.forward_seconds.assign(graph_.size(), 0.001);
  some.backward_seconds.assign(graph_.size(), 0.002);
  std::vector<perfdb::LayerMeasurement> rows = layer_rows(graph_, some);
  rows.erase(rows.begin());
  rows.resize(rows.size() - 2);
  db_.record_layer_measurements(device_, model_key(graph_, {}), 8, rows);
  EXPECT_EQ(profiled_step_costs(db_, device_, graph_, {}, 8).missing,
            "the copy bandwidth to_host; layer times of " + graph_.layer(graph_.size() - 2).name +
                ", " + graph_.layer(graph_.size() - 1).name + ", the loss at batch 8");
}

// A copy bandwidth recorded before schema version 6 has no compute share:
// the costs name it missing and the next profile measures it again.
TEST(StepCostsOldRows, ACopyBandwidthWithoutItsComputeShareIsMeasuredAgain) {
  test_support::TempDir dir;
  const std::string path = dir.path("perf.db");
  auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  const Graph graph = small_graph();
  {
    perfdb::PerfDb db(path);
    profile(graph, *backend, db, db.upsert_device(perfdb_device(backend->device_info())),
            layers_only({4}));
  }
  perfdb::internal::SqlShell(path).exec("UPDATE copy_bandwidth SET compute_share = NULL");
  perfdb::PerfDb db(path);
  const perfdb::DeviceId device = db.upsert_device(perfdb_device(backend->device_info()));
  EXPECT_FALSE(holds_copy_bandwidth(db, device));
  EXPECT_EQ(profiled_step_costs(db, device, graph, {}, 4).missing,
            "the copy bandwidth to_host (its compute share: measured before schema version 6) "
            "and to_device (its compute share: measured before schema version 6)");
  EXPECT_EQ(profile(graph, *backend, db, device, layers_only({4})).copy_measured, 1);
  const StepCostsLookup lookup = profiled_step_costs(db, device, graph, {}, 4);
  ASSERT_TRUE(lookup.costs.has_value()) << lookup.missing;
  EXPECT_GE(lookup.costs->copy_compute_share, 0);
  EXPECT_LE(lookup.costs->copy_compute_share, 1);
}

}  // namespace
}  // namespace vtrain::worker
