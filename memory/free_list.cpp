#include "memory/free_list.h"

#include <algorithm>
#include <string>

#include "memory/memory_error.h"

namespace vtrain::memory {

FreeList::FreeList(size_t capacity) : capacity_(capacity / kAlignment * kAlignment) {}

std::optional<size_t> FreeList::allocate(size_t bytes) {
  const size_t size = block_bytes(bytes);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= size && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best != free_.end()) {
    const size_t offset = best->first;
    const size_t left = best->second - size;
    free_.erase(best);
    if (left > 0) free_[offset + size] = left;
    take(offset, size);
    return offset;
  }
  if (size > capacity_ - top_) return std::nullopt;
  const size_t offset = top_;
  top_ += size;
  take(offset, size);
  return offset;
}

bool FreeList::allocate_at(size_t offset, size_t bytes) {
  const size_t size = block_bytes(bytes);
  if (offset % kAlignment != 0 || offset > capacity_ || size > capacity_ - offset) return false;
  const size_t end = offset + size;
  if (offset >= top_) {
    if (offset > top_) free_[top_] = offset - top_;  // the gap below the block
    top_ = end;
    take(offset, size);
    return true;
  }
  auto it = free_.upper_bound(offset);
  if (it == free_.begin()) return false;
  --it;
  const size_t range_start = it->first, range_end = it->first + it->second;
  if (end > range_end) return false;
  free_.erase(it);
  if (offset > range_start) free_[range_start] = offset - range_start;
  if (end < range_end) free_[end] = range_end - end;
  take(offset, size);
  return true;
}

void FreeList::take(size_t offset, size_t size) {
  used_[offset] = size;
  in_use_ += size;
  top_ = std::max(top_, offset + size);
  high_water_ = std::max(high_water_, top_);
}

void FreeList::release(size_t offset) {
  auto used = used_.find(offset);
  if (used == used_.end()) {
    throw MemoryError("free list: release of offset " + std::to_string(offset) +
                      ", where no block starts");
  }
  size_t start = offset, size = used->second;
  in_use_ -= size;
  used_.erase(used);
  // Coalesce with the free neighbours.
  auto next = free_.find(start + size);
  if (next != free_.end()) {
    size += next->second;
    free_.erase(next);
  }
  auto prev = free_.lower_bound(start);
  if (prev != free_.begin()) {
    --prev;
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (start + size == top_) {
    top_ = start;  // rejoins the unused space above the top (no free range ends at top_)
  } else {
    free_[start] = size;
  }
}

size_t FreeList::largest_free() const {
  size_t best = capacity_ - top_;
  for (const auto& [offset, size] : free_) best = std::max(best, size);
  return best;
}

size_t FreeList::block_size(size_t offset) const {
  auto it = used_.find(offset);
  return it == used_.end() ? 0 : it->second;
}

}  // namespace vtrain::memory
