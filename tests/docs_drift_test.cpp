// The reference pages cannot drift from the code.
//
//  - docs/config.md has one row per key the config loader accepts, and every
//    key it documents is accepted. The keys come from the loader itself: a
//    probe key in each map makes it list what it allows ("unknown key
//    (allowed: ...)"), maps inside maps are found the same way, and every
//    data kind and layer type is probed in turn. A key with a fixed set of
//    values must name each of them (`value`) in its row.
//  - docs/cli.md has one row per command and per flag that `vtrain help` and
//    `vtrain help COMMAND` list, and documents no other; every environment
//    variable the C++ sources read has a row too.
//  - `vtrain --version` prints the version CMakeLists.txt's project() gives.
//
// Each failure names the key, flag or variable and the side it is missing on.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "configs/config.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;
using Names = std::set<std::string>;

constexpr const char* kProbe = "vtrain_docs_probe";

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// ---- the docs' tables

// The rows of every Markdown table in `text` whose header's first cell is
// `first_header`, keyed by each `code` span of the row's first cell that
// `accept` keeps, with the whole row as value.
std::map<std::string, std::string> table_rows(const std::string& text, const std::string& first_header,
                                              const std::regex& accept) {
  std::map<std::string, std::string> rows;
  std::istringstream lines(text);
  bool in_table = false;
  const std::regex header("^\\|\\s*" + first_header + "\\s*\\|");
  const std::regex code("`([^`]+)`");
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '|') {
      in_table = false;
      continue;
    }
    if (std::regex_search(line, header)) {
      in_table = true;
      continue;
    }
    if (!in_table || line.find("---") != std::string::npos) continue;
    const std::string first_cell = line.substr(1, line.find('|', 1) - 1);
    for (std::sregex_iterator m(first_cell.begin(), first_cell.end(), code), end; m != end; ++m) {
      std::smatch name;
      const std::string span = (*m)[1];
      if (std::regex_search(span, name, accept)) rows[name[0]] = line;
    }
  }
  return rows;
}

// Names in `a` that `b` lacks.
Names missing_from(const Names& a, const std::map<std::string, std::string>& b) {
  Names out;
  for (const std::string& name : a) {
    if (!b.count(name)) out.insert(name);
  }
  return out;
}

std::string listed(const Names& names) {
  std::string out;
  for (const std::string& n : names) out += "\n  " + n;
  return out;
}

Names keys_of(const std::map<std::string, std::string>& rows) {
  Names out;
  for (const auto& [name, row] : rows) out.insert(name);
  return out;
}

// ---- the config loader's keys

// A config that parses, with the model given as `model` (YAML lines).
std::string config_text(const std::string& model) {
  return "model:\n" + model + "data:\n  kind: synthetic\n";
}
const std::string kPresetModel = "  preset: lenet\n";

// The second layer of a two-layer model has `type`, so that probing
// model.layers[1] asks the loader about that layer type.
std::string layer_model(const std::string& type) {
  return "  layers:\n    - {name: d, type: input}\n    - {name: l, type: " + type + "}\n";
}

// The list the loader's message gives after "(allowed: " or "(known: ",
// when the message is about `--set path` and contains `marker`.
std::optional<std::vector<std::string>> list_in_message(const std::string& message,
                                                        const std::string& path,
                                                        const std::string& marker) {
  if (message.rfind("--set " + path + ":", 0) != 0) return std::nullopt;
  const size_t at = message.find(marker);
  if (at == std::string::npos) return std::nullopt;
  size_t open = message.find("(allowed: ", at);
  size_t skip = 10;
  if (open == std::string::npos) {
    open = message.find("(known: ", at);
    skip = 8;
  }
  if (open == std::string::npos) return std::nullopt;
  const size_t close = message.find(')', open);
  std::vector<std::string> items;
  std::istringstream list(message.substr(open + skip, close - open - skip));
  for (std::string item; std::getline(list, item, ',');) {
    items.push_back(item.substr(item.find_first_not_of(' ')));
  }
  return items;
}

