#include "perfdb/internal/schema.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vtrain::perfdb::internal {
namespace {

// A step from version `to - 1` to `to`. Released migrations never change:
// files in the field were written by them. A new layout is a new entry.
struct Migration {
  int to;
  const char* sql;
  void (*rewrite_rows)(Connection&) = nullptr;  // after `sql`: what SQL cannot say
  void (*refuse_rows)(Connection&) = nullptr;   // before `sql`: fails on a row it cannot carry
};

void split_suffixed_keys(Connection& connection);
void refuse_unsplittable_layouts(Connection& connection);

// The comments inside CREATE TABLE are kept by SQLite, so `.schema` in the
// sqlite3 shell shows them.
constexpr Migration kMigrations[] = {
    {1, R"sql(
CREATE TABLE devices (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,                -- CPU model or GPU name
  backend TEXT NOT NULL,             -- 'cpu' or 'cuda'
  memory_bytes INTEGER NOT NULL,     -- device memory the backend serves
  library_version TEXT NOT NULL,     -- oneDNN or cuDNN version string
  threads INTEGER NOT NULL,          -- CPU threads used (1 for a GPU)
  host TEXT NOT NULL,
  UNIQUE (name, backend, library_version, threads, host)
);
CREATE TABLE kernels (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('Forward', 'BackwardData', 'BackwardFilter')),
  n INTEGER NOT NULL,                -- input batch, channels, height, width
  c INTEGER NOT NULL,
  h INTEGER NOT NULL,
  w INTEGER NOT NULL,
  k INTEGER NOT NULL,                -- filters: output channels, height, width
  r INTEGER NOT NULL,
  s INTEGER NOT NULL,
  pad_h INTEGER NOT NULL,
  pad_w INTEGER NOT NULL,
  stride_h INTEGER NOT NULL,
  stride_w INTEGER NOT NULL,
  dtype TEXT NOT NULL,
  layout TEXT NOT NULL,
  UNIQUE (kind, n, c, h, w, k, r, s, pad_h, pad_w, stride_h, stride_w, dtype, layout)
);
CREATE TABLE kernel_measurements (
  id INTEGER PRIMARY KEY,
  device_id INTEGER NOT NULL REFERENCES devices (id),
  kernel_id INTEGER NOT NULL REFERENCES kernels (id),
  algorithm TEXT NOT NULL,           -- the backend's stable algorithm name
  micro_batch INTEGER NOT NULL,      -- images per call
  time_ms REAL NOT NULL,             -- median time of one call
  workspace_bytes INTEGER NOT NULL,
  -- measured_at: Unix seconds, readable as datetime(measured_at, 'unixepoch')
  measured_at INTEGER NOT NULL,
  UNIQUE (device_id, kernel_id, algorithm, micro_batch)
);
CREATE TABLE step_measurements (
  id INTEGER PRIMARY KEY,
  device_id INTEGER NOT NULL REFERENCES devices (id),
  model TEXT NOT NULL,               -- model signature
  batch INTEGER NOT NULL,            -- per-rank batch
  memory_policy TEXT NOT NULL,
  time_ms REAL NOT NULL,             -- forward + backward
  peak_device_bytes INTEGER NOT NULL,
  measured_at INTEGER NOT NULL,      -- Unix seconds
  UNIQUE (device_id, model, batch, memory_policy)
);
)sql"},
    // Version 2: the spread of kernel times (so the optimiser can tell a
    // stable winner from noise), and the workspace plan a step ran with, which
    // becomes part of the step's key. SQLite cannot change a UNIQUE constraint
    // in place, so step_measurements is rebuilt; old rows keep their ids and
    // get the plan '' (none recorded).
    {2, R"sql(
ALTER TABLE kernel_measurements ADD COLUMN time_iqr_ms REAL;  -- NULL: written before version 2
ALTER TABLE step_measurements RENAME TO step_measurements_v1;
CREATE TABLE step_measurements (
  id INTEGER PRIMARY KEY,
  device_id INTEGER NOT NULL REFERENCES devices (id),
  model TEXT NOT NULL,               -- model signature
  batch INTEGER NOT NULL,            -- per-rank batch
  memory_policy TEXT NOT NULL,
  workspace_plan TEXT NOT NULL,      -- workspace-plan signature; '' = none
  time_ms REAL NOT NULL,             -- upload, forward, backward, update
  peak_device_bytes INTEGER NOT NULL,
  measured_at INTEGER NOT NULL,      -- Unix seconds
  UNIQUE (device_id, model, batch, memory_policy, workspace_plan)
);
INSERT INTO step_measurements
  (id, device_id, model, batch, memory_policy, workspace_plan, time_ms, peak_device_bytes, measured_at)
  SELECT id, device_id, model, batch, memory_policy, '', time_ms, peak_device_bytes, measured_at
  FROM step_measurements_v1;
DROP TABLE step_measurements_v1;
)sql"},
    // Version 3: what the timed memory simulator needs of a device (swap and
    // recompute planning): the memory stream's copy bandwidth each way, and
    // every layer's forward and backward time per model and batch.
    {3, R"sql(
CREATE TABLE copy_bandwidth (
  id INTEGER PRIMARY KEY,
  device_id INTEGER NOT NULL REFERENCES devices (id),
  direction TEXT NOT NULL CHECK (direction IN ('to_host', 'to_device')),
  bytes INTEGER NOT NULL,            -- bytes per timed copy
  bytes_per_second REAL NOT NULL,    -- median over the timed copies
  measured_at INTEGER NOT NULL,      -- Unix seconds
  UNIQUE (device_id, direction)
);
CREATE TABLE layer_measurements (
  id INTEGER PRIMARY KEY,
  device_id INTEGER NOT NULL REFERENCES devices (id),
  model TEXT NOT NULL,               -- model signature
  batch INTEGER NOT NULL,            -- per-rank batch
  layer_index INTEGER NOT NULL CHECK (layer_index >= -1),  -- graph index; -1 = the loss
  layer_name TEXT NOT NULL,
  forward_ms REAL NOT NULL,          -- median, training mode
  backward_ms REAL NOT NULL,         -- median
  measured_at INTEGER NOT NULL,      -- Unix seconds
  UNIQUE (device_id, model, batch, layer_index)
);
)sql"},
    // Version 4: where a step kept its activations (the split prices memory
    // plans; the plan shows each rank's). NULL: recorded before version 4.
    {4, R"sql(
ALTER TABLE step_measurements ADD COLUMN kept_bytes INTEGER;
ALTER TABLE step_measurements ADD COLUMN offloaded_bytes INTEGER;
ALTER TABLE step_measurements ADD COLUMN recomputed_bytes INTEGER;
)sql"},
    // Version 5: layer times measured inside training steps also hold the
    // step's time outside the calls (layer_index -2). SQLite cannot change
    // a CHECK in place: the table is rebuilt, ids and rows kept.
    {5, R"sql(
CREATE TABLE layer_measurements_v5 (
  id INTEGER PRIMARY KEY,
  device_id INTEGER NOT NULL REFERENCES devices (id),
  model TEXT NOT NULL,               -- model signature
  batch INTEGER NOT NULL,            -- per-rank batch
  layer_index INTEGER NOT NULL CHECK (layer_index >= -2),  -- graph index; -1 = the loss,
                                                           -- -2 = outside the layer calls
  layer_name TEXT NOT NULL,
  forward_ms REAL NOT NULL,          -- median, training mode
  backward_ms REAL NOT NULL,         -- median
  measured_at INTEGER NOT NULL,      -- Unix seconds
  UNIQUE (device_id, model, batch, layer_index)
);
INSERT INTO layer_measurements_v5 SELECT id, device_id, model, batch, layer_index, layer_name,
  forward_ms, backward_ms, measured_at FROM layer_measurements;
DROP TABLE layer_measurements;
ALTER TABLE layer_measurements_v5 RENAME TO layer_measurements;
)sql"},
    // Version 6: what a device's copies cost its compute stream when both
    // run (a CPU's copies take the cores its compute runs on).
    {6, R"sql(
ALTER TABLE copy_bandwidth ADD COLUMN compute_share REAL;  -- share of a copy's time the compute
                                                           -- stream loses, 0..1; NULL: measured
                                                           -- before version 6
)sql"},
    // Version 7: what a host's input delivers (images/s), keyed by what
    // the rate depends on, so that the batch split can price a rank's input.
    {7, R"sql(
CREATE TABLE input_rates (
  id INTEGER PRIMARY KEY,
  host TEXT NOT NULL,                -- the node whose cores read and decode
  workers INTEGER NOT NULL CHECK (workers >= 1),  -- decoding workers (threads)
  dataset_kind TEXT NOT NULL,        -- data.kind
  dataset TEXT NOT NULL,             -- its training file or folder; '' = generated
  channels INTEGER NOT NULL,         -- the network's input [C, H, W]
  height INTEGER NOT NULL,
  width INTEGER NOT NULL,
  transform TEXT NOT NULL,           -- the training transform's signature
  images_per_second REAL NOT NULL,   -- median over the timed batches
  host_cores INTEGER NOT NULL,       -- the host's cores when measured
  batch INTEGER NOT NULL,            -- images per timed batch
  measured_at INTEGER NOT NULL,      -- Unix seconds
  UNIQUE (host, workers, dataset_kind, dataset, channels, height, width, transform)
);
)sql"},
    // Version 8: how a model was computed gets typed columns of its own
    // (precision, layout, fuse_relu) in the two tables keyed on a model,
    // where it was "@" suffixes on the model's key; model keeps the
    // signature alone. Likewise the capacity a step's memory policy planned
    // for (policy_capacity_bytes), where it was a "@<bytes>" suffix on
    // memory_policy. The tables are rebuilt (their UNIQUE changes), ids and
    // rows kept; split_suffixed_keys then moves the suffixes into the
    // columns.
    {8, R"sql(
CREATE TABLE step_measurements_v8 (
  id INTEGER PRIMARY KEY,
  device_id INTEGER NOT NULL REFERENCES devices (id),
  model TEXT NOT NULL,               -- model signature (the architecture alone)
  precision TEXT NOT NULL,           -- train.precision: fp32, tf32, bf16, fp16
  layout TEXT NOT NULL,              -- device.layout: auto, nchw, nhwc
  fuse_relu TEXT NOT NULL,           -- conv.fuse_relu: auto, on, off
  batch INTEGER NOT NULL,            -- per-rank batch
  memory_policy TEXT NOT NULL,       -- memory.policy's name
  policy_capacity_bytes INTEGER NOT NULL CHECK (policy_capacity_bytes >= 0),
                                     -- the device capacity the policy planned for where its
                                     -- plan depends on it (dyn, auto, ...); 0 for the others
  workspace_plan TEXT NOT NULL,
  time_ms REAL NOT NULL, peak_device_bytes INTEGER NOT NULL, measured_at INTEGER NOT NULL,
  kept_bytes INTEGER, offloaded_bytes INTEGER,
  recomputed_bytes INTEGER,          -- workspace_plan to recomputed_bytes as in version 4
                                     -- (perfdb/README.md)
  UNIQUE (device_id, model, precision, layout, fuse_relu, batch, memory_policy,
          policy_capacity_bytes, workspace_plan)
);
INSERT INTO step_measurements_v8 SELECT id, device_id, model, 'fp32', 'auto', 'auto', batch,
  memory_policy, 0, workspace_plan, time_ms, peak_device_bytes, measured_at, kept_bytes,
  offloaded_bytes, recomputed_bytes FROM step_measurements;
DROP TABLE step_measurements;
ALTER TABLE step_measurements_v8 RENAME TO step_measurements;
CREATE TABLE layer_measurements_v8 (
  id INTEGER PRIMARY KEY,
  device_id INTEGER NOT NULL REFERENCES devices (id),
  model TEXT NOT NULL, precision TEXT NOT NULL, layout TEXT NOT NULL, fuse_relu TEXT NOT NULL,
                                     -- the model and how it was computed, as in step_measurements
  batch INTEGER NOT NULL, layer_index INTEGER NOT NULL CHECK (layer_index >= -2),
  layer_name TEXT NOT NULL, forward_ms REAL NOT NULL, backward_ms REAL NOT NULL,
  measured_at INTEGER NOT NULL,      -- batch to measured_at as in version 5 (perfdb/README.md)
  UNIQUE (device_id, model, precision, layout, fuse_relu, batch, layer_index)
);
INSERT INTO layer_measurements_v8 SELECT id, device_id, model, 'fp32', 'auto', 'auto', batch,
  layer_index, layer_name, forward_ms, backward_ms, measured_at FROM layer_measurements;
DROP TABLE layer_measurements;
ALTER TABLE layer_measurements_v8 RENAME TO layer_measurements;
)sql", split_suffixed_keys},
    // Version 9: a kernel's activation layouts get a column each
    // (input_layout, output_layout), where layout held both as one text
    // "<x>-><y>", and its channel groups one (groups; the rows before were
    // all dense convolutions: 1). kernels is rebuilt (its UNIQUE changes), ids and rows
    // kept; so is kernel_measurements, whose rows reference it, because a
    // table that rows reference cannot be dropped while foreign keys are
    // checked. refuse_unsplittable_layouts first refuses a layout vtrain
    // never wrote.
    {9, R"sql(
CREATE TABLE kernels_v9 (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('Forward', 'BackwardData', 'BackwardFilter')),
  n INTEGER NOT NULL, c INTEGER NOT NULL, h INTEGER NOT NULL, w INTEGER NOT NULL,
  k INTEGER NOT NULL, r INTEGER NOT NULL, s INTEGER NOT NULL,
  pad_h INTEGER NOT NULL, pad_w INTEGER NOT NULL, stride_h INTEGER NOT NULL, stride_w INTEGER NOT NULL,
  groups INTEGER NOT NULL DEFAULT 1 CHECK (groups >= 1),  -- channel groups; groups = c: depthwise
  dtype TEXT NOT NULL,               -- the others as in version 1 (perfdb/README.md)
  input_layout TEXT NOT NULL,        -- the layout of the convolution's input x: plain, nChw8c,
                                     -- nChw16c or nhwc (worker/device/tensor.h)
  output_layout TEXT NOT NULL,       -- the layout of its output y
  UNIQUE (kind, n, c, h, w, k, r, s, pad_h, pad_w, stride_h, stride_w, groups, dtype,
          input_layout, output_layout)
);
INSERT INTO kernels_v9 SELECT id, kind, n, c, h, w, k, r, s, pad_h, pad_w, stride_h, stride_w, 1, dtype,
  substr(layout, 1, instr(layout, '->') - 1), substr(layout, instr(layout, '->') + 2) FROM kernels;
CREATE TABLE kernel_measurements_v9 (
  id INTEGER PRIMARY KEY,
  device_id INTEGER NOT NULL REFERENCES devices (id),
  kernel_id INTEGER NOT NULL REFERENCES kernels_v9 (id),
  algorithm TEXT NOT NULL, micro_batch INTEGER NOT NULL, time_ms REAL NOT NULL,
  workspace_bytes INTEGER NOT NULL, measured_at INTEGER NOT NULL,
  time_iqr_ms REAL,                  -- algorithm to time_iqr_ms as in version 2 (perfdb/README.md)
  UNIQUE (device_id, kernel_id, algorithm, micro_batch)
);
INSERT INTO kernel_measurements_v9 SELECT id, device_id, kernel_id, algorithm, micro_batch, time_ms,
  workspace_bytes, measured_at, time_iqr_ms FROM kernel_measurements;
DROP TABLE kernel_measurements;
DROP TABLE kernels;
ALTER TABLE kernels_v9 RENAME TO kernels;
ALTER TABLE kernel_measurements_v9 RENAME TO kernel_measurements;
)sql", nullptr, refuse_unsplittable_layouts},
};

