// Config loading, --set KEY.PATH=VALUE: the value, parsed as YAML, written
// into the tree before the sections are read.
#include <algorithm>
#include <cctype>
#include <sstream>
#include <string>
#include <vector>

#include "configs/internal/config_parts.h"

namespace vtrain::config::internal {
namespace {

// The steps of KEY.PATH: map keys, and list indices (NAME[INDEX]).
struct Step {
  std::string name;
  bool is_index = false;
};

std::vector<Step> parse_key_path(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream stream(key);
  for (std::string part; std::getline(stream, part, '.');) parts.push_back(part);
  if (key.back() == '.' ||
      std::any_of(parts.begin(), parts.end(), [](const auto& p) { return p.empty(); })) {
    throw ConfigError("--set " + key + ": empty name in key path");
  }
  std::vector<Step> steps;
  for (const std::string& part : parts) {
    size_t at = part.find('[');
    if (at == 0) throw ConfigError("--set " + key + ": '" + part + "' has no name before '['");
    steps.push_back({part.substr(0, at)});
    while (at != std::string::npos) {
      const size_t close = part.find(']', at);
      const std::string digits =
          close == std::string::npos ? "" : part.substr(at + 1, close - at - 1);
      const auto is_digit = [](unsigned char c) { return std::isdigit(c) != 0; };
      if (digits.empty() || !std::all_of(digits.begin(), digits.end(), is_digit) ||
          digits.size() > 9 || (close + 1 < part.size() && part[close + 1] != '[')) {
        throw ConfigError("--set " + key + ": '" + part +
                          "' is not NAME or NAME[INDEX] (INDEX a number from 0)");
      }
      steps.push_back({digits, true});
      at = close + 1 < part.size() ? close + 1 : std::string::npos;
    }
  }
  return steps;
}

}  // namespace

// Applies "a.b.c=value" to the tree, creating missing sections; "NAME[I]"
// steps into entry I of a list (the path error messages print, e.g.
// model.layers[1].out). The key path is checked later with the rest of the
// config, so an unknown key gets the same message (with --set as its
// origin).
void apply_override(YAML::Node& root, const std::string& arg,
                    std::vector<std::string>& overridden) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("--set " + arg + ": expected KEY.PATH=VALUE, e.g. train.batch=32");
  }
  const std::string key = arg.substr(0, eq);
  const std::vector<Step> steps = parse_key_path(key);
  YAML::Node value;
  try {
    value = YAML::Load(arg.substr(eq + 1));
  } catch (const YAML::Exception& error) {
    throw ConfigError("--set " + key + ": invalid YAML value: " + error.msg);
  }

  // yaml-cpp nodes are references and `operator=` writes through them, so
  // walking uses reset() to rebind the cursor instead.
  YAML::Node cursor;
  cursor.reset(root);
  std::string path;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string what = path.empty() ? "the config" : path;
    const bool last = i + 1 == steps.size();
    if (steps[i].is_index) {
      const size_t index = std::stoul(steps[i].name);
      if (!cursor.IsSequence()) throw ConfigError("--set " + key + ": " + what + " is not a list");
      if (index >= cursor.size()) {
        throw ConfigError("--set " + key + ": " + what + " has " + std::to_string(cursor.size()) +
                          " entries, so no [" + std::to_string(index) + "]");
      }
      // As messages name it: [1], not [01]. One append at a time: "[" + ...
      // trips a GCC 12 -Wrestrict false positive.
      path += '[';
      path += std::to_string(index);
      path += ']';
      if (last) {
        cursor[index] = value;
        break;
      }
      YAML::Node next = cursor[index];
      cursor.reset(next);
      continue;
    }
    const std::string& name = steps[i].name;
    if (!cursor.IsMap() && !cursor.IsNull()) {
      throw ConfigError("--set " + key + ": " + what + " is not a map of keys");
    }
    path += (path.empty() ? "" : ".") + name;
    if (last) {
      cursor[name] = value;
      break;
    }
    YAML::Node next = cursor[name];
    if (!next.IsDefined()) {
      if (steps[i + 1].is_index) {
        throw ConfigError("--set " + key + ": " + path + " is not in the config, so it has no [" +
                          std::to_string(std::stoul(steps[i + 1].name)) + "]");
      }
      cursor[name] = YAML::Node(YAML::NodeType::Map);
      next.reset(cursor[name]);
      overridden.push_back(path);  // a section the file does not have
    }
    cursor.reset(next);
  }
  overridden.push_back(path);
}
}  // namespace vtrain::config::internal
