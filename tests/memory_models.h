// Small memory models for the memory part's tests (a chain and a fork/join
// graph, layers described as the engine describes them) and a symbolic
// executor that checks a schedule never touches a released tensor.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "memory/vdnn_plan.h"

namespace vtrain::memory::test_models {

inline LayerNode node(const std::string& name, std::vector<int> inputs, size_t bytes,
               const std::string& type) {
  LayerNode l;
  l.name = name;
  l.inputs = std::move(inputs);
  l.output_bytes = bytes;
  l.is_input = type == "input";
  l.is_conv = type == "conv";
  // What each layer type's backward reads in the engine.
  l.backward_reads_inputs = type == "conv" || type == "pool" || type == "fc" || type == "bn";
  l.backward_reads_output = type == "relu" || type == "pool";
  l.backward_accumulates = type == "conv" || type == "add" || type == "concat";
  l.backward_needs_input_grad = type == "bn";
  if (type == "conv") l.forward_workspace = l.backward_workspace = bytes / 2;
  if (type == "pool" || type == "bn") l.state_bytes = 512;
  return l;
}

// A linear net: data, conv, relu, conv, relu, pool, fc.
inline MemoryModel chain() {
  MemoryModel m;
  m.layers = {node("data", {}, 4096, "input"), node("conv1", {0}, 8192, "conv"),
              node("relu1", {1}, 8192, "relu"), node("conv2", {2}, 8192, "conv"),
              node("relu2", {3}, 8192, "relu"), node("pool", {4}, 2048, "pool"),
              node("fc", {5}, 256, "fc")};
  m.persistent = {{"params", 10000}, {"grads", 10000}};
  return m;
}

// Fork and join: an inception-like block (concat of two branches, one of them
// a pool that reads the fork's tensor too) and a residual add whose skip
// input is read again after the join.
inline MemoryModel fork_join() {
  MemoryModel m;
  m.layers = {
      node("data", {}, 4096, "input"),      // 0
      node("stem", {0}, 8192, "conv"),      // 1
      node("bn", {1}, 8192, "bn"),          // 2
      node("relu", {2}, 8192, "relu"),      // 3  fork: read by 4, 5, 6
      node("b1", {3}, 4096, "conv"),        // 4
      node("b2pool", {3}, 8192, "pool"),    // 5
      node("b2", {5}, 4096, "conv"),        // 6
      node("cat", {4, 6}, 8192, "concat"),  // 7
      node("c", {7}, 8192, "conv"),         // 8
      node("add", {8, 3}, 8192, "add"),     // 9  join with the skip from relu
      node("relu2", {9}, 8192, "relu"),     // 10
      node("conv_a", {10}, 4096, "conv"),   // 11
      node("add2", {11, 10, 10}, 4096, "add"),  // 12 reads relu2 twice
      node("fc", {12}, 256, "fc"),          // 13
  };
  // relu (3) is read by b1, b2pool and add: its last forward consumer is add.
  // Bug bait: conv b1 reads relu's output in backward after add's backward.
  m.persistent = {{"params", 20000}};
  return m;
}

// Executes a schedule symbolically: every tensor a layer touches must be
// on the device, nothing is used after its free, offloads happen only at the
// last forward consumer, and a step ends with only the persistent tensors.
inline void check_schedule(const MemoryModel& m, const Schedule& s, bool training) {
  using Key = std::pair<int, int>;  // (kind, layer)
  auto key = [](const TensorId& id) { return Key{static_cast<int>(id.kind), id.layer}; };
  std::set<Key> device, host, persistent;
  for (const TensorId& id : s.persistent) {
    ASSERT_TRUE(persistent.insert(key(id)).second) << tensor_name(m, id) << " twice";
  }
  auto resident = [&](TensorKind kind, int layer) {
    const Key k{static_cast<int>(kind), layer};
    if (device.count(k) || persistent.count(k)) return true;
    if (!s.layer_wise && (kind == TensorKind::kWorkspace || kind == TensorKind::kScratch)) {
      return persistent.count({static_cast<int>(kind), -1}) > 0;
    }
    return false;
  };
  const int n = static_cast<int>(m.layers.size());
  std::vector<int> last_consumer(n, -1);
  for (int i = 0; i < n; ++i) {
    for (int p : m.layers[i].inputs) last_consumer[p] = std::max(last_consumer[p], i);
  }
  int forward_done = 0;
  const auto& events = training ? s.train : s.evaluate;
  for (const ScheduleEvent& e : events) {
    const std::string name = tensor_name(m, e.tensor);
    const Key k = key(e.tensor);
    const int i = e.tensor.layer;
    switch (e.op) {
      case Op::kAlloc:
        ASSERT_TRUE(device.insert(k).second) << "double alloc " << name;
        break;
      case Op::kFree:
        ASSERT_EQ(device.erase(k), 1u) << "free of " << name << ", not on the device";
        break;
      case Op::kOffload:
        ASSERT_TRUE(training);
        ASSERT_TRUE(device.count(k)) << "offload of " << name << ", not on the device";
        ASSERT_EQ(last_consumer[i], forward_done + 1)
            << name << " offloaded before its last forward consumer";
        ASSERT_TRUE(host.insert(k).second);
        break;
      case Op::kPrefetch:
        ASSERT_TRUE(host.count(k)) << "prefetch of " << name << ", which is not on the host";
        ASSERT_TRUE(device.insert(k).second) << "prefetch of " << name << " onto itself";
        break;
      case Op::kFreeHost: ASSERT_EQ(host.erase(k), 1u) << name; break;
      case Op::kSyncMemory: break;
      case Op::kForward:
      case Op::kRecompute: {
        const bool again = e.op == Op::kRecompute;
        if (again) {
          ASSERT_TRUE(training);
        } else {
          forward_done = i;
        }
        for (int p : m.layers[i].inputs) {
          ASSERT_TRUE(resident(TensorKind::kOutput, p))
              << m.layers[i].name << (again ? " recompute" : " forward") << " reads "
              << m.layers[p].name << ".y, released";
        }
        ASSERT_TRUE(resident(TensorKind::kOutput, i));
        if (m.layers[i].forward_workspace) {
          ASSERT_TRUE(resident(TensorKind::kWorkspace, i));
        }
        if (m.layers[i].state_bytes) {
          ASSERT_TRUE(resident(TensorKind::kState, i));
        }
        break;
      }
      case Op::kLoss:
        ASSERT_TRUE(resident(TensorKind::kOutput, i));
        if (training) {
          ASSERT_TRUE(resident(TensorKind::kGradient, i));
        }
        break;
      case Op::kBackward: {
        const LayerNode& l = m.layers[i];
        ASSERT_TRUE(resident(TensorKind::kGradient, i)) << l.name << ".dy";
        if (l.backward_reads_output) {
          ASSERT_TRUE(resident(TensorKind::kOutput, i)) << l.name;
        }
        for (int p : l.inputs) {
          if (l.backward_reads_inputs) {
            ASSERT_TRUE(resident(TensorKind::kOutput, p))
                << l.name << " backward reads " << m.layers[p].name << ".y, not on the device";
          }
          if (!m.layers[p].is_input) {
            ASSERT_TRUE(resident(TensorKind::kGradient, p)) << l.name << " writes "
                                                            << m.layers[p].name << ".dy";
          }
        }
        if (l.backward_workspace) {
          ASSERT_TRUE(s.layer_wise ? resident(TensorKind::kBackwardWorkspace, i)
                                   : resident(TensorKind::kWorkspace, i));
        }
        if (l.state_bytes) {
          ASSERT_TRUE(resident(TensorKind::kState, i));
        }
        break;
      }
    }
  }
  EXPECT_TRUE(device.empty()) << tensor_name(m, {static_cast<TensorKind>(device.begin()->first),
                                                 device.begin()->second})
                              << " still allocated after the step";
  EXPECT_TRUE(host.empty());
}

}  // namespace vtrain::memory::test_models
