// Naive reference ops. Every loop mirrors the mathematical definition; sums
// are accumulated in double so that the oracle is more accurate than any
// backend it judges.
#include "tests/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/half.h"

namespace vtrain::reference {
namespace {

// A size mismatch is a bug in the calling test; say which argument is wrong.
void check_size(const char* op, const char* what, const Vec& v, int64_t expected) {
  if (static_cast<int64_t>(v.size()) != expected) {
    throw std::invalid_argument(std::string("reference::") + op + ": " + what + " has " +
                                std::to_string(v.size()) + " elements, expected " +
                                std::to_string(expected));
  }
}

// Offset of element (n, c, h, w) in a plain NCHW tensor of shape s.
int64_t at(const Shape& s, int64_t n, int64_t c, int64_t h, int64_t w) {
  return ((n * s.c + c) * s.h + h) * s.w + w;
}

// Calls f(ih, iw) for every input position under the window of output
// (oh, ow) that lies inside the input (padding contributes nothing).
template <typename F>
void for_each_in_window(int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t stride_h,
                        int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t in_h, int64_t in_w,
                        F&& f) {
  for (int64_t i = 0; i < kh; ++i) {
    const int64_t ih = oh * stride_h - pad_h + i;
    if (ih < 0 || ih >= in_h) continue;
    for (int64_t j = 0; j < kw; ++j) {
      const int64_t iw = ow * stride_w - pad_w + j;
      if (iw < 0 || iw >= in_w) continue;
      f(ih, iw, i, j);
    }
  }
}

Shape pool_output_shape(const PoolDesc& p, const Shape& x) {
  return p.window.output_shape(x, x.c);
}

// Channel statistics accumulate over N, H and W.
int64_t per_channel_count(const Shape& s) { return s.n * s.h * s.w; }

}  // namespace

// ------------------------------------------------------------- convolution

Vec conv_forward(const ConvProblem& p, const Vec& x, const Vec& w, const Vec& bias) {
  if (p.groups != 1) return grouped_conv_forward(p, p.groups, x, w, bias);
  const Shape xs = p.x.shape;
  const Shape ys = p.output_shape();
  check_size("conv_forward", "x", x, xs.elements());
  check_size("conv_forward", "w", w, p.weight_shape().elements());
  if (!bias.empty()) check_size("conv_forward", "bias", bias, p.k);
  Vec y(static_cast<size_t>(ys.elements()));
  for (int64_t n = 0; n < ys.n; ++n) {
    for (int64_t k = 0; k < p.k; ++k) {
      for (int64_t oh = 0; oh < ys.h; ++oh) {
        for (int64_t ow = 0; ow < ys.w; ++ow) {
          double sum = bias.empty() ? 0.0 : bias[k];
          for (int64_t c = 0; c < xs.c; ++c) {
            for_each_in_window(oh, ow, p.window.kernel_h, p.window.kernel_w, p.window.stride_h, p.window.stride_w, p.window.pad_h, p.window.pad_w, xs.h,
                               xs.w, [&](int64_t ih, int64_t iw, int64_t r, int64_t s) {
                                 sum += double(x[at(xs, n, c, ih, iw)]) *
                                        w[((k * xs.c + c) * p.window.kernel_h + r) * p.window.kernel_w + s];
                               });
          }
          y[at(ys, n, k, oh, ow)] = static_cast<float>(sum);
        }
      }
    }
  }
  return y;
}

Vec conv_backward_data(const ConvProblem& p, const Vec& dy, const Vec& w) {
  if (p.groups != 1) return grouped_conv_backward_data(p, p.groups, dy, w);
  const Shape xs = p.x.shape;
  const Shape ys = p.output_shape();
  check_size("conv_backward_data", "dy", dy, ys.elements());
  check_size("conv_backward_data", "w", w, p.weight_shape().elements());
  // Scatter each output gradient back through the window it was computed from.
  std::vector<double> dx(static_cast<size_t>(xs.elements()), 0.0);
  for (int64_t n = 0; n < ys.n; ++n) {
    for (int64_t k = 0; k < p.k; ++k) {
      for (int64_t oh = 0; oh < ys.h; ++oh) {
        for (int64_t ow = 0; ow < ys.w; ++ow) {
          const double g = dy[at(ys, n, k, oh, ow)];
          for (int64_t c = 0; c < xs.c; ++c) {
            for_each_in_window(oh, ow, p.window.kernel_h, p.window.kernel_w, p.window.stride_h, p.window.stride_w, p.window.pad_h, p.window.pad_w, xs.h,
                               xs.w, [&](int64_t ih, int64_t iw, int64_t r, int64_t s) {
                                 dx[at(xs, n, c, ih, iw)] +=
                                     g * w[((k * xs.c + c) * p.window.kernel_h + r) * p.window.kernel_w + s];
                               });
          }
        }
      }
    }
  }
  return Vec(dx.begin(), dx.end());
}

Vec conv_backward_filter(const ConvProblem& p, const Vec& x, const Vec& dy, Vec* dbias) {
  if (p.groups != 1) return grouped_conv_backward_filter(p, p.groups, x, dy, dbias);
  const Shape xs = p.x.shape;
  const Shape ys = p.output_shape();
  check_size("conv_backward_filter", "x", x, xs.elements());
  check_size("conv_backward_filter", "dy", dy, ys.elements());
  std::vector<double> dw(static_cast<size_t>(p.weight_shape().elements()), 0.0);
  std::vector<double> db(static_cast<size_t>(p.k), 0.0);
  for (int64_t n = 0; n < ys.n; ++n) {
    for (int64_t k = 0; k < p.k; ++k) {
      for (int64_t oh = 0; oh < ys.h; ++oh) {
        for (int64_t ow = 0; ow < ys.w; ++ow) {
          const double g = dy[at(ys, n, k, oh, ow)];
          db[k] += g;
          for (int64_t c = 0; c < xs.c; ++c) {
            for_each_in_window(oh, ow, p.window.kernel_h, p.window.kernel_w, p.window.stride_h, p.window.stride_w, p.window.pad_h, p.window.pad_w, xs.h,
                               xs.w, [&](int64_t ih, int64_t iw, int64_t r, int64_t s) {
                                 dw[((k * xs.c + c) * p.window.kernel_h + r) * p.window.kernel_w + s] +=
                                     g * x[at(xs, n, c, ih, iw)];
                               });
          }
        }
      }
    }
  }
  if (dbias != nullptr) dbias->assign(db.begin(), db.end());
  return Vec(dw.begin(), dw.end());
}

// -------------------------------------------------------------------- relu

Vec relu_forward(const Vec& x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return y;
}

Vec relu_backward(const Vec& y, const Vec& dy) {
  check_size("relu_backward", "dy", dy, static_cast<int64_t>(y.size()));
  Vec dx(y.size());
  for (size_t i = 0; i < y.size(); ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  return dx;
}

Vec bias_relu_forward(common::DataType type, const Shape& shape, const Vec& x, const Vec& bias) {
  check_size("bias_relu_forward", "x", x, shape.elements());
  check_size("bias_relu_forward", "bias", bias, shape.c);
  const int64_t hw = shape.h * shape.w;
  Vec sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    sum[i] = x[i] + bias[static_cast<size_t>(static_cast<int64_t>(i) / hw % shape.c)];
  }
  return relu_forward(rounded(type, std::move(sum)));
}

Vec channel_sums(const Shape& shape, const Vec& x) {
  check_size("channel_sums", "x", x, shape.elements());
  const int64_t hw = shape.h * shape.w;
  std::vector<double> sums(static_cast<size_t>(shape.c), 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    sums[static_cast<size_t>(static_cast<int64_t>(i) / hw % shape.c)] += x[i];
  }
  return Vec(sums.begin(), sums.end());
}

// ----------------------------------------------------------------- pooling

namespace {

// Offset (in x) of the element max pooling selects for output (n, c, oh, ow):
// the first maximum in row-major window order, padding excluded.
int64_t max_position(const PoolDesc& p, const Shape& xs, const Vec& x, int64_t n, int64_t c,
                     int64_t oh, int64_t ow) {
  int64_t best = -1;
  float best_value = -std::numeric_limits<float>::infinity();
  for_each_in_window(oh, ow, p.window.kernel_h, p.window.kernel_w, p.window.stride_h, p.window.stride_w, p.window.pad_h, p.window.pad_w, xs.h, xs.w,
                     [&](int64_t ih, int64_t iw, int64_t, int64_t) {
                       const int64_t i = at(xs, n, c, ih, iw);
                       if (best < 0 || x[i] > best_value) {
                         best = i;
                         best_value = x[i];
                       }
                     });
  return best;
}

// Window elements inside the input: the divisor of average pooling.
int64_t window_count(const PoolDesc& p, const Shape& xs, int64_t oh, int64_t ow) {
  int64_t count = 0;
  for_each_in_window(oh, ow, p.window.kernel_h, p.window.kernel_w, p.window.stride_h, p.window.stride_w, p.window.pad_h, p.window.pad_w, xs.h, xs.w,
                     [&](int64_t, int64_t, int64_t, int64_t) { ++count; });
  return count;
}

}  // namespace

Vec pooling_forward(const PoolDesc& p, const Shape& xs, const Vec& x) {
  check_size("pooling_forward", "x", x, xs.elements());
  const Shape ys = pool_output_shape(p, xs);
  Vec y(static_cast<size_t>(ys.elements()));
  for (int64_t n = 0; n < ys.n; ++n) {
    for (int64_t c = 0; c < ys.c; ++c) {
      for (int64_t oh = 0; oh < ys.h; ++oh) {
        for (int64_t ow = 0; ow < ys.w; ++ow) {
          float value = 0.0f;
          if (p.kind == worker::PoolKind::kMax) {
            value = x[max_position(p, xs, x, n, c, oh, ow)];
          } else {
            double sum = 0.0;
            for_each_in_window(
                oh, ow, p.window.kernel_h, p.window.kernel_w, p.window.stride_h, p.window.stride_w, p.window.pad_h, p.window.pad_w, xs.h, xs.w,
                [&](int64_t ih, int64_t iw, int64_t, int64_t) { sum += x[at(xs, n, c, ih, iw)]; });
            value = static_cast<float>(sum / double(window_count(p, xs, oh, ow)));
          }
          y[at(ys, n, c, oh, ow)] = value;
        }
      }
    }
  }
  return y;
}

Vec pooling_backward(const PoolDesc& p, const Shape& xs, const Vec& x, const Vec& dy) {
  check_size("pooling_backward", "x", x, xs.elements());
  const Shape ys = pool_output_shape(p, xs);
  check_size("pooling_backward", "dy", dy, ys.elements());
  std::vector<double> dx(static_cast<size_t>(xs.elements()), 0.0);
  for (int64_t n = 0; n < ys.n; ++n) {
    for (int64_t c = 0; c < ys.c; ++c) {
      for (int64_t oh = 0; oh < ys.h; ++oh) {
        for (int64_t ow = 0; ow < ys.w; ++ow) {
          const double g = dy[at(ys, n, c, oh, ow)];
          if (p.kind == worker::PoolKind::kMax) {
            dx[max_position(p, xs, x, n, c, oh, ow)] += g;
          } else {
            const double share = g / double(window_count(p, xs, oh, ow));
            for_each_in_window(oh, ow, p.window.kernel_h, p.window.kernel_w, p.window.stride_h, p.window.stride_w, p.window.pad_h, p.window.pad_w, xs.h,
                               xs.w, [&](int64_t ih, int64_t iw, int64_t, int64_t) {
                                 dx[at(xs, n, c, ih, iw)] += share;
                               });
          }
        }
      }
    }
  }
  return Vec(dx.begin(), dx.end());
}

// ----------------------------------------------------------- inner product

Vec inner_product_forward(const Shape& xs, const Vec& x, int64_t out, const Vec& w,
                          const Vec& bias) {
  const int64_t in = xs.per_sample();
  check_size("inner_product_forward", "x", x, xs.elements());
  check_size("inner_product_forward", "w", w, out * in);
  if (!bias.empty()) check_size("inner_product_forward", "bias", bias, out);
  Vec y(static_cast<size_t>(xs.n * out));
  for (int64_t n = 0; n < xs.n; ++n) {
    for (int64_t o = 0; o < out; ++o) {
      double sum = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < in; ++i) sum += double(x[n * in + i]) * w[o * in + i];
      y[n * out + o] = static_cast<float>(sum);
    }
  }
  return y;
}