static_assert(std::size(kMigrations) == static_cast<size_t>(kSchemaVersion),
              "one migration per schema version");

[[noreturn]] void not_valid(const Connection& connection, const std::string& why) {
  throw PerfDbError(connection.path() + " is not a valid vtrain perf DB: " + why);
}

// Version 8's rows: a model key "<signature>@bf16@nhwc@fuse_relu=on" (as
// versions up to 7 wrote it) becomes model "<signature>" with precision
// bf16, layout nhwc, fuse_relu on. A suffix vtrain never wrote fails the
// upgrade naming the table, row and key, and the file is left as it was.
void split_model_keys(Connection& connection) {
  for (const char* table : {"step_measurements", "layer_measurements"}) {
    const std::string name(table);
    // Read first, then write: no row changes under a running scan.
    std::vector<std::pair<int64_t, std::string>> suffixed;
    Statement select(connection, "SELECT id, model FROM " + name + " WHERE instr(model, '@') > 0");
    while (select.step()) suffixed.emplace_back(select.column_int(0), select.column_text(1));
    Statement update(connection, "UPDATE " + name +
                                     " SET model = ?2, precision = ?3, layout = ?4, "
                                     "fuse_relu = ?5 WHERE id = ?1");
    for (const auto& [id, key] : suffixed) {
      common::SuffixedModelKey parsed;
      try {
        parsed = common::parse_suffixed_model_key(key);
      } catch (const std::invalid_argument& e) {
        not_valid(connection, name + " row " + std::to_string(id) + ": model '" + key +
                                  "': " + e.what());
      }
      // Version 8's columns, by name: bind_model binds today's, which a
      // later setting extends.
      const common::ComputeSettings& s = parsed.settings;
      StatementUse use(update);
      update.bind(1, id);
      update.bind(2, std::string_view(parsed.signature));
      update.bind(3, std::string_view(common::precision_name(s.precision)));
      update.bind(4, std::string_view(common::name_of(common::kLayoutChoiceNames, s.layout)));
      update.bind(5, std::string_view(common::name_of(common::kAutoOnOffNames, s.fuse_relu)));
      update.run();
    }
  }
}

