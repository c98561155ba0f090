// The device interface: everything the engine, the memory part and the
// profiler need from a device, and nothing vendor-specific.
//
// Implementations: worker/device/cpu (oneDNN; the "device" is host memory behind a
// byte counter, the memory stream a background thread) and worker/device/cuda
// (cuDNN/cuBLAS, two CUDA streams), chosen by make_backend() only.
//
// Contract for every op below:
//  - Tensors are views into memory from allocate_device(); descriptors carry
//    the layout, and ops accept any Layout for activations (they convert
//    internally where an implementation needs another one, inside the
//    workspace it reported). Exceptions, always kPlain: weights and their
//    gradients, inner-product outputs and their gradients, and softmax
//    logits (all {n, c, 1, 1}); preferred_layout() is for image-shaped
//    activations.
//  - Element types (train.precision, common/precision.h): activations and
//    their gradients are f32 or the job's half type (TensorDesc::dtype),
//    one type for all the tensors of a call. Weights and biases passed as
//    `const void*` to the forward and backward-data ops are in that type
//    too (the network's compute copy of its fp32 master weights). Always
//    f32: weight and bias gradients (dw, dbias), batch norm's scale_shift,
//    statistics and sums, the loss, and the optimizer's arrays.
//    upload/download/convert/fill convert between floats and a tensor's
//    type. A backend that cannot run a type says so in
//    precision_unavailable(); its ops then throw for tensors of it.
//  - Ops run on the compute stream in issue order. On return the work is
//    enqueued, not necessarily done: synchronize() or an event makes it
//    visible to the host. (The CPU backend's compute stream is synchronous.)
//  - Failures throw vtrain::worker::BackendError with the op and the shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <array>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/compute_settings.h"
#include "common/conv_kind.h"
#include "common/precision.h"
#include "worker/device/tensor.h"

namespace vtrain::worker {

class BackendError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a rank tells the others (and the perf DB) about its device.
struct DeviceInfo {
  std::string backend;          // "cpu" or "cuda"
  std::string name;             // CPU model name or GPU name
  size_t memory_bytes = 0;      // device memory capacity the backend will serve
  int threads = 1;              // CPU threads used (1 for CUDA)
  std::string library_version;  // "oneDNN 2.6.3" or "cuDNN 9.x.y, kernels rN" (cuda_kernels.h)
  std::string host;             // hostname
  std::string device_key;       // a GPU's UUID ("GPU-" and 32 hex digits; "" on the CPU):
                                // ranks with the same key share the device
  std::vector<int> cpus;        // CPU: the CPUs this process may run on when only
                                // some of the host's (empty: every one; on GPUs)
};

// ---------------------------------------------------------------- convolution

// The kernels of a convolution (common/conv_kind.h: one enum for the device,
// the perf DB and plans).
using common::ConvKind;
using common::conv_kind_name;

// Argument checks every backend makes alike; they throw BackendError naming
// `backend` ("cpu backend") and the op.
void check_beta(const char* backend, const char* op, float beta);  // beta is 0 or 1
// The tensors of one call share an element type.
void check_same_dtype(const char* backend, const char* op,
                      std::initializer_list<TensorDesc> tensors);
// The named tensors of one call have one descriptor; else the message
// names what differs, e.g. "cpu backend: relu_forward: x is bf16, y is f32"
// (element type, shape and layout, each difference named).
void check_same_desc(const char* backend, const char* op,
                     std::initializer_list<std::pair<const char*, TensorDesc>> tensors);
// concat_backward's slice: dx fits dy at `channel_offset` (same n, h, w).
void check_concat_slice(const Shape& dy, int64_t channel_offset, const Shape& dx);

// Backend-specific algorithm id; conv_algorithms() lists the valid ones and
// conv_algorithm_name() names them (names are stable: the perf DB keys on them).
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

// One convolution (groups = 1, dilation = 1). x.shape.n is the (micro-)batch.
struct ConvProblem {
  TensorDesc x;          // input
  TensorDesc y;          // output; shape must equal output_shape()
  int64_t k = 1;         // output channels
  int64_t r = 1, s = 1;  // filter height, width
  int64_t pad_h = 0, pad_w = 0;
  int64_t stride_h = 1, stride_w = 1;

