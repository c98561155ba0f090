// Graphs built by hand and checks of measured step costs, shared by the
// engine's and the profiler's tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memory/simulator.h"
#include "worker/engine/graph.h"

namespace vtrain::test_support {

// Layer `name` of `type` reading `inputs`; `out`: a conv's channels or an
// fc's features; `kernel`: a conv's or pool's square window, padded to keep
// the size at stride 1.
inline worker::LayerSpec layer_spec(const std::string& name, worker::LayerType type,
                                    std::vector<std::string> inputs, int64_t out = 0,
                                    int64_t kernel = 0) {
  worker::LayerSpec s;
  s.name = name;
  s.type = type;
  s.inputs = std::move(inputs);
  s.out = out;
  s.kernel_h = s.kernel_w = kernel;
  s.pad_h = s.pad_w = kernel / 2;
  return s;
}

// One forward and backward time per layer of `graph`, 0 for the data and
// positive for every other layer, and a positive loss.
inline void expect_every_layer_timed(const worker::Graph& graph, const memory::StepCosts& costs) {
  ASSERT_EQ(costs.forward_seconds.size(), static_cast<size_t>(graph.size()));
  ASSERT_EQ(costs.backward_seconds.size(), static_cast<size_t>(graph.size()));
  EXPECT_EQ(costs.forward_seconds[graph.input_index()], 0);
  EXPECT_EQ(costs.backward_seconds[graph.input_index()], 0);
  for (int i = 0; i < graph.size(); ++i) {
    if (i == graph.input_index()) continue;
    EXPECT_GT(costs.forward_seconds[i], 0) << graph.layer(i).name;
    EXPECT_GT(costs.backward_seconds[i], 0) << graph.layer(i).name;
  }
  EXPECT_GT(costs.loss_seconds, 0);
}

}  // namespace vtrain::test_support
