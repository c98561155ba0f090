#include "memory/vdnn_plan.h"

#include <algorithm>

#include "memory/memory_error.h"

namespace vtrain::memory {

Policy parse_policy(const std::string& name) {
  return common::parse_named<MemoryError>(kPolicyNames, name, "memory policy");
}

const char* offload_name(Offload offload) {
  switch (offload) {
    case Offload::kNone: return "none";
    case Offload::kConv: return "conv";
    case Offload::kAll: return "all";
  }
  return "?";
}

void validate(const MemoryModel& model) {
  if (model.layers.empty() || !model.layers[0].is_input) {
    throw MemoryError("memory model: layer 0 must be the input");
  }
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const LayerNode& l = model.layers[i];
    if (i > 0 && l.is_input) {
      throw MemoryError("memory model: layer '" + l.name + "' is a second input");
    }
    for (int p : l.inputs) {
      if (p < 0 || p >= static_cast<int>(i)) {
        throw MemoryError("memory model: layer '" + l.name + "' reads layer " +
                          std::to_string(p) + ", which is not below it");
      }
    }
  }
}

size_t tensor_bytes(const MemoryModel& model, const TensorId& id) {
  const auto& layers = model.layers;
  switch (id.kind) {
    case TensorKind::kPersistent: return model.persistent[id.layer].bytes;
    case TensorKind::kOutput:
    case TensorKind::kGradient: return layers[id.layer].output_bytes;
    case TensorKind::kState: return layers[id.layer].state_bytes;
    case TensorKind::kBackwardWorkspace: return layers[id.layer].backward_workspace;
    case TensorKind::kWorkspace:
      if (id.layer >= 0) {
        return layers[id.layer].forward_workspace;
      } else {
        size_t bytes = 0;
        for (const LayerNode& l : layers) {
          bytes = std::max({bytes, l.forward_workspace, l.backward_workspace});
        }
        return bytes;
      }
    case TensorKind::kScratch: {
      // The largest input of a layer that may need one (all layers if shared).
      size_t bytes = 0;
      for (size_t i = 0; i < layers.size(); ++i) {
        if (id.layer >= 0 && static_cast<int>(i) != id.layer) continue;
        for (int p : layers[i].inputs) bytes = std::max(bytes, layers[p].output_bytes);
      }
      return bytes;
    }
  }
  return 0;
}

std::string tensor_name(const MemoryModel& model, const TensorId& id) {
  if (id.kind == TensorKind::kPersistent) return model.persistent[id.layer].name;
  if (id.layer < 0) return id.kind == TensorKind::kWorkspace ? "workspace" : "scratch";
  const std::string& layer = model.layers[id.layer].name;
  switch (id.kind) {
    case TensorKind::kOutput: return layer + ".y";
    case TensorKind::kGradient: return layer + ".dy";
    case TensorKind::kState: return layer + ".state";
    case TensorKind::kWorkspace: return layer + ".workspace";
    case TensorKind::kBackwardWorkspace: return layer + ".backward_workspace";
    case TensorKind::kScratch: return layer + ".scratch";
    case TensorKind::kPersistent: break;
  }
  return layer;
}

namespace {

std::vector<int> unique_inputs(const LayerNode& l) {
  std::vector<int> in = l.inputs;
  std::sort(in.begin(), in.end());
  in.erase(std::unique(in.begin(), in.end()), in.end());
  return in;
}

// Whether layer i's backward writes a scratch gradient: for an input whose
// gradient another consumer already wrote when i cannot accumulate, or for
// the data input when i computes dX anyway.
bool needs_scratch(const MemoryModel& model, int i,
                   const std::vector<std::vector<int>>& consumers) {
  const LayerNode& l = model.layers[i];
  std::vector<int> seen;
  for (int p : l.inputs) {
    const bool repeated = std::find(seen.begin(), seen.end(), p) != seen.end();
    seen.push_back(p);
    if (model.layers[p].is_input) {
      if (l.backward_needs_input_grad) return true;
      continue;
    }
    const bool written_before = repeated || consumers[p].back() > i;
    if (written_before && !l.backward_accumulates) return true;
  }
  return false;
}

void add_persistent_of_model(const MemoryModel& model, Schedule& s) {
  for (int k = 0; k < static_cast<int>(model.persistent.size()); ++k) {
    s.persistent.push_back({TensorKind::kPersistent, k});
  }
}

}  // namespace

