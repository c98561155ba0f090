#include "worker/engine/device_blocks.h"

#include <algorithm>

#include "memory/memory_error.h"

namespace vtrain::worker {

size_t free_device_bytes(const Backend& backend) {
  const size_t device = backend.device_info().memory_bytes;
  const size_t in_use = backend.device_bytes_in_use();
  return device > in_use ? device - in_use : 0;
}

DeviceBlocks::~DeviceBlocks() {
  for (void* p : held_) backend_.free_device(p);
}

float* DeviceBlocks::get(size_t bytes) {
  try {
    held_.push_back(backend_.allocate_device(std::max<size_t>(bytes, sizeof(float))));
  } catch (const BackendError& e) {
    throw memory::OutOfMemoryError(why_ + ": " + e.what());
  }
  return static_cast<float*>(held_.back());
}

Tensor DeviceBlocks::tensor(const TensorDesc& desc, float value) {
  const Tensor t{desc, get(desc.bytes())};
  backend_.fill(t, value);
  return t;
}

float* DeviceBlocks::floats(int64_t count, float value) {
  return static_cast<float*>(tensor(vector_desc(count), value).data);
}

}  // namespace vtrain::worker