// The message parsing `text` with `overrides` throws ("" when it parses).
std::string load_error(const std::string& text, const std::vector<std::string>& overrides) {
  try {
    config::parse_config(text, "probe.yaml", overrides);
  } catch (const config::ConfigError& error) {
    return error.what();
  }
  return "";
}

struct LoaderKeys {
  Names keys;                                      // documented names, e.g. model.layers[].out
  std::map<std::string, Names> choices;            // a key's fixed set of values
};

// Walks the map at `path` (a --set path; "" = the top level) of the config
// `text` + `overrides`, recording its keys as `doc_prefix` + key.
void walk_map(const std::string& text, const std::vector<std::string>& overrides,
              const std::string& path, const std::string& doc_prefix, LoaderKeys& out) {
  const auto probe = [&](const std::string& key, const std::string& value, const std::string& marker) {
    std::vector<std::string> with = overrides;
    with.push_back(key + "=" + value);
    return list_in_message(load_error(text, with), key, marker);
  };
  const auto at = [&](const std::string& key) { return path.empty() ? key : path + "." + key; };
  const auto allowed = probe(at(kProbe), "1", "unknown key");
  ASSERT_TRUE(allowed) << "the loader lists no keys for " << (path.empty() ? "the top level" : path);
  for (const std::string& key : *allowed) {
    const std::string doc = doc_prefix + key;
    // A map of its own is documented by its keys' rows.
    if (probe(at(key) + "." + kProbe, "1", "unknown key")) {
      walk_map(text, overrides, at(key), doc + ".", out);
      continue;
    }
    out.keys.insert(doc);
    if (auto values = probe(at(key), kProbe, std::string("'") + kProbe + "' (")) {
      out.choices[doc].insert(values->begin(), values->end());
    }
  }
}

LoaderKeys loader_keys() {
  LoaderKeys out;
  const std::string text = config_text(kPresetModel);
  walk_map(text, {}, "", "", out);
  // data's keys depend on its kind, a layer's on its type: walk each.
  for (const std::string& kind : out.choices["data.kind"]) {
    walk_map(text, {"data.kind=" + kind}, "data", "data.", out);
  }
  LoaderKeys layers;
  walk_map(config_text(layer_model("input")), {}, "model.layers[1]", "model.layers[].", layers);
  for (const std::string& type : layers.choices["model.layers[].type"]) {
    walk_map(config_text(layer_model(type)), {}, "model.layers[1]", "model.layers[].", layers);
  }
  out.keys.insert(layers.keys.begin(), layers.keys.end());
  for (auto& [key, values] : layers.choices) out.choices[key].insert(values.begin(), values.end());
  return out;
}

TEST(DocsDrift, ConfigMdHasARowForEveryKeyTheLoaderAcceptsAndNoOther) {
  const LoaderKeys loader = loader_keys();
  ASSERT_GT(loader.keys.size(), 50u) << "the probe found too few keys:" << listed(loader.keys);
  const auto rows = table_rows(read_text(fs::path(test_support::source_dir()) / "docs/config.md"),
                               "key", std::regex("^[a-z_]+(\\[\\])?(\\.[a-z_]+(\\[\\])?)*$"));
  EXPECT_EQ(missing_from(loader.keys, rows), Names{})
      << "keys the config loader accepts without a row in docs/config.md:"
      << listed(missing_from(loader.keys, rows));
  const Names documented = keys_of(rows);
  Names not_accepted;
  for (const std::string& key : documented) {
    if (!loader.keys.count(key)) not_accepted.insert(key);
  }
  EXPECT_EQ(not_accepted, Names{}) << "keys docs/config.md documents that the loader does not accept:"
                                   << listed(not_accepted);
  for (const auto& [key, values] : loader.choices) {
    if (!rows.count(key)) continue;
    for (const std::string& value : values) {
      EXPECT_TRUE(rows.at(key).find("`" + value + "`") != std::string::npos)
          << "docs/config.md's row for " << key << " does not name the value `" << value << "`";
    }
  }
}

// ---- the CLI

