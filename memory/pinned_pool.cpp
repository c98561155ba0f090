#include "memory/pinned_pool.h"

#include "common/text.h"
#include "memory/device_pool.h"
#include "memory/memory_error.h"

namespace vtrain::memory {

PinnedPool::PinnedPool(worker::Backend& backend, size_t reservation)
    : backend_(backend), free_(align_up(reservation)) {
  if (free_.capacity() == 0) return;
  try {
    base_ = static_cast<char*>(backend.allocate_pinned(free_.capacity()));
  } catch (const worker::BackendError& e) {
    throw OutOfMemoryError("pinned host pool: cannot reserve " + common::format_bytes_fixed(free_.capacity()) +
                           ": " + e.what());
  }
}

PinnedPool::~PinnedPool() {
  if (base_) backend_.free_pinned(base_);
}

void* PinnedPool::allocate(size_t bytes, const std::string& name) {
  const std::optional<size_t> offset = free_.allocate(bytes);
  if (!offset) {
    throw OutOfMemoryError("pinned host pool: out of memory offloading '" + name + "' (" +
                           common::format_bytes_fixed(bytes) + " = " + std::to_string(bytes) + " bytes): " +
                           common::format_bytes_fixed(free_.bytes_in_use()) + " in use of " +
                           common::format_bytes_fixed(free_.capacity()));
  }
  void* ptr = base_ + *offset;
  blocks_[ptr] = *offset;
  return ptr;
}

void PinnedPool::release(void* ptr) {
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) throw MemoryError("pinned host pool: release of an unknown pointer");
  free_.release(it->second);
  blocks_.erase(it);
}

}  // namespace vtrain::memory
