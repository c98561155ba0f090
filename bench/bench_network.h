// A network's input for the C++ benchmark drivers that time training steps.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "worker/engine/graph.h"
#include "worker/engine/network.h"

namespace vtrain::bench {

// Uploads one batch of `batch` normal random images and random labels (a
// fixed seed: every run of a benchmark trains on the same batch).
inline void upload_random_batch(worker::Network& net, const worker::Graph& graph, int64_t batch) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const worker::Tensor in = net.input(batch);
  std::vector<float> x(static_cast<size_t>(in.shape().elements()));
  for (float& v : x) v = dist(rng);
  net.backend().upload(x.data(), in);
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  for (auto& l : labels) l = static_cast<int32_t>(rng() % graph.classes());
  net.backend().upload_labels(labels.data(), net.labels(), batch);
}

}  // namespace vtrain::bench
