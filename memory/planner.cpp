#include "memory/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "common/text.h"
#include "memory/dynamic_policy.h"
#include "memory/memory_error.h"

namespace vtrain::memory {
namespace {

using Actions = std::vector<TensorAction>;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double step_time(const MemoryPlan& plan) { return plan.simulation.timing.step_seconds; }

std::vector<int> plannable_layers(const MemoryModel& model) {
  const std::vector<bool> can = plannable(model);
  std::vector<int> layers;
  for (size_t p = 0; p < can.size(); ++p) {
    if (can[p]) layers.push_back(static_cast<int>(p));
  }
  return layers;
}

// Scores plans for one search: every planner searches with the pool's
// best fit (the static planner never needs more) and counts simulations.
// A plan is simulated once, unbounded, and fits when its reservation does:
// a search reads whether a plan fits, never where it would fail (the
// second, bounded replay simulate() makes for a message).
class Scorer {
 public:
  // `costs` null: the plans go untimed (only their sizes are wanted).
  Scorer(const MemoryModel& model, const StepCosts* costs, size_t capacity)
      : model_(model), costs_(costs), capacity_(capacity) {}

  MemoryPlan operator()(const std::string& method, const Actions& actions) {
    ++count_;
    MemoryPlan plan = evaluate_plan(method, actions, model_, costs_, 0, Planner::kPool);
    plan.simulation.fits = capacity_ == 0 || plan.simulation.reservation <= capacity_;
    return plan;
  }
  int count() const { return count_; }

 private:
  const MemoryModel& model_;
  const StepCosts* costs_;
  const size_t capacity_;
  int count_ = 0;
};

// Chen et al.: the plannable tensors in order, cut into segments of
// ceil(sqrt(N)); each segment's last tensor is kept, the others recomputed.
Actions memonger_actions(const MemoryModel& model) {
  const std::vector<int> layers = plannable_layers(model);
  Actions actions(model.layers.size(), TensorAction::kKeep);
  const size_t segment =
      std::max<size_t>(1, static_cast<size_t>(std::ceil(std::sqrt(double(layers.size())))));
  for (size_t k = 0; k < layers.size(); ++k) {
    if ((k + 1) % segment != 0) actions[layers[k]] = TensorAction::kRecompute;
  }
  return actions;
}

// SuperNeurons-style: conv outputs offloaded, cheap layers' recomputed.
Actions superneurons_actions(const MemoryModel& model) {
  Actions actions(model.layers.size(), TensorAction::kKeep);
  for (int p : plannable_layers(model)) {
    if (model.layers[p].is_conv) actions[p] = TensorAction::kOffload;
    if (model.layers[p].cheap) actions[p] = TensorAction::kRecompute;
  }
  return actions;
}

// Every plannable activation recomputed.
Actions recompute_all(const MemoryModel& model) {
  Actions actions(model.layers.size(), TensorAction::kKeep);
  for (int p : plannable_layers(model)) actions[p] = TensorAction::kRecompute;
  return actions;
}

// The fixed actions of the baselines that do not search.
Actions baseline_actions(const MemoryModel& model, Policy policy) {
  switch (policy) {
    case Policy::kAll: return offload_actions(model, Offload::kAll);
    case Policy::kConv: return offload_actions(model, Offload::kConv);
    case Policy::kMemonger: return memonger_actions(model);
    case Policy::kSuperNeurons: return superneurons_actions(model);
    default: break;
  }
  throw MemoryError(std::string("baseline_actions: ") + policy_name(policy) + " searches");
}

// The plans that need the least memory among those vtrain knows (keeping
// every activation included: on small nets it needs less than any other).
std::vector<Actions> frugal_actions(const MemoryModel& model) {
  return {recompute_all(model), offload_actions(model, Offload::kAll), memonger_actions(model),
          superneurons_actions(model), Actions(model.layers.size(), TensorAction::kKeep)};
}

// TFLMS-style: the N largest offloaded, the fewest N that fit (binary
// search on N; offloading more never needs more memory at the peak).
MemoryPlan tflms_plan(const MemoryModel& model, Scorer& score) {
  std::vector<int> layers = plannable_layers(model);
  std::stable_sort(layers.begin(), layers.end(), [&](int a, int b) {
    return model.layers[a].output_bytes > model.layers[b].output_bytes;
  });
  auto largest = [&](size_t count) {
    Actions actions(model.layers.size(), TensorAction::kKeep);
    for (size_t k = 0; k < count; ++k) actions[layers[k]] = TensorAction::kOffload;
    return actions;
  };
  MemoryPlan best = score("tflms", largest(layers.size()));
  if (!best.simulation.fits) return best;
  size_t lo = 0, hi = layers.size();  // hi fits
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    MemoryPlan plan = score("tflms", largest(mid));
    if (plan.simulation.fits) {
      hi = mid;
      best = std::move(plan);
    } else {
      lo = mid + 1;
    }
  }
  return best;
}

// Whether `a` is a better plan than `b`: it fits where b does not, or both
// fit and a is faster.
bool better(const MemoryPlan& a, const MemoryPlan& b) {
  if (a.simulation.fits != b.simulation.fits) return a.simulation.fits;
  return step_time(a) < step_time(b);
}

// The greedy of `auto`: each plannable tensor's cheaper action, measured
// alone against the all-keep step; tensors in order of added time per byte;
// actions added until the plan fits; then local search.
class GreedyPlanner {
 public:
  GreedyPlanner(const MemoryModel& model, Scorer& score)
      : model_(model), score_(score), layers_(plannable_layers(model)) {}

