#include "worker/engine/layer_timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <random>
#include <stdexcept>
#include <utility>

#include "common/text.h"
#include "memory/memory_error.h"
#include "worker/device/pinned_memory.h"
#include "worker/engine/device_blocks.h"
#include "worker/engine/layers/conv_layer.h"
#include "worker/engine/layers/layer_registry.h"
#include "worker/engine/network.h"
#include "worker/device/op_calls.h"

namespace vtrain::worker {
namespace {

// Why DeviceBlocks for measuring `what` can fail: all it needs against
// what the device has free when it starts.
std::string measuring(const Backend& backend, const std::string& what, size_t need) {
  return "measuring the step costs: " + what + " needs " + common::format_bytes_fixed(need) +
         " of device memory and the device has " +
         common::format_bytes_fixed(free_device_bytes(backend)) +
         " free (device.memory_limit or its memory)";
}

double median_copy_seconds(Backend& backend, void* dst, const void* src, size_t bytes,
                           int repeats) {
  // One untimed copy first: the first touch of the pages.
  const KernelTime t = time_kernel(backend, {1, repeats, TimingStatistic::kMedian}, [&] {
    backend.copy_async(dst, src, bytes, StreamKind::kMemory);
    backend.synchronize(StreamKind::kMemory);
  });
  return std::max(t.seconds, 1e-9);  // a copy below the clock's resolution
}

TensorDesc at_batch(TensorDesc desc, int64_t n) {
  desc.shape.n = n;
  return desc;
}


// Whether a consumer after layer i, whose backward runs before i's, has
// written producer p's gradient when i's backward starts.
bool written_before(const Graph& graph, int i, int p) {
  const std::vector<int>& consumers = graph.consumers(p);
  return std::any_of(consumers.begin(), consumers.end(), [&](int c) { return c > i; });
}

// What one layer's calls need on the device at batch n. As in a step, a
// backward that does not read X writes dX where X was, and one that does
// not read Y gets dY where Y was: a layer fits the device here when its
// step's calls do.
struct LayerNeeds {
  std::vector<TensorDesc> inputs;  // X_k
  std::vector<bool> input_grad;    // dX_k: input k is not the data
  TensorDesc output;               // Y and dY
  bool reads_inputs = false;       // backward reads X: dX needs its own buffer
  bool reads_output = false;       // backward reads Y: dY needs its own buffer
  size_t scratch = 0;              // an input gradient written aside (then added), where the
                                   // memory model expects one; else allocated on first use
  size_t workspace = 0;
  size_t state = 0;
  int64_t params = 0, buffers = 0;  // floats

