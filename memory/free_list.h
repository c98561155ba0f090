// Offsets in a range of bytes: the allocation policy shared by the device
// pool, the pinned host pool and the simulator that decides whether a step
// fits before it runs.
//
// Best fit among the free ranges below the high-water mark; only when none
// fits does a block extend the high-water mark. So the placement of a
// request never depends on the capacity (as long as it fits), and a
// simulation with an unbounded capacity reproduces a real pool's offsets
// exactly: its high-water mark is the reservation that trace needs.
//
// Not thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <optional>

namespace vtrain::memory {

// Every block is a multiple of this many bytes and starts at such an offset.
inline constexpr size_t kAlignment = 256;

inline size_t align_up(size_t bytes, size_t alignment = kAlignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}
// The bytes a request of `bytes` occupies: at least one, aligned.
inline size_t block_bytes(size_t bytes) { return align_up(bytes > 0 ? bytes : 1); }

class FreeList {
 public:
  explicit FreeList(size_t capacity);

  // Offset of a new block of block_bytes(bytes) bytes; nullopt when no
  // free range holds it.
  std::optional<size_t> allocate(size_t bytes);
  // Takes [offset, offset + align_up(bytes)) if all of it is free (a static
  // plan's fixed offset); false, changing nothing, otherwise.
  bool allocate_at(size_t offset, size_t bytes);
  // Frees the block that starts at `offset`; throws MemoryError if none does.
  void release(size_t offset);

  size_t capacity() const { return capacity_; }
  size_t bytes_in_use() const { return in_use_; }
  // One past the highest byte ever allocated.
  size_t high_water() const { return high_water_; }
  // One past the highest byte allocated now.
  size_t top() const { return top_; }
  // Largest request that would succeed now.
  size_t largest_free() const;
  // Size of the block at `offset`, 0 if none starts there.
  size_t block_size(size_t offset) const;

 private:
  void take(size_t offset, size_t size);

  size_t capacity_;
  size_t in_use_ = 0;
  size_t high_water_ = 0;
  size_t top_ = 0;
  std::map<size_t, size_t> free_;  // offset -> size, coalesced, below top_
  std::map<size_t, size_t> used_;  // offset -> size
};

}  // namespace vtrain::memory
