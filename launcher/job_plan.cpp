#include "launcher/job_plan.h"

#include "common/files.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/batch_split.h"
#include "common/machine.h"
#include "common/text.h"
#include "configs/model_graph.h"
#include "launcher/part_options.h"
#include "perfdb/perf_db.h"
#include "worker/comm/device_infos.h"
#include "worker/comm/wire.h"
#include "worker/profile/planning.h"
#include "worker/profile/profiler.h"
#include "worker/profile/step_costs.h"
#include "worker/train/trainer.h"

namespace vtrain::launcher {
namespace {
// Timed batches of an input rate measurement; the median is kept.
constexpr int kInputRateBatches = 7;

// The job's run settings as a rank computing in `precision` has them.
common::ComputeSettings in_precision(const config::Config& cfg, common::Precision precision) {
  common::ComputeSettings settings = config::compute_settings(cfg);
  settings.precision = precision;
  return settings;
}
}  // namespace

perfdb::InputRateMeasurement stored_input_rate(perfdb::PerfDb& db, const worker::DeviceInfo& info,
                                               const RankInput& input, int64_t batch) {
  perfdb::InputKey key = input.key;
  key.host = worker::perfdb_device(info).host;
  key.workers = input.source->workers();
  key.transform = input.source->transform();
  if (std::optional<perfdb::InputRateMeasurement> known = db.find_input_rate(key)) return *known;
  perfdb::InputRateMeasurement m;
  m.key = key;
  m.batch = std::max<int64_t>(batch, 1);
  m.images_per_second = input.source->measure_images_per_second(m.batch, kInputRateBatches);
  m.host_cores = std::max(1, common::hardware_threads());
  db.record_input_rate(m);
  return m;
}

perfdb::InputRateMeasurement stored_input_rate_in_turn(perfdb::PerfDb& db, const worker::DeviceInfo& info,
                                                       const RankInput& input, int64_t batch,
                                                       const std::vector<worker::DeviceInfo>& cluster,
                                                       worker::Communicator& comm) {
  int turn = 0, turns = 0;  // this rank's turn on its host, and the most ranks a host has
  std::map<std::string, int> seen;  // ranks met so far per host
  for (size_t r = 0; r < cluster.size(); ++r) {
    const int at = seen[cluster[r].host]++;
    turns = std::max(turns, at + 1);
    if (static_cast<int>(r) == comm.rank()) turn = at;
  }
  perfdb::InputRateMeasurement mine;
  for (int t = 0; t < turns; ++t) {
    if (t == turn) mine = stored_input_rate(db, info, input, batch);
    comm.barrier();
  }
  return mine;
}

namespace {

// `vtrain balance --fronts`: every kernel's Pareto front, one row a point.
void write_fronts(const std::string& path, const std::vector<worker::FrontPoint>& fronts,
                  const balancer::TrainingPlan& plan) {
  std::string csv = "rank,device,kernel,workspace_bytes,time_ms,calls,chosen\n";
  for (const worker::FrontPoint& p : fronts) {
    std::string device = plan.ranks.at(static_cast<size_t>(p.rank)).device.text();
    std::replace(device.begin(), device.end(), '"', '\'');
    char time[32];
    std::snprintf(time, sizeof time, "%.6g", p.time_ms);
    csv += std::to_string(p.rank) + ",\"" + device + "\"," + p.kernel + "," +
           std::to_string(p.workspace_bytes) + "," + time + ",\"" + p.calls + "\"," +
           (p.chosen ? "1" : "0") + "\n";
  }
  common::write_file_whole(path, csv, "Pareto fronts");
}

// Prints the plan and, with a path, writes it there (whole or not at all).
void print_and_save(const balancer::TrainingPlan& plan, const std::string& path) {
  std::fputs(worker::describe_plan(plan).c_str(), stdout);
  if (path.empty()) return;
  balancer::save_plan(plan, path);
  std::printf("plan: wrote %s\n", path.c_str());
}

// `text` cut at every `separator` outside parentheses and brackets: device
// names such as "AMD EPYC (cpus 0,1)" hold commas, and so may an entry's
// "[input=...]".
std::vector<std::string> split_outside_parentheses(const std::string& text, char separator) {
  std::vector<std::string> out(1);
  int depth = 0;
  for (char c : text) {
    depth += c == '(' || c == '[' ? 1 : (c == ')' || c == ']') && depth > 0 ? -1 : 0;
    if (c == separator && depth == 0) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

// `names` in order, each once.
std::vector<std::string> distinct(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  return out;
}

// "'a', 'b'", or "none".
std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out.empty() ? "none" : out;
}

// The device a --devices entry names, of the DB's `known` (ordered by id):
// by its label (perfdb::device_label), or by its bare name where all the
// devices of that name share one label (a GPU's label is its name); the
// newest registration of it. An unknown name, or a bare CPU name that
// devices of several thread counts share, is a usage error listing the
// labels to choose from.
perfdb::DeviceRecord device_named(const std::vector<perfdb::DeviceRecord>& known,
                                  const std::string& name, const std::string& db) {
  std::vector<std::string> labels, labels_of_name;
  const perfdb::DeviceRecord* by_label = nullptr;
  const perfdb::DeviceRecord* by_name = nullptr;
  for (const perfdb::DeviceRecord& r : known) {
    const std::string label = perfdb::device_label(r.device).text();
    labels.push_back(label);
    if (label == name) by_label = &r;
    if (r.device.name == name) {
      by_name = &r;
      labels_of_name.push_back(label);
    }
  }
  if (by_label) return *by_label;
  const std::vector<std::string> candidates = distinct(labels_of_name);
  if (candidates.size() == 1) return *by_name;
  if (candidates.size() > 1) {
    throw UsageError("--devices: '" + name + "' is ambiguous in " + db +
                     ": devices of other thread counts share that name (candidates: " +
                     quoted_list(candidates) + "); give one of those");
  }
  throw UsageError("--devices: no device named '" + name + "' in " + db +
                   " (known: " + quoted_list(distinct(labels)) + ")");
}

// One --devices entry: a device name, and optionally what its input
// delivers for the what-if: "NAME[input=IMAGES_PER_S]" or
// "NAME[workers=N]" (the perf DB's rate per worker on the device's host,
// linear in workers up to the host's cores).
struct DeviceSpec {
  std::string name;
  std::optional<double> input_rate;
  std::optional<int> workers;
};

DeviceSpec parse_device_spec(const std::string& entry) {
  DeviceSpec spec{entry, std::nullopt, std::nullopt};
  const size_t open = entry.rfind('[');
  if (open == std::string::npos || entry.back() != ']') {
    if (entry.find_first_of("[]") != std::string::npos) {
      throw UsageError("--devices: entry '" + entry + "': a '[' or ']' outside NAME[input=IMAGES_PER_S] or "
                       "NAME[workers=N]");
    }
    return spec;
  }
  spec.name = trim(entry.substr(0, open));
  const std::string attribute = entry.substr(open + 1, entry.size() - open - 2);
  const size_t eq = attribute.find('=');
  const std::string key = trim(attribute.substr(0, eq));
  const std::string value = eq == std::string::npos ? "" : trim(attribute.substr(eq + 1));
  char* end = nullptr;
  if (key == "input") {
    const double rate = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(rate > 0) || !std::isfinite(rate)) {
      throw UsageError("--devices: entry '" + entry + "': input= expects a number of images/s > 0, got '" +
                       value + "'");
    }
    spec.input_rate = rate;
  } else if (key == "workers") {
    const long n = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || n < 1 || n > 1 << 20) {
      throw UsageError("--devices: entry '" + entry + "': workers= expects an integer >= 1, got '" + value + "'");
    }
    spec.workers = static_cast<int>(n);
  } else {
    throw UsageError("--devices: entry '" + entry + "': unknown attribute '" + key +
                     "' (known: input=IMAGES_PER_S, workers=N)");
  }
  if (spec.name.empty()) throw UsageError("--devices: entry '" + entry + "' names no device");
  return spec;
}

// The input rate of `workers` decoding workers on `host` for the dataset
// `dataset` (its kind and file) through its transform: the perf DB's
// measured rate per worker (its row with the most workers), times the
// workers up to the host's cores. A usage error where the DB has no rate
// of that dataset and transform there.
double scaled_input_rate(perfdb::PerfDb& db, const std::string& host, const perfdb::InputKey& dataset,
                         int workers, const std::string& entry, const std::string& path) {
  std::optional<perfdb::InputRateMeasurement> best;
  for (const perfdb::InputRateMeasurement& m : db.input_rates(host)) {
    if (m.key.dataset_kind != dataset.dataset_kind || m.key.dataset != dataset.dataset ||
        m.key.transform != dataset.transform) {
      continue;
    }
    if (!best || m.key.workers > best->key.workers) best = m;
  }
  if (!best) {
    throw UsageError("--devices: entry '" + entry + "': " + path + " has no input rate of this dataset (" +
                     dataset.dataset_kind + (dataset.dataset.empty() ? "" : " " + dataset.dataset) +
                     ", transform " + dataset.transform + ") on host '" + host + "' to scale (train there with balance.split: auto first, or give "
                     "[input=IMAGES_PER_S])");
  }
  const int usable = std::min(workers, best->host_cores);
  return best->images_per_second / best->key.workers * usable;
}

// A --devices entry's device (its [attribute] taken off by
// parse_device_spec): a name or label, and after an '@' the
// precision it computes in ("Tesla V100-SXM2-16GB@fp16"; none: the
// config's train.precision). An '@' followed by no precision name is part
// of the name.
struct DeviceEntry {
  std::string name;
  std::optional<common::Precision> precision;
};
DeviceEntry device_entry(const std::string& text) {
  const size_t at = text.rfind('@');
  if (at == std::string::npos) return {text, std::nullopt};
  const std::string suffix = trim(text.substr(at + 1));
  const auto precision = common::find_named(common::kPrecisionNames, suffix);
  if (!precision) {
    if (suffix.find_first_of(" ()") == std::string::npos && !suffix.empty()) {
      throw UsageError("--devices: '" + text + "': unknown precision '" + suffix +
                       "' after '@' (known: " + common::join(common::names_of(common::kPrecisionNames)) +
                       ")");
    }
    return {text, std::nullopt};
  }
  return {trim(text.substr(0, at)), precision};
}

// Per-rank batch sizes the profiler measures for a split: around B / ranks,
// from a quarter to twice it, on the granularity.
std::vector<int64_t> candidate_batches(const config::Config& cfg, int ranks) {
  if (!cfg.profile.batches.empty()) return cfg.profile.batches;
  const int64_t g = cfg.balance.granularity;
  const int64_t per = (cfg.train.batch + ranks - 1) / ranks;
  std::set<int64_t> sizes;
  for (double f : {0.25, 0.5, 1.0, 1.5, 2.0}) {
    int64_t b = static_cast<int64_t>(f * static_cast<double>(per) / static_cast<double>(g) + 0.5) * g;
    b = std::clamp<int64_t>(b, g, cfg.train.batch);
    sizes.insert(b);
  }
  return {sizes.begin(), sizes.end()};
}


// What a rank measures at a share that was not a profiled batch: its
// kernels (and layer costs) there, alone: only the ranks whose share is new
// measure.
worker::ProfileOptions kernels_alone_at(worker::ProfileOptions po, int64_t batch) {
  po.batches = {batch};
  po.steps = false;
  po.peers = {};
  return po;
}

// Every rank's input as the split prices it, on every rank (rank order).
struct RankInputs {
  std::vector<double> rates;             // images/s, VTRAIN_INPUT_RATE_LIMIT applied; 0 = not priced
  std::vector<double> cpu_ms_per_image;  // CPU time its decoding takes per image (the unlimited
                                         // rate: a throttle takes no core)
  std::vector<double> cores;             // cores of its host, or the CPUs it is pinned to
};

// Collective (stored_input_rate_in_turn where `input` has a source).
RankInputs rank_inputs(perfdb::PerfDb& db, const worker::DeviceInfo& info, const RankInput& input,
                       int64_t batch, const std::vector<worker::DeviceInfo>& cluster,
                       worker::Communicator& comm) {
  const auto n = static_cast<size_t>(comm.size()), me = static_cast<size_t>(comm.rank());
  std::vector<double> slots(3 * n, 0.0);
  if (input.source) {
    const perfdb::InputRateMeasurement m = stored_input_rate_in_turn(db, info, input, batch, cluster, comm);
    slots[me] = input.limit ? std::min(m.images_per_second, *input.limit) : m.images_per_second;
    const int busy = std::min(m.key.workers, m.host_cores);  // the decoding threads' cores
    slots[n + me] = 1e3 * busy / m.images_per_second;
  }
  slots[2 * n + me] =
      info.cpus.empty() ? common::hardware_threads() : static_cast<double>(info.cpus.size());
  comm.allreduce_sum(slots);
  RankInputs out{{slots.begin(), slots.begin() + static_cast<long>(n)},
                 {slots.begin() + static_cast<long>(n), slots.begin() + static_cast<long>(2 * n)},
                 {slots.begin() + static_cast<long>(2 * n), slots.end()}};
  if (comm.rank() == 0 && input.source) {
    std::string text;
    for (size_t r = 0; r < n; ++r) {
      text += common::format("%s%zu %.0f", text.empty() ? "" : ", ", r, out.rates[r]);
    }
    std::printf("profile: input rates (images/s, VTRAIN_INPUT_RATE_LIMIT applied) per rank: %s\n",
                text.c_str());
    std::fflush(stdout);
  }
  return out;
}

// Which cores each rank's compute and decoding share (balancer::HostShare):
// CPU ranks of one host, or pinned to the same CPUs, share them; a GPU
// rank computes off them. The k ranks of a group were profiled together,
// so each one's compute ran on at most cores / k of them.
std::vector<balancer::HostShare> host_shares(const std::vector<worker::DeviceInfo>& cluster,
                                             const RankInputs& inputs) {
  std::vector<std::string> groups;
  std::vector<int> members;
  std::vector<balancer::HostShare> out(cluster.size());
  for (size_t r = 0; r < cluster.size(); ++r) {
    const worker::DeviceInfo& d = cluster[r];
    if (d.backend != "cpu") continue;
    std::string group = d.host;
    for (int cpu : d.cpus) group += " " + std::to_string(cpu);
    const auto at = std::find(groups.begin(), groups.end(), group);
    out[r].host = static_cast<int>(at - groups.begin());
    if (at == groups.end()) {
      groups.push_back(group);
      members.push_back(0);
    }
    ++members[static_cast<size_t>(out[r].host)];
  }
  for (size_t r = 0; r < cluster.size(); ++r) {
    if (out[r].host < 0) continue;
    out[r].cores = inputs.cores[r];
    const int sharing = members[static_cast<size_t>(out[r].host)];
    out[r].compute_cores = std::min(static_cast<double>(cluster[r].threads), inputs.cores[r] / sharing);
    out[r].input_cpu_ms_per_image = inputs.cpu_ms_per_image[r];
  }
  return out;
}

// Training: profile in place, solve on rank 0. Returns the plan's text on
// rank 0, "" elsewhere.
std::string solve_job_plan(const config::Config& cfg, const worker::Graph& graph,
                           worker::Backend& backend, worker::Communicator& comm,
                           worker::Communicator& gradient_comm,
                           const std::vector<worker::DeviceInfo>& cluster,
                           const std::vector<common::Precision>& precisions,
                           const std::vector<int64_t>& fixed_split,
                           SplitProblem* solved_on, const RankInput& input) {
  const bool balance = cfg.balance.split == balancer::SplitMode::kAuto;
  const worker::DeviceInfo info = backend.device_info();
  perfdb::PerfDb db(cfg.profile.db);
  const perfdb::DeviceId id = db.upsert_device(worker::perfdb_device(info));

  worker::ProfileOptions po = profile_options(cfg, graph, backend);
  po.batches = balance ? candidate_batches(cfg, comm.size())
                       : std::vector<int64_t>{fixed_split[comm.rank()]};
  po.batches.erase(std::remove(po.batches.begin(), po.batches.end(), 0), po.batches.end());
  po.steps = balance;
  const ProfileGroup group = profile_group(comm, cluster);
  // Without an auto split each rank measures its own share, the ranks of a
  // group other batches (or none): they cannot take the same items in turn.
  if (balance) po.peers = group.peers;
  if (!po.batches.empty()) {
    const worker::ProfileReport r = worker::profile(graph, backend, db, id, po);
    if (comm.rank() == 0) {
      std::printf("profile: batches %s: %lld kernel items measured, %lld cached; %lld steps "
                  "measured%s, %lld cached (%.1f s, rank 0)\n",
                  balancer::join_batches(po.batches).c_str(), static_cast<long long>(r.kernel_measured),
                  static_cast<long long>(r.kernel_cached), static_cast<long long>(r.step_measured),
                  worker::copied_ahead_note(r).c_str(), static_cast<long long>(r.step_cached),
                  r.seconds);
      std::fflush(stdout);
    }
  }
  comm.barrier();

  // The gradient exchange every step pays (rank 0's measurement of the
  // collective), added to every device's step time.
  double allreduce_ms = 0;
  if (balance && cfg.balance.allreduce == balancer::AllreduceCost::kMeasure && comm.size() > 1) {
    allreduce_ms = worker::measure_allreduce_ms(backend, gradient_comm, graph.parameter_count(), po);
    if (comm.rank() == 0) {
      std::printf("profile: allreduce of %lld gradients: %.2f ms (balance.allreduce: measure)\n",
                  static_cast<long long>(graph.parameter_count()), allreduce_ms);
      std::fflush(stdout);
    }
  }

  // Every rank's input rate (also under balance.input_aware: false, which
  // chooses the split without it: the plan then says what binds).
  const size_t ranks = cluster.size();
  const int64_t even_share = (cfg.train.batch + comm.size() - 1) / comm.size();
  const RankInputs inputs =
      balance ? rank_inputs(db, info, input, even_share, cluster, comm)
              : RankInputs{std::vector<double>(ranks, 0.0), std::vector<double>(ranks, 0.0),
                           std::vector<double>(ranks, 1.0)};
  const std::vector<balancer::HostShare> shares_of_cores = host_shares(cluster, inputs);

  // Rank 0 learns every rank's row in the perf DB.
  const std::vector<perfdb::DeviceId> ids = worker::gather_messages(comm, id, 0);
  std::vector<worker::PlanDevice> devices;
  worker::SplitShares shares;
  balancer::BatchSplit split;
  if (comm.rank() == 0) {
    const bool mixed = !std::all_of(precisions.begin(), precisions.end(),
                                    [&](common::Precision p) { return p == precisions.front(); });
    for (size_t r = 0; r < cluster.size(); ++r) {
      worker::PlanDevice d;
      d.id = ids[r];
      d.memory_bytes = cluster[r].memory_bytes;
      d.layout = worker::layout_rule_for(worker::parse_backend_kind(cluster[r].backend),
                                         in_precision(cfg, precisions[r]));
      d.label = worker::device_label(cluster[r]);
      d.input_rate = inputs.rates[r];
      d.host_share = shares_of_cores[r];
      if (mixed) d.precision = precisions[r];
      devices.push_back(std::move(d));
    }
    if (balance) {
      SplitProblem problem{worker::device_profiles(graph, config::compute_settings(cfg), db,
                                                   devices, step_pricing(cfg)),
                           split_options(cfg), devices};
      // Every step pays the exchange once, idle ranks taking part: a cost
      // of the split, not of a device (a device sitting out saves none).
      problem.options.allreduce_ms = allreduce_ms;
      split = balancer::plan_batch_split(problem.profiles, cfg.train.batch, problem.options);
      if (solved_on) *solved_on = std::move(problem);
    } else {
      split.batch = fixed_split;
    }
    shares.batch = split.batch;
  }
  worker::broadcast_message(comm, shares, 0);
  // A rank whose share was not a profiled batch measures its kernels there.
  const int64_t my_batch = shares.batch.at(static_cast<size_t>(comm.rank()));
  if (my_batch > 0 &&
      std::find(po.batches.begin(), po.batches.end(), my_batch) == po.batches.end()) {
    worker::profile(graph, backend, db, id, kernels_alone_at(po, my_batch));
  }
  comm.barrier();
  if (comm.rank() != 0) return "";
  // Undivided kernels take the fastest algorithm whose workspace fits the
  // limit, as plain cuDNN with a workspace limit would.
  balancer::TrainingPlan plan = worker::plan_workspaces(graph, config::compute_settings(cfg), db,
                                                        devices, split, step_pricing(cfg));
  plan.memory_policy = memory::policy_name(cfg.memory.policy);
  return balancer::plan_to_yaml(plan);
}

}  // namespace

