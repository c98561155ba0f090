// Config loading: YAML text -> validated plain structs. Only this part
// includes yaml-cpp (through common/yaml_reader.h): config.cpp loads the
// text and applies --set (config_overrides.cpp), config_sections.cpp reads
// every section, config_dump.cpp writes the effective config back.
//
// Reading is strict: every map is checked against the keys it may hold, every
// value against its type and range, and every error names where the value came
// from (FILE:LINE or --set) and its key path.
#include "configs/config.h"

#include <filesystem>

#include "common/text_file.h"
#include "configs/internal/config_parts.h"

namespace vtrain::config {
namespace {

using namespace common::yaml;

namespace fs = std::filesystem;

// Records the key path of every map entry and list item under `node`, with
// its line (0 for values --set created or wrote).
void record_origins(const YAML::Node& node, const std::string& path, const Source& source,
                    std::vector<KeyOrigin>& origins) {
  auto add = [&](const std::string& key, const YAML::Node& at, const YAML::Node& value) {
    origins.push_back({key, source.from_override(key) ? 0 : line_of(at, 0)});
    record_origins(value, key, source, origins);
  };
  if (node.IsMap()) {
    for (const auto& entry : node) {
      if (!entry.first.IsScalar()) continue;
      add(path.empty() ? entry.first.Scalar() : path + "." + entry.first.Scalar(), entry.first,
          entry.second);
    }
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      add(path + "[" + std::to_string(i) + "]", node[i], node[i]);
    }
  }
}

Config parse(const std::string& text, const std::string& file, const fs::path& file_dir,
             const std::vector<std::string>& overrides) {
  Source source{file, file_dir, {}};
  YAML::Node root_node = load_document(text, file, "config");
  for (const auto& arg : overrides) {
    internal::apply_override(root_node, arg, source.overridden);
  }

  const Field root(source, root_node, true, "", 0);
  Config config = internal::read_sections(root);
  config.path = file;
  record_origins(root_node, "", source, config.origins);
  if (config.profile.db.empty()) {
    config.profile.db = (file_dir / "perf.db").lexically_normal().string();
  }
  return config;
}
}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string text = common::read_text_file(path, "config", kMaxConfigBytes);
  return parse(text, path, fs::absolute(path).parent_path(), overrides);
}

Config parse_config(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  return parse(yaml_text, origin, fs::current_path(), overrides);
}

std::string where_at(const Config& config, const std::string& key) {
  for (const KeyOrigin& origin : config.origins) {
    if (origin.key != key) continue;
    if (origin.line == 0) return "--set " + key;
    return config.path + ":" + std::to_string(origin.line) + ": " + key;
  }
  return config.path + ": " + key;
}

void fail_at(const Config& config, const std::string& key, const std::string& message) {
  throw ConfigError(where_at(config, key) + ": " + message);
}

}  // namespace vtrain::config
