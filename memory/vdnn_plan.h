// The vDNN memory schedule (Rhu et al., "vDNN", Sec. III): from the graph's
// dataflow, which tensor is allocated, released, offloaded to host memory
// and prefetched back, and when, for one training step and for one
// evaluation (forward-only) pass.
//
// Pure functions of a MemoryModel, so that the engine, the simulator that
// decides what fits, and the tests all use one schedule. The engine executes
// the events in order; the simulator replays their allocations and frees.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/name_table.h"

namespace vtrain::memory {

// memory.policy in the config.
enum class Policy {
  kNone,  // baseline: every tensor allocated once for the whole network
  kAll,   // layer-wise allocation; offload the input X of every layer
  kConv,  // layer-wise allocation; offload the input X of conv layers only
  kDyn,   // choose offloading and conv algorithms by simulated profiling passes (Sec. III-C)
  // Per-tensor plans (memory/planner.h): keep, offload or recompute each
  // activation, chosen on the timed simulator under the capacity.
  kAuto,          // the least simulated step time that fits (the planner vtrain ships)
  kMemonger,      // Chen et al.: sqrt(N) segments, recompute only
  kSuperNeurons,  // Wang et al.: offload conv outputs, recompute the cheap layers
  kTflms,         // Le et al.: offload the N largest, the fewest that fit
};
inline constexpr auto kPolicyNames = std::to_array<common::Named<Policy>>(
    {{Policy::kNone, "none"}, {Policy::kAll, "all"}, {Policy::kConv, "conv"},
     {Policy::kDyn, "dyn"}, {Policy::kAuto, "auto"}, {Policy::kMemonger, "memonger"},
     {Policy::kSuperNeurons, "superneurons"}, {Policy::kTflms, "tflms"}});
inline const char* policy_name(Policy policy) { return common::name_of(kPolicyNames, policy); }
// Throws MemoryError listing the known names.
Policy parse_policy(const std::string& name);
// Whether `policy` chooses per activation (memory/planner.h): auto,
// memonger, superneurons, tflms.
inline bool plans_per_tensor(Policy policy) {
  return policy == Policy::kAuto || policy == Policy::kMemonger ||
         policy == Policy::kSuperNeurons || policy == Policy::kTflms;
}
// Whether what `policy` runs depends on the capacity it plans for (dyn and
// the per-tensor policies); none, all and conv run the same everywhere.
inline bool plans_for_capacity(Policy policy) {
  return policy == Policy::kDyn || plans_per_tensor(policy);
}

// What offloading a layer-wise schedule does (the resolved form of a policy).
enum class Offload { kNone, kConv, kAll };
const char* offload_name(Offload offload);  // "none", "conv", "all"

// What a layer-wise schedule does with one activation Y between its last
// forward use and its first backward use.
enum class TensorAction {
  kKeep,       // stays on the device
  kOffload,    // copied to the host after its last forward consumer, prefetched back
  kRecompute,  // released after its last forward consumer, recomputed in backward by
               // re-running the layers that produce it from what is still on the device
};
inline constexpr auto kTensorActionNames = std::to_array<common::Named<TensorAction>>(
    {{TensorAction::kKeep, "keep"},
     {TensorAction::kOffload, "offload"},
     {TensorAction::kRecompute, "recompute"}});

// One graph node as the memory part sees it. Every node produces one tensor
// Y (named after it) and, unless it is the input, its gradient dY.
struct LayerNode {
  std::string name;
  bool is_input = false;        // the data: allocated once (the caller writes it), never
                                // offloaded, no gradient
  bool is_conv = false;         // vDNN_conv offloads only the inputs of these; the prefetch
                                // window (Fig. 10) ends at them
  bool cheap = false;           // recomputing it costs little next to its output (an
                                // activation, pooling, batch norm, add, concat): what
                                // SuperNeurons-style plans recompute
  std::vector<int> inputs;      // producers (node indices below this one), in order
  size_t output_bytes = 0;      // Y and dY
  size_t state_bytes = 0;       // kept from forward to backward (pooling indices, BN stats)
  size_t forward_workspace = 0;
  size_t backward_workspace = 0;
  bool backward_reads_inputs = false;  // backward reads X (conv, pool, fc, batch norm)
  bool backward_reads_output = false;  // backward reads Y (relu, pool)
  bool backward_accumulates = true;    // can add into an input gradient another consumer
                                       // already wrote; else it writes a scratch tensor
  bool backward_needs_input_grad = false;  // computes dX even for the data input (into
                                           // scratch), as batch norm must for its parameters
};

// A tensor outside the graph's activations that lives as long as the network
// (parameters, gradients, labels).
struct PersistentTensor {
  std::string name;
  size_t bytes = 0;
};

struct MemoryModel {
  std::vector<LayerNode> layers;  // topological order; layers[0] is the input; last = logits
  std::vector<PersistentTensor> persistent;
};

// Throws MemoryError naming the layer for an input index that is not below it.
void validate(const MemoryModel& model);

enum class TensorKind {
  kPersistent,  // model.persistent[layer]
  kOutput,      // Y of a layer
  kGradient,    // dY of a layer
  kState,       // a layer's forward-to-backward state
  kWorkspace,   // a layer's forward workspace; layer -1: the one shared by every call
  kBackwardWorkspace,  // a layer's backward workspace
  kScratch,     // a layer's gradient scratch; layer -1: the one shared by all layers
};
inline constexpr int kTensorKindCount = static_cast<int>(TensorKind::kScratch) + 1;

struct TensorId {
  TensorKind kind = TensorKind::kOutput;
  int layer = 0;
  bool operator==(const TensorId&) const = default;
};

enum class Op {
  kAlloc,        // allocate the tensor on the device
  kFree,         // release its device memory
  kOffload,      // allocate host memory and copy device -> host on the memory stream
  kPrefetch,     // allocate device memory and copy host -> device on the memory stream
  kSyncMemory,   // compute waits for everything issued to the memory stream
  kFreeHost,     // release the tensor's host copy
  kForward,      // run the layer's forward
  kLoss,         // softmax cross-entropy on the logits (writes the logits' dY)
  kBackward,     // run the layer's backward
  kRecompute,    // run the layer's forward again during backward (its Y was released):
                 // training mode, but no running statistics are updated
};

// One entry of a schedule: a memory operation or a layer call, in the order
// the network executes them (not a point in a stream's work: that is the
// backend's Event).
struct ScheduleEvent {
  Op op = Op::kForward;
  TensorId tensor;  // for kForward / kLoss / kBackward: {kOutput, the layer}
};

struct Schedule {
  bool layer_wise = false;             // false: the network-wide baseline (policy none)
  Offload offload = Offload::kNone;
  std::vector<TensorId> persistent;    // allocated once, in this order, before any step
  std::vector<ScheduleEvent> train;            // one training step
  std::vector<ScheduleEvent> evaluate;         // one forward pass in inference mode
  std::vector<TensorAction> actions;   // per layer: what happens to its Y (all kKeep for
                                       // the network-wide schedule)
  std::vector<int> offload_layer;      // per layer: where its Y is offloaded (-1: never)
  std::vector<std::vector<int>> prefetch_at;  // per layer: layers whose offloaded inputs its
                                              // backward prefetches by the window rule
};

// Bytes of a tensor (shared workspace / scratch: the largest of any layer).
size_t tensor_bytes(const MemoryModel& model, const TensorId& id);
// "conv2.y", "conv2.dy", "conv2.state", "conv2.workspace", "workspace", "params", ...
std::string tensor_name(const MemoryModel& model, const TensorId& id);

// The network-wide baseline (policy none): everything persistent, one
// shared workspace and scratch; the step schedules only compute.
Schedule network_wide_schedule(const MemoryModel& model);

// vDNN's layer-wise schedule (Sec. III-A, III-B):
//  forward of layer i: allocate Y(i) (+ state, workspace); offload each input
//    X whose last forward consumer is i, if offloading applies to i and some
//    backward reads X, overlapped with i's forward; sync the memory stream at
//    the end of the layer and free the offloaded X; free the workspace and
//    every input nothing reads any more;
//  backward of layer i: prefetch on demand what i reads and is still on the
//    host (sync); prefetch the inputs offloaded at find_prefetch_layer(i),
//    overlapped with i's backward; allocate the input gradients i writes
//    first; after i: sync, free host copies, dY(i), state, workspace,
//    scratch, and every Y whose last backward reader was i.
Schedule layer_wise_schedule(const MemoryModel& model, Offload offload);

// Whether an action other than kKeep may apply to layer p's Y: not the data,
// not the logits, not empty, and some backward reads it (else the
// layer-wise schedule releases it in forward anyway).
std::vector<bool> plannable(const MemoryModel& model);

// The actions vDNN's offload policy takes: kOffload for every plannable Y
// whose last forward consumer the policy covers (conv: a conv layer).
std::vector<TensorAction> offload_actions(const MemoryModel& model, Offload offload);

// The layer-wise schedule of per-tensor actions (one per layer; entries for
// layers that are not plannable must be kKeep, else MemoryError). As
// layer_wise_schedule for kKeep and kOffload; a kRecompute Y is released
// after its last forward consumer like a tensor no backward reads, and
// before the first backward that reads it, it is recomputed (kAlloc, its
// workspace, kRecompute) after whatever its layer reads is made present:
// kept tensors are there, offloaded ones are prefetched (with a sync),
// released ones are recomputed the same way first, up to the nearest
// present ancestor (forks and joins included). A recomputed Y then stays
// until its last backward reader; ancestors recomputed only to produce it
// are released once the layer's reads are all present.
Schedule planned_schedule(const MemoryModel& model, const std::vector<TensorAction>& actions);

// The schedule of a static policy (none, all, conv). Throws MemoryError for
// kDyn and the per-tensor plans (memory/planner.h resolves those).
Schedule make_schedule(const MemoryModel& model, Policy policy);

// Fig. 10: searching down from current - 1, the nearest layer whose
// offloaded inputs are not prefetched yet; the search stops (returns -1) at
// the first conv layer that does not qualify. `offloaded[l]`: layer l
// offloaded something; `prefetched[l]`: that has been prefetched.
// Per event, the index of the layer call (kForward, kLoss, kBackward) it
// belongs to: the next one, or for the events after the last call (the
// releases after the last backward) that last call; -1 without any call.
std::vector<int> event_owners(const std::vector<ScheduleEvent>& events);

int find_prefetch_layer(int current, const std::vector<LayerNode>& layers,
                        const std::vector<bool>& offloaded, const std::vector<bool>& prefetched);

}  // namespace vtrain::memory