// Version 8's steps: a memory_policy "auto@8589934592" (as versions up to 7
// wrote a policy whose plan depends on the capacity) becomes memory_policy
// "auto" with policy_capacity_bytes 8589934592. A suffix that is not a
// positive byte count fails the upgrade naming the row and the value.
void split_policy_capacities(Connection& connection) {
  std::vector<std::pair<int64_t, std::string>> suffixed;
  Statement select(connection,
                   "SELECT id, memory_policy FROM step_measurements WHERE instr(memory_policy, '@') > 0");
  while (select.step()) suffixed.emplace_back(select.column_int(0), select.column_text(1));
  Statement update(connection,
                   "UPDATE step_measurements SET memory_policy = ?2, policy_capacity_bytes = ?3 "
                   "WHERE id = ?1");
  for (const auto& [id, key] : suffixed) {
    const size_t at = key.find('@');
    const std::string_view digits = std::string_view(key).substr(at + 1);
    int64_t capacity = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), capacity);
    if (at == 0 || error != std::errc() || end != digits.data() + digits.size() || capacity < 1) {
      not_valid(connection, "step_measurements row " + std::to_string(id) + ": memory_policy '" + key +
                                "': expected <policy>@<capacity bytes>, a positive integer");
    }
    StatementUse use(update);
    update.bind(1, id);
    update.bind(2, std::string_view(key).substr(0, at));
    update.bind(3, capacity);
    update.run();
  }
}