  Shape weight_shape() const { return {k, x.shape.c, r, s}; }
  Shape output_shape() const;
  // The same problem at another batch size (for micro-batches).
  ConvProblem with_batch(int64_t n) const;
  std::string str() const;  // for error messages and keys
};

struct ConvAlgoInfo {
  ConvAlgo algo = 0;
  std::string name;
  size_t workspace_bytes = 0;  // what a call with this algorithm needs
};

// ------------------------------------------------------------------ other ops

enum class PoolKind { kMax, kAverage };  // average excludes padding

struct PoolParams {
  PoolKind kind = PoolKind::kMax;
  int64_t kh = 2, kw = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
};

// Output size of a pooling or convolution window along one dimension.
int64_t window_output(int64_t in, int64_t window, int64_t stride, int64_t pad);

struct LossStats {
  double loss_sum = 0.0;  // sum over samples of -log softmax(logits)[label]
  int64_t correct = 0;    // samples whose arg-max equals the label
};

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

enum class StreamKind { kCompute, kMemory };

// A point in one stream's work, returned by record_event().
struct Event {
  StreamKind stream = StreamKind::kCompute;
  uint64_t ticket = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual DeviceInfo device_info() const = 0;
  // Why this backend cannot train in `precision` on this device (naming
  // what is missing: an instruction set, a GPU generation), or nothing when
  // it can.
  virtual std::optional<std::string> precision_unavailable(common::Precision precision) const = 0;

  // ------------------------------------------------------------- memory
  // Raw device memory. The memory part reserves once and pools over it; the
  // engine never calls these per step. Throws BackendError when the device
  // cannot provide the bytes. Returned memory is 64-byte aligned.
  virtual void* allocate_device(size_t bytes) = 0;
  virtual void free_device(void* ptr) = 0;
  // The device bytes allocate_device(bytes) takes (its alignment rounding):
  // what every count of device memory made before allocating (the memory
  // plan's room, the least capacity an error suggests) must use.
  virtual size_t allocation_bytes(size_t bytes) const = 0;
  // Bytes currently allocated with allocate_device, and the peak since start
  // or the last reset_peak().
  virtual size_t device_bytes_in_use() const = 0;
  virtual size_t device_bytes_peak() const = 0;
  virtual void reset_peak() = 0;
  // Host memory that the memory stream can copy to and from asynchronously.
  virtual void* allocate_pinned(size_t bytes) = 0;
  // Waits for the copies queued so far (they may still read or write the
  // memory: an owner unwinding from an error need not), then frees it.
  virtual void free_pinned(void* ptr) = 0;

  // Layout this backend keeps an activation with this many channels in
  // (BackendOptions::layout, by LayoutRule below).
  virtual Layout preferred_layout(int64_t channels) const = 0;

  // --------------------------------------------------- streams and copies
  virtual Event record_event(StreamKind stream) = 0;
  // Work issued to `stream` after this call starts only after `event`.
  virtual void wait_event(StreamKind stream, const Event& event) = 0;
  // Blocks the host until `event` has passed.
  virtual void synchronize(const Event& event) = 0;
  virtual void synchronize(StreamKind stream) = 0;
  // Times a span of the compute stream's work (a rank's compute in a step,
  // for online re-balancing): begin_compute_span() marks its start,
  // end_compute_span_ms() its end, waits for the work in between and
  // returns the milliseconds it took on the device (the host clock where
  // the compute stream is synchronous, stream events on a GPU; host time
  // would count waits for the other ranks). One span at a time; end without
  // a begin returns 0.
  virtual void begin_compute_span() = 0;
  virtual double end_compute_span_ms() = 0;
  // Byte copy between device and pinned host memory (either direction) on a stream.
  virtual void copy_async(void* dst, const void* src, size_t bytes, StreamKind stream) = 0;

  // Synchronous transfers with layout conversion: `host` holds plain NCHW
  // (OIHW for weights) floats, shape().elements() of them.
  virtual void upload(const float* host, const Tensor& dst) = 0;
  virtual void download(const Tensor& src, float* host) = 0;
  // dst = src with layout and element-type conversion (shapes must match;
  // f32 to half rounds to nearest even).
  virtual void convert(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, float value) = 0;
  virtual void upload_labels(const int32_t* host, int32_t* device, int64_t count) = 0;

  // --------------------------------------------------------- convolution
  // Algorithms available for this problem, each with its workspace for a
  // call with beta = 0 and, if different, with beta != 0 (see accumulate).
  virtual std::vector<ConvAlgoInfo> conv_algorithms(ConvKind kind, const ConvProblem& p,
                                                    bool accumulate) = 0;
  virtual std::string conv_algorithm_name(ConvKind kind, ConvAlgo algo) const = 0;
  // Throws naming the problem when the algorithm does not support it.
  virtual size_t conv_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                                bool accumulate) = 0;

