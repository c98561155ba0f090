// Text every part formats the same way: byte sizes, integer lists, JSON strings.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vtrain::common {

// "512 B", "1.50 KiB", "384 MiB", "2.25 GiB": binary units, at most three
// significant decimals, trailing zeros dropped.
std::string format_bytes(uint64_t bytes);

// "512 B", "256.0 KiB", "2.0 MiB", "1.25 GiB": one decimal below GiB, two
// from GiB on (the memory part's messages and reports).
std::string format_bytes_fixed(uint64_t bytes);

// "0.5 MiB", "64.0 MiB": always MiB with one decimal (plan and run summaries).
std::string format_mib(uint64_t bytes);

// "8, 16, 32": a list of integers, comma separated.
std::string format_list(std::span<const int64_t> values);

// "a, b, c": the items with `separator` between them.
inline std::string join(const std::vector<std::string>& items,
                        std::string_view separator = ", ") {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

// "64MiB", "1.5GB", "4096", "2k" -> bytes. Binary (KiB, MiB, GiB, TiB) and
// decimal (kB, MB, GB, TB) units. Throws InputError (without location) otherwise.
uint64_t parse_size(const std::string& text);

// printf into a std::string of whatever length the result has (no fixed
// buffer that would cut a long line short).
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// `text` with each NUL byte written as \0: a message that holds one would
// end there wherever it is read as a C string (what(), printf's %s).
std::string escape_nul(std::string_view text);

// `text` as a JSON string literal, quotes included: \" \\ \n \r \t escaped,
// other control characters as \u00XX.
std::string json_quote(std::string_view text);

}  // namespace vtrain::common