ProfileGroup profile_group(worker::Communicator& comm,
                           const std::vector<worker::DeviceInfo>& cluster) {
  const std::vector<int> colours = worker::profile_group_colours(cluster);
  const int mine = colours[static_cast<size_t>(comm.rank())];
  ProfileGroup group;
  group.peers.count = 0;
  for (int r = 0; r < static_cast<int>(cluster.size()); ++r) {
    if (colours[static_cast<size_t>(r)] != mine) continue;
    if (r < comm.rank()) ++group.peers.index;
    ++group.peers.count;
    group.peers.ranks.push_back(r);
  }
  group.peers.together =
      cluster[static_cast<size_t>(comm.rank())].backend == "cpu" && group.peers.count > 1;
  if (comm.size() > 1) {
    // Every rank takes part in the split, also one in a group of one.
    std::unique_ptr<worker::Communicator> members = worker::make_mpi_subcommunicator(mine);
    if (group.peers.together) {
      worker::Communicator* c = members.get();
      group.peers.any = [c](bool mine_needs) {
        std::vector<double> v{mine_needs ? 1.0 : 0.0};
        c->allreduce_sum(v);
        return v[0] > 0;
      };
      group.peers.keep_busy = [c](const std::function<void()>& work) { c->barrier_while(work); };
      group.peers.all_texts = [c](const std::string& text) {
        return worker::all_gather_texts(*c, text);
      };
      group.comm = std::move(members);
    }
  }
  return group;
}

