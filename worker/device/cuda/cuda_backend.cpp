// CUDA backend on cuDNN and cuBLAS: errors, lifecycle, device and pinned
// memory, streams, events and transfers. See cuda_backend.h; the class is
// in cuda_backend_impl.h.
#include "worker/device/cuda/cuda_backend_impl.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>

#include "common/half_convert.h"

namespace vtrain::worker::cuda {

namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// Local rank from the usual launcher variables, 0 when none is set.
int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                           "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(name)) {
      char* end = nullptr;
      const long rank = std::strtol(value, &end, 10);
      if (end != value && *end == '\0' && rank >= 0 && rank <= INT_MAX) {
        return static_cast<int>(rank);
      }
    }
  }
  return 0;
}

}  // namespace

// ------------------------------------------------------------------ errors

std::string error_message(const char* library, const char* error, int code, const char* expr,
                          const char* file, int line, const std::string& context) {
  return context + ": " + expr + " failed at " + file + ":" + std::to_string(line) + ": " +
         library + " error " + std::to_string(code) + " (" + (error ? error : "unknown") + ")";
}

void throw_error(cudaError_t status, const char* expr, const char* file, int line,
                 const std::string& context) {
  cudaGetLastError();  // clear a non-sticky error so later calls do not report it again
  throw BackendError("cuda backend: " + error_message("CUDA", cudaGetErrorString(status),
                                                      static_cast<int>(status), expr, file, line,
                                                      context));
}

void throw_error(cudnnStatus_t status, const char* expr, const char* file, int line,
                 const std::string& context) {
  throw BackendError("cuda backend: " + error_message("cuDNN", cudnnGetErrorString(status),
                                                      static_cast<int>(status), expr, file, line,
                                                      context));
}

void throw_error(cublasStatus_t status, const char* expr, const char* file, int line,
                 const std::string& context) {
  throw BackendError("cuda backend: " + error_message("cuBLAS", cublasGetStatusString(status),
                                                      static_cast<int>(status), expr, file, line,
                                                      context));
}

// ----------------------------------------------------------------- lifecycle

CudaBackend::CudaBackend(const BackendOptions& options) {
  int count = 0;
  VTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count), "counting CUDA devices");
  if (count < 1) throw BackendError("cuda backend: no CUDA device is visible");
  device_ = local_rank() % count;
  const std::string where = "device " + std::to_string(device_);
  VTRAIN_CUDA_CHECK(cudaSetDevice(device_), where);
  cudaDeviceProp prop{};
  VTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_), where);
  const size_t version = cudnnGetVersion();
  info_.backend = "cuda";
  info_.name = prop.name;
  info_.threads = 1;
  info_.library_version = "cuDNN " + std::to_string(version / 10000) + "." +
                          std::to_string(version / 100 % 100) + "." + std::to_string(version % 100) +
                          ", kernels r" + std::to_string(kKernelRevision);
  info_.host = host_name();
  // The UUID, not host and bus id: containers on one machine have
  // hostnames of their own, and single-GPU nodes share bus ids.
  info_.device_key = "GPU-";
  constexpr char kHex[] = "0123456789abcdef";
  for (const char byte : prop.uuid.bytes) {
    const auto b = static_cast<unsigned char>(byte);
    info_.device_key += kHex[b >> 4];
    info_.device_key += kHex[b & 15];
  }

  cudaStream_t raw_stream = nullptr;
  VTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking), where);
  compute_.reset(raw_stream);
  VTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking), where);
  memory_.reset(raw_stream);

  cudnnHandle_t raw_cudnn = nullptr;
  VTRAIN_CUDA_CHECK(cudnnCreate(&raw_cudnn), where);
  cudnn_.reset(raw_cudnn);
  VTRAIN_CUDA_CHECK(cudnnSetStream(cudnn_.get(), compute_.get()), where);
  cublasHandle_t raw_cublas = nullptr;
  VTRAIN_CUDA_CHECK(cublasCreate(&raw_cublas), where);
  cublas_.reset(raw_cublas);
  VTRAIN_CUDA_CHECK(cublasSetStream(cublas_.get(), compute_.get()), where);
  // Plain float32 (no TF32 tensor cores, results comparable with the CPU)
  // unless the job trains in tf32. Half GEMMs with a half output reduce
  // split-K partial sums in float too (by default cuBLAS may reduce them in
  // the output type), so they round once, as the contract says.
  tf32_ = options.settings.precision == common::Precision::kTf32;
  cudnn_graph_ = options.cudnn_graph;
  graph_engines_per_variant_ = options.graph_engines;
  layout_rule_ = {.choice = options.settings.layout, .gpu = true,
                  .precision = options.settings.precision};
  compute_capability_ = prop.major * 10 + prop.minor;
  const cublasMath_t math = tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
  VTRAIN_CUDA_CHECK(
      cublasSetMathMode(cublas_.get(), static_cast<cublasMath_t>(
                                           math | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
      where);

  // What this backend may allocate: device.memory_limit, else what is free
  // now that the context and the cuDNN and cuBLAS handles exist, less
  // kLibraryHeadroom for what the libraries and this backend's own scratch
  // allocate outside the count later (a pool sized to the last byte of
  // totalGlobalMem would fail in cudaMalloc).
  size_t free_bytes = 0, total_bytes = 0;
  VTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), where);
  capacity_ = options.memory_limit > 0
                  ? options.memory_limit
                  : (free_bytes > kLibraryHeadroom ? free_bytes - kLibraryHeadroom : 0);
  info_.memory_bytes = capacity_;
}

