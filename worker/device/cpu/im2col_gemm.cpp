#include "worker/device/cpu/im2col_gemm.h"

#include <algorithm>

namespace vtrain::worker::cpu {

void im2col(const Im2colGeometry& g, const float* x, float* cols) {
  const int64_t plane = g.oh * g.ow;
  const int64_t row_len = g.cols();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t ch = 0; ch < g.c; ++ch) {
    for (int64_t ij = 0; ij < g.r * g.s; ++ij) {
      const int64_t i = ij / g.s;
      const int64_t j = ij % g.s;
      float* row = cols + (ch * g.r * g.s + ij) * row_len;
      for (int64_t img = 0; img < g.n; ++img) {
        const float* src = x + (img * g.c + ch) * g.h * g.w;
        float* dst = row + img * plane;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * g.stride_h - g.pad_h + i;
          float* out = dst + oy * g.ow;
          if (iy < 0 || iy >= g.h) {
            std::fill(out, out + g.ow, 0.0f);
            continue;
          }
          const float* in = src + iy * g.w;
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            const int64_t ix = ox * g.stride_w - g.pad_w + j;
            out[ox] = (ix >= 0 && ix < g.w) ? in[ix] : 0.0f;
          }
        }
      }
    }
  }
}

void col2im_accumulate(const Im2colGeometry& g, const float* cols, float* dx) {
  const int64_t plane = g.oh * g.ow;
  const int64_t row_len = g.cols();
  // Parallel over (image, channel): each owns a distinct dx plane, so the
  // overlapping windows never race.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t img = 0; img < g.n; ++img) {
    for (int64_t ch = 0; ch < g.c; ++ch) {
      float* dst = dx + (img * g.c + ch) * g.h * g.w;
      for (int64_t ij = 0; ij < g.r * g.s; ++ij) {
        const int64_t i = ij / g.s;
        const int64_t j = ij % g.s;
        const float* src = cols + (ch * g.r * g.s + ij) * row_len + img * plane;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * g.stride_h - g.pad_h + i;
          if (iy < 0 || iy >= g.h) continue;
          float* out = dst + iy * g.w;
          const float* in = src + oy * g.ow;
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            const int64_t ix = ox * g.stride_w - g.pad_w + j;
            if (ix >= 0 && ix < g.w) out[ix] += in[ox];
          }
        }
      }
    }
  }
}

}  // namespace vtrain::worker::cpu
