#include "common/device_label.h"

#include <charconv>

namespace vtrain::common {
namespace {

// " (N threads)" as text() writes it.
std::string threads_qualifier(int threads) {
  return " (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)");
}

}  // namespace

std::string DeviceLabel::text() const {
  return threads ? name + threads_qualifier(*threads) : name;
}

DeviceLabel DeviceLabel::parse(std::string_view text) {
  const size_t open = text.rfind(" (");
  if (open == std::string_view::npos) return {std::string(text), std::nullopt};
  const std::string_view count = text.substr(open + 2);
  int threads = 0;
  std::from_chars(count.data(), count.data() + count.size(), threads);
  if (threads >= 1 && text.substr(open) == threads_qualifier(threads)) {
    return {std::string(text.substr(0, open)), threads};
  }
  return {std::string(text), std::nullopt};
}

}  // namespace vtrain::common
