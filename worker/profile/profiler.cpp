#include "worker/profile/profiler.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "common/text.h"
#include "memory/memory_error.h"
#include "worker/device/pinned_memory.h"
#include "worker/engine/device_blocks.h"
#include "worker/engine/kernel_timing.h"
#include "worker/engine/layer_timing.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"
#include "worker/profile/profile_peers.h"
#include "worker/profile/step_costs.h"
#include "worker/device/op_calls.h"

namespace vtrain::worker {
namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  double median_ms = 0;
  double iqr_ms = 0;
};

// Median and interquartile range of `repeats` timed runs after `warmup`.
Timing time_runs(Backend& backend, int warmup, int repeats, const std::function<void()>& run) {
  const KernelTime t =
      time_kernel(backend, {warmup, repeats, TimingStatistic::kMedian}, run);
  return {t.seconds * 1000.0, t.iqr_seconds * 1000.0};
}

// One convolution kernel shape of the model, with the batches it runs at.
struct KernelSite {
  ConvKind kind;
  ConvProblem problem;  // at batch 1
};

std::vector<KernelSite> kernel_sites(const Graph& graph, const ComputeSettings& settings,
                                     const Backend& backend) {
  const std::vector<TensorDesc> descs = activation_descs(graph, settings, backend, 1);
  std::vector<KernelSite> sites;
  std::set<std::string> seen;  // deep nets repeat shapes: measure each once
  for (const ConvKernelSite& k : conv_kernel_sites(graph, descs)) {
    if (seen.insert(std::string(conv_kind_name(k.kind)) + k.problem.str()).second) {
      sites.push_back({k.kind, k.problem});
    }
  }
  return sites;
}

// What decides the work items profile() walks, as "name: value" lines
// (require_same_items).
std::string item_settings(const Graph& graph, const std::vector<KernelSite>& sites,
                          const std::map<int64_t, std::vector<int64_t>>& batches_of,
                          const ProfileOptions& options) {
  std::vector<int64_t> micro_batches;
  for (const auto& [m, batches] : batches_of) micro_batches.push_back(m);
  const std::string steps =
      options.steps ? common::format("%d rounds (profile.step_rounds)", options.step_rounds)
                    : "none (profile.steps)";
  return common::format(
      "model: %s\nconv kernels: %zu\nprofile.batches: %s\nmicro-batches "
      "(profile.micro_batches): %s\nlayer costs: %s\nsteps: %s\n",
      perfdb::describe_model(model_key(graph, options.settings)).c_str(), sites.size(), common::format_list(options.batches).c_str(),
      common::format_list(micro_batches).c_str(), options.layer_costs ? "yes" : "no",
      steps.c_str());
}

// What a measurement's buffers may round up to, together.
constexpr size_t kAllocationSlack = size_t{64} << 10;

// One convolution kernel at micro-batch m: what of it fits the device now.
// On a small device (device.memory_limit) only what fits is measured: an
// algorithm whose workspace does not fit cannot run there, and a kernel
// whose tensors do not fit belongs to no step that does (algos empty).
// Weights and bias in the activations' type, their gradients in f32.
struct KernelItem {
  KernelItem(const KernelSite& s, int64_t m, Backend& backend)
      : site(s), p(s.problem.with_batch(m)), w_shape(p.weight_shape()),
        w_desc{w_shape, Layout::kPlain, p.x.dtype}, bias_desc(vector_desc(p.k, p.x.dtype)) {
    const size_t tensors = p.x.bytes() + p.y.bytes() + w_desc.bytes() + bias_desc.bytes() +
                           (w_shape.elements() + p.k) * sizeof(float);
    const size_t free = free_device_bytes(backend);
    if (tensors + kAllocationSlack > free) return;
    algos = conv_algorithms(backend, site.kind, p, sums_over_micro_batches(site.kind));
    std::erase_if(algos, [&](const ConvAlgoInfo& a) {
      return tensors + a.workspace_bytes + kAllocationSlack > free;
    });
  }

  // Whether `db` holds every algorithm's time for each of `batches`.
  bool held_by(perfdb::PerfDb& db, perfdb::DeviceId device,
               const std::vector<int64_t>& batches) const {
    bool cached = true;
    for (int64_t b : batches) {
      const perfdb::KernelSignature sig = kernel_signature(site.kind, site.problem.with_batch(b));
      for (const ConvAlgoInfo& a : algos) {
        cached = cached && db.find_kernel_measurement(device, sig, a.name, p.x.shape.n).has_value();
      }
    }
    return cached;
  }

