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
  auto is_call = [](Op op) { return op == Op::kForward || op == Op::kLoss || op == Op::kBackward; };
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

Schedule layer_wise_schedule(const MemoryModel& model, Offload offload) {
  validate(model);
  const auto& layers = model.layers;
  const int n = static_cast<int>(layers.size());
  const int sink = n - 1;
  Schedule s;
  s.layer_wise = true;
  s.offload = offload;
  add_persistent_of_model(model, s);
  s.persistent.push_back({TensorKind::kOutput, 0});  // the data, written by the caller

  // Dataflow: consumers, the backward readers of every Y, and the last of them.
  std::vector<std::vector<int>> consumers(n);
  for (int i = 0; i < n; ++i) {
    for (int p : unique_inputs(layers[i])) consumers[p].push_back(i);
  }
  std::vector<int> last_backward_reader(n, -1);  // the lowest index: the last to run
  for (int p = 0; p < n; ++p) {
    int reader = -1;
    if (layers[p].backward_reads_output && !layers[p].is_input) reader = p;
    for (int c : consumers[p]) {
      if (layers[c].backward_reads_inputs && (reader < 0 || c < reader)) reader = c;
    }
    last_backward_reader[p] = reader;
  }
  // Offload Y(p) at its last forward consumer when the policy covers that
  // layer and a backward will read Y(p).
  s.offload_layer.assign(n, -1);
  std::vector<bool> offloads_something(n, false);
  for (int p = 1; p < n; ++p) {
    if (consumers[p].empty() || last_backward_reader[p] < 0) continue;
    const int at = consumers[p].back();
    const bool covered = offload == Offload::kAll || (offload == Offload::kConv && layers[at].is_conv);
    if (covered && layers[p].output_bytes > 0) {
      s.offload_layer[p] = at;
      offloads_something[at] = true;
    }
  }

  auto ev = [](Op op, TensorKind kind, int layer) { return ScheduleEvent{op, {kind, layer}}; };

  // ------------------------------------------------------------- forward
  auto forward = [&](std::vector<ScheduleEvent>& out, bool training) {
    for (int i = 1; i < n; ++i) {
      const LayerNode& l = layers[i];
      out.push_back(ev(Op::kAlloc, TensorKind::kOutput, i));
      if (l.state_bytes > 0) out.push_back(ev(Op::kAlloc, TensorKind::kState, i));
      if (l.forward_workspace > 0) out.push_back(ev(Op::kAlloc, TensorKind::kWorkspace, i));
      std::vector<int> offloaded;
      if (training) {
        for (int p : unique_inputs(l)) {
          if (s.offload_layer[p] == i) {
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
        const bool dead = training ? last_backward_reader[p] < 0 : true;
        const bool offloaded_here = training && s.offload_layer[p] == i;
        if (!layers[p].is_input && consumers[p].back() == i && dead && !offloaded_here) {
          out.push_back(ev(Op::kFree, TensorKind::kOutput, p));
        }
      }
    }
  };

  forward(s.evaluate, /*training=*/false);
  s.evaluate.push_back(ev(Op::kLoss, TensorKind::kOutput, sink));
  s.evaluate.push_back(ev(Op::kFree, TensorKind::kOutput, sink));

  forward(s.train, /*training=*/true);
  s.train.push_back(ev(Op::kAlloc, TensorKind::kGradient, sink));
  s.train.push_back(ev(Op::kLoss, TensorKind::kOutput, sink));
  if (last_backward_reader[sink] < 0) s.train.push_back(ev(Op::kFree, TensorKind::kOutput, sink));

  // ------------------------------------------------------------ backward
  std::vector<bool> on_host(n, false);    // offloaded and not yet prefetched
  std::vector<int> still_out(n, 0);       // per layer: its offloaded inputs still on the host
  std::vector<std::vector<int>> offloaded_at(n);
  for (int p = 0; p < n; ++p) {
    if (s.offload_layer[p] < 0) continue;
    on_host[p] = true;
    ++still_out[s.offload_layer[p]];
    offloaded_at[s.offload_layer[p]].push_back(p);
  }
  std::vector<bool> layer_prefetched(n, false);
  auto bring_back = [&](int p, std::vector<ScheduleEvent>& out) {
    out.push_back(ev(Op::kPrefetch, TensorKind::kOutput, p));
    on_host[p] = false;
    if (--still_out[s.offload_layer[p]] == 0) layer_prefetched[s.offload_layer[p]] = true;
  };
  s.prefetch_at.assign(n, {});
  for (int i = n - 1; i >= 1; --i) {
    const LayerNode& l = layers[i];
    auto& out = s.train;
    // On demand: what this backward reads and is still on the host.
    std::vector<int> reads;
    if (l.backward_reads_inputs) reads = unique_inputs(l);
    if (l.backward_reads_output) reads.push_back(i);
    std::vector<int> demand;
    for (int p : reads) {
      if (on_host[p]) {
        bring_back(p, out);
        demand.push_back(p);
      }
    }
    if (!demand.empty()) {
      out.push_back(ev(Op::kSyncMemory, TensorKind::kOutput, i));
      for (int p : demand) out.push_back(ev(Op::kFreeHost, TensorKind::kOutput, p));
    }
    // The window: overlapped with this layer's backward.
    std::vector<int> ahead;
    const int j = find_prefetch_layer(i, layers, offloads_something, layer_prefetched);
    if (j >= 0) {
      s.prefetch_at[i].push_back(j);
      for (int p : offloaded_at[j]) {
        if (on_host[p]) {
          bring_back(p, out);
          ahead.push_back(p);
        }
      }
    }
    // Input gradients this layer writes first (the consumer with the highest index).
    for (int p : unique_inputs(l)) {
      if (!layers[p].is_input && consumers[p].back() == i) {
        out.push_back(ev(Op::kAlloc, TensorKind::kGradient, p));
      }
    }
    if (l.backward_workspace > 0) out.push_back(ev(Op::kAlloc, TensorKind::kBackwardWorkspace, i));
    const bool scratch = needs_scratch(model, i, consumers);
    if (scratch) out.push_back(ev(Op::kAlloc, TensorKind::kScratch, i));
    out.push_back(ev(Op::kBackward, TensorKind::kOutput, i));
    if (!ahead.empty()) {
      out.push_back(ev(Op::kSyncMemory, TensorKind::kOutput, i));
      for (int p : ahead) out.push_back(ev(Op::kFreeHost, TensorKind::kOutput, p));
    }
    if (scratch) out.push_back(ev(Op::kFree, TensorKind::kScratch, i));
    if (l.backward_workspace > 0) out.push_back(ev(Op::kFree, TensorKind::kBackwardWorkspace, i));
    if (l.state_bytes > 0) out.push_back(ev(Op::kFree, TensorKind::kState, i));
    out.push_back(ev(Op::kFree, TensorKind::kGradient, i));
    std::vector<int> candidates = unique_inputs(l);
    candidates.push_back(i);
    for (int p : candidates) {
      if (!layers[p].is_input && last_backward_reader[p] == i) {
        out.push_back(ev(Op::kFree, TensorKind::kOutput, p));
      }
    }
  }
  return s;
}

Schedule make_schedule(const MemoryModel& model, Policy policy) {
  switch (policy) {
    case Policy::kNone: return network_wide_schedule(model);
    case Policy::kAll: return layer_wise_schedule(model, Offload::kAll);
    case Policy::kConv: return layer_wise_schedule(model, Offload::kConv);
    case Policy::kDyn: break;
  }
  throw MemoryError("make_schedule: policy dyn is resolved by choose_dynamic() first");
}

}  // namespace vtrain::memory
