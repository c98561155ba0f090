// Strict reading of YAML documents: a Field is a value at a key path that
// knows its file, line and path and reports errors about itself ("FILE:LINE:
// KEY: what was expected", or "--set KEY: ..." for a value from an
// override); a Section is a map whose keys are checked; to_int, to_choice,
// ... convert a Field's scalar with bounds. Shared by the config loader
// (configs/) and the plan file reader (balancer/), the two places that read
// YAML. Errors throw common::InputError.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/input_error.h"
#include "common/name_table.h"
#include "common/text.h"

namespace vtrain::common::yaml {

namespace fs = std::filesystem;

using Keys = std::vector<std::string>;
using common::join;  // (common/text.h) for the messages that list keys

// Shortest text that reads back as the same value ("0.05", not
// "0.050000000000000003").
template <typename Float>
inline std::string format_number(Float value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

// Where values come from, for messages and for resolving relative paths.
struct Source {
  std::string file;                     // the config file name as given
  fs::path file_dir;                    // relative paths in the file resolve here
  std::vector<std::string> overridden;  // key paths written (or created) by --set

  // A value is from --set when its path or an enclosing one was set.
  bool from_override(const std::string& path) const {
    for (const auto& key : overridden) {
      if (path == key) return true;
      if (path.size() > key.size() && path.starts_with(key) &&
          (path[key.size()] == '.' || path[key.size()] == '[')) {
        return true;
      }
    }
    return false;
  }
};

// The one YAML document of `text`, read from `origin` (a file name) and
// holding a `what` ("config", "plan"); empty text is a null node. A
// syntax error is "ORIGIN:LINE:COLUMN: YAML syntax error: ..."; a second
// document with content ("---" and more keys), which reading only the
// first would drop unseen, is an error at its line.
inline YAML::Node load_document(const std::string& text, const std::string& origin,
                                const std::string& what) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::Exception& error) {
    throw InputError(origin + ":" + std::to_string(error.mark.line + 1) + ":" +
                     std::to_string(error.mark.column + 1) + ": YAML syntax error: " + error.msg);
  }
  for (size_t i = 1; i < documents.size(); ++i) {
    if (documents[i].IsNull()) continue;  // a stray "---" at the end: nothing is dropped
    throw InputError(origin + ":" + std::to_string(documents[i].Mark().line + 1) +
                     ": a second YAML document (after '---'); a " + what +
                     " is one document: merge them or remove the '---'");
  }
  return documents.empty() ? YAML::Node() : documents.front();
}

// 1-based line of a node parsed from the file, or `fallback` for nodes that
// were built in memory (no mark).
inline int line_of(const YAML::Node& node, int fallback) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? fallback : mark.line + 1;
}

// What a node holds, for "expected X, got Y" messages.
inline std::string describe_node(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar: return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: break;
  }
  return "nothing";
}

// A value at a key path, or the absence of one (then `line` is that of the
// enclosing key, where the missing key belongs). Knows how to report an error
// about itself.
class Field {
 public:
  Field(const Source& source, YAML::Node node, bool present, std::string path, int line)
      : source_(&source),
        node_(std::move(node)),
        present_(present),
        path_(std::move(path)),
        line_(line) {}

  explicit operator bool() const { return present_; }
  const YAML::Node& node() const { return node_; }
  const std::string& path() const { return path_; }
  const Source& source() const { return *source_; }
  int line() const { return line_; }
  bool from_override() const { return source_->from_override(path_); }
  // The line to record in specs; 0 for values from --set (no file line).
  int file_line() const { return from_override() ? 0 : line_; }

  [[noreturn]] void fail(const std::string& message) const {
    std::string where;
    if (from_override()) {
      where = "--set ";
    } else {
      where = source_->file + (line_ > 0 ? ":" + std::to_string(line_) : std::string()) + ": ";
    }
    // A scalar the message quotes may hold a NUL ("\0" in YAML).
    throw InputError(escape_nul(where + (path_.empty() ? "" : path_ + ": ") + message));
  }

  // The items of a list; fails with `expected` for anything else.
  std::vector<Field> items(const std::string& expected) const {
    if (!node_.IsSequence()) fail("expected " + expected + ", got " + describe_node(node_));
    std::vector<Field> out;
    for (size_t i = 0; i < node_.size(); ++i) {
      const YAML::Node item = node_[i];
      out.emplace_back(*source_, item, true, path_ + "[" + std::to_string(i) + "]",
                       line_of(item, line_));
    }
    return out;
  }