  // Every algorithm's time, as samples for each of `batches`; an algorithm
  // that refuses to run (time_algorithms) has none, and is added to
  // *refused as "<kind> <name> (<error>) at <problem>". Ends the item's
  // turn (turns.done, running the fastest algorithm).
  std::vector<perfdb::KernelSample> measure(Backend& backend, const std::vector<int64_t>& batches,
                                            const ProfileOptions& options, const WorkTurns& turns,
                                            std::vector<std::string>* refused) const {
    size_t workspace = 0;
    for (const ConvAlgoInfo& a : algos) workspace = std::max(workspace, a.workspace_bytes);
    DeviceBlocks blocks(backend, std::string("profiling a ") + conv_kind_name(site.kind) +
                                     " kernel at micro-batch " + std::to_string(p.x.shape.n));
    const Tensor xt = blocks.tensor(p.x, 0.01f), yt = blocks.tensor(p.y, 0.01f);
    const void* w = blocks.tensor(w_desc, 0.01f).data;
    const void* bias = blocks.tensor(bias_desc, 0.0f).data;
    float* dw = blocks.floats(w_shape.elements(), 0.0f);
    float* dbias = blocks.floats(p.k, 0.0f);
    void* ws = blocks.get(workspace);
    // BackwardFilter is timed as a later micro-batch, which adds to dW.
    const float beta = sums_over_micro_batches(site.kind) ? 1.0f : 0.0f;
    const auto run = [&](ConvAlgo algo) {
      switch (site.kind) {
        case ConvKind::kForward:
          conv_forward(backend, algo, p, xt, w, bias, yt, 0.0f, ws, workspace);
          break;
        case ConvKind::kBackwardData:
          conv_backward_data(backend, algo, p, yt, w, xt, 0.0f, ws, workspace);
          break;
        case ConvKind::kBackwardFilter:
          conv_backward_filter(backend, algo, p, xt, yt, dw, dbias, beta, ws, workspace);
          break;
      }
    };
    const std::vector<AlgorithmTime> times = time_algorithms(
        backend, algos, {options.warmup, options.repeats, TimingStatistic::kMedian}, run);
    const AlgorithmTime* fastest = nullptr;
    for (const AlgorithmTime& t : times) {
      if (t.time && (!fastest || t.time->seconds < fastest->time->seconds)) fastest = &t;
    }
    if (fastest) {
      turns.done([&] {
        run(fastest->algo.algo);
        backend.synchronize(StreamKind::kCompute);
      });
    } else {
      turns.done();
    }
    for (const std::string& r : refusals(times)) {
      refused->push_back(std::string(conv_kind_name(site.kind)) + " " + r + " at " + p.str());
    }
    std::vector<perfdb::KernelSample> samples;
    for (const AlgorithmTime& t : times) {
      if (!t.time) continue;
      for (int64_t b : batches) {
        samples.push_back({kernel_signature(site.kind, site.problem.with_batch(b)),
                           {t.algo.name, p.x.shape.n, t.time->seconds * 1000.0,
                            t.time->iqr_seconds * 1000.0, t.algo.workspace_bytes, 0}});
      }
    }
    return samples;
  }

  const KernelSite& site;
  ConvProblem p;  // at micro-batch m
  Shape w_shape;
  TensorDesc w_desc, bias_desc;
  std::vector<ConvAlgoInfo> algos;  // those that fit; empty when the kernel does not
};

