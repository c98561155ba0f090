#include "worker/engine/network.h"

#include <algorithm>
#include <stdexcept>

#include "common/text.h"
#include "memory/memory_error.h"
#include "worker/engine/layers/conv_layer.h"
#include "worker/engine/fusion_pass.h"
#include "worker/engine/op_scratch.h"
#include "worker/engine/layers/layer_registry.h"
#include "worker/engine/layers/relu_layer.h"
#include "worker/engine/schedule_interpreter.h"

namespace vtrain::worker {

std::vector<TensorDesc> activation_descs(const Graph& graph, const ComputeSettings& settings,
                                         const Backend& backend, int64_t n) {
  return activation_descs(
      graph, settings, [&](int64_t channels) { return backend.preferred_layout(channels); }, n);
}

std::vector<TensorDesc> activation_descs(const Graph& graph, const ComputeSettings& settings,
                                         const std::function<Layout(int64_t)>& preferred_layout,
                                         int64_t n) {
  std::vector<TensorDesc> descs(graph.size());
  for (int i = 0; i < graph.size(); ++i) {
    Shape shape = graph.output_shape(i);
    shape.n = n;
    Layout layout = Layout::kPlain;
    switch (graph.layer(i).type) {
      case LayerType::kInput:
      case LayerType::kFc: layout = Layout::kPlain; break;
      // Element-wise layers keep their input's layout: no reorder between them.
      case LayerType::kRelu:
      case LayerType::kSilu:
      case LayerType::kGelu:
      case LayerType::kSigmoid:
      case LayerType::kRelu6:
      case LayerType::kDropout:
      case LayerType::kMul:  // its broadcast factor is C x 1 x 1, the same in every layout
      case LayerType::kBatchNorm:
      case LayerType::kPool: layout = descs[graph.inputs(i)[0]].layout; break;
      case LayerType::kConv:
      case LayerType::kAdd:
      case LayerType::kConcat: layout = preferred_layout(shape.c); break;
    }
    descs[i] = {shape, layout, settings.activation_type()};
  }
  return descs;
}

void require_precision(const Backend& backend, common::Precision precision) {
  if (std::optional<std::string> why = backend.precision_unavailable(precision)) {
    throw BackendError(*why);
  }
}

std::optional<std::string> conv_algorithm_refusal(const Graph& graph,
                                                  const ComputeSettings& settings,
                                                  Backend& backend, const std::string& algorithm,
                                                  int64_t n) {
  if (algorithm == "auto") return std::nullopt;
  const std::vector<TensorDesc> descs = activation_descs(graph, settings, backend, n);
  std::vector<ConvAlgorithmChoice> choices;
  for (int i = 0; i < graph.size(); ++i) {
    if (graph.layer(i).type != LayerType::kConv) continue;
    choices.emplace_back(backend, conv_problem(graph.layer(i), descs[graph.inputs(i)[0]], descs[i]),
                         algorithm, graph.layer(i).name);
  }
  std::vector<const ConvAlgorithmChoice*> views;
  for (const ConvAlgorithmChoice& c : choices) views.push_back(&c);
  return named_algorithm_refusal(algorithm, views, backend.device_info().backend);
}

namespace {

// Checks that a plan's executions each name a conv layer of the graph and
// keep their workspace segments inside the plan's buffer.
void check_conv_executions(const Graph& graph, const NetworkOptions& options) {
  for (const ConvLayerExecution& e : options.conv_executions) {
    const int i = graph.find(e.layer);
    if (i < 0 || graph.layer(i).type != LayerType::kConv) {
      throw BackendError("the plan configures '" + e.layer + "', which is not a conv layer of " +
                         "the model");
    }
    for (const ConvKernelExecution& k : e.kernels) {
      if (k.workspace_offset + k.workspace_bytes > options.conv_workspace_bytes) {
        throw BackendError("layer '" + e.layer + "': workspace segment [" +
                           std::to_string(k.workspace_offset) + ", " +
                           std::to_string(k.workspace_offset + k.workspace_bytes) +
                           ") lies outside the plan's workspace of " +
                           std::to_string(options.conv_workspace_bytes) + " bytes");
      }
    }
  }
}

// A plan's execution of conv layer `name` (null without a plan).
const ConvLayerExecution* execution_of(const NetworkOptions& options, const std::string& name) {
  if (options.conv_executions.empty()) return nullptr;
  for (const ConvLayerExecution& e : options.conv_executions) {
    if (e.layer == name) return &e;
  }
  throw BackendError("layer '" + name + "': the plan has no convolution configuration for it");
}

}  // namespace

Network::Network(const Graph& graph, Backend& backend, const NetworkOptions& options)
    : graph_(graph), backend_(backend), options_(options) {
  if (options.max_batch < 1) throw std::invalid_argument("Network: max_batch must be >= 1");
  require_precision(backend, options.settings.precision);
  out_desc_ = activation_descs(graph, options.settings, backend, options.max_batch);
  check_conv_executions(graph, options);
  make_layers();
  check_named_algorithm();
  // Parameter layout (the memory part allocates the buffers below).
  const int64_t align = kComputeAlignBytes / static_cast<int64_t>(element_bytes(options.settings.activation_type()));
  for (int i = 0; i < graph.size(); ++i) {
    if (const int64_t c = layers_[i]->param_count()) {
      param_ranges_.push_back({i, param_count_, c});
      param_count_ += c;
      if (layers_[i]->reads_compute_params()) {
        compute_offsets_.push_back((compute_count_ + align - 1) / align * align);
        compute_count_ = compute_offsets_.back() + c;
      } else {
        compute_offsets_.push_back(-1);
      }
    }
    buffer_count_ += layers_[i]->buffer_count();
  }
  reserve_op_scratch();
  // Whether memory fits is decided on the least-workspace algorithms (on
  // sizes): timing only starts where some schedule can fit, so a model far
  // too big is refused as fast as under a named algorithm, and the timed
  // choice never decides whether a plan fits (plan_memory falls back).
  choose_smallest_workspaces();
  if (options.conv_algorithm == "auto" && options.time_convolutions) {
    describe_memory();
    const std::optional<size_t> least = least_pool_capacity();
    if (!least || *least <= room()) tune_convolutions();
  }
  plan_memory();
  // Last: the layers timed alone before (costs measured in place for the
  // memory plan) run on storage of their own, a paired relu's convolution's
  // unbound, so they time the layers unpaired.
  pair_bias_with_relu();
}

// A prefetch still copying must finish before the pool (its staging) goes.
Network::~Network() {
  try {
    drop_prefetch();
  } catch (...) {  // a device error: nothing is left to protect
  }
}

// The ops' own scratch is taken now, so the pool is sized around it; a
// device too small for it is refused like one too small for the pool.
void Network::reserve_op_scratch() {
  const size_t need = op_scratch_bytes(graph_, out_desc_, backend_);
  const size_t held = backend_.scratch_reserved();
  const size_t device = backend_.device_info().memory_bytes;
  const size_t in_use = backend_.device_bytes_in_use();
  if (need > held && device < in_use + (need - held)) {
    throw memory::OutOfMemoryError(
        "no device memory left for the network: the device serves " +
        common::format_bytes_fixed(device) + " (device.memory_limit or its memory), " +
        common::format_bytes_fixed(in_use) + " are in use and the ops' scratch needs " +
        common::format_bytes_fixed(need));
  }
  backend_.reserve_scratch(need);
}

// A named conv.algorithm that no convolution offers (a typo, or another
// backend's name) is refused, where each kind would otherwise quietly run
// the backend's first algorithm.
void Network::check_named_algorithm() const {
  std::vector<const ConvAlgorithmChoice*> choices;
  for (const auto& layer : layers_) {
    auto* conv = layer->as_conv();
    if (conv && !conv->planned()) choices.push_back(&conv->choice());
  }
  if (auto why = named_algorithm_refusal(options_.conv_algorithm, choices,
                                         backend_.device_info().backend)) {
    throw BackendError(*why);
  }
}

void Network::make_layers() {
  for (int i = 0; i < graph_.size(); ++i) {
    const LayerSpec& spec = graph_.layer(i);
    const std::vector<int>& in = graph_.inputs(i);
    try {
      const LayerSite site{graph_,
                           i,
                           backend_,
                           in.empty() ? nullptr : &out_desc_[in[0]],
                           out_desc_[i],
                           options_.conv_algorithm,
                           spec.type == LayerType::kConv ? execution_of(options_, spec.name)
                                                         : nullptr};
      layers_.push_back(make_layer(site));
    } catch (const BackendError& e) {
      throw BackendError("layer '" + spec.name + "': " + e.what());
    }
  }
}

void Network::pair_bias_with_relu() {
  // The pass chose conv and relu layers by their specs' types.
  for (const FusedPair& pair : fuse_conv_bias_relu(graph_, out_desc_, backend_, options_.settings)) {
    ConvLayer& conv = *layers_[pair.from]->as_conv();
    conv.leave_bias_to_relu();
    layers_[pair.into]->as_relu()->take_bias_of(conv);
    ++bias_relu_pairs_;
  }
}

void Network::choose_smallest_workspaces() {
  for (const auto& layer : layers_) {
    auto* conv = layer->as_conv();
    if (conv && !conv->planned()) conv->choice().choose_smallest();
  }
}

void Network::tune_convolutions() {
  tuned_ = true;
  for (int i = 0; i < graph_.size(); ++i) {
    auto* conv = layers_[i]->as_conv();
    if (!conv || conv->planned()) continue;  // a plan fixes its algorithms
    conv->tune(backend_, out_desc_[graph_.inputs(i)[0]], out_desc_[i], [this] { return room(); });
  }
}

void Network::bind_layers() {
  params_ = static_cast<float*>(interpreter_->persistent("params"));
  grads_ = static_cast<float*>(interpreter_->persistent("grads"));
  buffers_ = static_cast<float*>(interpreter_->persistent("buffers"));
  labels_ = static_cast<int32_t*>(interpreter_->persistent("labels"));
  if (options_.prefetch_input) {
    input_staging_ = static_cast<float*>(interpreter_->persistent("input_staging"));
  }
  const DataType compute_type = options_.settings.activation_type();
  compute_params_ = has_compute_copy() ? interpreter_->persistent("compute_params") : nullptr;
  int64_t p = 0, b = 0;
  size_t range = 0;
  for (const auto& layer : layers_) {
    const void* compute = nullptr;
    if (layer->param_count() > 0) {
      if (compute_params_ && compute_offsets_[range] >= 0) compute = compute_range(range);
      ++range;
    }
    layer->bind({params_ + p, grads_ + p, buffers_ + b, compute, compute_type});
    p += layer->param_count();
    b += layer->buffer_count();
  }
  interpreter_->on_layer_gradients_ready = [this](int i) {
    if (!on_gradients_ready) return;
    for (const ParamRange& r : param_ranges_) {
      if (r.layer == i) on_gradients_ready(r);
    }
  };
}

void Network::init_parameters(uint64_t seed) {
  Rng rng(seed);
  for (auto& layer : layers_) layer->init(rng, backend_);
  compute_params_stale_ = true;
}

void* Network::compute_range(size_t range) const {
  return static_cast<char*>(compute_params_) +
         compute_offsets_[range] * static_cast<int64_t>(element_bytes(options_.settings.activation_type()));
}

bool Network::has_compute_copy() const {
  return options_.settings.activation_type() != DataType::kF32 && compute_count_ > 0;
}

TensorDesc Network::compute_params_desc() const {
  return vector_desc(compute_count_, options_.settings.activation_type());
}

// Range by range: each starts aligned in the compute copy (the padding
// between them is never read); the ranges of layers that read their f32
// parameters have none.
void Network::refresh_compute_params() {
  if (compute_params_ && compute_params_stale_) {
    for (size_t i = 0; i < param_ranges_.size(); ++i) {
      if (compute_offsets_[i] < 0) continue;
      const ParamRange& r = param_ranges_[i];
      backend_.convert(Tensor{vector_desc(r.count), params_ + r.offset},
                       Tensor{vector_desc(r.count, options_.settings.activation_type()), compute_range(i)});
    }
  }
  compute_params_stale_ = false;
}

Tensor Network::input(int64_t n) const {
  const int data = graph_.input_index();
  Tensor t{out_desc_[data], interpreter_->output(data)};
  t.desc.shape.n = n;
  return t;
}

// With a staging, a batch not prefetched goes through it too: a half
// input's upload would otherwise take as much again in the backend's
// scratch.
bool Network::upload_input(const float* host, int64_t n) {
  const Tensor dst = input(n);
  const std::optional<Prefetch> p = prefetch_;
  drop_prefetch();  // so that `host` may change on return (the copy ran during a step)
  const bool prefetched = p && p->host == host && p->n == n;
  if (input_staging_ == nullptr) {
    backend_.upload(host, dst);
    return false;
  }
  const Tensor staging = input_staging(n);
  if (!prefetched) backend_.copy_async(staging.data, host, staging.bytes(), StreamKind::kCompute);
  backend_.convert(staging, dst);
  staging_read_ = backend_.record_event(StreamKind::kCompute);
  if (!prefetched) backend_.synchronize(StreamKind::kCompute);  // `host` may change on return
  return prefetched;
}

void Network::prefetch_input(const float* host, int64_t n) {
  if (input_staging_ == nullptr) {
    throw std::logic_error("prefetch_input: the network was built without prefetch_input");
  }
  if (n < 1 || n > options_.max_batch) {
    throw std::invalid_argument("prefetch_input: " + std::to_string(n) +
                                " samples for a network of at most " +
                                std::to_string(options_.max_batch));
  }
  drop_prefetch();
  memory::ChromeTrace* const trace = interpreter_->trace();
  const double issued_us = trace ? trace->now_us() : 0.0;
  backend_.wait_event(StreamKind::kMemory, staging_read_);
  const Tensor staging = input_staging(n);
  backend_.copy_async(staging.data, host, staging.bytes(), StreamKind::kMemory);
  prefetch_ = Prefetch{host, n, backend_.record_event(StreamKind::kMemory)};
  // Traced steps wait for every call (set_trace), the copy too: its span.
  if (trace) {
    backend_.synchronize(prefetch_->copied);
    trace->span("memory stream", "prefetch input", "prefetch", issued_us,
                trace->now_us() - issued_us, std::to_string(n) + " samples");
  }
}

Tensor Network::input_staging(int64_t n) const {
  return Tensor{{input(n).shape(), Layout::kPlain, DataType::kF32}, input_staging_};
}

void Network::drop_prefetch() {
  if (!prefetch_) return;
  backend_.synchronize(prefetch_->copied);
  prefetch_.reset();
}

void Network::set_step_context(const StepContext& context) {
  interpreter_->set_step_context(context);
}

LossStats Network::train_step(int64_t n, float loss_scale, float label_smoothing) {
  refresh_compute_params();
  const LossStats stats = interpreter_->train_step(n, loss_scale, label_smoothing);
  compute_params_stale_ = true;  // the update that follows changes them again
  return stats;
}

void Network::train_without_samples() {
  compute_params_stale_ = true;  // the update that follows changes them, as after train_step
  if (!options_.sum_over_ranks) return;
  const int layers = static_cast<int>(layers_.size());
  for (int i = 0; i < layers; ++i) layers_[i]->train_without_samples(options_.sum_over_ranks, false);
  for (int i = layers - 1; i >= 0; --i) {
    layers_[i]->train_without_samples(options_.sum_over_ranks, true);
  }
}

LossStats Network::evaluate(int64_t n, float* logits) {
  refresh_compute_params();
  return interpreter_->evaluate(n, logits);
}

size_t Network::workspace_bytes() const { return interpreter_->shared_workspace().second; }

void Network::set_trace(memory::ChromeTrace* trace) { interpreter_->set_trace(trace); }

void Network::record_call_times(std::vector<memory::StepCosts>* steps) {
  interpreter_->record_call_times(steps);
}

MemoryStats Network::memory_stats() const {
  const memory::DevicePool& pool = interpreter_->pool();
  MemoryStats s = fixed_stats_;
  s.reservation = pool.reservation();
  s.step_peak = pool.step_peak_bytes();
  s.step_average = pool.step_average_bytes();
  s.offloaded_bytes = interpreter_->offloaded_bytes();
  s.static_plan = pool.static_plan();
  return s;
}

const std::vector<memory::TimelineSample>& Network::memory_timeline() const {
  return interpreter_->pool().timeline();
}

const std::vector<memory::DsaBlock>& Network::last_step_trace() const {
  return interpreter_->pool().last_step_trace();
}

std::vector<float> Network::download_parameters() const {
  return download_floats(backend_, params_, param_count_);
}

void Network::upload_parameters(const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != param_count_) {
    throw std::invalid_argument("upload_parameters: " + std::to_string(values.size()) +
                                " values for " + std::to_string(param_count_) + " parameters");
  }
  upload_floats(backend_, values, params_);
  compute_params_stale_ = true;
}

std::vector<float> Network::download_buffers() const {
  return download_floats(backend_, buffers_, buffer_count_);
}

void Network::upload_buffers(const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != buffer_count_) {
    throw std::invalid_argument("upload_buffers: " + std::to_string(values.size()) +
                                " values for " + std::to_string(buffer_count_) + " buffers");
  }
  upload_floats(backend_, values, buffers_);
}

std::vector<std::string> Network::algorithm_summary() const {
  std::vector<std::string> lines;
  for (const auto& layer : layers_) {
    const std::string a = layer->algorithms(backend_);
    if (!a.empty()) lines.push_back(layer->spec().name + ": " + a);
  }
  return lines;
}

}  // namespace vtrain::worker
