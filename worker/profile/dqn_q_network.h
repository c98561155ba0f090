// The DQN planner's Q-network (the swap-and-recompute paper, Sec. 4.4 and
// 4.9), on a worker::Backend:
//
//   s_v^{t+1} = ReLU(W1 x_v + W2 sum_{u in N(v)} s_u^t
//                    + W3 sum_{u in N(v)} ReLU(W4 w(u, v)))         (Eq. 1, s^0
//                    = 0)
//   g         = [W5 sum_{u in V} s_u^T, W6 s_c^T]                    (Eq. 2)
//   Q(g, s_a) = W7 ReLU([g, W8 s_a^T])                               (Eq. 3)
//
// What runs where. On the backend: every product with a learned matrix
// (inner_product_forward over all nodes of all states of a batch at once,
// inner_product_backward_data / _weights for the gradients), the ReLUs and
// their backward, the sums C + W2 (...) (add, accumulate), the
// concatenation [g, W8 s_a] and its split (concat_forward / _backward), and
// the SGD update (worker::Sgd). On the host, between those calls: the
// neighbourhood sums over N(v) and their transpose in backward, the sum over
// V and the picking of s_c and s_a rows (and their scatter back), the
// spreading of W3 (...) to every state of a batch and its sum back, the
// squared-error loss and its gradient (Eq. 4). Each host step is a fixed
// linear map of the rows it moves.
//
// Deterministic for a seed on one backend and thread count: the weights
// start from worker::Rng, and every host sum runs in a fixed order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "worker/device/backend.h"
#include "worker/engine/optimizer.h"

namespace vtrain::worker {

// The graph every state of a batch shares: per node, N(v) with the edge
// weights w(u, v) (v itself belongs to N(v)).
struct QGraph {
  std::vector<std::vector<std::pair<int, float>>> neighbours;
  int nodes() const { return static_cast<int>(neighbours.size()); }
};

// Some states of the graph and the (state, action node) pairs to score.
struct QBatch {
  int states = 0;
  std::vector<float> features;   // states x nodes x feature_count, row-major
  std::vector<int> current;      // per state: the node under execution (s_c)
  std::vector<int> query_state;  // per query: which state
  std::vector<int> query_node;   // per query: the action node (s_a)
  int queries() const { return static_cast<int>(query_node.size()); }
};

struct QNetworkShape {
  int features = 0;    // length of x_v
  int embedding = 16;  // p
  int iterations = 3;  // T of Eq. 1 (at least 1)
};

class QNetwork {
 public:
  // Weights uniform in +-sqrt(6 / (fan_in + fan_out)) from `seed`; SGD with
  // `momentum`. Throws std::invalid_argument for a bad shape or a neighbour
  // outside the graph.
  QNetwork(Backend& backend, QGraph graph, const QNetworkShape& shape, uint64_t seed,
           float momentum);
  ~QNetwork();
  QNetwork(const QNetwork&) = delete;
  QNetwork& operator=(const QNetwork&) = delete;

  // Q for every query of the batch. Throws std::invalid_argument naming the
  // field of a batch whose sizes or indices do not match the graph.
  std::vector<float> evaluate(const QBatch& batch);
  // The mean over the queries of (target - Q)^2 (Eq. 4), and its gradient
  // with respect to every weight, kept for step() and gradients().
  double backpropagate(const QBatch& batch, std::span<const float> targets);
  // One SGD step with the last backpropagate()'s gradient, scaled down to
  // an L2 norm of `max_norm` when it is longer (0: never).
  void step(float learning_rate, float max_norm = 0);

  int64_t parameter_count() const { return count_; }
  // W1 ... W8, each row-major {out, in}, one after the other.
  std::vector<float> parameters() const;
  void set_parameters(std::span<const float> values);
  std::vector<float> gradients() const;

 private:
  class BufferPool;
  class Matrix;
  struct Pass;
  enum Weight { kW1, kW2, kW3, kW4, kW5, kW6, kW7, kW8, kWeightCount };

  float* weight(Weight w) const;
  float* gradient(Weight w) const;
  void check(const QBatch& batch) const;
  void embed(Pass& pass, const QBatch& batch);
  void score(Pass& pass, const QBatch& batch);
  void edge_terms(Pass& pass, int states);
  void backward_score(Pass& pass, const QBatch& batch, const std::vector<float>& dq);
  void backward_embed(Pass& pass, const QBatch& batch, std::vector<float> ds);
  void backward_edge_terms(Pass& pass, const Matrix& dc, int states);

  Backend& backend_;
  QGraph graph_;
  QNetworkShape shape_;
  int64_t offset_[kWeightCount + 1] = {};
  int64_t count_ = 0;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  std::unique_ptr<Sgd> sgd_;
  std::unique_ptr<BufferPool> buffers_;
  std::vector<float> edge_weight_;  // per edge (v's neighbours in order, v by v)
  std::vector<int> edge_target_;    // per edge: v
};

}  // namespace vtrain::worker
