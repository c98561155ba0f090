#include "perfdb/internal/perf_db_impl.h"

#include <filesystem>
#include <system_error>

namespace vtrain::perfdb {

using internal::in_transaction;
using internal::with_retry;

PerfDb::Impl::Impl(const std::string& path, const PerfDbOptions& options)
    : options_(options), rng_(std::random_device{}()) {
  if (options.max_attempts < 1 || options.busy_timeout.count() < 0 ||
      options.busy_timeout.count() > std::numeric_limits<int>::max() || options.backoff_initial.count() < 0 ||
      options.backoff_max.count() < 0) {
    throw PerfDbError("perf DB " + path +
                      ": open: invalid options (max_attempts must be >= 1; times must be >= 0, "
                      "busy_timeout at most INT_MAX ms)");
  }

  std::error_code ignored;  // a path we cannot stat fails to open below, with SQLite's message
  if (std::filesystem::is_directory(path, ignored)) {
    throw PerfDbError("perf DB " + path + ": open: is a directory, expected a perf DB file");
  }
  if (options.mode == OpenMode::kReadOnly) {
    open_read_only(path);
    return;
  }

  // Check an existing file on a read-only connection, so that nothing can be
  // written to a file that turns out to be damaged, someone else's, or newer.
  bool checked = false;
  std::optional<int> version;
  if (path != ":memory:" && std::filesystem::exists(path, ignored)) {
    try {
      Connection reader(path, SQLITE_OPEN_READONLY);
      reader.set_operation("open (checking the file)");
      reader.set_busy_timeout(options_.busy_timeout);
      version = with_retry(reader, options_, rng_, [&] {
        return in_transaction(reader, Txn::kRead, [&] { return internal::inspect_schema(reader, true); });
      });
      if (version) internal::check_schema_version(reader, *version, true);
      checked = true;
    } catch (const SqliteError& e) {
      // A writer died mid-transaction and left a hot journal, which only a
      // writable connection may roll back (SQLite's normal recovery). The
      // file is then checked on that connection, under the write lock.
      if (e.code() != SQLITE_READONLY_ROLLBACK) throw;
    }
  }

  connection_ = std::make_unique<Connection>(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  Connection& db = *connection_;
  db.set_busy_timeout(options_.busy_timeout);
  // Rollback journal: WAL needs shared memory between processes, which NFS
  // does not provide. Switching a file out of WAL needs the lock, hence the
  // retry.
  const std::string mode = with_retry(db, options_, rng_, [&] {
    Statement pragma(db, "PRAGMA journal_mode = DELETE");
    if (!pragma.step()) throw PerfDbError(db.message("PRAGMA journal_mode returned nothing"));
    return pragma.column_text(0);
  });
  if (mode != "delete" && !(path == ":memory:" && mode == "memory")) {
    throw PerfDbError(db.message("cannot use a rollback journal; journal_mode is " + mode));
  }
  // FULL: a commit is on disk (and on the NFS server) before it returns, so a
  // node that crashes after a commit cannot take the row with it.
  db.exec("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;");

  if (checked && version == kSchemaVersion) return;
  // Create or upgrade under the write lock, looking again: another process
  // may have done it since the check above.
  with_retry(db, options_, rng_, [&] {
    in_transaction(db, Txn::kWrite, [&] {
      const std::optional<int> now = internal::inspect_schema(db, !checked);
      if (now) internal::check_schema_version(db, *now, true);
      if (now != kSchemaVersion) internal::migrate(db, now);
    });
  });
}

void PerfDb::Impl::open_read_only(const std::string& path) {
  std::error_code ec;
  if (path == ":memory:" || !std::filesystem::exists(path, ec)) {
    throw PerfDbError("perf DB " + path + ": open (read-only): no such file" +
                      (ec ? " (" + ec.message() + ")" : std::string()));
  }
  connection_ = std::make_unique<Connection>(path, SQLITE_OPEN_READONLY);
  Connection& db = *connection_;
  db.set_operation("open (read-only)");
  db.set_busy_timeout(options_.busy_timeout);
  std::optional<int> version;
  try {
    version = with_retry(db, options_, rng_, [&] {
      return in_transaction(db, Txn::kRead, [&] { return internal::inspect_schema(db, true); });
    });
  } catch (const SqliteError& e) {
    if (e.code() != SQLITE_READONLY_ROLLBACK) throw;
    invalid("a writer crashed mid-transaction and left a hot journal, which only a read-write "
            "open (vtrain profile) may roll back");
  }
  if (!version) invalid("the file holds no tables: not a perf DB yet (fill it with vtrain profile)");
  if (*version < kSchemaVersion) {
    invalid("schema version " + std::to_string(*version) + " is older than this vtrain's " +
            std::to_string(kSchemaVersion) + ", and a read-only open does not upgrade it (a "
            "read-write open, e.g. vtrain profile, does)");
  }
  internal::check_schema_version(db, *version, false);
}

void PerfDb::Impl::require_device(DeviceId device) {
  StatementUse known(cached("SELECT 1 FROM devices WHERE id = ?1"));
  known->bind(1, device.value);
  if (known->step()) return;
  StatementUse all(cached("SELECT id FROM devices ORDER BY id LIMIT 21"));
  std::string ids;
  int listed = 0;
  while (all->step()) {
    if (++listed > 20) {
      ids += ", ...";
      break;
    }
    if (!ids.empty()) ids += ", ";
    ids += std::to_string(all->column_int(0));
  }
  invalid("unknown device id " + std::to_string(device.value) + " (known ids: " +
          (ids.empty() ? "none" : ids) + "); register it with upsert_device first");
}


}  // namespace vtrain::perfdb
