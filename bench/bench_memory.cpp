// Device memory and step time of the vDNN policies (memory/) on the CPU
// backend, the figures of the vDNN paper's Sec. V-A and V-C at a small
// batch: for each network, each policy's most and mean (time-weighted)
// device bytes in use during a training step, its step time, and the
// reduction against the network-wide baseline `none` (the paper reports an
// 89-95% mean reduction; vDNN_conv close to the baseline's speed where the
// copies hide behind compute). Then the DSA planner on the same step traces
// (best fit vs the lower bound vs the pool), and the largest VGG (vgg416)
// trained for a few steps under a memory limit far below its `none` need.
//
//   bench_memory [--nets alexnet,googlenet,vgg16,resnet50] [--size 224] [--batch 2]
//                [--steps 3] [--algorithm direct] [--deep-size 64] [--deep-batch 8]
//                [--deep-steps 2] [--deep-algorithm direct] [--trace-dir DIR] [--backend cpu|cuda]
//
// dyn runs under a capacity between vDNN_conv's and the baseline's need, so
// that it has to choose (under the device's own when the baseline does not
// fit; ratios are then against the first policy that fitted). --trace-dir writes one Chrome trace per network and
// policy (scripts/plot_memory.py draws their memory timelines). Exit status
// 0 whatever the figures: a measurement, not a test.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "bench/bench_network.h"
#include "memory/chrome_trace.h"
#include "memory/dsa.h"
#include "memory/free_list.h"
#include "memory/simulator.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"

