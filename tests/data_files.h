// Dataset files written by tests: IDX images and labels, CIFAR-10 records.
#pragma once

#include <cstdint>
#include <vector>

namespace vtrain::test_support {

using Bytes = std::vector<uint8_t>;

inline void put_u32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(v >> shift));
}

// An IDX image file of `count` images whose pixel k (over the whole file) is k % 251.
inline Bytes idx_images(uint32_t count, uint32_t rows, uint32_t cols) {
  Bytes out;
  put_u32(out, 0x00000803);
  put_u32(out, count);
  put_u32(out, rows);
  put_u32(out, cols);
  for (uint64_t k = 0; k < uint64_t{count} * rows * cols; ++k) out.push_back(uint8_t(k % 251));
  return out;
}

inline Bytes idx_labels(const std::vector<uint8_t>& labels) {
  Bytes out;
  put_u32(out, 0x00000801);
  put_u32(out, static_cast<uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

// A CIFAR-10 record whose pixel j is (label * 7 + j + salt) % 256.
inline void put_cifar_record(Bytes& out, uint8_t label, int salt) {
  out.push_back(label);
  for (int j = 0; j < 3072; ++j) out.push_back(uint8_t((label * 7 + j + salt) % 256));
}

}  // namespace vtrain::test_support
