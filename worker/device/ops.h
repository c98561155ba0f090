// The ops half of the device interface: every op a backend runs, described
// by a value. One descriptor struct per op family says WHAT is computed
// (its kind, the TensorDescs with shapes, types and layouts, attributes
// such as a fused bias, the algorithm); the family's Args struct says
// WHERE (the buffers of one call). Backend::supports(), scratch_bytes()
// and run() (backend.h) take them; each backend keeps a table of its
// kernels keyed by the descriptor's type.
//
// Contract for every op:
//  - Activation buffers hold their TensorDesc's layout; ops accept any
//    Layout for activations (they convert internally where an
//    implementation needs another one, inside the scratch it reported).
//    Exceptions, always kPlain: weights and their gradients, inner-product
//    outputs and their gradients, and softmax logits (all {n, c, 1, 1});
//    Device::preferred_layout() is for image-shaped activations.
//  - Element types (train.precision, common/precision.h): activations and
//    their gradients are f32 or the job's half type (TensorDesc::dtype),
//    one type for all the tensors of a call. Weights and biases an op reads
//    (`const void*` in Args) are in that type too (the network's compute
//    copy of its fp32 master weights). Always f32: weight and bias
//    gradients (dw, dbias), batch norm's scale_shift, statistics and sums,
//    the loss, and the optimizers' arrays. A backend that cannot run a type
//    says so in supports() (Device::precision_unavailable()); run() then
//    throws for it.
//  - Ops run on the compute stream in issue order. On return the work is
//    enqueued, not necessarily done: synchronize() or an event makes it
//    visible to the host. Ops that return host values (LossStats, sums,
//    all_finite) synchronise.
//  - Failures throw vtrain::worker::BackendError with the op and the shapes.
//
// Adding an op (docs/architecture.md, "Adding an op"): a descriptor kind or
// attribute here (a new family: a Desc/Args pair and an entry in OpDesc and
// OpArgs), each backend's kernel, its layer, its conformance case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/conv_kind.h"
#include "worker/device/dropout_draw.h"
#include "worker/device/tensor.h"

namespace vtrain::worker {

// Which way an op with a forward and a backward runs.
enum class Direction : uint8_t { kForward, kBackward };

// The window of a convolution or a pooling: one geometry, one set of names.
struct Window {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;

  // The output of this window over `x` with `channels` channels.
  Shape output_shape(const Shape& x, int64_t channels) const;
  bool operator==(const Window&) const = default;
};

// ---------------------------------------------------------------- convolution

// The kernels of a convolution (common/conv_kind.h: one enum for the device,
// the perf DB and plans).
using common::ConvKind;
using common::conv_kind_name;

// Backend-specific algorithm id; Backend::conv_algorithms() lists the valid
// ones and conv_algorithm_name() names them (names are stable: the perf DB
// keys on them).
using ConvAlgo = int;

// A convolution algorithm offered in several compute configurations (the
// CUDA backend, as mu-cuDNN offers cuDNN's) is named for each, so that the
// profiler times them and WR / WD choose among all:
//   "<name>/tf32"         f32 tensors on TF32 tensor cores (train.precision tf32)
//   "<name>/pseudo_half"  f16 tensors, f32 compute (cuDNN's PSEUDO_HALF; fp16)
//   "<name>/true_half"    f16 tensors, f16 compute (cuDNN's TRUE_HALF; fp16)
//   "<name>/pseudo_bf16"  bf16 tensors, f32 compute (cuDNN's PSEUDO_BFLOAT16; bf16)
// An unsuffixed name computes as its tensors' type says (or, for the CPU
// backend's bf16 algorithms, accumulates in f32 as oneDNN does).
inline constexpr std::string_view kTf32AlgorithmSuffix = "/tf32";
inline constexpr std::string_view kPseudoHalfAlgorithmSuffix = "/pseudo_half";
inline constexpr std::string_view kTrueHalfAlgorithmSuffix = "/true_half";
inline constexpr std::string_view kPseudoBf16AlgorithmSuffix = "/pseudo_bf16";
// Whether the name is one of cuDNN's graph-API engine configurations
// ("eng<index>...", offered under conv.cudnn_graph).
bool is_graph_engine(std::string_view name);
// Whether a job in train.precision `p` that offers graph engines or not
// (conv.cudnn_graph) runs the algorithm named `name` (the perf DB holds
// every precision's and setting's algorithms side by side): a suffixed one
// only under the precision its suffix is for, the others under every
// precision; a graph engine only where they are offered.
bool conv_algorithm_allowed(std::string_view name, common::Precision p,
                            bool graph_engines = false);

// The geometry of one convolution (dilation 1). x.shape.n is the
// (micro-)batch. With `groups` > 1 the input and output channels fall into
// that many groups, output channel o reading only the input channels of its
// group o / (k / groups) (depthwise: groups = x.shape.c); groups divides
// both channel counts.
struct ConvProblem {
  TensorDesc x;     // input (backward data: dx)
  TensorDesc y;     // output (backward: dy); shape must equal output_shape()
  int64_t k = 1;    // output channels
  Window window;    // filter height and width, strides, padding
  int64_t groups = 1;

