// The lowering step of the im2col + GEMM convolution algorithm: unfold
// input patches into columns (and fold them back for backward-data). The
// GEMMs themselves run on oneDNN's sgemm in cpu_conv.cpp.
//
// Column layout for a batch of n images: cols[(c * r + i) * s + j][img * oh * ow + y * ow + x],
// i.e. a (c*r*s) x (n*oh*ow) row-major matrix, so one GEMM covers the batch.
// Its size grows with n: that is the algorithm's workspace/time trade-off.
#pragma once

#include <cstdint>

namespace vtrain::worker::cpu {

struct Im2colGeometry {
  int64_t n, c, h, w;  // input
  int64_t r, s;        // filter
  int64_t pad_h, pad_w, stride_h, stride_w;
  int64_t oh, ow;      // output

  int64_t rows() const { return c * r * s; }
  int64_t cols() const { return n * oh * ow; }
};

// x: plain NCHW. cols: rows() x cols(), fully written (zeros for padding).
void im2col(const Im2colGeometry& g, const float* x, float* cols);

// dx (plain NCHW) += fold(cols). dx must be initialised by the caller.
void col2im_accumulate(const Im2colGeometry& g, const float* cols, float* dx);

}  // namespace vtrain::worker::cpu
