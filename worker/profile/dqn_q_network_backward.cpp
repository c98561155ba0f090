// The Q-network's backward pass: the gradient of Eq. 4 through Eq. 3, 2 and
// the T iterations of Eq. 1, into the weight gradients.
#include "worker/profile/dqn_q_network.h"
#include "worker/profile/dqn_q_network_internal.h"
#include "worker/device/op_calls.h"

namespace vtrain::worker {

void QNetwork::backward_score(Pass& pass, const QBatch& batch, const std::vector<float>& dq_host) {
  const int p = shape_.embedding, n = graph_.nodes(), queries = batch.queries();
  Matrix dq(*buffers_, queries, 1);
  dq.upload(dq_host);
  inner_product_backward_weights(backend_, **pass.hr, *dq, gradient(kW7), nullptr, 0.0f);
  Matrix dz(*buffers_, queries, 3 * p);
  inner_product_backward_data(backend_, *dq, weight(kW7), *dz);
  relu_backward(backend_, **pass.hr, *dz, *dz);
  Matrix dg1q(*buffers_, queries, p), dg2q(*buffers_, queries, p), dh8(*buffers_, queries, p);
  concat_backward(backend_, *dz, 0, *dg1q, 0.0f);
  concat_backward(backend_, *dz, p, *dg2q, 0.0f);
  concat_backward(backend_, *dz, 2 * p, *dh8, 0.0f);
  inner_product_backward_weights(backend_, **pass.sa, *dh8, gradient(kW8), nullptr, 0.0f);
  Matrix dsa(*buffers_, queries, p);
  inner_product_backward_data(backend_, *dh8, weight(kW8), *dsa);

  // Each query's share of g back to its state.
  const std::vector<float> dg1q_host = dg1q.download(), dg2q_host = dg2q.download();
  std::vector<float> dg1_host(static_cast<size_t>(batch.states) * p, 0.0f), dg2_host(dg1_host);
  for (int q = 0; q < queries; ++q) {
    add_row(&dg1_host[batch.query_state[q] * p], &dg1q_host[static_cast<size_t>(q) * p], p);
    add_row(&dg2_host[batch.query_state[q] * p], &dg2q_host[static_cast<size_t>(q) * p], p);
  }
  Matrix dg1(*buffers_, batch.states, p), dg2(*buffers_, batch.states, p);
  dg1.upload(dg1_host);
  dg2.upload(dg2_host);
  inner_product_backward_weights(backend_, **pass.sum, *dg1, gradient(kW5), nullptr, 0.0f);
  inner_product_backward_weights(backend_, **pass.sc, *dg2, gradient(kW6), nullptr, 0.0f);
  Matrix dsum(*buffers_, batch.states, p), dsc(*buffers_, batch.states, p);
  inner_product_backward_data(backend_, *dg1, weight(kW5), *dsum);
  inner_product_backward_data(backend_, *dg2, weight(kW6), *dsc);

  // d s^T: every node of a state from the sum, s_c and s_a from their rows.
  const std::vector<float> dsum_host = dsum.download(), dsc_host = dsc.download();
  const std::vector<float> dsa_host = dsa.download();
  std::vector<float> ds(static_cast<size_t>(batch.states) * n * p, 0.0f);
  for (int b = 0; b < batch.states; ++b) {
    const size_t base = static_cast<size_t>(b) * n;
    for (int v = 0; v < n; ++v) add_row(&ds[(base + v) * p], &dsum_host[b * p], p, 1.0f / n);
    add_row(&ds[(base + batch.current[b]) * p], &dsc_host[b * p], p);
  }
  for (int q = 0; q < queries; ++q) {
    const size_t row = static_cast<size_t>(batch.query_state[q]) * n + batch.query_node[q];
    add_row(&ds[row * p], &dsa_host[static_cast<size_t>(q) * p], p);
  }
  backward_embed(pass, batch, std::move(ds));
}

void QNetwork::backward_embed(Pass& pass, const QBatch& batch, std::vector<float> ds_host) {
  const int p = shape_.embedding, last = shape_.iterations - 1;
  const int64_t rows = static_cast<int64_t>(batch.states) * graph_.nodes();
  Matrix ds(*buffers_, rows, p), dc(*buffers_, rows, p);
  for (int t = last; t >= 0; --t) {
    // s^{t+1} = ReLU(C + W2 agg^t): ds becomes the pre-activation's gradient.
    ds.upload(ds_host);
    relu_backward(backend_, *pass.s[t], *ds, *ds);
    accumulate(backend_, *ds, *dc, t == last ? 0.0f : 1.0f);
    if (t == 0) break;  // s^0 = 0: nothing flows further
    inner_product_backward_weights(backend_, *pass.agg[t - 1], *ds, gradient(kW2), nullptr,
                                            t == last ? 0.0f : 1.0f);
    Matrix dagg(*buffers_, rows, p);
    inner_product_backward_data(backend_, *ds, weight(kW2), *dagg);
    ds_host = neighbour_sum(graph_, dagg.download(), batch.states, p, true);
  }
  if (last == 0) {
    backend_.fill(Tensor{vector_desc(static_cast<int64_t>(p) * p), gradient(kW2)}, 0.0f);
  }
  inner_product_backward_weights(backend_, **pass.x, *dc, gradient(kW1), nullptr, 0.0f);
  backward_edge_terms(pass, dc, batch.states);
}

// C holds W3 e spread to every state: e's gradient is the sum over states.
void QNetwork::backward_edge_terms(Pass& pass, const Matrix& dc, int states) {
  const int p = shape_.embedding, n = graph_.nodes();
  const int64_t m = static_cast<int64_t>(edge_target_.size());
  const std::vector<float> dc_host = dc.download();
  std::vector<float> de3_host(static_cast<size_t>(n) * p, 0.0f);
  for (int b = 0; b < states; ++b) {
    for (int v = 0; v < n; ++v) {
      add_row(&de3_host[static_cast<size_t>(v) * p], &dc_host[(static_cast<size_t>(b) * n + v) * p],
              p);
    }
  }
  Matrix de3(*buffers_, n, p), de(*buffers_, n, p);
  de3.upload(de3_host);
  inner_product_backward_weights(backend_, **pass.e, *de3, gradient(kW3), nullptr, 0.0f);
  inner_product_backward_data(backend_, *de3, weight(kW3), *de);
  const std::vector<float> de_host = de.download();
  std::vector<float> dh_host(static_cast<size_t>(m) * p);
  for (int64_t k = 0; k < m; ++k) {
    std::copy_n(&de_host[static_cast<size_t>(edge_target_[k]) * p], p, &dh_host[k * p]);
  }
  Matrix dh(*buffers_, m, p);
  dh.upload(dh_host);
  relu_backward(backend_, **pass.edge_h, *dh, *dh);
  inner_product_backward_weights(backend_, **pass.edge_w, *dh, gradient(kW4), nullptr, 0.0f);
}

}  // namespace vtrain::worker
