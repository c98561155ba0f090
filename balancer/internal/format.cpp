#include "balancer/internal/format.h"

#include <cstdio>

namespace vtrain::balancer::internal {
namespace {

// printf("%.*f") without the trailing zeros (and point) it pads with.
std::string trimmed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  std::string text = buffer;
  if (text.find('.') != std::string::npos) {
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
  }
  return text;
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return std::to_string(bytes) + " B";
  const int decimals = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return trimmed(value, decimals) + " " + kUnits[unit];
}

std::string format_list(std::span<const int64_t> values) {
  std::string text;
  for (int64_t value : values) {
    if (!text.empty()) text += ", ";
    text += std::to_string(value);
  }
  return text;
}

}  // namespace vtrain::balancer::internal