Schedule network_wide_schedule(const MemoryModel& model) {
  validate(model);
  Schedule s;
  s.layer_wise = false;
  const int n = static_cast<int>(model.layers.size());
  s.offload_layer.assign(n, -1);
  s.prefetch_at.assign(n, {});
  s.actions.assign(n, TensorAction::kKeep);
  add_persistent_of_model(model, s);
  for (int i = 0; i < n; ++i) {
    s.persistent.push_back({TensorKind::kOutput, i});
    if (!model.layers[i].is_input) s.persistent.push_back({TensorKind::kGradient, i});
    if (model.layers[i].state_bytes > 0) s.persistent.push_back({TensorKind::kState, i});
  }
  if (tensor_bytes(model, {TensorKind::kWorkspace, -1}) > 0) {
    s.persistent.push_back({TensorKind::kWorkspace, -1});
  }
  if (tensor_bytes(model, {TensorKind::kScratch, -1}) > 0) {
    s.persistent.push_back({TensorKind::kScratch, -1});
  }
  for (int i = 1; i < n; ++i) {
    s.train.push_back({Op::kForward, {TensorKind::kOutput, i}});
    s.evaluate.push_back({Op::kForward, {TensorKind::kOutput, i}});
  }
  s.train.push_back({Op::kLoss, {TensorKind::kOutput, n - 1}});
  s.evaluate.push_back({Op::kLoss, {TensorKind::kOutput, n - 1}});
  for (int i = n - 1; i >= 1; --i) s.train.push_back({Op::kBackward, {TensorKind::kOutput, i}});
  return s;
}

std::vector<int> event_owners(const std::vector<ScheduleEvent>& events) {
  auto is_call = [](Op op) {
    return op == Op::kForward || op == Op::kLoss || op == Op::kBackward || op == Op::kRecompute;
  };
  int last_call = -1;
  for (size_t k = 0; k < events.size(); ++k) {
    if (is_call(events[k].op)) last_call = static_cast<int>(k);
  }
  std::vector<int> owner(events.size(), last_call);
  int next = -1;
  for (size_t k = events.size(); k-- > 0;) {
    if (is_call(events[k].op)) next = static_cast<int>(k);
    if (next >= 0) owner[k] = next;
  }
  return owner;
}

int find_prefetch_layer(int current, const std::vector<LayerNode>& layers,
                        const std::vector<bool>& offloaded, const std::vector<bool>& prefetched) {
  for (int id = current - 1; id >= 0; --id) {
    if (offloaded[id] && !prefetched[id]) return id;
    if (layers[id].is_conv) return -1;  // the end of the search window
  }
  return -1;
}

namespace {

// Consumers of every Y and the lowest-index layer whose backward reads it
// (the last backward to run that needs it; -1: none).
struct Dataflow {
  std::vector<std::vector<int>> consumers;
  std::vector<int> last_backward_reader;

  explicit Dataflow(const std::vector<LayerNode>& layers) {
    const int n = static_cast<int>(layers.size());
    consumers.assign(n, {});
    for (int i = 0; i < n; ++i) {
      for (int p : unique_inputs(layers[i])) consumers[p].push_back(i);
    }
    last_backward_reader.assign(n, -1);
    for (int p = 0; p < n; ++p) {
      int reader = -1;
      if (layers[p].backward_reads_output && !layers[p].is_input) reader = p;
      for (int c : consumers[p]) {
        if (layers[c].backward_reads_inputs && (reader < 0 || c < reader)) reader = c;
      }
      last_backward_reader[p] = reader;
    }
  }
};

// Builds a layer-wise schedule (vDNN, Rhu et al. Sec. III-A/B, with
// recomputation): the dataflow of the model, which outputs are offloaded
// or released for recomputation where, then the forward and backward event
// lists.
class LayerWiseBuilder {
 public:
  LayerWiseBuilder(const MemoryModel& model, const std::vector<TensorAction>& actions)
      : model_(model), layers_(model.layers), n_(static_cast<int>(layers_.size())),
        flow_(layers_) {
    s_.layer_wise = true;
    s_.actions = actions;
    add_persistent_of_model(model, s_);
    s_.persistent.push_back({TensorKind::kOutput, 0});  // the data, written by the caller
    place_offloads();
  }