Vec inner_product_backward_data(const Shape& xs, int64_t out, const Vec& dy, const Vec& w) {
  const int64_t in = xs.per_sample();
  check_size("inner_product_backward_data", "dy", dy, xs.n * out);
  check_size("inner_product_backward_data", "w", w, out * in);
  Vec dx(static_cast<size_t>(xs.elements()));
  for (int64_t n = 0; n < xs.n; ++n) {
    for (int64_t i = 0; i < in; ++i) {
      double sum = 0.0;
      for (int64_t o = 0; o < out; ++o) sum += double(dy[n * out + o]) * w[o * in + i];
      dx[n * in + i] = static_cast<float>(sum);
    }
  }
  return dx;
}

Vec inner_product_backward_weights(const Shape& xs, int64_t out, const Vec& x, const Vec& dy,
                                   Vec* dbias) {
  const int64_t in = xs.per_sample();
  check_size("inner_product_backward_weights", "x", x, xs.elements());
  check_size("inner_product_backward_weights", "dy", dy, xs.n * out);
  Vec dw(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      double sum = 0.0;
      for (int64_t n = 0; n < xs.n; ++n) sum += double(dy[n * out + o]) * x[n * in + i];
      dw[o * in + i] = static_cast<float>(sum);
    }
  }
  if (dbias != nullptr) {
    dbias->assign(static_cast<size_t>(out), 0.0f);
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0;
      for (int64_t n = 0; n < xs.n; ++n) sum += dy[n * out + o];
      (*dbias)[o] = static_cast<float>(sum);
    }
  }
  return dw;
}