 private:
  const Source* source_;
  YAML::Node node_;
  bool present_;
  std::string path_;
  int line_;
};

// A map of keys. The constructor rejects non-maps and duplicate keys; allow()
// rejects keys outside the given set, so callers can read a key that decides
// the schema (data.kind, a layer's type) before checking the rest.
class Section {
 public:
  explicit Section(Field field) : field_(std::move(field)) {
    const YAML::Node& node = field_.node();
    if (node.IsNull()) return;  // `train:` with nothing under it: all defaults
    if (!node.IsMap()) field_.fail("expected a map of keys, got " + describe_node(node));
    for (const auto& entry : node) {
      const int line = line_of(entry.first, line_of(node, 0));
      if (!entry.first.IsScalar()) {
        key_field("?", line).fail("expected a key name, got " + describe_node(entry.first));
      }
      const std::string key = entry.first.Scalar();
      if (const Entry* first = find(key)) {
        key_field(key, line).fail("duplicate key (first at line " + std::to_string(first->line) +
                                  ")");
      }
      entries_.push_back({key, line, entry.second});
    }
  }

  // `context` qualifies the message, e.g. "for kind idx".
  void allow(const Keys& allowed, const std::string& context = "") const {
    for (const auto& entry : entries_) {
      if (std::find(allowed.begin(), allowed.end(), entry.key) == allowed.end()) {
        const std::string qualifier = context.empty() ? "" : " " + context;
        key_field(entry.key, entry.line)
            .fail("unknown key" + qualifier + " (allowed: " + join(allowed) + ")");
      }
    }
  }

  Field operator[](const std::string& key) const {
    if (const Entry* entry = find(key)) {
      return Field(field_.source(), entry->value, true, child_path(key), entry->line);
    }
    // A missing key is reported at the line of the section's own key.
    return key_field(key, field_.line());
  }

  // Fails with "missing (why)" when absent.
  Field required(const std::string& key, const std::string& why) const {
    Field field = (*this)[key];
    if (!field) field.fail("missing (" + why + ")");
    return field;
  }

 private:
  struct Entry {
    std::string key;
    int line;
    YAML::Node value;
  };

  const Entry* find(const std::string& key) const {
    for (const auto& entry : entries_) {
      if (entry.key == key) return &entry;
    }
    return nullptr;
  }
  std::string child_path(const std::string& key) const {
    return field_.path().empty() ? key : field_.path() + "." + key;
  }
  Field key_field(const std::string& key, int line) const {
    return Field(field_.source(), YAML::Node(), false, child_path(key), line);
  }

  Field field_;
  std::vector<Entry> entries_;
};

// Allowed range of a number, for checks and for the message.
struct Bounds {
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;

  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  // " >= 1", " > 0", " in [0, 1)", or "" when unbounded.
  std::string describe() const {
    if (hi == kInf) {
      if (lo == -kInf) return "";
      return (lo_open ? " > " : " >= ") + format_number(lo);
    }
    if (lo == -kInf) return (hi_open ? " < " : " <= ") + format_number(hi);
    return std::string(" in ") + (lo_open ? "(" : "[") + format_number(lo) + ", " +
           format_number(hi) + (hi_open ? ")" : "]");
  }
};

inline Bounds at_least(double lo) { return {lo, Bounds::kInf, false, false}; }
inline Bounds above(double lo) { return {lo, Bounds::kInf, true, false}; }
inline Bounds between(double lo, double hi, bool lo_open, bool hi_open) {
  return {lo, hi, lo_open, hi_open};
}

// Integers are parsed by hand: yaml-cpp's conversions accept surprises and
// wrap negatives into unsigned types. Fails unless the whole scalar is one.
template <typename Int>
inline Int parse_integer(const Field& field, const std::string& expected) {
  const YAML::Node& node = field.node();
  if (!node.IsScalar()) field.fail(expected + ", got " + describe_node(node));
  const std::string& text = node.Scalar();
  const char* last = text.data() + text.size();
  Int value = 0;
  const auto [end, error] = std::from_chars(text.data(), last, value);
  if (error == std::errc::result_out_of_range && end == last) {
    field.fail(expected + ", got " + text + " (out of range)");
  }
  if (error != std::errc() || end != last) field.fail(expected + ", got '" + text + "'");
  return value;
}

inline int64_t to_int(const Field& field, const Bounds& bounds = {}) {
  const std::string expected = "expected an integer" + bounds.describe();
  const int64_t value = parse_integer<int64_t>(field, expected);
  if (!bounds.contains(static_cast<double>(value))) {
    field.fail(expected + ", got " + field.node().Scalar());
  }
  return value;
}

