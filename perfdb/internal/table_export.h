// Renders query results as CSV or JSON lines, for PerfDb::export_table.
#pragma once

#include <string>

#include "perfdb/internal/sqlite.h"
#include "perfdb/perf_db.h"

namespace vtrain::perfdb::internal {

// Steps `rows` to the end and returns the text: CSV is a header of column
// names, then one line per row (RFC 4180 quoting, NULL as an empty field);
// JSON lines is one flat object per row (NULL and non-finite reals as null).
// Reals use the shortest text that reads back to the same double; BLOBs,
// which vtrain never writes, come out as hex text.
std::string render_rows(Statement& rows, ExportFormat format);

}  // namespace vtrain::perfdb::internal
