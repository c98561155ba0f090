#include "worker/profile/dqn_planner.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/text.h"
#include "memory/memory_error.h"
#include "worker/engine/rng.h"
#include "worker/profile/dqn_environment.h"
#include "worker/profile/dqn_q_network.h"

namespace vtrain::worker {
namespace {

struct Experience {
  DqnState state;
  int action = 0;
  double reward = 0;
  DqnState next;
};

void check(const DqnOptions& o) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("dqn options: " + what); };
  if (o.episodes < 0) fail("episodes must be >= 0");
  if (o.embedding < 1 || o.iterations < 1) fail("embedding and iterations must be >= 1");
  if (o.batch < 1 || o.replay_size < o.batch) fail("need 1 <= batch <= replay_size");
  if (!(o.learning_rate > 0)) fail("learning_rate must be > 0");
  if (!(o.gamma >= 0 && o.gamma <= 1)) fail("gamma must be in [0, 1]");
  if (!(o.epsilon_end >= 0 && o.epsilon_end <= 1)) fail("epsilon_end must be in [0, 1]");
  if (!(o.infeasible_penalty >= 0)) fail("infeasible_penalty must be >= 0");
  if (o.updates_per_step < 1 || o.target_sync < 0) {
    fail("updates_per_step must be >= 1 and target_sync >= 0");
  }
}

// The Q-network acting in and learning from the environment (Algorithm 1).
class Agent {
 public:
  Agent(DqnEnvironment& env, Backend& backend, const DqnOptions& o)
      : env_(env),
        o_(o),
        network_(backend, QGraph{env.neighbours()}, {kDqnFeatureCount, o.embedding, o.iterations},
                 o.seed, o.momentum),
        rng_(o.seed ^ 0x5deece66dULL) {
    if (o.target_sync > 0) {
      target_ = std::make_unique<QNetwork>(
          backend, QGraph{env.neighbours()},
          QNetworkShape{kDqnFeatureCount, o.embedding, o.iterations}, o.seed, o.momentum);
    }
  }

  int act(const DqnState& s, double epsilon) {
    if (rng_.unit() < epsilon) return static_cast<int>(rng_.next() % kDqnActions);
    return greedy(s);
  }

  // The action of the largest Q (the first of equals).
  int greedy(const DqnState& s) {
    const std::vector<float> q = network_.evaluate(batch_of({&s}));
    return static_cast<int>(std::max_element(q.begin(), q.end()) - q.begin());
  }

  void remember(Experience e) {
    if (static_cast<int>(replay_.size()) < o_.replay_size) {
      replay_.push_back(std::move(e));
    } else {
      replay_[oldest_] = std::move(e);
      oldest_ = (oldest_ + 1) % replay_.size();
    }
  }

  // One fitted-Q step on a batch sampled from the replay (Eq. 4-5), once
  // there are enough transitions.
  void learn() {
    if (static_cast<int>(replay_.size()) < o_.batch) return;
    std::vector<const Experience*> sample;
    for (int i = 0; i < o_.batch; ++i) sample.push_back(&replay_[rng_.next() % replay_.size()]);
    std::vector<const DqnState*> next;
    for (const Experience* e : sample) {
      if (!e->next.terminal) next.push_back(&e->next);
    }
    std::vector<float> next_q;
    if (!next.empty()) next_q = (target_ ? *target_ : network_).evaluate(batch_of(next));
    std::vector<float> targets;
    std::vector<const DqnState*> states;
    std::vector<int> actions;
    size_t k = 0;
    for (const Experience* e : sample) {
      double y = e->reward;  // Q of a terminal state is 0
      if (!e->next.terminal) {
        y += o_.gamma * *std::max_element(next_q.begin() + k, next_q.begin() + k + kDqnActions);
        k += kDqnActions;
      }
      targets.push_back(static_cast<float>(y));
      states.push_back(&e->state);
      actions.push_back(e->action);
    }
    last_loss_ = network_.backpropagate(batch_of(states, &actions), targets);
    network_.step(static_cast<float>(o_.learning_rate), o_.max_gradient_norm);
    if (target_ && ++updates_ % o_.target_sync == 0) target_->set_parameters(network_.parameters());
  }

  double last_loss() const { return last_loss_; }

 private:
  // States with one query per action of the candidate each decides next,
  // or (with `actions`) only the query of the given action.
  QBatch batch_of(const std::vector<const DqnState*>& states,
                  const std::vector<int>* actions = nullptr) const {
    QBatch batch;
    batch.states = static_cast<int>(states.size());
    for (int b = 0; b < batch.states; ++b) {
      const DqnState& s = *states[b];
      env_.features(s, batch.features);
      batch.current.push_back(env_.current_node(s));
      const int candidate = static_cast<int>(s.decided.size());
      for (int a = 0; a < kDqnActions; ++a) {
        if (actions && (*actions)[b] != a) continue;
        batch.query_state.push_back(b);
        batch.query_node.push_back(env_.node_of(candidate, a));
      }
    }
    return batch;
  }