namespace {

using namespace vtrain;
using Clock = std::chrono::steady_clock;

struct Settings {
  std::vector<std::string> nets = {"alexnet", "googlenet", "vgg16", "resnet50"};
  int64_t size = 224;              // input side (3 x size x size)
  int64_t batch = 2;
  int steps = 3;                   // timed steps after one warm-up step
  std::string algorithm = "direct";  // conv.algorithm ("auto" times every candidate)
  int64_t deep_size = 64;          // vgg416's input side (0: skip it)
  int64_t deep_batch = 8;
  int deep_steps = 2;
  std::string trace_dir;           // one Chrome trace per run; empty = none
  worker::BackendKind backend = worker::BackendKind::kCpu;  // device.backend: cpu or cuda
  std::string deep_algorithm = "direct";  // conv.algorithm for vgg416 (cuda: a cuDNN name)
};

double mib(double bytes) { return bytes / 1048576.0; }

// Step traces of at most this many blocks are also solved exactly (the MIP).
constexpr size_t kMipBlocks = 40;

struct Run {
  std::string policy;
  size_t step_peak = 0;
  double step_average = 0;
  size_t reservation = 0;
  size_t offloaded = 0;
  double step_ms = 0;
  std::vector<memory::DsaBlock> trace;
};


Run train(worker::Backend& backend, const worker::Graph& graph, const Settings& s,
          memory::Policy policy, size_t capacity, int steps, const std::string& trace_path) {
  worker::NetworkOptions o;
  o.max_batch = s.batch;
  o.conv_algorithm = s.algorithm;
  o.memory_policy = policy;
  o.memory_capacity = capacity;
  o.allocations_after_network = {worker::Sgd::kStateBytesPerParameter};
  worker::Network net(graph, backend, o);
  net.init_parameters(1);
  worker::Sgd sgd(backend, net.parameter_count(), 0.9f, 0.0f);
  bench::upload_random_batch(net, graph, s.batch);
  std::unique_ptr<memory::ChromeTrace> trace;
  std::vector<double> times;
  for (int step = 0; step <= steps; ++step) {
    if (step == 1 && !trace_path.empty()) {
      trace = std::make_unique<memory::ChromeTrace>(0, memory::policy_name(policy));
      net.set_trace(trace.get());
    }
    const auto start = Clock::now();
    net.train_step(s.batch, 1.0f / static_cast<float>(s.batch));
    sgd.step(net.parameters(), net.gradients(), 0.01f);
    backend.synchronize(worker::StreamKind::kCompute);
    if (step > 0) {  // the first step creates every primitive
      times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  }
  if (trace) trace->write(trace_path);
  std::sort(times.begin(), times.end());
  const worker::MemoryStats st = net.memory_stats();
  return {st.policy, st.step_peak, st.step_average, st.reservation, st.offloaded_bytes,
          times[times.size() / 2], net.last_step_trace()};
}

// Milliseconds per MiB of a device -> host plus host -> device copy on the
// memory stream (the copies an offloaded byte costs), from the bandwidth the
// planners use (64 MiB blocks, median of 5 each way).
double copy_ms_per_mib(worker::Backend& backend) {
  const worker::CopyBandwidth b = worker::measure_copy_bandwidth(backend);
  const double seconds_per_byte =
      1.0 / b.to_host_bytes_per_second + 1.0 / b.to_device_bytes_per_second;
  return 1048576.0 * 1e3 * seconds_per_byte;
}

// What the baseline would reserve, and of it what every policy keeps
// allocated (parameters, gradients, momentum, the data), from the network's
// own memory model.
std::pair<size_t, size_t> baseline_need(worker::Backend& backend, const worker::Graph& graph, const Settings& s) {
  worker::NetworkOptions o;
  o.max_batch = s.batch;
  o.conv_algorithm = s.algorithm;
  o.memory_policy = memory::Policy::kAll;
  const worker::Network net(graph, backend, o);
  const memory::MemoryModel& m = net.memory_model();
  const auto sim = [&](memory::Policy p) {
    return memory::simulate(m, memory::make_schedule(m, p), 0, memory::Planner::kPool);
  };
  // Sgd's velocity comes on top: one float per parameter.
  const size_t velocity =
      static_cast<size_t>(net.parameter_count()) * worker::Sgd::kStateBytesPerParameter;
  return {sim(memory::Policy::kNone).reservation + velocity,
          sim(memory::Policy::kAll).persistent_bytes + velocity};
}


// The command line; exits 2 with the usage on anything unknown.
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
    } else if (arg == "--steps") {
      s.steps = std::max(1, std::atoi(next().c_str()));
    } else if (arg == "--algorithm") {
      s.algorithm = next();
    } else if (arg == "--deep-size") {
      s.deep_size = std::atoll(next().c_str());
    } else if (arg == "--deep-batch") {
      s.deep_batch = std::atoll(next().c_str());
    } else if (arg == "--deep-steps") {
      s.deep_steps = std::atoi(next().c_str());
    } else if (arg == "--trace-dir") {
      s.trace_dir = next();
    } else if (arg == "--backend") {
      s.backend = worker::parse_backend_kind(next());
    } else if (arg == "--deep-algorithm") {
      s.deep_algorithm = next();
    } else {
      std::fprintf(stderr,
                   "usage: bench_memory [--nets a,b] [--size N] [--batch B] [--steps N] "
                   "[--algorithm NAME] [--deep-size N] [--deep-steps N] [--trace-dir DIR] "
                   "[--backend cpu|cuda] [--deep-algorithm NAME]\n");
      std::exit(2);
    }
  }
  return s;
}

using NetRuns = std::vector<std::pair<std::string, std::vector<Run>>>;

