// Solve times of the balancer's models on synthetic instances sized like the
// mu-cuDNN paper's (Sec. IV-B: GLPK solved ResNet-50's WD ILP in 5.46 ms and
// ResNet-152's in 716 ms) and like large heterogeneous clusters.
//
//   bench_balancer [--repeats N] [--glpk-limit-ms MS] [--no-glpk]
//
// Prints one line per figure: the median over N solves (default 7), the
// instance's size, and the target (a fifth of the paper's time for WD, one
// second for the batch split), plus, once each and cut off at MS (default
// 2000), the GLPK reference solvers on some instances. Exit status 0 whether
// or not targets are met: this is a measurement, not a test.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "balancer/batch_split.h"
#include "balancer/workspace_plan.h"

namespace {

using namespace vtrain::balancer;
using Clock = std::chrono::steady_clock;

struct Settings {
  int repeats = 7;                              // solves per figure; the median is printed
  bool glpk = true;                             // also time the GLPK reference solvers
  std::chrono::milliseconds glpk_limit{2000};   // per GLPK solve
};

using vtrain::bench::median_ms;

// ------------------------------------------------------------ WD instances

struct ConvLayer {
  int64_t in_channels, out_channels, kernel, stride, in_size;
};

// The convolutions of ResNet-50 (blocks 3-4-6-3) or ResNet-152 (3-8-36-3) on
// 224x224 images: the stem, three per bottleneck block, one projection per
// stage.
std::vector<ConvLayer> resnet_layers(const std::vector<int>& blocks) {
  std::vector<ConvLayer> layers = {{3, 64, 7, 2, 224}};
  int64_t channels = 64, size = 56;
  for (size_t stage = 0; stage < blocks.size(); ++stage) {
    const int64_t width = 64 << stage, out = width * 4;
    for (int block = 0; block < blocks[stage]; ++block) {
      const int64_t stride = (block == 0 && stage > 0) ? 2 : 1;
      layers.push_back({channels, width, 1, 1, size});
      layers.push_back({width, width, 3, stride, size});
      if (block == 0) layers.push_back({channels, out, 1, stride, size});  // projection
      size /= stride;
      layers.push_back({width, out, 1, 1, size});
      channels = out;
    }
  }
  return layers;
}

// An algorithm of the cost model: its share of peak throughput, how fast it
// saturates with the micro-batch, and its workspace per image relative to
// the layer's im2col buffer (0 = none), plus a fixed part.
struct AlgorithmModel {
  const char* name;
  double efficiency;
  double half_batch;        // micro-batch at which it reaches half its efficiency
  double workspace_factor;  // x im2col bytes per image
  double workspace_fixed;   // x filter bytes
  bool needs_3x3_stride_1;  // Winograd and FFT variants
};

const std::vector<std::vector<AlgorithmModel>>& algorithm_models() {
  static const std::vector<std::vector<AlgorithmModel>> models = {
      {  // Forward: cuDNN's 8 minus DIRECT
       {"IMPLICIT_GEMM", 0.35, 2, 0, 0, false},
       {"IMPLICIT_PRECOMP_GEMM", 0.55, 4, 0.02, 1, false},
       {"GEMM", 0.5, 1, 1.0, 0, false},
       {"FFT", 0.75, 8, 3.0, 8, true},
       {"FFT_TILING", 0.7, 4, 1.2, 4, true},
       {"WINOGRAD", 0.8, 8, 0.05, 2, true},
       {"WINOGRAD_NONFUSED", 0.9, 16, 2.0, 4, true}},
      {  // BackwardData
       {"ALGO_0", 0.3, 2, 0, 0, false},
       {"ALGO_1", 0.5, 4, 0.1, 1, false},
       {"FFT", 0.7, 8, 3.0, 8, true},
       {"FFT_TILING", 0.65, 4, 1.2, 4, true},
       {"WINOGRAD", 0.75, 8, 0.05, 2, true},
       {"WINOGRAD_NONFUSED", 0.85, 16, 2.0, 4, true}},
      {  // BackwardFilter
       {"ALGO_0", 0.3, 4, 0, 0, false},
       {"ALGO_1", 0.5, 2, 0.05, 1, false},
       {"FFT", 0.7, 8, 3.0, 8, true},
       {"ALGO_3", 0.45, 4, 0.3, 2, false},
       {"WINOGRAD_NONFUSED", 0.85, 16, 2.0, 4, true},
       {"FFT_TILING", 0.65, 4, 1.2, 4, true}},
  };
  return models;
}

// Every algorithm at every power-of-two micro-batch, with 3% measurement
// noise. `shared`: repeated layers (same shape) share their measurements, as
// they do in the perf DB, which keys measurements by kernel signature;
// otherwise every kernel has its own noise, so no two kernels have the same
// numbers (the harder case for the ILP).
std::vector<ConvKernel> resnet_kernels(const std::vector<int>& blocks, int64_t batch, bool shared) {
  const char* const kinds[] = {"Forward", "BackwardData", "BackwardFilter"};
  const double peak_flops_per_ms = 10e12 / 1e3;  // a P100-class GPU
  std::vector<ConvKernel> kernels;
  const std::vector<ConvLayer> layers = resnet_layers(blocks);
  for (size_t l = 0; l < layers.size(); ++l) {
    const ConvLayer& layer = layers[l];
    const uint32_t seed = shared ? static_cast<uint32_t>(layer.in_channels * 1000003 + layer.out_channels * 10007 +
                                                          layer.kernel * 101 + layer.stride * 11 + layer.in_size)
                                 : static_cast<uint32_t>(l + 1);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> noise(0.97, 1.03);
    const int64_t out_size = layer.in_size / layer.stride;
    const double flops_per_image = 2.0 * layer.out_channels * out_size * out_size * layer.in_channels *
                                   layer.kernel * layer.kernel;
    const double im2col_bytes = 4.0 * layer.in_channels * layer.kernel * layer.kernel * out_size * out_size;
    const double filter_bytes = 4.0 * layer.in_channels * layer.out_channels * layer.kernel * layer.kernel;
    for (int kind = 0; kind < 3; ++kind) {
      ConvKernel kernel{"conv" + std::to_string(l) + "/" + kinds[kind], batch, {}};
      for (const AlgorithmModel& algorithm : algorithm_models()[kind]) {
        if (algorithm.needs_3x3_stride_1 && (layer.kernel != 3 || layer.stride != 1)) continue;
        for (int64_t m : micro_batch_sizes(MicroBatchPolicy::kPowerOfTwo, batch)) {
          const double utilisation = m / (m + algorithm.half_batch);
          const double time = 0.005 + flops_per_image * m /
                                          (peak_flops_per_ms * algorithm.efficiency * utilisation);
          // An eighth of the im2col scale keeps totals in the GiB range the
          // paper reports (ResNet-50: 5 GiB for cuDNN's own choices).
          const double workspace = (algorithm.workspace_factor * im2col_bytes * m +
                                    algorithm.workspace_fixed * filter_bytes) / 8;
          kernel.options.push_back({algorithm.name, m, time * noise(rng),
                                    static_cast<uint64_t>(workspace * noise(rng))});
        }
      }
      kernels.push_back(std::move(kernel));
    }
  }
  return kernels;
}

// Budgets between the least and the fastest total workspace; the ends are
// trivial (only least-workspace configurations fit / every kernel's fastest
// fits), the middle is where the choice is hard.
const double kBudgetShares[] = {0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98};

void bench_workspace_division(const char* name, const std::vector<int>& blocks, bool shared, double paper_ms,
                              const Settings& settings) {
  const int64_t batch = 256;
  const std::vector<ConvKernel> kernels = resnet_kernels(blocks, batch, shared);
  std::vector<std::vector<KernelConfig>> fronts;
  std::vector<std::string> names;
  const double front_ms = median_ms(settings.repeats, [&] {
    fronts.clear();
    for (const ConvKernel& kernel : kernels) fronts.push_back(pareto_front(kernel));
  });
  size_t options = 0, points = 0, largest = 0;
  uint64_t least = 0, fastest = 0;
  for (size_t k = 0; k < kernels.size(); ++k) {
    names.push_back(kernels[k].name);
    options += kernels[k].options.size();
    points += fronts[k].size();
    largest = std::max(largest, fronts[k].size());
    least += fronts[k].front().workspace_bytes;
    fastest += fronts[k].back().workspace_bytes;
  }
  std::printf("\nWD %s (%s measurements): %zu kernels, batch %lld, %zu options, Pareto fronts %zu points "
              "(largest %zu) computed in %.1f ms; workspace %.0f MiB (least) to %.0f MiB (all fastest)\n",
              name, shared ? "repeated layers share" : "every kernel has its own", kernels.size(),
              static_cast<long long>(batch), options, points, largest, front_ms, least / 1048576.0,
              fastest / 1048576.0);
  const double target = paper_ms / 5;
  double worst = 0;
  for (double share : kBudgetShares) {
    const auto budget = static_cast<uint64_t>(static_cast<double>(least) + share * static_cast<double>(fastest - least));
    WorkspaceDivision division;
    const double ms = median_ms(settings.repeats, [&] { division = plan_workspace_division(fronts, names, budget); });
    worst = std::max(worst, ms);
    std::string reference = "";
    if (settings.glpk && (share == 0.1 || share == 0.5 || share == 0.9)) {
      WorkspaceDivisionOptions glpk;
      glpk.solver = WorkspaceDivisionSolver::kGlpk;
      glpk.time_limit = settings.glpk_limit;
      char text[128];
      try {
        WorkspaceDivision by_glpk;
        const double glpk_ms = median_ms(1, [&] { by_glpk = plan_workspace_division(fronts, names, budget, glpk); });
        std::snprintf(text, sizeof text, "; GLPK %.1f ms, total %.3f ms", glpk_ms, by_glpk.total_time_ms);
      } catch (const BalancerError&) {
        std::snprintf(text, sizeof text, "; GLPK no optimum within %lld ms",
                      static_cast<long long>(settings.glpk_limit.count()));
      }
      reference = text;
    }
    std::printf("  budget %7.0f MiB (%2.0f%%): %.3f ms, total time %.3f ms%s\n", budget / 1048576.0, share * 100,
                ms, division.total_time_ms, reference.c_str());
  }
  std::printf("  slowest WD solve %.3f ms; target <= %.3f ms (a fifth of the paper's %.2f ms): %s\n", worst, target,
              paper_ms, worst <= target ? "met" : "MISSED");
}

// ------------------------------------------------------ batch-split instances

// A cluster of four GPU generations in equal shares, each device measured
// at batch 8, 16, ..., 512 on its own with 2% noise, so no two devices have
// the same numbers.
std::vector<DeviceProfile> cluster(int devices) {
  struct Generation {
    const char* name;
    double fixed_ms, per_sample_ms;
    double memory_gib, base_gib, per_sample_mib;
  };
  static const Generation generations[] = {{"K20Xm", 12, 1.6, 6, 1.0, 30},
                                           {"K80", 10, 1.0, 12, 1.0, 30},
                                           {"P100", 6, 0.45, 16, 1.2, 32},
                                           {"V100", 5, 0.3, 16, 1.2, 32}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.98, 1.02);
  std::vector<DeviceProfile> out;
  for (int d = 0; d < devices; ++d) {
    const Generation& gen = generations[d % 4];
    DeviceProfile device{"rank" + std::to_string(d) + "-" + gen.name, {},
                         static_cast<uint64_t>(gen.memory_gib * (1 << 30)), 0};
    for (int64_t b = 8; b <= 512; b *= 2) {
      const double time = (gen.fixed_ms + gen.per_sample_ms * static_cast<double>(b)) * noise(rng);
      const double memory = (gen.base_gib * 1024 + gen.per_sample_mib * static_cast<double>(b)) * (1 << 20);
      device.steps.push_back({b, time, static_cast<uint64_t>(memory)});
    }
    out.push_back(std::move(device));
  }
  return out;
}

void bench_batch_split(int devices, CandidateSizes sizes, const Settings& settings) {
  const std::vector<DeviceProfile> profiles = cluster(devices);
  const int64_t batch = int64_t{64} * devices;
  BatchSplitOptions options;
  options.granularity = 8;
  options.candidates = sizes;
  BatchSplit split;
  const double ms = median_ms(settings.repeats, [&] { split = plan_batch_split(profiles, batch, options); });
  char even[64] = "not representable";
  if (split.even_split_time_ms) std::snprintf(even, sizeof even, "%.1f ms", *split.even_split_time_ms);
  std::printf("  %4d devices, batch %6lld, %-12s: %7.2f ms (target < 1000 ms: %s); step %.1f ms, even split %s, "
              "%zu idle",
              devices, static_cast<long long>(batch), sizes == CandidateSizes::kMeasured ? "measured" : "interpolated",
              ms, ms < 1000 ? "met" : "MISSED", split.step_time_ms, even, split.idle_devices.size());
  if (settings.glpk && devices <= 64) {
    options.solver = BatchSplitSolver::kGlpk;
    options.time_limit = settings.glpk_limit;
    try {
      BatchSplit by_glpk;
      const double glpk_ms = median_ms(1, [&] { by_glpk = plan_batch_split(profiles, batch, options); });
      std::printf("; GLPK %.1f ms, step %.1f ms", glpk_ms, by_glpk.step_time_ms);
    } catch (const BalancerError&) {
      std::printf("; GLPK no optimum within %lld ms", static_cast<long long>(settings.glpk_limit.count()));
    }
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each figure as soon as it is measured
  Settings settings;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--repeats" && i + 1 < argc) {
      settings.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--glpk-limit-ms" && i + 1 < argc) {
      settings.glpk_limit = std::chrono::milliseconds(std::max(1, std::atoi(argv[++i])));
    } else if (arg == "--no-glpk") {
      settings.glpk = false;
    } else {
      std::fprintf(stderr, "usage: bench_balancer [--repeats N] [--glpk-limit-ms MS] [--no-glpk]\n");
      return 2;
    }
  }
  std::printf("Batch split (threshold search; granularity 8; 64 samples per device on average):\n");
  for (int devices : {64, 256, 1024}) {
    bench_batch_split(devices, CandidateSizes::kMeasured, settings);
    bench_batch_split(devices, CandidateSizes::kInterpolated, settings);
  }
  for (bool shared : {false, true}) {
    bench_workspace_division("ResNet-50", {3, 4, 6, 3}, shared, 5.46, settings);
    bench_workspace_division("ResNet-152", {3, 8, 36, 3}, shared, 716, settings);
  }
  return 0;
}
