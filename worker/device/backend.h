// The device interface: everything the engine, the memory part and the
// profiler need from a device, and nothing vendor-specific. Two halves:
//  - Device (worker/device/device.h): memory, pinned memory, streams,
//    events, copies, transfers, the ops' scratch;
//  - the ops (worker/device/ops.h): each op a descriptor value, run through
//    a handful of entry points below (supports, prefers, scratch_bytes,
//    run, and the convolution algorithms' list and names).
//
// Implementations: worker/device/cpu (oneDNN; the "device" is host memory behind a
// byte counter, the memory stream a background thread) and worker/device/cuda
// (cuDNN/cuBLAS, two CUDA streams), chosen by make_backend() only. Each keeps
// its kernels in a table keyed by the descriptor's type (op_table.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/compute_settings.h"
#include "common/name_table.h"
#include "common/precision.h"
#include "worker/device/device.h"
#include "worker/device/ops.h"
#include "worker/device/tensor.h"

namespace vtrain::worker {

// Argument checks every backend makes alike; they throw BackendError naming
// `backend` ("cpu backend") and the op.
void check_beta(const char* backend, const char* op, float beta);  // beta is 0 or 1
// The tensors of one call share an element type.
void check_same_dtype(const char* backend, const char* op,
                      std::initializer_list<TensorDesc> tensors);
// The named tensors of one call have one descriptor; else the message
// names what differs, e.g. "cpu backend: relu_forward: x is bf16, y is f32"
// (element type, shape and layout, each difference named).
void check_same_desc(const char* backend, const char* op,
                     std::initializer_list<std::pair<const char*, TensorDesc>> tensors);
// concat_backward's slice: dx fits dy at `channel_offset` (same n, h, w).
void check_concat_slice(const Shape& dy, int64_t channel_offset, const Shape& dx);
// The shapes and types of a kMul or kMulSum (ops.h, BinaryDesc); returns
// whether b is broadcast over H and W (kMul with b {a.n, a.c, 1, 1} and a
// larger than one pixel).
bool check_mul(const char* backend, const BinaryDesc& op);

class Backend : public Device {
 public:
  // Why this backend cannot run `op` (naming what is missing: the element
  // type on this device, an attribute it lacks), or nothing when it can.
  // run() of an op it refuses throws BackendError with that reason.
  virtual std::optional<std::string> supports(const OpDesc& op) const = 0;
  // Whether `op`, a fused form (an ActivationDesc with bias: the bias of the
  // convolution before it added here), saves work on this backend over its
  // parts: the fusion pass's rule under "auto". Where a convolution adds
  // its bias for free (oneDNN) it does not; where the bias is a pass over
  // the activations each way (cuDNN) it does.
  virtual bool prefers(const OpDesc& op) const = 0;
  // The memory one call of `op` needs besides its buffers (OpBytes).
  // Throws BackendError naming the problem when a convolution's algorithm
  // does not support it.
  virtual OpBytes scratch_bytes(const OpDesc& op) = 0;
  // Runs `op` on `args` (the OpArgs alternative of OpDesc's: a mismatch
  // throws BackendError).
  virtual void run(const OpDesc& op, const OpArgs& args) = 0;

  // The convolution algorithms available for op's kind and problem (its
  // algo is ignored), each with its workspace for a call with beta 0 and,
  // where op.beta != 0 needs more, with that beta (micro-batches accumulate).
  virtual std::vector<ConvAlgoInfo> conv_algorithms(const ConvDesc& op) = 0;
  virtual std::string conv_algorithm_name(ConvKind kind, ConvAlgo algo) const = 0;
};

// The activation layout a job asks for (device.layout), with the other
// settings of how a model is computed (common/compute_settings.h).
using common::LayoutChoice;
using common::kLayoutChoiceNames;

// The layout rule of every backend, also what the offline planner assumes
// for a rank it cannot ask: the layout of an activation of `channels`
// under `choice` on a device whose own choice is `native_block` for the
// CPU (its ISA's channel block: 16, 8 or 1) or, for a GPU, `gpu` set.
struct LayoutRule {
  LayoutChoice choice = LayoutChoice::kAuto;
  bool gpu = false;
  int64_t native_block = 1;  // CPU
  common::Precision precision = common::Precision::kFp32;
  Layout operator()(int64_t channels) const;
};

// How many of cuDNN's ranked graph engines each half configuration offers
// unless conv.graph_engines says otherwise: as many as PyTorch's cuDNN path
// times (torch.backends.cudnn.benchmark_limit, 10, of the same heuristic's
// ranking, mode A), so that the kernels it can reach are among vtrain's
// candidates too. Each costs a plan and its timing at profile time only.
inline constexpr int kDefaultGraphEngines = 10;

// Which backend a process runs on (device.backend). A DeviceInfo names a
// made backend by its name here ("cpu", "cuda"), never "auto".
enum class BackendKind {
  kAuto,  // cuda if a GPU is visible, else cpu
  kCpu,
  kCuda,
};
inline constexpr auto kBackendKindNames = std::to_array<common::Named<BackendKind>>(
    {{BackendKind::kAuto, "auto"}, {BackendKind::kCpu, "cpu"}, {BackendKind::kCuda, "cuda"}});

// The kind named `name` (a DeviceInfo's or perf DB device's backend).
// Throws BackendError "unknown backend kind 'NAME' (known: auto, cpu, cuda)".
BackendKind parse_backend_kind(std::string_view name);

struct BackendOptions {
  BackendKind kind = BackendKind::kAuto;
  int threads = 0;            // CPU threads; 0 = all cores the process may run on, no more than
                              // its cgroup CPU quota keeps busy (common/cgroup_limits.h)
  size_t memory_limit = 0;    // device bytes the backend may serve; 0 = the device's memory
  // The job's run settings, whole (config::compute_settings). A backend
  // reads two: `precision` (train.precision; under tf32 the CUDA backend
  // also offers each convolution algorithm in a TF32 tensor-core variant,
  // "<name>/tf32", timed and chosen like any algorithm, and runs its GEMMs
  // in TF32; fp32 keeps FMA math throughout; half tensors need no option:
  // a backend runs them whatever this says, where precision_unavailable()
  // allows) and `layout` (device.layout: activations' layout,
  // preferred_layout(), by layout_rule_for).
  common::ComputeSettings settings;
  // CUDA: also offer half convolutions as the engine configurations of
  // cuDNN's graph API (conv.cudnn_graph; "eng<index>..." algorithms):
  // the first `graph_engines` of its heuristic's ranking that finalize, per
  // configuration (conv.graph_engines). Other backends ignore both.
  bool cudnn_graph = false;
  int graph_engines = kDefaultGraphEngines;
  // Tests, CPU: the memory stream's work starts only when something waits
  // for it (common::HostStream's lazy mode), as on a device whose copies
  // are slow, so that a missing wait reads stale data deterministically.
  bool lazy_memory_stream = false;
};

// The layout rule a backend of `kind` (kCpu: this machine's CPU; kCuda)
// follows under `settings` (its layout and precision), without making one
// (what the offline planner assumes for a rank). Throws BackendError for
// kAuto, which names no one backend.
LayoutRule layout_rule_for(BackendKind kind, const common::ComputeSettings& settings);

// The only place that knows which backends were built. Throws BackendError
// for an unavailable one, naming the built ones.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

// Whether a GPU backend is built and a GPU is visible.
bool gpu_available();
// Why not (the backend is not built; the CUDA runtime's error, e.g. a
// driver too old for it; or no device), or nullopt when one is.
std::optional<std::string> why_no_gpu();

}  // namespace vtrain::worker
