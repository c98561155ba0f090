// CPU backend: inner product, softmax cross-entropy, SGD, scale and the finiteness check.
#include "worker/device/cpu/cpu_backend_impl.h"

#include <algorithm>
#include <cmath>

namespace vtrain::worker::cpu {

// ----------------------------------------------------------- inner product

namespace {

memory::desc ip_dst_md(int64_t n, int64_t out, DataType type) {
  return {{n, out}, dnnl_type(type), Tag::nc};
}

void check_fc_output(const Tensor& y) {
  if (y.desc.layout != Layout::kPlain || y.shape().h != 1 || y.shape().w != 1) {
    throw BackendError("inner product: the output must be plain {n, out, 1, 1}, got " +
                       y.shape().str() + " " + layout_name(y.desc.layout));
  }
}

Shape ip_weight_shape(const TensorDesc& x, int64_t out) {
  return {out, x.shape.c, x.shape.h, x.shape.w};
}

// Where an inner product's scratch holds what: the primitive's scratchpad
// first, then the weights (or their gradient) in the primitive's format
// when staged, then the bias gradient when it must be accumulated.
struct IpScratch {
  bool staged = false;
  bool staged_bias = false;
  size_t staged_offset = 0;
  size_t bias_offset = 0;
  size_t total = 0;
};

IpScratch ip_weights_scratch(const memory::desc& pad_md, const memory::desc& prim_w,
                             const memory::desc& user_w) {
  IpScratch s;
  s.staged_offset = align_up(pad_md.get_size());
  s.staged = prim_w != user_w;
  s.total = s.staged_offset + (s.staged ? prim_w.get_size() : 0);
  return s;
}

IpScratch ip_gradient_scratch(const dnnl::inner_product_backward_weights::primitive_desc& pd,
                              const memory::desc& user_w, int64_t out, bool bias, float beta) {
  IpScratch s;
  s.staged_offset = align_up(pd.scratchpad_desc().get_size());
  s.staged = beta != 0.0f || pd.diff_weights_desc() != user_w;
  s.staged_bias = bias && beta != 0.0f;
  s.bias_offset = s.staged_offset + (s.staged ? align_up(pd.diff_weights_desc().get_size()) : 0);
  s.total = s.bias_offset + (s.staged_bias ? static_cast<size_t>(out) * sizeof(float) : 0);
  return s;
}

// The weights (and their gradient) in the input's layout, where oneDNN has
// an implementation for it, else in the format it prefers. Its GEMM-based
// inner products read matching layouts as two matrices, so the plain user
// weights need no staging beside a plain input and only a blocking copy
// beside a blocked one; the format oneDNN prefers is a transposed blocking
// that costs more to stage than the product itself at small batches
// (vgg-small at batch 16 on one core: its fc layers took 11.7 ms a training
// step, 6.2 in the input's layout; figures in bench/results/2026-11-27-cpu-xeon.md).
template <class Make>
auto with_weights_like_input(const TensorDesc& x, const Shape& w_shape, DataType w_type,
                             const Make& make) {
  try {
    return make(md_of({w_shape, x.layout, w_type}));
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    return make(any_md(w_shape, w_type));
  }
}

}  // namespace

static dnnl::inner_product_forward::primitive_desc make_ip_fwd(const dnnl::engine& engine,
                                                               const TensorDesc& x, int64_t out,
                                                               bool bias) {
  return with_weights_like_input(x, ip_weight_shape(x, out), x.dtype,
                                 [&](const memory::desc& w) {
    dnnl::inner_product_forward::desc d(dnnl::prop_kind::forward_training, md_of(x), w,
                                        bias ? vector_md(out, x.dtype) : memory::desc(),
                                        ip_dst_md(x.shape.n, out, x.dtype));
    return dnnl::inner_product_forward::primitive_desc(d, user_scratchpad_attr(), engine);
  });
}

const dnnl::inner_product_forward::primitive_desc& CpuBackend::ip_fwd_pd(const TensorDesc& x,
                                                                          int64_t out, bool bias) {
  return cached<dnnl::inner_product_forward::primitive_desc>(
      "ip_f" + shape_key(x) + std::to_string(out) + (bias ? "b" : ""),
      [&] { return make_ip_fwd(engine_, x, out, bias); });
}

const dnnl::inner_product_backward_data::primitive_desc& CpuBackend::ip_bwd_data_pd(
    const TensorDesc& dx, int64_t out) {
  return cached<dnnl::inner_product_backward_data::primitive_desc>(
      "ip_bd" + shape_key(dx) + std::to_string(out), [&] {
        auto hint = make_ip_fwd(engine_, dx, out, true);
        return with_weights_like_input(dx, ip_weight_shape(dx, out), dx.dtype,
                                       [&](const memory::desc& w) {
          dnnl::inner_product_backward_data::desc d(md_of(dx), w,
                                                    ip_dst_md(dx.shape.n, out, dx.dtype));
          return dnnl::inner_product_backward_data::primitive_desc(d, user_scratchpad_attr(),
                                                                   engine_, hint);
        });
      });
}

const dnnl::inner_product_backward_weights::primitive_desc& CpuBackend::ip_bwd_weights_pd(
    const TensorDesc& x, int64_t out, bool bias) {
  return cached<dnnl::inner_product_backward_weights::primitive_desc>(
      "ip_bw" + shape_key(x) + std::to_string(out) + (bias ? "b" : ""), [&] {
        auto hint = make_ip_fwd(engine_, x, out, bias);
        return with_weights_like_input(x, ip_weight_shape(x, out), DataType::kF32,
                                       [&](const memory::desc& dw) {
          dnnl::inner_product_backward_weights::desc d(
              md_of(x), dw, bias ? vector_md(out) : memory::desc(),
              ip_dst_md(x.shape.n, out, x.dtype));
          return dnnl::inner_product_backward_weights::primitive_desc(d, user_scratchpad_attr(),
                                                                      engine_, hint);
        });
      });
}

size_t CpuBackend::inner_product_scratch_bytes(const TensorDesc& x, int64_t out, bool bias) {
  try {
    const memory::desc user_w = plain_md(ip_weight_shape(x, out), x.dtype);
    const memory::desc user_dw = plain_md(ip_weight_shape(x, out));
    const auto& fwd = ip_fwd_pd(x, out, bias);
    const auto& bwd_data = ip_bwd_data_pd(x, out);
    const auto& bwd_weights = ip_bwd_weights_pd(x, out, bias);
    return std::max({ip_weights_scratch(fwd.scratchpad_desc(), fwd.weights_desc(), user_w).total,
                     ip_weights_scratch(bwd_data.scratchpad_desc(), bwd_data.weights_desc(),
                                        user_w).total,
                     ip_gradient_scratch(bwd_weights, user_dw, out, bias, 0.0f).total,
                     ip_gradient_scratch(bwd_weights, user_dw, out, bias, 1.0f).total});
  } catch (const dnnl::error& e) {
    rethrow("inner product " + x.shape.str() + " -> " + std::to_string(out), e);
  }
}

// Forward and backward data: the weights in the primitive's format if it
// differs from the plain user format.
const void* CpuBackend::ip_weights(const memory::desc& pad_md, const memory::desc& prim_w,
                                   const TensorDesc& x, int64_t out, const void* w, char** buf) {
  const memory::desc user_w = plain_md(ip_weight_shape(x, out), x.dtype);
  const IpScratch layout = ip_weights_scratch(pad_md, prim_w, user_w);
  *buf = scratch(layout.total);
  if (!layout.staged) return w;
  reorder(user_w, w, prim_w, *buf + layout.staged_offset);
  return *buf + layout.staged_offset;
}

void CpuBackend::inner_product_forward(const Tensor& x, const void* w, const void* bias,
                                       const Tensor& y) {
  check_fc_output(y);
  check_same_dtype("inner_product_forward", {x.desc, y.desc});
  const int64_t out = y.shape().c;
  try {
    const auto& pd = ip_fwd_pd(x.desc, out, bias != nullptr);
    char* buf = nullptr;
    const void* weights = ip_weights(pd.scratchpad_desc(), pd.weights_desc(), x.desc, out, w, &buf);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
        {DNNL_ARG_WEIGHTS, mem(pd.weights_desc(), weights)},
        {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
        {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), buf)}};
    if (bias) args[DNNL_ARG_BIAS] = mem(vector_md(out, x.desc.dtype), bias);
    execute(dnnl::inner_product_forward(pd), std::move(args));
  } catch (const dnnl::error& e) {
    rethrow("inner_product_forward " + x.shape().str() + " -> " + std::to_string(out), e);
  }
}