  // The parameters' copy in the activations' type, which conv and fc
  // kernels read, under a half precision (none in f32 or without parameters).
  bool compute_copy() const { return params > 0 && output.dtype != DataType::kF32; }
  TensorDesc compute_params() const { return vector_desc(params, output.dtype); }
  size_t total() const {
    size_t bytes = output.bytes() * (reads_output ? 2 : 1) + scratch + workspace + state +
                   (2 * params + buffers) * sizeof(float) +
                   (compute_copy() ? compute_params().bytes() : 0);
    for (size_t k = 0; k < inputs.size(); ++k) {
      bytes += inputs[k].bytes() * (input_grad[k] && reads_inputs ? 2 : 1);
    }
    return bytes;
  }
};

LayerNeeds layer_needs(const Graph& graph, int i, const Layer& layer,
                       const std::vector<TensorDesc>& out_desc, int64_t n,
                       uint64_t plan_workspace_bytes) {
  memory::LayerNode node;
  layer.describe_backward(node);
  LayerNeeds needs;
  for (int p : graph.inputs(i)) {
    needs.inputs.push_back(at_batch(out_desc[p], n));
    needs.input_grad.push_back(p != graph.input_index());
    // A gradient the layer cannot add to, or one it computes for the data.
    const bool aside = needs.input_grad.back()
                           ? !node.backward_accumulates && written_before(graph, i, p)
                           : node.backward_needs_input_grad;
    if (aside) needs.scratch = std::max(needs.scratch, needs.inputs.back().bytes());
  }
  needs.output = at_batch(out_desc[i], n);
  needs.reads_inputs = node.backward_reads_inputs;
  needs.reads_output = node.backward_reads_output;
  needs.workspace = std::max(node.forward_workspace, node.backward_workspace);
  const auto* conv = layer.as_conv();
  if (conv && conv->planned()) {
    if (plan_workspace_bytes == 0) {
      throw std::invalid_argument("measuring the step costs: layer '" + layer.spec().name +
                                  "' runs a plan's convolutions but the plan's workspace "
                                  "size was not given");
    }
    needs.workspace = plan_workspace_bytes;
  }
  needs.state = layer.state_bytes();
  needs.params = layer.param_count();
  needs.buffers = layer.buffer_count();
  return needs;
}

struct LayerSeconds {
  double forward = 0, backward = 0;
};

// Binds a layer to temporary storage and unbinds it on destruction.
class TemporaryBinding {
 public:
  TemporaryBinding(Layer& layer, const LayerStorage& storage, void* state) : layer_(layer) {
    layer.bind(storage);
    layer.bind_state(state);
  }
  ~TemporaryBinding() {
    layer_.bind({});
    layer_.bind_state(nullptr);
  }
  TemporaryBinding(const TemporaryBinding&) = delete;
  TemporaryBinding& operator=(const TemporaryBinding&) = delete;

 private:
  Layer& layer_;
};

// One layer's tensors on the device and its calls over them, made as a
// training step makes them; the layer is bound to temporary storage while
// the bench lives.
class LayerBench {
 public:
  LayerBench(const Graph& graph, int i, Layer& layer, const std::vector<TensorDesc>& out_desc,
             Backend& backend, int64_t n, uint64_t plan_workspace_bytes)
      : graph_(graph), i_(i), layer_(layer), backend_(backend),
        needs_(layer_needs(graph, i, layer, out_desc, n, plan_workspace_bytes)),
        blocks_(backend, measuring(backend,
                                   "layer '" + layer.spec().name + "' at batch " + std::to_string(n),
                                   needs_.total())),
        call_{backend, n, {}, {}, {}, nullptr, needs_.workspace, {}, {}, {}, {}, {}, {}} {
    allocate();
    call_.emit_grad = [this](int k, bool can_add,
                             const std::function<void(const Tensor&, float)>& op) {
      emit_grad(k, can_add, op);
    };
    call_.needs_grad = [this](int k) { return needs_.input_grad[k]; };
    call_.scratch_like = [this](const Tensor& like) { return scratch_like(like.desc); };
    call_.gradients_ready = [] {};
  }

  LayerSeconds time(const KernelTimingOptions& timing) {
    LayerSeconds seconds;
    seconds.forward =
        time_kernel(backend_, timing, [&] { layer_.forward(call_, true); }).seconds;
    seconds.backward = time_kernel(backend_, timing, [&] {
                         std::fill(written_.begin(), written_.end(), false);
                         layer_.backward(call_);
                       }).seconds;
    return seconds;
  }

 private:
  void allocate() {
    for (size_t k = 0; k < needs_.inputs.size(); ++k) {
      call_.in.push_back(blocks_.tensor(needs_.inputs[k], 0.01f));
      din_.push_back(!needs_.input_grad[k]  ? Tensor{}
                     : needs_.reads_inputs ? blocks_.tensor(needs_.inputs[k], 0.0f)
                                           : call_.in.back());
    }
    written_.assign(call_.in.size(), false);
    call_.out = blocks_.tensor(needs_.output, 0.01f);
    call_.dout = needs_.reads_output ? blocks_.tensor(needs_.output, 0.01f) : call_.out;
    if (needs_.scratch > 0) scratch_ = blocks_.get(needs_.scratch);
    if (needs_.workspace > 0) call_.workspace = blocks_.get(needs_.workspace);
    void* state = needs_.state > 0 ? blocks_.get(needs_.state) : nullptr;
    LayerStorage storage{blocks_.floats(needs_.params, 0.01f), blocks_.floats(needs_.params, 0.0f),
                         blocks_.floats(needs_.buffers, 0.01f)};
    if (needs_.compute_copy()) {
      storage.compute_params = blocks_.tensor(needs_.compute_params(), 0.01f).data;
      storage.compute_type = needs_.output.dtype;
    }
    binding_.emplace(layer_, storage, state);
  }