  DqnEnvironment& env_;
  const DqnOptions& o_;
  QNetwork network_;
  std::unique_ptr<QNetwork> target_;  // Eq. 5's W when target_sync > 0
  int64_t updates_ = 0;
  Rng rng_;
  std::vector<Experience> replay_;
  size_t oldest_ = 0;
  double last_loss_ = 0;
};

// The terminal states worth keeping: the fastest that fits, and the one
// with the least reservation (for the error when none fits).
struct Best {
  DqnState fastest, closest;
  bool found = false, any = false;
  int episode = -1;

  void consider(const DqnState& s, int episode_index) {
    if (s.outcome.fits && (!found || s.outcome.step_seconds < fastest.outcome.step_seconds)) {
      fastest = s;
      found = true;
      episode = episode_index;
    }
    if (!any || s.outcome.reservation < closest.outcome.reservation) {
      closest = s;
      any = true;
    }
  }
};

[[noreturn]] void throw_no_fit(const memory::MemoryModel& model, const memory::StepCosts& costs,
                               size_t capacity, memory::Planner planner, const DqnEnvironment& env,
                               const Best& best, int episodes) {
  const memory::MemoryPlan closest = memory::evaluate_plan(
      "dqn", env.layer_actions(best.closest.decided), model, &costs, capacity, planner);
  const size_t least = memory::least_capacity(model);
  throw memory::OutOfMemoryError(
      "dqn: no plan found in " + std::to_string(episodes) + " episodes fits " +
      common::format_bytes_fixed(capacity) + " = " + std::to_string(capacity) +
      " bytes; the closest plan needs " + std::to_string(closest.simulation.reservation) +
      " bytes (" + closest.simulation.failure + "); the least capacity auto finds a plan for is " +
      common::format_bytes_fixed(least) + " = " + std::to_string(least) + " bytes");
}

}  // namespace

namespace {

// One episode of Algorithm 1 (lines 3-17): returns the sum of its rewards.
double run_episode(DqnEnvironment& env, Agent& agent, double epsilon, int updates, DqnState& last) {
  last = env.reset();
  double total = 0;
  while (!last.terminal) {
    const int action = agent.act(last, epsilon);
    DqnTransition t = env.step(last, action);
    total += t.reward;
    agent.remember({last, action, t.reward, t.next});
    for (int u = 0; u < updates; ++u) agent.learn();
    last = std::move(t.next);
  }
  return total;
}

// The trained policy's own plan: epsilon 0, no learning.
DqnState greedy_rollout(DqnEnvironment& env, Agent& agent) {
  DqnState s = env.reset();
  while (!s.terminal) s = env.step(s, agent.greedy(s)).next;
  return s;
}

}  // namespace

DqnRun train_dqn(const memory::MemoryModel& model, const memory::StepCosts& costs, size_t capacity,
                 memory::Planner planner, const DqnOptions& options, Backend& backend) {
  check(options);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  DqnEnvironment env(model, costs, capacity, planner, options.infeasible_penalty,
                     options.shape_rewards);
  DqnRun run;
  Best best;
  DqnState greedy = env.reset();  // terminal at once when keeping everything fits
  const bool keep_fits = greedy.terminal;
  if (!keep_fits) {
    Agent agent(env, backend, options);
    for (int episode = 0; episode < options.episodes; ++episode) {
      if (options.time_budget_seconds > 0 && elapsed() > options.time_budget_seconds) break;
      const double progress = static_cast<double>(episode) / std::max(1, options.episodes - 1);
      DqnState last;
      run.returns.push_back(run_episode(env, agent, 1.0 - (1.0 - options.epsilon_end) * progress,
                                        options.updates_per_step, last));
      best.consider(last, episode);
      ++run.episodes;
    }
    greedy = greedy_rollout(env, agent);
    run.last_loss = agent.last_loss();
  }
  best.consider(greedy, keep_fits ? -1 : run.episodes);
  run.greedy_fits = greedy.outcome.fits;
  run.greedy_step_seconds = greedy.outcome.step_seconds;
  run.greedy_actions = env.layer_actions(greedy.decided);
  if (!best.found) throw_no_fit(model, costs, capacity, planner, env, best, run.episodes);
  run.best_episode = best.episode;
  run.plan = memory::evaluate_plan("dqn", env.layer_actions(best.fastest.decided), model, &costs,
                                   capacity, planner);
  run.plan.simulations = env.simulations() + 1;
  run.plan.solve_seconds = elapsed();
  return run;
}

memory::MemoryPlan plan_dqn(const memory::MemoryModel& model, const memory::StepCosts& costs,
                            size_t capacity, memory::Planner planner, const DqnOptions& options) {
  const std::unique_ptr<Backend> backend =
      make_backend({.kind = worker::BackendKind::kCpu, .threads = 1, .memory_limit = 0});
  return train_dqn(model, costs, capacity, planner, options, *backend).plan;
}

}  // namespace vtrain::worker
