// The perf DB's tables and their forward migrations. perfdb/README.md shows
// the resulting layout.
#pragma once

#include <optional>

#include "perfdb/internal/sqlite.h"
#include "perfdb/perf_db.h"

namespace vtrain::perfdb::internal {

// Reads what the connected file holds; call it inside a transaction. With
// `quick_check`, first runs PRAGMA quick_check over every page. Returns the
// schema version, or nullopt for an empty database (no tables at all).
// Throws PerfDbError "FILE is not a valid vtrain perf DB: ..." for garbage,
// damaged pages, or an SQLite file without our schema_version table; other
// SQLite failures (busy, I/O) pass through as SqliteError.
std::optional<int> inspect_schema(Connection& connection, bool quick_check);

// Throws PerfDbError unless `version` is one this code reads and writes (or,
// with allow_older, can upgrade from).
void check_schema_version(const Connection& connection, int version, bool allow_older);

// Binds `model` to parameters first..first + common::kSettingCount, the
// columns it is stored in: model, then each setting
// (common::setting_texts) by its name in the config.
inline void bind_model(Statement& statement, int first, const ModelKey& model) {
  statement.bind(first, std::string_view(model.signature));
  for (const common::SettingText& s : common::setting_texts(model.settings)) {
    statement.bind(++first, s.value);
  }
}

// Brings the database from `version` (nullopt: empty) up to kSchemaVersion.
// Call it inside a write transaction, so a failed upgrade leaves nothing.
void migrate(Connection& connection, std::optional<int> version);

}  // namespace vtrain::perfdb::internal
