#include "perfdb/internal/sqlite.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <memory>
#include <thread>
#include <utility>

namespace vtrain::perfdb::internal {

bool SqliteError::busy() const {
  const int primary = code_ & 0xff;
  return primary == SQLITE_BUSY || primary == SQLITE_LOCKED;
}

bool SqliteError::corrupt() const {
  const int primary = code_ & 0xff;
  return primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT;
}

// ------------------------------------------------------------------ Connection

Connection::Connection(std::string path, int flags) : path_(std::move(path)) {
  const int rc = sqlite3_open_v2(path_.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    // sqlite3_open_v2 hands back a handle even on failure (unless out of
    // memory); it carries the message and must still be closed.
    std::string detail = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw SqliteError(message(detail), detail, rc);
  }
  // Extended codes tell "busy because of a recovery" and "read-only because a
  // hot journal needs rolling back" apart from the plain codes.
  if (const int ext = sqlite3_extended_result_codes(db_, 1); ext != SQLITE_OK) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw SqliteError(message(sqlite3_errstr(ext)), sqlite3_errstr(ext), ext);
  }
}

void Connection::set_busy_timeout(std::chrono::milliseconds timeout) {
  busy_timeout_ = timeout;
  busy_random_.seed(std::random_device{}());
  if (const int rc = sqlite3_busy_handler(db_, &Connection::on_busy, this); rc != SQLITE_OK) fail(rc);
}

int Connection::on_busy(void* self, int count) {
  auto& connection = *static_cast<Connection*>(self);
  const auto now = std::chrono::steady_clock::now();
  // count restarts at 0 for every lock the connection waits for.
  if (count == 0) connection.busy_since_ = now;
  // Giving up makes the statement report busy.
  if (now - connection.busy_since_ >= connection.busy_timeout_) return 0;
  // Sleep a random time in [d/2, d], d doubling from 100 us to 20 ms: short
  // enough to catch the gap between two transactions of another process, long
  // enough not to flood an NFS lock server with lock requests.
  const int64_t ceiling_us = std::min<int64_t>(20000, int64_t{100} << std::min(count, 8));
  std::uniform_int_distribution<int64_t> pick(ceiling_us / 2, ceiling_us);
  std::this_thread::sleep_for(std::chrono::microseconds(pick(connection.busy_random_)));
  return 1;
}

Connection::~Connection() {
  // Every Statement is finalized before its connection (owners declare the
  // connection first), so closing cannot find one still open.
  [[maybe_unused]] const int rc = sqlite3_close(db_);
  assert(rc == SQLITE_OK);
}

std::string Connection::message(std::string_view detail) const {
  std::string text = "perf DB ";
  text += path_;
  text += ": ";
  text += operation_;
  text += ": ";
  text += detail;
  return text;
}

void Connection::fail(int rc) const {
  // sqlite3_errmsg describes the last failed call on this connection, which
  // is the one that returned rc.
  std::string detail = sqlite3_errmsg(db_);
  throw SqliteError(message(detail), detail, rc);
}

void Connection::exec(std::string_view script) {
  struct Finalize {
    void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }  // repeats step's code, checked there
  };
  const char* tail = script.data();
  const char* const end = script.data() + script.size();
  while (tail < end) {
    sqlite3_stmt* raw = nullptr;
    const char* next = nullptr;
    const int rc = sqlite3_prepare_v2(db_, tail, static_cast<int>(end - tail), &raw, &next);
    if (rc != SQLITE_OK) fail(rc);
    if (raw == nullptr) break;  // only whitespace or comments were left
    std::unique_ptr<sqlite3_stmt, Finalize> stmt(raw);
    int step_rc = SQLITE_ROW;
    while (step_rc == SQLITE_ROW) step_rc = sqlite3_step(stmt.get());
    if (step_rc != SQLITE_DONE) fail(step_rc);
    tail = next;
  }
}

// ------------------------------------------------------------------ Statement

Statement::Statement(Connection& connection, std::string_view sql) : connection_(&connection) {
  const char* tail = nullptr;
  const int rc = sqlite3_prepare_v2(connection.get(), sql.data(), static_cast<int>(sql.size()), &stmt_,
                                    &tail);
  if (rc != SQLITE_OK) connection.fail(rc);
  assert(stmt_ != nullptr && "a Statement holds exactly one SQL statement");
  assert(tail == sql.data() + sql.size() && "a Statement holds exactly one SQL statement");
}

Statement::~Statement() {
  // sqlite3_finalize returns the code of the last step, already checked.
  if (stmt_ != nullptr) sqlite3_finalize(stmt_);
}

Statement::Statement(Statement&& other) noexcept
    : connection_(other.connection_), stmt_(std::exchange(other.stmt_, nullptr)) {}

void Statement::check_bind(int rc) {
  if (rc != SQLITE_OK) connection_->fail(rc);
}

void Statement::bind(int index, int64_t value) { check_bind(sqlite3_bind_int64(stmt_, index, value)); }

void Statement::bind(int index, double value) { check_bind(sqlite3_bind_double(stmt_, index, value)); }

void Statement::bind(int index, std::string_view value) {
  check_bind(sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
}

void Statement::bind(int index, std::optional<double> value) {
  if (value) {
    bind(index, *value);
  } else {
    bind_null(index);
  }
}

void Statement::bind_null(int index) { check_bind(sqlite3_bind_null(stmt_, index)); }

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  connection_->fail(rc);
}

void Statement::run() {
  if (step()) throw PerfDbError(connection_->message("internal error: a write statement returned rows"));
}

int Statement::column_count() const { return sqlite3_column_count(stmt_); }

const char* Statement::column_name(int column) const { return sqlite3_column_name(stmt_, column); }

int Statement::column_type(int column) const { return sqlite3_column_type(stmt_, column); }

int64_t Statement::column_int(int column) const { return sqlite3_column_int64(stmt_, column); }

double Statement::column_double(int column) const { return sqlite3_column_double(stmt_, column); }

std::optional<double> Statement::column_optional_double(int column) const {
  if (column_type(column) == SQLITE_NULL) return std::nullopt;
  return column_double(column);
}

std::string Statement::column_text(int column) const {
  const auto* text = sqlite3_column_text(stmt_, column);
  if (text == nullptr) return {};
  return {reinterpret_cast<const char*>(text), static_cast<size_t>(sqlite3_column_bytes(stmt_, column))};
}

std::string Statement::column_blob_hex(int column) const {
  const auto* bytes = static_cast<const unsigned char*>(sqlite3_column_blob(stmt_, column));
  const int size = sqlite3_column_bytes(stmt_, column);
  std::string hex;
  hex.reserve(2 * static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) {
    char pair[3];
    std::snprintf(pair, sizeof pair, "%02x", bytes[i]);
    hex += pair;
  }
  return hex;
}

void Statement::reset() {
  // sqlite3_reset repeats the code of the last step (already checked) and
  // sqlite3_clear_bindings always succeeds.
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

}  // namespace vtrain::perfdb::internal