  Tensor scratch_like(const TensorDesc& desc) {
    if (!scratch_) scratch_ = blocks_.get(std::max(needs_.scratch, desc.bytes()));
    return Tensor{desc, scratch_};
  }

  // As the schedule interpreter does: beta 0 for the first write of a
  // gradient, else beta 1 where the op can add, else aside and added.
  void emit_grad(int k, bool can_add, const std::function<void(const Tensor&, float)>& op) {
    if (!needs_.input_grad[k]) return;  // the data needs no gradient
    const std::vector<int>& inputs = graph_.inputs(i_);
    bool before = written_before(graph_, i_, inputs[k]);
    for (size_t j = 0; j < inputs.size(); ++j) {
      before = before || (written_[j] && inputs[j] == inputs[k]);
    }
    const Tensor& dx = din_[k];
    if (!before) {
      op(dx, 0.0f);
    } else if (can_add) {
      op(dx, 1.0f);
    } else {
      const Tensor aside = scratch_like(dx.desc);
      op(aside, 0.0f);
      accumulate(backend_, aside, dx, 1.0f);
    }
    written_[k] = true;
  }

  const Graph& graph_;
  int i_;
  Layer& layer_;
  Backend& backend_;
  LayerNeeds needs_;
  DeviceBlocks blocks_;  // before the binding: the layer is unbound before its storage goes
  LayerCall call_;
  std::vector<Tensor> din_;
  std::vector<bool> written_;  // in this backward call, per input
  float* scratch_ = nullptr;
  std::optional<TemporaryBinding> binding_;
};

double time_loss(const TensorDesc& logits_desc, Backend& backend, int64_t n,
                 const KernelTimingOptions& timing) {
  const TensorDesc desc = at_batch(logits_desc, n);
  DeviceBlocks blocks(backend, measuring(backend, "the loss at batch " + std::to_string(n),
                                          2 * desc.bytes() + static_cast<size_t>(n) * sizeof(int32_t)));
  const Tensor logits = blocks.tensor(desc, 0.01f);
  const Tensor dlogits = blocks.tensor(desc, 0.0f);
  auto* labels = reinterpret_cast<int32_t*>(blocks.get(static_cast<size_t>(n) * sizeof(int32_t)));
  const std::vector<int32_t> zeros(static_cast<size_t>(n), 0);
  backend.upload_labels(zeros.data(), labels, n);
  const float scale = 1.0f / static_cast<float>(n);
  return time_kernel(backend, timing, [&] {
           softmax_cross_entropy(backend, logits, labels, scale, &dlogits);
         }).seconds;
}

// The compute share's matrix product: kProductBatch rows of `features`.
constexpr int64_t kProductBatch = 64;
constexpr int64_t kMostFeatures = 128;  // where the device has room for them

TensorDesc product_rows(int64_t features) {
  return {{kProductBatch, features, 1, 1}, Layout::kPlain, DataType::kF32};
}

// The backend scratch the product needs (the scratch query covers its
// every inner-product kind).
size_t product_scratch(Backend& backend, int64_t features) {
  const TensorDesc rows = product_rows(features);
  return backend.scratch_bytes(InnerProductDesc{InnerProductKind::kForward, rows, rows}).scratch;
}

// Device bytes of the product: input and output of kProductBatch rows, the
// square weights, and what the backend's scratch grows by for it.
size_t product_bytes(Backend& backend, int64_t features) {
  const size_t scratch = product_scratch(backend, features);
  return static_cast<size_t>(2 * kProductBatch * features + features * features) * sizeof(float) +
         (scratch > backend.scratch_reserved() ? scratch - backend.scratch_reserved() : 0);
}

// The share of the copies' time that a compute-bound call on every thread
// (the product of `features`, needing `need` = product_bytes) loses to
// them; see measure_copy_bandwidth. `on_device` and `host` hold
// bandwidth.bytes each.
double measure_compute_share(Backend& backend, const CopyBandwidth& bandwidth, void* on_device,
                             void* host, int64_t features, size_t need, int repeats) {
  const std::string why = measuring(backend, "the copies' share of the compute", need);
  DeviceBlocks blocks(backend, why);
  try {
    backend.reserve_scratch(product_scratch(backend, features));
  } catch (const BackendError& e) {
    throw memory::OutOfMemoryError(why + ": " + e.what());
  }
  const Tensor x = blocks.tensor(product_rows(features), 0.01f);
  const Tensor y = blocks.tensor(product_rows(features), 0.0f);
  const float* w = blocks.floats(features * features, 0.01f);
  using Clock = std::chrono::steady_clock;
  const auto product = [&](int calls) {
    const auto start = Clock::now();
    for (int k = 0; k < calls; ++k) inner_product_forward(backend, x, w, nullptr, y);
    backend.synchronize(StreamKind::kCompute);
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  const double b = static_cast<double>(bandwidth.bytes);
  const double copy_seconds =
      (b / bandwidth.to_host_bytes_per_second + b / bandwidth.to_device_bytes_per_second) / 2;
  // Each round's product runs 10 ms (many scheduler slices) and at least
  // two copies' time, so that the copies issued end within it.
  const double target = std::max(0.01, 2 * copy_seconds);
  product(1);  // untimed: the primitive's creation
  const int calls =
      static_cast<int>(std::clamp(std::ceil(target / std::max(product(4) / 4, 1e-7)), 1.0, 1e5));
  std::vector<double> shares;
  for (int round = 0; round < repeats; ++round) {
    const double alone = product(calls);
    const int copies = static_cast<int>(std::clamp(std::floor(alone / copy_seconds), 1.0, 1e4));
    for (int k = 0; k < copies; ++k) {
      if (k % 2 == 0) {
        backend.copy_async(host, on_device, bandwidth.bytes, StreamKind::kMemory);
      } else {
        backend.copy_async(on_device, host, bandwidth.bytes, StreamKind::kMemory);
      }
    }
    const double together = product(calls);
    backend.synchronize(StreamKind::kMemory);
    // The compute the copies cost, over their time alone (what the
    // simulator charges the share of).
    shares.push_back((together - alone) / (copies * copy_seconds));
  }
  std::sort(shares.begin(), shares.end());
  return std::clamp(shares[shares.size() / 2], 0.0, 1.0);
}

}  // namespace

memory::StepCosts with_copies(memory::StepCosts costs, const CopyBandwidth& bandwidth) {
  costs.to_host_bytes_per_second = bandwidth.to_host_bytes_per_second;
  costs.to_device_bytes_per_second = bandwidth.to_device_bytes_per_second;
  costs.copy_compute_share = bandwidth.compute_share;
  return costs;
}

CopyBandwidth copies_of(const memory::StepCosts& costs) {
  CopyBandwidth bandwidth;
  bandwidth.to_host_bytes_per_second = costs.to_host_bytes_per_second;
  bandwidth.to_device_bytes_per_second = costs.to_device_bytes_per_second;
  bandwidth.compute_share = costs.copy_compute_share;
  return bandwidth;
}

size_t copy_measurement_scratch(Backend& backend) {
  return std::max(backend.scratch_reserved(), product_scratch(backend, kMostFeatures));
}

CopyBandwidth measure_copy_bandwidth(Backend& backend, size_t bytes, int repeats) {
  if (bytes == 0 || repeats < 1) {
    throw std::invalid_argument("measure_copy_bandwidth: bytes must be > 0 and repeats >= 1");
  }
  // The compute share's matrix product: the largest of 128 down to 16
  // features in half the free memory; the copies get the rest.
  constexpr size_t kLeast = 4096;
  constexpr size_t kRounding = 4096;  // the blocks' alignment, rounded up
  const size_t free = free_device_bytes(backend);
  int64_t features = kMostFeatures;
  size_t product = product_bytes(backend, features);
  while (features > 16 && product > free / 2) product = product_bytes(backend, features /= 2);
  if (free < kLeast + kRounding + product) {
    throw memory::OutOfMemoryError(
        "measuring the copy bandwidth needs " +
        common::format_bytes_fixed(kLeast + kRounding + product) +
        " of device memory and the device has " + common::format_bytes_fixed(free) +
        " free (device.memory_limit or its memory)");
  }
  bytes = std::min(bytes, free - kRounding - product);
  DeviceBlocks device(backend, measuring(backend, "the copy bandwidth", bytes));
  float* on_device = device.get(bytes);
  PinnedMemory pinned(backend);
  std::pmr::vector<char> pinned_bytes(bytes, &pinned);
  char* const host = pinned_bytes.data();
  backend.fill(Tensor{vector_desc(static_cast<int64_t>(bytes / sizeof(float))), on_device}, 0.01f);
  CopyBandwidth bandwidth;
  bandwidth.bytes = bytes;
  const double b = static_cast<double>(bytes);
  bandwidth.to_host_bytes_per_second =
      b / median_copy_seconds(backend, host, on_device, bytes, repeats);
  bandwidth.to_device_bytes_per_second =
      b / median_copy_seconds(backend, on_device, host, bytes, repeats);
  bandwidth.compute_share =
      measure_compute_share(backend, bandwidth, on_device, host, features, product, repeats);
  return bandwidth;
}

memory::StepCosts measure_step_costs(const Graph& graph,
                                     const std::vector<std::unique_ptr<Layer>>& layers,
                                     const std::vector<TensorDesc>& out_desc, Backend& backend,
                                     int64_t n, const CopyBandwidth& bandwidth,
                                     const KernelTimingOptions& timing,
                                     uint64_t plan_workspace_bytes) {
  if (n < 1) throw std::invalid_argument("measure_step_costs: batch must be >= 1");
  if (static_cast<int>(layers.size()) != graph.size() ||
      static_cast<int>(out_desc.size()) != graph.size()) {
    throw std::invalid_argument("measure_step_costs: " + std::to_string(layers.size()) +
                                " layers and " + std::to_string(out_desc.size()) +
                                " output descriptors for a graph of " +
                                std::to_string(graph.size()) + " layers");
  }
  memory::StepCosts costs;
  costs.forward_seconds.assign(graph.size(), 0.0);
  costs.backward_seconds.assign(graph.size(), 0.0);
  for (int i = 0; i < graph.size(); ++i) {
    if (i == graph.input_index()) continue;  // the data: uploaded, not computed
    const LayerSeconds s =
        LayerBench(graph, i, *layers[i], out_desc, backend, n, plan_workspace_bytes).time(timing);
    costs.forward_seconds[i] = s.forward;
    costs.backward_seconds[i] = s.backward;
  }
  costs.loss_seconds = time_loss(out_desc[graph.sink_index()], backend, n, timing);
  return with_copies(std::move(costs), bandwidth);
}

memory::StepCosts measure_graph_step_costs(const Graph& graph, const ComputeSettings& settings,
                                           Backend& backend, int64_t n,
                                           const CopyBandwidth& bandwidth,
                                           const std::string& conv_algorithm,
                                           const KernelTimingOptions& timing) {
  require_precision(backend, settings.precision);
  const std::vector<TensorDesc> out_desc = activation_descs(graph, settings, backend, n);
  std::vector<std::unique_ptr<Layer>> layers;
  for (int i = 0; i < graph.size(); ++i) {
    const std::vector<int>& in = graph.inputs(i);
    const TensorDesc* x = in.empty() ? nullptr : &out_desc[in[0]];
    layers.push_back(make_layer({graph, i, backend, x, out_desc[i], conv_algorithm, nullptr}));
    auto* conv = layers.back()->as_conv();
    if (conv && conv_algorithm == "auto") {
      conv->tune(backend, *x, out_desc[i], [&] { return free_device_bytes(backend); });
    }
  }
  return measure_step_costs(graph, layers, out_desc, backend, n, bandwidth, timing);
}

TimingBatch timing_batch(const Graph& graph, int64_t n, std::pmr::memory_resource* host) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TimingBatch batch{std::pmr::vector<float>(host), {}};
  batch.images.resize(static_cast<size_t>(graph.output_shape(graph.input_index()).per_sample() * n));
  for (float& v : batch.images) v = normal(rng);
  for (int64_t i = 0; i < n; ++i) {
    batch.labels.push_back(static_cast<int32_t>(i % graph.classes()));
  }
  return batch;
}

memory::StepCosts median_call_times(const std::vector<memory::StepCosts>& steps) {
  if (steps.empty()) throw std::invalid_argument("median_call_times: no steps");
  const size_t layers = steps.front().forward_seconds.size();
  auto median = [&](auto field) {
    std::vector<double> v;
    for (const memory::StepCosts& s : steps) v.push_back(field(s));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  memory::StepCosts costs;
  for (const memory::StepCosts& s : steps) {
    if (s.forward_seconds.size() != layers || s.backward_seconds.size() != layers) {
      throw std::invalid_argument("median_call_times: steps of different layer counts");
    }
  }
  for (size_t i = 0; i < layers; ++i) {
    costs.forward_seconds.push_back(median([i](const auto& s) { return s.forward_seconds[i]; }));
    costs.backward_seconds.push_back(median([i](const auto& s) { return s.backward_seconds[i]; }));
  }
  costs.loss_seconds = median([](const auto& s) { return s.loss_seconds; });
  costs.other_seconds = median([](const auto& s) { return s.other_seconds; });
  return costs;
}

memory::StepCosts measure_costs_in_steps(Network& net, int64_t n, int steps,
                                         const CopyBandwidth& bandwidth) {
  if (steps < 1) throw std::invalid_argument("measure_costs_in_steps: steps must be >= 1");
  Backend& backend = net.backend();
  const TimingBatch batch = timing_batch(net.graph(), n);
  backend.upload(batch.images.data(), net.input(n));
  backend.upload_labels(batch.labels.data(), net.labels(), n);
  const float scale = 1.0f / static_cast<float>(n);
  net.train_step(n, scale);  // untimed: first touches, lazily made primitives
  std::vector<memory::StepCosts> times;
  net.record_call_times(&times);
  try {
    for (int k = 0; k < steps; ++k) net.train_step(n, scale);
  } catch (...) {
    net.record_call_times(nullptr);
    throw;
  }
  net.record_call_times(nullptr);
  memory::StepCosts costs = median_call_times(times);
  return with_copies(std::move(costs), bandwidth);
}

InPlaceCosts measure_costs_in_place(const Graph& graph, Backend& backend,
                                    const NetworkOptions& options, int steps) {
  if (!options.memory_costs.forward_seconds.empty()) {
    throw std::invalid_argument("measure_costs_in_place: the options carry costs already");
  }
  // Each rank measures on its own: no batch-norm collective in these steps
  // (ranks whose costs come from a profile do not run them).
  NetworkOptions own = options;
  own.sum_over_ranks = nullptr;
  Network net(graph, backend, own);
  const memory::StepCosts* alone = net.plan_costs();
  if (alone == nullptr) {
    throw std::invalid_argument(std::string("measure_costs_in_place: memory.policy ") +
                                memory::policy_name(options.memory_policy) +
                                " plans no tensors with costs");
  }
  if (net.activation_placement().offloaded_bytes > 0) return {*alone, false};
  net.init_parameters(1);
  return {measure_costs_in_steps(net, options.max_batch, steps, copies_of(*alone)), true};
}

}  // namespace vtrain::worker