  // y = conv(x, w) (+ bias if non-null) + beta * y. beta is 0 or 1.
  virtual void conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const void* w,
                            const void* bias, const Tensor& y, float beta, void* workspace,
                            size_t workspace_bytes) = 0;
  // dx = conv_transpose(dy, w) + beta * dx.
  virtual void conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy,
                                  const void* w, const Tensor& dx, float beta, void* workspace,
                                  size_t workspace_bytes) = 0;
  // dw = corr(x, dy) + beta * dw; dbias (if non-null) = sum(dy) + beta * dbias.
  virtual void conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                                    const Tensor& dy, float* dw, float* dbias, float beta,
                                    void* workspace, size_t workspace_bytes) = 0;

  // ---------------------------------------------------------- other ops
  virtual void relu_forward(const Tensor& x, const Tensor& y) = 0;
  // dx = dy where y > 0 else 0. dx may alias dy.
  virtual void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;
  // A convolution's bias and the relu after it, each way in one pass over
  // the activations (the network pairs them: conv.fuse_relu). Forward:
  // y = relu(x + bias[c]), the bias in x's type, rounded to it once as a
  // bias add would round, y not aliasing x. Backward: relu_backward into
  // dx, and dbias[c] = the sum of dx over n, h and w, in f32, overwritten
  // (the convolution's bias gradient).
  virtual void bias_relu_forward(const Tensor& x, const void* bias, const Tensor& y) = 0;
  virtual void relu_backward_bias(const Tensor& y, const Tensor& dy, const Tensor& dx,
                                  float* dbias) = 0;
  // Whether that pairing saves work here: a pass over the activations each
  // way (CUDA). Where a convolution adds its bias for free, as oneDNN's
  // does, it does not.
  virtual bool pairs_bias_with_relu() const = 0;

  // Bytes a pooling forward must leave for its backward (max indices), 0 if none.
  virtual size_t pooling_state_bytes(const PoolParams& p, const TensorDesc& x,
                                     const TensorDesc& y) = 0;
  virtual void pooling_forward(const PoolParams& p, const Tensor& x, const Tensor& y,
                               void* state) = 0;
  virtual void pooling_backward(const PoolParams& p, const Tensor& x, const Tensor& y,
                                const Tensor& dy, const Tensor& dx, const void* state) = 0;

  // y[n, o] = sum_i x[n, i] w[o, i] + b[o]; w is {out, x.c, x.h, x.w} plain.
  virtual void inner_product_forward(const Tensor& x, const void* w, const void* bias,
                                     const Tensor& y) = 0;
  virtual void inner_product_backward_data(const Tensor& dy, const void* w,
                                           const Tensor& dx) = 0;
  // dw = dy^T x + beta * dw; dbias = sum_n dy + beta * dbias.
  virtual void inner_product_backward_weights(const Tensor& x, const Tensor& dy, float* dw,
                                              float* dbias, float beta) = 0;

  // Batch normalisation over N, H, W per channel. scale_shift holds gamma[C]
  // then beta[C]. Training saves the batch mean/variance for backward and
  // updates running = (1 - momentum) * running + momentum * batch (unbiased var).
  virtual void batch_norm_forward_training(const Tensor& x, const Tensor& y,
                                           const float* scale_shift, float* save_mean,
                                           float* save_var, float* running_mean,
                                           float* running_var, float momentum, float eps) = 0;
  virtual void batch_norm_forward_inference(const Tensor& x, const Tensor& y,
                                            const float* scale_shift, const float* running_mean,
                                            const float* running_var, float eps) = 0;
  // dx, and d(scale_shift) = computed + beta * d(scale_shift).
  virtual void batch_norm_backward(const Tensor& x, const Tensor& dy, const float* scale_shift,
                                   const float* save_mean, const float* save_var,
                                   const Tensor& dx, float* dscale_shift, float beta,
                                   float eps) = 0;

  // Synchronised batch norm: the statistics of a batch split over ranks,
  // from per-rank sums that the caller adds up across ranks between calls.
  // Normalising with the global mean and variance is
  // batch_norm_forward_inference with them in place of the running ones.
  // Per channel c of x, over N, H, W, accumulated in double: sums[c] = sum
  // of x, sums[C + c] = sum of x^2. Synchronises; returns 2C values.
  virtual std::vector<double> batch_norm_sums(const Tensor& x) = 0;
  // Per channel, with xhat = (x - mean) / sqrt(var + eps): sums[c] = sum of
  // dy, sums[C + c] = sum of dy * xhat (d beta and d gamma of this batch).
  // dy has x's descriptor. Synchronises; returns 2C values.
  virtual std::vector<double> batch_norm_backward_sums(const Tensor& x, const Tensor& dy,
                                                       const float* mean, const float* var,
                                                       float eps) = 0;
  // dx = gamma / sqrt(var + eps) * (dy - dy_means[c] - xhat * dy_means[C + c]),
  // where dy_means holds the global batch's mean of dy and of dy * xhat per
  // channel (2C floats of device memory). x, dy and dx share a descriptor.
  virtual void batch_norm_backward_data(const Tensor& x, const Tensor& dy,
                                        const float* scale_shift, const float* mean,
                                        const float* var, const float* dy_means,
                                        const Tensor& dx, float eps) = 0;

  // y = a + b (any layouts; y may alias a or b).
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  // y = x + beta * y, for accumulating gradients of tensors with several consumers.
  virtual void accumulate(const Tensor& x, const Tensor& y, float beta) = 0;
  // Channel concatenation and its backward (split). Spatial sizes must match.
  virtual void concat_forward(std::span<const Tensor> xs, const Tensor& y) = 0;
  // dx = channels [channel_offset, channel_offset + dx.c) of dy + beta * dx:
  // one input's share of a concat's gradient (each input may need its own beta).
  virtual void concat_backward(const Tensor& dy, int64_t channel_offset, const Tensor& dx,
                               float beta) = 0;

  // Softmax cross-entropy over logits {n, classes, 1, 1}. labels are device
  // int32 in [0, classes). With label smoothing s the target is
  // q = (1 - s) * onehot + s / classes: the loss of a sample is
  // -sum_j q[j] log softmax[j], and dlogits (may be null) = (softmax - q) * scale.
  // Returns the loss sum and arg-max hits over the n samples (synchronises).
  virtual LossStats softmax_cross_entropy(const Tensor& logits, const int32_t* labels,
                                          float scale, const Tensor* dlogits,
                                          float label_smoothing = 0.0f) = 0;

  // Elementwise over `count` floats, the optimizers' updates (SgdStep,
  // AdamWStep above say what each computes). velocity, m and v are state
  // the caller keeps between steps.
  virtual void sgd_update(float* w, const float* g, float* velocity, int64_t count,
                          const SgdStep& step) = 0;
  virtual void adamw_update(float* w, const float* g, float* m, float* v, int64_t count,
                            const AdamWStep& step) = 0;
  // average += (1 - decay) * (x - average) over `count` floats: one step of
  // an exponential moving average of x.
  virtual void moving_average(float* average, const float* x, int64_t count, float decay) = 0;
  // The sum of squares of each segment [offsets[i], offsets[i + 1]) of x,
  // in double and in an order fixed by the segment alone (the same bits on
  // every call, whatever the threads): gradient and weight norms.
  // Synchronises; returns offsets.size() - 1 values.
  virtual std::vector<double> sum_squares(const float* x, std::span<const int64_t> offsets) = 0;
  // x *= alpha over `count` floats.
  virtual void scale(float* x, int64_t count, float alpha) = 0;
  // Whether none of `count` floats is infinite or NaN (loss scaling's
  // overflow check). Synchronises.
  virtual bool all_finite(const float* x, int64_t count) = 0;

  // ------------------------------------------------ the ops' own scratch
  // Ops other than convolutions may need device memory of the backend's own
  // (a library scratchpad, a layout-converted copy): one scratch buffer,
  // counted in device_bytes_in_use(), that grows when a call needs more.
  // Each query returns the most bytes one call of that op family needs with
  // these descriptors (either beta, training or inference; 0 if none), as
  // conv_workspace() does for convolutions, so that a network can
  // reserve_scratch() its largest before it sizes its pool and no step
  // allocates device memory outside the plan.
  virtual size_t relu_scratch_bytes(const TensorDesc& x) = 0;  // bias-paired calls too
  virtual size_t pooling_scratch_bytes(const PoolParams& p, const TensorDesc& x,
                                       const TensorDesc& y) = 0;
  // The three inner-product calls with weights {out, x.c, x.h, x.w}.
  virtual size_t inner_product_scratch_bytes(const TensorDesc& x, int64_t out, bool bias) = 0;
  // Every batch-norm op above, the synchronised ones included.
  virtual size_t batch_norm_scratch_bytes(const TensorDesc& x, float eps) = 0;
  // add(a, b, y); accumulate(x, y, beta) needs add_scratch_bytes(y, x, y).
  virtual size_t add_scratch_bytes(const TensorDesc& a, const TensorDesc& b,
                                   const TensorDesc& y) = 0;
  // concat_forward, and concat_backward of each input's slice.
  virtual size_t concat_scratch_bytes(std::span<const TensorDesc> xs, const TensorDesc& y) = 0;
  virtual size_t softmax_scratch_bytes(const TensorDesc& logits) = 0;
  // sum_squares over this many segments.
  virtual size_t sum_squares_scratch_bytes(size_t segments) = 0;
  // Grows the scratch to at least `bytes` now (throws BackendError when the
  // device cannot provide them); it never shrinks while the backend lives.
  virtual void reserve_scratch(size_t bytes) = 0;
  virtual size_t scratch_bytes() const = 0;  // the scratch's current size
};

