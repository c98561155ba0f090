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
// in backward (memory/vdnn_plan.h); `auto`, `memonger`, `superneurons` and
// `tflms` choose per activation to keep, offload or recompute it (re-run
// its forward in backward) under the capacity (memory/planner.h). Every
// policy computes the same numbers.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/name_table.h"
#include "memory/chrome_trace.h"
#include "memory/device_pool.h"
#include "memory/planner.h"
#include "memory/simulator.h"
#include "memory/vdnn_plan.h"
#include "worker/device/backend.h"
#include "worker/engine/conv_kernel.h"
#include "worker/engine/graph.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/layers/layer.h"

namespace vtrain::worker {

class Layer;
class ScheduleInterpreter;

struct NetworkOptions {
  ComputeSettings settings;                // how the graph is computed: precision, layout
                                           // (the backend's, which it was made with), fusion
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
                               // less the allocations below
  // The device allocations the trainer makes after the network, each of
  // this many bytes per parameter (Sgd's velocity: 4; a half gradient
  // exchange's staging: 2), left free by the pool as the backend serves
  // them (Backend::allocation_bytes).
  std::vector<size_t> allocations_after_network;
  // conv.algorithm auto: time the candidates and run the fastest that the
  // memory plan fits. False (`vtrain check`, which plans but does not
  // train, under a vDNN policy): each kernel's least-workspace candidate,
  // untimed; whether memory fits is decided on that choice either way.
  bool time_convolutions = true;
  // Tests and benchmarks: a per-tensor plan, one action per graph layer
  // (memory/vdnn_plan.h's planned_schedule), run instead of memory_policy
  // when not empty.
  std::vector<memory::TensorAction> memory_actions;
  // What a step's operations cost on this device at max_batch (one entry
  // per graph layer). Empty: the per-tensor planners (auto, memonger,
  // superneurons, tflms) measure them in place (worker/engine/layer_timing.h)
  // and explicit memory_actions go untimed.
  memory::StepCosts memory_costs;
  bool poison_freed = false;   // tests: fill released memory with NaN so a read after
                               // release changes the results
  // model.batch_norm: sync over several ranks: how batch norm adds up its
  // statistics over the ranks in training steps (a collective of its own,
  // see LayerCall). Null: each rank normalises its own samples.
  SumOverRanks sum_over_ranks;
  // A device copy of the input's floats at max_batch (a persistent block
  // of the pool), for prefetch_input(): the trainer turns it on where the
  // device has memory of its own (a GPU).
  bool prefetch_input = false;
};

// What the memory part is doing for a network.
struct MemoryStats {
  std::string policy;           // "none", "all", "conv", "dyn" with the pass it chose, a
                                // per-tensor planner ("auto", "memonger", ...; "auto (tflms)"
                                // when auto chose a baseline's plan), or "explicit"
  std::string offload;          // what is offloaded: "none", "conv", "all", or "per tensor"
                                // (a per-tensor plan that offloads some)
  std::string planner;          // "pool" or "static"
  size_t capacity = 0;          // bytes the schedule had to fit
  size_t reservation = 0;       // device bytes the pool reserved
  size_t persistent_bytes = 0;  // of it, allocated once (parameters, gradients, data, ...)
  size_t step_peak = 0;         // most bytes in use during the last training step
  double step_average = 0;      // bytes in use during it, time-weighted
  size_t host_reservation = 0;  // pinned host bytes for offloads
  size_t offloaded_bytes = 0;   // copied to the host in the last training step
  // The per-tensor plan's prediction (0 without one, or for an untimed plan).
  double predicted_step_seconds = 0;  // simulated step time
  size_t predicted_peak = 0;          // simulated peak bytes, persistent ones included
  memory::StaticPlanReport static_plan;
};

// Descriptors of every layer's output at batch n, in `settings`'
// activation type: the layout each gets on
// `backend` (conv/add/concat outputs in the backend's preferred layout,
// element-wise layers keep their input's, data and fc outputs plain).
std::vector<TensorDesc> activation_descs(const Graph& graph, const ComputeSettings& settings,
                                         const Backend& backend, int64_t n);
// The same for a device known only by its layout rule (offline planning).
std::vector<TensorDesc> activation_descs(const Graph& graph, const ComputeSettings& settings,
                                         const std::function<Layout(int64_t)>& preferred_layout,
                                         int64_t n);

// Throws BackendError with the backend's reason when it cannot run
// `precision`: before anything builds or times a graph's layers (a
// network, the profiler, layer timing).
void require_precision(const Backend& backend, common::Precision precision);

// Why a named conv.algorithm (not "auto") runs on none of the graph's
// convolutions on `backend` at batch n, naming what they offer instead
// (the error a network gives); nothing when one offers it.
std::optional<std::string> conv_algorithm_refusal(const Graph& graph,
                                                  const ComputeSettings& settings,
                                                  Backend& backend, const std::string& algorithm,
                                                  int64_t n);

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

