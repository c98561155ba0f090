#include "worker/engine/schedule_interpreter.h"
#include "worker/device/op_calls.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace vtrain::worker {

using memory::Op;
using memory::ScheduleEvent;
using memory::TensorKind;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A layer call's word in labels and its trace category.
const char* call_kind(Op op) {
  switch (op) {
    case Op::kForward: return "forward";
    case Op::kRecompute: return "recompute";
    case Op::kBackward: return "backward";
    default: throw std::logic_error("call_kind: not a layer call");
  }
}

}  // namespace

ScheduleInterpreter::ScheduleInterpreter(const Graph& graph, Backend& backend,
                                         const std::vector<std::unique_ptr<Layer>>& layers,
                                         const std::vector<TensorDesc>& out_desc,
                                         const memory::MemoryModel& model,
                                         const memory::Schedule& schedule,
                                         const memory::Simulation& simulation,
                                         const ScheduleInterpreterOptions& options)
    : graph_(graph), backend_(backend), layers_(layers), out_desc_(out_desc), model_(model),
      schedule_(schedule), options_(options) {
  const int count = graph.size();
  train_text_ = event_text(schedule.train);
  evaluate_text_ = event_text(schedule.evaluate);
  memory::DevicePoolOptions pool_options;
  pool_options.planner = options.planner;
  pool_options.poison_freed = options.poison_freed;
  pool_options.capacity_note = options.capacity_note;
  pool_ = std::make_unique<memory::DevicePool>(backend, simulation.reservation, pool_options);
  pinned_ = std::make_unique<memory::PinnedPool>(backend, simulation.host_bytes);
  device_.assign(memory::kTensorKindCount,
                 std::vector<void*>(std::max<size_t>(count, model.persistent.size()), nullptr));
  host_.assign(count, nullptr);
  for (const memory::TensorId& id : schedule.persistent) {
    slot(id.kind, id.layer) =
        pool_->allocate(memory::tensor_bytes(model, id), memory::tensor_name(model, id));
  }
  for (int i = 0; i < count; ++i) {
    if (void* state = slot(TensorKind::kState, i)) layers[i]->bind_state(state);
  }
  labels_ = static_cast<int32_t*>(persistent("labels"));
  if (options.planned_convs) {
    workspace_bytes_ = options.plan_workspace_bytes;
    workspace_ = workspace_bytes_ > 0 ? persistent("conv_workspace") : nullptr;
  } else if (!schedule.layer_wise) {
    workspace_bytes_ = memory::tensor_bytes(model, {TensorKind::kWorkspace, -1});
    workspace_ = shared_workspace_;
  }
  if (options.planner == memory::Planner::kStatic) {
    pool_->plan_from_trace(simulation.step_trace, simulation.static_plan);
  }
  grad_written_.assign(count, false);
}

ScheduleInterpreter::~ScheduleInterpreter() {
  try {
    backend_.synchronize(StreamKind::kMemory);
  } catch (...) {
    // A failed copy was reported by the step that issued it.
  }
}

void* ScheduleInterpreter::persistent(const std::string& name) const {
  std::string known;
  for (size_t k = 0; k < model_.persistent.size(); ++k) {
    if (model_.persistent[k].name == name) return slot(TensorKind::kPersistent, static_cast<int>(k));
    known += (known.empty() ? "" : ", ") + model_.persistent[k].name;
  }
  throw std::logic_error("no persistent tensor '" + name + "' in the memory model (known: " +
                         known + ")");
}

float* ScheduleInterpreter::output(int i) const {
  return static_cast<float*>(slot(TensorKind::kOutput, i));
}

ScheduleInterpreter::EventText ScheduleInterpreter::event_text(
    const std::vector<ScheduleEvent>& events) const {
  EventText text;
  text.owner = memory::event_owners(events);
  for (size_t k = 0; k < events.size(); ++k) {
    const ScheduleEvent* call = text.owner[k] >= 0 ? &events[text.owner[k]] : nullptr;
    const std::string& name = call ? graph_.layer(call->tensor.layer).name : "";
    text.label.push_back(!call                    ? "step"
                         : call->op == Op::kLoss ? "loss"
                                                 : name + " " + call_kind(call->op));
    const Op op = events[k].op;
    const bool moves_tensor =
        op == Op::kAlloc || op == Op::kFree || op == Op::kOffload || op == Op::kPrefetch;
    text.tensor.push_back(moves_tensor ? memory::tensor_name(model_, events[k].tensor) : "");
  }
  return text;
}