// ------------------------------------------------------------- batch norm

BatchNormForward batch_norm_forward_training(const Shape& s, const Vec& x, const Vec& gamma,
                                             const Vec& beta, float eps) {
  check_size("batch_norm_forward_training", "x", x, s.elements());
  BatchNormForward out;
  out.mean.resize(static_cast<size_t>(s.c));
  out.var.resize(static_cast<size_t>(s.c));
  const double count = double(per_channel_count(s));
  for (int64_t c = 0; c < s.c; ++c) {
    double sum = 0.0;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.h * s.w; ++i) sum += x[at(s, n, c, 0, 0) + i];
    const double mean = sum / count;
    // Two passes: the variance of centred values does not cancel catastrophically.
    double sq = 0.0;
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.h * s.w; ++i) {
        const double d = x[at(s, n, c, 0, 0) + i] - mean;
        sq += d * d;
      }
    }
    out.mean[c] = static_cast<float>(mean);
    out.var[c] = static_cast<float>(sq / count);
  }
  out.y = batch_norm_forward_inference(s, x, gamma, beta, out.mean, out.var, eps);
  return out;
}

Vec batch_norm_forward_inference(const Shape& s, const Vec& x, const Vec& gamma, const Vec& beta,
                                 const Vec& mean, const Vec& var, float eps) {
  check_size("batch_norm_forward", "x", x, s.elements());
  check_size("batch_norm_forward", "gamma", gamma, s.c);
  check_size("batch_norm_forward", "beta", beta, s.c);
  check_size("batch_norm_forward", "mean", mean, s.c);
  check_size("batch_norm_forward", "var", var, s.c);
  Vec y(x.size());
  for (int64_t c = 0; c < s.c; ++c) {
    const double inv_std = 1.0 / std::sqrt(double(var[c]) + eps);
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.h * s.w; ++i) {
        const int64_t j = at(s, n, c, 0, 0) + i;
        y[j] = static_cast<float>(gamma[c] * (x[j] - double(mean[c])) * inv_std + beta[c]);
      }
    }
  }
  return y;
}