  MemoryPlan run() {
    Actions actions(model_.layers.size(), TensorAction::kKeep);
    MemoryPlan plan = score_("auto", actions);
    if (plan.simulation.fits) return plan;
    const double base = step_time(plan);
    struct Option {
      int layer;
      TensorAction action;
      double per_byte;
    };
    std::vector<Option> options;
    for (int p : layers_) {
      Option best{p, TensorAction::kKeep, std::numeric_limits<double>::infinity()};
      for (TensorAction a : {TensorAction::kOffload, TensorAction::kRecompute}) {
        Actions one(model_.layers.size(), TensorAction::kKeep);
        one[p] = a;
        const double added = std::max(0.0, step_time(score_("auto", one)) - base);
        const double per_byte = added / static_cast<double>(model_.layers[p].output_bytes);
        if (per_byte < best.per_byte) best = {p, a, per_byte};
      }
      options.push_back(best);
    }
    std::stable_sort(options.begin(), options.end(),
                     [](const Option& a, const Option& b) { return a.per_byte < b.per_byte; });
    // In that order, each tensor takes whichever action leaves the smaller
    // reservation (the cheaper one on a tie), until the plan fits.
    for (const Option& o : options) {
      const TensorAction other = o.action == TensorAction::kOffload ? TensorAction::kRecompute
                                                                    : TensorAction::kOffload;
      for (TensorAction a : {o.action, other}) {
        Actions trial_actions = actions;
        trial_actions[o.layer] = a;
        MemoryPlan trial = score_("auto", trial_actions);
        if (smaller(trial, plan)) plan = std::move(trial);
      }
      actions = plan.actions;
      if (plan.simulation.fits) break;
    }
    if (!plan.simulation.fits) return plan;
    return improve(std::move(plan));
  }

  // Drops actions and swaps offload for recompute (and back) while the plan
  // fits and gets faster; a few passes, each over every acted-on tensor.
  MemoryPlan improve(MemoryPlan plan) {
    for (int pass = 0; pass < 3; ++pass) {
      bool changed = false;
      for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
        const TensorAction now = plan.actions[*it];
        if (now == TensorAction::kKeep) continue;
        const TensorAction other =
            now == TensorAction::kOffload ? TensorAction::kRecompute : TensorAction::kOffload;
        for (TensorAction a : {TensorAction::kKeep, other}) {
          Actions trial = plan.actions;
          trial[*it] = a;
          MemoryPlan candidate = score_("auto", trial);
          if (candidate.simulation.fits && step_time(candidate) < step_time(plan)) {
            plan = std::move(candidate);
            changed = true;
            break;
          }
        }
      }
      if (!changed) break;
    }
    return plan;
  }

