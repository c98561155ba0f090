// Pinned host memory for offloaded tensors.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>

#include "memory/free_list.h"
#include "worker/device/backend.h"

namespace vtrain::memory {

// Host memory the memory stream copies offloaded tensors to: one pinned
// reservation (allocate_pinned once), blocks by offset, so no step pins
// memory per tensor. Same placement as the device pool; same thread rules.
class PinnedPool {
 public:
  // reservation 0: no host memory (every allocate throws).
  PinnedPool(worker::Backend& backend, size_t reservation);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  void* allocate(size_t bytes, const std::string& name);
  void release(void* ptr);
  size_t reservation() const { return free_.capacity(); }
  size_t bytes_in_use() const { return free_.bytes_in_use(); }

 private:
  worker::Backend& backend_;
  char* base_ = nullptr;
  FreeList free_;
  std::unordered_map<void*, size_t> blocks_;  // pointer -> offset
};

}  // namespace vtrain::memory
