// CPU backend on oneDNN. See cpu_backend.h.
//
// Every primitive runs with a user-provided scratchpad, so all memory it
// touches is device memory that this backend counts: convolutions use the
// caller's workspace, other ops a backend-owned scratch buffer. Primitives are
// created once per (op, shapes, layouts) and cached.
#include "worker/device/cpu/cpu_backend.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "dnnl.hpp"
#include "common/host_stream.h"
#include "common/machine.h"
#include "worker/device/cpu/im2col_gemm.h"

namespace vtrain::worker::cpu {
namespace {

using dnnl::memory;
using Tag = dnnl::memory::format_tag;

constexpr size_t kAlign = 64;

size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

memory::desc md_of(const TensorDesc& d) {
  const memory::dims dims{d.shape.n, d.shape.c, d.shape.h, d.shape.w};
  switch (d.layout) {
    case Layout::kPlain: return {dims, memory::data_type::f32, Tag::nchw};
    case Layout::kBlocked8: return {dims, memory::data_type::f32, Tag::nChw8c};
    case Layout::kBlocked16: return {dims, memory::data_type::f32, Tag::nChw16c};
  }
  throw BackendError("unknown layout");
}

memory::desc plain_md(const Shape& s) { return md_of({s, Layout::kPlain}); }
memory::desc vector_md(int64_t n) { return {{n}, memory::data_type::f32, Tag::x}; }
// Rows = channels: the "CNHW" order the im2col GEMMs produce and consume.
memory::desc cnhw_md(const Shape& s) {
  return {{s.n, s.c, s.h, s.w}, memory::data_type::f32, Tag::bacd};
}
memory::desc any_md(const Shape& s) {
  return {{s.n, s.c, s.h, s.w}, memory::data_type::f32, Tag::any};
}

dnnl::primitive_attr user_scratchpad_attr(bool sum_post_op = false) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (sum_post_op) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  return attr;
}

std::string shape_key(const TensorDesc& d) {
  return d.shape.str() + layout_name(d.layout);
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

// " (cpus 0,2)" when this process may run on only some of the online CPUs
// (a rankfile, taskset, a SLURM cpuset): such a device is not the whole CPU,
// and the perf DB must keep its measurements apart.
std::string affinity_suffix() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "";
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online <= 0 || CPU_COUNT(&set) >= online) return "";
  std::string cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    if (!cpus.empty()) cpus += ',';  // not "," + to_string(c): a GCC 12 -Wrestrict false positive
    cpus += std::to_string(c);
  }
  return " (cpus " + cpus + ")";
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

[[noreturn]] void rethrow(const std::string& what, const dnnl::error& e) {
  throw BackendError("cpu backend: " + what + ": oneDNN error: " + e.what());
}

// A prepared stage that moves data between a user buffer and a temporary
// in the workspace when the primitive wants another format (or when the
// result must be accumulated into the user buffer).
struct Stage {
  bool active = false;
  memory::desc user_md;
  memory::desc prim_md;
  size_t offset = 0;  // of the temporary in the workspace
  dnnl::reorder reorder;
};

// Adds a temporary of `md` to a workspace being laid out.
size_t reserve(size_t& cursor, const memory::desc& md) {
  const size_t offset = cursor;
  cursor += align_up(md.get_size());
  return offset;
}

// Primitive plus stages for one convolution (kind, algorithm, problem, accumulate).
struct ConvPlan {
  // oneDNN path
  dnnl::primitive prim;
  memory::desc scratch_md;
  size_t scratch_offset = 0;
  Stage in0, in1;        // fwd: src, weights; bwd-data: diff_dst, weights; bwd-filter: src, diff_dst
  Stage out;             // dst, diff_src or diff_weights
  Stage out_bias;        // diff_bias (bwd-filter with accumulate)
  // im2col path
  bool im2col = false;
  Im2colGeometry geometry{};
  size_t cols_offset = 0;
  size_t workspace = 0;
};

}  // namespace

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  ~CpuBackend() override;

  DeviceInfo device_info() const override { return info_; }

  void* allocate_device(size_t bytes) override;
  void free_device(void* ptr) override;
  size_t device_bytes_in_use() const override {
    std::lock_guard lock(alloc_mutex_);
    return in_use_;
  }
  size_t device_bytes_peak() const override {
    std::lock_guard lock(alloc_mutex_);
    return peak_;
  }
  void reset_peak() override {
    std::lock_guard lock(alloc_mutex_);
    peak_ = in_use_;
  }
  void* allocate_pinned(size_t bytes) override;
  void free_pinned(void* ptr) override { std::free(ptr); }
  Layout preferred_layout(int64_t channels) const override;

  Event record_event(StreamKind stream) override;
  void wait_event(StreamKind stream, const Event& event) override;
  void synchronize(const Event& event) override;
  void synchronize(StreamKind stream) override;
  void copy_async(void* dst, const void* src, size_t bytes, StreamKind stream) override;

  void upload(const float* host, const Tensor& dst) override;
  void download(const Tensor& src, float* host) override;
  void convert(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;
  void upload_labels(const int32_t* host, int32_t* device, int64_t count) override {
    std::memcpy(device, host, static_cast<size_t>(count) * sizeof(int32_t));
  }

  std::vector<ConvAlgoInfo> conv_algorithms(ConvKind kind, const ConvProblem& p,
                                            bool accumulate) override;
  std::string conv_algorithm_name(ConvKind kind, ConvAlgo algo) const override;
  size_t conv_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                        bool accumulate) override {
    return conv_plan(kind, algo, p, accumulate, /*has_bias=*/true).workspace;
  }
  void conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const float* w,
                    const float* bias, const Tensor& y, float beta, void* workspace,
                    size_t workspace_bytes) override;
  void conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy, const float* w,
                          const Tensor& dx, float beta, void* workspace,
                          size_t workspace_bytes) override;
  void conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                            const Tensor& dy, float* dw, float* dbias, float beta,
                            void* workspace, size_t workspace_bytes) override;

  void relu_forward(const Tensor& x, const Tensor& y) override;
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override;
  size_t pooling_state_bytes(const PoolParams& p, const TensorDesc& x,
                             const TensorDesc& y) override;
  void pooling_forward(const PoolParams& p, const Tensor& x, const Tensor& y,
                       void* state) override;
  void pooling_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& dx, const void* state) override;
  void inner_product_forward(const Tensor& x, const float* w, const float* bias,
                             const Tensor& y) override;
  void inner_product_backward_data(const Tensor& dy, const float* w, const Tensor& dx) override;
  void inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw,
                                      float* dbias, float beta) override;
  void batch_norm_forward_training(const Tensor& x, const Tensor& y, const float* scale_shift,
                                   float* save_mean, float* save_var, float* running_mean,
                                   float* running_var, float momentum, float eps) override;
  void batch_norm_forward_inference(const Tensor& x, const Tensor& y, const float* scale_shift,
                                    const float* running_mean, const float* running_var,
                                    float eps) override;
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                           const float* save_mean, const float* save_var, const Tensor& dx,
                           float* dscale_shift, float beta, float eps) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void accumulate(const Tensor& x, const Tensor& y, float beta) override;
  void concat_forward(std::span<const Tensor> xs, const Tensor& y) override;
  void concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx,
                       float beta) override;
  LossStats softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float scale,
                                  const Tensor* dlogits) override;
  void sgd_update(float* w, const float* g, float* velocity, int64_t count,
                  const SgdStep& step) override;
  void scale(float* x, int64_t count, float alpha) override;

 private:
  const ConvPlan& conv_plan(ConvKind kind, ConvAlgo algo, const ConvProblem& p, bool accumulate,
                            bool has_bias);
  ConvPlan build_dnnl_conv(ConvKind kind, ConvAlgo algo, const ConvProblem& p, bool accumulate,
                           bool has_bias);
  ConvPlan build_im2col_conv(ConvKind kind, const ConvProblem& p, bool accumulate, bool has_bias);
  // Runs a oneDNN convolution plan: in0/in1/out as in ConvPlan's stages;
  // bias is the forward bias, dbias the backward-filter bias gradient.
  void run_dnnl_conv(ConvKind kind, const ConvPlan& plan, char* ws, const void* in0,
                     const void* in1, void* out, const float* bias, float* dbias);
  void run_im2col(ConvKind kind, const ConvPlan& plan, const ConvProblem& p, const Tensor* x,
                  const float* w, const float* bias, const Tensor* dy, const Tensor* out,
                  float* dw, float* dbias, float beta, char* ws);
  void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
             const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

  // Reorder between two descriptions of the same data; `sum` adds into dst.
  void reorder(const memory::desc& src_md, const void* src, const memory::desc& dst_md, void* dst,
               bool sum = false);
  // Scratch memory for non-convolution ops, grown on demand and counted as
  // device memory. Valid until the next call that asks for scratch.
  char* scratch(size_t bytes);
  void run_reorder(const dnnl::reorder& r, memory src, memory dst) {
    r.execute(stream_, src, dst);
  }
  memory mem(const memory::desc& md, const void* ptr) {
    return memory(md, engine_, const_cast<void*>(ptr));
  }
  void execute(const dnnl::primitive& prim, std::unordered_map<int, memory> args) {
    prim.execute(stream_, args);
    stream_.wait();
  }
  template <typename Pd>
  const Pd& cached(const std::string& key, const std::function<Pd()>& make);

  DeviceInfo info_;
  size_t capacity_;
  int block_;  // channel block preferred by the CPU's ISA (16, 8 or 1)
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  common::HostStream memory_stream_;

  mutable std::mutex alloc_mutex_;
  std::unordered_map<void*, size_t> allocations_;
  size_t in_use_ = 0;
  size_t peak_ = 0;

  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;

  std::unordered_map<std::string, ConvPlan> conv_plans_;
  std::unordered_map<std::string, std::shared_ptr<void>> primitive_cache_;
};

