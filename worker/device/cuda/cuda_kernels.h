// The CUDA kernels of the backend: the ops no library provides (layout and
// element-type conversions, fills, elementwise sums, strided channel
// copies, softmax cross-entropy, SGD, batch-norm statistics, the f32 bias
// gradient of half tensors) and those cuDNN provides slowly (relu, and max
// pooling over tiling windows; the bias in NHWC). Each function enqueues one kernel on
// `stream` and throws BackendError if the launch fails; a zero count
// enqueues nothing. Internal to worker/device/cuda.
//
// Element types: an `Element` argument says what the `void` pointers next
// to it hold (f32, bf16 or f16); the kernels read every type into float,
// compute in float (double where noted) and round once to the stored type
// (to nearest even). `float*` arguments are always f32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace vtrain::worker::cuda {

// The revision of these kernels, part of the backend's library version
// (DeviceInfo::library_version, "cuDNN 9.19.0, kernels r2"), so that a perf
// DB keeps measurements per revision: raise it when a kernel change moves a
// profiled time or a convolution's workspace (r2: the two-pass bias
// gradient, whose partial sums take workspace, relu, tiled max pooling).
inline constexpr int kKernelRevision = 2;

// common::Element's element types, for the kernels: this header is
// compiled by nvcc as C++17, below what common/precision.h needs
// (cuda_backend_impl.h's element() maps one to the other).
enum class Element : uint8_t { kF32, kBF16, kF16 };

// A 4-D tensor's logical shape and its channel block (1 = plain NCHW,
// 8 / 16 = nChw8c / nChw16c with zero-padded channels, c = NHWC:
// worker::channel_block).
struct BlockedShape {
  int64_t n = 1, c = 1, h = 1, w = 1;
  int64_t block = 1;
  int64_t storage_elements() const { return n * ((c + block - 1) / block * block) * h * w; }
};

// dst = src with a layout and element-type change (either or both);
// padding channels of dst become 0. src has dst_shape's logical shape.
void reorder(Element src_type, const void* src, int64_t src_block, Element dst_type, void* dst,
             const BlockedShape& dst_shape, cudaStream_t stream);
// Every element = value (rounded to the type), padding channels = 0.
void fill(Element type, void* dst, const BlockedShape& shape, float value, cudaStream_t stream);

// y = a + b over count elements of `type`; y may alias a or b.
void add(Element type, const void* a, const void* b, void* y, int64_t count,
         cudaStream_t stream);
// y = x + bias per channel over {n, c, hw} of `type` (NCHW, or NHWC where
// channels_last), in float, rounded once, and with `relu` relu of that; y
// may alias x: a convolution's bias in NHWC, where cudnnAddTensor is slow,
// and a bias paired with the relu after it (Backend::bias_relu_forward).
void add_bias(Element type, const void* x, void* y, const void* bias, int64_t n, int64_t c,
              int64_t hw, bool channels_last, bool relu, cudaStream_t stream);
// y = x + beta * y over count elements, x of x_type and y of y_type (a half
// x into an f32 y: a half convolution's weight gradient); beta = 0 never
// reads y.
void accumulate(Element x_type, const void* x, Element y_type, void* y, float beta,
                int64_t count, cudaStream_t stream);
// x *= alpha over count floats.
void scale(float* x, float alpha, int64_t count, cudaStream_t stream);
// *flag = 1 when any of x[0, count) is infinite or NaN (flag left as is otherwise).
void flag_non_finite(const float* x, int64_t count, int32_t* flag, cudaStream_t stream);

// For each of `rows` rows: dst[row * dst_pitch + i] = src[row * src_pitch + i]
// + beta * dst[...] for i < row_length (pitches and lengths in elements of
// `type`); beta = 0 never reads dst.
void copy_rows(Element type, const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch,
               int64_t rows, int64_t row_length, float beta, cudaStream_t stream);

