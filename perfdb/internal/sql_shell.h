// Raw SQL on a database file, like the sqlite3 shell, without sqlite3.h in
// the caller. For perfdb's tests, which build files by hand (an old schema,
// someone else's SQLite file, a newer version) and hold locks to exercise the
// retry path. Product code goes through PerfDb.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace vtrain::perfdb::internal {

class Connection;

class SqlShell {
 public:
  // Opens (creating if missing) `path` read-write; waits up to 5 s for locks.
  explicit SqlShell(const std::string& path);
  ~SqlShell();
  SqlShell(const SqlShell&) = delete;
  SqlShell& operator=(const SqlShell&) = delete;

  // Runs every statement of `script` (which may be BEGIN or COMMIT alone, to
  // hold a lock across calls). Throws PerfDbError on failure.
  void exec(const std::string& script);

  // The rows of one statement, each value as text ("" for NULL).
  std::vector<std::vector<std::string>> query(const std::string& sql);

 private:
  std::unique_ptr<Connection> connection_;
};

}  // namespace vtrain::perfdb::internal