// One line per net and vDNN policy: memory, step time, what was offloaded.
NetRuns run_policies(worker::Backend& backend, const Settings& s, double copy_ms) {
  NetRuns all_runs;
  for (const std::string& name : s.nets) {
    const worker::Shape input{1, 3, s.size, s.size};
    const worker::Graph graph =
        worker::Graph::build(worker::preset_layers(name, {input, 1000}), input);
    std::printf("\n%s (%d layers):\n", name.c_str(), graph.size());
    std::vector<Run> runs;
    size_t conv_need = 0, none_need = 0;
    // An untimed run first: the process's first network pays for page
    // faults and primitive creation beyond its first step, which would
    // make whichever policy runs first look slow.
    try {
      train(backend, graph, s, memory::Policy::kAll, 0, 1, "");
    } catch (const std::exception&) {
      // The measured runs report what does not fit.
    }
    for (memory::Policy p : {memory::Policy::kNone, memory::Policy::kConv, memory::Policy::kAll,
                             memory::Policy::kDyn}) {
      size_t capacity = 0;
      // Between conv's need and none's (when none fitted), so dyn must choose.
      if (p == memory::Policy::kDyn && none_need > 0) capacity = (conv_need + none_need) / 2;
      const std::string trace_path =
          s.trace_dir.empty() ? ""
                              : s.trace_dir + "/" + name + "-" + memory::policy_name(p) + ".json";
      Run r;
      try {
        r = train(backend, graph, s, p, capacity, s.steps, trace_path);
      } catch (const std::exception& e) {  // e.g. none on a batch only vDNN fits
        std::printf("  %-44s does not fit: %s\n", memory::policy_name(p), e.what());
        continue;
      }
      if (p == memory::Policy::kNone) none_need = r.reservation;
      if (p == memory::Policy::kConv) conv_need = r.reservation;
      const Run& base = runs.empty() ? r : runs.front();
      // Of the copies' own time, the part the step did not grow by.
      const double transfer_ms = mib(r.offloaded) * copy_ms;
      const std::string hidden =
          transfer_ms > 0
              ? "  copies " + std::to_string(static_cast<int>(transfer_ms)) + " ms, " +
                    std::to_string(static_cast<int>(std::clamp(
                        100.0 * (1.0 - std::max(0.0, r.step_ms - base.step_ms) / transfer_ms),
                        0.0, 100.0))) +
                    "% hidden"
              : "";
      std::printf("  %-44s max %9.1f MiB (-%4.1f%%)  avg %9.1f MiB (-%4.1f%%)  step %8.1f ms "
                  "(%5.2fx)  offloaded %8.1f MiB%s%s\n",
                  r.policy.c_str(), mib(r.step_peak),
                  100.0 * (1.0 - static_cast<double>(r.step_peak) / base.step_peak),
                  mib(r.step_average), 100.0 * (1.0 - r.step_average / base.step_average),
                  r.step_ms, r.step_ms / base.step_ms, mib(r.offloaded),
                  p == memory::Policy::kDyn && capacity > 0
                      ? (" (capacity " + std::to_string(static_cast<long long>(mib(capacity))) +
                         " MiB)")
                            .c_str()
                      : "",
                  hidden.c_str());
      runs.push_back(std::move(r));
    }
    all_runs.push_back({name, std::move(runs)});
  }
  return all_runs;
}

// DSA best fit (and the MIP on small traces) against the lower bound.
void report_dsa(const NetRuns& all_runs) {
  std::printf("\nDSA static planning on the same step traces (bytes above the persistent "
              "tensors):\n");
  for (const auto& [name, runs] : all_runs) {
    for (const Run& r : runs) {
      if (r.trace.empty()) continue;
      const memory::DsaPlan plan = memory::dsa_plan(r.trace);
      const double ms = 1000.0 * plan.seconds;
      const double lb = static_cast<double>(memory::dsa_lower_bound(r.trace));
      const double peak = static_cast<double>(plan.peak);
      const double pool = static_cast<double>(memory::dsa_pool_span(r.trace));
      std::string exact;  // the MIP's optimum, where the trace is small enough
      if (r.trace.size() <= kMipBlocks) {
        try {
          const auto mip_start = Clock::now();
          const memory::DsaMipResult mip =
              memory::dsa_solve_mip(r.trace, {.time_limit = std::chrono::seconds(20)});
          char text[96];
          std::snprintf(text, sizeof text, ", MIP optimum %.3fx (%.0f ms)",
                        static_cast<double>(mip.peak) / lb,
                        std::chrono::duration<double, std::milli>(Clock::now() - mip_start)
                            .count());
          exact = text;
        } catch (const std::exception& e) {
          exact = std::string(", MIP: ") + e.what();
        }
      }
      std::printf("  %-10s %-44s %5zu blocks: lower bound %8.1f MiB, best fit %.3fx, pool "
                  "%.3fx, plan %.2f ms%s\n",
                  name.c_str(), r.policy.c_str(), r.trace.size(), mib(lb), peak / lb, pool / lb,
                  ms, exact.c_str());
    }
  }
}