// Softmax cross-entropy over n rows of `classes` logits of `type`: per row,
// loss[i] = log-sum-exp - logit[label] (in double), correct[i] = arg-max
// (first maximum) == label, and dlogits (if non-null, of `type`) =
// (softmax - onehot) * scale. A label outside [0, classes) sets
// bad_label[0] = 1 and bad_label[1] = the label (both untouched otherwise)
// and zeroes that row's outputs.
// With label smoothing (`smoothing`) the target is (1 - smoothing) * onehot
// + smoothing / classes, in the loss and in dlogits (Backend's contract).
void softmax_cross_entropy(Element type, const void* logits, const int32_t* labels, int64_t n,
                           int64_t classes, float scale, float smoothing, void* dlogits,
                           double* loss, int32_t* correct, int32_t* bad_label,
                           cudaStream_t stream);

// The optimizers' updates (worker/device/backend.h: SgdStep, AdamWStep;
// adamw_update takes AdamWFactors' values) and an exponential moving average.
void sgd_update(float* w, const float* g, float* v, int64_t count, float lr, float momentum,
                float weight_decay, float grad_scale, bool nesterov, cudaStream_t stream);
void adamw_update(float* w, const float* g, float* m, float* v, int64_t count, float beta1,
                  float beta2, float eps, float grad_scale, float decay, float step_size,
                  float sqrt_correction2, cudaStream_t stream);
void moving_average(float* average, const float* x, int64_t count, float decay,
                    cudaStream_t stream);

// Sums of squares of x over `segments` segments [offsets[i], offsets[i + 1])
// (offsets: device memory), in double: segment i's kSumSquaresBlocks
// partial sums land in partials[i * kSumSquaresBlocks ...], each in a fixed
// order; the caller adds them in order.
inline constexpr int64_t kSumSquaresBlocks = 64;
void sum_squares(const float* x, const int64_t* offsets, int64_t segments, double* partials,
                 cudaStream_t stream);

// Batch-norm statistics: cuDNN keeps 1 / sqrt(var + eps), the Backend
// contract the variance itself.
void inverse_std_to_variance(const float* inv_std, float* var, int64_t count, float eps,
                             cudaStream_t stream);
void variance_to_inverse_std(const float* var, float* inv_std, int64_t count, float eps,
                             cudaStream_t stream);

// Per-channel sums (channel_sum_grid.h: two passes, no atomics, the same
// result every run) need `partials`, device memory of the bytes the
// *_partial_bytes function gives for the same arguments; it may be reused
// once the call's work on `stream` is done.
//
// Synchronised batch norm on {n, c, h*w} of `type`, NCHW or (channels_last)
// NHWC (see Backend). Per channel, in double: sums[c] = sum of x and
// sums[c + C] = sum of x^2; or, with xhat = (x - mean) / sqrt(var + eps),
// sum of dy and sum of dy * xhat.
int64_t batch_norm_sum_partial_bytes(int64_t n, int64_t c, int64_t hw, bool channels_last);
void batch_norm_sums(Element type, const void* x, int64_t n, int64_t c, int64_t hw,
                     bool channels_last, double* sums, void* partials, cudaStream_t stream);
void batch_norm_backward_sums(Element type, const void* x, const void* dy, const float* mean,
                              const float* var, float eps, int64_t n, int64_t c, int64_t hw,
                              bool channels_last, double* sums, void* partials,
                              cudaStream_t stream);
// dx = gamma / sqrt(var + eps) * (dy - dy_means[c] - xhat * dy_means[C + c]).
void batch_norm_backward_data(Element type, const void* x, const void* dy, const float* gamma,
                              const float* mean, const float* var, const float* dy_means,
                              float eps, int64_t n, int64_t c, int64_t hw, bool channels_last,
                              void* dx, cudaStream_t stream);

// The bias gradient of dy {n, c, hw} of `type` (NCHW, or NHWC where
// channels_last) into f32: per channel, dbias[c] = sum of dy (in float) +
// beta * dbias[c]; beta = 0 never reads dbias.
int64_t bias_gradient_partial_bytes(int64_t n, int64_t c, int64_t hw, bool channels_last);
void bias_gradient(Element type, const void* dy, int64_t n, int64_t c, int64_t hw,
                   bool channels_last, float* dbias, float beta, void* partials,
                   cudaStream_t stream);

