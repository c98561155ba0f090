// Host memory that a backend's memory stream copies to and from
// asynchronously, as a memory resource for containers.
#pragma once

#include <cstddef>
#include <memory_resource>

#include "worker/device/backend.h"

namespace vtrain::worker {

// Host memory from the backend's allocate_pinned: page-locked on a GPU,
// where a batch then copies at the bus's speed and the device converts it to
// its layout and element type (from pageable memory the host would), and a
// copy_async from it overlaps the host's work. Must outlive what it
// allocated, and every copy still reading or writing that memory.
class PinnedMemory : public std::pmr::memory_resource {
 public:
  explicit PinnedMemory(Backend& backend) : backend_(backend) {}

 private:
  void* do_allocate(size_t bytes, size_t alignment) override;
  void do_deallocate(void* p, size_t bytes, size_t alignment) override;
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }
  Backend& backend_;
};

}  // namespace vtrain::worker