std::optional<balancer::TrainingPlan> job_plan(const CliArgs& cli, const config::Config& cfg,
                                             const worker::Graph& graph,
                                             worker::Backend& backend,
                                             worker::Communicator& comm,
                                             worker::Communicator& gradient_comm,
                                             const std::vector<worker::DeviceInfo>& cluster,
                                             const std::vector<common::Precision>& precisions,
                                             const std::vector<int64_t>& fixed_split,
                                             SplitProblem* solved_on, const RankInput& input) {
  std::string text, origin;
  if (!cli.plan.empty()) {
    origin = cli.plan;
    if (comm.rank() == 0) text = balancer::plan_to_yaml(balancer::load_plan(cli.plan));
  } else if (cfg.balance.split == balancer::SplitMode::kAuto ||
             cfg.balance.workspace != balancer::WorkspacePolicy::kUndivided) {
    origin = "the plan solved at start";
    text = solve_job_plan(cfg, graph, backend, comm, gradient_comm, cluster, precisions,
                          fixed_split, solved_on, input);
  } else {
    return std::nullopt;
  }
  comm.broadcast(text, 0);
  balancer::TrainingPlan plan = balancer::parse_plan(text, origin);
  if (auto why =
          worker::plan_mismatch(plan, graph, config::compute_settings(cfg), comm.size(),
                                cfg.train.batch, cfg.memory.policy)) {
    throw config::ConfigError(origin + ": " + *why);
  }
  if (auto why = worker::plan_precision_mismatch(plan, comm.rank(), cfg.compute.precision)) {
    throw config::ConfigError(origin + ": " + *why);
  }
  if (auto why = worker::plan_device_mismatch(plan, comm.rank(),
                                              worker::device_label(backend.device_info()))) {
    throw config::ConfigError(origin + ": " + *why);
  }
  if (comm.rank() == 0) {
    print_and_save(plan, cli.plan.empty() ? cfg.output.plan : "");
    std::fflush(stdout);
  }
  return plan;
}

