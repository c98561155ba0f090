// Thin RAII wrappers over the SQLite C API, used only inside perfdb. Every
// return code is checked; failures throw SqliteError, a PerfDbError whose
// message names the file and the current operation and which keeps SQLite's
// result code so callers can tell "busy, try again" from real failures.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>

#include "perfdb/perf_db.h"

namespace vtrain::perfdb::internal {

class SqliteError : public PerfDbError {
 public:
  SqliteError(const std::string& message, std::string detail, int code)
      : PerfDbError(message), detail_(std::move(detail)), code_(code) {}
  int code() const { return code_; }                       // SQLite's extended result code
  const std::string& detail() const { return detail_; }   // SQLite's own message
  // Another connection holds the lock: the whole transaction may be retried.
  bool busy() const;
  // The file is not an SQLite database or its pages are damaged.
  bool corrupt() const;

 private:
  std::string detail_;
  int code_;
};

class Connection {
 public:
  // flags: SQLITE_OPEN_* (READONLY, or READWRITE | CREATE).
  Connection(std::string path, int flags);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  sqlite3* get() const { return db_; }
  const std::string& path() const { return path_; }

  // The operation that error messages name ("record kernel measurements").
  void set_operation(std::string_view operation) { operation_ = operation; }

  // "perf DB FILE: OPERATION: detail".
  std::string message(std::string_view detail) const;
  [[noreturn]] void fail(int rc) const;  // throws SqliteError with SQLite's message

  // How long a statement waits for another connection's lock before it
  // reports busy. Replaces SQLite's own busy handler, whose sleeps grow to
  // 100 ms: a waiter that sleeps that long rarely sees the lock free, because
  // a process that has just committed begins its next transaction at once.
  // Shorter, randomised sleeps keep waiters in the race (in a test with 8
  // writing processes, SQLite's handler starved some writers for 20 s).
  void set_busy_timeout(std::chrono::milliseconds timeout);

  // Runs every statement of a constant script (DDL, BEGIN/COMMIT); any rows
  // produced are discarded.
  void exec(std::string_view script);
  // True while a transaction is open.
  bool in_transaction() const { return sqlite3_get_autocommit(db_) == 0; }

 private:
  static int on_busy(void* self, int count);

  std::string path_;
  std::string operation_ = "open";
  std::chrono::milliseconds busy_timeout_{0};
  std::chrono::steady_clock::time_point busy_since_;
  std::minstd_rand busy_random_;
  sqlite3* db_ = nullptr;
};

// A prepared statement. Parameters are 1-based, columns 0-based, as in SQLite.
class Statement {
 public:
  Statement(Connection& connection, std::string_view sql);
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  void bind(int index, int64_t value);
  void bind(int index, double value);
  void bind(int index, std::string_view value);  // copied by SQLite
  void bind(int index, std::optional<double> value);  // nullopt -> NULL
  void bind_null(int index);

  // Advances to the next row: true when a row is ready, false when done.
  bool step();
  // Steps a statement that returns no rows (INSERT, UPDATE).
  void run();

  int column_count() const;
  const char* column_name(int column) const;
  int column_type(int column) const;  // SQLITE_INTEGER, SQLITE_FLOAT, SQLITE_TEXT, SQLITE_BLOB, SQLITE_NULL
  int64_t column_int(int column) const;
  double column_double(int column) const;
  std::optional<double> column_optional_double(int column) const;  // NULL -> nullopt
  std::string column_text(int column) const;
  std::string column_blob_hex(int column) const;

  // Makes the statement ready to bind and run again. Its result code repeats
  // the error step() already threw, so it is deliberately not rechecked.
  void reset();

 private:
  void check_bind(int rc);

  Connection* connection_;
  sqlite3_stmt* stmt_ = nullptr;
};

// Resets a (cached) statement when leaving scope, so that it holds no read
// lock between uses and is ready for the next one.
class StatementUse {
 public:
  explicit StatementUse(Statement& statement) : statement_(statement) { statement_.reset(); }
  ~StatementUse() { statement_.reset(); }
  StatementUse(const StatementUse&) = delete;
  StatementUse& operator=(const StatementUse&) = delete;
  Statement* operator->() { return &statement_; }
  Statement& operator*() { return statement_; }

 private:
  Statement& statement_;
};

}  // namespace vtrain::perfdb::internal
