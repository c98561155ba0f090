// Tensor descriptors and views shared by every backend.
//
// A Tensor is a non-owning view: a descriptor plus a pointer into device
// memory that some owner (the network's storage, later the memory part's
// pool) keeps alive. Shapes are logical NCHW; how the elements are laid out in
// memory is the descriptor's Layout, which a backend may choose per tensor so
// that consecutive layers exchange data in the library's preferred format
// without a reorder at every call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/precision.h"

namespace vtrain::worker {

using common::DataType;
using common::dtype_name;
using common::element_bytes;

// Logical 4-D shape. Fully connected activations use {n, c, 1, 1}.
struct Shape {
  int64_t n = 1;  // batch (or output channels for weights)
  int64_t c = 1;  // channels (or input channels for weights)
  int64_t h = 1;  // height
  int64_t w = 1;  // width

  int64_t elements() const { return n * c * h * w; }
  int64_t per_sample() const { return c * h * w; }
  bool operator==(const Shape&) const = default;
  std::string str() const;  // "64x20x12x12"
};

// Memory layout of a tensor's elements.
enum class Layout : uint8_t {
  kPlain,      // row-major NCHW (weights: OIHW); what reference code and files use
  kBlocked8,   // nChw8c: channels in blocks of 8, padded with zeros (CPU, AVX2)
  kBlocked16,  // nChw16c: channels in blocks of 16, padded with zeros (CPU, AVX-512)
  kNhwc,       // channels last: NHWC (tensor cores' layout; a CPU backend may use it too)
};

const char* layout_name(Layout layout);

struct TensorDesc {
  Shape shape;
  Layout layout = Layout::kPlain;
  DataType dtype = DataType::kF32;

  // Elements in storage, channel padding included.
  int64_t storage_elements() const;
  size_t bytes() const { return static_cast<size_t>(storage_elements()) * element_bytes(dtype); }
  bool operator==(const TensorDesc&) const = default;
};

// The channel block of a tensor: its elements are stored as nChw[block]c,
// channel c of pixel (h, w) of sample n at
//   ((n * blocks + c / block) * h_w + pixel) * block + c % block,
// blocks = ceil(c / block), padding channels zero. 1 for kPlain, 8 or 16 for
// the blocked layouts, and all of the tensor's channels for kNhwc (one block
// of every channel is NHWC). Code that walks a tensor by this formula
// serves every layout.
int64_t channel_block(const TensorDesc& desc);

// Whether the tensor's storage is that of the plain layout, element for
// element: plain, or one pixel a sample with no channel padding (a global
// pool's {n, c, 1, 1} in NHWC, or blocked with c a multiple of the block).
inline bool stored_as_plain(const TensorDesc& desc) {
  return desc.layout == Layout::kPlain ||
         (desc.shape.h == 1 && desc.shape.w == 1 && desc.shape.c % channel_block(desc) == 0);
}

// A flat array of `count` elements as a plain {count, 1, 1, 1} tensor (at
// least one element: a zero-sized descriptor is no tensor).
inline TensorDesc vector_desc(int64_t count, DataType type = DataType::kF32) {
  return {{count > 1 ? count : 1, 1, 1, 1}, Layout::kPlain, type};
}

// Element `index` of an array of `type` elements at `base`.
inline const void* element_at(const void* base, int64_t index, DataType type) {
  return static_cast<const char*>(base) + index * static_cast<int64_t>(element_bytes(type));
}

// A non-owning view of device memory holding desc.dtype elements. Cheap to copy.
struct Tensor {
  TensorDesc desc;
  void* data = nullptr;

  const Shape& shape() const { return desc.shape; }
  size_t bytes() const { return desc.bytes(); }
  // data as floats; throws std::logic_error naming `op` unless desc.dtype is kF32.
  float* f32(const char* op) const;
  // Samples [first, first + count) of a tensor whose layout keeps each sample
  // contiguous (every Layout above does).
  Tensor samples(int64_t first, int64_t count) const;
};

}  // namespace vtrain::worker
