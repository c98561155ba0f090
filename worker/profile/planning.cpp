#include "worker/profile/planning.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <utility>

#include "common/text.h"
#include "worker/device/backend.h"
#include "worker/profile/profiler.h"
#include "worker/profile/step_costs.h"

namespace vtrain::worker {
namespace {

constexpr uint64_t kSegmentAlign = 256;  // every workspace segment starts aligned

uint64_t align_up(uint64_t bytes) { return (bytes + kSegmentAlign - 1) / kSegmentAlign * kSegmentAlign; }

// A conv kernel of the graph on one device at one batch.
struct KernelAt {
  std::string layer;
  ConvKind kind;
  perfdb::KernelSignature signature;
};

// The job's settings as `device` computes them (PlanDevice::precision).
ComputeSettings on_device(ComputeSettings settings, const PlanDevice& device) {
  if (device.precision) settings.precision = *device.precision;
  return settings;
}

std::vector<KernelAt> kernels_at(const Graph& graph, const ComputeSettings& settings,
                                 const PlanDevice& device, int64_t batch) {
  const std::vector<TensorDesc> descs = activation_descs(graph, settings, device.layout, batch);
  std::vector<KernelAt> out;
  for (const ConvKernelSite& k : conv_kernel_sites(graph, descs)) {
    out.push_back({graph.layer(k.layer).name, k.kind, kernel_signature(k.kind, k.problem)});
  }
  return out;
}


// One rank's conv kernels at `batch` under the workspace request.
struct RankWorkspace {
  balancer::RankPlan rank;   // device, batch, workspace_bytes, kernels
  double chosen_ms = 0;      // the kernels' time under the plan
  double fastest_ms = 0;     // their fastest undivided time (what a measured step ran)
};

RankWorkspace plan_rank_workspace(const Graph& graph, const ComputeSettings& job,
                                  perfdb::PerfDb& db, const PlanDevice& device, int64_t batch,
                                  const WorkspaceRequest& workspace, int rank_index,
                                  std::vector<FrontPoint>* fronts) {
  using balancer::WorkspacePolicy;
  const ComputeSettings settings = on_device(job, device);
  RankWorkspace out;
  out.rank.device = device.label;
  out.rank.precision = device.precision;
  out.rank.batch = batch;
  const std::vector<KernelAt> sites = kernels_at(graph, settings, device, batch);
  std::vector<balancer::ConvKernel> kernels;
  for (const KernelAt& site : sites) {
    balancer::ConvKernel k;
    k.name = site.layer + "/" + conv_kind_name(site.kind);
    k.batch = batch;
    double fastest = -1;
    for (const perfdb::KernelMeasurement& m : db.kernel_measurements(device.id, site.signature)) {
      if (m.micro_batch > batch ||
          !conv_algorithm_allowed(m.algorithm, settings.precision, workspace.graph_engines)) {
        continue;
      }
      if (m.micro_batch == batch && (fastest < 0 || m.time_ms < fastest)) fastest = m.time_ms;
      if (workspace.policy == WorkspacePolicy::kUndivided && m.micro_batch != batch) continue;
      k.options.push_back({m.algorithm, m.micro_batch, m.time_ms, align_up(m.workspace_bytes)});
    }
    if (k.options.empty() || fastest < 0) {
      throw std::runtime_error("device " + device.label.text() + ": no measurements of " + k.name +
                               " at batch " + std::to_string(batch) + " in " + db.path() +
                               " (profile with profile.batches including " +
                               std::to_string(batch) + ")");
    }
    out.fastest_ms += fastest;
    kernels.push_back(std::move(k));
  }
  std::vector<balancer::KernelConfig> configs;
  std::vector<uint64_t> offsets(kernels.size(), 0);
  if (workspace.policy == WorkspacePolicy::kWd) {
    balancer::WorkspaceDivision division =
        balancer::plan_workspace_division(kernels, workspace.limit);
    configs = std::move(division.configs);
    offsets = std::move(division.offsets);
    out.rank.workspace_bytes = division.total_workspace_bytes;
  } else {
    // Kernels run one after another: undivided and WR share one buffer.
    const uint64_t limit = workspace.limit > 0 ? workspace.limit : balancer::kNoWorkspaceLimit;
    for (const balancer::ConvKernel& k : kernels) {
      configs.push_back(balancer::plan_workspace_reuse(k, limit));
      out.rank.workspace_bytes = std::max(out.rank.workspace_bytes, configs.back().workspace_bytes);
    }
  }
  if (fronts) {
    const uint64_t per_call = workspace.policy == WorkspacePolicy::kWr && workspace.limit > 0
                                  ? workspace.limit
                                  : balancer::kNoWorkspaceLimit;
    for (size_t i = 0; i < kernels.size(); ++i) {
      for (const balancer::KernelConfig& c : balancer::pareto_front(kernels[i], per_call)) {
        fronts->push_back({rank_index, kernels[i].name, c.workspace_bytes, c.time_ms,
                           balancer::describe_calls(c.micro_batches),
                           c.workspace_bytes == configs[i].workspace_bytes &&
                               c.time_ms == configs[i].time_ms});
      }
    }
  }
  for (size_t i = 0; i < kernels.size(); ++i) {
    balancer::PlannedKernel pk;
    pk.layer = sites[i].layer;
    pk.kind = sites[i].kind;
    pk.calls = configs[i].micro_batches;
    pk.workspace_offset = offsets[i];
    pk.workspace_bytes = configs[i].workspace_bytes;
    pk.time_ms = configs[i].time_ms;
    out.chosen_ms += pk.time_ms;
    out.rank.kernels.push_back(std::move(pk));
  }
  return out;
}

// The profiler's steps of `graph` on `device` by batch.
std::map<int64_t, perfdb::StepMeasurement> steps_by_batch(perfdb::PerfDb& db, const Graph& graph,
                                                          const ComputeSettings& settings,
                                                          const PlanDevice& device,
                                                          memory::Policy memory_policy) {
  std::map<int64_t, perfdb::StepMeasurement> out;
  for (perfdb::StepMeasurement& s :
       profiled_steps(db, device.id, model_key(graph, on_device(settings, device)), memory_policy,
                      device.memory_bytes)) {
    out.emplace(s.batch, std::move(s));
  }
  return out;
}

// Whether the workspace request can make kernels run other than the
// fastest undivided algorithm each (what the profiler's steps ran).
bool changes_kernels(const WorkspaceRequest& workspace) {
  return workspace.policy != balancer::WorkspacePolicy::kUndivided || workspace.limit > 0;
}

}  // namespace

std::vector<balancer::DeviceProfile> device_profiles(const Graph& graph,
                                                     const ComputeSettings& settings,
                                                     perfdb::PerfDb& db,
                                                     const std::vector<PlanDevice>& devices,
                                                     const StepPricing& pricing) {
  std::vector<balancer::DeviceProfile> profiles;
  for (const PlanDevice& d : devices) {
    balancer::DeviceProfile p;
    p.name = d.label.text();
    p.memory_capacity_bytes = d.memory_bytes;
    p.input_rate = d.input_rate;
    p.host_share = d.host_share;
    const std::map<int64_t, perfdb::StepMeasurement> by_batch =
        steps_by_batch(db, graph, settings, d, pricing.memory_policy);
    if (by_batch.empty()) {
      const std::string at =
          d.precision ? std::string(" in ") + common::precision_name(*d.precision) : "";
      throw std::runtime_error("device " + d.label.text() + " has no step measurements of this model" +
                               at + " under memory.policy " + memory::policy_name(pricing.memory_policy) +
                               " in " + db.path() +
                               " (run `vtrain profile` on it with that policy first)");
    }
    for (const auto& [batch, s] : by_batch) {
      double time_ms = s.time_ms;
      if (changes_kernels(pricing.workspace)) {
        try {
          const RankWorkspace w =
              plan_rank_workspace(graph, settings, db, d, batch, pricing.workspace, 0, nullptr);
          time_ms = std::max(0.0, time_ms - w.fastest_ms + w.chosen_ms);
        } catch (const balancer::InfeasibleError&) {
          continue;  // the budget cannot hold this batch's kernels
        }
      }
      p.steps.push_back({batch, time_ms, s.peak_device_bytes});
    }
    balancer::make_monotone(p.steps);
    profiles.push_back(std::move(p));
  }
  return profiles;
}

balancer::BatchSplit plan_split(const Graph& graph, const ComputeSettings& settings,
                                perfdb::PerfDb& db,
                                const std::vector<PlanDevice>& devices, int64_t global_batch,
                                const balancer::BatchSplitOptions& options,
                                const StepPricing& pricing) {
  return balancer::plan_batch_split(device_profiles(graph, settings, db, devices, pricing),
                                    global_batch, options);
}

balancer::TrainingPlan plan_workspaces(const Graph& graph, const ComputeSettings& settings,
                                     perfdb::PerfDb& db,
                                     const std::vector<PlanDevice>& devices,
                                     const balancer::BatchSplit& split,
                                     const StepPricing& pricing,
                                     std::vector<FrontPoint>* fronts) {
  if (split.batch.size() != devices.size()) {
    throw std::invalid_argument("plan_workspaces: the split has " +
                                std::to_string(split.batch.size()) + " devices, not " +
                                std::to_string(devices.size()));
  }
  const WorkspaceRequest& workspace = pricing.workspace;
  if (workspace.policy == balancer::WorkspacePolicy::kWd && workspace.limit == 0) {
    throw std::invalid_argument("workspace policy wd needs a total workspace budget");
  }
  balancer::TrainingPlan plan;
  plan.model = graph.signature();
  plan.settings = devices.empty() ? settings : on_device(settings, devices[0]);
  plan.workspace_policy = workspace.policy;
  plan.workspace_limit = workspace.limit;
  plan.even_split_ms = split.even_split_time_ms;
  if (split.step_time_ms > 0) plan.split_ms = split.step_time_ms;
  if (split.ideal_step_time_ms > 0) plan.ideal_step_ms = split.ideal_step_time_ms;
  for (size_t g = 0; g < devices.size(); ++g) {
    const PlanDevice& device = devices[g];
    if (split.batch[g] == 0) {
      balancer::RankPlan idle;  // no samples, no kernels
      idle.device = device.label;
      idle.precision = device.precision;
      plan.ranks.push_back(std::move(idle));
      continue;
    }
    RankWorkspace w = plan_rank_workspace(graph, settings, db, device, split.batch[g], workspace,
                                          static_cast<int>(g), fronts);
    balancer::RankPlan& rank = w.rank;
    plan.global_batch += rank.batch;
    // The split's price of this batch (the workspace plan's kernels
    // included); a fixed split has none, and the kernels are all we know.
    const double priced = g < split.time_ms.size() ? split.time_ms[g] : 0.0;
    rank.predicted_ms = priced > 0 ? priced : w.chosen_ms;
    if (device.input_rate > 0) {
      rank.input_rate = device.input_rate;
      rank.binds = g < split.binding.size() ? split.binding[g] : balancer::Binding::kCompute;
    }
    const auto steps = steps_by_batch(db, graph, settings, device, pricing.memory_policy);
    if (const auto at = steps.find(rank.batch); at != steps.end()) {
      rank.activations = at->second.activations;
    }
    plan.predicted_step_ms = std::max(plan.predicted_step_ms, rank.predicted_ms);
    plan.ranks.push_back(std::move(rank));
  }
  if (split.step_time_ms > 0) plan.predicted_step_ms = split.step_time_ms;
  return plan;
}

std::optional<std::string> plan_mismatch(const balancer::TrainingPlan& plan, const Graph& graph,
                                         const ComputeSettings& settings, int ranks,
                                         int64_t global_batch, memory::Policy memory_policy) {
  // The settings are rank 0's; where ranks differ in precision, each
  // rank's own is checked by plan_precision_mismatch.
  ComputeSettings job = settings;
  if (!plan.ranks.empty() && plan.ranks[0].precision) job.precision = *plan.ranks[0].precision;
  const perfdb::ModelKey planned{plan.model, plan.settings};
  const perfdb::ModelKey ours = model_key(graph, job);
  if (planned != ours) {
    return "the plan was made for another model or another way of computing it (it was "
           "made for " + perfdb::describe_model(planned) +
           ", this config's is " + perfdb::describe_model(ours) + ")";
  }
  if (static_cast<int>(plan.ranks.size()) != ranks) {
    return "the plan has " + std::to_string(plan.ranks.size()) + " ranks, the job has " +
           std::to_string(ranks);
  }
  if (plan.memory_policy != memory::policy_name(memory_policy)) {
    // Its batches were chosen to fit the devices under that policy.
    return "the plan was made for memory.policy " + plan.memory_policy +
           ", the config's memory.policy is " + memory::policy_name(memory_policy);
  }
  if (plan.global_batch != global_batch) {
    return "the plan's global_batch is " + std::to_string(plan.global_batch) +
           ", the config's train.batch is " + std::to_string(global_batch);
  }
  const PlanDevice any{{}, {}, 0, [](int64_t) { return Layout::kPlain; }, 0};
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const balancer::RankPlan& rank = plan.ranks[r];
    if (rank.batch == 0) continue;
    std::vector<std::string> expected, given;
    for (const KernelAt& k : kernels_at(graph, settings, any, rank.batch)) {
      expected.push_back(k.layer + " " + conv_kind_name(k.kind));
    }
    for (const balancer::PlannedKernel& k : rank.kernels) given.push_back(k.layer + " " + conv_kind_name(k.kind));
    std::sort(expected.begin(), expected.end());
    std::sort(given.begin(), given.end());
    if (expected == given) continue;
    std::vector<std::string> missing, extra;
    std::set_difference(expected.begin(), expected.end(), given.begin(), given.end(),
                        std::back_inserter(missing));
    std::set_difference(given.begin(), given.end(), expected.begin(), expected.end(),
                        std::back_inserter(extra));
    return "rank " + std::to_string(r) + ": " +
           (missing.empty() ? "the plan configures " + extra.front() + ", not a kernel of the model"
                            : "the plan does not configure " + missing.front());
  }
  return std::nullopt;
}

