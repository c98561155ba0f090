// PerfDb's copy_bandwidth and layer_measurements tables: what the timed
// memory simulator needs of a device (see perf_db.h).
#include <set>
#include <span>
#include <string>

#include "perfdb/internal/perf_db_impl.h"
#include "perfdb/perf_db.h"

namespace vtrain::perfdb {

using internal::kMaxStoredUnsigned;
using internal::kModelParameters;
using internal::model_columns;
using internal::model_match;
using internal::parameters;
using internal::unix_now;
using internal::valid_time;

const char* copy_direction_name(CopyDirection direction) {
  switch (direction) {
    case CopyDirection::kToHost: return "to_host";
    case CopyDirection::kToDevice: return "to_device";
  }
  return "?";
}

namespace {

// Field checks before anything is written; each returns a complaint or "".
std::string complaint_about(const CopyBandwidthMeasurement& m) {
  if (m.bytes < 1 || m.bytes > kMaxStoredUnsigned) {
    return "bytes must be in 1..2^63-1, got " + std::to_string(m.bytes);
  }
  if (!valid_time(m.bytes_per_second) || m.bytes_per_second == 0) {
    return "bytes_per_second must be finite and > 0, got " + std::to_string(m.bytes_per_second);
  }
  if (m.measured_at < 0) return "measured_at must be >= 0";
  if (!m.compute_share) return "compute_share is required";
  if (!(*m.compute_share >= 0 && *m.compute_share <= 1)) {
    return "compute_share must be in [0, 1], got " + std::to_string(*m.compute_share);
  }
  return {};
}

std::string complaint_about(const LayerMeasurement& m) {
  if (m.layer_index < kOutsideCallsLayer) {
    return "layer_index must be >= " + std::to_string(kOutsideCallsLayer) +
           " (the time outside layer calls), got " + std::to_string(m.layer_index);
  }
  if (m.layer_name.empty()) return "layer_name must not be empty";
  if (!valid_time(m.forward_ms)) {
    return "forward_ms must be finite and >= 0, got " + std::to_string(m.forward_ms);
  }
  if (!valid_time(m.backward_ms)) {
    return "backward_ms must be finite and >= 0, got " + std::to_string(m.backward_ms);
  }
  if (m.measured_at < 0) return "measured_at must be >= 0";
  return {};
}

// The first complaint about `rows`, checked before anything is written:
// a row's fields, or a key (key_of names it) given twice; "" when none.
template <class Row, class KeyOf>
std::string complaint_about(std::span<const Row> rows, const std::string& row, KeyOf key_of) {
  std::set<std::string> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (std::string why = complaint_about(rows[i]); !why.empty()) {
      return row + " " + std::to_string(i) + ": " + why;
    }
    if (const std::string key = key_of(rows[i]); !seen.insert(key).second) {
      return key + " is given twice";
    }
  }
  return {};
}

}  // namespace

void PerfDb::record_copy_bandwidth(DeviceId device,
                                   std::span<const CopyBandwidthMeasurement> measurements) {
  impl_->begin("record copy bandwidth");
  const std::string why =
      complaint_about(measurements, "measurement", [](const CopyBandwidthMeasurement& m) {
        return std::string("direction ") + copy_direction_name(m.direction);
      });
  if (!why.empty()) impl_->invalid(why);
  if (measurements.empty()) return;
  const int64_t now = unix_now();
  impl_->transact(Txn::kWrite, [&] {
    impl_->require_device(device);
    for (const CopyBandwidthMeasurement& m : measurements) {
      StatementUse insert(impl_->cached(
          "INSERT INTO copy_bandwidth (device_id, direction, bytes, bytes_per_second, measured_at, "
          "compute_share) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (device_id, direction) DO "
          "UPDATE SET bytes = excluded.bytes, bytes_per_second = excluded.bytes_per_second, "
          "measured_at = excluded.measured_at, compute_share = excluded.compute_share"));
      insert->bind(1, device.value);
      insert->bind(2, std::string_view(copy_direction_name(m.direction)));
      insert->bind(3, static_cast<int64_t>(m.bytes));
      insert->bind(4, m.bytes_per_second);
      insert->bind(5, m.measured_at != 0 ? m.measured_at : now);
      insert->bind(6, *m.compute_share);
      insert->run();
    }
  });
}