std::optional<worker::ConvPlan> replan_kernels(const config::Config& cfg, const worker::Graph& graph,
                                               worker::Backend& backend, worker::Communicator& comm,
                                               const SplitProblem& problem,
                                               const worker::SplitSwitch& to) {
  // A share the DB has no kernel measurements at is measured first (what
  // the DB holds already is not measured again). A rank that cannot (its
  // device's memory, the DB) says why, and every rank keeps its kernels.
  const int64_t my_batch = to.split.at(static_cast<size_t>(comm.rank()));
  std::vector<double> failed{0.0};
  if (my_batch > 0) {
    try {
      perfdb::PerfDb db(cfg.profile.db);
      const perfdb::DeviceId id = db.upsert_device(worker::perfdb_device(backend.device_info()));
      const worker::ProfileReport r = worker::profile(
          graph, backend, db, id, kernels_alone_at(profile_options(cfg, graph, backend), my_batch));
      if (r.kernel_measured > 0) {
        std::printf("rebalance: rank %d measured %lld kernel items at its new batch %lld (%.1f s)\n",
                    comm.rank(), static_cast<long long>(r.kernel_measured),
                    static_cast<long long>(my_batch), r.seconds);
      }
    } catch (const std::exception& e) {
      std::printf("rebalance: rank %d could not measure its kernels at its new batch %lld: %s\n",
                  comm.rank(), static_cast<long long>(my_batch), e.what());
      failed[0] = 1.0;
    }
    std::fflush(stdout);
  }
  comm.allreduce_sum(failed);  // also: rank 0 plans once every measurement is in the DB
  if (failed[0] > 0) {
    if (comm.rank() == 0) {
      std::printf("rebalance: the conv kernels stay as planned before the switch (%g rank(s) "
                  "could not measure their new batch)\n", failed[0]);
      std::fflush(stdout);
    }
    return std::nullopt;
  }
  std::string text;
  if (comm.rank() == 0) {
    try {
      perfdb::PerfDb db(cfg.profile.db, {.mode = perfdb::OpenMode::kReadOnly});
      balancer::BatchSplit split;
      split.batch = to.split;
      split.time_ms = to.rank_ms;
      split.step_time_ms = to.predicted_ms;
      balancer::TrainingPlan plan =
          worker::plan_workspaces(graph, config::compute_settings(cfg), db, problem.devices,
                                  split, step_pricing(cfg));
      plan.memory_policy = memory::policy_name(cfg.memory.policy);
      text = balancer::plan_to_yaml(plan);
      print_and_save(plan, cfg.output.plan);
    } catch (const std::exception& e) {
      std::printf("rebalance: the conv kernels stay as planned before the switch (%s)\n", e.what());
      text.clear();
    }
    std::fflush(stdout);
  }
  comm.broadcast(text, 0);
  if (text.empty()) return std::nullopt;
  const balancer::TrainingPlan plan = balancer::parse_plan(text, "the re-balanced plan");
  const balancer::RankPlan& mine = plan.ranks.at(static_cast<size_t>(comm.rank()));
  return worker::ConvPlan{worker::conv_executions(mine), mine.workspace_bytes};
}

