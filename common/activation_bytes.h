// Where a training step keeps its activations (the layers' outputs), in
// bytes at its batch: what a memory plan does, as the perf DB records it
// for a measured step and a training plan prints it per rank.
#pragma once

#include <cstdint>

namespace vtrain::common {

struct ActivationBytes {
  uint64_t kept = 0;        // in device memory for the whole step
  uint64_t offloaded = 0;   // copied to the host and back
  uint64_t recomputed = 0;  // re-run in backward
  friend bool operator==(const ActivationBytes&, const ActivationBytes&) = default;
};

}  // namespace vtrain::common
