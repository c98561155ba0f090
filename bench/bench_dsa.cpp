// The DSA planner (memory/dsa.h) on synthetic network-shaped traces: the
// best-fit plan's peak against the lower bound (most bytes alive at once)
// and against the pool (best fit as requests come, memory/free_list.h) on
// the same trace; for traces of up to ~30 blocks also against the exact MIP
// (GLPK); and the planner's time for traces of 1k and 10k blocks (the paper,
// Sec. 5, reports its Python heuristic at seconds for thousands of blocks).
//
//   bench_dsa [--repeats N] [--mip-limit-ms MS] [--no-mip]
//
// Exit status 0 whether or not the figures are good: a measurement, not a test.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "balancer/balancer_error.h"
#include "memory/dsa.h"
#include "memory/free_list.h"

namespace {

using namespace vtrain::memory;
using Clock = std::chrono::steady_clock;

struct Settings {
  int repeats = 5;                            // planner runs per figure; the median is printed
  bool mip = true;                            // solve the MIP on the small traces
  std::chrono::milliseconds mip_limit{20000};  // per MIP solve
};

// A training step's shape: a forward that allocates activations (some freed
// at once, most kept), a workspace per layer, then a backward that frees
// them in reverse while gradients come and go. Sizes vary over two orders of
// magnitude like feature maps; `layers` sets the trace length (~3.3 blocks per layer).
// `forked`: tensors die out of order (skip connections, branches), as in
// ResNet or GoogLeNet, instead of strictly last-in first-out.
std::vector<DsaBlock> step_trace(std::mt19937& rng, int layers, bool forked) {
  DsaTraceRecorder rec;
  std::uniform_real_distribution<double> scale(0.0, 1.0);
  auto size = [&](double base) {
    return align_up(static_cast<size_t>(base * (0.25 + 2.0 * scale(rng))) + 1);
  };
  std::vector<int> kept;
  double feature = 1 << 20;
  for (int l = 0; l < layers; ++l) {
    if (rng() % 5 == 0) feature *= 0.5;  // pooling
    if (feature < (16 << 10)) feature = 1 << 20;  // a new block of the net
    const int y = rec.allocate(size(feature));
    const int ws = rec.allocate(size(feature / 3));
    rec.release(ws);
    if (rng() % 3 == 0 && !kept.empty()) {
      // Dead after its last consumer.
      const size_t k = forked ? rng() % kept.size() : kept.size() - 1;
      rec.release(kept[k]);
      kept.erase(kept.begin() + static_cast<long>(k));
    }
    kept.push_back(y);
  }
  while (!kept.empty()) {
    const int dy = rec.allocate(size(feature));
    const int ws = rec.allocate(size(feature / 3));
    rec.release(ws);
    const size_t k = forked && rng() % 3 == 0 ? rng() % kept.size() : kept.size() - 1;
    rec.release(kept[k]);
    kept.erase(kept.begin() + static_cast<long>(k));
    rec.release(dy);
  }
  return rec.finish();
}


using vtrain::bench::median_ms;

void figure(const Settings& settings, int layers, uint32_t seed, bool forked, bool with_mip) {
  std::mt19937 rng(seed);
  const std::vector<DsaBlock> trace = step_trace(rng, layers, forked);
  std::vector<size_t> offsets;
  const int repeats = trace.size() > 5000 ? std::max(1, settings.repeats / 2) : settings.repeats;
  const double ms = median_ms(repeats, [&] { offsets = dsa_best_fit(trace); });
  if (dsa_find_overlap(trace, offsets)) {
    std::printf("  ERROR: best fit placed two live blocks on the same bytes\n");
    std::exit(1);
  }
  const double lb = static_cast<double>(dsa_lower_bound(trace));
  const double peak = static_cast<double>(dsa_peak(trace, offsets));
  const double pool = static_cast<double>(dsa_pool_span(trace));
  std::printf("  %6zu blocks: best fit %8.2f MiB = %.3f x lower bound, pool %8.2f MiB = %.3f x; "
              "plan %9.2f ms",
              trace.size(), peak / 1048576, peak / lb, pool / 1048576, pool / lb, ms);
  if (with_mip) {
    try {
      const auto start = Clock::now();
      const DsaMipResult mip = dsa_solve_mip(trace, {.time_limit = settings.mip_limit});
      const double mip_ms =
          std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      std::printf("; MIP %.2f MiB, best fit = %.3f x MIP (GLPK %.0f ms)",
                  static_cast<double>(mip.peak) / 1048576, peak / static_cast<double>(mip.peak),
                  mip_ms);
    } catch (const vtrain::balancer::BalancerError& e) {
      std::printf("; MIP: %s", e.what());
    }
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--repeats" && i + 1 < argc) {
      settings.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--mip-limit-ms" && i + 1 < argc) {
      settings.mip_limit = std::chrono::milliseconds(std::atoi(argv[++i]));
    } else if (arg == "--no-mip") {
      settings.mip = false;
    } else {
      std::fprintf(stderr, "usage: bench_dsa [--repeats N] [--mip-limit-ms MS] [--no-mip]\n");
      return 2;
    }
  }
  for (bool forked : {false, true}) {
    const char* shape = forked ? "fork/join (out-of-order frees)" : "chain (last-in first-out)";
    std::printf("%sDSA best fit vs exact MIP, small %s step traces:\n", forked ? "\n" : "", shape);
    for (int layers : {3, 5, 7, 9}) {
      for (uint32_t seed : {1u, 2u}) figure(settings, layers, seed, forked, settings.mip);
    }
    std::printf("\nDSA best fit, large %s step traces (median of %d plans):\n", shape,
                settings.repeats);
    for (int layers : {30, 300, 3000}) figure(settings, layers, 7, forked, false);
  }
  return 0;
}