// The full uint64 range (seeds).
inline uint64_t to_uint64(const Field& field) {
  const std::string expected = "expected an integer >= 0";
  const YAML::Node& node = field.node();
  if (node.IsScalar() && node.Scalar().starts_with('-')) {
    // A negative integer is out of range, anything else is not an integer.
    parse_integer<int64_t>(field, expected);
    field.fail(expected + ", got " + node.Scalar());
  }
  return parse_integer<uint64_t>(field, expected);
}

inline double to_number(const Field& field, const Bounds& bounds = {}) {
  const std::string expected = "expected a number" + bounds.describe();
  const YAML::Node& node = field.node();
  if (!node.IsScalar()) field.fail(expected + ", got " + describe_node(node));
  const std::string& text = node.Scalar();
  const char* last = text.data() + text.size();
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), last, value);
  if (error != std::errc() || end != last || !std::isfinite(value)) {
    field.fail(expected + ", got '" + text + "'");
  }
  if (!bounds.contains(value)) field.fail(expected + ", got " + text);
  return value;
}

inline bool to_bool(const Field& field) {
  bool value = false;
  if (!field.node().IsScalar() || !YAML::convert<bool>::decode(field.node(), value)) {
    field.fail("expected true or false, got " + describe_node(field.node()));
  }
  return value;
}

// A non-empty string; `what` names it in the message ("a layer name").
inline std::string to_string(const Field& field, const std::string& what = "a string") {
  const YAML::Node& node = field.node();
  if (!node.IsScalar() || node.Scalar().empty()) {
    field.fail("expected " + what + ", got " + describe_node(node));
  }
  return node.Scalar();
}

inline std::string to_choice(const Field& field, const Keys& allowed) {
  const std::string value = to_string(field, "one of " + join(allowed));
  if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    field.fail("unknown value '" + value + "' (allowed: " + join(allowed) + ")");
  }
  return value;
}

// The enum value a scalar names, from the owning part's name table; the
// error lists the table's names.
template <class E, size_t N>
E to_choice(const Field& field, const std::array<Named<E>, N>& table) {
  return *find_named(table, to_choice(field, names_of(table)));
}

// Relative paths in the file resolve against its folder; those given with
// --set against the current directory, as a shell user expects.
inline std::string to_path(const Field& field) {
  const std::string text = to_string(field, "a file path");
  // The system would open the path up to the NUL: another file.
  if (text.find('\0') != std::string::npos) {
    field.fail("expected a file path, got '" + text + "', which holds a NUL byte (\\0)");
  }
  fs::path path = text;
  if (path.is_relative()) {
    const fs::path base = field.from_override() ? fs::current_path() : field.source().file_dir;
    path = base / path;
  }
  return path.lexically_normal().string();
}

inline std::vector<std::string> to_paths(const Field& field) {
  std::vector<std::string> paths;
  for (const Field& item : field.items("a list of file paths")) paths.push_back(to_path(item));
  if (paths.empty()) field.fail("expected a non-empty list of file paths, got an empty list");
  return paths;
}

inline uint64_t to_size(const Field& field) {
  const YAML::Node& node = field.node();
  if (!node.IsScalar()) {
    field.fail("expected a size such as 64MiB, 1.5GB or 4096, got " + describe_node(node));
  }
  try {
    return parse_size(node.Scalar());
  } catch (const InputError& error) {
    field.fail(error.what());
  }
}

inline std::vector<float> to_floats(const Field& field, const Bounds& bounds) {
  std::vector<float> values;
  for (const Field& item : field.items("a list of numbers")) {
    values.push_back(static_cast<float>(to_number(item, bounds)));
  }
  return values;
}

// kernel / stride / pad: one integer for both dimensions, or [h, w].
inline std::pair<int64_t, int64_t> to_pair(const Field& field, const Bounds& bounds) {
  const YAML::Node& node = field.node();
  if (node.IsSequence()) {
    if (node.size() != 2) {
      field.fail("expected an integer" + bounds.describe() + " or a list [h, w], got a list of " +
                 std::to_string(node.size()));
    }
    const std::vector<Field> items = field.items("[h, w]");
    return {to_int(items[0], bounds), to_int(items[1], bounds)};
  }
  const int64_t value = to_int(field, bounds);
  return {value, value};
}

}  // namespace vtrain::common::yaml