// The largest VGG under a memory limit far below its baseline need.
void run_deep(worker::Backend& backend, const Settings& s) {
  if (s.deep_size <= 0) return;
  const worker::Shape deep_input{1, 3, s.deep_size, s.deep_size};
  const worker::Graph deep =
      worker::Graph::build(worker::preset_layers("vgg416", {deep_input, 10}), deep_input);
  Settings ds = s;
  ds.size = s.deep_size;
  ds.batch = s.deep_batch;
  ds.algorithm = s.deep_algorithm;
  const auto [need, persistent] = baseline_need(backend, deep, ds);
  // Parameters, gradients and Sgd's velocity must stay; of the rest, 1/8.
  const size_t limit = persistent + (need - persistent) / 8;
  std::printf("\nvgg416 (%d layers), 3x%lldx%lld, batch %lld: policy none needs %.1f MiB "
              "(%.1f MiB of it persistent); device.memory_limit %.1f MiB (the persistent bytes "
              "and 1/8 of the rest, %.0f%% of none's need):\n",
              deep.size(), static_cast<long long>(ds.size), static_cast<long long>(ds.size),
              static_cast<long long>(ds.batch), mib(need), mib(persistent), mib(limit),
              100.0 * static_cast<double>(limit) / static_cast<double>(need));
  const auto limited = worker::make_backend({.kind = s.backend, .memory_limit = limit});
  try {
    worker::NetworkOptions o;
    o.max_batch = ds.batch;
    o.conv_algorithm = ds.algorithm;
    o.allocations_after_network = {worker::Sgd::kStateBytesPerParameter};
    worker::Network none(deep, *limited, o);
    std::printf("  none: unexpectedly fits\n");
  } catch (const std::exception& e) {
    std::printf("  none: %s\n", e.what());
  }
  for (memory::Policy p : {memory::Policy::kAll, memory::Policy::kDyn}) {
    const Run r = train(*limited, deep, ds, p, 0, ds.deep_steps, "");
    std::printf("  %-44s trained %d steps: max %.1f MiB, avg %.1f MiB, pool %.1f MiB of the "
                "%.1f MiB limit, step %.0f ms, offloaded %.1f MiB per step\n",
                r.policy.c_str(), ds.deep_steps + 1, mib(r.step_peak), mib(r.step_average),
                mib(r.reservation), mib(limit), r.step_ms, mib(r.offloaded));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Settings s = parse_settings(argc, argv);
  try {
    const auto backend = worker::make_backend({.kind = s.backend});
    const worker::DeviceInfo device = backend->device_info();
    const double copy_ms = copy_ms_per_mib(*backend);
    std::printf("vDNN policies on %s (%s, %d threads), 3x%lldx%lld, batch %lld, "
                "conv.algorithm %s; step time = median of %d steps; offload + prefetch copies "
                "%.3f ms/MiB (%.1f GB/s each way)\n",
                device.name.c_str(), device.backend.c_str(), device.threads,
                static_cast<long long>(s.size), static_cast<long long>(s.size),
                static_cast<long long>(s.batch), s.algorithm.c_str(), s.steps, copy_ms,
                2.0 * 1.048576 / copy_ms);
    report_dsa(run_policies(*backend, s, copy_ms));
    run_deep(*backend, s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory: %s\n", e.what());
    return 1;
  }
  return 0;
}