// ----------------------------------------------------------------- lifecycle

CpuBackend::CpuBackend(const BackendOptions& options) {
  if (options.threads > 0) omp_set_num_threads(options.threads);
  const dnnl::version_t* v = dnnl::version();
  info_.backend = "cpu";
  info_.name = cpu_model_name() + affinity_suffix();
  info_.threads = omp_get_max_threads();
  info_.library_version = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) +
                          "." + std::to_string(v->patch);
  info_.host = host_name();
  capacity_ = options.memory_limit > 0 ? options.memory_limit : static_cast<size_t>(common::physical_memory_bytes());
  info_.memory_bytes = capacity_;
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  if (isa == dnnl::cpu_isa::avx512_core || isa == dnnl::cpu_isa::avx512_core_vnni ||
      isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx ||
      isa == dnnl::cpu_isa::avx512_mic || isa == dnnl::cpu_isa::avx512_mic_4ops) {
    block_ = 16;
  } else if (isa == dnnl::cpu_isa::avx2 || isa == dnnl::cpu_isa::avx2_vnni) {
    block_ = 8;
  } else {
    block_ = 1;
  }
}

CpuBackend::~CpuBackend() {
  memory_stream_.wait_all();
  if (scratch_) free_device(scratch_);
  // Anything else still allocated belongs to owners that outlived us: a bug,
  // but freeing here keeps tools like valgrind quiet about it.
  for (auto& [ptr, bytes] : allocations_) std::free(ptr);
}

void* CpuBackend::allocate_device(size_t bytes) {
  std::lock_guard lock(alloc_mutex_);
  const size_t rounded = align_up(std::max<size_t>(bytes, 1));
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

Layout CpuBackend::preferred_layout(int64_t channels) const {
  // Blocked layouts pad channels up to the block; below one block the
  // padding would cost more than the vector kernels gain.
  if (block_ == 16 && channels >= 16) return Layout::kBlocked16;
  if (block_ >= 8 && channels >= 8) return Layout::kBlocked8;
  return Layout::kPlain;
}

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

template <typename Pd>
const Pd& CpuBackend::cached(const std::string& key, const std::function<Pd()>& make) {
  auto it = primitive_cache_.find(key);
  if (it == primitive_cache_.end()) {
    it = primitive_cache_.emplace(key, std::make_shared<Pd>(make())).first;
  }
  return *static_cast<const Pd*>(it->second.get());
}

// ------------------------------------------------------- streams and copies

Event CpuBackend::record_event(StreamKind stream) {
  // The compute stream is synchronous: its events have passed when recorded.
  if (stream == StreamKind::kCompute) return {stream, 0};
  return {stream, memory_stream_.record()};
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
  if (dst.desc.layout == Layout::kPlain) {
    std::memcpy(dst.data, host, dst.bytes());
    return;
  }
  reorder(plain_md(dst.shape()), host, md_of(dst.desc), dst.data);
}

void CpuBackend::download(const Tensor& src, float* host) {
  if (src.desc.layout == Layout::kPlain) {
    std::memcpy(host, src.data, src.bytes());
    return;
  }
  reorder(md_of(src.desc), src.data, plain_md(src.shape()), host);
}

void CpuBackend::convert(const Tensor& src, const Tensor& dst) {
  if (!(src.shape() == dst.shape())) {
    throw BackendError("convert: shapes differ: " + src.shape().str() + " vs " + dst.shape().str());
  }
  if (src.desc.layout == dst.desc.layout) {
    if (src.data != dst.data) std::memcpy(dst.data, src.data, dst.bytes());
    return;
  }
  reorder(md_of(src.desc), src.data, md_of(dst.desc), dst.data);
}

void CpuBackend::fill(const Tensor& dst, float value) {
  const Shape& s = dst.shape();
  const int64_t block = channel_block(dst.desc.layout);
  const int64_t blocks = (s.c + block - 1) / block;
  const int64_t spatial = s.h * s.w;
  float* data = dst.data;
  // Padding channels of blocked layouts must stay zero.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t cb = 0; cb < blocks; ++cb) {
      float* base = data + (n * blocks + cb) * spatial * block;
      for (int64_t i = 0; i < spatial; ++i) {
        for (int64_t lane = 0; lane < block; ++lane) {
          base[i * block + lane] = (cb * block + lane < s.c) ? value : 0.0f;
        }
      }
    }
  }
}