// One training step of `graph` at batch `b` under options.memory_policy,
// as training runs it, less the gradient exchange (measured on its own):
// the batch's upload from pinned host memory (where training's network
// holds the input staging, the batch copied during the step before, once
// its backward has been issued, as the trainer copies it), forward and
// backward, the update. A
// zero learning rate keeps the weights. nullopt when no step under the
// policy fits the device at this batch. A per-tensor policy plans with the
// layer costs `db` holds at `b` (else measures them in place). Also the
// step's calls (their medians over runs of their own, each call waited
// for), unless the step offloads. Ends the item's turn (turns.done,
// running the step again).
struct MeasuredStep {
  perfdb::StepMeasurement step;
  std::optional<memory::StepCosts> calls;
  bool copied_ahead = false;  // every timed run's batch copied during the run before
};
std::optional<MeasuredStep> measure_step(const Graph& graph, Backend& backend, perfdb::PerfDb& db,
                                         perfdb::DeviceId device, int64_t b,
                                         const ProfileOptions& options, const WorkTurns& turns) {
  const size_t base = backend.device_bytes_in_use();
  NetworkOptions net_options;
  net_options.settings = options.settings;
  net_options.max_batch = b;
  net_options.memory_policy = options.memory_policy;
  net_options.allocations_after_network = {Sgd::kStateBytesPerParameter};
  net_options.prefetch_input = options.input_staging && options.input_staging(b);
  if (memory::plans_per_tensor(options.memory_policy)) {
    StepCostsLookup found = profiled_step_costs(db, device, graph, options.settings, b);
    if (found.costs.has_value()) net_options.memory_costs = std::move(found.costs.value());
  }
  // Before the network: its destructor waits for a copy still reading it.
  PinnedMemory pinned(backend);
  const TimingBatch batch = timing_batch(graph, b, &pinned);
  std::optional<Network> net;
  try {
    net.emplace(graph, backend, net_options);
  } catch (const memory::OutOfMemoryError&) {
    turns.done();
    return std::nullopt;
  }
  Sgd sgd(backend, net->parameter_count(), 0.9f, 0.0f);  // its velocity counts in the peak
  net->init_parameters(1);
  // The peak counts from here, as in training: what the step holds, not the
  // buffers conv.algorithm auto timed its candidates in.
  backend.reset_peak();
  int64_t runs = 0, took_copies = 0;
  const auto run_step = [&] {
    ++runs;
    if (net->upload_input(batch.images.data(), b)) ++took_copies;
    backend.upload_labels(batch.labels.data(), net->labels(), b);
    net->train_step(b, 1.0f / static_cast<float>(b));
    if (net_options.prefetch_input) net->prefetch_input(batch.images.data(), b);
    sgd.step(net->parameters(), net->gradients(), 0.0f);
  };
  // The step timed as training runs it: no call waited for on its own.
  // Such waits would add a round trip to the host per call, lay bare each
  // launch that training hides behind the call before, and end backward
  // before the next batch's copy starts. A run without a batch copied
  // ahead (the first) is never one of the timed ones.
  const int warmup = net_options.prefetch_input ? std::max(options.warmup, 1) : options.warmup;
  const Timing t = time_runs(backend, warmup, options.repeats, run_step);
  MeasuredStep measured;
  measured.copied_ahead = took_copies == runs - 1 && runs > 1;
  const memory::PlanSummary placement = net->activation_placement();
  // The calls, each waited for, in runs of their own; not where the step
  // offloads (copies on a shared CPU slow the calls they overlap).
  if (placement.offloaded_bytes == 0) {
    std::vector<memory::StepCosts> calls;
    net->record_call_times(&calls);
    for (int i = 0; i < std::max(options.repeats, 1); ++i) run_step();
    net->record_call_times(nullptr);
    measured.calls = median_call_times(calls);
  }
  turns.done([&] {
    run_step();
    backend.synchronize(StreamKind::kCompute);
  });
  perfdb::StepMeasurement& step = measured.step;
  step.model = model_key(graph, options.settings);
  step.batch = b;
  step.memory_policy = memory::policy_name(options.memory_policy);
  step.policy_capacity_bytes =
      step_policy_capacity(options.memory_policy, backend.device_info().memory_bytes);
  step.workspace_plan = kProfiledStepPlan;
  step.time_ms = t.median_ms;
  step.peak_device_bytes = backend.device_bytes_peak() - base;
  step.activations = common::ActivationBytes{placement.kept_bytes, placement.offloaded_bytes,
                                             placement.recomputed_bytes};
  return measured;
}

}  // namespace

std::string copied_ahead_note(const ProfileReport& report) {
  if (report.step_copied_ahead == 0) return "";
  return " (" + std::to_string(report.step_copied_ahead) + " with the batch copied ahead)";
}

perfdb::Device perfdb_device(const DeviceInfo& info) {
  return {info.name, info.backend, info.memory_bytes, info.library_version, info.threads,
          info.host};
}

common::DeviceLabel device_label(const DeviceInfo& info) {
  return perfdb::device_label(perfdb_device(info));
}

perfdb::KernelSignature kernel_signature(ConvKind kind, const ConvProblem& p) {
  perfdb::KernelSignature sig;
  sig.kind = kind;
  sig.n = p.x.shape.n;
  sig.c = p.x.shape.c;
  sig.h = p.x.shape.h;
  sig.w = p.x.shape.w;
  sig.k = p.k;
  sig.r = p.window.kernel_h;  // the perf DB's columns keep cuDNN's names
  sig.s = p.window.kernel_w;
  sig.pad_h = p.window.pad_h;
  sig.pad_w = p.window.pad_w;
  sig.stride_h = p.window.stride_h;
  sig.stride_w = p.window.stride_w;
  sig.groups = p.groups;
  sig.dtype = dtype_name(p.x.dtype);
  sig.input_layout = layout_name(p.x.layout);
  sig.output_layout = layout_name(p.y.layout);
  return sig;
}

