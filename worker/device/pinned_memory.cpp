#include "worker/device/pinned_memory.h"

#include <new>

namespace vtrain::worker {

void* PinnedMemory::do_allocate(size_t bytes, size_t alignment) {
  if (alignment > 64) throw std::bad_alloc();  // allocate_pinned aligns to 64 bytes
  return backend_.allocate_pinned(bytes);
}

void PinnedMemory::do_deallocate(void* p, size_t, size_t) { backend_.free_pinned(p); }

}  // namespace vtrain::worker
