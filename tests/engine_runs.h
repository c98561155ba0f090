// Training a network for a few steps on seeded synthetic batches, the same
// way on every backend: what the memory tests compare across policies and
// planners (CPU) and across policies on real streams (CUDA).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory_resource>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "memory/chrome_trace.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"
#include "worker/train/batch_gatherer.h"

namespace vtrain::test_support {

struct TrainRun {
  std::vector<float> params, buffers;
  worker::MemoryStats stats;
};

// A preset for 3 x side x side inputs and 10 classes.
inline worker::Graph preset_graph(const std::string& preset, int64_t side) {
  const worker::Shape input{1, 3, side, side};
  return worker::Graph::build(worker::preset_layers(preset, {input, 10}), input);
}

// `steps` SGD steps (momentum 0.9, weight decay 1e-4) of `net` at batch
// max_batch, the last one partial (max_batch - 1), and one evaluation pass
// after the first step; returns the parameters, batch-norm buffers and
// memory stats.
inline TrainRun train_steps_of(worker::Backend& backend, worker::Network& net, int steps,
                               int64_t max_batch) {
  worker::Sgd sgd(backend, net.parameter_count(), 0.9f, 1e-4f);
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int step = 0; step < steps; ++step) {
    const int64_t n = step == steps - 1 ? max_batch - 1 : max_batch;
    const worker::Tensor in = net.input(n);
    std::vector<float> x(static_cast<size_t>(in.shape().elements()));
    for (float& v : x) v = dist(rng);
    backend.upload(x.data(), in);
    std::vector<int32_t> labels(static_cast<size_t>(n));
    for (auto& l : labels) l = static_cast<int32_t>(rng() % 10);
    backend.upload_labels(labels.data(), net.labels(), n);
    net.train_step(n, 1.0f / static_cast<float>(n));
    sgd.step(net.parameters(), net.gradients(), 0.05f);
    if (step == 0) net.evaluate(n);  // the evaluation schedule between steps
  }
  return {net.download_parameters(), net.download_buffers(), net.memory_stats()};
}

// The same on a new network of `graph` under `options`, initialised with
// seed 3.
inline TrainRun train_steps(worker::Backend& backend, const worker::Graph& graph,
                            const worker::NetworkOptions& options, int steps = 2) {
  worker::Network net(graph, backend, options);
  net.init_parameters(3);
  return train_steps_of(backend, net, steps, options.max_batch);
}

// One training step of `net` (initialised with seed 1) on n samples of 0.5
// labelled 1, recorded into `trace` (the network keeps tracing); returns the
// trace's JSON.
inline std::string traced_step(worker::Backend& backend, worker::Network& net,
                               memory::ChromeTrace& trace, int64_t n = 4) {
  net.init_parameters(1);
  net.set_trace(&trace);
  backend.fill(net.input(n), 0.5f);
  std::vector<int32_t> labels(static_cast<size_t>(n), 1);
  backend.upload_labels(labels.data(), net.labels(), n);
  net.train_step(n, 1.0f / static_cast<float>(n));
  return trace.json();
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Largest |a - b| over the largest |a| (a and b of one size).
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(a[i])));
  }
  return diff / scale;
}

