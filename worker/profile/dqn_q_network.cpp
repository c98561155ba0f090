#include "worker/profile/dqn_q_network.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "worker/engine/rng.h"
#include "worker/profile/dqn_q_network_internal.h"
#include "worker/device/op_calls.h"

namespace vtrain::worker {

QNetwork::QNetwork(Backend& backend, QGraph graph, const QNetworkShape& shape, uint64_t seed,
                   float momentum)
    : backend_(backend), graph_(std::move(graph)), shape_(shape) {
  if (shape.features < 1 || shape.embedding < 1 || shape.iterations < 1) {
    throw std::invalid_argument("q-network: features, embedding and iterations must be >= 1");
  }
  const int n = graph_.nodes();
  for (int v = 0; v < n; ++v) {
    for (const auto& [u, w] : graph_.neighbours[v]) {
      if (u < 0 || u >= n) {
        throw std::invalid_argument("q-network: node " + std::to_string(v) + " has neighbour " +
                                    std::to_string(u) + " outside the " + std::to_string(n) +
                                    " nodes");
      }
      edge_weight_.push_back(w);
      edge_target_.push_back(v);
    }
  }
  const int64_t p = shape.embedding;
  const int64_t fan[kWeightCount][2] = {{p, shape.features}, {p, p}, {p, p}, {p, 1}, {p, p}, {p, p},
                                        {1, 3 * p},          {p, p}};
  for (int w = 0; w < kWeightCount; ++w) offset_[w + 1] = offset_[w] + fan[w][0] * fan[w][1];
  count_ = offset_[kWeightCount];
  std::vector<float> init(static_cast<size_t>(count_));
  Rng rng(seed);
  for (int w = 0; w < kWeightCount; ++w) {
    const float bound = std::sqrt(6.0f / static_cast<float>(fan[w][0] + fan[w][1]));
    for (int64_t i = offset_[w]; i < offset_[w + 1]; ++i) init[i] = rng.uniform(bound);
  }
  params_ = static_cast<float*>(backend_.allocate_device(count_ * sizeof(float)));
  grads_ = static_cast<float*>(backend_.allocate_device(count_ * sizeof(float)));
  set_parameters(init);
  backend_.fill(Tensor{vector_desc(count_), grads_}, 0.0f);
  sgd_ = std::make_unique<Sgd>(backend_, count_, momentum, 0.0f);
  buffers_ = std::make_unique<BufferPool>(backend_);
}

QNetwork::~QNetwork() {
  buffers_.reset();
  sgd_.reset();
  backend_.free_device(grads_);
  backend_.free_device(params_);
}

float* QNetwork::weight(Weight w) const { return params_ + offset_[w]; }
float* QNetwork::gradient(Weight w) const { return grads_ + offset_[w]; }

std::vector<float> QNetwork::parameters() const {
  std::vector<float> host(static_cast<size_t>(count_));
  backend_.download(Tensor{vector_desc(count_), params_}, host.data());
  return host;
}

void QNetwork::set_parameters(std::span<const float> values) {
  if (static_cast<int64_t>(values.size()) != count_) {
    throw std::invalid_argument("q-network: " + std::to_string(values.size()) + " parameters for " +
                                std::to_string(count_));
  }
  backend_.upload(values.data(), Tensor{vector_desc(count_), params_});
}

std::vector<float> QNetwork::gradients() const {
  std::vector<float> host(static_cast<size_t>(count_));
  backend_.download(Tensor{vector_desc(count_), grads_}, host.data());
  return host;
}

void QNetwork::check(const QBatch& batch) const {
  const int n = graph_.nodes();
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("q-network batch: " + what);
  };
  if (batch.states < 1 || batch.queries() < 1) fail("needs at least one state and one query");
  const size_t want = static_cast<size_t>(batch.states) * n * shape_.features;
  if (batch.features.size() != want) {
    fail("features has " + std::to_string(batch.features.size()) + " values, want " +
         std::to_string(want) + " (states x nodes x features)");
  }
  if (static_cast<int>(batch.current.size()) != batch.states) fail("current needs one per state");
  if (batch.query_state.size() != batch.query_node.size()) {
    fail("query_state and query_node differ in length");
  }
  for (int c : batch.current) {
    if (c < 0 || c >= n) fail("current node " + std::to_string(c) + " outside the graph");
  }
  for (int q = 0; q < batch.queries(); ++q) {
    if (batch.query_state[q] < 0 || batch.query_state[q] >= batch.states) {
      fail("query_state[" + std::to_string(q) + "] is not a state of the batch");
    }
    if (batch.query_node[q] < 0 || batch.query_node[q] >= n) {
      fail("query_node[" + std::to_string(q) + "] outside the graph");
    }
  }
}