  Schedule build() {
    const int sink = n_ - 1;
    forward(s_.evaluate, /*training=*/false);
    s_.evaluate.push_back(ev(Op::kLoss, TensorKind::kOutput, sink));
    s_.evaluate.push_back(ev(Op::kFree, TensorKind::kOutput, sink));

    forward(s_.train, /*training=*/true);
    s_.train.push_back(ev(Op::kAlloc, TensorKind::kGradient, sink));
    s_.train.push_back(ev(Op::kLoss, TensorKind::kOutput, sink));
    if (flow_.last_backward_reader[sink] < 0) {
      s_.train.push_back(ev(Op::kFree, TensorKind::kOutput, sink));
    }
    start_backward();
    for (int i = n_ - 1; i >= 1; --i) backward(i, s_.train);
    return std::move(s_);
  }

 private:
  enum class Where { kDevice, kHost, kGone };

  static ScheduleEvent ev(Op op, TensorKind kind, int layer) { return {op, {kind, layer}}; }

  // An offloaded Y(p) is copied out at its last forward consumer.
  void place_offloads() {
    s_.offload_layer.assign(n_, -1);
    offloads_something_.assign(n_, false);
    for (int p = 1; p < n_; ++p) {
      if (s_.actions[p] != TensorAction::kOffload) continue;
      const int at = flow_.consumers[p].back();
      s_.offload_layer[p] = at;
      offloads_something_[at] = true;
    }
  }

  void forward(std::vector<ScheduleEvent>& out, bool training) const {
    for (int i = 1; i < n_; ++i) {
      const LayerNode& l = layers_[i];
      out.push_back(ev(Op::kAlloc, TensorKind::kOutput, i));
      if (l.state_bytes > 0) out.push_back(ev(Op::kAlloc, TensorKind::kState, i));
      if (l.forward_workspace > 0) out.push_back(ev(Op::kAlloc, TensorKind::kWorkspace, i));
      std::vector<int> offloaded;
      if (training) {
        for (int p : unique_inputs(l)) {
          if (s_.offload_layer[p] == i) {
            out.push_back(ev(Op::kOffload, TensorKind::kOutput, p));
            offloaded.push_back(p);
          }
        }
      }
      out.push_back(ev(Op::kForward, TensorKind::kOutput, i));
      if (!offloaded.empty()) out.push_back(ev(Op::kSyncMemory, TensorKind::kOutput, i));
      for (int p : offloaded) out.push_back(ev(Op::kFree, TensorKind::kOutput, p));
      if (l.forward_workspace > 0) out.push_back(ev(Op::kFree, TensorKind::kWorkspace, i));
      if (!training && l.state_bytes > 0) out.push_back(ev(Op::kFree, TensorKind::kState, i));
      for (int p : unique_inputs(l)) {
        const bool dead = !training || flow_.last_backward_reader[p] < 0 ||
                          s_.actions[p] == TensorAction::kRecompute;
        const bool offloaded_here = training && s_.offload_layer[p] == i;
        if (!layers_[p].is_input && flow_.consumers[p].back() == i && dead && !offloaded_here) {
          out.push_back(ev(Op::kFree, TensorKind::kOutput, p));
        }
      }
    }
  }

  // Where every Y is when the backward pass starts.
  void start_backward() {
    where_.assign(n_, Where::kGone);
    where_[0] = Where::kDevice;
    for (int p = 1; p < n_; ++p) {
      const bool read_later = flow_.last_backward_reader[p] >= 0 || p == n_ - 1;
      if (!read_later || s_.actions[p] == TensorAction::kRecompute) continue;
      where_[p] = s_.actions[p] == TensorAction::kOffload ? Where::kHost : Where::kDevice;
    }
    still_out_.assign(n_, 0);
    offloaded_at_.assign(n_, {});
    for (int p = 0; p < n_; ++p) {
      if (s_.offload_layer[p] < 0) continue;
      ++still_out_[s_.offload_layer[p]];
      offloaded_at_[s_.offload_layer[p]].push_back(p);
    }
    layer_prefetched_.assign(n_, false);
    s_.prefetch_at.assign(n_, {});
  }