void CpuBackend::inner_product_backward_data(const Tensor& dy, const void* w, const Tensor& dx) {
  check_fc_output(dy);
  check_same_dtype("inner_product_backward_data", {dy.desc, dx.desc});
  const int64_t out = dy.shape().c;
  try {
    const auto& pd = ip_bwd_data_pd(dx.desc, out);
    char* buf = nullptr;
    const void* weights =
        ip_weights(pd.scratchpad_desc(), pd.weights_desc(), dx.desc, out, w, &buf);
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
  check_same_dtype("inner_product_backward_weights", {x.desc, dy.desc});
  const int64_t out = dy.shape().c;
  try {
    const auto& pd = ip_bwd_weights_pd(x.desc, out, dbias != nullptr);
    const memory::desc user_w = plain_md(ip_weight_shape(x.desc, out));
    const IpScratch layout = ip_gradient_scratch(pd, user_w, out, dbias != nullptr, beta);
    char* buf = scratch(layout.total);
    void* dw_target = layout.staged ? static_cast<void*>(buf + layout.staged_offset) : dw;
    void* db_target = layout.staged_bias ? static_cast<void*>(buf + layout.bias_offset) : dbias;
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
        {DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), dy.data)},
        {DNNL_ARG_DIFF_WEIGHTS, mem(pd.diff_weights_desc(), dw_target)},
        {DNNL_ARG_SCRATCHPAD, mem(pd.scratchpad_desc(), buf)}};
    if (dbias) args[DNNL_ARG_DIFF_BIAS] = mem(vector_md(out), db_target);
    execute(dnnl::inner_product_backward_weights(pd), std::move(args));
    if (layout.staged) reorder(pd.diff_weights_desc(), dw_target, user_w, dw, beta != 0.0f);
    if (layout.staged_bias) {
      const float* tmp = static_cast<const float*>(db_target);
      for (int64_t i = 0; i < out; ++i) dbias[i] += tmp[i];
    }
  } catch (const dnnl::error& e) {
    rethrow("inner_product_backward_weights " + x.shape().str(), e);
  }
}


