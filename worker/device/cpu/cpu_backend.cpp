// CPU backend on oneDNN: lifecycle, device memory, streams and transfers.
// See cpu_backend.h; the class is in cpu_backend_impl.h.
#include "worker/device/cpu/cpu_backend_impl.h"

#include "common/cgroup_limits.h"
#include "common/machine.h"
#include "common/text.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace vtrain::worker::cpu {

namespace {

// The CPUs this process may run on when only some of the online ones (a
// rankfile, taskset, a SLURM cpuset); empty when every one.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && online > 0 && CPU_COUNT(&set) < online) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

// " (cpus 0,2)" when this process may run on only some of the online CPUs
// (`cpus`), " (cpu quota 0.5)" when its cgroup's CFS quota gives it half a
// CPU's time (a container's CPU limit), both when both: such a device is a
// slice of the CPU, and the perf DB must keep its measurements apart.
std::string slice_suffix(const std::vector<int>& cpus, std::optional<double> quota) {
  std::vector<std::string> parts;
  if (!cpus.empty()) {
    std::vector<std::string> numbers;
    for (int c : cpus) numbers.push_back(std::to_string(c));
    parts.push_back("cpus " + common::join(numbers, ","));
  }
  if (quota) parts.push_back("cpu quota " + common::format_cpus(*quota));
  return parts.empty() ? "" : " (" + common::join(parts, ", ") + ")";
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

// ----------------------------------------------------------------- lifecycle

LayoutRule layout_rule(const common::ComputeSettings& settings) {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  int64_t block = 1;
  if (isa == dnnl::cpu_isa::avx512_core || isa == dnnl::cpu_isa::avx512_core_vnni ||
      isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx ||
      isa == dnnl::cpu_isa::avx512_mic || isa == dnnl::cpu_isa::avx512_mic_4ops) {
    block = 16;
  } else if (isa == dnnl::cpu_isa::avx2 || isa == dnnl::cpu_isa::avx2_vnni) {
    block = 8;
  }
  return {.choice = settings.layout, .native_block = block, .precision = settings.precision};
}

CpuBackend::CpuBackend(const BackendOptions& options)
    : threads_before_(omp_get_max_threads()), memory_stream_(options.lazy_memory_stream) {
  // OpenMP's own default (OMP_NUM_THREADS, else the cores the process may
  // run on), as it was before any backend set a count: a backend of
  // threads 0 made while another of threads 1 lives must not inherit 1.
  static const int process_default = threads_before_;
  const std::optional<double> quota = common::cpu_quota();
  if (options.threads > 0) {
    omp_set_num_threads(options.threads);
  } else if (quota) {
    // More threads than the quota keeps busy only wait for each other at
    // every parallel region's end while the quota throttles them.
    const int busy = static_cast<int>(std::ceil(*quota - 1e-6));
    omp_set_num_threads(std::clamp(busy, 1, process_default));
  } else {
    omp_set_num_threads(process_default);
  }
  const dnnl::version_t* v = dnnl::version();
  info_.backend = "cpu";
  info_.cpus = allowed_cpus();
  info_.name = common::cpu_model_name() + slice_suffix(info_.cpus, quota);
  info_.threads = omp_get_max_threads();
  info_.library_version = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) +
                          "." + std::to_string(v->patch);
  info_.host = host_name();
  capacity_ = options.memory_limit > 0 ? options.memory_limit : static_cast<size_t>(common::usable_memory_bytes());
  info_.memory_bytes = capacity_;
  layout_rule_ = layout_rule(options.settings);
}

// OpenMP's thread count is the process's: a backend made for a moment
// (threads 1 for a planner's own network) must not leave the one that
// trains on one thread.
CpuBackend::~CpuBackend() {
  omp_set_num_threads(threads_before_);
  memory_stream_.wait_all();
  if (scratch_) free_device(scratch_);
  // Anything else still allocated belongs to owners that outlived us: a bug,
  // but freeing here keeps tools like valgrind quiet about it.
  for (auto& [ptr, bytes] : allocations_) std::free(ptr);
}

void* CpuBackend::allocate_device(size_t bytes) {
  std::lock_guard lock(alloc_mutex_);
  const size_t rounded = allocation_bytes(bytes);
  if (in_use_ + rounded > capacity_) {
    throw BackendError("cpu device out of memory: requested " + std::to_string(bytes) +
                       " bytes with " + std::to_string(in_use_) + " in use of a capacity of " +
                       std::to_string(capacity_) + " (device.memory_limit)");
  }
  void* ptr = std::aligned_alloc(kAlign, rounded);
  if (!ptr) throw BackendError("cpu device: host allocation of " + std::to_string(bytes) + " failed");
  allocations_[ptr] = rounded;
  in_use_ += rounded;
  peak_ = std::max(peak_, in_use_);
  return ptr;
}

void CpuBackend::free_device(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(alloc_mutex_);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) throw BackendError("cpu device: free of an unknown pointer");
  in_use_ -= it->second;
  allocations_.erase(it);
  std::free(ptr);
}