CudaBackend::~CudaBackend() {
  // Errors here have been reported by the op that caused them.
  cudaStreamSynchronize(memory_.get());
  cudaStreamSynchronize(compute_.get());
  for (auto& [ptr, bytes] : allocations_) cudaFree(ptr);
  if (pinned_) cudaFreeHost(pinned_);
}

void CudaBackend::sync_compute(const std::string& context) {
  VTRAIN_CUDA_CHECK(cudaStreamSynchronize(compute_.get()), context);
}

// -------------------------------------------------------------------- memory

void* CudaBackend::allocate_device(size_t bytes) {
  use_device();
  std::lock_guard lock(alloc_mutex_);
  const size_t rounded = allocation_bytes(bytes);
  if (in_use_ + rounded > capacity_) {
    throw BackendError("cuda device out of memory: requested " + std::to_string(bytes) +
                       " bytes with " + std::to_string(in_use_) + " in use of a capacity of " +
                       std::to_string(capacity_) + " (device.memory_limit)");
  }
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, rounded);
  if (status != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw BackendError("cuda device: cudaMalloc of " + std::to_string(bytes) + " bytes failed (" +
                       cudaGetErrorString(status) + ") with " + std::to_string(in_use_) +
                       " bytes in use by this backend, " + std::to_string(free_bytes) + " of " +
                       std::to_string(total_bytes) + " free on the device");
  }
  allocations_[ptr] = rounded;
  in_use_ += rounded;
  peak_ = std::max(peak_, in_use_);
  return ptr;
}

void CudaBackend::free_device(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(alloc_mutex_);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) throw BackendError("cuda device: free of an unknown pointer");
  VTRAIN_CUDA_CHECK(cudaFree(ptr), "free_device of " + std::to_string(it->second) + " bytes");
  in_use_ -= it->second;
  allocations_.erase(it);
}

void* CudaBackend::allocate_pinned(size_t bytes) {
  use_device();
  void* ptr = nullptr;
  VTRAIN_CUDA_CHECK(cudaHostAlloc(&ptr, std::max<size_t>(bytes, 1), cudaHostAllocDefault),
                    "allocate_pinned of " + std::to_string(bytes) + " bytes");
  return ptr;
}

// Not checked: a failed wait is a sticky error, which cudaFreeHost reports.
void CudaBackend::free_pinned(void* ptr) {
  if (!ptr) return;
  for (StreamKind kind : {StreamKind::kCompute, StreamKind::kMemory}) {
    cudaStreamSynchronize(stream(kind));
  }
  VTRAIN_CUDA_CHECK(cudaFreeHost(ptr), "free_pinned");
}

char* CudaBackend::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_) {
      sync_compute("growing the scratch buffer");  // queued ops may still use the old one
      free_device(scratch_);
    }
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    scratch_ = static_cast<char*>(allocate_device(bytes));
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

