#include "model_io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/files.h"

namespace vtrain::model_io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this host would need byte swaps");

namespace {

using nlohmann::json;

constexpr uint64_t kLengthBytes = 8;
// The safetensors library's own limit: a larger header is refused before
// it is parsed.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

uint64_t read_u64_le(const std::byte* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The product of `shape` times `bytes`, or false when it overflows.
bool byte_count(std::span<const int64_t> shape, uint64_t bytes, uint64_t* out) {
  uint64_t total = bytes;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(total, static_cast<uint64_t>(d), &total)) return false;
  }
  *out = total;
  return true;
}

std::vector<std::byte> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw WeightsError("cannot read " + path + ": " + std::strerror(errno));
  const std::streamoff size = in.tellg();
  if (size < 0) throw WeightsError("cannot read " + path + ": not a regular file");
  std::vector<std::byte> content(static_cast<size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(content.data()), size);
  if (!in) throw WeightsError("cannot read " + path + ": " + std::strerror(errno));
  return content;
}

// Parses the header, refusing a key given twice (JSON allows it, and a
// parser would silently keep one of them).
json parse_header(const std::string& path, std::string_view text) {
  std::set<std::string> seen;
  std::string duplicate;
  const json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event,
                                                json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), note_keys);
  } catch (const json::parse_error& e) {
    throw WeightsError(path + ": not a safetensors file: its header is not JSON (" + e.what() +
                       ")");
  }
  if (!header.is_object()) {
    throw WeightsError(path + ": not a safetensors file: its header is JSON but not an object");
  }
  if (!duplicate.empty()) {
    throw WeightsError(path + ": the header names '" + duplicate + "' twice");
  }
  return header;
}

std::map<std::string, std::string> read_metadata(const std::string& path, const json& value) {
  const std::string where = path + ": " + kMetadataKey;
  if (!value.is_object()) throw WeightsError(where + ": expected an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) throw WeightsError(where + ": '" + key + "' is not a string");
    metadata[key] = v.get<std::string>();
  }
  return metadata;
}

// A non-negative integer of a JSON array, or an error naming `what`.
uint64_t unsigned_item(const json& v, const std::string& where, const char* what) {
  if (!v.is_number_unsigned()) {
    throw WeightsError(where + ": " + what + " holds " + v.dump() +
                       ", expected integers >= 0");
  }
  return v.get<uint64_t>();
}

// One tensor's entry, checked against the data section's size.
TensorEntry read_entry(const std::string& path, const std::string& name, const json& value,
                       uint64_t data_bytes) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!value.is_object()) throw WeightsError(where + ": expected an object, got " + value.dump());
  for (const auto& [key, v] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      throw WeightsError(where + ": unknown key '" + key +
                         "' (expected dtype, shape, data_offsets)");
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) throw WeightsError(where + ": no " + key);
  }
  TensorEntry t;
  t.name = name;
  const json& dtype = value["dtype"];
  const std::string dtype_name = dtype.is_string() ? dtype.get<std::string>() : dtype.dump();
  const std::optional<Dtype> known = common::find_named(kDtypeNames, dtype_name);
  if (!dtype.is_string() || !known) {
    throw WeightsError(where + ": unknown dtype " + dtype.dump() + " (known: " +
                       common::join(common::names_of(kDtypeNames)) + ")");
  }
  t.dtype = *known;
  const json& shape = value["shape"];
  if (!shape.is_array()) throw WeightsError(where + ": shape is " + shape.dump() + ", expected a list");
  for (const json& d : shape) {
    const uint64_t n = unsigned_item(d, where, "shape");
    if (n > static_cast<uint64_t>(INT64_MAX)) throw WeightsError(where + ": shape too large");
    t.shape.push_back(static_cast<int64_t>(n));
  }
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    throw WeightsError(where + ": data_offsets is " + offsets.dump() + ", expected [begin, end]");
  }
  t.begin = unsigned_item(offsets[0], where, "data_offsets");
  t.end = unsigned_item(offsets[1], where, "data_offsets");
  const std::string span = "data_offsets [" + std::to_string(t.begin) + ", " +
                           std::to_string(t.end) + "]";
  if (t.begin > t.end) throw WeightsError(where + ": " + span + " end before they begin");
  if (t.end > data_bytes) {
    throw WeightsError(where + ": " + span + " run past the data, which holds " +
                       std::to_string(data_bytes) + " bytes (the file is truncated or the "
                       "header wrong)");
  }
  uint64_t expected = 0;
  if (!byte_count(t.shape, dtype_bytes(t.dtype), &expected)) {
    throw WeightsError(where + ": shape " + shape_text(t.shape) + " is too large");
  }
  if (expected != t.end - t.begin) {
    throw WeightsError(where + ": shape " + shape_text(t.shape) + " of " + dtype_name +
                       " needs " + std::to_string(expected) + " bytes but " + span + " hold " +
                       std::to_string(t.end - t.begin));
  }
  return t;
}

