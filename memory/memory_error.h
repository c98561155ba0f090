// The memory part's exceptions.
#pragma once

#include <stdexcept>

namespace vtrain::memory {

// Misuse of the memory part (a bad size, a free of an unknown pointer) or a
// failure of the device underneath it.
class MemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request that does not fit. The message names the tensor, its size, the
// bytes in use, the capacity and the largest free range.
class OutOfMemoryError : public MemoryError {
 public:
  using MemoryError::MemoryError;
};

}  // namespace vtrain::memory