int run_balance(const CliArgs& cli, const config::Config& cfg, const worker::Graph& graph,
                const std::string& input_transform) {
  // Offline planning only reads: the file is neither created nor changed.
  perfdb::PerfDb db(cli.db, {.mode = perfdb::OpenMode::kReadOnly});
  std::vector<worker::PlanDevice> devices;
  auto add = [&](const perfdb::DeviceRecord& rec, std::optional<common::Precision> precision) {
    worker::PlanDevice d;
    d.id = rec.id;
    d.memory_bytes = rec.device.memory_bytes;
    d.layout = worker::layout_rule_for(worker::parse_backend_kind(rec.device.backend),
                                       in_precision(cfg, precision.value_or(cfg.compute.precision)));
    d.label = perfdb::device_label(rec.device);  // as the rank that runs on it will name its device
    d.precision = precision;
    devices.push_back(std::move(d));
  };
  if (!cli.devices.empty()) {
    const std::vector<perfdb::DeviceRecord> known = db.devices();
    for (const std::string& raw : split_outside_parentheses(cli.devices, ',')) {
      const DeviceSpec spec = parse_device_spec(trim(raw));
      const DeviceEntry entry = device_entry(spec.name);
      const perfdb::DeviceRecord record = device_named(known, entry.name, cli.db);
      add(record, entry.precision);
      if (spec.input_rate) devices.back().input_rate = *spec.input_rate;
      if (spec.workers) {
        perfdb::InputKey dataset = input_key(cfg, cfg.data.shape);
        dataset.transform = input_transform;
        devices.back().input_rate =
            scaled_input_rate(db, record.device.host, dataset, *spec.workers, trim(raw), cli.db);
      }
    }
  } else {
    for (const perfdb::DeviceRecord& r : db.devices()) {
      const perfdb::ModelKey model = worker::model_key(graph, config::compute_settings(cfg));
      if (!worker::profiled_steps(db, r.id, model, cfg.memory.policy, r.device.memory_bytes)
               .empty()) {
        add(r, std::nullopt);
      }
    }
    if (devices.empty()) {
      throw std::runtime_error(cli.db + " has no step measurements of this model under "
                               "memory.policy " + memory::policy_name(cfg.memory.policy) +
                               " (run `vtrain profile` with this config first)");
    }
  }
  const int64_t batch = cli.batch > 0 ? cli.batch : cfg.train.batch;
  // Offline no device can profile an interpolated batch's kernels (training
  // does, on the rank that gets it): every rank's batch is a profiled one.
  balancer::BatchSplitOptions options = split_options(cfg);
  options.candidates = balancer::CandidateSizes::kMeasured;
  options.allreduce_ms = cli.allreduce_ms;  // once per step (see solve_job_plan)
  // The config's pricing, with --policy and --workspace where given.
  worker::StepPricing pricing = step_pricing(cfg);
  if (cli.policy) pricing.workspace.policy = *cli.policy;
  if (!cli.workspace.empty()) pricing.workspace.limit = config::parse_size(cli.workspace);
  const common::ComputeSettings settings = config::compute_settings(cfg);
  const balancer::BatchSplit split =
      worker::plan_split(graph, settings, db, devices, batch, options, pricing);
  std::vector<worker::FrontPoint> fronts;
  balancer::TrainingPlan plan = worker::plan_workspaces(graph, settings, db, devices, split,
                                                        pricing,
                                                        cli.fronts.empty() ? nullptr : &fronts);
  plan.memory_policy = memory::policy_name(cfg.memory.policy);
  print_and_save(plan, cli.out);
  if (!cli.fronts.empty()) {
    write_fronts(cli.fronts, fronts, plan);
    std::printf("fronts: wrote %s\n", cli.fronts.c_str());
  }
  return kExitOk;
}

}  // namespace vtrain::launcher
