// Network's memory planning: the capacity, the memory part's model of the
// network, the schedule of memory.policy (a static one, the dynamic
// policy's, or a per-tensor plan), and the interpreter that runs it.
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "common/text.h"
#include "memory/dynamic_policy.h"
#include "memory/memory_error.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/layers/conv_layer.h"
#include "worker/engine/network.h"
#include "worker/engine/schedule_interpreter.h"

namespace vtrain::worker {
namespace {

// The memory part's view of a layer (what its backward reads and writes
// comes from the layer itself).
memory::LayerNode memory_node(const Graph& graph, int i, const TensorDesc& out,
                              const Layer& layer) {
  const LayerSpec& spec = graph.layer(i);
  memory::LayerNode node;
  node.name = spec.name;
  node.is_input = spec.type == LayerType::kInput;
  node.is_conv = spec.type == LayerType::kConv;
  node.cheap = !node.is_input && !node.is_conv && spec.type != LayerType::kFc;
  node.inputs = graph.inputs(i);
  node.output_bytes = out.bytes();
  node.state_bytes = layer.state_bytes();
  layer.describe_backward(node);
  return node;
}

// Throws std::invalid_argument unless `costs` has one entry per layer.
void check_costs(const memory::StepCosts& costs, size_t layers) {
  if (costs.forward_seconds.size() != layers || costs.backward_seconds.size() != layers) {
    throw std::invalid_argument("NetworkOptions.memory_costs: " +
                                std::to_string(costs.forward_seconds.size()) + " forward and " +
                                std::to_string(costs.backward_seconds.size()) +
                                " backward times for the " + std::to_string(layers) +
                                " layers of the graph");
  }
}

}  // namespace

size_t Network::allocations_after() const {
  size_t bytes = 0;
  for (size_t per_parameter : options_.allocations_after_network) {
    bytes += backend_.allocation_bytes(static_cast<size_t>(param_count_) * per_parameter);
  }
  return bytes;
}

size_t Network::room() const {
  if (options_.memory_capacity > 0) return options_.memory_capacity;
  const size_t device = backend_.device_info().memory_bytes;
  const size_t in_use = backend_.device_bytes_in_use();
  const size_t after = allocations_after();
  if (device <= in_use + after) {
    // (A capacity of 0 would mean "unbounded" to the simulator.)
    throw memory::OutOfMemoryError(
        "no device memory left for the network: the device serves " +
        common::format_bytes_fixed(device) + " (device.memory_limit or its memory), " +
        common::format_bytes_fixed(in_use) + " are in use (" +
        common::format_bytes_fixed(backend_.scratch_reserved()) + " of it the ops' scratch) and the " +
        "optimizer's state needs " +
        common::format_bytes_fixed(after));
  }
  return device - in_use - after;
}

void Network::describe_memory() {
  model_ = {};
  auto floats = [](int64_t count) {
    return static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float);
  };
  model_.persistent = {{"params", floats(param_count_)},
                       {"grads", floats(param_count_)},
                       {"buffers", floats(buffer_count_)},
                       {"labels", static_cast<size_t>(options_.max_batch) * sizeof(int32_t)}};
  if (has_compute_copy()) {
    model_.persistent.push_back({"compute_params", compute_params_desc().bytes()});
  }
  if (options_.prefetch_input) {
    model_.persistent.push_back(
        {"input_staging", floats(out_desc_[graph_.input_index()].shape.elements())});
  }
  if (!options_.conv_executions.empty() && options_.conv_workspace_bytes > 0) {
    model_.persistent.push_back({"conv_workspace", options_.conv_workspace_bytes});
  }
  for (int i = 0; i < graph_.size(); ++i) {
    model_.layers.push_back(memory_node(graph_, i, out_desc_[i], *layers_[i]));
  }
}