 private:
  // Less reservation, or as much and faster.
  static bool smaller(const MemoryPlan& a, const MemoryPlan& b) {
    if (a.simulation.reservation != b.simulation.reservation) {
      return a.simulation.reservation < b.simulation.reservation;
    }
    return step_time(a) < step_time(b);
  }

  const MemoryModel& model_;
  Scorer& score_;
  const std::vector<int> layers_;
};

// The greedy on sizes alone: the plannable tensors largest first (the
// earlier on a tie), each taking offload or recompute where that leaves a
// smaller reservation. Its plans' reservations fall step by step; returns
// the first that is at most `stop_at` (0: none is), else the last, the
// least. Timings play no part: on the same sizes it plans alike.
MemoryPlan size_greedy(const MemoryModel& model, Scorer& score, size_t stop_at) {
  std::vector<int> layers = plannable_layers(model);
  std::stable_sort(layers.begin(), layers.end(), [&](int a, int b) {
    return model.layers[a].output_bytes > model.layers[b].output_bytes;
  });
  MemoryPlan plan = score("auto", Actions(model.layers.size(), TensorAction::kKeep));
  for (int p : layers) {
    if (plan.simulation.reservation <= stop_at) break;
    const Actions before = plan.actions;
    for (TensorAction a : {TensorAction::kOffload, TensorAction::kRecompute}) {
      Actions trial = before;
      trial[p] = a;
      MemoryPlan candidate = score("auto", trial);
      if (candidate.simulation.reservation < plan.simulation.reservation) {
        plan = std::move(candidate);
      }
    }
  }
  return plan;
}

// The plans whose reservations decide where auto fits: the frugal plans,
// the conv baseline, the greedy on sizes and keeping everything allocated
// once (the network-wide schedule). None depends on the costs.
std::vector<MemoryPlan> sized_plans(const MemoryModel& model, Scorer& score, size_t stop_at) {
  std::vector<MemoryPlan> plans = {score("", baseline_actions(model, Policy::kConv)),
                                   size_greedy(model, score, stop_at)};
  for (const Actions& actions : frugal_actions(model)) plans.push_back(score("", actions));
  return plans;
}

MemoryPlan auto_plan(const MemoryModel& model, const StepCosts& costs, size_t capacity,
                     Scorer& score) {
  GreedyPlanner greedy(model, score);
  MemoryPlan best = greedy.run();
  MemoryPlan none;
  none.schedule = network_wide_schedule(model);
  none.actions = none.schedule.actions;
  none.simulation = simulate(model, none.schedule, capacity, Planner::kPool, &costs);
  if (better(none, best)) best = std::move(none);
  // Every layer-wise baseline and the most frugal plans as starting points;
  // the best that fits is improved by the same local search.
  std::vector<MemoryPlan> starts = sized_plans(model, score, capacity);
  starts.push_back(tflms_plan(model, score));
  std::optional<MemoryPlan> start;
  for (MemoryPlan& plan : starts) {
    if (better(plan, best)) best = plan;
    if (!start || better(plan, *start)) start = std::move(plan);
  }
  if (start && start->simulation.fits) {
    MemoryPlan improved = greedy.improve(std::move(*start));
    if (better(improved, best)) best = std::move(improved);
  }
  best.method = "auto";
  return best;
}

std::string ms(double seconds) { return common::format("%.2f ms", seconds * 1e3); }

}  // namespace

MemoryPlan evaluate_plan(const std::string& method, const std::vector<TensorAction>& actions,
                         const MemoryModel& model, const StepCosts* costs, size_t capacity,
                         Planner planner) {
  MemoryPlan plan;
  plan.method = method;
  plan.actions = actions;
  plan.schedule = planned_schedule(model, actions);
  plan.simulation = simulate(model, plan.schedule, capacity, planner, costs);
  plan.simulations = 1;
  return plan;
}

