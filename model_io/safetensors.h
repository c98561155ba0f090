// The safetensors file format (Hugging Face's safetensors, what
// `safetensors.torch.save_file` writes and `load_file` reads), written and
// read directly:
//
//   8 bytes   N, the header's length, unsigned little-endian
//   N bytes   a JSON object: per tensor name {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]}, and optionally "__metadata__":
//             {string: string}; padded with spaces
//   the rest  the tensors' raw little-endian bytes, offsets relative to here
//
// The reader trusts nothing: the header length against the file size, the
// JSON, every entry's keys and types, the dtype, offsets inside the data and
// shape x dtype size = the bytes they span, and that the tensors cover the
// data exactly (no overlap, no gap, nothing after the last: the format's
// rule against polyglot files). Every error names the file and, where one
// is at fault, the tensor.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/name_table.h"

namespace vtrain::model_io {

// A weights file is malformed, or does not fit the model it is for. A bad
// input file, as a bad data file is: a runtime failure (exit 1). The message
// names the file and the tensor.
class WeightsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Element types of the format (those torch writes; vtrain writes F32 and,
// for batch norm's num_batches_tracked, I64).
enum class Dtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };
inline constexpr auto kDtypeNames = std::to_array<common::Named<Dtype>>(
    {{Dtype::kF64, "F64"},
     {Dtype::kF32, "F32"},
     {Dtype::kF16, "F16"},
     {Dtype::kBF16, "BF16"},
     {Dtype::kI64, "I64"},
     {Dtype::kI32, "I32"},
     {Dtype::kI16, "I16"},
     {Dtype::kI8, "I8"},
     {Dtype::kU8, "U8"},
     {Dtype::kBool, "BOOL"}});
size_t dtype_bytes(Dtype dtype);

// "[64, 3, 7, 7]"; "[]" for a scalar.
std::string shape_text(std::span<const int64_t> shape);

// A tensor to write: `data` holds the product of `shape` elements of
// `dtype`, little-endian, and must stay valid during the write.
struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes `tensors` (data in the given order, names unique, not
// "__metadata__") and `metadata` to `path` whole or not at all
// (common::OutputFile). Throws common::OutputError when the file cannot be
// written, std::invalid_argument for a duplicate or reserved name. Returns
// the bytes written.
uint64_t write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata);

// One tensor of a file read.
struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section
  uint64_t end = 0;
};

// A safetensors file read whole into memory and validated.
class SafetensorsFile {
 public:
  // Reads `path`; throws WeightsError naming it and what is wrong
  // ("truncated", "header length ... exceeds", "tensor 'x': ...").
  static SafetensorsFile read(const std::string& path);

  const std::string& path() const { return path_; }
  // In the order of their data (ascending offsets).
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor named `name`, or null.
  const TensorEntry* find(const std::string& name) const;
  // The tensor's bytes, as stored (little-endian).
  std::span<const std::byte> bytes(const TensorEntry& tensor) const;

 private:
  std::string path_;
  std::vector<std::byte> content_;  // the whole file
  uint64_t data_start_ = 0;          // where the data section starts in content_
  std::vector<TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace vtrain::model_io
