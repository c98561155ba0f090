// A network instantiated on a backend: per-layer operators over a Graph,
// device storage for activations, gradients and parameters, and one
// training step (forward, softmax cross-entropy, backward).
//
// Parameters and their gradients each live in one flat device buffer, laid
// out layer by layer in graph order, so an optimizer or an allreduce can work
// on the whole model (or on contiguous per-layer ranges) at once.
//
// Storage: every tensor (activations, their gradients, parameters,
// gradients, workspace, state) comes from one device pool of the memory part
// (memory/), reserved once at construction and sized by simulating the
// step's schedule. Tensors are sized for the largest batch; smaller batches
// use the leading samples. memory_policy chooses the schedule: `none`
// allocates everything once (the vDNN paper's network-wide baseline); `all`,
// `conv` and `dyn` allocate layer by layer, release dead tensors, offload
// inputs to pinned host memory on the memory stream and prefetch them back
// in backward (memory/vdnn_plan.h). Every policy computes the same numbers.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memory/chrome_trace.h"
#include "memory/device_pool.h"
#include "memory/pinned_pool.h"
#include "memory/simulator.h"
#include "memory/vdnn_plan.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"

namespace vtrain::worker {

// ----------------------------------------------- micro-batched convolutions
// A convolution kernel (a conv layer's Forward, BackwardData or
// BackwardFilter) may run as several calls on micro-batches, each with its
// own algorithm, inside its own segment of the network's workspace (mu-cuDNN;
// the balancer's WR / WD plans).

// One call: an algorithm (the backend's stable name) on `size` images.
struct ConvCall {
  std::string algorithm;
  int64_t size = 1;
};

// How one kernel runs: its calls in order, sizes summing to the rank's
// batch, within [workspace_offset, workspace_offset + workspace_bytes) of the
// network's workspace.
struct ConvKernelExecution {
  std::vector<ConvCall> calls;
  uint64_t workspace_offset = 0;
  uint64_t workspace_bytes = 0;
};

// A conv layer's three kernels, indexed by ConvKind.
struct ConvLayerExecution {
  std::string layer;  // the conv layer's name
  std::array<ConvKernelExecution, 3> kernels;
};

// A call resolved to the backend's algorithm id.
struct ConvStep {
  ConvAlgo algo = 0;
  int64_t size = 1;
};

// The tensors a kernel reads and writes (the ones its kind uses).
struct ConvOperands {
  Tensor x, y;    // Forward: y = conv(x, w) (+ bias); BackwardFilter reads x
  Tensor dy, dx;  // BackwardData: dx from dy; BackwardFilter reads dy
  const float* w = nullptr;
  const float* bias = nullptr;
  float* dw = nullptr;
  float* dbias = nullptr;
};

// Runs `kind` of problem p (p.x.shape.n images) as the calls `steps`, in
// order, each on its slice of the samples; when the steps cover fewer images
// than p has (a larger batch than planned) they repeat, and the last call is
// cut to what is left. Forward and BackwardData write disjoint slices with
// `beta`; BackwardFilter accumulates: `beta` on the first call, 1 after it,
// so dW and dbias sum over every micro-batch. Throws BackendError when a
// call's workspace exceeds workspace_bytes.
void run_conv_kernel(Backend& backend, ConvKind kind, const ConvProblem& p,
                     std::span<const ConvStep> steps, const ConvOperands& operands, float beta,
                     void* workspace, size_t workspace_bytes);

struct NetworkOptions {
  int64_t max_batch = 64;                  // largest batch a step or evaluation will use
  std::string conv_algorithm = "auto";     // "auto": time every algorithm per layer and kind at
                                           // construction and keep the fastest; or a name,
                                           // used wherever the backend offers it
  // From a plan: how each conv layer's kernels run. Empty: conv_algorithm
  // decides, every kernel runs undivided in one shared workspace. When set,
  // every conv layer must be listed and conv_workspace_bytes is the size of
  // the buffer the kernels' segments lie in.
  std::vector<ConvLayerExecution> conv_executions;
  uint64_t conv_workspace_bytes = 0;