// The input prefetch (NetworkOptions::prefetch_input) on `backend`: a
// batch copied on the memory stream ahead of its upload is what the upload
// writes, in the input's type, bit for bit what Backend::upload writes; an
// upload of another batch or size takes that batch instead; the batch's
// host memory may change once its upload returned; the staging is a
// persistent block of the pool, there only with the option.
inline void check_input_prefetch(worker::Backend& backend, common::Precision precision) {
  using worker::Network;
  const worker::Shape input{1, 3, 16, 16};
  const worker::Graph g =
      worker::Graph::build(worker::preset_layers("lenet", {input, 4}), input);
  worker::NetworkOptions o;
  o.settings.precision = precision;
  o.max_batch = 8;
  o.conv_algorithm = "auto";
  {
    Network plain(g, backend, o);
    for (const auto& p : plain.memory_model().persistent) EXPECT_NE(p.name, "input_staging");
    EXPECT_THROW(plain.prefetch_input(nullptr, 1), std::logic_error);
  }
  // The host batches outlive the network: its destructor waits for the
  // copy left pending at the end.
  const int64_t per_sample = input.per_sample();
  const auto batch_floats = static_cast<size_t>(8 * per_sample);
  worker::PinnedMemory pinned(backend);
  std::pmr::vector<float> a(batch_floats, &pinned), b(batch_floats, &pinned);
  o.prefetch_input = true;
  Network net(g, backend, o);
  ASSERT_EQ(net.input(1).shape().elements(), per_sample);
  size_t staging = 0;
  for (const auto& p : net.memory_model().persistent) {
    if (p.name == "input_staging") staging = p.bytes;
  }
  EXPECT_EQ(staging, batch_floats * sizeof(float));

  // Values a half input holds exactly: integers up to 256, another set per batch.
  auto fill = [](std::pmr::vector<float>& v, int tag) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(tag * 40 + i % 37);
  };
  fill(a, 1);
  fill(b, 2);
  const std::vector<float> a_values(a.begin(), a.end()), b_values(b.begin(), b.end());
  auto input_now = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n * per_sample));
    backend.download(net.input(n), x.data());
    return x;
  };
  auto leading = [&](const std::vector<float>& v, int64_t n) {
    return std::vector<float>(v.begin(), v.begin() + n * per_sample);
  };

  // The upload writes the copy the prefetch made: a change to the host
  // memory after the copy (the memory stream waited for here) is not seen.
  net.prefetch_input(a.data(), 8);
  backend.synchronize(worker::StreamKind::kMemory);
  fill(a, 3);
  EXPECT_TRUE(net.upload_input(a.data(), 8));
  EXPECT_EQ(input_now(8), a_values);
  fill(a, 1);

  net.prefetch_input(b.data(), 5);
  EXPECT_TRUE(net.upload_input(b.data(), 5));
  fill(b, 4);  // free once uploaded
  EXPECT_EQ(input_now(5), leading(b_values, 5));
  fill(b, 2);

  net.prefetch_input(a.data(), 8);  // dropped: another batch is uploaded
  EXPECT_FALSE(net.upload_input(b.data(), 8));
  EXPECT_EQ(input_now(8), b_values);
  net.prefetch_input(a.data(), 8);  // dropped: another size
  EXPECT_FALSE(net.upload_input(a.data(), 6));
  EXPECT_EQ(input_now(6), leading(a_values, 6));
  net.prefetch_input(a.data(), 8);  // replaced by the next one
  net.prefetch_input(b.data(), 8);
  EXPECT_TRUE(net.upload_input(b.data(), 8));
  EXPECT_EQ(input_now(8), b_values);
  EXPECT_FALSE(net.upload_input(b.data(), 8));  // taken once

  // Each wait between the streams, with the stream it waits for held up by
  // a long copy, so that on a GPU a missing wait reads or overwrites the
  // staging every time, not by chance (on the CPU the compute stream is
  // the host's own, and the lazy memory stream catches a missing wait).
  const size_t stall_bytes = size_t{64} << 20;  // over a millisecond on a PCIe 5 bus
  auto* stall_host = static_cast<char*>(backend.allocate_pinned(stall_bytes));
  void* stall_device = backend.allocate_device(stall_bytes);
  std::memset(stall_host, 0, stall_bytes);
  // The conversion waits for the copy: the memory stream busy before it,
  // the staging holding another batch.
  EXPECT_FALSE(net.upload_input(a.data(), 8));
  backend.copy_async(stall_device, stall_host, stall_bytes, worker::StreamKind::kMemory);
  net.prefetch_input(b.data(), 8);
  EXPECT_TRUE(net.upload_input(b.data(), 8));
  EXPECT_EQ(input_now(8), b_values);
  // The next copy into the staging waits for the conversion that reads
  // it: the compute stream busy before that conversion (a copy to the
  // host, on another copy engine than the prefetch's).
  net.prefetch_input(a.data(), 8);
  backend.synchronize(worker::StreamKind::kMemory);
  backend.copy_async(stall_host, stall_device, stall_bytes, worker::StreamKind::kCompute);
  EXPECT_TRUE(net.upload_input(a.data(), 8));
  net.prefetch_input(b.data(), 8);
  EXPECT_EQ(input_now(8), a_values);
  EXPECT_TRUE(net.upload_input(b.data(), 8));
  EXPECT_EQ(input_now(8), b_values);
  backend.synchronize(worker::StreamKind::kCompute);
  backend.free_device(stall_device);
  backend.free_pinned(stall_host);

  // Values a half input rounds: the prefetched and the plain path round alike.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : a) v = normal(rng);
  backend.upload(a.data(), net.input(8));
  const std::vector<float> uploaded = input_now(8);
  net.prefetch_input(a.data(), 8);
  EXPECT_TRUE(net.upload_input(a.data(), 8));
  const std::vector<float> prefetched = input_now(8);
  EXPECT_TRUE(bitwise_equal(prefetched, uploaded));
  EXPECT_FALSE(net.upload_input(a.data(), 8));  // through the staging, not prefetched
  EXPECT_TRUE(bitwise_equal(input_now(8), uploaded));

  EXPECT_THROW(net.prefetch_input(a.data(), 9), std::invalid_argument);

  // A traced prefetch is a span of the memory stream.
  memory::ChromeTrace trace(0, "prefetch");
  net.set_trace(&trace);
  net.prefetch_input(b.data(), 8);
  net.set_trace(nullptr);
  EXPECT_NE(trace.events_json().find("\"prefetch input\""), std::string::npos)
      << trace.events_json();
  EXPECT_TRUE(net.upload_input(b.data(), 8));
  EXPECT_EQ(input_now(8), b_values);

  net.prefetch_input(a.data(), 8);  // left pending: the destructor waits for it
}

}  // namespace vtrain::test_support
