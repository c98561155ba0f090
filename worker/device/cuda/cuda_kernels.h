// The CUDA kernels of the backend: the ops no library provides (layout
// reorders, fills, elementwise sums, strided channel copies, softmax
// cross-entropy, SGD, batch-norm statistic conversions). Each function
// enqueues one kernel on `stream` and throws BackendError if the launch
// fails; a zero count enqueues nothing. Internal to worker/device/cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace vtrain::worker::cuda {

// A 4-D tensor's logical shape and its channel block (1 = plain NCHW,
// 8 / 16 = nChw8c / nChw16c with zero-padded channels).
struct BlockedShape {
  int64_t n = 1, c = 1, h = 1, w = 1;
  int64_t block = 1;
  int64_t storage_elements() const { return n * (c + block - 1) / block * block * h * w; }
};

// dst = src with a layout change; padding channels of dst become 0.
void reorder(const float* src, int64_t src_block, float* dst, const BlockedShape& dst_shape,
             cudaStream_t stream);
// Every element = value, padding channels = 0.
void fill(float* dst, const BlockedShape& shape, float value, cudaStream_t stream);

// y = a + b over count floats; y may alias a or b.
void add(const float* a, const float* b, float* y, int64_t count, cudaStream_t stream);
// y = x + beta * y over count floats; beta = 0 never reads y.
void accumulate(const float* x, float* y, float beta, int64_t count, cudaStream_t stream);
// x *= alpha over count floats.
void scale(float* x, float alpha, int64_t count, cudaStream_t stream);
// *flag = 1 when any of x[0, count) is infinite or NaN (flag left as is otherwise).
void flag_non_finite(const float* x, int64_t count, int32_t* flag, cudaStream_t stream);

// For each of `rows` rows: dst[row * dst_pitch + i] = src[row * src_pitch + i]
// + beta * dst[...] for i < row_length (all in floats); beta = 0 never reads dst.
void copy_rows(const float* src, int64_t src_pitch, float* dst, int64_t dst_pitch, int64_t rows,
               int64_t row_length, float beta, cudaStream_t stream);

// Softmax cross-entropy over n rows of `classes` logits: per row, loss[i] =
// log-sum-exp - logit[label] (in double), correct[i] = arg-max (first
// maximum) == label, and dlogits (if non-null) = (softmax - onehot) * scale.
// A label outside [0, classes) sets bad_label[0] = 1 and bad_label[1] = the
// label (both untouched otherwise) and zeroes that row's outputs.
void softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t n, int64_t classes,
                           float scale, float* dlogits, double* loss, int32_t* correct,
                           int32_t* bad_label, cudaStream_t stream);

// v = momentum * v + g * grad_scale + weight_decay * w; w -= lr * v.
void sgd_update(float* w, const float* g, float* v, int64_t count, float lr, float momentum,
                float weight_decay, float grad_scale, cudaStream_t stream);

// Batch-norm statistics: cuDNN keeps 1 / sqrt(var + eps), the Backend
// contract the variance itself.
void inverse_std_to_variance(const float* inv_std, float* var, int64_t count, float eps,
                             cudaStream_t stream);
void variance_to_inverse_std(const float* var, float* inv_std, int64_t count, float eps,
                             cudaStream_t stream);

// Synchronised batch norm on plain NCHW {n, c, h*w} (see Backend). Per
// channel, in double: sums[c] = sum of x and sums[c + C] = sum of x^2; or,
// with xhat = (x - mean) / sqrt(var + eps), sum of dy and sum of dy * xhat.
void batch_norm_sums(const float* x, int64_t n, int64_t c, int64_t hw, double* sums,
                     cudaStream_t stream);
void batch_norm_backward_sums(const float* x, const float* dy, const float* mean,
                              const float* var, float eps, int64_t n, int64_t c, int64_t hw,
                              double* sums, cudaStream_t stream);
// dx = gamma / sqrt(var + eps) * (dy - dy_means[c] - xhat * dy_means[C + c]).
void batch_norm_backward_data(const float* x, const float* dy, const float* gamma,
                              const float* mean, const float* var, const float* dy_means,
                              float eps, int64_t n, int64_t c, int64_t hw, float* dx,
                              cudaStream_t stream);

}  // namespace vtrain::worker::cuda