namespace {

// Half logits, and logits in another layout than plain (a global pool's
// {n, classes, 1, 1} keeps its input's blocked or NHWC layout), are read,
// and their gradient written, through plain f32 copies.
bool softmax_staged(const TensorDesc& logits) {
  return logits.dtype != DataType::kF32 || logits.layout != Layout::kPlain;
}

}  // namespace

size_t CpuBackend::softmax_scratch_bytes(const TensorDesc& logits) {
  if (!softmax_staged(logits)) return 0;
  return 2 * align_up(static_cast<size_t>(logits.shape.elements()) * sizeof(float));
}

LossStats CpuBackend::softmax_cross_entropy(const Tensor& logits, const int32_t* labels,
                                            float scale, const Tensor* dlogits,
                                            float label_smoothing) {
  if (dlogits) {
    check_same_dtype("softmax_cross_entropy", {logits.desc, dlogits->desc});
    if (dlogits->desc.layout != logits.desc.layout) {
      throw BackendError("softmax_cross_entropy: dlogits in another layout than the logits");
    }
  }
  const int64_t n = logits.shape().n;
  const int64_t k = logits.shape().per_sample();
  const bool staged = softmax_staged(logits.desc);
  const memory::desc f32_md = plain_md(logits.shape());
  char* buf = staged ? scratch(softmax_scratch_bytes(logits.desc)) : nullptr;
  const float* z_all = static_cast<const float*>(logits.data);
  float* d = dlogits ? static_cast<float*>(dlogits->data) : nullptr;
  if (staged) {
    reorder(md_of(logits.desc), logits.data, f32_md, buf);
    z_all = reinterpret_cast<const float*>(buf);
    if (d) d = reinterpret_cast<float*>(buf + align_up(f32_md.get_size()));
  }
  double loss = 0.0;
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = z_all + i * k;
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
    // The target: 1 - s on the label, s / k spread over every class.
    const double spread = static_cast<double>(label_smoothing) / static_cast<double>(k);
    const double on_label = 1.0 - static_cast<double>(label_smoothing);
    loss += on_label * (log_denom - (static_cast<double>(z[label]) - zmax));
    if (label_smoothing != 0.0f) {
      double logits_sum = 0.0;
      for (int64_t j = 0; j < k; ++j) logits_sum += static_cast<double>(z[j]) - zmax;
      loss += spread * (static_cast<double>(k) * log_denom - logits_sum);
    }
    if (d) {
      for (int64_t j = 0; j < k; ++j) {
        const double p = std::exp(static_cast<double>(z[j]) - zmax - log_denom);
        const double q = (j == label ? on_label : 0.0) + spread;
        d[i * k + j] = static_cast<float>((p - q) * scale);
      }
    }
  }
  if (staged && d) reorder(f32_md, d, md_of(dlogits->desc), dlogits->data);
  return {loss, correct};
}