// W3 sum ReLU(W4 w(u, v)) for every node, spread to every state and added to
// W1 x_v: the part of Eq. 1 that does not change with t.
void QNetwork::edge_terms(Pass& pass, int states) {
  const int64_t p = shape_.embedding, m = static_cast<int64_t>(edge_weight_.size());
  const int n = graph_.nodes();
  pass.edge_w.emplace(*buffers_, m, 1);
  pass.edge_w->upload(edge_weight_);
  Matrix edge_pre(*buffers_, m, p);
  inner_product_forward(backend_, **pass.edge_w, weight(kW4), nullptr, *edge_pre);
  pass.edge_h.emplace(*buffers_, m, p);
  relu_forward(backend_, *edge_pre, **pass.edge_h);
  const std::vector<float> h = pass.edge_h->download();
  std::vector<float> e(static_cast<size_t>(n) * p, 0.0f);
  for (int64_t k = 0; k < m; ++k) add_row(&e[edge_target_[k] * p], &h[k * p], static_cast<int>(p));
  pass.e.emplace(*buffers_, n, p);
  pass.e->upload(e);
  Matrix e3(*buffers_, n, p);
  inner_product_forward(backend_, **pass.e, weight(kW3), nullptr, *e3);
  const std::vector<float> one = e3.download();
  std::vector<float> spread;
  spread.reserve(one.size() * states);
  for (int b = 0; b < states; ++b) spread.insert(spread.end(), one.begin(), one.end());
  Matrix tiled(*buffers_, static_cast<int64_t>(n) * states, p);
  tiled.upload(spread);
  add(backend_, **pass.c, *tiled, **pass.c);
}

void QNetwork::embed(Pass& pass, const QBatch& batch) {
  const int64_t p = shape_.embedding, rows = static_cast<int64_t>(batch.states) * graph_.nodes();
  pass.x.emplace(*buffers_, rows, shape_.features);
  pass.x->upload(batch.features);
  pass.c.emplace(*buffers_, rows, p);
  inner_product_forward(backend_, **pass.x, weight(kW1), nullptr, **pass.c);
  edge_terms(pass, batch.states);
  pass.s.emplace_back(*buffers_, rows, p);  // s^1 = ReLU(C): s^0 = 0
  relu_forward(backend_, **pass.c, *pass.s.back());
  for (int t = 1; t < shape_.iterations; ++t) {
    pass.agg.emplace_back(*buffers_, rows, p);
    pass.agg.back().upload(
        neighbour_sum(graph_, pass.s.back().download(), batch.states, static_cast<int>(p), false));
    Matrix pre(*buffers_, rows, p);
    inner_product_forward(backend_, *pass.agg.back(), weight(kW2), nullptr, *pre);
    add(backend_, **pass.c, *pre, *pre);
    pass.s.emplace_back(*buffers_, rows, p);
    relu_forward(backend_, *pre, *pass.s.back());
  }
}

