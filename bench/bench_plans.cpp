// Swap and recompute under a capacity (memory/planner.h): for each network,
// the per-layer costs measured on this device (timed where training steps
// make the calls, worker::measure_costs_in_steps; --isolated: each layer
// alone), then at capacities of the persistent bytes (parameters,
// gradients, labels: what every plan keeps) plus 100%, 80%, 60%, 40% and
// 25% of the rest of the network-wide baseline's need (`none`), every
// planner's plan: simulated step time, simulated peak, solve time, and
// (--measure) the engine's measured step time and peak running that plan,
// with the simulator's error. Distinct plans are measured in --rounds
// rounds, each running every plan in turn, and the median round counts.
// Then the largest batch each planner fits under a fixed capacity (the
// memory model scaled by batch), to set beside Checkmate's VGG-19 figures
// on a 16 GB V100.
//
//   bench_plans [--nets vgg16,resnet50,googlenet,vgg116] [--size 64] [--batch 8]
//               [--capacities 1,0.8,0.6,0.4,0.25] [--measure] [--steps 3] [--rounds 3]
//               [--algorithm direct] [--backend cpu|cuda] [--oracle-max 12]
//               [--max-batch-net vgg16] [--max-batch-size 224] [--max-batch-gib 16]
//               [--no-dqn] [--dqn-budget S] [--costs] [--isolated] [--csv FILE]
//
// --costs prints the measured per-layer costs and auto's plan report; the
// DQN trains for at most --dqn-budget seconds per plan (default 20).
//
// Exit status 0 whatever the figures: a measurement, not a test.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "bench/bench_network.h"
#include "memory/memory_error.h"
#include "memory/planner.h"
#include "memory/simulator.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"
#include "worker/profile/dqn_planner.h"

