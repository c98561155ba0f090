// PerfDb's input_rates table: the images/s a host's input delivers (see
// perf_db.h).
#include <cmath>
#include <string>
#include <vector>

#include "perfdb/internal/perf_db_impl.h"
#include "perfdb/perf_db.h"

namespace vtrain::perfdb {

using internal::unix_now;

namespace {

// A complaint about the row's fields, or "" when there is none.
std::string complaint_about(const InputRateMeasurement& m) {
  const InputKey& k = m.key;
  if (k.host.empty()) return "host must not be empty";
  if (k.dataset_kind.empty()) return "dataset_kind must not be empty";
  if (k.transform.empty()) return "transform must not be empty";
  if (k.workers < 1) return "workers must be >= 1, got " + std::to_string(k.workers);
  if (k.channels < 1 || k.height < 1 || k.width < 1) {
    return "channels, height and width must be >= 1, got " + std::to_string(k.channels) + " x " +
           std::to_string(k.height) + " x " + std::to_string(k.width);
  }
  if (!std::isfinite(m.images_per_second) || m.images_per_second <= 0) {
    return "images_per_second must be finite and > 0, got " + std::to_string(m.images_per_second);
  }
  if (m.host_cores < 1) return "host_cores must be >= 1, got " + std::to_string(m.host_cores);
  if (m.batch < 1) return "batch must be >= 1, got " + std::to_string(m.batch);
  if (m.measured_at < 0) return "measured_at must be >= 0";
  return {};
}

constexpr const char* kColumns =
    "host, workers, dataset_kind, dataset, channels, height, width, transform, "
    "images_per_second, host_cores, batch, measured_at";

// The row at the statement's current position, columns in kColumns' order.
InputRateMeasurement read_rate(const internal::Statement& row) {
  InputRateMeasurement m;
  m.key.host = row.column_text(0);
  m.key.workers = static_cast<int>(row.column_int(1));
  m.key.dataset_kind = row.column_text(2);
  m.key.dataset = row.column_text(3);
  m.key.channels = row.column_int(4);
  m.key.height = row.column_int(5);
  m.key.width = row.column_int(6);
  m.key.transform = row.column_text(7);
  m.images_per_second = row.column_double(8);
  m.host_cores = static_cast<int>(row.column_int(9));
  m.batch = row.column_int(10);
  m.measured_at = row.column_int(11);
  return m;
}

// Binds the key's columns as ?1..?8 in kColumns' order.
void bind_key(internal::Statement& statement, const InputKey& k) {
  statement.bind(1, std::string_view(k.host));
  statement.bind(2, int64_t{k.workers});
  statement.bind(3, std::string_view(k.dataset_kind));
  statement.bind(4, std::string_view(k.dataset));
  statement.bind(5, k.channels);
  statement.bind(6, k.height);
  statement.bind(7, k.width);
  statement.bind(8, std::string_view(k.transform));
}

}  // namespace

void PerfDb::record_input_rate(const InputRateMeasurement& rate) {
  impl_->begin("record input rate");
  if (const std::string why = complaint_about(rate); !why.empty()) impl_->invalid(why);
  const int64_t now = unix_now();
  impl_->transact(Txn::kWrite, [&] {
    StatementUse insert(impl_->cached(
        "INSERT INTO input_rates (host, workers, dataset_kind, dataset, channels, height, width, "
        "transform, images_per_second, host_cores, batch, measured_at) VALUES "
        "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) ON CONFLICT (host, workers, "
        "dataset_kind, dataset, channels, height, width, transform) DO UPDATE SET "
        "images_per_second = excluded.images_per_second, host_cores = excluded.host_cores, "
        "batch = excluded.batch, measured_at = excluded.measured_at"));
    bind_key(*insert, rate.key);
    insert->bind(9, rate.images_per_second);
    insert->bind(10, int64_t{rate.host_cores});
    insert->bind(11, rate.batch);
    insert->bind(12, rate.measured_at != 0 ? rate.measured_at : now);
    insert->run();
  });
}

std::optional<InputRateMeasurement> PerfDb::find_input_rate(const InputKey& key) {
  impl_->begin("find input rate");
  return impl_->transact(Txn::kRead, [&]() -> std::optional<InputRateMeasurement> {
    static const std::string sql = std::string("SELECT ") + kColumns +
                                   " FROM input_rates WHERE host = ?1 AND workers = ?2 AND "
                                   "dataset_kind = ?3 AND dataset = ?4 AND channels = ?5 AND "
                                   "height = ?6 AND width = ?7 AND transform = ?8";
    StatementUse select(impl_->cached(sql.c_str()));
    bind_key(*select, key);
    if (!select->step()) return std::nullopt;
    return read_rate(*select);
  });
}

std::vector<InputRateMeasurement> PerfDb::input_rates(std::string_view host) {
  impl_->begin("input rates");
  return impl_->transact(Txn::kRead, [&] {
    static const std::string sql =
        std::string("SELECT ") + kColumns + " FROM input_rates WHERE host = ?1 ORDER BY id";
    StatementUse select(impl_->cached(sql.c_str()));
    select->bind(1, host);
    std::vector<InputRateMeasurement> out;
    while (select->step()) out.push_back(read_rate(*select));
    return out;
  });
}

}  // namespace vtrain::perfdb