  void bring_back(int p, std::vector<ScheduleEvent>& out) {
    out.push_back(ev(Op::kPrefetch, TensorKind::kOutput, p));
    where_[p] = Where::kDevice;
    if (--still_out_[s_.offload_layer[p]] == 0) layer_prefetched_[s_.offload_layer[p]] = true;
  }

  // Brings back what `ps` lists that is still on the host; returns those.
  std::vector<int> bring_back_all(const std::vector<int>& ps, std::vector<ScheduleEvent>& out) {
    std::vector<int> brought;
    for (int p : ps) {
      if (where_[p] == Where::kHost) {
        bring_back(p, out);
        brought.push_back(p);
      }
    }
    return brought;
  }

  void sync_and_free_host(int i, const std::vector<int>& ps, std::vector<ScheduleEvent>& out) {
    if (ps.empty()) return;
    out.push_back(ev(Op::kSyncMemory, TensorKind::kOutput, i));
    for (int p : ps) out.push_back(ev(Op::kFreeHost, TensorKind::kOutput, p));
  }

  // Makes Y(p) present for the backward of layer i: prefetched (on demand,
  // into `fetched`) or recomputed from its inputs, made present first.
  // Recomputed tensors are added to `recomputed`.
  void make_present(int p, int i, std::vector<int>& fetched, std::vector<int>& recomputed,
                    std::vector<ScheduleEvent>& out) {
    if (where_[p] == Where::kDevice) return;
    if (where_[p] == Where::kHost) {
      bring_back(p, out);
      fetched.push_back(p);
      return;
    }
    const LayerNode& l = layers_[p];
    for (int q : unique_inputs(l)) make_present(q, i, fetched, recomputed, out);
    // The recomputation reads its inputs: prefetches issued for them land first.
    if (!fetched.empty()) {
      sync_and_free_host(i, fetched, out);
      fetched.clear();
    }
    out.push_back(ev(Op::kAlloc, TensorKind::kOutput, p));
    if (l.forward_workspace > 0) out.push_back(ev(Op::kAlloc, TensorKind::kWorkspace, p));
    out.push_back(ev(Op::kRecompute, TensorKind::kOutput, p));
    if (l.forward_workspace > 0) out.push_back(ev(Op::kFree, TensorKind::kWorkspace, p));
    where_[p] = Where::kDevice;
    // Inputs recomputed only for this one go as soon as it exists.
    for (int q : unique_inputs(l)) {
      auto it = std::find(recomputed.begin(), recomputed.end(), q);
      if (it != recomputed.end() && !needed_at(q, i)) {
        out.push_back(ev(Op::kFree, TensorKind::kOutput, q));
        where_[q] = Where::kGone;
        recomputed.erase(it);
      }
    }
    recomputed.push_back(p);
  }

  // Whether the backward of layer i or a later one reads Y(p).
  bool needed_at(int p, int i) const {
    const int last = flow_.last_backward_reader[p];
    return last >= 0 && last <= i;
  }

  void backward(int i, std::vector<ScheduleEvent>& out) {
    const LayerNode& l = layers_[i];
    // On demand: what this backward reads and is not on the device.
    std::vector<int> reads;
    if (l.backward_reads_inputs) reads = unique_inputs(l);
    if (l.backward_reads_output) reads.push_back(i);
    std::vector<int> fetched, recomputed;
    for (int p : reads) make_present(p, i, fetched, recomputed, out);
    sync_and_free_host(i, fetched, out);
    // Ancestors recomputed only to produce what this layer reads.
    for (int p : recomputed) {
      if (!needed_at(p, i)) {
        out.push_back(ev(Op::kFree, TensorKind::kOutput, p));
        where_[p] = Where::kGone;
      }
    }
    // The window (the paper's Fig. 10): overlapped with this layer's backward.
    std::vector<int> ahead;
    const int j = find_prefetch_layer(i, layers_, offloads_something_, layer_prefetched_);
    if (j >= 0) {
      s_.prefetch_at[i].push_back(j);
      ahead = bring_back_all(offloaded_at_[j], out);
    }
    // Input gradients this layer writes first (the consumer with the highest index).
    for (int p : unique_inputs(l)) {
      if (!layers_[p].is_input && flow_.consumers[p].back() == i) {
        out.push_back(ev(Op::kAlloc, TensorKind::kGradient, p));
      }
    }
    if (l.backward_workspace > 0) out.push_back(ev(Op::kAlloc, TensorKind::kBackwardWorkspace, i));
    const bool scratch = needs_scratch(model_, i, flow_.consumers);
    if (scratch) out.push_back(ev(Op::kAlloc, TensorKind::kScratch, i));
    out.push_back(ev(Op::kBackward, TensorKind::kOutput, i));
    sync_and_free_host(i, ahead, out);
    if (scratch) out.push_back(ev(Op::kFree, TensorKind::kScratch, i));
    if (l.backward_workspace > 0) out.push_back(ev(Op::kFree, TensorKind::kBackwardWorkspace, i));
    if (l.state_bytes > 0) out.push_back(ev(Op::kFree, TensorKind::kState, i));
    out.push_back(ev(Op::kFree, TensorKind::kGradient, i));
    std::vector<int> candidates = unique_inputs(l);
    candidates.push_back(i);
    for (int p : candidates) {
      if (!layers_[p].is_input && flow_.last_backward_reader[p] == i) {
        out.push_back(ev(Op::kFree, TensorKind::kOutput, p));
        where_[p] = Where::kGone;
      }
    }
  }