memory::Simulation Network::plan_dynamic(size_t capacity) {
  // The kernels' candidates with their tuned times (Sec. III-C).
  std::vector<memory::KernelChoices> kernels;
  for (int i = 0; i < graph_.size(); ++i) {
    auto* conv = layers_[i]->as_conv();
    if (!conv || conv->planned()) continue;
    for (ConvKind kind : conv->kernels()) {
      memory::KernelChoices k{i, kind, {}};
      for (const auto& [a, seconds] : conv->choice().timed_candidates(kind)) {
        k.options.push_back({a.name, a.workspace_bytes, seconds});
      }
      kernels.push_back(std::move(k));
    }
  }
  memory::DynamicDecision d =
      memory::choose_dynamic(model_, kernels, capacity, options_.memory_planner);
  for (size_t k = 0; k < kernels.size(); ++k) {
    static_cast<ConvLayer&>(*layers_[kernels[k].layer])
        .choice()
        .choose(kernels[k].kind, kernels[k].options[d.choice[k]].name);
  }
  memory::apply_choice(model_, kernels, d.choice);
  schedule_ = memory::layer_wise_schedule(model_, d.offload);
  fixed_stats_.policy = "dyn (" + d.pass + ")";
  return std::move(d.simulation);
}

bool Network::measures_costs_in_place() const {
  return options_.memory_costs.forward_seconds.empty() && options_.memory_actions.empty() &&
         memory::plans_per_tensor(options_.memory_policy);
}

memory::StepCosts Network::step_costs() {
  if (!options_.memory_costs.forward_seconds.empty()) {
    check_costs(options_.memory_costs, model_.layers.size());
    return options_.memory_costs;
  }
  // On a device too small for one layer's tensors at max_batch (what the
  // planners are for), the largest halved batch that fits, its times scaled
  // by the batch ratio: a layer's time is close to linear in the batch.
  const int64_t batch = options_.max_batch;
  for (int64_t n = batch;; n = (n + 1) / 2) {
    try {
      return memory::scaled(measure_step_costs(graph_, layers_, out_desc_, backend_, n,
                                               copy_bandwidth_,
                                               {}, options_.conv_workspace_bytes),
                            static_cast<double>(batch) / static_cast<double>(n));
    } catch (const memory::OutOfMemoryError&) {
      if (n == 1) throw;
    }
  }
}

memory::Simulation Network::plan_per_tensor(size_t capacity, const std::string& where) {
  const std::vector<memory::TensorAction>& actions = options_.memory_actions;
  const memory::Planner planner = options_.memory_planner;
  MemoryStats& fixed = fixed_stats_;
  if (!actions.empty()) {
    if (actions.size() != model_.layers.size()) {
      throw std::invalid_argument("NetworkOptions.memory_actions: " +
                                  std::to_string(actions.size()) + " actions for the " +
                                  std::to_string(model_.layers.size()) + " layers of the graph");
    }
    fixed.policy = "explicit";
    // Explicit actions go untimed unless the costs are given.
    std::optional<memory::StepCosts> costs;
    if (!options_.memory_costs.forward_seconds.empty()) costs = step_costs();
    plan_ = memory::evaluate_plan("explicit", actions, model_, costs ? &*costs : nullptr,
                                  capacity, planner);
  } else {
    try {
      plan_costs_ = step_costs();
      plan_ = memory::plan_memory(options_.memory_policy, model_, *plan_costs_, capacity,
                                  planner);
    } catch (const memory::OutOfMemoryError& e) {
      // The planner's message names the policy, the tensor and the least capacity.
      throw memory::OutOfMemoryError(std::string(e.what()) + "; " + where);
    }
    if (plan_->method != fixed.policy) fixed.policy += " (" + plan_->method + ")";
  }
  schedule_ = plan_->schedule;
  const memory::Simulation& simulation = plan_->simulation;
  fixed.predicted_step_seconds = simulation.timed ? simulation.timing.step_seconds : 0;
  fixed.predicted_peak = simulation.peak_bytes;
  return simulation;
}

memory::Simulation Network::choose_schedule(size_t capacity, const std::string& where) {
  const memory::Policy policy = options_.memory_policy;
  fixed_stats_.policy = memory::policy_name(policy);
  if (!options_.memory_actions.empty() || memory::plans_per_tensor(policy)) {
    return plan_per_tensor(capacity, where);
  }
  if (policy == memory::Policy::kDyn) return plan_dynamic(capacity);
  schedule_ = memory::make_schedule(model_, policy);
  return memory::simulate(model_, schedule_, capacity, options_.memory_planner);
}

std::optional<size_t> Network::least_pool_capacity() const {
  const memory::Policy policy = options_.memory_policy;
  if (!options_.memory_actions.empty()) return std::nullopt;
  if (memory::plans_per_tensor(policy)) return memory::least_capacity(model_);
  const memory::Policy first = policy == memory::Policy::kDyn ? memory::Policy::kAll : policy;
  return memory::simulate(model_, memory::make_schedule(model_, first), 0, options_.memory_planner)
      .reservation;
}