void split_suffixed_keys(Connection& connection) {
  split_model_keys(connection);
  split_policy_capacities(connection);
}

// Version 8's kernels: layout "<x>-><y>", each side a name that
// worker::layout_name gave up to version 8. Anything else (another text
// written through the API, never by the profiler) stops the upgrade
// naming the row and the value.
void refuse_unsplittable_layouts(Connection& connection) {
  constexpr std::string_view kWritten[] = {"plain", "nChw8c", "nChw16c", "nhwc"};
  auto written = [&](std::string_view name) {
    return std::find(std::begin(kWritten), std::end(kWritten), name) != std::end(kWritten);
  };
  Statement select(connection, "SELECT id, layout FROM kernels ORDER BY id");
  while (select.step()) {
    const std::string layout = select.column_text(1);
    const size_t arrow = layout.find("->");
    if (arrow == std::string::npos || !written(std::string_view(layout).substr(0, arrow)) ||
        !written(std::string_view(layout).substr(arrow + 2))) {
      not_valid(connection, "kernels row " + std::to_string(select.column_int(0)) + ": layout '" +
                                layout + "': expected <input layout>-><output layout>, each one of "
                                "plain, nChw8c, nChw16c, nhwc");
    }
  }
}

}  // namespace

std::string model_columns() {
  std::string columns = "model";
  for (const common::Setting& s : common::kSettings) columns += std::string(", ") + s.name;
  return columns;
}