void* CpuBackend::allocate_pinned(size_t bytes) {
  void* ptr = std::aligned_alloc(kAlign, align_up(std::max<size_t>(bytes, 1)));
  if (!ptr) throw BackendError("cpu backend: pinned allocation of " + std::to_string(bytes) + " failed");
  return ptr;
}

// The memory stream's tasks are copies (memcpy), which do not throw.
void CpuBackend::free_pinned(void* ptr) {
  if (!ptr) return;
  memory_stream_.wait_all();
  std::free(ptr);
}

Layout CpuBackend::preferred_layout(int64_t channels) const { return layout_rule_(channels); }

char* CpuBackend::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_) free_device(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    scratch_ = static_cast<char*>(allocate_device(bytes));
    scratch_bytes_ = bytes;
  }
  return scratch_;
}


// ------------------------------------------------------- streams and copies

Event CpuBackend::record_event(StreamKind stream) {
  // The compute stream is synchronous: its events have passed when recorded.
  if (stream == StreamKind::kCompute) return {stream, 0};
  return {stream, memory_stream_.record()};
}

// The compute stream is synchronous: its work is done when the host gets here.
double CpuBackend::end_compute_span_ms() {
  if (!span_start_) return 0;
  const auto elapsed = std::chrono::steady_clock::now() - *span_start_;
  span_start_.reset();
  return std::chrono::duration<double, std::milli>(elapsed).count();
}

void CpuBackend::wait_event(StreamKind stream, const Event& event) {
  if (event.stream == StreamKind::kCompute) return;  // already passed
  if (stream == StreamKind::kCompute) {
    memory_stream_.wait(event.ticket);  // compute runs on this thread
  }
  // Memory-stream work waiting on a memory-stream event is already ordered.
}

void CpuBackend::synchronize(const Event& event) {
  if (event.stream == StreamKind::kMemory) memory_stream_.wait(event.ticket);
}

void CpuBackend::synchronize(StreamKind stream) {
  if (stream == StreamKind::kMemory) memory_stream_.wait_all();
}

void CpuBackend::copy_async(void* dst, const void* src, size_t bytes, StreamKind stream) {
  if (stream == StreamKind::kCompute) {
    std::memcpy(dst, src, bytes);
    return;
  }
  memory_stream_.enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
}

void CpuBackend::reorder(const memory::desc& src_md, const void* src, const memory::desc& dst_md,
                         void* dst, bool sum) {
  try {
    // Reorder primitives are cheap to create relative to the copy and the
    // descriptor key would cost as much as the creation, so no cache here.
    dnnl::primitive_attr attr;
    if (sum) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::reorder::primitive_desc pd(engine_, src_md, engine_, dst_md, attr);
    run_reorder(dnnl::reorder(pd), mem(src_md, src), mem(dst_md, dst));
    stream_.wait();
  } catch (const dnnl::error& e) {
    rethrow("reorder", e);
  }
}

void CpuBackend::upload(const float* host, const Tensor& dst) {
  if (dst.desc.layout == Layout::kPlain && dst.desc.dtype == DataType::kF32) {
    std::memcpy(dst.data, host, dst.bytes());
    return;
  }
  reorder(plain_md(dst.shape()), host, md_of(dst.desc), dst.data);
}