// The words `vtrain help` lists as commands, from the error for a topic
// that is none of them.
Names cli_commands() {
  const auto r = test_support::run_vtrain(std::string("help ") + kProbe);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const size_t at = r.output.find("(commands: ");
  EXPECT_NE(at, std::string::npos) << r.output;
  Names commands;
  if (at == std::string::npos) return commands;
  std::istringstream list(r.output.substr(at + 11, r.output.find(')', at) - at - 11));
  for (std::string item; std::getline(list, item, ',');) {
    commands.insert(item.substr(item.find_first_not_of(' ')));
  }
  return commands;
}

// Every --flag in the help of vtrain and of each command.
Names cli_flags(const Names& commands) {
  Names flags;
  const std::regex flag("(^|[\\s\\[(|,])(--[a-z][a-z0-9-]*)");
  std::vector<std::string> topics = {""};
  topics.insert(topics.end(), commands.begin(), commands.end());
  for (const std::string& topic : topics) {
    const auto r = test_support::run_vtrain("help " + topic);
    EXPECT_EQ(r.exit_code, 0) << "vtrain help " << topic << ":\n" << r.output;
    for (std::sregex_iterator m(r.output.begin(), r.output.end(), flag), end; m != end; ++m) {
      flags.insert((*m)[2]);
    }
  }
  return flags;
}

// Names and documented rows compared both ways, one failure per side.
void expect_same(const Names& code, const std::map<std::string, std::string>& rows,
                 const std::string& what, const std::string& source) {
  EXPECT_EQ(missing_from(code, rows), Names{})
      << what << " " << source << " lists without a row in docs/cli.md:" << listed(missing_from(code, rows));
  Names extra;
  for (const std::string& name : keys_of(rows)) {
    if (!code.count(name)) extra.insert(name);
  }
  EXPECT_EQ(extra, Names{}) << what << " docs/cli.md documents that " << source
                            << " does not list:" << listed(extra);
}

TEST(DocsDrift, CliMdHasARowForEveryCommandAndFlagOfVtrainHelpAndNoOther) {
  const std::string cli_md = read_text(fs::path(test_support::source_dir()) / "docs/cli.md");
  const Names commands = cli_commands();
  ASSERT_FALSE(commands.empty());
  expect_same(commands, table_rows(cli_md, "command", std::regex("^[a-z]+")), "commands",
              "vtrain help");
  expect_same(cli_flags(commands), table_rows(cli_md, "flag", std::regex("--[a-z][a-z0-9-]*")),
              "flags", "vtrain help");
}

// The VTRAIN_* names that the C++ sources and scripts quote, read as
// environment variables.
Names environment_variables_read() {
  // Built from two pieces so that this file's own text does not match.
  const std::regex quoted(std::string("\"(VTRAIN") + "_[A-Z0-9_]+)\"");
  Names names;
  const fs::path root = test_support::source_dir();
  for (const char* dir : {"launcher", "configs", "worker", "memory", "balancer", "perfdb", "common",
                          "tests"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = entry.path().extension().string();
      if (ext != ".cpp" && ext != ".h" && ext != ".cu") continue;
      const std::string text = read_text(entry.path());
      for (std::sregex_iterator m(text.begin(), text.end(), quoted), end; m != end; ++m) {
        names.insert((*m)[1]);
      }
    }
  }
  return names;
}

TEST(DocsDrift, CliMdHasARowForEveryEnvironmentVariableTheSourcesRead) {
  const std::string cli_md = read_text(fs::path(test_support::source_dir()) / "docs/cli.md");
  const auto rows = table_rows(cli_md, "variable", std::regex("^VTRAIN_[A-Z0-9_]+$"));
  const Names read = environment_variables_read();
  ASSERT_FALSE(read.empty());
  EXPECT_EQ(missing_from(read, rows), Names{})
      << "environment variables the sources read without a row in docs/cli.md:"
      << listed(missing_from(read, rows));
}

TEST(DocsDrift, VersionIsTheProjectVersion) {
  const std::string cmake = read_text(fs::path(test_support::source_dir()) / "CMakeLists.txt");
  std::smatch version;
  ASSERT_TRUE(std::regex_search(cmake, version, std::regex("project\\(vtrain VERSION ([0-9.]+)")));
  const auto r = test_support::run_vtrain("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "vtrain " + version[1].str() + "\n");
}

}  // namespace
}  // namespace vtrain
