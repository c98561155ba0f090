// The perf DB's tables and their forward migrations. perfdb/README.md shows
// the resulting layout.
#pragma once

#include <optional>
#include <string>

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

// The columns a ModelKey is stored in, in the tables keyed on a model:
// "model, precision, layout, ...", a column per setting (common::kSettings).
std::string model_columns();
// "model = ?F AND precision = ?F+1 AND ...": those columns matched against
// parameters `first` (F) onwards, in that order.
std::string model_match(int first);
// "?F, ?F+1, ..., ?F+count-1".
std::string parameters(int first, int count);

// The parameters a ModelKey takes: the signature and each setting.
inline constexpr int kModelParameters = 1 + static_cast<int>(common::kSettingCount);

// Binds `model` to parameters first..first + kModelParameters - 1, in the
// order of model_columns(): the signature, then each setting's name for
// its value in the config.
inline void bind_model(Statement& statement, int first, const ModelKey& model) {
  statement.bind(first, std::string_view(model.signature));
  for (const common::Setting& s : common::kSettings) statement.bind(++first, s.text(model.settings));
}

// Brings the database from `version` (nullopt: empty) up to kSchemaVersion.
// Call it inside a write transaction, so a failed upgrade leaves nothing.
void migrate(Connection& connection, std::optional<int> version);

}  // namespace vtrain::perfdb::internal
