// One table per enum that users name in a config, a plan or on the command
// line: the enum's values with their names, in the order messages list them.
// The part that owns the enum declares the table in its header, e.g.
//
//   inline constexpr auto kPolicyNames = std::to_array<common::Named<Policy>>(
//       {{Policy::kNone, "none"}, {Policy::kAll, "all"}});
//
// and everything that prints or parses a value (the config loader, the plan
// file, the CLI) goes through it, so the list of choices is written once.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/text.h"

namespace vtrain::common {

template <class E>
struct Named {
  E value;
  const char* name;
};

// The name of `value`; "?" for a value missing from the table (a bug in the
// table, which tests/config_test.cpp checks for every table).
template <class E, size_t N>
constexpr const char* name_of(const std::array<Named<E>, N>& table, E value) {
  for (const Named<E>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

// The value named `name` (exact, case-sensitive), or nullopt.
template <class E, size_t N>
constexpr std::optional<E> find_named(const std::array<Named<E>, N>& table,
                                      std::string_view name) {
  for (const Named<E>& entry : table) {
    if (name == entry.name) return entry.value;
  }
  return std::nullopt;
}

// Every name, in table order.
template <class E, size_t N>
std::vector<std::string> names_of(const std::array<Named<E>, N>& table) {
  std::vector<std::string> names;
  for (const Named<E>& entry : table) names.emplace_back(entry.name);
  return names;
}

// The value named `name`; otherwise throws Error("unknown WHAT 'NAME'
// (known: a, b, c)").
template <class Error, class E, size_t N>
E parse_named(const std::array<Named<E>, N>& table, std::string_view name,
              const std::string& what) {
  if (std::optional<E> value = find_named(table, name)) return *value;
  throw Error("unknown " + what + " '" + std::string(name) + "' (known: " +
              join(names_of(table)) + ")");
}

// A setting that is auto (the part that owns it decides), on or off, such
// as train.loss_scaling.mode.
enum class AutoOnOff { kAuto, kOn, kOff };
inline constexpr auto kAutoOnOffNames = std::to_array<Named<AutoOnOff>>(
    {{AutoOnOff::kAuto, "auto"}, {AutoOnOff::kOn, "on"}, {AutoOnOff::kOff, "off"}});

}  // namespace vtrain::common
