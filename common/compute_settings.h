// How a job computes its model, apart from the model itself: the settings
// that change a step's time, its memory or its numbers but not the
// architecture (the model graph and its signature). Their measurements are
// kept apart per value: the perf DB's typed columns, a plan's fields.
//
//   precision  train.precision: the type activations are stored in, the math
//   layout     device.layout: the activations' layout the backend uses
//   fuse_relu  conv.fuse_relu: whether a conv's bias is added by the relu after it
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

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

// One setting as the stores keep it, each in a place of its own: the perf
// DB's column and the plan file's field are named `name`, and hold the
// value's name in the config. The list below is the one place that names
// the settings for them: a new setting is an entry here, its config key,
// and a perf DB migration adding its column.
struct SettingText {
  const char* name;        // "precision", "layout", "fuse_relu"
  std::string_view value;  // "bf16", "nhwc", "on"
};
inline constexpr size_t kSettingCount = 3;
// Every setting of `settings`, in the order of the perf DB's columns.
std::array<SettingText, kSettingCount> setting_texts(const ComputeSettings& settings);
// Sets the setting named `name` to the value named `value`. Throws
// std::invalid_argument for an unknown setting or value ("unknown layout
// 'nhcw' (known: auto, nchw, nhwc)").
void set_setting(ComputeSettings& settings, std::string_view name, std::string_view value);
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
