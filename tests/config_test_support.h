// Helpers shared by the config loader's tests (config_test.cpp,
// config_errors_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "configs/config.h"
#include "tests/test_support.h"
#include "worker/engine/graph.h"

namespace vtrain::config {

namespace fs = std::filesystem;
using test_support::TempDir;
using worker::LayerType;


// The smallest valid config; tests append sections from line 5 on.
constexpr const char* kMinimal =
    "model:\n"              // 1
    "  preset: lenet\n"     // 2
    "data:\n"               // 3
    "  kind: synthetic\n";  // 4

inline Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config(text, "t.yaml", overrides);
}

// The message of the ConfigError that parsing `text` throws.
inline std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

inline std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

inline fs::path source_dir() { return test_support::source_dir(); }


}  // namespace vtrain::config
