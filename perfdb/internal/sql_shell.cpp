#include "perfdb/internal/sql_shell.h"

#include "perfdb/internal/sqlite.h"

namespace vtrain::perfdb::internal {

SqlShell::SqlShell(const std::string& path)
    : connection_(std::make_unique<Connection>(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)) {
  connection_->set_operation("sql shell");
  connection_->set_busy_timeout(std::chrono::milliseconds(5000));
}

SqlShell::~SqlShell() = default;

void SqlShell::exec(const std::string& script) { connection_->exec(script); }

std::vector<std::vector<std::string>> SqlShell::query(const std::string& sql) {
  Statement statement(*connection_, sql);
  std::vector<std::vector<std::string>> rows;
  while (statement.step()) {
    auto& row = rows.emplace_back();
    for (int i = 0; i < statement.column_count(); ++i) row.push_back(statement.column_text(i));
  }
  return rows;
}

}  // namespace vtrain::perfdb::internal