std::optional<MemoryPlan> try_plan_memory(Policy policy, const MemoryModel& model,
                                          const StepCosts& costs, size_t capacity,
                                          Planner planner) {
  const auto start = std::chrono::steady_clock::now();
  Scorer score(model, &costs, capacity);
  MemoryPlan plan;
  bool scored = true;  // the plan comes from the search, simulated under the pool
  switch (policy) {
    case Policy::kNone:
    case Policy::kAll:
    case Policy::kConv:
      plan.schedule = make_schedule(model, policy);
      plan.actions = plan.schedule.actions;
      scored = false;
      break;
    case Policy::kDyn:
      try {
        plan.schedule =
            layer_wise_schedule(model, choose_dynamic(model, {}, capacity, planner).offload);
      } catch (const OutOfMemoryError&) {
        return std::nullopt;  // even vDNN_all does not fit
      }
      plan.actions = plan.schedule.actions;
      scored = false;
      break;
    case Policy::kMemonger:
    case Policy::kSuperNeurons: plan = score("", baseline_actions(model, policy)); break;
    case Policy::kTflms: plan = tflms_plan(model, score); break;
    case Policy::kAuto:
      // Where auto fits is decided on sizes (least_capacity): timings
      // differ from run to run, and a plan must not fit on one and not on
      // the next. Below it, even a plan that the costs' greedy finds is refused.
      if (capacity > 0 && least_capacity(model) > capacity) return std::nullopt;
      plan = auto_plan(model, costs, capacity, score);
      break;
  }
  plan.method = policy_name(policy);
  // The final plan under the planner the pool will use (the search's
  // simulation is that already when it is the pool).
  if (!scored || planner != Planner::kPool) {
    plan.simulation = simulate(model, plan.schedule, capacity, planner, &costs);
  }
  plan.simulations = score.count() + (scored && planner == Planner::kPool ? 0 : 1);
  plan.solve_seconds = seconds_since(start);
  if (!plan.simulation.fits) return std::nullopt;
  return plan;
}

MemoryPlan plan_memory(Policy policy, const MemoryModel& model, const StepCosts& costs,
                       size_t capacity, Planner planner) {
  if (std::optional<MemoryPlan> plan = try_plan_memory(policy, model, costs, capacity, planner)) {
    return std::move(*plan);
  }
  // The most frugal plan names the tensor that cannot be placed.
  const Actions frugal[] = {recompute_all(model), offload_actions(model, Offload::kAll)};
  Simulation best_try;
  size_t frugal_need = std::numeric_limits<size_t>::max();
  for (const Actions& actions : frugal) {
    const Schedule schedule = planned_schedule(model, actions);
    const Simulation sim = simulate(model, schedule, 0, planner);
    if (sim.reservation < frugal_need) {
      frugal_need = sim.reservation;
      best_try = simulate(model, schedule, capacity, planner);
    }
  }
  const size_t least = least_capacity(model);
  throw OutOfMemoryError(std::string("memory.policy ") + policy_name(policy) + ": no plan fits " +
                         common::format_bytes_fixed(capacity) + " = " + std::to_string(capacity) +
                         " bytes; offloading or recomputing every activation, " +
                         best_try.failure + "; the least capacity auto finds a plan for is " +
                         common::format_bytes_fixed(least) + " = " + std::to_string(least) +
                         " bytes");
}

size_t least_capacity(const MemoryModel& model) {
  Scorer score(model, nullptr, 0);
  // The network-wide schedule is auto's plan `none`.
  size_t least = simulate(model, network_wide_schedule(model), 0, Planner::kPool).reservation;
  for (const MemoryPlan& plan : sized_plans(model, score, 0)) {
    least = std::min(least, plan.simulation.reservation);
  }
  return least;
}

