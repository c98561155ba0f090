// The plan of a training job (balance.split: auto, a workspace policy, or
// --plan FILE) and the offline `vtrain balance` command.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "common/input_rate_source.h"
#include "configs/config.h"
#include "perfdb/perf_db.h"
#include "balancer/plan.h"
#include "launcher/cli.h"
#include "worker/device/backend.h"
#include "worker/comm/communicator.h"
#include "worker/engine/graph.h"
#include "worker/profile/planning.h"
#include "worker/profile/profile_peers.h"
#include "worker/train/trainer.h"

namespace vtrain::launcher {

// This rank's profiling group (worker::profile_group_colours): CPU
// processes on one host that share a core measure every item together,
// each into its own device's rows; identical GPUs split the items. `comm`
// carries the group's agreement on each item and its keep_busy barrier
// (null unless together). `cluster` is every rank's device
// (gather_device_infos). Collective.
struct ProfileGroup {
  std::unique_ptr<worker::Communicator> comm;
  worker::ProfilePeers peers;
};
ProfileGroup profile_group(worker::Communicator& comm,
                           const std::vector<worker::DeviceInfo>& cluster);

// What a batch split is solved on: the devices' step-time curves and the
// solve's options (the measured allreduce included), and the devices as
// the perf DB knows them (for their kernels' workspace plans).
struct SplitProblem {
  std::vector<balancer::DeviceProfile> profiles;
  balancer::BatchSplitOptions options;
  std::vector<worker::PlanDevice> devices;
};

// A rank's input, for an auto split that prices it (balance.input_aware).
struct RankInput {
  common::InputRateSource* source = nullptr;  // null: the split does not price input
  // The dataset's part of the rate's perf DB key (dataset_kind, dataset,
  // channels, height, width); host, workers and transform come from the
  // rank and the source.
  perfdb::InputKey key;
  std::optional<double> limit;  // this rank's VTRAIN_INPUT_RATE_LIMIT, images/s
};

// This rank's input rate for `input`'s key on its host (input.source
// non-null): the perf DB's, or measured over batches of `batch` samples
// and recorded first where the DB has none (input.limit not applied).
perfdb::InputRateMeasurement stored_input_rate(perfdb::PerfDb& db, const worker::DeviceInfo& info,
                                               const RankInput& input, int64_t batch);
// stored_input_rate on every rank, the ranks of a host one after another
// (the others wait): a rate is its pool's with the host's cores to itself,
// what its key means; sharing them is the split's to price
// (balancer::HostShare). `cluster` is every rank's device. Collective.
perfdb::InputRateMeasurement stored_input_rate_in_turn(perfdb::PerfDb& db, const worker::DeviceInfo& info,
                                                       const RankInput& input, int64_t batch,
                                                       const std::vector<worker::DeviceInfo>& cluster,
                                                       worker::Communicator& comm);

// The plan every rank follows, or nullopt when the config asks for none
// (split even/manual with undivided workspaces and no --plan). Collective:
// with --plan rank 0 reads the file; otherwise every rank profiles its device
// into the perf DB, rank 0 solves the split and the workspace plan, and the
// plan's text is broadcast. Throws ConfigError when the plan does not fit
// the model, the rank count or the batch. With `solved_on`, rank 0 also
// gets what an auto split was solved on (online re-balancing re-solves the
// same problem); its profiles are left empty otherwise. `cluster` is every
// rank's device (gather_device_infos), `precisions` every rank's
// train.precision (each rank is priced and planned in its own). With an
// auto split and `input.source`, every rank takes its input rate from the
// perf DB (measuring it there first where the DB has none for its key),
// limited to `input.limit`, and the split prices it.
std::optional<balancer::TrainingPlan> job_plan(const CliArgs& cli, const config::Config& cfg,
                                             const worker::Graph& graph,
                                             worker::Backend& backend,
                                             worker::Communicator& comm,
                                             worker::Communicator& gradient_comm,
                                             const std::vector<worker::DeviceInfo>& cluster,
                                             const std::vector<common::Precision>& precisions,
                                             const std::vector<int64_t>& fixed_split,
                                             SplitProblem* solved_on = nullptr,
                                             const RankInput& input = {});

// After a re-balance to `to.split`: every rank with samples measures its
// kernels at its new batch where the perf DB has none (freed of its
// network first: the trainer does that), then rank 0 plans every rank's
// conv kernels from the DB, as at start (balance.workspace), prints the
// plan and rewrites output.plan (when set) so that it holds the plan in
// effect; the text is broadcast and every rank returns its part.
// Collective over `comm`. nullopt on every rank, with the reason printed
// by rank 0, when rank 0 cannot plan them: every rank then keeps its
// kernels. `problem` is job_plan's `solved_on` (rank 0).
std::optional<worker::ConvPlan> replan_kernels(const config::Config& cfg, const worker::Graph& graph,
                                               worker::Backend& backend, worker::Communicator& comm,
                                               const SplitProblem& problem,
                                               const worker::SplitSwitch& to);

// `vtrain balance`: prints (and with --out writes) a plan from the perf DB.
// `input_transform` is the training input's signature
// (worker::input_transform), which a --devices [workers=N] rate is looked
// up with.
int run_balance(const CliArgs& cli, const config::Config& cfg, const worker::Graph& graph,
                const std::string& input_transform);

}  // namespace vtrain::launcher