// ------------------------------------------------------------- convolution

std::string CpuBackend::conv_algorithm_name(ConvKind, ConvAlgo algo) const {
  switch (algo) {
    case kDirect: return "direct";
    case kWinograd: return "winograd";
    case kIm2colGemm: return "im2col_gemm";
  }
  throw BackendError("cpu backend: unknown convolution algorithm id " + std::to_string(algo) +
                     " (known: 0 direct, 1 winograd, 2 im2col_gemm)");
}

std::vector<ConvAlgoInfo> CpuBackend::conv_algorithms(ConvKind kind, const ConvProblem& p,
                                                      bool accumulate) {
  std::vector<ConvAlgoInfo> algos;
  for (ConvAlgo algo : {kDirect, kWinograd, kIm2colGemm}) {
    try {
      const ConvPlan& plan = conv_plan(kind, algo, p, accumulate, true);
      algos.push_back({algo, conv_algorithm_name(kind, algo), plan.workspace});
    } catch (const BackendError&) {
      // Not available for this problem on this CPU.
    }
  }
  return algos;
}

const ConvPlan& CpuBackend::conv_plan(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                                      bool accumulate, bool has_bias) {
  if (!(p.y.shape == p.output_shape())) {
    throw BackendError("convolution " + p.str() + ": output shape should be " +
                       p.output_shape().str());
  }
  const std::string key = std::to_string(static_cast<int>(kind)) + "/" + std::to_string(algo) +
                          "/" + p.str() + (accumulate ? "/acc" : "/set") +
                          (has_bias ? "/b" : "/nb");
  auto it = conv_plans_.find(key);
  if (it != conv_plans_.end()) return it->second;
  ConvPlan plan;
  if (algo == kIm2colGemm) {
    plan = build_im2col_conv(kind, p, accumulate, has_bias);
  } else if (algo == kDirect || algo == kWinograd) {
    plan = build_dnnl_conv(kind, algo, p, accumulate, has_bias);
  } else {
    conv_algorithm_name(kind, algo);  // throws naming the known ids
  }
  return conv_plans_.emplace(key, std::move(plan)).first->second;
}

ConvPlan CpuBackend::build_dnnl_conv(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                                     bool accumulate, bool has_bias) {
  const auto alg =
      algo == kWinograd ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
  const memory::dims strides{p.stride_h, p.stride_w};
  const memory::dims pad{p.pad_h, p.pad_w};
  const Shape w_shape = p.weight_shape();
  const memory::desc x_any = any_md(p.x.shape);
  const memory::desc y_any = any_md(p.y.shape);
  const memory::desc w_any = any_md(w_shape);
  const memory::desc b_md = has_bias ? vector_md(p.k) : memory::desc();

  ConvPlan plan;
  size_t cursor = 0;
  auto stage = [&](Stage& s, const memory::desc& user, const memory::desc& prim, bool out,
                   bool force) {
    s.user_md = user;
    s.prim_md = prim;
    s.active = force || user != prim;
    if (!s.active) return;
    s.offset = reserve(cursor, prim);
    dnnl::primitive_attr attr;
    if (out && accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    s.reorder = out ? dnnl::reorder(dnnl::reorder::primitive_desc(engine_, prim, engine_, user, attr))
                    : dnnl::reorder(dnnl::reorder::primitive_desc(engine_, user, engine_, prim));
  };

  try {
    // The forward descriptor is also the hint backward primitives need.
    const bool fwd_sum = kind == ConvKind::kForward && accumulate;
    dnnl::convolution_forward::desc fwd_desc(dnnl::prop_kind::forward_training, alg, x_any, w_any,
                                             kind == ConvKind::kForward ? b_md : memory::desc(),
                                             y_any, strides, pad, pad);
    dnnl::convolution_forward::primitive_desc fwd_pd(fwd_desc, user_scratchpad_attr(), engine_);
    switch (kind) {
      case ConvKind::kForward: {
        // With a sum post-op the primitive accumulates into dst itself, but
        // only when dst is already in the primitive's format.
        const bool dst_matches = fwd_pd.dst_desc() == md_of(p.y);
        auto pd = (fwd_sum && dst_matches)
                      ? dnnl::convolution_forward::primitive_desc(fwd_desc,
                                                                  user_scratchpad_attr(true), engine_)
                      : fwd_pd;
        plan.prim = dnnl::convolution_forward(pd);
        plan.scratch_md = pd.scratchpad_desc();
        stage(plan.in0, md_of(p.x), pd.src_desc(), false, false);
        stage(plan.in1, plain_md(w_shape), pd.weights_desc(), false, false);
        stage(plan.out, md_of(p.y), pd.dst_desc(), true, false);
        plan.out_bias.user_md = b_md;  // the forward bias is an input, never staged
        break;
      }
      case ConvKind::kBackwardData: {
        dnnl::convolution_backward_data::desc d(alg, x_any, w_any, y_any, strides, pad, pad);
        dnnl::convolution_backward_data::primitive_desc pd(d, user_scratchpad_attr(), engine_,
                                                           fwd_pd);
        plan.prim = dnnl::convolution_backward_data(pd);
        plan.scratch_md = pd.scratchpad_desc();
        stage(plan.in0, md_of(p.y), pd.diff_dst_desc(), false, false);
        stage(plan.in1, plain_md(w_shape), pd.weights_desc(), false, false);
        stage(plan.out, md_of(p.x), pd.diff_src_desc(), true, accumulate);
        break;
      }
      case ConvKind::kBackwardFilter: {
        dnnl::convolution_backward_weights::desc d(alg, x_any, w_any, b_md, y_any, strides, pad,
                                                   pad);
        dnnl::convolution_backward_weights::primitive_desc pd(d, user_scratchpad_attr(), engine_,
                                                              fwd_pd);
        plan.prim = dnnl::convolution_backward_weights(pd);
        plan.scratch_md = pd.scratchpad_desc();
        stage(plan.in0, md_of(p.x), pd.src_desc(), false, false);
        stage(plan.in1, md_of(p.y), pd.diff_dst_desc(), false, false);
        stage(plan.out, plain_md(w_shape), pd.diff_weights_desc(), true, accumulate);
        if (has_bias) stage(plan.out_bias, b_md, pd.diff_bias_desc(), true, accumulate);
        break;
      }
    }
  } catch (const dnnl::error& e) {
    throw BackendError(std::string("cpu backend: ") + conv_kind_name(kind) + " algorithm " +
                       conv_algorithm_name(kind, algo) + " is not available for " + p.str() +
                       ": " + e.what());
  }
  plan.scratch_offset = reserve(cursor, plan.scratch_md);
  plan.workspace = cursor;
  return plan;
}

ConvPlan CpuBackend::build_im2col_conv(ConvKind kind, const ConvProblem& p, bool accumulate,
                                       bool has_bias) {
  ConvPlan plan;
  plan.im2col = true;
  const Shape y = p.output_shape();
  plan.geometry = {p.x.shape.n, p.x.shape.c, p.x.shape.h, p.x.shape.w, p.r, p.s, p.pad_h,
                   p.pad_w, p.stride_h, p.stride_w, y.h, y.w};
  size_t cursor = 0;
  const size_t cols_bytes =
      static_cast<size_t>(plan.geometry.rows() * plan.geometry.cols()) * sizeof(float);
  plan.cols_offset = cursor;
  cursor += align_up(cols_bytes);
  // in0: the input in plain NCHW (x) or the output gradient in CNHW (dy);
  // out: the result staged before it is reordered (and summed) into place.
  const bool x_plain = p.x.layout == Layout::kPlain;
  switch (kind) {
    case ConvKind::kForward:
      plan.in0.active = !x_plain;
      if (plan.in0.active) plan.in0.offset = reserve(cursor, plain_md(p.x.shape));
      plan.out.active = true;
      plan.out.offset = reserve(cursor, cnhw_md(y));
      break;
    case ConvKind::kBackwardData:
      plan.in0.active = true;
      plan.in0.offset = reserve(cursor, cnhw_md(y));
      plan.out.active = !x_plain;
      if (plan.out.active) plan.out.offset = reserve(cursor, plain_md(p.x.shape));
      break;
    case ConvKind::kBackwardFilter:
      plan.in0.active = !x_plain;
      if (plan.in0.active) plan.in0.offset = reserve(cursor, plain_md(p.x.shape));
      plan.in1.active = true;
      plan.in1.offset = reserve(cursor, cnhw_md(y));
      break;
  }
  (void)accumulate;  // GEMM beta and reorder-sum accumulate without extra space
  plan.workspace = cursor;
  return plan;
}

void CpuBackend::sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                       int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                       int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) {
    throw BackendError("cpu backend: dnnl_sgemm failed with status " + std::to_string(st));
  }
}

