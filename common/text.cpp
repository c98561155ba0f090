#include "common/text.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>
#include <string_view>
#include <utility>

#include "common/input_error.h"

namespace vtrain::common {
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

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int size = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string text(size > 0 ? static_cast<size_t>(size) : 0, '\0');
  if (size > 0) std::vsnprintf(text.data(), text.size() + 1, fmt, again);
  va_end(again);
  return text;
}

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

std::string escape_nul(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\0') {
      out += "\\0";
    } else {
      out += c;
    }
  }
  return out;
}

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Units are case-insensitive. Decimal: B, k/kB (1000), M/MB, G/GB, T/TB;
// binary: KiB (1024), MiB, GiB, TiB. "2k" and "2K" are both 2000: a lone
// letter follows the SI prefix, and anyone who means 1024 writes KiB.
uint64_t parse_size(const std::string& text) {
  const auto fail = [&](const std::string& why) {
    return InputError("invalid size '" + text + "': " + why);
  };
  const std::string units =
      "B, k, kB, M, MB, G, GB, T, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)";

  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.starts_with('-')) throw fail("sizes cannot be negative");
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s.front()))) {
    throw fail("expected a number of bytes with an optional unit, e.g. 64MiB, 1.5GB or 4096");
  }

  // Exact integer arithmetic: "1.5GB" is 1500000000, not a rounded double.
  using Wide = unsigned __int128;
  constexpr Wide kMax = std::numeric_limits<uint64_t>::max();
  Wide whole = 0;
  size_t i = 0;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole > kMax) throw fail("too large (the limit is 2^64 - 1 bytes)");
  }
  std::string fraction;
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) fraction += s[i];
    if (fraction.empty()) throw fail("expected digits after the decimal point");
  }
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;

  std::string unit(s.substr(i));
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1000},
      {"kb", 1000},
      {"m", 1000'000},
      {"mb", 1000'000},
      {"g", 1000'000'000},
      {"gb", 1000'000'000},
      {"t", 1000'000'000'000},
      {"tb", 1000'000'000'000},
      {"kib", uint64_t{1} << 10},
      {"mib", uint64_t{1} << 20},
      {"gib", uint64_t{1} << 30},
      {"tib", uint64_t{1} << 40},
  };
  const auto* match = std::find_if(std::begin(kUnits), std::end(kUnits),
                                   [&](const auto& entry) { return unit == entry.first; });
  if (match == std::end(kUnits)) {
    throw fail("unknown unit '" + std::string(s.substr(i)) + "' (known: " + units + ")");
  }
  const Wide multiplier = match->second;

  while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
  // Beyond 19 significant decimals no multiplier here gives whole bytes.
  if (fraction.size() > 19) throw fail("not a whole number of bytes");
  Wide numerator = 0, denominator = 1;
  for (char digit : fraction) {
    numerator = numerator * 10 + static_cast<unsigned>(digit - '0');
    denominator *= 10;
  }
  if (numerator * multiplier % denominator != 0) throw fail("not a whole number of bytes");
  const Wide bytes = whole * multiplier + numerator * multiplier / denominator;
  if (bytes > kMax) throw fail("too large (the limit is 2^64 - 1 bytes)");
  return static_cast<uint64_t>(bytes);
}

std::string format_bytes_fixed(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

std::string format_mib(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace vtrain::common