void CpuBackend::download(const Tensor& src, float* host) {
  if (src.desc.layout == Layout::kPlain && src.desc.dtype == DataType::kF32) {
    std::memcpy(host, src.data, src.bytes());
    return;
  }
  reorder(md_of(src.desc), src.data, plain_md(src.shape()), host);
}

void CpuBackend::convert(const Tensor& src, const Tensor& dst) {
  if (!(src.shape() == dst.shape())) {
    throw BackendError("convert: shapes differ: " + src.shape().str() + " vs " + dst.shape().str());
  }
  if (src.desc.layout == dst.desc.layout && src.desc.dtype == dst.desc.dtype) {
    if (src.data != dst.data) std::memcpy(dst.data, src.data, dst.bytes());
    return;
  }
  reorder(md_of(src.desc), src.data, md_of(dst.desc), dst.data);
}

void CpuBackend::fill(const Tensor& dst, float value) {
  const Shape& s = dst.shape();
  const int64_t block = channel_block(dst.desc);
  const int64_t blocks = (s.c + block - 1) / block;
  const int64_t spatial = s.h * s.w;
  with_element_type(dst.desc.dtype, [&]<class T>(T) {
    T filled{}, zero{};
    store(&filled, value);
    store(&zero, 0.0f);
    T* data = static_cast<T*>(dst.data);
    // Padding channels of blocked layouts must stay zero.
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t cb = 0; cb < blocks; ++cb) {
        T* base = data + (n * blocks + cb) * spatial * block;
        for (int64_t i = 0; i < spatial; ++i) {
          for (int64_t lane = 0; lane < block; ++lane) {
            base[i * block + lane] = (cb * block + lane < s.c) ? filled : zero;
          }
        }
      }
    }
  });
}

// --------------------------------------------------------------- precision

namespace {

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "SSE4.1";
    case dnnl::cpu_isa::avx: return "AVX";
    case dnnl::cpu_isa::avx2: return "AVX2";
    case dnnl::cpu_isa::avx2_vnni: return "AVX2 VNNI";
    case dnnl::cpu_isa::avx512_mic: return "AVX-512 (MIC)";
    case dnnl::cpu_isa::avx512_mic_4ops: return "AVX-512 (MIC 4ops)";
    case dnnl::cpu_isa::avx512_core: return "AVX-512";
    case dnnl::cpu_isa::avx512_core_vnni: return "AVX-512 VNNI";
    case dnnl::cpu_isa::avx512_core_bf16: return "AVX-512 BF16";
    case dnnl::cpu_isa::avx512_core_amx: return "AMX";
    default: return "an instruction set older than SSE4.1";
  }
}

}  // namespace

std::optional<std::string> CpuBackend::precision_unavailable(common::Precision precision) const {
  switch (precision) {
    case common::Precision::kFp32: return std::nullopt;
    case common::Precision::kBf16: {
      // oneDNN runs bf16 on any AVX-512 CPU, but without native bf16
      // instructions it emulates them, slower than fp32: refused.
      const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
      if (isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx) {
        return std::nullopt;
      }
      return std::string("train.precision bf16 needs native bf16 instructions (AVX-512 BF16 or "
                         "AMX); oneDNN finds ") +
             isa_name(isa) + " on this CPU (" + info_.name + ")";
    }
    case common::Precision::kTf32:
      return std::string("train.precision tf32 is a GPU tensor-core mode; the CPU backend "
                         "trains in fp32 or, with AVX-512 BF16 or AMX, bf16");
    case common::Precision::kFp16:
      return std::string("train.precision fp16 runs on the CUDA backend only; the CPU backend "
                         "trains in fp32 or, with AVX-512 BF16 or AMX, bf16");
  }
  return std::string("unknown precision");
}

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

void CpuBackend::run(const OpDesc& op, const OpArgs& args) { run_op(*this, op, args); }

}  // namespace vtrain::worker::cpu