namespace {

// A device name without what says where it runs rather than what it is: the
// cores a CPU process is pinned to (" (cpus 0,1)", which a requeued job may
// get differently; a thread count may follow it) and the " #rank" older
// offline plans appended.
std::string hardware_name(std::string name) {
  if (const size_t at = name.rfind(" (cpus "); at != std::string::npos) {
    const size_t close = name.find(')', at);
    if (close != std::string::npos) name.erase(at, close + 1 - at);
  }
  const size_t hash = name.rfind(" #");
  if (hash != std::string::npos && hash + 2 < name.size() &&
      name.find_first_not_of("0123456789", hash + 2) == std::string::npos) {
    name.resize(hash);
  }
  return name;
}

}  // namespace

std::optional<std::string> plan_device_mismatch(const balancer::TrainingPlan& plan, int rank,
                                                const common::DeviceLabel& device) {
  const common::DeviceLabel& planned = plan.ranks.at(static_cast<size_t>(rank)).device;
  if (planned.name.empty()) return std::nullopt;
  const std::string where = "rank " + std::to_string(rank) + " was planned for device '" +
                            planned.text() + "', but it runs on '" + device.text() + "'";
  if (hardware_name(planned.name) != hardware_name(device.name)) {
    return where + " (plan again for these devices)";
  }
  // Plans written before a CPU's label held its thread count name none:
  // such a plan is taken for any thread count.
  if (planned.threads && planned.threads != device.threads) {
    return where + ": its thread count differs (device.threads; plan again for these devices)";
  }
  return std::nullopt;
}

