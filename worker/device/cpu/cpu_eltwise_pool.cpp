// CPU backend: relu and the other activations, pooling, add / accumulate and concat.
#include "worker/device/cpu/cpu_backend_impl.h"

#include <algorithm>

namespace vtrain::worker::cpu {

// ----------------------------------------------------------------- eltwise

const dnnl::eltwise_forward::primitive_desc& CpuBackend::relu_fwd_pd(const TensorDesc& x) {
  return cached<dnnl::eltwise_forward::primitive_desc>("relu_f" + shape_key(x), [&] {
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training,
                                  dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md_of(x), 0.0f,
                                  0.0f);
    return dnnl::eltwise_forward::primitive_desc(d, user_scratchpad_attr(), engine_);
  });
}

const dnnl::eltwise_backward::primitive_desc& CpuBackend::relu_bwd_pd(const TensorDesc& y) {
  return cached<dnnl::eltwise_backward::primitive_desc>("relu_b" + shape_key(y), [&] {
    const memory::desc md = md_of(y);
    dnnl::eltwise_forward::desc fd(dnnl::prop_kind::forward_training,
                                   dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md, 0.0f, 0.0f);
    dnnl::eltwise_forward::primitive_desc hint(fd, engine_);
    dnnl::eltwise_backward::desc d(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md, md, 0.0f,
                                   0.0f);
    return dnnl::eltwise_backward::primitive_desc(d, user_scratchpad_attr(), engine_, hint);
  });
}

namespace {

// oneDNN's eltwise algorithm and its alpha, beta for an activation other
// than relu. Backward reads x (src) for all of them.
struct Eltwise {
  dnnl::algorithm algorithm;
  float alpha = 0.0f, beta = 0.0f;
};

Eltwise eltwise_of(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kSilu: return {dnnl::algorithm::eltwise_swish, 1.0f};  // x * sigmoid(1 x)
    case ActivationKind::kGelu: return {dnnl::algorithm::eltwise_gelu_erf};
    case ActivationKind::kSigmoid: return {dnnl::algorithm::eltwise_logistic};
    // clip_v2's derivative is 1 strictly inside (alpha, beta), as PyTorch's hardtanh.
    case ActivationKind::kRelu6: return {dnnl::algorithm::eltwise_clip_v2, 0.0f, 6.0f};
    case ActivationKind::kRelu: break;
  }
  throw BackendError(std::string("cpu backend: ") + activation_name(kind) +
                     " runs as relu_forward, not as an eltwise of its own");
}

}  // namespace

const dnnl::eltwise_forward::primitive_desc& CpuBackend::activation_fwd_pd(ActivationKind kind,
                                                                           const TensorDesc& x) {
  const Eltwise e = eltwise_of(kind);
  return cached<dnnl::eltwise_forward::primitive_desc>(
      std::string(activation_name(kind)) + "_f" + shape_key(x), [&] {
        dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training, e.algorithm, md_of(x),
                                      e.alpha, e.beta);
        return dnnl::eltwise_forward::primitive_desc(d, user_scratchpad_attr(), engine_);
      });
}

const dnnl::eltwise_backward::primitive_desc& CpuBackend::activation_bwd_pd(ActivationKind kind,
                                                                            const TensorDesc& x) {
  const Eltwise e = eltwise_of(kind);
  return cached<dnnl::eltwise_backward::primitive_desc>(
      std::string(activation_name(kind)) + "_b" + shape_key(x), [&] {
        const memory::desc md = md_of(x);
        dnnl::eltwise_backward::desc d(e.algorithm, md, md, e.alpha, e.beta);
        return dnnl::eltwise_backward::primitive_desc(d, user_scratchpad_attr(), engine_,
                                                      activation_fwd_pd(kind, x));
      });
}

size_t CpuBackend::activation_scratch_bytes(ActivationKind kind, const TensorDesc& x) {
  try {
    return std::max(activation_fwd_pd(kind, x).scratchpad_desc().get_size(),
                    activation_bwd_pd(kind, x).scratchpad_desc().get_size());
  } catch (const dnnl::error& e) {
    rethrow(std::string(activation_name(kind)) + " " + x.shape.str(), e);
  }
}

