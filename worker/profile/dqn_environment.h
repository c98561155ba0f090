// The DQN planner's environment (the swap-and-recompute paper, Sec. 4.4-4.8):
// an episode walks the plannable activations of a MemoryModel in forward
// order and decides for each one keep / offload / recompute; every decision
// is scored by the timed simulator (memory::planned_schedule +
// memory::simulate) with the tensors not decided yet kept.
//
// The graph the Q-network embeds has three action nodes per candidate
// tensor (keep = "do nothing", offload = swap-out, recompute = remove), so
// no node represents more than one action (Sec. 4.9). Edges join the three
// nodes of one tensor ("use the same variable", lag 0) and the same action
// of two tensors that follow each other in forward order ("continuous") or
// where one is computed from the other through layers that are not
// candidates (what recomputing one reads); their lag is the all-keep step's
// time between the two forwards.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "memory/device_pool.h"
#include "memory/simulator.h"
#include "memory/vdnn_plan.h"

namespace vtrain::worker {

// The three actions of a candidate, in node order.
inline constexpr int kDqnActions = 3;
inline constexpr memory::TensorAction kDqnActionOf[kDqnActions] = {
    memory::TensorAction::kKeep, memory::TensorAction::kOffload, memory::TensorAction::kRecompute};

// Per node features x_v, in this order. The paper's six (Sec. 4.4.1): the
// variable's size, its transfer time, its recompute time, how soon it is
// revisited, the node's action type, whether the action is valid now; then
// what the episode has decided (the paper's changing sets H0 / H1) and how
// much memory is still to free, which its state also needs. Times are in
// units of the all-keep step time divided by the number of candidates.
enum DqnFeature : int {
  kFeatureOne,         // constant 1 (the bias of W1)
  kFeatureSizeOfNeed,  // bytes of the tensor / bytes the all-keep plan is over, at most 4
  kFeatureSizeOfMax,   // bytes / the largest candidate's bytes
  kFeatureTransfer,    // time to copy it to the host and back
  kFeatureRecompute,   // forward time of its layer (what recomputing it at least costs)
  kFeatureRevisit,     // all-keep time from its last forward use to its first backward use
  kFeatureIsKeep,      // the node's action type, one-hot (3 features)
  kFeatureIsOffload,
  kFeatureIsRecompute,
  kFeatureValid,   // the node is an action of the tensor being decided now
  kFeatureChosen,  // the episode took this action earlier
  kFeatureNeed,    // bytes the current plan is still over / the all-keep overshoot, at most 2
  kFeatureCovers,  // bytes of the tensor / bytes the current plan is still over, at most 2
  kDqnFeatureCount,
};

// The simulated result of a plan (actions decided so far, the rest kept).
struct DqnOutcome {
  double step_seconds = 0;
  size_t reservation = 0;
  bool fits = false;
};

struct DqnState {
  std::vector<int8_t> decided;  // per candidate decided so far: index into kDqnActionOf
  DqnOutcome outcome;           // of the decided actions, the rest kept
  bool terminal = false;        // the plan fits, or every candidate is decided
};

struct DqnTransition {
  DqnState next;
  double reward = 0;  // minus the step time the action added (in time units), and at a
                      // terminal state that does not fit, minus the penalty
};

class DqnEnvironment {
 public:
  // `infeasible_penalty`: the penalty at a terminal state that does not fit,
  // in all-keep step times, times (1 + the fraction of the overshoot left).
  // `shaping`: add potential-based shaping (Ng et al., 1999) with phi(s) =
  // minus the penalty times the fraction of the overshoot s has left (0 at a
  // terminal state), so that freeing memory is rewarded when it happens; it
  // adds the same constant to every episode's return, so the best plan stays
  // the best. Throws MemoryError for costs that do not match the model.
  DqnEnvironment(const memory::MemoryModel& model, const memory::StepCosts& costs, size_t capacity,
                 memory::Planner planner, double infeasible_penalty, bool shaping);

  int candidates() const { return static_cast<int>(candidates_.size()); }
  int nodes() const { return kDqnActions * candidates(); }
  // N(v) with the edge weights w(u, v) in time units; v itself included (w = 0).
  const std::vector<std::vector<std::pair<int, float>>>& neighbours() const { return neighbours_; }
  int node_of(int candidate, int action) const { return kDqnActions * candidate + action; }
  double time_unit() const { return time_unit_; }

  // All candidates undecided; terminal when the all-keep plan fits.
  DqnState reset();
  // Decides the next candidate of a non-terminal state.
  DqnTransition step(const DqnState& state, int action);

  // x_v for every node in node order (nodes() x kDqnFeatureCount), appended.
  void features(const DqnState& state, std::vector<float>& out) const;
  // The node under execution: the keep node of the candidate decided next
  // (the last candidate's at a terminal state).
  int current_node(const DqnState& state) const;
  // Bytes the state's plan is over the capacity / the all-keep plan's (0 when it fits).
  double need(const DqnState& state) const;

  // Per layer actions of a state's decisions (the rest kept).
  std::vector<memory::TensorAction> layer_actions(const std::vector<int8_t>& decided) const;
  int simulations() const { return simulations_; }

 private:
  DqnOutcome evaluate(const std::vector<int8_t>& decided);
  double potential(const DqnState& state) const;
  void add_static_features(const std::vector<double>& forward_end,
                           const std::vector<double>& backward_start);
  void add_edges(const std::vector<double>& forward_end);

  const memory::MemoryModel& model_;
  const memory::StepCosts& costs_;
  size_t capacity_;
  memory::Planner planner_;
  double infeasible_penalty_;
  bool shaping_;
  std::vector<int> candidates_;  // layer of each candidate, forward order
  std::vector<std::array<float, kDqnFeatureCount>> static_;  // per candidate
  std::vector<double> bytes_;                                // per candidate
  std::vector<std::vector<std::pair<int, float>>> neighbours_;
  DqnOutcome all_keep_;
  double time_unit_ = 1;
  double overshoot_ = 1;  // bytes the all-keep plan is over the capacity (at least 1)
  std::map<std::string, DqnOutcome> memo_;  // by decided actions
  int simulations_ = 0;
};

}  // namespace vtrain::worker