  // Memory (memory.policy, memory.planner in the config).
  memory::Policy memory_policy = memory::Policy::kNone;
  memory::Planner memory_planner = memory::Planner::kPool;
  size_t memory_capacity = 0;  // device bytes the pool may reserve; 0 = the device's memory
                               // (device.memory_limit on the CPU) less what is in use and
                               // less the optimizer's state below
  size_t optimizer_bytes_per_parameter = 0;  // device bytes per parameter the optimizer
                                             // allocates after the network (Sgd: 4, its
                                             // velocity), left free by the pool
  bool poison_freed = false;   // tests: fill released memory with NaN so a read after
                               // release changes the results
};

// What the memory part is doing for a network.
struct MemoryStats {
  std::string policy;           // "none", "all", "conv", or "dyn" with the pass it chose
  std::string offload;          // what is offloaded: "none", "conv" or "all"
  std::string planner;          // "pool" or "static"
  size_t capacity = 0;          // bytes the schedule had to fit
  size_t reservation = 0;       // device bytes the pool reserved
  size_t persistent_bytes = 0;  // of it, allocated once (parameters, gradients, data, ...)
  size_t step_peak = 0;         // most bytes in use during the last training step
  double step_average = 0;      // bytes in use during it, time-weighted
  size_t host_reservation = 0;  // pinned host bytes for offloads
  size_t offloaded_bytes = 0;   // copied to the host in the last training step
  memory::StaticPlanReport static_plan;
};

// Descriptors of every layer's output at batch n: the layout each gets on
// `backend` (conv/add/concat outputs in the backend's preferred layout,
// element-wise layers keep their input's, data and fc outputs plain).
std::vector<TensorDesc> activation_descs(const Graph& graph, const Backend& backend, int64_t n);
// The same for a device known only by its layout rule (offline planning).
std::vector<TensorDesc> activation_descs(const Graph& graph,
                                         const std::function<Layout(int64_t)>& preferred_layout,
                                         int64_t n);

// The convolution a conv layer runs, between activations x and y.
ConvProblem conv_problem(const LayerSpec& conv, const TensorDesc& x, const TensorDesc& y);

// The kernels conv layer `layer` of `graph` runs in a training step:
// Forward, BackwardData (unless its input is the data, which needs no
// gradient) and BackwardFilter.
std::vector<ConvKind> conv_kernels_of(const Graph& graph, int layer);

// A contiguous range of the flat parameter buffer owned by one layer.
struct ParamRange {
  int layer = 0;           // graph index
  int64_t offset = 0;      // in floats, into parameters() / gradients()
  int64_t count = 0;
};

class Network {
 public:
  Network(const Graph& graph, Backend& backend, const NetworkOptions& options);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  const Graph& graph() const { return graph_; }
  Backend& backend() { return backend_; }

  // Kaiming-uniform weights and uniform biases as PyTorch's defaults
  // (bound 1/sqrt(fan_in)), batch norm gamma = 1, beta = 0, running stats
  // 0 / 1. Deterministic in the seed.
  void init_parameters(uint64_t seed);

  // Where the caller writes a batch of n samples (plain NCHW) and labels.
  Tensor input(int64_t n) const;
  int32_t* labels() const { return labels_; }

  // One training step on the first n samples of input()/labels(): forward,
  // loss = scale * sum of per-sample losses, backward. Gradients are
  // overwritten (not accumulated across steps). on_gradients_ready, if set,
  // is called during backward once a layer's parameter gradients are final.
  LossStats train_step(int64_t n, float loss_scale);
  // Forward in inference mode (batch norm uses running statistics).
  LossStats evaluate(int64_t n);

  std::function<void(const ParamRange&)> on_gradients_ready;

  // Flat device buffers of parameters and gradients (parameter_count() floats).
  float* parameters() const { return params_; }
  float* gradients() const { return grads_; }
  int64_t parameter_count() const { return param_count_; }
  const std::vector<ParamRange>& param_ranges() const { return param_ranges_; }
  // Non-learned state saved with the model (batch-norm running statistics).
  float* buffers() const { return buffers_; }
  int64_t buffer_count() const { return buffer_count_; }

  // Host copies (for checkpoints and tests).
  std::vector<float> download_parameters() const;
  void upload_parameters(const std::vector<float>& values);
  std::vector<float> download_buffers() const;
  void upload_buffers(const std::vector<float>& values);

  // Bytes of the shared convolution workspace (policy none, or a plan's
  // buffer); under the layer-wise policies each conv call gets its own.
  size_t workspace_bytes() const { return workspace_bytes_; }

