// The uneven split of a global mini-batch over heterogeneous devices (mu-cuDNN,
// Oyama et al., Sec. III-E): each device g gets b_g samples, sum b_g = B, so
// that the slowest device finishes as early as possible:
//
//   min T  s.t.  T >= sum_b t[g,b] x[g,b]      for every device g
//                sum_b x[g,b] <= 1              for every device g
//                sum_g sum_b b x[g,b] = B
//                x[g,b] binary
//
// over candidate sizes b that fit the device's memory. A device with no
// x[g,b] = 1 gets 0 samples and does not train. Solved to optimality (see
// BatchSplitSolver).
//
// Candidate sizes come from the caller's step measurements (forward plus
// backward at a per-rank batch, with its peak memory), as the profiler
// records them in the perf DB:
//   kMeasured:      the measured sizes that are multiples of the granularity.
//   kInterpolated:  every multiple of the granularity from the device's
//                   smallest to its largest measured size; time and peak
//                   memory are linear between the two nearest measured sizes
//                   (exact at measured sizes, never extrapolated). Step time
//                   and memory are close to affine in the batch, so this
//                   finds splits the measured sizes alone cannot express.
// A candidate is kept only when its (measured or interpolated) peak memory is
// at most the device's capacity, and only up to B.
//
// Communication, which the paper leaves out: a device's allreduce_ms (its
// exposed allreduce time, e.g. behind a slow link) is added to t[g,b] for
// every b, and options.allreduce_ms (the part every step pays) is added to T.
// An idle device adds nothing: the plan leaves it out of training.
//
// Input, which the paper leaves out too: a device whose input (reading,
// decoding, augmenting) delivers input_rate images/s, decoded ahead while
// it computes, runs a step at batch b in
//
//   t[g,b] = max(compute_g(b) + allreduce_g + A, 1000 b / input_rate_g)  ms
//
// where A is options.allreduce_ms (the input of the next step overlaps the
// whole of this one, the exchange included; whichever is slower sets the
// pace). In the ILP that is one more row per device,
// T >= sum_b (1000 b / input_rate_g - A) x[g,b], beside the compute row
// (T + A is the step): a convex piecewise-linear compute and a linear
// input term stay linear in x. input_rate 0 means input never binds (data
// in memory).
//
// Cores, which a CPU device's compute and its input's decoding share with
// each other and with the other devices of its host (HostShare): however
// the work is scheduled, a step cannot take less than the CPU time all of
// them need together over the host's cores,
//
//   host_ms = sum over the host's devices g of
//             (compute_cores_g * compute_g(b_g) + b_g * input_cpu_ms_per_image_g) / cores
//
// which binds only where their threads outnumber the cores (a small node
// decoding beside its compute). The split's predicted step is the larger of
// the slowest device's step plus A and every host's host_ms; devices of a
// host whose host_ms is larger are predicted at it and bind on "cores".
// The split is still chosen per device (the solvers' structure); host_ms
// makes its prediction true where cores are short.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "balancer/balancer_error.h"
#include "common/name_table.h"

