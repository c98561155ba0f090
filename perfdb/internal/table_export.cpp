#include "perfdb/internal/table_export.h"

#include "common/text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

namespace vtrain::perfdb::internal {
namespace {

std::string real_text(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return {buffer, result.ptr};
}

void append_csv_field(std::string& out, std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) {
    out += text;
    return;
  }
  out += '"';
  for (char ch : text) {
    if (ch == '"') out += '"';
    out += ch;
  }
  out += '"';
}


}  // namespace

std::string render_rows(Statement& rows, ExportFormat format) {
  const int columns = rows.column_count();
  std::vector<std::string> names;
  for (int i = 0; i < columns; ++i) names.emplace_back(rows.column_name(i));

  std::string out;
  if (format == ExportFormat::kCsv) {
    for (int i = 0; i < columns; ++i) {
      if (i > 0) out += ',';
      append_csv_field(out, names[i]);
    }
    out += '\n';
  }
  while (rows.step()) {
    if (format == ExportFormat::kJsonLines) out += '{';
    for (int i = 0; i < columns; ++i) {
      if (i > 0) out += ',';
      if (format == ExportFormat::kJsonLines) {
        out += common::json_quote(names[i]);
        out += ':';
      }
      switch (rows.column_type(i)) {
        case SQLITE_NULL:
          if (format == ExportFormat::kJsonLines) out += "null";
          break;
        case SQLITE_INTEGER:
          out += std::to_string(rows.column_int(i));
          break;
        case SQLITE_FLOAT: {
          const double value = rows.column_double(i);
          if (format == ExportFormat::kJsonLines && !std::isfinite(value)) {
            out += "null";  // JSON has no inf or nan
          } else {
            out += real_text(value);
          }
          break;
        }
        case SQLITE_TEXT:
          if (format == ExportFormat::kJsonLines) {
            out += common::json_quote(rows.column_text(i));
          } else {
            append_csv_field(out, rows.column_text(i));
          }
          break;
        default:  // SQLITE_BLOB
          if (format == ExportFormat::kJsonLines) {
            out += common::json_quote(rows.column_blob_hex(i));
          } else {
            out += rows.column_blob_hex(i);
          }
      }
    }
    out += format == ExportFormat::kJsonLines ? "}\n" : "\n";
  }
  return out;
}

}  // namespace vtrain::perfdb::internal