BatchNormBackward batch_norm_backward(const Shape& s, const Vec& x, const Vec& dy, const Vec& gamma,
                                      const Vec& mean, const Vec& var, float eps) {
  check_size("batch_norm_backward", "x", x, s.elements());
  check_size("batch_norm_backward", "dy", dy, s.elements());
  check_size("batch_norm_backward", "gamma", gamma, s.c);
  check_size("batch_norm_backward", "mean", mean, s.c);
  check_size("batch_norm_backward", "var", var, s.c);
  BatchNormBackward out;
  out.dx.resize(x.size());
  out.dgamma.resize(static_cast<size_t>(s.c));
  out.dbeta.resize(static_cast<size_t>(s.c));
  const double count = double(per_channel_count(s));
  for (int64_t c = 0; c < s.c; ++c) {
    const double inv_std = 1.0 / std::sqrt(double(var[c]) + eps);
    double dbeta = 0.0;
    double dgamma = 0.0;
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.h * s.w; ++i) {
        const int64_t j = at(s, n, c, 0, 0) + i;
        dbeta += dy[j];
        dgamma += dy[j] * (x[j] - double(mean[c])) * inv_std;
      }
    }
    // dx = gamma / std * (dy - mean(dy) - xhat * mean(dy * xhat)): the mean and
    // variance depend on every x of the channel, hence the two correction terms.
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t i = 0; i < s.h * s.w; ++i) {
        const int64_t j = at(s, n, c, 0, 0) + i;
        const double xhat = (x[j] - double(mean[c])) * inv_std;
        out.dx[j] = static_cast<float>(gamma[c] * inv_std *
                                       (dy[j] - dbeta / count - xhat * dgamma / count));
      }
    }
    out.dgamma[c] = static_cast<float>(dgamma);
    out.dbeta[c] = static_cast<float>(dbeta);
  }
  return out;
}