void*& ScheduleInterpreter::slot(TensorKind kind, int layer) {
  if (layer < 0) return kind == TensorKind::kWorkspace ? shared_workspace_ : shared_scratch_;
  return device_[static_cast<int>(kind)][layer];
}

void* ScheduleInterpreter::slot(TensorKind kind, int layer) const {
  if (layer < 0) return kind == TensorKind::kWorkspace ? shared_workspace_ : shared_scratch_;
  return device_[static_cast<int>(kind)][layer];
}

Tensor ScheduleInterpreter::view(int layer, float* data, int64_t n) const {
  Tensor t{out_desc_[layer], data};
  t.desc.shape.n = n;
  return t;
}

void ScheduleInterpreter::set_trace(memory::ChromeTrace* trace) {
  trace_ = trace;
  pool_->record_timeline(trace != nullptr);  // memory_timeline() goes with the trace
  trace_in_use();
}

void ScheduleInterpreter::trace_in_use() {
  if (trace_) {
    trace_->counter("device bytes in use", trace_->now_us(),
                    static_cast<double>(pool_->bytes_in_use()));
  }
}

void ScheduleInterpreter::trace_memory_ops() {
  if (!trace_) return;
  const double now = trace_->now_us();
  for (const PendingCopy& c : pending_copies_) {
    trace_->span("memory stream", std::string(c.kind) + " " + c.name, c.kind, c.start_us,
                 now - c.start_us);
  }
  pending_copies_.clear();
}

void* ScheduleInterpreter::allocate_tensor(const memory::TensorId& id, const std::string& name) {
  void* p = pool_->allocate(memory::tensor_bytes(model_, id), name);
  slot(id.kind, id.layer) = p;
  trace_in_use();
  return p;
}

std::pair<void*, size_t> ScheduleInterpreter::workspace_for(int i, bool backward) {
  if (!schedule_.layer_wise || options_.planned_convs) {
    return {workspace_, workspace_bytes_};  // network-wide, or a plan's buffer
  }
  const memory::LayerNode& node = model_.layers[i];
  return backward ? std::pair{slot(TensorKind::kBackwardWorkspace, i), node.backward_workspace}
                  : std::pair{slot(TensorKind::kWorkspace, i), node.forward_workspace};
}

LayerCall ScheduleInterpreter::forward_call(int i, int64_t n) {
  const auto [ws, ws_bytes] = workspace_for(i, false);
  LayerCall call{backend_, n, {}, view(i, output(i), n), {}, ws, ws_bytes, {}, {}, {}, {}, {},
                 step_context_};
  for (int in : graph_.inputs(i)) call.in.push_back(view(in, output(in), n));
  return call;
}

Tensor ScheduleInterpreter::scratch_for(int i, const TensorDesc& desc) {
  void* scratch = slot(TensorKind::kScratch, schedule_.layer_wise ? i : -1);
  if (!scratch) {
    throw std::logic_error("layer '" + graph_.layer(i).name +
                           "': the memory schedule gave its backward no scratch gradient");
  }
  return Tensor{desc, static_cast<float*>(scratch)};
}

void ScheduleInterpreter::emit_grad(int i, int k, int64_t n, bool can_add,
                                    const std::function<void(const Tensor&, float)>& op) {
  const int producer = graph_.inputs(i)[k];
  if (producer == graph_.input_index()) return;  // the data needs no gradient
  const Tensor dx =
      view(producer, static_cast<float*>(slot(TensorKind::kGradient, producer)), n);
  if (!grad_written_[producer]) {
    op(dx, 0.0f);
  } else if (can_add) {
    op(dx, 1.0f);
  } else {
    const Tensor tmp = scratch_for(i, dx.desc);
    op(tmp, 0.0f);
    accumulate(backend_, tmp, dx, 1.0f);
  }
  grad_written_[producer] = true;
}