namespace vtrain::balancer {

// One training step measured on a device at one per-rank batch.
struct StepSample {
  int64_t batch = 1;               // per-rank batch, >= 1
  double time_ms = 0;              // forward + backward, finite and >= 0
  uint64_t peak_memory_bytes = 0;  // peak device memory of that step
};

// The cores a device shares with its input's decoding and the other
// devices of its host (see the top of this file).
struct HostShare {
  int host = -1;         // devices with the same host >= 0 share its cores; -1: the device
                         // computes off the host's cores (a GPU), none shared
  double cores = 0;      // cores of the host (or of the CPUs its devices are pinned to), > 0
  double compute_cores = 0;   // cores its compute keeps busy while it runs: its threads, at
                              // most its share of the cores where several devices' compute
                              // shares them (as the profile, which measures them together, saw)
  double input_cpu_ms_per_image = 0;   // CPU time decoding takes per image: the decoding
                                       // threads over the images/s they deliver together
                                       // (0: input in memory, or simulated)
};

struct DeviceProfile {
  std::string name;                   // for messages and the idle list, e.g. "rank 2 (Tesla K20Xm)"
  std::vector<StepSample> steps;      // at most one per batch size, any order
  uint64_t memory_capacity_bytes = 0; // a batch fits when its peak memory is at most this
  double allreduce_ms = 0;            // this device's exposed allreduce time, added to
                                      // its step time when it trains (>= 0)
  double input_rate = 0;              // images/s its input delivers, decoded ahead of
                                      // compute; 0 = unlimited (input never binds)
  HostShare host_share;               // the cores it shares; host -1: none
};

// What sets a device's step time at its batch: its compute (with its
// exposed allreduce), its input, or its host's cores (HostShare).
enum class Binding { kCompute, kInput, kCores };
inline constexpr auto kBindingNames = std::to_array<common::Named<Binding>>(
    {{Binding::kCompute, "compute"}, {Binding::kInput, "input"}, {Binding::kCores, "cores"}});

// A device's input time in ms for `batch` samples at `input_rate` images/s;
// 0 when the rate is 0 (unlimited).
double input_ms(double input_rate, int64_t batch);

// Which per-rank batch sizes a device may get (balance.candidates).
enum class CandidateSizes { kMeasured, kInterpolated };
inline constexpr auto kCandidateSizesNames = std::to_array<common::Named<CandidateSizes>>(
    {{CandidateSizes::kMeasured, "measured"}, {CandidateSizes::kInterpolated, "interpolated"}});

// How a job's global batch is split over its ranks (balance.split).
enum class SplitMode {
  kEven,    // B / ranks, the remainder to the first ranks (even_split)
  kManual,  // per-rank batches given by the user
  kAuto,    // profile, then plan_batch_split on rank 0
};
inline constexpr auto kSplitModeNames = std::to_array<common::Named<SplitMode>>(
    {{SplitMode::kEven, "even"}, {SplitMode::kManual, "manual"}, {SplitMode::kAuto, "auto"}});

// Whether an auto split counts the gradient allreduce (balance.allreduce):
// kMeasure times one allreduce of all gradients and adds it to every
// device's step time; kNone leaves communication out.
enum class AllreduceCost { kMeasure, kNone };
inline constexpr auto kAllreduceCostNames = std::to_array<common::Named<AllreduceCost>>(
    {{AllreduceCost::kMeasure, "measure"}, {AllreduceCost::kNone, "none"}});

// How the model is solved. Both are exact; among equally fast splits they
// may return different ones.
enum class BatchSplitSolver {
  // The default: the optimal T is one of the candidates' times, so a binary
  // search over them, each step a bit-parallel subset-sum test ("can every
  // device stay at or below T and the sizes add up to B?"), finds it; the
  // split is read back from the subset-sum tables, spreading the slack
  // below T over the devices in proportion to the largest size each may
  // take. Tens of milliseconds for 1024 devices; the tables take about
  // devices * B / granularity / 8 bytes (1 MiB for 1024 devices, B = 65536,
  // granularity 8), and more than 1 GiB is refused with a BalancerError
  // asking for a coarser granularity.
  kThresholdSearch,
  // The ILP above handed to GLPK. A reference: fine for a few dozen devices,
  // minutes for a few hundred.
  kGlpk,
};

struct BatchSplitOptions {
  int64_t granularity = 1;                         // every b_g is a multiple of this (>= 1)
  CandidateSizes candidates = CandidateSizes::kMeasured;  // see the top of this file
  double allreduce_ms = 0;                         // added to the step time of every split (>= 0)
  bool allow_idle_devices = true;                  // false: every device gets one of its candidates
  BatchSplitSolver solver = BatchSplitSolver::kThresholdSearch;
  std::chrono::milliseconds time_limit{0};         // kGlpk only: limit of the solve; 0 = none
  // false: the split is chosen on compute alone (the devices' input_rate
  // left out of the choice, as a compute-only balancer would); the times
  // the split reports still include input, so they predict what it runs.
  bool input_aware = true;
};

struct BatchSplit {
  std::vector<int64_t> batch;             // per device, in input order; 0 = does not train
  std::vector<double> time_ms;            // per device: predicted step time incl. its
                                          // allreduce_ms, input and host's cores (less
                                          // options.allreduce_ms); 0 for an idle device
  std::vector<double> input_ms;           // per device: its input time at its batch (0:
                                          // idle or unlimited input), 1000 b / input_rate
  std::vector<Binding> binding;           // per device: what sets its time (kCompute when idle)
  double step_time_ms = 0;                // max of time_ms plus options.allreduce_ms
  std::vector<std::string> idle_devices;  // names of the devices that get 0, in input order
  // The step time of the even split B/n on every device, for comparison;
  // nullopt when that split is not representable (n does not divide B, B/n
  // is not a multiple of the granularity, or it is not a candidate of every
  // device, e.g. it does not fit one's memory).
  std::optional<double> even_split_time_ms;
  // The ideal bound: B over the sum of every device's best throughput
  // alone (its candidate with the most samples per ms, its exposed
  // allreduce left out), plus the exchange every step pays at least
  // (options.allreduce_ms and the least device allreduce_ms). No split
  // beats it; step_time_ms / ideal_step_time_ms says how close this one is.
  double ideal_step_time_ms = 0;
};

// The optimal split of `global_batch` over `devices`. Throws InfeasibleError
// when no split exists, saying why: the batch is not a multiple of the
// granularity; it exceeds what the devices can hold together; no combination
// of candidate sizes adds up to it (the message gives the nearest totals that
// can be made); or, without idle devices, a device has no candidate or the
// batch is smaller than the devices' smallest candidates together. Throws
// BalancerError on invalid input (no devices, batch < 1, a duplicate or
// malformed sample) or a solver failure.
BatchSplit plan_batch_split(std::span<const DeviceProfile> devices, int64_t global_batch,
                            const BatchSplitOptions& options = {});

// The device's step time at `batch` (its allreduce_ms not included) as the
// candidates price it: measured, or linear between the two nearest measured
// sizes; nullopt outside its measured range. Throws BalancerError on a
// malformed profile, as plan_batch_split does.
std::optional<double> step_time_at(const DeviceProfile& device, int64_t batch);

// A device's step does not get faster as its batch grows; measured times
// that say so are noise (a slow spell of a shared machine on one batch's
// runs). Makes `steps` (any order; returned sorted by batch) non-decreasing
// in time by pooling adjacent violators into their mean (isotonic
// regression, least squares). Two identical devices whose one profile
// read t(12) < t(8) were otherwise split 4 + 12 of 16 and, once training
// measured them alike, re-balanced back and forth.
void make_monotone(std::vector<StepSample>& steps);

// B / ranks each, the remainder to the first ranks.
std::vector<int64_t> even_split(int64_t batch, int ranks);

// Per-rank batches as text: "24,24" (or "24+24" with separator '+').
std::string join_batches(const std::vector<int64_t>& batches, char separator = ',');

}  // namespace vtrain::balancer