void CpuBackend::run_im2col(ConvKind kind, const ConvPlan& plan, const ConvProblem& p,
                            const Tensor* x, const float* w, const float* bias, const Tensor* dy,
                            const Tensor* out, float* dw, float* dbias, float beta, char* ws) {
  const Im2colGeometry& g = plan.geometry;
  const Shape y_shape = p.output_shape();
  float* cols = reinterpret_cast<float*>(ws + plan.cols_offset);
  const int64_t K = p.k, CRS = g.rows(), NPQ = g.cols();
  auto plain_x = [&](const Tensor& t, const Stage& s) -> const float* {
    if (!s.active) return t.data;
    float* tmp = reinterpret_cast<float*>(ws + s.offset);
    reorder(md_of(t.desc), t.data, plain_md(t.shape()), tmp);
    return tmp;
  };
  switch (kind) {
    case ConvKind::kForward: {
      im2col(g, plain_x(*x, plan.in0), cols);
      float* yt = reinterpret_cast<float*>(ws + plan.out.offset);  // K x NPQ (CNHW)
      sgemm('N', 'N', K, NPQ, CRS, w, CRS, cols, NPQ, 0.0f, yt, NPQ);
      if (bias) {
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < K; ++k) {
          for (int64_t i = 0; i < NPQ; ++i) yt[k * NPQ + i] += bias[k];
        }
      }
      reorder(cnhw_md(y_shape), yt, md_of(out->desc), out->data, beta != 0.0f);
      break;
    }
    case ConvKind::kBackwardData: {
      float* dyt = reinterpret_cast<float*>(ws + plan.in0.offset);
      reorder(md_of(dy->desc), dy->data, cnhw_md(y_shape), dyt);
      sgemm('T', 'N', CRS, NPQ, K, w, CRS, dyt, NPQ, 0.0f, cols, NPQ);
      float* dx = plan.out.active ? reinterpret_cast<float*>(ws + plan.out.offset) : out->data;
      const bool fold_into_user = !plan.out.active;
      if (!fold_into_user || beta == 0.0f) {
        std::memset(dx, 0, static_cast<size_t>(p.x.shape.elements()) * sizeof(float));
      }
      col2im_accumulate(g, cols, dx);
      if (!fold_into_user) {
        reorder(plain_md(p.x.shape), dx, md_of(out->desc), out->data, beta != 0.0f);
      }
      break;
    }
    case ConvKind::kBackwardFilter: {
      im2col(g, plain_x(*x, plan.in0), cols);
      float* dyt = reinterpret_cast<float*>(ws + plan.in1.offset);
      reorder(md_of(dy->desc), dy->data, cnhw_md(y_shape), dyt);
      sgemm('N', 'T', K, CRS, NPQ, dyt, NPQ, cols, NPQ, beta, dw, CRS);
      if (dbias) {
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < K; ++k) {
          double sum = 0.0;
          for (int64_t i = 0; i < NPQ; ++i) sum += dyt[k * NPQ + i];
          // beta = 0 must not read dbias: it may hold anything, NaN included.
          dbias[k] = beta == 0.0f ? static_cast<float>(sum) : static_cast<float>(sum) + dbias[k];
        }
      }
      break;
    }
  }
}

namespace {

void check_workspace(const char* op, size_t have, size_t need, const ConvProblem& p) {
  if (have < need) {
    throw BackendError(std::string("cpu backend: ") + op + " " + p.str() + " needs " +
                       std::to_string(need) + " workspace bytes, got " + std::to_string(have));
  }
}

void check_beta(const char* op, float beta) {
  if (beta != 0.0f && beta != 1.0f) {
    throw BackendError(std::string("cpu backend: ") + op + ": beta must be 0 or 1, got " +
                       std::to_string(beta));
  }
}

}  // namespace