// ------------------------------------------------------- add and concat

Vec rounded(common::DataType type, Vec v) {
  for (float& x : v) x = common::round_to(type, x);
  return v;
}

Vec add(const Vec& a, const Vec& b) {
  check_size("add", "b", b, static_cast<int64_t>(a.size()));
  Vec y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

// ------------------------------------------------ the layers of issue 43

double activation(Activation f, double x) {
  switch (f) {
    case Activation::kSilu: return x / (1.0 + std::exp(-x));
    case Activation::kGelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::kSigmoid: return 1.0 / (1.0 + std::exp(-x));
    case Activation::kRelu6: return std::min(std::max(x, 0.0), 6.0);
  }
  throw std::invalid_argument("reference::activation: unknown activation");
}

double activation_derivative(Activation f, double x) {
  const double sigmoid = 1.0 / (1.0 + std::exp(-x));
  switch (f) {
    // d/dx x s(x) = s(x) + x s(x) (1 - s(x))
    case Activation::kSilu: return sigmoid * (1.0 + x * (1.0 - sigmoid));
    // d/dx x Phi(x) = Phi(x) + x phi(x)
    case Activation::kGelu: {
      const double pi = std::acos(-1.0);
      return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
             x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * pi);
    }
    case Activation::kSigmoid: return sigmoid * (1.0 - sigmoid);
    // The kinks at 0 and 6 take the derivative of the flat side, as PyTorch's
    // hardtanh backward does.
    case Activation::kRelu6: return x > 0.0 && x < 6.0 ? 1.0 : 0.0;
  }
  throw std::invalid_argument("reference::activation_derivative: unknown activation");
}

Vec activation_forward(Activation f, const Vec& x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(activation(f, x[i]));
  return y;
}

Vec activation_backward(Activation f, const Vec& x, const Vec& dy) {
  check_size("activation_backward", "dy", dy, static_cast<int64_t>(x.size()));
  Vec dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    dx[i] = static_cast<float>(activation_derivative(f, x[i]) * dy[i]);
  }
  return dx;
}

namespace {

// Offset into b of element i of a: the same element, or its (n, c) value
// when b is n x c x 1 x 1 (and a is not).
int64_t mul_b_index(const Shape& a_shape, const Shape& b_shape, int64_t i) {
  if (b_shape == a_shape) return i;
  return i / (a_shape.h * a_shape.w);
}

void check_mul(const char* op, const Shape& a_shape, const Shape& b_shape, const Vec& a,
               const Vec& b) {
  check_size(op, "a", a, a_shape.elements());
  check_size(op, "b", b, b_shape.elements());
  const bool broadcast = b_shape.n == a_shape.n && b_shape.c == a_shape.c && b_shape.h == 1 &&
                         b_shape.w == 1;
  if (b_shape != a_shape && !broadcast) {
    throw std::invalid_argument(std::string("reference::") + op + ": b " + b_shape.str() +
                                " neither equals nor broadcasts to a " + a_shape.str());
  }
}

}  // namespace