  const MemoryModel& model_;
  const std::vector<LayerNode>& layers_;
  const int n_;
  const Dataflow flow_;
  Schedule s_;
  std::vector<bool> offloads_something_;  // per layer: it offloads an input
  // Backward state.
  std::vector<Where> where_;                    // per Y
  std::vector<int> still_out_;                  // per layer: its offloaded inputs on the host
  std::vector<std::vector<int>> offloaded_at_;  // per layer: the inputs it offloads
  std::vector<bool> layer_prefetched_;
};

}  // namespace

std::vector<bool> plannable(const MemoryModel& model) {
  validate(model);
  const Dataflow flow(model.layers);
  const int n = static_cast<int>(model.layers.size());
  std::vector<bool> can(n, false);
  for (int p = 1; p < n - 1; ++p) {
    can[p] = model.layers[p].output_bytes > 0 && flow.last_backward_reader[p] >= 0 &&
             !flow.consumers[p].empty();
  }
  return can;
}

std::vector<TensorAction> offload_actions(const MemoryModel& model, Offload offload) {
  const std::vector<bool> can = plannable(model);
  const Dataflow flow(model.layers);
  std::vector<TensorAction> actions(model.layers.size(), TensorAction::kKeep);
  for (size_t p = 0; p < actions.size(); ++p) {
    if (!can[p]) continue;
    const int at = flow.consumers[p].back();
    const bool covered =
        offload == Offload::kAll || (offload == Offload::kConv && model.layers[at].is_conv);
    if (covered) actions[p] = TensorAction::kOffload;
  }
  return actions;
}

Schedule planned_schedule(const MemoryModel& model, const std::vector<TensorAction>& actions) {
  const std::vector<bool> can = plannable(model);
  if (actions.size() != model.layers.size()) {
    throw MemoryError("memory plan: " + std::to_string(actions.size()) + " actions for " +
                      std::to_string(model.layers.size()) + " layers");
  }
  for (size_t p = 0; p < actions.size(); ++p) {
    if (actions[p] != TensorAction::kKeep && !can[p]) {
      throw MemoryError("memory plan: the output of '" + model.layers[p].name + "' cannot be " +
                        (actions[p] == TensorAction::kOffload ? "offloaded" : "recomputed") +
                        ": it is the data, the logits, empty, or no backward reads it");
    }
  }
  Schedule s = LayerWiseBuilder(model, actions).build();
  s.offload = Offload::kNone;
  return s;
}

Schedule layer_wise_schedule(const MemoryModel& model, Offload offload) {
  validate(model);
  Schedule s = LayerWiseBuilder(model, offload_actions(model, offload)).build();
  s.offload = offload;
  return s;
}

Schedule make_schedule(const MemoryModel& model, Policy policy) {
  switch (policy) {
    case Policy::kNone: return network_wide_schedule(model);
    case Policy::kAll: return layer_wise_schedule(model, Offload::kAll);
    case Policy::kConv: return layer_wise_schedule(model, Offload::kConv);
    default: break;
  }
  throw MemoryError(std::string("make_schedule: policy ") + policy_name(policy) +
                    " is resolved by a planner first");
}

}  // namespace vtrain::memory
