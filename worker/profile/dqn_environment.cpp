#include "worker/profile/dqn_environment.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "memory/memory_error.h"

namespace vtrain::worker {
namespace {

using memory::Op;
using memory::TensorAction;

// When each layer's forward ends and its backward starts in the all-keep
// step (no copies, so no stalls: the compute stream's running sum).
struct CallTimes {
  std::vector<double> forward_end, backward_start;
};

CallTimes all_keep_times(const memory::MemoryModel& model, const memory::StepCosts& costs) {
  const size_t n = model.layers.size();
  const memory::Schedule keep =
      memory::planned_schedule(model, std::vector<TensorAction>(n, TensorAction::kKeep));
  CallTimes t{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  double clock = 0;
  for (const memory::ScheduleEvent& e : keep.train) {
    const double seconds = memory::call_seconds(costs, e);
    if (e.op == Op::kBackward) t.backward_start[e.tensor.layer] = clock;
    clock += seconds;
    if (e.op == Op::kForward) t.forward_end[e.tensor.layer] = clock;
  }
  return t;
}

bool reads_in_backward(const memory::LayerNode& reader, int reader_index, int tensor) {
  if (reader_index == tensor) return reader.backward_reads_output;
  return reader.backward_reads_inputs &&
         std::find(reader.inputs.begin(), reader.inputs.end(), tensor) != reader.inputs.end();
}

// From the end of the last forward that reads Y(p) to the start of the
// first backward that reads it, in the all-keep step.
double revisit_seconds(const memory::MemoryModel& model, int p,
                       const std::vector<double>& forward_end,
                       const std::vector<double>& backward_start) {
  double last_forward = forward_end[p];
  double first_backward = std::numeric_limits<double>::infinity();
  for (int i = 0; i < static_cast<int>(model.layers.size()); ++i) {
    const memory::LayerNode& l = model.layers[i];
    if (std::find(l.inputs.begin(), l.inputs.end(), p) != l.inputs.end()) {
      last_forward = std::max(last_forward, forward_end[i]);
    }
    if (reads_in_backward(l, i, p)) first_backward = std::min(first_backward, backward_start[i]);
  }
  return std::isfinite(first_backward) ? std::max(0.0, first_backward - last_forward) : 0.0;
}

// Per layer, the nearest candidates it is computed from (through layers that
// are not candidates).
std::vector<std::set<int>> candidate_ancestors(const memory::MemoryModel& model,
                                               const std::vector<int>& candidate_of) {
  std::vector<std::set<int>> ancestors(model.layers.size());
  for (size_t i = 0; i < model.layers.size(); ++i) {
    for (int p : model.layers[i].inputs) {
      if (candidate_of[p] >= 0) {
        ancestors[i].insert(candidate_of[p]);
      } else {
        ancestors[i].insert(ancestors[p].begin(), ancestors[p].end());
      }
    }
  }
  return ancestors;
}

std::string memo_key(const std::vector<int8_t>& decided) {
  size_t end = decided.size();
  while (end > 0 && decided[end - 1] == 0) --end;  // trailing keeps change nothing
  std::string key(end, '0');
  for (size_t i = 0; i < end; ++i) key[i] = static_cast<char>('0' + decided[i]);
  return key;
}

}  // namespace

DqnEnvironment::DqnEnvironment(const memory::MemoryModel& model, const memory::StepCosts& costs,
                               size_t capacity, memory::Planner planner, double infeasible_penalty,
                               bool shaping)
    : model_(model),
      costs_(costs),
      capacity_(capacity),
      planner_(planner),
      infeasible_penalty_(infeasible_penalty),
      shaping_(shaping) {
  const std::vector<bool> can = memory::plannable(model);
  for (int p = 0; p < static_cast<int>(can.size()); ++p) {
    if (can[p]) candidates_.push_back(p);
  }
  all_keep_ = evaluate({});
  if (capacity_ > 0 && all_keep_.reservation > capacity_) {
    overshoot_ = static_cast<double>(all_keep_.reservation - capacity_);
  }
  if (all_keep_.step_seconds > 0 && !candidates_.empty()) {
    time_unit_ = all_keep_.step_seconds / static_cast<double>(candidates_.size());
  }
  const CallTimes times = all_keep_times(model, costs);
  add_static_features(times.forward_end, times.backward_start);
  add_edges(times.forward_end);
}

void DqnEnvironment::add_static_features(const std::vector<double>& forward_end,
                                         const std::vector<double>& backward_start) {
  size_t largest = 1;
  for (int p : candidates_) largest = std::max(largest, model_.layers[p].output_bytes);
  for (int p : candidates_) {
    const double bytes = static_cast<double>(model_.layers[p].output_bytes);
    std::array<float, kDqnFeatureCount> x{};
    x[kFeatureOne] = 1.0f;
    x[kFeatureSizeOfNeed] = static_cast<float>(std::min(4.0, bytes / overshoot_));
    x[kFeatureSizeOfMax] = static_cast<float>(bytes / static_cast<double>(largest));
    x[kFeatureTransfer] = static_cast<float>(
        (bytes / costs_.to_host_bytes_per_second + bytes / costs_.to_device_bytes_per_second) /
        time_unit_);
    x[kFeatureRecompute] = static_cast<float>(costs_.forward_seconds[p] / time_unit_);
    x[kFeatureRevisit] =
        static_cast<float>(revisit_seconds(model_, p, forward_end, backward_start) / time_unit_);
    static_.push_back(x);
    bytes_.push_back(bytes);
  }
}

void DqnEnvironment::add_edges(const std::vector<double>& forward_end) {
  const int k = candidates();
  std::vector<int> candidate_of(model_.layers.size(), -1);
  for (int c = 0; c < k; ++c) candidate_of[candidates_[c]] = c;
  const std::vector<std::set<int>> ancestors = candidate_ancestors(model_, candidate_of);
  std::vector<std::set<int>> linked(k);  // per candidate j, the later candidates m joined to it
  for (int m = 0; m < k; ++m) {
    if (m > 0) linked[m - 1].insert(m);
    for (int j : ancestors[candidates_[m]]) linked[j].insert(m);
  }
  neighbours_.assign(nodes(), {});
  for (int c = 0; c < k; ++c) {
    for (int a = 0; a < kDqnActions; ++a) {
      for (int b = 0; b < kDqnActions; ++b) {
        neighbours_[node_of(c, a)].push_back({node_of(c, b), 0.0f});
      }
    }
  }
  for (int j = 0; j < k; ++j) {
    for (int m : linked[j]) {
      const float lag = static_cast<float>(
          (forward_end[candidates_[m]] - forward_end[candidates_[j]]) / time_unit_);
      for (int a = 0; a < kDqnActions; ++a) {
        neighbours_[node_of(j, a)].push_back({node_of(m, a), lag});
        neighbours_[node_of(m, a)].push_back({node_of(j, a), lag});
      }
    }
  }
}

std::vector<TensorAction> DqnEnvironment::layer_actions(const std::vector<int8_t>& decided) const {
  std::vector<TensorAction> actions(model_.layers.size(), TensorAction::kKeep);
  for (size_t c = 0; c < decided.size(); ++c) actions[candidates_[c]] = kDqnActionOf[decided[c]];
  return actions;
}

DqnOutcome DqnEnvironment::evaluate(const std::vector<int8_t>& decided) {
  const std::string key = memo_key(decided);
  if (auto it = memo_.find(key); it != memo_.end()) return it->second;
  const memory::Schedule schedule = memory::planned_schedule(model_, layer_actions(decided));
  // Unbounded: simulate() decides "fits" by the reservation alone, and the
  // bounded replay it adds for a plan over the capacity only names the failure.
  const memory::Simulation sim = memory::simulate(model_, schedule, 0, planner_, &costs_);
  ++simulations_;
  const DqnOutcome outcome{sim.timing.step_seconds, sim.reservation,
                           capacity_ == 0 || sim.reservation <= capacity_};
  memo_.emplace(key, outcome);
  return outcome;
}

DqnState DqnEnvironment::reset() {
  DqnState s;
  s.outcome = all_keep_;
  s.terminal = all_keep_.fits || candidates_.empty();
  return s;
}

DqnTransition DqnEnvironment::step(const DqnState& state, int action) {
  if (state.terminal) throw memory::MemoryError("dqn: step from a terminal state");
  if (action < 0 || action >= kDqnActions) {
    throw memory::MemoryError("dqn: action " + std::to_string(action) + " is not 0, 1 or 2");
  }
  DqnTransition t;
  t.next.decided = state.decided;
  t.next.decided.push_back(static_cast<int8_t>(action));
  t.next.outcome = evaluate(t.next.decided);
  t.next.terminal = t.next.outcome.fits || static_cast<int>(t.next.decided.size()) == candidates();
  t.reward = -(t.next.outcome.step_seconds - state.outcome.step_seconds) / time_unit_;
  if (t.next.terminal && !t.next.outcome.fits) {
    const double left = static_cast<double>(t.next.outcome.reservation - capacity_) / overshoot_;
    t.reward -= infeasible_penalty_ * candidates() * (1.0 + std::min(left, 1.0));
  }
  if (shaping_) t.reward += potential(t.next) - potential(state);
  return t;
}

double DqnEnvironment::need(const DqnState& state) const {
  if (state.outcome.fits || state.outcome.reservation <= capacity_) return 0;
  return static_cast<double>(state.outcome.reservation - capacity_) / overshoot_;
}

double DqnEnvironment::potential(const DqnState& state) const {
  if (state.terminal) return 0;
  return -infeasible_penalty_ * candidates() * std::min(need(state), 1.0);
}

int DqnEnvironment::current_node(const DqnState& state) const {
  const int c = std::min(static_cast<int>(state.decided.size()), candidates() - 1);
  return node_of(std::max(c, 0), 0);
}

void DqnEnvironment::features(const DqnState& state, std::vector<float>& out) const {
  const int next = state.terminal ? -1 : static_cast<int>(state.decided.size());
  const double left = need(state);
  for (int c = 0; c < candidates(); ++c) {
    for (int a = 0; a < kDqnActions; ++a) {
      std::array<float, kDqnFeatureCount> x = static_[c];
      x[kFeatureIsKeep + a] = 1.0f;
      x[kFeatureValid] = c == next ? 1.0f : 0.0f;
      x[kFeatureChosen] =
          c < static_cast<int>(state.decided.size()) && state.decided[c] == a ? 1.0f : 0.0f;
      x[kFeatureNeed] = static_cast<float>(std::min(left, 2.0));
      x[kFeatureCovers] =
          left > 0 ? static_cast<float>(std::min(2.0, bytes_[c] / (left * overshoot_))) : 0.0f;
      out.insert(out.end(), x.begin(), x.end());
    }
  }
}

}  // namespace vtrain::worker