uint64_t step_policy_capacity(memory::Policy memory_policy, uint64_t capacity_bytes) {
  return memory::plans_for_capacity(memory_policy) ? capacity_bytes : 0;
}

std::vector<perfdb::StepMeasurement> profiled_steps(perfdb::PerfDb& db, perfdb::DeviceId device,
                                                    const perfdb::ModelKey& model,
                                                    memory::Policy memory_policy,
                                                    uint64_t capacity_bytes) {
  std::vector<perfdb::StepMeasurement> steps =
      db.step_measurements(device, model, memory::policy_name(memory_policy),
                           step_policy_capacity(memory_policy, capacity_bytes));
  std::erase_if(steps, [](const perfdb::StepMeasurement& s) {
    return s.workspace_plan != kProfiledStepPlan;
  });
  return steps;
}

namespace {

// Micro-batch size -> the candidate batches whose policy set contains it.
using BatchesOf = std::map<int64_t, std::vector<int64_t>>;

BatchesOf micro_batches_of(const ProfileOptions& options) {
  BatchesOf batches_of;
  for (int64_t b : options.batches) {
    if (b < 1) throw std::invalid_argument("profile: batch sizes must be >= 1");
    for (int64_t m : balancer::micro_batch_sizes(options.micro_batches, b)) {
      batches_of[m].push_back(b);
    }
  }
  return batches_of;
}

// What every phase of profile() works on, and the report they fill in.
// `turns` is the peer protocol (profile_peers.h): which items this process
// measures, and where it waits for the others; the phases walk their items
// through it in the same order on every member.
struct ProfileRun {
  const Graph& graph;
  Backend& backend;
  perfdb::PerfDb& db;
  perfdb::DeviceId device;
  const ProfileOptions& options;
  WorkTurns turns;
  ProfileReport report;
};

// Kernels: every conv kernel at every micro-batch, each algorithm timed
// once for every candidate batch whose policy set holds the micro-batch.
void profile_kernels(ProfileRun& run, const std::vector<KernelSite>& sites,
                     const BatchesOf& batches_of) {
  for (const KernelSite& site : sites) {
    for (const auto& [m, batches] : batches_of) {
      std::optional<KernelItem> item;
      const Turn turn = run.turns.play(
          [&] {
            item.emplace(site, m, run.backend);
            return ItemState{!item->algos.empty(), item->held_by(run.db, run.device, batches)};
          },
          [&] {
            run.db.record_kernel_measurements(
                run.device, item->measure(run.backend, batches, run.options, run.turns,
                                          &run.report.algorithms_refused));
            ++run.report.kernel_measured;
          });
      if (turn == Turn::kCached) ++run.report.kernel_cached;
    }
  }
}

// Layer costs: the device's copy bandwidth, then each candidate batch's
// layers, every layer timed alone (step_costs.h).
void profile_layer_costs(ProfileRun& run) {
  const KernelTimingOptions timing{run.options.warmup, run.options.repeats,
                                   TimingStatistic::kMedian};
  const Turn copy = run.turns.play(
      [&] { return ItemState{true, holds_copy_bandwidth(run.db, run.device)}; },
      [&] {
        record_copy_bandwidth(run.backend, run.db, run.device, timing);
        run.turns.done();
      });
  if (copy != Turn::kSkip) {
    ++(copy == Turn::kMeasure ? run.report.copy_measured : run.report.copy_cached);
  }
  for (int64_t b : run.options.batches) {
    const Turn turn = run.turns.play(
        [&] {
          return ItemState{
              true, holds_layer_costs(run.db, run.device, run.graph, run.options.settings, b)};
        },
        [&] {
          try {
            record_layer_costs(run.graph, run.options.settings, run.backend, run.db, run.device, b,
                               timing);
            ++run.report.layer_costs_measured;
          } catch (const memory::OutOfMemoryError&) {
            // Layer by layer needs less than a step; the step says it too.
          }
          run.turns.done();
        });
    if (turn == Turn::kCached) ++run.report.layer_costs_cached;
  }
}

// This process's steps over every round: each batch's measured rounds, and
// its batches in the order they were dealt.
struct StepRounds {
  std::map<int64_t, std::vector<MeasuredStep>> of;
  std::vector<int64_t> dealt;
};

// Steps, timed: round 1 deals the candidate batches (turns); each later
// round re-times what this process measured in round 1, in the same order
// (WorkTurns::replay keeps together peers in step). A batch no step fits
// (under the policy) in round 1 is reported infeasible.
StepRounds time_step_rounds(ProfileRun& run) {
  const ProfileOptions& options = run.options;
  const std::vector<perfdb::StepMeasurement> known =
      profiled_steps(run.db, run.device, model_key(run.graph, options.settings),
                     options.memory_policy, run.backend.device_info().memory_bytes);
  StepRounds rounds;
  const auto measure = [&](int64_t b, bool first_round) {
    std::optional<MeasuredStep> measured =
        measure_step(run.graph, run.backend, run.db, run.device, b, options, run.turns);
    if (measured) {
      rounds.of[b].push_back(std::move(*measured));
    } else if (first_round) {
      run.report.step_infeasible.push_back(b);
    }
  };
  for (int64_t b : options.batches) {
    const Turn turn = run.turns.play(
        [&] {
          return ItemState{true, std::any_of(known.begin(), known.end(),
                                             [&](const perfdb::StepMeasurement& s) {
                                               return s.batch == b;
                                             })};
        },
        [&] {
          rounds.dealt.push_back(b);
          measure(b, true);
        });
    if (turn == Turn::kCached) ++run.report.step_cached;
  }
  for (int round = 1; round < std::max(options.step_rounds, 1); ++round) {
    for (int64_t b : options.batches) {
      // Not this process's batch, or it fit no step: no measurement.
      run.turns.replay(rounds.of.contains(b), [&] { measure(b, false); });
    }
  }
  return rounds;
}

// Steps, recorded: each dealt batch's round of median time (the lower of
// two middles), peak and all; with layer costs, the layers as that step
// met them replace their times alone (see measure_costs_in_steps): the
// simulator then predicts steps.
void record_median_steps(ProfileRun& run, StepRounds& rounds) {
  for (int64_t b : rounds.dealt) {
    auto found = rounds.of.find(b);
    if (found == rounds.of.end()) continue;
    std::vector<MeasuredStep>& runs = found->second;
    const auto middle = runs.begin() + static_cast<std::ptrdiff_t>((runs.size() - 1) / 2);
    std::nth_element(runs.begin(), middle, runs.end(),
                     [](const MeasuredStep& x, const MeasuredStep& y) {
                       return x.step.time_ms < y.step.time_ms;
                     });
    const MeasuredStep& measured = *middle;
    run.db.record_step_measurements(run.device, std::span(&measured.step, 1));
    ++run.report.step_measured;
    if (measured.copied_ahead) ++run.report.step_copied_ahead;
    if (run.options.layer_costs && measured.calls) {
      run.db.record_layer_measurements(run.device, model_key(run.graph, run.options.settings), b,
                                       layer_rows(run.graph, *measured.calls));
    }
  }
  std::sort(run.report.step_infeasible.begin(), run.report.step_infeasible.end());
}

}  // namespace

