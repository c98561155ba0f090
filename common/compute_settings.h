// How a job computes its model, apart from the model itself: the settings
// that change a step's time, its memory or its numbers but not the
// architecture (the model graph and its signature). Their measurements are
// kept apart per value: the perf DB's typed columns, a plan's fields, all
// named by the rows of kSettings below.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/name_table.h"
#include "common/precision.h"

namespace vtrain::common {

// The activation layout a job asks for (device.layout): the backend's own
// choice, or one forced.
enum class LayoutChoice : uint8_t {
  kAuto,  // the CPU: its ISA's channel block (nChw16c / nChw8c); a GPU:
          // NHWC under bf16 / fp16 (tensor cores' layout) for channels in
          // groups of 8, NCHW otherwise
  kNchw,  // plain NCHW everywhere
  kNhwc,  // channels last everywhere
};
inline constexpr auto kLayoutChoiceNames = std::to_array<Named<LayoutChoice>>(
    {{LayoutChoice::kAuto, "auto"}, {LayoutChoice::kNchw, "nchw"}, {LayoutChoice::kNhwc, "nhwc"}});

struct ComputeSettings {
  Precision precision = Precision::kFp32;  // train.precision
  LayoutChoice layout = LayoutChoice::kAuto;  // device.layout
  AutoOnOff fuse_relu = AutoOnOff::kAuto;  // conv.fuse_relu: auto where the backend
                                           // gains from it (Backend::prefers)

  // The type activations and their gradients are stored in.
  DataType activation_type() const { return storage_type(precision); }
  friend bool operator==(const ComputeSettings&, const ComputeSettings&) = default;
};

// The run settings, one row each: the one list that names them for the
// config (its key, read and dumped by the row), the perf DB (a column per
// row in the tables keyed on a model) and the plan file (a field per row).
// Adding a setting is its field in ComputeSettings above, its row in
// kSettings below, a perf DB migration adding its column
// (perfdb/internal/schema.cpp), the code that acts on it, and its docs.
struct Setting {
  const char* name;        // the perf DB's column and the plan's field: "layout"
  const char* config_key;  // where the config holds it: "device.layout"
  // Whether the config reads and dumps it by this row; false for
  // train.precision, whose section also takes a precision per rank.
  bool plain_config_key;
  // The value's name in the config: "nhwc".
  std::string_view (*text)(const ComputeSettings& settings);
  // Sets the value named `value`; false (nothing set) when none is.
  bool (*parse)(ComputeSettings& settings, std::string_view value);
  // Every value's name, in the order messages list them.
  std::vector<std::string> (*choices)();
};

// A row for the ComputeSettings field `Field`, an enum named by the
// common::Named table `Names`.
template <auto Field, const auto& Names>
constexpr Setting named_setting(const char* name, const char* config_key, bool plain_config_key) {
  return {name, config_key, plain_config_key,
          [](const ComputeSettings& s) -> std::string_view { return name_of(Names, s.*Field); },
          [](ComputeSettings& s, std::string_view value) {
            const auto found = find_named(Names, value);
            if (found) s.*Field = *found;
            return found.has_value();
          },
          [] { return names_of(Names); }};
}

// Every run setting, in the order of the perf DB's columns.
inline constexpr std::array kSettings = {
    named_setting<&ComputeSettings::precision, kPrecisionNames>("precision", "train.precision", false),
    named_setting<&ComputeSettings::layout, kLayoutChoiceNames>("layout", "device.layout", true),
    named_setting<&ComputeSettings::fuse_relu, kAutoOnOffNames>("fuse_relu", "conv.fuse_relu", true),
};
inline constexpr size_t kSettingCount = kSettings.size();

// The row named `name`, or nullptr.
const Setting* find_setting(std::string_view name);
// Sets `setting` of `settings` to the value named `value`. Throws
// std::invalid_argument for an unknown value ("unknown layout 'nhcw'
// (known: auto, nchw, nhwc)").
void set_setting(ComputeSettings& settings, const Setting& setting, std::string_view value);
// For messages: "precision bf16, layout nhwc, fuse_relu on".
std::string describe(const ComputeSettings& settings);

// A model key as vtrain wrote it before the settings were typed (perf DB
// schema 7 and older, plan format 1): the model's signature followed by
// "@<precision>" unless fp32, "@<layout>" unless auto and
// "@fuse_relu=<on|off>" unless auto.
struct SuffixedModelKey {
  std::string signature;
  ComputeSettings settings;
};
// Splits such a key. Throws std::invalid_argument naming a suffix that is
// none of those (the caller adds which file and field held it).
SuffixedModelKey parse_suffixed_model_key(std::string_view key);

}  // namespace vtrain::common