namespace {

using namespace vtrain;
using Clock = std::chrono::steady_clock;

struct Settings {
  std::vector<std::string> nets = {"vgg16", "resnet50", "googlenet", "vgg116"};
  int64_t size = 64;
  int64_t batch = 8;
  std::vector<double> capacities = {1.0, 0.8, 0.6, 0.4, 0.25};
  bool measure = false;
  int steps = 3;
  int rounds = 3;  // --measure: rounds over the distinct plans
  std::string algorithm = "direct";
  std::string backend = "cpu";
  int oracle_max = 12;
  std::string max_batch_net = "vgg16";
  int64_t max_batch_size = 224;
  double max_batch_gib = 16;
  std::string csv;
  bool dqn = true;
  double dqn_budget = 20;  // seconds of DQN training per plan
  bool print_costs = false;
  bool isolated = false;   // time each layer alone, not in a step
};

double mib(double bytes) { return bytes / 1048576.0; }


Settings parse_settings(int argc, char** argv) {
  Settings s;
  bench::Args args(argc, argv);
  while (args.next()) {
    const std::string arg = args.arg();
    auto next = [&] { return args.value(); };
    if (arg == "--nets") {
      s.nets = bench::split_list(next());
    } else if (arg == "--size") {
      s.size = std::atoll(next().c_str());
    } else if (arg == "--batch") {
      s.batch = std::atoll(next().c_str());
    } else if (arg == "--capacities") {
      s.capacities.clear();
      for (const std::string& c : bench::split_list(next())) {
        s.capacities.push_back(std::atof(c.c_str()));
      }
    } else if (arg == "--measure") {
      s.measure = true;
    } else if (arg == "--steps") {
      s.steps = std::max(1, std::atoi(next().c_str()));
    } else if (arg == "--rounds") {
      s.rounds = std::max(1, std::atoi(next().c_str()));
    } else if (arg == "--algorithm") {
      s.algorithm = next();
    } else if (arg == "--backend") {
      s.backend = next();
    } else if (arg == "--oracle-max") {
      s.oracle_max = std::atoi(next().c_str());
    } else if (arg == "--max-batch-net") {
      s.max_batch_net = next();
    } else if (arg == "--max-batch-size") {
      s.max_batch_size = std::atoll(next().c_str());
    } else if (arg == "--max-batch-gib") {
      s.max_batch_gib = std::atof(next().c_str());
    } else if (arg == "--isolated") {
      s.isolated = true;
    } else if (arg == "--costs") {
      s.print_costs = true;
    } else if (arg == "--dqn-budget") {
      s.dqn_budget = std::atof(next().c_str());
    } else if (arg == "--no-dqn") {
      s.dqn = false;
    } else if (arg == "--csv") {
      s.csv = next();
    } else {
      std::fprintf(stderr,
                   "usage: bench_plans [--nets a,b] [--size N] [--batch B] [--capacities f,g] "
                   "[--measure] [--steps N] [--rounds R] [--algorithm NAME] [--backend cpu|cuda] "
                   "[--oracle-max N] [--max-batch-net NAME] [--max-batch-size N] "
                   "[--max-batch-gib G] [--no-dqn] [--dqn-budget S] [--costs] [--isolated] [--csv FILE]\n");
      std::exit(2);
    }
  }
  return s;
}

int plannable_count(const memory::MemoryModel& model) {
  const std::vector<bool> can = memory::plannable(model);
  return static_cast<int>(std::count(can.begin(), can.end(), true));
}

worker::Graph preset(const std::string& name, int64_t size) {
  const worker::Shape input{1, 3, size, size};
  return worker::Graph::build(worker::preset_layers(name, {input, 1000}), input);
}

// The network's memory model and its measured costs at the bench's batch.
struct Profiled {
  memory::MemoryModel model;
  memory::StepCosts costs;
};

// The layers' costs and the copy bandwidth on this device at the bench's
// batch: timed in the steps of a network that keeps everything, or with
// --isolated each layer alone.
memory::StepCosts measured_costs(worker::Backend& backend, const worker::Graph& graph,
                                 const Settings& s) {
  const worker::CopyBandwidth bandwidth = worker::measure_copy_bandwidth(backend);
  if (s.isolated) {
    return worker::measure_graph_step_costs(graph, {}, backend, s.batch, bandwidth,
                                            s.algorithm);
  }
  worker::NetworkOptions o;
  o.max_batch = s.batch;
  o.conv_algorithm = s.algorithm;
  o.memory_policy = memory::Policy::kNone;
  worker::Network net(graph, backend, o);
  net.init_parameters(1);
  return worker::measure_costs_in_steps(net, s.batch, s.steps, bandwidth);
}

Profiled profile(worker::Backend& backend, const worker::Graph& graph, const Settings& s) {
  worker::NetworkOptions o;
  o.max_batch = s.batch;
  o.conv_algorithm = s.algorithm;
  o.memory_policy = memory::Policy::kAll;
  memory::MemoryModel model = worker::Network(graph, backend, o).memory_model();
  return {std::move(model), measured_costs(backend, graph, s)};
}

struct Measured {
  double step_ms = 0;
  size_t peak = 0;
};

// Trains s.steps steps (after one untimed) under explicit actions.
Measured measure(worker::Backend& backend, const worker::Graph& graph, const Settings& s,
                 const memory::MemoryPlan& plan, const memory::StepCosts& costs) {
  worker::NetworkOptions o;
  o.max_batch = s.batch;
  o.conv_algorithm = s.algorithm;
  if (plan.schedule.layer_wise) {
    o.memory_actions = plan.actions;
  } else {
    o.memory_policy = memory::Policy::kNone;
  }
  o.memory_costs = costs;
  worker::Network net(graph, backend, o);
  net.init_parameters(1);
  worker::Sgd sgd(backend, net.parameter_count(), 0.9f, 0.0f);
  bench::upload_random_batch(net, graph, s.batch);
  std::vector<double> times;
  for (int step = 0; step <= s.steps; ++step) {
    const auto start = Clock::now();
    net.train_step(s.batch, 1.0f / static_cast<float>(s.batch));
    backend.synchronize(worker::StreamKind::kCompute);
    if (step > 0) {
      times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    sgd.step(net.parameters(), net.gradients(), 0.01f);
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], net.memory_stats().step_peak};
}

// Every planner's plan at one capacity (nullopt: it does not fit).
std::vector<std::pair<std::string, std::optional<memory::MemoryPlan>>> plans_at(
    const Profiled& p, size_t capacity, const Settings& s) {
  std::vector<std::pair<std::string, std::optional<memory::MemoryPlan>>> out;
  using memory::Policy;
  for (Policy policy : {Policy::kNone, Policy::kAll, Policy::kConv, Policy::kDyn,
                        Policy::kMemonger, Policy::kSuperNeurons, Policy::kTflms}) {
    out.emplace_back(memory::policy_name(policy),
                     memory::try_plan_memory(policy, p.model, p.costs, capacity,
                                             memory::Planner::kPool));
  }
  out.emplace_back("oracle", memory::plan_oracle(p.model, p.costs, capacity,
                                                 memory::Planner::kPool, s.oracle_max));
  if (s.dqn) {
    worker::DqnOptions dqn;
    dqn.time_budget_seconds = s.dqn_budget;
    try {
      out.emplace_back("dqn",
                       worker::plan_dqn(p.model, p.costs, capacity, memory::Planner::kPool, dqn));
    } catch (const memory::OutOfMemoryError&) {
      out.emplace_back("dqn", std::nullopt);
    }
  }
  out.emplace_back("auto", memory::try_plan_memory(Policy::kAuto, p.model, p.costs, capacity,
                                                   memory::Planner::kPool));
  return out;
}

// One row of a net's table: a planner's plan at a capacity.
struct Row {
  double fraction;
  std::string method;
  std::optional<memory::MemoryPlan> plan;
  int measured = -1;  // index into the distinct plans measured
};

// Identical plans (many planners agree) are measured once: the actions,
// and whether the schedule is layer-wise.
std::string plan_key(const memory::MemoryPlan& plan) {
  std::string key(1, plan.schedule.layer_wise ? 'L' : 'N');
  for (memory::TensorAction a : plan.actions) key += static_cast<char>('0' + static_cast<int>(a));
  return key;
}

// Each distinct plan's measured step and its simulated one: s.rounds
// rounds, each timing the layers afresh (measured_costs) and
// then running every plan in turn (the order rotating); the plan's schedule
// is simulated under the round's costs. Per plan the median of the rounds,
// so the machine's drift falls alike on the prediction and the measurement.
struct PlanTimes {
  Measured measured;
  double simulated_ms = 0;
  double overlapped_ms = 0;  // simulated with copy_compute_share 0 (copies beside compute)
};
std::vector<PlanTimes> measure_plans(worker::Backend& backend, const worker::Graph& graph,
                                     const Settings& s,
                                     const std::vector<const memory::MemoryPlan*>& plans,
                                     const Profiled& p) {
  std::vector<std::vector<double>> measured(plans.size()), simulated(plans.size()),
      overlapped(plans.size());
  std::vector<PlanTimes> out(plans.size());
  for (int round = 0; round < s.rounds; ++round) {
    const memory::StepCosts costs = round == 0 ? p.costs : measured_costs(backend, graph, s);
    for (size_t k = 0; k < plans.size(); ++k) {
      const size_t j = (k + static_cast<size_t>(round)) % plans.size();
      out[j].measured = measure(backend, graph, s, *plans[j], costs);
      measured[j].push_back(out[j].measured.step_ms);
      const auto step_ms = [&](const memory::StepCosts& c) {
        return memory::simulate(p.model, plans[j]->schedule, 0, memory::Planner::kPool, &c)
                   .timing.step_seconds * 1e3;
      };
      simulated[j].push_back(step_ms(costs));
      memory::StepCosts beside = costs;
      beside.copy_compute_share = 0;
      overlapped[j].push_back(step_ms(beside));
    }
    std::printf("  measured round %d of %d (%zu distinct plans)\n", round + 1, s.rounds,
                plans.size());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (size_t j = 0; j < plans.size(); ++j) {
    out[j].measured.step_ms = median(measured[j]);
    out[j].simulated_ms = median(simulated[j]);
    out[j].overlapped_ms = median(overlapped[j]);
  }
  return out;
}

// With a measurement, the simulated time is the median of its rounds'.
void print_row(const Row& r, const std::optional<PlanTimes>& m2, const std::string& name,
               const Profiled& p, const Settings& s, FILE* csv) {
  const Measured* m = m2 ? &m2->measured : nullptr;
  if (!r.plan) {
    const bool too_big = r.method == "oracle" && plannable_count(p.model) > s.oracle_max;
    std::printf("  %4.0f%% %-13s %10s\n", r.fraction * 100, r.method.c_str(),
                too_big ? "too many tensors" : "no fit");
    if (csv) std::fprintf(csv, "%s,%.2f,%s,,,,,\n", name.c_str(), r.fraction, r.method.c_str());
    return;
  }
  const double sim_ms = m2 ? m2->simulated_ms : r.plan->simulation.timing.step_seconds * 1e3;
  const double sim_mib = mib(double(r.plan->simulation.peak_bytes));
  const memory::StepTiming& t = r.plan->simulation.timing;
  std::printf("  %4.0f%% %-13s %10.1f %10.1f %9.1f %8.1f %8.1f", r.fraction * 100, r.method.c_str(),
              sim_ms, sim_mib, r.plan->solve_seconds * 1e3, t.copy_seconds * 1e3,
              t.stall_seconds * 1e3);
  if (m) {
    std::printf(" %10.1f %10.1f %+6.1f%% %+6.1f%%", m->step_ms, mib(double(m->peak)),
                100.0 * (sim_ms - m->step_ms) / m->step_ms,
                100.0 * (m2->overlapped_ms - m->step_ms) / m->step_ms);
  }
  std::printf("\n");
  if (s.print_costs && r.method == "auto") {
    std::printf("%s", memory::plan_report(p.model, *r.plan).c_str());
  }
  if (csv) {
    std::fprintf(csv, "%s,%.2f,%s,%.3f,%.3f,%.3f,%s,%s\n", name.c_str(), r.fraction,
                 r.method.c_str(), sim_ms, sim_mib, r.plan->solve_seconds * 1e3,
                 m ? std::to_string(m->step_ms).c_str() : "",
                 m ? std::to_string(mib(double(m->peak))).c_str() : "");
  }
}

void print_costs(const Profiled& p) {
  std::printf("  measured costs (ms): layer, forward, backward\n");
  for (size_t i = 0; i < p.model.layers.size(); ++i) {
    std::printf("    %-20s %9.3f %9.3f\n", p.model.layers[i].name.c_str(),
                p.costs.forward_seconds[i] * 1e3, p.costs.backward_seconds[i] * 1e3);
  }
  std::printf("    loss %.3f, outside the calls %.3f\n", p.costs.loss_seconds * 1e3,
              p.costs.other_seconds * 1e3);
}

void run_net(worker::Backend& backend, const std::string& name, const Settings& s, FILE* csv) {
  const worker::Graph graph = preset(name, s.size);
  Profiled p = profile(backend, graph, s);
  const memory::Simulation base =
      memory::simulate(p.model, memory::network_wide_schedule(p.model), 0, memory::Planner::kPool);
  const size_t none = base.reservation;
  size_t kept = 0;  // every plan keeps the parameters, gradients, buffers and labels
  for (const memory::PersistentTensor& t : p.model.persistent) kept += t.bytes;
  std::printf("\n%s at %lldx%lld, batch %lld: %zu layers (%d plannable), none needs %.1f MiB, "
              "%.1f MiB of it parameters, gradients and labels; costs timed %s\n",
              name.c_str(), static_cast<long long>(s.size), static_cast<long long>(s.size),
              static_cast<long long>(s.batch), p.model.layers.size(), plannable_count(p.model),
              mib(double(none)), mib(double(kept)), s.isolated ? "layer by layer" : "in steps");
  if (s.print_costs) print_costs(p);
  std::vector<Row> rows;
  std::vector<const memory::MemoryPlan*> distinct;
  std::map<std::string, int> index;
  for (double fraction : s.capacities) {
    const size_t capacity =
        kept + static_cast<size_t>(fraction * static_cast<double>(none - kept));
    for (auto& [method, plan] : plans_at(p, capacity, s)) {
      rows.push_back({fraction, method, std::move(plan)});
    }
  }
  for (Row& r : rows) {
    if (!r.plan || !s.measure) continue;
    const auto [it, added] = index.emplace(plan_key(*r.plan), static_cast<int>(distinct.size()));
    if (added) distinct.push_back(&*r.plan);
    r.measured = it->second;
  }
  const std::vector<PlanTimes> measured =
      s.measure ? measure_plans(backend, graph, s, distinct, p) : std::vector<PlanTimes>{};
  std::printf("  %-5s %-13s %10s %10s %9s %8s %8s %10s %10s %7s %7s\n", "cap", "plan", "sim ms",
              "sim MiB", "solve ms", "copy ms", "stall ms", "meas ms", "meas MiB", "error",
              "error@0");
  std::printf("  copies %.2f GB/s to host, %.2f GB/s to device; they cost compute %.2f of their "
              "time (error@0: simulated as if 0)\n",
              p.costs.to_host_bytes_per_second / 1e9, p.costs.to_device_bytes_per_second / 1e9,
              p.costs.copy_compute_share);
  std::printf("  capacity = the persistent bytes + a fraction of none's other bytes\n");
  for (const Row& r : rows) {
    print_row(r, r.measured >= 0 ? std::optional<PlanTimes>(measured[r.measured]) : std::nullopt,
              name, p, s, csv);
  }
}

// The model at batch `to` from the one at `from`: activations, states and
// workspaces scale with the batch (the labels too); parameters do not.
// Costs scale the same way (an approximation: per-sample time is assumed
// constant).
Profiled scale(const Profiled& p, int64_t from, int64_t to) {
  Profiled q = p;
  const double f = static_cast<double>(to) / static_cast<double>(from);
  auto by = [f](size_t bytes) { return static_cast<size_t>(static_cast<double>(bytes) * f); };
  for (memory::LayerNode& l : q.model.layers) {
    l.output_bytes = by(l.output_bytes);
    l.state_bytes = by(l.state_bytes);
    l.forward_workspace = by(l.forward_workspace);
    l.backward_workspace = by(l.backward_workspace);
  }
  for (memory::PersistentTensor& t : q.model.persistent) {
    if (t.name == "labels") t.bytes = by(t.bytes);
  }
  q.costs = memory::scaled(q.costs, f);
  return q;
}

// The largest batch each planner fits in `capacity` (doubling, then
// bisection on the scaled model).
void max_batches(worker::Backend& backend, const Settings& s) {
  Settings one = s;
  one.batch = 1;
  const Profiled p1 = profile(backend, preset(s.max_batch_net, s.max_batch_size), one);
  const size_t capacity = static_cast<size_t>(s.max_batch_gib * 1073741824.0);
  std::printf("\nlargest batch of %s at %lldx%lld in %.0f GiB (simulated, model scaled from "
              "batch 1):\n",
              s.max_batch_net.c_str(), static_cast<long long>(s.max_batch_size),
              static_cast<long long>(s.max_batch_size), s.max_batch_gib);
  using memory::Policy;
  for (Policy policy : {Policy::kNone, Policy::kAll, Policy::kMemonger, Policy::kSuperNeurons,
                        Policy::kTflms, Policy::kAuto}) {
    auto fits = [&](int64_t b) {
      const Profiled q = scale(p1, 1, b);
      return memory::try_plan_memory(policy, q.model, q.costs, capacity, memory::Planner::kPool)
          .has_value();
    };
    int64_t lo = 0, hi = 1;
    while (fits(hi) && hi < (int64_t{1} << 16)) lo = hi, hi *= 2;
    while (lo + 1 < hi) {
      const int64_t mid = (lo + hi) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    std::printf("  %-13s %6lld\n", memory::policy_name(policy), static_cast<long long>(lo));
  }
  std::printf("  (Checkmate, VGG-19 on a 16 GB V100: 167 checkpoint-all, 197 sqrt(n), "
              "289 optimal)\n");
}

}  // namespace

int main(int argc, char** argv) {
  const Settings s = parse_settings(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress as it comes, also into a file
  const auto backend = worker::make_backend({.kind = worker::parse_backend_kind(s.backend)});
  FILE* csv = s.csv.empty() ? nullptr : std::fopen(s.csv.c_str(), "w");
  if (csv) std::fprintf(csv, "net,capacity,plan,sim_ms,sim_mib,solve_ms,meas_ms,meas_mib\n");
  for (const std::string& name : s.nets) run_net(*backend, name, s, csv);
  if (csv) std::fclose(csv);
  if (s.max_batch_size > 0) max_batches(*backend, s);
  return 0;
}
