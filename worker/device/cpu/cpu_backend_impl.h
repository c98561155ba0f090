// Internal to the CPU backend (worker/device/cpu/*.cpp): the CpuBackend
// class and the oneDNN helpers its op files share. Each op family lives in
// its own file: cpu_backend.cpp (memory, streams, transfers), cpu_conv.cpp,
// cpu_eltwise_pool.cpp (relu, pooling, add, concat), cpu_mul.cpp (mul,
// mul_sum), cpu_inner_product.cpp (inner product, loss, SGD),
// cpu_batch_norm.cpp, cpu_dropout.cpp.
//
// Every primitive runs with a user-provided scratchpad, so all memory it
// touches is device memory that this backend counts: convolutions use the
// caller's workspace, other ops a backend-owned scratch buffer. Primitives are
// created once per (op, shapes, layouts) and cached.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "dnnl.hpp"
#include "common/half.h"
#include "common/host_stream.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/device/cpu/im2col_gemm.h"
#include "worker/device/op_table.h"

namespace vtrain::worker::cpu {

using dnnl::memory;
using Tag = dnnl::memory::format_tag;

constexpr size_t kAlign = 64;

inline size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

inline memory::data_type dnnl_type(DataType type) {
  switch (type) {
    case DataType::kF32: return memory::data_type::f32;
    case DataType::kBF16: return memory::data_type::bf16;
    case DataType::kF16: return memory::data_type::f16;
  }
  throw BackendError("unknown data type");
}

inline memory::desc md_of(const TensorDesc& d) {
  const memory::dims dims{d.shape.n, d.shape.c, d.shape.h, d.shape.w};
  const memory::data_type type = dnnl_type(d.dtype);
  // An NHWC tensor of one pixel (an inner product's input) or one channel
  // is NCHW byte for byte, and oneDNN's primitive cache takes its
  // descriptor for NCHW's (strides of size-1 dimensions do not count): a
  // primitive made for an NCHW tensor would be handed out for it, weights
  // expected in another format. So it is described as NCHW. (Blocked
  // descriptors carry their blocking and are never taken for NCHW.)
  if (d.layout == Layout::kNhwc && (d.shape.h * d.shape.w == 1 || d.shape.c == 1)) {
    return {dims, type, Tag::nchw};
  }
  switch (d.layout) {
    case Layout::kPlain: return {dims, type, Tag::nchw};
    case Layout::kBlocked8: return {dims, type, Tag::nChw8c};
    case Layout::kBlocked16: return {dims, type, Tag::nChw16c};
    case Layout::kNhwc: return {dims, type, Tag::nhwc};
  }
  throw BackendError("unknown layout");
}

inline memory::desc plain_md(const Shape& s, DataType type = DataType::kF32) {
  return md_of({s, Layout::kPlain, type});
}
inline memory::desc vector_md(int64_t n, DataType type = DataType::kF32) {
  return {{n}, dnnl_type(type), Tag::x};
}
// Rows = channels: the "CNHW" order the im2col GEMMs produce and consume.
inline memory::desc cnhw_md(const Shape& s) {
  return {{s.n, s.c, s.h, s.w}, memory::data_type::f32, Tag::bacd};
}
inline memory::desc any_md(const Shape& s, DataType type = DataType::kF32) {
  return {{s.n, s.c, s.h, s.w}, dnnl_type(type), Tag::any};
}

// Element access for the backend's own loops (fill, synchronised batch
// norm), in float whatever the storage type.
inline float load(const float* p) { return *p; }
inline float load(const common::Bf16* p) { return common::to_float(*p); }
inline float load(const common::F16* p) { return common::to_float(*p); }
inline void store(float* p, float v) { *p = v; }
inline void store(common::Bf16* p, float v) { *p = common::to_bf16(v); }
inline void store(common::F16* p, float v) { *p = common::to_f16(v); }

// f(T{}) with T the element type of `type` (float, common::Bf16 or F16).
template <class F>
decltype(auto) with_element_type(DataType type, F&& f) {
  switch (type) {
    case DataType::kBF16: return f(common::Bf16{});
    case DataType::kF16: return f(common::F16{});
    case DataType::kF32: break;
  }
  return f(0.0f);
}

inline dnnl::primitive_attr user_scratchpad_attr(bool sum_post_op = false) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (sum_post_op) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  return attr;
}

inline std::string shape_key(const TensorDesc& d) {
  return d.shape.str() + layout_name(d.layout) + dtype_name(d.dtype);
}

