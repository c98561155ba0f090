#include "common/compute_settings.h"

#include <stdexcept>
#include <string>

namespace vtrain::common {
namespace {

constexpr std::string_view kFuseReluPrefix = "fuse_relu=";

// Sets the field of `settings` that one "@" suffix names.
void read_suffix(std::string_view suffix, ComputeSettings& settings) {
  if (auto precision = find_named(kPrecisionNames, suffix)) {
    settings.precision = *precision;
  } else if (auto layout = find_named(kLayoutChoiceNames, suffix)) {
    settings.layout = *layout;
  } else if (suffix.starts_with(kFuseReluPrefix)) {
    settings.fuse_relu = parse_named<std::invalid_argument>(
        kAutoOnOffNames, suffix.substr(kFuseReluPrefix.size()), "fuse_relu value");
  } else {
    throw std::invalid_argument("unknown suffix '@" + std::string(suffix) +
                                "' (known: a precision, a layout or fuse_relu=on|off)");
  }
}

}  // namespace

std::array<SettingText, kSettingCount> setting_texts(const ComputeSettings& settings) {
  return {{{"precision", precision_name(settings.precision)},
           {"layout", name_of(kLayoutChoiceNames, settings.layout)},
           {"fuse_relu", name_of(kAutoOnOffNames, settings.fuse_relu)}}};
}

void set_setting(ComputeSettings& settings, std::string_view name, std::string_view value) {
  using Error = std::invalid_argument;
  if (name == "precision") {
    settings.precision = parse_named<Error>(kPrecisionNames, value, "precision");
  } else if (name == "layout") {
    settings.layout = parse_named<Error>(kLayoutChoiceNames, value, "layout");
  } else if (name == "fuse_relu") {
    settings.fuse_relu = parse_named<Error>(kAutoOnOffNames, value, "fuse_relu value");
  } else {
    throw Error("unknown setting '" + std::string(name) + "'");
  }
}

std::string describe(const ComputeSettings& settings) {
  std::string text;
  for (const SettingText& s : setting_texts(settings)) {
    text += (text.empty() ? "" : ", ") + std::string(s.name) + " " + std::string(s.value);
  }
  return text;
}

SuffixedModelKey parse_suffixed_model_key(std::string_view key) {
  const size_t at = key.find('@');
  SuffixedModelKey parsed{std::string(key.substr(0, at)), {}};
  if (at == std::string_view::npos) return parsed;
  std::string_view rest = key.substr(at + 1);
  for (;;) {
    const size_t end = rest.find('@');
    read_suffix(rest.substr(0, end), parsed.settings);
    if (end == std::string_view::npos) return parsed;
    rest.remove_prefix(end + 1);
  }
}

}  // namespace vtrain::common
