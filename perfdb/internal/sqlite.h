// Thin RAII wrappers over the SQLite C API, used only inside perfdb. Every
// return code is checked; failures throw SqliteError, a PerfDbError whose
// message names the file and the current operation and which keeps SQLite's
// result code so callers can tell "busy, try again" from real failures.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "perfdb/perf_db.h"

namespace vtrain::perfdb::internal {

class SqliteError : public PerfDbError {
 public:
  SqliteError(const std::string& message, int code) : PerfDbError(message), code_(code) {}
  int code() const { return code_; }  // SQLite's extended result code
  // Another connection holds the lock: the whole transaction may be retried.
  bool busy() const;
  // The file is not an SQLite database or its pages are damaged.
  bool corrupt() const;

 private:
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
  const std::string& operation() const { return operation_; }

  // "perf DB FILE: OPERATION: detail".
  std::string message(std::string_view detail) const;
  [[noreturn]] void fail(int rc) const;  // throws SqliteError with SQLite's message

  // Runs every statement of a constant script (DDL, BEGIN/COMMIT); any rows
  // produced are discarded.
  void exec(std::string_view script);
  // True while a transaction is open.
  bool in_transaction() const { return sqlite3_get_autocommit(db_) == 0; }

 private:
  std::string path_;
  std::string operation_ = "open";
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

 private:
  Statement& statement_;
};

}  // namespace vtrain::perfdb::internal