void CpuBackend::run_dnnl_conv(ConvKind kind, const ConvPlan& plan, char* ws, const void* in0,
                               const void* in1, void* out, const float* bias, float* dbias) {
  // Argument ids of the two inputs and the output, per kind.
  static constexpr int kArgs[3][3] = {
      {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
      {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
      {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS},
  };
  const int* ids = kArgs[static_cast<int>(kind)];
  std::unordered_map<int, memory> args;
  auto input = [&](const Stage& s, const void* user, int arg) {
    if (s.active) {
      run_reorder(s.reorder, mem(s.user_md, user), mem(s.prim_md, ws + s.offset));
      args[arg] = mem(s.prim_md, ws + s.offset);
    } else {
      args[arg] = mem(s.user_md, user);
    }
  };
  // An output staged in the workspace is reordered (and, when
  // accumulating, summed) into place after the primitive.
  auto output = [&](const Stage& s, void* user, int arg) {
    args[arg] = s.active ? mem(s.prim_md, ws + s.offset) : mem(s.user_md, user);
  };
  auto finish = [&](const Stage& s, void* user) {
    if (s.active) run_reorder(s.reorder, mem(s.prim_md, ws + s.offset), mem(s.user_md, user));
  };
  input(plan.in0, in0, ids[0]);
  input(plan.in1, in1, ids[1]);
  output(plan.out, out, ids[2]);
  if (bias) args[DNNL_ARG_BIAS] = mem(plan.out_bias.user_md, bias);
  if (dbias) output(plan.out_bias, dbias, DNNL_ARG_DIFF_BIAS);
  args[DNNL_ARG_SCRATCHPAD] = mem(plan.scratch_md, ws + plan.scratch_offset);
  plan.prim.execute(stream_, args);
  finish(plan.out, out);
  if (dbias) finish(plan.out_bias, dbias);
  stream_.wait();
}

void CpuBackend::conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const float* w,
                              const float* bias, const Tensor& y, float beta, void* workspace,
                              size_t workspace_bytes) {
  check_beta("conv_forward", beta);
  const ConvPlan& plan = conv_plan(ConvKind::kForward, algo, p, beta != 0.0f, bias != nullptr);
  check_workspace("conv_forward", workspace_bytes, plan.workspace, p);
  char* ws = static_cast<char*>(workspace);
  try {
    if (plan.im2col) {
      run_im2col(ConvKind::kForward, plan, p, &x, w, bias, nullptr, &y, nullptr, nullptr, beta, ws);
    } else {
      run_dnnl_conv(ConvKind::kForward, plan, ws, x.data, w, y.data, bias, nullptr);
    }
  } catch (const dnnl::error& e) {
    rethrow("conv_forward " + p.str(), e);
  }
}

void CpuBackend::conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy,
                                    const float* w, const Tensor& dx, float beta, void* workspace,
                                    size_t workspace_bytes) {
  check_beta("conv_backward_data", beta);
  const ConvPlan& plan = conv_plan(ConvKind::kBackwardData, algo, p, beta != 0.0f, true);
  check_workspace("conv_backward_data", workspace_bytes, plan.workspace, p);
  char* ws = static_cast<char*>(workspace);
  try {
    if (plan.im2col) {
      run_im2col(ConvKind::kBackwardData, plan, p, nullptr, w, nullptr, &dy, &dx, nullptr, nullptr,
                 beta, ws);
    } else {
      run_dnnl_conv(ConvKind::kBackwardData, plan, ws, dy.data, w, dx.data, nullptr, nullptr);
    }
  } catch (const dnnl::error& e) {
    rethrow("conv_backward_data " + p.str(), e);
  }
}

void CpuBackend::conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                                      const Tensor& dy, float* dw, float* dbias, float beta,
                                      void* workspace, size_t workspace_bytes) {
  check_beta("conv_backward_filter", beta);
  const ConvPlan& plan =
      conv_plan(ConvKind::kBackwardFilter, algo, p, beta != 0.0f, dbias != nullptr);
  check_workspace("conv_backward_filter", workspace_bytes, plan.workspace, p);
  char* ws = static_cast<char*>(workspace);
  try {
    if (plan.im2col) {
      run_im2col(ConvKind::kBackwardFilter, plan, p, &x, nullptr, nullptr, &dy, nullptr, dw, dbias,
                 beta, ws);
    } else {
      run_dnnl_conv(ConvKind::kBackwardFilter, plan, ws, x.data, dy.data, dw, nullptr, dbias);
    }
  } catch (const dnnl::error& e) {
    rethrow("conv_backward_filter " + p.str(), e);
  }
}

// ----------------------------------------------------------------- eltwise

void CpuBackend::relu_forward(const Tensor& x, const Tensor& y) {
  if (!(x.desc == y.desc)) throw BackendError("relu_forward: x and y descriptors differ");
  try {
    const std::string key = "relu_f" + shape_key(x.desc);
    const auto& pd = cached<dnnl::eltwise_forward::primitive_desc>(key, [&] {
      dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md_of(x.desc),
                                    0.0f, 0.0f);
      return dnnl::eltwise_forward::primitive_desc(d, user_scratchpad_attr(), engine_);
    });
    execute(dnnl::eltwise_forward(pd),
            {{DNNL_ARG_SRC, mem(pd.src_desc(), x.data)}, {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
             {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), scratch(pd.scratchpad_desc().get_size()))}});
  } catch (const dnnl::error& e) {
    rethrow("relu_forward " + x.shape().str(), e);
  }
}

void CpuBackend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  if (!(y.desc == dy.desc) || !(dy.desc == dx.desc)) {
    throw BackendError("relu_backward: y, dy and dx descriptors must match");
  }
  try {
    const std::string key = "relu_b" + shape_key(y.desc);
    const auto& pd = cached<dnnl::eltwise_backward::primitive_desc>(key, [&] {
      const memory::desc md = md_of(y.desc);
      dnnl::eltwise_forward::desc fd(dnnl::prop_kind::forward_training,
                                     dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md, 0.0f, 0.0f);
      dnnl::eltwise_forward::primitive_desc hint(fd, engine_);
      dnnl::eltwise_backward::desc d(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md, md, 0.0f,
                                     0.0f);
      return dnnl::eltwise_backward::primitive_desc(d, user_scratchpad_attr(), engine_, hint);
    });
    execute(dnnl::eltwise_backward(pd),
            {{DNNL_ARG_DST, mem(pd.src_desc(), y.data)},
             {DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), dy.data)},
             {DNNL_ARG_DIFF_SRC, mem(pd.diff_src_desc(), dx.data)},
             {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), scratch(pd.scratchpad_desc().get_size()))}});
  } catch (const dnnl::error& e) {
    rethrow("relu_backward " + y.shape().str(), e);
  }
}

// ----------------------------------------------------------------- pooling

namespace {

dnnl::algorithm pool_alg(PoolKind kind) {
  return kind == PoolKind::kMax ? dnnl::algorithm::pooling_max
                                : dnnl::algorithm::pooling_avg_exclude_padding;
}

std::string pool_key(const PoolParams& p, const TensorDesc& x, const TensorDesc& y) {
  return std::to_string(static_cast<int>(p.kind)) + "k" + std::to_string(p.kh) + "x" +
         std::to_string(p.kw) + "s" + std::to_string(p.stride_h) + "x" +
         std::to_string(p.stride_w) + "p" + std::to_string(p.pad_h) + "x" +
         std::to_string(p.pad_w) + shape_key(x) + shape_key(y);
}

// Right/bottom padding that makes oneDNN's output size equal floor-mode's.
memory::dims pool_pad_r(const PoolParams& p, const Shape& x, const Shape& y) {
  return {(y.h - 1) * p.stride_h + p.kh - x.h - p.pad_h,
          (y.w - 1) * p.stride_w + p.kw - x.w - p.pad_w};
}

}  // namespace

// The forward primitive descriptor of a pooling; backward uses it as hint.
static dnnl::pooling_forward::primitive_desc make_pool_fwd(const dnnl::engine& engine,
                                                           const PoolParams& p,
                                                           const TensorDesc& x,
                                                           const TensorDesc& y) {
  dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training, pool_alg(p.kind), md_of(x),
                                md_of(y), {p.stride_h, p.stride_w}, {p.kh, p.kw},
                                {p.pad_h, p.pad_w}, pool_pad_r(p, x.shape, y.shape));
  return dnnl::pooling_forward::primitive_desc(d, user_scratchpad_attr(), engine);
}

size_t CpuBackend::pooling_state_bytes(const PoolParams& p, const TensorDesc& x,
                                       const TensorDesc& y) {
  try {
    const auto& pd = cached<dnnl::pooling_forward::primitive_desc>(
        "pool_f" + pool_key(p, x, y), [&] { return make_pool_fwd(engine_, p, x, y); });
    return pd.workspace_desc().get_size();
  } catch (const dnnl::error& e) {
    rethrow("pooling " + x.shape.str() + " -> " + y.shape.str(), e);
  }
}

