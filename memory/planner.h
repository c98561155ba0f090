// Per-tensor memory plans under a capacity (the swap-and-recompute paper,
// Sec. 3-5): for every activation Y, keep it, offload it (prefetched back by
// vDNN's window rule) or release it and recompute it in backward, so that
// the simulated step fits the capacity at the least simulated step time.
// Every plan is scored by the one timed simulator (simulator.h).
//
// Planners, by memory.policy name:
//  none, all, conv, dyn  the vDNN schedules (network-wide, offload all / conv
//                        inputs, the dynamic policy's passes);
//  memonger              Chen et al.: sqrt(N) segments; the segment ends are
//                        kept, everything else is recomputed;
//  superneurons          Wang et al.: outputs of conv layers offloaded, outputs
//                        of cheap layers recomputed, the rest kept;
//  tflms                 Le et al.: the N largest offloaded, the fewest N that fit;
//  auto                  what vtrain ships: greedy in order of added time per
//                        byte (each tensor's cheaper action, measured alone),
//                        each tensor taking the action that leaves the
//                        smaller reservation, until the plan fits; then local
//                        search (drop an action, swap offload and recompute)
//                        while the plan fits and gets faster. The same local
//                        search also starts from the fastest fitting baseline
//                        or frugal plan; the fastest result wins. Whether
//                        auto fits at all is decided on sizes alone
//                        (least_capacity), never on the measured costs.
// plan_oracle() is exact for small graphs (branch and bound over every
// assignment), to measure how far the others are from optimal.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "memory/simulator.h"
#include "memory/vdnn_plan.h"

namespace vtrain::memory {

struct MemoryPlan {
  std::string method;                 // "auto", "memonger", "oracle", "dqn", ...
  std::vector<TensorAction> actions;  // per layer (all kKeep for none)
  Schedule schedule;
  Simulation simulation;              // timed; simulation.fits under the capacity
  double solve_seconds = 0;           // planning time
  int simulations = 0;                // timed simulations the planner ran
};

// What a plan does with its activations, for printing.
struct PlanSummary {
  int kept = 0, offloaded = 0, recomputed = 0;  // plannable tensors by action
  size_t kept_bytes = 0, offloaded_bytes = 0, recomputed_bytes = 0;
};
PlanSummary summarize(const MemoryModel& model, const MemoryPlan& plan);
// The same for any schedule's actions (a Schedule's `actions`; empty: all kept).
PlanSummary summarize(const MemoryModel& model, const std::vector<TensorAction>& actions);
// The plan for people: its method, predicted step time (compute,
// recompute, stalls) and peak, the summary, and one line per plannable
// tensor (name, bytes, action, the stall its copies cause).
std::string plan_report(const MemoryModel& model, const MemoryPlan& plan);

// Simulates the schedule of `actions`, timed with `costs` (null: untimed).
// Throws MemoryError for actions that do not apply (see planned_schedule).
MemoryPlan evaluate_plan(const std::string& method, const std::vector<TensorAction>& actions,
                         const MemoryModel& model, const StepCosts* costs, size_t capacity,
                         Planner planner);

// The plan `policy` makes (any Policy) under `capacity` bytes (0:
// unbounded). Throws OutOfMemoryError when it cannot fit: the message names
// the tensor that could not be placed under the most frugal plan tried and
// the least capacity with which some plan fits.
MemoryPlan plan_memory(Policy policy, const MemoryModel& model, const StepCosts& costs,
                       size_t capacity, Planner planner);

// Like plan_memory, but nullopt instead of the error (for comparing planners).
std::optional<MemoryPlan> try_plan_memory(Policy policy, const MemoryModel& model,
                                          const StepCosts& costs, size_t capacity,
                                          Planner planner);

// The least simulated step time over every assignment of actions to the
// plannable tensors that fits `capacity`; nullopt when there are more than
// `max_tensors` plannable tensors or none fits. Branch and bound: a partial
// assignment costs at least the step without any action plus the forward
// time of every tensor it recomputes.
std::optional<MemoryPlan> plan_oracle(const MemoryModel& model, const StepCosts& costs,
                                      size_t capacity, Planner planner, int max_tensors = 12);

// The least capacity for which auto finds a plan: the least reservation
// (under the pool's best fit, as the planners search) of the plans that
// decide where auto fits: keeping everything, the most frugal plans
// (offload all, recompute all, memonger, superneurons), the conv baseline
// and a greedy on sizes alone. It does not depend on the step's costs, so
// auto fits a capacity or not alike on every run; at this capacity and
// above it always fits, below it never.
size_t least_capacity(const MemoryModel& model);

}  // namespace vtrain::memory