std::optional<std::string> plan_precision_mismatch(const balancer::TrainingPlan& plan, int rank,
                                                   common::Precision precision) {
  const std::optional<common::Precision> planned = plan.ranks.at(static_cast<size_t>(rank)).precision;
  if (!planned || *planned == precision) return std::nullopt;
  return "rank " + std::to_string(rank) + " was planned to compute in " +
         common::precision_name(*planned) +
         ", but it computes in " + common::precision_name(precision) +
         " (train.precision; plan again for these precisions)";
}

std::vector<ConvLayerExecution> conv_executions(const balancer::RankPlan& rank) {
  std::vector<ConvLayerExecution> out;
  for (const balancer::PlannedKernel& k : rank.kernels) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const ConvLayerExecution& e) { return e.layer == k.layer; });
    if (it == out.end()) {
      out.push_back({k.layer, {}});
      it = std::prev(out.end());
    }
    ConvKernelExecution& e = it->kernels[static_cast<size_t>(k.kind)];
    for (const balancer::MicroBatch& c : k.calls) e.calls.push_back({c.algorithm, c.size});
    e.workspace_offset = k.workspace_offset;
    e.workspace_bytes = k.workspace_bytes;
  }
  return out;
}

namespace {
// ", bf16" after a rank's device where the plan names its precision.
std::string precision_note(const balancer::RankPlan& rank) {
  return rank.precision ? std::string(", ") + common::precision_name(*rank.precision) : "";
}
}  // namespace