void ScheduleInterpreter::backward_layer(int i, int64_t n) {
  const std::vector<int>& inputs = graph_.inputs(i);
  const auto [ws, ws_bytes] = workspace_for(i, true);
  float* dy = static_cast<float*>(slot(TensorKind::kGradient, i));
  LayerCall call{backend_, n, {}, view(i, output(i), n), view(i, dy, n), ws, ws_bytes,
                 {}, {}, {}, {}, {}, step_context_};
  for (int in : inputs) call.in.push_back(view(in, output(in), n));
  call.emit_grad = [&](int k, bool can_add, const std::function<void(const Tensor&, float)>& op) {
    emit_grad(i, k, n, can_add, op);
  };
  call.needs_grad = [&](int k) { return inputs[k] != graph_.input_index(); };
  call.scratch_like = [&](const Tensor& like) { return scratch_for(i, like.desc); };
  call.gradients_ready = [&] {
    if (on_layer_gradients_ready) on_layer_gradients_ready(i);
  };
  call.sum_over_ranks = options_.sum_over_ranks;
  layers_[i]->backward(call);
}

void ScheduleInterpreter::run_memory_op(const ScheduleEvent& e, const std::string& tensor,
                                        int64_t n) {
  const int t = e.tensor.layer;
  switch (e.op) {
    case Op::kAlloc: {
      void* p = allocate_tensor(e.tensor, tensor);
      if (e.tensor.kind == TensorKind::kState) layers_[t]->bind_state(p);
      break;
    }
    case Op::kFree: {
      void*& p = slot(e.tensor.kind, t);
      pool_->release(p);
      p = nullptr;
      if (trace_) trace_->instant("memory stream", "release " + tensor, "release", trace_->now_us());
      trace_in_use();
      break;
    }
    case Op::kOffload: {
      const Tensor y = view(t, output(t), n);
      host_[t] = pinned_->allocate(y.bytes(), tensor);
      // The copy starts once the compute stream has produced Y.
      backend_.wait_event(StreamKind::kMemory, backend_.record_event(StreamKind::kCompute));
      backend_.copy_async(host_[t], y.data, y.bytes(), StreamKind::kMemory);
      offloaded_bytes_ += y.bytes();
      if (trace_) pending_copies_.push_back({tensor, "offload", trace_->now_us()});
      break;
    }
    case Op::kPrefetch: {
      void* p = allocate_tensor(e.tensor, tensor);
      // The block may have held a tensor the compute stream was still reading.
      backend_.wait_event(StreamKind::kMemory, backend_.record_event(StreamKind::kCompute));
      backend_.copy_async(p, host_[t], view(t, nullptr, n).bytes(), StreamKind::kMemory);
      if (trace_) pending_copies_.push_back({tensor, "prefetch", trace_->now_us()});
      break;
    }
    case Op::kSyncMemory:
      backend_.synchronize(StreamKind::kMemory);
      trace_memory_ops();
      break;
    case Op::kFreeHost:
      pinned_->release(host_[t]);
      host_[t] = nullptr;
      break;
    case Op::kForward:
    case Op::kBackward:
    case Op::kRecompute:
    case Op::kLoss:
      throw std::logic_error("run_memory_op: a layer call or the loss");
  }
}

void ScheduleInterpreter::run_layer_call(const ScheduleEvent& e, const std::string& label,
                                         int64_t n, bool training) {
  const double start = trace_ ? trace_->now_us() : 0;
  const bool timed = call_times_ && training;
  const auto clock_start = timed ? Clock::now() : Clock::time_point{};
  const int i = e.tensor.layer;
  if (e.op == Op::kForward) {
    LayerCall call = forward_call(i, n);
    if (training) call.sum_over_ranks = options_.sum_over_ranks;
    layers_[i]->forward(call, training);
  } else if (e.op == Op::kRecompute) {
    LayerCall call = forward_call(i, n);
    layers_[i]->recompute(call);
  } else {
    backward_layer(i, n);
  }
  if (trace_ || timed) backend_.synchronize(StreamKind::kCompute);  // the work, not its issue
  if (trace_) {
    trace_->span("compute", label, call_kind(e.op), start, trace_->now_us() - start,
                 layer_type_name(graph_.layers()[i].type));
  }
  if (timed) {
    const double seconds = seconds_since(clock_start);
    calls_seconds_ += seconds;
    if (e.op == Op::kForward) call_times_->back().forward_seconds[i] = seconds;
    if (e.op == Op::kBackward) call_times_->back().backward_seconds[i] = seconds;
  }
}