  // {k, c / groups, kernel_h, kernel_w}: group g's filters are the rows
  // g * k / groups onwards (OIHW, which is oneDNN's goihw byte for byte).
  Shape weight_shape() const {
    return {k, x.shape.c / groups, window.kernel_h, window.kernel_w};
  }
  Shape output_shape() const { return window.output_shape(x.shape, k); }
  // The same problem at another batch size (for micro-batches).
  ConvProblem with_batch(int64_t n) const;
  std::string str() const;  // for error messages and keys; names groups > 1
  // Why a backend cannot run this problem whatever its algorithm (y's
  // shape not output_shape(), groups not dividing both channel counts),
  // naming the problem; empty when it is well formed.
  std::string geometry_error() const;
  bool operator==(const ConvProblem&) const = default;
};

struct ConvAlgoInfo {
  ConvAlgo algo = 0;
  std::string name;
  size_t workspace_bytes = 0;  // what a call with this algorithm needs
};

// One convolution kernel:
//   kForward:        y = conv(x, w) (+ bias[k] if bias) + beta * y
//   kBackwardData:   dx = conv_transpose(dy, w) + beta * dx
//   kBackwardFilter: dw = corr(x, dy) + beta * dw, and if bias
//                    dbias = sum(dy) + beta * dbias (f32)
// beta is 0 or 1 (1: micro-batches accumulate). The workspace is the
// caller's (scratch_bytes() of this descriptor; conv_algorithms() lists it
// per algorithm), not the backend's scratch. `bias` is the convolution's
// epilogue (oneDNN's post-ops): the fusion pass (worker/engine/fusion_pass.h)
// clears it where the bias runs in the next op instead (ActivationDesc::bias).
struct ConvDesc {
  ConvKind kind = ConvKind::kForward;
  ConvProblem problem;
  ConvAlgo algo = 0;
  float beta = 0.0f;
  bool bias = false;
};
struct ConvArgs {
  const void* x = nullptr;     // forward, backward filter
  const void* w = nullptr;     // forward, backward data: weight_shape() plain
  const void* bias = nullptr;  // forward with bias: k elements
  void* y = nullptr;           // forward
  const void* dy = nullptr;    // backward
  void* dx = nullptr;          // backward data
  float* dw = nullptr;         // backward filter
  float* dbias = nullptr;      // backward filter with bias
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// ----------------------------------------------------------------- activation

// The activation functions:
//   kRelu     max(x, 0)
//   kSilu     x * sigmoid(x)
//   kGelu     x * Phi(x), Phi the standard normal CDF (the erf form)
//   kSigmoid  1 / (1 + exp(-x))
//   kRelu6    min(max(x, 0), 6); its derivative is 1 on (0, 6), else 0
//             (PyTorch's; at exactly 6 a backend may pass dy)
enum class ActivationKind : uint8_t { kRelu, kSilu, kGelu, kSigmoid, kRelu6 };
// "relu", "silu", "gelu", "sigmoid", "relu6".
const char* activation_name(ActivationKind kind);

// Forward: y = act(x), or with `bias` (relu only) y = act(x + bias[c]) (the
// bias in x's type, rounded to it once as a bias add would round; y not
// aliasing x). Backward: dx = dy * act'(x): relu reads y (dy where y > 0,
// else 0; dx may alias dy), the other kinds read x. With `bias` also
// dbias[c] = the sum of dx over n, h and w, in f32, overwritten (the bias
// gradient of the convolution before it). Each tensor has its descriptor
// (forward x and y; backward dy, dx and y for relu, x for the others), and
// they must agree: the backend names any difference. The bias-paired form
// is the fusion pass's alternative to a convolution's bias epilogue.
struct ActivationDesc {
  ActivationKind kind = ActivationKind::kRelu;
  Direction direction = Direction::kForward;
  TensorDesc x, y, dy, dx;
  bool bias = false;
};
struct ActivationArgs {
  const void* x = nullptr;     // forward; backward of every kind but relu
  void* y = nullptr;           // forward: written; backward: read
  const void* dy = nullptr;    // backward
  void* dx = nullptr;          // backward
  const void* bias = nullptr;  // forward with bias: c elements
  float* dbias = nullptr;      // backward with bias: c floats
};

// -------------------------------------------------------------------- pooling

enum class PoolKind { kMax, kAverage };  // average excludes padding

// Forward: y = pool(x) over the window, leaving `state` (scratch_bytes()'s
// state: a max pool's indices, 0 bytes where none) for the backward.
// Backward: dx from dy, x, y and the forward's state (dx shaped as x, dy
// as y; backward only).
struct PoolDesc {
  PoolKind kind = PoolKind::kMax;
  Direction direction = Direction::kForward;
  TensorDesc x, y;
  Window window{2, 2, 2, 2, 0, 0};
  TensorDesc dy, dx;
};
struct PoolArgs {
  const void* x = nullptr;
  void* y = nullptr;         // forward: written; backward: read
  const void* dy = nullptr;  // backward
  void* dx = nullptr;        // backward
  void* state = nullptr;     // written forward, read backward (caller memory)
};

// -------------------------------------------------------------- inner product

enum class InnerProductKind : uint8_t { kForward, kBackwardData, kBackwardWeights };

// With w {out, x.c, x.h, x.w} plain and y {x.n, out, 1, 1} plain:
//   kForward:         y[n, o] = sum_i x[n, i] w[o, i] (+ b[o] if bias)
//   kBackwardData:    dx = dy w (dx has x's descriptor, dy y's)
//   kBackwardWeights: dw = dy^T x + beta * dw; if bias dbias = sum_n dy + beta * dbias
struct InnerProductDesc {
  InnerProductKind kind = InnerProductKind::kForward;
  TensorDesc x, y;
  bool bias = false;
  float beta = 0.0f;  // backward weights: 0 or 1
};
struct InnerProductArgs {
  const void* x = nullptr;     // forward, backward weights
  const void* w = nullptr;     // forward, backward data
  const void* bias = nullptr;  // forward with bias
  void* y = nullptr;           // forward
  const void* dy = nullptr;    // backward
  void* dx = nullptr;          // backward data
  float* dw = nullptr;         // backward weights
  float* dbias = nullptr;      // backward weights with bias
};

// ----------------------------------------------------------------- batch norm

enum class BatchNormKind : uint8_t {
  // y = normalised x; saves the batch mean/variance for backward and
  // updates running = (1 - momentum) * running + momentum * batch (unbiased var).
  kForwardTraining,
  // y = normalised x with given statistics (running ones, or a split
  // batch's global ones: synchronised batch norm).
  kForwardInference,
  // dx, and d(scale_shift) = computed + beta * d(scale_shift).
  kBackward,
  // Synchronised batch norm (the statistics of a batch split over ranks,
  // from per-rank sums the caller adds up across ranks between calls).
  // Per channel c of x, over N, H, W, accumulated in double: sums[c] = sum
  // of x, sums[C + c] = sum of x^2. 2C values.
  kSums,
  // Per channel, with xhat = (x - mean) / sqrt(var + eps): sums[c] = sum of
  // dy, sums[C + c] = sum of dy * xhat (d beta and d gamma of this batch).
  kBackwardSums,
  // dx = gamma / sqrt(var + eps) * (dy - dy_means[c] - xhat * dy_means[C + c]),
  // dy_means the global batch's mean of dy and of dy * xhat per channel.
  kBackwardData,
};

// Batch normalisation over N, H, W per channel. scale_shift holds gamma[C]
// then beta[C]. Each tensor a kind uses has its descriptor (forward x and
// y; kBackward and kBackwardData x, dy and dx; kBackwardSums x and dy;
// kSums x), and they must agree.
struct BatchNormDesc {
  BatchNormKind kind = BatchNormKind::kForwardTraining;
  TensorDesc x;
  float eps = 1e-5f;
  float momentum = 0.1f;  // forward training
  float beta = 0.0f;      // backward: 0 or 1
  TensorDesc y, dy, dx;
};
struct BatchNormArgs {
  const void* x = nullptr;
  void* y = nullptr;                 // forward
  const void* dy = nullptr;          // backward kinds
  void* dx = nullptr;                // kBackward, kBackwardData
  const float* scale_shift = nullptr;
  float* mean = nullptr;             // training: saved; else read (C floats)
  float* var = nullptr;              // training: saved; else read (C floats)
  float* running_mean = nullptr;     // training: updated
  float* running_var = nullptr;      // training: updated
  float* dscale_shift = nullptr;     // kBackward
  const float* dy_means = nullptr;   // kBackwardData: 2C floats of device memory
  std::vector<double>* sums = nullptr;  // kSums, kBackwardSums: the host result
};

// ---------------------------------------------------------------- elementwise

// kAdd: y = a + b (any layouts; y may alias a or b).
// kAccumulate: y = a + beta * y, for accumulating the gradients of tensors
// with several consumers (b is y's descriptor).
// kMul: y = a * b + beta * y, y shaped like a. b is shaped like a, or
//   {a.n, a.c, 1, 1}: one factor per sample and channel, broadcast over H
//   and W (squeeze-excitation's gate). Any layouts; with beta 0, y may
//   alias a. The mul layer's backward is this kind too: da = dy * b, and
//   db = dy * a where b is shaped like a.
// kMulSum: y[n, c] = the sum over h and w of a * b, + beta * y: a and b
//   shaped alike, y {a.n, a.c, 1, 1} (any layouts). The gradient of a
//   broadcast factor, db = sum of dy * a; summed in f32, rounded once.
// The products are in f32, rounded once to the tensors' type.
enum class BinaryKind : uint8_t { kAdd, kAccumulate, kMul, kMulSum };
// "add", "accumulate", "mul", "mul_sum".
const char* binary_name(BinaryKind kind);
struct BinaryDesc {
  BinaryKind kind = BinaryKind::kAdd;
  TensorDesc a, b, y;
  float beta = 0.0f;  // kAccumulate, kMul, kMulSum: 0 or 1
};
struct BinaryArgs {
  const void* a = nullptr;
  const void* b = nullptr;  // kAdd, kMul, kMulSum
  void* y = nullptr;
};

// ---------------------------------------------------------------------- concat

// Channel concatenation (spatial sizes match). Forward: y = the xs one after
// another. Backward: dx = channels [channel_offset, channel_offset + dx.c)
// of dy + beta * dx, one input's share (each input may need its own beta);
// xs then holds that one input's descriptor, y dy's. scratch_bytes() of the
// forward descriptor covers the backward of each input's slice too.
struct ConcatDesc {
  Direction direction = Direction::kForward;
  std::vector<TensorDesc> xs;
  TensorDesc y;
  int64_t channel_offset = 0;  // backward
  float beta = 0.0f;           // backward: 0 or 1
};
struct ConcatArgs {
  std::span<void* const> xs;  // forward: the inputs
  void* y = nullptr;          // forward
  const void* dy = nullptr;   // backward
  void* dx = nullptr;         // backward
};

// --------------------------------------------------------------------- dropout

// Inverted dropout with its mask computed on the device from the key
// (worker/device/dropout_draw.h), never stored: element e (in logical
// C x H x W order, whatever the layout) of sample s of the call is kept
// when its draw under (key, first_sample + s) clears p, so the backward,
// a recomputation, a resume and another rank's share of the batch all see
// the forward's mask and the op keeps no state.
//   kForward:  y = x * keep * scale
//   kBackward: dx = dy * keep * scale
// scale = 1 / (1 - p); a dropped element is 0 (whatever its input), a kept
// one is its input times scale in float, rounded once. One descriptor, x,
// describes both tensors of a call (forward x and y, backward dy and dx);
// the output may alias the input. No scratch.
struct DropoutDesc {
  Direction direction = Direction::kForward;
  TensorDesc x;
  float p = 0.5f;            // in [0, 1), else run() throws
  DropoutKey key;            // seed, step, layer
  int64_t first_sample = 0;  // the global batch index of the call's sample 0
};
struct DropoutArgs {
  const void* x = nullptr;   // forward
  void* y = nullptr;         // forward
  const void* dy = nullptr;  // backward
  void* dx = nullptr;        // backward
};

// -------------------------------------------------------------------- the loss

struct LossStats {
  double loss_sum = 0.0;  // sum over samples of -log softmax(logits)[label]
  int64_t correct = 0;    // samples whose arg-max equals the label
};

// Softmax cross-entropy over logits {n, classes, 1, 1}. labels are device
// int32 in [0, classes). With label smoothing s the target is
// q = (1 - s) * onehot + s / classes: the loss of a sample is
// -sum_j q[j] log softmax[j], and if gradient dlogits = (softmax - q) * scale.
// Writes the loss sum and arg-max hits over the n samples (synchronises).
struct SoftmaxCrossEntropyDesc {
  TensorDesc logits;
  bool gradient = false;  // dlogits has logits' descriptor
  float scale = 1.0f;
  float label_smoothing = 0.0f;
};
struct SoftmaxCrossEntropyArgs {
  const void* logits = nullptr;
  const int32_t* labels = nullptr;
  void* dlogits = nullptr;
  LossStats* stats = nullptr;  // host result
};

// ---------------------------------------------- optimizers and reductions
// Elementwise over `count` floats of device memory; the state (velocity, m,
// v, averages) is the caller's, kept between steps.

// One step of SGD with momentum, torch.optim.SGD's form (dampening 0):
// d = g * grad_scale + weight_decay * w; v = momentum * v + d; then
// w -= lr * v, or with nesterov w -= lr * (d + momentum * v).
struct SgdStep {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;    // loss scaling's 1/S: the gradients were computed scaled by S
  bool nesterov = false;
};

// One step of AdamW, torch.optim.AdamW's form (amsgrad off): with
// d = g * grad_scale, w *= 1 - lr * weight_decay (decoupled decay);
// m = beta1 * m + (1 - beta1) * d; v = beta2 * v + (1 - beta2) * d^2;
// w -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
struct AdamWStep {
  float lr = 0.001f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  int64_t step = 1;  // updates taken, this one included (>= 1): the bias corrections'
};

// AdamWStep's factors, computed once per step in double and then rounded,
// the same for every backend: decay = 1 - lr * weight_decay, step_size =
// lr / (1 - beta1^step), sqrt_correction2 = sqrt(1 - beta2^step).
struct AdamWFactors {
  float decay = 1.0f;
  float step_size = 0.0f;
  float sqrt_correction2 = 1.0f;
};
AdamWFactors adamw_factors(const AdamWStep& step);

// SgdStep above.
struct SgdDesc {
  int64_t count = 0;
  SgdStep step;
};
struct SgdArgs {
  float* w = nullptr;
  const float* g = nullptr;
  float* velocity = nullptr;
};

// AdamWStep above.
struct AdamWDesc {
  int64_t count = 0;
  AdamWStep step;
};
struct AdamWArgs {
  float* w = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
};

// average += (1 - decay) * (x - average): one step of an exponential
// moving average of x.
struct MovingAverageDesc {
  int64_t count = 0;
  float decay = 0.0f;
};
struct MovingAverageArgs {
  float* average = nullptr;
  const float* x = nullptr;
};

// x *= alpha.
struct ScaleDesc {
  int64_t count = 0;
  float alpha = 1.0f;
};
struct ScaleArgs {
  float* x = nullptr;
};

// The sum of squares of each segment [offsets[i], offsets[i + 1]) of x, in
// double and in an order fixed by the segment alone (the same bits on every
// call, whatever the threads): gradient and weight norms. segments + 1 offsets.
struct SumSquaresDesc {
  size_t segments = 0;
};
struct SumSquaresArgs {
  const float* x = nullptr;
  std::span<const int64_t> offsets;
  std::vector<double>* sums = nullptr;  // host result: `segments` values
};

// Whether none of `count` floats is infinite or NaN (loss scaling's
// overflow check).
struct AllFiniteDesc {
  int64_t count = 0;
};
struct AllFiniteArgs {
  const float* x = nullptr;
  bool* finite = nullptr;  // host result
};

// ---------------------------------------------------------------- every op

// An op as a value: what supports(), scratch_bytes() and run() take.
using OpDesc = std::variant<ConvDesc, ActivationDesc, PoolDesc, InnerProductDesc, BatchNormDesc,
                            BinaryDesc, ConcatDesc, SoftmaxCrossEntropyDesc, SgdDesc, AdamWDesc,
                            MovingAverageDesc, ScaleDesc, SumSquaresDesc, AllFiniteDesc,
                            DropoutDesc>;
// The buffers of one call, alternative for alternative with OpDesc.
using OpArgs = std::variant<ConvArgs, ActivationArgs, PoolArgs, InnerProductArgs, BatchNormArgs,
                            BinaryArgs, ConcatArgs, SoftmaxCrossEntropyArgs, SgdArgs, AdamWArgs,
                            MovingAverageArgs, ScaleArgs, SumSquaresArgs, AllFiniteArgs,
                            DropoutArgs>;

// What scratch_bytes() of a descriptor returns.
struct OpBytes {
  // Device memory one call needs besides its buffers, with either beta,
  // training or inference: the backend's scratch (Device::reserve_scratch),
  // or, for a convolution, the caller's workspace.
  size_t scratch = 0;
  // Caller memory a forward leaves for its backward (a max pool's
  // indices: PoolArgs::state); 0 for the other ops.
  size_t state = 0;
};

// The op's name and kind for messages: "conv BackwardData", "relu forward
// (bias)", "batch_norm training", "sgd".
std::string op_name(const OpDesc& op);

}  // namespace vtrain::worker