  MemoryStats memory_stats() const;
  // Every allocation and release of the last training step, labelled with
  // the layer, for plots; recorded while a trace is set (set_trace).
  const std::vector<memory::TimelineSample>& memory_timeline() const;
  const memory::MemoryModel& memory_model() const { return model_; }
  // The alloc/free trace of the last training step (for the DSA planner).
  const std::vector<memory::DsaBlock>& last_step_trace() const;
  // Records compute and memory-stream events of the following steps into
  // `trace` (null: stop). The trace must outlive the network's use of it.
  // Also samples the bytes in use at once, so a policy that allocates
  // nothing during steps (none) still has a memory line.
  void set_trace(memory::ChromeTrace* trace);
  // "conv1: Forward=direct BackwardData=direct BackwardFilter=direct" lines.
  std::vector<std::string> algorithm_summary() const;

  struct Layer;  // internal operator of one graph node

 private:
  // Per event of a schedule, fixed once it is: the label of the layer call
  // it belongs to ("conv2 forward", for the timeline and trace) and the name
  // of the tensor a memory event moves ("conv2.y").
  struct EventText {
    std::vector<int> owner;
    std::vector<std::string> label, tensor;
  };
  void tune_convolutions();
  // Device bytes the network may use now: memory_capacity, else the
  // device's memory less what is in use and the optimizer's state. Throws
  // OutOfMemoryError when nothing is left.
  size_t room() const;
  void plan_memory();
  // Executes a schedule's events: memory operations and layer calls.
  LossStats run(const std::vector<memory::Event>& events, const EventText& text, int64_t n,
                bool training, float loss_scale);
  EventText event_text(const std::vector<memory::Event>& events) const;
  // Allocates the tensor of a memory event from the pool into its slot.
  void* allocate_tensor(const memory::TensorId& id, const std::string& name);
  // Device bytes in use, as a trace counter sample (when tracing).
  void trace_in_use();
  // The workspace a layer's forward or backward runs in: the network-wide
  // one or a plan's buffer, or under the layer-wise policies its own.
  std::pair<void*, size_t> workspace_for(int i, bool backward);
  void forward_layer(int i, int64_t n, bool training);
  void backward_layer(int i, int64_t n);
  // The device memory of a tensor now (null when it is not on the device).
  void*& slot(memory::TensorKind kind, int layer);
  float* out(int i) { return static_cast<float*>(slot(memory::TensorKind::kOutput, i)); }
  float* grad(int i) { return static_cast<float*>(slot(memory::TensorKind::kGradient, i)); }
  // Releases whatever a failed step left allocated.
  void abandon_step();
  void trace_memory_ops();

  const Graph& graph_;
  Backend& backend_;
  NetworkOptions options_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<TensorDesc> out_desc_;  // per layer, at max batch
  std::vector<bool> grad_written_;    // per step: gradient holds a value already
  int32_t* labels_ = nullptr;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  float* buffers_ = nullptr;
  int64_t param_count_ = 0;
  int64_t buffer_count_ = 0;
  std::vector<ParamRange> param_ranges_;
  void* workspace_ = nullptr;         // shared: policy none, or a plan's buffer
  size_t workspace_bytes_ = 0;

  // Memory part.
  memory::MemoryModel model_;
  memory::Schedule schedule_;
  MemoryStats fixed_stats_;  // what plan_memory decided (policy, capacity, ...); the rest is live
  EventText train_text_, evaluate_text_;  // of schedule_.train and schedule_.evaluate
  std::unique_ptr<memory::DevicePool> pool_;
  std::unique_ptr<memory::PinnedPool> pinned_;
  std::vector<std::vector<void*>> device_;  // per TensorKind, per layer (or persistent index)
  void* shared_workspace_ = nullptr;        // TensorKind::kWorkspace, layer -1
  void* shared_scratch_ = nullptr;          // TensorKind::kScratch, layer -1
  std::vector<void*> host_;                 // per layer: its offloaded Y in pinned memory
  size_t offloaded_bytes_ = 0;              // this step
  // Memory-stream copies issued since the last sync (for the trace).
  struct PendingCopy {
    std::string name;
    const char* kind;
    double start_us;
  };
  std::vector<PendingCopy> pending_copies_;
  memory::ChromeTrace* trace_ = nullptr;
};

}  // namespace vtrain::worker