void QNetwork::score(Pass& pass, const QBatch& batch) {
  const int p = shape_.embedding, n = graph_.nodes(), queries = batch.queries();
  const std::vector<float> s = pass.s.back().download();
  std::vector<float> sum(static_cast<size_t>(batch.states) * p, 0.0f), sc(sum.size());
  std::vector<float> sa(static_cast<size_t>(queries) * p);
  for (int b = 0; b < batch.states; ++b) {
    for (int v = 0; v < n; ++v) {
      add_row(&sum[b * p], &s[(static_cast<size_t>(b) * n + v) * p], p, 1.0f / n);
    }
    std::copy_n(&s[(static_cast<size_t>(b) * n + batch.current[b]) * p], p, &sc[b * p]);
  }
  for (int q = 0; q < queries; ++q) {
    const size_t row = static_cast<size_t>(batch.query_state[q]) * n + batch.query_node[q];
    std::copy_n(&s[row * p], p, &sa[static_cast<size_t>(q) * p]);
  }
  pass.sum.emplace(*buffers_, batch.states, p);
  pass.sum->upload(sum);
  pass.sc.emplace(*buffers_, batch.states, p);
  pass.sc->upload(sc);
  pass.sa.emplace(*buffers_, queries, p);
  pass.sa->upload(sa);
  Matrix g1(*buffers_, batch.states, p), g2(*buffers_, batch.states, p), h8(*buffers_, queries, p);
  inner_product_forward(backend_, **pass.sum, weight(kW5), nullptr, *g1);
  inner_product_forward(backend_, **pass.sc, weight(kW6), nullptr, *g2);
  inner_product_forward(backend_, **pass.sa, weight(kW8), nullptr, *h8);
  // g of each query's state, then [g, W8 s_a].
  const std::vector<float> g1_host = g1.download(), g2_host = g2.download();
  std::vector<float> g1q(sa.size()), g2q(sa.size());
  for (int q = 0; q < queries; ++q) {
    std::copy_n(&g1_host[batch.query_state[q] * p], p, &g1q[static_cast<size_t>(q) * p]);
    std::copy_n(&g2_host[batch.query_state[q] * p], p, &g2q[static_cast<size_t>(q) * p]);
  }
  Matrix g1m(*buffers_, queries, p), g2m(*buffers_, queries, p), z(*buffers_, queries, 3 * p);
  g1m.upload(g1q);
  g2m.upload(g2q);
  const Tensor parts[] = {*g1m, *g2m, *h8};
  concat_forward(backend_, parts, *z);
  pass.hr.emplace(*buffers_, queries, 3 * p);
  relu_forward(backend_, *z, **pass.hr);
  Matrix q(*buffers_, queries, 1);
  inner_product_forward(backend_, **pass.hr, weight(kW7), nullptr, *q);
  pass.q = q.download();
}

std::vector<float> QNetwork::evaluate(const QBatch& batch) {
  check(batch);
  Pass pass;
  embed(pass, batch);
  score(pass, batch);
  return pass.q;
}

double QNetwork::backpropagate(const QBatch& batch, std::span<const float> targets) {
  check(batch);
  if (static_cast<int>(targets.size()) != batch.queries()) {
    throw std::invalid_argument("q-network: " + std::to_string(targets.size()) + " targets for " +
                                std::to_string(batch.queries()) + " queries");
  }
  Pass pass;
  embed(pass, batch);
  score(pass, batch);
  double loss = 0;
  std::vector<float> dq(pass.q.size());
  const double scale = 1.0 / static_cast<double>(dq.size());
  for (size_t i = 0; i < dq.size(); ++i) {
    const double error = static_cast<double>(pass.q[i]) - targets[i];
    loss += error * error * scale;
    dq[i] = static_cast<float>(2.0 * error * scale);
  }
  backward_score(pass, batch, dq);
  return loss;
}

void QNetwork::step(float learning_rate, float max_norm) {
  if (max_norm > 0) {
    double norm = 0;
    for (float g : gradients()) norm += static_cast<double>(g) * g;
    norm = std::sqrt(norm);
    if (norm > max_norm) backend_.run(ScaleDesc{count_, static_cast<float>(max_norm / norm)}, ScaleArgs{grads_});
  }
  sgd_->step(params_, grads_, learning_rate);
}

}  // namespace vtrain::worker