void CpuBackend::pooling_forward(const PoolParams& p, const Tensor& x, const Tensor& y,
                                 void* state) {
  try {
    const auto& pd = cached<dnnl::pooling_forward::primitive_desc>(
        "pool_f" + pool_key(p, x.desc, y.desc),
        [&] { return make_pool_fwd(engine_, p, x.desc, y.desc); });
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
        {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
        {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), scratch(pd.scratchpad_desc().get_size()))}};
    if (pd.workspace_desc().get_size() > 0) {
      if (!state) throw BackendError("pooling_forward: max pooling needs its state buffer");
      args[DNNL_ARG_WORKSPACE] = mem(pd.workspace_desc(), state);
    }
    execute(dnnl::pooling_forward(pd), std::move(args));
  } catch (const dnnl::error& e) {
    rethrow("pooling_forward " + x.shape().str(), e);
  }
}

void CpuBackend::pooling_backward(const PoolParams& p, const Tensor& x, const Tensor& y,
                                  const Tensor& dy, const Tensor& dx, const void* state) {
  try {
    const auto& fwd = cached<dnnl::pooling_forward::primitive_desc>(
        "pool_f" + pool_key(p, x.desc, y.desc),
        [&] { return make_pool_fwd(engine_, p, x.desc, y.desc); });
    const auto& pd = cached<dnnl::pooling_backward::primitive_desc>(
        "pool_b" + pool_key(p, dx.desc, dy.desc), [&] {
          dnnl::pooling_backward::desc d(pool_alg(p.kind), md_of(dx.desc), md_of(dy.desc),
                                         {p.stride_h, p.stride_w}, {p.kh, p.kw},
                                         {p.pad_h, p.pad_w}, pool_pad_r(p, x.shape(), y.shape()));
          return dnnl::pooling_backward::primitive_desc(d, user_scratchpad_attr(), engine_, fwd);
        });
    std::unordered_map<int, memory> args{
        {DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), dy.data)},
        {DNNL_ARG_DIFF_SRC, mem(pd.diff_src_desc(), dx.data)},
        {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), scratch(pd.scratchpad_desc().get_size()))}};
    if (fwd.workspace_desc().get_size() > 0) {
      if (!state) throw BackendError("pooling_backward: max pooling needs its state buffer");
      args[DNNL_ARG_WORKSPACE] = mem(fwd.workspace_desc(), state);
    }
    execute(dnnl::pooling_backward(pd), std::move(args));
  } catch (const dnnl::error& e) {
    rethrow("pooling_backward " + x.shape().str(), e);
  }
}

// ----------------------------------------------------------- inner product

namespace {

memory::desc ip_dst_md(int64_t n, int64_t out) {
  return {{n, out}, memory::data_type::f32, Tag::nc};
}

void check_fc_output(const Tensor& y) {
  if (y.desc.layout != Layout::kPlain || y.shape().h != 1 || y.shape().w != 1) {
    throw BackendError("inner product: the output must be plain {n, out, 1, 1}, got " +
                       y.shape().str() + " " + layout_name(y.desc.layout));
  }
}

}  // namespace

static dnnl::inner_product_forward::primitive_desc make_ip_fwd(const dnnl::engine& engine,
                                                               const TensorDesc& x, int64_t out,
                                                               bool bias) {
  const Shape w{out, x.shape.c, x.shape.h, x.shape.w};
  dnnl::inner_product_forward::desc d(dnnl::prop_kind::forward_training, md_of(x), any_md(w),
                                      bias ? vector_md(out) : memory::desc(),
                                      ip_dst_md(x.shape.n, out));
  return dnnl::inner_product_forward::primitive_desc(d, user_scratchpad_attr(), engine);
}

void CpuBackend::inner_product_forward(const Tensor& x, const float* w, const float* bias,
                                       const Tensor& y) {
  check_fc_output(y);
  const int64_t out = y.shape().c;
  const Shape w_shape{out, x.shape().c, x.shape().h, x.shape().w};
  try {
    const auto& pd = cached<dnnl::inner_product_forward::primitive_desc>(
        "ip_f" + shape_key(x.desc) + std::to_string(out) + (bias ? "b" : ""),
        [&] { return make_ip_fwd(engine_, x.desc, out, bias != nullptr); });
    const memory::desc user_w = plain_md(w_shape);
    const size_t pad_bytes = align_up(pd.scratchpad_desc().get_size());
    const bool reorder_w = pd.weights_desc() != user_w;
    char* buf = scratch(pad_bytes + (reorder_w ? pd.weights_desc().get_size() : 0));
    const void* weights = w;
    if (reorder_w) {
      reorder(user_w, w, pd.weights_desc(), buf + pad_bytes);
      weights = buf + pad_bytes;
    }
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
        {DNNL_ARG_WEIGHTS, mem(pd.weights_desc(), weights)},
        {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
        {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), buf)}};
    if (bias) args[DNNL_ARG_BIAS] = mem(vector_md(out), bias);
    execute(dnnl::inner_product_forward(pd), std::move(args));
  } catch (const dnnl::error& e) {
    rethrow("inner_product_forward " + x.shape().str() + " -> " + std::to_string(out), e);
  }
}

void CpuBackend::inner_product_backward_data(const Tensor& dy, const float* w, const Tensor& dx) {
  check_fc_output(dy);
  const int64_t out = dy.shape().c;
  const Shape w_shape{out, dx.shape().c, dx.shape().h, dx.shape().w};
  try {
    const auto& pd = cached<dnnl::inner_product_backward_data::primitive_desc>(
        "ip_bd" + shape_key(dx.desc) + std::to_string(out), [&] {
          auto hint = make_ip_fwd(engine_, dx.desc, out, true);
          dnnl::inner_product_backward_data::desc d(md_of(dx.desc), any_md(w_shape),
                                                    ip_dst_md(dx.shape().n, out));
          return dnnl::inner_product_backward_data::primitive_desc(d, user_scratchpad_attr(),
                                                                   engine_, hint);
        });
    const memory::desc user_w = plain_md(w_shape);
    const size_t pad_bytes = align_up(pd.scratchpad_desc().get_size());
    const bool reorder_w = pd.weights_desc() != user_w;
    char* buf = scratch(pad_bytes + (reorder_w ? pd.weights_desc().get_size() : 0));
    const void* weights = w;
    if (reorder_w) {
      reorder(user_w, w, pd.weights_desc(), buf + pad_bytes);
      weights = buf + pad_bytes;
    }
    execute(dnnl::inner_product_backward_data(pd),
            {{DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), dy.data)},
             {DNNL_ARG_WEIGHTS, mem(pd.weights_desc(), weights)},
             {DNNL_ARG_DIFF_SRC, mem(pd.diff_src_desc(), dx.data)},
             {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), buf)}});
  } catch (const dnnl::error& e) {
    rethrow("inner_product_backward_data " + dx.shape().str(), e);
  }
}