void CpuBackend::sgd_update(float* w, const float* g, float* velocity, int64_t count,
                            const SgdStep& step) {
  const float lr = step.lr, mu = step.momentum, wd = step.weight_decay, gs = step.grad_scale;
  if (step.nesterov) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      const float d = g[i] * gs + wd * w[i];
      const float v = mu * velocity[i] + d;
      velocity[i] = v;
      w[i] -= lr * (d + mu * v);
    }
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float v = mu * velocity[i] + g[i] * gs + wd * w[i];
    velocity[i] = v;
    w[i] -= lr * v;
  }
}

void CpuBackend::adamw_update(float* w, const float* g, float* m, float* v, int64_t count,
                              const AdamWStep& step) {
  const AdamWFactors f = adamw_factors(step);
  const float b1 = step.beta1, b2 = step.beta2, eps = step.eps, gs = step.grad_scale;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float d = g[i] * gs;
    const float mi = b1 * m[i] + (1.0f - b1) * d;
    const float vi = b2 * v[i] + (1.0f - b2) * d * d;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * f.decay - f.step_size * (mi / (std::sqrt(vi) / f.sqrt_correction2 + eps));
  }
}

void CpuBackend::moving_average(float* average, const float* x, int64_t count, float decay) {
  const float rate = 1.0f - decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) average[i] += rate * (x[i] - average[i]);
}

// Chunks of a fixed size summed each in order, then the chunks' sums in
// order: the threads only decide who sums a chunk, never the order.
std::vector<double> CpuBackend::sum_squares(const float* x, std::span<const int64_t> offsets) {
  constexpr int64_t kChunk = 4096;
  std::vector<double> sums(offsets.empty() ? 0 : offsets.size() - 1, 0.0);
  for (size_t s = 0; s < sums.size(); ++s) {
    const float* segment = x + offsets[s];
    const int64_t count = offsets[s + 1] - offsets[s];
    const int64_t chunks = (count + kChunk - 1) / kChunk;
    std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double sum = 0.0;
      for (int64_t i = c * kChunk; i < std::min(count, (c + 1) * kChunk); ++i) {
        sum += static_cast<double>(segment[i]) * segment[i];
      }
      partial[static_cast<size_t>(c)] = sum;
    }
    for (const double p : partial) sums[s] += p;
  }
  return sums;
}

void CpuBackend::scale(float* x, int64_t count, float alpha) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) x[i] *= alpha;
}

bool CpuBackend::all_finite(const float* x, int64_t count) {
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t i = 0; i < count; ++i) bad += std::isfinite(x[i]) ? 0 : 1;
  return bad == 0;
}


}  // namespace vtrain::worker::cpu
