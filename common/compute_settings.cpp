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

const Setting* find_setting(std::string_view name) {
  for (const Setting& setting : kSettings) {
    if (name == setting.name) return &setting;
  }
  return nullptr;
}

void set_setting(ComputeSettings& settings, const Setting& setting, std::string_view value) {
  if (!setting.parse(settings, value)) {
    throw std::invalid_argument("unknown " + std::string(setting.name) + " '" + std::string(value) +
                                "' (known: " + join(setting.choices()) + ")");
  }
}

std::string describe(const ComputeSettings& settings) {
  std::string text;
  for (const Setting& s : kSettings) {
    text += (text.empty() ? "" : ", ") + std::string(s.name) + " " + std::string(s.text(settings));
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
