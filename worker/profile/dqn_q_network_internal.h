// The Q-network's internals shared by its forward (dqn_q_network.cpp) and
// backward (dqn_q_network_backward.cpp): device matrices, what a forward
// pass keeps, and the host-side sums over the graph.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "worker/profile/dqn_q_network.h"

namespace vtrain::worker {

// Device buffers the passes reuse: a pass allocates the same sizes every
// time, and the backend's allocations are not free.
class QNetwork::BufferPool {
 public:
  explicit BufferPool(Backend& backend) : backend_(backend) {}
  ~BufferPool() {
    for (const auto& [bytes, ptr] : free_) backend_.free_device(ptr);
  }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  float* take(size_t bytes) {
    auto it = free_.find(bytes);
    if (it == free_.end()) return static_cast<float*>(backend_.allocate_device(bytes));
    float* ptr = it->second;
    free_.erase(it);
    return ptr;
  }
  void give(size_t bytes, float* ptr) { free_.emplace(bytes, ptr); }
  Backend& backend() { return backend_; }

 private:
  Backend& backend_;
  std::multimap<size_t, float*> free_;
};

// rows x cols floats of device memory, as the plain {rows, cols, 1, 1}
// tensor the inner-product ops take.
class QNetwork::Matrix {
 public:
  Matrix(BufferPool& pool, int64_t rows, int64_t cols) : pool_(&pool) {
    tensor_.desc.shape = {rows, cols, 1, 1};
    tensor_.data = pool.take(bytes());
  }
  ~Matrix() {
    if (tensor_.data) pool_->give(bytes(), tensor_.f32("Matrix"));
  }
  Matrix(const Matrix&) = delete;
  Matrix& operator=(const Matrix&) = delete;
  Matrix(Matrix&& other) noexcept : pool_(other.pool_), tensor_(other.tensor_) {
    other.tensor_.data = nullptr;
  }

  const Tensor& operator*() const { return tensor_; }
  std::vector<float> download() const {
    std::vector<float> host(static_cast<size_t>(tensor_.shape().elements()));
    pool_->backend().download(tensor_, host.data());
    return host;
  }
  void upload(const std::vector<float>& host) { pool_->backend().upload(host.data(), tensor_); }

 private:
  size_t bytes() const { return std::max(tensor_.bytes(), sizeof(float)); }

  BufferPool* pool_;
  Tensor tensor_;
};

// What a forward pass keeps for its backward.
struct QNetwork::Pass {
  std::optional<Matrix> x, c;  // features; W1 x + W3 (edge terms)
  std::optional<Matrix> edge_w,
      edge_h;               // per edge: w(u, v) and ReLU(W4 w(u, v))
  std::optional<Matrix> e;  // per node: the sum of edge_h over N(v)
  std::optional<Matrix> sum, sc,
      sa;                    // sum_V s^T per state, s_c^T per state, s_a^T per query
  std::optional<Matrix> hr;  // ReLU([g, W8 s_a]) per query
  std::vector<Matrix> s;     // s^1 ... s^T, states x nodes rows
  std::vector<Matrix> agg;   // sum over N(v) of s^1 ... s^{T-1}
  std::vector<float> q;
};

// out[b, v] = sum over u in N(v) of in[b, u] (transpose: out[b, u] += in[b,
// v]).
inline std::vector<float> neighbour_sum(const QGraph& graph, const std::vector<float>& in,
                                        int states, int p, bool transpose) {
  const int n = graph.nodes();
  std::vector<float> out(in.size(), 0.0f);
  for (int b = 0; b < states; ++b) {
    const size_t base = static_cast<size_t>(b) * n;
    for (int v = 0; v < n; ++v) {
      for (const auto& [u, w] : graph.neighbours[v]) {
        const float* from = &in[((transpose ? v : u) + base) * p];
        float* to = &out[((transpose ? u : v) + base) * p];
        for (int j = 0; j < p; ++j) to[j] += from[j];
      }
    }
  }
  return out;
}

inline void add_row(float* to, const float* from, int p, float scale = 1.0f) {
  for (int j = 0; j < p; ++j) to[j] += scale * from[j];
}

}  // namespace vtrain::worker
