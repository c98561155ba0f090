// TEST ONLY: half precision on a device that lacks it, emulated. Not on a
// user's path: make_backend() wraps a backend in it only where the
// environment sets VTRAIN_EMULATE_HALF=1 (a testing aid, as VTRAIN_FAIL_*
// are), so that a machine without AVX-512 BF16 (an AVX2-only CPU, a CI box)
// can still run the jobs that mix precisions per rank.
//
// The emulation keeps tensors in their half type (bf16 or fp16: storage,
// memory plans and the bytes that cross the wire are those of the real
// thing) and computes every op in f32: each half input is widened into a
// host copy, the wrapped backend runs its f32 op, and each half output is
// rounded to its type once (round to nearest even). Half weights the ops
// read (`const void*`) are widened likewise. It differs from native half
// compute where a native kernel rounds in between (a half accumulation,
// say); vtrain's own half kernels accumulate in f32 and round once, which
// is what this does.
//
// A half type the wrapped backend runs natively (bf16 on a CPU with
// AVX-512 BF16 or AMX) is passed through untouched; only the types it
// refuses are emulated. The device's name gets the suffix
// kHalfEmulationSuffix, so the perf DB, plans and the cluster table keep
// emulated devices apart and say so. The f32 copies are host memory that
// no device counter sees.
#pragma once

#include <memory>
#include <string_view>

#include "worker/device/backend.h"

namespace vtrain::worker {

inline constexpr std::string_view kHalfEmulationSuffix = " (half emulated, test only)";

// The environment variable that turns the emulation on ("1").
inline constexpr const char* kEmulateHalfEnv = "VTRAIN_EMULATE_HALF";
bool half_emulation_requested();

// `inner` with bf16 and fp16 offered, emulated where it lacks them.
std::unique_ptr<Backend> emulate_half(std::unique_ptr<Backend> inner);

}  // namespace vtrain::worker