LossStats ScheduleInterpreter::run_loss(int t, int64_t n, bool training, float loss_scale) {
  const Tensor logits = view(t, output(t), n);
  if (!training) {
    if (logits_out_ != nullptr) backend_.download(logits, logits_out_);
    return softmax_cross_entropy(backend_, logits, labels_, loss_scale, nullptr);
  }
  const Tensor dlogits = view(t, static_cast<float*>(slot(TensorKind::kGradient, t)), n);
  const auto start = Clock::now();
  const LossStats stats =
      softmax_cross_entropy(backend_, logits, labels_, loss_scale, &dlogits, label_smoothing_);
  grad_written_[t] = true;
  if (call_times_) {
    backend_.synchronize(StreamKind::kCompute);
    call_times_->back().loss_seconds = seconds_since(start);
    calls_seconds_ += call_times_->back().loss_seconds;
  }
  return stats;
}

LossStats ScheduleInterpreter::run(const std::vector<ScheduleEvent>& events,
                                   const EventText& text, int64_t n, bool training,
                                   float loss_scale) {
  if (n < 1 || n > options_.max_batch) {
    throw std::invalid_argument("Network: batch " + std::to_string(n) + " outside [1, " +
                                std::to_string(options_.max_batch) + "]");
  }
  LossStats stats;
  int current = -2;  // the layer call whose label the pool has
  for (size_t k = 0; k < events.size(); ++k) {
    const ScheduleEvent& e = events[k];
    if (text.owner[k] != current) {
      current = text.owner[k];
      pool_->set_label(text.label[k]);
    }
    if (e.op == Op::kForward || e.op == Op::kBackward || e.op == Op::kRecompute) {
      run_layer_call(e, text.label[k], n, training);
    } else if (e.op == Op::kLoss) {
      stats = run_loss(e.tensor.layer, n, training, loss_scale);
    } else {
      run_memory_op(e, text.tensor[k], n);
    }
  }
  return stats;
}

void ScheduleInterpreter::abandon_step() {
  try {
    backend_.synchronize(StreamKind::kMemory);
  } catch (...) {
    // The step's own error is the one to report.
  }
  pending_copies_.clear();
  // Everything the schedule allocates per step goes back to the pools.
  std::vector<std::vector<bool>> keep(memory::kTensorKindCount,
                                      std::vector<bool>(device_[0].size(), false));
  for (const memory::TensorId& id : schedule_.persistent) {
    // The shared workspace and scratch (layer -1) are not in device_.
    if (id.layer >= 0) keep[static_cast<int>(id.kind)][id.layer] = true;
  }
  for (int kind = 0; kind < memory::kTensorKindCount; ++kind) {
    for (size_t l = 0; l < device_[kind].size(); ++l) {
      if (device_[kind][l] && !keep[kind][l]) {
        pool_->release(device_[kind][l]);
        device_[kind][l] = nullptr;
      }
    }
  }
  for (void*& h : host_) {
    if (h) pinned_->release(h);
    h = nullptr;
  }
  if (pool_->in_step()) pool_->end_step();
}

LossStats ScheduleInterpreter::train_step(int64_t n, float loss_scale, float label_smoothing) {
  const auto start = Clock::now();
  label_smoothing_ = label_smoothing;
  if (call_times_) {
    memory::StepCosts times;
    times.forward_seconds.assign(graph_.size(), 0.0);
    times.backward_seconds.assign(graph_.size(), 0.0);
    call_times_->push_back(std::move(times));
    calls_seconds_ = 0;
  }
  std::fill(grad_written_.begin(), grad_written_.end(), false);
  offloaded_bytes_ = 0;
  pool_->begin_step();
  LossStats stats;
  try {
    stats = run(schedule_.train, train_text_, n, /*training=*/true, loss_scale);
  } catch (...) {
    if (call_times_) call_times_->pop_back();
    abandon_step();
    throw;
  }
  pool_->end_step();
  if (call_times_) {
    backend_.synchronize(StreamKind::kCompute);
    call_times_->back().other_seconds = std::max(0.0, seconds_since(start) - calls_seconds_);
  }
  return stats;
}

LossStats ScheduleInterpreter::evaluate(int64_t n, float* logits) {
  logits_out_ = logits;
  try {
    const LossStats stats = run(schedule_.evaluate, evaluate_text_, n, /*training=*/false, 1.0f);
    logits_out_ = nullptr;
    return stats;
  } catch (...) {
    logits_out_ = nullptr;
    abandon_step();
    throw;
  }
}

}  // namespace vtrain::worker