void CpuBackend::inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw,
                                                float* dbias, float beta) {
  check_fc_output(dy);
  check_beta("inner_product_backward_weights", beta);
  const int64_t out = dy.shape().c;
  const Shape w_shape{out, x.shape().c, x.shape().h, x.shape().w};
  try {
    const auto& pd = cached<dnnl::inner_product_backward_weights::primitive_desc>(
        "ip_bw" + shape_key(x.desc) + std::to_string(out) + (dbias ? "b" : ""), [&] {
          auto hint = make_ip_fwd(engine_, x.desc, out, dbias != nullptr);
          dnnl::inner_product_backward_weights::desc d(
              md_of(x.desc), any_md(w_shape), dbias ? vector_md(out) : memory::desc(),
              ip_dst_md(x.shape().n, out));
          return dnnl::inner_product_backward_weights::primitive_desc(d, user_scratchpad_attr(),
                                                                      engine_, hint);
        });
    const memory::desc user_w = plain_md(w_shape);
    const bool stage_w = beta != 0.0f || pd.diff_weights_desc() != user_w;
    const bool stage_b = dbias && beta != 0.0f;
    const size_t pad_bytes = align_up(pd.scratchpad_desc().get_size());
    const size_t w_bytes = stage_w ? align_up(pd.diff_weights_desc().get_size()) : 0;
    char* buf = scratch(pad_bytes + w_bytes + (stage_b ? out * sizeof(float) : 0));
    void* dw_target = stage_w ? static_cast<void*>(buf + pad_bytes) : dw;
    void* db_target = stage_b ? static_cast<void*>(buf + pad_bytes + w_bytes) : dbias;
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
        {DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), dy.data)},
        {DNNL_ARG_DIFF_WEIGHTS, mem(pd.diff_weights_desc(), dw_target)},
        {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), buf)}};
    if (dbias) args[DNNL_ARG_DIFF_BIAS] = mem(vector_md(out), db_target);
    execute(dnnl::inner_product_backward_weights(pd), std::move(args));
    if (stage_w) reorder(pd.diff_weights_desc(), dw_target, user_w, dw, beta != 0.0f);
    if (stage_b) {
      const float* tmp = static_cast<const float*>(db_target);
      for (int64_t i = 0; i < out; ++i) dbias[i] += tmp[i];
    }
  } catch (const dnnl::error& e) {
    rethrow("inner_product_backward_weights " + x.shape().str(), e);
  }
}

// -------------------------------------------------------------- batch norm

static dnnl::batch_normalization_forward::primitive_desc make_bn_fwd(const dnnl::engine& engine,
                                                                     const TensorDesc& x,
                                                                     float eps, bool training) {
  auto flags = dnnl::normalization_flags::use_scale_shift;
  if (!training) flags = flags | dnnl::normalization_flags::use_global_stats;
  dnnl::batch_normalization_forward::desc d(
      training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, md_of(x),
      eps, flags);
  return dnnl::batch_normalization_forward::primitive_desc(d, user_scratchpad_attr(), engine);
}

void CpuBackend::batch_norm_forward_training(const Tensor& x, const Tensor& y,
                                             const float* scale_shift, float* save_mean,
                                             float* save_var, float* running_mean,
                                             float* running_var, float momentum, float eps) {
  if (!(x.desc == y.desc)) throw BackendError("batch_norm_forward_training: x and y differ");
  const int64_t c = x.shape().c;
  try {
    const auto& pd = cached<dnnl::batch_normalization_forward::primitive_desc>(
        "bn_ft" + shape_key(x.desc) + std::to_string(eps),
        [&] { return make_bn_fwd(engine_, x.desc, eps, true); });
    execute(dnnl::batch_normalization_forward(pd),
            {{DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
             {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
             {DNNL_ARG_SCALE_SHIFT, mem(pd.weights_desc(), scale_shift)},
             {DNNL_ARG_MEAN, mem(pd.mean_desc(), save_mean)},
             {DNNL_ARG_VARIANCE, mem(pd.variance_desc(), save_var)},
             {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), scratch(pd.scratchpad_desc().get_size()))}});
  } catch (const dnnl::error& e) {
    rethrow("batch_norm_forward_training " + x.shape().str(), e);
  }
  // Running statistics track the unbiased variance, as PyTorch and cuDNN do.
  const int64_t m = x.shape().n * x.shape().h * x.shape().w;
  const float unbias = m > 1 ? static_cast<float>(m) / static_cast<float>(m - 1) : 1.0f;
  for (int64_t i = 0; i < c; ++i) {
    running_mean[i] = (1.0f - momentum) * running_mean[i] + momentum * save_mean[i];
    running_var[i] = (1.0f - momentum) * running_var[i] + momentum * save_var[i] * unbias;
  }
}

void CpuBackend::batch_norm_forward_inference(const Tensor& x, const Tensor& y,
                                              const float* scale_shift, const float* running_mean,
                                              const float* running_var, float eps) {
  if (!(x.desc == y.desc)) throw BackendError("batch_norm_forward_inference: x and y differ");
  try {
    const auto& pd = cached<dnnl::batch_normalization_forward::primitive_desc>(
        "bn_fi" + shape_key(x.desc) + std::to_string(eps),
        [&] { return make_bn_fwd(engine_, x.desc, eps, false); });
    execute(dnnl::batch_normalization_forward(pd),
            {{DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
             {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
             {DNNL_ARG_SCALE_SHIFT, mem(pd.weights_desc(), scale_shift)},
             {DNNL_ARG_MEAN, mem(pd.mean_desc(), running_mean)},
             {DNNL_ARG_VARIANCE, mem(pd.variance_desc(), running_var)},
             {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), scratch(pd.scratchpad_desc().get_size()))}});
  } catch (const dnnl::error& e) {
    rethrow("batch_norm_forward_inference " + x.shape().str(), e);
  }
}

void CpuBackend::batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                     const float* save_mean, const float* save_var,
                                     const Tensor& dx, float* dscale_shift, float beta,
                                     float eps) {
  check_beta("batch_norm_backward", beta);
  const int64_t c = x.shape().c;
  try {
    const auto& pd = cached<dnnl::batch_normalization_backward::primitive_desc>(
        "bn_b" + shape_key(x.desc) + shape_key(dy.desc) + std::to_string(eps), [&] {
          auto hint = make_bn_fwd(engine_, x.desc, eps, true);
          dnnl::batch_normalization_backward::desc d(dnnl::prop_kind::backward, md_of(dy.desc),
                                                     md_of(x.desc), eps,
                                                     dnnl::normalization_flags::use_scale_shift);
          return dnnl::batch_normalization_backward::primitive_desc(d, user_scratchpad_attr(),
                                                                    engine_, hint);
        });
    const size_t pad_bytes = align_up(pd.scratchpad_desc().get_size());
    char* buf = scratch(pad_bytes + (beta != 0.0f ? 2 * c * sizeof(float) : 0));
    float* target = beta != 0.0f ? reinterpret_cast<float*>(buf + pad_bytes) : dscale_shift;
    execute(dnnl::batch_normalization_backward(pd),
            {{DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
             {DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), dy.data)},
             {DNNL_ARG_SCALE_SHIFT, mem(pd.weights_desc(), scale_shift)},
             {DNNL_ARG_MEAN, mem(pd.mean_desc(), save_mean)},
             {DNNL_ARG_VARIANCE, mem(pd.variance_desc(), save_var)},
             {DNNL_ARG_DIFF_SRC, mem(pd.diff_src_desc(), dx.data)},
             {DNNL_ARG_DIFF_SCALE_SHIFT, mem(pd.diff_weights_desc(), target)},
             {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), buf)}});
    if (beta != 0.0f) {
      for (int64_t i = 0; i < 2 * c; ++i) dscale_shift[i] += target[i];
    }
  } catch (const dnnl::error& e) {
    rethrow("batch_norm_backward " + x.shape().str(), e);
  }
}