void CpuBackend::activation_forward(ActivationKind kind, const Tensor& x, const Tensor& y) {
  const std::string what = std::string(activation_name(kind)) + "_forward";
  check_same_desc(what.c_str(), {{"x", x.desc}, {"y", y.desc}});
  try {
    const auto& pd = activation_fwd_pd(kind, x.desc);
    execute(dnnl::eltwise_forward(pd),
            {{DNNL_ARG_SRC, mem(pd.src_desc(), x.data)}, {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
             {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
  } catch (const dnnl::error& e) {
    rethrow(what + " " + x.shape().str(), e);
  }
}

void CpuBackend::activation_backward(ActivationKind kind, const Tensor& x, const Tensor& dy,
                                     const Tensor& dx) {
  const std::string what = std::string(activation_name(kind)) + "_backward";
  check_same_desc(what.c_str(), {{"x", x.desc}, {"dy", dy.desc}, {"dx", dx.desc}});
  try {
    eltwise_backward(activation_bwd_pd(kind, x.desc), DNNL_ARG_SRC, x.data, dy, dx);
  } catch (const dnnl::error& e) {
    rethrow(what + " " + x.shape().str(), e);
  }
}

// The bias as a {1, C, 1, 1} tensor of x's type, added per channel; relu
// as a post-op.
const dnnl::binary::primitive_desc& CpuBackend::bias_relu_pd(const TensorDesc& x) {
  return cached<dnnl::binary::primitive_desc>("bias_relu" + shape_key(x), [&] {
    const memory::desc md = md_of(x);
    dnnl::binary::desc d(dnnl::algorithm::binary_add, md, plain_md({1, x.shape.c, 1, 1}, x.dtype),
                         md);
    dnnl::primitive_attr attr = user_scratchpad_attr();
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
    return dnnl::binary::primitive_desc(d, attr, engine_);
  });
}

// Per-channel sums of dx into f32 {1, C, 1, 1}, where there is something to
// add up (oneDNN refuses a reduction over nothing: n, h and w all 1).
namespace {
bool sums_over_channels(const TensorDesc& x) { return x.shape.n * x.shape.h * x.shape.w > 1; }
}  // namespace

const dnnl::reduction::primitive_desc& CpuBackend::channel_sum_pd(const TensorDesc& x) {
  return cached<dnnl::reduction::primitive_desc>("channel_sum" + shape_key(x), [&] {
    dnnl::reduction::desc d(dnnl::algorithm::reduction_sum, md_of(x),
                            plain_md({1, x.shape.c, 1, 1}), 0.0f, 0.0f);
    return dnnl::reduction::primitive_desc(d, user_scratchpad_attr(), engine_);
  });
}

void CpuBackend::eltwise_backward(const dnnl::eltwise_backward::primitive_desc& pd,
                                  int saved_arg, const void* saved, const Tensor& dy,
                                  const Tensor& dx) {
  execute(dnnl::eltwise_backward(pd),
          {{saved_arg, mem(pd.src_desc(), saved)},
           {DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), dy.data)},
           {DNNL_ARG_DIFF_SRC, mem(pd.diff_src_desc(), dx.data)},
           {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
}

size_t CpuBackend::relu_scratch_bytes(const TensorDesc& x) {
  size_t bytes = 0;
  try {
    bytes = std::max(relu_fwd_pd(x).scratchpad_desc().get_size(),
                     relu_bwd_pd(x).scratchpad_desc().get_size());
  } catch (const dnnl::error& e) {
    rethrow("relu " + x.shape.str(), e);
  }
  // The bias-paired calls only where oneDNN offers them (off by default
  // here): a refusal is the paired call's to report, not every relu's.
  try {
    bytes = std::max({bytes, bias_relu_pd(x).scratchpad_desc().get_size(),
                      sums_over_channels(x) ? channel_sum_pd(x).scratchpad_desc().get_size()
                                            : size_t{0}});
  } catch (const dnnl::error&) {
  }
  return bytes;
}

void CpuBackend::relu_forward(const Tensor& x, const Tensor& y) {
  check_same_desc("relu_forward", {{"x", x.desc}, {"y", y.desc}});
  try {
    const auto& pd = relu_fwd_pd(x.desc);
    execute(dnnl::eltwise_forward(pd),
            {{DNNL_ARG_SRC, mem(pd.src_desc(), x.data)}, {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
             {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
  } catch (const dnnl::error& e) {
    rethrow("relu_forward " + x.shape().str(), e);
  }
}

void CpuBackend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  check_same_desc("relu_backward", {{"y", y.desc}, {"dy", dy.desc}, {"dx", dx.desc}});
  try {
    eltwise_backward(relu_bwd_pd(y.desc), DNNL_ARG_DST, y.data, dy, dx);
  } catch (const dnnl::error& e) {
    rethrow("relu_backward " + y.shape().str(), e);
  }
}

void CpuBackend::bias_relu_forward(const Tensor& x, const void* bias, const Tensor& y) {
  check_same_desc("bias_relu_forward", {{"x", x.desc}, {"y", y.desc}});
  try {
    const auto& pd = bias_relu_pd(x.desc);
    execute(dnnl::binary(pd), {{DNNL_ARG_SRC_0, mem(pd.src_desc(0), x.data)},
                               {DNNL_ARG_SRC_1, mem(pd.src_desc(1), bias)},
                               {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
                               {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
  } catch (const dnnl::error& e) {
    rethrow("bias_relu_forward " + x.shape().str(), e);
  }
}

// Two primitives: oneDNN has no fused one, and on the CPU a convolution's
// bias is free in its kernel (prefers() is false).
void CpuBackend::relu_backward_bias(const Tensor& y, const Tensor& dy, const Tensor& dx,
                                    float* dbias) {
  relu_backward(y, dy, dx);
  if (!sums_over_channels(dx.desc)) {  // one value per channel: dbias is dx in f32
    reorder(md_of(dx.desc), dx.data, plain_md({1, dx.shape().c, 1, 1}), dbias, false);
    return;
  }
  try {
    const auto& pd = channel_sum_pd(dx.desc);
    execute(dnnl::reduction(pd), {{DNNL_ARG_SRC, mem(pd.src_desc(), dx.data)},
                                  {DNNL_ARG_DST, mem(pd.dst_desc(), dbias)},
                                  {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
  } catch (const dnnl::error& e) {
    rethrow("relu_backward_bias " + y.shape().str(), e);
  }
}

// ----------------------------------------------------------------- pooling

namespace {

dnnl::algorithm pool_alg(PoolKind kind) {
  return kind == PoolKind::kMax ? dnnl::algorithm::pooling_max
                                : dnnl::algorithm::pooling_avg_exclude_padding;
}

std::string pool_key(const PoolDesc& p, const TensorDesc& x, const TensorDesc& y) {
  return std::to_string(static_cast<int>(p.kind)) + "k" + std::to_string(p.window.kernel_h) + "x" +
         std::to_string(p.window.kernel_w) + "s" + std::to_string(p.window.stride_h) + "x" +
         std::to_string(p.window.stride_w) + "p" + std::to_string(p.window.pad_h) + "x" +
         std::to_string(p.window.pad_w) + shape_key(x) + shape_key(y);
}

// Right/bottom padding that makes oneDNN's output size equal floor-mode's.
memory::dims pool_pad_r(const PoolDesc& p, const Shape& x, const Shape& y) {
  return {(y.h - 1) * p.window.stride_h + p.window.kernel_h - x.h - p.window.pad_h,
          (y.w - 1) * p.window.stride_w + p.window.kernel_w - x.w - p.window.pad_w};
}

}  // namespace

// The forward primitive descriptor of a pooling; backward uses it as hint.
static dnnl::pooling_forward::primitive_desc make_pool_fwd(const dnnl::engine& engine,
                                                           const PoolDesc& p,
                                                           const TensorDesc& x,
                                                           const TensorDesc& y) {
  dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training, pool_alg(p.kind), md_of(x),
                                md_of(y), {p.window.stride_h, p.window.stride_w}, {p.window.kernel_h, p.window.kernel_w},
                                {p.window.pad_h, p.window.pad_w}, pool_pad_r(p, x.shape, y.shape));
  return dnnl::pooling_forward::primitive_desc(d, user_scratchpad_attr(), engine);
}

const dnnl::pooling_forward::primitive_desc& CpuBackend::pool_fwd_pd(const PoolDesc& p,
                                                                      const TensorDesc& x,
                                                                      const TensorDesc& y) {
  return cached<dnnl::pooling_forward::primitive_desc>(
      "pool_f" + pool_key(p, x, y), [&] { return make_pool_fwd(engine_, p, x, y); });
}

const dnnl::pooling_backward::primitive_desc& CpuBackend::pool_bwd_pd(const PoolDesc& p,
                                                                       const TensorDesc& x,
                                                                       const TensorDesc& y,
                                                                       const TensorDesc& dx,
                                                                       const TensorDesc& dy) {
  const auto& fwd = pool_fwd_pd(p, x, y);
  return cached<dnnl::pooling_backward::primitive_desc>("pool_b" + pool_key(p, dx, dy), [&] {
    dnnl::pooling_backward::desc d(pool_alg(p.kind), md_of(dx), md_of(dy),
                                   {p.window.stride_h, p.window.stride_w}, {p.window.kernel_h, p.window.kernel_w}, {p.window.pad_h, p.window.pad_w},
                                   pool_pad_r(p, x.shape, y.shape));
    return dnnl::pooling_backward::primitive_desc(d, user_scratchpad_attr(), engine_, fwd);
  });
}

size_t CpuBackend::pooling_state_bytes(const PoolDesc& p, const TensorDesc& x,
                                       const TensorDesc& y) {
  try {
    return pool_fwd_pd(p, x, y).workspace_desc().get_size();
  } catch (const dnnl::error& e) {
    rethrow("pooling " + x.shape.str() + " -> " + y.shape.str(), e);
  }
}

size_t CpuBackend::pooling_scratch_bytes(const PoolDesc& p, const TensorDesc& x,
                                         const TensorDesc& y) {
  try {
    return std::max(pool_fwd_pd(p, x, y).scratchpad_desc().get_size(),
                    pool_bwd_pd(p, x, y, x, y).scratchpad_desc().get_size());
  } catch (const dnnl::error& e) {
    rethrow("pooling " + x.shape.str() + " -> " + y.shape.str(), e);
  }
}

void CpuBackend::pooling_forward(const PoolDesc& p, const Tensor& x, const Tensor& y,
                                 void* state) {
  check_same_dtype("pooling_forward", {x.desc, y.desc});
  try {
    const auto& pd = pool_fwd_pd(p, x.desc, y.desc);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
                                         {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
                                         {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}};
    if (pd.workspace_desc().get_size() > 0) {
      if (!state) throw BackendError("pooling_forward: max pooling needs its state buffer");
      args[DNNL_ARG_WORKSPACE] = mem(pd.workspace_desc(), state);
    }
    execute(dnnl::pooling_forward(pd), std::move(args));
  } catch (const dnnl::error& e) {
    rethrow("pooling_forward " + x.shape().str(), e);
  }
}

void CpuBackend::pooling_backward(const PoolDesc& p, const Tensor& x, const Tensor& y,
                                  const Tensor& dy, const Tensor& dx, const void* state) {
  check_same_dtype("pooling_backward", {x.desc, y.desc, dy.desc, dx.desc});
  try {
    const auto& fwd = pool_fwd_pd(p, x.desc, y.desc);
    const auto& pd = pool_bwd_pd(p, x.desc, y.desc, dx.desc, dy.desc);
    std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), dy.data)},
                                         {DNNL_ARG_DIFF_SRC, mem(pd.diff_src_desc(), dx.data)},
                                         {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}};
    if (fwd.workspace_desc().get_size() > 0) {
      if (!state) throw BackendError("pooling_backward: max pooling needs its state buffer");
      args[DNNL_ARG_WORKSPACE] = mem(fwd.workspace_desc(), state);
    }
    execute(dnnl::pooling_backward(pd), std::move(args));
  } catch (const dnnl::error& e) {
    rethrow("pooling_backward " + x.shape().str(), e);
  }
}


// ------------------------------------------------------- add, concat, loss

const dnnl::sum::primitive_desc& CpuBackend::sum_pd(const TensorDesc& a, const TensorDesc& b,
                                                    const TensorDesc& y) {
  return cached<dnnl::sum::primitive_desc>("sum" + shape_key(a) + shape_key(b) + shape_key(y), [&] {
    return dnnl::sum::primitive_desc(md_of(y), {1.0f, 1.0f}, {md_of(a), md_of(b)}, engine_,
                                     user_scratchpad_attr());
  });
}

size_t CpuBackend::add_scratch_bytes(const TensorDesc& a, const TensorDesc& b,
                                     const TensorDesc& y) {
  try {
    // add() swaps its sources when y aliases b: either order may run.
    return std::max(sum_pd(a, b, y).scratchpad_desc().get_size(),
                    sum_pd(b, a, y).scratchpad_desc().get_size());
  } catch (const dnnl::error& e) {
    rethrow("add " + a.shape.str(), e);
  }
}

void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  if (!(a.shape() == b.shape()) || !(a.shape() == y.shape())) {
    throw BackendError("add: shapes differ: " + a.shape().str() + ", " + b.shape().str() + " -> " +
                       y.shape().str());
  }
  check_same_dtype("add", {a.desc, b.desc, y.desc});
  // oneDNN's sum works in place only on its first source: put y there.
  if (y.data == b.data && y.data != a.data) {
    add(b, a, y);
    return;
  }
  try {
    const auto& pd = sum_pd(a.desc, b.desc, y.desc);
    execute(dnnl::sum(pd),
            {{DNNL_ARG_MULTIPLE_SRC, mem(md_of(a.desc), a.data)},
             {DNNL_ARG_MULTIPLE_SRC + 1, mem(md_of(b.desc), b.data)},
             {DNNL_ARG_DST, mem(md_of(y.desc), y.data)},
             {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
  } catch (const dnnl::error& e) {
    rethrow("add " + a.shape().str(), e);
  }
}

void CpuBackend::accumulate(const Tensor& x, const Tensor& y, float beta) {
  check_beta("accumulate", beta);
  check_same_dtype("accumulate", {x.desc, y.desc});  // beta 0 would convert silently
  if (beta == 0.0f) {
    convert(x, y);
    return;
  }
  add(y, x, y);
}

// Plain and NHWC tensors take a channel slice as a strided view; a blocked
// one only where the slice is block-aligned (GoogLeNet's channel counts are).
static bool concat_slice_in_place(const TensorDesc& y, int64_t channel_offset, int64_t channels) {
  if (y.layout == Layout::kPlain || y.layout == Layout::kNhwc) return true;
  const int64_t block = channel_block(y);
  return channel_offset % block == 0 && channels % block == 0;
}

// A blocked output is assembled in a plain copy; plain and NHWC ones in place.
static bool concat_forward_direct(const TensorDesc& y) {
  return y.layout == Layout::kPlain || y.layout == Layout::kNhwc;
}

size_t CpuBackend::concat_scratch_bytes(std::span<const TensorDesc> xs, const TensorDesc& y) {
  const size_t plain_copy = plain_md(y.shape, y.dtype).get_size();
  size_t bytes = concat_forward_direct(y) ? 0 : plain_copy;
  int64_t offset = 0;
  for (const TensorDesc& x : xs) {
    if (!concat_slice_in_place(y, offset, x.shape.c)) bytes = plain_copy;
    offset += x.shape.c;
  }
  return bytes;
}

void CpuBackend::concat_forward(std::span<const Tensor> xs, const Tensor& y) {
  int64_t channels = 0;
  for (const Tensor& x : xs) {
    check_same_dtype("concat_forward", {x.desc, y.desc});
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
  // Each input is reordered into its channel slice of y, or of a plain copy
  // of a blocked y.
  const bool direct = concat_forward_direct(y.desc);
  Shape ys = y.shape();
  void* plain = direct ? y.data : scratch(plain_md(ys, y.desc.dtype).get_size());
  const memory::desc whole = direct ? md_of(y.desc) : plain_md(ys, y.desc.dtype);
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
  check_concat_slice(ys, channel_offset, xs);
  check_same_dtype("concat_backward", {dy.desc, dx.desc});
  const memory::dims part_dims{ys.n, xs.c, ys.h, ys.w};
  const memory::dims part_offset{0, channel_offset, 0, 0};
  if (concat_slice_in_place(dy.desc, channel_offset, xs.c)) {
    reorder(md_of(dy.desc).submemory_desc(part_dims, part_offset), dy.data, md_of(dx.desc),
            dx.data, beta != 0.0f);
    return;
  }
  const memory::desc whole = plain_md(ys, dy.desc.dtype);
  char* plain = scratch(whole.get_size());
  reorder(md_of(dy.desc), dy.data, whole, plain);
  reorder(whole.submemory_desc(part_dims, part_offset), plain, md_of(dx.desc), dx.data,
          beta != 0.0f);
}


}  // namespace vtrain::worker::cpu