// The activation layout a job asks for (device.layout), with the other
// settings of how a model is computed (common/compute_settings.h).
using common::LayoutChoice;
using common::kLayoutChoiceNames;

// The layout rule of every backend, also what the offline planner assumes
// for a rank it cannot ask: the layout of an activation of `channels`
// under `choice` on a device whose own choice is `native_block` for the
// CPU (its ISA's channel block: 16, 8 or 1) or, for a GPU, `gpu` set.
struct LayoutRule {
  LayoutChoice choice = LayoutChoice::kAuto;
  bool gpu = false;
  int64_t native_block = 1;  // CPU
  common::Precision precision = common::Precision::kFp32;
  Layout operator()(int64_t channels) const;
};

// How many of cuDNN's ranked graph engines each half configuration offers
// unless conv.graph_engines says otherwise: as many as PyTorch's cuDNN path
// times (torch.backends.cudnn.benchmark_limit, 10, of the same heuristic's
// ranking, mode A), so that the kernels it can reach are among vtrain's
// candidates too. Each costs a plan and its timing at profile time only.
inline constexpr int kDefaultGraphEngines = 10;

struct BackendOptions {
  std::string kind = "auto";  // "auto" (cuda if a GPU is visible, else cpu), "cpu", "cuda"
  int threads = 0;            // CPU threads; 0 = all cores the process may run on, no more than
                              // its cgroup CPU quota keeps busy (common/cgroup_limits.h)
  size_t memory_limit = 0;    // device bytes the backend may serve; 0 = the device's memory
  // The job's train.precision. Under tf32 the CUDA backend also offers each
  // convolution algorithm in a TF32 tensor-core variant ("<name>/tf32",
  // timed and chosen like any algorithm) and runs its GEMMs in TF32;
  // fp32 keeps FMA math throughout. Half tensors need no option: a backend
  // runs them whatever this says, where precision_unavailable() allows.
  common::Precision precision = common::Precision::kFp32;
  // Activations' layout (preferred_layout()).
  LayoutChoice layout = LayoutChoice::kAuto;
  // CUDA: also offer half convolutions as the engine configurations of
  // cuDNN's graph API (conv.cudnn_graph; "eng<index>..." algorithms):
  // the first `graph_engines` of its heuristic's ranking that finalize, per
  // configuration (conv.graph_engines). Other backends ignore both.
  bool cudnn_graph = false;
  int graph_engines = kDefaultGraphEngines;
  // Tests, CPU: the memory stream's work starts only when something waits
  // for it (common::HostStream's lazy mode), as on a device whose copies
  // are slow, so that a missing wait reads stale data deterministically.
  bool lazy_memory_stream = false;
};

// The layout rule a backend of `kind` ("cpu": this machine's CPU; "cuda")
// follows under `choice` and `precision`, without making one (what the
// offline planner assumes for a rank). Throws BackendError for other kinds.
LayoutRule layout_rule_for(const std::string& kind, LayoutChoice choice,
                           common::Precision precision);

// The only place that knows which backends were built. Throws BackendError
// naming the known kinds for an unknown or unavailable one.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

// Whether a GPU backend is built and a GPU is visible.
bool gpu_available();
// Why not (the backend is not built; the CUDA runtime's error, e.g. a
// driver too old for it; or no device), or nullopt when one is.
std::optional<std::string> why_no_gpu();

}  // namespace vtrain::worker