  // Writes n samples of plain NCHW floats at `host` to input(n): from the
  // prefetched copy when it is of this `host` and n (then only a conversion
  // on the device is left), else copied now (through the staging where the
  // network has one). A prefetch of another batch is dropped. `host` may
  // change once this returns. Returns whether the prefetched copy was taken.
  bool upload_input(const float* host, int64_t n);
  // Starts copying n samples of plain NCHW floats at `host` (page-locked:
  // Backend::allocate_pinned) to the device on the memory stream, after the
  // work issued so far (a step's backward runs meanwhile), for the next
  // upload_input(host, n). `host` must not change until that returns, or
  // until the next prefetch_input, which waits for this copy and drops it.
  // Needs NetworkOptions::prefetch_input.
  void prefetch_input(const float* host, int64_t n);
  // Waits for a prefetch's copy, if one was not uploaded, and drops it: its
  // `host` may then change or be freed. The destructor does it too.
  void drop_prefetch();

  // One training step on the first n samples of input()/labels(): forward,
  // loss = scale * sum of per-sample losses, backward. Gradients are
  // overwritten (not accumulated across steps). on_gradients_ready, if set,
  // is called during backward once a layer's parameter gradients are final.
  // label_smoothing: Backend::softmax_cross_entropy's (train.label_smoothing).
  LossStats train_step(int64_t n, float loss_scale, float label_smoothing = 0.0f);
  // The step and this rank's first sample in the global batch that the
  // following train_step calls compute (LayerCall::step): what dropout's
  // mask is drawn from. Until set: seed 0, step 0, first sample 0.
  void set_step_context(const StepContext& context);
  // A training step in which this rank has no samples: with
  // sum_over_ranks, makes the collectives the other ranks' train_step makes
  // (forward in graph order, then backward in reverse, as every schedule
  // runs them), contributing nothing; nothing without it.
  void train_without_samples();
  // Forward in inference mode (batch norm uses running statistics). With
  // `logits`, also copies the scores the loss read there: n x
  // graph().classes() floats, sample by sample (evaluation's top-k and
  // confusion, predict's probabilities).
  LossStats evaluate(int64_t n, float* logits = nullptr);

  std::function<void(const ParamRange&)> on_gradients_ready;

  // Flat device buffers of parameters and gradients (parameter_count()
  // floats). Under a half precision (Graph::precision) these are the fp32
  // master parameters: the conv and fc kernels read a copy in the
  // activations' type, refreshed from them at the start of every training
  // step and of the first evaluation after one or after
  // init_parameters/upload_parameters (whoever else writes parameters()
  // between steps, as the optimizer does, needs nothing more).
  float* parameters() const { return params_; }
  // (train_without_samples also counts as a step here.)
  float* gradients() const { return grads_; }
  int64_t parameter_count() const { return param_count_; }
  // The relu layers that add their convolution's bias (fusion_pass.h).
  int bias_relu_pairs() const { return bias_relu_pairs_; }
  const std::vector<ParamRange>& param_ranges() const { return param_ranges_; }
  // Under a half precision, where param_ranges()[i] starts in the compute
  // copy, in its elements: each range at a multiple of kComputeAlignBytes
  // (tensor-core kernels want their operands 16-byte aligned at least); -1
  // for a layer that reads its f32 parameters (Layer::reads_compute_params:
  // batch norm), which has no copy.
  static constexpr int64_t kComputeAlignBytes = 128;
  int64_t compute_offset(size_t range) const { return compute_offsets_.at(range); }
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
  size_t workspace_bytes() const;

  MemoryStats memory_stats() const;
  // Every allocation and release of the last training step, labelled with
  // the layer, for plots; recorded while a trace is set (set_trace).
  const std::vector<memory::TimelineSample>& memory_timeline() const;
  const memory::MemoryModel& memory_model() const { return model_; }
  // The per-tensor plan the network runs (a per-tensor policy or explicit
  // memory_actions); null for none, all, conv and dyn.
  const memory::MemoryPlan* memory_plan() const { return plan_ ? &*plan_ : nullptr; }
  // The costs a per-tensor policy planned with (NetworkOptions'
  // memory_costs, or those measured in place); null without such a plan.
  const memory::StepCosts* plan_costs() const { return plan_costs_ ? &*plan_costs_ : nullptr; }
  // Where the schedule keeps the activations: kept, offloaded, recomputed.
  memory::PlanSummary activation_placement() const {
    return memory::summarize(model_, schedule_.actions);
  }
  // The alloc/free trace of the last training step (for the DSA planner).
  const std::vector<memory::DsaBlock>& last_step_trace() const;
  // Records compute and memory-stream events of the following steps into
  // `trace` (null: stop), each call waited for, an input prefetch's copy
  // too. The trace must outlive the network's use of it. Also samples the
  // bytes in use at once, so a policy that allocates nothing during steps
  // (none) still has a memory line.
  void set_trace(memory::ChromeTrace* trace);
  // While `steps` is set (null: stop), every training step appends the
  // times of its calls as it made them (memory::StepCosts, bandwidths 0):
  // each layer's forward and backward, the loss, and other_seconds, the
  // step's time outside them. A recompute call is not a forward's time.
  // On a device with asynchronous compute each call is waited for.
  void record_call_times(std::vector<memory::StepCosts>* steps);
  // "conv1: Forward=direct BackwardData=direct BackwardFilter=direct" lines,
  // each followed by the algorithms tuning left out because they refused
  // to run (ConvAlgorithmChoice::refused), if any.
  std::vector<std::string> algorithm_summary() const;