[[noreturn]] inline void rethrow(const std::string& what, const dnnl::error& e) {
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
inline size_t reserve(size_t& cursor, const memory::desc& md) {
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
  Stage in_bias;         // fwd: the bias (converted where the primitive computes in another type)
  Stage out;             // dst, diff_src or diff_weights
  Stage out_bias;        // diff_bias (bwd-filter with accumulate)
  // im2col path
  bool im2col = false;
  Im2colGeometry geometry{};
  size_t cols_offset = 0;
  size_t workspace = 0;
};


// check_beta, check_same_dtype and check_same_desc (backend.h) for this backend.
inline void check_beta(const char* op, float beta) { worker::check_beta("cpu backend", op, beta); }
inline void check_same_dtype(const char* op, std::initializer_list<TensorDesc> tensors) {
  worker::check_same_dtype("cpu backend", op, tensors);
}
inline void check_same_desc(const char* op,
                            std::initializer_list<std::pair<const char*, TensorDesc>> tensors) {
  worker::check_same_desc("cpu backend", op, tensors);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  ~CpuBackend() override;

  DeviceInfo device_info() const override { return info_; }
  std::optional<std::string> precision_unavailable(common::Precision precision) const override;

  void* allocate_device(size_t bytes) override;
  void free_device(void* ptr) override;
  size_t allocation_bytes(size_t bytes) const override {
    return align_up(std::max<size_t>(bytes, 1));
  }
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
  void free_pinned(void* ptr) override;
  Layout preferred_layout(int64_t channels) const override;

  Event record_event(StreamKind stream) override;
  void wait_event(StreamKind stream, const Event& event) override;
  void synchronize(const Event& event) override;
  void synchronize(StreamKind stream) override;
  void begin_compute_span() override { span_start_ = std::chrono::steady_clock::now(); }
  double end_compute_span_ms() override;
  void copy_async(void* dst, const void* src, size_t bytes, StreamKind stream) override;

  void upload(const float* host, const Tensor& dst) override;
  void download(const Tensor& src, float* host) override;
  void convert(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;
  void upload_labels(const int32_t* host, int32_t* device, int64_t count) override {
    std::memcpy(device, host, static_cast<size_t>(count) * sizeof(int32_t));
  }

  // The op surface (backend.h): descriptors to the kernels below (op_table.h).
  std::optional<std::string> supports(const OpDesc& op) const override {
    return dtype_unsupported(*this, op);
  }
  // oneDNN's convolution adds its bias for free: no fused form saves work.
  bool prefers(const OpDesc&) const override { return false; }
  OpBytes scratch_bytes(const OpDesc& op) override { return op_bytes(*this, op); }
  void run(const OpDesc& op, const OpArgs& args) override;
  std::vector<ConvAlgoInfo> conv_algorithms(const ConvDesc& op) override;
  std::string conv_algorithm_name(ConvKind kind, ConvAlgo algo) const override;

  // The kernels, one per descriptor kind (op_table.h names them).
  size_t conv_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                        bool accumulate) {
    return conv_plan(kind, algo, p, accumulate, /*has_bias=*/true).workspace;
  }
  void conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const void* w,
                    const void* bias, const Tensor& y, float beta, void* workspace,
                    size_t workspace_bytes);
  void conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy, const void* w,
                          const Tensor& dx, float beta, void* workspace,
                          size_t workspace_bytes);
  void conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                            const Tensor& dy, float* dw, float* dbias, float beta,
                            void* workspace, size_t workspace_bytes);

  void relu_forward(const Tensor& x, const Tensor& y);
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);
  void bias_relu_forward(const Tensor& x, const void* bias, const Tensor& y);
  void relu_backward_bias(const Tensor& y, const Tensor& dy, const Tensor& dx,
                          float* dbias);
  size_t pooling_state_bytes(const PoolDesc& p, const TensorDesc& x,
                             const TensorDesc& y);
  void pooling_forward(const PoolDesc& p, const Tensor& x, const Tensor& y,
                       void* state);
  void pooling_backward(const PoolDesc& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& dx, const void* state);
  void inner_product_forward(const Tensor& x, const void* w, const void* bias,
                             const Tensor& y);
  void inner_product_backward_data(const Tensor& dy, const void* w, const Tensor& dx);
  void inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw,
                                      float* dbias, float beta);
  void batch_norm_forward_training(const Tensor& x, const Tensor& y, const float* scale_shift,
                                   float* save_mean, float* save_var, float* running_mean,
                                   float* running_var, float momentum, float eps);
  void batch_norm_forward_inference(const Tensor& x, const Tensor& y, const float* scale_shift,
                                    const float* running_mean, const float* running_var,
                                    float eps);
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                           const float* save_mean, const float* save_var, const Tensor& dx,
                           float* dscale_shift, float beta, float eps);
  std::vector<double> batch_norm_sums(const Tensor& x);
  std::vector<double> batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                               const float* mean, const float* var,
                                               float eps);
  void batch_norm_backward_data(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                const float* mean, const float* var, const float* dy_means,
                                const Tensor& dx, float eps);
  void add(const Tensor& a, const Tensor& b, const Tensor& y);
  void accumulate(const Tensor& x, const Tensor& y, float beta);
  // kMul and kMulSum (cpu_mul.cpp).
  void mul(const Tensor& a, const Tensor& b, const Tensor& y, float beta);
  void mul_sum(const Tensor& a, const Tensor& b, const Tensor& y, float beta);
  size_t mul_scratch_bytes(BinaryKind kind, const TensorDesc& a, const TensorDesc& b,
                           const TensorDesc& y);
  void concat_forward(std::span<const Tensor> xs, const Tensor& y);
  void concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx,
                       float beta);
  LossStats softmax_cross_entropy(const Tensor& logits, const int32_t* labels, float scale,
                                  const Tensor* dlogits, float label_smoothing = 0.0f);
  void sgd_update(float* w, const float* g, float* velocity, int64_t count,
                  const SgdStep& step);
  void adamw_update(float* w, const float* g, float* m, float* v, int64_t count,
                    const AdamWStep& step);
  void moving_average(float* average, const float* x, int64_t count, float decay);
  std::vector<double> sum_squares(const float* x, std::span<const int64_t> offsets);
  void scale(float* x, int64_t count, float alpha);
  bool all_finite(const float* x, int64_t count);
  // cpu_dropout.cpp: forward x -> y or backward dy -> dx (op_table.h).
  void dropout(const DropoutDesc& d, const Tensor& in, const Tensor& out);

  size_t relu_scratch_bytes(const TensorDesc& x);
  // silu, gelu, sigmoid, relu6: oneDNN's eltwise algorithms, backward from x.
  void activation_forward(ActivationKind kind, const Tensor& x, const Tensor& y);
  void activation_backward(ActivationKind kind, const Tensor& x, const Tensor& dy,
                           const Tensor& dx);
  size_t activation_scratch_bytes(ActivationKind kind, const TensorDesc& x);
  size_t pooling_scratch_bytes(const PoolDesc& p, const TensorDesc& x,
                               const TensorDesc& y);
  size_t inner_product_scratch_bytes(const TensorDesc& x, int64_t out, bool bias);
  size_t batch_norm_scratch_bytes(const TensorDesc& x, float eps);
  size_t add_scratch_bytes(const TensorDesc& a, const TensorDesc& b,
                           const TensorDesc& y);
  size_t concat_scratch_bytes(std::span<const TensorDesc> xs, const TensorDesc& y);
  size_t softmax_scratch_bytes(const TensorDesc& logits);
  size_t sum_squares_scratch_bytes(size_t) { return 0; }
  void reserve_scratch(size_t bytes) override { scratch(bytes); }
  size_t scratch_reserved() const override { return scratch_bytes_; }

 private:
  // Cached primitive descriptors, shared by each op and its scratch query.
  const dnnl::eltwise_forward::primitive_desc& relu_fwd_pd(const TensorDesc& x);
  const dnnl::eltwise_backward::primitive_desc& relu_bwd_pd(const TensorDesc& y);
  // dx = dy * f'(saved): saved is x (DNNL_ARG_SRC) or, for the *_use_dst
  // algorithms, y (DNNL_ARG_DST).
  void eltwise_backward(const dnnl::eltwise_backward::primitive_desc& pd, int saved_arg,
                        const void* saved, const Tensor& dy, const Tensor& dx);
  const dnnl::eltwise_forward::primitive_desc& activation_fwd_pd(ActivationKind kind,
                                                                 const TensorDesc& x);
  const dnnl::eltwise_backward::primitive_desc& activation_bwd_pd(ActivationKind kind,
                                                                  const TensorDesc& x);
  const dnnl::binary::primitive_desc& bias_relu_pd(const TensorDesc& x);
  const dnnl::reduction::primitive_desc& channel_sum_pd(const TensorDesc& x);
  const dnnl::pooling_forward::primitive_desc& pool_fwd_pd(const PoolDesc& p,
                                                           const TensorDesc& x,
                                                           const TensorDesc& y);
  const dnnl::pooling_backward::primitive_desc& pool_bwd_pd(const PoolDesc& p,
                                                            const TensorDesc& x,
                                                            const TensorDesc& y,
                                                            const TensorDesc& dx,
                                                            const TensorDesc& dy);
  const dnnl::inner_product_forward::primitive_desc& ip_fwd_pd(const TensorDesc& x, int64_t out,
                                                               bool bias);
  const dnnl::inner_product_backward_data::primitive_desc& ip_bwd_data_pd(const TensorDesc& dx,
                                                                          int64_t out);
  const dnnl::inner_product_backward_weights::primitive_desc& ip_bwd_weights_pd(
      const TensorDesc& x, int64_t out, bool bias);
  const void* ip_weights(const memory::desc& pad_md, const memory::desc& prim_w,
                         const TensorDesc& x, int64_t out, const void* w, char** buf);
  const dnnl::batch_normalization_forward::primitive_desc& bn_fwd_pd(const TensorDesc& x,
                                                                     float eps, bool training);
  const dnnl::batch_normalization_backward::primitive_desc& bn_bwd_pd(const TensorDesc& x,
                                                                      const TensorDesc& dy,
                                                                      float eps);
  const dnnl::sum::primitive_desc& sum_pd(const TensorDesc& a, const TensorDesc& b,
                                          const TensorDesc& y);
  const dnnl::binary::primitive_desc& mul_pd(const TensorDesc& a, const TensorDesc& b,
                                             const TensorDesc& y, bool accumulate);

  const ConvPlan& conv_plan(ConvKind kind, ConvAlgo algo, const ConvProblem& p, bool accumulate,
                            bool has_bias);
  ConvPlan build_dnnl_conv(ConvKind kind, ConvAlgo algo, const ConvProblem& p, bool accumulate,
                           bool has_bias);
  ConvPlan build_im2col_conv(ConvKind kind, const ConvProblem& p, bool accumulate, bool has_bias);
  // Runs a oneDNN convolution plan: in0/in1/out as in ConvPlan's stages;
  // bias is the forward bias, dbias the backward-filter bias gradient.
  void run_dnnl_conv(ConvKind kind, const ConvPlan& plan, char* ws, const void* in0,
                     const void* in1, void* out, const void* bias, float* dbias);
  void run_im2col(ConvKind kind, const ConvPlan& plan, const ConvProblem& p, const Tensor* x,
                  const void* w, const void* bias, const Tensor* dy, const Tensor* out,
                  float* dw, float* dbias, float beta, char* ws);
  void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
             const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

  // Reorder between two descriptions of the same data; `sum` adds into dst.
  void reorder(const memory::desc& src_md, const void* src, const memory::desc& dst_md, void* dst,
               bool sum = false);
  // Scratch memory for non-convolution ops, grown on demand and counted as
  // device memory. Valid until the next call that asks for scratch.
  char* scratch(size_t bytes);
  // The scratch as a primitive's scratchpad argument.
  memory scratchpad(const memory::desc& md) { return mem(md, scratch(md.get_size())); }
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
  LayoutRule layout_rule_;  // native_block: the channel block of the CPU's ISA (16, 8 or 1)
  int threads_before_;      // OpenMP's thread count before this backend set its own
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  common::HostStream memory_stream_;
  // The compute span's start; unset outside a span.
  std::optional<std::chrono::steady_clock::time_point> span_start_;

  mutable std::mutex alloc_mutex_;
  std::unordered_map<void*, size_t> allocations_;
  size_t in_use_ = 0;
  size_t peak_ = 0;

  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;

  std::unordered_map<std::string, ConvPlan> conv_plans_;
  std::unordered_map<std::string, std::shared_ptr<void>> primitive_cache_;
};

template <typename Pd>
const Pd& CpuBackend::cached(const std::string& key, const std::function<Pd()>& make) {
  auto it = primitive_cache_.find(key);
  if (it == primitive_cache_.end()) {
    it = primitive_cache_.emplace(key, std::make_shared<Pd>(make())).first;
  }
  return *static_cast<const Pd*>(it->second.get());
}

}  // namespace vtrain::worker::cpu