std::string describe_plan(const balancer::TrainingPlan& plan) {
  using common::format;
  std::vector<int64_t> batches;
  for (const balancer::RankPlan& r : plan.ranks) batches.push_back(r.batch);
  // Every line is built to its full length: with hundreds of ranks the split
  // alone is longer than any fixed buffer.
  std::string out = "plan: split " + balancer::join_batches(batches, '+') +
                    format(" of %lld, workspace %s", static_cast<long long>(plan.global_batch),
                           balancer::workspace_policy_name(plan.workspace_policy)) +
                    (plan.workspace_limit > 0 ? " " + common::format_mib(plan.workspace_limit) : "") +
                    format(", predicted step %.2f ms", plan.predicted_step_ms);
  if (plan.even_split_ms && plan.split_ms && *plan.split_ms > 0) {
    out += format("\n  from measured steps: this split %.2f ms, even split %.2f ms (%.2fx)",
                  *plan.split_ms, *plan.even_split_ms, *plan.even_split_ms / *plan.split_ms);
  } else if (plan.split_ms && !plan.ranks.empty()) {
    const auto n = static_cast<long long>(plan.ranks.size());
    const auto batch = static_cast<long long>(plan.global_batch);
    out += format("\n  from measured steps: this split %.2f ms; no even split to compare ",
                  *plan.split_ms);
    out += batch % n != 0 ? format("(%lld samples do not divide among %lld ranks)", batch, n)
                          : format("(%lld per rank is not a candidate batch of every device, or "
                                   "does not fit one)", batch / n);
  }
  if (plan.ideal_step_ms && plan.predicted_step_ms > 0) {
    const double batch = static_cast<double>(plan.global_batch);
    out += format("\n  predicted %.1f images/s, %.1f%% of the ideal bound %.1f images/s (every "
                  "device's best throughput alone, less the exchange)",
                  1e3 * batch / plan.predicted_step_ms,
                  100.0 * *plan.ideal_step_ms / plan.predicted_step_ms,
                  1e3 * batch / *plan.ideal_step_ms);
  }
  out += "\n";
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const balancer::RankPlan& rank = plan.ranks[r];
    if (rank.batch == 0) {
      out += "  rank " + std::to_string(r) + " (" + rank.device.text() + precision_note(rank) +
             "): idle, gets no samples\n";
      continue;
    }
    int divided = 0;
    for (const balancer::PlannedKernel& k : rank.kernels) divided += k.calls.size() > 1;
    out += format("  rank %zu (%s): batch %lld, predicted %.2f ms, workspace %s, %d of %zu conv "
                  "kernels micro-batched\n",
                  r, (rank.device.text() + precision_note(rank)).c_str(),
                  static_cast<long long>(rank.batch), rank.predicted_ms,
                  common::format_mib(rank.workspace_bytes).c_str(), divided, rank.kernels.size());
    if (rank.input_rate) {
      out += format("    input: %.0f images/s (%.2f ms for its batch); %s binds\n", *rank.input_rate,
                    balancer::input_ms(*rank.input_rate, rank.batch),
                    common::name_of(balancer::kBindingNames,
                                    rank.binds.value_or(balancer::Binding::kCompute)));
    }
    if (const auto& a = rank.activations) {
      out += "    memory: activations kept " + common::format_mib(a->kept) + ", offloaded " +
             common::format_mib(a->offloaded) + ", recomputed " +
             common::format_mib(a->recomputed) + "\n";
    }
    for (const balancer::PlannedKernel& k : rank.kernels) {
      out += format("    %-12s %-14s %-40s %8.3f ms %10s\n", k.layer.c_str(), conv_kind_name(k.kind),
                    balancer::describe_calls(k.calls).c_str(), k.time_ms,
                    common::format_mib(k.workspace_bytes).c_str());
    }
  }
  return out;
}

void WireFormat<perfdb::DeviceId>::write(WireWriter& out, const perfdb::DeviceId& id) {
  out.number(id.value);
}

perfdb::DeviceId WireFormat<perfdb::DeviceId>::read(WireReader& in) {
  return {in.number<int64_t>("value")};
}

void WireFormat<SplitShares>::write(WireWriter& out, const SplitShares& split) {
  out.numbers(split.batch);
}

SplitShares WireFormat<SplitShares>::read(WireReader& in) {
  return {in.numbers<int64_t>("batch", "rank's batch")};
}

}  // namespace vtrain::worker