 private:
  void make_layers();
  void check_named_algorithm() const;
  // Once the layers are bound, what the fusion pass decides under
  // options_.settings (fusion_pass.h): the relu adds the bias (ActivationDesc::bias).
  void pair_bias_with_relu();
  bool has_compute_copy() const;           // a half precision with conv or fc parameters
  TensorDesc compute_params_desc() const;  // the half compute copy of the parameters
  void refresh_compute_params();            // from params_ when stale
  void* compute_range(size_t range) const;  // where param_ranges_[range] starts in the copy
  void reserve_op_scratch();
  void tune_convolutions();
  // Each unplanned conv kernel's least-workspace candidate (whether any
  // schedule fits is decided on it: on sizes, never on timings).
  void choose_smallest_workspaces();
  // Device bytes the allocations after the network take.
  size_t allocations_after() const;
  // Device bytes the network may use now: memory_capacity, else the
  // device's memory less what is in use and allocations_after(). Throws
  // OutOfMemoryError when nothing is left.
  size_t room() const;
  // The memory model of the layers as they are now (their algorithms'
  // workspaces) into model_.
  void describe_memory();
  // The least pool capacity some schedule of the policy fits with the
  // model as described, on sizes alone: auto's least capacity for a
  // per-tensor policy, else the reservation of the policy's schedule (for
  // dyn, of its first pass: offload all); nothing for memory_actions.
  std::optional<size_t> least_pool_capacity() const;
  // The dynamic policy's choice of conv algorithms and offloads.
  memory::Simulation plan_dynamic(size_t capacity);
  // A per-tensor plan (memory_actions, or a planner's) into plan_ and schedule_.
  memory::Simulation plan_per_tensor(size_t capacity, const std::string& where);
  // memory_costs, else measured on this device (the copies: copy_bandwidth_).
  memory::StepCosts step_costs();
  // Whether plan_memory measures the costs on this device.
  bool measures_costs_in_place() const;
  // Sets schedule_ (and plan_) for the options; the simulation of schedule_.
  memory::Simulation choose_schedule(size_t capacity, const std::string& where);
  // choose_schedule, throwing OutOfMemoryError when it does not fit.
  memory::Simulation fitting_schedule(size_t capacity, const std::string& where);
  // An out-of-memory error's message with the device.memory_limit it
  // takes (the least capacity plus what the network does not plan: the
  // bytes in use and allocations_after()), when the capacity is the
  // device's.
  std::string with_least_limit(const std::string& message) const;
  void plan_memory();
  void bind_layers();

  const Graph& graph_;
  Backend& backend_;
  NetworkOptions options_;
  std::vector<std::unique_ptr<Layer>> layers_;
  int bias_relu_pairs_ = 0;
  std::vector<TensorDesc> out_desc_;  // per layer, at max batch
  int32_t* labels_ = nullptr;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  float* buffers_ = nullptr;
  void* compute_params_ = nullptr;  // under a half precision; else null
  bool compute_params_stale_ = true;
  int64_t param_count_ = 0;
  int64_t buffer_count_ = 0;
  std::vector<ParamRange> param_ranges_;
  std::vector<int64_t> compute_offsets_;  // per range, into the compute copy (aligned); -1: none
  int64_t compute_count_ = 0;             // the compute copy's elements, padding included

  // Memory part.
  memory::MemoryModel model_;
  memory::Schedule schedule_;
  std::optional<memory::MemoryPlan> plan_;  // a per-tensor plan (schedule_ is its schedule)
  std::optional<memory::StepCosts> plan_costs_;  // what plan_ was made with
  CopyBandwidth copy_bandwidth_;  // measured in place by plan_memory
  bool tuned_ = false;            // conv.algorithm auto timed the candidates
  MemoryStats fixed_stats_;  // what plan_memory decided (policy, capacity, ...); the rest is live
  std::unique_ptr<ScheduleInterpreter> interpreter_;  // runs schedule_ in the pool it owns

  // Input prefetch (NetworkOptions::prefetch_input).
  struct Prefetch {
    const float* host = nullptr;
    int64_t n = 0;
    Event copied;  // on the memory stream
  };
  float* input_staging_ = nullptr;   // max_batch samples of floats; null without prefetch
  Tensor input_staging(int64_t n) const;  // its first n samples, plain f32
  std::optional<Prefetch> prefetch_;  // copied or copying, not yet uploaded
  Event staging_read_;                // compute stream: after the last conversion from it
};

}  // namespace vtrain::worker