// ------------------------------------------------------- add, concat, loss

void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  if (!(a.shape() == b.shape()) || !(a.shape() == y.shape())) {
    throw BackendError("add: shapes differ: " + a.shape().str() + ", " + b.shape().str() + " -> " +
                       y.shape().str());
  }
  // oneDNN's sum works in place only on its first source: put y there.
  if (y.data == b.data && y.data != a.data) {
    add(b, a, y);
    return;
  }
  try {
    const auto& pd = cached<dnnl::sum::primitive_desc>(
        "sum" + shape_key(a.desc) + shape_key(b.desc) + shape_key(y.desc), [&] {
          return dnnl::sum::primitive_desc(md_of(y.desc), {1.0f, 1.0f},
                                           {md_of(a.desc), md_of(b.desc)}, engine_,
                                           user_scratchpad_attr());
        });
    execute(dnnl::sum(pd),
            {{DNNL_ARG_MULTIPLE_SRC, mem(md_of(a.desc), a.data)},
             {DNNL_ARG_MULTIPLE_SRC + 1, mem(md_of(b.desc), b.data)},
             {DNNL_ARG_DST, mem(md_of(y.desc), y.data)},
             {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), scratch(pd.scratchpad_desc().get_size()))}});
  } catch (const dnnl::error& e) {
    rethrow("add " + a.shape().str(), e);
  }
}

void CpuBackend::accumulate(const Tensor& x, const Tensor& y, float beta) {
  check_beta("accumulate", beta);
  if (beta == 0.0f) {
    convert(x, y);
    return;
  }
  add(y, x, y);
}

void CpuBackend::concat_forward(std::span<const Tensor> xs, const Tensor& y) {
  int64_t channels = 0;
  for (const Tensor& x : xs) {
    if (x.shape().n != y.shape().n || x.shape().h != y.shape().h || x.shape().w != y.shape().w) {
      throw BackendError("concat: input " + x.shape().str() + " does not fit output " +
                         y.shape().str());
    }
    channels += x.shape().c;
  }
  if (channels != y.shape().c) {
    throw BackendError("concat: inputs have " + std::to_string(channels) +
                       " channels, output " + std::to_string(y.shape().c));
  }
  // Each input is reordered into its channel slice of a plain view; for a
  // blocked output whose slices are not block-aligned, through a plain copy.
  const bool direct = y.desc.layout == Layout::kPlain;
  Shape ys = y.shape();
  float* plain = direct ? y.data : reinterpret_cast<float*>(scratch(plain_md(ys).get_size()));
  const memory::desc whole = plain_md(ys);
  int64_t offset = 0;
  for (const Tensor& x : xs) {
    const memory::desc part =
        whole.submemory_desc({ys.n, x.shape().c, ys.h, ys.w}, {0, offset, 0, 0});
    reorder(md_of(x.desc), x.data, part, plain);
    offset += x.shape().c;
  }
  if (!direct) reorder(whole, plain, md_of(y.desc), y.data);
}

void CpuBackend::concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx,
                                 float beta) {
  check_beta("concat_backward", beta);
  const Shape ys = dy.shape();
  const Shape xs = dx.shape();
  if (xs.n != ys.n || xs.h != ys.h || xs.w != ys.w || channel_offset < 0 ||
      channel_offset + xs.c > ys.c) {
    throw BackendError("concat_backward: slice " + xs.str() + " at channel " +
                       std::to_string(channel_offset) + " does not fit " + ys.str());
  }
  const memory::dims part_dims{ys.n, xs.c, ys.h, ys.w};
  const memory::dims part_offset{0, channel_offset, 0, 0};
  // A blocked gradient can be sliced in place when the slice is block-aligned
  // (GoogLeNet's channel counts are); otherwise go through a plain copy.
  const int64_t block = channel_block(dy.desc.layout);
  if (channel_offset % block == 0 && xs.c % block == 0) {
    reorder(md_of(dy.desc).submemory_desc(part_dims, part_offset), dy.data, md_of(dx.desc),
            dx.data, beta != 0.0f);
    return;
  }
  const memory::desc whole = plain_md(ys);
  float* plain = reinterpret_cast<float*>(scratch(whole.get_size()));
  reorder(md_of(dy.desc), dy.data, whole, plain);
  reorder(whole.submemory_desc(part_dims, part_offset), plain, md_of(dx.desc), dx.data,
          beta != 0.0f);
}

LossStats CpuBackend::softmax_cross_entropy(const Tensor& logits, const int32_t* labels,
                                            float scale, const Tensor* dlogits) {
  if (logits.desc.layout != Layout::kPlain || (dlogits && dlogits->desc.layout != Layout::kPlain)) {
    throw BackendError("softmax_cross_entropy: logits must be plain {n, classes, 1, 1}");
  }
  const int64_t n = logits.shape().n;
  const int64_t k = logits.shape().per_sample();
  double loss = 0.0;
  int64_t correct = 0;
  float* d = dlogits ? dlogits->data : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits.data + i * k;
    const int32_t label = labels[i];
    if (label < 0 || label >= k) {
      throw BackendError("softmax_cross_entropy: label " + std::to_string(label) +
                         " outside [0, " + std::to_string(k) + ")");
    }
    int64_t best = 0;
    for (int64_t j = 1; j < k; ++j) best = z[j] > z[best] ? j : best;
    correct += best == label;
    const double zmax = z[best];
    double denom = 0.0;
    for (int64_t j = 0; j < k; ++j) denom += std::exp(static_cast<double>(z[j]) - zmax);
    const double log_denom = std::log(denom);
    loss += log_denom - (static_cast<double>(z[label]) - zmax);
    if (d) {
      for (int64_t j = 0; j < k; ++j) {
        const double p = std::exp(static_cast<double>(z[j]) - zmax - log_denom);
        d[i * k + j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * scale);
      }
    }
  }
  return {loss, correct};
}

void CpuBackend::sgd_update(float* w, const float* g, float* velocity, int64_t count,
                            const SgdStep& step) {
  const float lr = step.lr, mu = step.momentum, wd = step.weight_decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float v = mu * velocity[i] + g[i] + wd * w[i];
    velocity[i] = v;
    w[i] -= lr * v;
  }
}

void CpuBackend::scale(float* x, int64_t count, float alpha) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) x[i] *= alpha;
}

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace vtrain::worker::cpu
