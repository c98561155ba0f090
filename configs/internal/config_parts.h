// The pieces of the config loader, one file each (see config.cpp).
#pragma once

#include <string>
#include <vector>

#include "common/yaml_reader.h"
#include "configs/config.h"

namespace vtrain::config::internal {

// Every section under the config's top-level map `root` (config_sections.cpp).
// Leaves Config::path and the default profile.db to the caller.
Config read_sections(const common::yaml::Field& root);

// The run settings (common::kSettings) that `section` holds under a plain
// key, with that key: {"layout", device.layout's row} for "device", in
// table order (config_sections.cpp).
struct SectionSetting {
  std::string key;
  const common::Setting* setting;
};
std::vector<SectionSetting> settings_in(const std::string& section);

// Applies "a.b.c=value" to the tree (config_overrides.cpp); the key paths it
// creates are appended to `overridden`, for messages that blame --set.
void apply_override(YAML::Node& root, const std::string& arg,
                    std::vector<std::string>& overridden);

// A per-sample shape as "CxHxW" (model_graph.cpp).
std::string chw(const worker::Shape& s);
// The key that set the model's input size: data.shape for synthetic data,
// else data.kind (IDX and CIFAR-10 files fix their shape).
std::string input_key(const Config& config);

}  // namespace vtrain::config::internal
