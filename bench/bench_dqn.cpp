// The DQN planner (worker/profile/dqn_planner.h) on full-size graphs next to
// the planners of memory/planner.h, in the timed simulator: per network and
// capacity (a fraction of the way from the least capacity memory/planner.h
// plans for to what keeping every activation needs), each plan's simulated
// step time, its overhead over keeping everything, and its solve time.
//
//   bench_dqn [--net vgg16 --net resnet50 ...] [--size 112] [--batch 32]
//             [--fraction 0.75 --fraction 0.5 ...] [--episodes 300] [--budget 120]
//
// The memory models are the engine's own (a Network on the CPU backend
// describes its tensors). The costs are analytic, for a V100-like device,
// not measured: a conv or fc layer takes its FLOPs at 7 TFLOP/s, any other
// layer its input and output bytes at 450 GB/s, a backward twice its
// forward, and copies run at 12 GB/s each way (PCIe 3 x16). Exit status 0
// whatever the figures: a measurement, not a test.

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/memory_error.h"
#include "memory/planner.h"
#include "memory/simulator.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/profile/dqn_planner.h"

namespace {

using namespace vtrain;

// Placement by the static planner (DSA best fit over the step's trace): the
// pool's first fit leaves VGG-16's early activations no room to shrink into.
constexpr memory::Planner planner = memory::Planner::kStatic;

struct Settings {
  std::vector<std::string> nets = {"vgg16", "resnet50"};
  int64_t size = 112;  // input side (3 x size x size)
  int64_t batch = 32;
  std::vector<double> fractions = {0.75, 0.5, 0.25};  // of the way from the least capacity
                                                      // to keeping every activation
  int episodes = 300;
  double budget = 120;  // seconds of DQN training per plan
};

constexpr double kFlops = 7e12, kBytesPerSecond = 450e9, kCopyBytesPerSecond = 12e9;

// Forward seconds of layer i at batch n under the analytic device.
double forward_seconds(const worker::Graph& graph, int i, int64_t n) {
  const worker::LayerSpec& l = graph.layer(i);
  const worker::Shape& out = graph.output_shape(i);
  if (l.type == worker::LayerType::kInput) return 0;
  const worker::Shape& in = graph.output_shape(graph.inputs(i).front());
  if (l.type == worker::LayerType::kConv) {
    const double flops = 2.0 * n * out.c * (in.c / l.groups) * l.kernel_h * l.kernel_w * out.h * out.w;
    return flops / kFlops;
  }
  if (l.type == worker::LayerType::kFc) return 2.0 * n * in.per_sample() * out.c / kFlops;
  double bytes = static_cast<double>(out.per_sample());
  for (int p : graph.inputs(i)) bytes += static_cast<double>(graph.output_shape(p).per_sample());
  return bytes * sizeof(float) * n / kBytesPerSecond;
}

memory::StepCosts analytic_costs(const worker::Graph& graph, int64_t n) {
  memory::StepCosts c;
  for (int i = 0; i < graph.size(); ++i) {
    c.forward_seconds.push_back(forward_seconds(graph, i, n));
    c.backward_seconds.push_back(2 * c.forward_seconds.back());
  }
  c.loss_seconds = 1e-5;
  c.to_host_bytes_per_second = c.to_device_bytes_per_second = kCopyBytesPerSecond;
  return c;
}

void print_row(const std::string& method, const memory::MemoryModel& model,
               const std::optional<memory::MemoryPlan>& plan, double keep_seconds,
               const std::string& note = "") {
  if (!plan) {
    std::printf("    %-13s %9s\n", method.c_str(), "no fit");
    return;
  }
  const memory::PlanSummary s = memory::summarize(model, *plan);
  const double step = plan->simulation.timing.step_seconds;
  std::printf("    %-13s %9.2f ms %+8.2f%% %9.1f MiB %4d K %3d O %3d R %9.2f s %7d sims %s\n",
              method.c_str(), step * 1e3, 100 * (step / keep_seconds - 1),
              plan->simulation.reservation / 1048576.0, s.kept, s.offloaded, s.recomputed,
              plan->solve_seconds, plan->simulations, note.c_str());
}

std::optional<memory::MemoryPlan> dqn(const memory::MemoryModel& model,
                                      const memory::StepCosts& costs, size_t capacity,
                                      const Settings& s, std::string& note) {
  worker::DqnOptions o;
  o.episodes = s.episodes;
  o.time_budget_seconds = s.budget;
  const auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  try {
    const worker::DqnRun run = worker::train_dqn(model, costs, capacity, planner, o, *backend);
    note = std::to_string(run.episodes) + " episodes, best in " + std::to_string(run.best_episode) +
           ", greedy " + (run.greedy_fits ? "fits" : "does not fit");
    return run.plan;
  } catch (const memory::OutOfMemoryError& e) {
    note = e.what();
    return std::nullopt;
  }
}

void bench_net(const std::string& name, const Settings& s) {
  const worker::Shape input{1, 3, s.size, s.size};
  const worker::Graph graph =
      worker::Graph::build(worker::preset_layers(name, {input, 1000}), input);
  const auto backend = worker::make_backend({.kind = worker::BackendKind::kCpu});
  worker::NetworkOptions no;
  no.max_batch = s.batch;
  no.conv_algorithm = "direct";
  no.memory_policy = memory::Policy::kAll;
  const worker::Network net(graph, *backend, no);
  const memory::MemoryModel& model = net.memory_model();
  for (int i = 0; i < graph.size(); ++i) {
    if (static_cast<int>(model.layers.size()) != graph.size() ||
        model.layers[i].name != graph.layer(i).name) {
      throw std::runtime_error("the memory model's layers are not the graph's, in order");
    }
  }
  const memory::StepCosts costs = analytic_costs(graph, s.batch);
  const memory::MemoryPlan keep = memory::evaluate_plan(
      "keep", std::vector<memory::TensorAction>(model.layers.size()), model, &costs, 0, planner);
  const double keep_seconds = keep.simulation.timing.step_seconds;
  int candidates = 0;
  for (bool can : memory::plannable(model)) candidates += can;
  std::printf(
      "%s, batch %lld at %lldx%lld: %zu layers, %d plannable activations, keeping all: "
      "%.2f ms, %.1f MiB\n",
      name.c_str(), static_cast<long long>(s.batch), static_cast<long long>(s.size),
      static_cast<long long>(s.size), model.layers.size(), candidates, keep_seconds * 1e3,
      keep.simulation.reservation / 1048576.0);
  const size_t least = memory::least_capacity(model);
  std::printf("  the least capacity auto plans for: %.1f MiB\n", least / 1048576.0);
  for (double f : s.fractions) {
    const size_t capacity =
        least + static_cast<size_t>(f * static_cast<double>(keep.simulation.reservation - least));
    std::printf("  capacity %.0f%% of the way from the least to keeping all: %.1f MiB\n", 100 * f,
                capacity / 1048576.0);
    for (memory::Policy p :
         {memory::Policy::kAll, memory::Policy::kMemonger, memory::Policy::kSuperNeurons,
          memory::Policy::kTflms, memory::Policy::kAuto}) {
      print_row(memory::policy_name(p), model,
                memory::try_plan_memory(p, model, costs, capacity, planner), keep_seconds);
    }
    std::string note;
    const std::optional<memory::MemoryPlan> plan = dqn(model, costs, capacity, s, note);
    print_row("dqn", model, plan, keep_seconds, note);
  }
}

// The command line; exits 2 with the usage on anything unknown.
Settings parse_settings(int argc, char** argv) {
  Settings s;
  bool nets_given = false, fractions_given = false;  // a repeated option replaces the defaults
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", arg.c_str());
      std::exit(2);
    }
    const std::string value = argv[++i];
    if (arg == "--net") {
      if (!nets_given) s.nets.clear();
      nets_given = true;
      s.nets.push_back(value);
    } else if (arg == "--size") {
      s.size = std::atoll(value.c_str());
    } else if (arg == "--batch") {
      s.batch = std::atoll(value.c_str());
    } else if (arg == "--fraction") {
      if (!fractions_given) s.fractions.clear();
      fractions_given = true;
      s.fractions.push_back(std::atof(value.c_str()));
    } else if (arg == "--episodes") {
      s.episodes = std::atoi(value.c_str());
    } else if (arg == "--budget") {
      s.budget = std::atof(value.c_str());
    } else {
      std::fprintf(stderr,
                   "unknown option %s\nusage: bench_dqn [--net NAME]... [--size 112] [--batch 32] "
                   "[--fraction F]... [--episodes 300] [--budget 120]\n",
                   arg.c_str());
      std::exit(2);
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings s = parse_settings(argc, argv);
  try {
    for (const std::string& name : s.nets) bench_net(name, s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
