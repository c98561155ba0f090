#include "common/compute_settings.h"

#include <stdexcept>

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
