// Device memory held for a measurement or a tuning run, outside a
// network's pool (before it exists, or beside it): the profiler's kernel
// timings, the layer costs of the timed simulator, conv.algorithm auto.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "worker/device/backend.h"

namespace vtrain::worker {

// Device bytes the backend can still serve: its capacity (the device's
// memory or device.memory_limit) less what is in use.
size_t free_device_bytes(const Backend& backend);

// Blocks of device memory, returned on destruction. A request the device
// cannot serve is a memory::OutOfMemoryError: `why` (what was being done and
// what it needs), then the backend's message.
class DeviceBlocks {
 public:
  DeviceBlocks(Backend& backend, std::string why) : backend_(backend), why_(std::move(why)) {}
  ~DeviceBlocks();
  DeviceBlocks(const DeviceBlocks&) = delete;
  DeviceBlocks& operator=(const DeviceBlocks&) = delete;

  float* get(size_t bytes);  // at least one float
  // A block for `desc` filled with `value` (finite contents: no NaNs or
  // denormals in a timing).
  Tensor tensor(const TensorDesc& desc, float value);
  // max(count, 1) floats, each `value`.
  float* floats(int64_t count, float value);

 private:
  Backend& backend_;
  std::string why_;
  std::vector<void*> held_;
};

}  // namespace vtrain::worker
