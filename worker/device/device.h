// The device half of the device interface (worker/device/backend.h adds the
// ops): memory, pinned memory, streams, events, copies, transfers with
// layout and type conversion, compute spans and the ops' scratch. Nothing
// here knows an op; an op's kernels live behind Backend::run().
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/precision.h"
#include "worker/device/tensor.h"

namespace vtrain::worker {

class BackendError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a rank tells the others (and the perf DB) about its device.
struct DeviceInfo {
  std::string backend;          // "cpu" or "cuda"
  std::string name;             // CPU model name or GPU name
  size_t memory_bytes = 0;      // device memory capacity the backend will serve
  int threads = 1;              // CPU threads used (1 for CUDA)
  std::string library_version;  // "oneDNN 2.6.3" or "cuDNN 9.x.y, kernels rN" (cuda_kernels.h)
  std::string host;             // hostname
  std::string device_key;       // a GPU's UUID ("GPU-" and 32 hex digits; "" on the CPU):
                                // ranks with the same key share the device
  std::vector<int> cpus;        // CPU: the CPUs this process may run on when only
                                // some of the host's (empty: every one; on GPUs)
};

enum class StreamKind { kCompute, kMemory };

// A point in one stream's work, returned by record_event().
struct Event {
  StreamKind stream = StreamKind::kCompute;
  uint64_t ticket = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceInfo device_info() const = 0;
  // Why this backend cannot train in `precision` on this device (naming
  // what is missing: an instruction set, a GPU generation), or nothing when
  // it can.
  virtual std::optional<std::string> precision_unavailable(common::Precision precision) const = 0;

  // ------------------------------------------------------------- memory
  // Raw device memory. The memory part reserves once and pools over it; the
  // engine never calls these per step. Throws BackendError when the device
  // cannot provide the bytes. Returned memory is 64-byte aligned.
  virtual void* allocate_device(size_t bytes) = 0;
  virtual void free_device(void* ptr) = 0;
  // The device bytes allocate_device(bytes) takes (its alignment rounding):
  // what every count of device memory made before allocating (the memory
  // plan's room, the least capacity an error suggests) must use.
  virtual size_t allocation_bytes(size_t bytes) const = 0;
  // Bytes currently allocated with allocate_device, and the peak since start
  // or the last reset_peak().
  virtual size_t device_bytes_in_use() const = 0;
  virtual size_t device_bytes_peak() const = 0;
  virtual void reset_peak() = 0;
  // Host memory that the memory stream can copy to and from asynchronously.
  virtual void* allocate_pinned(size_t bytes) = 0;
  // Waits for the copies queued so far (they may still read or write the
  // memory: an owner unwinding from an error need not), then frees it.
  virtual void free_pinned(void* ptr) = 0;

  // Layout this backend keeps an activation with this many channels in
  // (BackendOptions::layout, by LayoutRule in backend.h).
  virtual Layout preferred_layout(int64_t channels) const = 0;

  // --------------------------------------------------- streams and copies
  virtual Event record_event(StreamKind stream) = 0;
  // Work issued to `stream` after this call starts only after `event`.
  virtual void wait_event(StreamKind stream, const Event& event) = 0;
  // Blocks the host until `event` has passed.
  virtual void synchronize(const Event& event) = 0;
  virtual void synchronize(StreamKind stream) = 0;
  // Times a span of the compute stream's work (a rank's compute in a step,
  // for online re-balancing): begin_compute_span() marks its start,
  // end_compute_span_ms() its end, waits for the work in between and
  // returns the milliseconds it took on the device (the host clock where
  // the compute stream is synchronous, stream events on a GPU; host time
  // would count waits for the other ranks). One span at a time; end without
  // a begin returns 0.
  virtual void begin_compute_span() = 0;
  virtual double end_compute_span_ms() = 0;
  // Byte copy between device and pinned host memory (either direction) on a stream.
  virtual void copy_async(void* dst, const void* src, size_t bytes, StreamKind stream) = 0;

  // Synchronous transfers with layout conversion: `host` holds plain NCHW
  // (OIHW for weights) floats, shape().elements() of them.
  virtual void upload(const float* host, const Tensor& dst) = 0;
  virtual void download(const Tensor& src, float* host) = 0;
  // dst = src with layout and element-type conversion (shapes must match;
  // f32 to half rounds to nearest even).
  virtual void convert(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, float value) = 0;
  virtual void upload_labels(const int32_t* host, int32_t* device, int64_t count) = 0;

  // ------------------------------------------------ the ops' own scratch
  // Ops other than convolutions may need device memory of the backend's own
  // (a library scratchpad, a layout-converted copy): one scratch buffer,
  // counted in device_bytes_in_use(), that grows when a call needs more.
  // Backend::scratch_bytes(op) says how much one call needs, so that a
  // network can reserve_scratch() its largest before it sizes its pool and
  // no step allocates device memory outside the plan.
  // Grows the scratch to at least `bytes` now (throws BackendError when the
  // device cannot provide them); it never shrinks while the backend lives.
  virtual void reserve_scratch(size_t bytes) = 0;
  virtual size_t scratch_reserved() const = 0;  // the scratch's current size
};

}  // namespace vtrain::worker