// The tensors, sorted by offset, must tile [0, data_bytes) exactly.
void check_coverage(const std::string& path, const std::vector<TensorEntry>& sorted,
                    uint64_t data_bytes) {
  uint64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& t : sorted) {
    const std::string where = path + ": tensor '" + t.name + "'";
    if (t.begin < covered) {
      throw WeightsError(where + ": its data [" + std::to_string(t.begin) + ", " +
                         std::to_string(t.end) + ") overlaps tensor '" + previous->name + "'s [" +
                         std::to_string(previous->begin) + ", " + std::to_string(previous->end) +
                         ")");
    }
    if (t.begin > covered) {
      throw WeightsError(where + ": its data starts at byte " + std::to_string(t.begin) +
                         ", leaving bytes [" + std::to_string(covered) + ", " +
                         std::to_string(t.begin) + ") of the data to no tensor");
    }
    covered = t.end;
    previous = &t;
  }
  if (covered != data_bytes) {
    throw WeightsError(path + ": " + std::to_string(data_bytes - covered) +
                       " bytes after the last tensor's data belong to no tensor");
  }
}

}  // namespace

size_t dtype_bytes(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF64:
    case Dtype::kI64: return 8;
    case Dtype::kF32:
    case Dtype::kI32: return 4;
    case Dtype::kF16:
    case Dtype::kBF16:
    case Dtype::kI16: return 2;
    case Dtype::kI8:
    case Dtype::kU8:
    case Dtype::kBool: return 1;
  }
  return 0;
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

uint64_t write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const TensorToWrite& t : tensors) {
    if (t.name == kMetadataKey || header.contains(t.name)) {
      throw std::invalid_argument("write_safetensors: tensor name '" + t.name +
                                  "' is reserved or given twice");
    }
    uint64_t bytes = 0;
    if (!byte_count(t.shape, dtype_bytes(t.dtype), &bytes)) {
      throw std::invalid_argument("write_safetensors: tensor '" + t.name + "' is too large");
    }
    header[t.name] = {{"dtype", common::name_of(kDtypeNames, t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    sizes.push_back(bytes);
  }
  std::string text = header.dump();
  // Data aligned to 8 bytes from the file's start, as the reference writer
  // pads it.
  text.append((kLengthBytes - text.size() % kLengthBytes) % kLengthBytes, ' ');
  const uint64_t length = text.size();
  common::OutputFile out(path, "safetensors file");
  out.write(&length, sizeof length);
  out.write(text);
  for (size_t i = 0; i < tensors.size(); ++i) out.write(tensors[i].data, sizes[i]);
  out.commit();
  return kLengthBytes + length + offset;
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  file.content_ = read_whole(path);
  const uint64_t size = file.content_.size();
  if (size < kLengthBytes) {
    throw WeightsError(path + ": truncated: " + std::to_string(size) +
                       " bytes, less than the 8-byte header length a safetensors file starts with");
  }
  const uint64_t length = read_u64_le(file.content_.data());
  if (length > size - kLengthBytes) {
    throw WeightsError(path + ": not a safetensors file, or truncated: its header length " +
                       std::to_string(length) + " exceeds the " +
                       std::to_string(size - kLengthBytes) + " bytes after it");
  }
  if (length > kMaxHeaderBytes) {
    throw WeightsError(path + ": header length " + std::to_string(length) +
                       " is over the format's limit of " + std::to_string(kMaxHeaderBytes));
  }
  const auto* text = reinterpret_cast<const char*>(file.content_.data() + kLengthBytes);
  if (length == 0 || text[0] != '{') {
    throw WeightsError(path + ": not a safetensors file: its header does not start with '{'");
  }
  const json header = parse_header(path, std::string_view(text, length));
  file.data_start_ = kLengthBytes + length;
  const uint64_t data_bytes = size - file.data_start_;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      file.metadata_ = read_metadata(path, value);
    } else {
      file.tensors_.push_back(read_entry(path, name, value, data_bytes));
    }
  }
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const TensorEntry& a, const TensorEntry& b) {
              return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
            });
  check_coverage(path, file.tensors_, data_bytes);
  return file;
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  for (const TensorEntry& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorEntry& tensor) const {
  return std::span<const std::byte>(content_).subspan(data_start_ + tensor.begin,
                                                       tensor.end - tensor.begin);
}

}  // namespace vtrain::model_io