Vec mul_forward(const Shape& a_shape, const Shape& b_shape, const Vec& a, const Vec& b) {
  check_mul("mul_forward", a_shape, b_shape, a, b);
  Vec y(a.size());
  for (int64_t i = 0; i < a_shape.elements(); ++i) {
    y[i] = static_cast<float>(double(a[i]) * b[mul_b_index(a_shape, b_shape, i)]);
  }
  return y;
}

MulBackward mul_backward(const Shape& a_shape, const Shape& b_shape, const Vec& a, const Vec& b,
                         const Vec& dy) {
  check_mul("mul_backward", a_shape, b_shape, a, b);
  check_size("mul_backward", "dy", dy, a_shape.elements());
  MulBackward g;
  g.da.resize(a.size());
  std::vector<double> db(b.size(), 0.0);
  for (int64_t i = 0; i < a_shape.elements(); ++i) {
    const int64_t j = mul_b_index(a_shape, b_shape, i);
    g.da[i] = static_cast<float>(double(dy[i]) * b[j]);
    db[j] += double(dy[i]) * a[i];
  }
  g.db.assign(db.begin(), db.end());
  return g;
}

namespace {

// Channels [k * c, (k + 1) * c) of every sample of an NCHW tensor with
// `channels` channels and `plane` elements per channel.
Vec channel_slice(const Vec& v, int64_t n, int64_t channels, int64_t plane, int64_t k, int64_t c) {
  Vec out;
  for (int64_t i = 0; i < n; ++i) {
    const auto first = v.begin() + (i * channels + k * c) * plane;
    out.insert(out.end(), first, first + c * plane);
  }
  return out;
}

// The inverse of channel_slice: writes `part` into `v`.
void put_channel_slice(Vec& v, const Vec& part, int64_t n, int64_t channels, int64_t plane,
                       int64_t k, int64_t c) {
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(part.begin() + i * c * plane, c * plane, v.begin() + (i * channels + k * c) * plane);
  }
}

// A grouped convolution cut into its groups: `one` is the problem of one
// group (1 / count of the input and output channels), and the parts of
// group k of x-, y-, weight- and bias-shaped tensors are read and written
// through it.
struct ConvGroups {
  ConvProblem whole, one;
  int64_t count;

  ConvGroups(const ConvProblem& p, int64_t groups) : whole(p), one(p), count(groups) {
    if (groups < 1 || p.x.shape.c % groups != 0 || p.k % groups != 0) {
      throw std::invalid_argument("reference grouped conv: groups " + std::to_string(groups) +
                                  " must divide channels " + std::to_string(p.x.shape.c) +
                                  " and " + std::to_string(p.k));
    }
    whole.groups = groups;
    one.groups = 1;
    one.x.shape.c /= groups;
    one.k /= groups;
    one.y.shape = one.output_shape();
  }

  Vec x_part(const Vec& x, int64_t k) const {
    const Shape& s = whole.x.shape;
    return channel_slice(x, s.n, s.c, s.h * s.w, k, one.x.shape.c);
  }
  void put_x_part(Vec& x, const Vec& part, int64_t k) const {
    const Shape& s = whole.x.shape;
    put_channel_slice(x, part, s.n, s.c, s.h * s.w, k, one.x.shape.c);
  }
  Vec y_part(const Vec& y, int64_t k) const {
    const Shape s = whole.output_shape();
    return channel_slice(y, s.n, s.c, s.h * s.w, k, one.k);
  }
  void put_y_part(Vec& y, const Vec& part, int64_t k) const {
    const Shape s = whole.output_shape();
    put_channel_slice(y, part, s.n, s.c, s.h * s.w, k, one.k);
  }
  // Group k's filters: the weights are {whole.k, one.x.shape.c, r, s}.
  Vec w_part(const Vec& w, int64_t k) const {
    const int64_t size = one.weight_shape().elements();
    check_size("grouped conv", "w", w, count * size);
    return Vec(w.begin() + k * size, w.begin() + (k + 1) * size);
  }
  Vec bias_part(const Vec& bias, int64_t k) const {
    if (bias.empty()) return {};
    return Vec(bias.begin() + k * one.k, bias.begin() + (k + 1) * one.k);
  }
};

}  // namespace