char* CudaBackend::pinned_staging(size_t bytes) {
  if (bytes > pinned_bytes_) {
    if (pinned_) {
      sync_compute("growing the pinned staging buffer");
      VTRAIN_CUDA_CHECK(cudaFreeHost(pinned_), "pinned staging");
    }
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    VTRAIN_CUDA_CHECK(
        cudaHostAlloc(reinterpret_cast<void**>(&pinned_), bytes, cudaHostAllocDefault),
        "pinned staging of " + std::to_string(bytes) + " bytes");
    pinned_bytes_ = bytes;
  }
  return pinned_;
}

// ------------------------------------------------------- streams and copies

void CudaBackend::retire_passed(EventQueue& queue) {
  while (!queue.pending.empty()) {
    const cudaError_t status = cudaEventQuery(queue.pending.front().second.get());
    if (status == cudaErrorNotReady) return;
    VTRAIN_CUDA_CHECK(status, "querying an event");
    queue.pending.pop_front();
  }
}

Event CudaBackend::record_event(StreamKind kind) {
  use_device();
  std::lock_guard lock(event_mutex_);
  EventQueue& queue = events_[static_cast<int>(kind)];
  retire_passed(queue);
  cudaEvent_t raw = nullptr;
  VTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming), "record_event");
  CudaEvent event(raw, cudaEventDestroy);
  VTRAIN_CUDA_CHECK(cudaEventRecord(event.get(), stream(kind)), "record_event");
  queue.pending.emplace_back(queue.next_ticket, std::move(event));
  return {kind, queue.next_ticket++};
}

void CudaBackend::begin_compute_span() {
  use_device();
  auto make = [](CudaEvent& event) {
    if (event) return;
    cudaEvent_t raw = nullptr;
    VTRAIN_CUDA_CHECK(cudaEventCreate(&raw), "begin_compute_span");  // with timing
    event = CudaEvent(raw, cudaEventDestroy);
  };
  make(span_start_);
  make(span_end_);
  VTRAIN_CUDA_CHECK(cudaEventRecord(span_start_.get(), stream(StreamKind::kCompute)),
                    "begin_compute_span");
  span_open_ = true;
}

double CudaBackend::end_compute_span_ms() {
  if (!span_open_) return 0;
  span_open_ = false;
  use_device();
  VTRAIN_CUDA_CHECK(cudaEventRecord(span_end_.get(), stream(StreamKind::kCompute)),
                    "end_compute_span_ms");
  VTRAIN_CUDA_CHECK(cudaEventSynchronize(span_end_.get()), "end_compute_span_ms");
  float ms = 0;
  VTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, span_start_.get(), span_end_.get()),
                    "end_compute_span_ms");
  return ms;
}

CudaEvent CudaBackend::find_event(const Event& event) {
  std::lock_guard lock(event_mutex_);
  EventQueue& queue = events_[static_cast<int>(event.stream)];
  if (event.ticket >= queue.next_ticket) {
    throw BackendError("cuda backend: event " + std::to_string(event.ticket) +
                       " was never recorded on the " +
                       (event.stream == StreamKind::kCompute ? "compute" : "memory") + " stream");
  }
  // Tickets below the oldest pending one have passed (ticket 0 is the
  // default Event, which has always passed).
  for (const auto& [ticket, e] : queue.pending) {
    if (ticket == event.ticket) return e;
  }
  return nullptr;
}

void CudaBackend::wait_event(StreamKind kind, const Event& event) {
  use_device();
  if (const CudaEvent e = find_event(event)) {
    VTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream(kind), e.get(), 0), "wait_event");
  }
}

void CudaBackend::synchronize(const Event& event) {
  if (const CudaEvent e = find_event(event)) {
    VTRAIN_CUDA_CHECK(cudaEventSynchronize(e.get()), "synchronize(event)");
  }
}

void CudaBackend::synchronize(StreamKind kind) {
  VTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream(kind)),
                    kind == StreamKind::kCompute ? "synchronize(compute)" : "synchronize(memory)");
  std::lock_guard lock(event_mutex_);
  retire_passed(events_[static_cast<int>(kind)]);
}

void CudaBackend::copy_async(void* dst, const void* src, size_t bytes, StreamKind kind) {
  if (bytes == 0) return;
  use_device();
  VTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream(kind)),
                    "copy_async of " + std::to_string(bytes) + " bytes");
}