memory::Simulation Network::fitting_schedule(size_t capacity, const std::string& where) {
  describe_memory();
  const memory::Simulation simulation = choose_schedule(capacity, where);
  if (!simulation.fits) {
    throw memory::OutOfMemoryError("memory.policy " + fixed_stats_.policy + ": " +
                                   simulation.failure + "; " + where);
  }
  return simulation;
}

std::string Network::with_least_limit(const std::string& message) const {
  const std::optional<size_t> least = least_pool_capacity();
  if (options_.memory_capacity > 0 || !least) return message;
  // In use before the pool: the ops' scratch, grown to what measuring the
  // copies in place takes on a device with room for the pool.
  size_t in_use = backend_.device_bytes_in_use();
  if (measures_costs_in_place()) {
    const auto held = [&](size_t scratch) {
      return scratch == 0 ? 0 : backend_.allocation_bytes(scratch);
    };
    in_use += held(copy_measurement_scratch(backend_)) - held(backend_.scratch_reserved());
  }
  const size_t after = allocations_after();
  const size_t limit = *least + in_use + after;
  return message + "; it fits a device.memory_limit of " + common::format_bytes_fixed(limit) +
         " = " + std::to_string(limit) + " bytes (" + std::to_string(*least) +
         " for the network's pool, " + std::to_string(in_use) + " in use before it, " +
         std::to_string(after) + " for the optimizer's state after it)";
}

void Network::plan_memory() {
  // Costs measured here start with the copies, whose compute share runs a
  // matrix product that may grow the ops' scratch: measured before the
  // capacity is taken, in a quarter of it at most so they fit a small device.
  if (measures_costs_in_place()) {
    copy_bandwidth_ = measure_copy_bandwidth(
        backend_, std::clamp(room() / 4, size_t{4} << 10, size_t{64} << 20));
  }
  // What the schedule must fit: the pool's capacity.
  const size_t capacity = room();
  const memory::Planner planner = options_.memory_planner;
  MemoryStats& fixed = fixed_stats_;
  const std::string where = options_.memory_capacity > 0
                                ? "memory capacity " + common::format_bytes_fixed(capacity)
                                : "capacity " + common::format_bytes_fixed(capacity) +
                                      " (device.memory_limit or the device's memory, less " +
                                      "what is in use)";
  // The timed algorithms decide how fast a step runs, never whether it
  // fits: where the plan with them does not, the least workspaces decide.
  std::optional<memory::Simulation> planned;
  if (tuned_) {
    try {
      planned = fitting_schedule(capacity, where);
    } catch (const memory::OutOfMemoryError&) {
      choose_smallest_workspaces();
    }
  }
  if (!planned) {
    try {
      planned = fitting_schedule(capacity, where);
    } catch (const memory::OutOfMemoryError& e) {
      throw memory::OutOfMemoryError(with_least_limit(e.what()));
    }
  }
  const memory::Simulation& simulation = *planned;
  const bool offloads_some = std::count(schedule_.actions.begin(), schedule_.actions.end(),
                                        memory::TensorAction::kOffload) > 0;
  fixed.offload = plan_ ? (offloads_some ? "per tensor" : "none")
                        : memory::offload_name(schedule_.offload);
  fixed.planner = memory::planner_name(planner);
  fixed.capacity = capacity;
  fixed.persistent_bytes = simulation.persistent_bytes;

  ScheduleInterpreterOptions run_options;
  run_options.max_batch = options_.max_batch;
  run_options.planner = planner;
  run_options.poison_freed = options_.poison_freed;
  run_options.capacity_note = where;
  run_options.planned_convs = !options_.conv_executions.empty();
  run_options.plan_workspace_bytes = options_.conv_workspace_bytes;
  run_options.sum_over_ranks = options_.sum_over_ranks;
  interpreter_ = std::make_unique<ScheduleInterpreter>(graph_, backend_, layers_, out_desc_, model_,
                                                       schedule_, simulation, run_options);
  fixed.host_reservation = interpreter_->host_reservation();
  bind_layers();
}

}  // namespace vtrain::worker
