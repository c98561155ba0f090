#include "perfdb/perf_db.h"

#include <algorithm>
#include <ostream>
#include <string>
#include <utility>

#include "perfdb/internal/perf_db_impl.h"
#include "perfdb/internal/table_export.h"

namespace vtrain::perfdb {

using internal::kMaxStoredUnsigned;
using internal::kModelParameters;
using internal::model_columns;
using internal::model_match;
using internal::parameters;
using internal::unix_now;
using internal::valid_time;

const char* table_name(Table table) {
  switch (table) {
    case Table::kDevices: return "devices";
    case Table::kKernels: return "kernels";
    case Table::kKernelMeasurements: return "kernel_measurements";
    case Table::kStepMeasurements: return "step_measurements";
    case Table::kCopyBandwidth: return "copy_bandwidth";
    case Table::kLayerMeasurements: return "layer_measurements";
    case Table::kInputRates: return "input_rates";
  }
  return "?";
}

std::optional<Table> table_from_name(std::string_view name) {
  for (Table table : kTables) {
    if (name == table_name(table)) return table;
  }
  return std::nullopt;
}

std::string table_names() {
  std::string out;
  for (Table t : kTables) out += std::string(out.empty() ? "" : ", ") + table_name(t);
  return out;
}

common::DeviceLabel device_label(const Device& device) {
  if (device.backend != "cpu") return {device.name, std::nullopt};
  return {device.name, device.threads};
}

namespace {

constexpr const char* kKernelWhere =
    "kind = ?1 AND n = ?2 AND c = ?3 AND h = ?4 AND w = ?5 AND k = ?6 AND r = ?7 AND s = ?8 AND "
    "pad_h = ?9 AND pad_w = ?10 AND stride_h = ?11 AND stride_w = ?12 AND groups = ?13 AND "
    "dtype = ?14 AND input_layout = ?15 AND output_layout = ?16";

// Binds a kernel signature to parameters ?1..?16, in the order of the
// kernels table (every kernel statement below uses that order).
void bind_kernel(Statement& statement, const KernelSignature& kernel) {
  statement.bind(1, std::string_view(common::conv_kind_name(kernel.kind)));
  const int64_t numbers[] = {kernel.n,     kernel.c,        kernel.h,        kernel.w,
                             kernel.k,     kernel.r,        kernel.s,        kernel.pad_h,
                             kernel.pad_w, kernel.stride_h, kernel.stride_w, kernel.groups};
  for (int i = 0; i < 12; ++i) statement.bind(2 + i, numbers[i]);
  statement.bind(14, std::string_view(kernel.dtype));
  statement.bind(15, std::string_view(kernel.input_layout));
  statement.bind(16, std::string_view(kernel.output_layout));
}

KernelMeasurement read_kernel_measurement(const Statement& row) {
  KernelMeasurement m;
  m.algorithm = row.column_text(0);
  m.micro_batch = row.column_int(1);
  m.time_ms = row.column_double(2);
  m.time_iqr_ms = row.column_optional_double(3);
  m.workspace_bytes = static_cast<uint64_t>(row.column_int(4));
  m.measured_at = row.column_int(5);
  return m;
}

DeviceRecord read_device(const Statement& row) {
  DeviceRecord record;
  record.id.value = row.column_int(0);
  record.device.name = row.column_text(1);
  record.device.backend = row.column_text(2);
  record.device.memory_bytes = static_cast<uint64_t>(row.column_int(3));
  record.device.library_version = row.column_text(4);
  record.device.threads = static_cast<int>(row.column_int(5));
  record.device.host = row.column_text(6);
  return record;
}

// Field checks before anything is written; each returns a complaint or "".
std::string complaint_about(const KernelSignature& k) {
  const std::pair<const char*, int64_t> at_least_one[] = {
      {"n", k.n}, {"c", k.c}, {"h", k.h}, {"w", k.w}, {"k", k.k},
      {"r", k.r}, {"s", k.s}, {"stride_h", k.stride_h}, {"stride_w", k.stride_w},
      {"groups", k.groups}};
  for (const auto& [name, value] : at_least_one) {
    if (value < 1) return std::string("kernel.") + name + " must be >= 1, got " + std::to_string(value);
  }
  if (k.pad_h < 0 || k.pad_w < 0) return "kernel padding must be >= 0";
  if (k.dtype.empty() || k.input_layout.empty() || k.output_layout.empty()) {
    return "kernel.dtype, kernel.input_layout and kernel.output_layout must not be empty";
  }
  return {};
}

std::string complaint_about(const KernelSample& sample) {
  if (std::string kernel = complaint_about(sample.kernel); !kernel.empty()) return kernel;
  const KernelMeasurement& m = sample.measurement;
  if (m.algorithm.empty()) return "algorithm must not be empty";
  if (m.micro_batch < 1 || m.micro_batch > sample.kernel.n) {
    return "micro_batch must be in 1.." + std::to_string(sample.kernel.n) + " (the kernel's n), got " +
           std::to_string(m.micro_batch);
  }
  if (!valid_time(m.time_ms)) return "time_ms must be finite and >= 0, got " + std::to_string(m.time_ms);
  if (m.time_iqr_ms && !valid_time(*m.time_iqr_ms)) return "time_iqr_ms must be finite and >= 0";
  if (m.workspace_bytes > kMaxStoredUnsigned) return "workspace_bytes does not fit a 64-bit signed integer";
  if (m.measured_at < 0) return "measured_at must be >= 0";
  return {};
}

std::string complaint_about(const StepMeasurement& step) {
  if (step.model.signature.empty()) return "model must not be empty";
  if (step.batch < 1) return "batch must be >= 1, got " + std::to_string(step.batch);
  if (step.memory_policy.empty()) return "memory_policy must not be empty";
  if (step.memory_policy.find('@') != std::string::npos) {
    return "memory_policy must be the policy's name alone (the capacity goes in "
           "policy_capacity_bytes), got '" + step.memory_policy + "'";
  }
  if (step.policy_capacity_bytes > kMaxStoredUnsigned) {
    return "policy_capacity_bytes does not fit a 64-bit signed integer";
  }
  if (!valid_time(step.time_ms)) {
    return "time_ms must be finite and >= 0, got " + std::to_string(step.time_ms);
  }
  if (step.peak_device_bytes > kMaxStoredUnsigned) {
    return "peak_device_bytes does not fit a 64-bit signed integer";
  }
  if (step.measured_at < 0) return "measured_at must be >= 0";
  if (const auto& a = step.activations;
      a && std::max({a->kept, a->offloaded, a->recomputed}) > kMaxStoredUnsigned) {
    return "activation bytes do not fit a 64-bit signed integer";
  }
  return {};
}

}  // namespace

int64_t PerfDb::Impl::upsert_kernel(const KernelSignature& kernel) {
  {
    StatementUse insert(cached(
        "INSERT INTO kernels (kind, n, c, h, w, k, r, s, pad_h, pad_w, stride_h, stride_w, groups, "
        "dtype, input_layout, output_layout) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16) "
        "ON CONFLICT DO NOTHING"));
    bind_kernel(*insert, kernel);
    insert->run();
  }
  static const std::string kSelect = std::string("SELECT id FROM kernels WHERE ") + kKernelWhere;
  StatementUse select(cached(kSelect.c_str()));
  bind_kernel(*select, kernel);
  if (!select->step()) invalid("internal error: a kernel vanished right after it was inserted");
  return select->column_int(0);
}

// ------------------------------------------------------------------ PerfDb

PerfDb::PerfDb(const std::string& path, const PerfDbOptions& options)
    : impl_(std::make_unique<Impl>(path, options)) {}
PerfDb::~PerfDb() = default;
PerfDb::PerfDb(PerfDb&&) noexcept = default;
PerfDb& PerfDb::operator=(PerfDb&&) noexcept = default;

const std::string& PerfDb::path() const { return impl_->path(); }

namespace {

// A device's identity (everything but memory_bytes) as ?1..?5.
void bind_identity(Statement& s, const Device& device) {
  s.bind(1, std::string_view(device.name));
  s.bind(2, std::string_view(device.backend));
  s.bind(3, std::string_view(device.library_version));
  s.bind(4, int64_t{device.threads});
  s.bind(5, std::string_view(device.host));
}

constexpr const char* kSelectDeviceId =
    "SELECT id FROM devices WHERE name = ?1 AND backend = ?2 AND library_version = ?3 AND "
    "threads = ?4 AND host = ?5";

}  // namespace

DeviceId PerfDb::upsert_device(const Device& device) {
  impl_->begin("upsert device");
  if (device.name.empty() || device.backend.empty()) {
    impl_->invalid("device name and backend must not be empty");
  }
  if (device.memory_bytes > kMaxStoredUnsigned) {
    impl_->invalid("memory_bytes does not fit a 64-bit signed integer");
  }
  if (device.threads < 1) impl_->invalid("threads must be >= 1, got " + std::to_string(device.threads));
  return impl_->transact(Txn::kWrite, [&] {
    {
      StatementUse insert(impl_->cached(
          "INSERT INTO devices (name, backend, library_version, threads, host, memory_bytes) "
          "VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
          "ON CONFLICT (name, backend, library_version, threads, host) "
          "DO UPDATE SET memory_bytes = excluded.memory_bytes"));
      bind_identity(*insert, device);
      insert->bind(6, static_cast<int64_t>(device.memory_bytes));
      insert->run();
    }
    // last_insert_rowid is not set when the upsert took the update path.
    StatementUse select(impl_->cached(kSelectDeviceId));
    bind_identity(*select, device);
    if (!select->step()) impl_->invalid("internal error: the device vanished right after it was inserted");
    return DeviceId{select->column_int(0)};
  });
}

std::optional<DeviceId> PerfDb::find_device(const Device& device) {
  impl_->begin("find device");
  return impl_->transact(Txn::kRead, [&]() -> std::optional<DeviceId> {
    StatementUse select(impl_->cached(kSelectDeviceId));
    bind_identity(*select, device);
    if (!select->step()) return std::nullopt;
    return DeviceId{select->column_int(0)};
  });
}

void PerfDb::record_kernel_measurements(DeviceId device, std::span<const KernelSample> samples) {
  impl_->begin("record kernel measurements");
  for (size_t i = 0; i < samples.size(); ++i) {
    if (std::string why = complaint_about(samples[i]); !why.empty()) {
      impl_->invalid("sample " + std::to_string(i) + ": " + why);
    }
  }
  if (samples.empty()) return;
  const int64_t now = unix_now();
  impl_->transact(Txn::kWrite, [&] {
    impl_->require_device(device);
    const KernelSignature* previous = nullptr;
    int64_t kernel_id = 0;
    for (const KernelSample& sample : samples) {
      // Benchmarks record many algorithms and micro-batches of one kernel in
      // a row; look its id up once.
      if (previous == nullptr || !(*previous == sample.kernel)) {
        kernel_id = impl_->upsert_kernel(sample.kernel);
      }
      previous = &sample.kernel;
      const KernelMeasurement& m = sample.measurement;
      StatementUse insert(impl_->cached(
          "INSERT INTO kernel_measurements (device_id, kernel_id, algorithm, micro_batch, time_ms, "
          "time_iqr_ms, workspace_bytes, measured_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) "
          "ON CONFLICT (device_id, kernel_id, algorithm, micro_batch) DO UPDATE SET "
          "time_ms = excluded.time_ms, time_iqr_ms = excluded.time_iqr_ms, "
          "workspace_bytes = excluded.workspace_bytes, measured_at = excluded.measured_at"));
      insert->bind(1, device.value);
      insert->bind(2, kernel_id);
      insert->bind(3, std::string_view(m.algorithm));
      insert->bind(4, m.micro_batch);
      insert->bind(5, m.time_ms);
      insert->bind(6, m.time_iqr_ms);
      insert->bind(7, static_cast<int64_t>(m.workspace_bytes));
      insert->bind(8, m.measured_at != 0 ? m.measured_at : now);
      insert->run();
    }
  });
}

void PerfDb::record_step_measurements(DeviceId device, std::span<const StepMeasurement> steps) {
  impl_->begin("record step measurements");
  for (size_t i = 0; i < steps.size(); ++i) {
    if (std::string why = complaint_about(steps[i]); !why.empty()) {
      impl_->invalid("step " + std::to_string(i) + ": " + why);
    }
  }
  if (steps.empty()) return;
  const int64_t now = unix_now();
  impl_->transact(Txn::kWrite, [&] {
    impl_->require_device(device);
    for (const StepMeasurement& step : steps) {
      // The model's columns come last: their count is the settings'.
      static const std::string kSql =
          "INSERT INTO step_measurements (device_id, batch, memory_policy, workspace_plan, time_ms, "
          "peak_device_bytes, measured_at, kept_bytes, offloaded_bytes, recomputed_bytes, "
          "policy_capacity_bytes, " + model_columns() + ") VALUES (" +
          parameters(1, 11 + kModelParameters) + ") ON CONFLICT (device_id, " + model_columns() +
          ", batch, memory_policy, policy_capacity_bytes, workspace_plan) DO UPDATE SET "
          "time_ms = excluded.time_ms, peak_device_bytes = excluded.peak_device_bytes, "
          "measured_at = excluded.measured_at, kept_bytes = excluded.kept_bytes, "
          "offloaded_bytes = excluded.offloaded_bytes, "
          "recomputed_bytes = excluded.recomputed_bytes";
      StatementUse insert(impl_->cached(kSql.c_str()));
      insert->bind(1, device.value);
      insert->bind(2, step.batch);
      insert->bind(3, std::string_view(step.memory_policy));
      insert->bind(4, std::string_view(step.workspace_plan));
      insert->bind(5, step.time_ms);
      insert->bind(6, static_cast<int64_t>(step.peak_device_bytes));
      insert->bind(7, step.measured_at != 0 ? step.measured_at : now);
      if (const auto& a = step.activations) {
        insert->bind(8, static_cast<int64_t>(a->kept));
        insert->bind(9, static_cast<int64_t>(a->offloaded));
        insert->bind(10, static_cast<int64_t>(a->recomputed));
      } else {
        for (int column : {8, 9, 10}) insert->bind(column, std::optional<double>());
      }
      insert->bind(11, static_cast<int64_t>(step.policy_capacity_bytes));
      bind_model(*insert, 12, step.model);
      insert->run();
    }
  });
}

std::optional<KernelMeasurement> PerfDb::find_kernel_measurement(DeviceId device,
                                                                 const KernelSignature& kernel,
                                                                 std::string_view algorithm,
                                                                 int64_t micro_batch) {
  impl_->begin("find kernel measurement");
  return impl_->transact(Txn::kRead, [&]() -> std::optional<KernelMeasurement> {
    static const std::string kSql =
        std::string(
            "SELECT algorithm, micro_batch, time_ms, time_iqr_ms, workspace_bytes, measured_at "
            "FROM kernel_measurements WHERE device_id = ?17 AND algorithm = ?18 AND micro_batch = ?19 AND "
            "kernel_id = (SELECT id FROM kernels WHERE ") +
        kKernelWhere + ")";
    StatementUse select(impl_->cached(kSql.c_str()));
    bind_kernel(*select, kernel);
    select->bind(17, device.value);
    select->bind(18, algorithm);
    select->bind(19, micro_batch);
    if (!select->step()) return std::nullopt;
    return read_kernel_measurement(*select);
  });
}

std::vector<KernelMeasurement> PerfDb::kernel_measurements(DeviceId device, const KernelSignature& kernel) {
  impl_->begin("list kernel measurements");
  return impl_->transact(Txn::kRead, [&] {
    static const std::string kSql =
        std::string(
            "SELECT algorithm, micro_batch, time_ms, time_iqr_ms, workspace_bytes, measured_at "
            "FROM kernel_measurements WHERE device_id = ?17 AND kernel_id = (SELECT id FROM kernels WHERE ") +
        kKernelWhere + ") ORDER BY algorithm, micro_batch";
    StatementUse select(impl_->cached(kSql.c_str()));
    bind_kernel(*select, kernel);
    select->bind(17, device.value);
    std::vector<KernelMeasurement> found;
    while (select->step()) found.push_back(read_kernel_measurement(*select));
    return found;
  });
}

std::string describe_model(const ModelKey& model) {
  return model.signature + " (" + common::describe(model.settings) + ")";
}

std::vector<StepMeasurement> PerfDb::step_measurements(DeviceId device, const ModelKey& model,
                                                       std::string_view memory_policy,
                                                       uint64_t policy_capacity_bytes) {
  impl_->begin("list step measurements");
  return impl_->transact(Txn::kRead, [&] {
    static const std::string kSql =
        "SELECT batch, memory_policy, workspace_plan, time_ms, peak_device_bytes, measured_at, "
        "kept_bytes, offloaded_bytes, recomputed_bytes FROM step_measurements WHERE device_id = ?1 "
        "AND memory_policy = ?2 AND policy_capacity_bytes = ?3 AND " + model_match(4) +
        " ORDER BY batch, workspace_plan";
    StatementUse select(impl_->cached(kSql.c_str()));
    select->bind(1, device.value);
    select->bind(2, memory_policy);
    select->bind(3, static_cast<int64_t>(policy_capacity_bytes));
    bind_model(*select, 4, model);
    std::vector<StepMeasurement> found;
    while (select->step()) {
      StepMeasurement& step = found.emplace_back();
      step.model = model;
      step.batch = select->column_int(0);
      step.memory_policy = select->column_text(1);
      step.policy_capacity_bytes = policy_capacity_bytes;
      step.workspace_plan = select->column_text(2);
      step.time_ms = select->column_double(3);
      step.peak_device_bytes = static_cast<uint64_t>(select->column_int(4));
      step.measured_at = select->column_int(5);
      if (select->column_type(6) != SQLITE_NULL) {
        step.activations = common::ActivationBytes{static_cast<uint64_t>(select->column_int(6)),
                                               static_cast<uint64_t>(select->column_int(7)),
                                               static_cast<uint64_t>(select->column_int(8))};
      }
    }
    return found;
  });
}

std::vector<DeviceRecord> PerfDb::devices() {
  impl_->begin("list devices");
  return impl_->transact(Txn::kRead, [&] {
    StatementUse select(impl_->cached(
        "SELECT id, name, backend, memory_bytes, library_version, threads, host FROM devices ORDER BY id"));
    std::vector<DeviceRecord> found;
    while (select->step()) found.push_back(read_device(*select));
    return found;
  });
}

std::vector<DeviceRecord> PerfDb::find_devices(std::string_view name) {
  impl_->begin("find devices");
  return impl_->transact(Txn::kRead, [&] {
    StatementUse select(impl_->cached(
        "SELECT id, name, backend, memory_bytes, library_version, threads, host FROM devices "
        "WHERE name = ?1 ORDER BY id"));
    select->bind(1, name);
    std::vector<DeviceRecord> found;
    while (select->step()) found.push_back(read_device(*select));
    return found;
  });
}

Stats PerfDb::stats() {
  impl_->begin("stats");
  return impl_->transact(Txn::kRead, [&] {
    Stats stats;
    stats.schema_version = kSchemaVersion;  // transact() has just checked it
    StatementUse counts(impl_->cached(
        "SELECT (SELECT count(*) FROM devices), (SELECT count(*) FROM kernels), "
        "(SELECT count(*) FROM kernel_measurements), (SELECT count(*) FROM step_measurements), "
        "(SELECT count(*) FROM copy_bandwidth), (SELECT count(*) FROM layer_measurements), (SELECT count(*) FROM input_rates)"));
    if (!counts->step()) impl_->invalid("internal error: counting rows returned nothing");
    stats.devices = counts->column_int(0);
    stats.kernels = counts->column_int(1);
    stats.kernel_measurements = counts->column_int(2);
    stats.step_measurements = counts->column_int(3);
    stats.copy_bandwidths = counts->column_int(4);
    stats.layer_measurements = counts->column_int(5);
    stats.input_rates = counts->column_int(6);
    StatementUse per_device(impl_->cached(
        "SELECT d.id, d.name, d.backend, d.memory_bytes, d.library_version, d.threads, d.host, "
        "(SELECT count(*) FROM kernel_measurements m WHERE m.device_id = d.id), "
        "(SELECT count(*) FROM step_measurements s WHERE s.device_id = d.id), "
        "(SELECT count(*) FROM layer_measurements l WHERE l.device_id = d.id) "
        "FROM devices d ORDER BY d.id"));
    while (per_device->step()) {
      DeviceStats& entry = stats.per_device.emplace_back();
      entry.device = read_device(*per_device);
      entry.kernel_measurements = per_device->column_int(7);
      entry.step_measurements = per_device->column_int(8);
      entry.layer_measurements = per_device->column_int(9);
    }
    return stats;
  });
}

void PerfDb::export_table(Table table, ExportFormat format, std::ostream& out) {
  impl_->begin(std::string("export ") + table_name(table));
  // One constant statement per table: the name never comes from input.
  const char* sql = nullptr;
  switch (table) {
    case Table::kDevices: sql = "SELECT * FROM devices ORDER BY id"; break;
    case Table::kKernels: sql = "SELECT * FROM kernels ORDER BY id"; break;
    case Table::kKernelMeasurements: sql = "SELECT * FROM kernel_measurements ORDER BY id"; break;
    case Table::kStepMeasurements: sql = "SELECT * FROM step_measurements ORDER BY id"; break;
    case Table::kCopyBandwidth: sql = "SELECT * FROM copy_bandwidth ORDER BY id"; break;
    case Table::kLayerMeasurements: sql = "SELECT * FROM layer_measurements ORDER BY id"; break;
    case Table::kInputRates: sql = "SELECT * FROM input_rates ORDER BY id"; break;
  }
  if (sql == nullptr) impl_->invalid("unknown table");
  // Rendered whole inside the transaction and written after it, so a retried
  // transaction never writes a partial copy to the stream.
  const std::string text = impl_->transact(Txn::kRead, [&] {
    StatementUse rows(impl_->cached(sql));
    return internal::render_rows(*rows, format);
  });
  out << text;
  out.flush();
  if (!out) impl_->invalid("writing the export to the stream failed");
}

}  // namespace vtrain::perfdb
