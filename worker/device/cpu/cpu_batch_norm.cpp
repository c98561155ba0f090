// CPU backend: batch normalisation.
#include "worker/device/cpu/cpu_backend_impl.h"

#include <algorithm>
#include <cmath>

namespace vtrain::worker::cpu {

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

const dnnl::batch_normalization_forward::primitive_desc& CpuBackend::bn_fwd_pd(
    const TensorDesc& x, float eps, bool training) {
  return cached<dnnl::batch_normalization_forward::primitive_desc>(
      (training ? "bn_ft" : "bn_fi") + shape_key(x) + std::to_string(eps),
      [&] { return make_bn_fwd(engine_, x, eps, training); });
}

const dnnl::batch_normalization_backward::primitive_desc& CpuBackend::bn_bwd_pd(
    const TensorDesc& x, const TensorDesc& dy, float eps) {
  return cached<dnnl::batch_normalization_backward::primitive_desc>(
      "bn_b" + shape_key(x) + shape_key(dy) + std::to_string(eps), [&] {
        auto hint = make_bn_fwd(engine_, x, eps, true);
        dnnl::batch_normalization_backward::desc d(dnnl::prop_kind::backward, md_of(dy),
                                                   md_of(x), eps,
                                                   dnnl::normalization_flags::use_scale_shift);
        return dnnl::batch_normalization_backward::primitive_desc(d, user_scratchpad_attr(),
                                                                  engine_, hint);
      });
}

// Backward's scratchpad, then with beta = 1 d(scale_shift) before it is added.
static size_t bn_backward_scratch(const dnnl::batch_normalization_backward::primitive_desc& pd,
                                  int64_t channels, float beta) {
  return align_up(pd.scratchpad_desc().get_size()) +
         (beta != 0.0f ? 2 * static_cast<size_t>(channels) * sizeof(float) : 0);
}

size_t CpuBackend::batch_norm_scratch_bytes(const TensorDesc& x, float eps) {
  try {
    return std::max({bn_fwd_pd(x, eps, true).scratchpad_desc().get_size(),
                     bn_fwd_pd(x, eps, false).scratchpad_desc().get_size(),
                     bn_backward_scratch(bn_bwd_pd(x, x, eps), x.shape.c, 1.0f)});
  } catch (const dnnl::error& e) {
    rethrow("batch norm " + x.shape.str(), e);
  }
}

void CpuBackend::batch_norm_forward_training(const Tensor& x, const Tensor& y,
                                             const float* scale_shift, float* save_mean,
                                             float* save_var, float* running_mean,
                                             float* running_var, float momentum, float eps) {
  check_same_desc("batch_norm_forward_training", {{"x", x.desc}, {"y", y.desc}});
  const int64_t c = x.shape().c;
  try {
    const auto& pd = bn_fwd_pd(x.desc, eps, true);
    execute(dnnl::batch_normalization_forward(pd),
            {{DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
             {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
             {DNNL_ARG_SCALE_SHIFT, mem(pd.weights_desc(), scale_shift)},
             {DNNL_ARG_MEAN, mem(pd.mean_desc(), save_mean)},
             {DNNL_ARG_VARIANCE, mem(pd.variance_desc(), save_var)},
             {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
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
  check_same_desc("batch_norm_forward_inference", {{"x", x.desc}, {"y", y.desc}});
  try {
    const auto& pd = bn_fwd_pd(x.desc, eps, false);
    execute(dnnl::batch_normalization_forward(pd),
            {{DNNL_ARG_SRC, mem(pd.src_desc(), x.data)},
             {DNNL_ARG_DST, mem(pd.dst_desc(), y.data)},
             {DNNL_ARG_SCALE_SHIFT, mem(pd.weights_desc(), scale_shift)},
             {DNNL_ARG_MEAN, mem(pd.mean_desc(), running_mean)},
             {DNNL_ARG_VARIANCE, mem(pd.variance_desc(), running_var)},
             {DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc())}});
  } catch (const dnnl::error& e) {
    rethrow("batch_norm_forward_inference " + x.shape().str(), e);
  }
}

void CpuBackend::batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                     const float* save_mean, const float* save_var,
                                     const Tensor& dx, float* dscale_shift, float beta,
                                     float eps) {
  check_beta("batch_norm_backward", beta);
  check_same_dtype("batch_norm_backward", {x.desc, dy.desc, dx.desc});
  const int64_t c = x.shape().c;
  try {
    const auto& pd = bn_bwd_pd(x.desc, dy.desc, eps);
    const size_t pad_bytes = align_up(pd.scratchpad_desc().get_size());
    char* buf = scratch(bn_backward_scratch(pd, c, beta));
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

// ------------------------------------------------ synchronised batch norm
//
// Plain loops: oneDNN's batch normalisation gives neither the per-channel
// sums (its statistics are float means and variances of the local batch)
// nor a backward from global sums (with use_global_stats its dx treats the
// statistics as constants). Each channel is summed by one thread in a fixed
// order, so the sums do not depend on the thread count.

namespace {

// Where channel c of sample n starts in a tensor of `d`, and the stride
// between its h * w elements (the channel block: 1 when plain).
struct ChannelRun {
  int64_t block, padded, hw;
  explicit ChannelRun(const TensorDesc& d)
      : block(channel_block(d)),
        padded((d.shape.c + block - 1) / block * block),
        hw(d.shape.h * d.shape.w) {}
  int64_t start(int64_t n, int64_t c) const {
    return (n * padded + c / block * block) * hw + c % block;
  }
};

}  // namespace

std::vector<double> CpuBackend::batch_norm_sums(const Tensor& x) {
  const Shape& s = x.shape();
  const ChannelRun run(x.desc);
  std::vector<double> sums(2 * static_cast<size_t>(s.c), 0.0);
  with_element_type(x.desc.dtype, [&]<class T>(T) {
    const T* xs = static_cast<const T*>(x.data);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < s.c; ++c) {
      double sum = 0, squares = 0;
      for (int64_t n = 0; n < s.n; ++n) {
        const T* p = xs + run.start(n, c);
        for (int64_t k = 0; k < run.hw; ++k) {
          const double v = load(p + k * run.block);
          sum += v;
          squares += v * v;
        }
      }
      sums[c] = sum;
      sums[s.c + c] = squares;
    }
  });
  return sums;
}

std::vector<double> CpuBackend::batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                                         const float* mean, const float* var,
                                                         float eps) {
  check_same_desc("batch_norm_backward_sums", {{"x", x.desc}, {"dy", dy.desc}});
  const Shape& s = x.shape();
  const ChannelRun run(x.desc);
  std::vector<double> sums(2 * static_cast<size_t>(s.c), 0.0);
  with_element_type(x.desc.dtype, [&]<class T>(T) {
    const T* xs = static_cast<const T*>(x.data);
    const T* dys = static_cast<const T*>(dy.data);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < s.c; ++c) {
      const float inv_std = 1.0f / std::sqrt(var[c] + eps);
      double sum = 0, dot = 0;
      for (int64_t n = 0; n < s.n; ++n) {
        const int64_t at = run.start(n, c);
        for (int64_t k = 0; k < run.hw; ++k) {
          const int64_t i = at + k * run.block;
          const float g = load(dys + i);
          sum += g;
          dot += static_cast<double>(g) * ((load(xs + i) - mean[c]) * inv_std);
        }
      }
      sums[c] = sum;
      sums[s.c + c] = dot;
    }
  });
  return sums;
}

void CpuBackend::batch_norm_backward_data(const Tensor& x, const Tensor& dy,
                                          const float* scale_shift, const float* mean,
                                          const float* var, const float* dy_means,
                                          const Tensor& dx, float eps) {
  check_same_desc("batch_norm_backward_data", {{"x", x.desc}, {"dy", dy.desc}, {"dx", dx.desc}});
  const Shape& s = x.shape();
  const ChannelRun run(x.desc);
  with_element_type(x.desc.dtype, [&]<class T>(T) {
    const T* xs = static_cast<const T*>(x.data);
    const T* dys = static_cast<const T*>(dy.data);
    T* dxs = static_cast<T*>(dx.data);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t c = 0; c < s.c; ++c) {
        const float inv_std = 1.0f / std::sqrt(var[c] + eps);
        const float gain = scale_shift[c] * inv_std;
        const int64_t at = run.start(n, c);
        for (int64_t k = 0; k < run.hw; ++k) {
          const int64_t i = at + k * run.block;
          const float xhat = (load(xs + i) - mean[c]) * inv_std;
          store(dxs + i, gain * (load(dys + i) - dy_means[c] - xhat * dy_means[s.c + c]));
        }
      }
    }
    // oneDNN reads blocked layouts' padding channels as zeros.
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t c = s.c; c < run.padded; ++c) {
        for (int64_t k = 0; k < run.hw; ++k) store(dxs + run.start(n, c) + k * run.block, 0.0f);
      }
    }
  });
}

}  // namespace vtrain::worker::cpu