// Plain tensors move as they are stored: a half one is rounded on the host
// (common/half_convert.h, to nearest even as on the device) into the pinned
// staging, or widened from it, so that a step's input upload (the input
// layer is plain) takes no device memory outside the plan. Other layouts
// go through f32 staging in the scratch and a device reorder.
void CudaBackend::upload(const float* host, const Tensor& dst) {
  const int64_t elements = dst.shape().elements();
  const size_t plain_bytes = static_cast<size_t>(elements) * sizeof(float);
  const std::string context = "upload " + dst.shape().str() + " " + dtype_name(dst.desc.dtype);
  const DataType type = call_type("upload", {dst.desc});
  if (dst.desc.layout == Layout::kPlain && type == DataType::kF32) {
    VTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(dst.data, host, plain_bytes, cudaMemcpyHostToDevice, compute_.get()),
        context);
  } else if (dst.desc.layout == Layout::kPlain && !is_pinned(host)) {
    // Pageable floats are rounded on the host: half the bytes to copy.
    // The pinned staging is free between calls: every op that copies
    // through it waits for the copy before it returns.
    char* staging = pinned_staging(static_cast<size_t>(elements) * element_bytes(type));
    const std::span<const float> in(host, static_cast<size_t>(elements));
    if (type == DataType::kBF16) {
      common::to_bf16(in, reinterpret_cast<common::Bf16*>(staging));
    } else {
      common::to_f16(in, reinterpret_cast<common::F16*>(staging));
    }
    VTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, staging, dst.bytes(), cudaMemcpyHostToDevice,
                                      compute_.get()),
                      context);
  } else {
    // Other layouts, and pinned floats (a staged batch: at the bus's speed,
    // faster than rounding on the host), convert on the device.
    void* staging = scratch(plain_bytes);
    VTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(staging, host, plain_bytes, cudaMemcpyHostToDevice, compute_.get()),
        context);
    reorder(Element::kF32, staging, 1, element(type), dst.data, blocked(dst.desc),
            compute_.get());
  }
  sync_compute(context);  // the caller may reuse `host` on return
}

bool CudaBackend::is_pinned(const void* host) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
    cudaGetLastError();  // not an error to keep: the pointer is just not CUDA's
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

void CudaBackend::download(const Tensor& src, float* host) {
  const Shape& s = src.shape();
  const int64_t elements = s.elements();
  const size_t plain_bytes = static_cast<size_t>(elements) * sizeof(float);
  const std::string context = "download " + s.str() + " " + dtype_name(src.desc.dtype);
  const DataType type = call_type("download", {src.desc});
  if (src.desc.layout == Layout::kPlain && type != DataType::kF32) {
    char* staging = pinned_staging(src.bytes());
    VTRAIN_CUDA_CHECK(cudaMemcpyAsync(staging, src.data, src.bytes(), cudaMemcpyDeviceToHost,
                                      compute_.get()),
                      context);
    sync_compute(context);
    const auto count = static_cast<size_t>(elements);
    if (type == DataType::kBF16) {
      common::to_float({reinterpret_cast<const common::Bf16*>(staging), count}, host);
    } else {
      common::to_float({reinterpret_cast<const common::F16*>(staging), count}, host);
    }
    return;
  }
  const void* from = src.data;
  if (src.desc.layout != Layout::kPlain) {
    void* staging = scratch(plain_bytes);
    reorder(element(type), src.data, channel_block(src.desc), Element::kF32, staging,
            {s.n, s.c, s.h, s.w, 1}, compute_.get());
    from = staging;
  }
  VTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(host, from, plain_bytes, cudaMemcpyDeviceToHost, compute_.get()), context);
  sync_compute(context);
}

void CudaBackend::convert(const Tensor& src, const Tensor& dst) {
  if (!(src.shape() == dst.shape())) {
    throw BackendError("convert: shapes differ: " + src.shape().str() + " vs " + dst.shape().str());
  }
  call_type("convert", {src.desc});
  call_type("convert", {dst.desc});
  if (src.desc.layout == dst.desc.layout && src.desc.dtype == dst.desc.dtype) {
    if (src.data != dst.data) {
      VTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice,
                                        compute_.get()),
                        "convert " + src.shape().str());
    }
    return;
  }
  if (src.data == dst.data) {
    throw BackendError("convert: cannot change the layout or element type of " +
                       src.shape().str() + " in place");
  }
  reorder(element(src.desc.dtype), src.data, channel_block(src.desc),
          element(dst.desc.dtype), dst.data,
          blocked(dst.desc), compute_.get());
}