std::string model_match(int first) {
  std::string match = "model = ?" + std::to_string(first);
  for (const common::Setting& s : common::kSettings) {
    match += std::string(" AND ") + s.name + " = ?" + std::to_string(++first);
  }
  return match;
}

std::string parameters(int first, int count) {
  std::string list;
  for (int i = 0; i < count; ++i) list += (i == 0 ? "?" : ", ?") + std::to_string(first + i);
  return list;
}

std::optional<int> inspect_schema(Connection& connection, bool quick_check) {
  try {
    if (quick_check) {
      Statement check(connection, "PRAGMA quick_check");
      std::vector<std::string> problems;
      while (check.step()) problems.push_back(check.column_text(0));
      if (problems.size() != 1 || problems[0] != "ok") {
        // quick_check lists up to 100 problems; the first few say enough.
        std::string why = "quick_check found damage:";
        for (size_t i = 0; i < problems.size() && i < 3; ++i) why += " " + problems[i] + ";";
        if (problems.size() > 3) why += " ...";
        not_valid(connection, why);
      }
    }
    Statement ours(connection,
                   "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'");
    ours.step();
    if (ours.column_int(0) == 0) {
      Statement objects(connection, "SELECT count(*) FROM sqlite_master");
      objects.step();
      if (objects.column_int(0) == 0) return std::nullopt;
      not_valid(connection, "an SQLite database without a schema_version table (not created by vtrain)");
    }
    Statement version(connection, "SELECT version, typeof(version) FROM schema_version");
    std::vector<std::pair<int64_t, std::string>> rows;
    while (version.step()) rows.emplace_back(version.column_int(0), version.column_text(1));
    if (rows.size() != 1 || rows[0].second != "integer" || rows[0].first < 1) {
      not_valid(connection, "schema_version must hold one positive integer, found " +
                                std::to_string(rows.size()) + " row(s)");
    }
    return static_cast<int>(rows[0].first);
  } catch (const SqliteError& e) {
    if (e.corrupt()) not_valid(connection, e.detail());
    throw;
  }
}

