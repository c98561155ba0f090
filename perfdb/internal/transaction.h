// Retried, whole transactions on a perf DB connection (used only inside
// perfdb): every public operation of PerfDb runs as one of these.
#pragma once

#include <algorithm>
#include <chrono>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <type_traits>

#include "perfdb/internal/sqlite.h"

namespace vtrain::perfdb::internal {

enum class Txn { kRead, kWrite };

// Runs `body` until it gets through without a busy/locked file, sleeping a
// random, growing time between attempts. Only whole transactions (or
// statements outside one) are retried, so a retry redoes complete work.
template <class Body>
auto with_retry(Connection& connection, const PerfDbOptions& options, std::mt19937_64& rng, Body&& body)
    -> decltype(body()) {
  for (int attempt = 1;; ++attempt) {
    try {
      return body();
    } catch (const SqliteError& e) {
      if (!e.busy()) throw;
      if (attempt >= options.max_attempts) {
        throw PerfDbError(connection.message(
            "the file stayed locked through " + std::to_string(attempt) + " attempts (" + e.detail() +
            "); another process may be holding a long transaction, or the file system's locks do not work"));
      }
      const int doublings = std::min(attempt - 1, 20);
      const auto ceiling = std::min(options.backoff_max, options.backoff_initial * (int64_t{1} << doublings));
      std::uniform_int_distribution<int64_t> pick(0, ceiling.count());
      std::this_thread::sleep_for(std::chrono::milliseconds(pick(rng)));
    }
  }
}

// One transaction around `body`: committed when body returns, rolled back
// when anything throws. Writes take the write lock up front (BEGIN
// IMMEDIATE): a deferred transaction that upgrades from reading to writing can
// deadlock with another writer, which SQLite reports as busy at once.
template <class Body>
auto in_transaction(Connection& connection, Txn kind, Body&& body) -> decltype(body()) {
  connection.exec(kind == Txn::kWrite ? "BEGIN IMMEDIATE" : "BEGIN");
  try {
    if constexpr (std::is_void_v<decltype(body())>) {
      body();
      connection.exec("COMMIT");
    } else {
      auto result = body();
      connection.exec("COMMIT");
      return result;
    }
  } catch (const std::exception& e) {
    // A failed COMMIT (busy) leaves the transaction open; some I/O errors
    // have already rolled it back.
    if (connection.in_transaction()) {
      try {
        connection.exec("ROLLBACK");
      } catch (const PerfDbError& rollback) {
        throw PerfDbError(std::string(e.what()) + "; rolling back also failed: " + rollback.what());
      }
    }
    throw;
  }
}

}  // namespace vtrain::perfdb::internal
