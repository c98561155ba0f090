// The folders are the architecture: every #include "..." of a project header
// must follow the dependency table in docs/architecture.md ("Who may include
// whom"). The table is read from the document, so the rule and its
// description cannot drift apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;

// part -> the parts it may include (besides itself).
using Rules = std::map<std::string, std::set<std::string>>;

// Parts whose files may include anything (they are not layers).
const std::set<std::string> kFree = {"tests", "bench"};

// The rows "| `part` | `a`, `b` |" of the table under the heading
// "## Who may include whom".
Rules read_rules(const std::string& markdown) {
  Rules rules;
  std::istringstream in(markdown);
  std::string line;
  bool in_section = false;
  const std::regex row(R"(^\|\s*`([^`]+)`\s*\|(.*)\|\s*$)");
  const std::regex name("`([^`]+)`");
  while (std::getline(in, line)) {
    if (line.starts_with("## ")) in_section = line == "## Who may include whom";
    std::smatch m;
    if (!in_section || !std::regex_match(line, m, row)) continue;
    std::set<std::string>& allowed = rules[m[1]];
    const std::string cells = m[2];
    for (auto it = std::sregex_iterator(cells.begin(), cells.end(), name);
         it != std::sregex_iterator(); ++it) {
      allowed.insert((*it)[1]);
    }
  }
  return rules;
}

// The part a repository path belongs to: the longest part folder that
// contains it, or "" when none does.
std::string part_of(const std::string& path, const Rules& rules) {
  std::string best;
  auto consider = [&](const std::string& part) {
    if (path.starts_with(part + "/") && part.size() > best.size()) best = part;
  };
  for (const auto& [part, allowed] : rules) consider(part);
  for (const std::string& part : kFree) consider(part);
  return best;
}

// "FILE:LINE includes HEADER: PART may not include TARGET" for every include
// under `root` that breaks `rules`.
std::vector<std::string> violations(const fs::path& root, const Rules& rules) {
  std::vector<std::string> found;
  const std::regex include(R"re(^\s*#\s*include\s+"([^"]+)")re");
  std::vector<std::string> folders;
  for (const auto& [part, allowed] : rules) folders.push_back(part.substr(0, part.find('/')));
  std::sort(folders.begin(), folders.end());
  folders.erase(std::unique(folders.begin(), folders.end()), folders.end());
  for (const std::string& folder : folders) {
    if (!fs::is_directory(root / folder)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu")) continue;
      const std::string file = fs::relative(entry.path(), root).generic_string();
      const std::string from = part_of(file, rules);
      if (from.empty() || kFree.contains(from)) continue;
      std::ifstream in(entry.path());
      std::string line;
      for (int number = 1; std::getline(in, line); ++number) {
        std::smatch m;
        if (!std::regex_search(line, m, include)) continue;
        const std::string header = m[1];
        const std::string to = part_of(header, rules);
        if (to.empty()) continue;  // not a project header (or a sibling by plain name)
        std::string why;
        if (to != from && !rules.at(from).contains(to)) {
          why = from + " may not include " + to;
        } else if (to != from && header.find("/internal/") != std::string::npos) {
          why = "only " + to + " may include its internal/ headers";
        }
        if (!why.empty()) {
          found.push_back(file + ":" + std::to_string(number) + " includes " + header + ": " + why);
        }
      }
    }
  }
  return found;
}

Rules project_rules() {
  const fs::path doc = fs::path(test_support::source_dir()) / "docs" / "architecture.md";
  std::ifstream in(doc);
  std::stringstream text;
  text << in.rdbuf();
  return read_rules(text.str());
}

TEST(Layering, TheTableNamesEveryPart) {
  const Rules rules = project_rules();
  ASSERT_FALSE(rules.empty()) << "no dependency table found in docs/architecture.md";
  for (const char* part : {"common", "perfdb", "balancer", "memory", "configs", "launcher",
                           "worker/device", "worker/engine", "worker/train"}) {
    EXPECT_TRUE(rules.contains(part)) << part;
  }
  // Every part a row allows is itself a row: no typo silently allows nothing.
  for (const auto& [part, allowed] : rules) {
    for (const std::string& to : allowed) EXPECT_TRUE(rules.contains(to)) << part << " -> " << to;
  }
}

TEST(Layering, EveryIncludeFollowsTheTable) {
  const Rules rules = project_rules();
  ASSERT_FALSE(rules.empty());
  std::string report;
  for (const std::string& v : violations(test_support::source_dir(), rules)) report += v + "\n";
  EXPECT_EQ(report, "");
}

TEST(Layering, TheTableHasNoCycles) {
  const Rules rules = project_rules();
  // Depth-first search for a back edge, printing the cycle it closes.
  std::map<std::string, int> state;  // 0 unseen, 1 on the path, 2 done
  std::vector<std::string> path;
  std::string cycle;
  std::function<void(const std::string&)> visit = [&](const std::string& part) {
    state[part] = 1;
    path.push_back(part);
    for (const std::string& to : rules.at(part)) {
      if (state[to] == 1 && cycle.empty()) {
        auto start = std::find(path.begin(), path.end(), to);
        for (auto it = start; it != path.end(); ++it) cycle += *it + " -> ";
        cycle += to;
      } else if (state[to] == 0 && rules.contains(to)) {
        visit(to);
      }
    }
    path.pop_back();
    state[part] = 2;
  };
  for (const auto& [part, allowed] : rules) {
    if (state[part] == 0) visit(part);
  }
  EXPECT_EQ(cycle, "");
}

// The check itself: a forbidden include in a scratch tree is reported with
// its file and line; an allowed one is not.
TEST(Layering, AForbiddenIncludeIsReported) {
  const test_support::TempDir dir;
  const fs::path root = dir.path();
  fs::create_directories(root / "memory");
  fs::create_directories(root / "worker" / "engine");
  fs::create_directories(root / "worker" / "device");
  std::ofstream(root / "memory" / "pool.h") << "#pragma once\n#include \"worker/device/backend.h\"\n"
                                            << "#include \"worker/engine/network.h\"\n";
  std::ofstream(root / "worker" / "engine" / "network.h") << "#include \"memory/pool.h\"\n";
  const Rules rules = read_rules(
      "## Who may include whom\n\n| part | may include |\n| --- | --- |\n"
      "| `worker/device` | |\n| `memory` | `worker/device` |\n"
      "| `worker/engine` | `memory`, `worker/device` |\n");
  const std::vector<std::string> found = violations(root, rules);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0],
            "memory/pool.h:3 includes worker/engine/network.h: memory may not include worker/engine");
}

}  // namespace
}  // namespace vtrain
