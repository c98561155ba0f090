// The swap-and-recompute paper's own planner (Sec. 4): a deep Q-network
// that decides, for every plannable activation in forward order, keep /
// offload / recompute, trained by fitted Q-iteration on vtrain's timed
// simulator (Algorithm 1: epsilon-greedy episodes, experience replay, SGD on
// Eq. 4-5).
//
// The environment is worker/profile/dqn_environment.h (state, actions,
// reward: minus the simulated step time an action adds, and a penalty when
// the last decision still does not fit). The Q-network is
// worker/profile/dqn_q_network.h, run on a worker::Backend (vtrain's own
// ops, no framework).
//
// The plan returned is the best-found strategy (Fig. 3): the fastest plan
// that fits among every episode's and the final greedy policy's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "memory/device_pool.h"
#include "memory/planner.h"
#include "memory/simulator.h"
#include "memory/vdnn_plan.h"
#include "worker/device/backend.h"

namespace vtrain::worker {

struct DqnOptions {
  int episodes = 300;               // l of Algorithm 1
  int embedding = 16;               // p: length of a node state
  int iterations = 3;               // T of Eq. 1
  double gamma = 1.0;               // decay of Eq. 5 (episodes are finite)
  double learning_rate = 1e-2;      // SGD on Eq. 4
  float momentum = 0.0f;            // of the SGD
  float max_gradient_norm = 10.0f;  // SGD steps are clipped to this L2 norm (0: never)
  int replay_size = 4096;           // transitions kept for experience replay
  int batch = 32;                   // transitions per SGD step
  double epsilon_end = 0.05;        // exploration falls linearly from 1 to this
                                    // over the episodes (Algorithm 1, line 7)
  double infeasible_penalty = 1.0;  // in all-keep step times (see DqnEnvironment)
  bool shape_rewards = true;        // potential-based shaping by memory freed (DqnEnvironment)
  int updates_per_step = 4;         // SGD steps per decision (Algorithm 1: 1)
  int target_sync = 0;              // Eq. 5's max from a copy of W refreshed every this many
                                    // SGD steps (0: from W itself, as the paper)
  uint64_t seed = 1;                // weights, exploration and replay sampling
  double time_budget_seconds = 0;   // stop starting episodes after this long (0: none);
                                    // a binding budget makes the result depend on speed
};

// What training did, for tests and benches.
struct DqnRun {
  memory::MemoryPlan plan;         // the best-found plan (method "dqn")
  bool greedy_fits = false;        // the trained policy's own plan (epsilon 0) fits
  double greedy_step_seconds = 0;  // and its simulated step time
  std::vector<memory::TensorAction> greedy_actions;  // and its actions (per layer)
  int episodes = 0;                                  // episodes run (fewer under a time budget)
  int best_episode = -1;        // the episode that found `plan`; `episodes` for the
                                // greedy roll-out, -1 when the all-keep plan fits
  std::vector<double> returns;  // per episode: the sum of its rewards
  double last_loss = 0;         // of the last SGD step
};

// Trains the agent on `backend` (any backend; the CPU's is deterministic for
// a seed) and plans. Throws memory::OutOfMemoryError when no plan it found
// fits: the message names the tensor the closest plan could not place and
// the bytes it needs. Throws memory::MemoryError for costs that do not match
// the model and std::invalid_argument for bad options.
DqnRun train_dqn(const memory::MemoryModel& model, const memory::StepCosts& costs, size_t capacity,
                 memory::Planner planner, const DqnOptions& options, Backend& backend);

// train_dqn's plan, on a one-thread CPU backend of its own.
memory::MemoryPlan plan_dqn(const memory::MemoryModel& model, const memory::StepCosts& costs,
                            size_t capacity, memory::Planner planner, const DqnOptions& options);

}  // namespace vtrain::worker