std::optional<MemoryPlan> plan_oracle(const MemoryModel& model, const StepCosts& costs,
                                      size_t capacity, Planner planner, int max_tensors) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> layers = plannable_layers(model);
  if (static_cast<int>(layers.size()) > max_tensors) return std::nullopt;
  // Big tensors first: their choices decide what fits.
  std::stable_sort(layers.begin(), layers.end(), [&](int a, int b) {
    return model.layers[a].output_bytes > model.layers[b].output_bytes;
  });
  Scorer score(model, &costs, capacity);
  Actions actions(model.layers.size(), TensorAction::kKeep);
  const double base = step_time(score("oracle", actions));
  std::optional<MemoryPlan> best;
  std::function<void(size_t, double)> search = [&](size_t depth, double bound) {
    if (best && bound >= step_time(*best)) return;
    if (depth == layers.size()) {
      MemoryPlan plan = score("oracle", actions);
      if (plan.simulation.fits && (!best || step_time(plan) < step_time(*best))) {
        best = std::move(plan);
      }
      return;
    }
    const int p = layers[depth];
    for (TensorAction a : {TensorAction::kKeep, TensorAction::kOffload, TensorAction::kRecompute}) {
      actions[p] = a;
      const double added = a == TensorAction::kRecompute ? costs.forward_seconds[p] : 0;
      search(depth + 1, bound + added);
    }
    actions[p] = TensorAction::kKeep;
  };
  search(0, base);
  if (!best) return std::nullopt;
  best->simulation = simulate(model, best->schedule, capacity, planner, &costs);
  if (!best->simulation.fits) return std::nullopt;
  best->simulations = score.count() + 1;
  best->solve_seconds = seconds_since(start);
  return best;
}

PlanSummary summarize(const MemoryModel& model, const MemoryPlan& plan) {
  return summarize(model, plan.actions);
}

PlanSummary summarize(const MemoryModel& model, const std::vector<TensorAction>& actions) {
  PlanSummary s;
  const std::vector<bool> can = plannable(model);
  for (size_t p = 0; p < can.size(); ++p) {
    if (!can[p]) continue;
    const size_t bytes = model.layers[p].output_bytes;
    switch (p < actions.size() ? actions[p] : TensorAction::kKeep) {
      case TensorAction::kKeep: ++s.kept, s.kept_bytes += bytes; break;
      case TensorAction::kOffload: ++s.offloaded, s.offloaded_bytes += bytes; break;
      case TensorAction::kRecompute: ++s.recomputed, s.recomputed_bytes += bytes; break;
    }
  }
  return s;
}

std::string plan_report(const MemoryModel& model, const MemoryPlan& plan) {
  const StepTiming& t = plan.simulation.timing;
  const PlanSummary s = summarize(model, plan);
  std::string out = common::format(
      "memory plan: %s (%d simulations, %.1f ms to plan)\n", plan.method.c_str(),
      plan.simulations, plan.solve_seconds * 1e3);
  out += "  predicted step " + ms(t.step_seconds) + " (compute " + ms(t.compute_seconds) +
         ", recompute " + ms(t.recompute_seconds) + ", stalls " + ms(t.stall_seconds) +
         (t.copy_contention_seconds >= 5e-6 ? ", copies on the compute's cores " +
                                              ms(t.copy_contention_seconds)
                                        : std::string()) +
         "), peak " + common::format_bytes_fixed(plan.simulation.peak_bytes) + ", reservation " +
         common::format_bytes_fixed(plan.simulation.reservation) + "\n";
  out += common::format("  activations: %d kept (%s), %d offloaded (%s), %d recomputed (%s)\n",
                        s.kept, common::format_bytes_fixed(s.kept_bytes).c_str(), s.offloaded,
                        common::format_bytes_fixed(s.offloaded_bytes).c_str(), s.recomputed,
                        common::format_bytes_fixed(s.recomputed_bytes).c_str());
  out += common::format("  %-24s %12s  %-9s %s\n", "tensor", "bytes", "action", "copy cost");
  const std::vector<bool> can = plannable(model);
  for (size_t p = 0; p < can.size(); ++p) {
    if (!can[p]) continue;
    const double stall = t.stall_per_tensor.empty() ? 0 : t.stall_per_tensor[p];
    out += common::format("  %-24s %12s  %-9s %s\n", (model.layers[p].name + ".y").c_str(),
                          common::format_bytes_fixed(model.layers[p].output_bytes).c_str(),
                          common::name_of(kTensorActionNames, plan.actions[p]), ms(stall).c_str());
  }
  return out;
}

}  // namespace vtrain::memory