void CudaBackend::fill(const Tensor& dst, float value) {
  call_type("fill", {dst.desc});
  cuda::fill(element(dst.desc.dtype), dst.data, blocked(dst.desc), value, compute_.get());
}

void CudaBackend::upload_labels(const int32_t* host, int32_t* device, int64_t count) {
  if (count <= 0) return;
  VTRAIN_CUDA_CHECK(cudaMemcpyAsync(device, host, static_cast<size_t>(count) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, compute_.get()),
                    "upload_labels");
  sync_compute("upload_labels");
}

const void* CudaBackend::in_layout(const Tensor& t, Layout layout, void* staging) {
  if (t.desc.layout == layout) return t.data;
  reorder(element(t.desc.dtype), t.data, channel_block(t.desc), element(t.desc.dtype),
          staging, blocked({t.shape(), layout, t.desc.dtype}), compute_.get());
  return staging;
}

// ---------------------------------------------------------------- precision

// bf16 and f16 run on tensor cores: cuDNN's PSEUDO_BFLOAT16 configuration
// needs compute capability 8.0, and f16 convolutions and GEMMs are only
// worth training in with Volta's tensor cores (cuDNN runs TRUE_HALF from
// 5.3 on, without them).
std::optional<std::string> CudaBackend::precision_unavailable(common::Precision precision) const {
  const std::string gpu = info_.name + " is sm_" + std::to_string(compute_capability_);
  switch (precision) {
    case common::Precision::kFp32: return std::nullopt;
    case common::Precision::kTf32:
      if (compute_capability_ >= 80) return std::nullopt;
      return "train.precision tf32 needs TF32 tensor cores (compute capability 8.0, Ampere, or "
             "newer); " + gpu;
    case common::Precision::kBf16:
      if (compute_capability_ >= 80) return std::nullopt;
      return "train.precision bf16 needs BF16 tensor cores (compute capability 8.0, Ampere, or "
             "newer); " + gpu;
    case common::Precision::kFp16:
      if (compute_capability_ >= 70) return std::nullopt;
      return "train.precision fp16 needs FP16 tensor cores (compute capability 7.0, Volta, or "
             "newer); " + gpu;
  }
  return std::string("unknown precision");
}

DataType CudaBackend::call_type(const char* op, std::initializer_list<TensorDesc> tensors) const {
  worker::check_same_dtype("cuda backend", op, tensors);
  const DataType type = tensors.begin()->dtype;
  if (type == DataType::kF32) return type;
  const common::Precision precision =
      type == DataType::kBF16 ? common::Precision::kBf16 : common::Precision::kFp16;
  if (const std::optional<std::string> why = precision_unavailable(precision)) {
    throw BackendError(std::string("cuda backend: ") + op + ": " + dtype_name(type) +
                       " tensors: " + *why);
  }
  return type;
}

// ------------------------------------------------------------------ access

DeviceStreams device_streams(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) {
    throw BackendError("the NCCL communicator needs the cuda backend, got '" +
                       backend.device_info().backend + "'");
  }
  return cuda->streams();
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  if (const std::optional<std::string> why = cuda_unavailable()) {
    throw BackendError("backend 'cuda': no CUDA GPU is visible (" + *why +
                       "); use device.backend cpu or auto (known: auto, cpu, cuda)");
  }
  return std::make_unique<CudaBackend>(options);
}

void CudaBackend::run(const OpDesc& op, const OpArgs& args) { run_op(*this, op, args); }

int cuda_device_count() {
  int count = 0;
  // Without libcuda.so the runtime reports cudaErrorInsufficientDriver here.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::optional<std::string> cuda_unavailable() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string("CUDA: ") + cudaGetErrorString(status);
  }
  if (count < 1) return "0 devices";
  return std::nullopt;
}

bool cuda_device_visible() { return !cuda_unavailable(); }

}  // namespace vtrain::worker::cuda
