#include "worker/profile/step_costs.h"

#include <algorithm>
#include <map>

#include "common/text.h"
#include "worker/engine/layer_timing.h"

namespace vtrain::worker {
namespace {

using perfdb::CopyDirection;

constexpr CopyDirection kDirections[] = {CopyDirection::kToHost, CopyDirection::kToDevice};

// "conv2, relu2" (the first few of many, then how many in all).
std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  if (names.size() <= kShown) return common::join(names);
  return common::join(std::vector<std::string>(names.begin(), names.begin() + kShown)) + ", ... (" +
         std::to_string(names.size()) + " in all)";
}

// The names of `graph`'s layers (and the loss) without a row, in graph order.
std::vector<std::string> missing_layers(const Graph& graph,
                                        const std::map<int64_t, perfdb::LayerMeasurement>& rows) {
  std::vector<std::string> missing;
  for (int i = 0; i < graph.size(); ++i) {
    if (!rows.contains(i)) missing.push_back(graph.layer(i).name);
  }
  if (!rows.contains(perfdb::kLossLayer)) missing.push_back("the loss");
  return missing;
}

std::map<int64_t, perfdb::LayerMeasurement> rows_by_layer(perfdb::PerfDb& db,
                                                          perfdb::DeviceId device,
                                                          const Graph& graph,
                                                          const ComputeSettings& settings,
                                                          int64_t batch) {
  std::map<int64_t, perfdb::LayerMeasurement> rows;
  for (perfdb::LayerMeasurement& row :
       db.layer_measurements(device, model_key(graph, settings), batch)) {
    rows.emplace(row.layer_index, std::move(row));
  }
  return rows;
}

}  // namespace

perfdb::ModelKey model_key(const Graph& graph, const ComputeSettings& settings) {
  return {graph.signature(), settings};
}

std::vector<perfdb::LayerMeasurement> layer_rows(const Graph& graph,
                                                 const memory::StepCosts& costs) {
  std::vector<perfdb::LayerMeasurement> rows;
  rows.push_back({perfdb::kLossLayer, "loss", costs.loss_seconds * 1e3, 0, 0});
  if (costs.other_seconds > 0) {
    rows.push_back({perfdb::kOutsideCallsLayer, "outside layer calls", costs.other_seconds * 1e3,
                    0, 0});
  }
  for (int i = 0; i < graph.size(); ++i) {
    rows.push_back({i, graph.layer(i).name, costs.forward_seconds.at(i) * 1e3,
                    costs.backward_seconds.at(i) * 1e3, 0});
  }
  return rows;
}

StepCostsLookup profiled_step_costs(perfdb::PerfDb& db, perfdb::DeviceId device,
                                    const Graph& graph, const ComputeSettings& settings,
                                    int64_t batch) {
  memory::StepCosts costs;
  std::vector<std::string> missing_copies;
  for (CopyDirection direction : kDirections) {
    const auto found = db.find_copy_bandwidth(device, direction);
    if (!found || !found->compute_share) {
      std::string what = perfdb::copy_direction_name(direction);
      if (found) what += " (its compute share: measured before schema version 6)";
      missing_copies.push_back(std::move(what));
      continue;
    }
    (direction == CopyDirection::kToHost ? costs.to_host_bytes_per_second
                                         : costs.to_device_bytes_per_second) =
        found->bytes_per_second;
    // One share for both ways: the larger, should two measurements differ.
    costs.copy_compute_share = std::max(costs.copy_compute_share, *found->compute_share);
  }
  const auto rows = rows_by_layer(db, device, graph, settings, batch);
  const std::vector<std::string> missing = missing_layers(graph, rows);
  StepCostsLookup lookup;
  if (!missing_copies.empty()) {
    lookup.missing = "the copy bandwidth " + common::join(missing_copies, " and ");
  }
  if (!missing.empty()) {
    if (!lookup.missing.empty()) lookup.missing += "; ";
    lookup.missing += "layer times of " + name_list(missing) + " at batch " +
                      std::to_string(batch);
  }
  if (!lookup.missing.empty()) return lookup;
  for (int i = 0; i < graph.size(); ++i) {
    costs.forward_seconds.push_back(rows.at(i).forward_ms * 1e-3);
    costs.backward_seconds.push_back(rows.at(i).backward_ms * 1e-3);
  }
  costs.loss_seconds = rows.at(perfdb::kLossLayer).forward_ms * 1e-3;
  if (const auto other = rows.find(perfdb::kOutsideCallsLayer); other != rows.end()) {
    costs.other_seconds = other->second.forward_ms * 1e-3;
  }
  lookup.costs = std::move(costs);
  return lookup;
}

bool holds_copy_bandwidth(perfdb::PerfDb& db, perfdb::DeviceId device) {
  // Rows from before schema version 6 lack the compute share: measured again.
  return std::all_of(std::begin(kDirections), std::end(kDirections), [&](CopyDirection d) {
    const auto found = db.find_copy_bandwidth(device, d);
    return found && found->compute_share;
  });
}

void record_copy_bandwidth(Backend& backend, perfdb::PerfDb& db, perfdb::DeviceId device,
                           const KernelTimingOptions& timing) {
  const CopyBandwidth b = measure_copy_bandwidth(backend, size_t{64} << 20,
                                                 std::max(timing.repeats, 1));
  const perfdb::CopyBandwidthMeasurement rows[] = {
      {CopyDirection::kToHost, b.bytes, b.to_host_bytes_per_second, 0, b.compute_share},
      {CopyDirection::kToDevice, b.bytes, b.to_device_bytes_per_second, 0, b.compute_share}};
  db.record_copy_bandwidth(device, rows);
}

bool holds_layer_costs(perfdb::PerfDb& db, perfdb::DeviceId device, const Graph& graph,
                       const ComputeSettings& settings, int64_t batch) {
  return missing_layers(graph, rows_by_layer(db, device, graph, settings, batch)).empty();
}

void record_layer_costs(const Graph& graph, const ComputeSettings& settings, Backend& backend,
                        perfdb::PerfDb& db, perfdb::DeviceId device, int64_t batch,
                        const KernelTimingOptions& timing) {
  const memory::StepCosts costs =
      measure_graph_step_costs(graph, settings, backend, batch, {}, "auto", timing);
  db.record_layer_measurements(device, model_key(graph, settings), batch,
                               layer_rows(graph, costs));
}

}  // namespace vtrain::worker