// relu_backward over {n, c, hw} and, in one pass, the bias gradient of the
// dx it writes into f32 dbias (overwritten), as bias_gradient would sum it;
// partials as bias_gradient_partial_bytes gives. dx may alias dy.
void relu_backward_bias(Element type, const void* y, const void* dy, void* dx, int64_t n,
                        int64_t c, int64_t hw, bool channels_last, float* dbias, void* partials,
                        cudaStream_t stream);

// relu over `count` elements of `type` in any layout (relu(0) = 0 keeps
// padding zero): y = x <= 0 ? 0 : x, and dx = y <= 0 ? 0 : dy (y > 0
// exactly where x > 0), so a NaN propagates. y may alias x, dx dy. cuDNN's activation ran at a
// fifth of the memory's speed on NHWC half tensors (VGG-16's relu1_1: 0.49
// ms forward at batch 64 on an H200).
void relu_forward(Element type, const void* x, void* y, int64_t count, cudaStream_t stream);
void relu_backward(Element type, const void* y, const void* dy, void* dx, int64_t count,
                   cudaStream_t stream);
enum class Activation : int;  // kernel_bodies.h

// silu, gelu, sigmoid or relu6 (kernel_bodies.h: Activation) over `count`
// elements of `type` in any layout: y = f(x), and dx = dy * f'(x) (dx may
// alias dy), in float, rounded once.
void activation_forward(Activation a, Element type, const void* x, void* y, int64_t count,
                        cudaStream_t stream);
void activation_backward(Activation a, Element type, const void* x, const void* dy, void* dx,
                         int64_t count, cudaStream_t stream);

// The mul layer's products (kernel_bodies.h: mul_at, mul_sum_partial) over
// `shape` {n, c, h, w} of `type` in channel block shape.block (padding
// channels of the output become 0), in float, rounded once:
// mul: y = a * b + beta * y, a in y's layout; b in it too where b_block is
// 0, else b is {n, c, 1, 1} with channel block b_block, broadcast over h, w.
// mul_sum: y[n, c] = the sum over h, w of a * b + beta * y, a and b in one
// layout, y {n, c, 1, 1} with channel block y_block; a warp or block per
// (n, c) group, in a fixed order (the same bits every run).
void mul(Element type, const void* a, const void* b, int64_t b_block, void* y, float beta,
         const BlockedShape& shape, cudaStream_t stream);
void mul_sum(Element type, const void* a, const void* b, void* y, int64_t y_block, float beta,
             const BlockedShape& shape, cudaStream_t stream);

struct DropoutCall;  // dropout_body.h

// Dropout (DropoutDesc) of a tensor of `shape` (any channel block; padding
// channels become 0) of `type`: out = in * keep * scale, the mask drawn per
// element from `call`'s key in logical C x H x W order; out may alias in.
void dropout(Element type, const void* in, void* out, const BlockedShape& shape,
             const DropoutCall& call, cudaStream_t stream);

// Max pooling where the windows tile x {n, c, h, w} of `type` (NCHW, or
// NHWC where channels_last): kernel = stride, no padding, h and w multiples
// of the kernel; y and dy {n, c, h / kh, w / kw} in x's layout. Each window
// selects its first maximum in row-major order (the reference's tie rule;
// its first NaN, if any, so that NaN propagates): forward writes it to y,
// backward writes dy there and 0 to the rest of dx. cuDNN's NHWC pooling
// backward ran about 18x slower than its bytes need on an H100 (VGG-16's
// pool1: 6.2 ms), its forward at about a ninth of the memory's speed on an
// H200 (0.49 ms for 257 MB).
void max_pool_forward_tiled(Element type, const void* x, void* y, int64_t n, int64_t c, int64_t h,
                            int64_t w, int64_t kh, int64_t kw, bool channels_last,
                            cudaStream_t stream);
void max_pool_backward_tiled(Element type, const void* x, const void* dy, void* dx, int64_t n,
                             int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                             bool channels_last, cudaStream_t stream);

}  // namespace vtrain::worker::cuda
