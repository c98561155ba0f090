#include "worker/data/transform.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "worker/data/random.h"

namespace vtrain::worker {
namespace {

using data_random::Rng;

// Separates augmentation's streams from the permutation's and the
// synthetic data's for the same seed.
constexpr uint64_t kAugmentKey = 0xA06D3E7C5A11F1A9ULL;

// One stream per (epoch, sample): epochs below 2^24 and samples below 2^40
// never share one.
Rng sample_rng(SampleDraw draw, int64_t index) {
  const uint64_t stream = (static_cast<uint64_t>(draw.epoch) << 40) ^ static_cast<uint64_t>(index);
  return Rng(draw.seed ^ kAugmentKey, stream);
}

// torchvision's RandomResizedCrop.get_params: ten tries at a random area
// and aspect ratio that fit, else the largest centred window whose aspect
// is within the ratio range.
CropWindow random_resized(const TransformOptions& o, int64_t width, int64_t height, Rng& rng) {
  const double area = static_cast<double>(width) * static_cast<double>(height);
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (o.scale_min + (o.scale_max - o.scale_min) * rng.uniform());
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * rng.uniform());
    const auto w = static_cast<int64_t>(std::lround(std::sqrt(target * aspect)));
    const auto h = static_cast<int64_t>(std::lround(std::sqrt(target / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const auto y = static_cast<int64_t>(rng.below(static_cast<uint64_t>(height - h + 1)));
      const auto x = static_cast<int64_t>(rng.below(static_cast<uint64_t>(width - w + 1)));
      return {double(x), double(y), double(w), double(h)};
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < o.ratio_min) {
    h = std::lround(static_cast<double>(w) / o.ratio_min);
  } else if (in_ratio > o.ratio_max) {
    w = std::lround(static_cast<double>(h) * o.ratio_max);
  }
  return {double((width - w) / 2), double((height - h) / 2), double(w), double(h)};
}

CropWindow center(const TransformOptions& o, int64_t width, int64_t height, int64_t out_width,
                  int64_t out_height) {
  const int64_t resize = o.resize > 0 ? o.resize : std::min(out_width, out_height);
  const double scale = static_cast<double>(resize) / static_cast<double>(std::min(width, height));
  const double w = static_cast<double>(out_width) / scale;
  const double h = static_cast<double>(out_height) / scale;
  return {(static_cast<double>(width) - w) / 2, (static_cast<double>(height) - h) / 2, w, h};
}

// A window of the output's size anywhere in the padded image.
CropWindow random_padded(const TransformOptions& o, int64_t width, int64_t height, int64_t out_width,
                         int64_t out_height, Rng& rng) {
  auto offset = [&](int64_t size, int64_t out) {
    const int64_t room = std::max<int64_t>(0, size + 2 * o.pad - out);
    return static_cast<double>(static_cast<int64_t>(rng.below(static_cast<uint64_t>(room) + 1)) - o.pad);
  };
  const double y = offset(height, out_height);
  const double x = offset(width, out_width);
  return {x, y, double(out_width), double(out_height)};
}

// One output axis's filter: for output pixel i, taps[i] weights starting at
// source pixel first[i]. Bilinear (a triangle of radius 1) widened by the
// shrink factor, limited to the window's pixels and normalised over them;
// taps outside the source (zero pixels) are then dropped.
void axis_filter(double start, double length, int64_t out, int64_t source, std::vector<int32_t>& first,
                 std::vector<int32_t>& taps, std::vector<float>& weights, int64_t& stride) {
  const double scale = length / static_cast<double>(out);
  const double support = std::max(scale, 1.0);
  stride = static_cast<int64_t>(std::ceil(2 * support)) + 2;
  first.resize(static_cast<size_t>(out));
  taps.resize(static_cast<size_t>(out));
  weights.resize(static_cast<size_t>(out * stride));
  const auto window_lo = static_cast<int64_t>(std::floor(start));
  const auto window_hi = static_cast<int64_t>(std::ceil(start + length));
  for (int64_t i = 0; i < out; ++i) {
    const double centre = start + (static_cast<double>(i) + 0.5) * scale;
    const int64_t lo = std::max(window_lo, static_cast<int64_t>(std::floor(centre - support)));
    const int64_t hi = std::min({window_hi, static_cast<int64_t>(std::ceil(centre + support)), lo + stride});
    double w[64];
    double sum = 0;
    const int64_t n = std::min<int64_t>(hi - lo, 64);
    for (int64_t k = 0; k < n; ++k) {
      const double d = std::abs(static_cast<double>(lo + k) + 0.5 - centre) / support;
      w[k] = d < 1 ? 1 - d : 0;
      sum += w[k];
    }
    const int64_t from = std::max<int64_t>(lo, 0), to = std::min<int64_t>(lo + n, source);
    first[i] = static_cast<int32_t>(from);
    taps[i] = static_cast<int32_t>(std::max<int64_t>(0, to - from));
    for (int64_t j = from; j < to; ++j) {
      weights[i * stride + (j - from)] = sum > 0 ? static_cast<float>(w[j - lo] / sum) : 0.0f;
    }
  }
}

}  // namespace

std::string TransformOptions::str() const {
  std::string s = common::name_of(kCropKindNames, crop);
  char buf[160];
  if (crop == CropKind::kRandomResized) {
    std::snprintf(buf, sizeof buf, " (scale %g-%g, ratio %.4g-%.4g)", scale_min, scale_max, ratio_min,
                  ratio_max);
    s += buf;
  } else if (crop == CropKind::kCenter && resize > 0) {
    s += " (resize " + std::to_string(resize) + ")";
  } else if (crop == CropKind::kRandom) {
    s += " (pad " + std::to_string(pad) + ")";
  }
  return s + (flip ? " + flip" : "");
}

CropWindow plan_window(const TransformOptions& options, int64_t src_width, int64_t src_height,
                       int64_t out_width, int64_t out_height, SampleDraw draw, int64_t index) {
  Rng rng = sample_rng(draw, index);
  CropWindow window;
  switch (options.crop) {
    case CropKind::kNone:
      window = {0, 0, double(src_width), double(src_height)};
      break;
    case CropKind::kRandomResized:
      window = random_resized(options, src_width, src_height, rng);
      break;
    case CropKind::kCenter:
      window = center(options, src_width, src_height, out_width, out_height);
      break;
    case CropKind::kRandom:
      window = random_padded(options, src_width, src_height, out_width, out_height, rng);
      break;
  }
  window.flip = options.flip && rng.uniform() < 0.5;
  return window;
}

PixelNorm pixel_norm(const std::vector<float>& mean, const std::vector<float>& stddev) {
  if (mean.size() != stddev.size()) {
    throw std::invalid_argument("pixel_norm: " + std::to_string(mean.size()) + " means but " +
                                std::to_string(stddev.size()) + " deviations");
  }
  PixelNorm norm;
  for (size_t c = 0; c < mean.size(); ++c) {
    const double sd = stddev[c] > 0 ? double{stddev[c]} : 1.0;
    norm.scale.push_back(static_cast<float>(1.0 / (255.0 * sd)));
    norm.offset.push_back(static_cast<float>(-double{mean[c]} / sd));
  }
  return norm;
}

void render_window(const ImageView& src, const CropWindow& window, const PixelNorm& norm, int64_t out_height,
                   int64_t out_width, float* dst, ResampleScratch& s) {
  const int64_t channels = src.channels;
  if (static_cast<int64_t>(norm.scale.size()) != channels) {
    throw std::invalid_argument("render_window: normalisation for " + std::to_string(norm.scale.size()) +
                                " channels, the image has " + std::to_string(channels));
  }
  int64_t stride_x = 0, stride_y = 0;
  axis_filter(window.x, window.width, out_width, src.width, s.first_x, s.taps_x, s.weights_x, stride_x);
  axis_filter(window.y, window.height, out_height, src.height, s.first_y, s.taps_y, s.weights_y, stride_y);

  // The source rows any output row reads.
  int64_t row_lo = src.height, row_hi = 0;
  for (int64_t i = 0; i < out_height; ++i) {
    if (s.taps_y[i] == 0) continue;
    row_lo = std::min<int64_t>(row_lo, s.first_y[i]);
    row_hi = std::max<int64_t>(row_hi, s.first_y[i] + s.taps_y[i]);
  }
  const int64_t rows = std::max<int64_t>(0, row_hi - row_lo);
  s.rows.resize(static_cast<size_t>(rows * channels * out_width));

  // Horizontal pass: each needed source row, shrunk to the output's width.
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = src.data + (row_lo + r) * src.y_step;
    for (int64_t c = 0; c < channels; ++c) {
      const uint8_t* plane = row + c * src.c_step;
      float* out = s.rows.data() + (r * channels + c) * out_width;
      for (int64_t i = 0; i < out_width; ++i) {
        const float* w = s.weights_x.data() + i * stride_x;
        const uint8_t* p = plane + static_cast<int64_t>(s.first_x[i]) * src.x_step;
        float sum = 0;
        for (int32_t k = 0; k < s.taps_x[i]; ++k) sum += w[k] * static_cast<float>(p[k * src.x_step]);
        out[i] = sum;
      }
    }
  }

  // Vertical pass, normalised and (mirrored) written into the batch.
  for (int64_t c = 0; c < channels; ++c) {
    const float scale = norm.scale[c], offset = norm.offset[c];
    for (int64_t i = 0; i < out_height; ++i) {
      float* out = dst + (c * out_height + i) * out_width;
      const float* w = s.weights_y.data() + i * stride_y;
      float line[4096];
      float* acc = out_width <= 4096 ? line : out;  // a stack row for the common widths
      std::fill(acc, acc + out_width, 0.0f);
      for (int32_t k = 0; k < s.taps_y[i]; ++k) {
        const float* in = s.rows.data() + ((s.first_y[i] + k - row_lo) * channels + c) * out_width;
        const float wk = w[k];
        for (int64_t x = 0; x < out_width; ++x) acc[x] += wk * in[x];
      }
      if (window.flip) std::reverse(acc, acc + out_width);
      for (int64_t x = 0; x < out_width; ++x) out[x] = acc[x] * scale + offset;
    }
  }
}

}  // namespace vtrain::worker