std::optional<CopyBandwidthMeasurement> PerfDb::find_copy_bandwidth(DeviceId device,
                                                                    CopyDirection direction) {
  impl_->begin("find copy bandwidth");
  return impl_->transact(Txn::kRead, [&]() -> std::optional<CopyBandwidthMeasurement> {
    StatementUse select(impl_->cached(
        "SELECT bytes, bytes_per_second, measured_at, compute_share FROM copy_bandwidth "
        "WHERE device_id = ?1 AND direction = ?2"));
    select->bind(1, device.value);
    select->bind(2, std::string_view(copy_direction_name(direction)));
    if (!select->step()) return std::nullopt;
    return CopyBandwidthMeasurement{direction, static_cast<uint64_t>(select->column_int(0)),
                                    select->column_double(1), select->column_int(2),
                                    select->column_optional_double(3)};
  });
}

void PerfDb::record_layer_measurements(DeviceId device, const ModelKey& model, int64_t batch,
                                       std::span<const LayerMeasurement> layers) {
  impl_->begin("record layer measurements");
  if (model.signature.empty()) impl_->invalid("model must not be empty");
  if (batch < 1) impl_->invalid("batch must be >= 1, got " + std::to_string(batch));
  const std::string why = complaint_about(layers, "layer", [](const LayerMeasurement& m) {
    return "layer_index " + std::to_string(m.layer_index);
  });
  if (!why.empty()) impl_->invalid(why);
  if (layers.empty()) return;
  const int64_t now = unix_now();
  impl_->transact(Txn::kWrite, [&] {
    impl_->require_device(device);
    for (const LayerMeasurement& m : layers) {
      // The model's columns come last: their count is the settings'.
      static const std::string kSql =
          "INSERT INTO layer_measurements (device_id, batch, layer_index, layer_name, forward_ms, "
          "backward_ms, measured_at, " + model_columns() + ") VALUES (" +
          parameters(1, 7 + kModelParameters) + ") ON CONFLICT (device_id, " + model_columns() +
          ", batch, layer_index) DO UPDATE SET "
          "layer_name = excluded.layer_name, forward_ms = excluded.forward_ms, "
          "backward_ms = excluded.backward_ms, measured_at = excluded.measured_at";
      StatementUse insert(impl_->cached(kSql.c_str()));
      insert->bind(1, device.value);
      insert->bind(2, batch);
      insert->bind(3, m.layer_index);
      insert->bind(4, std::string_view(m.layer_name));
      insert->bind(5, m.forward_ms);
      insert->bind(6, m.backward_ms);
      insert->bind(7, m.measured_at != 0 ? m.measured_at : now);
      bind_model(*insert, 8, model);
      insert->run();
    }
  });
}

std::vector<LayerMeasurement> PerfDb::layer_measurements(DeviceId device, const ModelKey& model,
                                                         int64_t batch) {
  impl_->begin("list layer measurements");
  return impl_->transact(Txn::kRead, [&] {
    static const std::string kSql =
        "SELECT layer_index, layer_name, forward_ms, backward_ms, measured_at "
        "FROM layer_measurements WHERE device_id = ?1 AND batch = ?2 AND " + model_match(3) +
        " ORDER BY layer_index";
    StatementUse select(impl_->cached(kSql.c_str()));
    select->bind(1, device.value);
    select->bind(2, batch);
    bind_model(*select, 3, model);
    std::vector<LayerMeasurement> found;
    while (select->step()) {
      found.push_back({select->column_int(0), select->column_text(1), select->column_double(2),
                       select->column_double(3), select->column_int(4)});
    }
    return found;
  });
}

}  // namespace vtrain::perfdb