ProfileReport profile(const Graph& graph, Backend& backend, perfdb::PerfDb& db,
                      perfdb::DeviceId device, const ProfileOptions& options) {
  require_precision(backend, options.settings.precision);
  const auto start = Clock::now();
  const BatchesOf batches_of = micro_batches_of(options);
  const std::vector<KernelSite> sites = kernel_sites(graph, options.settings, backend);
  require_same_items(options.peers, item_settings(graph, sites, batches_of, options));
  ProfileRun run{graph, backend, db, device, options, WorkTurns(options.peers), {}};
  profile_kernels(run, sites, batches_of);
  // Layer costs before the steps: a per-tensor policy's step plans with them.
  if (options.layer_costs) profile_layer_costs(run);
  if (options.steps) {
    StepRounds rounds = time_step_rounds(run);
    record_median_steps(run, rounds);
  }
  run.report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return run.report;
}

double measure_allreduce_ms(Backend& backend, Communicator& comm, int64_t count,
                            const ProfileOptions& options) {
  const int64_t n = std::max<int64_t>(count, 1);
  DeviceBlocks blocks(backend, "timing the gradient allreduce");
  float* buffer = blocks.floats(n, 0.0f);
  return time_runs(backend, options.warmup, options.repeats, [&] {
           comm.allreduce_async(buffer, n);
           comm.wait();
         }).median_ms;
}

}  // namespace vtrain::worker