void check_schema_version(const Connection& connection, int version, bool allow_older) {
  if (version > kSchemaVersion) {
    throw PerfDbError("perf DB " + connection.path() + " has schema version " + std::to_string(version) +
                      "; this vtrain knows up to " + std::to_string(kSchemaVersion));
  }
  if (version < kSchemaVersion && !allow_older) {
    // Versions only go up, so this file was replaced after it was opened.
    throw PerfDbError("perf DB " + connection.path() + " has schema version " + std::to_string(version) +
                      " but was opened at version " + std::to_string(kSchemaVersion) +
                      " (was the file replaced?); open it again");
  }
}

void migrate(Connection& connection, std::optional<int> version) {
  int at = 0;
  if (version) {
    at = *version;
  } else {
    // Version 0, an empty schema, exists only inside this transaction.
    connection.exec(
        "CREATE TABLE schema_version (version INTEGER NOT NULL);"
        "INSERT INTO schema_version (version) VALUES (0);");
  }
  for (const Migration& migration : kMigrations) {
    if (migration.to <= at) continue;
    if (migration.refuse_rows) migration.refuse_rows(connection);
    connection.exec(migration.sql);
    if (migration.rewrite_rows) migration.rewrite_rows(connection);
    Statement set(connection, "UPDATE schema_version SET version = ?1");
    set.bind(1, int64_t{migration.to});
    set.run();
  }
}

}  // namespace vtrain::perfdb::internal
