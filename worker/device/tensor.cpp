#include "worker/device/tensor.h"

#include <stdexcept>

namespace vtrain::worker {

std::string Shape::str() const {
  return std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" +
         std::to_string(w);
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kPlain: return "plain";
    case Layout::kBlocked8: return "nChw8c";
    case Layout::kBlocked16: return "nChw16c";
    case Layout::kNhwc: return "nhwc";
  }
  return "unknown";
}

int64_t channel_block(const TensorDesc& desc) {
  switch (desc.layout) {
    case Layout::kPlain: return 1;
    case Layout::kBlocked8: return 8;
    case Layout::kBlocked16: return 16;
    case Layout::kNhwc: return desc.shape.c > 0 ? desc.shape.c : 1;
  }
  return 1;
}

float* Tensor::f32(const char* op) const {
  if (desc.dtype != DataType::kF32) {
    throw std::logic_error(std::string(op) + ": expects an f32 tensor, got " +
                           dtype_name(desc.dtype) + " " + desc.shape.str());
  }
  return static_cast<float*>(data);
}

int64_t TensorDesc::storage_elements() const {
  const int64_t block = channel_block(*this);
  const int64_t padded_c = (shape.c + block - 1) / block * block;
  return shape.n * padded_c * shape.h * shape.w;
}

Tensor Tensor::samples(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > desc.shape.n) {
    throw std::out_of_range("Tensor::samples: [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") outside batch " +
                            std::to_string(desc.shape.n));
  }
  Tensor view = *this;
  view.desc.shape.n = count;
  const int64_t per_sample = desc.storage_elements() / (desc.shape.n == 0 ? 1 : desc.shape.n);
  view.data = static_cast<char*>(data) + first * per_sample * element_bytes(desc.dtype);
  return view;
}

}  // namespace vtrain::worker