// A grouped convolution is `groups` independent convolutions on channel
// slices: each function below runs the plain one per group.
Vec grouped_conv_forward(const ConvProblem& p, int64_t groups, const Vec& x, const Vec& w,
                         const Vec& bias) {
  const ConvGroups g(p, groups);
  Vec y(static_cast<size_t>(p.output_shape().elements()));
  for (int64_t k = 0; k < groups; ++k) {
    g.put_y_part(y, conv_forward(g.one, g.x_part(x, k), g.w_part(w, k), g.bias_part(bias, k)), k);
  }
  return y;
}

Vec grouped_conv_backward_data(const ConvProblem& p, int64_t groups, const Vec& dy, const Vec& w) {
  const ConvGroups g(p, groups);
  Vec dx(static_cast<size_t>(p.x.shape.elements()));
  for (int64_t k = 0; k < groups; ++k) {
    g.put_x_part(dx, conv_backward_data(g.one, g.y_part(dy, k), g.w_part(w, k)), k);
  }
  return dx;
}

Vec grouped_conv_backward_filter(const ConvProblem& p, int64_t groups, const Vec& x,
                                 const Vec& dy, Vec* dbias) {
  const ConvGroups g(p, groups);
  Vec dw;
  if (dbias) dbias->clear();
  for (int64_t k = 0; k < groups; ++k) {
    Vec dbias_k;
    const Vec dw_k =
        conv_backward_filter(g.one, g.x_part(x, k), g.y_part(dy, k), dbias ? &dbias_k : nullptr);
    dw.insert(dw.end(), dw_k.begin(), dw_k.end());
    if (dbias) dbias->insert(dbias->end(), dbias_k.begin(), dbias_k.end());
  }
  return dw;
}

Vec dropout_apply(const Vec& x, const std::vector<uint8_t>& keep, float p) {
  if (keep.size() != x.size()) {
    throw std::invalid_argument("reference::dropout_apply: keep has " +
                                std::to_string(keep.size()) + " elements, expected " +
                                std::to_string(x.size()));
  }
  const double scale = 1.0 / (1.0 - double(p));
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = keep[i] ? static_cast<float>(x[i] * scale) : 0.0f;
  return y;
}

namespace {

// Checks that the inputs agree on n, h, w and returns the concatenated shape.
Shape concat_shape(const char* op, const std::vector<Shape>& shapes) {
  if (shapes.empty()) throw std::invalid_argument(std::string("reference::") + op + ": no inputs");
  Shape out = shapes.front();
  out.c = 0;
  for (const Shape& s : shapes) {
    if (s.n != out.n || s.h != out.h || s.w != out.w) {
      throw std::invalid_argument(std::string("reference::") + op + ": input " + s.str() +
                                  " does not match " + shapes.front().str() + " outside channels");
    }
    out.c += s.c;
  }
  return out;
}

}  // namespace

Vec concat(const std::vector<Shape>& shapes, const std::vector<Vec>& xs) {
  const Shape ys = concat_shape("concat", shapes);
  if (xs.size() != shapes.size()) throw std::invalid_argument("reference::concat: shapes/xs count");
  Vec y(static_cast<size_t>(ys.elements()));
  int64_t first_channel = 0;
  for (size_t t = 0; t < shapes.size(); ++t) {
    const Shape& s = shapes[t];
    check_size("concat", "input", xs[t], s.elements());
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t c = 0; c < s.c; ++c)
        for (int64_t i = 0; i < s.h * s.w; ++i)
          y[at(ys, n, first_channel + c, 0, 0) + i] = xs[t][at(s, n, c, 0, 0) + i];
    first_channel += s.c;
  }
  return y;
}

std::vector<Vec> concat_backward(const std::vector<Shape>& shapes, const Vec& dy) {
  const Shape ys = concat_shape("concat_backward", shapes);
  check_size("concat_backward", "dy", dy, ys.elements());
  std::vector<Vec> dxs;
  int64_t first_channel = 0;
  for (const Shape& s : shapes) {
    Vec dx(static_cast<size_t>(s.elements()));
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t c = 0; c < s.c; ++c)
        for (int64_t i = 0; i < s.h * s.w; ++i)
          dx[at(s, n, c, 0, 0) + i] = dy[at(ys, n, first_channel + c, 0, 0) + i];
    dxs.push_back(std::move(dx));
    first_channel += s.c;
  }
  return dxs;
}

