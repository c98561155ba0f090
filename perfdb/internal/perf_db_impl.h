// PerfDb's implementation object, shared by the files that implement
// PerfDb's operations (perf_db.cpp, memory_costs.cpp): the connection, its
// cached statements, and retried transactions that check the schema.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>

#include "perfdb/internal/schema.h"
#include "perfdb/internal/sqlite.h"
#include "perfdb/internal/transaction.h"
#include "perfdb/perf_db.h"

namespace vtrain::perfdb {

namespace internal {

// The largest unsigned value a column (a signed 64-bit integer) can hold.
inline constexpr uint64_t kMaxStoredUnsigned =
    static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A time a measurement may record: finite and not negative.
inline bool valid_time(double value) { return std::isfinite(value) && value >= 0; }

}  // namespace internal

using internal::Connection;
using internal::SqliteError;
using internal::Statement;
using internal::StatementUse;
using internal::Txn;

class PerfDb::Impl {
 public:
  Impl(const std::string& path, const PerfDbOptions& options);

  const std::string& path() const { return connection_->path(); }

  // Names the public operation in error messages until the next one starts.
  void begin(std::string_view operation) { connection_->set_operation(operation); }
  [[noreturn]] void invalid(const std::string& what) const { throw PerfDbError(connection_->message(what)); }

  // A retried transaction that first checks the file still has our schema
  // version: another vtrain may have upgraded it since we opened it.
  template <class Body>
  auto transact(Txn kind, Body&& body) -> decltype(body()) {
    if (kind == Txn::kWrite && options_.mode == OpenMode::kReadOnly) {
      invalid("the perf DB was opened read-only");
    }
    return internal::with_retry(*connection_, options_, rng_, [&] {
      return internal::in_transaction(*connection_, kind, [&] {
        StatementUse version(cached("SELECT version FROM schema_version"));
        if (!version->step()) invalid("schema_version is empty");
        internal::check_schema_version(*connection_, static_cast<int>(version->column_int(0)), false);
        return body();
      });
    });
  }

  // Prepared once per connection and kept: statements are the same each call.
  Statement& cached(const char* sql) {
    auto found = statements_.find(sql);
    if (found == statements_.end()) found = statements_.emplace(sql, Statement(*connection_, sql)).first;
    return found->second;
  }

  void open_read_only(const std::string& path);
  void require_device(DeviceId device);
  int64_t upsert_kernel(const KernelSignature& kernel);

  PerfDbOptions options_;
  std::mt19937_64 rng_;
  // Declared before the statements so that they are finalized first.
  std::unique_ptr<Connection> connection_;
  std::unordered_map<std::string, Statement> statements_;
};

}  // namespace vtrain::perfdb
