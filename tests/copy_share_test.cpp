// What copies on the memory stream cost the compute stream, as
// measure_copy_bandwidth measures it (worker/engine/layer_timing.h). On the
// CPU the memory stream is a thread: where the compute's threads fill the
// cores it takes one from them, and every copy delays the compute by about
// its own length (2 vCPUs here: 0.88-1.00 of it); with a core left free the
// copies run beside the compute (0.03). Claims every core (PROCESSORS 2), so
// that no other test takes the free core.
//
// What it measures is the machine's: another process on the free core (a
// build beside the run) makes the copies cost the compute there too, and a
// `ctest -L cpu` on a busy machine failed it. So it is labelled `timing`,
// not `cpu`, and skips unless VTRAIN_IDLE_MACHINE=1 says that nothing else
// runs:
//   VTRAIN_IDLE_MACHINE=1 ctest --test-dir build -L timing
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/machine.h"
#include "worker/device/backend.h"
#include "worker/engine/layer_timing.h"

namespace vtrain::worker {
namespace {

// Three measurements with `threads` compute threads, in order. A load
// from outside (another process on a core) blurs both sides of a
// measurement, so the test takes the clearest of three.
std::vector<double> shares_with(int threads) {
  std::vector<double> shares;
  for (int k = 0; k < 3; ++k) {
    auto backend = make_backend({.kind = worker::BackendKind::kCpu, .threads = threads});
    shares.push_back(measure_copy_bandwidth(*backend, size_t{16} << 20, 5).compute_share);
  }
  std::sort(shares.begin(), shares.end());
  return shares;
}

bool idle_machine() {
  const char* v = std::getenv("VTRAIN_IDLE_MACHINE");
  return v != nullptr && std::string(v) == "1";
}

TEST(CopyShare, CopiesCostTheComputeWhenItsThreadsFillTheCoresAndLessWithACoreFree) {
  if (!idle_machine()) {
    GTEST_SKIP() << "needs a machine where nothing else runs, so that a free core is free: "
                    "VTRAIN_IDLE_MACHINE=1 ctest -L timing";
  }
  const int cores = common::hardware_threads();
  if (cores < 2) GTEST_SKIP() << "one core: no thread count leaves a core free";
  const double full = shares_with(cores).back();       // the most the copies cost
  const double one_free = shares_with(cores - 1).front();  // the least
  std::printf("copies' share of the compute: %.2f with %d threads, %.2f with %d\n", full, cores,
              one_free, cores - 1);
  EXPECT_GE(full, 0.4) << "with every core computing, copies should cost the compute";
  EXPECT_LE(one_free, full - 0.2) << "a free core should take the copies";
}

}  // namespace
}  // namespace vtrain::worker