// ------------------------------------------------------------------- loss

SoftmaxXent softmax_cross_entropy(int64_t n, int64_t classes, const Vec& logits,
                                  const std::vector<int32_t>& labels, float scale,
                                  float label_smoothing) {
  check_size("softmax_cross_entropy", "logits", logits, n * classes);
  if (static_cast<int64_t>(labels.size()) != n) {
    throw std::invalid_argument(
        "reference::softmax_cross_entropy: " + std::to_string(labels.size()) + " labels for " +
        std::to_string(n) + " samples");
  }
  SoftmaxXent out;
  out.dlogits.resize(logits.size());
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits.data() + i * classes;
    const int32_t label = labels[i];
    if (label < 0 || label >= classes) {
      throw std::invalid_argument("reference::softmax_cross_entropy: label " +
                                  std::to_string(label) + " outside [0, " +
                                  std::to_string(classes) + ")");
    }
    // First maximum: the prediction, and the shift that keeps exp() finite.
    int64_t arg_max = 0;
    for (int64_t j = 1; j < classes; ++j)
      if (z[j] > z[arg_max]) arg_max = j;
    const double max = z[arg_max];
    double sum_exp = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum_exp += std::exp(double(z[j]) - max);
    const double log_sum_exp = max + std::log(sum_exp);
    if (arg_max == label) ++out.correct;
    for (int64_t j = 0; j < classes; ++j) {
      const double q = (j == label ? 1.0 - label_smoothing : 0.0) +
                       double(label_smoothing) / double(classes);
      out.loss_sum += q * (log_sum_exp - z[j]);
      const double softmax = std::exp(double(z[j]) - log_sum_exp);
      out.dlogits[i * classes + j] = static_cast<float>((softmax - q) * scale);
    }
  }
  return out;
}

// -------------------------------------------------------------- optimizer

void sgd_update(Vec& w, const Vec& g, Vec& v, const worker::SgdStep& step) {
  check_size("sgd_update", "g", g, static_cast<int64_t>(w.size()));
  check_size("sgd_update", "velocity", v, static_cast<int64_t>(w.size()));
  // Float arithmetic in the documented order: the same rounding a backend's
  // elementwise kernel performs, so the comparison can be tight.
  for (size_t i = 0; i < w.size(); ++i) {
    const float d = g[i] * step.grad_scale + step.weight_decay * w[i];
    v[i] = step.momentum * v[i] + d;
    w[i] -= step.lr * (step.nesterov ? d + step.momentum * v[i] : v[i]);
  }
}

void adamw_update(Vec& w, const Vec& g, Vec& m, Vec& v, const worker::AdamWStep& step) {
  check_size("adamw_update", "g", g, static_cast<int64_t>(w.size()));
  check_size("adamw_update", "m", m, static_cast<int64_t>(w.size()));
  check_size("adamw_update", "v", v, static_cast<int64_t>(w.size()));
  const worker::AdamWFactors f = worker::adamw_factors(step);
  for (size_t i = 0; i < w.size(); ++i) {
    const float d = g[i] * step.grad_scale;
    m[i] = step.beta1 * m[i] + (1.0f - step.beta1) * d;
    v[i] = step.beta2 * v[i] + (1.0f - step.beta2) * d * d;
    w[i] = w[i] * f.decay - f.step_size * (m[i] / (std::sqrt(v[i]) / f.sqrt_correction2 + step.eps));
  }
}

void moving_average(Vec& average, const Vec& x, float decay) {
  check_size("moving_average", "x", x, static_cast<int64_t>(average.size()));
  for (size_t i = 0; i < x.size(); ++i) average[i] += (1.0f - decay) * (x[i] - average[i]);
}

std::vector<double> sum_squares(const Vec& x, const std::vector<int64_t>& offsets) {
  std::vector<double> sums;
  for (size_t s = 0; s + 1 < offsets.size(); ++s) {
    double sum = 0.0;
    for (int64_t i = offsets[s]; i < offsets[s + 1]; ++i) sum += double(x[i]) * double(x[i]);
    sums.push_back(sum);
  }
  return sums;
}

}  // namespace vtrain::reference
